//! HTTP/2 on the edge's own path: plain requests of an HTTP/2 connection proxied to HTTP/1.1
//! upstreams without Pingora's per-request machinery.
//!
//! The connection loop ([`crate::connection`]) accepts each stream with Pingora's HTTP/2
//! server, which already refuses control bytes in `:path`, ambiguous `Content-Length` fields
//! and invalid authorities (and the `h2` crate everything HTTP/2 forbids: connection-specific
//! fields, uppercase names, bytes a field value cannot hold). A stream whose request is plain
//! takes this path: a method but `CONNECT`, a path target of plain bytes within the limits, an
//! authority (or `Host`) that names a route with upstreams, no `Expect`, no body or a body with
//! one `Content-Length` of at most 64 KiB. Its request goes upstream as one HTTP/1.1 request
//! on the fast path's pool: the request line, `Host` from the authority, the fields as
//! received but the hop-by-hop and forwarding ones (and those named with `_` unless
//! configured), the `cookie` fields joined into one (RFC 9113 section 8.2.3), `Content-Length`
//! as plain decimal, the forwarding fields, then the body. The response head is read with the
//! fast path's rules ([`response_plan`]); interim (1xx) responses are dropped, hop-by-hop and
//! framing fields left out, and the body passed on (a chunked one without its framing), with
//! HTTP/2's flow control. Every other stream goes to Pingora's proxy, as every stream did
//! before. The `fast_path` setting sends them all there.

use std::io;
use std::net::SocketAddr;
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::task::Poll;
use std::time::Instant;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method};
use pingora::http::ResponseHeader;
use pingora::protocols::http::v2::server::HttpSession;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use crate::connection::HeaderScan;
use crate::fast_path::{
    cut, dropped_request_field, dropped_response_field, field_slots, is, parse_response,
    plain_target, response_plan, send_request, unpooled_if_cut, Buffers, ChunkedScan,
    ConnectionOptions, ExchangeError, Exchanged, FastPath, Framing, IO_TIMEOUT, MAX_FAST_BODY,
    MAX_RESPONSE_HEAD,
};
use crate::proxy::{parse_content_length, push_decimal, write_forwarding, Attempts, Finished};

/// How much the read buffer grows by when less than 4 KiB of it is free (a read takes all the
/// free space there is: the worker's buffer starts at 32 KiB).
const READ_SIZE: usize = 16 * 1024;

/// What the HTTP/2 path needs of an accepted request; the upstream request head is in the
/// [`Buffers`] that come with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct H2Plan {
    /// Where the host is in the upstream head (its `Host` field's value).
    pub host: Range<usize>,
    pub content_length: u64,
    /// Safe to send again after a connection that was reused turned out dead.
    pub idempotent: bool,
    pub head: bool,
}

