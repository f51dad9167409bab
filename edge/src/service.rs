//! The edge's listeners and the threads that serve their connections.
//!
//! Each worker thread runs an event loop of its own (a single-threaded tokio runtime with its
//! own epoll instance). One acceptor per listener takes each new connection and gives it to
//! the worker with the fewest connections open, where it is registered and served from accept
//! to close. A connection's events are then read by the thread that serves it, and so are
//! those of the upstream connections the edge's own paths open for it: [`crate::fast_path`]'s
//! pool is kept per worker. (Pingora's proxy, for the requests the edge's paths leave to it,
//! keeps one upstream pool for every worker.) A shared event loop, as a work-stealing runtime
//! has, wakes one thread for every event and lets a worker sit in a run queue while the other
//! CPU idles: measured on two CPUs under load (`bench/edge_ab.sh`), the machine stayed 9-11%
//! idle with it, and 3-5% with a loop per worker.
//!
//! Shutdown: after SIGTERM's drain delay [`EdgeClosing::close`] closes the listeners while the
//! rest of the daemon still runs, idle connections close between requests, and
//! [`EdgeClosing::closed`] waits for the acceptors to stop and for the last connection, counted
//! from its accept (or a bound); the Ingress Ports ([`crate::ingress_ports`]) close and count
//! their TCP connections with them. The server's own shutdown closes them the same way. Workers
//! run until the process ends: what a connection leaves behind (a lingering close, an upstream
//! connection in Pingora's pool that another worker may be using) stays served.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::apps::ServerApp;
use pingora::protocols::l4::stream::Stream as L4Stream;
use pingora::protocols::{GetSocketDigest, SocketDigest, Stream};
use pingora::server::{ListenFds, ShutdownWatch};
use tokio::io::unix::AsyncFd;
use tokio::sync::{mpsc, watch, Notify};

use crate::EdgeApp;

/// Connections a listener's queue holds before the kernel refuses more (Pingora's figure).
const LISTEN_BACKLOG: i32 = 65535;
/// How long an acceptor waits after the process ran out of file descriptors (or memory)
/// before it tries again: the error repeats at once until a connection closes.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);
/// How often at most an acceptor logs that it is out of file descriptors (or memory).
const ACCEPT_WARNING_EVERY: Duration = Duration::from_secs(10);
/// Connections an acceptor takes in one go before it yields, so that what shares its task (the
/// other listeners' acceptors, the shutdown signal) gets polled.
const ACCEPT_BATCH: usize = 64;

/// Closes the edge's listeners and counts the connections still open.
#[derive(Clone)]
pub struct EdgeClosing {
    inner: Arc<Closing>,
}

struct Closing {
    close: watch::Sender<bool>,
    open: AtomicUsize,
    /// Acceptors still running.
    accepting: AtomicUsize,
    /// Notified when a connection closes or an acceptor stops.
    left: Notify,
}

impl Default for EdgeClosing {
    fn default() -> EdgeClosing {
        EdgeClosing {
            inner: Arc::new(Closing {
                close: watch::channel(false).0,
                open: AtomicUsize::new(0),
                accepting: AtomicUsize::new(0),
                left: Notify::new(),
            }),
        }
    }
}

impl fmt::Debug for EdgeClosing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EdgeClosing")
            .field("closed", &*self.inner.close.borrow())
            .field("open", &self.open())
            .finish()
    }
}

impl EdgeClosing {
    /// Closes the edge's listeners and its Ingress Ports: no connection is accepted any more,
    /// idle ones close between requests, requests in flight are answered (with
    /// `Connection: close`), and TCP connections through an Ingress Port go on for the Ingress
    /// Ports' grace period.
    pub fn close(&self) {
        self.inner.close.send_replace(true);
    }

    /// Connections open now (HTTP/1 and HTTP/2, plain and TLS, and TCP through Ingress Ports).
    pub fn open(&self) -> usize {
        self.inner.open.load(Ordering::SeqCst)
    }

