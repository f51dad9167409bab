//! Serves a static `internal.` zone file with the Ployz DNS server and forwards every other
//! name: the candidate for `dns_bench.sh`.
//!
//! ```text
//! cargo build --release -p ployz-dns --example serve_zone
//! CANDIDATE_PORT=15360 \
//! CANDIDATE_CMD='target/release/examples/serve_zone --zone $ZONE_FILE \
//!     --listen 127.0.0.1:$CANDIDATE_PORT --forward $FORWARD_UPSTREAM' ./dns_bench.sh
//! ```
//!
//! Flags fall back to the variables the benchmark exports: `ZONE_FILE`, `CANDIDATE_PORT`
//! (listening on 127.0.0.1), `FORWARD_UPSTREAM` and `WORKERS` (UDP workers and runtime threads).
//! Only loopback sources are answered. Stops on Ctrl-C or SIGTERM.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use ployz_dns::{DnsController, DnsServer, DnsServerConfig, DnsSnapshot};

struct Args {
    zone: PathBuf,
    listen: SocketAddr,
    forward: Vec<SocketAddr>,
    workers: usize,
}

fn parse_args() -> Result<Args, String> {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let mut zone = env("ZONE_FILE").map(PathBuf::from);
    let mut listen = env("CANDIDATE_PORT").map(|p| format!("127.0.0.1:{p}"));
    let mut forward: Vec<String> = env("FORWARD_UPSTREAM").into_iter().collect();
    let mut workers = env("WORKERS");
    let mut args = std::env::args().skip(1);
    let mut forward_given = false;
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--zone" => zone = Some(PathBuf::from(value()?)),
            "--listen" => listen = Some(value()?),
            "--forward" => {
                if !forward_given {
                    forward.clear();
                    forward_given = true;
                }
                forward.push(value()?);
            }
            "--workers" => workers = Some(value()?),
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    Ok(Args {
        zone: zone.ok_or("--zone (or ZONE_FILE) is required")?,
        listen: listen
            .ok_or("--listen (or CANDIDATE_PORT) is required")?
            .parse()
            .map_err(|e| format!("--listen: {e}"))?,
        forward: forward
            .iter()
            .map(|f| f.parse().map_err(|e| format!("--forward {f}: {e}")))
            .collect::<Result<_, String>>()?,
        workers: match workers {
            Some(w) => w.parse().map_err(|e| format!("--workers: {e}"))?,
            None => std::thread::available_parallelism().map_or(2, |n| n.get()),
        },
    })
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("serve_zone: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.workers.max(1))
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(async move {
        let snapshot = match DnsSnapshot::load_zone_file(&args.zone) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("serve_zone: {e}");
                return ExitCode::FAILURE;
            }
        };
        let names = snapshot.len();
        let controller = DnsController::fixed(snapshot);
        let mut config = DnsServerConfig::new(args.listen);
        config.upstreams = args.forward;
        config.udp_workers = args.workers.max(1);
        let server = match DnsServer::bind(config, controller.snapshot().clone()).await {
            Ok(s) => s,
            Err(e) => {
                eprintln!("serve_zone: {e}");
                return ExitCode::FAILURE;
            }
        };
        eprintln!("serve_zone: {names} names on {}", server.local_addr());
        let metrics = server.metrics();
        let (tx, rx) = tokio::sync::watch::channel(false);
        let serving = tokio::spawn(server.run(rx));
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        let _ = tx.send(true);
        let _ = serving.await;
        let mut text = String::new();
        metrics.render_prometheus(&mut text);
        eprint!("{text}");
        ExitCode::SUCCESS
    })
}
