//! Ployz installed on host Machines the way users install it on their servers: from one CLI,
//! over SSH, as the `ployz.service` systemd unit (a real systemd per host Machine, with its own
//! `/etc`, `/usr`, `/var/lib` and `/run`), then a Cluster formed and a deploy served; upgraded
//! in place under load; removed.

mod common;

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{text, wait_for, web_compose};
use ployz_lab::{Lab, LabOptions};
use serde_json::Value;

/// The workstation's CLI: this build without its debug information (a fifth of the size; it
/// copies itself to every host it installs).
fn workstation(lab: &Lab) -> PathBuf {
    let path = lab.dir().join("ployz");
    if !path.exists() {
        let bin = ployz_lab::ployz_bin().expect("the ployz binary");
        let out = Command::new("strip")
            .arg("--strip-debug")
            .arg("-o")
            .arg(&path)
            .arg(&bin)
            .output()
            .expect("strip runs (binutils)");
        assert!(out.status.success(), "strip: {}", text(&out));
    }
    path
}

/// Another build of the workstation's CLI, as a rebuild makes one: the same code, one more
/// section (so its digest differs, and stripping keeps the difference).
fn next_build(lab: &Lab, from: &Path) -> PathBuf {
    build_named(lab, from, "next")
}

/// [`next_build`] named `name` (a build after `from`, whatever `from` is).
fn build_named(lab: &Lab, from: &Path, name: &str) -> PathBuf {
    let note = lab.dir().join(format!("{name}-build-note"));
    std::fs::write(&note, format!("the {name} build\n")).expect("write the note");
    let path = lab.dir().join(format!("ployz-{name}"));
    let out = Command::new("objcopy")
        .arg(format!(
            "--add-section=.note.ployz-{name}={}",
            note.display()
        ))
        .arg(format!(
            "--set-section-flags=.note.ployz-{name}=noload,readonly"
        ))
        .arg(from)
        .arg(&path)
        .output()
        .expect("objcopy runs (binutils)");
    assert!(out.status.success(), "objcopy: {}", text(&out));
    path
}

/// `ployz ARGS` from the lab's workstation (its HOME, its SSH client), no `--connect`.
fn cli(lab: &Lab, args: &[&str]) -> Output {
    let mut c = lab.cli_program(&workstation(lab));
    c.args(args);
    c.output().expect("the CLI runs")
}

fn cli_ok(lab: &Lab, args: &[&str]) -> Output {
    let out = cli(lab, args);
    assert!(
        out.status.success(),
        "ployz {args:?} failed:\n{}\n{}",
        text(&out),
        host_logs(lab)
    );
    out
}

