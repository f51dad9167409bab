//! The edge's fast path: plain HTTP/1 requests proxied without Pingora's per-request
//! machinery.
//!
//! Most requests a Machine serves are the same shape: HTTP/1.1 (or HTTP/1.0), an origin-form
//! target, one `Host` that names a route, no body or a short one with a `Content-Length`. For
//! those (and for chunked or longer bodies, which are streamed: see below) the
//! connection loop ([`crate::connection`]) calls [`FastPath::serve`]: the request head is read
//! once into the connection's buffer, rewritten for the upstream in one pass (hop-by-hop fields
//! out, fields named with `_` out unless configured, `Content-Length` as plain decimal,
//! forwarding fields in), written with its body in one write on a pooled upstream connection,
//! and the response head is passed back unchanged when it carries no hop-by-hop field and ends
//! its lines with CRLF, with the first body bytes in the same write. An HTTP/1.0 client keeps
//! its connection when it asks (`Connection: keep-alive`, said back in the answer), gets no
//! interim responses, and a chunked body unframed, its connection ending with it. For
//! `Expect: 100-continue` the edge answers `100 Continue` itself when the body is not in yet,
//! and the upstream gets the request without the expectation. A chunked body (HTTP/1.1, one
//! `Transfer-Encoding: chunked`, no `Content-Length`) or one over 64 KiB is sent on as it
//! arrives, a chunked one framed anew (one chunk per run of data, no extensions or trailers, so
//! the upstream reads no framing the edge did not check; broken framing is answered 400); an
//! upstream that answers before the body is whole is heard, and the client's connection ends
//! after that answer; such a request is never sent twice. Everything else (upgrades, other
//! expectations, other transfer codings, absolute-form or other targets that are
//! not a path, more than one `Content-Length` or a list, machine paths, redirects, unknown
//! hosts, anything over a limit) goes to Pingora's proxy, which answers it as documented. The
//! `fast_path` setting sends every request there.
//!
//! Streams of HTTP/2 connections have their own side of the fast path, on the same upstream
//! pool: [`crate::h2_path`].
//!
//! The decisions are pure functions over parsed heads ([`plan`], [`write_upstream_head`],
//! [`response_plan`], [`ChunkedScan`]), tested without sockets; [`FastPath::serve`] is the IO.

use std::collections::HashMap;
use std::io;
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use pingora::protocols::Stream;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::proxy::{
    parse_content_length, push_decimal, write_forwarding, Attempts, EdgeLimits, EdgeProxy, Finished,
};

/// The longest request body the fast path reads whole before sending; longer ones are
/// streamed ([`Plan::streamed`]).
pub(crate) const MAX_FAST_BODY: u64 = 64 * 1024;
/// Header slots for parsing a head; a head with more fields goes to Pingora (requests) or is
/// refused with 502 (responses).
pub(crate) const MAX_FIELDS: usize = 128;
/// The longest response head accepted from an upstream.
pub(crate) const MAX_RESPONSE_HEAD: usize = 64 * 1024;
/// How long an idle upstream connection is kept for reuse.
const UPSTREAM_IDLE: Duration = Duration::from_secs(30);
/// Idle upstream connections kept per upstream address.
const POOL_PER_UPSTREAM: usize = 256;
/// Time allowed for each read of a request body, each write of a request or a response, and
/// each read of a response; Pingora's default for its reads.
pub(crate) const IO_TIMEOUT: Duration = Duration::from_secs(60);
/// The buffer for response bytes, per request in flight.
const RESPONSE_BUFFER: usize = 32 * 1024;

/// What the fast path needs of a request head: positions in the connection's buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    pub method: Range<usize>,
    /// Path and query.
    pub target: Range<usize>,
    pub host: Range<usize>,
    pub content_length: u64,
    /// The client asked to close the connection after this request (an HTTP/1.0 client does
    /// unless it asked to keep it alive).
    pub close: bool,
    /// An HTTP/1.0 request: its answer says `Connection: keep-alive` while the connection
    /// stays open, comes without interim responses, and a chunked body reaches it unframed,
    /// ending with the connection.
    pub http10: bool,
    /// `Expect: 100-continue`: the edge answers `100 Continue` itself when the body is not
    /// in yet (the upstream gets the request without the field, and the body with it).
    pub expect_continue: bool,
    /// Safe to send again after a connection that was reused turned out dead.
    pub idempotent: bool,
    pub head: bool,
    /// The head's length at the start of the connection's buffer.
    pub head_len: usize,
    /// A chunked body (`Transfer-Encoding: chunked`): streamed, framed anew for the upstream.
    pub chunked: bool,
    /// The most body bytes a chunked body may carry (the edge's `max_body_bytes`).
    pub body_limit: Option<u64>,
    /// Bytes of the path its route strips before it goes upstream ([`Route::strip`]).
    ///
    /// [`Route::strip`]: crate::route_table::Route::strip
    pub strip: usize,
}

impl Plan {
    /// Whether the body is sent to the upstream as it arrives rather than whole: a chunked
    /// one, or one longer than [`MAX_FAST_BODY`].
    pub(crate) fn streamed(&self) -> bool {
        self.chunked || self.content_length > MAX_FAST_BODY
    }
}

/// Bytes of a request target the fast path passes on as they are: RFC 3986's unreserved,
/// sub-delims, `:`, `@`, `/`, `?` and `%`. A target with any other byte (a fragment, quotes,
/// brackets, braces...) goes to Pingora, which validates and normalises it.
const PLAIN_TARGET: [bool; 256] = {
    let mut table = [false; 256];
    let allowed =
        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~!$&'()*+,;=:@/?%";
    let mut i = 0;
    while i < allowed.len() {
        table[allowed[i] as usize] = true;
        i += 1;
    }
    table
};

fn range_in(buf: &[u8], part: &[u8]) -> Range<usize> {
    let start = part.as_ptr() as usize - buf.as_ptr() as usize;
    start..start + part.len()
}

pub(crate) fn is(name: &str, lowercase: &str) -> bool {
    name.len() == lowercase.len() && name.eq_ignore_ascii_case(lowercase)
}

/// Whether every comma-separated token of a `Connection` value is `close` or `keep-alive`;
/// then whether one of them is `close`, and whether one is `keep-alive`.
fn connection_tokens(value: &[u8]) -> Option<(bool, bool)> {
    let (mut close, mut keep_alive) = (false, false);
    for token in value.split(|b| *b == b',') {
        let token = token.trim_ascii();
        if token.eq_ignore_ascii_case(b"close") {
            close = true;
        } else if token.eq_ignore_ascii_case(b"keep-alive") {
            keep_alive = true;
        } else if !token.is_empty() {
            return None;
        }
    }
    Some((close, keep_alive))
}

/// Whether a request target is one the fast paths pass on as it is: a path of plain bytes
/// ([`PLAIN_TARGET`]) within the limit, and none the edge answers itself (machine paths, ACME
/// challenges).
pub(crate) fn plain_target(target: &[u8], limits: &EdgeLimits) -> bool {
    target.first() == Some(&b'/')
        && target.iter().all(|b| PLAIN_TARGET[*b as usize])
        && target.len() <= limits.max_uri_bytes
        && !target.starts_with(b"/.ployz/")
        && !target.starts_with(b"/.well-known/acme-challenge/")
}

/// Decides whether a parsed request head (from `buf`) takes the fast path. `None` hands it to
/// Pingora. The route itself is checked by the caller.
pub(crate) fn plan(
    buf: &[u8],
    req: &httparse::Request<'_, '_>,
    limits: &EdgeLimits,
) -> Option<Plan> {
    let http10 = match req.version {
        Some(1) => false,
        Some(0) => true,
        _ => return None,
    };
    let method = req.method?;
    let target = req.path?;
    if method == "CONNECT" || !plain_target(target.as_bytes(), limits) {
        return None;
    }
    let mut host: Option<&[u8]> = None;
    let mut length: Option<u64> = None;
    let (mut close, mut keep_alive, mut expect_continue) = (false, false, false);
    let mut chunked = false;
    let mut header_bytes = 0;
    for h in req.headers.iter() {
        header_bytes += h.name.len() + h.value.len() + 4;
        match h.name.len() {
            4 if is(h.name, "host") => {
                host = match host {
                    None => Some(h.value),
                    Some(_) => return None,
                }
            }
            // A second field, a list or anything but digits goes to Pingora, which refuses it.
            14 if is(h.name, "content-length") => {
                if length.is_some() {
                    return None;
                }
                length = Some(parse_content_length(h.value)?);
            }
            // `chunked` once, from an HTTP/1.1 client; any other coding goes to Pingora, which
            // refuses it.
            17 if is(h.name, "transfer-encoding") => {
                if http10 || chunked || !h.value.trim_ascii().eq_ignore_ascii_case(b"chunked") {
                    return None;
                }
                chunked = true;
            }
            // `100-continue` once, from an HTTP/1.1 client; any other expectation goes to
            // Pingora, which refuses it.
            6 if is(h.name, "expect") => {
                if http10
                    || expect_continue
                    || !h.value.trim_ascii().eq_ignore_ascii_case(b"100-continue")
                {
                    return None;
                }
                expect_continue = true;
            }
            7 if is(h.name, "upgrade") => return None,
            14 if is(h.name, "http2-settings") => return None,
            10 if is(h.name, "connection") => {
                let (c, k) = connection_tokens(h.value)?;
                close |= c;
                keep_alive |= k;
            }
            _ => {}
        }
    }
    // Both framings at once is a smuggling shape: Pingora refuses it.
    if chunked && length.is_some() {
        return None;
    }
    let content_length = length.unwrap_or(0);
    if header_bytes > limits.max_header_bytes
        || limits
            .max_body_bytes
            .is_some_and(|max| content_length > max)
    {
        return None;
    }
    // The Host is checked by the route match (`RouteTable::match_host` takes only a
    // `valid_host`); a Host that matches nothing goes to Pingora, which answers 400 or 404.
    let host = host?;
    Some(Plan {
        method: range_in(buf, method.as_bytes()),
        target: range_in(buf, target.as_bytes()),
        host: range_in(buf, host),
        content_length,
        close: close || (http10 && !keep_alive),
        http10,
        expect_continue,
        // A streamed body is read once: its request cannot be sent again.
        idempotent: matches!(
            method,
            "GET" | "HEAD" | "PUT" | "DELETE" | "OPTIONS" | "TRACE"
        ) && !chunked
            && content_length <= MAX_FAST_BODY,
        head: method == "HEAD",
        head_len: buf.len(),
        chunked,
        body_limit: limits.max_body_bytes,
        strip: 0,
    })
}

