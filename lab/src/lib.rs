//! The lab: N real Machines on one host, for multi-Machine tests.
//!
//! Each Machine is a network namespace (`ployzlab-<run>-<i>`) joined by a veth to one bridge in
//! the root namespace (`plzbr<run>`, the underlay, `198.18.<run>.0/24` out of the benchmarking
//! range 198.18.0.0/15, never a real network), with its own `dockerd` and its own
//! `ployz daemon run`, both started inside the namespace with `nsenter --net` (not
//! `ip netns exec`, which remounts `/sys`, where dockerd then finds no cgroups), and optionally
//! an `sshd` on its underlay address. With [`LabOptions::hosts`] each Machine is a host of its
//! own instead (systemd as its PID 1, private `/etc`, `/usr`, `/var/lib` and `/run`), where tests
//! install Ployz over SSH as users do. Tests drive Machines through the real CLI ([`Lab::ployz`]),
//! stop and start their processes, partition the underlay and add loss and delay to it.
//!
//! ```no_run
//! use ployz_lab::{Lab, LabOptions};
//! let lab = Lab::start(LabOptions::machines(3));
//! let ls = lab.json(0, &["machine", "ls", "--json"]);
//! # let _ = ls;
//! ```
//!
//! Everything a lab makes is named in a state file before it is made (see [`LabState`]) and
//! removed by name and PID when the [`Lab`] is dropped, also when a test panics. A lab whose
//! process died is removed when the next one starts (or by the `ployz-lab-sweep` binary). One
//! lab runs at a time on a host (an flock, [`LabLock`]): tests of one binary queue on it.
//! `PLOYZ_LAB_KEEP=1` keeps a failed lab up and prints how to enter and remove it.
//!
//! Needs root, iproute2 (`ip`, `bridge`, `tc`), iptables, Docker's `dockerd` and `docker`,
//! `nsenter`, `tar`, Debian's `busybox-static` (`/bin/busybox`), and with `sshd: true`
//! openssh-server and openssh-client. The `ployz` binary comes from `PLOYZ_BIN`, else
//! `target/<profile>/ployz` beside the test executable ([`ployz_bin`]).
//!
//! The public operations panic with a message naming what failed (this is a test harness);
//! [`Lab::try_start`] returns the error instead.

mod host;
mod netem;
mod procs;
mod state;

use std::io::{Read as _, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _};

pub use state::{
    lab_root, link_exists, list_links, list_netns, netns_path, shim_socket, wireguard_socket,
    LabLock, LabState, MachineState, BRIDGE_PREFIX, DEFAULT_LAB_ROOT, NETNS_PREFIX, VETH_PREFIX,
};

/// The test image every Machine's dockerd holds: Debian's busybox-static (`sh`, `httpd`,
/// `wget`, `nc`, `sleep`...), made with `docker import`.
pub const LAB_IMAGE: &str = "ployz-lab/busybox:latest";

/// The underlay's interface inside each Machine's namespace.
pub const UNDERLAY_INTERFACE: &str = "eth0";

/// How long a dockerd may take to answer after it started.
const DOCKERD_READY: Duration = Duration::from_secs(60);
/// How long a daemon may take to answer after it started.
const DAEMON_READY: Duration = Duration::from_secs(30);
/// How long a host Machine's systemd may take to come up.
const HOST_READY: Duration = Duration::from_secs(60);
/// The PATH of a root shell on a host Machine.
const HOST_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// How long sshd may take to listen.
const SSHD_READY: Duration = Duration::from_secs(10);
/// What SIGTERM gets before SIGKILL, per process.
const TERM_GRACE: Duration = Duration::from_secs(15);
/// The most Machines a lab raises (addresses .10 to .73 of its /24).
pub const MAX_MACHINES: usize = 64;

/// What to raise.
#[derive(Debug, Clone, Default)]
pub struct LabOptions {
    /// How many Machines (1 to [`MAX_MACHINES`]).
    pub machines: usize,
    /// An sshd in each Machine on its underlay address, port 22, and the client side
    /// ([`Lab::ssh_command`], set as `PLOYZ_SSH_COMMAND` for [`Lab::ployz`]), so
    /// `ployz machine add ssh://root@<underlay>` works.
    pub sshd: bool,
    /// The daemons' internal DNS on the Machine Gateway (`[dns] listen = "gateway"`); off
    /// otherwise.
    pub dns: bool,
    /// Per-Machine settings, by index; Machines beyond the list get the defaults.
    pub per_machine: Vec<MachineOptions>,
    /// The daemons' `PLOYZ_LOG` filter; `None`: `info`.
    pub log_filter: Option<String>,
    /// Host Machines: each Machine a host of its own, the way a server is one (systemd as
    /// PID 1 of its own namespaces; private `/etc`, `/usr`, `/var/lib`, `/var/log`,
    /// `/var/cache`, `/run` and `/tmp`; its own dockerd serving `/run/docker.sock`; an sshd),
    /// with no Ployz on it: tests install it as users do (`ployz machine init ssh://...`).
    /// Implies `sshd`; see `host.rs`.
    pub hosts: bool,
}

impl LabOptions {
    /// `n` Machines, no sshd, everything else default.
    pub fn machines(n: usize) -> LabOptions {
        LabOptions {
            machines: n,
            ..LabOptions::default()
        }
    }

    fn machine(&self, i: usize) -> MachineOptions {
        self.per_machine.get(i).cloned().unwrap_or_default()
    }
}

/// One Machine's settings.
#[derive(Debug, Clone, Default)]
pub struct MachineOptions {
    /// TOML laid over the daemon config the lab writes (tables merge key by key; a key given
    /// here wins), e.g. `"[mesh]\nprofile = \"wan\"\n"`.
    pub daemon_toml: String,
    /// The daemon's `mesh.clock_offset_ms` (test only: its store's clock runs this far ahead,
    /// or behind when negative).
    pub clock_offset_ms: i64,
}

/// A running lab. Dropping it removes everything it made (see the crate doc).
pub struct Lab {
    state: LabState,
    options: LabOptions,
    ployz: PathBuf,
    machines: Vec<Machine>,
    ssh: Option<SshClient>,
    raised_in: Duration,
    /// Each Machine's partition group, while partitioned.
    groups: Vec<Option<usize>>,
    /// The partition groups' bridges that exist.
    group_bridges: Vec<String>,
    /// The netem fallback's threads, one per Machine, while loss and delay are on.
    delayers: Vec<netem::Delayer>,
    /// Set when starting failed: Drop treats it as a failed lab (`PLOYZ_LAB_KEEP`).
    failed: bool,
    /// Released after the teardown (fields drop after `Drop::drop`).
    _lock: LabLock,
}

#[derive(Default)]
struct Machine {
    dockerd: Option<Child>,
    daemon: Option<Child>,
    sshd: Option<Child>,
    /// A host Machine's first process (`unshare`, whose child becomes its systemd).
    host: Option<Child>,
    /// A host Machine's systemd, once it runs.
    systemd: Option<u32>,
}

struct SshClient {
    command: String,
}

