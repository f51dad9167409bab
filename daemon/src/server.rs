//! Composition: the Pingora server, its services, startup checks and shutdown.

use std::io::IsTerminal as _;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::{Arc, Mutex};

use anyhow::{bail, Context as _};
use async_trait::async_trait;
use pingora::server::configuration::ServerConf;
use pingora::server::{RunArgs, Server, ShutdownWatch};
use pingora::services::background::{background_service, BackgroundService};

use ployz_edge::{CertificateResolver, EdgeMetrics, EdgeProxy, EdgeState, RouteController};

use crate::api;
use crate::config::{DaemonConfig, DnsListen, LogFormat, UnderscoreHeaders};
use crate::identity::DataDir;
use crate::local_machine::{Initialised, LocalMachine};

/// Runs the daemon until SIGTERM or SIGINT. Blocks the calling thread; call it outside any async
/// runtime (Pingora starts its own).
///
/// `config` is validated first ([`DaemonConfig::validate`]: [`DaemonConfig::load`] has done it
/// already, a configuration built by hand has not), before anything is bound or written.
pub fn run(config: DaemonConfig) -> anyhow::Result<()> {
    run_as(config, false)
}

/// Runs the daemon taking over from the one running on the same data dir (`--take-over`,
/// [`crate::handover`]): its edge listeners, store and modules, without a request dropped.
pub fn run_taking_over(config: DaemonConfig) -> anyhow::Result<()> {
    run_as(config, true)
}