    /// Waits until no connection is open (and, once [`EdgeClosing::close`] was called, no
    /// acceptor is still running: one may be handing out a last connection), or `within`
    /// passed; returns how many connections are left.
    pub async fn closed(&self, within: Duration) -> usize {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let left = self.inner.left.notified();
            tokio::pin!(left);
            left.as_mut().enable();
            let accepting =
                *self.inner.close.borrow() && self.inner.accepting.load(Ordering::SeqCst) > 0;
            if self.open() == 0 && !accepting {
                return 0;
            }
            if tokio::time::timeout_at(deadline, left).await.is_err() {
                return self.open();
            }
        }
    }

    /// Counts one connection until the guard drops.
    pub(crate) fn opened(&self) -> OpenConnection {
        self.inner.open.fetch_add(1, Ordering::SeqCst);
        OpenConnection {
            inner: self.inner.clone(),
        }
    }

    fn subscribe(&self) -> watch::Receiver<bool> {
        self.inner.close.subscribe()
    }

    /// Whether [`EdgeClosing::close`] was called.
    pub(crate) fn is_closed(&self) -> bool {
        *self.inner.close.borrow()
    }

    /// Waits until [`EdgeClosing::close`] is called.
    pub async fn close_called(&self) {
        let mut closed = self.subscribe();
        let _ = closed.wait_for(|closed| *closed).await;
    }

    /// Counts one running acceptor until the guard drops.
    pub(crate) fn accepting(&self) -> Accepting {
        self.inner.accepting.fetch_add(1, Ordering::SeqCst);
        Accepting {
            inner: self.inner.clone(),
        }
    }
}

/// One running acceptor, counted by [`EdgeClosing`].
pub(crate) struct Accepting {
    inner: Arc<Closing>,
}

impl Drop for Accepting {
    fn drop(&mut self) {
        self.inner.accepting.fetch_sub(1, Ordering::SeqCst);
        self.inner.left.notify_waiters();
    }
}

/// One open connection, counted by [`EdgeClosing`].
pub(crate) struct OpenConnection {
    inner: Arc<Closing>,
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.inner.open.fetch_sub(1, Ordering::SeqCst);
        self.inner.left.notify_waiters();
    }
}

/// The edge's listening service: its listeners, an acceptor for each, and the worker threads
/// that serve their connections. Add listeners to it, then add it to the server.
pub struct EdgeService {
    app: EdgeApp,
    listeners: Vec<Listener>,
    /// Worker threads to start.
    workers: usize,
    /// Set: the acceptors take no connection until it turns true (or its sender goes).
    gate: Option<watch::Receiver<bool>>,
}

/// A bound listener and the edge that serves its connections (with a TLS acceptor on an
/// HTTPS listener).
struct Listener {
    addr: SocketAddr,
    socket: std::net::TcpListener,
    app: Arc<EdgeApp>,
}

impl EdgeService {
    /// `workers`: how many threads serve connections (at least one).
    pub(crate) fn new(app: EdgeApp, workers: usize) -> EdgeService {
        EdgeService {
            app,
            listeners: Vec::new(),
            workers: workers.max(1),
            gate: None,
        }
    }

    /// Adds a plain HTTP listener on `addr`, bound now: the error is the bind's (the address
    /// is taken, or not this machine's).
    pub fn add_tcp(&mut self, addr: SocketAddr) -> io::Result<()> {
        let app = self.app.clone();
        self.add(addr, app)
    }

    /// Adds an HTTPS listener on `addr`, bound now: its connections get a TLS handshake with
    /// `config` (see [`crate::tls::server_config`]) before their first request. It shares this
    /// edge (routes, upstream pools, connection count), so whether a connection is TLS never
    /// depends on its address.
    pub fn add_tls(
        &mut self,
        addr: SocketAddr,
        config: Arc<rustls::ServerConfig>,
    ) -> io::Result<()> {
        let app = self.app.with_tls(config);
        self.add(addr, app)
    }

    /// Adds a plain HTTP listener on a socket already listening (one another daemon process
    /// handed over).
    pub fn add_tcp_listening(&mut self, socket: std::net::TcpListener) -> io::Result<()> {
        let app = self.app.clone();
        self.add_listening(socket, app)
    }

