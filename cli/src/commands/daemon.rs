//! `ployz daemon run`.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use ployz_daemon::{DaemonConfig, DaemonConfigFile, LogFormat, UnderscoreHeaders};

#[derive(Debug, Subcommand)]
pub enum DaemonCommand {
    /// Run the daemon in the foreground until SIGTERM (graceful) or SIGINT (fast).
    Run(Box<RunArgs>),
    /// Run only the edge, with fixed routes (benchmarks, debugging).
    #[command(hide = true)]
    Edge(EdgeArgs),
}

#[derive(Debug, Args)]
pub struct EdgeArgs {
    /// HTTP listener, ADDR:PORT.
    #[arg(long, value_name = "ADDR:PORT")]
    http_listen: String,
    /// A fixed route, HOST=ADDR:PORT[,ADDR:PORT...]. Repeatable.
    #[arg(long = "route", value_name = "HOST=ADDRS", required = true)]
    routes: Vec<String>,
    /// Worker threads [default: the number of CPUs].
    #[arg(long)]
    threads: Option<usize>,
    /// Do not write an access-log line per request.
    #[arg(long)]
    no_access_log: bool,
    /// Seconds a client has to send a whole request header.
    #[arg(long, value_name = "SECONDS", default_value_t = 15)]
    header_timeout: u64,
    /// After SIGTERM, seconds of serving with `Connection: close` before the listener closes.
    #[arg(long, value_name = "SECONDS", default_value_t = 0)]
    drain_delay: u64,
    /// After the listener closed, seconds in-flight requests may take.
    #[arg(long, value_name = "SECONDS", default_value_t = 0)]
    shutdown_grace: u64,
    #[command(flatten)]
    proxying: ProxyingArgs,
}

/// How the edge proxies, for `daemon run` and `daemon edge` alike.
#[derive(Debug, Args)]
pub struct ProxyingArgs {
    /// Milliseconds a connection to an upstream may take before the next one is tried
    /// [default: 2000].
    #[arg(long, value_name = "MS")]
    upstream_connect_timeout_ms: Option<u64>,
    /// Request header fields named with `_`: drop (as nginx does) or pass [default: drop].
    #[arg(long, value_name = "POLICY")]
    underscore_headers: Option<UnderscoreHeaders>,
    /// Send every request through Pingora's proxy instead of the HTTP/1 fast path.
    #[arg(long)]
    no_fast_path: bool,
}

impl ProxyingArgs {
    /// The settings these flags override.
    fn apply_to(&self, config: &mut DaemonConfig) {
        if let Some(v) = self.upstream_connect_timeout_ms {
            config.upstream_connect_timeout_ms = v;
        }
        if let Some(v) = self.underscore_headers {
            config.underscore_headers = v;
        }
        if self.no_fast_path {
            config.fast_path = false;
        }
    }
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// A TOML config file (see configs/daemon.toml); flags override what it sets.
    #[arg(long, value_name = "FILE", env = "PLOYZ_DAEMON_CONFIG")]
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
    #[arg(long, value_name = "ADDR:PORT")]
    http_listen: Option<String>,
    /// The edge's HTTPS listener, ADDR:PORT [default: 0.0.0.0:443].
    #[arg(long, value_name = "ADDR:PORT")]
    https_listen: Option<String>,
    /// Prometheus metrics listener, ADDR:PORT [default: 127.0.0.1:51090].
    #[arg(long, value_name = "ADDR:PORT")]
    metrics_listen: Option<String>,
    /// Do not write an access-log line per edge request.
    #[arg(long)]
    no_access_log: bool,
    /// Largest request body the edge accepts, bytes (0: no limit) [default: 0].
    #[arg(long, value_name = "BYTES")]
    max_body_bytes: Option<u64>,
    /// Seconds a client has to send a whole request header, from connect [default: 15].
    #[arg(long, value_name = "SECONDS")]
    header_timeout: Option<u64>,
    /// After SIGTERM, seconds of serving with health 503 before the listeners close [default: 5].
    #[arg(long, value_name = "SECONDS")]
    drain_delay: Option<u64>,
    /// Where the internal DNS listens: gateway (the Machine Gateway:53), ADDR:PORT or off
    /// [default: gateway].
    #[arg(long, value_name = "ADDR:PORT")]
    dns_listen: Option<String>,
    /// Where the internal DNS forwards other names, ADDR:PORT (repeatable) [default: the
    /// nameservers of /etc/resolv.conf].
    #[arg(long = "dns-upstream", value_name = "ADDR:PORT")]
    dns_upstreams: Vec<String>,
    /// Do not order certificates by ACME (imported Certificate Material is still served).
    #[arg(long)]
    no_certificates: bool,
    /// The DNS server the Cluster DNS Verdict asks, ADDR:PORT [default: the system's].
    #[arg(long, value_name = "ADDR:PORT")]
    verdict_resolver: Option<String>,
    /// Log lines as `text` or `json` [default: text].
    #[arg(long, value_name = "FORMAT")]
    log_format: Option<LogFormat>,
    #[command(flatten)]
    proxying: ProxyingArgs,
    /// Start even though the data dir lost data this Machine acknowledged (a damaged, deleted
    /// or older store, or a missing WireGuard key): keep what is left, move what cannot be read
    /// aside, make a new key pair if the key is gone. For one start, after the daemon refused
    /// and said what is missing.
    #[arg(long)]
    accept_data_loss: bool,
}