/// Decides whether a request of an HTTP/2 stream takes this path (`None`: Pingora's proxy
/// serves it), and writes its upstream head into `out`. `end_of_stream`: the request has no
/// body (its HEADERS frame ended the stream). `route` answers, for the host and target, the
/// bytes of path its route strips, or `None` when no route with an upstream takes it.
pub(crate) fn plan_h2(
    req: &http::request::Parts,
    end_of_stream: bool,
    limits: &crate::EdgeLimits,
    (client, proto): (Option<&str>, &str),
    route: impl FnOnce(&[u8], &[u8]) -> Option<usize>,
    out: &mut Vec<u8>,
) -> Option<H2Plan> {
    if req.method == Method::CONNECT {
        return None;
    }
    let target = req.uri.path_and_query()?.as_str().as_bytes();
    if !plain_target(target, limits) {
        return None;
    }
    let host = match req.uri.authority() {
        Some(authority) => authority.as_str().as_bytes(),
        None => {
            let mut hosts = req.headers.get_all(http::header::HOST).iter();
            let host = hosts.next()?;
            if hosts.next().is_some() {
                return None;
            }
            host.as_bytes()
        }
    };
    let mut length = None;
    let mut header_bytes = 0;
    let mut cookies = 0;
    let mut forwarded_for = false;
    for (name, value) in req.headers.iter() {
        header_bytes += name.as_str().len() + value.len() + 4;
        match name.as_str() {
            "x-forwarded-for" => forwarded_for = true,
            "content-length" => {
                if length.is_some() {
                    return None;
                }
                length = Some(parse_content_length(value.as_bytes())?);
            }
            "cookie" => cookies += 1,
            "transfer-encoding" | "expect" | "upgrade" | "http2-settings" => return None,
            _ => {}
        }
    }
    let content_length = match length {
        Some(n) => n,
        None if end_of_stream => 0,
        // A body of unknown length: Pingora's proxy streams it.
        None => return None,
    };
    if header_bytes > limits.max_header_bytes
        || content_length > MAX_FAST_BODY
        || limits
            .max_body_bytes
            .is_some_and(|max| content_length > max)
    {
        return None;
    }
    let strip = route(host, target)?;
    out.extend_from_slice(req.method.as_str().as_bytes());
    out.push(b' ');
    crate::route_table::write_target(out, target, strip);
    out.extend_from_slice(b" HTTP/1.1\r\nHost: ");
    let host_at = out.len()..out.len() + host.len();
    out.extend_from_slice(host);
    out.extend_from_slice(b"\r\n");
    for (name, value) in req.headers.iter() {
        let name = name.as_str();
        if dropped_request_field(name)
            || matches!(name, "host" | "content-length" | "cookie")
            || (!limits.forward_underscore_headers && name.contains('_'))
        {
            continue;
        }
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if cookies > 0 {
        out.extend_from_slice(b"cookie: ");
        for (i, value) in req.headers.get_all(http::header::COOKIE).iter().enumerate() {
            if i > 0 {
                out.extend_from_slice(b"; ");
            }
            out.extend_from_slice(value.as_bytes());
        }
        out.extend_from_slice(b"\r\n");
    }
    if length.is_some() {
        out.extend_from_slice(b"content-length: ");
        push_decimal(out, content_length);
        out.extend_from_slice(b"\r\n");
    }
    // Looked up only when there is one: a lookup by name hashes it.
    let forwarded = forwarded_for.then(|| req.headers.get_all("x-forwarded-for"));
    write_forwarding(
        out,
        client,
        forwarded
            .iter()
            .flat_map(|all| all.iter())
            .map(HeaderValue::as_bytes),
        host,
        proto,
    );
    out.extend_from_slice(b"\r\n");
    Some(H2Plan {
        host: host_at,
        content_length,
        idempotent: req.method.is_idempotent(),
        head: req.method == Method::HEAD,
    })
}

/// A parsed upstream response head as the HTTP/2 client gets it: the status and the fields
/// but the hop-by-hop and framing ones (a `Content-Length` stays when it frames the body) and
/// `Date` (Pingora's HTTP/2 server writes the edge's own over whatever the head has). `raw` is
/// what `resp` was parsed from, and `shared` a copy of (at least) its head: the field values
/// are slices of that one copy rather than a copy each. `Err` names what makes it unusable.
pub(crate) fn h2_response_head(
    resp: &httparse::Response<'_, '_>,
    raw: &[u8],
    shared: &Bytes,
    framing: Framing,
) -> Result<ResponseHeader, &'static str> {
    let status = resp.code.ok_or("no valid status code")?;
    let mut head = http::Response::builder()
        .status(status)
        .body(())
        .map_err(|_| "no valid status code")?;
    let keep_length = matches!(framing, Framing::Length(_) | Framing::Empty);
    let options = ConnectionOptions::of(resp);
    let fields = head.headers_mut();
    fields.reserve(resp.headers.len());
    for h in resp.headers.iter() {
        let dropped = match h.name.len() {
            2 => is(h.name, "te"),
            4 => is(h.name, "date"),
            7 => is(h.name, "upgrade"),
            14 => is(h.name, "content-length") && !keep_length,
            17 => is(h.name, "transfer-encoding"),
            _ => false,
        };
        if dropped || dropped_response_field(h.name, &options) {
            continue;
        }
        let name =
            HeaderName::from_bytes(h.name.as_bytes()).map_err(|_| "an invalid field name")?;
        let value = match slice_of(raw, h.value).filter(|at| at.end <= shared.len()) {
            Some(at) => HeaderValue::from_maybe_shared(shared.slice(at)),
            None => HeaderValue::from_bytes(h.value),
        }
        .map_err(|_| "an invalid field value")?;
        fields.append(name, value);
    }
    Ok(head.into_parts().0.into())
}

