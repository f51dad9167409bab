//! Measures a Cluster in the lab: replication throughput and latency, failure detection, the
//! idle cost of the mesh, userspace WireGuard throughput against the plain underlay, the
//! latency of a listing fanned out to every Machine against the same listing of one, route
//! convergence (a container healthy on Machine 2 to Machine 0's edge serving it), and the edge's
//! requests/s to a container across the mesh against a local one. Prints one line per figure;
//! nothing is asserted.
//!
//! ```sh
//! cargo build --release -p ployz -p ployz-lab
//! PLOYZ_BIN=$PWD/target/release/ployz target/release/ployz-lab-bench [replication|latency|detection|idle|wireguard|fanout|convergence|edge-mesh|image-push]...
//! ```
//!
//! Without arguments every measurement runs (about 9 minutes on 2 cores).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use ployz_lab::{Lab, LabOptions, MachineOptions};
use serde_json::Value;

/// One HTTP/1.1 GET over a daemon's unix socket; the body as JSON.
fn api_get(socket: &Path, path: &str) -> anyhow::Result<Value> {
    let mut s = UnixStream::connect(socket).with_context(|| format!("{}", socket.display()))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: ployz\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .context("an HTTP answer without a body")?;
    if !head.starts_with("HTTP/1.1 200") {
        bail!("{path}: {head}");
    }
    // A chunked body: the JSON starts at the first '{' or '['.
    let start = body.find(['{', '[']).context("no JSON in the body")?;
    let end = body.rfind(['}', ']']).context("no JSON in the body")?;
    Ok(serde_json::from_str(&body[start..=end])?)
}