/// The `ployz` binary the lab runs: `PLOYZ_BIN` if set, else `ployz` in the cargo target
/// profile directory of the running executable (`target/debug/deps/lab-*` ->
/// `target/debug/ployz`). `cargo test --workspace` builds it; alone, run
/// `cargo build -p ployz` first.
pub fn ployz_bin() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("PLOYZ_BIN").filter(|v| !v.is_empty()) {
        let p = PathBuf::from(p);
        if !p.is_file() {
            bail!(
                "PLOYZ_BIN={} is not a file: point it at a built ployz binary",
                p.display()
            );
        }
        return Ok(p);
    }
    let exe = std::env::current_exe().context("cannot find the running executable")?;
    let mut dir = exe
        .parent()
        .ok_or_else(|| anyhow!("{} has no directory", exe.display()))?;
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir = dir.parent().unwrap_or(dir);
    }
    let candidate = dir.join("ployz");
    if !candidate.is_file() {
        bail!(
            "the ployz binary is not at {}: build it (`cargo build -p ployz`, same profile; `cargo test --workspace` builds it) or set PLOYZ_BIN=/path/to/ployz",
            candidate.display()
        );
    }
    Ok(candidate)
}

impl Lab {
    /// Raises the lab, panicking with the reason when it cannot.
    pub fn start(options: LabOptions) -> Lab {
        Lab::try_start(options).unwrap_or_else(|e| panic!("the lab did not start: {e:#}"))
    }

    /// Raises the lab: takes the host's lab lock (waiting for another lab to end), removes
    /// leftovers of dead labs, then makes the underlay, and starts every Machine's dockerd,
    /// imports [`LAB_IMAGE`], starts the sshds if asked and the daemons, all Machines in
    /// parallel, each step waiting until what it started answers. On error, what was made is
    /// removed (or kept, with `PLOYZ_LAB_KEEP=1`).
    pub fn try_start(options: LabOptions) -> anyhow::Result<Lab> {
        let n = options.machines;
        if n == 0 || n > MAX_MACHINES {
            bail!("LabOptions.machines = {n}: give 1 to {MAX_MACHINES}");
        }
        let mut options = options;
        options.sshd |= options.hosts;
        preflight(options.sshd, options.hosts)?;
        let ployz = ployz_bin()?;
        let root = lab_root();
        let lock = LabLock::acquire(&root)?;
        let began = Instant::now();
        for line in lock.sweep() {
            eprintln!("ployz-lab: a leftover of an earlier lab could not be removed: {line}");
        }
        let run = lock.next_run()?;
        let state = LabState::new(&root, run, n);
        state.save()?;
        let mut lab = Lab {
            state,
            options,
            ployz,
            machines: (0..n).map(|_| Machine::default()).collect(),
            ssh: None,
            raised_in: Duration::ZERO,
            groups: vec![None; n],
            group_bridges: Vec::new(),
            delayers: Vec::new(),
            failed: false,
            _lock: lock,
        };
        if let Err(e) = lab.raise() {
            lab.failed = true;
            return Err(e.context(format!("lab {} at {}", run, lab.state.dir.display())));
        }
        lab.raised_in = began.elapsed();
        Ok(lab)
    }

    fn raise(&mut self) -> anyhow::Result<()> {
        for m in &self.state.machines {
            std::fs::create_dir_all(&m.dir)
                .with_context(|| format!("cannot create {}", m.dir.display()))?;
        }
        std::fs::create_dir_all(self.home())?;
        self.make_underlay()?;
        let tarball = self.make_image_tarball()?;
        if self.options.hosts {
            for i in 0..self.machines.len() {
                self.boot_host(i)?;
            }
            for i in 0..self.machines.len() {
                self.wait_host(i)?;
            }
        }
        for i in 0..self.machines.len() {
            self.spawn_dockerd(i)?;
        }
        for i in 0..self.machines.len() {
            self.wait_dockerd(i)?;
        }
        self.import_image(&tarball)?;
        if self.options.sshd {
            self.start_sshds()?;
        }
        if self.options.hosts {
            // Nothing of Ployz runs on a host Machine until a test installs it.
            return Ok(());
        }
        for i in 0..self.machines.len() {
            self.spawn_daemon(i)?;
        }
        for i in 0..self.machines.len() {
            self.wait_daemon(i)?;
        }
        Ok(())
    }

    // ---- host Machines ------------------------------------------------------------------

    /// Boots host Machine `i`: in its network namespace and its own cgroup, a process in new
    /// PID, mount, UTS, IPC and cgroup namespaces that builds the host's mounts and becomes its
    /// systemd (`host.rs`).
    fn boot_host(&mut self, i: usize) -> anyhow::Result<()> {
        let m = self.state.machines[i].clone();
        let script = m.dir.join("host-boot.sh");
        std::fs::write(&script, host::boot_script(&m, &format!("host{i}")))?;
        let mut cmd = self.in_ns(i, "sh");
        cmd.arg("-c").arg(format!(
            "set -e\n{}exec unshare --pid --fork --mount --uts --ipc --cgroup --mount-proc --propagation private sh {}",
            host::enter_cgroups(&m.cgroup),
            script.display()
        ));
        let child = self.spawn_logged(i, cmd, &m.dir.join("host-console.log"))?;
        self.machines[i].host = Some(child);
        Ok(())
    }