/// Where `part` lies in `whole`, if it is a part of it.
fn slice_of(whole: &[u8], part: &[u8]) -> Option<Range<usize>> {
    let start = (part.as_ptr() as usize).checked_sub(whole.as_ptr() as usize)?;
    let end = start.checked_add(part.len())?;
    (end <= whole.len()).then_some(start..end)
}

impl FastPath {
    /// Plans an accepted HTTP/2 request: `Some` when this path serves it.
    pub(crate) fn accept_h2(
        &self,
        session: &HttpSession,
        client: Option<&str>,
        tls: bool,
    ) -> Option<(H2Plan, Buffers)> {
        let mut buffers = Buffers::take();
        let table = self.edge.routes().table().load();
        let routed = plan_h2(
            session.req_header(),
            session.is_body_empty(),
            self.edge.limits(),
            (client, if tls { "https" } else { "http" }),
            |host, target| {
                table
                    .match_request(host, target)
                    .filter(|route| !route.upstreams.is_empty() && !route.needs_proxy())
                    .map(|route| route.strip)
            },
            &mut buffers.out,
        );
        match routed {
            Some(plan) => Some((plan, buffers)),
            None => {
                buffers.give_back();
                None
            }
        }
    }

    /// Serves one planned HTTP/2 request, and writes its access-log line.
    pub(crate) async fn serve_h2(
        &self,
        mut session: HttpSession,
        plan: H2Plan,
        mut buffers: Buffers,
    ) {
        let start = Instant::now();
        let mut attempts = Attempts::default();
        let (status, error) =
            match read_body(&mut session, &mut buffers.out, plan.content_length).await {
                Err(e) => {
                    session.shutdown();
                    (0, Some(format!("reading the request body: {e}")))
                }
                Ok(()) => match self
                    .forward_h2(
                        &mut session,
                        &plan,
                        &buffers.out,
                        &mut buffers.resp,
                        &mut attempts,
                    )
                    .await
                {
                    Ok(status) => (status, None),
                    Err((status, e)) => (status, Some(e)),
                },
            };
        let req = session.req_header();
        self.edge.finish(
            Finished {
                method: req.method.as_str(),
                host: &buffers.out[plan.host.clone()],
                path: req.uri.path(),
                status,
                start,
                error,
            },
            &mut attempts,
        );
        buffers.give_back();
    }

