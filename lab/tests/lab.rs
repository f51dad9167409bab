//! The lab proves itself: three real Machines (namespaces, dockerds, daemons) answer, reach
//! each other on the underlay, can be partitioned, slowed, killed, stopped and started, serve a
//! container across the underlay, and leave nothing behind; a lab whose process was killed is
//! swept by the next.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use ployz_lab::{
    link_exists, list_netns, process_runs, shim_socket, Lab, LabOptions, LabState, MachineOptions,
    LAB_IMAGE,
};

fn text(out: &Output) -> String {
    format!(
        "status {}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// One ping from Machine `from` to Machine `to`'s underlay address, waiting 1 s for the answer.
fn pings(lab: &Lab, from: usize, to: usize) -> bool {
    let addr = lab.underlay_addr(to).to_string();
    lab.exec_in(from, &["/bin/busybox", "ping", "-c", "1", "-W", "1", &addr])
        .status
        .success()
}

/// Waits (bounded) until `from` reaches `to`.
fn reaches_within(lab: &Lab, from: usize, to: usize, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if pings(lab, from, to) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
    }
}

fn machine_id(lab: &Lab, i: usize) -> String {
    let ls = lab.json(i, &["machine", "ls", "--json"]);
    ls["values"][0]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("machine ls on Machine {i} shows no id: {ls}"))
        .to_owned()
}

/// `N packets transmitted, M packets received` of busybox ping.
fn ping_counts(summary: &str) -> (u32, u32) {
    let line = summary
        .lines()
        .find(|l| l.contains("packets transmitted"))
        .unwrap_or_else(|| panic!("no ping summary: {summary}"));
    let numbers: Vec<u32> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    (numbers[0], numbers[1])
}

/// The minimum of `round-trip min/avg/max = a/b/c ms`.
fn ping_min_rtt_ms(summary: &str) -> Option<f64> {
    let line = summary.lines().find(|l| l.contains("min/avg/max"))?;
    line.split('=')
        .nth(1)?
        .trim()
        .split('/')
        .next()?
        .trim()
        .parse()
        .ok()
}

fn cgroups_named(name: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let root = Path::new("/sys/fs/cgroup");
    if root.join(name).exists() {
        out.push(root.join(name));
    }
    for e in std::fs::read_dir(root).into_iter().flatten().flatten() {
        if e.path().join(name).exists() {
            out.push(e.path().join(name));
        }
    }
    out
}

/// Asserts nothing a lab with this state made is left: namespaces, links, FORWARD rule,
/// cgroups, directory, processes.
fn assert_gone(state: &LabState, processes: &BTreeSet<i32>) {
    let netns = list_netns();
    for m in &state.machines {
        assert!(!netns.contains(&m.netns), "namespace {} is left", m.netns);
        assert!(!link_exists(&m.veth), "link {} is left", m.veth);
        assert!(
            cgroups_named(&m.cgroup).is_empty(),
            "cgroups {:?} are left",
            cgroups_named(&m.cgroup)
        );
        for (pid, _) in &m.pids {
            assert!(
                !process_runs(*pid),
                "process {pid} of Machine {} runs",
                m.index
            );
        }
    }
    assert!(
        !link_exists(&state.bridge),
        "bridge {} is left",
        state.bridge
    );
    assert!(!state.dir.exists(), "{} is left", state.dir.display());
    let forward = Command::new("iptables")
        .args(["-S", "FORWARD"])
        .output()
        .expect("iptables runs");
    let forward = String::from_utf8_lossy(&forward.stdout);
    if let Some(comment) = &state.forward_rule {
        assert!(
            !forward.contains(comment.as_str()),
            "FORWARD rule left: {forward}"
        );
    }
    let running: Vec<i32> = processes
        .iter()
        .copied()
        .filter(|p| process_runs(*p))
        .collect();
    assert!(
        running.is_empty(),
        "processes of the lab still run: {running:?}"
    );
}

