//! The edge's connection loops: every HTTP/1 and HTTP/2 connection, from accept to close.
//!
//! [`EdgeApp`] is the Pingora application of the edge's listeners. For HTTP/2 connections
//! (negotiated by ALPN) it runs the accept loop (`EdgeApp::serve_h2`) and gives each stream
//! to `h2_path` or Pingora's proxy. For HTTP/1 it runs the keep-alive loop
//! itself: it reads each request head into the connection's buffer within the header deadline,
//! then either serves it on the [`crate::fast_path`] or hands the connection, with the bytes
//! already read, to Pingora's proxy for that one request, and takes it back for the next.
//!
//! On a connection to one of the edge's HTTPS listeners the loop first runs the TLS handshake
//! ([`crate::tls`]), which must end within the header timeout.
//!
//! The header deadline is against slowloris clients: from accept (on TLS, after the handshake)
//! or, on a kept-alive connection, from the first byte of the next request, the whole head
//! must arrive within the timeout, or the connection is closed.
//! Pingora times out each read on its own (60 s), so without it a client sending one byte every
//! few seconds would hold a connection for as long as it liked.
//!
//! A request handed to Pingora reads only its own bytes ([`ReplayStream`] stops at the end of
//! its body, by `Content-Length` or chunked framing): what the client pipelined behind it stays
//! in the connection's buffer for the next turn of the loop, whichever path serves it.
//!
//! Shutdown: once SIGTERM arrives, every HTTP/1 response says `Connection: close` and its
//! connection closes after it. When the edge's listeners close, a connection is closed only
//! between requests (nothing of a next request read or waiting in the socket); a request in
//! flight or partly received is answered first.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use futures_util::stream::{FuturesUnordered, StreamExt};
use pingora::apps::{HttpServerApp, ServerApp};
use pingora::listeners::tls::Acceptor;
use pingora::protocols::http::v2::{self, server::H2Accept};
use pingora::protocols::http::ServerSession;
use pingora::protocols::l4::stream::Stream as L4Stream;
use pingora::protocols::Digest;
use pingora::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, Ssl, Stream, UniqueID,
    UniqueIDType, ALPN,
};
use pingora::proxy::HttpProxy;
use pingora::server::ShutdownWatch;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::time::Instant;

use crate::fast_path::{ChunkedScan, Downstream, FastPath, Served, MAX_READ_AHEAD};
use crate::service::EdgeClosing;
use crate::EdgeProxy;

/// Idle time allowed between two requests on a kept-alive connection (Pingora's default).
const KEEPALIVE: Duration = Duration::from_secs(60);
/// How long an HTTP/2 connection told to go away for being idle has to close.
const GOAWAY_GRACE: Duration = Duration::from_secs(10);
/// Malformed streams an HTTP/2 connection may open (each is refused) before it is closed, as
/// Pingora's own HTTP/2 loop counts them.
const MAX_MALFORMED_STREAMS: usize = 32;
/// How long an idle client connection keeps its upstream connection before giving it back to
/// the pool, so idle clients do not pin upstream connections.
const HOLD_UPSTREAM: Duration = Duration::from_secs(1);
/// Once the edge's listeners close, how long a connection with no request under way (a fresh
/// one, one still shaking hands, a kept-alive one between requests) still waits for its next
/// request: a client that sent it as the listeners closed is answered (with `Connection:
/// close`) rather than met with a closed connection, which a client cannot tell from a lost
/// request. A client that has been quiet that long is idle, and closing it is the keep-alive
/// timeout's race, which clients retry through.
const IDLE_AT_SHUTDOWN: Duration = Duration::from_secs(2);

/// The edge's Pingora application: the fast path first, Pingora's proxy for the rest. A clone
/// is the same edge (its state is shared).
#[derive(Clone)]
pub struct EdgeApp {
    pingora: Arc<HttpProxy<EdgeProxy>>,
    fast: Arc<FastPath>,
    /// Whether the fast path serves what it can; off: every request goes to Pingora's proxy.
    fast_path: bool,
    header_timeout: Duration,
    /// The longest request head read; a longer one is answered 414 or 431 and the connection
    /// closed.
    max_head: usize,
    /// Counts open connections (from accept on, by the listening service), so shutdown can
    /// wait for them.
    closing: EdgeClosing,
    /// Set on the app of an HTTPS listener: every connection begins with a TLS handshake.
    tls: Option<Arc<Acceptor>>,
}