fn run_as(config: DaemonConfig, take_over: bool) -> anyhow::Result<()> {
    config.validate()?;
    // Before any file or thread: nothing the daemon creates is open to others by default.
    crate::fsutil::restrict_umask();
    init_logging(config.log_format);
    let verdict_resolver = match config.certificates.verdict_resolver {
        Some(at) => ployz_acme::VerdictResolver::At(at),
        None => ployz_acme::VerdictResolver::System,
    };
    let (stops, signals) = tokio::sync::mpsc::unbounded_channel();
    listen_for_signals(stops.clone())?;
    let runtime_dir = config.data_dir.join("run");
    // Taking over: the running daemon's socket stays in place (and answers) until this one
    // serves; this one's is renamed over it then.
    let api_path = if take_over {
        taking_over_path(&config.socket)
    } else {
        config.socket.clone()
    };
    let listener = bind_socket(&api_path, &config.socket_group)?;
    let mut taken = if take_over {
        crate::notify::status("asking the running daemon to hand over");
        tracing::info!("asking the running daemon to hand over");
        match crate::handover::take_over(&runtime_dir) {
            Ok(t) => Some(t),
            Err(e) => {
                drop(listener);
                let _ = std::fs::remove_file(&api_path);
                return Err(e);
            }
        }
    } else {
        None
    };
    crate::notify::status("opening this Machine's store");
    let machine = Arc::new(open_machine(&config, take_over)?);
    machine.set_store_clock(
        std::time::Duration::from_millis(config.mesh.max_clock_drift_ms),
        config.mesh.clock_offset_ms,
    );
    if config.mesh.clock_offset_ms != 0 {
        tracing::warn!(
            offset_ms = config.mesh.clock_offset_ms,
            "mesh.clock_offset_ms shifts this Machine's clock (a test-only setting)"
        );
    }
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        socket = %config.socket.display(),
        data_dir = %config.data_dir.display(),
        phase = %machine.phase(),
        "ployz daemon starting"
    );

    if !config.certificates.enabled {
        // Other Machines must not leave hostnames to an issuer that does not run.
        if let Some(store) = machine.store() {
            let key = ployz_store::machines::certificate_issuer_key(store.local());
            if matches!(store.get(&key), Ok(Some(r)) if r.live_value().is_some()) {
                store
                    .delete(&key)
                    .context("cannot withdraw this Machine as a certificate issuer")?;
            }
        }
    }
    std::fs::create_dir_all(&runtime_dir)
        .with_context(|| format!("cannot create {}", runtime_dir.display()))?;
    let handed = |taken: &mut Option<crate::handover::TakenOver>, addr, tls| {
        taken.as_mut().and_then(|t| t.take(addr, tls))
    };
    let http_handed = handed(&mut taken, config.http_listen, false);
    let https_handed = handed(&mut taken, config.https_listen, true);
    if http_handed.is_none() {
        check_listener_free("http_listen", config.http_listen)?;
    }
    if https_handed.is_none() {
        check_listener_free("https_listen", config.https_listen)?;
    }
    if !take_over {
        // Taking over, the running daemon holds it until it retires; it is bound when free.
        check_listener_free("metrics_listen", config.metrics_listen)?;
    }
    let handover_listener = crate::handover::HandoverService::bind(&runtime_dir)?;
    let handover = crate::handover::Handover::new();
    let conf = ServerConf {
        pid_file: runtime_dir.join("ployz.pid").display().to_string(),
        upgrade_sock: runtime_dir.join("upgrade.sock").display().to_string(),
        threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
        // The grace period is the edge's (DrainFirst waits for its requests in flight, no
        // longer than needed); Pingora's own would be a fixed sleep on every stop.
        grace_period_seconds: Some(0),
        graceful_shutdown_timeout_seconds: Some(config.shutdown.timeout_seconds),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let routes = RouteController::new();
    let edge_state = Arc::new(EdgeState::default());
    let edge_state_for_signal = edge_state.clone();
    let certificates = CertificateResolver::default();
    let challenges = ployz_edge::ChallengeResponder::default();
    let metrics = Arc::new(EdgeMetrics::default());
    let dns = ployz_dns::DnsController::new();
    let dns_metrics: Arc<std::sync::OnceLock<Arc<ployz_dns::DnsMetrics>>> = Arc::default();
    let issuer_counters = ployz_acme::IssuerCounters::default();
    let mut edge = ployz_edge::edge_service(
        &server.configuration,
        EdgeProxy::new(
            routes.clone(),
            edge_state.clone(),
            metrics.clone(),
            Some(config.https_listen.port()),
            edge_limits(&config),
        )
        .with_challenges(challenges.clone()),
    );
    let edge_closing = edge.closing();
    // Taking over, this edge takes connections from the shared listening sockets once it can
    // route them (its first route and certificate tables); until then the running process
    // answers them all. A fresh start takes them at once: its health answers 503 "starting",
    // and any host 503 with Retry-After, until the first route table. Either way the daemon
    // says it is ready only once the tables are built. (An uninitialised Machine has no tables
    // to wait for.)
    let (routing, routing_gate) = tokio::sync::watch::channel(false);
    let initialised = machine.store().is_some();
    let gated = take_over && initialised;
    if gated {
        edge.accept_after(routing_gate.clone());
    }
    match http_handed {
        Some(socket) => edge.add_tcp_listening(socket),
        None => edge.add_tcp(config.http_listen),
    }
    .with_context(|| {
        format!(
            "the edge's HTTP listener cannot listen on {} (http_listen)",
            config.http_listen
        )
    })?;
    match https_handed {
        Some(socket) => edge.add_tls_listening(socket, tls_config(&certificates)?),
        None => edge.add_tls(config.https_listen, tls_config(&certificates)?),
    }
    .with_context(|| {
        format!(
            "the edge's HTTPS listener cannot listen on {} (https_listen)",
            config.https_listen
        )
    })?;
    let edge_sockets = edge
        .listening_sockets()
        .context("cannot copy the edge's listening sockets")?;
    server.add_service(edge);
    let mesh_view = Arc::new(crate::mesh::MeshView::new(config.mesh.clone()));
    use crate::handover::{Stage, UntilStage};
    let reconciler = crate::reconcile::Reconciler::new(machine.clone(), &config);
    let ingress_ports = ployz_edge::ingress_ports::IngressPorts::new(
        routes.clone(),
        edge_closing.clone(),
        config.shutdown.grace(),
        config.edge.upstream_connect_timeout(),
    );
    if let Some(taken) = taken.as_mut() {
        ingress_ports.adopt(std::mem::take(&mut taken.ingress_ports));
    }
    server.add_service(background_service(
        "ingress ports",
        UntilStage::new(
            IngressPortsService(ingress_ports.clone()),
            Stage::Retiring,
            &handover,
        ),
    ));
    server.add_service(background_service(
        "route controller",
        UntilStage::new(
            RouteService {
                machine: machine.clone(),
                routes: routes.clone(),
                certificates: certificates.clone(),
                challenges,
                state: edge_state.clone(),
                mesh: mesh_view.clone(),
                routing,
            },
            Stage::Releasing,
            &handover,
        ),
    ));
    if config.certificates.enabled {
        server.add_service(background_service(
            "certificate issuer",
            UntilStage::new(
                IssuerService {
                    machine: machine.clone(),
                    verdict_resolver,
                    counters: issuer_counters.clone(),
                    challenge_port: config.http_listen.port(),
                    mesh: mesh_view.clone(),
                    down_grace: config.certificates.down_grace(),
                },
                Stage::Releasing,
                &handover,
            ),
        ));
    }
    let lease = crate::lease::MachineLease::new(machine.clone());
    let api_app = local_api(
        machine.clone(),
        routes.clone(),
        (config.dns.listen != DnsListen::Off).then(|| dns.clone()),
        mesh_view.clone(),
        lease.clone(),
        crate::docker_api::OwnListeners::from_config(&config),
        reconciler.clone(),
    );
    if config.mesh.enabled {
        machine.set_mesh_interface(&config.mesh.interface);
        server.add_service(background_service(
            "mesh",
            UntilStage::new(
                crate::mesh_service::MeshService {
                    machine: machine.clone(),
                    view: mesh_view.clone(),
                    header_timeout: config.limits.header_timeout(),
                    api: api_app.clone(),
                    reconcile: reconciler.clone(),
                    handover: handover.stage.subscribe(),
                },
                Stage::Releasing,
                &handover,
            ),
        ));
    }
    server.add_service(background_service(
        "reconciler",
        UntilStage::new(
            crate::reconcile::ReconcileService {
                reconciler: reconciler.clone(),
            },
            Stage::Releasing,
            &handover,
        ),
    ));
    server.add_service(background_service(
        "management API",
        UntilStage::new(
            ApiService {
                listener: Mutex::new(Some(listener)),
                machine: machine.clone(),
                app: api_app.clone(),
                header_timeout: config.limits.header_timeout(),
                mesh: mesh_view.clone(),
            },
            Stage::Retiring,
            &handover,
        ),
    ));
    server.add_service(background_service(
        "drain-mark sweeper",
        UntilStage::new(
            crate::drain::Sweeper::new(machine.clone(), lease),
            Stage::Releasing,
            &handover,
        ),
    ));
    server.add_service(background_service(
        "metrics",
        UntilStage::new(
            MetricsService {
                addr: config.metrics_listen,
                metrics,
                routes: routes.clone(),
                dns: dns_metrics.clone(),
                failures: StoreFailures {
                    routes: routes.clone(),
                    dns: (config.dns.listen != DnsListen::Off).then(|| dns.clone()),
                    issuer: config.certificates.enabled.then(|| issuer_counters.clone()),
                },
                header_timeout: config.limits.header_timeout(),
                mesh: mesh_view.clone(),
                take_over,
                reconcile: reconciler.clone(),
                certificates: certificates.clone(),
            },
            Stage::Retiring,
            &handover,
        ),
    ));
    if config.dns.listen != DnsListen::Off {
        server.add_service(background_service(
            "internal DNS",
            UntilStage::new(
                DnsService {
                    machine: machine.clone(),
                    controller: dns,
                    listen: config.dns.listen,
                    upstreams: config.dns.upstreams.clone(),
                    cache_entries: config.dns.cache_entries,
                    metrics: dns_metrics,
                    take_over,
                    listener: reconciler.dns_listener().unwrap_or_default(),
                },
                Stage::Retiring,
                &handover,
            ),
        ));
    }
    server.add_service(background_service(
        "docker observer",
        UntilStage::new(
            ObserverService {
                machine: machine.clone(),
            },
            Stage::Releasing,
            &handover,
        ),
    ));
    server.add_service(background_service(
        "readiness",
        UntilStage::new(
            Readiness {
                socket: config.socket.clone(),
                probe_socket: api_path.clone(),
                edge: vec![config.http_listen, config.https_listen],
                routing: initialised.then_some(routing_gate),
                pid_file: runtime_dir.join(PID_FILE),
                taken: Mutex::new(taken),
            },
            Stage::Releasing,
            &handover,
        ),
    ));
    server.add_service(background_service(
        "handover",
        crate::handover::HandoverService {
            listener: Mutex::new(Some(handover_listener)),
            path: crate::handover::socket_path(&runtime_dir),
            releasing: handover.releasing(),
            stage: handover.stage.clone(),
            edge: Mutex::new(edge_sockets),
            edge_closing: edge_closing.clone(),
            ingress_ports,
            machine: machine.clone(),
            edge_state: edge_state.clone(),
            retire: stops,
        },
    ));
    crate::notify::status("starting the edge, the management API and the modules");
    server.run(RunArgs {
        shutdown_signal: Box::new(DrainFirst {
            state: edge_state_for_signal,
            delay: config.shutdown.drain_delay(),
            edge: edge_closing,
            grace: config.shutdown.grace(),
            handover_grace: config.shutdown.handover_grace(),
            signals: tokio::sync::Mutex::new(signals),
        }),
    });

    let handed_over = *handover.stage.borrow() != Stage::Serving;
    if handed_over {
        // The socket's path, the pid file and the store are the new process's now.
        tracing::info!("ployz daemon handed over and stopped");
        if *handover.stage.borrow() != Stage::Retiring {
            std::process::exit(1);
        }
        return Ok(());
    }
    machine.flush();
    let _ = std::fs::remove_file(&config.socket);
    let pid_file = runtime_dir.join(PID_FILE);
    if std::fs::read_to_string(&pid_file).is_ok_and(|p| p.trim() == std::process::id().to_string())
    {
        let _ = std::fs::remove_file(&pid_file);
    }
    let _ = std::fs::remove_file(crate::handover::socket_path(&runtime_dir));
    tracing::info!("ployz daemon stopped");
    Ok(())
}