    /// Waits until host Machine `i`'s systemd runs and says the system is up.
    fn wait_host(&mut self, i: usize) -> anyhow::Result<()> {
        let deadline = Instant::now() + HOST_READY;
        let console = self.machine_dir(i).join("host-console.log");
        loop {
            let first = match self.machines[i].host.as_mut() {
                Some(c) => {
                    if let Some(status) = c.try_wait()? {
                        bail!(
                            "host Machine {i} did not boot ({status}): {}",
                            tail(&read(&console), 30)
                        );
                    }
                    c.id()
                }
                None => bail!("host Machine {i} was not booted"),
            };
            // `unshare` forks the namespace's PID 1, which execs the boot script, then systemd.
            if let Some(pid) = host::systemd_pid(first) {
                self.machines[i].systemd = Some(pid);
                let out = self.host_exec(i, &["systemctl", "is-system-running"]);
                let state = String::from_utf8_lossy(&out.stdout).trim().to_owned();
                if state == "running" || state == "degraded" {
                    return Ok(());
                }
            }
            if Instant::now() >= deadline {
                bail!(
                    "host Machine {i}'s systemd did not come up within {HOST_READY:?}: {}",
                    tail(&read(&console), 30)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Host Machine `i`'s systemd, which must run.
    fn systemd_pid(&self, i: usize) -> anyhow::Result<u32> {
        if !self.options.hosts {
            bail!("Machine {i} is not a host Machine (LabOptions.hosts)");
        }
        self.machines[i]
            .systemd
            .ok_or_else(|| anyhow!("host Machine {i}'s systemd is not running"))
    }

    /// A command in every namespace of host Machine `i` (its mounts, PID 1, network, cgroup),
    /// as a root shell on that host would run it.
    fn in_host(&self, i: usize, program: impl AsRef<std::ffi::OsStr>) -> anyhow::Result<Command> {
        let pid = self.systemd_pid(i)?;
        let mut c = Command::new("nsenter");
        c.args([
            "-t",
            &pid.to_string(),
            "-m",
            "-u",
            "-i",
            "-n",
            "-p",
            "-C",
            "--",
        ])
        .arg(program)
        .env_clear()
        .env("PATH", HOST_PATH)
        .env("HOME", "/root")
        .env("LANG", "C.UTF-8");
        Ok(c)
    }

    /// Runs `cmd` as root on host Machine `i` (see [`LabOptions::hosts`]):
    /// `host_exec(0, &["systemctl", "is-active", "ployz"])`.
    pub fn host_exec(&self, i: usize, cmd: &[&str]) -> Output {
        let (program, args) = cmd
            .split_first()
            .unwrap_or_else(|| panic!("host_exec({i}, []): give a command"));
        let mut c = or_panic(self.in_host(i, program));
        c.args(args).stdin(Stdio::null());
        output(&mut c)
    }

    /// A path on host Machine `i` as the lab host reaches it (through its systemd's root):
    /// `host_path(0, "/run/ployz/ployz.sock")`.
    pub fn host_path(&self, i: usize, path: &str) -> PathBuf {
        let pid = or_panic(self.systemd_pid(i));
        PathBuf::from(format!("/proc/{pid}/root")).join(path.trim_start_matches('/'))
    }

    /// The journal of `unit` on host Machine `i`, its last `n` lines.
    pub fn host_journal(&self, i: usize, unit: &str, n: usize) -> String {
        let out = self.host_exec(
            i,
            &[
                "journalctl",
                "-u",
                unit,
                "-n",
                &n.to_string(),
                "--no-pager",
                "-o",
                "cat",
            ],
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    // ---- the underlay -------------------------------------------------------------------

    fn bridge_cidr(&self) -> String {
        format!("{}/24", self.bridge_addr())
    }

    fn make_underlay(&mut self) -> anyhow::Result<()> {
        let br = self.state.bridge.clone();
        run(Command::new("ip").args(["link", "add", &br, "type", "bridge"]))?;
        run(Command::new("ip").args(["addr", "add", &self.bridge_cidr(), "dev", &br]))?;
        // Nothing that arrives on the bridge is routed anywhere else by the root namespace.
        let forwarding = format!("/proc/sys/net/ipv4/conf/{br}/forwarding");
        std::fs::write(&forwarding, "0").with_context(|| format!("cannot write {forwarding}"))?;
        run(Command::new("ip").args(["link", "set", &br, "up"]))?;
        // With br_netfilter loaded (Docker loads it), bridged frames cross the root namespace's
        // FORWARD chain, whose policy Docker sets to DROP: accept what stays on this bridge.
        if !bridge_netfilter_families().is_empty() {
            let comment = format!("{} {}", state::RULE_COMMENT_PREFIX, self.state.run);
            self.state.forward_rule = Some(comment);
            self.state.save()?;
            self.bridge_rule("-I", &br)?;
        }
        let gateway = self.bridge_addr().to_string();
        for m in self.state.machines.clone() {
            run(Command::new("ip").args(["netns", "add", &m.netns]))?;
            run(Command::new("ip").args([
                "link",
                "add",
                &m.veth,
                "type",
                "veth",
                "peer",
                "name",
                UNDERLAY_INTERFACE,
                "netns",
                &m.netns,
            ]))?;
            run(Command::new("ip").args(["link", "set", &m.veth, "master", &br, "up"]))?;
            let addr = format!("{}/24", m.underlay);
            let ns = |args: &[&str]| {
                let mut c = Command::new("ip");
                c.args(["-n", &m.netns]).args(args);
                c
            };
            run(&mut ns(&["addr", "add", &addr, "dev", UNDERLAY_INTERFACE]))?;
            run(&mut ns(&["link", "set", UNDERLAY_INTERFACE, "up"]))?;
            run(&mut ns(&["link", "set", "lo", "up"]))?;
            run(&mut ns(&["route", "add", "default", "via", &gateway]))?;
        }
        Ok(())
    }

    // ---- processes ----------------------------------------------------------------------

    /// A command run inside Machine `i`'s network namespace (`nsenter --net`).
    fn in_ns(&self, i: usize, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!(
            "--net={}",
            netns_path(&self.state.machines[i].netns).display()
        ))
        .arg("--")
        .arg(program);
        c
    }

    /// Spawns a long-running process of Machine `i` with its output appended to `log`, in its
    /// own process group (a terminal's Ctrl-C does not reach it), and records its PID.
    fn spawn_logged(&mut self, i: usize, mut cmd: Command, log: &Path) -> anyhow::Result<Child> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("cannot open {}", log.display()))?;
        cmd.stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .current_dir(&self.state.machines[i].dir)
            .process_group(0);
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start {cmd:?}"))?;
        let pid = child.id() as i32;
        let m = &mut self.state.machines[i];
        m.pids.retain(|(p, s)| procs::alive_as(*p, *s));
        if let Some(s) = procs::stat(pid) {
            m.pids.push((pid, s.start_time));
        }
        self.state.save()?;
        Ok(child)
    }

    fn spawn_dockerd(&mut self, i: usize) -> anyhow::Result<()> {
        let m = self.state.machines[i].clone();
        let d = &m.dir;
        let config = d.join("dockerd.json");
        // Its own (empty) config file: the host's /etc/docker/daemon.json is not this Machine's.
        std::fs::write(&config, "{}\n")?;
        // A host Machine's dockerd runs in all of its namespaces and serves the socket where
        // Docker's package serves it, so what is installed there finds it as on a server.
        let (mut cmd, socket, cgroup_parent) = if self.options.hosts {
            (
                self.in_host(i, "dockerd")?,
                "/run/docker.sock".to_owned(),
                "/docker".to_owned(),
            )
        } else {
            (
                self.in_ns(i, "dockerd"),
                d.join("docker.sock").display().to_string(),
                format!("/{}", m.cgroup),
            )
        };
        cmd.arg("--data-root")
            .arg(d.join("data"))
            .arg("--exec-root")
            .arg(d.join("exec"))
            .arg("-H")
            .arg(format!("unix://{socket}"))
            .arg("--pidfile")
            .arg(d.join("docker.pid"))
            .arg("--config-file")
            .arg(&config)
            // The namespace's own firewall: published ports and the bridge's NAT are real.
            .arg("--iptables=true")
            // Containers' cgroups under a name of this lab, removed with it; cgroupfs so the
            // name means the same with or without systemd.
            .args(["--exec-opt", "native.cgroupdriver=cgroupfs"])
            .arg(format!("--cgroup-parent={cgroup_parent}"))
            // A stopped Machine stops its containers quickly.
            .args(["--shutdown-timeout", "2"]);
        let child = self.spawn_logged(i, cmd, &d.join("dockerd.log"))?;
        self.machines[i].dockerd = Some(child);
        Ok(())
    }

    fn wait_dockerd(&mut self, i: usize) -> anyhow::Result<()> {
        let sock = self.docker_socket(i);
        let deadline = Instant::now() + DOCKERD_READY;
        loop {
            if docker_ping(&sock) {
                return Ok(());
            }
            let exited = match self.machines[i].dockerd.as_mut() {
                Some(c) => c.try_wait()?,
                None => bail!("Machine {i}'s dockerd is not running"),
            };
            if let Some(status) = exited {
                bail!(
                    "Machine {i}'s dockerd exited ({status}): {}",
                    tail(&self.dockerd_log(i), 30)
                );
            }
            if Instant::now() >= deadline {
                bail!(
                    "Machine {i}'s dockerd did not answer on {} within {DOCKERD_READY:?}: {}",
                    sock.display(),
                    tail(&self.dockerd_log(i), 30)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn make_image_tarball(&self) -> anyhow::Result<PathBuf> {
        let busybox = Path::new("/bin/busybox");
        let root = self.state.dir.join("image");
        for sub in ["bin", "tmp", "www", "etc"] {
            std::fs::create_dir_all(root.join(sub))?;
        }
        std::fs::write(root.join("etc/passwd"), "root:x:0:0:root:/:/bin/sh\n")?;
        std::fs::copy(busybox, root.join("bin/busybox")).with_context(|| {
            "cannot copy /bin/busybox: install Debian's busybox-static (a static busybox)"
        })?;
        let list = run(Command::new(busybox).arg("--list"))?;
        for applet in String::from_utf8_lossy(&list.stdout).lines() {
            let applet = applet.trim();
            if applet.is_empty() || applet == "busybox" || applet.contains('/') {
                continue;
            }
            let link = root.join("bin").join(applet);
            if !link.exists() {
                std::os::unix::fs::symlink("busybox", &link)?;
            }
        }
        let tarball = self.state.dir.join("busybox.tar");
        run(Command::new("tar")
            .arg("-C")
            .arg(&root)
            .arg("-cf")
            .arg(&tarball)
            .arg("."))?;
        std::fs::remove_dir_all(&root)?;
        Ok(tarball)
    }

    fn import_image(&self, tarball: &Path) -> anyhow::Result<()> {
        let children: Vec<(usize, Child)> = (0..self.machines.len())
            .map(|i| {
                let mut c = self.docker_cmd(i);
                c.arg("import")
                    .arg(tarball)
                    .arg(LAB_IMAGE)
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped());
                c.spawn()
                    .with_context(|| format!("cannot run docker import for Machine {i}"))
                    .map(|child| (i, child))
            })
            .collect::<anyhow::Result<_>>()?;
        for (i, child) in children {
            let out = child.wait_with_output()?;
            if !out.status.success() {
                bail!(
                    "docker import of {LAB_IMAGE} into Machine {i}'s dockerd failed ({}): {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
        }
        Ok(())
    }

    fn start_sshds(&mut self) -> anyhow::Result<()> {
        let dir = self.state.dir.join("ssh");
        std::fs::create_dir_all(&dir)?;
        std::fs::create_dir_all("/run/sshd")
            .context("cannot create /run/sshd (sshd's privilege separation dir)")?;
        let client_key = dir.join("client_key");
        keygen(&client_key)?;
        let authorized = dir.join("authorized_keys");
        std::fs::copy(client_key.with_extension("pub"), &authorized)?;
        let known_hosts = dir.join("known_hosts");
        let mut known = String::new();
        let bin_dir = self
            .ployz
            .parent()
            .ok_or_else(|| anyhow!("{} has no directory", self.ployz.display()))?
            .to_owned();
        let mut children = Vec::new();
        for i in 0..self.machines.len() {
            let m = self.state.machines[i].clone();
            let host_key = m.dir.join("ssh_host_ed25519_key");
            keygen(&host_key)?;
            let public = std::fs::read_to_string(host_key.with_extension("pub"))?;
            let mut words = public.split_whitespace();
            let (Some(kind), Some(key)) = (words.next(), words.next()) else {
                bail!(
                    "{} is not an ssh public key",
                    host_key.with_extension("pub").display()
                );
            };
            known.push_str(&format!("{} {kind} {key}\n", m.underlay));
            // A host Machine's sessions find what is installed there, as on a server; the
            // others find the lab's build and their daemon's socket.
            let env = if self.options.hosts {
                format!("PATH={HOST_PATH}")
            } else {
                let socket = self.socket(i);
                format!(
                    "PATH={bin}:{HOST_PATH} PLOYZ_SOCKET={sock} PLOYZ_CONNECT=unix://{sock}",
                    bin = bin_dir.display(),
                    sock = socket.display(),
                )
            };
            let config = m.dir.join("sshd_config");
            std::fs::write(
                &config,
                format!(
                    "ListenAddress {addr}\nPort 22\nHostKey {host_key}\nAuthorizedKeysFile {auth}\n\
                     PidFile {pid}\nStrictModes no\nUsePAM no\nPasswordAuthentication no\n\
                     KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n\
                     SetEnv {env}\n",
                    addr = m.underlay,
                    host_key = host_key.display(),
                    auth = authorized.display(),
                    pid = m.dir.join("sshd.pid").display(),
                ),
            )?;
            let mut cmd = if self.options.hosts {
                std::fs::create_dir_all(self.host_path(i, "/run/sshd"))?;
                self.in_host(i, "/usr/sbin/sshd")?
            } else {
                self.in_ns(i, "/usr/sbin/sshd")
            };
            cmd.args(["-D", "-e", "-f"]).arg(&config);
            let child = self.spawn_logged(i, cmd, &m.dir.join("sshd.log"))?;
            children.push(child);
        }
        for (i, child) in children.into_iter().enumerate() {
            self.machines[i].sshd = Some(child);
        }
        std::fs::write(&known_hosts, known)?;
        let ssh_config = dir.join("ssh_config");
        std::fs::write(
            &ssh_config,
            format!(
                "Host *\n  User root\n  UserKnownHostsFile {}\n  GlobalKnownHostsFile /dev/null\n  IdentityFile {}\n  IdentitiesOnly yes\n",
                known_hosts.display(),
                client_key.display()
            ),
        )?;
        self.ssh = Some(SshClient {
            command: format!("ssh -F {}", ssh_config.display()),
        });
        for i in 0..self.machines.len() {
            let addr = SocketAddr::from((self.state.machines[i].underlay, 22));
            let deadline = Instant::now() + SSHD_READY;
            while TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_err() {
                if let Some(c) = self.machines[i].sshd.as_mut() {
                    if let Some(status) = c.try_wait()? {
                        bail!(
                            "Machine {i}'s sshd exited ({status}): {}",
                            tail(&read(&self.machine_dir(i).join("sshd.log")), 20)
                        );
                    }
                }
                if Instant::now() >= deadline {
                    bail!(
                        "Machine {i}'s sshd did not listen on {addr} within {SSHD_READY:?}: {}",
                        tail(&read(&self.machine_dir(i).join("sshd.log")), 20)
                    );
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(())
    }

    /// The daemon config Machine `i` runs with (what the lab writes to `<dir>/daemon.toml`).
    pub fn daemon_config(&self, i: usize) -> anyhow::Result<String> {
        let m = &self.state.machines[i];
        let opts = self.options.machine(i);
        let s = |v: &Path| toml::Value::String(v.display().to_string());
        let mut t = toml::Table::new();
        t.insert("data_dir".into(), s(&m.dir.join("ployz")));
        t.insert("socket".into(), s(&self.socket(i)));
        t.insert(
            "docker_host".into(),
            toml::Value::String(self.docker_host(i)),
        );
        t.insert("http_listen".into(), "0.0.0.0:80".into());
        t.insert("https_listen".into(), "0.0.0.0:443".into());
        let mut certificates = toml::Table::new();
        certificates.insert("enabled".into(), false.into());
        t.insert("certificates".into(), certificates.into());
        let mut dns = toml::Table::new();
        dns.insert(
            "listen".into(),
            if self.options.dns { "gateway" } else { "off" }.into(),
        );
        t.insert("dns".into(), dns.into());
        let mut shutdown = toml::Table::new();
        shutdown.insert("drain_delay_seconds".into(), 0.into());
        shutdown.insert("grace_seconds".into(), 1.into());
        shutdown.insert("timeout_seconds".into(), 2.into());
        t.insert("shutdown".into(), shutdown.into());
        let mut mesh = toml::Table::new();
        mesh.insert("interface".into(), m.wg_interface.clone().into());
        mesh.insert("clock_offset_ms".into(), opts.clock_offset_ms.into());
        t.insert("mesh".into(), mesh.into());
        if !opts.daemon_toml.trim().is_empty() {
            let extra: toml::Table = opts.daemon_toml.parse().with_context(|| {
                format!("MachineOptions.daemon_toml of Machine {i} is not TOML")
            })?;
            merge(&mut t, extra);
        }
        Ok(toml::to_string(&t)?)
    }

    fn spawn_daemon(&mut self, i: usize) -> anyhow::Result<()> {
        let dir = self.machine_dir(i).to_owned();
        let config = dir.join("daemon.toml");
        std::fs::write(&config, self.daemon_config(i)?)?;
        let mut cmd = self.in_ns(i, &self.ployz);
        cmd.args(["daemon", "run", "--config"]).arg(&config).env(
            "PLOYZ_LOG",
            self.options.log_filter.as_deref().unwrap_or("info"),
        );
        let child = self.spawn_logged(i, cmd, &dir.join("daemon.log"))?;
        self.machines[i].daemon = Some(child);
        Ok(())
    }

    fn wait_daemon(&mut self, i: usize) -> anyhow::Result<()> {
        let socket = self.socket(i);
        let deadline = Instant::now() + DAEMON_READY;
        loop {
            if UnixStream::connect(&socket).is_ok() {
                return Ok(());
            }
            let exited = match self.machines[i].daemon.as_mut() {
                Some(c) => c.try_wait()?,
                None => bail!("Machine {i}'s daemon is not running"),
            };
            if let Some(status) = exited {
                bail!(
                    "Machine {i}'s daemon exited ({status}): {}",
                    tail(&self.log(i), 30)
                );
            }
            if Instant::now() >= deadline {
                bail!(
                    "Machine {i}'s daemon did not answer on {} within {DAEMON_READY:?}: {}",
                    socket.display(),
                    tail(&self.log(i), 30)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    // ---- what tests read ----------------------------------------------------------------

    /// How many Machines.
    pub fn len(&self) -> usize {
        self.machines.len()
    }

    /// Whether the lab has no Machine (never, once started).
    pub fn is_empty(&self) -> bool {
        self.machines.is_empty()
    }

    /// The run number (third octet of the underlay, part of every name).
    pub fn run(&self) -> u8 {
        self.state.run
    }

    /// How long [`Lab::start`] took, from taking the lab lock (waiting for it excluded) to the
    /// last daemon answering.
    pub fn raised_in(&self) -> Duration {
        self.raised_in
    }

    /// Everything this lab made, by name and PID.
    pub fn state(&self) -> &LabState {
        &self.state
    }

    /// The lab's directory.
    pub fn dir(&self) -> &Path {
        &self.state.dir
    }

    /// The bridge's own address, the Machines' default gateway (leads nowhere further).
    pub fn bridge_addr(&self) -> Ipv4Addr {
        Ipv4Addr::new(198, 18, self.state.run, 1)
    }

    /// Machine `i`'s underlay address (`198.18.<run>.<10+i>`, on its `eth0`).
    pub fn underlay_addr(&self, i: usize) -> Ipv4Addr {
        self.state.machines[i].underlay
    }

    /// Machine `i`'s directory (dockerd's `data/` and `exec/`, the daemon's `ployz/`, logs).
    pub fn machine_dir(&self, i: usize) -> &Path {
        &self.state.machines[i].dir
    }

    /// Machine `i`'s network namespace name (enter it with
    /// `nsenter --net=/var/run/netns/NAME`).
    pub fn netns(&self, i: usize) -> &str {
        &self.state.machines[i].netns
    }

    /// The root-namespace end of Machine `i`'s veth (where [`Lab::netem`] applies).
    pub fn link(&self, i: usize) -> &str {
        &self.state.machines[i].veth
    }

    /// Machine `i`'s WireGuard interface name (its daemon's `mesh.interface`).
    pub fn wg_interface(&self, i: usize) -> &str {
        &self.state.machines[i].wg_interface
    }

    /// Machine `i`'s daemon socket (on a host Machine, the installed daemon's
    /// `/run/ployz/ployz.sock`, reached through its systemd's root).
    pub fn socket(&self, i: usize) -> PathBuf {
        if self.options.hosts {
            self.host_path(i, "/run/ployz/ployz.sock")
        } else {
            self.state.machines[i].dir.join("ployz.sock")
        }
    }

    /// Machine `i`'s dockerd, as `DOCKER_HOST` says it (`unix:///...`).
    pub fn docker_host(&self, i: usize) -> String {
        format!("unix://{}", self.docker_socket(i).display())
    }

    /// Machine `i`'s dockerd's socket, as the lab host reaches it.
    fn docker_socket(&self, i: usize) -> PathBuf {
        if self.options.hosts {
            self.host_path(i, "/run/docker.sock")
        } else {
            self.state.machines[i].dir.join("docker.sock")
        }
    }

    /// `ssh://root@<underlay>` of Machine `i` (with `sshd: true`).
    pub fn ssh_url(&self, i: usize) -> String {
        format!("ssh://root@{}", self.underlay_addr(i))
    }

    /// The `PLOYZ_SSH_COMMAND` that reaches the Machines' sshds with the lab's key and known
    /// hosts (with `sshd: true`).
    pub fn ssh_command(&self) -> Option<&str> {
        self.ssh.as_ref().map(|s| s.command.as_str())
    }

    /// The daemon log of Machine `i` (every start appends), for failure messages; on a host
    /// Machine, the end of `ployz.service`'s journal.
    pub fn log(&self, i: usize) -> String {
        if self.options.hosts {
            return match self.machines[i].systemd {
                Some(_) => self.host_journal(i, "ployz.service", 200),
                None => String::new(),
            };
        }
        read(&self.machine_dir(i).join("daemon.log"))
    }

    /// The dockerd log of Machine `i`.
    pub fn dockerd_log(&self, i: usize) -> String {
        read(&self.machine_dir(i).join("dockerd.log"))
    }

    /// The PID of Machine `i`'s daemon, while it runs.
    pub fn daemon_pid(&self, i: usize) -> Option<u32> {
        self.machines[i].daemon.as_ref().map(Child::id)
    }

    /// The PID of Machine `i`'s dockerd, while it runs.
    pub fn dockerd_pid(&self, i: usize) -> Option<u32> {
        self.machines[i].dockerd.as_ref().map(Child::id)
    }

    /// Every process of the lab now: those in its Machines' namespaces, their descendants
    /// (containers included), those in its containers' cgroups and the recorded PIDs.
    pub fn processes(&self) -> std::collections::BTreeSet<i32> {
        let inodes: Vec<u64> = self
            .state
            .machines
            .iter()
            .filter_map(|m| procs::netns_inode(&netns_path(&m.netns)))
            .collect();
        let recorded: Vec<(i32, u64)> = self
            .state
            .machines
            .iter()
            .flat_map(|m| m.pids.clone())
            .collect();
        let cgroups: Vec<PathBuf> = self
            .state
            .machines
            .iter()
            .flat_map(|m| procs::cgroup_dirs(&m.cgroup))
            .collect();
        procs::belonging(&inodes, &recorded, &cgroups)
    }

    fn home(&self) -> PathBuf {
        self.state.dir.join("home")
    }

    // ---- commands -----------------------------------------------------------------------

    /// The CLI, run from the root namespace, with HOME and XDG_CONFIG_HOME in the lab, no
    /// ambient connection settings, `PLOYZ_SSH_COMMAND` when the lab has sshds, and
    /// `--connect unix://<Machine i's socket>`. Add arguments and run it.
    pub fn cli(&self, i: usize) -> Command {
        let mut c = self.cli_bare();
        c.arg("--connect")
            .arg(format!("unix://{}", self.socket(i).display()));
        c
    }

    /// [`Lab::cli`] without `--connect`: give it one (`--connect ssh://root@<underlay>`).
    pub fn cli_bare(&self) -> Command {
        let mut c = Command::new(&self.ployz);
        self.cli_env(&mut c);
        c
    }

    /// [`Lab::cli_bare`] with another build of the CLI (an upgrade's), in the same
    /// workstation: the lab's HOME, contexts and SSH client.
    pub fn cli_program(&self, program: &Path) -> Command {
        let mut c = Command::new(program);
        self.cli_env(&mut c);
        c
    }

    fn cli_env(&self, c: &mut Command) {
        c.env("HOME", self.home())
            .env("XDG_CONFIG_HOME", self.home().join(".config"))
            .env_remove("PLOYZ_CONNECT")
            .env_remove("PLOYZ_CONTEXT")
            .env_remove("PLOYZ_CONFIG")
            .env_remove("PLOYZ_SSH_COMMAND")
            .stdin(Stdio::null());
        if let Some(ssh) = &self.ssh {
            c.env("PLOYZ_SSH_COMMAND", &ssh.command);
        }
    }

    /// `ployz --connect unix://<socket of i> ARGS` from the root namespace.
    pub fn ployz(&self, i: usize, args: &[&str]) -> Output {
        let mut c = self.cli(i);
        c.args(args);
        output(&mut c)
    }

    /// The same CLI run inside Machine `i`'s namespace (for what must see its network).
    pub fn ployz_in_ns(&self, i: usize, args: &[&str]) -> Output {
        let mut c = self.in_ns(i, &self.ployz);
        self.cli_env(&mut c);
        c.arg("--connect")
            .arg(format!("unix://{}", self.socket(i).display()))
            .args(args);
        output(&mut c)
    }

    /// [`Lab::ployz`], which must succeed, its stdout parsed as JSON (pass `--json`).
    pub fn json(&self, i: usize, args: &[&str]) -> serde_json::Value {
        let out = self.ployz(i, args);
        assert!(
            out.status.success(),
            "ployz {args:?} on Machine {i} failed ({}): {}\n--- daemon log ---\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            tail(&self.log(i), 40)
        );
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "ployz {args:?} on Machine {i} printed no JSON ({e}): {}",
                String::from_utf8_lossy(&out.stdout)
            )
        })
    }

    /// A command inside Machine `i`'s namespace: `exec_in(0, &["ping", "-c1", "198.18.5.11"])`.
    pub fn exec_in(&self, i: usize, cmd: &[&str]) -> Output {
        let (program, args) = cmd
            .split_first()
            .unwrap_or_else(|| panic!("exec_in({i}, []): give a command"));
        let mut c = self.in_ns(i, program);
        c.args(args).stdin(Stdio::null());
        output(&mut c)
    }

    fn docker_cmd(&self, i: usize) -> Command {
        let mut c = Command::new("docker");
        c.arg("-H")
            .arg(self.docker_host(i))
            .env("DOCKER_CONFIG", self.state.dir.join("docker-config"))
            .env_remove("DOCKER_HOST")
            .env_remove("DOCKER_CONTEXT")
            .stdin(Stdio::null());
        c
    }

    /// [`Lab::docker`] as a command to run as the caller needs (its stdin piped in).
    pub fn docker_command(&self, i: usize, args: &[&str]) -> Command {
        let mut c = self.docker_cmd(i);
        c.args(args);
        c
    }

    /// The docker CLI against Machine `i`'s dockerd (tests may; the product never shells out
    /// to docker).
    pub fn docker(&self, i: usize, args: &[&str]) -> Output {
        let mut c = self.docker_cmd(i);
        c.args(args);
        output(&mut c)
    }

    // ---- processes, stopped and started -------------------------------------------------

    /// SIGKILLs Machine `i`'s daemon (and reaps it).
    pub fn kill_daemon(&mut self, i: usize) {
        if let Some(mut c) = self.machines[i].daemon.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERMs Machine `i`'s daemon and waits (bounded, 15 s), then SIGKILLs it. Returns
    /// whether it ended on SIGTERM.
    pub fn term_daemon(&mut self, i: usize) -> bool {
        match self.machines[i].daemon.take() {
            Some(mut c) => terminate(&mut c, TERM_GRACE),
            None => true,
        }
    }

    /// Starts Machine `i`'s daemon again (same config and data dir) and waits until it answers.
    /// Panics if it already runs.
    pub fn start_daemon(&mut self, i: usize) {
        or_panic(self.try_start_daemon(i));
    }

    fn try_start_daemon(&mut self, i: usize) -> anyhow::Result<()> {
        if let Some(c) = self.machines[i].daemon.as_mut() {
            if c.try_wait()?.is_none() {
                bail!(
                    "Machine {i}'s daemon already runs (PID {}); stop it first",
                    c.id()
                );
            }
        }
        self.spawn_daemon(i)?;
        self.wait_daemon(i)
    }

    /// Replaces Machine `i`'s options (its extra daemon TOML, its clock offset); they take
    /// effect at its daemon's next start ([`Lab::start_daemon`], [`Lab::start_machine`]).
    pub fn set_machine_options(&mut self, i: usize, options: MachineOptions) {
        assert!(
            i < self.len(),
            "Machine {i} does not exist (the lab has {})",
            self.len()
        );
        if self.options.per_machine.len() <= i {
            self.options
                .per_machine
                .resize(i + 1, MachineOptions::default());
        }
        self.options.per_machine[i] = options;
    }

    /// Stops Machine `i` as a whole: its daemon, then its dockerd (which stops its containers
    /// and containerd), each SIGTERM with a bounded wait, then SIGKILL for anything of them left.
    /// The sshd, like a host's, stays.
    pub fn stop_machine(&mut self, i: usize) {
        self.term_daemon(i);
        if let Some(mut c) = self.machines[i].dockerd.take() {
            terminate(&mut c, TERM_GRACE);
        }
        // What the dockerd left (a shim, a container) when it did not end on SIGTERM.
        let m = &self.state.machines[i];
        let inodes: Vec<u64> = procs::netns_inode(&netns_path(&m.netns))
            .into_iter()
            .collect();
        let keep: std::collections::BTreeSet<i32> = match &self.machines[i].sshd {
            Some(sshd) => procs::belonging(
                &[],
                &[(
                    sshd.id() as i32,
                    procs::stat(sshd.id() as i32)
                        .map(|s| s.start_time)
                        .unwrap_or(0),
                )],
                &[],
            ),
            None => Default::default(),
        };
        let cgroups = procs::cgroup_dirs(&m.cgroup);
        let left: std::collections::BTreeSet<i32> = procs::belonging(&inodes, &[], &cgroups)
            .difference(&keep)
            .copied()
            .collect();
        for pid in &left {
            procs::signal(*pid, libc::SIGKILL);
        }
        procs::wait_gone(&left, Duration::from_secs(10));
    }

    /// Starts Machine `i` again after [`Lab::stop_machine`]: its dockerd, then its daemon,
    /// waiting for each to answer.
    pub fn start_machine(&mut self, i: usize) {
        or_panic(self.try_start_machine(i));
    }

    fn try_start_machine(&mut self, i: usize) -> anyhow::Result<()> {
        if self.machines[i].dockerd.is_none() {
            self.spawn_dockerd(i)?;
            self.wait_dockerd(i)?;
        }
        self.try_start_daemon(i)
    }

    // ---- the underlay's faults ----------------------------------------------------------

    /// Splits the underlay: Machines in different groups cannot reach each other; Machines in
    /// no group form one more group with the bridge's own address. Done on the underlay's
    /// links, like pulling cables apart: each group's veths move to a bridge of their own
    /// (`plzbr<run>p<g>`, no address), so nothing inside the Machines (their firewalls, their
    /// routes) is touched and a heal is exact. Replaces an earlier partition.
    pub fn partition(&mut self, groups: &[&[usize]]) {
        or_panic(self.try_partition(groups));
    }

    fn try_partition(&mut self, groups: &[&[usize]]) -> anyhow::Result<()> {
        let mut seen = vec![false; self.len()];
        for g in groups {
            for &i in *g {
                if i >= self.len() {
                    bail!(
                        "partition: Machine {i} does not exist (the lab has {})",
                        self.len()
                    );
                }
                if std::mem::replace(&mut seen[i], true) {
                    bail!("partition: Machine {i} is in two groups");
                }
            }
        }
        self.try_heal()?;
        for (g, group) in groups.iter().enumerate() {
            if group.is_empty() {
                continue;
            }
            let bridge = self.group_bridge(g)?;
            for &i in *group {
                let veth = self.state.machines[i].veth.clone();
                run(Command::new("ip").args(["link", "set", &veth, "master", &bridge]))?;
                self.groups[i] = Some(g);
            }
        }
        Ok(())
    }

    /// The bridge of partition group `g`, made when first needed.
    fn group_bridge(&mut self, g: usize) -> anyhow::Result<String> {
        let name = format!("{}p{g}", self.state.bridge);
        if self.group_bridges.contains(&name) {
            return Ok(name);
        }
        self.group_bridges.push(name.clone());
        run(Command::new("ip").args(["link", "add", &name, "type", "bridge"]))?;
        run(Command::new("ip").args(["link", "set", &name, "up"]))?;
        self.bridge_rule("-I", &name)?;
        Ok(name)
    }

    /// Inserts (`-I`) or deletes (`-D`) the root namespace's FORWARD rule accepting what stays
    /// on `bridge`, for each family whose bridged traffic crosses netfilter; none when the lab
    /// added no such rule.
    fn bridge_rule(&self, op: &str, bridge: &str) -> anyhow::Result<()> {
        let Some(comment) = &self.state.forward_rule else {
            return Ok(());
        };
        for tool in bridge_netfilter_families() {
            let mut c = Command::new(tool);
            c.args([op, "FORWARD"]);
            if op == "-I" {
                c.arg("1");
            }
            c.args([
                "-i",
                bridge,
                "-o",
                bridge,
                "-m",
                "comment",
                "--comment",
                comment,
            ]);
            c.args(["-j", "ACCEPT"]);
            run(&mut c)?;
        }
        Ok(())
    }

    /// Undoes [`Lab::partition`]: every Machine back on the one underlay bridge.
    pub fn heal(&mut self) {
        or_panic(self.try_heal());
    }

    fn try_heal(&mut self) -> anyhow::Result<()> {
        let main = self.state.bridge.clone();
        for i in 0..self.len() {
            if self.groups[i].take().is_some() {
                let veth = self.state.machines[i].veth.clone();
                run(Command::new("ip").args(["link", "set", &veth, "master", &main]))?;
            }
        }
        for name in std::mem::take(&mut self.group_bridges) {
            self.bridge_rule("-D", &name)?;
            run(Command::new("ip").args(["link", "delete", &name]))?;
        }
        Ok(())
    }

    /// Adds loss and delay to every underlay link, replacing earlier settings. Where the kernel
    /// has the `netem` qdisc, a `netem` qdisc on the root-namespace end of each Machine's veth
    /// (`tc qdisc show dev <link>`): each packet between two Machines meets it once, on its way
    /// into the receiver. Where it has none (as on these VMs), each Machine's namespace queues
    /// what leaves its `eth0` to a thread of this process that drops and delays (see
    /// `netem.rs`): each packet meets it once, leaving its sender. [`Lab::netem_in_place`]
    /// shows which.
    pub fn netem(&mut self, loss_percent: f64, delay_ms: u32) {
        or_panic(self.try_netem(loss_percent, delay_ms));
    }

    fn try_netem(&mut self, loss_percent: f64, delay_ms: u32) -> anyhow::Result<()> {
        if !(0.0..=100.0).contains(&loss_percent) {
            bail!("netem: loss_percent {loss_percent} is not within 0..=100");
        }
        self.try_clear_netem()?;
        if netem::kernel_has_netem() {
            for m in &self.state.machines {
                run(Command::new("tc").args([
                    "qdisc",
                    "replace",
                    "dev",
                    &m.veth,
                    "root",
                    "netem",
                    "loss",
                    &format!("{loss_percent}%"),
                    "delay",
                    &format!("{delay_ms}ms"),
                ]))?;
            }
        } else {
            for m in &self.state.machines {
                let ns = netns_path(&m.netns);
                let delayer = netem::Delayer::start(
                    &ns,
                    loss_percent / 100.0,
                    Duration::from_millis(delay_ms.into()),
                )?;
                self.delayers.push(delayer);
                netem::hook(&ns, UNDERLAY_INTERFACE)?;
            }
        }
        Ok(())
    }

    /// Removes [`Lab::netem`]'s loss and delay.
    pub fn clear_netem(&mut self) {
        or_panic(self.try_clear_netem());
    }

    fn try_clear_netem(&mut self) -> anyhow::Result<()> {
        for m in &self.state.machines {
            let shown = run(Command::new("tc").args(["qdisc", "show", "dev", &m.veth, "root"]))?;
            if String::from_utf8_lossy(&shown.stdout).contains("netem") {
                run(Command::new("tc").args(["qdisc", "del", "dev", &m.veth, "root"]))?;
            }
            if !self.delayers.is_empty() {
                netem::unhook(&netns_path(&m.netns), UNDERLAY_INTERFACE);
            }
        }
        // Joins the threads; what they held goes on its way.
        self.delayers.clear();
        Ok(())
    }

    /// What the system shows of [`Lab::netem`] on Machine `i`'s link, `None` when nothing: the
    /// `netem` qdisc (`tc qdisc show`), or the queueing rule in its namespace
    /// (`iptables -t mangle -S`) while a delayer serves it.
    pub fn netem_in_place(&self, i: usize) -> Option<String> {
        let m = &self.state.machines[i];
        let tc = Command::new("tc")
            .args(["qdisc", "show", "dev", &m.veth, "root"])
            .output()
            .ok()?;
        let tc = String::from_utf8_lossy(&tc.stdout).into_owned();
        if tc.contains("netem") {
            return Some(tc);
        }
        if self.delayers.is_empty() {
            return None;
        }
        let rules = self.exec_in(i, &["iptables", "-t", "mangle", "-S"]);
        let rules = String::from_utf8_lossy(&rules.stdout).into_owned();
        rules.contains("NFQUEUE").then_some(rules)
    }

    // ---- teardown -----------------------------------------------------------------------

    /// What a person needs to enter and inspect the lab, and remove it.
    pub fn how_to_enter(&self) -> String {
        let mut s = format!(
            "lab {} at {} (underlay {}/24 on bridge {}):\n",
            self.state.run,
            self.state.dir.display(),
            self.bridge_addr(),
            self.state.bridge
        );
        for (i, m) in self.state.machines.iter().enumerate() {
            if let Some(pid) = self.machines[i].systemd {
                s.push_str(&format!(
                    "  host Machine {i} ({addr}):\n    shell:   nsenter -t {pid} -m -u -i -n -p -C bash\n    logs:    (in that shell) journalctl -u ployz; {dir}/dockerd.log\n",
                    addr = m.underlay,
                    dir = m.dir.display(),
                ));
                continue;
            }
            s.push_str(&format!(
                "  Machine {i} ({addr}):\n    shell:   nsenter --net={ns} bash\n    ployz:   {bin} --connect unix://{sock} machine ls\n    docker:  docker -H {docker} ps -a\n    logs:    {dir}/daemon.log {dir}/dockerd.log\n",
                addr = m.underlay,
                ns = netns_path(&m.netns).display(),
                bin = self.ployz.display(),
                sock = self.socket(i).display(),
                docker = self.docker_host(i),
                dir = m.dir.display(),
            ));
        }
        let sweep = self
            .ployz
            .parent()
            .map(|d| d.join("ployz-lab-sweep"))
            .filter(|p| p.is_file())
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "cargo run -p ployz-lab --bin ployz-lab-sweep".to_owned());
        s.push_str(&format!(
            "  remove it: {sweep} (or start another lab: it sweeps labs whose process ended)\n"
        ));
        s
    }

    fn teardown(&mut self) -> Vec<String> {
        // The netem threads hold their namespaces open: end them first.
        self.delayers.clear();
        // First ask politely, all Machines at once: dockerd stops its containers and shims,
        // which then leave no sockets or mounts behind.
        let mut running: Vec<Child> = Vec::new();
        for m in &mut self.machines {
            for c in [
                m.daemon.take(),
                m.dockerd.take(),
                m.sshd.take(),
                m.host.take(),
            ]
            .into_iter()
            .flatten()
            {
                procs::signal(c.id() as i32, libc::SIGTERM);
                running.push(c);
            }
        }
        // Bounded: a dockerd with running containers takes ~10 s to stop them and containerd;
        // what has not ended by then is killed, and its shims' sockets removed by name.
        let deadline = Instant::now() + Duration::from_secs(3);
        for c in &mut running {
            while Instant::now() < deadline && matches!(c.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        // Then SIGKILL whatever is left, remove mounts, names and directories.
        let left = self.state.remove();
        for mut c in running {
            let _ = c.kill();
            let _ = c.wait();
        }
        left
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let failed = self.failed || std::thread::panicking();
        if failed && std::env::var_os("PLOYZ_LAB_KEEP").is_some_and(|v| v == "1") {
            // The processes keep running (their handles are dropped, not killed).
            eprintln!(
                "ployz-lab: PLOYZ_LAB_KEEP=1 keeps the failed {}",
                self.how_to_enter()
            );
            return;
        }
        let left = self.teardown();
        if !left.is_empty() {
            eprintln!(
                "ployz-lab: lab {} left things behind (the next lab's start retries): {}",
                self.state.run,
                left.join("; ")
            );
        }
    }
}

/// The firewall tools of the families whose bridged frames cross the root namespace's
/// netfilter (`br_netfilter` loaded, `bridge-nf-call-ip{,6}tables` 1).
fn bridge_netfilter_families() -> Vec<&'static str> {
    [
        ("iptables", "bridge-nf-call-iptables"),
        ("ip6tables", "bridge-nf-call-ip6tables"),
    ]
    .into_iter()
    .filter(|(tool, sysctl)| {
        let on = std::fs::read_to_string(format!("/proc/sys/net/bridge/{sysctl}"))
            .is_ok_and(|v| v.trim() == "1");
        on && which(tool).is_some()
    })
    .map(|(tool, _)| tool)
    .collect()
}

/// Whether process `pid` runs (exists and is not a zombie): for tests asserting that a lab's
/// processes are gone.
pub fn process_runs(pid: i32) -> bool {
    procs::alive(pid)
}

/// Checks the tools and rights a lab needs, naming what is missing.
fn preflight(sshd: bool, hosts: bool) -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the lab needs root (network namespaces, dockerd, iptables): run the test as root");
    }
    let mut tools = vec![
        ("ip", "iproute2"),
        ("bridge", "iproute2"),
        ("tc", "iproute2"),
        ("iptables", "iptables"),
        ("nsenter", "util-linux"),
        ("dockerd", "docker.io"),
        ("docker", "docker.io"),
        ("tar", "tar"),
    ];
    if sshd {
        tools.push(("ssh", "openssh-client"));
        tools.push(("ssh-keygen", "openssh-client"));
    }
    for (tool, package) in tools {
        if which(tool).is_none() {
            bail!("`{tool}` is not on PATH: install Debian's {package}");
        }
    }
    if !Path::new("/bin/busybox").is_file() {
        bail!("/bin/busybox is missing: install Debian's busybox-static (the lab's test image)");
    }
    if hosts {
        for (tool, package) in [
            ("unshare", "util-linux"),
            ("systemctl", "systemd"),
            ("sudo", "sudo"),
        ] {
            if which(tool).is_none() {
                bail!("`{tool}` is not on PATH: install Debian's {package} (LabOptions.hosts)");
            }
        }
        if !Path::new("/lib/systemd/systemd").is_file() {
            bail!("/lib/systemd/systemd is missing: install Debian's systemd (LabOptions.hosts)");
        }
    }
    if sshd && !Path::new("/usr/sbin/sshd").is_file() {
        bail!("/usr/sbin/sshd is missing: install Debian's openssh-server (LabOptions.sshd)");
    }
    Ok(())
}

fn which(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

/// Runs a command to its end, failing with its stderr when it exits non-zero.
fn run(cmd: &mut Command) -> anyhow::Result<Output> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out)
}

/// Runs a command to its end and returns what it did (a command that cannot start panics).
fn output(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

fn or_panic<T>(r: anyhow::Result<T>) -> T {
    r.unwrap_or_else(|e| panic!("{e:#}"))
}

/// SIGTERM, a bounded wait, SIGKILL. Returns whether SIGTERM sufficed.
fn terminate(child: &mut Child, grace: Duration) -> bool {
    if matches!(child.try_wait(), Ok(Some(_))) {
        return true;
    }
    procs::signal(child.id() as i32, libc::SIGTERM);
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if matches!(child.try_wait(), Ok(Some(_))) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    false
}

/// Whether a dockerd answers `GET /_ping` with 200 on its socket.
fn docker_ping(sock: &Path) -> bool {
    let Ok(mut s) = UnixStream::connect(sock) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    text.starts_with("HTTP/1.") && text.lines().next().is_some_and(|l| l.contains(" 200"))
}

fn keygen(path: &Path) -> anyhow::Result<()> {
    let _ = std::fs::remove_file(path);
    let _ = std::fs::remove_file(path.with_extension("pub"));
    run(Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(path))?;
    Ok(())
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// The last `n` lines of `text`.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Lays `over` onto `base`: tables merge key by key, anything else is replaced.
fn merge(base: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extra_toml_merges_key_by_key() {
        let mut base: toml::Table = "a = 1\n[mesh]\ninterface = \"x\"\nclock_offset_ms = 0\n"
            .parse()
            .unwrap();
        let over: toml::Table = "b = 2\n[mesh]\nclock_offset_ms = 5\n".parse().unwrap();
        merge(&mut base, over);
        assert_eq!(base["a"].as_integer(), Some(1));
        assert_eq!(base["b"].as_integer(), Some(2));
        assert_eq!(base["mesh"]["interface"].as_str(), Some("x"));
        assert_eq!(base["mesh"]["clock_offset_ms"].as_integer(), Some(5));
    }

    #[test]
    fn tail_keeps_the_last_lines() {
        assert_eq!(tail("a\nb\nc", 2), "b\nc");
        assert_eq!(tail("a", 5), "a");
    }
}