impl EdgeApp {
    /// `pingora` is the same `proxy` inside Pingora's proxy; a header that takes longer than
    /// the limits' header timeout ends the connection. `workers`: how many edge workers serve
    /// its connections (each keeps upstream connections of its own).
    pub fn new(pingora: HttpProxy<EdgeProxy>, proxy: EdgeProxy, workers: usize) -> EdgeApp {
        let limits = *proxy.limits();
        EdgeApp {
            pingora: Arc::new(pingora),
            fast: Arc::new(FastPath::new(proxy, workers)),
            fast_path: limits.fast_path,
            header_timeout: limits.header_timeout,
            max_head: limits.max_header_bytes + limits.max_uri_bytes + 4096,
            closing: EdgeClosing::default(),
            tls: None,
        }
    }

    /// The same edge (proxy, upstream pool, connection count) for an HTTPS listener: each
    /// connection first makes a TLS handshake with `config`.
    pub(crate) fn with_tls(&self, config: Arc<rustls::ServerConfig>) -> EdgeApp {
        EdgeApp {
            tls: Some(Arc::new(Acceptor::from_server_config(config))),
            ..self.clone()
        }
    }

    /// Whether its connections start with a TLS handshake.
    pub(crate) fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The TLS handshake of a connection to an HTTPS listener, within the header timeout; a
    /// connection to a plain listener as it is. `None`: the handshake failed or took too long
    /// (counted in the edge's metrics). Once the edge's listeners close, a handshake under way
    /// gets at most [`IDLE_AT_SHUTDOWN`] more: its client is about to send a request.
    async fn handshake(&self, stream: Stream, shutdown: &ShutdownWatch) -> Option<Stream> {
        let Some(acceptor) = &self.tls else {
            return Some(stream);
        };
        let peer = stream
            .get_socket_digest()
            .and_then(|d| d.peer_addr().cloned());
        let Ok(tcp) = stream.into_any().downcast::<L4Stream>() else {
            tracing::warn!("a connection to an HTTPS listener is not a TCP stream; closed");
            return None;
        };
        let metrics = self.fast.edge.metrics();
        let mut closing = shutdown.clone();
        let deadline = Instant::now() + self.header_timeout;
        let handshake = acceptor.tls_handshake(*tcp);
        tokio::pin!(handshake);
        let finished = tokio::select! {
            finished = tokio::time::timeout_at(deadline, &mut handshake) => Some(finished),
            _ = closing.wait_for(|closed| *closed) => None,
        };
        let finished = match finished {
            Some(finished) => finished,
            None => {
                let until = deadline.min(Instant::now() + IDLE_AT_SHUTDOWN);
                tokio::time::timeout_at(until, handshake).await
            }
        };
        match finished {
            Ok(Ok(tls)) => Some(Box::new(tls)),
            Ok(Err(e)) => {
                metrics.tls_handshake_failed(false);
                tracing::debug!(?peer, "TLS handshake failed: {e}");
                None
            }
            Err(_) => {
                metrics.tls_handshake_failed(true);
                tracing::debug!(?peer, "TLS handshake took longer than the header timeout");
                None
            }
        }
    }

    /// Closes this edge's listeners ahead of the rest of the server and counts its open
    /// connections.
    pub fn closing(&self) -> EdgeClosing {
        self.closing.clone()
    }

    /// Hands one request, whose head is the first `head_len` bytes of `conn.buf`, to Pingora's
    /// proxy; the connection back, with what followed the request, if it can carry another
    /// request.
    async fn through_pingora(
        self: &Arc<Self>,
        conn: Downstream,
        head_len: usize,
        shutdown: &ShutdownWatch,
        reuses_left: Option<u32>,
    ) -> Option<Downstream> {
        let Downstream {
            stream,
            buf,
            client,
            tls,
            held,
            read_limit,
        } = conn;
        let body = RequestBytes::of(&buf[..head_len]);
        let replay = ReplayStream {
            inner: Lingering(Some(stream)),
            buf,
            pos: 0,
            head_left: head_len,
            body,
        };
        let mut session = ServerSession::new_http1(Box::new(replay));
        // As Pingora does: no reuse once the service is shutting down.
        session.set_keepalive((!*shutdown.borrow()).then_some(KEEPALIVE.as_secs()));
        session.set_keepalive_reuses_remaining(reuses_left);
        let reused = self.pingora.process_new_http(session, shutdown).await;
        let Some((stream, _)) = reused.map(|r| r.consume()) else {
            self.fast.release(held);
            return None;
        };
        let (stream, buf) = if (*stream).as_any().is::<ReplayStream>() {
            let replay = stream
                .into_any()
                .downcast::<ReplayStream>()
                .expect("checked type");
            let ReplayStream {
                mut inner,
                mut buf,
                pos,
                ..
            } = *replay;
            buf.drain(..pos.min(buf.len()));
            (inner.take(), buf)
        } else {
            (stream, Vec::new())
        };
        Some(Downstream {
            stream,
            buf,
            client,
            tls,
            held,
            read_limit,
        })
    }
}

