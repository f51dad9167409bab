//! Pebble (Let's Encrypt's test CA) and its mock DNS on loopback (or on a bridge a test made,
//! [`Pebble::start_on`]), for tests: each instance on its own ports in its own temporary
//! directory, stopped by PID. Shared by the issuer's tests
//! and the end-to-end tests through the daemon (`#[path]`-included there).
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ployz_core::CertificatePolicy;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};

pub const EAB_KID: &str = "ployz-test-kid";
/// base64url of 32 bytes, as Pebble wants its EAB keys.
pub const EAB_HMAC: &str = "zWNDZM6eQGHWpSRTPal5eIUYFTu7EajVIoguysqZ9wG44nMEtx3MUAsUDkMTQ12W";

/// A loopback port free on TCP and UDP, reserved for this test process (see `ployz_testkit`).
pub use ployz_testkit::free_port;

/// The throwaway CA that signs Pebble's API listener certificate (what `pebble_up.sh` makes with
/// openssl), written to `dir`; returns the CA's PEM.
pub fn make_listener_certs(dir: &Path) -> String {
    make_listener_certs_for(dir, &[])
}

/// [`make_listener_certs`] with the listener certificate valid for `addresses` as well.
pub fn make_listener_certs_for(dir: &Path, addresses: &[IpAddr]) -> String {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.distinguished_name.push(
        rcgen::DnType::CommonName,
        "ployz test CA for Pebble's listener (throwaway)",
    );
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
    ];
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).unwrap();
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let mut names = vec![
        "localhost".to_owned(),
        "127.0.0.1".to_owned(),
        "::1".to_owned(),
    ];
    names.extend(addresses.iter().map(|a| a.to_string()));
    let mut leaf_params = rcgen::CertificateParams::new(names).unwrap();
    leaf_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "localhost");
    leaf_params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let leaf = leaf_params.signed_by(&leaf_key, &ca).unwrap();
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
    std::fs::write(dir.join("localhost.pem"), leaf.pem()).unwrap();
    std::fs::write(dir.join("localhost.key"), leaf_key.serialize_pem()).unwrap();
    ca.pem()
}

/// Pebble and its mock DNS, on ports of their own.
pub struct Pebble {
    pub dir: tempfile::TempDir,
    pub acme_port: u16,
    pub mgmt_port: u16,
    pub dns_port: u16,
    pub chall_mgmt_port: u16,
    pub http01_port: u16,
    pub tlsalpn_port: u16,
    pub eab: bool,
    /// Where Pebble and its mock DNS listen.
    pub bind: IpAddr,
    /// What the mock DNS answers for every A query.
    pub default_ipv4: Ipv4Addr,
    /// The CA that signs Pebble's API listener: the client must trust it.
    pub ca_pem: String,
    pub children: Vec<(&'static str, Child)>,
}

impl Pebble {
    /// Starts Pebble validating HTTP-01 against `127.0.0.1:http01_port`. With `eab`, Pebble
    /// demands an external account binding with [`EAB_KID`]/[`EAB_HMAC`].
    pub fn start(http01_port: u16, eab: bool) -> Pebble {
        Pebble::start_with_dns(http01_port, eab, free_port())
    }

    /// [`Pebble::start`] with its mock DNS on `dns_port` (a daemon may be told to ask it).
    pub fn start_with_dns(http01_port: u16, eab: bool, dns_port: u16) -> Pebble {
        Pebble::start_at(
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            http01_port,
            eab,
            dns_port,
            Ipv4Addr::LOCALHOST,
        )
    }

    /// Pebble and its mock DNS listening on `bind` (a bridge the test made), the mock DNS
    /// answering `default_ipv4` for every name, so Pebble validates HTTP-01 on
    /// `default_ipv4:http01_port`.
    pub fn start_on(
        bind: IpAddr,
        http01_port: u16,
        dns_port: u16,
        default_ipv4: Ipv4Addr,
    ) -> Pebble {
        Pebble::start_at(bind, http01_port, false, dns_port, default_ipv4)
    }

    fn start_at(
        bind: IpAddr,
        http01_port: u16,
        eab: bool,
        dns_port: u16,
        default_ipv4: Ipv4Addr,
    ) -> Pebble {
        assert!(
            Path::new("/usr/bin/pebble").exists() || which("pebble").is_some(),
            "pebble is not installed: `apt-get install -y pebble` (scripts/setup.sh does it)"
        );
        let dir = tempfile::tempdir().unwrap();
        let ca_pem = make_listener_certs_for(dir.path(), &[bind]);
        let mut p = Pebble {
            dir,
            acme_port: free_port(),
            mgmt_port: free_port(),
            dns_port,
            chall_mgmt_port: free_port(),
            http01_port,
            tlsalpn_port: free_port(),
            eab,
            bind,
            default_ipv4,
            ca_pem,
            children: Vec::new(),
        };
        p.write_config();
        p.spawn();
        p
    }

    fn write_config(&self) {
        let d = self.dir.path();
        let mut pebble = serde_json::json!({
            "listenAddress": std::net::SocketAddr::new(self.bind, self.acme_port).to_string(),
            "managementListenAddress": std::net::SocketAddr::new(self.bind, self.mgmt_port).to_string(),
            "certificate": d.join("localhost.pem"),
            "privateKey": d.join("localhost.key"),
            "httpPort": self.http01_port,
            "tlsPort": self.tlsalpn_port,
            "ocspResponderURL": "",
            "externalAccountBindingRequired": self.eab,
        });
        if self.eab {
            pebble["externalAccountMACKeys"] = serde_json::json!({ EAB_KID: EAB_HMAC });
        }
        std::fs::write(
            d.join("pebble-config.json"),
            serde_json::to_vec_pretty(&serde_json::json!({ "pebble": pebble })).unwrap(),
        )
        .unwrap();
    }