    /// Adds an HTTPS listener on a socket already listening, as [`EdgeService::add_tls`].
    pub fn add_tls_listening(
        &mut self,
        socket: std::net::TcpListener,
        config: Arc<rustls::ServerConfig>,
    ) -> io::Result<()> {
        let app = self.app.with_tls(config);
        self.add_listening(socket, app)
    }

    /// Copies of the listening sockets, with their addresses and whether each is HTTPS, for a
    /// daemon process taking over: they go on listening in both until this one closes its own.
    pub fn listening_sockets(&self) -> io::Result<Vec<(SocketAddr, bool, std::net::TcpListener)>> {
        self.listeners
            .iter()
            .map(|l| Ok((l.addr, l.app.is_tls(), l.socket.try_clone()?)))
            .collect()
    }

    fn add(&mut self, addr: SocketAddr, app: EdgeApp) -> io::Result<()> {
        self.add_listening(bind(addr)?, app)
    }

    fn add_listening(&mut self, socket: std::net::TcpListener, app: EdgeApp) -> io::Result<()> {
        socket.set_nonblocking(true)?;
        let addr = socket.local_addr()?;
        self.listeners.push(Listener {
            addr,
            socket,
            app: Arc::new(app),
        });
        Ok(())
    }

    /// Closes this service's listeners ahead of the server and waits for its connections.
    pub fn closing(&self) -> EdgeClosing {
        self.app.closing()
    }

    /// Takes no connection until `gate` turns true (or its sender is dropped): a process
    /// taking over listening sockets the running one still accepts on leaves its connections
    /// to it until this one can route them.
    pub fn accept_after(&mut self, gate: watch::Receiver<bool>) {
        self.gate = Some(gate);
    }
}

