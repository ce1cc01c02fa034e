//! Sweep charts (plotters): iteration time against the memory cap per method, and the ILP's
//! level mix against the cap. Each chart is written as SVG and PNG; PNG text uses the bundled
//! DejaVu Sans, so no system font library is needed.

use plotters::coord::Shift;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use shardplan_scheduler::sweep::SweepRow;
use std::path::Path;

const FONT: &[u8] = include_bytes!("../assets/fonts/DejaVuSans.ttf");
const SIZE: (u32, u32) = (1100, 700);
const GIB: f64 = 1073741824.0;

/// Registers the bundled font once (PNG text rendering).
pub fn register_font() -> anyhow::Result<()> {
    static ONCE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let ok = *ONCE.get_or_init(|| {
        plotters::style::register_font("sans-serif", FontStyle::Normal, FONT).is_ok()
    });
    anyhow::ensure!(ok, "the bundled font could not be loaded");
    Ok(())
}

fn color(k: usize) -> RGBColor {
    const PALETTE: [RGBColor; 7] = [
        RGBColor(200, 30, 30),
        RGBColor(31, 119, 180),
        RGBColor(44, 160, 44),
        RGBColor(148, 103, 189),
        RGBColor(255, 127, 14),
        RGBColor(140, 86, 75),
        RGBColor(23, 190, 207),
    ];
    PALETTE[k % PALETTE.len()]
}

/// Consecutive feasible points of one method as separate segments (infeasible caps leave gaps).
fn segments(rows: &[&SweepRow]) -> Vec<Vec<(f64, f64)>> {
    let mut out: Vec<Vec<(f64, f64)>> = vec![Vec::new()];
    for r in rows {
        match r.iteration_time_us {
            Some(t) if r.feasible => out
                .last_mut()
                .expect("non-empty")
                .push((r.cap_bytes as f64 / GIB, t / 1e6)),
            _ if !out.last().expect("non-empty").is_empty() => out.push(Vec::new()),
            _ => {}
        }
    }
    out.retain(|s| !s.is_empty());
    out
}

/// How many units of a sweep row a chart line counts.
type UnitCount = fn(&SweepRow) -> usize;

/// A chart over (cap in GiB) × (value).
type Frame<'a, DB> = ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// Smallest and largest of some values; None when there are none (an axis needs a finite range:
/// plotters never finishes placing ticks on an infinite one).
fn extent(values: impl Iterator<Item = f64> + Clone) -> Option<(f64, f64)> {
    let low = values.clone().fold(f64::INFINITY, f64::min);
    let high = values.fold(f64::NEG_INFINITY, f64::max);
    (low.is_finite() && high.is_finite()).then_some((low, high))
}

/// Title, axes with their units and the mesh, shared by both charts.
fn frame<'a, DB: DrawingBackend>(
    root: &'a DrawingArea<DB, Shift>,
    title: &str,
    caps: (f64, f64),
    y: std::ops::Range<f64>,
    y_desc: &str,
) -> Result<Frame<'a, DB>, DrawingAreaErrorKind<DB::ErrorType>> {
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 26))
        .margin(20)
        .x_label_area_size(55)
        .y_label_area_size(80)
        .build_cartesian_2d(caps.0..caps.1.max(caps.0 + 1e-9), y)?;
    chart
        .configure_mesh()
        .x_desc("memory cap per rank (GiB)")
        .y_desc(y_desc)
        .axis_desc_style(("sans-serif", 20))
        .label_style(("sans-serif", 16))
        .draw()?;
    Ok(chart)
}

/// The legend box, shared by both charts.
fn legend<'a, DB: DrawingBackend + 'a>(
    chart: &mut Frame<'a, DB>,
    position: SeriesLabelPosition,
) -> Drawn<DB> {
    chart
        .configure_series_labels()
        .position(position)
        .label_font(("sans-serif", 18))
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()
}

type Drawn<DB> = Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

fn draw_times<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    rows: &[SweepRow],
    methods: &[String],
) -> Drawn<DB> {
    let caps = extent(rows.iter().map(|r| r.cap_bytes as f64 / GIB)).unwrap_or((0.0, 1.0));
    // No method fits any cap: an empty time axis.
    let (y0, y1) = extent(
        rows.iter()
            .filter_map(|r| r.iteration_time_us)
            .map(|t| t / 1e6),
    )
    .unwrap_or((0.0, 1.0));
    let pad = ((y1 - y0) * 0.08).max(y1 * 0.01).max(1e-9);
    let mut chart = frame(
        root,
        title,
        caps,
        (y0 - pad).max(0.0)..y1 + pad,
        "iteration time (s)",
    )?;
    for (k, method) in methods.iter().enumerate() {
        let mine: Vec<&SweepRow> = rows.iter().filter(|r| &r.method == method).collect();
        let style = color(k);
        let width = if method == "ilp" { 4 } else { 2 };
        let label = if method == "ilp" {
            "ilp (Pareto frontier)".to_string()
        } else {
            method.clone()
        };
        let mut first = true;
        for segment in segments(&mine) {
            let series =
                chart.draw_series(LineSeries::new(segment.clone(), style.stroke_width(width)))?;
            if first {
                series.label(label.clone()).legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 24, y)], style.stroke_width(width))
                });
                first = false;
            }
            chart.draw_series(segment.iter().map(|&p| Circle::new(p, 4, style.filled())))?;
        }
    }
    legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    root.present()
}

