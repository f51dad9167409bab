//! The daemon's configuration: built-in defaults, then an optional TOML file, then flags.
//!
//! [`DaemonConfig`] is the configuration the daemon actually runs with; [`DaemonConfigFile`] is
//! the TOML front-end that lowers into it. `configs/daemon.toml` documents every key with its
//! default, and a test keeps it equal to [`DaemonConfig::default`].

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde::Deserialize;

/// Where the daemon keeps its data unless told otherwise.
pub const DEFAULT_DATA_DIR: &str = "/var/lib/ployz";
/// Where the management API listens unless told otherwise.
pub const DEFAULT_SOCKET: &str = "/run/ployz/ployz.sock";
/// The group given access to the socket when it exists.
pub const DEFAULT_SOCKET_GROUP: &str = "ployz";
/// The edge's HTTP listener unless told otherwise.
pub const DEFAULT_HTTP_LISTEN: &str = "0.0.0.0:80";
/// The edge's HTTPS listener unless told otherwise.
pub const DEFAULT_HTTPS_LISTEN: &str = "0.0.0.0:443";
/// The metrics listener unless told otherwise (loopback: metrics are not public).
pub const DEFAULT_METRICS_LISTEN: &str = "127.0.0.1:51090";

/// How log lines are written to stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// One human-readable line per event.
    #[default]
    Text,
    /// One JSON object per event.
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(format!("log format '{other}' is not one of: text, json")),
        }
    }
}

/// What the edge does with request header fields whose names contain `_` (`X_Forwarded_For`):
/// applications that read `_` and `-` alike could take one for a field the edge writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum UnderscoreHeaders {
    /// Left out of the request the upstream gets (as nginx does by default).
    #[default]
    Drop,
    /// Passed on as sent.
    Pass,
}

impl std::str::FromStr for UnderscoreHeaders {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "drop" => Ok(UnderscoreHeaders::Drop),
            "pass" => Ok(UnderscoreHeaders::Pass),
            other => Err(format!(
                "underscore header policy '{other}' is not one of: drop, pass"
            )),
        }
    }
}

/// The configuration the daemon runs with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonConfig {
    /// Identity, keys and the store live here.
    pub data_dir: PathBuf,
    /// The management API's unix socket (mode 0660).
    pub socket: PathBuf,
    /// The group that owns the socket, when such a group exists on this system.
    pub socket_group: String,
    /// Log line format.
    pub log_format: LogFormat,
    /// Where Docker listens (`unix:///path`); `None`: `DOCKER_HOST` or the default socket.
    pub docker_host: Option<String>,
    /// The edge's plain-HTTP listener.
    pub http_listen: String,
    /// The edge's HTTPS listener.
    pub https_listen: String,
    /// Prometheus metrics (`GET /metrics`).
    pub metrics_listen: String,
    /// Header bytes per request before 431.
    pub max_header_bytes: usize,
    /// Request target bytes before 414.
    pub max_uri_bytes: usize,
    /// Request body bytes before 413; `None`: unlimited.
    pub max_body_bytes: Option<u64>,
    /// Seconds a client has to send a whole request header (against slowloris).
    pub header_timeout_seconds: u64,
    /// One access-log line per edge request.
    pub access_log: bool,
    /// Milliseconds a connection to an upstream may take; then the edge tries the next
    /// Serving Container and avoids the silent one for a while.
    pub upstream_connect_timeout_ms: u64,
    /// Request header fields named with `_`: dropped or passed on.
    pub underscore_headers: UnderscoreHeaders,
    /// The edge's HTTP/1 fast path; off: every request goes through Pingora's proxy.
    pub fast_path: bool,
    /// After SIGTERM, how long the edge keeps serving with its health endpoint answering 503
    /// and every HTTP/1 response saying `Connection: close`, so load balancers and clients
    /// move away before its listeners close.
    pub drain_delay_seconds: u64,
    /// After the edge's listeners closed, how long requests in flight may take; shutdown goes
    /// on as soon as none is left.
    pub shutdown_grace_seconds: u64,
    /// After the grace period, how long in-flight work may take before it is cut.
    pub shutdown_timeout_seconds: u64,
    /// Order and renew certificates by ACME for Ingress Hostnames published with `https`.
    pub certificates: bool,
    /// The DNS server (`ADDR:PORT`) the Cluster DNS Verdict asks; `None`: the system's.
    pub verdict_resolver: Option<String>,
    /// Where the internal DNS listens: `gateway` (the Machine Gateway, port 53), `ADDR:PORT`,
    /// or `off`.
    pub dns_listen: String,
    /// Where the internal DNS forwards names outside `.internal`; empty: the nameservers of
    /// `/etc/resolv.conf`.
    pub dns_upstreams: Vec<String>,
    /// Start even though the data dir lost acknowledged data (the store, its acknowledgement
    /// record, the WireGuard key), keeping what is left. A flag only, never in the file: it
    /// is meant for one start.
    pub accept_data_loss: bool,
}

