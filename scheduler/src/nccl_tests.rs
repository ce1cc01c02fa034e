//! Measured collective curves from nccl-tests (`all_gather_perf`, `reduce_scatter_perf`,
//! `all_reduce_perf`): the text output in its current and older column layouts, and the `-J`
//! JSON output. A curve takes the out-of-place time (µs) at each `size` (the full buffer in
//! bytes).
//!
//! Text: columns are found from the header line (`size count type redop [root] time algbw busbw
//! #wrong|error time …`, with or without the leading `#`); without a header, a `root` column is
//! assumed when the row has 13 or more fields. Lines that are not result rows (NCCL INFO logs,
//! comments) are skipped, mpirun's `[1,0]<stdout>:` prefixes removed, trailing extra columns
//! (timestamps) ignored. Results are refused when any row's `#wrong` is a count above 0 (`N/A`,
//! validation off, is accepted), or the `Out of bounds values` footer is above 0. In the older
//! layout the `error` column is the largest deviation (1e-7 is normal for float sums), so there
//! only the footer decides.

use crate::curve::CommCurve;
use crate::{Error, Result};
use serde_json::Value;

/// Parses one nccl-tests output; `origin` names it in errors.
pub fn parse(text: &str, origin: &str) -> Result<CommCurve> {
    let points = if text.trim_start().starts_with('{') {
        parse_json(text, origin)?
    } else {
        parse_text(text, origin)?
    };
    finish(points, origin)
}

fn bad(origin: &str, field: impl Into<String>, expected: impl Into<String>) -> Error {
    Error::invalid(origin, field, expected)
}

/// Sorts, refuses duplicate sizes and checks the table.
fn finish(mut points: Vec<(u64, f64)>, origin: &str) -> Result<CommCurve> {
    points.sort_by_key(|p| p.0);
    if let Some(w) = points.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(bad(
            origin,
            "size",
            format!(
                "one result row per size, {} appears twice (run one data type and one op per file)",
                w[0].0
            ),
        ));
    }
    let curve = CommCurve { points };
    curve.check().map_err(|why| bad(origin, "results", why))?;
    Ok(curve)
}

/// Drops mpirun's `--tag-output` prefix (`[1,0]<stdout>:`).
fn untag(line: &str) -> &str {
    match (line.starts_with('['), line.find("]<stdout>:")) {
        (true, Some(k)) => &line[k + "]<stdout>:".len()..],
        _ => line,
    }
}

/// Column positions of one text layout.
#[derive(Debug, Clone, Copy)]
struct Columns {
    time: usize,
    /// The out-of-place and in-place `#wrong` columns; None in the older `error` layout.
    wrong: Option<(usize, usize)>,
}

impl Columns {
    fn from_header(names: &[&str]) -> Option<Columns> {
        let time = names.iter().position(|n| *n == "time" || *n == "cputime")?;
        let wrong = match names.get(time + 3) {
            Some(&"#wrong") => Some((time + 3, time + 7)),
            _ => None,
        };
        Some(Columns { time, wrong })
    }

    /// Without a header: a row of 13+ fields has a `root` column.
    fn guess(fields: usize) -> Columns {
        if fields >= 13 {
            Columns {
                time: 5,
                wrong: Some((8, 12)),
            }
        } else {
            Columns {
                time: 4,
                wrong: None,
            }
        }
    }
}

