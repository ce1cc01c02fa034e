//! Where a step's device time goes (`profile measure --launch-times`, DESIGN §6.6): after the
//! units are timed, one more compute round in slot order and every unit's optimizer step, each
//! slot alone on the device with the backend's launch clock on, so every kernel and product is
//! timed by itself. The launches are summed per unit kind (the unit's name without its index:
//! every `block.<n>` is a `block`), pass and launch name.

use super::DataSteps;
use super::timing::compute_slot;
use crate::Result;
use crate::backend::{Backend, LaunchTime};
use crate::layout::Layout;
use crate::train::{Train, optimize_unit};

/// One launch name's time within one pass of one unit kind, summed over a step.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LaunchRow {
    /// The unit's name without its index (`block` for `block.3`).
    pub unit: String,
    /// `forward`, `backward` or `optimizer`.
    pub pass: &'static str,
    /// The kernel, or the product's shape ([`LaunchTime::name`]).
    pub name: String,
    pub launches: usize,
    pub us: f64,
    pub flops: f64,
}

/// Every launch of a step (one compute round of `layout` and each unit's optimizer step), each
/// slot synchronised before the next, summed into rows, the longest first.
pub fn time_launches<B: Backend, W: Train<B>>(
    backend: &B,
    workload: &W,
    layout: &Layout,
    steps: &DataSteps,
) -> Result<Vec<LaunchRow>> {
    let l = workload.unit_count();
    let mut rows = Vec::new();
    // The work queued before the round; from then on each slot's `launch_times` waits for it.
    backend.synchronize()?;
    for s in 0..2 * l {
        backend.start_launch_clock()?;
        compute_slot(backend, workload, layout, s, steps)?;
        let (unit, pass) = if s < l {
            (s, "forward")
        } else {
            (2 * l - 1 - s, "backward")
        };
        add(
            &mut rows,
            &unit_kind(&workload.unit_name(unit)),
            pass,
            backend.launch_times()?,
        );
    }
    for i in 0..l {
        backend.start_launch_clock()?;
        optimize_unit(workload, backend, layout, i, 1)?;
        add(
            &mut rows,
            &unit_kind(&workload.unit_name(i)),
            "optimizer",
            backend.launch_times()?,
        );
    }
    rows.sort_by(|a, b| b.us.total_cmp(&a.us));
    Ok(rows)
}

/// A unit's name without a trailing `.<index>`.
fn unit_kind(name: &str) -> String {
    match name.rsplit_once('.') {
        Some((kind, index)) if !index.is_empty() && index.bytes().all(|b| b.is_ascii_digit()) => {
            kind.to_string()
        }
        _ => name.to_string(),
    }
}

/// Adds `times` to the rows of (`unit`, `pass`), one row per launch name.
fn add(rows: &mut Vec<LaunchRow>, unit: &str, pass: &'static str, times: Vec<LaunchTime>) {
    for time in times {
        let row = match rows
            .iter()
            .position(|r| r.unit == unit && r.pass == pass && r.name == time.name)
        {
            Some(i) => &mut rows[i],
            None => {
                rows.push(LaunchRow {
                    unit: unit.to_string(),
                    pass,
                    name: time.name,
                    launches: 0,
                    us: 0.0,
                    flops: 0.0,
                });
                rows.last_mut().expect("just pushed")
            }
        };
        row.launches += 1;
        row.us += time.us;
        row.flops += time.flops;
    }
}

#[cfg(test)]
mod tests {
    use super::{LaunchTime, add, unit_kind};

    #[test]
    fn a_units_kind_drops_only_a_numeric_index() {
        assert_eq!(unit_kind("block.12"), "block");
        assert_eq!(unit_kind("head"), "head");
        assert_eq!(unit_kind("layer.norm"), "layer.norm");
        assert_eq!(unit_kind("block."), "block.");
    }

    #[test]
    fn launches_of_one_name_in_one_pass_of_a_kind_sum_into_one_row() {
        let time = |name: &str, us| LaunchTime {
            name: name.into(),
            flops: if name == "gelu_forward" { 0.0 } else { 10.0 },
            us,
        };
        let mut rows = Vec::new();
        add(
            &mut rows,
            "block",
            "forward",
            vec![time("p", 2.0), time("gelu_forward", 1.0)],
        );
        add(&mut rows, "block", "forward", vec![time("p", 3.0)]);
        add(&mut rows, "block", "backward", vec![time("p", 4.0)]);
        let summed: Vec<_> = rows
            .iter()
            .map(|r| (r.pass, r.name.as_str(), r.launches, r.us, r.flops))
            .collect();
        assert_eq!(
            summed,
            [
                ("forward", "p", 2, 5.0, 20.0),
                ("forward", "gelu_forward", 1, 1.0, 0.0),
                ("backward", "p", 1, 4.0, 10.0),
            ]
        );
    }
}