impl Default for DaemonConfig {
    fn default() -> Self {
        DaemonConfig {
            data_dir: DEFAULT_DATA_DIR.into(),
            socket: DEFAULT_SOCKET.into(),
            socket_group: DEFAULT_SOCKET_GROUP.into(),
            log_format: LogFormat::Text,
            docker_host: None,
            http_listen: DEFAULT_HTTP_LISTEN.into(),
            https_listen: DEFAULT_HTTPS_LISTEN.into(),
            metrics_listen: DEFAULT_METRICS_LISTEN.into(),
            max_header_bytes: 16 * 1024,
            max_uri_bytes: 8 * 1024,
            max_body_bytes: None,
            header_timeout_seconds: 15,
            access_log: true,
            upstream_connect_timeout_ms: 2000,
            underscore_headers: UnderscoreHeaders::Drop,
            fast_path: true,
            drain_delay_seconds: 5,
            shutdown_grace_seconds: 10,
            shutdown_timeout_seconds: 5,
            certificates: true,
            verdict_resolver: None,
            dns_listen: "gateway".into(),
            dns_upstreams: Vec::new(),
            accept_data_loss: false,
        }
    }
}

/// The TOML file's shape. Every key is optional; unknown keys are refused.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DaemonConfigFile {
    pub data_dir: Option<PathBuf>,
    pub socket: Option<PathBuf>,
    pub socket_group: Option<String>,
    pub log_format: Option<LogFormat>,
    pub docker_host: Option<String>,
    pub http_listen: Option<String>,
    pub https_listen: Option<String>,
    pub metrics_listen: Option<String>,
    pub access_log: Option<bool>,
    pub limits: Option<LimitsSection>,
    pub edge: Option<EdgeSection>,
    pub shutdown: Option<ShutdownSection>,
    pub certificates: Option<CertificatesSection>,
    pub dns: Option<DnsSection>,
}

/// `[edge]` in the TOML file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EdgeSection {
    pub upstream_connect_timeout_ms: Option<u64>,
    pub underscore_headers: Option<UnderscoreHeaders>,
    pub fast_path: Option<bool>,
}

/// `[dns]` in the TOML file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DnsSection {
    pub listen: Option<String>,
    pub upstreams: Option<Vec<String>>,
}

/// `[certificates]` in the TOML file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CertificatesSection {
    pub enabled: Option<bool>,
    pub verdict_resolver: Option<String>,
}

/// `[limits]` in the TOML file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsSection {
    pub max_header_bytes: Option<usize>,
    pub max_uri_bytes: Option<usize>,
    pub max_body_bytes: Option<u64>,
    pub header_timeout_seconds: Option<u64>,
}

/// `[shutdown]` in the TOML file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShutdownSection {
    pub drain_delay_seconds: Option<u64>,
    pub grace_seconds: Option<u64>,
    pub timeout_seconds: Option<u64>,
}

