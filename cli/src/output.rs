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
