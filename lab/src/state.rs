//! What a lab owns, written down before it is made, so that a lab whose process died (a
//! `kill -9`, a crashed test, `PLOYZ_LAB_KEEP=1`) is removed by name and PID before the next one
//! starts; and the host-wide lock that lets one lab run at a time.
//!
//! Layout under the lab root ([`lab_root`], default `/var/tmp/ployz-lab`):
//!
//! ```text
//! lock                 flock: held by the running lab's process
//! next-run             the next run number to try
//! <run>/state.json     this module's LabState, written before anything is created
//! <run>/m<i>/          Machine i: dockerd's data and exec roots, the daemon's data, logs
//! ```

use std::fs::{File, OpenOptions};
use std::net::Ipv4Addr;
use std::os::unix::fs::OpenOptionsExt as _;
use std::os::unix::io::AsRawFd as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use serde::{Deserialize, Serialize};

use crate::procs;

/// Where labs live unless `PLOYZ_LAB_ROOT` says otherwise.
pub const DEFAULT_LAB_ROOT: &str = "/var/tmp/ployz-lab";
/// Prefix of every network namespace a lab creates (`ployzlab-<run>-<i>`).
pub const NETNS_PREFIX: &str = "ployzlab-";
/// Prefix of every lab bridge (`plzbr<run>`).
pub const BRIDGE_PREFIX: &str = "plzbr";
/// Prefix of the root-namespace end of every lab veth (`plzv<run>-<i>`).
pub const VETH_PREFIX: &str = "plzv";
/// The comment on the root namespace's FORWARD rule a lab adds for its bridge.
pub const RULE_COMMENT_PREFIX: &str = "ployz-lab";
/// How long [`LabLock::acquire`] waits for another lab to finish.
const LOCK_WAIT: Duration = Duration::from_secs(30 * 60);

/// The directory every lab lives under: `PLOYZ_LAB_ROOT`, else [`DEFAULT_LAB_ROOT`].
pub fn lab_root() -> PathBuf {
    std::env::var_os("PLOYZ_LAB_ROOT")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_LAB_ROOT))
}

/// Everything one lab made, by name and PID.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct LabState {
    /// The run number: the third octet of the underlay (`198.18.<run>.0/24`) and part of every
    /// name.
    pub run: u8,
    /// The process that owns the lab, and its start time (so a reused PID is not taken for it).
    pub owner_pid: i32,
    /// `/proc/<pid>/stat` start time of the owner.
    pub owner_start: u64,
    /// `<root>/<run>`.
    pub dir: PathBuf,
    /// The underlay bridge in the root namespace.
    pub bridge: String,
    /// The comment of the FORWARD rule accepting the bridge's own traffic, when one was added.
    pub forward_rule: Option<String>,
    /// The Machines.
    pub machines: Vec<MachineState>,
}

/// One Machine's names and processes.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct MachineState {
    /// Its index in the lab (0-based).
    pub index: usize,
    /// Its network namespace (`ip netns`).
    pub netns: String,
    /// The root-namespace end of its veth, a port of the bridge.
    pub veth: String,
    /// Its underlay address.
    pub underlay: Ipv4Addr,
    /// Its WireGuard interface name (the daemon's `mesh.interface`).
    pub wg_interface: String,
    /// Its directory.
    pub dir: PathBuf,
    /// The cgroup parent its dockerd gives containers (`/NAME`).
    pub cgroup: String,
    /// Processes started for it, with their start times.
    pub pids: Vec<(i32, u64)>,
}

