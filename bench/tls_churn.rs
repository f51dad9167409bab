//! `tls-churn`: a load of new TLS connections, one HTTP/1.1 request each, with or without
//! session resumption, for `bench/https_side_by_side.sh`. wrk and h2load make a full handshake
//! on every new connection; a returning visitor's browser resumes its session instead, and that
//! is what `--resume` measures.
//!
//! `tls-churn --connect 127.0.0.1:18483 --host localhost [--connections 32] [--threads 2]
//! [--duration 10] [--resume [--visitors N]]`
//!
//! Each visit is a new connection: connect, handshake (resumed when the server kept or
//! ticketed the visitor's last session), `GET /` with `Connection: close`, read the answer to
//! its end. `--connections` visits run at once; the visitors (each with its own session cache,
//! one per connection loop unless `--visitors` says more) take turns, so with many visitors
//! each comes back only after all the others: a server that keeps few sessions forgets them
//! before they return. With `--resume`, every visitor's first visit (a full handshake) is
//! made before the clock starts, so only returning visits are counted. The last line is the summary, `key=value` pairs the script
//! reads: `requests`, `seconds`, `rate` (requests/s), `resumed` (the share of handshakes that
//! resumed), `errors`, `p50_ms`, `p99_ms`.
//!
//! The server's certificate chain is not checked against any root (the benches' certificates
//! are self-signed); its handshake signatures are, as a browser's would be.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::Resumption;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, HandshakeKind, SignatureScheme};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Debug, Parser)]
#[command(name = "tls-churn", about = "New TLS connections, one request each")]
struct Args {
    /// The server, ADDR:PORT.
    #[arg(long)]
    connect: SocketAddr,
    /// The name sent as SNI and Host.
    #[arg(long, default_value = "localhost")]
    host: String,
    /// Connection loops running at once.
    #[arg(long, default_value_t = 32)]
    connections: usize,
    /// Client threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Seconds to run.
    #[arg(long, default_value_t = 10)]
    duration: u64,
    /// Resume the previous session on each new connection (TLS 1.3 tickets, or TLS 1.2 session
    /// IDs and tickets).
    #[arg(long)]
    resume: bool,
    /// Distinct visitors taking turns [default: one per connection loop].
    #[arg(long, value_name = "N")]
    visitors: Option<usize>,
}