/// Request fields never passed on: hop-by-hop ones, and the forwarding ones the edge writes
/// itself.
pub(crate) fn dropped_request_field(name: &str) -> bool {
    match name.len() {
        2 => is(name, "te"),
        6 => is(name, "expect"),
        7 => is(name, "trailer"),
        17 => is(name, "transfer-encoding") || is(name, "x-forwarded-proto"),
        9 => is(name, "forwarded"),
        10 => is(name, "connection") || is(name, "keep-alive"),
        15 => is(name, "x-forwarded-for"),
        16 => is(name, "proxy-connection") || is(name, "x-forwarded-host"),
        18 => is(name, "proxy-authenticate"),
        19 => is(name, "proxy-authorization"),
        _ => false,
    }
}

/// Writes the request head the upstream gets: the request line as received (as HTTP/1.1), the
/// client's fields but the dropped ones (and, unless `forward_underscores`, those whose names
/// hold a `_`), `Content-Length` as plain decimal, then the forwarding fields, which carry every
/// `X-Forwarded-For` line the client sent.
pub(crate) fn write_upstream_head(
    out: &mut Vec<u8>,
    buf: &[u8],
    req: &httparse::Request<'_, '_>,
    plan: &Plan,
    client: Option<&str>,
    proto: &str,
    forward_underscores: bool,
) {
    out.extend_from_slice(&buf[plan.method.clone()]);
    out.push(b' ');
    crate::route_table::write_target(out, &buf[plan.target.clone()], plan.strip);
    out.extend_from_slice(b" HTTP/1.1\r\n");
    for h in req.headers.iter() {
        if dropped_request_field(h.name)
            || (!forward_underscores && h.name.as_bytes().contains(&b'_'))
        {
            continue;
        }
        out.extend_from_slice(h.name.as_bytes());
        out.extend_from_slice(b": ");
        if h.name.len() == 14 && is(h.name, "content-length") {
            push_decimal(out, plan.content_length);
        } else {
            out.extend_from_slice(h.value);
        }
        out.extend_from_slice(b"\r\n");
    }
    if plan.chunked {
        out.extend_from_slice(b"Transfer-Encoding: chunked\r\n");
    }
    write_forwarding(
        out,
        client,
        req.headers
            .iter()
            .filter(|h| h.name.len() == 15 && is(h.name, "x-forwarded-for"))
            .map(|h| h.value),
        &buf[plan.host.clone()],
        proto,
    );
    out.extend_from_slice(b"\r\n");
}

/// Whether a head has a line that ends in a bare LF (httparse accepts them); such a head is
/// written again with CRLF before it reaches the client.
pub(crate) fn has_bare_lf(head: &[u8]) -> bool {
    memchr::memchr_iter(b'\n', head).any(|i| i == 0 || head[i - 1] != b'\r')
}

/// Room for the fields of one head, left uninitialised: httparse writes those it finds (an
/// array of [`MAX_FIELDS`] empty fields would be written in full before every parse).
pub(crate) fn field_slots<'b>() -> [MaybeUninit<httparse::Header<'b>>; MAX_FIELDS] {
    [MaybeUninit::uninit(); MAX_FIELDS]
}

/// Parses a response head as `httparse::Response::parse` does, its fields into `slots`.
pub(crate) fn parse_response<'h, 'b>(
    resp: &mut httparse::Response<'h, 'b>,
    buf: &'b [u8],
    slots: &'h mut [MaybeUninit<httparse::Header<'b>>],
) -> httparse::Result<usize> {
    httparse::ParserConfig::default().parse_response_with_uninit_headers(resp, buf, slots)
}

/// How a response body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    /// No body (HEAD, 1xx, 204, 304).
    Empty,
    Length(u64),
    Chunked,
    /// Until the upstream closes the connection.
    UntilClose,
}

/// What to do with a response head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ResponsePlan {
    pub status: u16,
    pub framing: Framing,
    /// The upstream connection can carry another request after this response.
    pub reusable: bool,
    /// The head must be rewritten (hop-by-hop fields, HTTP/1.0, a length beside chunked).
    pub rewrite: bool,
    /// Whether the head says `Connection: close`.
    pub says_close: bool,
}

/// The field names a response head's `Connection` fields list (RFC 9110 section 7.6.1),
/// gathered once per head so that each of its fields is checked against them alone, not
/// against every field of the head again.
pub(crate) struct ConnectionOptions<'a> {
    names: [&'a [u8]; 8],
    len: usize,
    /// More names than fit: each check reads the head's `Connection` fields again.
    more: Option<&'a [httparse::Header<'a>]>,
}

impl<'a> ConnectionOptions<'a> {
    pub(crate) fn of<'b: 'a>(resp: &'a httparse::Response<'_, 'b>) -> ConnectionOptions<'a> {
        let fields: &'a [httparse::Header<'a>] = resp.headers;
        let mut options = ConnectionOptions {
            names: [&[]; 8],
            len: 0,
            more: None,
        };
        for token in listed_names(fields) {
            if options.len == options.names.len() {
                options.more = Some(fields);
                break;
            }
            options.names[options.len] = token;
            options.len += 1;
        }
        options
    }

    /// Whether a `Connection` field lists `name`.
    fn names(&self, name: &str) -> bool {
        let listed = |token: &[u8]| name.as_bytes().eq_ignore_ascii_case(token);
        match self.more {
            Some(fields) => listed_names(fields).any(listed),
            None => self.names[..self.len].iter().any(|token| listed(token)),
        }
    }
}

