//! Human output (aligned tables) and machine output (one JSON object on stdout).

use serde_json::Value;
use std::io::Write;

/// What a command prints, its failures included: lines for people, or one JSON document on
/// stdout (`--json`). It replaces the `json: bool` parameters: `Json` is their `true`, `Text`
/// their `false`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    Text,
    Json,
}

impl Output {
    /// The output a command's `--json` flag (clap's bool) asks for: the one conversion.
    pub fn of_json_flag(json: bool) -> Output {
        if json { Output::Json } else { Output::Text }
    }
}

/// Writes one line on stdout. A reader that has gone away (`shardplan … | head`) is not a
/// failure: the rest of the output is dropped, as `println!` would instead panic.
pub fn emit(line: std::fmt::Arguments) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(line).and_then(|()| out.write_all(b"\n"))
        && e.kind() != std::io::ErrorKind::BrokenPipe
    {
        eprintln!("warning: cannot write to standard output: {e}");
    }
}

/// `println!` through [`emit`].
macro_rules! outln {
    () => {
        $crate::output::emit(format_args!(""))
    };
    ($($arg:tt)*) => {
        $crate::output::emit(format_args!($($arg)*))
    };
}
pub(crate) use outln;

/// Prints one JSON object on stdout.
pub fn print_json(value: &Value) {
    outln!(
        "{}",
        serde_json::to_string_pretty(value).expect("JSON values serialise")
    );
}

/// A plain text table: cells that start with a digit are right-aligned, the rest left-aligned.
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&str]) -> Self {
        Table {
            header: header.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let widths: Vec<usize> = (0..self.header.len())
            .map(|c| {
                self.rows
                    .iter()
                    .map(|r| r[c].chars().count())
                    .chain([self.header[c].len()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let line = |cells: &[String]| {
            cells
                .iter()
                .zip(&widths)
                .enumerate()
                .map(|(c, (cell, w))| {
                    if c == 0 {
                        format!("{cell:<w$}")
                    } else {
                        format!("{cell:>w$}")
                    }
                })
                .collect::<Vec<_>>()
                .join("  ")
                .trim_end()
                .to_string()
        };
        let mut out = vec![line(&self.header)];
        out.push(
            widths
                .iter()
                .map(|w| "-".repeat(*w))
                .collect::<Vec<_>>()
                .join("  "),
        );
        out.extend(self.rows.iter().map(|r| line(r)));
        out.join("\n")
    }
}

/// Milliseconds with three decimals, from µs.
pub fn ms(us: f64) -> String {
    format!("{:.3} ms", us / 1e3)
}