/// How reading a request head ended.
enum Head {
    /// The head is the first this many bytes of the buffer.
    Complete(usize),
    /// The client closed, went idle past the keep-alive time, or failed.
    Gone,
    /// The head did not arrive within the deadline.
    TimedOut,
    /// The head is longer than allowed; `true` if still within the request line.
    TooLarge(bool),
}

/// Reads until `conn.buf` holds a whole request head. `deadline`: when the head must be
/// complete; `None` on a kept-alive connection between requests, where the clock starts at the
/// first byte (or at once if part of the next request is already buffered). Once the edge's
/// listeners close, a connection with nothing of a request read yet (a fresh one, or one
/// between requests) closes unless the next request's first bytes arrive within
/// [`IDLE_AT_SHUTDOWN`]. While a kept-alive connection idles, after [`HOLD_UPSTREAM`] its kept
/// upstream connection goes back to the pool for other clients.
async fn read_head(
    conn: &mut Downstream,
    mut deadline: Option<Instant>,
    timeout: Duration,
    max: usize,
    shutdown: &mut ShutdownWatch,
    fast: &FastPath,
) -> Head {
    if deadline.is_none() && !conn.buf.is_empty() {
        deadline = Some(Instant::now() + timeout);
    }
    let mut scan = HeaderScan::default();
    let mut scanned = 0;
    // Set once shutdown is seen with nothing of a request read.
    let mut idle_until: Option<Instant> = None;
    loop {
        if let Some(end) = scan.feed(&conn.buf[scanned..]) {
            return Head::Complete(scanned + end);
        }
        scanned = conn.buf.len();
        if scanned >= max {
            return Head::TooLarge(!conn.buf.contains(&b'\n'));
        }
        if conn.buf.capacity() - conn.buf.len() < 1024 {
            conn.buf.reserve(4096);
        }
        // Nothing of a request read yet: shutdown closes the connection, unless the next
        // request begins within IDLE_AT_SHUTDOWN.
        let idle = conn.buf.is_empty();
        if idle && *shutdown.borrow() {
            let mut until = *idle_until.get_or_insert_with(|| Instant::now() + IDLE_AT_SHUTDOWN);
            if let Some(deadline) = deadline {
                until = until.min(deadline);
            }
            match tokio::time::timeout_at(until, conn.stream.read_buf(&mut conn.buf)).await {
                Ok(Ok(n)) if n > 0 => {
                    deadline.get_or_insert_with(|| Instant::now() + timeout);
                    continue;
                }
                _ => return Head::Gone,
            }
        }
        let read = match deadline {
            Some(deadline) => {
                let read = tokio::time::timeout_at(deadline, conn.stream.read_buf(&mut conn.buf));
                tokio::select! {
                    biased;
                    r = read => match r {
                        Ok(read) => read,
                        Err(_) => return Head::TimedOut,
                    },
                    // A new connection that has sent nothing yet is idle too.
                    r = shutdown.changed(), if idle => match r {
                        Ok(()) => continue,
                        Err(_) => return Head::Gone,
                    },
                }
            }
            None => {
                let mut read = std::pin::pin!(conn.stream.read_buf(&mut conn.buf));
                let first = tokio::select! {
                    biased;
                    r = tokio::time::timeout(HOLD_UPSTREAM, &mut read) => r.ok(),
                    r = shutdown.changed() => match r {
                        Ok(()) => continue,
                        Err(_) => return Head::Gone,
                    },
                };
                match first {
                    Some(read) => read,
                    None => {
                        fast.release(conn.held.take());
                        tokio::select! {
                            biased;
                            r = tokio::time::timeout(KEEPALIVE - HOLD_UPSTREAM, read) => match r {
                                Ok(read) => read,
                                Err(_) => return Head::Gone,
                            },
                            r = shutdown.changed() => match r {
                                Ok(()) => continue,
                                Err(_) => return Head::Gone,
                            },
                        }
                    }
                }
            }
        };
        match read {
            Err(_) | Ok(0) => return Head::Gone,
            Ok(_) => {
                if deadline.is_none() {
                    deadline = Some(Instant::now() + timeout);
                }
            }
        }
    }
}