#[test]
#[ignore = "needs root, dockerd"]
fn three_machines_answer_reach_each_other_fail_and_leave_nothing_behind() {
    let mut lab = Lab::start(LabOptions {
        sshd: true,
        ..LabOptions::machines(3)
    });
    eprintln!("raised 3 Machines in {:?}", lab.raised_in());

    // Each daemon answers on its own socket, with its own identity.
    let mut ids = Vec::new();
    for i in 0..3 {
        let name = format!("lab-m{i}");
        let out = lab.ployz(i, &["machine", "init", "--name", &name]);
        assert!(out.status.success(), "init on Machine {i}: {}", text(&out));
        let ls = lab.json(i, &["machine", "ls", "--json"]);
        assert_eq!(ls["values"][0]["name"], name.as_str(), "{ls}");
        ids.push(machine_id(&lab, i));
    }
    // Each mesh comes up at the first try: the mesh module and the orchestrator both make the
    // Docker network `ployz` right after init, and the one that loses that race takes the
    // other's network instead of failing (Docker says "Pool overlaps" to the loser).
    for i in 0..3 {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !lab.log(i).contains("mesh interface up") {
            assert!(
                Instant::now() < deadline,
                "Machine {i}'s mesh is not up: {}",
                lab.log(i)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(
            !lab.log(i).contains("the mesh could not start"),
            "Machine {i}'s mesh failed first: {}",
            lab.log(i)
        );
    }
    let in_ns = lab.ployz_in_ns(2, &["machine", "ls", "--json"]);
    assert!(
        in_ns.status.success(),
        "the CLI inside Machine 2: {}",
        text(&in_ns)
    );
    assert_ne!(ids[0], ids[1]);
    assert_ne!(ids[1], ids[2]);

    // Over SSH from the root namespace to Machine 1's sshd, whose sessions find Machine 1's
    // socket: what `ployz machine add ssh://root@<underlay>` run against Machine 0 needs.
    let over_ssh = lab
        .cli_bare()
        .args(["--connect", &lab.ssh_url(1), "machine", "ls", "--json"])
        .output()
        .expect("ployz runs");
    assert!(over_ssh.status.success(), "over ssh: {}", text(&over_ssh));
    let ls: serde_json::Value = serde_json::from_slice(&over_ssh.stdout).expect("json");
    assert_eq!(ls["values"][0]["id"], ids[1].as_str(), "{ls}");

    // The underlay: every Machine reaches every other.
    for (from, to) in [(0, 1), (1, 2), (2, 0)] {
        assert!(
            reaches_within(&lab, from, to, Duration::from_secs(10)),
            "Machine {from} does not reach Machine {to}"
        );
    }

    // A partition {0,1} | {2}: 0 and 1 still meet, 2 reaches neither; heal restores it.
    lab.partition(&[&[0, 1], &[2]]);
    assert!(
        reaches_within(&lab, 0, 1, Duration::from_secs(10)),
        "0 -> 1 within a group failed"
    );
    assert!(!pings(&lab, 0, 2), "0 -> 2 crossed the partition");
    assert!(!pings(&lab, 2, 1), "2 -> 1 crossed the partition");
    lab.heal();
    assert!(
        reaches_within(&lab, 0, 2, Duration::from_secs(10)),
        "heal did not restore 0 -> 2"
    );
    assert!(reaches_within(&lab, 2, 1, Duration::from_secs(10)));

    // Loss and delay on every underlay link: in place, felt (no ping is faster than the delay
    // there and back, some are lost), then cleared.
    lab.netem(20.0, 50);
    for i in 0..3 {
        let shown = lab.netem_in_place(i);
        assert!(shown.is_some(), "no netem on Machine {i}'s link");
    }
    let to = lab.underlay_addr(1).to_string();
    let pinged = lab.exec_in(
        0,
        &[
            "/bin/busybox",
            "ping",
            "-c",
            "30",
            "-i",
            "0.05",
            "-W",
            "1",
            &to,
        ],
    );
    let summary = String::from_utf8_lossy(&pinged.stdout).into_owned();
    let (sent, received) = ping_counts(&summary);
    assert_eq!(sent, 30, "{summary}");
    assert!(
        received > 0 && received < 30,
        "20% loss each way, yet {received}/30: {summary}"
    );
    let min_rtt =
        ping_min_rtt_ms(&summary).unwrap_or_else(|| panic!("no round-trip line: {summary}"));
    assert!(
        min_rtt >= 50.0,
        "a round trip of {min_rtt} ms beat the 50 ms delay: {summary}"
    );
    lab.clear_netem();
    for i in 0..3 {
        assert_eq!(lab.netem_in_place(i), None, "netem left on Machine {i}");
    }
    let pinged = lab.exec_in(
        0,
        &[
            "/bin/busybox",
            "ping",
            "-c",
            "5",
            "-i",
            "0.05",
            "-W",
            "1",
            &to,
        ],
    );
    let summary = String::from_utf8_lossy(&pinged.stdout).into_owned();
    assert_eq!(
        ping_counts(&summary).1,
        5,
        "loss after clear_netem: {summary}"
    );

    // kill -9, then start again: the same Machine with its data.
    lab.kill_daemon(1);
    let out = lab.ployz(1, &["machine", "ls", "--json"]);
    assert!(
        !out.status.success(),
        "a killed daemon answered: {}",
        text(&out)
    );
    lab.start_daemon(1);
    assert_eq!(
        machine_id(&lab, 1),
        ids[1],
        "the daemon lost its identity on restart"
    );

    // SIGTERM ends a daemon within its short drain; it starts again with new options.
    assert!(
        lab.term_daemon(0),
        "daemon 0 needed SIGKILL: {}",
        lab.log(0)
    );
    lab.set_machine_options(
        0,
        MachineOptions {
            clock_offset_ms: 3_600_000,
            daemon_toml: "[mesh]\nprofile = \"wan\"\n".into(),
        },
    );
    let config = lab.daemon_config(0).expect("config");
    assert!(config.contains("clock_offset_ms = 3600000"), "{config}");
    assert!(config.contains("profile = \"wan\""), "{config}");
    assert!(
        config.contains(&format!("interface = \"{}\"", lab.wg_interface(0))),
        "{config}"
    );
    lab.start_daemon(0);
    assert_eq!(machine_id(&lab, 0), ids[0]);

    // The whole Machine stopped (dockerd too), then started again.
    lab.stop_machine(2);
    assert!(
        !lab.docker(2, &["info"]).status.success(),
        "dockerd 2 still answers"
    );
    assert!(!lab.ployz(2, &["machine", "ls"]).status.success());
    lab.start_machine(2);
    let info = lab.docker(2, &["image", "inspect", LAB_IMAGE]);
    assert!(
        info.status.success(),
        "the test image is gone: {}",
        text(&info)
    );
    assert_eq!(machine_id(&lab, 2), ids[2]);

    // A container on Machine 1, published on 8080, answers from Machine 2's namespace on
    // Machine 1's underlay address.
    let run = lab.docker(
        1,
        &[
            "run",
            "-d",
            "--name",
            "lab-httpd",
            "-p",
            "8080:80",
            LAB_IMAGE,
            "sh",
            "-c",
            "echo hello-from-machine-1 > /www/index.html && exec httpd -f -p 80 -h /www",
        ],
    );
    assert!(run.status.success(), "docker run: {}", text(&run));
    let url = format!("http://{}:8080/", lab.underlay_addr(1));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        // busybox's nc, not its wget (which crashes outside a container on Debian 12).
        let request = format!(
            "printf 'GET / HTTP/1.0\\r\\n\\r\\n' | /bin/busybox nc -w 2 {} 8080",
            lab.underlay_addr(1)
        );
        let got = lab.exec_in(2, &["/bin/busybox", "sh", "-c", &request]);
        if String::from_utf8_lossy(&got.stdout).contains("hello-from-machine-1") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{url} did not answer from Machine 2: {}",
            text(&got)
        );
    }

    let inspect = lab.docker(1, &["inspect", "-f", "{{.Id}}", "lab-httpd"]);
    let container_id = String::from_utf8_lossy(&inspect.stdout).trim().to_owned();
    let shim = shim_socket(lab.machine_dir(1), &container_id).expect("sha256sum runs");
    assert!(
        shim.exists(),
        "the shim socket is not where the lab looks: {}",
        shim.display()
    );

    // Dropped: nothing of it remains, the container's processes and shim socket included.
    let state = lab.state().clone();
    let processes = lab.processes();
    assert!(
        processes.len() >= 7,
        "expected the daemons, dockerds, containerds and the container: {processes:?}"
    );
    drop(lab);
    assert_gone(&state, &processes);
    assert!(!shim.exists(), "{} is left", shim.display());
}

