//! `x-routes` end to end: Services sharing one Ingress Hostname by path through a real daemon
//! and dockerd, on the HTTP/1 fast path and through Pingora's proxy alone; the path one of
//! them routes refused to another; `ployz routes` showing the table the edge serves; and the
//! rules a route adds: basic authentication, a timeout, a body limit and error pages.

mod common;

use common::*;

const HOST: &str = "shop.test.localhost";

/// `site` serves the hostname whole; `api` serves `/api` with the prefix stripped; `health`
/// serves `/api/health` alone. Each answers with its name and the path it was asked for.
const SHARED: &str = r#"
services:
  site:
    image: IMAGE
    command: ["sh", "-c", "mkdir -p /www && echo site-root > /www/index.html && echo site-docs > /www/api-docs && echo site-users > /www/users && exec httpd -f -p 8080 -h /www"]
    x-ports: [shop.test.localhost:8080/http, www.shop.test.localhost:8080/http]
    x-routes:
      - {hostname: www.shop.test.localhost, redirect: http://shop.test.localhost}
      - {hostname: www.shop.test.localhost, path: /old, strip_prefix: true, redirect: http://shop.test.localhost/new, status: 301}
  api:
    image: IMAGE
    command: ["sh", "-c", "mkdir -p /www/v1 && echo api-users > /www/users && echo api-index > /www/index.html && echo api-v1 > /www/v1/orders && exec httpd -f -p 8080 -h /www"]
    x-ports: [shop.test.localhost:8080/http]
    x-routes:
      - path: /api/
        strip_prefix: true
      - {path: /api/admin, allow: [192.0.2.0/24]}
  echo:
    image: IMAGE
    command: ["sh", "-c", "mkdir -p /www/cgi-bin && printf '#!/bin/sh\\necho Content-Type: text/plain\\necho X-Internal: secret\\necho\\nenv | grep ^HTTP_ | sort\\n' > /www/cgi-bin/echo && chmod +x /www/cgi-bin/echo && exec httpd -f -p 8080 -h /www"]
    x-ports: [shop.test.localhost:8080/http]
    x-routes:
      - path: /cgi-bin
        allow: [127.0.0.0/8, "::1"]
        request_headers: {set: {X-Tenant: acme}, add: {X-Extra: one}, remove: [Cookie]}
        response_headers: {set: {Strict-Transport-Security: max-age=63072000}, add: {X-Served-By: ployz}, remove: [X-Internal]}
  health:
    image: IMAGE
    command: ["sh", "-c", "mkdir -p /www/api && echo health-ok > /www/api/health && exec httpd -f -p 8080 -h /www"]
    x-ports: [shop.test.localhost:8080/http]
    x-routes:
      - exact: /api/health
"#;

const CLAIMS_API: &str = r#"
services:
  other:
    image: IMAGE
    command: ["sh", "-c", "exec httpd -f -p 8080 -h /"]
    x-ports: [shop.test.localhost:8080/http]
    x-routes:
      - path: /api
"#;

/// One GET with `extra` header lines on its own connection: the whole answer.
fn raw_get(port: u16, host: &str, path: &str, extra: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    let _ = s.read_to_string(&mut raw);
    raw
}

/// One GET on its own connection: (status, `Location`).
fn location(port: u16, host: &str, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    let _ = s.read_to_string(&mut raw);
    let status = raw
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let location = raw
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .starts_with("location:")
                .then(|| l[9..].trim().to_owned())
        })
        .unwrap_or_default();
    (status, location)
}

