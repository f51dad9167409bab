//! `ployz-lab-sweep`: removes every lab whose process has ended (a crashed test, a `kill -9`,
//! a lab kept with `PLOYZ_LAB_KEEP=1`): its processes, mounts, network namespaces, links,
//! FORWARD rule, cgroups and directory, by the names and PIDs its state file records. Waits
//! while a running lab holds the lock (`--now`: refuse instead). The lab root is
//! `PLOYZ_LAB_ROOT`, default `/var/tmp/ployz-lab`.

use std::process::ExitCode;

fn main() -> ExitCode {
    let now = std::env::args().skip(1).any(|a| a == "--now");
    let root = ployz_lab::lab_root();
    let lock = if now {
        ployz_lab::LabLock::try_acquire(&root)
    } else {
        ployz_lab::LabLock::acquire(&root)
    };
    let lock = match lock {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let left = lock.sweep();
    if left.is_empty() {
        println!("no lab left under {}", root.display());
        ExitCode::SUCCESS
    } else {
        for l in &left {
            eprintln!("error: {l}");
        }
        ExitCode::FAILURE
    }
}