/// The pid file in the runtime directory: the process serving this data dir, written once it
/// is ready (`ployz daemon handover` waits for the new process's number there).
pub const PID_FILE: &str = "daemon.pid";

/// Writes this process's ID to `path`: a temporary file renamed into place, so a reader sees
/// the old number or the new one.
fn write_pid_file(path: &Path) -> std::io::Result<()> {
    let tmp = path.with_extension("pid.tmp");
    std::fs::write(&tmp, format!("{}\n", std::process::id()))?;
    std::fs::rename(&tmp, path)
}

/// Where a process taking over binds the management API before it renames it into place.
fn taking_over_path(socket: &Path) -> std::path::PathBuf {
    let mut name = socket.file_name().unwrap_or_default().to_owned();
    name.push(".taking-over");
    socket.with_file_name(name)
}

/// Opens this Machine's data. Taking over, the running daemon has just let go of the store; a
/// moment's wait for its files is allowed.
fn open_machine(config: &DaemonConfig, take_over: bool) -> anyhow::Result<LocalMachine> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match LocalMachine::open_with(
            DataDir::new(&config.data_dir),
            config.docker_host.clone(),
            config.accept_data_loss,
        ) {
            Ok(m) => return Ok(m),
            Err(e) if take_over && std::time::Instant::now() < deadline => {
                tracing::debug!(error = %e, "the store is not free yet");
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            Err(e) => return Err(e).context("cannot load this Machine's data"),
        }
    }
}

/// What the edge enforces per request, from the daemon's settings.
fn edge_limits(config: &DaemonConfig) -> ployz_edge::EdgeLimits {
    ployz_edge::EdgeLimits {
        max_header_bytes: config.limits.max_header_bytes,
        max_uri_bytes: config.limits.max_uri_bytes,
        max_body_bytes: config.limits.max_body_bytes,
        access_log: config.access_log,
        header_timeout: config.limits.header_timeout(),
        connect_timeout: config.edge.upstream_connect_timeout(),
        forward_underscore_headers: config.edge.underscore_headers == UnderscoreHeaders::Pass,
        fast_path: config.edge.fast_path,
    }
}

/// Checks nothing listens on a listener's address (the setting `key`) before anything starts,
/// so that a port in use is one clear error that names its setting.
fn check_listener_free(key: &str, addr: std::net::SocketAddr) -> anyhow::Result<()> {
    if let Err(e) = std::net::TcpListener::bind(addr) {
        let listener = match key {
            "http_listen" => "the edge's HTTP listener",
            "https_listen" => "the edge's HTTPS listener",
            "metrics_listen" => "the metrics listener",
            _ => "a listener",
        };
        bail!(
            "{listener} cannot listen on {addr} ({key}): {e}; stop what holds it or choose another --{}",
            key.replace('_', "-")
        );
    }
    Ok(())
}

/// TLS 1.2 and 1.3, certificates by SNI from the store's Certificate Material, HTTP/2 by
/// ALPN, resumption by session tickets ([`ployz_edge::tls::server_config`]).
fn tls_config(
    resolver: &CertificateResolver,
) -> anyhow::Result<Arc<ployz_edge::tls::ServerConfig>> {
    ployz_edge::tls::server_config(Arc::new(resolver.clone()))
        .map_err(|e| anyhow::anyhow!("cannot set up TLS: {e}"))
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("PLOYZ_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// Binds the management socket with mode 0660 (group `group` when it exists). A live socket
/// at the path means another daemon runs there: refuse. A dead one is a leftover: replace it.
///
/// A socket directory that does not exist is created 0750 with that group: only root and the
/// group can enter it. The socket is bound under the daemon's umask ([`DAEMON_UMASK`]), so it
/// is its owner's alone until its mode and group are set: never open to others, not even for a
/// moment.
///
/// [`DAEMON_UMASK`]: crate::fsutil::DAEMON_UMASK
fn bind_socket(path: &Path, group: &str) -> anyhow::Result<UnixListener> {
    let gid = group_id(group);
    if let Some(parent) = path.parent() {
        crate::fsutil::create_dirs(parent, 0o750, gid)
            .with_context(|| format!("cannot create socket directory {}", parent.display()))?;
    }
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            bail!(
                "another ployz daemon is already listening on {}; stop it, or give this one its own --socket and --data-dir",
                path.display()
            );
        }
        std::fs::remove_file(path)
            .with_context(|| format!("cannot remove stale socket {}", path.display()))?;
    }
    let listener =
        UnixListener::bind(path).with_context(|| format!("cannot listen on {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
        .with_context(|| format!("cannot set mode 0660 on {}", path.display()))?;
    if let Some(gid) = gid {
        if let Err(e) = std::os::unix::fs::chown(path, None, Some(gid)) {
            tracing::warn!(socket = %path.display(), group, error = %e, "cannot give the socket to its group");
        }
    }
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// The ID of a group by name, from the system's group database (NSS: `/etc/group`, LDAP,
/// systemd's dynamic groups...); `None` when there is no such group or it cannot be looked up.
fn group_id(name: &str) -> Option<u32> {
    match nix::unistd::Group::from_name(name) {
        Ok(group) => group.map(|g| g.gid.as_raw()),
        Err(e) => {
            tracing::warn!(group = name, error = %e, "cannot look up the socket's group");
            None
        }
    }
}

/// Serves the management API on the bound socket until shutdown.
struct ApiService {
    listener: Mutex<Option<UnixListener>>,
    machine: Arc<LocalMachine>,
    /// The API's routes with the Machine lease and the API's limits and error bodies
    /// ([`local_api`]); the mesh listener serves the same to the Cluster's members.
    app: axum::Router,
    /// How long a client has to send a request head (the next one, on a kept-alive connection).
    header_timeout: std::time::Duration,
    /// What the mesh observes.
    mesh: Arc<crate::mesh::MeshView>,
}

/// The management API over this Machine: its routes, guarded by the Machine lease, with the
/// API's limits and error bodies. Served on the socket (behind Machine Target forwarding) and,
/// to the Cluster's members, on the mesh listener.
fn local_api(
    machine: Arc<LocalMachine>,
    routes: RouteController,
    dns: Option<ployz_dns::DnsController>,
    mesh: Arc<crate::mesh::MeshView>,
    lease: Arc<crate::lease::MachineLease>,
    listeners: crate::docker_api::OwnListeners,
    reconciler: Arc<crate::reconcile::Reconciler>,
) -> axum::Router {
    api::with_api_errors(crate::lease::guarded(
        api::router(machine, routes, dns, mesh)
            .merge(crate::reconcile::router(reconciler))
            .layer(axum::Extension(listeners)),
        lease,
    ))
}

#[async_trait]
impl BackgroundService for ApiService {
    async fn start(&self, shutdown: ShutdownWatch) {
        let Some(std_listener) = self.listener.lock().expect("listener lock").take() else {
            return;
        };
        let listener = match tokio::net::UnixListener::from_std(std_listener) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "management API cannot use its socket");
                return;
            }
        };
        let local = self.app.clone();
        let app = local.clone().layer(axum::middleware::from_fn_with_state(
            crate::forward::Forwarding {
                machine: self.machine.clone(),
                mesh: self.mesh.clone(),
                local,
            },
            crate::forward::forward,
        ));
        api::serve(
            listener,
            app,
            self.header_timeout,
            api::MAX_CONNECTIONS,
            shutdown,
        )
        .await;
    }
}