/// A listening socket on `addr` (`SO_REUSEADDR`, so a restart need not wait for the old
/// connections' TIME_WAIT), close-on-exec and non-blocking.
fn bind(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(LISTEN_BACKLOG)?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

/// A worker thread as acceptors see it.
struct Worker {
    /// Connections given to this worker and not yet closed.
    load: Arc<AtomicUsize>,
    queue: mpsc::UnboundedSender<Accepted>,
}

/// A connection accepted for a worker.
struct Accepted {
    stream: std::net::TcpStream,
    peer: SocketAddr,
    app: Arc<EdgeApp>,
    /// Counted open from accept on, so that shutdown waits for it while it is still queued.
    _open: OpenConnection,
}

/// Starts `count` worker threads, each with its own event loop, and waits until each runs.
/// A worker serves the connections given to it until the process ends.
async fn start_workers(count: usize, shutdown: &ShutdownWatch) -> io::Result<Arc<[Worker]>> {
    let mut workers = Vec::with_capacity(count);
    for index in 0..count {
        let (queue, accepted) = mpsc::unbounded_channel();
        let load = Arc::new(AtomicUsize::new(0));
        let (started, running) = tokio::sync::oneshot::channel();
        let (thread_load, shutdown) = (load.clone(), shutdown.clone());
        std::thread::Builder::new()
            .name(format!("edge-{index}"))
            .spawn(move || {
                // Built on its own thread: a runtime may not be dropped in an async context,
                // as it would be if it were built there and this thread failed to start.
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build();
                match runtime {
                    Ok(runtime) => {
                        let _ = started.send(Ok(()));
                        crate::fast_path::set_worker(index);
                        runtime.block_on(run_worker(accepted, thread_load, shutdown));
                    }
                    Err(e) => {
                        let _ = started.send(Err(e));
                    }
                }
            })?;
        running
            .await
            .map_err(|_| io::Error::other("the worker thread ended at once"))??;
        workers.push(Worker { load, queue });
    }
    Ok(workers.into())
}

/// A worker's loop: serves each connection given to it, in a task of its own. Once its queue
/// closes (the listeners are closed) it goes on running what its connections left behind
/// until the process ends.
async fn run_worker(
    mut accepted: mpsc::UnboundedReceiver<Accepted>,
    load: Arc<AtomicUsize>,
    shutdown: ShutdownWatch,
) {
    while let Some(conn) = accepted.recv().await {
        tokio::spawn(serve(conn, shutdown.clone(), Load(load.clone())));
    }
    std::future::pending::<()>().await;
}

/// One connection on a worker's count, until it drops.
struct Load(Arc<AtomicUsize>);

impl Drop for Load {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Serves one connection on the worker that runs this task: registered with this worker's
/// event loop, then given to the edge (again for as long as the edge hands it back, as
/// Pingora's listening service does).
async fn serve(conn: Accepted, shutdown: ShutdownWatch, _load: Load) {
    let Accepted {
        stream,
        peer,
        app,
        _open,
    } = conn;
    let stream = match stream
        .set_nonblocking(true)
        .and_then(|()| tokio::net::TcpStream::from_std(stream))
    {
        Ok(stream) => stream,
        Err(e) => {
            tracing::debug!(error = %e, %peer, "cannot serve an accepted connection");
            return;
        }
    };
    let mut l4 = L4Stream::from(stream);
    if let Err(e) = l4.set_nodelay() {
        tracing::debug!(error = %e, %peer, "cannot set TCP_NODELAY");
    }
    let digest = SocketDigest::from_raw_fd(l4.as_raw_fd());
    let _ = digest.peer_addr.set(Some(peer.into()));
    l4.set_socket_digest(digest);
    let mut next: Option<Stream> = Some(Box::new(l4));
    while let Some(stream) = next {
        next = app.process_new(stream, &shutdown).await;
    }
}

/// Accepts the connections of one listener until shutdown, and gives each to the worker with
/// the fewest connections (ties in turn). The listener closes when this returns.
async fn run_acceptor(
    listener: Listener,
    workers: Arc<[Worker]>,
    closing: EdgeClosing,
    mut shutdown: ShutdownWatch,
    gate: Option<watch::Receiver<bool>>,
) {
    let _accepting = closing.accepting();
    let Listener { addr, socket, app } = listener;
    if let Some(mut gate) = gate {
        tokio::select! {
            biased;
            _ = shutdown.wait_for(|down| *down) => return,
            _ = gate.wait_for(|open| *open) => {}
        }
    }
    // SAFETY: the listener owns its file descriptor, and the `AsyncFd` owns the listener until
    // it drops: the descriptor is neither closed nor replaced while it is registered.
    let socket = match unsafe { AsyncFd::register(socket) } {
        Ok(socket) => socket,
        Err(e) => {
            tracing::error!(error = %e, %addr, "cannot watch the edge's listener");
            return;
        }
    };
    let mut turn = 0;
    let mut warned: Option<std::time::Instant> = None;
    loop {
        let mut ready = tokio::select! {
            biased;
            _ = shutdown.wait_for(|down| *down) => break,
            ready = socket.readable() => match ready {
                Ok(ready) => ready,
                Err(e) => {
                    tracing::error!(error = %e, %addr, "the edge's listener failed");
                    break;
                }
            },
        };
        // The connections waiting now, up to a batch, then back to waiting (at once if more
        // are waiting: the listener stays ready until an accept would block).
        let mut batch_full = true;
        for _ in 0..ACCEPT_BATCH {
            match ready.try_io(|socket| socket.get_ref().accept()) {
                Ok(Ok((stream, peer))) => {
                    let conn = Accepted {
                        stream,
                        peer,
                        app: app.clone(),
                        _open: closing.opened(),
                    };
                    dispatch(&workers, &mut turn, conn);
                }
                Ok(Err(e)) => {
                    if out_of_resources(&e) {
                        if warned.is_none_or(|at| at.elapsed() >= ACCEPT_WARNING_EVERY) {
                            warned = Some(std::time::Instant::now());
                            tracing::warn!(error = %e, %addr, "cannot accept connections");
                        }
                        drop(ready);
                        tokio::time::sleep(ACCEPT_PAUSE).await;
                    } else {
                        // The client left before it was accepted, or similar: its own loss.
                        tracing::debug!(error = %e, %addr, "accept failed");
                    }
                    batch_full = false;
                    break;
                }
                Err(_would_block) => {
                    batch_full = false;
                    break;
                }
            }
        }
        if batch_full {
            tokio::task::yield_now().await;
        }
    }
    tracing::info!(%addr, "the edge's listener closed");
}

/// Accept errors that repeat until something is freed.
fn out_of_resources(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// Gives `conn` to the worker with the fewest connections open; among equals, the first from
/// `turn` on, which moves one on every time. A worker whose thread is gone is never chosen
/// again, and the connection goes to the next choice.
fn dispatch(workers: &[Worker], turn: &mut usize, mut conn: Accepted) {
    let count = workers.len();
    let start = *turn % count;
    *turn = start + 1;
    for _ in 0..count {
        let chosen = (0..count)
            .map(|i| (start + i) % count)
            .min_by_key(|&i| workers[i].load.load(Ordering::Relaxed))
            .expect("an edge has at least one worker");
        let worker = &workers[chosen];
        worker.load.fetch_add(1, Ordering::Relaxed);
        match worker.queue.send(conn) {
            Ok(()) => return,
            Err(mpsc::error::SendError(back)) => {
                tracing::error!(worker = chosen, "an edge worker's thread is gone");
                worker.load.store(GONE, Ordering::Relaxed);
                conn = back;
            }
        }
    }
    // Every worker is gone: the connection closes.
}

/// The load of a worker whose thread is gone: above any real one.
const GONE: usize = usize::MAX / 2;

#[async_trait]
impl pingora::services::Service for EdgeService {
    async fn start_service(
        &mut self,
        _fds: Option<ListenFds>,
        shutdown: ShutdownWatch,
        _listeners_per_fd: usize,
    ) {
        // The listeners and connections see one signal: the edge's own close, or the server's
        // shutdown.
        let (tx, rx) = watch::channel(false);
        let mut server = shutdown;
        let mut close = self.app.closing().subscribe();
        let forward = async {
            tokio::select! {
                _ = server.wait_for(|down| *down) => {}
                _ = close.wait_for(|closed| *closed) => {}
            }
            let _ = tx.send(true);
            // The sender stays until the service ends: a dropped one reads as shutdown too, but
            // connections still being answered watch it.
            std::future::pending::<()>().await
        };
        let workers = match start_workers(self.workers, &rx).await {
            Ok(workers) => workers,
            Err(e) => {
                // Listening with no one to serve would leave clients hanging while the daemon
                // looks well: better to exit and be restarted.
                tracing::error!(error = %e, "cannot start the edge's worker threads; exiting");
                std::process::exit(1);
            }
        };
        let accepting: Vec<_> = self
            .listeners
            .drain(..)
            .map(|listener| {
                run_acceptor(
                    listener,
                    workers.clone(),
                    self.app.closing(),
                    rx.clone(),
                    self.gate.clone(),
                )
            })
            .collect();
        // The workers' queues close with the last acceptor.
        drop(workers);
        tokio::select! {
            _ = futures_util::future::join_all(accepting) => {}
            () = forward => {}
        }
        self.app.cleanup().await;
    }

    fn name(&self) -> &str {
        "edge"
    }

    /// The acceptors' runtime: one thread (the connections are served on the workers).
    fn threads(&self) -> Option<usize> {
        Some(1)
    }

    fn listen_addresses(&self) -> Option<Vec<String>> {
        Some(self.listeners.iter().map(|l| l.addr.to_string()).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker(load: usize) -> (Worker, mpsc::UnboundedReceiver<Accepted>) {
        let (queue, accepted) = mpsc::unbounded_channel();
        let load = Arc::new(AtomicUsize::new(load));
        (Worker { load, queue }, accepted)
    }

    /// A connection to give away: a real socket pair's accepted end.
    fn accepted(listener: &std::net::TcpListener, app: &Arc<EdgeApp>) -> Accepted {
        let _client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (stream, peer) = listener.accept().unwrap();
        Accepted {
            stream,
            peer,
            app: app.clone(),
            _open: app.closing().opened(),
        }
    }

    fn app(upstream: SocketAddr, workers: usize) -> EdgeService {
        let routes = crate::RouteTable::from_static(&[("app.test".to_owned(), vec![upstream])]);
        app_with(
            crate::controller::RouteController::fixed(routes),
            workers,
            true,
        )
    }

    /// An edge whose routes are `routes`', of an initialised Machine if `participating`.
    fn app_with(
        routes: crate::controller::RouteController,
        workers: usize,
        participating: bool,
    ) -> EdgeService {
        let conf = Arc::new(pingora::server::configuration::ServerConf {
            threads: workers,
            ..Default::default()
        });
        let state = Arc::new(crate::EdgeState::default());
        if participating {
            state.set_participating("service-test");
        }
        crate::edge_service(
            &conf,
            crate::EdgeProxy::new(
                routes,
                state,
                Arc::new(crate::EdgeMetrics::default()),
                None,
                crate::EdgeLimits::default(),
            ),
        )
    }

    #[test]
    fn a_connection_goes_to_the_least_loaded_worker_and_equals_take_turns() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let app = Arc::new(app(listener.local_addr().unwrap(), 1).app);
        let (a, mut a_queue) = worker(3);
        let (b, mut b_queue) = worker(1);
        let (c, mut c_queue) = worker(1);
        let workers = [a, b, c];
        let mut turn = 0;
        // b and c have one connection each, a three: b (the first equal from turn 0 on).
        dispatch(&workers, &mut turn, accepted(&listener, &app));
        assert!(b_queue.try_recv().is_ok());
        assert_eq!(workers[1].load.load(Ordering::Relaxed), 2);
        // Now c is the least loaded.
        dispatch(&workers, &mut turn, accepted(&listener, &app));
        assert!(c_queue.try_recv().is_ok());
        // b and c both at 2: from turn 2 on, c comes first.
        dispatch(&workers, &mut turn, accepted(&listener, &app));
        assert!(c_queue.try_recv().is_ok());
        assert!(a_queue.try_recv().is_err() && b_queue.try_recv().is_err());
        assert_eq!(
            workers
                .iter()
                .map(|w| w.load.load(Ordering::Relaxed))
                .collect::<Vec<_>>(),
            [3, 2, 3]
        );
        // b (the least loaded) is gone: the connection goes to the next choice, a (equal
        // with c, and first from turn 3 on), and b is not chosen again.
        drop(b_queue);
        dispatch(&workers, &mut turn, accepted(&listener, &app));
        assert!(a_queue.try_recv().is_ok());
        assert_eq!(workers[1].load.load(Ordering::Relaxed), GONE);
        dispatch(&workers, &mut turn, accepted(&listener, &app));
        assert!(c_queue.try_recv().is_ok());
        assert_eq!(
            [&workers[0], &workers[2]].map(|w| w.load.load(Ordering::Relaxed)),
            [4, 4]
        );
    }

    /// An HTTP/1.1 upstream that answers each request with the number of the connection it
    /// came on (0 for the first it accepted), and the count of connections it accepted.
    async fn numbering_upstream() -> (SocketAddr, Arc<AtomicUsize>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let number = count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    loop {
                        match stream.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            buf.drain(..end + 4);
                            let body = number.to_string();
                            let response = format!(
                                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                                body.len()
                            );
                            if stream.write_all(response.as_bytes()).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        (addr, accepted)
    }

    /// One GET through the edge on `client`; the response's body.
    async fn get(client: &mut tokio::net::TcpStream) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        client
            .write_all(b"GET / HTTP/1.1\r\nHost: app.test\r\n\r\n")
            .await
            .unwrap();
        let mut response = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            let n = client.read(&mut chunk).await.unwrap();
            assert!(
                n > 0,
                "the edge closed the connection before the response ended"
            );
            response.extend_from_slice(&chunk[..n]);
            let text = String::from_utf8_lossy(&response).into_owned();
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                assert!(head.starts_with("HTTP/1.1 200"), "{head}");
                let length: usize = head
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length: ")
                            .map(str::to_owned)
                    })
                    .expect("a content-length")
                    .parse()
                    .unwrap();
                if body.len() >= length {
                    return body.to_owned();
                }
            }
        }
    }

    /// An edge taking over a listening socket another process accepts on takes no connection
    /// before its gate opens (the other process answers them), and takes them once it opens.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_gated_edge_leaves_connections_to_the_running_process_until_its_gate_opens() {
        let (upstream, _) = numbering_upstream().await;
        let mut service = app(upstream, 1);
        let shared = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let edge = shared.local_addr().unwrap();
        let running_process = shared.try_clone().unwrap();
        service.add_tcp_listening(shared).unwrap();
        let closing = service.closing();
        let (open_gate, gate) = watch::channel(false);
        service.accept_after(gate);
        let (shutdown, watch) = watch::channel(false);
        let running = tokio::spawn(async move {
            pingora::services::Service::start_service(&mut service, None, watch, 1).await;
        });

        // Once the edge's acceptor runs, a client connects; the edge is given half a second to
        // take it (an ungated one does at once), and then the running process accepts it.
        tokio::time::timeout(Duration::from_secs(5), async {
            while closing.inner.accepting.load(Ordering::SeqCst) == 0 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the edge's acceptor started");
        let _early = tokio::net::TcpStream::connect(edge).await.unwrap();
        let took = tokio::time::timeout(Duration::from_millis(500), async {
            while closing.open() == 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        assert!(took.is_err(), "the gated edge took a connection");
        let running_process = tokio::net::TcpListener::from_std(running_process).unwrap();
        let taken = tokio::time::timeout(Duration::from_secs(5), running_process.accept()).await;
        assert!(
            matches!(taken, Ok(Ok(_))),
            "the gated edge took a connection: {taken:?}"
        );
        assert_eq!(closing.open(), 0);

        open_gate.send_replace(true);
        let mut later = tokio::net::TcpStream::connect(edge).await.unwrap();
        assert_eq!(
            get(&mut later).await,
            "0",
            "the edge serves once its gate opened"
        );
        shutdown.send_replace(true);
        drop(later);
        running.await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn workers_take_connections_in_turn_and_reuse_only_their_own_upstream_connections() {
        let (upstream, upstream_connections) = numbering_upstream().await;
        let service = app(upstream, 2);
        let closing = service.closing();
        let (edge, shutdown, running) = serve_on_loopback(service);

        // The first connection goes to worker 0, which opens upstream connection 0 and keeps
        // it in its pool once the client is gone.
        let mut a = tokio::net::TcpStream::connect(edge).await.unwrap();
        assert_eq!(get(&mut a).await, "0");
        drop(a);
        assert_eq!(closing.closed(Duration::from_secs(10)).await, 0);
        // The next goes to worker 1 (its turn): worker 0's idle upstream connection is not
        // its to take, so it opens one of its own.
        let mut b = tokio::net::TcpStream::connect(edge).await.unwrap();
        assert_eq!(get(&mut b).await, "1");
        // With b open on worker 1, the next goes to worker 0 and reuses connection 0.
        let mut c = tokio::net::TcpStream::connect(edge).await.unwrap();
        assert_eq!(get(&mut c).await, "0");
        assert_eq!(get(&mut b).await, "1");
        assert_eq!(upstream_connections.load(Ordering::SeqCst), 2);

        // Shutdown: the listener closes, and idle connections are closed between requests.
        shutdown.send_replace(true);
        for mut idle in [b, c] {
            use tokio::io::AsyncReadExt;
            let mut rest = Vec::new();
            let read = tokio::time::timeout(Duration::from_secs(10), idle.read_to_end(&mut rest));
            assert!(
                matches!(read.await, Ok(Ok(0))),
                "an idle connection stayed open"
            );
        }
        running.await.unwrap();
        assert!(tokio::net::TcpStream::connect(edge).await.is_err());
    }

    /// One request on a connection of its own, `Connection: close`; the whole response.
    async fn exchange(edge: SocketAddr, host: &str, path: &str) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut client = tokio::net::TcpStream::connect(edge).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        client.write_all(request.as_bytes()).await.unwrap();
        let mut response = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), client.read_to_end(&mut response))
            .await
            .expect("the edge answered within 10 s")
            .unwrap();
        String::from_utf8_lossy(&response).into_owned()
    }

    /// Runs `service` on a loopback port: its address, the shutdown sender and the task.
    fn serve_on_loopback(
        mut service: EdgeService,
    ) -> (SocketAddr, watch::Sender<bool>, tokio::task::JoinHandle<()>) {
        service.add_tcp("127.0.0.1:0".parse().unwrap()).unwrap();
        let edge = service.listeners[0].addr;
        let (shutdown, watch) = watch::channel(false);
        let running = tokio::spawn(async move {
            pingora::services::Service::start_service(&mut service, None, watch, 1).await;
        });
        (edge, shutdown, running)
    }

    /// Just started, before its first route table from the store, a participating Machine's
    /// edge cannot tell an unknown host from one it routes: it answers 503 with Retry-After,
    /// and its health says so, rather than 404 and serving. Once the table comes, unknown is
    /// unknown. An uninitialised Machine's edge (no table will come) answers 404.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn before_its_first_route_table_the_edge_answers_starting_not_unknown() {
        let uninitialised = crate::controller::RouteController::new();
        let (edge, shutdown, running) = serve_on_loopback(app_with(uninitialised, 1, false));
        let unknown = exchange(edge, "app.test", "/").await;
        assert!(unknown.starts_with("HTTP/1.1 404"), "{unknown}");
        let health = exchange(edge, "app.test", "/.ployz/health").await;
        assert!(
            health.contains("this Machine is not initialised"),
            "{health}"
        );
        shutdown.send_replace(true);
        running.await.unwrap();

        let (upstream, _) = numbering_upstream().await;
        let routes = crate::controller::RouteController::new();
        let (edge, shutdown, running) = serve_on_loopback(app_with(routes.clone(), 1, true));

        let before = exchange(edge, "app.test", "/").await;
        assert!(before.starts_with("HTTP/1.1 503"), "{before}");
        assert!(
            before
                .to_ascii_lowercase()
                .contains("\r\nretry-after: 1\r\n"),
            "{before}"
        );
        assert!(
            before.ends_with(crate::proxy::ROUTES_NOT_LOADED),
            "{before}"
        );
        let health = exchange(edge, "app.test", "/.ployz/health").await;
        assert!(health.starts_with("HTTP/1.1 503"), "{health}");
        assert!(health.contains(r#""status":"starting""#), "{health}");

        routes
            .table()
            .store(Arc::new(crate::RouteTable::from_static(&[(
                "app.test".to_owned(),
                vec![upstream],
            )])));
        let routed = exchange(edge, "app.test", "/").await;
        assert!(routed.starts_with("HTTP/1.1 200"), "{routed}");
        let unknown = exchange(edge, "nobody.test", "/").await;
        assert!(unknown.starts_with("HTTP/1.1 404"), "{unknown}");
        assert!(
            unknown.ends_with("no Service publishes this host\n"),
            "{unknown}"
        );
        let health = exchange(edge, "app.test", "/.ployz/health").await;
        assert!(health.starts_with("HTTP/1.1 200"), "{health}");
        assert!(health.contains(r#""status":"serving""#), "{health}");
        shutdown.send_replace(true);
        running.await.unwrap();
    }

    #[tokio::test]
    async fn closed_waits_for_the_last_connection_and_no_longer() {
        let closing = EdgeClosing::default();
        assert_eq!(closing.closed(Duration::from_secs(5)).await, 0);
        let a = closing.opened();
        let b = closing.opened();
        assert_eq!(closing.open(), 2);
        assert_eq!(closing.closed(Duration::from_millis(20)).await, 2);
        let start = std::time::Instant::now();
        let waiting = tokio::spawn({
            let closing = closing.clone();
            async move { closing.closed(Duration::from_secs(5)).await }
        });
        drop(a);
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(b);
        assert_eq!(waiting.await.unwrap(), 0);
        assert!(start.elapsed() < Duration::from_secs(2));
    }

    #[tokio::test]
    async fn after_close_the_wait_for_connections_also_waits_for_the_acceptors() {
        let closing = EdgeClosing::default();
        let acceptor = closing.accepting();
        // Not closed yet: a running acceptor is no reason to wait.
        assert_eq!(closing.closed(Duration::from_secs(5)).await, 0);
        closing.close();
        // Closed, with an acceptor that may still hand out a connection: the wait runs out.
        let start = std::time::Instant::now();
        assert_eq!(closing.closed(Duration::from_millis(50)).await, 0);
        assert!(start.elapsed() >= Duration::from_millis(50));
        let waiting = tokio::spawn({
            let closing = closing.clone();
            async move { closing.closed(Duration::from_secs(5)).await }
        });
        drop(acceptor);
        assert_eq!(waiting.await.unwrap(), 0);
    }
}