/// The names the `Connection` fields among `fields` list, trimmed, empty ones left out.
fn listed_names<'a>(fields: &'a [httparse::Header<'a>]) -> impl Iterator<Item = &'a [u8]> {
    fields
        .iter()
        .filter(|h| is(h.name, "connection"))
        .flat_map(|h| h.value.split(|b| *b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|token| !token.is_empty())
}

/// Response fields never passed on: hop-by-hop ones, and every field the head's `Connection`
/// fields name (`options`).
pub(crate) fn dropped_response_field(name: &str, options: &ConnectionOptions<'_>) -> bool {
    match name.len() {
        10 if is(name, "connection") || is(name, "keep-alive") => true,
        16 if is(name, "proxy-connection") => true,
        // The framing fields stay whatever `Connection` names: without them the body's end
        // would be lost.
        14 | 17 if is(name, "content-length") || is(name, "transfer-encoding") => false,
        _ => options.names(name),
    }
}

/// Reads a parsed response head; `Err` names what makes it unusable (answered with 502).
pub(crate) fn response_plan(
    resp: &httparse::Response<'_, '_>,
    head_request: bool,
) -> Result<ResponsePlan, &'static str> {
    let status = resp
        .code
        .filter(|c| (100..=999).contains(c))
        .ok_or("no valid status code")?;
    let http11 = resp.version == Some(1);
    let mut length: Option<u64> = None;
    let mut chunked = None;
    let mut says_close = !http11;
    let mut rewrite = !http11;
    for h in resp.headers.iter() {
        match h.name.len() {
            14 if is(h.name, "content-length") => {
                let v = std::str::from_utf8(h.value)
                    .ok()
                    .map(str::trim)
                    .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
                    .and_then(|v| v.parse::<u64>().ok())
                    .ok_or("an invalid Content-Length")?;
                if length.replace(v).is_some_and(|prev| prev != v) {
                    return Err("conflicting Content-Length fields");
                }
            }
            17 if is(h.name, "transfer-encoding") => {
                let last = h.value.rsplit(|b| *b == b',').next().unwrap_or_default();
                chunked = Some(last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
            }
            10 if is(h.name, "connection") => {
                // `Connection: keep-alive` is true of the client's connection too while it
                // stays open (a closing one gets its head rewritten); anything else is not.
                for token in h.value.split(|b| *b == b',').map(<[u8]>::trim_ascii) {
                    if token.eq_ignore_ascii_case(b"close") {
                        says_close = true;
                        rewrite = true;
                    } else if !token.eq_ignore_ascii_case(b"keep-alive") {
                        rewrite = true;
                    }
                }
            }
            10 | 16 if is(h.name, "keep-alive") || is(h.name, "proxy-connection") => rewrite = true,
            _ => {}
        }
    }
    let framing = if head_request || (100..200).contains(&status) || status == 204 || status == 304
    {
        Framing::Empty
    } else if let Some(chunked) = chunked {
        // A length beside Transfer-Encoding is dropped (RFC 9112 6.3).
        rewrite |= length.is_some();
        if chunked {
            Framing::Chunked
        } else {
            Framing::UntilClose
        }
    } else if let Some(n) = length {
        Framing::Length(n)
    } else {
        Framing::UntilClose
    };
    Ok(ResponsePlan {
        status,
        framing,
        reusable: http11 && !says_close && framing != Framing::UntilClose,
        rewrite,
        says_close,
    })
}

/// Writes a rewritten response head: HTTP/1.1, hop-by-hop fields out, a Content-Length beside
/// chunked framing out, `Connection: close` when `close`; for an HTTP/1.0 client (`http10`),
/// `Connection: keep-alive` when not `close` and no `Transfer-Encoding` (its body reaches it
/// unframed).
pub(crate) fn write_response_head(
    out: &mut Vec<u8>,
    resp: &httparse::Response<'_, '_>,
    plan: &ResponsePlan,
    close: bool,
    http10: bool,
) {
    out.extend_from_slice(b"HTTP/1.1 ");
    push_decimal(out, u64::from(plan.status));
    out.push(b' ');
    out.extend_from_slice(resp.reason.unwrap_or_default().as_bytes());
    out.extend_from_slice(b"\r\n");
    let drop_length = plan.framing == Framing::Chunked || plan.framing == Framing::UntilClose;
    let options = ConnectionOptions::of(resp);
    for h in resp.headers.iter() {
        if dropped_response_field(h.name, &options)
            || (drop_length && is(h.name, "content-length"))
            || (http10 && is(h.name, "transfer-encoding"))
        {
            continue;
        }
        out.extend_from_slice(h.name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(h.value);
        out.extend_from_slice(b"\r\n");
    }
    if close {
        out.extend_from_slice(b"Connection: close\r\n");
    } else if http10 {
        out.extend_from_slice(b"Connection: keep-alive\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// Finds the end of a chunked body while its bytes pass through unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct ChunkedScan {
    state: ChunkState,
    /// Size of the chunk being read, or bytes of it left.
    size: u64,
    digits: u8,
    /// Every line ends in CRLF, and an extension starts with `;` (request bodies: what the
    /// edge reads as their end, a proxy in front of it must read alike).
    strict: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum ChunkState {
    #[default]
    Size,
    Extension,
    SizeLf,
    Data,
    DataCr,
    DataLf,
    TrailerLineStart,
    TrailerLine,
    /// Whitespace after a chunk size (strict scans).
    SizeWs,
    /// After a trailer line's CR (strict scans).
    TrailerLineLf,
    FinalLf,
    Done,
}

impl ChunkedScan {
    /// A scan that takes only RFC 9112's framing: CRLF line ends, `;` before an extension.
    pub(crate) fn strict() -> ChunkedScan {
        ChunkedScan {
            strict: true,
            ..ChunkedScan::default()
        }
    }

    /// Consumes `input`; returns how many of its bytes belong to the body and whether the body
    /// ended there. `Err`: not a chunked body.
    pub(crate) fn feed(&mut self, input: &[u8]) -> Result<(usize, bool), &'static str> {
        self.feed_with(input, |_| {})
    }

    /// As [`ChunkedScan::feed`], and calls `data` with the range of `input` of each run of
    /// chunk data in it (the body without its framing), in order.
    pub(crate) fn feed_with(
        &mut self,
        input: &[u8],
        mut data: impl FnMut(Range<usize>),
    ) -> Result<(usize, bool), &'static str> {
        let mut i = 0;
        while i < input.len() {
            if self.state == ChunkState::Data {
                let take = (input.len() - i).min(self.size.try_into().unwrap_or(usize::MAX));
                data(i..i + take);
                i += take;
                self.size -= take as u64;
                if self.size == 0 {
                    self.state = ChunkState::DataCr;
                }
                continue;
            }
            let b = input[i];
            i += 1;
            self.state = match (self.state, b) {
                (ChunkState::Size, b) if b.is_ascii_hexdigit() => {
                    if self.digits == 15 {
                        return Err("a chunk size too large");
                    }
                    self.digits += 1;
                    self.size = self.size * 16 + u64::from((b as char).to_digit(16).unwrap_or(0));
                    ChunkState::Size
                }
                (ChunkState::Size, b';') if self.digits > 0 => ChunkState::Extension,
                (ChunkState::Size, b' ' | b'\t') if self.digits > 0 && !self.strict => {
                    ChunkState::Extension
                }
                // Strict: whitespace after the size only before `;` or the line's end.
                (ChunkState::Size | ChunkState::SizeWs, b' ' | b'\t') if self.digits > 0 => {
                    ChunkState::SizeWs
                }
                (ChunkState::SizeWs, b';') => ChunkState::Extension,
                (ChunkState::SizeWs, b'\r') => ChunkState::SizeLf,
                (ChunkState::Size, b'\r') if self.digits > 0 => ChunkState::SizeLf,
                (ChunkState::Extension, b'\r') => ChunkState::SizeLf,
                (ChunkState::Extension, b'\n') if !self.strict => self.size_line_end(),
                (ChunkState::Extension, b) if b != b'\n' => ChunkState::Extension,
                (ChunkState::Size, b'\n') if self.digits > 0 && !self.strict => {
                    self.size_line_end()
                }
                (ChunkState::SizeLf, b'\n') => self.size_line_end(),
                (ChunkState::DataCr, b'\r') => ChunkState::DataLf,
                (ChunkState::DataCr, b'\n') if !self.strict => {
                    self.digits = 0;
                    ChunkState::Size
                }
                (ChunkState::DataLf, b'\n') => {
                    self.digits = 0;
                    ChunkState::Size
                }
                (ChunkState::TrailerLineStart, b'\r') => ChunkState::FinalLf,
                (ChunkState::TrailerLineStart, b'\n') if !self.strict => {
                    self.state = ChunkState::Done;
                    return Ok((i, true));
                }
                (ChunkState::FinalLf, b'\n') => {
                    self.state = ChunkState::Done;
                    return Ok((i, true));
                }
                (ChunkState::TrailerLine, b'\r') if self.strict => ChunkState::TrailerLineLf,
                (ChunkState::TrailerLineLf, b'\n') => ChunkState::TrailerLineStart,
                (ChunkState::TrailerLine, b'\n') if self.strict => {
                    return Err("malformed chunked framing")
                }
                (ChunkState::TrailerLine, b'\n') => ChunkState::TrailerLineStart,
                (ChunkState::TrailerLineStart | ChunkState::TrailerLine, _) => {
                    ChunkState::TrailerLine
                }
                (ChunkState::Done, _) => return Ok((i - 1, true)),
                _ => return Err("malformed chunked framing"),
            };
        }
        Ok((i, self.state == ChunkState::Done))
    }

    fn size_line_end(&mut self) -> ChunkState {
        if self.size == 0 {
            ChunkState::TrailerLineStart
        } else {
            ChunkState::Data
        }
    }
}

/// Idle upstream connections, by upstream address, kept per edge worker: a connection is
/// registered with the event loop of the worker that opened it, so the worker that reuses it
/// is that one (its events are read where it is used). Threads that are not workers share one
/// more pool.
pub(crate) struct UpstreamPool {
    /// The pool of threads that are not workers, then one per worker.
    pools: Box<[Mutex<PoolInner>]>,
}

thread_local! {
    /// 1 + the index of the edge worker running here; 0 on any other thread.
    static WORKER: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Marks the calling thread as edge worker `index`, for the upstream pools.
pub(crate) fn set_worker(index: usize) {
    WORKER.with(|w| w.set(index + 1));
}

impl UpstreamPool {
    /// Pools for `workers` workers and for the threads that are not.
    pub(crate) fn new(workers: usize) -> UpstreamPool {
        UpstreamPool {
            pools: (0..=workers).map(|_| Mutex::default()).collect(),
        }
    }
}

#[derive(Default)]
struct PoolInner {
    /// Keyed by the routes' upstream addresses (never a client's choice): foldhash, not
    /// SipHash, on every request's path.
    idle: HashMap<SocketAddr, Vec<(TcpStream, Instant)>, foldhash::fast::RandomState>,
    swept: Option<Instant>,
}

/// Whether an idle connection can carry a request: no byte and no end of stream waiting on it.
fn alive(stream: &TcpStream) -> bool {
    let mut probe = [0u8; 1];
    matches!(stream.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
}

impl UpstreamPool {
    /// This thread's pool (a worker of another edge, with more workers than this one has
    /// pools, shares one).
    fn mine(&self) -> std::sync::MutexGuard<'_, PoolInner> {
        let pool = &self.pools[WORKER.with(std::cell::Cell::get) % self.pools.len()];
        pool.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn take(&self, addr: SocketAddr) -> Option<TcpStream> {
        let mut inner = self.mine();
        let idle = inner.idle.get_mut(&addr)?;
        while let Some((stream, since)) = idle.pop() {
            if since.elapsed() < UPSTREAM_IDLE && alive(&stream) {
                return Some(stream);
            }
        }
        None
    }

    pub(crate) fn put(&self, addr: SocketAddr, stream: TcpStream) {
        let now = Instant::now();
        let mut inner = self.mine();
        if inner
            .swept
            .is_none_or(|t| now.duration_since(t) > UPSTREAM_IDLE)
        {
            inner.swept = Some(now);
            inner.idle.retain(|_, v| {
                v.retain(|(_, since)| now.duration_since(*since) < UPSTREAM_IDLE);
                !v.is_empty()
            });
        }
        let idle = inner.idle.entry(addr).or_default();
        if idle.len() < POOL_PER_UPSTREAM {
            idle.push((stream, now));
        }
    }

    /// Idle connections kept, over every upstream.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.pools
            .iter()
            .map(|pool| {
                let inner = pool.lock().unwrap_or_else(|e| e.into_inner());
                inner.idle.values().map(Vec::len).sum::<usize>()
            })
            .sum()
    }
}

/// A client connection as the fast path sees it.
pub(crate) struct Downstream {
    pub stream: Stream,
    /// Bytes read from the client and not yet used: the current request's head (and body),
    /// then whatever follows.
    pub buf: Vec<u8>,
    /// The client's IP address, as forwarding fields write it.
    pub client: Option<Box<str>>,
    pub tls: bool,
    /// The upstream connection the last request used, kept for the next one.
    pub held: Option<(SocketAddr, TcpStream)>,
    /// How many bytes `buf` may hold while a request waits for its upstream: the request and
    /// [`MAX_READ_AHEAD`] after it.
    pub read_limit: usize,
}

impl Downstream {
    pub(crate) fn new(stream: Stream) -> Downstream {
        let client = stream
            .get_socket_digest()
            .and_then(|d| {
                d.peer_addr()
                    .and_then(|a| a.as_inet())
                    .map(|a| a.ip().to_string())
            })
            .map(String::into_boxed_str);
        let tls = stream.get_ssl_digest().is_some();
        Downstream {
            stream,
            buf: Vec::with_capacity(4096),
            client,
            tls,
            held: None,
            read_limit: 0,
        }
    }
}

/// Per-request buffers, reused across requests on a worker thread.
#[derive(Default)]
pub(crate) struct Buffers {
    /// The upstream request (head and body), then the rewritten response head.
    pub(crate) out: Vec<u8>,
    /// Response bytes from the upstream.
    pub(crate) resp: Vec<u8>,
}

thread_local! {
    static SPARE: std::cell::RefCell<Vec<Buffers>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Buffers {
    pub(crate) fn take() -> Buffers {
        SPARE
            .with(|s| s.borrow_mut().pop())
            .unwrap_or_else(|| Buffers {
                out: Vec::with_capacity(4096),
                resp: Vec::with_capacity(RESPONSE_BUFFER),
            })
    }

    pub(crate) fn give_back(mut self) {
        if self.out.capacity() > 4 * MAX_FAST_BODY as usize {
            self.out = Vec::with_capacity(4096);
        }
        if self.resp.capacity() > 4 * RESPONSE_BUFFER {
            self.resp = Vec::with_capacity(RESPONSE_BUFFER);
        }
        self.out.clear();
        self.resp.clear();
        SPARE.with(|s| {
            let mut s = s.borrow_mut();
            if s.len() < 64 {
                s.push(self);
            }
        });
    }
}

/// How a request on the fast path ended, for the connection loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Served {
    /// The connection can carry the next request.
    KeepAlive,
    Close,
    /// Closed, reading for a moment what the client still sends (the rest of a body nobody
    /// read), so that the answer is not lost to a reset.
    CloseDraining,
}

/// Why an exchange with an upstream failed.
pub(crate) enum ExchangeError {
    /// Nothing came back: the request may be sent elsewhere if that is safe.
    NoResponse(io::Error),
    /// The response was unusable or broke off after its head was passed on: the client's
    /// connection cannot continue.
    Broken(String),
    /// An unusable response head, nothing sent to the client yet: answer 502.
    BadResponse(&'static str),
    /// The request cannot go on (its chunked framing is broken, its body over the limit),
    /// nothing sent to the client yet: answer this status.
    Refused(u16, &'static str),
}

/// The fast path of one edge.
pub(crate) struct FastPath {
    pub(crate) edge: EdgeProxy,
    pub(crate) pool: UpstreamPool,
}

impl FastPath {
    /// The fast path of `edge`, served by `workers` edge workers.
    pub(crate) fn new(edge: EdgeProxy, workers: usize) -> FastPath {
        FastPath {
            edge,
            pool: UpstreamPool::new(workers),
        }
    }

    /// Plans `head_len` bytes of request head in `conn.buf`: `Some` when the fast path serves
    /// it (the upstream head is then already in the returned buffers).
    pub(crate) fn accept(&self, conn: &Downstream, head_len: usize) -> Option<(Plan, Buffers)> {
        let mut fields = field_slots();
        let mut req = httparse::Request::new(&mut []);
        let buf = &conn.buf[..head_len];
        match req.parse_with_uninit_headers(buf, &mut fields) {
            Ok(httparse::Status::Complete(n)) if n == head_len => {}
            _ => return None,
        }
        let mut plan = plan(buf, &req, self.edge.limits())?;
        let table = self.edge.routes().table().load();
        let route = table.match_request(&buf[plan.host.clone()], &buf[plan.target.clone()])?;
        plan.strip = route.strip;
        // A gated Service (maintenance, paused) and a route with rules are Pingora's proxy's.
        if route.upstreams.is_empty()
            || route.needs_proxy()
            || (route.https && !conn.tls && self.edge.https_port().is_some())
        {
            return None;
        }
        let mut buffers = Buffers::take();
        write_upstream_head(
            &mut buffers.out,
            buf,
            &req,
            &plan,
            conn.client.as_deref(),
            if conn.tls { "https" } else { "http" },
            self.edge.limits().forward_underscore_headers,
        );
        Some((plan, buffers))
    }

    /// Serves one planned request whose head is the first `head_len` bytes of `conn.buf`, and
    /// consumes it from the buffer.
    pub(crate) async fn serve(
        &self,
        conn: &mut Downstream,
        head_len: usize,
        plan: Plan,
        mut buffers: Buffers,
        close_after: bool,
    ) -> Served {
        let start = Instant::now();
        let streamed = plan.streamed();
        // A streamed body leaves the buffer as it goes upstream: the request is then its head.
        let request_len = if streamed {
            head_len
        } else {
            head_len + plan.content_length as usize
        };
        conn.read_limit = request_len + MAX_READ_AHEAD;
        let body_missing = if plan.chunked {
            !matches!(
                ChunkedScan::strict().feed(&conn.buf[head_len..]),
                Ok((_, true))
            )
        } else {
            ((conn.buf.len() - head_len) as u64) < plan.content_length
        };
        let mut outcome = Served::Close;
        let mut status = 0;
        let mut error = None;
        let mut attempts = Attempts::default();
        let continued = if plan.expect_continue && body_missing {
            write_client(&mut conn.stream, b"HTTP/1.1 100 Continue\r\n\r\n").await
        } else {
            Ok(())
        };
        let read = match continued {
            Ok(()) if streamed => Ok(()),
            Ok(()) => read_body(conn, request_len).await,
            Err(e) => Err(e),
        };
        match read {
            Err(e) => error = Some(format!("reading the request body: {e}")),
            Ok(()) => {
                buffers
                    .out
                    .extend_from_slice(&conn.buf[head_len..request_len]);
                let close = close_after || plan.close;
                match self
                    .forward(conn, &plan, &mut buffers, &mut attempts, close)
                    .await
                {
                    Ok((s, keep)) => {
                        status = s;
                        if keep && !close {
                            outcome = Served::KeepAlive;
                        }
                    }
                    Err((s, e)) => {
                        status = s;
                        error = Some(e);
                    }
                }
            }
        }
        let path_end = conn.buf[plan.target.clone()]
            .iter()
            .position(|b| *b == b'?')
            .map_or(plan.target.end, |i| plan.target.start + i);
        self.edge.finish(
            Finished {
                method: std::str::from_utf8(&conn.buf[plan.method.clone()]).unwrap_or("?"),
                host: &conn.buf[plan.host.clone()],
                path: std::str::from_utf8(&conn.buf[plan.target.start..path_end]).unwrap_or("?"),
                status,
                start,
                error,
            },
            &mut attempts,
        );
        buffers.give_back();
        if outcome == Served::KeepAlive {
            conn.buf.drain(..request_len);
        } else if streamed {
            outcome = Served::CloseDraining;
        }
        outcome
    }

    /// Sends the request in `buffers.out` to an upstream and passes its response to the
    /// client. Ok: the status and whether the client's connection can go on; Err: the status
    /// written (0 if none) and what went wrong.
    async fn forward(
        &self,
        conn: &mut Downstream,
        plan: &Plan,
        buffers: &mut Buffers,
        attempts: &mut Attempts,
        close: bool,
    ) -> Result<(u16, bool), (u16, String)> {
        loop {
            let Some(addr) = self.edge.choose_upstream(
                &conn.buf[plan.host.clone()],
                &conn.buf[plan.target.clone()],
                attempts,
            ) else {
                let status = answer(
                    &mut conn.stream,
                    503,
                    crate::proxy::NO_SERVING_CONTAINER,
                    plan.head,
                )
                .await;
                return Err((status, crate::proxy::NO_SERVING_CONTAINER.trim_end().into()));
            };
            let kept = self.checkout(conn, addr);
            let reused = kept.is_some();
            let mut upstream = match kept {
                Some(s) => s,
                None => match self.connect(conn, addr, attempts, plan.head).await? {
                    Some(s) => s,
                    None => continue,
                },
            };
            let mut registered = self.edge.register_exchange(attempts, upstream.as_raw_fd());
            let mut result = exchange(conn, &mut upstream, plan, buffers, close).await;
            let no_response =
                |r: &Result<_, ExchangeError>| matches!(r, Err(ExchangeError::NoResponse(_)));
            if cut(&registered) && plan.idempotent && no_response(&result) {
                // Its Machine was observed down: another Serving Container.
                continue;
            }
            if !cut(&registered) && reused && plan.idempotent && no_response(&result) {
                // A kept connection the upstream had closed meanwhile: once more on a new one.
                upstream = match self.connect(conn, addr, attempts, plan.head).await? {
                    Some(s) => s,
                    None => continue,
                };
                registered = self.edge.register_exchange(attempts, upstream.as_raw_fd());
                result = exchange(conn, &mut upstream, plan, buffers, close).await;
                if cut(&registered) && no_response(&result) {
                    continue;
                }
            }
            let result = unpooled_if_cut(result, registered);
            return match result {
                Ok(done) => {
                    if done.upstream_reusable {
                        if let Some((old_addr, old)) = conn.held.replace((addr, upstream)) {
                            self.pool.put(old_addr, old);
                        }
                    }
                    Ok((done.status, done.client_continues))
                }
                Err(ExchangeError::NoResponse(e)) => {
                    let status = answer(
                        &mut conn.stream,
                        502,
                        crate::proxy::UPSTREAM_FAILED,
                        plan.head,
                    )
                    .await;
                    Err((status, format!("{addr}: {e}")))
                }
                Err(ExchangeError::BadResponse(why)) => {
                    let status = answer(
                        &mut conn.stream,
                        502,
                        crate::proxy::UPSTREAM_FAILED,
                        plan.head,
                    )
                    .await;
                    Err((status, format!("{addr}: {why}")))
                }
                Err(ExchangeError::Refused(status, why)) => {
                    let status =
                        answer(&mut conn.stream, status, &format!("{why}\n"), plan.head).await;
                    Err((status, why.into()))
                }
                Err(ExchangeError::Broken(why)) => Err((0, format!("{addr}: {why}"))),
            };
        }
    }

    /// A new connection to `addr`. `None`: it failed and the next upstream may be tried;
    /// `Err`: it failed with nothing left to try, and the client was answered 502.
    async fn connect(
        &self,
        conn: &mut Downstream,
        addr: SocketAddr,
        attempts: &Attempts,
        head_request: bool,
    ) -> Result<Option<TcpStream>, (u16, String)> {
        match self.dial(addr, attempts).await {
            Ok(s) => Ok(s),
            Err(e) => {
                let status = answer(
                    &mut conn.stream,
                    502,
                    crate::proxy::UPSTREAM_UNREACHABLE,
                    head_request,
                )
                .await;
                Err((status, format!("connecting to {addr}: {e}")))
            }
        }
    }

    /// A new connection to `addr` for either protocol's path. `None`: it failed and the next
    /// upstream may be tried; `Err`: it failed with nothing left to try.
    pub(crate) async fn dial(
        &self,
        addr: SocketAddr,
        attempts: &Attempts,
    ) -> io::Result<Option<TcpStream>> {
        match connect(addr, self.edge.limits().connect_timeout).await {
            Ok(s) => Ok(Some(s)),
            Err(e) if self.edge.connect_failed(attempts) => {
                tracing::debug!(%addr, error = %e, "connect failed; trying the next upstream");
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// The connection this client used last if it goes to `addr`, else one from the pool.
    fn checkout(&self, conn: &mut Downstream, addr: SocketAddr) -> Option<TcpStream> {
        match conn.held.take() {
            Some((held_addr, s)) if held_addr == addr && alive(&s) => return Some(s),
            // Closed by the upstream meanwhile: dropped.
            Some((held_addr, _)) if held_addr == addr => {}
            Some((held_addr, s)) => self.pool.put(held_addr, s),
            None => {}
        }
        self.pool.take(addr)
    }

    /// Whether SIGTERM arrived: responses then say `Connection: close`.
    pub(crate) fn draining(&self) -> bool {
        self.edge.draining()
    }

    /// Gives a client's kept upstream connection to the pool (the client is gone).
    pub(crate) fn release(&self, held: Option<(SocketAddr, TcpStream)>) {
        if let Some((addr, s)) = held {
            if alive(&s) {
                self.pool.put(addr, s);
            }
        }
    }
}

/// An exchange's result, and the end of its registration: a cut exchange's connection goes
/// nowhere near the pool, whatever came back.
pub(crate) fn unpooled_if_cut(
    result: Result<Exchanged, ExchangeError>,
    registered: Option<crate::exchanges::Registered>,
) -> Result<Exchanged, ExchangeError> {
    match result {
        Ok(done) if cut(&registered) => Ok(Exchanged {
            upstream_reusable: false,
            ..done
        }),
        other => other,
    }
}

/// Whether an exchange was cut because its Machine was observed down.
pub(crate) fn cut(registered: &Option<crate::exchanges::Registered>) -> bool {
    registered
        .as_ref()
        .is_some_and(crate::exchanges::Registered::was_cut)
}

/// A new upstream connection, or `TimedOut` after `timeout`.
async fn connect(addr: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    let stream = tokio::time::timeout(timeout, TcpStream::connect(addr))
        .await
        .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))??;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// Reads until `conn.buf` holds `len` bytes.
async fn read_body(conn: &mut Downstream, len: usize) -> io::Result<()> {
    while conn.buf.len() < len {
        conn.buf.reserve(len - conn.buf.len());
        let n = tokio::time::timeout(IO_TIMEOUT, conn.stream.read_buf(&mut conn.buf))
            .await
            .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))??;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(())
}

/// Reads from an upstream within [`IO_TIMEOUT`].
async fn read_upstream(upstream: &mut TcpStream, buf: &mut Vec<u8>) -> io::Result<usize> {
    if buf.capacity() - buf.len() < 4096 {
        buf.reserve(RESPONSE_BUFFER);
    }
    tokio::time::timeout(IO_TIMEOUT, upstream.read_buf(buf))
        .await
        .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))?
}

/// Writes to the client within [`IO_TIMEOUT`]: a client that stops reading does not hold the
/// request (and its upstream's in-flight count) for ever.
async fn write_client(stream: &mut Stream, bytes: &[u8]) -> io::Result<()> {
    let write = async {
        stream.write_all(bytes).await?;
        stream.flush().await
    };
    tokio::time::timeout(IO_TIMEOUT, write)
        .await
        .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))?
}

/// A short plain-text answer from the edge itself, after which it closes; the status, or 0 if it
/// could not be written. The answer to a HEAD request (`head_request`) gives the body's length
/// and leaves the body out.
async fn answer(stream: &mut Stream, status: u16, body: &str, head_request: bool) -> u16 {
    let reason = match status {
        400 => "Bad Request",
        413 => "Content Too Large",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        _ => "",
    };
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\ncache-control: no-store\r\nconnection: close\r\n\r\n{}",
        body.len(),
        if head_request { "" } else { body }
    );
    match write_client(stream, head.as_bytes()).await {
        Ok(()) => status,
        Err(_) => 0,
    }
}

/// Bytes a client may send ahead (a pipelined request) while its request waits for the
/// upstream; past them the edge stops reading it until the response is out.
pub(crate) const MAX_READ_AHEAD: usize = 64 * 1024;

/// Resolves when the client closes its connection (or it fails) while its request waits for
/// the upstream. What it sends meanwhile, a pipelined request, is kept in `buf` after the
/// current request while `buf` holds less than `limit` bytes; then the client is left unread
/// (TCP pushes back) until the response is out.
async fn client_gone(stream: &mut Stream, buf: &mut Vec<u8>, limit: usize) {
    loop {
        if buf.len() >= limit {
            return std::future::pending().await;
        }
        buf.reserve(4096);
        match stream.read_buf(buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

/// How an exchange with an upstream ended well.
pub(crate) struct Exchanged {
    pub(crate) status: u16,
    /// The upstream connection can carry another request.
    pub(crate) upstream_reusable: bool,
    /// The client's connection can carry another request.
    pub(crate) client_continues: bool,
}

/// One request and its response over `upstream`: the request in `buffers.out` is sent, each
/// interim (1xx) response is passed on as it comes, then the final response's head and body.
async fn exchange(
    conn: &mut Downstream,
    upstream: &mut TcpStream,
    plan: &Plan,
    buffers: &mut Buffers,
    close: bool,
) -> Result<Exchanged, ExchangeError> {
    // A body the upstream answered before it was whole: the rest stays unread, and the
    // client's connection ends with the answer.
    buffers.resp.clear();
    let body_whole = if plan.streamed() {
        // The head goes with the body's first piece.
        stream_body(conn, upstream, plan, &mut buffers.out, &mut buffers.resp).await?
    } else {
        send_request(upstream, &buffers.out).await?;
        true
    };
    let close = close || !body_whole;
    // Once an interim response went to the client, a failing upstream can no longer be
    // answered with 502 or retried.
    let mut interim_sent = false;
    let head = loop {
        let head = read_response_head(
            conn,
            upstream,
            &mut buffers.resp,
            &mut buffers.out,
            plan,
            close,
            interim_sent,
        )
        .await?;
        if !(100..200).contains(&head.plan.status) {
            break head;
        }
        if plan.http10 {
            // An HTTP/1.0 client gets no interim response (RFC 9110 section 15.2).
            buffers.resp.drain(..head.len);
            continue;
        }
        pass_interim(conn, &mut buffers.resp, &buffers.out, &head).await?;
        interim_sent = true;
    };
    let clean = pass_body(
        conn,
        upstream,
        &mut buffers.resp,
        head.len,
        &head.plan,
        head.rewritten,
        plan.http10,
        &mut buffers.out,
    )
    .await?;
    Ok(Exchanged {
        status: head.plan.status,
        upstream_reusable: clean && head.plan.reusable && body_whole,
        client_continues: !head.close_client,
    })
}

/// Sends the upstream request head in `out`, then a streamed request body (chunked, or longer
/// than [`MAX_FAST_BODY`]) as it arrives: each piece read from the client is written on and
/// dropped from the connection's buffer, which keeps the head and, once the body has ended,
/// what follows it. The head goes in one write with the body's first piece, and that first
/// write takes all the client has sent by then (a read that would wait is not waited for), so
/// a body that arrived with its head costs one write. A chunked body is framed anew (one chunk per
/// run of data, no extensions, no trailers), so the upstream never reads framing the edge did
/// not check. `Ok(false)`: the upstream began to answer (or closed) before the body was
/// whole, and the rest is not sent.
async fn stream_body(
    conn: &mut Downstream,
    upstream: &mut TcpStream,
    plan: &Plan,
    out: &mut Vec<u8>,
    resp: &mut Vec<u8>,
) -> Result<bool, ExchangeError> {
    let (mut rd, mut wr) = upstream.split();
    let start = plan.head_len;
    let mut remaining = plan.content_length;
    let mut scan = ChunkedScan::strict();
    let mut runs: Vec<Range<usize>> = Vec::new();
    let mut data: u64 = 0;
    // The head, still to be written with the first piece.
    let mut head = true;
    loop {
        // With the head goes all the client has sent by then, without waiting for more.
        if head && !plan.chunked && ((conn.buf.len() - start) as u64) < remaining {
            read_ready(conn, plan, remaining);
        }
        let (consumed, done) = if plan.chunked {
            runs.clear();
            let (mut n, mut done) = scan_runs(&mut scan, &conn.buf[start..], 0, &mut runs)
                .map_err(|why| ExchangeError::Refused(400, why))?;
            if head && !done && read_ready(conn, plan, remaining) {
                let (more, now_done) = scan_runs(&mut scan, &conn.buf[start..], n, &mut runs)
                    .map_err(|why| ExchangeError::Refused(400, why))?;
                (n, done) = (n + more, now_done);
            }
            if !head {
                out.clear();
            }
            for run in &runs {
                data += run.len() as u64;
                push_hex(out, run.len());
                out.extend_from_slice(b"\r\n");
                out.extend_from_slice(&conn.buf[start + run.start..start + run.end]);
                out.extend_from_slice(b"\r\n");
            }
            if done {
                out.extend_from_slice(b"0\r\n\r\n");
            }
            (n, done)
        } else {
            let n = (conn.buf.len() - start).min(remaining.try_into().unwrap_or(usize::MAX));
            remaining -= n as u64;
            (n, remaining == 0)
        };
        if plan.body_limit.is_some_and(|max| data > max) {
            return Err(ExchangeError::Refused(413, "request body too large"));
        }
        let piece: &[u8] = if plan.chunked {
            out
        } else if head {
            out.extend_from_slice(&conn.buf[start..start + consumed]);
            out
        } else {
            &conn.buf[start..start + consumed]
        };
        head = false;
        // Written while the upstream is watched: one that answers (say, 413) and stops
        // reading is heard instead of waited on. A write cut short by that watch wrote
        // nothing, so the count of bytes written stays true.
        let mut written = 0;
        while written < piece.len() {
            tokio::select! {
                biased;
                answered = upstream_answered(&mut rd, resp) => {
                    if answered.map_err(ExchangeError::NoResponse)? {
                        return Ok(false);
                    }
                }
                n = tokio::time::timeout(IO_TIMEOUT, wr.write(&piece[written..])) => {
                    let n = n
                        .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))
                        .and_then(|r| r)
                        .map_err(ExchangeError::NoResponse)?;
                    if n == 0 {
                        return Err(ExchangeError::NoResponse(io::ErrorKind::WriteZero.into()));
                    }
                    written += n;
                }
            }
        }
        conn.buf.drain(start..start + consumed);
        if done {
            // A connection that streamed one long body does not keep a buffer its size.
            conn.buf.shrink_to(KEPT_BUFFER);
            return Ok(true);
        }
        conn.buf.reserve(read_size(plan, remaining));
        tokio::select! {
            biased;
            answered = upstream_answered(&mut rd, resp) => {
                if answered.map_err(ExchangeError::NoResponse)? {
                    return Ok(false);
                }
            }
            read = tokio::time::timeout(IO_TIMEOUT, conn.stream.read_buf(&mut conn.buf)) => {
                match read {
                    Ok(Ok(0)) => {
                        return Err(ExchangeError::Broken(
                            "the client closed before its body's end".into(),
                        ))
                    }
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => {
                        return Err(ExchangeError::Broken(format!("reading the request body: {e}")))
                    }
                    Err(_) => {
                        return Err(ExchangeError::Broken("reading the request body timed out".into()))
                    }
                }
            }
        }
    }
}

/// The most a streamed body's read takes from the client at once.
const STREAM_READ: usize = 64 * 1024;
/// The room a connection's buffer keeps after a streamed body.
const KEPT_BUFFER: usize = 16 * 1024;

/// How much room the next read of a streamed body gets: what is left of a `Content-Length`
/// body, up to [`STREAM_READ`], or [`STREAM_READ`] for a chunked one.
fn read_size(plan: &Plan, remaining: u64) -> usize {
    if plan.chunked {
        STREAM_READ
    } else {
        usize::try_from(remaining).map_or(STREAM_READ, |r| r.clamp(1, STREAM_READ))
    }
}

/// Scans the chunked body bytes in `body[from..]` (the scan saw `body[..from]` already),
/// adding the runs of data found to `runs` as ranges of `body`. Returns the bytes taken from
/// `from` on (all of them, unless the body ended there) and whether the body ended.
fn scan_runs(
    scan: &mut ChunkedScan,
    body: &[u8],
    from: usize,
    runs: &mut Vec<Range<usize>>,
) -> Result<(usize, bool), &'static str> {
    scan.feed_with(&body[from..], |run| {
        runs.push(run.start + from..run.end + from)
    })
}

/// Takes into `conn.buf` what the client has already sent of a streamed body, without waiting
/// for more: one read, polled once. Whether it took anything.
fn read_ready(conn: &mut Downstream, plan: &Plan, remaining: u64) -> bool {
    conn.buf.reserve(read_size(plan, remaining));
    // A read that would wait is dropped: it took nothing. The end of the connection or a
    // failure is met again by the read that waits.
    matches!(
        conn.stream.read_buf(&mut conn.buf).now_or_never(),
        Some(Ok(n)) if n > 0
    )
}

/// Waits for the upstream to send something while a body is still going to it, reads it into
/// `resp` and drops the interim (1xx) responses in it. `true`: a final response (or the end of
/// the connection) has begun, and stays in `resp` for the exchange; `false`: only interim
/// responses came, and the body goes on.
async fn upstream_answered(
    rd: &mut tokio::net::tcp::ReadHalf<'_>,
    resp: &mut Vec<u8>,
) -> io::Result<bool> {
    loop {
        resp.reserve(4096);
        let n = rd.read_buf(resp).await?;
        if n == 0 {
            return Ok(true);
        }
        loop {
            if resp.is_empty() {
                return Ok(false);
            }
            let mut fields = field_slots();
            let mut parsed = httparse::Response::new(&mut []);
            match parse_response(&mut parsed, resp, &mut fields) {
                Ok(httparse::Status::Complete(len))
                    if parsed
                        .code
                        .is_some_and(|c| (100..200).contains(&c) && c != 101) =>
                {
                    resp.drain(..len);
                }
                Ok(httparse::Status::Partial) if resp.len() <= MAX_RESPONSE_HEAD => break,
                // A final response, or one the exchange will refuse.
                _ => return Ok(true),
            }
        }
    }
}
/// Appends `n` in hexadecimal, as chunk sizes are written.
fn push_hex(out: &mut Vec<u8>, n: usize) {
    let digits = ((usize::BITS - n.leading_zeros()).div_ceil(4) as usize).max(1);
    let mut hex = [0u8; usize::BITS as usize / 4];
    for (i, digit) in hex[..digits].iter_mut().enumerate() {
        *digit = b"0123456789abcdef"[(n >> ((digits - 1 - i) * 4)) & 0xf];
    }
    out.extend_from_slice(&hex[..digits]);
}

/// A response head read from the upstream, and how it goes to the client.
struct PlannedHead {
    /// The head's length at the start of the response buffer.
    len: usize,
    plan: ResponsePlan,
    /// The client's connection ends with this response: the request asked for it, or the body
    /// ends when the upstream closes.
    close_client: bool,
    /// The head goes to the client as rewritten in the out buffer, not as received.
    rewritten: bool,
}

/// Writes the upstream request (head and body) within [`IO_TIMEOUT`]. A failure is
/// [`ExchangeError::NoResponse`]: nothing came back.
pub(crate) async fn send_request(
    upstream: &mut TcpStream,
    request: &[u8],
) -> Result<(), ExchangeError> {
    tokio::time::timeout(IO_TIMEOUT, upstream.write_all(request))
        .await
        .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))
        .and_then(|r| r)
        .map_err(ExchangeError::NoResponse)
}

/// Reads the upstream's next whole response head into `resp` (it is parsed from what is
/// buffered, and read when that is not enough) and plans it; a head the client gets
/// rewritten is written to `out`.
async fn read_response_head(
    conn: &mut Downstream,
    upstream: &mut TcpStream,
    resp: &mut Vec<u8>,
    out: &mut Vec<u8>,
    plan: &Plan,
    close: bool,
    interim_sent: bool,
) -> Result<PlannedHead, ExchangeError> {
    let mut scan = crate::connection::HeaderScan::default();
    let mut scanned = 0;
    loop {
        // Parsed once the blank line is in: an upstream trickling its head costs one scan.
        let complete = scan.feed(&resp[scanned..]).is_some();
        scanned = resp.len();
        if complete {
            return plan_response_head(resp, plan.head, close, plan.http10, out);
        }
        if resp.len() > MAX_RESPONSE_HEAD {
            return Err(ExchangeError::BadResponse("a response head over 64 KiB"));
        }
        read_more_response(conn, upstream, resp, interim_sent).await?;
    }
}

/// Parses the complete response head at the start of `resp` and decides how it reaches the
/// client: as received, or rewritten into `out` (hop-by-hop fields, bare LF line ends, a
/// `Connection: close` the upstream did not say, an HTTP/1.0 client's `Connection` field).
fn plan_response_head(
    resp: &[u8],
    head_request: bool,
    close: bool,
    http10: bool,
    out: &mut Vec<u8>,
) -> Result<PlannedHead, ExchangeError> {
    let mut fields = field_slots();
    let mut parsed = httparse::Response::new(&mut []);
    let len = match parse_response(&mut parsed, resp, &mut fields) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) | Err(_) => {
            return Err(ExchangeError::BadResponse("a malformed response head"))
        }
    };
    let mut plan = response_plan(&parsed, head_request).map_err(ExchangeError::BadResponse)?;
    // Lines ending in a bare LF reach the client with CRLF.
    plan.rewrite |= has_bare_lf(&resp[..len]);
    if plan.status == 101 {
        return Err(ExchangeError::BadResponse("101 without an upgrade request"));
    }
    // A chunked body reaches an HTTP/1.0 client unframed: it ends with the connection.
    let close_client = close
        || plan.framing == Framing::UntilClose
        || (http10 && plan.framing == Framing::Chunked);
    let rewritten = plan.rewrite || (close_client && !plan.says_close) || http10;
    if rewritten {
        out.clear();
        write_response_head(out, &parsed, &plan, close_client, http10);
    }
    Ok(PlannedHead {
        len,
        plan,
        close_client,
        rewritten,
    })
}