impl LabState {
    /// The names of a new lab of `machines` Machines under `root`, owned by this process.
    pub(crate) fn new(root: &Path, run: u8, machines: usize) -> LabState {
        let me = std::process::id() as i32;
        let dir = root.join(run.to_string());
        LabState {
            run,
            owner_pid: me,
            owner_start: procs::stat(me).map(|s| s.start_time).unwrap_or(0),
            bridge: format!("{BRIDGE_PREFIX}{run}"),
            forward_rule: None,
            machines: (0..machines)
                .map(|i| MachineState {
                    index: i,
                    netns: format!("{NETNS_PREFIX}{run}-{i}"),
                    veth: format!("{VETH_PREFIX}{run}-{i}"),
                    underlay: Ipv4Addr::new(198, 18, run, 10 + i as u8),
                    wg_interface: format!("plz{run}w{i}"),
                    dir: dir.join(format!("m{i}")),
                    cgroup: format!("ployz-lab-{run}-m{i}"),
                    pids: Vec::new(),
                })
                .collect(),
            dir,
        }
    }

    /// `<dir>/state.json`.
    pub fn file(&self) -> PathBuf {
        self.dir.join("state.json")
    }

    /// Writes the state file (atomically: a temp file renamed over it).
    pub(crate) fn save(&self) -> anyhow::Result<()> {
        std::fs::create_dir_all(&self.dir)
            .with_context(|| format!("cannot create lab dir {}", self.dir.display()))?;
        let tmp = self.dir.join("state.json.tmp");
        let text = serde_json::to_vec_pretty(self)?;
        std::fs::write(&tmp, text).with_context(|| format!("cannot write {}", tmp.display()))?;
        std::fs::rename(&tmp, self.file())
            .with_context(|| format!("cannot write {}", self.file().display()))?;
        Ok(())
    }

    /// Reads a state file.
    pub fn load(file: &Path) -> anyhow::Result<LabState> {
        let text =
            std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
        serde_json::from_slice(&text)
            .with_context(|| format!("{} is not a lab state", file.display()))
    }

    /// Whether the owner process still runs.
    pub fn owner_alive(&self) -> bool {
        procs::alive_as(self.owner_pid, self.owner_start)
    }

    /// Removes everything this state names: kills its processes (everything in its namespaces,
    /// their descendants, its containers' cgroups, the recorded PIDs), unmounts what its
    /// dockerds mounted, removes its WireGuard control sockets, namespaces, veths, bridge,
    /// FORWARD rule, cgroups and directory. Missing pieces are skipped. Returns what could not be
    /// removed, one line each (empty: all gone).
    pub fn remove(&self) -> Vec<String> {
        let mut left = Vec::new();
        let inodes: Vec<u64> = self
            .machines
            .iter()
            .filter_map(|m| procs::netns_inode(&netns_path(&m.netns)))
            .collect();
        let recorded: Vec<(i32, u64)> = self.machines.iter().flat_map(|m| m.pids.clone()).collect();
        let cgroups: Vec<PathBuf> = self
            .machines
            .iter()
            .flat_map(|m| procs::cgroup_dirs(&m.cgroup))
            .collect();
        let alive = procs::kill_belonging(&inodes, &recorded, &cgroups, Duration::from_secs(15));
        if !alive.is_empty() {
            left.push(format!("processes still running after SIGKILL: {alive:?}"));
        }
        // Killed shims leave their sockets in containerd's shared directory: remove them by
        // the name containerd gives them.
        for m in &self.machines {
            for socket in shim_sockets(&m.dir) {
                let _ = std::fs::remove_file(socket);
            }
        }
        let mounts = procs::unmount_under(&self.dir);
        if !mounts.is_empty() {
            left.push(format!("mounts still there: {mounts:?}"));
        }
        for m in &self.machines {
            let _ = std::fs::remove_file(wireguard_socket(&m.wg_interface));
            if netns_path(&m.netns).exists() {
                if let Err(e) = quiet(Command::new("ip").args(["netns", "delete", &m.netns])) {
                    left.push(format!("network namespace {}: {e:#}", m.netns));
                }
            }
            if link_exists(&m.veth) {
                if let Err(e) = quiet(Command::new("ip").args(["link", "delete", &m.veth])) {
                    left.push(format!("link {}: {e:#}", m.veth));
                }
            }
        }
        // Partition groups' bridges (`<bridge>p<g>`), if a partition was left in place.
        let group_prefix = format!("{}p", self.bridge);
        for link in list_links() {
            if link
                .strip_prefix(&group_prefix)
                .is_some_and(|g| g.parse::<usize>().is_ok())
            {
                if let Err(e) = quiet(Command::new("ip").args(["link", "delete", &link])) {
                    left.push(format!("bridge {link}: {e:#}"));
                }
            }
        }
        if link_exists(&self.bridge) {
            if let Err(e) = quiet(Command::new("ip").args(["link", "delete", &self.bridge])) {
                left.push(format!("bridge {}: {e:#}", self.bridge));
            }
        }
        if let Some(comment) = &self.forward_rule {
            remove_forward_rules(comment);
        }
        procs::remove_cgroups(&cgroups);
        if self.dir.exists() {
            // The state file goes last: while anything else is left, it still names it.
            let result = remove_dir_but(&self.dir, &self.file());
            if let Err(e) = result {
                left.push(format!("directory {}: {e:#}", self.dir.display()));
            }
        }
        if left.is_empty() {
            let _ = std::fs::remove_file(self.file());
            let _ = std::fs::remove_dir(&self.dir);
        }
        left
    }
}