/// What each host Machine's ployz.service says of itself, for failure messages.
fn host_logs(lab: &Lab) -> String {
    (0..lab.len())
        .map(|i| {
            format!(
                "--- host Machine {i}: systemctl status ployz ---\n{}\n--- its journal ---\n{}",
                stdout(&lab.host_exec(i, &["systemctl", "status", "ployz", "--no-pager"])),
                lab.host_journal(i, "ployz.service", 30)
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A root shell command on host Machine `i`, which must succeed; its stdout.
fn host_sh(lab: &Lab, i: usize, script: &str) -> String {
    let out = lab.host_exec(i, &["sh", "-c", script]);
    assert!(
        out.status.success(),
        "`{script}` on host Machine {i} failed:\n{}",
        text(&out)
    );
    stdout(&out)
}

/// `systemctl is-active ployz` / `is-enabled ployz` on host Machine `i`.
fn unit_state(lab: &Lab, i: usize) -> (String, String) {
    (
        stdout(&lab.host_exec(i, &["systemctl", "is-active", "ployz.service"])),
        stdout(&lab.host_exec(i, &["systemctl", "is-enabled", "ployz.service"])),
    )
}

/// Host Machine `i`'s `ployz.service` is active and enabled.
fn assert_running(lab: &Lab, i: usize) {
    assert_eq!(
        unit_state(lab, i),
        ("active".into(), "enabled".into()),
        "{}",
        host_logs(lab)
    );
}

/// Per Machine, what host Machine `i`'s daemon observes: (name, phase, membership).
fn observed(lab: &Lab, i: usize) -> Option<Vec<(String, String, String)>> {
    let out = lab.ployz(i, &["machine", "ls", "--json"]);
    if !out.status.success() {
        return None;
    }
    let v: Value = serde_json::from_slice(&out.stdout).ok()?;
    let mut list: Vec<(String, String, String)> = v["values"]
        .as_array()?
        .iter()
        .map(|m| {
            let s = |k: &str| m[k].as_str().unwrap_or_default().to_owned();
            (s("name"), s("phase"), s("membership"))
        })
        .collect();
    list.sort();
    Some(list)
}

fn whole(lab: &Lab, names: &[&str]) -> bool {
    (0..lab.len()).all(|i| {
        observed(lab, i).is_some_and(|o| {
            o.len() == names.len()
                && o.iter()
                    .zip(names)
                    .all(|((name, phase, membership), want)| {
                        name == want && phase == "participating" && membership == "up"
                    })
        })
    })
}

/// `curl` inside Machine `i`'s network namespace against its own edge.
fn curl_edge(lab: &Lab, i: usize) -> Output {
    Command::new("nsenter")
        .arg(format!("--net=/var/run/netns/{}", lab.netns(i)))
        .args(["curl", "-sS", "-m", "5", "-H", "Host: web.example.test"])
        .arg(format!("http://{}/", lab.underlay_addr(i)))
        .output()
        .expect("nsenter runs")
}

#[test]
#[ignore = "needs root, dockerd, systemd and sshd: host Machines (scripts/test.sh runs it)"]
fn three_hosts_installed_over_ssh_form_a_cluster_serve_a_deploy_and_upgrade_under_load() {
    let lab = Lab::start(LabOptions {
        hosts: true,
        ..LabOptions::machines(3)
    });
    // A fresh server: no Ployz, Docker's socket where its package puts it.
    for i in 0..3 {
        assert!(
            !lab.host_path(i, "/usr/bin/ployz").exists(),
            "host Machine {i} has Ployz before it was installed"
        );
    }
    // Host 2 is reached as a user with passwordless sudo, as on many cloud images (no password
    // and not locked: sshd refuses a locked account even its key).
    host_sh(
        &lab,
        2,
        "useradd -m -p '*' -s /bin/sh deployer && echo 'deployer ALL=(ALL) NOPASSWD:ALL' > /etc/sudoers.d/deployer && chmod 0440 /etc/sudoers.d/deployer",
    );

    // The first Machine: installed and initialised in one command, its connection saved.
    let init = cli_ok(&lab, &["machine", "init", "--name", "m0", &lab.ssh_url(0)]);
    let progress = stderr(&init);
    for step in [
        "checking ssh://root@",
        "copying Ployz ",
        "installing Ployz ",
        "waiting for the daemon on ",
        "is running on ",
        "context 'default' now reaches ssh://root@",
    ] {
        assert!(progress.contains(step), "no `{step}` in:\n{progress}");
    }
    assert!(
        stdout(&init).contains("Machine 'm0' initialised"),
        "{}",
        text(&init)
    );
    assert_running(&lab, 0);
    // What the installation made, with its modes.
    assert_eq!(
        host_sh(
            &lab,
            0,
            "stat -c '%a %U' /usr/bin/ployz /var/lib/ployz /etc/ployz/daemon.toml && getent group ployz | cut -d: -f1 && systemctl show -p Type -p NRestarts -p WatchdogUSec ployz.service"
        ),
        "755 root\n700 root\n644 root\nployz\nType=notify\nWatchdogUSec=1min\nNRestarts=0"
    );

    // The others added through the saved context; host 2 as the sudo user, host 1 with /tmp
    // mounted noexec, as hardened hosts have it (the CLI stages the install elsewhere).
    host_sh(&lab, 1, "mount -o remount,bind,noexec /tmp");
    cli_ok(&lab, &["machine", "add", "--name", "m1", &lab.ssh_url(1)]);
    let as_user = format!("ssh://deployer@{}", lab.underlay_addr(2));
    let add = cli_ok(&lab, &["machine", "add", "--name", "m2", &as_user]);
    assert!(stderr(&add).contains("installing Ployz "), "{}", text(&add));
    for i in 1..3 {
        assert_running(&lab, i);
    }
    // The sudo user reaches the daemon's socket as a member of the group ployz.
    assert!(
        host_sh(&lab, 2, "id -nG deployer")
            .split_whitespace()
            .any(|g| g == "ployz"),
        "deployer is not in the group ployz"
    );
    wait_for(
        &lab,
        "every Machine observes m0, m1, m2 participating and up",
        Duration::from_secs(60),
        || whole(&lab, &["m0", "m1", "m2"]).then_some(()),
    );
    // Each host is reached through the context the CLI saved.
    let ls = cli_ok(&lab, &["machine", "ls"]);
    for name in ["m0", "m1", "m2"] {
        assert!(stdout(&ls).contains(name), "{}", text(&ls));
    }

    // A deploy from the same CLI: one replica per Machine, each reached through host 2's edge.
    let compose = lab.dir().join("compose.yaml");
    std::fs::write(&compose, web_compose(1)).expect("compose file");
    cli_ok(
        &lab,
        &["deploy", "-y", "-f", compose.to_str().expect("utf-8 path")],
    );
    wait_for(
        &lab,
        "web answers from all three Machines through host 2's edge",
        Duration::from_secs(60),
        || {
            let seen: std::collections::BTreeSet<String> = (0..15)
                .filter_map(|_| {
                    let out = curl_edge(&lab, 2);
                    let body = stdout(&out);
                    body.starts_with("web-on-").then_some(body)
                })
                .collect();
            (seen.len() == 3).then_some(seen)
        },
    );

    upgrade_under_load(&lab);

    // Installing again over a running daemon of this release changes nothing.
    let again = cli(&lab, &["machine", "add", "--name", "m1b", &lab.ssh_url(1)]);
    assert!(
        stderr(&again).contains("is installed and running on"),
        "{}",
        text(&again)
    );
}

/// One request on a new connection (`Connection: close`): the status and body, or what failed.
fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    timeout: Duration,
) -> Result<(u16, String), String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: web.example.test\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(head.as_bytes())
        .map_err(|e| format!("write: {e}"))?;
    let mut answer = Vec::new();
    s.read_to_end(&mut answer)
        .map_err(|e| format!("read: {e}"))?;
    let answer = String::from_utf8_lossy(&answer);
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no complete head in {answer:?}"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no status in {head:?}"))?;
    Ok((status, body.to_owned()))
}

