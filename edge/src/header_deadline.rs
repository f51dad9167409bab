//! A deadline for a whole HTTP/1 request header, against slowloris clients.
//!
//! Pingora times out each read of a request header on its own (60 s), so a client sending one
//! byte every few seconds holds a connection for as long as it likes. [`HeaderDeadline`] wraps
//! the proxy application and its connections: from the moment a connection is accepted (or, on a
//! reused keep-alive connection, from the first byte of the next request) the whole header must
//! arrive within the timeout, otherwise reads fail with `TimedOut` and Pingora closes the
//! connection. Once the blank line ending the header has been read, reads pass through untouched
//! until the connection is handed back for its next request. HTTP/2 connections (negotiated by
//! ALPN) are not wrapped: their framing has its own limits.

use std::fmt;
use std::future::Future as _;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use pingora::apps::ServerApp;
use pingora::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, Ssl, Stream, UniqueID,
    UniqueIDType, ALPN,
};
use pingora::server::ShutdownWatch;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// Wraps a Pingora application so that every HTTP/1 request header must arrive within a
/// deadline.
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

#[async_trait]
impl<A: ServerApp + Send + Sync + 'static> ServerApp for HeaderDeadline<A> {
    async fn process_new(
        self: &Arc<Self>,
        stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        let stream: Stream = if (*stream).as_any().is::<DeadlineStream>() {
            // A keep-alive connection coming back for its next request.
            let mut s = stream
                .into_any()
                .downcast::<DeadlineStream>()
                .expect("checked type");
            s.rearm();
            s
        } else if stream.selected_alpn_proto() == Some(ALPN::H2) {
            stream
        } else {
            Box::new(DeadlineStream::new(stream, self.timeout))
        };
        self.inner.process_new(stream, shutdown).await
    }

    async fn cleanup(&self) {
        self.inner.cleanup().await
    }
}

enum Phase {
    /// Reading a header: `deadline` is set once the clock runs (at accept, or at the first
    /// byte on a reused connection); `tail` holds the last bytes seen, to find the blank line.
    Header {
        deadline: Option<Pin<Box<Sleep>>>,
        tail: u32,
    },
    /// The header is complete: reads pass through.
    Body,
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
                tail: 0,
            },
        }
    }

    /// Starts waiting for the next request's header; the clock starts at its first byte.
    fn rearm(&mut self) {
        self.phase = Phase::Header {
            deadline: None,
            tail: 0,
        };
    }
}

/// Feeds `bytes` into the rolling `tail`; returns whether a header-ending blank line
/// (`\r\n\r\n`, or `\n\n` as HTTP/1 parsers accept) was completed.
fn header_ends(tail: &mut u32, bytes: &[u8]) -> bool {
    for &b in bytes {
        *tail = (*tail << 8) | u32::from(b);
        if *tail == u32::from_be_bytes(*b"\r\n\r\n") || *tail & 0xffff == 0x0a0a {
            return true;
        }
    }
    false
}

impl AsyncRead for DeadlineStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        let Phase::Header { deadline, tail } = &mut this.phase else {
            return Pin::new(&mut this.inner).poll_read(cx, buf);
        };
        let before = buf.filled().len();
        let result = Pin::new(&mut this.inner).poll_read(cx, buf);
        let new = &buf.filled()[before..];
        if !new.is_empty() {
            if header_ends(tail, new) {
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
    use super::header_ends;

    #[test]
    fn the_blank_line_is_found_across_reads() {
        let mut tail = 0;
        assert!(!header_ends(&mut tail, b"GET / HTTP/1.1\r\nHost: a\r"));
        assert!(!header_ends(&mut tail, b"\n"));
        assert!(!header_ends(&mut tail, b"\r"));
        assert!(header_ends(&mut tail, b"\n"));
    }

    #[test]
    fn bare_line_feeds_end_a_header_too() {
        let mut tail = 0;
        assert!(header_ends(&mut tail, b"GET / HTTP/1.1\nHost: a\n\n"));
    }

    #[test]
    fn a_single_line_end_does_not() {
        let mut tail = 0;
        assert!(!header_ends(
            &mut tail,
            b"GET / HTTP/1.1\r\nHost: a\r\nX: \r\n"
        ));
        let mut tail = 0;
        assert!(!header_ends(&mut tail, b"\r\n\r"));
    }
}
