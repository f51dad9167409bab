//! `edge-bench`: the edge alone with a fixed route table, through the same proxy code as the
//! daemon, for side-by-side benchmarks (`bench/proxy_side_by_side.sh`).
//!
//! `edge-bench --listen 127.0.0.1:18090 --route bench.test=127.0.0.1:18080 [--threads N]
//! [--access-log] [--no-fast-path]`

use clap::Parser;

#[derive(Debug, Parser)]
#[command(name = "edge-bench", about = "The Ployz edge with a fixed route table")]
struct Args {
    /// HTTP listener, ADDR:PORT.
    #[arg(long, value_name = "ADDR:PORT", value_parser = ployz_daemon::parse_socket_addr)]
    listen: std::net::SocketAddr,
    /// A fixed route, HOST=ADDR:PORT[,ADDR:PORT...]. Repeatable.
    #[arg(long = "route", value_name = "HOST=ADDRS", required = true)]
    routes: Vec<String>,
    /// Worker threads [default: the number of CPUs].
    #[arg(long)]
    threads: Option<usize>,
    /// Write an access-log line per request (off by default, like the peers' configurations).
    #[arg(long)]
    access_log: bool,
    /// Send every request through Pingora's proxy instead of the HTTP/1 fast path.
    #[arg(long)]
    no_fast_path: bool,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let routes = args
        .routes
        .iter()
        .map(|r| ployz_daemon::parse_route(r))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
    let mut config = ployz_daemon::DaemonConfig {
        http_listen: args.listen,
        access_log: args.access_log,
        ..Default::default()
    };
    config.edge.fast_path = !args.no_fast_path;
    config.shutdown.drain_delay_seconds = 0;
    config.shutdown.grace_seconds = 0;
    ployz_daemon::run_edge_alone(&config, routes, threads)
}