    /// Sends `request` to an upstream and passes its response to the client. Ok: the status;
    /// Err: the status written (0 if none) and what went wrong.
    async fn forward_h2(
        &self,
        session: &mut HttpSession,
        plan: &H2Plan,
        request: &[u8],
        resp: &mut Vec<u8>,
        attempts: &mut Attempts,
    ) -> Result<u16, (u16, String)> {
        let host = &request[plan.host.clone()];
        // The target as the client sent it (the upstream head has it stripped); a clone of a
        // `Uri` shares its bytes.
        let uri = session.req_header().uri.clone();
        let target = uri.path_and_query().map_or("/", |p| p.as_str()).as_bytes();
        loop {
            let Some(addr) = self.edge.choose_upstream(host, target, attempts) else {
                let status = answer(session, 503, crate::proxy::NO_SERVING_CONTAINER).await;
                return Err((status, crate::proxy::NO_SERVING_CONTAINER.trim_end().into()));
            };
            let kept = self.pool.take(addr);
            let reused = kept.is_some();
            let mut upstream = match kept {
                Some(s) => s,
                None => match self.connect_h2(session, addr, attempts).await? {
                    Some(s) => s,
                    None => continue,
                },
            };
            let mut registered = self.edge.register_exchange(attempts, upstream.as_raw_fd());
            let mut result = exchange(session, &mut upstream, plan.head, request, resp).await;
            let no_response =
                |r: &Result<_, ExchangeError>| matches!(r, Err(ExchangeError::NoResponse(_)));
            if cut(&registered) && plan.idempotent && no_response(&result) {
                // Its Machine was observed down: another Serving Container.
                continue;
            }
            if !cut(&registered) && reused && plan.idempotent && no_response(&result) {
                // A kept connection the upstream had closed meanwhile: once more on a new one.
                upstream = match self.connect_h2(session, addr, attempts).await? {
                    Some(s) => s,
                    None => continue,
                };
                registered = self.edge.register_exchange(attempts, upstream.as_raw_fd());
                result = exchange(session, &mut upstream, plan.head, request, resp).await;
                if cut(&registered) && no_response(&result) {
                    continue;
                }
            }
            let result = unpooled_if_cut(result, registered);
            return match result {
                Ok(done) => {
                    if done.upstream_reusable {
                        self.pool.put(addr, upstream);
                    }
                    Ok(done.status)
                }
                Err(ExchangeError::NoResponse(e)) => {
                    let status = answer(session, 502, crate::proxy::UPSTREAM_FAILED).await;
                    Err((status, format!("{addr}: {e}")))
                }
                Err(ExchangeError::BadResponse(why)) => {
                    let status = answer(session, 502, crate::proxy::UPSTREAM_FAILED).await;
                    Err((status, format!("{addr}: {why}")))
                }
                // Refusals come from streamed HTTP/1 bodies; answered alike if one ever comes.
                Err(ExchangeError::Refused(status, why)) => {
                    let status = answer(session, status, "request refused\n").await;
                    Err((status, why.into()))
                }
                Err(ExchangeError::Broken(why)) => {
                    session.shutdown();
                    // The status the client got before the response broke off, if any.
                    let status = session.response_written().map_or(0, |r| r.status.as_u16());
                    Err((status, format!("{addr}: {why}")))
                }
            };
        }
    }

    /// A new connection to `addr`. `None`: it failed and the next upstream may be tried;
    /// `Err`: it failed with nothing left to try, and the client was answered 502.
    async fn connect_h2(
        &self,
        session: &mut HttpSession,
        addr: SocketAddr,
        attempts: &Attempts,
    ) -> Result<Option<TcpStream>, (u16, String)> {
        match self.dial(addr, attempts).await {
            Ok(s) => Ok(s),
            Err(e) => {
                let status = answer(session, 502, crate::proxy::UPSTREAM_UNREACHABLE).await;
                Err((status, format!("connecting to {addr}: {e}")))
            }
        }
    }
}

/// Reads the request body (`length` bytes, as the request declared) onto `out`, within
/// [`IO_TIMEOUT`] per read.
async fn read_body(session: &mut HttpSession, out: &mut Vec<u8>, length: u64) -> io::Result<()> {
    if session.is_body_done() {
        return if length == 0 {
            Ok(())
        } else {
            Err(io::ErrorKind::UnexpectedEof.into())
        };
    }
    let mut read = 0u64;
    loop {
        let data = tokio::time::timeout(IO_TIMEOUT, session.read_body_bytes())
            .await
            .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))?
            .map_err(|e| io::Error::other(e.to_string()))?;
        let Some(data) = data else { break };
        read += data.len() as u64;
        if read > length {
            return Err(io::Error::other("more body than its Content-Length"));
        }
        out.extend_from_slice(&data);
    }
    if read < length {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}

/// A short plain-text answer from the edge itself; the status, or 0 if it could not be written.
/// The answer to a HEAD request gives the body's length and ends the stream with its head.
async fn answer(session: &mut HttpSession, status: u16, body: &'static str) -> u16 {
    let head_request = session.req_header().method == Method::HEAD;
    let Ok(mut head) = ResponseHeader::build_no_case(status, Some(3)) else {
        return 0;
    };
    let mut length = Vec::with_capacity(4);
    push_decimal(&mut length, body.len() as u64);
    let built = head
        .insert_header(http::header::CONTENT_TYPE, "text/plain")
        .and_then(|()| head.insert_header(http::header::CONTENT_LENGTH, length))
        .and_then(|()| head.insert_header(http::header::CACHE_CONTROL, "no-store"));
    if built.is_err()
        || session
            .write_response_header(Box::new(head), head_request)
            .is_err()
    {
        return 0;
    }
    if head_request {
        return status;
    }
    match write_body(session, Bytes::from_static(body.as_bytes()), true).await {
        Ok(()) => status,
        Err(_) => 0,
    }
}