/// The signals that end the daemon, as they arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    Term,
    Int,
    Quit,
    /// A new process took over ([`crate::handover`]): close the edge, finish what is in flight.
    Retire,
    /// A handover failed after this process gave up its store: stop at once.
    Failed,
}

/// Starts listening for SIGTERM, SIGINT and SIGQUIT at once, on a thread of its own, so a
/// signal that arrives while the server is still starting is not lost (nor fatal).
fn listen_for_signals(tx: tokio::sync::mpsc::UnboundedSender<Stop>) -> anyhow::Result<()> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("ployz-signals".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("signal runtime");
            runtime.block_on(async move {
                use tokio::signal::unix::{signal, SignalKind};
                let streams = (
                    signal(SignalKind::terminate()),
                    signal(SignalKind::interrupt()),
                    signal(SignalKind::quit()),
                );
                let (Ok(mut term), Ok(mut int), Ok(mut quit)) = streams else {
                    let _ = ready_tx.send(false);
                    return;
                };
                let _ = ready_tx.send(true);
                loop {
                    let stop = tokio::select! {
                        _ = term.recv() => Stop::Term,
                        _ = int.recv() => Stop::Int,
                        _ = quit.recv() => Stop::Quit,
                    };
                    if tx.send(stop).is_err() {
                        return;
                    }
                }
            });
        })?;
    match ready_rx.recv() {
        Ok(true) => Ok(()),
        _ => bail!("cannot install signal handlers"),
    }
}

/// SIGTERM: for the drain delay the edge still serves, health answering 503 and every HTTP/1
/// response saying `Connection: close`; then the edge's listeners close, idle connections are
/// closed between requests, requests in flight get up to the grace period (no longer than they
/// need), and Pingora's graceful shutdown stops the rest. SIGINT: fast, at any point. SIGQUIT:
/// Pingora's graceful upgrade.
struct DrainFirst {
    state: Arc<EdgeState>,
    delay: std::time::Duration,
    edge: ployz_edge::EdgeClosing,
    grace: std::time::Duration,
    /// How long requests in flight may take after a handover.
    handover_grace: std::time::Duration,
    signals: tokio::sync::Mutex<tokio::sync::mpsc::UnboundedReceiver<Stop>>,
}

/// Runs `work` to its end, unless SIGINT comes first (`Err`: shut down fast). A repeated
/// SIGTERM (or SIGQUIT) changes nothing.
async fn unless_interrupted<T>(
    work: impl std::future::Future<Output = T>,
    signals: &mut tokio::sync::mpsc::UnboundedReceiver<Stop>,
) -> Result<T, pingora::server::ShutdownSignal> {
    tokio::pin!(work);
    let mut listening = true;
    loop {
        tokio::select! {
            out = &mut work => return Ok(out),
            signal = signals.recv(), if listening => match signal {
                Some(Stop::Int) => return Err(pingora::server::ShutdownSignal::FastShutdown),
                Some(_) => {}
                None => listening = false,
            },
        }
    }
}

#[async_trait]
impl pingora::server::ShutdownSignalWatch for DrainFirst {
    async fn recv(&self) -> pingora::server::ShutdownSignal {
        use pingora::server::ShutdownSignal;
        let mut signals = self.signals.lock().await;
        let signal = signals.recv().await;
        match signal {
            Some(Stop::Term) | None => crate::notify::stopping("draining: health answers 503"),
            Some(Stop::Int) => crate::notify::stopping("stopping now (SIGINT)"),
            Some(Stop::Quit) => crate::notify::stopping("stopping (SIGQUIT)"),
            // The service goes on in the new process: nothing to tell the service manager.
            Some(Stop::Retire | Stop::Failed) => {}
        }
        match signal {
            Some(Stop::Retire) => {
                // The new process accepts on the same listening sockets: this one stops at
                // once. Requests under way here get `Connection: close` with their responses,
                // and a connection accepted here whose next request is only now on its way is
                // still answered (the edge's idle window at shutdown).
                self.state.set_handing_over();
                self.edge.close();
                tracing::info!(
                    connections = self.edge.open(),
                    grace_s = self.handover_grace.as_secs(),
                    "handed over: the edge's listeners are closed here; answering the requests in flight"
                );
                match unless_interrupted(self.edge.closed(self.handover_grace), &mut signals).await
                {
                    Err(fast) => fast,
                    Ok(0) => ShutdownSignal::GracefulTerminate,
                    Ok(left) => {
                        tracing::warn!(
                            connections = left,
                            grace_s = self.handover_grace.as_secs(),
                            "connections still busy after the grace period are cut"
                        );
                        ShutdownSignal::GracefulTerminate
                    }
                }
            }
            Some(Stop::Failed) => ShutdownSignal::FastShutdown,
            Some(Stop::Term) | None => {
                self.state.set_draining();
                tracing::info!(
                    delay_s = self.delay.as_secs(),
                    "SIGTERM: health answers 503 and responses close their connections; serving for the drain delay"
                );
                if let Err(fast) =
                    unless_interrupted(tokio::time::sleep(self.delay), &mut signals).await
                {
                    return fast;
                }
                self.edge.close();
                tracing::info!(
                    connections = self.edge.open(),
                    grace_s = self.grace.as_secs(),
                    "the edge's listeners are closed; answering the requests in flight"
                );
                match unless_interrupted(self.edge.closed(self.grace), &mut signals).await {
                    Err(fast) => fast,
                    Ok(0) => ShutdownSignal::GracefulTerminate,
                    Ok(left) => {
                        tracing::warn!(
                            connections = left,
                            grace_s = self.grace.as_secs(),
                            "connections still busy after the grace period are cut"
                        );
                        ShutdownSignal::GracefulTerminate
                    }
                }
            }
            Some(Stop::Int) => ShutdownSignal::FastShutdown,
            Some(Stop::Quit) => ShutdownSignal::GracefulUpgrade,
        }
    }
}