/// Removes `dir`'s contents except `keep`.
fn remove_dir_but(dir: &Path, keep: &Path) -> anyhow::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let path = e?.path();
        if path == keep {
            continue;
        }
        let result = if path.is_dir() && !path.is_symlink() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        result.with_context(|| format!("cannot remove {}", path.display()))?;
    }
    Ok(())
}

/// The socket containerd's runc shim (v2) of container `id` listens on, for the dockerd of
/// the Machine in `machine_dir`: `/run/containerd/s/` + hex SHA-256 of
/// `<containerd address>/<namespace>/<id>`, the address being the managed containerd's socket
/// under the exec root and the namespace Docker's `moby`. A shim that ends cleanly removes it;
/// a killed one does not.
pub fn shim_socket(machine_dir: &Path, id: &str) -> Option<PathBuf> {
    let address = machine_dir.join("exec/containerd/containerd.sock");
    let text = format!("{}/moby/{id}", address.display());
    let mut child = Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .ok()?;
    {
        use std::io::Write as _;
        let mut stdin = child.stdin.take()?;
        stdin.write_all(text.as_bytes()).ok()?;
    }
    let out = child.wait_with_output().ok()?;
    let hex = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()?
        .to_owned();
    (hex.len() == 64).then(|| Path::new("/run/containerd/s").join(hex))
}

/// The shim sockets of every container the Machine's dockerd knows (`data/containers/<id>`).
fn shim_sockets(machine_dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(machine_dir.join("data/containers")) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_owned))
        .filter_map(|id| shim_socket(machine_dir, &id))
        .collect()
}

/// `/var/run/netns/NAME`.
pub fn netns_path(name: &str) -> PathBuf {
    Path::new("/var/run/netns").join(name)
}

/// The userspace WireGuard control socket of an interface, shared by every namespace.
pub fn wireguard_socket(interface: &str) -> PathBuf {
    Path::new("/var/run/wireguard").join(format!("{interface}.sock"))
}

/// Whether a link of this name exists in the root namespace.
pub fn link_exists(name: &str) -> bool {
    Path::new("/sys/class/net").join(name).exists()
}