/// Ends a connection the way a client expects: TLS `close_notify`, or a TCP FIN, within a
/// second. After an early answer (414, 431) the rest of what the client sends is read and
/// dropped for a moment, so closing with unread bytes does not reset the connection before the
/// client has read the answer.
async fn close(mut stream: Stream, drain: bool) {
    let _ = tokio::time::timeout(Duration::from_secs(1), Shutdown::shutdown(&mut *stream)).await;
    if drain {
        let mut sink = [0u8; 4096];
        let until = Instant::now() + Duration::from_millis(500);
        let mut left: usize = 256 * 1024;
        while left > 0 {
            match tokio::time::timeout_at(until, stream.read(&mut sink)).await {
                Ok(Ok(n)) if n > 0 => left = left.saturating_sub(n),
                _ => break,
            }
        }
    }
}

impl EdgeApp {
    /// Runs one HTTP/2 connection: each stream it accepts is served by the edge's own path
    /// (`h2_path`) when it can, else by Pingora's proxy. The streams run in this connection's
    /// task, beside its accept loop (which drives the connection's IO): no task per stream, no
    /// stream woken on another thread than its connection.
    ///
    /// The connection ends when the client ends it, when it breaks, when it refused
    /// [`MAX_MALFORMED_STREAMS`] malformed streams (the streams in flight end with it), or when
    /// its HTTP/2 preface does not arrive within the header timeout. A connection with no
    /// stream in flight and none started or finished for between [`KEEPALIVE`] and twice that
    /// is told to go away (GOAWAY), and closed if it is still idle [`GOAWAY_GRACE`] later. On
    /// shutdown (and from the start of SIGTERM's drain delay, at its next stream) it says
    /// GOAWAY, and ends once the streams it accepted are answered, or once no stream has
    /// started or finished for [`KEEPALIVE`].
    async fn serve_h2(self: &Arc<Self>, stream: Stream, shutdown: &ShutdownWatch) {
        let client: Option<Arc<str>> = stream
            .get_socket_digest()
            .and_then(|d| d.peer_addr().and_then(|a| a.as_inet()).map(|a| a.ip()))
            .map(|ip| Arc::from(ip.to_string()));
        let tls = stream.get_ssl_digest().is_some();
        let digest = Arc::new(Digest {
            ssl_digest: stream.get_ssl_digest(),
            timing_digest: stream.get_timing_digest(),
            proxy_digest: stream.get_proxy_digest(),
            socket_digest: stream.get_socket_digest(),
        });
        let handshake = v2::server::handshake(stream, self.pingora.h2_options());
        let mut conn = match tokio::time::timeout(self.header_timeout, handshake).await {
            Ok(Ok(conn)) => conn,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "HTTP/2 handshake failed");
                return;
            }
            Err(_) => {
                tracing::debug!("no HTTP/2 preface within the header timeout");
                return;
            }
        };
        let mut streams: FuturesUnordered<Pin<Box<dyn Future<Output = ()> + Send + '_>>> =
            FuturesUnordered::new();
        let mut watch = shutdown.clone();
        // One future for the whole connection (not one per turn of the loop); polled until it
        // is ready, once.
        let mut shutting_down = std::pin::pin!(watch.changed());
        let mut going_away = false;
        let mut malformed = 0;
        // Checked every KEEPALIVE (GOAWAY_GRACE after an idle GOAWAY): the connection is idle
        // when no stream started or finished since the last check and none is in flight.
        let idle_check = tokio::time::sleep(KEEPALIVE);
        tokio::pin!(idle_check);
        let mut active_since_check = false;
        loop {
            if !going_away && self.fast.draining() {
                conn.graceful_shutdown();
                going_away = true;
            }
            let accepted = tokio::select! {
                biased;
                _ = &mut shutting_down, if !going_away => {
                    conn.graceful_shutdown();
                    going_away = true;
                    continue;
                }
                Some(()) = streams.next(), if !streams.is_empty() => {
                    active_since_check = true;
                    continue;
                }
                accepted = v2::server::HttpSession::from_h2_conn(&mut conn, digest.clone()) => accepted,
                () = &mut idle_check => {
                    let idle = !active_since_check && streams.is_empty();
                    active_since_check = false;
                    if idle && going_away {
                        break;
                    }
                    let next = if idle {
                        // Told first, so that a request crossing the close is known unserved.
                        conn.graceful_shutdown();
                        going_away = true;
                        GOAWAY_GRACE
                    } else {
                        KEEPALIVE
                    };
                    idle_check.as_mut().reset(Instant::now() + next);
                    continue;
                }
            };
            let session = match accepted {
                Ok(Some(H2Accept::Session(session))) => session,
                Ok(Some(H2Accept::Rejected)) => {
                    malformed += 1;
                    if malformed >= MAX_MALFORMED_STREAMS {
                        break;
                    }
                    continue;
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!(error = %e, "HTTP/2 connection ended");
                    break;
                }
            };
            active_since_check = true;
            let planned = if self.fast_path {
                self.fast.accept_h2(&session, client.as_deref(), tls)
            } else {
                None
            };
            match planned {
                Some((plan, buffers)) => {
                    streams.push(Box::pin(self.fast.serve_h2(session, plan, buffers)));
                }
                None => {
                    let session = ServerSession::new_http2(session);
                    streams.push(Box::pin(async move {
                        self.pingora.process_new_http(session, shutdown).await;
                    }));
                }
            }
        }
        // The connection is over (or given up): closed now, so that what its streams still
        // wait for ends with an error each, which their access-log lines say.
        drop(conn);
        while streams.next().await.is_some() {}
    }
}