/// Not a test on its own: the child process of `a_leftover_of_a_killed_run_is_swept`, which
/// raises a lab, writes its state to `PLOYZ_LAB_HOLD` and waits to be killed. Without that
/// variable it does nothing.
#[test]
#[ignore = "needs root, dockerd"]
fn hold_a_lab_for_the_sweep_test() {
    let Some(path) = std::env::var_os("PLOYZ_LAB_HOLD") else {
        return;
    };
    let path = PathBuf::from(path);
    let lab = Lab::start(LabOptions::machines(1));
    let report = serde_json::json!({
        "state": lab.state(),
        "processes": lab.processes(),
    });
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, report.to_string()).expect("write the hold report");
    std::fs::rename(&tmp, &path).expect("write the hold report");
    loop {
        std::thread::park();
    }
}

#[test]
#[ignore = "needs root, dockerd"]
fn a_leftover_of_a_killed_run_is_swept() {
    let report = std::env::temp_dir().join(format!("ployz-lab-hold-{}.json", std::process::id()));
    let _ = std::fs::remove_file(&report);
    let log = report.with_extension("log");
    let log_file = std::fs::File::create(&log).expect("create the child's log");
    let mut child = Command::new(std::env::current_exe().expect("test executable"))
        .args([
            "--exact",
            "hold_a_lab_for_the_sweep_test",
            "--include-ignored",
            "--nocapture",
        ])
        .env("PLOYZ_LAB_HOLD", &report)
        .stdin(Stdio::null())
        .stdout(log_file.try_clone().expect("log"))
        .stderr(log_file)
        .spawn()
        .expect("start the child lab");
    // The child may wait for the lab lock while another lab test runs.
    let deadline = Instant::now() + Duration::from_secs(900);
    while !report.exists() {
        if let Some(status) = child.try_wait().expect("child status") {
            panic!(
                "the child lab exited ({status}): {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        assert!(Instant::now() < deadline, "the child lab did not come up");
        std::thread::sleep(Duration::from_millis(100));
    }
    let held: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report).expect("read the report")).expect("json");
    let old: LabState = serde_json::from_value(held["state"].clone()).expect("state");
    let processes: BTreeSet<i32> =
        serde_json::from_value(held["processes"].clone()).expect("processes");
    child.kill().expect("kill -9 the child");
    child.wait().expect("reap the child");
    let _ = std::fs::remove_file(&report);
    let _ = std::fs::remove_file(&log);

    // The leftover is really there: its namespace, bridge and dockerd outlived their owner.
    assert!(list_netns().contains(&old.machines[0].netns));
    assert!(link_exists(&old.bridge));
    assert!(processes.iter().any(|p| process_runs(*p)), "{processes:?}");

    let lab = Lab::start(LabOptions::machines(1));
    assert_ne!(
        lab.run(),
        old.run,
        "the new lab reused the leftover's names"
    );
    assert_gone(&old, &processes);
    let state = lab.state().clone();
    let processes = lab.processes();
    drop(lab);
    assert_gone(&state, &processes);
}