    fn log(&self, name: &str) -> std::fs::File {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("{name}.log")))
            .unwrap()
    }

    fn spawn(&mut self) {
        // Mock DNS only: every A query -> `default_ipv4`, no AAAA, no challenge listeners of its own
        // (the HTTP-01 port stays free for the stand-in edge).
        let dns = Command::new("pebble-challtestsrv")
            .args([
                "-management",
                &std::net::SocketAddr::new(self.bind, self.chall_mgmt_port).to_string(),
                "-dns01",
                &std::net::SocketAddr::new(self.bind, self.dns_port).to_string(),
                "-http01",
                "",
                "-https01",
                "",
                "-tlsalpn01",
                "",
                "-defaultIPv4",
                &self.default_ipv4.to_string(),
                "-defaultIPv6",
                "",
            ])
            .stdin(Stdio::null())
            .stdout(self.log("challtestsrv"))
            .stderr(self.log("challtestsrv"))
            .spawn()
            .expect("pebble-challtestsrv starts");
        self.children.push(("challtestsrv", dns));
        let pebble = Command::new("pebble")
            .args([
                "-config",
                self.dir.path().join("pebble-config.json").to_str().unwrap(),
                "-dnsserver",
                &std::net::SocketAddr::new(self.bind, self.dns_port).to_string(),
                "-strict=false",
            ])
            // No random validation sleeps; Pebble's default 5% nonce rejection and 50%
            // authorization reuse stay on: the issuer must cope with both.
            .env("PEBBLE_VA_NOSLEEP", "1")
            .env("PEBBLE_VA_ALWAYS_VALID", "0")
            .stdin(Stdio::null())
            .stdout(self.log("pebble"))
            .stderr(self.log("pebble"))
            .spawn()
            .expect("pebble starts");
        self.children.push(("pebble", pebble));
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if https_get_at(&self.ca_pem, self.bind, self.acme_port, "/dir").is_ok() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "pebble did not come up; log:\n{}",
                std::fs::read_to_string(self.dir.path().join("pebble.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Stops both processes by PID: SIGTERM, a bounded wait, then SIGKILL.
    pub fn stop(&mut self) {
        for (_, child) in &self.children {
            // SAFETY: kill(2) on a PID we spawned and have not reaped yet.
            unsafe {
                libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
            }
        }
        for (name, mut child) in self.children.drain(..) {
            let deadline = Instant::now() + Duration::from_secs(3);
            loop {
                match child.try_wait() {
                    Ok(Some(_)) => break,
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(50))
                    }
                    _ => {
                        eprintln!("{name} ignored SIGTERM; killing it");
                        let _ = child.kill();
                        let _ = child.wait();
                        break;
                    }
                }
            }
        }
    }

    /// Starts Pebble again on the same ports (it forgets every account and order).
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    pub fn directory_url(&self) -> String {
        format!(
            "https://{}/dir",
            std::net::SocketAddr::new(self.bind, self.acme_port)
        )
    }

    /// The root that signs what Pebble issues (new on every Pebble start).
    pub fn issuing_root(&self) -> String {
        https_get_at(&self.ca_pem, self.bind, self.mgmt_port, "/roots/0").expect("pebble's root")
    }

    /// A Certificate Policy for this Pebble: its directory, its listener CA, quick backoff.
    pub fn policy(&self) -> CertificatePolicy {
        CertificatePolicy {
            directory_url: Some(self.directory_url()),
            ca_bundle_pem: Some(self.ca_pem.clone()),
            backoff_min_secs: Some(1),
            backoff_max_secs: Some(4),
            probe_timeout_ms: Some(1_000),
            ..Default::default()
        }
    }
}

impl Drop for Pebble {
    fn drop(&mut self) {
        self.stop();
    }
}

pub fn which(cmd: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(cmd))
        .find(|p| p.exists())
}

/// A blocking HTTPS GET to 127.0.0.1:`port`, trusting `ca_pem`.
pub fn https_get(ca_pem: &str, port: u16, path: &str) -> Result<String, String> {
    https_get_at(ca_pem, IpAddr::V4(Ipv4Addr::LOCALHOST), port, path)
}

/// A blocking HTTPS GET to `addr:port`, trusting `ca_pem`.
pub fn https_get_at(ca_pem: &str, addr: IpAddr, port: u16, path: &str) -> Result<String, String> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots
            .add(c.map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let conn =
        rustls::ClientConnection::new(Arc::new(config), ServerName::try_from("localhost").unwrap())
            .map_err(|e| e.to_string())?;
    let sock = std::net::TcpStream::connect((addr, port)).map_err(|e| e.to_string())?;
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, sock);
    write!(
        tls,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut response = Vec::new();
    match tls.read_to_end(&mut response) {
        Ok(_) => {}
        // Go's server may close without close_notify.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !response.is_empty() => {}
        Err(e) => return Err(e.to_string()),
    }
    let text = String::from_utf8_lossy(&response).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").ok_or("no HTTP response")?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(head.lines().next().unwrap_or_default().to_owned());
    }
    Ok(body.to_owned())
}