/// Tells the service manager the daemon is ready once it is, observed from outside: the
/// management API answers `GET /v1/version` on its socket, every edge listener accepts a
/// connection (the store is open before any of it starts) and, on an initialised Machine, the
/// edge's first route and certificate tables are built (or [`FIRST_TABLES_WITHIN`] passed).
/// Then, with a watchdog, keeps it alive for as long as the API keeps answering.
struct Readiness {
    /// The management API's path.
    socket: std::path::PathBuf,
    /// Where it is bound now: the path, or (taking over) beside it until ready.
    probe_socket: std::path::PathBuf,
    edge: Vec<std::net::SocketAddr>,
    /// On an initialised Machine: true once the edge can route (its first route and certificate
    /// tables).
    routing: Option<tokio::sync::watch::Receiver<bool>>,
    /// Written with this process's ID once ready.
    pid_file: std::path::PathBuf,
    /// Taking over: the running daemon, told once this one serves.
    taken: Mutex<Option<crate::handover::TakenOver>>,
}

/// How long one readiness probe may take.
const PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

impl Readiness {
    /// What is not serving yet, or `None` when everything is.
    async fn waiting_for(&self) -> Option<String> {
        if !api_answers(&self.probe_socket).await {
            return Some(format!(
                "waiting for the management API on {}",
                self.probe_socket.display()
            ));
        }
        for addr in &self.edge {
            if !accepts(*addr).await {
                return Some(format!("waiting for the edge's listener on {addr}"));
            }
        }
        // A gate whose sender went is open, as the edge's acceptors read it.
        if self
            .routing
            .as_ref()
            .is_some_and(|r| !*r.borrow() && r.has_changed().is_ok())
        {
            return Some(
                "waiting for the first route and certificate tables from the store".into(),
            );
        }
        None
    }
}

/// Whether the management API on `socket` answers a version request with 200.
async fn api_answers(socket: &Path) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let probe = async {
        let mut stream = tokio::net::UnixStream::connect(socket).await.ok()?;
        let request = format!(
            "GET {} HTTP/1.1\r\nHost: ployz\r\nConnection: close\r\n\r\n",
            ployz_core::api::paths::VERSION
        );
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut head = [0u8; 12];
        stream.read_exact(&mut head).await.ok()?;
        Some(&head == b"HTTP/1.1 200")
    };
    matches!(
        tokio::time::timeout(PROBE_TIMEOUT, probe).await,
        Ok(Some(true))
    )
}

/// Whether a listener on `addr` accepts a TCP connection (an unspecified address is probed on
/// loopback).
async fn accepts(addr: std::net::SocketAddr) -> bool {
    let mut to = addr;
    if to.ip().is_unspecified() {
        to.set_ip(match addr {
            std::net::SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            std::net::SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    matches!(
        tokio::time::timeout(PROBE_TIMEOUT, tokio::net::TcpStream::connect(to)).await,
        Ok(Ok(_))
    )
}

#[async_trait]
impl BackgroundService for Readiness {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut last = String::new();
        loop {
            let Some(waiting) = self.waiting_for().await else {
                break;
            };
            if waiting != last {
                crate::notify::status(&waiting);
                last = waiting;
            }
            tokio::select! {
                _ = tokio::time::sleep(std::time::Duration::from_millis(50)) => {}
                _ = shutdown.changed() => return,
            }
        }
        let taken = self.taken.lock().expect("readiness lock").take();
        let handed_watchdog = taken.as_ref().and_then(|t| t.watchdog);
        if taken.is_some() {
            // Atomic: a client connecting now reaches one process or the other, never none.
            if let Err(e) = std::fs::rename(&self.probe_socket, &self.socket) {
                tracing::error!(error = %e, from = %self.probe_socket.display(), to = %self.socket.display(), "cannot move the management API's socket into place");
            }
        }
        crate::notify::ready(&format!(
            "serving: the edge on {}, the management API on {}",
            self.edge
                .iter()
                .map(|a| a.to_string())
                .collect::<Vec<_>>()
                .join(" and "),
            self.socket.display()
        ));
        if crate::notify::enabled() {
            tracing::info!("ready: told the service manager");
        }
        if let Err(e) = write_pid_file(&self.pid_file) {
            tracing::warn!(error = %e, file = %self.pid_file.display(), "cannot write the pid file");
        }
        if let Some(mut taken) = taken {
            match taken.ready() {
                Ok(()) => tracing::info!("took over: the previous process retires"),
                Err(e) => {
                    tracing::error!(error = %e, "cannot tell the previous process this one serves")
                }
            }
        }
        // Taking over, the service manager's watchdog is the old process's: `$WATCHDOG_USEC`
        // was given to the unit's first process only.
        let Some(every) = crate::notify::watchdog_interval().or(handed_watchdog) else {
            return;
        };
        loop {
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = shutdown.changed() => return,
            }
            if *shutdown.borrow() {
                return;
            }
            if api_answers(&self.socket).await {
                crate::notify::watchdog();
            } else {
                tracing::warn!(
                    socket = %self.socket.display(),
                    "the management API did not answer; the watchdog is not fed"
                );
            }
        }
    }
}

/// Serves `GET /metrics` (Prometheus text format) on the metrics listener.
struct MetricsService {
    addr: std::net::SocketAddr,
    metrics: Arc<EdgeMetrics>,
    routes: RouteController,
    /// The internal DNS's counters, once its server is bound.
    dns: Arc<std::sync::OnceLock<Arc<ployz_dns::DnsMetrics>>>,
    /// What the modules reading the store counted when it could not be read or written.
    failures: StoreFailures,
    /// The mesh's series.
    mesh: Arc<crate::mesh::MeshView>,
    /// How long a client has to send a request head.
    header_timeout: std::time::Duration,
    /// Taking over: the address is retried until the previous process lets go of it.
    take_over: bool,
    /// The reconciliation's series.
    reconcile: Arc<crate::reconcile::Reconciler>,
    /// The certificates the edge serves, for their expiry.
    certificates: CertificateResolver,
}

#[async_trait]
impl BackgroundService for MetricsService {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        // Taking over, the previous process holds the address until it retires.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        let listener = loop {
            match tokio::net::TcpListener::bind(self.addr).await {
                Ok(l) => break l,
                Err(e) if self.take_over && std::time::Instant::now() < deadline => {
                    tracing::debug!(addr = %self.addr, error = %e, "the metrics address is not free yet");
                    tokio::select! {
                        _ = shutdown.changed() => return,
                        _ = tokio::time::sleep(std::time::Duration::from_millis(100)) => {}
                    }
                }
                Err(e) => {
                    tracing::error!(addr = %self.addr, error = %e, "metrics listener cannot bind");
                    return;
                }
            }
        };
        let metrics = self.metrics.clone();
        let routes = self.routes.clone();
        let dns = self.dns.clone();
        let failures = self.failures.clone();
        let mesh = self.mesh.clone();
        let reconcile = self.reconcile.clone();
        let certificates = self.certificates.clone();
        let app = axum::Router::new().route(
            "/metrics",
            axum::routing::get(move || {
                let metrics = metrics.clone();
                let routes = routes.clone();
                let dns = dns.clone();
                let failures = failures.clone();
                let mesh = mesh.clone();
                let reconcile = reconcile.clone();
                let certificates = certificates.clone();
                async move {
                    let table = routes.table().load();
                    let mut text = metrics.render(table.generation(), table.len());
                    if let Some(d) = dns.get() {
                        d.render_prometheus(&mut text);
                    }
                    failures.render(&mut text);
                    mesh.render(&mut text);
                    reconcile.render(&mut text);
                    certificates.render_expiry(&mut text);
                    ([("content-type", "text/plain; version=0.0.4")], text)
                }
            }),
        );
        // Scrapers are few: the cap only bounds what a flood of half-sent requests can hold.
        api::serve(listener, app, self.header_timeout, 64, shutdown).await;
    }
}