fn draw_levels<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    rows: &[SweepRow],
) -> Drawn<DB> {
    let ilp: Vec<&SweepRow> = rows
        .iter()
        .filter(|r| r.method == "ilp" && r.feasible)
        .collect();
    let caps = extent(ilp.iter().map(|r| r.cap_bytes as f64 / GIB)).unwrap_or((0.0, 1.0));
    let mut chart = frame(root, title, caps, 0.0..100.0, "share of units (%)")?;
    let share = |r: &SweepRow, n: usize| {
        100.0 * n as f64 / (r.units_none + r.units_sdp + r.units_fsdp).max(1) as f64
    };
    let lines: [(&str, UnitCount); 4] = [
        ("none (replicated)", |r| r.units_none),
        ("sdp (ZeRO-2)", |r| r.units_sdp),
        ("fsdp (ZeRO-3)", |r| r.units_fsdp),
        ("recomputed", |r| r.recomputed_units),
    ];
    for (k, (name, value)) in lines.iter().enumerate() {
        let points: Vec<(f64, f64)> = ilp
            .iter()
            .map(|r| (r.cap_bytes as f64 / GIB, share(r, value(r))))
            .collect();
        let style = color(k + 1);
        chart
            .draw_series(LineSeries::new(points.clone(), style.stroke_width(3)))?
            .label(*name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 24, y)], style.stroke_width(3))
            });
        chart.draw_series(points.iter().map(|&p| Circle::new(p, 4, style.filled())))?;
    }
    legend(&mut chart, SeriesLabelPosition::MiddleRight)?;
    root.present()
}

/// The two charts of a sweep.
enum Chart<'a> {
    Times {
        title: String,
        rows: &'a [SweepRow],
        methods: &'a [String],
    },
    Levels {
        title: String,
        rows: &'a [SweepRow],
    },
}

fn draw<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, chart: &Chart) -> Drawn<DB> {
    match chart {
        Chart::Times {
            title,
            rows,
            methods,
        } => draw_times(root, title, rows, methods),
        Chart::Levels { title, rows } => draw_levels(root, title, rows),
    }
}

/// Renders one chart to `dir/stem.svg` and `dir/stem.png`, each written atomically.
fn render(dir: &Path, stem: &str, chart: &Chart) -> anyhow::Result<()> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        draw(&root, chart).map_err(|e| anyhow::anyhow!("{stem}.svg: {e}"))?;
    }
    shardplan_scheduler::io::write_atomic(&dir.join(format!("{stem}.svg")), svg.as_bytes())?;
    let png = dir.join(format!("{stem}.png"));
    let tmp = dir.join(format!(".tmp-{}-{stem}.png", std::process::id()));
    let drawn = {
        let root = BitMapBackend::new(&tmp, SIZE).into_drawing_area();
        draw(&root, chart).map_err(|e| anyhow::anyhow!("{}: {e}", png.display()))
    };
    let result = drawn.and_then(|()| {
        std::fs::rename(&tmp, &png)
            .map_err(|e| anyhow::anyhow!("{}: cannot write: {e}", png.display()))
    });
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Writes sweep.{svg,png} into `dir`, and levels.{svg,png} when the ILP found a plan at some cap;
/// returns the names of the files written.
pub fn write_charts(
    dir: &Path,
    profile_name: &str,
    rows: &[SweepRow],
    methods: &[String],
) -> anyhow::Result<Vec<&'static str>> {
    register_font()?;
    render(
        dir,
        "sweep",
        &Chart::Times {
            title: format!("{profile_name}: iteration time vs memory cap"),
            rows,
            methods,
        },
    )?;
    if !rows.iter().any(|r| r.method == "ilp" && r.feasible) {
        return Ok(vec!["sweep.svg", "sweep.png"]);
    }
    render(
        dir,
        "levels",
        &Chart::Levels {
            title: format!("{profile_name}: ILP level mix vs memory cap"),
            rows,
        },
    )?;
    Ok(vec!["sweep.svg", "sweep.png", "levels.svg", "levels.png"])
}