/// Runs `cmd` to its end, its stderr lines stamped with when each came (for the figures).
fn timed(mut cmd: Command) -> (Output, String) {
    use std::io::BufRead as _;
    let began = Instant::now();
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the CLI starts");
    let err = child.stderr.take().expect("piped stderr");
    let lines = std::thread::spawn(move || {
        std::io::BufReader::new(err)
            .lines()
            .map_while(Result::ok)
            .map(|l| (began.elapsed(), l))
            .collect::<Vec<_>>()
    });
    let mut stdout = Vec::new();
    child
        .stdout
        .take()
        .expect("piped stdout")
        .read_to_end(&mut stdout)
        .expect("the CLI's stdout");
    let status = child.wait().expect("the CLI ends");
    let lines = lines.join().expect("the stderr reader");
    let timeline = lines
        .iter()
        .map(|(t, l)| format!("  {:>7.2} s  {l}", t.as_secs_f64()))
        .collect::<Vec<_>>()
        .join("\n");
    let stderr = lines
        .into_iter()
        .map(|(_, l)| l + "\n")
        .collect::<String>()
        .into_bytes();
    (
        Output {
            status,
            stdout,
            stderr,
        },
        timeline,
    )
}

/// How long the API on `socket` takes to answer `GET /v1/version`, or what failed.
fn api_probe(socket: &std::path::Path) -> Result<(), String> {
    let mut s = UnixStream::connect(socket).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    s.write_all(b"GET /v1/version HTTP/1.1\r\nHost: ployz\r\nConnection: close\r\n\r\n")
        .map_err(|e| format!("write: {e}"))?;
    let mut answer = String::new();
    s.read_to_string(&mut answer)
        .map_err(|e| format!("read: {e}"))?;
    if answer.starts_with("HTTP/1.1 200") {
        Ok(())
    } else {
        Err(format!("answered {:?}", answer.lines().next()))
    }
}