/// The failures of the modules that publish from the store (the route table, the DNS snapshot,
/// the certificate issuer), each of which keeps what it last published when the store cannot
/// be read: counted there, rendered here.
#[derive(Clone)]
struct StoreFailures {
    routes: RouteController,
    dns: Option<ployz_dns::DnsController>,
    issuer: Option<ployz_acme::IssuerCounters>,
}

impl StoreFailures {
    /// Appends `ployz_store_read_failures_total{reader}` and
    /// `ployz_store_write_failures_total{writer}` in the Prometheus text format (one series per
    /// module that runs on this Machine).
    fn render(&self, out: &mut String) {
        use prometheus_client::metrics::counter::Counter;
        use prometheus_client::metrics::family::Family;
        type ByModule = Family<[(&'static str, &'static str); 1], Counter>;
        let reads = ByModule::default();
        let writes = ByModule::default();
        reads
            .get_or_create(&[("reader", "route_table")])
            .inc_by(self.routes.rebuild_failures());
        if let Some(dns) = &self.dns {
            reads
                .get_or_create(&[("reader", "dns")])
                .inc_by(dns.rebuild_failures());
        }
        if let Some(issuer) = &self.issuer {
            reads
                .get_or_create(&[("reader", "certificate_issuer")])
                .inc_by(issuer.store_read_failures());
            writes
                .get_or_create(&[("writer", "certificate_issuer")])
                .inc_by(issuer.store_write_failures());
        }
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register(
            "ployz_store_read_failures",
            "Rebuilds and passes skipped because the store could not be read (what was published stays)",
            reads,
        );
        registry.register(
            "ployz_store_write_failures",
            "Store writes that failed",
            writes,
        );
        // Writing to a String cannot fail, and nothing registered here fails to encode.
        let _ = prometheus_client::encoding::prometheus_text::encode(out, &registry);
    }
}

/// The internal DNS: once this Machine is initialised, keeps the answer snapshot current and
/// serves it on the Machine Gateway (or the configured address).
struct DnsService {
    machine: Arc<LocalMachine>,
    controller: ployz_dns::DnsController,
    /// Never [`DnsListen::Off`]: then the service is not started.
    listen: DnsListen,
    upstreams: Vec<std::net::SocketAddr>,
    /// Forwarded answers kept (`[dns] cache_entries`).
    cache_entries: usize,
    metrics: Arc<std::sync::OnceLock<Arc<ployz_dns::DnsMetrics>>>,
    /// Taking over: the port is retried quickly until the previous process lets go of it.
    take_over: bool,
    /// Where it reports its sockets, and is asked to bind again when they stop answering.
    listener: Arc<crate::reconcile::DnsListener>,
}

#[async_trait]
impl BackgroundService for DnsService {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let Some(machine) = self.machine.initialised(&mut shutdown).await else {
            return;
        };
        let (store, info) = (machine.store, machine.info);
        let listen = match self.listen {
            DnsListen::Gateway => std::net::SocketAddr::new(info.subnet.gateway().into(), 53),
            DnsListen::At(a) => a,
            DnsListen::Off => return,
        };
        let controller = self.controller.clone();
        let (s, id, rx) = (store.clone(), info.id.clone(), shutdown.clone());
        let rebuilding = tokio::spawn(async move { controller.run(s, id, rx).await });
        let upstreams = if self.upstreams.is_empty() {
            ployz_dns::upstreams_from_resolv_conf("/etc/resolv.conf".as_ref(), &[listen])
                .unwrap_or_else(|e| {
                    tracing::warn!(error = %e, "no upstream resolvers: names outside .internal get REFUSED");
                    Vec::new()
                })
        } else {
            self.upstreams.clone()
        };
        // Bound again when the reconciler finds the sockets no longer answer.
        loop {
            // The Machine Gateway appears with the `ployz` network; a port held by another server
            // is reported and retried, so fixing it needs no restart.
            let mut delay = std::time::Duration::from_millis(200);
            let server = loop {
                let mut config = ployz_dns::DnsServerConfig::new(listen);
                // This Machine itself (whose queries may leave with any of its addresses, NAT
                // included), its containers and the mesh; nobody else.
                config.allowed_sources = crate::public_addresses::interface_addresses()
                    .into_iter()
                    .fold(
                        ployz_dns::AllowedSources::loopback()
                            .with_machine_subnet(info.subnet)
                            .with(
                                ployz_core::DEFAULT_CLUSTER_NETWORK
                                    .parse()
                                    .expect("the cluster network is a network"),
                            ),
                        |acl, a| acl.with(ployz_dns::IpNet::from(a)),
                    );
                config.upstreams = upstreams.clone();
                config.cache_entries = self.cache_entries;
                config.metrics = self.metrics.get().cloned();
                match ployz_dns::DnsServer::bind(config, self.controller.snapshot().clone()).await {
                    Ok(server) => break server,
                    Err(e) => {
                        tracing::error!(listen = %listen, error = %e, retry_in_s = delay.as_secs_f32(), "internal DNS cannot listen");
                        self.listener.set_bind_error(e.to_string());
                    }
                }
                tokio::select! {
                    _ = shutdown.changed() => return,
                    _ = tokio::time::sleep(delay) => {}
                }
                // Taking over, the previous process lets go of the port when it retires: soon.
                if !self.take_over {
                    delay = (delay * 2).min(std::time::Duration::from_secs(30));
                }
            };
            tracing::info!(listen = %server.local_addr(), upstreams = ?upstreams, "internal DNS listening");
            let _ = self.metrics.set(server.metrics());
            self.listener.set_bound(Some(server.local_addr()));
            let (stop, stopped) = tokio::sync::watch::channel(false);
            let running = server.run(stopped);
            tokio::pin!(running);
            let rebind = tokio::select! {
                _ = &mut running => false,
                _ = shutdown.changed() => false,
                _ = self.listener.rebind_requested() => true,
            };
            self.listener.set_bound(None);
            stop.send_replace(true);
            running.await;
            if !rebind {
                break;
            }
            tracing::warn!(listen = %listen, "internal DNS binding its sockets again");
        }
        let _ = rebuilding.await;
    }
}