#[async_trait]
impl ServerApp for EdgeApp {
    async fn process_new(
        self: &Arc<Self>,
        stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        // Counted in `EdgeClosing` from accept on (`service::Accepted`).
        let stream = self.handshake(stream, shutdown).await?;
        if stream.selected_alpn_proto() == Some(ALPN::H2) {
            self.serve_h2(stream, shutdown).await;
            return None;
        }
        let mut conn = Downstream::new(stream);
        let limit = self
            .pingora
            .server_options()
            .and_then(|o| o.keepalive_request_limit);
        let mut served: u32 = 0;
        let mut deadline = Some(Instant::now() + self.header_timeout);
        let mut shutdown_watch = shutdown.clone();
        let mut drain = false;
        loop {
            let head = read_head(
                &mut conn,
                deadline,
                self.header_timeout,
                self.max_head,
                &mut shutdown_watch,
                &self.fast,
            )
            .await;
            let head_len = match head {
                Head::Complete(n) => n,
                Head::Gone | Head::TimedOut => break,
                Head::TooLarge(in_request_line) => {
                    let answer: &[u8] = if in_request_line {
                        b"HTTP/1.1 414 URI Too Long\r\ncontent-type: text/plain\r\ncontent-length: 24\r\nconnection: close\r\n\r\nrequest target too long\n"
                    } else {
                        b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain\r\ncontent-length: 32\r\nconnection: close\r\n\r\nrequest header fields too large\n"
                    };
                    let _ = conn.stream.write_all(answer).await;
                    let _ = conn.stream.flush().await;
                    drain = true;
                    break;
                }
            };
            deadline = None;
            served = served.saturating_add(1);
            // Shutting down (or SIGTERM's drain delay): this response says `Connection: close`.
            let last =
                *shutdown.borrow() || self.fast.draining() || limit.is_some_and(|l| served >= l);
            if self.fast_path {
                if let Some((plan, buffers)) = self.fast.accept(&conn, head_len) {
                    match self
                        .fast
                        .serve(&mut conn, head_len, plan, buffers, last)
                        .await
                    {
                        Served::KeepAlive => continue,
                        Served::Close => break,
                        Served::CloseDraining => {
                            drain = true;
                            break;
                        }
                    }
                }
            }
            let reuses_left = limit.map(|l| l.saturating_sub(served));
            match self
                .through_pingora(conn, head_len, shutdown, reuses_left)
                .await
            {
                Some(c) => conn = c,
                None => return None,
            }
        }
        self.fast.release(conn.held.take());
        close(conn.stream, drain).await;
        None
    }

    async fn cleanup(&self) {
        self.pingora.http_cleanup().await
    }
}

/// Finds the end of an HTTP/1 request header the way HTTP/1 parsers (httparse) read it: empty
/// lines before the request line are skipped; after it, the first empty line (`\n` or `\r\n`
/// right after a `\n`) ends the header.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum HeaderScan {
    /// Nothing but CR and LF so far.
    #[default]
    Leading,
    /// Inside a line.
    InLine,
    /// Just after a `\n`.
    LineStart,
    /// Just after a `\n` then a `\r`.
    LineStartCr,
}