/// Writes a piece of the response body within [`IO_TIMEOUT`]. The timer is set only when the
/// piece cannot go at once (the stream's or the connection's window is short), which most
/// pieces can.
async fn write_body(session: &mut HttpSession, piece: Bytes, end: bool) -> pingora::Result<()> {
    let mut write = std::pin::pin!(session.write_body(piece, end));
    if let Poll::Ready(done) = futures_util::poll!(write.as_mut()) {
        return done;
    }
    match tokio::time::timeout(IO_TIMEOUT, write).await {
        Ok(done) => done,
        Err(_) => pingora::Error::e_explain(
            pingora::ErrorType::WriteTimedout,
            "writing the response body",
        ),
    }
}

/// Reads from an upstream onto the end of `resp` within [`IO_TIMEOUT`].
async fn read_upstream(upstream: &mut TcpStream, resp: &mut Vec<u8>) -> io::Result<usize> {
    if resp.capacity() - resp.len() < 4096 {
        resp.reserve(READ_SIZE);
    }
    tokio::time::timeout(IO_TIMEOUT, upstream.read_buf(resp))
        .await
        .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))?
}

/// One request and its response over `upstream`: `request` is sent, interim responses are
/// read and dropped, then the final response's head and body go to the client. `resp` is the
/// read buffer (a worker thread's, reused): the body goes to the client in copies of what was
/// read, so that the buffer is free again when the exchange ends.
async fn exchange(
    session: &mut HttpSession,
    upstream: &mut TcpStream,
    head_request: bool,
    request: &[u8],
    resp: &mut Vec<u8>,
) -> Result<Exchanged, ExchangeError> {
    send_request(upstream, request).await?;
    resp.clear();
    // Where the unread part of `resp` begins.
    let mut at = 0;
    // The final response's head, with as much of its body as came with it when its length is
    // known, is copied out of `resp` once: the field values and that first piece of the body
    // are slices of the copy.
    let (head, shared_body, framing, reusable) = loop {
        let mut scan = HeaderScan::default();
        let mut scanned = at;
        loop {
            let complete = scan.feed(&resp[scanned..]).is_some();
            scanned = resp.len();
            if complete {
                break;
            }
            if resp.len() - at > MAX_RESPONSE_HEAD {
                return Err(ExchangeError::BadResponse("a response head over 64 KiB"));
            }
            let n = tokio::select! {
                biased;
                n = read_upstream(upstream, resp) => n.map_err(ExchangeError::NoResponse)?,
                reason = session.idle() => {
                    return Err(ExchangeError::Broken(match reason {
                        Ok(reason) => format!("the client reset the stream ({reason:?}) before the response"),
                        Err(e) => format!("the client went away before the response: {e}"),
                    }));
                }
            };
            if n == 0 {
                return Err(ExchangeError::NoResponse(
                    io::ErrorKind::UnexpectedEof.into(),
                ));
            }
        }
        let mut fields = field_slots();
        let mut parsed = httparse::Response::new(&mut []);
        let raw = &resp[at..];
        let len = match parse_response(&mut parsed, raw, &mut fields) {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) | Err(_) => {
                return Err(ExchangeError::BadResponse("a malformed response head"))
            }
        };
        let plan = response_plan(&parsed, head_request).map_err(ExchangeError::BadResponse)?;
        if plan.status == 101 {
            return Err(ExchangeError::BadResponse("101 without an upgrade request"));
        }
        if (100..200).contains(&plan.status) {
            // Interim responses stay here: Pingora's HTTP/2 server drops them too. Dropped
            // from the buffer as well: an upstream may send any number of them.
            resp.drain(..at + len);
            at = 0;
            continue;
        }
        let body_now = match plan.framing {
            Framing::Length(n) => (raw.len() - len).min(n.try_into().unwrap_or(usize::MAX)),
            _ => 0,
        };
        let shared = Bytes::copy_from_slice(&raw[..len + body_now]);
        let head = h2_response_head(&parsed, raw, &shared, plan.framing)
            .map_err(ExchangeError::BadResponse)?;
        at += len + body_now;
        let body = (body_now > 0).then(|| shared.slice(len..));
        break (head, body, plan.framing, plan.reusable);
    };
    let status = head.status.as_u16();
    let broken_client =
        |e: Box<pingora::Error>| ExchangeError::Broken(format!("writing to the client: {e}"));
    let ends_now = matches!(framing, Framing::Empty | Framing::Length(0));
    session
        .write_response_header(Box::new(head), ends_now)
        .map_err(broken_client)?;
    let clean = match framing {
        Framing::Empty | Framing::Length(0) => at == resp.len(),
        Framing::Length(mut left) => {
            if let Some(piece) = shared_body {
                left -= piece.len() as u64;
                write_body(session, piece, left == 0)
                    .await
                    .map_err(broken_client)?;
            }
            while left > 0 {
                resp.clear();
                read_body_bytes(upstream, resp).await?;
                let take = resp.len().min(left.try_into().unwrap_or(usize::MAX));
                left -= take as u64;
                at = take;
                let piece = Bytes::copy_from_slice(&resp[..take]);
                write_body(session, piece, left == 0)
                    .await
                    .map_err(broken_client)?;
            }
            at == resp.len()
        }
        Framing::Chunked => {
            let mut scan = ChunkedScan::default();
            let mut runs: Vec<Range<usize>> = Vec::new();
            loop {
                runs.clear();
                let (n, done) = scan
                    .feed_with(&resp[at..], |run| runs.push(run))
                    .map_err(|e| ExchangeError::Broken(e.into()))?;
                for run in runs.drain(..) {
                    let piece = Bytes::copy_from_slice(&resp[at + run.start..at + run.end]);
                    write_body(session, piece, false)
                        .await
                        .map_err(broken_client)?;
                }
                at += n;
                if done {
                    session.finish().map_err(broken_client)?;
                    break;
                }
                // The scan takes all it is given until the body ends, so this empties the
                // buffer; anything it had left would stay at the front.
                resp.drain(..at);
                at = 0;
                read_body_bytes(upstream, resp).await?;
            }
            at == resp.len()
        }
        Framing::UntilClose => {
            loop {
                if at < resp.len() {
                    let piece = Bytes::copy_from_slice(&resp[at..]);
                    write_body(session, piece, false)
                        .await
                        .map_err(broken_client)?;
                }
                resp.clear();
                at = 0;
                let read = read_upstream(upstream, resp)
                    .await
                    .map_err(|e| ExchangeError::Broken(format!("reading the response: {e}")))?;
                if read == 0 {
                    break;
                }
            }
            session.finish().map_err(broken_client)?;
            false
        }
    };
    Ok(Exchanged {
        status,
        upstream_reusable: clean && reusable,
        client_continues: true,
    })
}

