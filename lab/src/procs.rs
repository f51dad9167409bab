//! Processes, mounts and cgroups as the lab sees them through `/proc` and `/sys`: what lives in
//! a Machine's network namespace (and everything those processes started, containers
//! included), killing by PID with a bounded wait, and undoing what a dockerd mounted.

use std::collections::{BTreeSet, HashMap};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A process as `/proc/<pid>/stat` describes it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ProcStat {
    /// One letter: R, S, D, Z, X...
    pub state: char,
    /// The parent's PID.
    pub ppid: i32,
    /// Clock ticks after boot at which the process started: with the PID, it names one process
    /// even after the PID is reused.
    pub start_time: u64,
}

/// `/proc/<pid>/stat` of `pid`, if it exists.
pub(crate) fn stat(pid: i32) -> Option<ProcStat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces or parentheses itself.
    let after = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    Some(ProcStat {
        state: fields.first()?.chars().next()?,
        ppid: fields.get(1)?.parse().ok()?,
        start_time: fields.get(19)?.parse().ok()?,
    })
}

/// Whether `pid` runs (exists and is not a zombie waiting to be reaped).
pub(crate) fn alive(pid: i32) -> bool {
    stat(pid).is_some_and(|s| s.state != 'Z' && s.state != 'X')
}

/// Whether `pid` is still the process recorded with `start_time` and runs.
pub(crate) fn alive_as(pid: i32, start_time: u64) -> bool {
    stat(pid).is_some_and(|s| s.start_time == start_time && s.state != 'Z' && s.state != 'X')
}

/// Every PID in `/proc`.
fn all_pids() -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

/// The inode of a network namespace file (`/var/run/netns/NAME`), which is what
/// `/proc/<pid>/ns/net` links to (`net:[INODE]`).
pub(crate) fn netns_inode(path: &Path) -> Option<u64> {
    std::fs::metadata(path).ok().map(|m| m.ino())
}

fn pid_netns(pid: i32) -> Option<u64> {
    let link = std::fs::read_link(format!("/proc/{pid}/ns/net")).ok()?;
    let text = link.to_str()?;
    text.strip_prefix("net:[")?.strip_suffix(']')?.parse().ok()
}

/// The PIDs of every cgroup under `dirs` (recursively).
fn cgroup_pids(dirs: &[PathBuf]) -> BTreeSet<i32> {
    fn walk(dir: &Path, out: &mut BTreeSet<i32>) {
        if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
            out.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
        }
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    walk(&e.path(), out);
                }
            }
        }
    }
    let mut out = BTreeSet::new();
    for d in dirs {
        walk(d, &mut out);
    }
    out
}

/// The cgroup directories named `name` directly under the cgroup mounts: `/sys/fs/cgroup/NAME`
/// (cgroup v2) and `/sys/fs/cgroup/<controller>/NAME` (v1), as Docker creates them for a
/// `--cgroup-parent=/NAME`.
pub(crate) fn cgroup_dirs(name: &str) -> Vec<PathBuf> {
    let root = Path::new("/sys/fs/cgroup");
    let mut out = Vec::new();
    let direct = root.join(name);
    if direct.is_dir() {
        out.push(direct);
    }
    if let Ok(entries) = std::fs::read_dir(root) {
        for e in entries.flatten() {
            let candidate = e.path().join(name);
            if candidate.is_dir() {
                out.push(candidate);
            }
        }
    }
    out
}

/// Removes cgroup directories depth-first (a cgroup is removed with `rmdir`, once empty).
pub(crate) fn remove_cgroups(dirs: &[PathBuf]) {
    fn walk(dir: &Path) {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    walk(&e.path());
                }
            }
        }
        let _ = std::fs::remove_dir(dir);
    }
    for d in dirs {
        walk(d);
    }
}

