//! Crash safety: a child process writes records and acknowledges each write after `put` returns;
//! the parent kills it with SIGKILL at a random moment, many rounds over. The store must reopen
//! every time and hold every acknowledged write (or a newer one for the same key).
//!
//! The child is this test binary re-executed with `PLOYZ_CRASH_DIR` set, running
//! [`crash_child_writer`]; run normally, that function returns at once.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use ployz_core::MachineId;
use ployz_store::{Key, Store};
use rand::Rng;

const KEYS: u64 = 50;
const ROUNDS: usize = 30;

fn key(machine: &MachineId, n: u64) -> Key {
    Key::machine(machine, "crash", (n % KEYS).to_string())
}

/// The child's body: write forever, printing `ack N` after each write returned.
#[test]
fn crash_child_writer() {
    let Ok(dir) = std::env::var("PLOYZ_CRASH_DIR") else {
        return;
    };
    let machine: MachineId = std::env::var("PLOYZ_CRASH_MACHINE")
        .unwrap()
        .parse()
        .unwrap();
    let start: u64 = std::env::var("PLOYZ_CRASH_START").unwrap().parse().unwrap();
    let store = Store::open(&dir, machine.clone()).unwrap();
    println!("ready");
    for n in start.. {
        store
            .put(&key(&machine, n), n.to_be_bytes().to_vec())
            .unwrap();
        println!("ack {n}");
    }
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
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "crash_child_writer",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("PLOYZ_CRASH_DIR", dir.path())
            .env("PLOYZ_CRASH_MACHINE", machine.as_str())
            .env("PLOYZ_CRASH_START", next.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            let mut acks = Vec::new();
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(n) = line.strip_prefix("ack ") {
                    acks.push(n.parse::<u64>().unwrap());
                }
            }
            acks
        });
        std::thread::sleep(Duration::from_millis(rng.gen_range(30..250)));
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