/// `ployz machine upgrade` to a new build while GETs and POSTs go through Machine 0's edge and
/// a 20 s request is in flight: no request fails, the long one completes, no unit restarts.
fn upgrade_under_load(lab: &Lab) {
    let edge = SocketAddr::from((lab.underlay_addr(0), 80));
    let next = next_build(lab, &workstation(lab));
    let next_sha = {
        let out = Command::new("sha256sum")
            .arg(&next)
            .output()
            .expect("sha256sum runs");
        stdout(&out)
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_owned()
    };
    let main_pids: Vec<String> = (0..lab.len())
        .map(|i| host_sh(lab, i, "systemctl show -p MainPID --value ployz.service"))
        .collect();

    let answers = |what: &str, path: &str| {
        wait_for(lab, what, Duration::from_secs(30), || {
            matches!(
                request(edge, "GET", path, "", Duration::from_secs(5)),
                Ok((200, _))
            )
            .then_some(())
        })
    };
    // Every replica answers before the load starts.
    answers("web answers through Machine 0's edge", "/");
    let slow = std::thread::spawn(move || {
        let started = Instant::now();
        (
            request(edge, "GET", "/cgi-bin/slow", "", Duration::from_secs(90)),
            started.elapsed(),
        )
    });
    answers("the long request runs in a container", "/slow-started");

    let stop = Arc::new(AtomicBool::new(false));
    let failures = Arc::new(Mutex::new(Vec::<String>::new()));
    let answered = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut load = Vec::new();
    for t in 0..4 {
        let (stop, failures, answered) = (stop.clone(), failures.clone(), answered.clone());
        load.push(std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let (method, path, body) = if t % 2 == 0 {
                    ("GET", "/", String::new())
                } else {
                    ("POST", "/cgi-bin/echo", format!("post-{t}-{n}"))
                };
                match request(edge, method, path, &body, Duration::from_secs(30)) {
                    Ok((200, got)) if method == "GET" && got.starts_with("web-on-") => {}
                    Ok((200, got)) if method == "POST" && got == body => {}
                    other => failures
                        .lock()
                        .unwrap()
                        .push(format!("{method} {path}: {other:?}")),
                }
                answered.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let socket = lab.socket(0);
    let probe_stop = stop.clone();
    let probe = std::thread::spawn(move || {
        let (mut last_ok, mut gap, mut failed) = (Instant::now(), Duration::ZERO, 0usize);
        while !probe_stop.load(Ordering::Relaxed) {
            match api_probe(&socket) {
                Ok(()) => {
                    gap = gap.max(last_ok.elapsed());
                    last_ok = Instant::now();
                }
                Err(_) => failed += 1,
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        (gap, failed)
    });

    let began = Instant::now();
    let mut upgrade = lab.cli_program(&next);
    upgrade.args(["machine", "upgrade"]);
    let (out, timeline) = timed(upgrade);
    let took = began.elapsed();
    eprintln!("machine upgrade, its progress lines by when they came:\n{timeline}");
    let (slow_answer, slow_took) = slow.join().expect("the long request's thread");
    stop.store(true, Ordering::Relaxed);
    for t in load {
        t.join().expect("a load thread");
    }
    let (api_gap, api_failed) = probe.join().expect("the API probe");
    assert!(
        out.status.success(),
        "machine upgrade failed:\n{}\n{}",
        text(&out),
        host_logs(lab)
    );
    assert!(
        stdout(&out).contains("3 of 3 Machines upgraded"),
        "{}",
        text(&out)
    );
    let failures = failures.lock().unwrap().clone();
    let total = answered.load(Ordering::Relaxed);
    eprintln!(
        "machine upgrade of 3 Machines took {took:?}; {total} requests through Machine 0's edge, {} failed; the long request took {slow_took:?}; the API socket's longest gap between answers {api_gap:?}, {api_failed} probes failed",
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} of {total} requests failed: {failures:?}\n{}",
        failures.len(),
        host_logs(lab)
    );
    assert!(total > 100, "only {total} requests ran during the upgrade");
    assert!(
        matches!(&slow_answer, Ok((200, body)) if body.starts_with("slow-on-")),
        "the long request did not complete: {slow_answer:?}"
    );
    // Each host runs the new build in a new main process of the same unit, never restarted.
    for (i, before) in main_pids.iter().enumerate() {
        assert_eq!(
            host_sh(lab, i, "sha256sum /usr/bin/ployz | cut -d ' ' -f 1"),
            next_sha,
            "host Machine {i} does not run the new build"
        );
        let after = host_sh(lab, i, "systemctl show -p MainPID --value ployz.service");
        assert_ne!(
            &after, before,
            "host Machine {i}'s main process did not change"
        );
        assert_eq!(
            host_sh(lab, i, "systemctl show -p NRestarts --value ployz.service"),
            "0",
            "host Machine {i}'s unit was restarted\n{}",
            host_logs(lab)
        );
        assert_running(lab, i);
    }
    // Upgrading one Machine, by name, to the build it already runs does nothing.
    let mut again = lab.cli_program(&next);
    again.args(["machine", "upgrade", "-m", "m1", "--json"]);
    let out = again.output().expect("the new CLI runs");
    assert!(out.status.success(), "{}", text(&out));
    let outcome: Value = serde_json::from_slice(&out.stdout).expect("machine upgrade --json");
    let machines = outcome["machines"].as_array().expect("machines");
    assert_eq!(machines.len(), 1, "{outcome}");
    assert_eq!(machines[0]["name"], "m1", "{outcome}");
    assert_eq!(machines[0]["upgraded"], false, "{outcome}");

    // The file replaced but the daemon not handed over (a handover that failed, SSH cut between
    // the two): the same file is not the same build running, and the upgrade hands over.
    let third = build_named(lab, &next, "third");
    ssh_ok(
        lab,
        1,
        "cat > /usr/bin/ployz.new && chmod 0755 /usr/bin/ployz.new && mv -f /usr/bin/ployz.new /usr/bin/ployz",
        Some(&third),
    );
    let exe = "readlink /proc/$(systemctl show -p MainPID --value ployz.service)/exe";
    assert_eq!(host_sh(lab, 1, exe), "/usr/bin/ployz (deleted)");
    let mut stale = lab.cli_program(&third);
    stale.args(["machine", "upgrade", "-m", "m1", "--json"]);
    let out = stale.output().expect("the third CLI runs");
    assert!(out.status.success(), "{}", text(&out));
    let outcome: Value = serde_json::from_slice(&out.stdout).expect("machine upgrade --json");
    assert_eq!(outcome["machines"][0]["upgraded"], true, "{outcome}");
    assert_eq!(host_sh(lab, 1, exe), "/usr/bin/ployz");
    assert_running(lab, 1);
}

/// The repository's root (the lab crate's parent).
fn repo() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the lab crate has a parent")
        .to_owned()
}

/// Builds the package and the tarball of `bin` as `version` into `out`; the paths of the .deb
/// and the tarball.
fn package(
    bin: &std::path::Path,
    version: &str,
    out: &std::path::Path,
) -> (std::path::PathBuf, std::path::PathBuf) {
    let built = Command::new("bash")
        .arg(repo().join("scripts/package.sh"))
        .arg("--fast")
        .arg("--bin")
        .arg(bin)
        .args(["--version", version, "--out"])
        .arg(out)
        .output()
        .expect("scripts/package.sh runs");
    assert!(
        built.status.success(),
        "scripts/package.sh failed:\n{}",
        text(&built)
    );
    let find = |suffix: &str| {
        std::fs::read_dir(out)
            .expect("the package directory")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| {
                let name = p
                    .file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned();
                name.contains(version) && name.ends_with(suffix)
            })
            .unwrap_or_else(|| panic!("no *{version}*{suffix} in {}", out.display()))
    };
    (find(".deb"), find(".tar.gz"))
}

/// `ssh root@<host i> SCRIPT` with the lab's SSH client, `input` on its stdin.
fn ssh(lab: &Lab, i: usize, script: &str, input: Option<&std::path::Path>) -> Output {
    // `ssh -F <lab dir>/ssh/ssh_config`: no quoting in it.
    let words: Vec<&str> = lab
        .ssh_command()
        .expect("the lab has an SSH client")
        .split_whitespace()
        .collect();
    let mut c = Command::new(words[0]);
    c.args(&words[1..])
        .arg(format!("root@{}", lab.underlay_addr(i)))
        .arg(script);
    match input {
        Some(path) => c.stdin(std::fs::File::open(path).expect("the file to send")),
        None => c.stdin(std::process::Stdio::null()),
    };
    c.output().expect("ssh runs")
}

fn ssh_ok(lab: &Lab, i: usize, script: &str, input: Option<&std::path::Path>) -> String {
    let out = ssh(lab, i, script, input);
    assert!(
        out.status.success(),
        "ssh `{script}` failed:\n{}\n{}",
        text(&out),
        host_logs(lab)
    );
    format!("{}{}", stdout(&out), stderr(&out))
}

/// Cuts host Machine `i` off from everything but SSH to it (its own firewall).
fn only_ssh(lab: &Lab, i: usize) {
    let bridge = lab.bridge_addr().to_string();
    let ping = || {
        lab.exec_in(i, &["/bin/busybox", "ping", "-c", "1", "-W", "1", &bridge])
            .status
            .success()
    };
    assert!(
        ping(),
        "host Machine {i} does not reach the bridge before it is cut off"
    );
    for rule in [
        "-A INPUT -i lo -j ACCEPT",
        "-A INPUT -p tcp --dport 22 -j ACCEPT",
        "-A INPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT",
        "-P INPUT DROP",
        "-A OUTPUT -o lo -j ACCEPT",
        "-A OUTPUT -p tcp --sport 22 -j ACCEPT",
        "-P OUTPUT DROP",
    ] {
        let mut args = vec!["iptables", "-w"];
        args.extend(rule.split_whitespace());
        let out = lab.exec_in(i, &args);
        assert!(out.status.success(), "iptables {rule}: {}", text(&out));
    }
    // Proof that it is cut off: the bridge answered a ping before, and no longer does.
    assert!(!ping(), "host Machine {i} still reaches the bridge");
}

#[test]
#[ignore = "needs root, dockerd, systemd and sshd: host Machines (scripts/test.sh runs it)"]
fn the_tarball_and_the_package_install_upgrade_and_remove_on_a_host_cut_off_from_the_network() {
    let lab = Lab::start(LabOptions {
        hosts: true,
        ..LabOptions::machines(1)
    });
    let out_dir = lab.dir().join("package");
    let bin = ployz_lab::ployz_bin().expect("the ployz binary");
    let (deb, tarball) = package(&bin, "0.1.0", &out_dir);
    // The upgrade's build: another binary of a later package version.
    let next = next_build(&lab, &bin);
    let (deb_next, _) = package(&next, "0.1.1", &out_dir);
    refusals_change_nothing(&lab);
    only_ssh(&lab, 0);

    // The tarball: unpacked and installed with nothing but SSH.
    let top = tarball
        .file_name()
        .unwrap()
        .to_string_lossy()
        .trim_end_matches(".tar.gz")
        .to_owned();
    let said = ssh_ok(
        &lab,
        0,
        &format!("cd /root && tar xzf - && sh {top}/install.sh"),
        Some(&tarball),
    );
    assert!(said.contains("starting ployz.service"), "{said}");
    assert_running(&lab, 0);
    let pid = host_sh(&lab, 0, "systemctl show -p MainPID --value ployz.service");
    let version = cli_ok(&lab, &["--connect", &lab.ssh_url(0), "version", "--json"]);
    assert!(
        stdout(&version).contains("\"daemon\""),
        "{}",
        text(&version)
    );
    // Again: nothing changes, nothing restarts.
    let said = ssh_ok(&lab, 0, &format!("sh /root/{top}/install.sh"), None);
    assert!(said.contains("already runs this build"), "{said}");
    assert_eq!(
        host_sh(&lab, 0, "systemctl show -p MainPID --value ployz.service"),
        pid
    );
    // An older release there, not initialised: `machine init` upgrades it first (refused, it
    // named `machine upgrade`, which has no Machine to upgrade there).
    host_sh(
        &lab,
        0,
        "mv /usr/bin/ployz /usr/bin/ployz.real && printf '#!/bin/sh\nif [ \"$1\" = --version ]; then echo \"ployz 0.0.1\"; exit 0; fi\nexec /usr/bin/ployz.real \"$@\"\n' > /usr/bin/ployz && chmod 0755 /usr/bin/ployz",
    );
    assert_eq!(host_sh(&lab, 0, "ployz --version"), "ployz 0.0.1");
    let init = cli_ok(
        &lab,
        &["machine", "init", "--name", "old", "--yes", &lab.ssh_url(0)],
    );
    assert!(
        stderr(&init).contains("is older than this CLI's")
            && stderr(&init).contains("upgrading it"),
        "{}",
        text(&init)
    );
    assert_eq!(
        host_sh(
            &lab,
            0,
            "ployz --version | cut -d ' ' -f 2; rm /usr/bin/ployz.real"
        ),
        "0.1.0"
    );
    assert_running(&lab, 0);
    // Removed, state and configuration kept; then purged.
    let said = ssh_ok(
        &lab,
        0,
        &format!("sh /root/{top}/install.sh --uninstall"),
        None,
    );
    assert!(said.contains("kept /var/lib/ployz"), "{said}");
    assert_eq!(
        host_sh(&lab, 0, "test ! -e /usr/bin/ployz && test ! -e /lib/systemd/system/ployz.service && ls -d /var/lib/ployz /etc/ployz/daemon.toml"),
        "/etc/ployz/daemon.toml\n/var/lib/ployz"
    );
    assert_ne!(
        stdout(&lab.host_exec(0, &["systemctl", "is-active", "ployz.service"])),
        "active"
    );
    ssh_ok(&lab, 0, &format!("sh /root/{top}/install.sh --purge"), None);
    assert_eq!(
        host_sh(
            &lab,
            0,
            "ls -d /var/lib/ployz /etc/ployz 2>/dev/null | wc -l"
        ),
        "0"
    );

    // The package: installed, enabled and started.
    ssh_ok(
        &lab,
        0,
        "cat > /root/ployz.deb && dpkg -i /root/ployz.deb",
        Some(&deb),
    );
    assert_running(&lab, 0);
    assert_eq!(
        host_sh(&lab, 0, "stat -c '%a' /var/lib/ployz && getent group ployz | cut -d: -f1 && dpkg-query -W -f '${Version}' ployz"),
        "700\nployz\n0.1.0"
    );
    // `machine upgrade` leaves a package's files to the package: refused, nothing changed.
    let sha = host_sh(&lab, 0, "sha256sum /usr/bin/ployz | cut -d ' ' -f 1");
    // Initialised as a user with passwordless sudo whom the package did not put in the group
    // ployz: the CLI adds it, and reaches the daemon's socket.
    host_sh(
        &lab,
        0,
        "useradd -m -p '*' -s /bin/sh deployer && echo 'deployer ALL=(ALL) NOPASSWD:ALL' > /etc/sudoers.d/deployer && chmod 0440 /etc/sudoers.d/deployer",
    );
    let as_user = format!("ssh://deployer@{}", lab.underlay_addr(0));
    let init = cli_ok(
        &lab,
        &["machine", "init", "--name", "pkg", "--yes", &as_user],
    );
    assert!(
        stderr(&init).contains("adding deployer to the group ployz"),
        "{}",
        text(&init)
    );
    let out = lab
        .cli_program(&next)
        .args(["machine", "upgrade", "-m", "pkg"])
        .output()
        .unwrap();
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        stderr(&out).contains("has Ployz from the ployz package (0.1.0)")
            && stderr(&out).contains("apt install"),
        "{}",
        text(&out)
    );
    assert_eq!(
        host_sh(&lab, 0, "sha256sum /usr/bin/ployz | cut -d ' ' -f 1"),
        sha
    );
    assert_eq!(host_sh(&lab, 0, "dpkg -V ployz; echo verified"), "verified");
    // A local change to the conffile survives the upgrade, which hands over without a restart.
    host_sh(&lab, 0, "echo '# edited here' >> /etc/ployz/daemon.toml");
    let pid = host_sh(&lab, 0, "systemctl show -p MainPID --value ployz.service");
    ssh_ok(
        &lab,
        0,
        "cat > /root/ployz-next.deb && dpkg -i --force-confold /root/ployz-next.deb",
        Some(&deb_next),
    );
    assert_eq!(
        host_sh(&lab, 0, "dpkg-query -W -f '${Version}' ployz"),
        "0.1.1"
    );
    assert_running(&lab, 0);
    assert_ne!(
        host_sh(&lab, 0, "systemctl show -p MainPID --value ployz.service"),
        pid,
        "the upgrade did not hand over"
    );
    assert_eq!(
        host_sh(&lab, 0, "systemctl show -p NRestarts --value ployz.service"),
        "0"
    );
    assert!(host_sh(&lab, 0, "cat /etc/ployz/daemon.toml").contains("# edited here"));
    // Removed: stopped and disabled, state and configuration kept; purged: all gone.
    ssh_ok(&lab, 0, "dpkg -r ployz", None);
    assert_eq!(
        host_sh(
            &lab,
            0,
            "test ! -e /usr/bin/ployz && ls -d /var/lib/ployz /etc/ployz/daemon.toml"
        ),
        "/etc/ployz/daemon.toml\n/var/lib/ployz"
    );
    assert_ne!(
        stdout(&lab.host_exec(0, &["systemctl", "is-active", "ployz.service"])),
        "active"
    );
    ssh_ok(&lab, 0, "dpkg -P ployz", None);
    assert_eq!(
        host_sh(
            &lab,
            0,
            "ls -d /var/lib/ployz /etc/ployz 2>/dev/null | wc -l; getent group ployz | wc -l"
        ),
        "0\n0"
    );
}