impl DaemonConfigFile {
    /// Reads and parses a TOML config file; the error names the file and the bad key.
    pub fn load(path: &Path) -> anyhow::Result<DaemonConfigFile> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config file {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("config file {} is invalid", path.display()))
    }

    /// Parses TOML text.
    pub fn parse(text: &str) -> anyhow::Result<DaemonConfigFile> {
        Ok(toml::from_str(text)?)
    }

    /// The defaults overridden by what this file sets.
    pub fn apply_to(self, mut config: DaemonConfig) -> DaemonConfig {
        if let Some(v) = self.data_dir {
            config.data_dir = v;
        }
        if let Some(v) = self.socket {
            config.socket = v;
        }
        if let Some(v) = self.socket_group {
            config.socket_group = v;
        }
        if let Some(v) = self.log_format {
            config.log_format = v;
        }
        if let Some(v) = self.docker_host {
            config.docker_host = Some(v);
        }
        if let Some(v) = self.http_listen {
            config.http_listen = v;
        }
        if let Some(v) = self.https_listen {
            config.https_listen = v;
        }
        if let Some(v) = self.metrics_listen {
            config.metrics_listen = v;
        }
        if let Some(v) = self.access_log {
            config.access_log = v;
        }
        if let Some(l) = self.limits {
            if let Some(v) = l.max_header_bytes {
                config.max_header_bytes = v;
            }
            if let Some(v) = l.max_uri_bytes {
                config.max_uri_bytes = v;
            }
            if let Some(v) = l.max_body_bytes {
                config.max_body_bytes = (v > 0).then_some(v);
            }
            if let Some(v) = l.header_timeout_seconds {
                config.header_timeout_seconds = v;
            }
        }
        if let Some(e) = self.edge {
            if let Some(v) = e.upstream_connect_timeout_ms {
                config.upstream_connect_timeout_ms = v;
            }
            if let Some(v) = e.underscore_headers {
                config.underscore_headers = v;
            }
            if let Some(v) = e.fast_path {
                config.fast_path = v;
            }
        }
        if let Some(d) = self.dns {
            if let Some(v) = d.listen {
                config.dns_listen = v;
            }
            if let Some(v) = d.upstreams {
                config.dns_upstreams = v;
            }
        }
        if let Some(c) = self.certificates {
            if let Some(v) = c.enabled {
                config.certificates = v;
            }
            if let Some(v) = c.verdict_resolver {
                config.verdict_resolver = Some(v);
            }
        }
        if let Some(s) = self.shutdown {
            if let Some(v) = s.drain_delay_seconds {
                config.drain_delay_seconds = v;
            }
            if let Some(v) = s.grace_seconds {
                config.shutdown_grace_seconds = v;
            }
            if let Some(v) = s.timeout_seconds {
                config.shutdown_timeout_seconds = v;
            }
        }
        config
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_example_states_the_defaults() {
        let text = include_str!("../../configs/daemon.toml");
        let parsed = DaemonConfigFile::parse(text).unwrap();
        assert_eq!(
            parsed.apply_to(DaemonConfig::default()),
            DaemonConfig::default()
        );
    }

    #[test]
    fn unknown_keys_are_refused_by_name() {
        let err = DaemonConfigFile::parse("data_dri = \"/x\"").unwrap_err();
        assert!(format!("{err:#}").contains("data_dri"), "{err:#}");
    }

    #[test]
    fn edge_settings_come_from_their_section() {
        let parsed = DaemonConfigFile::parse(
            "[edge]\nupstream_connect_timeout_ms = 500\nunderscore_headers = \"pass\"\nfast_path = false\n",
        )
        .unwrap();
        let c = parsed.apply_to(DaemonConfig::default());
        assert_eq!(c.upstream_connect_timeout_ms, 500);
        assert_eq!(c.underscore_headers, UnderscoreHeaders::Pass);
        assert!(!c.fast_path);
        let err = DaemonConfigFile::parse("[edge]\nunderscore_headers = \"keep\"\n").unwrap_err();
        assert!(format!("{err:#}").contains("keep"), "{err:#}");
    }

    #[test]
    fn file_values_override_defaults() {
        let parsed =
            DaemonConfigFile::parse("socket = \"/tmp/p.sock\"\n[shutdown]\ngrace_seconds = 7\n")
                .unwrap();
        let c = parsed.apply_to(DaemonConfig::default());
        assert_eq!(c.socket, PathBuf::from("/tmp/p.sock"));
        assert_eq!(c.shutdown_grace_seconds, 7);
        assert_eq!(c.data_dir, PathBuf::from(DEFAULT_DATA_DIR));
    }
}