pub fn run(cmd: DaemonCommand) -> anyhow::Result<()> {
    let args = match cmd {
        DaemonCommand::Run(args) => *args,
        DaemonCommand::Edge(args) => return edge(args),
    };
    let file = match &args.config {
        Some(path) => DaemonConfigFile::load(path)?,
        None => DaemonConfigFile::default(),
    };
    let mut config = file.apply_to(DaemonConfig::default());
    if let Some(v) = args.data_dir {
        config.data_dir = v;
    }
    if let Some(v) = args.socket {
        config.socket = v;
    }
    if let Some(v) = args.docker_host {
        config.docker_host = Some(v);
    }
    if let Some(v) = args.http_listen {
        config.http_listen = v;
    }
    if let Some(v) = args.https_listen {
        config.https_listen = v;
    }
    if let Some(v) = args.metrics_listen {
        config.metrics_listen = v;
    }
    if args.no_access_log {
        config.access_log = false;
    }
    if let Some(v) = args.max_body_bytes {
        config.max_body_bytes = (v > 0).then_some(v);
    }
    if let Some(v) = args.header_timeout {
        config.header_timeout_seconds = v;
    }
    if let Some(v) = args.drain_delay {
        config.drain_delay_seconds = v;
    }
    if let Some(v) = args.dns_listen {
        config.dns_listen = v;
    }
    if !args.dns_upstreams.is_empty() {
        config.dns_upstreams = args.dns_upstreams;
    }
    if args.no_certificates {
        config.certificates = false;
    }
    if let Some(v) = args.verdict_resolver {
        config.verdict_resolver = Some(v);
    }
    if let Some(v) = args.log_format {
        config.log_format = v;
    }
    args.proxying.apply_to(&mut config);
    if args.accept_data_loss {
        config.accept_data_loss = true;
    }
    ployz_daemon::run(config)
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
    if args.header_timeout == 0 {
        anyhow::bail!("--header-timeout 0 would disconnect every client: give at least 1 second");
    }
    let mut proxying = DaemonConfig::default();
    args.proxying.apply_to(&mut proxying);
    ployz_daemon::run_edge_alone(
        &args.http_listen,
        routes,
        ployz_daemon::EdgeAloneOptions {
            threads,
            access_log: !args.no_access_log,
            header_timeout: std::time::Duration::from_secs(args.header_timeout),
            drain_delay_seconds: args.drain_delay,
            shutdown_grace_seconds: args.shutdown_grace,
            upstream_connect_timeout_ms: proxying.upstream_connect_timeout_ms,
            underscore_headers: proxying.underscore_headers,
            fast_path: proxying.fast_path,
        },
    )
}