/// What belongs to a Machine: the processes in its network namespaces, the PIDs recorded for
/// it, those in its containers' cgroups, and every descendant of any of them (containers run in
/// their own namespaces, as children of shims that run in the Machine's).
pub(crate) fn belonging(
    netns_inodes: &[u64],
    recorded: &[(i32, u64)],
    cgroups: &[PathBuf],
) -> BTreeSet<i32> {
    let me = std::process::id() as i32;
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    let mut roots: BTreeSet<i32> = BTreeSet::new();
    for pid in all_pids() {
        let Some(s) = stat(pid) else { continue };
        children.entry(s.ppid).or_default().push(pid);
        if pid_netns(pid).is_some_and(|ino| netns_inodes.contains(&ino)) {
            roots.insert(pid);
        }
    }
    roots.extend(
        recorded
            .iter()
            .filter(|(pid, start)| alive_as(*pid, *start))
            .map(|(pid, _)| *pid),
    );
    roots.extend(cgroup_pids(cgroups));
    let mut out = BTreeSet::new();
    let mut todo: Vec<i32> = roots.into_iter().collect();
    while let Some(pid) = todo.pop() {
        if pid == me || pid <= 1 || !out.insert(pid) {
            continue;
        }
        if let Some(kids) = children.get(&pid) {
            todo.extend(kids);
        }
    }
    out.retain(|pid| alive(*pid));
    out
}

/// Sends `signal` to `pid`.
pub(crate) fn signal(pid: i32, signal: i32) {
    // SAFETY: kill(2) has no memory effects; a PID that is gone yields ESRCH, ignored.
    unsafe {
        libc::kill(pid, signal);
    }
}

/// SIGKILLs everything [`belonging`] finds, again and again (a dying dockerd may still fork),
/// until nothing is left or `within` has passed. Returns the PIDs still running at the end.
pub(crate) fn kill_belonging(
    netns_inodes: &[u64],
    recorded: &[(i32, u64)],
    cgroups: &[PathBuf],
    within: Duration,
) -> BTreeSet<i32> {
    let deadline = Instant::now() + within;
    loop {
        let left = belonging(netns_inodes, recorded, cgroups);
        if left.is_empty() || Instant::now() >= deadline {
            return left;
        }
        for pid in &left {
            signal(*pid, libc::SIGKILL);
        }
        wait_gone(
            &left,
            Duration::from_millis(500).min(deadline - Instant::now()),
        );
    }
}

/// Waits until none of `pids` runs, at most `within`. Returns whether they all ended.
pub(crate) fn wait_gone(pids: &BTreeSet<i32>, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if pids.iter().all(|p| !alive(*p)) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The mount points at or under `dir`, deepest first, from `/proc/self/mountinfo`.
pub(crate) fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = text
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape_mount_path(p)))
        .filter(|p| p.starts_with(dir))
        .collect();
    out.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
    out.dedup();
    out
}

/// mountinfo writes space, tab, newline and backslash as `\ooo`.
fn unescape_mount_path(p: &str) -> String {
    let bytes = p.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 3 < bytes.len() {
            let oct = std::str::from_utf8(&bytes[i + 1..i + 4]).unwrap_or("");
            if let Ok(v) = u8::from_str_radix(oct, 8) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Detaches every mount at or under `dir` (lazily: a mount still busy goes once its last user
/// does), deepest first, until none is left or a few rounds did not help. Returns what is left.
pub(crate) fn unmount_under(dir: &Path) -> Vec<PathBuf> {
    for _ in 0..5 {
        let mounts = mounts_under(dir);
        if mounts.is_empty() {
            return mounts;
        }
        for m in &mounts {
            let Ok(c) = std::ffi::CString::new(m.as_os_str().as_encoded_bytes()) else {
                continue;
            };
            // SAFETY: a valid NUL-terminated path; umount2 has no memory effects.
            unsafe {
                libc::umount2(c.as_ptr(), libc::MNT_DETACH);
            }
        }
    }
    mounts_under(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_paths_are_unescaped() {
        assert_eq!(unescape_mount_path(r"/a\040b"), "/a b");
        assert_eq!(unescape_mount_path("/plain/path"), "/plain/path");
        assert_eq!(unescape_mount_path(r"/end\"), r"/end\");
    }

    #[test]
    fn this_process_is_alive_and_its_stat_parses() {
        let me = std::process::id() as i32;
        let s = stat(me).expect("own stat");
        assert!(alive(me));
        assert!(alive_as(me, s.start_time));
        assert!(!alive_as(me, s.start_time + 1));
        assert!(s.ppid > 0);
    }
}