fn parse_text(text: &str, origin: &str) -> Result<Vec<(u64, f64)>> {
    let mut columns: Option<Columns> = None;
    let mut points = Vec::new();
    for (number, raw) in text.lines().enumerate() {
        let line = untag(raw).trim();
        let body = line.trim_start_matches('#').trim();
        let tokens: Vec<&str> = body.split_whitespace().collect();
        let at = || format!("{origin}:{}", number + 1);
        if tokens.first() == Some(&"size") && tokens.contains(&"count") {
            columns = Columns::from_header(&tokens).or(columns);
            continue;
        }
        if let Some(rest) = body.strip_prefix("Out of bounds values") {
            let count: u64 = rest
                .trim_start_matches([' ', ':'])
                .split_whitespace()
                .next()
                .and_then(|t| t.parse().ok())
                .unwrap_or(0);
            if count > 0 {
                return Err(bad(
                    &at(),
                    "Out of bounds values",
                    format!("0 wrong results, got {count}: the run failed validation"),
                ));
            }
            continue;
        }
        if line.starts_with('#') || tokens.len() < 8 {
            continue;
        }
        let (Ok(size), Ok(_count)) = (tokens[0].parse::<u64>(), tokens[1].parse::<u64>()) else {
            continue;
        };
        let c = columns.unwrap_or_else(|| Columns::guess(tokens.len()));
        let time: f64 = tokens
            .get(c.time)
            .and_then(|t| t.parse().ok())
            .ok_or_else(|| {
                bad(
                    &at(),
                    "time",
                    format!(
                        "an out-of-place time in µs in column {} of the row for size {size}",
                        c.time + 1
                    ),
                )
            })?;
        if let Some((oop, ip)) = c.wrong {
            for (k, which) in [(oop, "out-of-place"), (ip, "in-place")] {
                match tokens.get(k) {
                    Some(&"N/A") | None => {}
                    Some(t) => {
                        let wrong: f64 = t.parse().map_err(|_| {
                            bad(&at(), "#wrong", format!("a count or N/A, got `{t}`"))
                        })?;
                        if wrong > 0.0 {
                            return Err(bad(
                                &at(),
                                "#wrong",
                                format!(
                                    "0 wrong results, got {t} {which} at size {size}: the run failed validation"
                                ),
                            ));
                        }
                    }
                }
            }
        }
        points.push((size, time));
    }
    if points.is_empty() {
        return Err(bad(
            origin,
            "results",
            "nccl-tests result rows (size, count, type, redop, [root], time, …); found none",
        ));
    }
    Ok(points)
}

fn parse_json(text: &str, origin: &str) -> Result<Vec<(u64, f64)>> {
    let doc: Value = serde_json::from_str(text).map_err(|e| Error::Parse {
        origin: format!("{origin}:{}:{}", e.line(), e.column()),
        message: e.to_string(),
    })?;
    if let Some(count) = doc.pointer("/out_of_bounds/count").and_then(Value::as_u64)
        && count > 0
    {
        return Err(bad(
            origin,
            "out_of_bounds.count",
            format!("0 wrong results, got {count}: the run failed validation"),
        ));
    }
    let results = doc
        .get("results")
        .and_then(Value::as_array)
        .ok_or_else(|| {
            bad(
                origin,
                "results",
                "a list of result objects (nccl-tests -J output)",
            )
        })?;
    results
        .iter()
        .enumerate()
        .map(|(k, r)| {
            let field = |name: &str| format!("results[{k}].{name}");
            let size = r
                .get("size")
                .and_then(Value::as_u64)
                .ok_or_else(|| bad(origin, field("size"), "the message size in bytes"))?;
            let oop = r
                .get("out_of_place")
                .filter(|v| v.is_object())
                .ok_or_else(|| {
                    bad(
                        origin,
                        field("out_of_place"),
                        "an object with the out-of-place time",
                    )
                })?;
            let time = oop
                .get("time")
                .or_else(|| oop.get("cpu_time"))
                .and_then(Value::as_f64)
                .ok_or_else(|| bad(origin, field("out_of_place.time"), "a time in µs"))?;
            for place in ["out_of_place", "in_place"] {
                if let Some(wrong) = r
                    .get(place)
                    .and_then(|p| p.get("nwrong"))
                    .and_then(Value::as_f64)
                    && wrong > 0.0
                {
                    return Err(bad(
                        origin,
                        field(&format!("{place}.nwrong")),
                        format!("0 wrong results, got {wrong} at size {size}"),
                    ));
                }
            }
            Ok((size, time))
        })
        .collect()
}