/// Reads more response bytes into `resp` while watching the client: a client that goes away
/// meanwhile ends the request (and frees its upstream). An upstream that fails or closes has
/// given no response, unless an interim one already went to the client.
async fn read_more_response(
    conn: &mut Downstream,
    upstream: &mut TcpStream,
    resp: &mut Vec<u8>,
    interim_sent: bool,
) -> Result<(), ExchangeError> {
    let no_response = |e: io::Error| {
        if interim_sent {
            ExchangeError::Broken(format!("reading the response: {e}"))
        } else {
            ExchangeError::NoResponse(e)
        }
    };
    let n = tokio::select! {
        biased;
        n = read_upstream(upstream, resp) => n.map_err(no_response)?,
        () = client_gone(&mut conn.stream, &mut conn.buf, conn.read_limit) => {
            return Err(ExchangeError::Broken(
                "the client closed its connection before the response".into(),
            ));
        }
    };
    if n == 0 {
        return Err(no_response(io::ErrorKind::UnexpectedEof.into()));
    }
    Ok(())
}

/// Passes an interim (1xx) response head to the client (as received in `resp`, or rewritten
/// in `out`) and drops it from `resp`, where the final response follows.
async fn pass_interim(
    conn: &mut Downstream,
    resp: &mut Vec<u8>,
    out: &[u8],
    head: &PlannedHead,
) -> Result<(), ExchangeError> {
    let bytes: &[u8] = if head.rewritten {
        out
    } else {
        &resp[..head.len]
    };
    write_client(&mut conn.stream, bytes)
        .await
        .map_err(|e| ExchangeError::Broken(format!("writing to the client: {e}")))?;
    resp.drain(..head.len);
    Ok(())
}

