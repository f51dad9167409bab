//! Test helper, not a product binary: the writer that `tests/crash.rs` kills with SIGKILL.
//!
//! Opens the store in `PLOYZ_CRASH_DIR` as Machine `PLOYZ_CRASH_MACHINE`, prints `ready`, then
//! writes forever from write number `PLOYZ_CRASH_START` on, printing `ack N` after each `put`
//! returned. Key and value of write N: key `crash/<N mod 50>`, value N as 8 big-endian bytes.

use std::io::Write;
use std::process::ExitCode;

use ployz_core::MachineId;
use ployz_store::{Key, Store};

/// How many distinct keys the writes cycle through (the test reads them back by the same rule).
const KEYS: u64 = 50;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("crash writer: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The value of environment variable `name`, or an error naming it.
fn var(name: &str) -> Result<String, String> {
    std::env::var(name).map_err(|e| format!("{name}: {e} (tests/crash.rs sets it)"))
}

fn run() -> Result<(), String> {
    let dir = var("PLOYZ_CRASH_DIR")?;
    let machine_text = var("PLOYZ_CRASH_MACHINE")?;
    let machine: MachineId = machine_text
        .parse()
        .map_err(|e| format!("PLOYZ_CRASH_MACHINE={machine_text:?} is not a Machine ID: {e}"))?;
    let start_text = var("PLOYZ_CRASH_START")?;
    let start: u64 = start_text
        .parse()
        .map_err(|e| format!("PLOYZ_CRASH_START={start_text:?} is not a number: {e}"))?;
    let store = Store::open(&dir, machine.clone())
        .map_err(|e| format!("cannot open the store in {dir}: {e}"))?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready").map_err(|e| format!("stdout: {e}"))?;
    out.flush().map_err(|e| format!("stdout: {e}"))?;
    for n in start.. {
        let key = Key::machine(&machine, "crash", (n % KEYS).to_string());
        store
            .put(&key, n.to_be_bytes().to_vec())
            .map_err(|e| format!("write {n}: {e}"))?;
        writeln!(out, "ack {n}").map_err(|e| format!("stdout: {e}"))?;
        out.flush().map_err(|e| format!("stdout: {e}"))?;
    }
    Ok(())
}
