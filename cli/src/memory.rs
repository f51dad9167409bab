//! How the daemon gives memory back. glibc's malloc keeps what a thread frees in that thread's
//! arena and returns to the system only the free space at the top of each heap. A burst (many
//! edge connections at once, large API bodies, many TLS handshakes) spreads short-lived buffers
//! through the arenas of the edge's and the API's threads; the few that live on pin the heaps,
//! and the resident size stays at the burst's high mark for good, though little of it is in
//! use. So the daemon caps its arenas, and a thread of its own reads the resident size every
//! few seconds and has malloc release every free page (`malloc_trim`, which walks each arena
//! under its lock once) when it has grown by [`TRIM_AFTER_GROWTH`] since the last trim, or has
//! grown at all and then held still for a look (the burst is over): under steady load it
//! trims at most once, and an idle daemon comes back to what it uses.

/// How often the resident size is read (one read of `/proc/self/statm`).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const CHECK_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Growth of resident anonymous memory since the last trim (or the lowest value seen since) that
/// makes the daemon trim at once, while the growth may still go on.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const TRIM_AFTER_GROWTH: u64 = 8 * 1024 * 1024;

/// Growth since the last trim that makes the daemon trim once the resident size holds still
/// (moved less than [`STILL`] between two looks): below it a trim is not worth its walk.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const TRIM_WHEN_STILL: u64 = 1024 * 1024;

/// How little the resident size may move between two looks and count as holding still.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const STILL: u64 = 256 * 1024;

/// Arenas malloc may create. glibc's default is eight per core, one per thread that meets
/// contention; the daemon's hot threads are the edge's workers, one per core.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const ARENA_MAX: i32 = 4;

/// Sets up the allocator for a long-running daemon process: fewer arenas (unless
/// `MALLOC_ARENA_MAX` says otherwise) and freed memory returned to the system after growth.
/// Call first thing, before any other thread starts.
pub fn configure_for_daemon() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
            // SAFETY: mallopt only changes malloc's parameters; no other thread exists yet.
            unsafe { libc::mallopt(libc::M_ARENA_MAX, ARENA_MAX) };
        }
        let spawned = std::thread::Builder::new()
            .name("ployz-memory".into())
            .spawn(return_freed_memory);
        if let Err(e) = spawned {
            eprintln!("warning: cannot start the thread that returns freed memory: {e}");
        }
    }
}

/// Resident anonymous memory in bytes (resident minus file-backed shared pages), from
/// `/proc/self/statm`.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn resident_anonymous() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let mut fields = statm.split_whitespace().skip(1);
    let resident: u64 = fields.next()?.parse().ok()?;
    let shared: u64 = fields.next()?.parse().ok()?;
    // SAFETY: sysconf reads a constant of the system.
    let page = u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).ok()?;
    Some(resident.saturating_sub(shared) * page)
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn return_freed_memory() {
    let Some(mut floor) = resident_anonymous() else {
        return;
    };
    let mut last = floor;
    loop {
        std::thread::sleep(CHECK_EVERY);
        let Some(now) = resident_anonymous() else {
            return;
        };
        let growth = now.saturating_sub(floor);
        let still = now.abs_diff(last) < STILL;
        last = now;
        if growth <= TRIM_AFTER_GROWTH && !(still && growth > TRIM_WHEN_STILL) {
            floor = floor.min(now);
            continue;
        }
        let started = std::time::Instant::now();
        // SAFETY: malloc_trim is thread-safe: it takes each arena's lock in turn.
        unsafe { libc::malloc_trim(0) };
        let after = resident_anonymous().unwrap_or(now);
        tracing::debug!(
            before_kib = now / 1024,
            after_kib = after / 1024,
            took_us = started.elapsed().as_micros() as u64,
            "freed memory returned to the system"
        );
        floor = after;
        last = after;
    }
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::*;

    #[test]
    fn resident_anonymous_memory_is_read_and_follows_use() {
        let before = resident_anonymous().expect("statm readable");
        assert!(before > 0);
        // 64 MiB written page by page is resident until freed.
        let block = vec![1u8; 64 * 1024 * 1024];
        let during = resident_anonymous().expect("statm readable");
        assert!(
            during >= before + 32 * 1024 * 1024,
            "resident anonymous memory {during} did not grow from {before}"
        );
        drop(block);
    }
}