#[derive(Default)]
struct Tally {
    latencies_us: Vec<u32>,
    resumed: u64,
    errors: u64,
    first_error: Option<String>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let visitors = args.visitors.unwrap_or(args.connections);
    if args.connections == 0 || args.threads == 0 || args.duration == 0 || visitors == 0 {
        anyhow::bail!("--connections, --threads, --duration and --visitors must be at least 1");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let server_name = ServerName::try_from(args.host.clone())
        .map_err(|e| anyhow::anyhow!("--host {:?} is not a server name: {e}", args.host))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads)
        .enable_all()
        .build()?;
    let request = format!(
        "GET / HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        args.host
    );
    let connectors = (0..visitors)
        .map(|_| {
            let config = client_config(&provider, args.resume)?;
            Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let connectors = Arc::new(connectors);
    if args.resume {
        // Every visitor's first visit, a full handshake, before the clock starts: what is
        // measured is returning visits alone.
        let turn = Arc::new(AtomicUsize::new(0));
        let failed = runtime.block_on(async {
            let mut loops = Vec::new();
            for _ in 0..args.connections.min(visitors) {
                let (name, request, addr) = (server_name.clone(), request.clone(), args.connect);
                let (connectors, turn) = (connectors.clone(), turn.clone());
                loops.push(tokio::spawn(async move {
                    let mut failed = 0u64;
                    loop {
                        let visitor = turn.fetch_add(1, Ordering::Relaxed);
                        let Some(connector) = connectors.get(visitor) else {
                            return failed;
                        };
                        let first = visit(connector, addr, name.clone(), request.as_bytes());
                        failed += u64::from(first.await.is_err());
                    }
                }));
            }
            let mut failed = 0;
            for l in loops {
                failed += l.await?;
            }
            anyhow::Ok(failed)
        })?;
        if failed > 0 {
            anyhow::bail!("{failed} of {visitors} first visits failed");
        }
    }
    let started = Instant::now();
    let until = started + Duration::from_secs(args.duration);
    let turn = Arc::new(AtomicUsize::new(0));
    let tallies = runtime.block_on(async {
        let mut loops = Vec::new();
        for _ in 0..args.connections {
            let (name, request, addr) = (server_name.clone(), request.clone(), args.connect);
            let (connectors, turn) = (connectors.clone(), turn.clone());
            loops.push(tokio::spawn(async move {
                let mut tally = Tally::default();
                while Instant::now() < until {
                    let visitor = turn.fetch_add(1, Ordering::Relaxed) % connectors.len();
                    let connector = &connectors[visitor];
                    let begun = Instant::now();
                    match visit(connector, addr, name.clone(), request.as_bytes()).await {
                        Ok(resumed) => {
                            let us = begun.elapsed().as_micros().min(u32::MAX as u128) as u32;
                            tally.latencies_us.push(us);
                            tally.resumed += u64::from(resumed);
                        }
                        Err(e) => {
                            tally.errors += 1;
                            tally.first_error.get_or_insert(e.to_string());
                        }
                    }
                }
                tally
            }));
        }
        let mut all = Vec::new();
        for l in loops {
            all.push(l.await?);
        }
        anyhow::Ok(all)
    })?;
    let seconds = started.elapsed().as_secs_f64();
    let mut latencies: Vec<u32> = tallies
        .iter()
        .flat_map(|t| t.latencies_us.iter().copied())
        .collect();
    latencies.sort_unstable();
    let requests = latencies.len();
    let resumed: u64 = tallies.iter().map(|t| t.resumed).sum();
    let errors: u64 = tallies.iter().map(|t| t.errors).sum();
    if let Some(e) = tallies.iter().find_map(|t| t.first_error.as_deref()) {
        eprintln!("first error: {e}");
    }
    let quantile = |q: f64| -> f64 {
        if latencies.is_empty() {
            return f64::NAN;
        }
        let i = ((latencies.len() as f64 * q).ceil() as usize).clamp(1, latencies.len()) - 1;
        f64::from(latencies[i]) / 1000.0
    };
    println!(
        "requests={requests} seconds={seconds:.2} rate={:.0} resumed={:.3} errors={errors} p50_ms={:.2} p99_ms={:.2}",
        requests as f64 / seconds,
        if requests == 0 { 0.0 } else { resumed as f64 / requests as f64 },
        quantile(0.50),
        quantile(0.99),
    );
    if requests == 0 {
        anyhow::bail!("no request was answered");
    }
    Ok(())
}

/// One visit: a new connection, its handshake, one request, its answer read to the end.
/// Returns whether the handshake resumed a session.
async fn visit(
    connector: &tokio_rustls::TlsConnector,
    addr: SocketAddr,
    name: ServerName<'static>,
    request: &[u8],
) -> anyhow::Result<bool> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let mut tls = connector.connect(name, tcp).await?;
    let resumed = tls.get_ref().1.handshake_kind() == Some(HandshakeKind::Resumed);
    tls.write_all(request).await?;
    let mut answer = Vec::with_capacity(512);
    // A server that closes without close_notify ends the read with an error after the answer
    // arrived whole; the status line is what counts.
    let read = tls.read_to_end(&mut answer).await;
    if !answer.starts_with(b"HTTP/1.1 200 ") {
        read?;
        anyhow::bail!(
            "answer did not start with 200: {:?}",
            String::from_utf8_lossy(&answer[..answer.len().min(40)])
        );
    }
    Ok(resumed)
}

fn client_config(provider: &Arc<CryptoProvider>, resume: bool) -> anyhow::Result<ClientConfig> {
    let mut config = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(SignaturesOnly(provider.clone())))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    config.resumption = if resume {
        Resumption::in_memory_sessions(8)
    } else {
        Resumption::disabled()
    };
    Ok(config)
}

/// Accepts any certificate chain but checks the handshake signatures with it.
#[derive(Debug)]
struct SignaturesOnly(Arc<CryptoProvider>);

impl ServerCertVerifier for SignaturesOnly {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