/// Keeps this Machine's Container Runtime Observations in the store, once it is initialised.
struct ObserverService {
    machine: Arc<LocalMachine>,
}

#[async_trait]
impl BackgroundService for ObserverService {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let Some(machine) = self.machine.initialised(&mut shutdown).await else {
            return;
        };
        ployz_orchestrator::observer::run(machine.docker, machine.store, shutdown).await;
    }
}

/// Publishes the edge's route table from the store, once this Machine is initialised, turns
/// the health endpoint to 503 while the store cannot write, and to draining on shutdown.
struct RouteService {
    machine: Arc<LocalMachine>,
    routes: RouteController,
    certificates: CertificateResolver,
    challenges: ployz_edge::ChallengeResponder,
    state: Arc<EdgeState>,
    /// Which Machines this Machine observes down, for the order of each route's upstreams.
    mesh: Arc<crate::mesh::MeshView>,
    /// Turned true once the first route and certificate tables from the store are published.
    routing: tokio::sync::watch::Sender<bool>,
}

/// How long the tables are waited for: a process taking over, before its edge takes connections
/// regardless (well within the running process's wait for `READY`); any start of an
/// initialised Machine, before it says `READY`.
const FIRST_TABLES_WITHIN: std::time::Duration = std::time::Duration::from_secs(30);

/// The TCP and UDP ports the edge forwards to Services, following the published table. Apart
/// from the route controller: handing over, they are served with the last table until this
/// process retires, as the edge's listeners are.
struct IngressPortsService(Arc<ployz_edge::ingress_ports::IngressPorts>);

#[async_trait]
impl BackgroundService for IngressPortsService {
    async fn start(&self, shutdown: ShutdownWatch) {
        self.0.clone().run(shutdown).await;
    }
}

#[async_trait]
impl BackgroundService for RouteService {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let Some(Initialised { store, .. }) = self.machine.initialised(&mut shutdown).await else {
            self.state.set_draining();
            return;
        };
        self.state.set_participating(store.local().as_str());
        // Health answers 503 while the store cannot write.
        let state = self.state.clone();
        let store_writability = self
            .machine
            .follow_store_writability(move |r| state.set_store_unwritable(r), shutdown.clone());
        let mut down = self.mesh.machines_down();
        let routes = self.routes.clone();
        let mut stop = shutdown.clone();
        let follow_membership = async move {
            loop {
                routes.set_machines_down(down.borrow_and_update().iter().cloned().collect());
                tokio::select! {
                    changed = down.changed() => if changed.is_err() { return },
                    _ = stop.changed() => return,
                }
            }
        };
        let mut stop_routing = shutdown.clone();
        let routing = async {
            let first_tables = async {
                self.routes.first_published().await;
                self.certificates.first_built().await;
            };
            tokio::select! {
                built = tokio::time::timeout(FIRST_TABLES_WITHIN, first_tables) => {
                    if built.is_err() {
                        tracing::warn!(
                            within_s = FIRST_TABLES_WITHIN.as_secs(),
                            "the first route and certificate tables are not built yet; the edge takes connections and the daemon says it is ready regardless"
                        );
                    }
                    self.routing.send_replace(true);
                }
                _ = stop_routing.changed() => {}
            }
        };
        tokio::join!(
            routing,
            self.routes.run(store.clone(), shutdown.clone()),
            follow_membership,
            self.certificates.run(store.clone(), shutdown.clone()),
            self.challenges.run(store, shutdown.clone()),
            store_writability,
        );
        self.state.set_draining();
    }
}

/// How long the certificate issuer waits at start for replication to pull from a peer.
const CATCH_UP_WITHIN: std::time::Duration = std::time::Duration::from_secs(60);

/// Orders and renews certificates by ACME once this Machine is initialised.
struct IssuerService {
    machine: Arc<LocalMachine>,
    verdict_resolver: ployz_acme::VerdictResolver,
    /// Shared with the metrics listener.
    counters: ployz_acme::IssuerCounters,
    /// The edge's HTTP port, where the authority's HTTP-01 validation arrives.
    challenge_port: u16,
    /// Which Machines this Machine does not observe up (past the grace, their hostnames are
    /// issued by the others), and whether replication has pulled from a peer yet.
    mesh: Arc<crate::mesh::MeshView>,
    down_grace: std::time::Duration,
}

#[async_trait]
impl BackgroundService for IssuerService {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let Some(Initialised { store, .. }) = self.machine.initialised(&mut shutdown).await else {
            return;
        };
        // A Machine back from a long absence holds a stale store: the others may have renewed
        // in its place what it would order again. Unless it is alone, the issuer waits (at
        // most CATCH_UP_WITHIN) until replication has pulled what a peer holds.
        let alone = ployz_store::machines::stored_machines(&store)
            .map(|m| m.iter().all(|m| m.id == *store.local()))
            .unwrap_or(false);
        if !alone {
            let mut caught_up = self.mesh.caught_up();
            tokio::select! {
                waited = tokio::time::timeout(CATCH_UP_WITHIN, caught_up.wait_for(|c| *c)) => {
                    if waited.is_err() {
                        tracing::warn!(
                            within_s = CATCH_UP_WITHIN.as_secs(),
                            "the certificate issuer starts before replication pulled from a peer: a certificate renewed elsewhere meanwhile may be ordered again"
                        );
                    }
                }
                _ = shutdown.changed() => return,
            }
        }
        let mut config = ployz_acme::IssuerConfig::new(store.local().clone());
        config.verdict_resolver = self.verdict_resolver;
        config.counters = self.counters.clone();
        config.challenge_port = Some(self.challenge_port);
        config.machines_not_up = self.mesh.machines_not_up();
        config.down_grace = self.down_grace;
        config.public_addresses = ployz_acme::PublicAddressSource::Dynamic(Arc::new(
            ployz_store::machines::stored_public_addresses,
        ));
        ployz_acme::CertificateIssuer::run(store, config, shutdown).await;
    }
}

/// Parses a fixed route, `HOST[PATH]=ADDR:PORT[,ADDR:PORT...]` (a path ending in `/*` is a
/// prefix, another an exact path).
pub fn parse_route(r: &str) -> anyhow::Result<(String, Vec<std::net::SocketAddr>)> {
    let (host, addrs) = r.split_once('=').ok_or_else(|| {
        anyhow::anyhow!("--route '{r}' is not HOST[/PATH[/*]]=ADDR:PORT[,ADDR:PORT...]")
    })?;
    let addrs = addrs
        .split(',')
        .map(|a| {
            a.parse()
                .map_err(|_| anyhow::anyhow!("--route '{r}': '{a}' is not ADDR:PORT"))
        })
        .collect::<anyhow::Result<Vec<std::net::SocketAddr>>>()?;
    if ployz_edge::route_table::parse_static_route(host).is_none() {
        anyhow::bail!(
            "--route '{r}': '{host}' is not a host name with an optional plain path; give one such as app.test or app.test/api/*"
        );
    }
    Ok((host.to_owned(), addrs))
}