/// Runs a command, failing with its stderr when it exits non-zero.
pub(crate) fn quiet(cmd: &mut Command) -> anyhow::Result<()> {
    let out = cmd
        .output()
        .with_context(|| format!("cannot run {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Deletes every rule of the root namespace's FORWARD chains (IPv4 and IPv6) carrying
/// `comment`.
pub(crate) fn remove_forward_rules(comment: &str) {
    remove_forward_rules_where(|c| c == comment);
}

/// Deletes every rule of the root namespace's FORWARD chains (IPv4 and IPv6) whose comment
/// `pick` chooses.
fn remove_forward_rules_where(pick: impl Fn(&str) -> bool) {
    for tool in ["iptables", "ip6tables"] {
        let Ok(out) = Command::new(tool).args(["-S", "FORWARD"]).output() else {
            continue;
        };
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        for line in text.lines() {
            let Some(rule) = line.strip_prefix("-A FORWARD ") else {
                continue;
            };
            // iptables -S quotes comments with spaces; the words split as a shell would.
            let Some(words) = split_words(rule) else {
                continue;
            };
            let tagged = words.windows(2).any(|w| w[0] == "--comment" && pick(&w[1]));
            if tagged {
                let _ = Command::new(tool)
                    .args(["-D", "FORWARD"])
                    .args(&words)
                    .output();
            }
        }
    }
}

/// Splits an `iptables -S` rule into words, honouring double quotes.
fn split_words(rule: &str) -> Option<Vec<String>> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut in_quotes = false;
    let mut has = false;
    for c in rule.chars() {
        match c {
            '"' => {
                in_quotes = !in_quotes;
                has = true;
            }
            ' ' if !in_quotes => {
                if has {
                    words.push(std::mem::take(&mut cur));
                    has = false;
                }
            }
            _ => {
                cur.push(c);
                has = true;
            }
        }
    }
    if in_quotes {
        return None;
    }
    if has {
        words.push(cur);
    }
    Some(words)
}

/// The host-wide lab lock (`<root>/lock`, flock): one lab at a time, since each raises dockerds
/// and daemons on a small machine. Released when dropped, or when its process dies.
#[derive(Debug)]
pub struct LabLock {
    _file: File,
    root: PathBuf,
}

impl LabLock {
    /// Takes the lock, waiting (bounded, 30 min) while another lab holds it.
    pub fn acquire(root: &Path) -> anyhow::Result<LabLock> {
        Self::take(root, LOCK_WAIT)
    }

    /// Takes the lock if it is free now.
    pub fn try_acquire(root: &Path) -> anyhow::Result<LabLock> {
        Self::take(root, Duration::ZERO)
    }

    fn take(root: &Path, wait: Duration) -> anyhow::Result<LabLock> {
        std::fs::create_dir_all(root).with_context(|| {
            format!(
                "cannot create the lab root {} (PLOYZ_LAB_ROOT)",
                root.display()
            )
        })?;
        let path = root.join("lock");
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(&path)
            .with_context(|| format!("cannot open the lab lock {}", path.display()))?;
        let deadline = Instant::now() + wait;
        let mut said = false;
        loop {
            // SAFETY: flock on an open descriptor we own.
            let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
            if rc == 0 {
                break;
            }
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EWOULDBLOCK) {
                bail!("cannot lock {}: {err}", path.display());
            }
            if Instant::now() >= deadline {
                bail!(
                    "another lab holds {} (one lab runs at a time on a host); wait for it to end, or end its test process",
                    path.display()
                );
            }
            if !said {
                eprintln!(
                    "ployz-lab: waiting for the lab lock {} (another lab runs)",
                    path.display()
                );
                said = true;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(LabLock {
            _file: file,
            root: root.to_owned(),
        })
    }

    /// Removes every lab under the root whose owner is gone (crashed, killed, or kept with
    /// `PLOYZ_LAB_KEEP=1` and since ended), then anything named like a lab that no state file
    /// names (a crash between two steps). Returns, per lab, what could not be removed.
    pub fn sweep(&self) -> Vec<String> {
        let mut left = Vec::new();
        let mut known_netns = Vec::new();
        let mut known_links = Vec::new();
        let mut known_rules = Vec::new();
        if let Ok(entries) = std::fs::read_dir(&self.root) {
            for e in entries.flatten() {
                let file = e.path().join("state.json");
                if !file.exists() {
                    // A run dir without state: created before its state was written, or the
                    // remainder of a removal; nothing outside it is named by it.
                    if e.path().is_dir()
                        && e.file_name()
                            .to_str()
                            .is_some_and(|n| n.parse::<u8>().is_ok())
                    {
                        let remaining = procs::unmount_under(&e.path());
                        if remaining.is_empty() {
                            let _ = std::fs::remove_dir_all(e.path());
                        }
                    }
                    continue;
                }
                let state = match LabState::load(&file) {
                    Ok(s) => s,
                    Err(err) => {
                        left.push(format!("{err:#}"));
                        continue;
                    }
                };
                if state.owner_alive() {
                    known_netns.extend(state.machines.iter().map(|m| m.netns.clone()));
                    known_links.push(state.bridge.clone());
                    known_links.extend(state.machines.iter().map(|m| m.veth.clone()));
                    known_rules.extend(state.forward_rule.clone());
                    continue;
                }
                for l in state.remove() {
                    left.push(format!("lab {}: {l}", state.dir.display()));
                }
            }
        }
        // Names no state file claims.
        let claimed_rules: Vec<String> = known_rules;
        remove_forward_rules_where(|c| {
            c.starts_with(&format!("{RULE_COMMENT_PREFIX} "))
                && !claimed_rules.iter().any(|k| k == c)
        });
        for ns in list_netns() {
            if ns.starts_with(NETNS_PREFIX) && !known_netns.contains(&ns) {
                let inode: Vec<u64> = procs::netns_inode(&netns_path(&ns)).into_iter().collect();
                procs::kill_belonging(&inode, &[], &[], Duration::from_secs(10));
                let _ = quiet(Command::new("ip").args(["netns", "delete", &ns]));
            }
        }
        for link in list_links() {
            let claimed = known_links
                .iter()
                .any(|k| link == *k || link.starts_with(&format!("{k}p")));
            if (link.starts_with(BRIDGE_PREFIX) || link.starts_with(VETH_PREFIX)) && !claimed {
                let _ = quiet(Command::new("ip").args(["link", "delete", &link]));
            }
        }
        left
    }

    /// The lab root this lock guards.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// A run number no leftover uses, remembered in `<root>/next-run` so consecutive labs get
    /// different names.
    pub(crate) fn next_run(&self) -> anyhow::Result<u8> {
        let counter = self.root.join("next-run");
        let start: u8 = std::fs::read_to_string(&counter)
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(0);
        let netns = list_netns();
        for step in 0..=255u16 {
            let run = start.wrapping_add(step as u8);
            let taken = self.root.join(run.to_string()).exists()
                || link_exists(&format!("{BRIDGE_PREFIX}{run}"))
                || netns
                    .iter()
                    .any(|n| n.starts_with(&format!("{NETNS_PREFIX}{run}-")));
            if !taken {
                std::fs::write(&counter, run.wrapping_add(1).to_string())
                    .with_context(|| format!("cannot write {}", counter.display()))?;
                return Ok(run);
            }
        }
        bail!(
            "every run number 0..=255 is taken under {}: run ployz-lab-sweep",
            self.root.display()
        )
    }
}

/// The network namespaces `ip netns` knows.
pub fn list_netns() -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/var/run/netns") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_owned))
        .collect()
}

/// The links of the root namespace.
pub fn list_links() -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/sys/class/net") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_owned))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fit_the_kernel_limits() {
        let s = LabState::new(Path::new("/x"), 255, 16);
        for m in &s.machines {
            assert!(m.veth.len() <= 15, "{}", m.veth);
            assert!(m.wg_interface.len() <= 15, "{}", m.wg_interface);
        }
        assert!(s.bridge.len() <= 15);
        assert_eq!(s.machines[3].underlay, Ipv4Addr::new(198, 18, 255, 13));
        assert_eq!(s.machines[3].dir, Path::new("/x/255/m3"));
    }

    #[test]
    fn iptables_rules_split_like_a_shell() {
        assert_eq!(
            split_words(r#"-i plzbr3 -o plzbr3 -m comment --comment "ployz-lab 3" -j ACCEPT"#)
                .unwrap(),
            [
                "-i",
                "plzbr3",
                "-o",
                "plzbr3",
                "-m",
                "comment",
                "--comment",
                "ployz-lab 3",
                "-j",
                "ACCEPT"
            ]
        );
        assert!(split_words(r#"-m "open"#).is_none());
    }
}
