//! Host Machines ([`crate::LabOptions::hosts`]): each Machine a host of its own, the way a
//! server is one, so that installing Ployz on it is tested the way users install it.
//!
//! A host Machine runs systemd as PID 1 of its own PID namespace, with its own mount, UTS and
//! cgroup namespaces, inside the Machine's network namespace. Its `/etc`, `/usr`, `/var/lib`,
//! `/var/log`, `/var/cache`, `/root` and `/home` are overlays on the lab host's (what is written there lands in
//! the Machine's directory; the lab host's files are never changed), `/run` a tmpfs and `/tmp` a
//! directory of its own. Its cgroup hierarchies are mounted from inside its cgroup namespace, so
//! its systemd manages a subtree named after the Machine and nothing above it. The unit files
//! of Docker and sshd the lab host has installed are masked there: the lab gives each Machine
//! its own dockerd (serving `/run/docker.sock`, where Docker's package serves it) and sshd,
//! started in all of the Machine's namespaces.
//!
//! Everything the Machine runs is in its network namespace and below its PID 1, so the lab's
//! teardown (SIGKILL by namespace, then the cgroups by name) removes it whole.

use std::path::Path;

use crate::state::MachineState;

/// The systemd target a host Machine boots to: basic.target, then whatever is started in it.
const TARGET: &str = "ployz-lab.target";

/// The unit files of the lab host a Machine must not run itself (the lab runs its own).
const MASKED: &[&str] = &[
    "docker.service",
    "docker.socket",
    "containerd.service",
    "ssh.service",
    "ssh.socket",
    "sshd.service",
];

/// The cgroup v1 controllers a host Machine mounts (those systemd and dockerd use), and the
/// named systemd hierarchy.
pub(crate) const CONTROLLERS: &[&str] = &["memory", "pids", "cpu", "cpuacct", "devices", "blkio"];

/// The overlaid directories, and the name of their upper/work directories.
const OVERLAYS: &[(&str, &str)] = &[
    ("/etc", "etc"),
    ("/usr", "usr"),
    ("/var/lib", "var-lib"),
    ("/var/log", "var-log"),
    ("/var/cache", "var-cache"),
    // Users' homes: what `useradd -m` and an install staged over SSH write there.
    ("/root", "root"),
    ("/home", "home"),
];

/// The script run as the Machine's first process (in its new namespaces): builds its mounts,
/// then becomes systemd.
pub(crate) fn boot_script(m: &MachineState, hostname: &str) -> String {
    let root = m.dir.join("host");
    let mut s = String::from("set -eu\n");
    for (dir, name) in OVERLAYS {
        let upper = root.join(format!("{name}.upper"));
        let work = root.join(format!("{name}.work"));
        s.push_str(&format!(
            "mkdir -p {upper} {work}\nmount -t overlay overlay -o lowerdir={dir},upperdir={upper},workdir={work} {dir}\n",
            upper = upper.display(),
            work = work.display(),
        ));
    }
    // A fresh server: nothing of Ployz the lab host itself may have installed shows through
    // the overlays (removed in the Machine's upper layers only).
    s.push_str(
        "rm -rf /usr/bin/ployz /lib/systemd/system/ployz.service /etc/systemd/system/ployz.service \\\n  /etc/systemd/system/multi-user.target.wants/ployz.service /etc/ployz /var/lib/ployz\n",
    );
    let tmp = root.join("tmp");
    s.push_str(&format!(
        "mkdir -p {tmp}\nchmod 1777 {tmp}\nmount --bind {tmp} /tmp\n",
        tmp = tmp.display()
    ));
    s.push_str("mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs /run\n");
    s.push_str("mkdir -p /run/systemd/system /run/lock /run/sshd\n");
    // The cgroup hierarchies as this cgroup namespace sees them (its root is the Machine's).
    s.push_str("mount -t tmpfs -o mode=0755 tmpfs /sys/fs/cgroup\n");
    for c in CONTROLLERS {
        s.push_str(&format!(
            "if grep -qw {c} /proc/cgroups; then mkdir -p /sys/fs/cgroup/{c}; mount -t cgroup -o {c} cgroup /sys/fs/cgroup/{c}; fi\n"
        ));
    }
    s.push_str(
        "mkdir -p /sys/fs/cgroup/systemd\nmount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd\n",
    );
    // Its name resolves, as on a server (sudo looks it up, and waits on DNS when it does not).
    s.push_str(&format!(
        "hostname {hostname}\necho {hostname} > /etc/hostname\nprintf '127.0.0.1 localhost\\n127.0.1.1 {hostname}\\n::1 localhost ip6-localhost ip6-loopback\\n' > /etc/hosts\n"
    ));
    // A machine ID of its own (systemd and journald key on it).
    s.push_str(&format!(
        "echo {} > /etc/machine-id\n",
        machine_id(&m.netns)
    ));
    s.push_str("mkdir -p /etc/systemd/system\n");
    for unit in MASKED {
        s.push_str(&format!("ln -sfn /dev/null /etc/systemd/system/{unit}\n"));
    }
    s.push_str(&format!(
        "cat > /etc/systemd/system/{TARGET} <<'EOF'\n[Unit]\nDescription=A Ployz lab host Machine\nRequires=basic.target\nAfter=basic.target\nAllowIsolate=yes\nEOF\n"
    ));
    s.push_str(&format!(
        "exec env container=ployz-lab /lib/systemd/systemd --system --unit={TARGET} --log-target=console --show-status=no\n"
    ));
    s
}

/// 32 hex digits derived from the namespace's name.
fn machine_id(name: &str) -> String {
    // FNV-1a, twice with different offsets: unique per name, stable, no dependency.
    let hash = |seed: u64| {
        name.bytes().fold(seed, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        })
    };
    format!(
        "{:016x}{:016x}",
        hash(0xcbf2_9ce4_8422_2325),
        hash(0x8422_2325_cbf2_9ce4)
    )
}

/// Puts the calling process's future children (via a shell snippet run before `exec`) into the
/// Machine's cgroup in every hierarchy: the text of a `sh -c` prefix.
pub(crate) fn enter_cgroups(cgroup: &str) -> String {
    let mut s = String::new();
    for c in CONTROLLERS.iter().chain(["systemd", "unified"].iter()) {
        let dir = Path::new("/sys/fs/cgroup").join(c);
        s.push_str(&format!(
            "if [ -d {d} ]; then mkdir -p {d}/{cgroup} && echo $$ > {d}/{cgroup}/cgroup.procs; fi\n",
            d = dir.display()
        ));
    }
    s
}

/// The PID of the Machine's systemd: the child of `unshare` (PID `unshare`) once it has become
/// systemd.
pub(crate) fn systemd_pid(unshare: u32) -> Option<u32> {
    let children =
        std::fs::read_to_string(format!("/proc/{unshare}/task/{unshare}/children")).ok()?;
    children
        .split_whitespace()
        .filter_map(|p| p.parse::<u32>().ok())
        .find(|p| {
            std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "systemd")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn machine_ids_are_32_hex_digits_and_differ_by_name() {
        let a = machine_id("ployzlab-3-0");
        let b = machine_id("ployzlab-3-1");
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