impl HeaderScan {
    /// Feeds `bytes`; `Some(n)`: the header ended with the first `n` of them. Inside a line
    /// only a `\n` matters, so the scan jumps from one to the next (memchr) rather than
    /// stepping through every byte of the head.
    pub fn feed(&mut self, bytes: &[u8]) -> Option<usize> {
        let mut i = 0;
        while i < bytes.len() {
            if *self == HeaderScan::InLine {
                i += memchr::memchr(b'\n', &bytes[i..])? + 1;
                *self = HeaderScan::LineStart;
                continue;
            }
            *self = match self.step(bytes[i]) {
                Some(next) => next,
                None => return Some(i + 1),
            };
            i += 1;
        }
        None
    }

    /// The state after one byte; `None`: that byte ended the header.
    fn step(self, b: u8) -> Option<HeaderScan> {
        Some(match (self, b) {
            (HeaderScan::Leading, b'\r' | b'\n') => HeaderScan::Leading,
            (HeaderScan::Leading, _) => HeaderScan::InLine,
            (HeaderScan::InLine, b'\n') => HeaderScan::LineStart,
            (HeaderScan::InLine, _) => HeaderScan::InLine,
            (HeaderScan::LineStart | HeaderScan::LineStartCr, b'\n') => return None,
            (HeaderScan::LineStart, b'\r') => HeaderScan::LineStartCr,
            (HeaderScan::LineStart | HeaderScan::LineStartCr, _) => HeaderScan::InLine,
        })
    }
}

/// Which bytes after its head belong to a request handed to Pingora.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RequestBytes {
    /// Everything the client sends: an upgrade (the connection may turn into a tunnel), or a
    /// head Pingora refuses and closes the connection after (`CONNECT`, unreadable or
    /// ambiguous framing).
    Unbounded,
    /// This many more bytes: a `Content-Length` body, or none.
    Length(u64),
    /// A chunked body, whose end is found as it passes.
    Chunked(ChunkedScan),
}

impl RequestBytes {
    /// How the body of the request whose head is `head` ends, read as Pingora reads it.
    fn of(head: &[u8]) -> RequestBytes {
        let mut fields = crate::fast_path::field_slots();
        let mut req = httparse::Request::new(&mut []);
        if !matches!(
            req.parse_with_uninit_headers(head, &mut fields),
            Ok(httparse::Status::Complete(_))
        ) || req.method == Some("CONNECT")
        {
            return RequestBytes::Unbounded;
        }
        let mut length = None;
        let mut lengths = 0;
        let mut encodings = 0;
        let mut chunked = false;
        for h in req.headers.iter() {
            if h.name.eq_ignore_ascii_case("upgrade") {
                return RequestBytes::Unbounded;
            } else if h.name.eq_ignore_ascii_case("content-length") {
                lengths += 1;
                length = crate::proxy::parse_content_length(h.value);
            } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                encodings += 1;
                let last = h.value.rsplit(|b| *b == b',').next().unwrap_or_default();
                chunked = last.trim_ascii().eq_ignore_ascii_case(b"chunked");
            }
        }
        match (lengths, encodings, length) {
            (0, 0, _) => RequestBytes::Length(0),
            (1, 0, Some(n)) => RequestBytes::Length(n),
            (0, 1, _) if chunked => RequestBytes::Chunked(ChunkedScan::default()),
            _ => RequestBytes::Unbounded,
        }
    }
}

/// The client connection inside a [`ReplayStream`]. When Pingora ends the connection instead of
/// handing it back (an error answer, `Connection: close`), dropping it closes the way
/// [`close`] does, on a task of its own: what the client sent and nobody read (a body behind an
/// early 502) is read and dropped for a moment, so the close does not reset the connection
/// before the client has read the answer.
#[derive(Debug)]
struct Lingering(Option<Stream>);

impl Lingering {
    /// The connection, handed back for the next request: dropping `self` then does nothing.
    fn take(&mut self) -> Stream {
        self.0
            .take()
            .expect("taken once, when the connection is handed back")
    }
}

impl std::ops::Deref for Lingering {
    type Target = Stream;

    fn deref(&self) -> &Stream {
        self.0.as_ref().expect("present until handed back")
    }
}

impl std::ops::DerefMut for Lingering {
    fn deref_mut(&mut self) -> &mut Stream {
        self.0.as_mut().expect("present until handed back")
    }
}

impl Drop for Lingering {
    fn drop(&mut self) {
        if let (Some(stream), Ok(runtime)) = (self.0.take(), tokio::runtime::Handle::try_current())
        {
            runtime.spawn(close(stream, true));
        }
    }
}

