//! `ployz daemon run`, `ployz daemon handover`, and the hidden `ployz daemon edge`.
//!
//! The flags are the top layer of the daemon's configuration (`ployz_daemon::DaemonConfig`):
//! each is serialised under the config key it sets (`#[serde(rename =
//! "limits.header_timeout_seconds")]`), an absent one (`None`) sets nothing, and
//! `DaemonConfig::load` lays them over the config file's keys. A `--no-X` flag sets its key to
//! `false` ([`off_if_given`]). Values are parsed here by the daemon's own parsers, so a bad one
//! is refused naming the flag.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use ployz_daemon::{parse_socket_addr, DaemonConfig, DnsListen, LogFormat, UnderscoreHeaders};
use serde::{Serialize, Serializer};

#[derive(Debug, Subcommand)]
pub enum DaemonCommand {
    /// Run the daemon in the foreground until SIGTERM (graceful) or SIGINT (fast).
    Run(Box<RunArgs>),
    /// Hand the running daemon over to a new process of this executable, dropping no request:
    /// starts `ployz daemon run --take-over` with the same flags, waits until it serves (the
    /// running one then retires, finishing its requests in flight). The unit's reload.
    Handover(Box<RunArgs>),
    /// Run only the edge, with fixed routes (benchmarks, debugging).
    #[command(hide = true)]
    Edge(Box<EdgeArgs>),
}

/// A `--no-X` flag: its key set to `false` when given, nothing otherwise.
fn off_if_given<S: Serializer>(given: &bool, serializer: S) -> Result<S::Ok, S::Error> {
    if *given {
        serializer.serialize_bool(false)
    } else {
        serializer.serialize_none()
    }
}

#[derive(Debug, Args, Serialize)]
pub struct EdgeArgs {
    /// HTTP listener, ADDR:PORT.
    #[arg(long, value_name = "ADDR:PORT", value_parser = parse_socket_addr)]
    http_listen: SocketAddr,
    /// A fixed route, HOST[/PATH]=ADDR:PORT[,ADDR:PORT...]: a path ending in /* is a prefix
    /// (app.test/api/*), another an exact path. Repeatable.
    #[arg(long = "route", value_name = "HOST[/PATH]=ADDRS", required = true)]
    #[serde(skip)]
    routes: Vec<String>,
    /// Worker threads [default: the number of CPUs].
    #[arg(long)]
    #[serde(skip)]
    threads: Option<usize>,
    /// HTTPS listener, ADDR:PORT (HTTP/1.1 and HTTP/2 by ALPN), serving --tls-cert for the
    /// routes' hostnames it covers.
    #[arg(long, value_name = "ADDR:PORT", value_parser = parse_socket_addr, requires_all = ["tls_cert", "tls_key"])]
    #[serde(skip)]
    https_listen: Option<SocketAddr>,
    /// The certificate chain (PEM) the HTTPS listener serves.
    #[arg(long, value_name = "FILE", requires = "https_listen")]
    #[serde(skip)]
    tls_cert: Option<std::path::PathBuf>,
    /// Its private key (PEM).
    #[arg(long, value_name = "FILE", requires = "https_listen")]
    #[serde(skip)]
    tls_key: Option<std::path::PathBuf>,
    /// Do not write an access-log line per request.
    #[arg(long)]
    #[serde(rename = "access_log", serialize_with = "off_if_given")]
    no_access_log: bool,
    /// Largest request body the edge accepts, bytes (0: no limit) [default: 0].
    #[arg(long, value_name = "BYTES")]
    #[serde(rename = "limits.max_body_bytes")]
    max_body_bytes: Option<u64>,
    /// Seconds a client has to send a whole request header.
    #[arg(long, value_name = "SECONDS", default_value_t = 15)]
    #[serde(rename = "limits.header_timeout_seconds")]
    header_timeout: u64,
    /// After SIGTERM, seconds of serving with `Connection: close` before the listener closes.
    #[arg(long, value_name = "SECONDS", default_value_t = 0)]
    #[serde(rename = "shutdown.drain_delay_seconds")]
    drain_delay: u64,
    /// After the listener closed, seconds in-flight requests may take.
    #[arg(long, value_name = "SECONDS", default_value_t = 0)]
    #[serde(rename = "shutdown.grace_seconds")]
    shutdown_grace: u64,
    #[command(flatten)]
    #[serde(flatten)]
    proxying: ProxyingArgs,
}