fn run(lab: &Lab, i: usize, args: &[&str]) -> anyhow::Result<String> {
    let out = lab.ployz(i, args);
    if !out.status.success() {
        bail!(
            "ployz {args:?} on Machine {i}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn wait(what: &str, within: Duration, mut check: impl FnMut() -> bool) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    while !check() {
        if Instant::now() > deadline {
            bail!("{what}: not within {} s", within.as_secs());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

fn digest(lab: &Lab, i: usize) -> Option<BTreeMap<String, u64>> {
    let v = api_get(&lab.socket(i), "/v1/store/digest").ok()?;
    serde_json::from_value(v["digest"].clone()).ok()
}

fn membership(lab: &Lab, observer: usize, of: &str) -> Option<String> {
    let v = api_get(&lab.socket(observer), "/v1/machines").ok()?;
    v["values"]
        .as_array()?
        .iter()
        .find(|m| m["id"] == of)
        .and_then(|m| m["membership"].as_str().map(str::to_owned))
}

fn own_id(lab: &Lab, i: usize) -> anyhow::Result<String> {
    let v = api_get(&lab.socket(i), "/v1/version")?;
    Ok(v["machine"].as_str().context("no Machine ID")?.to_owned())
}

/// A lab of `n` Machines formed into a Cluster through Machine 0.
fn cluster(n: usize, per_machine: Vec<MachineOptions>) -> anyhow::Result<Lab> {
    let lab = Lab::try_start(LabOptions {
        sshd: true,
        per_machine,
        log_filter: Some("warn".into()),
        ..LabOptions::machines(n)
    })?;
    run(&lab, 0, &["machine", "init", "--name", "m0"])?;
    for i in 1..n {
        run(
            &lab,
            0,
            &[
                "machine",
                "add",
                "--name",
                &format!("m{i}"),
                &lab.ssh_url(i),
            ],
        )?;
    }
    let ids: Vec<String> = (0..n).map(|i| own_id(&lab, i)).collect::<Result<_, _>>()?;
    wait(
        "every Machine up everywhere",
        Duration::from_secs(60),
        || {
            (0..n).all(|o| {
                ids.iter()
                    .enumerate()
                    .all(|(i, id)| i == o || membership(&lab, o, id).as_deref() == Some("up"))
            })
        },
    )?;
    Ok(lab)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    percentile(&v, 0.5)
}

fn replication() -> anyhow::Result<()> {
    let lab = cluster(3, vec![])?;
    let origin = own_id(&lab, 0)?;
    let before = digest(&lab, 0)
        .unwrap_or_default()
        .get(&origin)
        .copied()
        .unwrap_or(0);
    let pairs: Vec<String> = (0..10_000).map(|n| format!("bench{n:05}=value-{n:05}-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx")).collect();
    let mut args = vec!["store", "put"];
    args.extend(pairs.iter().map(String::as_str));
    let start = Instant::now();
    run(&lab, 0, &args)?;
    let written = start.elapsed();
    let target = before + 10_000;
    wait(
        "10,000 records on Machines 1 and 2",
        Duration::from_secs(300),
        || {
            [1, 2].iter().all(|&i| {
                digest(&lab, i).is_some_and(|d| d.get(&origin).copied().unwrap_or(0) >= target)
            })
        },
    )?;
    let all = start.elapsed();
    println!(
        "replication while writing: 10,000 records written on m0 in {:.2} s (each write flushed before it is acknowledged), on m1 and m2 (equal digests) after {:.2} s: {:.0} records/s end to end",
        written.as_secs_f64(),
        all.as_secs_f64(),
        10_000.0 / all.as_secs_f64()
    );
    // Catching up: 10,000 more records written while m1 and m2 are down, then the time from
    // their restart until their digests equal m0's.
    let mut lab = lab;
    lab.kill_daemon(1);
    lab.kill_daemon(2);
    let pairs: Vec<String> = (0..10_000).map(|n| format!("more{n:05}=value-{n:05}-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx")).collect();
    let mut args = vec!["store", "put"];
    args.extend(pairs.iter().map(String::as_str));
    run(&lab, 0, &args)?;
    let target = target + 10_000;
    lab.start_daemon(1);
    lab.start_daemon(2);
    let start = Instant::now();
    wait("m1 and m2 caught up", Duration::from_secs(300), || {
        [1, 2].iter().all(|&i| {
            digest(&lab, i).is_some_and(|d| d.get(&origin).copied().unwrap_or(0) >= target)
        })
    })?;
    let caught_up = start.elapsed();
    println!(
        "replication catching up: 10,000 records on m1 and m2 {:.2} s after their daemons started again (membership, anti-entropy and merge included): {:.0} records/s",
        caught_up.as_secs_f64(),
        10_000.0 / caught_up.as_secs_f64()
    );
    Ok(())
}

/// One write on Machine 0 to visible on Machine 2 (the farthest in the lab's sense: never the
/// writer), `n` times.
fn write_to_visible(lab: &Lab, n: usize) -> anyhow::Result<Vec<f64>> {
    let origin = own_id(lab, 0)?;
    let mut times = Vec::new();
    for k in 0..n {
        let start = Instant::now();
        run(lab, 0, &["store", "put", &format!("lat{k}=x")])?;
        let seq = digest(lab, 0)
            .and_then(|d| d.get(&origin).copied())
            .context("m0's digest")?;
        wait("the write on m2", Duration::from_secs(30), || {
            digest(lab, 2).is_some_and(|d| d.get(&origin).copied().unwrap_or(0) >= seq)
        })?;
        times.push(start.elapsed().as_secs_f64() * 1000.0);
    }
    times.sort_by(f64::total_cmp);
    Ok(times)
}

fn latency() -> anyhow::Result<()> {
    let mut lab = cluster(3, vec![])?;
    let quiet = write_to_visible(&lab, 100)?;
    println!(
        "write to visible on m2 (includes the CLI's own start, ~{:.0} ms): p50 {:.1} ms, p99 {:.1} ms (100 writes, no loss)",
        cli_cost(&lab)?,
        percentile(&quiet, 0.5),
        percentile(&quiet, 0.99)
    );
    lab.netem(20.0, 50);
    let lossy = write_to_visible(&lab, 100)?;
    lab.clear_netem();
    println!(
        "write to visible on m2: p50 {:.1} ms, p99 {:.1} ms (100 writes, 20% loss and 50 ms delay on every link)",
        percentile(&lossy, 0.5),
        percentile(&lossy, 0.99)
    );
    Ok(())
}

/// The median time of a `ployz version` (what every write above pays for the CLI itself).
fn cli_cost(lab: &Lab) -> anyhow::Result<f64> {
    let mut t = Vec::new();
    for _ in 0..10 {
        let s = Instant::now();
        run(lab, 0, &["version"])?;
        t.push(s.elapsed().as_secs_f64() * 1000.0);
    }
    Ok(median(t))
}

fn detection() -> anyhow::Result<()> {
    let mut lab = cluster(3, vec![])?;
    let victim = own_id(&lab, 1)?;
    let mut times = Vec::new();
    for _ in 0..5 {
        lab.kill_daemon(1);
        let killed = Instant::now();
        let mut seen: [Option<f64>; 2] = [None, None];
        wait("m1 down on m0 and m2", Duration::from_secs(30), || {
            for (slot, observer) in [0, 2].into_iter().enumerate() {
                if seen[slot].is_none()
                    && membership(&lab, observer, &victim).as_deref() == Some("down")
                {
                    seen[slot] = Some(killed.elapsed().as_secs_f64());
                }
            }
            seen.iter().all(Option::is_some)
        })?;
        let slowest = seen.iter().flatten().copied().fold(0.0, f64::max);
        times.push(slowest);
        lab.start_daemon(1);
        wait("m1 up again", Duration::from_secs(60), || {
            [0, 2]
                .iter()
                .all(|&o| membership(&lab, o, &victim).as_deref() == Some("up"))
        })?;
    }
    println!(
        "kill -9 to down on every observer: median {:.2} s (runs: {})",
        median(times.clone()),
        times
            .iter()
            .map(|t| format!("{t:.2}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(())
}

/// CPU seconds (user + system) and RSS (KiB) of a process.
fn usage(pid: u32) -> anyhow::Result<(f64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .context("stat")?
        .1
        .split_whitespace()
        .collect();
    let ticks: f64 = fields[11].parse::<f64>()? + fields[12].parse::<f64>()?;
    let hz = 100.0;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let rss = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .context("VmRSS")?
        .parse()?;
    Ok((ticks / hz, rss))
}

fn idle_figures(lab: &Lab, label: &str) -> anyhow::Result<()> {
    let pids: Vec<u32> = (0..lab.len())
        .map(|i| lab.daemon_pid(i).context("a daemon runs"))
        .collect::<Result<_, _>>()?;
    let before: Vec<(f64, u64)> = pids.iter().map(|&p| usage(p)).collect::<Result<_, _>>()?;
    std::thread::sleep(Duration::from_secs(60));
    let after: Vec<(f64, u64)> = pids.iter().map(|&p| usage(p)).collect::<Result<_, _>>()?;
    for (i, (b, a)) in before.iter().zip(&after).enumerate() {
        println!(
            "idle {label}: Machine {i}: {:.2}% of a core over 60 s, RSS {:.1} MiB",
            (a.0 - b.0) / 60.0 * 100.0,
            a.1 as f64 / 1024.0
        );
    }
    Ok(())
}

fn idle() -> anyhow::Result<()> {
    {
        let lab = Lab::try_start(LabOptions {
            per_machine: vec![MachineOptions {
                daemon_toml: "[mesh]\nenabled = false\n".into(),
                ..MachineOptions::default()
            }],
            log_filter: Some("warn".into()),
            ..LabOptions::machines(1)
        })?;
        run(&lab, 0, &["machine", "init", "--name", "alone"])?;
        std::thread::sleep(Duration::from_secs(5));
        idle_figures(&lab, "single Machine, no mesh")?;
    }
    let lab = cluster(3, vec![])?;
    std::thread::sleep(Duration::from_secs(5));
    idle_figures(&lab, "three-Machine Cluster")
}

/// Bytes per second from Machine `from` to `addr` (a listener in Machine `to`): 256 MiB (or
/// `PLOYZ_BENCH_MIB`, for a run long enough to profile), timed at the receiver from the first
/// byte to the end.
fn throughput(lab: &Lab, from: usize, to: usize, addr: SocketAddr) -> anyhow::Result<f64> {
    let mib: usize = std::env::var("PLOYZ_BENCH_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    let total = mib << 20;
    let listen_ns = netns_file(lab, to);
    let send_ns = netns_file(lab, from);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let receiver = std::thread::spawn(move || -> anyhow::Result<f64> {
        enter(&listen_ns)?;
        let listener = TcpListener::bind(("0.0.0.0", addr.port()))?;
        ready_tx.send(()).ok();
        let (mut s, _) = listener.accept()?;
        let mut buf = vec![0u8; 1 << 16];
        let n = s.read(&mut buf)?;
        let start = Instant::now();
        let mut got = n;
        loop {
            let n = s.read(&mut buf)?;
            if n == 0 {
                break;
            }
            got += n;
        }
        Ok(got as f64 / start.elapsed().as_secs_f64())
    });
    ready_rx.recv_timeout(Duration::from_secs(10))?;
    let sender = std::thread::spawn(move || -> anyhow::Result<()> {
        enter(&send_ns)?;
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(10))?;
        let chunk = vec![0x5au8; 1 << 16];
        let mut sent = 0;
        while sent < total {
            s.write_all(&chunk)?;
            sent += chunk.len();
        }
        Ok(())
    });
    sender
        .join()
        .map_err(|_| anyhow::anyhow!("the sender panicked"))??;
    receiver
        .join()
        .map_err(|_| anyhow::anyhow!("the receiver panicked"))?
}

fn netns_file(lab: &Lab, i: usize) -> PathBuf {
    PathBuf::from("/var/run/netns").join(lab.netns(i))
}

/// Moves the calling thread into a network namespace.
fn enter(ns: &Path) -> anyhow::Result<()> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(ns)?;
    // SAFETY: setns on this thread only, with a valid namespace file descriptor.
    let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc != 0 {
        bail!(
            "setns {}: {}",
            ns.display(),
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

fn wireguard() -> anyhow::Result<()> {
    let lab = cluster(2, vec![])?;
    let mut underlay = Vec::new();
    let mut mesh = Vec::new();
    for run in 0..3 {
        let port = 15_000 + run * 2;
        let u = throughput(
            &lab,
            0,
            1,
            SocketAddr::new(lab.underlay_addr(1).into(), port),
        )?;
        // Machine 1's Machine Gateway, reached through the WireGuard interface.
        let m = throughput(
            &lab,
            0,
            1,
            SocketAddr::new(std::net::Ipv4Addr::new(10, 210, 1, 1).into(), port + 1),
        )?;
        underlay.push(u / 1e6);
        mesh.push(m / 1e6);
    }
    let (u, m) = (median(underlay.clone()), median(mesh.clone()));
    println!(
        "TCP m0 -> m1: underlay {u:.0} MB/s, userspace WireGuard {m:.0} MB/s ({:.2}x the underlay; runs underlay {underlay:.0?}, mesh {mesh:.0?})",
        m / u
    );
    Ok(())
}

/// `ployz ps` through Machine 0 against all three Machines (fanned out over the mesh) and
/// against Machine 0 alone (`-m m0`), one container on each Machine; interleaved, 20 of each.
fn fanout() -> anyhow::Result<()> {
    let lab = cluster(3, vec![])?;
    for i in 0..3 {
        run(
            &lab,
            i,
            &[
                "run",
                "-y",
                "--name",
                &format!("app{i}"),
                "-m",
                &format!("m{i}"),
                ployz_lab::LAB_IMAGE,
                "sleep",
                "3600",
            ],
        )?;
    }
    let time = |args: &[&str]| -> anyhow::Result<f64> {
        let started = Instant::now();
        run(&lab, 0, args)?;
        Ok(started.elapsed().as_secs_f64() * 1000.0)
    };
    // Once each first: connections, caches.
    time(&["ps"])?;
    time(&["ps", "-m", "m0"])?;
    let (mut all, mut one) = (Vec::new(), Vec::new());
    for _ in 0..20 {
        all.push(time(&["ps"])?);
        one.push(time(&["ps", "-m", "m0"])?);
    }
    let (a, o) = (median(all.clone()), median(one.clone()));
    println!(
        "ployz ps through m0: 3 Machines median {a:.1} ms (max {:.1}), 1 Machine median {o:.1} ms (max {:.1}); {:.2}x",
        all.iter().copied().fold(0.0, f64::max),
        one.iter().copied().fold(0.0, f64::max),
        a / o
    );
    Ok(())
}

/// One `GET /` with `Host: host` to `addr` on a connection of its own; the status code.
fn get_status(addr: SocketAddr, host: &str) -> Option<u16> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        s,
        "GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut head = [0u8; 12];
    s.read_exact(&mut head).ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}

/// Milliseconds since the Unix epoch.
fn unix_ms(t: std::time::SystemTime) -> f64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64() * 1000.0)
        .unwrap_or(0.0)
}

/// Route convergence: a Service pinned to Machine 2, with a healthcheck, deployed through
/// Machine 0 while a thread in Machine 0's namespace asks Machine 0's edge for its hostname every
/// 2 ms; from Docker's `health_status: healthy` event on Machine 2 to the first 200 through
/// Machine 0's edge. Ten rounds, each a new Service.
fn convergence() -> anyhow::Result<()> {
    let lab = cluster(3, vec![])?;
    let edge = SocketAddr::new(lab.underlay_addr(0).into(), 80);
    let mut figures = Vec::new();
    for round in 0..10 {
        let name = format!("conv{round}");
        let host = format!("{name}.bench.test");
        let file = lab.dir().join(format!("{name}.yaml"));
        std::fs::write(
            &file,
            format!(
                "services:\n  {name}:\n    image: {}\n    command: [\"sh\", \"-c\", \"echo ok > /index.html && exec httpd -f -p 8080 -h /\"]\n    healthcheck:\n      test: [\"CMD\", \"wget\", \"-q\", \"-O\", \"/dev/null\", \"http://127.0.0.1:8080/\"]\n      interval: 1s\n      start_period: 0s\n    x-machines: m2\n    x-ports:\n      - {host}:8080/http\n",
                ployz_lab::LAB_IMAGE
            ),
        )?;
        let since = std::time::SystemTime::now();
        let ns = netns_file(&lab, 0);
        let poll_host = host.clone();
        let poller = std::thread::spawn(move || -> anyhow::Result<std::time::SystemTime> {
            enter(&ns)?;
            let deadline = Instant::now() + Duration::from_secs(120);
            while Instant::now() < deadline {
                if get_status(edge, &poll_host) == Some(200) {
                    return Ok(std::time::SystemTime::now());
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            bail!("{poll_host} never answered through Machine 0's edge")
        });
        let mut deploy = lab.cli(0);
        deploy
            .env("PLOYZ_HEALTH_MONITOR_PERIOD", "0")
            .args(["deploy", "-y", "-f"])
            .arg(&file);
        let out = deploy.output()?;
        if !out.status.success() {
            bail!("deploy {name}: {}", String::from_utf8_lossy(&out.stderr));
        }
        let served = poller
            .join()
            .map_err(|_| anyhow::anyhow!("the poller panicked"))??;
        let events = lab.docker(
            2,
            &[
                "events",
                "--since",
                &format!("{:.3}", unix_ms(since) / 1000.0),
                "--until",
                &format!("{:.3}", unix_ms(std::time::SystemTime::now()) / 1000.0),
                "--filter",
                "event=health_status: healthy",
                "--filter",
                &format!("label=ployz.service.name={name}"),
                "--format",
                "{{.TimeNano}}",
            ],
        );
        let healthy_ns: f64 = String::from_utf8_lossy(&events.stdout)
            .lines()
            .next()
            .and_then(|l| l.trim().parse().ok())
            .with_context(|| {
                format!(
                    "no health_status event for {name}: {}",
                    String::from_utf8_lossy(&events.stderr)
                )
            })?;
        figures.push(unix_ms(served) - healthy_ns / 1e6);
    }
    let max = figures.iter().copied().fold(f64::MIN, f64::max);
    println!(
        "route convergence, healthy on m2 to m0's edge serving it: median {:.0} ms, max {max:.0} ms (rounds {:.0?})",
        median(figures.clone()),
        figures
    );
    Ok(())
}

/// Requests per second from `conns` keep-alive connections (threads in Machine `from`'s
/// namespace) to `addr` with `Host: host`, over `secs` seconds.
fn load(
    lab: &Lab,
    from: usize,
    addr: SocketAddr,
    host: &str,
    conns: usize,
    secs: u64,
) -> anyhow::Result<f64> {
    let until = Instant::now() + Duration::from_secs(secs);
    let threads: Vec<_> = (0..conns)
        .map(|_| {
            let ns = netns_file(lab, from);
            let request = format!("GET / HTTP/1.1\r\nHost: {host}\r\n\r\n").into_bytes();
            std::thread::spawn(move || -> anyhow::Result<u64> {
                enter(&ns)?;
                let mut done = 0u64;
                let mut s = TcpStream::connect(addr)?;
                s.set_read_timeout(Some(Duration::from_secs(5)))?;
                let mut buf = vec![0u8; 16 << 10];
                while Instant::now() < until {
                    s.write_all(&request)?;
                    // One answer: the head, then Content-Length bytes of body.
                    let mut got = Vec::new();
                    let (head_end, length) = loop {
                        let n = s.read(&mut buf)?;
                        if n == 0 {
                            bail!("the edge closed the connection");
                        }
                        got.extend_from_slice(&buf[..n]);
                        if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                            let head = String::from_utf8_lossy(&got[..i]).to_ascii_lowercase();
                            if !head.starts_with("http/1.1 200") {
                                bail!("{}", head.lines().next().unwrap_or_default());
                            }
                            let length: usize = head
                                .lines()
                                .find_map(|l| l.strip_prefix("content-length:"))
                                .and_then(|v| v.trim().parse().ok())
                                .context("an answer without Content-Length")?;
                            break (i + 4, length);
                        }
                    };
                    while got.len() < head_end + length {
                        let n = s.read(&mut buf)?;
                        if n == 0 {
                            bail!("the edge closed the connection mid-body");
                        }
                        got.extend_from_slice(&buf[..n]);
                    }
                    done += 1;
                }
                Ok(done)
            })
        })
        .collect();
    let mut total = 0;
    for t in threads {
        total += t
            .join()
            .map_err(|_| anyhow::anyhow!("a load thread panicked"))??;
    }
    Ok(total as f64 / secs as f64)
}

/// The CPU time all of the machine's cores spent busy so far (`/proc/stat`'s first line: user,
/// nice, system, irq, softirq and steal).
fn cpu_busy() -> anyhow::Result<Duration> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let line = stat.lines().next().context("an empty /proc/stat")?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse())
        .collect::<Result<_, _>>()?;
    let busy: u64 = [0, 1, 2, 5, 6, 7]
        .iter()
        .filter_map(|&i| fields.get(i))
        .sum();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Ok(Duration::from_secs_f64(busy as f64 / hz))
}

/// A keep-alive HTTP/1.1 responder in busybox alone: `nc -ll` hands each connection to awk,
/// which reads the request buffered (a few reads per request) and answers `ok` at the end of
/// every request head, and keeps the connection.
const KEEP_ALIVE_RESPONDER: &str = r#"cat > /respond.awk <<'END'
/^\r?$/ { printf "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Type: text/plain\r\n\r\nok\n"; fflush() }
END
echo 'exec awk -f /respond.awk' > /respond.sh
exec nc -ll -p 8080 -e sh /respond.sh"#;

/// Machine 0's edge serving a container on Machine 0 against one on Machine 1 (over the mesh),
/// with two kinds of upstream, the same on both Machines:
///
/// - busybox httpd, which closes its connection after each answer: every request opens a new
///   upstream connection, whose handshake and close cross the mesh too (about ten small
///   packets each way);
/// - a responder that keeps its connections ([`KEEP_ALIVE_RESPONDER`]), as most application
///   servers do: the edge reuses them, and a request and its answer are about two packets
///   each way.
///
/// 4 keep-alive client connections from Machine 0's namespace, 3 s each, five interleaved
/// rounds. Besides requests per second, each run's CPU time per request (every core, from
/// `/proc/stat`, so both Machines, the load and the containers alike): the mesh's cost per
/// request is the difference, whether or not the machine is saturated. Short runs: with httpd
/// every request leaves an upstream connection in TIME_WAIT, and at about 2,000 requests/s ten
/// seconds to one container would use up the namespace's ephemeral ports within a minute.
fn edge_mesh() -> anyhow::Result<()> {
    let lab = cluster(2, vec![])?;
    let kinds = [
        (
            "page",
            "echo ok > /index.html && exec httpd -f -p 8080 -h /",
        ),
        ("kept", KEEP_ALIVE_RESPONDER),
    ];
    let host = |kind: &str, i: usize| format!("{kind}{i}.bench.test");
    for (kind, command) in kinds {
        for i in 0..2 {
            let publish = format!("{}:8080/http", host(kind, i));
            run(
                &lab,
                0,
                &[
                    "run",
                    "-y",
                    "--name",
                    &format!("{kind}{i}"),
                    "-m",
                    &format!("m{i}"),
                    "-p",
                    &publish,
                    ployz_lab::LAB_IMAGE,
                    "sh",
                    "-c",
                    command,
                ],
            )?;
        }
    }
    let edge = SocketAddr::new(lab.underlay_addr(0).into(), 80);
    let ns = netns_file(&lab, 0);
    // One upstream connection per request leaves each in TIME_WAIT on m0 for 60 s: ~28,000
    // ephemeral ports per upstream address run out within two local runs, and the local figure
    // would measure that, not the path. Reusing TIME_WAIT ports for new outgoing connections
    // (safe with TCP timestamps) keeps both paths measuring the path.
    let sysctl = std::process::Command::new("ip")
        .args([
            "netns",
            "exec",
            lab.netns(0),
            "sysctl",
            "-qw",
            "net.ipv4.tcp_tw_reuse=1",
        ])
        .status()?;
    if !sysctl.success() {
        bail!("sysctl net.ipv4.tcp_tw_reuse=1 in m0's namespace failed");
    }
    for (kind, _) in kinds {
        for i in 0..2 {
            let (ns, host) = (ns.clone(), host(kind, i));
            std::thread::spawn(move || -> anyhow::Result<()> {
                enter(&ns)?;
                wait(&host, Duration::from_secs(60), || {
                    get_status(edge, &host) == Some(200)
                })
            })
            .join()
            .map_err(|_| anyhow::anyhow!("the waiter panicked"))??;
        }
    }
    const SECS: u64 = 3;
    // Per kind, per Machine of the container: (requests/s, CPU µs per request) of each round.
    let mut figures: BTreeMap<(&str, usize), Vec<(f64, f64)>> = BTreeMap::new();
    for _ in 0..5 {
        for (kind, _) in kinds {
            for i in 0..2 {
                let before = cpu_busy()?;
                let rate = load(&lab, 0, edge, &host(kind, i), 4, SECS)?;
                let busy = cpu_busy()? - before;
                let per_request = busy.as_secs_f64() * 1e6 / (rate * SECS as f64);
                figures
                    .entry((kind, i))
                    .or_default()
                    .push((rate, per_request));
            }
        }
    }
    for (kind, what) in [
        (
            "page",
            "a new upstream connection per request (busybox httpd)",
        ),
        ("kept", "upstream connections kept alive"),
    ] {
        let rates = |i: usize| -> Vec<f64> { figures[&(kind, i)].iter().map(|f| f.0).collect() };
        let cpu = |i: usize| -> Vec<f64> { figures[&(kind, i)].iter().map(|f| f.1).collect() };
        let (l, r) = (median(rates(0)), median(rates(1)));
        let (lc, rc) = (median(cpu(0)), median(cpu(1)));
        println!(
            "m0's edge, 4 connections, {what}: to a container on m0 {l:.0} req/s, on m1 over the mesh {r:.0} req/s ({:.2}x; runs local {:.0?}, mesh {:.0?}); CPU per request {lc:.0} µs and {rc:.0} µs, the mesh adds {:.0} µs (runs {:.0?} and {:.0?})",
            r / l,
            rates(0),
            rates(1),
            rc - lc,
            cpu(0),
            cpu(1),
        );
    }
    Ok(())
}

/// Builds `tag` in the host's Docker: busybox, then `random` bytes of random data and
/// `text` bytes of repetitive text (as a real image mixes binaries and text), one layer each.
fn build_bench_image(
    dir: &Path,
    tag: &str,
    seed: u64,
    random: usize,
    text: usize,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::copy("/bin/busybox", dir.join("busybox"))?;
    let mut data = vec![0u8; random];
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15 ^ seed;
    for b in data.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    std::fs::write(dir.join("random"), &data)?;
    let line = b"2026-12-06T09:00:00Z INFO request served path=/api/items status=200 took_ms=3\n";
    let text_data: Vec<u8> = line.iter().copied().cycle().take(text).collect();
    std::fs::write(dir.join("text"), &text_data)?;
    std::fs::write(
        dir.join("Dockerfile"),
        "FROM scratch\nCOPY busybox /bin/busybox\nCOPY text /text\nCOPY random /random\n",
    )?;
    let out = std::process::Command::new("docker")
        .args([
            "-H",
            "unix:///var/run/docker.sock",
            "build",
            "-q",
            "-t",
            tag,
        ])
        .arg(dir)
        .output()?;
    if !out.status.success() {
        bail!("docker build: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

/// The bytes of the image `tag` in the host's Docker.
fn host_image_size(tag: &str) -> anyhow::Result<u64> {
    let out = std::process::Command::new("docker")
        .args([
            "-H",
            "unix:///var/run/docker.sock",
            "image",
            "inspect",
            "-f",
            "{{.Size}}",
            tag,
        ])
        .output()?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().parse()?)
}

/// `ployz image push` of a ~100 MB image to one Machine, through the entry Machine and the mesh
/// and straight over SSH, against `docker save | ssh host docker load` on the same underlay;
/// then the bytes a one-layer change sends. 3 runs each, the image removed from the Machine
/// before each.
fn image_push() -> anyhow::Result<()> {
    let lab = cluster(2, Vec::new())?;
    let dir = lab.dir().join("bench-image");
    let tag = format!("ployz-bench/push-{}:1", lab.run());
    build_bench_image(&dir, &tag, 1, 50 << 20, 50 << 20)?;
    let size = host_image_size(&tag)?;
    let ssh = lab.ssh_command().context("the lab has no sshd")?.to_owned();
    let target = format!("root@{}", lab.underlay_addr(1));
    let remove = |lab: &Lab| {
        let _ = lab.docker(1, &["rmi", "-f", &tag]);
    };
    let push = |lab: &Lab, connect: Option<String>| -> anyhow::Result<(f64, u64)> {
        let mut c = match &connect {
            Some(url) => {
                let mut c = lab.cli_bare();
                c.args(["--connect", url]);
                c
            }
            None => lab.cli(0),
        };
        c.env("DOCKER_HOST", "unix:///var/run/docker.sock")
            .args(["image", "push", "--json", &tag, "-m", "m1"]);
        let t = Instant::now();
        let out = c.output()?;
        let took = t.elapsed().as_secs_f64();
        if !out.status.success() {
            bail!("image push: {}", String::from_utf8_lossy(&out.stderr));
        }
        let v: Value = serde_json::from_slice(&out.stdout)?;
        Ok((took, v[0]["values"][0]["bytes_sent"].as_u64().unwrap_or(0)))
    };
    let save_load = |lab: &Lab| -> anyhow::Result<(f64, u64)> {
        let t = Instant::now();
        let mut save = std::process::Command::new("docker")
            .args(["-H", "unix:///var/run/docker.sock", "save", &tag])
            .stdout(std::process::Stdio::piped())
            .spawn()?;
        let words: Vec<String> = ssh.split_whitespace().map(str::to_owned).collect();
        let mut load = std::process::Command::new(&words[0])
            .args(&words[1..])
            .arg(&target)
            .arg(format!("docker -H {} load", lab.docker_host(1)))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .spawn()?;
        let mut from = save.stdout.take().context("save's stdout")?;
        let mut to = load.stdin.take().context("ssh's stdin")?;
        let bytes = std::io::copy(&mut from, &mut to)?;
        drop(to);
        if !save.wait()?.success() || !load.wait()?.success() {
            bail!("docker save | ssh docker load failed");
        }
        Ok((t.elapsed().as_secs_f64(), bytes))
    };
    let direct = Some(format!("ssh://{target}"));
    let mut rows: Vec<(&str, Vec<(f64, u64)>)> = vec![
        ("ployz image push, through m0 and the mesh", Vec::new()),
        ("ployz image push --connect ssh://m1", Vec::new()),
        ("docker save | ssh m1 docker load", Vec::new()),
    ];
    // Interleaved: each run of each way in turn.
    for _ in 0..3 {
        remove(&lab);
        rows[0].1.push(push(&lab, None)?);
        remove(&lab);
        rows[1].1.push(push(&lab, direct.clone())?);
        remove(&lab);
        rows[2].1.push(save_load(&lab)?);
    }
    println!(
        "image-push: a {:.1} MiB image (busybox, 50 MiB of text, 50 MiB random), to one Machine, 3 runs each",
        size as f64 / 1048576.0
    );
    for (what, runs) in &rows {
        let mut secs: Vec<f64> = runs.iter().map(|r| r.0).collect();
        secs.sort_by(f64::total_cmp);
        println!(
            "image-push: {what}: median {:.2} s, {:.1} MiB crossed; runs {}",
            percentile(&secs, 0.5),
            runs[0].1 as f64 / 1048576.0,
            runs.iter()
                .map(|r| format!("{:.2} s", r.0))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    // One layer changed: 1 MiB of new random data on top of the same base.
    let tag_two = format!("ployz-bench/push-{}:2", lab.run());
    build_bench_image(&dir.join("two"), &tag_two, 2, 1 << 20, 50 << 20)?;
    let _ = push(&lab, None)?;
    let mut c = lab.cli(0);
    c.env("DOCKER_HOST", "unix:///var/run/docker.sock")
        .args(["image", "push", "--json", &tag_two, "-m", "m1"]);
    let out = c.output()?;
    let v: Value = serde_json::from_slice(&out.stdout)?;
    println!(
        "image-push: a one-layer change (1 MiB random on the same busybox and text layers): {} bytes crossed, {} of {} layers",
        v[0]["values"][0]["bytes_sent"],
        v[0]["values"][0]["layers_sent"],
        v[0]["values"][0]["layers"]
    );
    for t in [&tag, &tag_two] {
        let _ = std::process::Command::new("docker")
            .args(["-H", "unix:///var/run/docker.sock", "rmi", "-f", t])
            .output();
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let all = [
        "replication",
        "latency",
        "detection",
        "idle",
        "wireguard",
        "fanout",
        "convergence",
        "edge-mesh",
        "image-push",
    ];
    let asked: Vec<String> = std::env::args().skip(1).collect();
    let which: Vec<&str> = if asked.is_empty() {
        all.to_vec()
    } else {
        asked.iter().map(String::as_str).collect()
    };
    for w in which {
        match w {
            "replication" => replication()?,
            "latency" => latency()?,
            "detection" => detection()?,
            "idle" => idle()?,
            "wireguard" => wireguard()?,
            "fanout" => fanout()?,
            "convergence" => convergence()?,
            "edge-mesh" => edge_mesh()?,
            "image-push" => image_push()?,
            other => bail!("unknown measurement '{other}'; one of: {}", all.join(", ")),
        }
    }
    Ok(())
}