/// A connection handed to Pingora for one request, with the bytes already read from it. Reads
/// return the request's head, then its body, and nothing past the body's end: what follows (a
/// pipelined request) is kept, read ahead up to [`MAX_READ_AHEAD`] while Pingora watches the
/// connection for the client going away, and is the start of the connection's next request.
pub struct ReplayStream {
    inner: Lingering,
    /// Bytes read from the client; `buf[pos..]` are not handed to Pingora yet.
    buf: Vec<u8>,
    pos: usize,
    /// Bytes of the request head not handed out yet.
    head_left: usize,
    /// How the rest of the request ends.
    body: RequestBytes,
}

impl ReplayStream {
    /// How many of the next `available` buffered bytes belong to the request; the caller hands
    /// out exactly that many.
    fn take_request_bytes(&mut self, available: usize) -> usize {
        if self.head_left > 0 {
            let n = available.min(self.head_left);
            self.head_left -= n;
            return n;
        }
        match &mut self.body {
            RequestBytes::Unbounded => available,
            RequestBytes::Length(left) => {
                let n = available.min(usize::try_from(*left).unwrap_or(usize::MAX));
                *left -= n as u64;
                n
            }
            RequestBytes::Chunked(scan) => {
                match scan.feed(&self.buf[self.pos..self.pos + available]) {
                    Ok((n, done)) => {
                        if done {
                            self.body = RequestBytes::Length(0);
                        }
                        n
                    }
                    // Not chunked framing Pingora can read either: it answers 400 and closes.
                    Err(_) => {
                        self.body = RequestBytes::Unbounded;
                        available
                    }
                }
            }
        }
    }

    /// Whether every byte of the request was handed out.
    fn request_read(&self) -> bool {
        self.head_left == 0 && self.body == RequestBytes::Length(0)
    }
}

/// Bytes read from a client at a time on Pingora's path.
const REPLAY_READ: usize = 16 * 1024;

impl AsyncRead for ReplayStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        if out.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        loop {
            let buffered = this.buf.len() - this.pos;
            if buffered > 0 {
                let n = this.take_request_bytes(buffered.min(out.remaining()));
                if n > 0 {
                    out.put_slice(&this.buf[this.pos..this.pos + n]);
                    this.pos += n;
                    if this.pos == this.buf.len() {
                        this.buf.clear();
                        this.pos = 0;
                    }
                    return Poll::Ready(Ok(()));
                }
            }
            // The request is read and the client sent enough of the next one: leave it unread
            // (TCP pushes back) until the response is out.
            if this.request_read() && buffered >= MAX_READ_AHEAD {
                return Poll::Pending;
            }
            let start = this.buf.len();
            this.buf.resize(start + REPLAY_READ, 0);
            let mut read = ReadBuf::new(&mut this.buf[start..]);
            let polled = Pin::new(&mut *this.inner).poll_read(cx, &mut read);
            let n = read.filled().len();
            this.buf.truncate(start + n);
            match polled {
                // The end of the stream, in the request or between requests.
                Poll::Ready(Ok(())) if n == 0 => return Poll::Ready(Ok(())),
                Poll::Ready(Ok(())) => {}
                other => return other,
            }
        }
    }
}

impl AsyncWrite for ReplayStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut *self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut *self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[async_trait]
impl Shutdown for ReplayStream {
    async fn shutdown(&mut self) {
        Shutdown::shutdown(&mut **self.inner).await
    }
}

impl UniqueID for ReplayStream {
    fn id(&self) -> UniqueIDType {
        self.inner.id()
    }
}

impl Ssl for ReplayStream {
    fn get_ssl(&self) -> Option<&pingora::protocols::tls::TlsRef> {
        self.inner.get_ssl()
    }

    fn get_ssl_digest(&self) -> Option<Arc<pingora::protocols::tls::SslDigest>> {
        self.inner.get_ssl_digest()
    }

    fn selected_alpn_proto(&self) -> Option<ALPN> {
        self.inner.selected_alpn_proto()
    }
}

impl GetTimingDigest for ReplayStream {
    fn get_timing_digest(&self) -> Vec<Option<pingora::protocols::TimingDigest>> {
        self.inner.get_timing_digest()
    }

    fn get_read_pending_time(&self) -> Duration {
        self.inner.get_read_pending_time()
    }

    fn get_write_pending_time(&self) -> Duration {
        self.inner.get_write_pending_time()
    }
}