fn services_share_a_hostname_by_path(position: Position) {
    let lab = Lab::new();
    let name = match position {
        Position::FastPath => "routes1",
        Position::PingoraOnly => "routes2",
    };
    let m = DockerMachine::with(&lab, name, &[QUIET_DAEMON, position.args()].concat(), &[]);
    std::fs::write(
        lab.path("compose.yaml"),
        SHARED.replace("IMAGE", TEST_IMAGE),
    )
    .unwrap();
    let out = run(&lab, &m, &["deploy", "-y"]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));

    // Each Serving Container is in the table once its health settles: wait for all three.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while http_get(m.daemon.http_port, HOST, "/api/health") != (200, "health-ok\n".into())
        || http_get(m.daemon.http_port, HOST, "/api/users") != (200, "api-users\n".into())
        || http_get(m.daemon.http_port, HOST, "/") != (200, "site-root\n".into())
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the routes never served"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    for (path, want) in [
        // The whole hostname.
        ("/", (200, "site-root\n")),
        ("/users", (200, "site-users\n")),
        // A prefix takes only whole segments: /api-docs is not under /api.
        ("/api-docs", (200, "site-docs\n")),
        // The prefix, stripped: the container is asked for /users, /, /v1/orders.
        ("/api/users", (200, "api-users\n")),
        ("/api/users?page=2", (200, "api-users\n")),
        ("/api", (200, "api-index\n")),
        ("/api/", (200, "api-index\n")),
        ("/api/v1/orders", (200, "api-v1\n")),
        // An exact path wins over the prefix, and is not stripped.
        ("/api/health", (200, "health-ok\n")),
        ("/api/health?full=1", (200, "health-ok\n")),
    ] {
        let (status, body) = http_get(m.daemon.http_port, HOST, path);
        assert_eq!((status, body.as_str()), want, "{path} on {position:?}");
    }
    // Redirects the edge answers itself, the path and query kept (less a stripped prefix).
    for (path, want) in [
        ("/", (308, "http://shop.test.localhost/")),
        ("/a/b?c=1", (308, "http://shop.test.localhost/a/b?c=1")),
        ("/old/x?y=2", (301, "http://shop.test.localhost/new/x?y=2")),
        ("/old", (301, "http://shop.test.localhost/new/")),
    ] {
        let got = location(m.daemon.http_port, "www.shop.test.localhost", path);
        assert_eq!((got.0, got.1.as_str()), want, "{path} on {position:?}");
    }

    // Header rules: the request's, then the response's.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let answer = loop {
        let raw = raw_get(
            m.daemon.http_port,
            HOST,
            "/cgi-bin/echo",
            "X-Tenant: evil\r\nCookie: session=1\r\n",
        );
        if raw.starts_with("HTTP/1.1 200") {
            break raw;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the echo route never served: {raw}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    let head = head.to_ascii_lowercase();
    assert!(
        body.contains("HTTP_X_TENANT=acme") && !body.contains("evil"),
        "{body}"
    );
    assert!(body.contains("HTTP_X_EXTRA=one"), "{body}");
    assert!(!body.contains("HTTP_COOKIE"), "{body}");
    assert!(
        head.contains("\r\nstrict-transport-security: max-age=63072000"),
        "{head}"
    );
    assert!(head.contains("\r\nx-served-by: ployz"), "{head}");
    assert!(!head.contains("x-internal"), "{head}");

    // An allow list: the client here is 127.0.0.1, which /cgi-bin admits and /api/admin not.
    let (status, body) = http_get(m.daemon.http_port, HOST, "/api/admin/users");
    assert_eq!(
        (status, body.as_str()),
        (403, "this path admits only some client addresses\n")
    );

    // A path another server could read as one of the routes' is refused rather than routed
    // past that route's rules (here the allow list of /api/admin).
    for path in [
        "/%61pi/admin/users",
        "/x/../api/admin/users",
        "/api/%2e%2e/api/admin",
        "//api/admin",
        "/api/admin;x=1",
    ] {
        let (status, body) = http_get(m.daemon.http_port, HOST, path);
        assert_eq!(status, 400, "{path} on {position:?}: {body}");
        assert!(body.contains("not in its plain form"), "{body}");
    }

    // Nothing under /api/health/ is the exact path: it goes to the prefix's container, which
    // has no such file.
    assert_eq!(http_get(m.daemon.http_port, HOST, "/api/health/x").0, 404);

    // The table as the edge serves it.
    let routes = json(&run(&lab, &m, &["routes", "--json"]));
    let shown: Vec<(String, String, bool, usize)> = routes["routes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["service"].as_str().unwrap().to_owned(),
                serde_json::to_string(&r["path"]).unwrap(),
                r["strips"].as_bool().unwrap(),
                r["upstreams"].as_array().unwrap().len(),
            )
        })
        .collect();
    assert_eq!(
        shown,
        [
            ("site".to_owned(), r#"{"prefix":"/"}"#.to_owned(), false, 1),
            ("api".to_owned(), r#"{"prefix":"/api"}"#.to_owned(), true, 1),
            (
                "api".to_owned(),
                r#"{"prefix":"/api/admin"}"#.to_owned(),
                false,
                1
            ),
            (
                "echo".to_owned(),
                r#"{"prefix":"/cgi-bin"}"#.to_owned(),
                false,
                1
            ),
            (
                "health".to_owned(),
                r#"{"exact":"/api/health"}"#.to_owned(),
                false,
                1
            ),
            ("site".to_owned(), r#"{"prefix":"/"}"#.to_owned(), false, 0),
            (
                "site".to_owned(),
                r#"{"prefix":"/old"}"#.to_owned(),
                true,
                0
            ),
        ],
        "{routes:#}"
    );
    assert_eq!(
        routes["routes"][6]["redirect"],
        serde_json::json!({"to": "http://shop.test.localhost/new", "status": 301})
    );
    let text = stdout(&run(&lab, &m, &["routes"]));
    for part in [
        "redirects (301) to http://shop.test.localhost/new",
        "HOSTNAME",
        HOST,
        "/api/* (stripped)",
        "= /api/health",
        "/*",
        "local",
    ] {
        assert!(text.contains(part), "{part}\n{text}");
    }

    // Another Service taking /api of the hostname is refused before anything runs.
    std::fs::write(
        lab.path("other.yaml"),
        CLAIMS_API.replace("IMAGE", TEST_IMAGE),
    )
    .unwrap();
    let out = run(&lab, &m, &["deploy", "-y", "-f", "other.yaml"]);
    assert!(!out.status.success(), "{}", stdout(&out));
    let said = format!("{}{}", stdout(&out), stderr(&out));
    assert!(
        said.contains(
            "service 'other' routes /api/* of 'shop.test.localhost', which Service 'api' ("
        ),
        "{said}"
    );
    assert!(
        !m.docker_containers()
            .iter()
            .any(|(n, _)| n.starts_with("other-")),
        "{:?}",
        m.docker_containers()
    );
}

in_both_positions!(
    #[ignore = "needs dockerd (scripts/test.sh runs it)"]
    services_share_a_hostname_by_path
);

/// `/admin` asks for the users of a file (bcrypt), `/staff` for those of a secret (argon2);
/// `/slow` lets its container take 1 s and answers the edge's 504 with its own page; `/upload`
/// takes bodies of 1 KiB at most.
const RULES: &str = r#"
secrets:
  staff: {file: ./staff.htpasswd}
services:
  guarded:
    image: IMAGE
    command: ["sh", "-c", "mkdir -p /www/admin /www/staff /www/cgi-bin && echo admin-page > /www/admin/index.html && echo staff-page > /www/staff/index.html && printf '#!/bin/sh\\nsleep 3\\necho Content-Type: text/plain\\necho\\necho late\\n' > /www/cgi-bin/slow && printf '#!/bin/sh\\necho Content-Type: text/plain\\necho\\nwc -c\\n' > /www/cgi-bin/upload && chmod +x /www/cgi-bin/* && exec httpd -f -p 8080 -h /www"]
    x-ports: [rules.test.localhost:8080/http]
    x-routes:
      - path: /admin
        basic_auth: {users_file: ./admins.htpasswd, realm: Admins}
      - path: /staff
        basic_auth: {users_secret: staff}
      - path: /cgi-bin/slow
        timeout: 1s
        error_pages: {504: ./504.html}
      - path: /cgi-bin/upload
        max_body_size: 1k
"#;

/// The `Authorization` field of a user and password.
fn basic(user: &str, password: &str) -> String {
    use base64::Engine as _;
    format!(
        "Authorization: Basic {}\r\n",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
    )
}

/// The status of a raw answer.
fn status_of(raw: &str) -> u16 {
    raw.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

fn route_rules_authenticate_time_out_and_limit_bodies(position: Position) {
    let lab = Lab::new();
    let name = match position {
        Position::FastPath => "rules1",
        Position::PingoraOnly => "rules2",
    };
    let m = DockerMachine::with(&lab, name, &[QUIET_DAEMON, position.args()].concat(), &[]);
    let admin_hash = bcrypt::hash("open sesame", 4).unwrap();
    let staff_hash = {
        use argon2::password_hash::{PasswordHasher, SaltString};
        let salt = SaltString::encode_b64(b"route-rules-salt").unwrap();
        argon2::Argon2::default()
            .hash_password(b"staff-pass", &salt)
            .unwrap()
            .to_string()
    };
    std::fs::write(
        lab.path("admins.htpasswd"),
        format!("# admins\nalice:{admin_hash}\n"),
    )
    .unwrap();
    std::fs::write(lab.path("staff.htpasswd"), format!("bob:{staff_hash}\n")).unwrap();
    std::fs::write(lab.path("504.html"), "<h1>still thinking</h1>\n").unwrap();
    std::fs::write(lab.path("compose.yaml"), RULES.replace("IMAGE", TEST_IMAGE)).unwrap();

    // A plain password is refused before anything runs, naming the line and never the value.
    std::fs::write(lab.path("plain.htpasswd"), "alice:open sesame\n").unwrap();
    let plain = RULES
        .replace("IMAGE", TEST_IMAGE)
        .replace("./admins.htpasswd", "./plain.htpasswd");
    std::fs::write(lab.path("plain.yaml"), plain).unwrap();
    let out = run(&lab, &m, &["deploy", "-y", "-f", "plain.yaml"]);
    let said = format!("{}{}", stdout(&out), stderr(&out));
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("x-routes[0].basic_auth.users_file")
            && said.contains("line 1 has a hash that is not bcrypt or argon2"),
        "{said}"
    );
    assert!(!said.contains("open sesame"), "{said}");
    assert!(
        m.docker_containers().is_empty(),
        "{:?}",
        m.docker_containers()
    );

    let out = run(&lab, &m, &["deploy", "-y"]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let port = m.daemon.http_port;
    let get = |path: &str, extra: &str| raw_get(port, "rules.test.localhost", path, extra);

    // Serving once the container's health settles and the users lists reached the edge.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while status_of(&get("/admin/", &basic("alice", "open sesame"))) != 200
        || status_of(&get("/staff/", &basic("bob", "staff-pass"))) != 200
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the guarded routes never served: {}",
            get("/admin/", &basic("alice", "open sesame"))
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let answer = get("/admin/", &basic("alice", "open sesame"));
    assert!(answer.ends_with("admin-page\n"), "{answer}");
    let answer = get("/staff/", &basic("bob", "staff-pass"));
    assert!(answer.ends_with("staff-page\n"), "{answer}");
    for (path, field) in [
        ("/admin/", String::new()),
        ("/admin/", basic("alice", "wrong")),
        ("/admin/", basic("bob", "staff-pass")),
        (
            "/admin/",
            "Authorization: Bearer open-sesame\r\n".to_owned(),
        ),
        ("/staff/", basic("alice", "open sesame")),
    ] {
        let answer = get(path, &field);
        assert_eq!(status_of(&answer), 401, "{path} {field}: {answer}");
        let realm = if path == "/admin/" {
            "Admins"
        } else {
            "restricted"
        };
        assert!(
            answer.to_ascii_lowercase().contains(&format!(
                "www-authenticate: basic realm=\"{}\"",
                realm.to_ascii_lowercase()
            )),
            "{answer}"
        );
        assert!(!answer.contains("-page"), "{answer}");
    }

    // The container took longer than the route's timeout: the edge's 504, with the route's page
    // (without the timeout the CGI's late 200 would come back).
    let answer = get("/cgi-bin/slow", "");
    assert_eq!(status_of(&answer), 504, "{answer}");
    assert!(answer.ends_with("<h1>still thinking</h1>\n"), "{answer}");

    // A body over the route's limit is refused, declared or chunked; one under it goes through.
    let (status, body) = http_request(
        port,
        "POST",
        "rules.test.localhost",
        "/cgi-bin/upload",
        &"x".repeat(1000),
    );
    // The CGI answer has no length, so it comes chunked: the count is one line of it.
    assert!(
        status == 200 && body.lines().any(|l| l == "1000"),
        "{status} {body:?}"
    );
    let (status, _) = http_request(
        port,
        "POST",
        "rules.test.localhost",
        "/cgi-bin/upload",
        &"x".repeat(1025),
    );
    assert_eq!(status, 413);
    let chunked = {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        let chunk = "y".repeat(800);
        write!(
            s,
            "POST /cgi-bin/upload HTTP/1.1\r\nHost: rules.test.localhost\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n320\r\n{chunk}\r\n320\r\n{chunk}\r\n0\r\n\r\n"
        )
        .unwrap();
        let mut raw = String::new();
        let _ = s.read_to_string(&mut raw);
        raw
    };
    assert_eq!(status_of(&chunked), 413, "{chunked}");

    // `ployz routes` says which rules each route has.
    let routes = json(&run(&lab, &m, &["routes", "--json"]));
    let rules = |path: &str| -> Vec<String> {
        routes["routes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["path"]["prefix"] == path)
            .map(|r| serde_json::from_value(r["rules"].clone()).unwrap_or_default())
            .unwrap_or_else(|| panic!("no route {path}: {routes:#}"))
    };
    assert_eq!(rules("/admin"), ["basic auth 'Admins'"]);
    assert_eq!(rules("/cgi-bin/slow"), ["timeout 1s", "own pages for 504"]);
    assert_eq!(rules("/cgi-bin/upload"), ["body at most 1024 bytes"]);

    // The users lists travel by digest: no label, no inspect output carries a hash.
    let (container, _) = m
        .docker_containers()
        .into_iter()
        .find(|(n, _)| n.starts_with("guarded-"))
        .unwrap();
    let inspected = stdout(&docker(&["inspect", &container]));
    let shown = stdout(&run(&lab, &m, &["inspect", "guarded", "--json"]));
    for text in [&inspected, &shown] {
        assert!(!text.contains(&admin_hash[7..]), "{text}");
        assert!(!text.contains("argon2id"), "{text}");
    }
    assert!(
        inspected.contains("\\\"digest\\\":\\\"sha256:"),
        "{inspected}"
    );
}

in_both_positions!(
    #[ignore = "needs dockerd (scripts/test.sh runs it)"]
    route_rules_authenticate_time_out_and_limit_bodies
);

/// An Ingress Port end to end: the edge listens on it and forwards each connection to the
/// Service's container; `ployz routes` shows it; another Service taking the port is refused
/// before anything runs; and a Deploy without it closes it.
#[test]
#[ignore = "needs dockerd (scripts/test.sh runs it)"]
fn an_ingress_port_forwards_tcp_connections_to_the_service() {
    let lab = Lab::new();
    let m = DockerMachine::with(&lab, "ports1", QUIET_DAEMON, &[]);
    let port = free_tcp_port();
    std::fs::write(lab.path("compose.yaml"), raw_tcp_compose(port)).unwrap();
    let out = run(&lab, &m, &["deploy", "-y"]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));

    // Any bytes: here an HTTP request the edge does not read, with a Host it does not know.
    let ask = || {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
        s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        s.write_all(b"GET / HTTP/1.0\r\nHost: no.such.host\r\n\r\n")
            .ok()?;
        let mut raw = String::new();
        let _ = s.read_to_string(&mut raw);
        Some(raw)
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let answer = loop {
        match ask() {
            Some(raw) if raw.ends_with("raw-tcp\n") => break raw,
            other => assert!(
                std::time::Instant::now() < deadline,
                "the Ingress Port never forwarded: {other:?}\n{}",
                m.daemon.log_text()
            ),
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");

    let routes = json(&run(&lab, &m, &["routes", "--json"]));
    let ports = routes["ingress_ports"].as_array().unwrap();
    assert_eq!(ports.len(), 1, "{routes:#}");
    assert_eq!(ports[0]["port"], port);
    assert_eq!(ports[0]["protocol"], "tcp");
    assert_eq!(ports[0]["service"], "raw");
    assert_eq!(ports[0]["upstreams"].as_array().unwrap().len(), 1);
    let text = stdout(&run(&lab, &m, &["routes"]));
    assert!(
        text.contains(&format!("{port}/tcp")) && text.contains("raw"),
        "{text}"
    );

    // Another Service taking the port: refused, naming both, before any container starts.
    std::fs::write(
        lab.path("other.yaml"),
        format!(
            "services:\n  other:\n    image: {TEST_IMAGE}\n    command: [\"sh\", \"-c\", \"exec httpd -f -p 8080 -h /\"]\n    x-ports: ['{port}:8080/tcp']\n"
        ),
    )
    .unwrap();
    let out = run(&lab, &m, &["deploy", "-y", "-f", "other.yaml"]);
    let said = format!("{}{}", stdout(&out), stderr(&out));
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains(&format!(
            "service 'other' takes port {port}/tcp, which Service 'raw' ("
        )),
        "{said}"
    );
    assert!(
        !m.docker_containers()
            .iter()
            .any(|(n, _)| n.starts_with("other-")),
        "{:?}",
        m.docker_containers()
    );

    // Without the port in the Service, the edge stops listening on it.
    std::fs::write(
        lab.path("compose.yaml"),
        format!(
            "services:\n  raw:\n    image: {TEST_IMAGE}\n    command: [\"sh\", \"-c\", \"mkdir -p /www && echo raw-tcp > /www/index.html && exec httpd -f -p 8080 -h /www\"]\n"
        ),
    )
    .unwrap();
    let out = run(&lab, &m, &["deploy", "-y"]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "the edge still listens on {port}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// SIGTERM closes the Ingress Ports with the edge's listeners, and a TCP connection under way
/// through one goes on to its end within the grace period rather than being cut. Meanwhile
/// both the Ingress Port and the edge's HTTP port refuse connections, rather than take them
/// for no one to answer.
#[test]
#[ignore = "needs dockerd (scripts/test.sh runs it)"]
fn at_sigterm_an_ingress_port_closes_and_its_connection_goes_on() {
    use std::io::{Read, Write};
    let lab = Lab::new();
    let mut m = DockerMachine::with(&lab, "ports2", QUIET_DAEMON, &[]);
    let port = free_tcp_port();
    std::fs::write(lab.path("compose.yaml"), raw_tcp_compose(port)).unwrap();
    let out = run(&lab, &m, &["deploy", "-y"]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let ask = || -> Option<String> {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
        s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        s.write_all(b"GET / HTTP/1.0\r\n\r\n").ok()?;
        let mut raw = String::new();
        s.read_to_string(&mut raw).ok()?;
        raw.ends_with("raw-tcp\n").then_some(raw)
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while ask().is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "the Ingress Port never forwarded\n{}",
            m.daemon.log_text()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // A connection whose request comes only after SIGTERM; one answered after it was made
    // proves the edge took it (one acceptor, connections taken in order).
    let mut held = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    held.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    assert!(ask().is_some(), "a connection after it was not answered");
    // SAFETY: a signal to the daemon this test started.
    unsafe {
        libc::kill(m.daemon.pid() as i32, libc::SIGTERM);
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "the Ingress Port still takes connections after SIGTERM\n{}",
            m.daemon.log_text()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let http = m.daemon.http_port;
    while std::net::TcpStream::connect(("127.0.0.1", http)).is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "the edge's HTTP port still takes connections after SIGTERM\n{}",
            m.daemon.log_text()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    held.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    let mut raw = String::new();
    let read = held.read_to_string(&mut raw);
    assert!(
        read.is_ok() && raw.ends_with("raw-tcp\n"),
        "the connection under way was cut: {read:?} {raw:?}\n{}",
        m.daemon.log_text()
    );
    drop(held);
    let exited = m.daemon.wait_exited(std::time::Duration::from_secs(30));
    assert!(
        exited.is_some_and(|s| s.success()),
        "the daemon did not stop once the connection ended: {exited:?}\n{}",
        m.daemon.log_text()
    );
}
