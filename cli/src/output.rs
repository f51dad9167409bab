//! How results reach a person or a script: tables, JSON, and one-line errors.

use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};

use comfy_table::{presets, ContentArrangement, Table};
use serde::Serialize;

/// Set once stdout's reader has gone; nothing more is written there.
static READER_GONE: AtomicBool = AtomicBool::new(false);

/// Writes to stdout for the crate's `println!`/`print!`. A reader that has gone (EPIPE) stops
/// the output and nothing else; any other failure to write is reported on stderr once.
pub fn print_out(args: std::fmt::Arguments<'_>) {
    if READER_GONE.load(Ordering::Relaxed) {
        return;
    }
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(args).and_then(|()| out.flush()) {
        READER_GONE.store(true, Ordering::Relaxed);
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            eprintln!("error: cannot write to stdout: {e}; the command goes on without output");
        }
    }
}

/// A plain, aligned table with a header, as `ls`-style commands print.
pub fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_preset(presets::NOTHING)
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header(header.iter().copied());
    for column in t.column_iter_mut() {
        column.set_padding((0, 3));
    }
    t
}

/// Prints a table without the trailing padding of its last column.
pub fn print_table(t: &Table) {
    for line in t.to_string().lines() {
        println!("{}", line.trim_end());
    }
}

/// Prints a value as pretty JSON on stdout.
pub fn print_json<T: Serialize>(value: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// Prints an error as one line on stderr: the error and its causes, joined.
pub fn print_error(e: &anyhow::Error) {
    eprintln!("error: {e:#}");
}

/// What a command that refuses or fails prints on stdout with `--json`: every problem, and the
/// warnings found on the way. Absent fields are `null`.
#[derive(Debug, Clone, Serialize)]
pub struct ErrorDocument {
    pub errors: Vec<Problem>,
    pub warnings: Vec<Warning>,
}

/// One reason a command refused or failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    pub kind: ProblemKind,
    /// The Compose file the problem is in.
    pub file: Option<String>,
    /// The Service it is about, as the Compose file names it.
    pub service: Option<String>,
    /// The key it is about (`ports[0]`, `healthcheck.interval`).
    pub key: Option<String>,
    /// The value at fault, as written: never a value read from an env file or a secret.
    pub value: Option<String>,
    /// What is wrong.
    pub message: String,
    /// What to do about it.
    pub fix: Option<String>,
    /// The problem as one line, as stderr shows it after `error: `.
    #[serde(skip)]
    pub line: String,
}

impl Problem {
    /// A problem known only by its text (`message; fix` as one line).
    pub fn from_text(kind: ProblemKind, text: String) -> Problem {
        Problem {
            kind,
            file: None,
            service: None,
            key: None,
            value: None,
            message: text.clone(),
            fix: None,
            line: text,
        }
    }
}

/// Where a problem was found, as `--json` names it (`"kind"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProblemKind {
    /// In the Compose files: the loader refused them.
    Compose,
    /// In planning what loaded against what the Machines show.
    Plan,
    /// The command line asks for something the command cannot do.
    Usage,
    /// The daemon could not be reached or did not answer.
    Daemon,
    /// The Machine's lease is held by another command.
    Lease,
    /// Anything else that stopped the command.
    Failed,
}

/// Something worth a second look that did not stop the command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Warning {
    pub file: Option<String>,
    pub service: Option<String>,
    pub key: Option<String>,
    pub message: String,
    /// The warning as one line, as stderr shows it after `warning: `.
    #[serde(skip)]
    pub line: String,
}

impl Warning {
    /// A warning known only by its text.
    pub fn from_text(text: String) -> Warning {
        Warning {
            file: None,
            service: None,
            key: None,
            message: text.clone(),
            line: text,
        }
    }
}

/// Prints each warning on stderr as one `warning: ...` line.
pub fn print_warnings(warnings: &[Warning]) {
    for w in warnings {
        eprintln!("warning: {}", w.line);
    }
}

/// Every problem of a refused command, as `main` prints an error: one problem per line, each
/// after `error: ` (`main` writes the first one's), so each line stands alone.
#[derive(Debug)]
pub struct Problems(pub Vec<Problem>);

impl std::fmt::Display for Problems {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, p) in self.0.iter().enumerate() {
            if i > 0 {
                write!(f, "\nerror: ")?;
            }
            write!(f, "{}", p.line)?;
        }
        Ok(())
    }
}

impl std::error::Error for Problems {}

/// A byte count as people read it: `512 B`, `1.5 KiB`, `12.3 MiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}