impl GetProxyDigest for ReplayStream {
    fn get_proxy_digest(&self) -> Option<Arc<pingora::protocols::raw_connect::ProxyDigest>> {
        self.inner.get_proxy_digest()
    }

    fn set_proxy_digest(&mut self, digest: pingora::protocols::raw_connect::ProxyDigest) {
        self.inner.set_proxy_digest(digest)
    }
}

impl GetSocketDigest for ReplayStream {
    fn get_socket_digest(&self) -> Option<Arc<pingora::protocols::SocketDigest>> {
        self.inner.get_socket_digest()
    }

    fn set_socket_digest(&mut self, digest: pingora::protocols::SocketDigest) {
        self.inner.set_socket_digest(digest)
    }
}

#[async_trait]
impl Peek for ReplayStream {
    async fn try_peek(&mut self, buf: &mut [u8]) -> std::io::Result<bool> {
        self.inner.try_peek(buf).await
    }
}

impl fmt::Debug for ReplayStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReplayStream")
            .field("inner", &self.inner)
            .field("handed_out", &self.pos)
            .field("buffered", &self.buf.len())
            .field("head_left", &self.head_left)
            .field("body", &self.body)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use proptest::strategy::Just;

    use super::HeaderScan;

    fn ends(chunks: &[&[u8]]) -> bool {
        let mut scan = HeaderScan::default();
        chunks.iter().any(|c| scan.feed(c).is_some())
    }

    #[test]
    fn the_end_is_where_the_blank_line_ends() {
        let mut scan = HeaderScan::default();
        assert_eq!(scan.feed(b"GET / HTTP/1.1\r\nHost: a\r\n\r\nGET"), Some(27));
        let mut scan = HeaderScan::default();
        assert_eq!(scan.feed(b"\r\nGET / HTTP/1.1\nHost: a\n"), None);
        assert_eq!(scan.feed(b"\nrest"), Some(1));
    }

    #[test]
    fn the_blank_line_is_found_across_reads() {
        assert!(!ends(&[b"GET / HTTP/1.1\r\nHost: a\r", b"\n", b"\r"]));
        assert!(ends(&[b"GET / HTTP/1.1\r\nHost: a\r", b"\n", b"\r", b"\n"]));
    }

    #[test]
    fn every_line_ending_httparse_accepts_ends_a_header() {
        assert!(ends(&[b"GET / HTTP/1.1\nHost: a\n\n"]));
        assert!(ends(&[b"GET / HTTP/1.1\r\nHost: a\n\r\n"]));
        assert!(ends(&[b"GET / HTTP/1.1\nHost: a\r\n\n"]));
    }

    #[test]
    fn leading_empty_lines_do_not_end_a_header() {
        assert!(!ends(&[b"\r\n\r\n\n\n"]));
        assert!(!ends(&[b"\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n"]));
        assert!(ends(&[b"\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n"]));
    }

    #[test]
    fn a_single_line_end_does_not() {
        assert!(!ends(&[b"GET / HTTP/1.1\r\nHost: a\r\nX: \r\n"]));
        assert!(!ends(&[b"GET / HTTP/1.1\r\nX: a\rb\r\n"]));
    }

    /// The scan one byte at a time: what `feed` must agree with, wherever reads split a head.
    fn byte_by_byte(bytes: &[u8]) -> Option<usize> {
        let mut scan = HeaderScan::default();
        for (i, &b) in bytes.iter().enumerate() {
            scan = match scan.step(b) {
                Some(next) => next,
                None => return Some(i + 1),
            };
        }
        None
    }

    proptest::proptest! {
        #[test]
        fn feeding_in_pieces_finds_the_end_a_byte_at_a_time_finds(
            // Mostly the bytes that matter, so that heads end in every way they can.
            bytes in proptest::collection::vec(
                proptest::prop_oneof![Just(b'\r'), Just(b'\n'), Just(b'a'), Just(b':'), proptest::num::u8::ANY],
                0..64,
            ),
            cuts in proptest::collection::vec(0usize..64, 0..4),
        ) {
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(bytes.len())).collect();
            cuts.push(bytes.len());
            cuts.sort_unstable();
            let mut scan = HeaderScan::default();
            let mut from = 0;
            let mut found = None;
            for cut in cuts {
                if let Some(n) = scan.feed(&bytes[from..cut]) {
                    found = Some(from + n);
                    break;
                }
                from = cut;
            }
            proptest::prop_assert_eq!(found, byte_by_byte(&bytes));
        }
    }
}
