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
//!
//! The file is checked against the collective it is imported as, so a curve cannot land in the
//! wrong op:
//! - the test's name, where the output carries one (`# Collective test starting: X_perf` or
//!   `concluded: X_perf`; in JSON the program in `args`);
//! - the `redop` column: `none` for all_gather, a reduction (`sum`, …) for the other two;
//! - the `count` column: nccl-tests prints the per-rank count for all_gather and reduce_scatter
//!   (so size = count · type size · ranks) and the whole count for all_reduce (size = count · type
//!   size), which tells the ranks the curve was measured on.
//!
//! Rows of size 0 (requested sizes below one element per rank round down to nothing; nccl-tests
//! prints several) are skipped and counted in the notes. A result row whose size is not a byte
//! count (negative, fractional) is refused, not skipped.

use crate::curve::CommCurve;
use crate::timeline::Collective;
use crate::{Error, Result};
use serde_json::Value;

/// Whether `collective`'s `count` column is per rank (size = count · type size · ranks).
fn count_per_rank(collective: Collective) -> bool {
    collective != Collective::AllReduce
}

/// The tests nccl-tests builds, longest names first so a prefix match picks the right one.
const TESTS: [&str; 10] = [
    "reduce_scatter",
    "all_gather",
    "all_reduce",
    "hypercube",
    "broadcast",
    "sendrecv",
    "alltoall",
    "scatter",
    "gather",
    "reduce",
];

/// An imported curve and what the file says about how it was measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Imported {
    pub curve: CommCurve,
    /// The ranks an all_gather or reduce_scatter curve was measured on, from the `count` column;
    /// None for all_reduce (its count does not tell) and for unknown data types.
    pub ranks: Option<u64>,
    /// What was skipped or could not be checked, one line each.
    pub notes: Vec<String>,
}

/// One result row.
#[derive(Debug, Clone)]
struct Row {
    /// Where the row is (`file:LINE` or `file: results[k]`), for errors.
    at: String,
    size: u64,
    count: u64,
    dtype: String,
    redop: String,
    time_us: f64,
}

/// Parses one nccl-tests output imported as `collective`; `origin` names it in errors.
pub fn parse(text: &str, origin: &str, collective: Collective) -> Result<Imported> {
    let (rows, test) = if text.trim_start().starts_with('{') {
        parse_json(text, origin)?
    } else {
        parse_text(text, origin)?
    };
    if let Some(test) = test
        && test != collective.test_name()
    {
        return Err(bad(
            origin,
            "test",
            format!(
                "an output of {}_perf, got one of {test}_perf",
                collective.test_name()
            ),
        ));
    }
    let zero = rows.iter().filter(|r| r.size == 0).count();
    let rows: Vec<Row> = rows.into_iter().filter(|r| r.size > 0).collect();
    for row in &rows {
        check_redop(row, collective)?;
    }
    let ranks = ranks(&rows, collective)?;
    let mut notes = Vec::new();
    if zero > 0 {
        notes.push(format!(
            "skipped {zero} rows of size 0 (requested sizes below one element per rank)"
        ));
    }
    if let Some(row) = rows.iter().find(|r| type_bytes(&r.dtype).is_none()) {
        notes.push(format!(
            "unknown data type `{}`: the count column was not checked",
            row.dtype
        ));
    }
    let curve = finish(rows.iter().map(|r| (r.size, r.time_us)).collect(), origin)?;
    Ok(Imported {
        curve,
        ranks,
        notes,
    })
}

/// `none` for all_gather, a reduction for reduce_scatter and all_reduce.
fn check_redop(row: &Row, collective: Collective) -> Result<()> {
    let gathers = collective == Collective::AllGather;
    if (row.redop == "none") == gathers {
        return Ok(());
    }
    let expected = if gathers {
        "`none` (all_gather does not reduce)"
    } else {
        "a reduction such as `sum`"
    };
    Err(bad(
        &row.at,
        "redop",
        format!(
            "{expected} in an output of {}_perf, got `{}` at size {}: is this file another \
             collective's output?",
            collective.test_name(),
            row.redop,
            row.size
        ),
    ))
}

/// Bytes of one element of an nccl-tests data type.
fn type_bytes(name: &str) -> Option<u64> {
    Some(match name {
        "int8" | "uint8" | "char" | "f8e4m3" | "f8e5m2" | "fp8_e4m3" | "fp8_e5m2" => 1,
        "half" | "bfloat16" | "float16" => 2,
        "int32" | "uint32" | "int" | "float" | "float32" => 4,
        "int64" | "uint64" | "double" | "float64" => 8,
        _ => return None,
    })
}

