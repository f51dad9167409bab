//! Crash safety: a child process writes records and acknowledges each write after `put` returns;
//! the parent kills it with SIGKILL at a random moment, many rounds over. The store must reopen
//! every time and hold every acknowledged write (or a newer one for the same key).
//!
//! The child is the `ployz-store-crash-writer` helper binary (`tests/helpers/crash_writer.rs`).

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use ployz_core::MachineId;
use ployz_store::{Key, Store};
use rand::Rng;

/// Keys the writer cycles through (its own `KEYS`: write N goes to key N mod 50).
const KEYS: u64 = 50;
const ROUNDS: usize = 30;
/// The writer the test kills: a helper binary of this package.
const WRITER: &str = env!("CARGO_BIN_EXE_ployz-store-crash-writer");

fn key(machine: &MachineId, n: u64) -> Key {
    Key::machine(machine, "crash", (n % KEYS).to_string())
}

#[test]
fn every_acknowledged_write_survives_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let machine = MachineId::generate();
    let mut rng = rand::thread_rng();
    // Per key, the highest write acknowledged so far.
    let mut acked: HashMap<u64, u64> = HashMap::new();
    let mut next = 0u64;
    let mut total_acks = 0usize;
    for round in 0..ROUNDS {
        let mut child = Command::new(WRITER)
            .env("PLOYZ_CRASH_DIR", dir.path())
            .env("PLOYZ_CRASH_MACHINE", machine.as_str())
            .env("PLOYZ_CRASH_START", next.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (first_ack, writing) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut acks = Vec::new();
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(n) = line.strip_prefix("ack ") {
                    acks.push(n.parse::<u64>().unwrap());
                    if acks.len() == 1 {
                        let _ = first_ack.send(());
                    }
                }
            }
            acks
        });
        // The kill lands at a random moment once the writer is writing (not while it opens the
        // store, which would test nothing): wait for its first acknowledgement, bounded.
        if writing.recv_timeout(Duration::from_secs(60)).is_err() {
            let _ = child.kill();
            let _ = child.wait();
            panic!("round {round}: the writer acknowledged no write within 60 s");
        }
        std::thread::sleep(Duration::from_millis(rng.gen_range(0..220)));
        child.kill().unwrap();
        child.wait().unwrap();
        let acks = reader.join().unwrap();
        total_acks += acks.len();
        for n in &acks {
            let slot = acked.entry(n % KEYS).or_insert(*n);
            *slot = (*slot).max(*n);
        }
        // Unacknowledged writes may or may not have landed; start past them either way.
        next = acks.last().map_or(next, |n| n + 1) + 1000;

        let store = Store::open(dir.path(), machine.clone())
            .unwrap_or_else(|e| panic!("round {round}: the store did not reopen: {e}"));
        for (k, n) in &acked {
            let record = store
                .get(&key(&machine, *k))
                .unwrap()
                .unwrap_or_else(|| panic!("round {round}: acknowledged key {k} is gone"));
            let held = u64::from_be_bytes(record.value.as_slice().try_into().unwrap());
            assert!(
                held >= *n,
                "round {round}: key {k} holds write {held}, older than acknowledged {n}"
            );
        }
    }
    assert!(
        total_acks > ROUNDS,
        "the writer barely wrote ({total_acks} acks); the test proved little"
    );
}
