//! `edge-bench`: the edge alone with a fixed route table, through the same proxy code as the
//! daemon, for side-by-side benchmarks (`bench/proxy_side_by_side.sh`).
//!
//! `edge-bench --listen 127.0.0.1:18090 --route bench.test=127.0.0.1:18080 [--threads N]
//! [--access-log] [--no-fast-path] [--tls-listen 127.0.0.1:18443 --tls-cert FILE --tls-key FILE]`
//!
//! With `--tls-listen`, HTTPS too (HTTP/1.1 and HTTP/2 by ALPN, so h2load and wrk both work),
//! serving the certificate for the routes' hostnames it covers.

use clap::Parser;

#[derive(Debug, Parser)]
#[command(name = "edge-bench", about = "The Ployz edge with a fixed route table")]
struct Args {
    /// HTTP listener, ADDR:PORT.
    #[arg(long, value_name = "ADDR:PORT", value_parser = ployz_daemon::parse_socket_addr)]
    listen: std::net::SocketAddr,
    /// A fixed route, HOST[/PATH]=ADDR:PORT[,ADDR:PORT...]: a path ending in /* is a prefix
    /// (app.test/api/*), another an exact path. Repeatable.
    #[arg(long = "route", value_name = "HOST[/PATH]=ADDRS", required = true)]
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
    /// HTTPS listener, ADDR:PORT.
    #[arg(long, value_name = "ADDR:PORT", value_parser = ployz_daemon::parse_socket_addr, requires_all = ["tls_cert", "tls_key"])]
    tls_listen: Option<std::net::SocketAddr>,
    /// The certificate chain (PEM) the HTTPS listener serves.
    #[arg(long, value_name = "FILE", requires = "tls_listen")]
    tls_cert: Option<std::path::PathBuf>,
    /// Its private key (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_listen")]
    tls_key: Option<std::path::PathBuf>,
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
    let tls = match (args.tls_listen, &args.tls_cert, &args.tls_key) {
        (Some(listen), Some(cert), Some(key)) => {
            let cert_pem = std::fs::read_to_string(cert)?;
            let key_pem = std::fs::read_to_string(key)?;
            let hosts: Vec<&str> = routes
                .iter()
                .map(|(h, _)| h.split('/').next().unwrap_or(h))
                .collect();
            Some(ployz_daemon::EdgeTls::from_pem(
                listen,
                (cert, &cert_pem),
                &key_pem,
                &hosts,
            )?)
        }
        _ => None,
    };
    ployz_daemon::run_edge_alone(&config, routes, threads, tls)
}
