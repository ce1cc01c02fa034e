//! Where a step's device time goes (`profile measure --launch-times`, DESIGN §6.6): after the
//! units are timed, one more compute round in slot order and every unit's optimizer step, each
//! slot alone on the device with the backend's launch clock on, so every kernel and product is
//! timed by itself. The launches are summed per unit kind (the unit's name without its index:
//! every `block.<n>` is a `block`), pass and launch name, and per [`LaunchCategory`] (where the
//! time goes: products, attention, element-wise kernels, the loss, the optimizer).

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

/// What a launch is, for the summary of where a step's device time goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaunchCategory {
    /// A layer's product (one product, not a batch).
    Products,
    /// Attention: its batched products (one per head) and its softmax kernels.
    Attention,
    /// The loss: the logits' softmax, the log-likelihood, its gradient (the head's, the MLP's).
    Loss,
    /// Every launch of the optimizer's pass (AdamW, the master rounded into the parameters).
    Optimizer,
    /// Every other kernel: norms, activations, biases, residual adds, embeddings, roundings.
    ElementWise,
}

/// The kernels of the loss, by name.
const LOSS_KERNELS: [&str; 7] = [
    "softmax_rows",
    "nll_partials",
    "sum_loss",
    "cross_entropy_backward",
    "store_values",
    "mse_grad",
    "mse_loss_partials",
];

impl LaunchCategory {
    pub fn name(self) -> &'static str {
        match self {
            LaunchCategory::Products => "products",
            LaunchCategory::Attention => "attention",
            LaunchCategory::Loss => "loss",
            LaunchCategory::Optimizer => "optimizer",
            LaunchCategory::ElementWise => "element-wise",
        }
    }
}

impl LaunchRow {
    pub fn category(&self) -> LaunchCategory {
        let name = self.name.as_str();
        if self.pass == "optimizer" {
            LaunchCategory::Optimizer
        } else if name.starts_with("product ") {
            match name.contains(" × ") {
                true => LaunchCategory::Attention,
                false => LaunchCategory::Products,
            }
        } else if name.starts_with("causal_softmax") {
            LaunchCategory::Attention
        } else if LOSS_KERNELS.contains(&name) {
            LaunchCategory::Loss
        } else {
            LaunchCategory::ElementWise
        }
    }
}

/// The rows' time per category (µs), the longest first; categories without time left out.
pub fn by_category(rows: &[LaunchRow]) -> Vec<(LaunchCategory, f64)> {
    let mut sums: Vec<(LaunchCategory, f64)> = Vec::new();
    for row in rows {
        let category = row.category();
        match sums.iter_mut().find(|(c, _)| *c == category) {
            Some((_, us)) => *us += row.us,
            None => sums.push((category, row.us)),
        }
    }
    sums.sort_by(|a, b| b.1.total_cmp(&a.1));
    sums
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
    use super::{LaunchCategory, LaunchRow, LaunchTime, add, by_category, unit_kind};

    /// Linear products, attention's batched products and softmaxes, the loss's kernels, the
    /// optimizer's pass and the rest fall in their categories, summed the longest first.
    #[test]
    fn launches_fall_in_their_categories() {
        let row = |pass, name: &str, us| LaunchRow {
            unit: "block".into(),
            pass,
            name: name.into(),
            launches: 1,
            us,
            flops: 0.0,
        };
        let rows = [
            row("forward", "product 4096×2304×768", 30.0),
            row("forward", "product 1024×1024×64 × 12", 8.0),
            row("backward", "causal_softmax_backward", 2.0),
            row("forward", "softmax_rows", 5.0),
            row("optimizer", "adamw", 4.0),
            row("optimizer", "narrow_values", 1.0),
            row("forward", "layernorm_forward", 3.0),
            row("backward", "round_values", 0.5),
        ];
        use LaunchCategory::*;
        let categories: Vec<_> = rows.iter().map(LaunchRow::category).collect();
        assert_eq!(
            categories,
            [
                Products,
                Attention,
                Attention,
                Loss,
                Optimizer,
                Optimizer,
                ElementWise,
                ElementWise
            ]
        );
        assert_eq!(
            by_category(&rows),
            [
                (Products, 30.0),
                (Attention, 10.0),
                (Loss, 5.0),
                (Optimizer, 5.0),
                (ElementWise, 3.5)
            ]
        );
    }

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