/// The HTTPS listener of the edge alone: where, and the certificates it serves by SNI.
#[derive(Debug, Clone)]
pub struct EdgeTls {
    pub listen: std::net::SocketAddr,
    pub materials: Vec<ployz_core::CertificateMaterial>,
}

impl EdgeTls {
    /// The listener on `listen` serving the certificate chain `cert_pem` with `key_pem` for
    /// each of `hostnames` it covers; refused when it covers none, or does not load.
    pub fn from_pem(
        listen: std::net::SocketAddr,
        (cert_file, cert_pem): (&std::path::Path, &str),
        key_pem: &str,
        hostnames: &[&str],
    ) -> anyhow::Result<EdgeTls> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let mut materials = Vec::new();
        let mut why = Vec::new();
        for h in hostnames {
            match ployz_core::CertificateMaterial::check(h, cert_pem, key_pem, now) {
                Ok(m) => materials.push(m),
                Err(e) => why.push(format!("{h}: {e}")),
            }
        }
        if materials.is_empty() {
            anyhow::bail!(
                "--tls-cert {}: the certificate serves none of the routes' hostnames ({}); give a certificate for one of them",
                cert_file.display(),
                why.join("; ")
            );
        }
        Ok(EdgeTls { listen, materials })
    }
}

/// Runs the edge alone, with fixed routes and no Machine, store or API: for side-by-side
/// benchmarks and for debugging the proxy in isolation. Blocks until SIGTERM or SIGINT.
///
/// Of `config` it uses `http_listen`, `access_log`, `[limits]`, `[edge]` and the drain delay and
/// grace period of `[shutdown]`, and validates those; `threads` edge workers serve.
/// With `tls`, an HTTPS listener too (HTTP/1.1 and HTTP/2 by ALPN), serving its certificates.
pub fn run_edge_alone(
    config: &DaemonConfig,
    routes: Vec<(String, Vec<std::net::SocketAddr>)>,
    threads: usize,
    tls: Option<EdgeTls>,
) -> anyhow::Result<()> {
    config.limits.validate()?;
    config.edge.validate()?;
    init_logging(LogFormat::Text);
    let (stops, signals) = tokio::sync::mpsc::unbounded_channel();
    listen_for_signals(stops)?;
    check_listener_free("http_listen", config.http_listen)?;
    if let Some(tls) = &tls {
        check_listener_free("https_listen", tls.listen)?;
    }
    // Pingora writes its pid file only when it daemonizes, and uses the upgrade socket only on
    // SIGQUIT; the edge alone does neither, so the paths are named but nothing is created.
    let runtime_base = std::env::temp_dir().join(format!("ployz-edge-{}", std::process::id()));
    let conf = ServerConf {
        pid_file: runtime_base.with_extension("pid").display().to_string(),
        upgrade_sock: runtime_base
            .with_extension("upgrade.sock")
            .display()
            .to_string(),
        threads,
        grace_period_seconds: Some(0),
        graceful_shutdown_timeout_seconds: Some(1),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let state = Arc::new(EdgeState::default());
    state.set_participating("edge-alone");
    let mut edge = ployz_edge::edge_service(
        &server.configuration,
        EdgeProxy::new(
            RouteController::fixed(ployz_edge::RouteTable::from_static(&routes)),
            state.clone(),
            Arc::new(EdgeMetrics::default()),
            None,
            edge_limits(config),
        ),
    );
    let edge_closing = edge.closing();
    edge.add_tcp(config.http_listen)
        .with_context(|| format!("the edge cannot listen on {}", config.http_listen))?;
    if let Some(tls) = &tls {
        edge.add_tls(
            tls.listen,
            tls_config(&CertificateResolver::fixed(&tls.materials))?,
        )
        .with_context(|| format!("the edge cannot listen on {}", tls.listen))?;
    }
    server.add_service(edge);
    server.run(RunArgs {
        shutdown_signal: Box::new(DrainFirst {
            state,
            delay: config.shutdown.drain_delay(),
            edge: edge_closing,
            grace: config.shutdown.grace(),
            handover_grace: config.shutdown.handover_grace(),
            signals: tokio::sync::Mutex::new(signals),
        }),
    });
    Ok(())
}

/// Starts this daemon again in place (same executable, same arguments, same PID), after a reset
/// to uninitialised: every listener and open file closes with the old image (they are opened
/// close-on-exec), and the new one starts from the data dir as it now is. Returns only if the
/// exec failed, after logging why; the process then exits so a service manager restarts it.
pub(crate) fn restart_process() -> ! {
    use std::os::unix::process::CommandExt as _;
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    tracing::warn!("starting the daemon again, uninitialised");
    let error = std::process::Command::new("/proc/self/exe")
        .args(&args)
        .exec();
    tracing::error!(error = %error, "cannot start the daemon again; exiting");
    std::process::exit(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_socket_is_refused_and_a_stale_one_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/ployz.sock");
        let first = bind_socket(&path, "no-such-group").unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o660);
        let dir_mode = std::fs::metadata(dir.path().join("sub"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(
            dir_mode, 0o750,
            "a socket dir the daemon makes is for root and its group"
        );
        let err = bind_socket(&path, "no-such-group").unwrap_err();
        assert!(err.to_string().contains("already listening"), "{err}");
        drop(first);
        bind_socket(&path, "no-such-group").expect("a stale socket is replaced");
    }

    #[test]
    fn group_ids_come_from_the_group_database() {
        assert_eq!(group_id("root"), Some(0));
        assert_eq!(group_id("no-such-group-here"), None);
    }

    #[test]
    fn store_read_failures_are_rendered_per_module() {
        let store = ployz_store::Store::temporary(ployz_core::MachineId::generate()).unwrap();
        let routes = RouteController::new();
        let dns = ployz_dns::DnsController::new();
        let failures = StoreFailures {
            routes: routes.clone(),
            dns: Some(dns.clone()),
            issuer: None,
        };
        store.fail_reads(Some("injected read failure"));
        let mut fp = ployz_edge::route_table::Fingerprint::new();
        assert!(routes.rebuild(&store, &mut fp).is_err());
        assert!(routes.rebuild(&store, &mut fp).is_err());
        assert!(dns.rebuild(&store, store.local()).is_err());
        let mut text = String::new();
        failures.render(&mut text);
        assert!(
            text.contains("ployz_store_read_failures_total{reader=\"route_table\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("ployz_store_read_failures_total{reader=\"dns\"} 1\n"),
            "{text}"
        );
        assert!(
            !text.contains("certificate_issuer"),
            "a module that does not run has no series: {text}"
        );
        assert!(
            text.contains("# TYPE ployz_store_read_failures_total counter"),
            "{text}"
        );
    }
}