/// Passes the response head (raw from `resp`, or rewritten in `out`) and body to the client;
/// with `unframe` (an HTTP/1.0 client), a chunked body goes without its framing.
/// Ok: whether the upstream connection ended cleanly at the body's end.
#[allow(clippy::too_many_arguments)]
async fn pass_body(
    conn: &mut Downstream,
    upstream: &mut TcpStream,
    resp: &mut Vec<u8>,
    head_len: usize,
    rplan: &ResponsePlan,
    rewritten: bool,
    unframe: bool,
    out: &mut Vec<u8>,
) -> Result<bool, ExchangeError> {
    let broken_client = |e: io::Error| ExchangeError::Broken(format!("writing to the client: {e}"));
    let broken_upstream =
        |e: io::Error| ExchangeError::Broken(format!("reading the response: {e}"));
    let unframe = unframe && rplan.framing == Framing::Chunked;
    let mut chunked = ChunkedScan::default();
    // The runs of chunk data in what `take` last consumed, when unframing.
    let mut runs: Vec<Range<usize>> = Vec::new();
    // Body bytes of `chunk` and whether the body is complete with them.
    let mut remaining = match rplan.framing {
        Framing::Length(n) => n,
        _ => 0,
    };
    let mut take =
        |chunk: &[u8], runs: &mut Vec<Range<usize>>| -> Result<(usize, bool), ExchangeError> {
            match rplan.framing {
                Framing::Empty => Ok((0, true)),
                Framing::Length(_) => {
                    let n = chunk.len().min(remaining.try_into().unwrap_or(usize::MAX));
                    remaining -= n as u64;
                    Ok((n, remaining == 0))
                }
                Framing::Chunked if unframe => {
                    runs.clear();
                    chunked
                        .feed_with(chunk, |run| runs.push(run))
                        .map_err(|e| ExchangeError::Broken(e.into()))
                }
                Framing::Chunked => chunked
                    .feed(chunk)
                    .map_err(|e| ExchangeError::Broken(e.into())),
                Framing::UntilClose => Ok((chunk.len(), false)),
            }
        };
    let (mut n, mut done) = take(&resp[head_len..], &mut runs)?;
    let mut extra = resp.len() > head_len + n;
    if unframe {
        for run in &runs {
            out.extend_from_slice(&resp[head_len + run.start..head_len + run.end]);
        }
        write_client(&mut conn.stream, out)
            .await
            .map_err(broken_client)?;
    } else if rewritten {
        out.extend_from_slice(&resp[head_len..head_len + n]);
        write_client(&mut conn.stream, out)
            .await
            .map_err(broken_client)?;
    } else {
        write_client(&mut conn.stream, &resp[..head_len + n])
            .await
            .map_err(broken_client)?;
    }
    while !done {
        resp.clear();
        let read = read_upstream(upstream, resp)
            .await
            .map_err(broken_upstream)?;
        if read == 0 {
            if rplan.framing == Framing::UntilClose {
                return Ok(false);
            }
            return Err(ExchangeError::Broken(
                "the upstream closed before the body's end".into(),
            ));
        }
        (n, done) = take(resp, &mut runs)?;
        extra |= n < resp.len();
        if unframe {
            out.clear();
            for run in &runs {
                out.extend_from_slice(&resp[run.clone()]);
            }
            if !out.is_empty() {
                write_client(&mut conn.stream, out)
                    .await
                    .map_err(broken_client)?;
            }
        } else {
            write_client(&mut conn.stream, &resp[..n])
                .await
                .map_err(broken_client)?;
        }
    }
    // Bytes after the body's end: the upstream does not speak HTTP as expected; drop it.
    Ok(!extra)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> EdgeLimits {
        EdgeLimits::default()
    }

    fn planned(raw: &[u8]) -> Option<Plan> {
        let mut fields = [httparse::EMPTY_HEADER; MAX_FIELDS];
        let mut req = httparse::Request::new(&mut fields);
        assert!(req.parse(raw).unwrap().is_complete());
        plan(raw, &req, &limits())
    }

    #[test]
    fn plain_requests_take_the_fast_path() {
        let raw = b"GET /a?b=1 HTTP/1.1\r\nHost: app.test\r\nAccept: */*\r\n\r\n";
        let p = planned(raw).unwrap();
        assert_eq!(&raw[p.method.clone()], b"GET");
        assert_eq!(&raw[p.target.clone()], b"/a?b=1");
        assert_eq!(&raw[p.host.clone()], b"app.test");
        assert_eq!(
            (p.content_length, p.close, p.idempotent, p.head),
            (0, false, true, false)
        );
        let raw = b"POST / HTTP/1.1\r\nhost: a\r\ncontent-length: 5\r\nConnection: close\r\n\r\n";
        let p = planned(raw).unwrap();
        assert_eq!((p.content_length, p.close, p.idempotent), (5, true, false));
    }

    #[test]
    fn chunked_and_long_bodies_are_streamed_and_never_sent_twice() {
        let raw = b"POST /u HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:  Chunked \r\n\r\n";
        let p = planned(raw).unwrap();
        assert!(p.chunked && p.streamed() && !p.idempotent);
        assert_eq!(p.head_len, raw.len());
        // The upstream gets the coding as the edge frames it, once.
        let head = upstream_head(raw, None, "http");
        assert_eq!(
            head.matches("Transfer-Encoding: chunked\r\n").count(),
            1,
            "{head}"
        );
        assert!(!head.contains("Chunked"), "{head}");

        let p = planned(b"PUT /u HTTP/1.1\r\nHost: a\r\nContent-Length: 65537\r\n\r\n").unwrap();
        assert!(!p.chunked && p.streamed() && !p.idempotent);
        let p = planned(b"PUT /u HTTP/1.1\r\nHost: a\r\nContent-Length: 65536\r\n\r\n").unwrap();
        assert!(!p.streamed() && p.idempotent);
    }

    #[test]
    fn strict_scans_take_only_crlf_and_semicolon_extensions() {
        let lenient_only: [&[u8]; 5] = [
            b"5\nhello\r\n0\r\n\r\n",
            b"5;x\nhello\r\n0\r\n\r\n",
            b"5\r\nhello\n0\r\n\r\n",
            b"5 x\r\nhello\r\n0\r\n\r\n",
            b"5\r\nhello\r\n0\r\nX-T: 1\n\r\n",
        ];
        for body in lenient_only {
            let shown = String::from_utf8_lossy(body);
            assert_eq!(
                ChunkedScan::default().feed(body),
                Ok((body.len(), true)),
                "{shown}"
            );
            assert!(ChunkedScan::strict().feed(body).is_err(), "{shown}");
        }
        for fine in [
            &b"5;a=b\r\nhello\r\n0\r\nX-T: 1\r\n\r\n"[..],
            b"5 \r\nhello\r\n0\r\n\r\n",
            b"5 \t;a\r\nhello\r\n0\r\n\r\n",
        ] {
            let shown = String::from_utf8_lossy(fine);
            assert_eq!(
                ChunkedScan::strict().feed(fine),
                Ok((fine.len(), true)),
                "{shown}"
            );
        }
    }

    #[test]
    fn a_chunked_body_scanned_in_two_parts_gives_its_data_wherever_it_is_cut() {
        // Extensions, a trailer, sizes of one and two digits, and what follows the body.
        let body = b"5;e=1\r\nhello\r\n1\r\n \r\n1a\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\nX-T: 1\r\n\r\nGET /";
        let end = body.len() - b"GET /".len();
        for cut in 0..=body.len() {
            let mut scan = ChunkedScan::strict();
            let mut runs = Vec::new();
            let (n, done) = scan_runs(&mut scan, &body[..cut], 0, &mut runs).unwrap();
            let (n, done) = if done {
                (n, done)
            } else {
                assert_eq!(n, cut, "an unfinished body is taken whole (cut at {cut})");
                let (more, done) = scan_runs(&mut scan, body, n, &mut runs).unwrap();
                (n + more, done)
            };
            assert!(done, "cut at {cut}");
            assert_eq!(
                n, end,
                "the body ends before what follows it (cut at {cut})"
            );
            let data: Vec<u8> = runs.iter().flat_map(|r| body[r.clone()].to_vec()).collect();
            assert_eq!(
                String::from_utf8_lossy(&data),
                "hello abcdefghijklmnopqrstuvwxyz",
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn chunk_sizes_are_written_in_lowercase_hex() {
        for (n, hex) in [
            (0, "0"),
            (9, "9"),
            (10, "a"),
            (255, "ff"),
            (4096, "1000"),
            (0xabcdef, "abcdef"),
            (1 << 60, "1000000000000000"),
            (usize::MAX, "ffffffffffffffff"),
        ] {
            let mut out = Vec::new();
            push_hex(&mut out, n);
            assert_eq!(String::from_utf8(out).unwrap(), hex);
        }
    }

    #[test]
    fn http10_requests_keep_their_connection_only_when_they_ask() {
        let p = planned(b"GET / HTTP/1.0\r\nHost: a\r\n\r\n").unwrap();
        assert!(p.http10 && p.close);
        let p = planned(b"GET / HTTP/1.0\r\nHost: a\r\nConnection: Keep-Alive\r\n\r\n").unwrap();
        assert!(p.http10 && !p.close);
        let p = planned(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
        assert!(!p.http10 && !p.close);
    }

    #[test]
    fn expect_100_continue_is_the_edges_to_answer() {
        let raw =
            b"PUT /x HTTP/1.1\r\nHost: a\r\nExpect: 100-Continue\r\nContent-Length: 3\r\n\r\n";
        let p = planned(raw).unwrap();
        assert!(p.expect_continue);
        // The upstream does not get the expectation: the edge has the body before it sends.
        assert!(!upstream_head(raw, None, "http")
            .to_ascii_lowercase()
            .contains("expect"));
    }

    #[test]
    fn anything_unusual_goes_to_pingora() {
        for raw in [
            &b"GET / HTTP/1.0\r\n\r\n"[..],
            b"POST / HTTP/1.0\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\n",
            b"GET / HTTP/1.1\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
            b"GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n",
            b"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n",
            b"CONNECT a:443 HTTP/1.1\r\nHost: a\r\n\r\n",
            b"GET /.ployz/health HTTP/1.1\r\nHost: a\r\n\r\n",
            b"GET /.well-known/acme-challenge/x HTTP/1.1\r\nHost: a\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
            b"POST / HTTP/1.0\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +1\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: \r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nExpect: 200-ok\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nExpect: 100-continue\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\nConnection: x-secret\r\n\r\n",
            b"GET /a#fragment HTTP/1.1\r\nHost: a\r\n\r\n",
            b"GET /<script> HTTP/1.1\r\nHost: a\r\n\r\n",
            b"GET /?q=\"a\" HTTP/1.1\r\nHost: a\r\n\r\n",
            b"GET /{x}|^ HTTP/1.1\r\nHost: a\r\n\r\n",
        ] {
            assert_eq!(planned(raw), None, "{}", String::from_utf8_lossy(raw));
        }
    }

    #[test]
    fn limits_send_requests_to_pingora_which_answers_them() {
        let long = format!("GET /{} HTTP/1.1\r\nHost: a\r\n\r\n", "a".repeat(9000));
        assert_eq!(planned(long.as_bytes()), None);
        let big = format!(
            "GET / HTTP/1.1\r\nHost: a\r\nX: {}\r\n\r\n",
            "a".repeat(17000)
        );
        assert_eq!(planned(big.as_bytes()), None);
        let raw = b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\n";
        let mut fields = [httparse::EMPTY_HEADER; MAX_FIELDS];
        let mut req = httparse::Request::new(&mut fields);
        req.parse(raw).unwrap();
        let small = EdgeLimits {
            max_body_bytes: Some(9),
            ..limits()
        };
        assert_eq!(plan(raw, &req, &small), None);
    }

    fn upstream_head(raw: &[u8], client: Option<&str>, proto: &str) -> String {
        let mut fields = [httparse::EMPTY_HEADER; MAX_FIELDS];
        let mut req = httparse::Request::new(&mut fields);
        req.parse(raw).unwrap();
        let p = plan(raw, &req, &limits()).unwrap();
        let mut out = Vec::new();
        write_upstream_head(&mut out, raw, &req, &p, client, proto, false);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn the_upstream_head_drops_hop_by_hop_fields_and_adds_forwarding_ones() {
        let head = upstream_head(
            b"GET /x?q HTTP/1.1\r\nHost: App.test:80\r\nConnection: keep-alive\r\nKeep-Alive: 5\r\nTE: trailers\r\nProxy-Authorization: secret\r\nX-Forwarded-For: 1.1.1.1\r\nX-Forwarded-For: 2.2.2.2\r\nForwarded: for=evil\r\nX-Forwarded-Proto: https\r\nX-Forwarded-Host: evil\r\nAccept: */*\r\n\r\n",
            Some("10.0.0.9"),
            "http",
        );
        assert_eq!(
            head,
            "GET /x?q HTTP/1.1\r\nHost: App.test:80\r\nAccept: */*\r\n\
             X-Forwarded-For: 1.1.1.1, 2.2.2.2, 10.0.0.9\r\n\
             Forwarded: for=10.0.0.9;host=\"App.test:80\";proto=http\r\n\
             X-Forwarded-Proto: http\r\nX-Forwarded-Host: App.test:80\r\n\r\n"
        );
        let head = upstream_head(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n", Some("::1"), "https");
        assert!(
            head.contains("Forwarded: for=\"[::1]\";host=\"a\";proto=https\r\n"),
            "{head}"
        );
        let head = upstream_head(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n", None, "http");
        assert_eq!(
            head,
            "GET / HTTP/1.1\r\nHost: a\r\nX-Forwarded-Proto: http\r\nX-Forwarded-Host: a\r\n\r\n"
        );
    }

    #[test]
    fn every_forwarded_for_line_reaches_the_upstream() {
        let mut raw = String::from("GET / HTTP/1.1\r\nHost: a\r\n");
        for i in 1..=12 {
            raw.push_str(&format!("X-Forwarded-For: 10.0.0.{i}\r\n"));
        }
        raw.push_str("\r\n");
        let head = upstream_head(raw.as_bytes(), Some("192.0.2.7"), "http");
        let chain: Vec<String> = (1..=12).map(|i| format!("10.0.0.{i}")).collect();
        assert!(
            head.contains(&format!(
                "\r\nX-Forwarded-For: {}, 192.0.2.7\r\n",
                chain.join(", ")
            )),
            "{head}"
        );
        assert_eq!(head.matches("X-Forwarded-For").count(), 1, "{head}");
    }

    #[test]
    fn content_length_reaches_the_upstream_as_plain_decimal() {
        let raw = b"POST / HTTP/1.1\r\nHost: a\r\ncontent-length: 00000000000000000000005\r\n\r\n";
        assert_eq!(planned(raw).unwrap().content_length, 5);
        let head = upstream_head(raw, None, "http");
        assert!(head.contains("\r\ncontent-length: 5\r\n"), "{head}");
        for raw in [
            &b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5,5\r\n\r\n"[..],
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 18446744073709551616\r\n\r\n",
        ] {
            assert_eq!(planned(raw), None, "{}", String::from_utf8_lossy(raw));
        }
    }

    #[test]
    fn fields_named_with_underscores_are_dropped_unless_forwarded() {
        let raw = b"GET / HTTP/1.1\r\nHost: a\r\nX_Forwarded_For: 6.6.6.6\r\nTransfer_Encoding: chunked\r\nX-Ok: 1\r\n\r\n";
        let head = upstream_head(raw, None, "http");
        assert!(!head.contains('_'), "{head}");
        assert!(head.contains("X-Ok: 1\r\n"), "{head}");
        let mut fields = [httparse::EMPTY_HEADER; MAX_FIELDS];
        let mut req = httparse::Request::new(&mut fields);
        req.parse(raw).unwrap();
        let p = plan(raw, &req, &limits()).unwrap();
        let mut out = Vec::new();
        write_upstream_head(&mut out, raw, &req, &p, None, "http", true);
        let head = String::from_utf8(out).unwrap();
        assert!(
            head.contains("X_Forwarded_For: 6.6.6.6\r\nTransfer_Encoding: chunked\r\n"),
            "{head}"
        );
    }

    #[test]
    fn bare_line_feeds_are_found() {
        assert!(!has_bare_lf(b"HTTP/1.1 200 OK\r\nA: b\r\n\r\n"));
        assert!(has_bare_lf(b"HTTP/1.1 200 OK\nA: b\r\n\r\n"));
        assert!(has_bare_lf(b"HTTP/1.1 200 OK\r\nA: b\r\n\n"));
        assert!(has_bare_lf(b"\n"));
    }

    fn rplan(raw: &[u8], head: bool) -> Result<ResponsePlan, &'static str> {
        let mut fields = [httparse::EMPTY_HEADER; MAX_FIELDS];
        let mut resp = httparse::Response::new(&mut fields);
        assert!(resp.parse(raw).unwrap().is_complete());
        response_plan(&resp, head)
    }

    #[test]
    fn response_framing_is_read_as_rfc_9112_says() {
        let p = rplan(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", false).unwrap();
        assert_eq!(
            (p.framing, p.reusable, p.rewrite),
            (Framing::Length(5), true, false)
        );
        let p = rplan(
            b"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nContent-Length: 5\r\n\r\n",
            false,
        )
        .unwrap();
        assert_eq!((p.reusable, p.rewrite, p.says_close), (true, false, false));
        let p = rplan(
            b"HTTP/1.1 200 OK\r\nConnection: keep-alive, x-hop\r\nContent-Length: 5\r\n\r\n",
            false,
        )
        .unwrap();
        assert_eq!((p.reusable, p.rewrite), (true, true));
        let p = rplan(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", true).unwrap();
        assert_eq!(p.framing, Framing::Empty);
        let p = rplan(
            b"HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n",
            false,
        )
        .unwrap();
        assert_eq!(p.framing, Framing::Empty);
        let p = rplan(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            false,
        )
        .unwrap();
        assert_eq!((p.framing, p.reusable), (Framing::Chunked, true));
        let p = rplan(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
            false,
        )
        .unwrap();
        assert_eq!((p.framing, p.rewrite), (Framing::Chunked, true));
        let p = rplan(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", false).unwrap();
        assert_eq!((p.framing, p.reusable), (Framing::UntilClose, false));
        let p = rplan(b"HTTP/1.1 200 OK\r\n\r\n", false).unwrap();
        assert_eq!((p.framing, p.reusable), (Framing::UntilClose, false));
        let p = rplan(b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\n", false).unwrap();
        assert_eq!((p.reusable, p.rewrite), (false, true));
        let p = rplan(
            b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\n",
            false,
        )
        .unwrap();
        assert_eq!((p.reusable, p.rewrite, p.says_close), (false, true, true));
        assert!(rplan(
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            false
        )
        .is_err());
        assert!(rplan(b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", false).is_err());
        assert!(rplan(b"HTTP/1.1 007 Odd\r\nContent-Length: 0\r\n\r\n", false).is_err());
        assert!(rplan(
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n",
            false
        )
        .is_ok());
    }

    #[test]
    fn a_rewritten_response_head_drops_hop_by_hop_fields() {
        // `Connection` may name any field but the framing ones, which stay.
        let raw = b"HTTP/1.0 200 Fine\r\nConnection: keep-alive, x-hop, content-length\r\nX-Hop: 1\r\nKeep-Alive: timeout=5\r\nContent-Length: 2\r\nServer: t\r\n\r\n";
        let mut fields = [httparse::EMPTY_HEADER; MAX_FIELDS];
        let mut resp = httparse::Response::new(&mut fields);
        resp.parse(raw).unwrap();
        let p = response_plan(&resp, false).unwrap();
        let mut out = Vec::new();
        write_response_head(&mut out, &resp, &p, true, false);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 200 Fine\r\nContent-Length: 2\r\nServer: t\r\nConnection: close\r\n\r\n"
        );
    }

    #[test]
    fn every_field_connection_names_is_dropped() {
        let names: Vec<String> = (0..12).map(|i| format!("x-hop-{i}")).collect();
        let mut raw = format!("HTTP/1.1 200 OK\nConnection: {}\n", names.join(", "));
        for n in &names {
            raw.push_str(&format!("{n}: 1\n"));
        }
        raw.push_str("Content-Length: 0\n\n");
        let mut fields = [httparse::EMPTY_HEADER; MAX_FIELDS];
        let mut resp = httparse::Response::new(&mut fields);
        resp.parse(raw.as_bytes()).unwrap();
        let p = response_plan(&resp, false).unwrap();
        let mut out = Vec::new();
        write_response_head(&mut out, &resp, &p, false, false);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
        );
    }

    fn scan_whole(body: &[u8], split: usize) -> Result<(usize, bool), &'static str> {
        let mut scan = ChunkedScan::default();
        let split = split.min(body.len());
        let (a, done) = scan.feed(&body[..split])?;
        if done {
            return Ok((a, true));
        }
        let (b, done) = scan.feed(&body[split..])?;
        Ok((a + b, done))
    }

    #[test]
    fn chunked_bodies_end_where_they_end_however_they_arrive() {
        let body = b"5\r\nhello\r\n1;ext=1\r\n!\r\n0\r\nTrailer: x\r\n\r\n";
        for split in 0..=body.len() {
            assert_eq!(
                scan_whole(body, split),
                Ok((body.len(), true)),
                "split at {split}"
            );
        }
        let mut with_next = body.to_vec();
        with_next.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
        assert_eq!(scan_whole(&with_next, 3), Ok((body.len(), true)));
        assert_eq!(scan_whole(b"0\r\n\r\n", 1), Ok((5, true)));
        assert_eq!(scan_whole(b"a\n0123456789\n0\n\n", 4), Ok((16, true)));
        assert_eq!(scan_whole(b"5\r\nhel", 2), Ok((6, false)));
    }

    #[test]
    fn broken_chunked_framing_is_refused() {
        for bad in [
            &b"x\r\n"[..],
            b"\r\n",
            b"5\r\nhelloX\r\n",
            b"fffffffffffffffff\r\n",
            b";\r\n",
        ] {
            assert!(
                scan_whole(bad, bad.len()).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    /// What `plan_response_head` makes of `raw`: the planned head and the out buffer, which
    /// holds `previous` unless the head was rewritten.
    fn planned_head(raw: &[u8], close: bool) -> Result<(PlannedHead, String), &'static str> {
        let mut out = b"previous".to_vec();
        match plan_response_head(raw, false, close, false, &mut out) {
            Ok(head) => Ok((head, String::from_utf8(out).unwrap())),
            Err(ExchangeError::BadResponse(why)) => Err(why),
            Err(_) => panic!("a head is only ever refused as a bad response"),
        }
    }

    #[test]
    fn an_http10_client_is_told_its_connection_stays_and_gets_no_chunked_framing() {
        let mut out = Vec::new();
        let sized = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
        let head = plan_response_head(sized, false, false, true, &mut out)
            .ok()
            .unwrap();
        assert!(head.rewritten && !head.close_client);
        assert_eq!(
            String::from_utf8(out.clone()).unwrap(),
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\n"
        );
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-A: 1\r\n\r\n";
        let head = plan_response_head(chunked, false, false, true, &mut out)
            .ok()
            .unwrap();
        assert!(head.rewritten && head.close_client);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 200 OK\r\nX-A: 1\r\nConnection: close\r\n\r\n"
        );
    }

    #[test]
    fn a_response_head_is_rewritten_only_when_the_client_must_see_it_changed() {
        let raw = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
        let (head, out) = planned_head(raw, false).unwrap();
        assert_eq!(head.len, raw.len() - 2);
        assert!(!head.rewritten && !head.close_client);
        assert_eq!(out, "previous");

        // The client's connection ends here: the head says so.
        let (head, out) = planned_head(raw, true).unwrap();
        assert!(head.rewritten && head.close_client);
        assert_eq!(
            out,
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n"
        );

        // A body that ends with the upstream's connection ends the client's too.
        let (head, out) = planned_head(b"HTTP/1.0 200 OK\r\n\r\nbody", false).unwrap();
        assert_eq!(head.plan.framing, Framing::UntilClose);
        assert!(head.rewritten && head.close_client && !head.plan.reusable);
        assert_eq!(out, "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n");

        // Bare line feeds reach the client as CRLF; an interim head is planned like any other.
        let (head, out) = planned_head(b"HTTP/1.1 100 Continue\n\nHTTP/1.1 204", false).unwrap();
        assert_eq!((head.len, head.plan.status), (23, 100));
        assert!(head.rewritten && !head.close_client);
        assert_eq!(out, "HTTP/1.1 100 Continue\r\n\r\n");
    }

    #[test]
    fn unusable_response_heads_are_refused() {
        for (raw, why) in [
            (
                &b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n"[..],
                "101 without an upgrade request",
            ),
            (
                b"HTTP/1.1 200 OK\r\nbad field\r\n\r\n",
                "a malformed response head",
            ),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
                "conflicting Content-Length fields",
            ),
        ] {
            assert_eq!(planned_head(raw, false).err(), Some(why));
        }
    }

    #[tokio::test]
    async fn the_pool_keeps_live_connections_and_drops_closed_ones() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let pool = UpstreamPool::new(0);
        let a = TcpStream::connect(addr).await.unwrap();
        let (server_a, _) = listener.accept().await.unwrap();
        let b = TcpStream::connect(addr).await.unwrap();
        let (_server_b, _) = listener.accept().await.unwrap();
        pool.put(addr, a);
        pool.put(addr, b);
        assert_eq!(pool.len(), 2);
        drop(server_a);
        tokio::time::sleep(Duration::from_millis(50)).await;
        // The newest (b) first; then a, closed by its peer, is not handed out.
        assert!(pool.take(addr).is_some());
        assert!(pool.take(addr).is_none());
        assert_eq!(pool.len(), 0);
    }
}
