//! The edge's TLS handshake on its HTTPS listener (`ployz daemon edge --https-listen`):
//! session resumption by tickets, TLS 1.2 and 1.3, a handshake that never comes, plain HTTP
//! sent to the HTTPS port.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use rustls::client::{Resumption, Tls12Resumption};
use rustls::{ClientConfig, ClientConnection, HandshakeKind, RootCertStore};

const HOST: &str = "tls.test";

/// The edge alone with an HTTPS listener for [`HOST`], routed to an upstream that answers
/// every request with its request line.
struct TlsEdge {
    port: u16,
    roots: RootCertStore,
    _up: Upstream,
    _edge: EdgeAlone,
    _dir: tempfile::TempDir,
}

impl TlsEdge {
    fn start(extra: &[&str]) -> TlsEdge {
        let up = Upstream::start(echo_request_line);
        let dir = tempfile::tempdir().unwrap();
        let (cert_file, key_file, cert) = self_signed(dir.path(), HOST);
        let [port] = free_ports();
        let listen = format!("127.0.0.1:{port}");
        let files: [PathBuf; 2] = [cert_file, key_file];
        let mut args = vec![
            "--https-listen",
            listen.as_str(),
            "--tls-cert",
            files[0].to_str().unwrap(),
            "--tls-key",
            files[1].to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let (_, edge) = edge_alone(&up.route(HOST), &args);
        wait_listening(port, "the HTTPS listener");
        let mut roots = RootCertStore::empty();
        roots.add(cert.der().clone()).unwrap();
        TlsEdge {
            port,
            roots,
            _up: up,
            _edge: edge,
            _dir: dir,
        }
    }

    /// A client with a session cache of its own: one returning visitor.
    fn visitor(&self, versions: &[&'static rustls::SupportedProtocolVersion]) -> Arc<ClientConfig> {
        self.visitor_resuming(versions, Resumption::in_memory_sessions(4))
    }

    fn visitor_resuming(
        &self,
        versions: &[&'static rustls::SupportedProtocolVersion],
        resumption: Resumption,
    ) -> Arc<ClientConfig> {
        let mut config =
            ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_protocol_versions(versions)
                .unwrap()
                .with_root_certificates(self.roots.clone())
                .with_no_client_auth();
        config.resumption = resumption;
        Arc::new(config)
    }

    /// One visit: a new connection, `GET /visit`, its answer read to the end. Returns how the
    /// handshake went and the status line.
    fn visit(&self, visitor: &Arc<ClientConfig>) -> (HandshakeKind, String) {
        let name = rustls::pki_types::ServerName::try_from(HOST).unwrap();
        let conn = ClientConnection::new(visitor.clone(), name).unwrap();
        let tcp = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut tls = rustls::StreamOwned::new(conn, tcp);
        tls.write_all(
            format!("GET /visit HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .unwrap();
        let mut answer = Vec::new();
        // Reading to the end also takes in the session tickets the server sent after the
        // handshake. A close without close_notify after the whole answer is not a failure here.
        match tls.read_to_end(&mut answer) {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::UnexpectedEof && !answer.is_empty() => {}
            Err(e) => panic!("reading the answer: {e}"),
        }
        let kind = tls.conn.handshake_kind().expect("the handshake finished");
        let text = String::from_utf8_lossy(&answer);
        let status = text.lines().next().unwrap_or_default().to_owned();
        assert!(
            text.ends_with("GET /visit"),
            "the upstream's answer reached the client: {text:?}"
        );
        (kind, status)
    }
}

#[test]
fn a_returning_visitor_resumes_after_hundreds_of_others() {
    let edge = TlsEdge::start(&[]);
    let tls13: &[&'static rustls::SupportedProtocolVersion] = &[&rustls::version::TLS13];
    let first = edge.visitor(tls13);
    assert_eq!(
        edge.visit(&first),
        (HandshakeKind::Full, "HTTP/1.1 200 OK".to_owned())
    );
    // More visitors than a 256-session cache holds sessions for (each handshake leaves two):
    // only a ticket the client carries survives them.
    for _ in 0..300 {
        let other = edge.visitor(tls13);
        assert_eq!(edge.visit(&other).0, HandshakeKind::Full);
    }
    assert_eq!(
        edge.visit(&first),
        (HandshakeKind::Resumed, "HTTP/1.1 200 OK".to_owned())
    );
    // And again on the ticket that visit left.
    assert_eq!(edge.visit(&first).0, HandshakeKind::Resumed);
}

#[test]
fn tls12_clients_resume_by_ticket_and_by_session_id_after_hundreds_of_others() {
    let edge = TlsEdge::start(&[]);
    let tls12: &[&'static rustls::SupportedProtocolVersion] = &[&rustls::version::TLS12];
    let by_id =
        || Resumption::in_memory_sessions(4).tls12_resumption(Tls12Resumption::SessionIdOnly);
    let ticketed = edge.visitor(tls12);
    let identified = edge.visitor_resuming(tls12, by_id());
    assert_eq!(edge.visit(&ticketed).0, HandshakeKind::Full);
    assert_eq!(edge.visit(&identified).0, HandshakeKind::Full);
    // More visitors by session ID than a 256-session cache holds.
    for _ in 0..300 {
        let other = edge.visitor_resuming(tls12, by_id());
        assert_eq!(edge.visit(&other).0, HandshakeKind::Full);
    }
    assert_eq!(
        edge.visit(&ticketed),
        (HandshakeKind::Resumed, "HTTP/1.1 200 OK".to_owned())
    );
    assert_eq!(
        edge.visit(&identified),
        (HandshakeKind::Resumed, "HTTP/1.1 200 OK".to_owned())
    );
}

#[test]
fn a_connection_that_never_says_hello_is_closed_after_the_header_timeout() {
    let edge = TlsEdge::start(&["--header-timeout", "1"]);
    let mut silent = TcpStream::connect(("127.0.0.1", edge.port)).unwrap();
    // Ten times the header timeout, and far short of the 60 s Pingora would wait.
    silent
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut buf = [0u8; 64];
    let n = match silent.read(&mut buf) {
        Ok(n) => n,
        Err(e) if e.kind() == ErrorKind::ConnectionReset => 0,
        Err(e) => panic!("the edge neither closed nor reset the silent connection: {e}"),
    };
    assert_eq!(n, 0, "nothing is sent to a client that never said hello");
    // The listener still serves.
    let visitor = edge.visitor(&[&rustls::version::TLS13]);
    assert_eq!(edge.visit(&visitor).1, "HTTP/1.1 200 OK");
}

#[test]
fn plain_http_on_the_https_port_gets_no_http_answer() {
    let edge = TlsEdge::start(&[]);
    let mut plain = TcpStream::connect(("127.0.0.1", edge.port)).unwrap();
    plain
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    plain
        .write_all(format!("GET / HTTP/1.1\r\nHost: {HOST}\r\n\r\n").as_bytes())
        .unwrap();
    let mut answer = Vec::new();
    let _ = plain.read_to_end(&mut answer);
    assert!(
        !answer.starts_with(b"HTTP/"),
        "the HTTPS listener does not speak plain HTTP: {:?}",
        String::from_utf8_lossy(&answer)
    );
    // The upstream saw nothing of it, and the listener still serves.
    let visitor = edge.visitor(&[&rustls::version::TLS13]);
    assert_eq!(edge.visit(&visitor).1, "HTTP/1.1 200 OK");
    assert_eq!(edge._up.requests().len(), 1);
}

#[test]
fn shutdown_does_not_wait_for_a_connection_still_shaking_hands() {
    let mut edge = TlsEdge::start(&["--shutdown-grace", "30", "--header-timeout", "60"]);
    let visitor = edge.visitor(&[&rustls::version::TLS13]);
    assert_eq!(edge.visit(&visitor).1, "HTTP/1.1 200 OK");
    let mut silent = TcpStream::connect(("127.0.0.1", edge.port)).unwrap();
    silent
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    // The edge has taken the connection once a visit after it is answered: a listener serves
    // its connections in order.
    assert_eq!(edge.visit(&visitor).1, "HTTP/1.1 200 OK");
    let child = &mut edge._edge.0;
    // SAFETY: a signal to the child this test started.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    // Closed at once, not after the 30 s grace (nor the 60 s header timeout).
    let mut buf = [0u8; 16];
    let n = match silent.read(&mut buf) {
        Ok(n) => n,
        Err(e) if e.kind() == ErrorKind::ConnectionReset => 0,
        Err(e) => panic!("the connection still shaking hands was not closed: {e}"),
    };
    assert_eq!(n, 0);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the edge did not exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}");
}
