//! A deadline for a whole HTTP/1 request header, against slowloris clients.
//!
//! Pingora times out each read of a request header on its own (60 s), so a client sending one
//! byte every few seconds holds a connection for as long as it likes. [`HeaderDeadline`] wraps
//! the proxy application and its connections: from the moment a connection is accepted (or, on a
//! reused keep-alive connection, from the first byte of the next request) the whole header must
//! arrive within the timeout, otherwise reads fail with `TimedOut` and Pingora closes the
//! connection. Once the blank line ending the header has been read, reads pass through untouched
//! until the next request on the connection. On TLS the clock starts after the handshake, which
//! Pingora bounds on its own. HTTP/2 connections (negotiated by ALPN) are not wrapped: their
//! framing has its own limits.

use std::fmt;
use std::future::Future as _;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use pingora::apps::{HttpServerApp, ServerApp};
use pingora::protocols::http::ServerSession;
use pingora::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, Ssl, Stream, UniqueID,
    UniqueIDType, ALPN,
};
use pingora::server::ShutdownWatch;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// Wraps a Pingora HTTP application so that every HTTP/1 request header must arrive within a
/// deadline. It runs the HTTP/1 keep-alive loop itself (as Pingora's own `ServerApp` does) so
/// the deadline is armed again before every request; HTTP/2 goes to the application unchanged.
pub struct HeaderDeadline<A> {
    inner: Arc<A>,
    timeout: Duration,
}

impl<A> HeaderDeadline<A> {
    /// `inner` gets its connections wrapped; a header that takes longer than `timeout` ends
    /// the connection.
    pub fn new(inner: A, timeout: Duration) -> HeaderDeadline<A> {
        HeaderDeadline {
            inner: Arc::new(inner),
            timeout,
        }
    }
}

/// Idle time allowed between two requests on a kept-alive connection (Pingora's default).
const KEEPALIVE_SECONDS: u64 = 60;

#[async_trait]
impl<A: HttpServerApp + Send + Sync + 'static> ServerApp for HeaderDeadline<A> {
    async fn process_new(
        self: &Arc<Self>,
        stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        if stream.selected_alpn_proto() == Some(ALPN::H2) {
            return ServerApp::process_new(&self.inner, stream, shutdown).await;
        }
        let mut session =
            ServerSession::new_http1(Box::new(DeadlineStream::new(stream, self.timeout)));
        // As Pingora does: no reuse once the service is shutting down.
        session.set_keepalive((!*shutdown.borrow()).then_some(KEEPALIVE_SECONDS));
        session.set_keepalive_reuses_remaining(
            self.inner
                .server_options()
                .and_then(|o| o.keepalive_request_limit),
        );
        let mut result = self.inner.process_new_http(session, shutdown).await;
        while let Some((stream, persistent)) = result.map(|r| r.consume()) {
            let stream: Stream = if (*stream).as_any().is::<DeadlineStream>() {
                let mut s = stream
                    .into_any()
                    .downcast::<DeadlineStream>()
                    .expect("checked type");
                s.rearm();
                s
            } else {
                stream
            };
            let mut session = ServerSession::new_http1(stream);
            if let Some(p) = persistent {
                p.apply_to_session(&mut session);
            }
            result = self.inner.process_new_http(session, shutdown).await;
        }
        None
    }

    async fn cleanup(&self) {
        self.inner.http_cleanup().await
    }
}