/// Reads more of a response body; the upstream closing first breaks the response off.
async fn read_body_bytes(
    upstream: &mut TcpStream,
    resp: &mut Vec<u8>,
) -> Result<(), ExchangeError> {
    match read_upstream(upstream, resp).await {
        Ok(0) => Err(ExchangeError::Broken(
            "the upstream closed before the body's end".into(),
        )),
        Ok(_) => Ok(()),
        Err(e) => Err(ExchangeError::Broken(format!("reading the response: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fast_path::MAX_FIELDS;

    fn limits() -> crate::EdgeLimits {
        crate::EdgeLimits::default()
    }

    fn parts(method: &str, uri: &str, fields: &[(&str, &str)]) -> http::request::Parts {
        let mut req = http::Request::builder().method(method).uri(uri);
        for (name, value) in fields {
            req = req.header(*name, *value);
        }
        req.body(()).unwrap().into_parts().0
    }

    /// The plan and the upstream head of a request without a body.
    fn planned(req: &http::request::Parts, limits: &crate::EdgeLimits) -> Option<(H2Plan, String)> {
        let mut out = Vec::new();
        let plan = plan_h2(
            req,
            true,
            limits,
            (Some("192.0.2.7"), "https"),
            |_, _| Some(0),
            &mut out,
        )?;
        Some((plan, String::from_utf8(out).unwrap()))
    }

    #[test]
    fn a_plain_request_goes_upstream_as_one_http1_head() {
        let req = parts(
            "GET",
            "https://h.test/a/b?c=d",
            &[
                ("accept", "*/*"),
                ("cookie", "a=1"),
                ("x-forwarded-for", "203.0.113.1"),
                ("cookie", "b=2"),
                ("x_under", "1"),
                ("te", "trailers"),
                ("host", "other.test"),
            ],
        );
        let (plan, head) = planned(&req, &limits()).unwrap();
        assert_eq!(
            head,
            "GET /a/b?c=d HTTP/1.1\r\nHost: h.test\r\naccept: */*\r\ncookie: a=1; b=2\r\n\
             X-Forwarded-For: 203.0.113.1, 192.0.2.7\r\n\
             Forwarded: for=192.0.2.7;host=\"h.test\";proto=https\r\n\
             X-Forwarded-Proto: https\r\nX-Forwarded-Host: h.test\r\n\r\n"
        );
        assert_eq!(&head[plan.host.clone()], "h.test");
        assert!(plan.idempotent && !plan.head);
        assert_eq!(plan.content_length, 0);

        // Without an authority, `Host` names the host.
        let req = parts("HEAD", "/x", &[("host", "h.test:8443")]);
        let (plan, head) = planned(&req, &limits()).unwrap();
        assert!(
            head.starts_with("HEAD /x HTTP/1.1\r\nHost: h.test:8443\r\n"),
            "{head}"
        );
        assert!(plan.head);
    }

    #[test]
    fn a_body_goes_with_its_length_as_plain_decimal() {
        let req = parts("POST", "https://h.test/", &[("content-length", "007")]);
        let mut out = Vec::new();
        let plan = plan_h2(
            &req,
            false,
            &limits(),
            (None, "https"),
            |_, _| Some(0),
            &mut out,
        )
        .unwrap();
        let head = String::from_utf8(out).unwrap();
        assert!(head.contains("\r\ncontent-length: 7\r\n"), "{head}");
        assert_eq!(plan.content_length, 7);
        assert!(!plan.idempotent);
    }

    #[test]
    fn fields_named_with_underscores_pass_when_configured() {
        let req = parts("GET", "https://h.test/", &[("x_under", "1")]);
        let passing = crate::EdgeLimits {
            forward_underscore_headers: true,
            ..limits()
        };
        assert!(planned(&req, &passing)
            .unwrap()
            .1
            .contains("\r\nx_under: 1\r\n"));
        assert!(!planned(&req, &limits()).unwrap().1.contains("x_under"));
    }

    #[test]
    fn anything_unusual_goes_to_pingora() {
        let l = limits();
        let long_target = format!("https://h.test/{}", "a".repeat(l.max_uri_bytes));
        let big = (MAX_FAST_BODY + 1).to_string();
        let long_value = "v".repeat(l.max_header_bytes);
        let cases: Vec<(http::request::Parts, bool)> = vec![
            (parts("CONNECT", "h.test:443", &[]), true),
            (parts("GET", "https://h.test/.ployz/health", &[]), true),
            (
                parts("GET", "https://h.test/.well-known/acme-challenge/t", &[]),
                true,
            ),
            (parts("GET", "https://h.test/a%20b\"c", &[]), true),
            (parts("GET", "https://h.test/{x}", &[]), true),
            (parts("GET", &long_target, &[]), true),
            (
                parts("GET", "/", &[("host", "a.test"), ("host", "b.test")]),
                true,
            ),
            (parts("GET", "/", &[]), true),
            (
                parts(
                    "POST",
                    "https://h.test/",
                    &[("content-length", "1"), ("content-length", "1")],
                ),
                false,
            ),
            (
                parts("POST", "https://h.test/", &[("content-length", "1,1")]),
                false,
            ),
            (
                parts("POST", "https://h.test/", &[("content-length", &big)]),
                false,
            ),
            (parts("POST", "https://h.test/", &[]), false),
            (
                parts("GET", "https://h.test/", &[("expect", "100-continue")]),
                true,
            ),
            (
                parts("GET", "https://h.test/", &[("upgrade", "websocket")]),
                true,
            ),
            (
                parts(
                    "GET",
                    "https://h.test/",
                    &[("transfer-encoding", "chunked")],
                ),
                true,
            ),
            (
                parts("GET", "https://h.test/", &[("x-long", &long_value)]),
                true,
            ),
        ];
        for (req, end_of_stream) in cases {
            let mut out = Vec::new();
            assert!(
                plan_h2(
                    &req,
                    end_of_stream,
                    &l,
                    (None, "https"),
                    |_, _| Some(0),
                    &mut out
                )
                .is_none(),
                "{req:?}"
            );
        }
        let limited = crate::EdgeLimits {
            max_body_bytes: Some(4),
            ..limits()
        };
        let req = parts("POST", "https://h.test/", &[("content-length", "5")]);
        assert!(plan_h2(
            &req,
            false,
            &limited,
            (None, "https"),
            |_, _| Some(0),
            &mut Vec::new()
        )
        .is_none());
    }

    fn head_for(raw: &[u8], head_request: bool) -> Result<ResponseHeader, &'static str> {
        let mut fields = [httparse::EMPTY_HEADER; MAX_FIELDS];
        let mut parsed = httparse::Response::new(&mut fields);
        parsed.parse(raw).unwrap();
        let plan = response_plan(&parsed, head_request)?;
        h2_response_head(&parsed, raw, &Bytes::copy_from_slice(raw), plan.framing)
    }

    #[test]
    fn response_heads_lose_their_hop_by_hop_and_framing_fields() {
        let head = head_for(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\nConnection: keep-alive, X-Hop\r\nX-Hop: 1\r\nKeep-Alive: timeout=5\r\nProxy-Connection: x\r\nUpgrade: h2c\r\nTE: trailers\r\nDate: Thu, 01 Jan 1970 00:00:00 GMT\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\nConnection: x-other\r\nX-Other: 2\r\nX-Kept: yes\r\n\r\n",
            false,
        )
        .unwrap();
        // `Date` goes too: Pingora's HTTP/2 server writes the edge's own.
        let names: Vec<&str> = head.headers.keys().map(|n| n.as_str()).collect();
        assert_eq!(names, ["set-cookie", "x-kept"]);
        let cookies: Vec<&HeaderValue> = head.headers.get_all("set-cookie").iter().collect();
        assert_eq!(cookies, ["a=1", "b=2"]);
        assert_eq!(head.headers["x-kept"], "yes");

        let sized = head_for(
            b"HTTP/1.1 404 Not Found\r\nContent-Length: 3\r\n\r\n",
            false,
        )
        .unwrap();
        assert_eq!(sized.status, 404);
        assert_eq!(sized.headers["content-length"], "3");
        // A HEAD response keeps the length of the body it stands for.
        let head_of = head_for(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n", true).unwrap();
        assert_eq!(head_of.headers["content-length"], "9");
        // Until close: the length-less body ends with the stream.
        let until_close = head_for(b"HTTP/1.0 200 OK\r\nX-A: 1\r\n\r\n", false).unwrap();
        assert!(!until_close.headers.contains_key("content-length"));
    }

    #[test]
    fn field_values_outside_the_shared_copy_are_copied() {
        let raw = b"HTTP/1.1 200 OK\r\nX-A: first\r\nContent-Length: 0\r\n\r\n";
        let mut fields = [httparse::EMPTY_HEADER; MAX_FIELDS];
        let mut parsed = httparse::Response::new(&mut fields);
        parsed.parse(raw).unwrap();
        // A copy that ends inside the first value: that value is copied on its own.
        let short = Bytes::copy_from_slice(&raw[..20]);
        let head = h2_response_head(&parsed, raw, &short, Framing::Length(0)).unwrap();
        assert_eq!(head.headers["x-a"], "first");
        assert_eq!(head.headers["content-length"], "0");
        // Values from another buffer than `raw` are copied as well.
        let head = h2_response_head(&parsed, b"elsewhere", &short, Framing::Length(0)).unwrap();
        assert_eq!(head.headers["x-a"], "first");
    }
}