/// The ranks implied by the `count` column, the same on every row; None when a type is unknown.
fn ranks(rows: &[Row], collective: Collective) -> Result<Option<u64>> {
    let mut found: Option<u64> = None;
    for row in rows {
        let Some(bytes) = type_bytes(&row.dtype) else {
            return Ok(None);
        };
        let element_bytes = row.count.checked_mul(bytes).unwrap_or(0);
        if element_bytes == 0 || !row.size.is_multiple_of(element_bytes) {
            return Err(bad(
                &row.at,
                "count",
                format!(
                    "a count whose {} bytes divide the size {}, got {}",
                    row.dtype, row.size, row.count
                ),
            ));
        }
        let ratio = row.size / element_bytes;
        if found.is_some_and(|r| r != ratio) {
            return Err(bad(
                &row.at,
                "count",
                format!(
                    "the same ranks on every row, got size/(count·{bytes}) = {ratio} after {}",
                    found.unwrap_or_default()
                ),
            ));
        }
        found = Some(ratio);
    }
    match (found, count_per_rank(collective)) {
        (Some(1), true) => Err(bad(
            rows.first().map_or("", |r| &r.at),
            "count",
            format!(
                "the per-rank count of {}_perf on 2 or more ranks, got count = size / type size: \
                 an all_reduce_perf output, or a run on one rank (which measures no communication)",
                collective.test_name()
            ),
        )),
        (Some(r), false) if r != 1 => Err(bad(
            rows.first().map_or("", |r| &r.at),
            "count",
            format!(
                "all_reduce_perf's count = size / type size, got a per-rank count (size is {r} × \
                 count × type size): an all_gather or reduce_scatter output"
            ),
        )),
        (ranks, per_rank) => Ok(ranks.filter(|_| per_rank)),
    }
}

/// The test named in a line such as `# Collective test starting: all_gather_perf`.
fn named_test(line: &str) -> Option<&'static str> {
    let name = line
        .strip_prefix("Collective test starting:")
        .or_else(|| line.strip_prefix("Collective test concluded:"))?
        .trim();
    test_of_program(name)
}

/// `all_gather` for `./build/all_gather_perf`, `all_gather_perf_mpi`, …
fn test_of_program(program: &str) -> Option<&'static str> {
    let base = program.rsplit('/').next().unwrap_or(program);
    TESTS.into_iter().find(|t| {
        base.strip_prefix(t)
            .is_some_and(|rest| rest.starts_with("_perf"))
    })
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

/// The result rows of a text output, and the test its header or footer names.
fn parse_text(text: &str, origin: &str) -> Result<(Vec<Row>, Option<&'static str>)> {
    let mut columns: Option<Columns> = None;
    let mut rows = Vec::new();
    let mut test = None;
    for (number, raw) in text.lines().enumerate() {
        let line = untag(raw).trim();
        let body = line.trim_start_matches('#').trim();
        let tokens: Vec<&str> = body.split_whitespace().collect();
        let at = || format!("{origin}:{}", number + 1);
        if let Some(named) = named_test(body) {
            test = Some(named);
            continue;
        }
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
        // A result row starts with two numbers; both must be whole byte and element counts.
        if tokens[..2].iter().any(|t| t.parse::<f64>().is_err()) {
            continue;
        }
        let whole = |k: usize, field: &str| {
            tokens[k].parse::<u64>().map_err(|_| {
                bad(
                    &at(),
                    field,
                    format!("a whole number >= 0, got `{}` in a result row", tokens[k]),
                )
            })
        };
        let (size, count) = (whole(0, "size")?, whole(1, "count")?);
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
        rows.push(Row {
            at: at(),
            size,
            count,
            dtype: tokens[2].to_string(),
            redop: tokens[3].to_string(),
            time_us: time,
        });
    }
    if rows.is_empty() {
        return Err(bad(
            origin,
            "results",
            "nccl-tests result rows (size, count, type, redop, [root], time, …); found none",
        ));
    }
    Ok((rows, test))
}

/// The result rows of a `-J` output, and the test its `args` name.
fn parse_json(text: &str, origin: &str) -> Result<(Vec<Row>, Option<&'static str>)> {
    let doc: Value = serde_json::from_str(text).map_err(|e| Error::Parse {
        origin: origin.to_string(),
        location: format!(":{}:{}", e.line(), e.column()),
        field: None,
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
    let test = doc
        .pointer("/args/0")
        .and_then(Value::as_str)
        .and_then(test_of_program);
    let rows = results
        .iter()
        .enumerate()
        .map(|(k, r)| {
            let field = |name: &str| format!("results[{k}].{name}");
            let size = r
                .get("size")
                .and_then(Value::as_u64)
                .ok_or_else(|| bad(origin, field("size"), "the message size in bytes"))?;
            let count = r
                .get("count")
                .and_then(Value::as_u64)
                .ok_or_else(|| bad(origin, field("count"), "the element count"))?;
            let text_of = |name: &str| {
                r.get(name)
                    .and_then(Value::as_str)
                    .map(|v| v.trim().to_string())
                    .ok_or_else(|| bad(origin, field(name), "a string"))
            };
            let (dtype, redop) = (text_of("type")?, text_of("redop")?);
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
            Ok(Row {
                at: format!("{origin}: results[{k}]"),
                size,
                count,
                dtype,
                redop,
                time_us: time,
            })
        })
        .collect::<Result<Vec<Row>>>()?;
    Ok((rows, test))
}