enum Phase {
    /// Reading a header: `deadline` is set once the clock runs (at accept, or at the first
    /// byte on a reused connection); `scan` finds where the header ends.
    Header {
        deadline: Option<Pin<Box<Sleep>>>,
        scan: HeaderScan,
    },
    /// The header is complete: reads pass through.
    Body,
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
    /// Feeds `bytes`; returns whether the header ended within them.
    pub fn feed(&mut self, bytes: &[u8]) -> bool {
        for &b in bytes {
            *self = match (*self, b) {
                (HeaderScan::Leading, b'\r' | b'\n') => HeaderScan::Leading,
                (HeaderScan::Leading, _) => HeaderScan::InLine,
                (HeaderScan::InLine, b'\n') => HeaderScan::LineStart,
                (HeaderScan::InLine, _) => HeaderScan::InLine,
                (HeaderScan::LineStart | HeaderScan::LineStartCr, b'\n') => return true,
                (HeaderScan::LineStart, b'\r') => HeaderScan::LineStartCr,
                (HeaderScan::LineStart | HeaderScan::LineStartCr, _) => HeaderScan::InLine,
            };
        }
        false
    }
}

/// A connection whose request header must complete by a deadline.
pub struct DeadlineStream {
    inner: Stream,
    timeout: Duration,
    phase: Phase,
}

impl DeadlineStream {
    fn new(inner: Stream, timeout: Duration) -> DeadlineStream {
        DeadlineStream {
            inner,
            timeout,
            phase: Phase::Header {
                deadline: Some(Box::pin(tokio::time::sleep(timeout))),
                scan: HeaderScan::default(),
            },
        }
    }

    /// Starts waiting for the next request's header; the clock starts at its first byte.
    fn rearm(&mut self) {
        self.phase = Phase::Header {
            deadline: None,
            scan: HeaderScan::default(),
        };
    }
}

impl AsyncRead for DeadlineStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        let Phase::Header { deadline, scan } = &mut this.phase else {
            return Pin::new(&mut this.inner).poll_read(cx, buf);
        };
        let before = buf.filled().len();
        let result = Pin::new(&mut this.inner).poll_read(cx, buf);
        let new = &buf.filled()[before..];
        if !new.is_empty() {
            if scan.feed(new) {
                this.phase = Phase::Body;
                return result;
            }
            if deadline.is_none() {
                *deadline = Some(Box::pin(tokio::time::sleep(this.timeout)));
            }
        }
        if let Some(d) = deadline.as_mut() {
            if d.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("request header not complete within {:?}", this.timeout),
                )));
            }
        }
        result
    }
}

impl AsyncWrite for DeadlineStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[async_trait]
impl Shutdown for DeadlineStream {
    async fn shutdown(&mut self) {
        self.inner.shutdown().await
    }
}

impl UniqueID for DeadlineStream {
    fn id(&self) -> UniqueIDType {
        self.inner.id()
    }
}

impl Ssl for DeadlineStream {
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

impl GetTimingDigest for DeadlineStream {
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

impl GetProxyDigest for DeadlineStream {
    fn get_proxy_digest(&self) -> Option<Arc<pingora::protocols::raw_connect::ProxyDigest>> {
        self.inner.get_proxy_digest()
    }

    fn set_proxy_digest(&mut self, digest: pingora::protocols::raw_connect::ProxyDigest) {
        self.inner.set_proxy_digest(digest)
    }
}

impl GetSocketDigest for DeadlineStream {
    fn get_socket_digest(&self) -> Option<Arc<pingora::protocols::SocketDigest>> {
        self.inner.get_socket_digest()
    }

    fn set_socket_digest(&mut self, digest: pingora::protocols::SocketDigest) {
        self.inner.set_socket_digest(digest)
    }
}

#[async_trait]
impl Peek for DeadlineStream {
    async fn try_peek(&mut self, buf: &mut [u8]) -> std::io::Result<bool> {
        self.inner.try_peek(buf).await
    }
}

impl fmt::Debug for DeadlineStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeadlineStream")
            .field("inner", &self.inner)
            .field("timeout", &self.timeout)
            .field("in_header", &matches!(self.phase, Phase::Header { .. }))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::HeaderScan;

    fn ends(chunks: &[&[u8]]) -> bool {
        let mut scan = HeaderScan::default();
        chunks.iter().any(|c| scan.feed(c))
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
}