/// What `machine init ssh://` refuses, before it changes anything on the host: `--no-install`
/// on a host without Ployz, a user who cannot become root, a host without Docker when nothing
/// may ask (or `--no-install`).
fn refusals_change_nothing(lab: &Lab) {
    let url = lab.ssh_url(0);
    let refused = |args: &[&str], wanted: &str| {
        let out = cli(lab, args);
        assert!(
            !out.status.success(),
            "ployz {args:?} succeeded:\n{}",
            text(&out)
        );
        assert!(
            stderr(&out).contains(wanted),
            "ployz {args:?}: no `{wanted}` in:\n{}",
            text(&out)
        );
        assert!(
            !lab.host_path(0, "/usr/bin/ployz").exists(),
            "ployz {args:?} installed something"
        );
    };
    refused(
        &["machine", "init", "--no-install", &url],
        "Ployz is not installed on ssh://root@",
    );
    host_sh(lab, 0, "useradd -m -p '*' -s /bin/sh guest");
    refused(
        &[
            "machine",
            "init",
            &format!("ssh://guest@{}", lab.underlay_addr(0)),
        ],
        "cannot use sudo without a password",
    );
    // Docker's programs gone (the running dockerd keeps running): asked about, and with no
    // terminal to ask on, refused; so with --no-install.
    const ENGINE: &str = "/usr/bin/docker /usr/local/bin/docker /usr/sbin/dockerd /usr/bin/dockerd";
    host_sh(
        lab,
        0,
        &format!("for f in {ENGINE}; do if [ -e $f ]; then mv $f $f.away; fi; done"),
    );
    refused(
        &["machine", "init", &url],
        "Docker is not installed on ssh://root@",
    );
    refused(&["machine", "init", &url], "give --yes to install it");
    refused(
        &["machine", "init", "--no-install", &url],
        "Ployz is not installed on ssh://root@",
    );
    host_sh(
        lab,
        0,
        &format!("for f in {ENGINE}; do if [ -e $f.away ]; then mv $f.away $f; fi; done"),
    );
}