/// How the edge proxies (`[edge]`), for `daemon run` and `daemon edge` alike.
#[derive(Debug, Args, Serialize)]
pub struct ProxyingArgs {
    /// Milliseconds a connection to an upstream may take before the next one is tried
    /// [default: 1000].
    #[arg(long, value_name = "MS")]
    #[serde(rename = "edge.upstream_connect_timeout_ms")]
    upstream_connect_timeout_ms: Option<u64>,
    /// Request header fields named with `_`: drop (as nginx does) or pass [default: drop].
    #[arg(long, value_name = "POLICY")]
    #[serde(rename = "edge.underscore_headers")]
    underscore_headers: Option<UnderscoreHeaders>,
    /// Send every request through Pingora's proxy instead of the HTTP/1 fast path.
    #[arg(long)]
    #[serde(rename = "edge.fast_path", serialize_with = "off_if_given")]
    no_fast_path: bool,
}

#[derive(Debug, Args, Serialize)]
pub struct RunArgs {
    /// A TOML config file (see configs/daemon.toml); flags override what it sets.
    #[arg(long, value_name = "FILE", env = "PLOYZ_DAEMON_CONFIG")]
    #[serde(skip)]
    config: Option<PathBuf>,
    /// Where identity, keys and the store live [default: /var/lib/ployz].
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// The management API's unix socket [default: /run/ployz/ployz.sock].
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// Where Docker listens, e.g. unix:///var/run/docker.sock [default: DOCKER_HOST, else the
    /// default socket].
    #[arg(long, value_name = "URL")]
    docker_host: Option<String>,
    /// The edge's HTTP listener, ADDR:PORT [default: 0.0.0.0:80].
    #[arg(long, value_name = "ADDR:PORT", value_parser = parse_socket_addr)]
    http_listen: Option<SocketAddr>,
    /// The edge's HTTPS listener, ADDR:PORT [default: 0.0.0.0:443].
    #[arg(long, value_name = "ADDR:PORT", value_parser = parse_socket_addr)]
    https_listen: Option<SocketAddr>,
    /// Prometheus metrics listener, ADDR:PORT [default: 127.0.0.1:51090].
    #[arg(long, value_name = "ADDR:PORT", value_parser = parse_socket_addr)]
    metrics_listen: Option<SocketAddr>,
    /// Do not write an access-log line per edge request.
    #[arg(long)]
    #[serde(rename = "access_log", serialize_with = "off_if_given")]
    no_access_log: bool,
    /// Largest request body the edge accepts, bytes (0: no limit) [default: 0].
    #[arg(long, value_name = "BYTES")]
    #[serde(rename = "limits.max_body_bytes")]
    max_body_bytes: Option<u64>,
    /// Seconds a client has to send a whole request header, from connect [default: 15].
    #[arg(long, value_name = "SECONDS")]
    #[serde(rename = "limits.header_timeout_seconds")]
    header_timeout: Option<u64>,
    /// After SIGTERM, seconds of serving with health 503 before the listeners close [default: 5].
    #[arg(long, value_name = "SECONDS")]
    #[serde(rename = "shutdown.drain_delay_seconds")]
    drain_delay: Option<u64>,
    /// Where the internal DNS listens: gateway (the Machine Gateway:53), ADDR:PORT or off
    /// [default: gateway].
    #[arg(long, value_name = "ADDR:PORT")]
    #[serde(rename = "dns.listen")]
    dns_listen: Option<DnsListen>,
    /// Where the internal DNS forwards other names, ADDR:PORT (repeatable) [default: the
    /// nameservers of /etc/resolv.conf].
    #[arg(long = "dns-upstream", value_name = "ADDR:PORT", value_parser = parse_socket_addr)]
    #[serde(rename = "dns.upstreams")]
    dns_upstreams: Option<Vec<SocketAddr>>,
    /// Do not order certificates by ACME (imported Certificate Material is still served).
    #[arg(long)]
    #[serde(rename = "certificates.enabled", serialize_with = "off_if_given")]
    no_certificates: bool,
    /// Run without the mesh: no WireGuard interface, firewall chain, gossip or replication (a
    /// Machine on its own).
    #[arg(long)]
    #[serde(rename = "mesh.enabled", serialize_with = "off_if_given")]
    no_mesh: bool,
    /// The WireGuard interface's name [default: ployz0].
    #[arg(long, value_name = "NAME")]
    #[serde(rename = "mesh.interface")]
    wg_interface: Option<String>,
    /// WireGuard's UDP port [default: 51820].
    #[arg(long, value_name = "PORT")]
    #[serde(rename = "mesh.wireguard_port")]
    wg_port: Option<u16>,
    /// The DNS server the Cluster DNS Verdict asks, ADDR:PORT [default: the system's].
    #[arg(long, value_name = "ADDR:PORT", value_parser = parse_socket_addr)]
    #[serde(rename = "certificates.verdict_resolver")]
    verdict_resolver: Option<SocketAddr>,
    /// Log lines as `text` or `json` [default: text].
    #[arg(long, value_name = "FORMAT")]
    log_format: Option<LogFormat>,
    #[command(flatten)]
    #[serde(flatten)]
    proxying: ProxyingArgs,
    /// Start even though the data dir lost data this Machine acknowledged (a damaged, deleted
    /// or older store, or a missing WireGuard key): keep what is left, move what cannot be read
    /// aside, make a new key pair if the key is gone. For one start, after the daemon refused
    /// and said what is missing.
    #[arg(long)]
    #[serde(skip)]
    accept_data_loss: bool,
    /// Take over from the daemon running on the same data dir: its edge listeners, its store,
    /// its modules, with no request dropped (what `ployz daemon handover` starts).
    #[arg(long)]
    #[serde(skip)]
    take_over: bool,
}

