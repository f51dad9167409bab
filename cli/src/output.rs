//! How results reach a person or a script: tables, JSON, and one-line errors.

use comfy_table::{presets, ContentArrangement, Table};
use serde::Serialize;

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