pub fn run(cmd: DaemonCommand) -> anyhow::Result<()> {
    let (args, handing_over) = match cmd {
        DaemonCommand::Run(args) => (*args, false),
        DaemonCommand::Handover(args) => (*args, true),
        DaemonCommand::Edge(args) => return edge(*args),
    };
    let mut config = DaemonConfig::load(args.config.as_deref(), &args)?;
    // A flag only, for one start: never in the file.
    config.accept_data_loss = args.accept_data_loss;
    if handing_over {
        if args.take_over {
            anyhow::bail!("--take-over is what `daemon handover` gives the new process; give it to `daemon run`, or leave it out");
        }
        return handover(&config);
    }
    if args.take_over {
        ployz_daemon::run_taking_over(config)
    } else {
        ployz_daemon::run(config)
    }
}

/// How long `daemon handover` waits for the new process to serve.
const HANDOVER_WITHIN: std::time::Duration = std::time::Duration::from_secs(150);

/// `ployz daemon handover`: starts this executable as `daemon run --take-over` with the flags
/// given, and returns once the new process serves (its ID in the pid file).
fn handover(config: &DaemonConfig) -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt as _;
    let pid_file = config.data_dir.join("run").join(ployz_daemon::PID_FILE);
    let read_pid =
        || -> Option<u32> { std::fs::read_to_string(&pid_file).ok()?.trim().parse().ok() };
    let old = read_pid();
    // The same flags, given to `daemon run --take-over`.
    let mut words: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let at = words
        .iter()
        .position(|w| w == "handover")
        .ok_or_else(|| anyhow::anyhow!("cannot find `handover` among the arguments"))?;
    words[at] = "run".into();
    words.push("--take-over".into());
    let exe = std::env::current_exe().context("cannot find this executable")?;
    let mut child = std::process::Command::new(&exe)
        .args(&words)
        .stdin(std::process::Stdio::null())
        // Its log is on stderr, which it shares with this command (the journal, under systemd).
        .stdout(std::process::Stdio::null())
        // Its own process group: the new daemon outlives this command.
        .process_group(0)
        .spawn()
        .with_context(|| format!("cannot start {}", exe.display()))?;
    let new = child.id();
    eprintln!(
        "handing over from process {} to process {new} ({}) ...",
        old.map_or_else(|| "?".to_owned(), |p| p.to_string()),
        exe.display()
    );
    let deadline = std::time::Instant::now() + HANDOVER_WITHIN;
    loop {
        if read_pid() == Some(new) {
            break;
        }
        if let Some(status) = child.try_wait()? {
            anyhow::bail!(
                "the new daemon process exited ({status}) before it served; see its log (the running one goes on serving unless it had handed over its store: then it exits too, for the service manager to start a fresh daemon)"
            );
        }
        if std::time::Instant::now() >= deadline {
            let _ = child.kill();
            anyhow::bail!(
                "the new daemon process did not serve within {} s and was stopped; see its log",
                HANDOVER_WITHIN.as_secs()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    println!(
        "handed over: process {new} serves; process {} finishes its requests in flight and exits",
        old.map_or_else(|| "?".to_owned(), |p| p.to_string())
    );
    Ok(())
}

fn edge(args: EdgeArgs) -> anyhow::Result<()> {
    let routes = args
        .routes
        .iter()
        .map(|r| ployz_daemon::parse_route(r))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
    let tls = match (&args.https_listen, &args.tls_cert, &args.tls_key) {
        (Some(listen), Some(cert), Some(key)) => {
            let read = |flag: &str, path: &std::path::Path| {
                std::fs::read_to_string(path)
                    .map_err(|e| anyhow::anyhow!("{flag} {}: {e}", path.display()))
            };
            let (cert_pem, key_pem) = (read("--tls-cert", cert)?, read("--tls-key", key)?);
            let hosts: Vec<&str> = routes
                .iter()
                .map(|(h, _)| h.split('/').next().unwrap_or(h))
                .collect();
            Some(ployz_daemon::EdgeTls::from_pem(
                *listen,
                (cert, &cert_pem),
                &key_pem,
                &hosts,
            )?)
        }
        _ => None,
    };
    // The edge alone reads no file: its flags over the defaults, validated by run_edge_alone.
    let config = DaemonConfig::layered(None, &args)?;
    ployz_daemon::run_edge_alone(&config, routes, threads, tls)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        daemon: DaemonCommand,
    }

    fn run_args(args: &[&str]) -> RunArgs {
        match Cli::try_parse_from(["ployz", "run"].iter().chain(args)) {
            Ok(Cli {
                daemon: DaemonCommand::Run(args),
            }) => *args,
            Ok(_) => panic!("not daemon run"),
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn every_flag_sets_its_key() {
        let args = run_args(&[
            "--data-dir=/d",
            "--socket=/s.sock",
            "--docker-host=unix:///docker.sock",
            "--http-listen=127.0.0.1:1080",
            "--https-listen=127.0.0.1:1443",
            "--metrics-listen=127.0.0.1:1090",
            "--no-access-log",
            "--max-body-bytes=100",
            "--header-timeout=3",
            "--drain-delay=2",
            "--dns-listen=127.0.0.1:5353",
            "--dns-upstream=127.0.0.53:53",
            "--dns-upstream=[::1]:53",
            "--no-certificates",
            "--no-mesh",
            "--wg-interface=plz9",
            "--wg-port=51821",
            "--verdict-resolver=127.0.0.1:53",
            "--log-format=json",
            "--upstream-connect-timeout-ms=300",
            "--underscore-headers=pass",
            "--no-fast-path",
        ]);
        let c = DaemonConfig::load(None, &args).unwrap();
        assert_eq!(c.data_dir, PathBuf::from("/d"));
        assert_eq!(c.socket, PathBuf::from("/s.sock"));
        assert_eq!(c.docker_host.as_deref(), Some("unix:///docker.sock"));
        assert_eq!(c.http_listen, "127.0.0.1:1080".parse().unwrap());
        assert_eq!(c.https_listen, "127.0.0.1:1443".parse().unwrap());
        assert_eq!(c.metrics_listen, "127.0.0.1:1090".parse().unwrap());
        assert!(!c.access_log);
        assert_eq!(c.limits.max_body_bytes, Some(100));
        assert_eq!(c.limits.header_timeout_seconds, 3);
        assert_eq!(c.shutdown.drain_delay_seconds, 2);
        assert_eq!(
            c.dns.listen,
            DnsListen::At("127.0.0.1:5353".parse().unwrap())
        );
        assert_eq!(
            c.dns.upstreams,
            vec![
                "127.0.0.53:53".parse().unwrap(),
                "[::1]:53".parse().unwrap()
            ]
        );
        assert!(!c.certificates.enabled);
        assert!(!c.mesh.enabled);
        assert_eq!(c.mesh.interface, "plz9");
        assert_eq!(c.mesh.wireguard_port, 51821);
        assert_eq!(
            c.certificates.verdict_resolver,
            Some("127.0.0.1:53".parse().unwrap())
        );
        assert_eq!(c.log_format, LogFormat::Json);
        assert_eq!(c.edge.upstream_connect_timeout_ms, 300);
        assert_eq!(c.edge.underscore_headers, UnderscoreHeaders::Pass);
        assert!(!c.edge.fast_path);
    }

    #[test]
    fn absent_flags_leave_the_file_alone() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("daemon.toml");
        std::fs::write(
            &file,
            "access_log = false
[certificates]
enabled = false
[edge]
fast_path = false
[dns]
upstreams = [\"127.0.0.1:53\"]
",
        )
        .unwrap();
        let c = DaemonConfig::load(Some(&file), &run_args(&[])).unwrap();
        assert!(!c.access_log && !c.certificates.enabled && !c.edge.fast_path);
        assert_eq!(c.dns.upstreams, vec!["127.0.0.1:53".parse().unwrap()]);
        let c = DaemonConfig::load(None, &run_args(&[])).unwrap();
        assert_eq!(c, DaemonConfig::default());
    }

    #[test]
    fn a_bad_address_is_refused_naming_the_flag() {
        for flag in [
            "--http-listen",
            "--dns-upstream",
            "--verdict-resolver",
            "--dns-listen",
        ] {
            let err = match Cli::try_parse_from(["ployz", "run", flag, "nowhere"]) {
                Ok(_) => panic!("{flag} nowhere was taken"),
                Err(e) => e.to_string(),
            };
            assert!(err.contains(flag), "{err}");
            assert!(err.contains("'nowhere' is not"), "{err}");
        }
    }

    #[test]
    fn the_edge_alone_takes_its_own_defaults() {
        let args = match Cli::try_parse_from([
            "ployz",
            "edge",
            "--http-listen",
            "127.0.0.1:1080",
            "--route",
            "a.test=127.0.0.1:9",
            "--no-fast-path",
        ]) {
            Ok(Cli {
                daemon: DaemonCommand::Edge(args),
            }) => *args,
            Ok(_) => panic!("not daemon edge"),
            Err(e) => panic!("{e}"),
        };
        let c = DaemonConfig::layered(None, &args).unwrap();
        assert_eq!(c.http_listen, "127.0.0.1:1080".parse().unwrap());
        assert_eq!(c.shutdown.drain_delay_seconds, 0);
        assert_eq!(c.shutdown.grace_seconds, 0);
        assert_eq!(c.limits.header_timeout_seconds, 15);
        assert!(c.access_log);
        assert!(!c.edge.fast_path);
    }
}
