//! The daemon's configuration: built-in defaults, then an optional TOML file, then flags, all
//! into one typed [`DaemonConfig`].
//!
//! [`DaemonConfig`] is both what the daemon runs with and the shape of the TOML file: the file's
//! top level holds the Machine's own settings (paths, socket, Docker, logging, listeners) and
//! each `[section]` is one settings struct of its concern ([`LimitSettings`], [`EdgeSettings`],
//! [`ShutdownSettings`], [`CertificateSettings`], [`DnsSettings`], [`MeshSettings`],
//! [`ReconcileSettings`]). A key's path is its field's
//! path: `edge.fast_path` is `config.edge.fast_path`. Every field holds its parsed type (a
//! [`SocketAddr`], an enum), so a bad value is refused while the file is read, naming the key.
//!
//! Flags are a second layer over the same keys. The CLI's flag struct serialises each flag it
//! was given under the key it sets (`#[serde(rename = "limits.header_timeout_seconds")]`; an
//! absent flag, `None`, sets nothing); [`DaemonConfig::load`] lays that table over the file's
//! and deserialises the result once, so a flag and a key share one type and one parser.
//! [`DaemonConfig::validate`] then checks what no single value's type can say (a zero timeout,
//! two listeners on one port), before anything is bound or written.
//!
//! Adding a setting: a field with its doc and its default in the struct of its concern, the
//! key with its default in `configs/daemon.toml` (a test keeps the two equal), and, if it gets
//! a flag, one field in the CLI's flags naming the key.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use serde::{Deserialize, Deserializer, Serialize};

/// Where the daemon keeps its data unless told otherwise.
pub const DEFAULT_DATA_DIR: &str = "/var/lib/ployz";
/// Where the management API listens unless told otherwise.
pub const DEFAULT_SOCKET: &str = "/run/ployz/ployz.sock";
/// The group given access to the socket when it exists.
pub const DEFAULT_SOCKET_GROUP: &str = "ployz";
/// The edge's HTTP listener unless told otherwise.
pub const DEFAULT_HTTP_LISTEN: SocketAddr = SocketAddr::new(IPV4_ANY, 80);
/// The edge's HTTPS listener unless told otherwise.
pub const DEFAULT_HTTPS_LISTEN: SocketAddr = SocketAddr::new(IPV4_ANY, 443);
/// The metrics listener unless told otherwise (loopback: metrics are not public).
pub const DEFAULT_METRICS_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 51090);

const IPV4_ANY: std::net::IpAddr = std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED);

/// The configuration the daemon runs with, and the shape of its TOML file (every key optional:
/// what the file leaves out keeps its default; unknown keys are refused).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
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
    #[serde(deserialize_with = "socket_addr::one")]
    pub http_listen: SocketAddr,
    /// The edge's HTTPS listener.
    #[serde(deserialize_with = "socket_addr::one")]
    pub https_listen: SocketAddr,
    /// Prometheus metrics (`GET /metrics`).
    #[serde(deserialize_with = "socket_addr::one")]
    pub metrics_listen: SocketAddr,
    /// One access-log line per edge request.
    pub access_log: bool,
    /// `[limits]`: what one request may hold and how long its header may take.
    pub limits: LimitSettings,
    /// `[edge]`: how the edge proxies.
    pub edge: EdgeSettings,
    /// `[shutdown]`: how SIGTERM drains the daemon.
    pub shutdown: ShutdownSettings,
    /// `[certificates]`: ACME ordering and renewal.
    pub certificates: CertificateSettings,
    /// `[dns]`: the internal DNS.
    pub dns: DnsSettings,
    /// `[mesh]`: the WireGuard mesh, membership and replication.
    pub mesh: MeshSettings,
    /// `[reconcile]`: how often the daemon checks its Machine's plumbing.
    pub reconcile: ReconcileSettings,
    /// Start even though the data dir lost acknowledged data (the store, its acknowledgement
    /// record, the WireGuard key), keeping what is left. A flag only, never in the file: it is
    /// meant for one start.
    #[serde(skip)]
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
            http_listen: DEFAULT_HTTP_LISTEN,
            https_listen: DEFAULT_HTTPS_LISTEN,
            metrics_listen: DEFAULT_METRICS_LISTEN,
            access_log: true,
            limits: LimitSettings::default(),
            edge: EdgeSettings::default(),
            shutdown: ShutdownSettings::default(),
            certificates: CertificateSettings::default(),
            dns: DnsSettings::default(),
            mesh: MeshSettings::default(),
            reconcile: ReconcileSettings::default(),
            accept_data_loss: false,
        }
    }
}

/// `[limits]`: what one edge request may hold, and how long a client may take to send its
/// header (the management API shares the header deadline).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitSettings {
    /// Header bytes per request before 431.
    pub max_header_bytes: usize,
    /// Request target bytes before 414.
    pub max_uri_bytes: usize,
    /// Request body bytes before 413; `None` (`0` in the file and the flag): unlimited.
    #[serde(deserialize_with = "zero_is_unlimited")]
    pub max_body_bytes: Option<u64>,
    /// Seconds a client has to send a whole request header (against slowloris); at least 1.
    pub header_timeout_seconds: u64,
}

impl Default for LimitSettings {
    fn default() -> Self {
        LimitSettings {
            max_header_bytes: 16 * 1024,
            max_uri_bytes: 8 * 1024,
            max_body_bytes: None,
            header_timeout_seconds: 15,
        }
    }
}

impl LimitSettings {
    /// How long a client has to send a whole request header.
    pub fn header_timeout(&self) -> Duration {
        Duration::from_secs(self.header_timeout_seconds)
    }

    /// Refuses a header deadline of zero, which would disconnect every client.
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.header_timeout_seconds == 0 {
            anyhow::bail!(
                "header_timeout_seconds = 0 ([limits] in the config file, or --header-timeout) would disconnect every client: give at least 1 second (default 15)"
            );
        }
        Ok(())
    }
}

/// `[edge]`: how the edge proxies, for `daemon run` and `daemon edge` alike.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EdgeSettings {
    /// Milliseconds a connection to an upstream may take; then the edge tries the next Serving
    /// Container and avoids the silent one for a while. At least 1.
    pub upstream_connect_timeout_ms: u64,
    /// Request header fields named with `_`: dropped or passed on.
    pub underscore_headers: UnderscoreHeaders,
    /// The edge's HTTP/1 fast path; off: every request goes through Pingora's proxy.
    pub fast_path: bool,
}

impl Default for EdgeSettings {
    fn default() -> Self {
        EdgeSettings {
            upstream_connect_timeout_ms: 1000,
            underscore_headers: UnderscoreHeaders::Drop,
            fast_path: true,
        }
    }
}

impl EdgeSettings {
    /// How long a connection to an upstream may take.
    pub fn upstream_connect_timeout(&self) -> Duration {
        Duration::from_millis(self.upstream_connect_timeout_ms)
    }

    /// Refuses an upstream connect timeout of zero, which would fail every connection.
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.upstream_connect_timeout_ms == 0 {
            anyhow::bail!(
                "upstream_connect_timeout_ms = 0 ([edge] in the config file, or --upstream-connect-timeout-ms) would fail every connection to a Serving Container: give at least 1 (default 1000)"
            );
        }
        Ok(())
    }
}

/// `[shutdown]`: what SIGTERM does, in order.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ShutdownSettings {
    /// After SIGTERM, seconds the edge keeps serving with its health endpoint answering 503 and
    /// every HTTP/1 response saying `Connection: close`, so load balancers and clients move
    /// away before its listeners close.
    pub drain_delay_seconds: u64,
    /// After the edge's listeners closed, seconds requests in flight may take; shutdown goes on
    /// as soon as none is left.
    pub grace_seconds: u64,
    /// After the grace period, seconds in-flight work may take before it is cut.
    pub timeout_seconds: u64,
    /// After a handover (`ployz daemon handover`), seconds the process that handed over may
    /// take to finish its requests in flight: the new process serves meanwhile, so a long
    /// request need not be cut as a stop would.
    pub handover_grace_seconds: u64,
}

impl Default for ShutdownSettings {
    fn default() -> Self {
        ShutdownSettings {
            drain_delay_seconds: 5,
            grace_seconds: 10,
            timeout_seconds: 5,
            handover_grace_seconds: 300,
        }
    }
}

impl ShutdownSettings {
    /// How long the edge serves, draining, before its listeners close.
    pub fn drain_delay(&self) -> Duration {
        Duration::from_secs(self.drain_delay_seconds)
    }

    /// How long requests in flight may take once the listeners closed.
    pub fn grace(&self) -> Duration {
        Duration::from_secs(self.grace_seconds)
    }

    /// How long requests in flight may take in a process that handed over.
    pub fn handover_grace(&self) -> Duration {
        Duration::from_secs(self.handover_grace_seconds)
    }
}

/// `[certificates]`: ordering and renewing certificates by ACME.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CertificateSettings {
    /// Order and renew certificates by ACME for Ingress Hostnames published with `https`.
    pub enabled: bool,
    /// The DNS server the Cluster DNS Verdict asks; `None`: the system's resolvers.
    #[serde(deserialize_with = "socket_addr::optional")]
    pub verdict_resolver: Option<SocketAddr>,
    /// Seconds a Machine is not observed up before the others order and renew the hostnames it
    /// would; 0 to 86400.
    pub down_grace_seconds: u64,
}

impl Default for CertificateSettings {
    fn default() -> Self {
        CertificateSettings {
            enabled: true,
            verdict_resolver: None,
            down_grace_seconds: ployz_acme::DEFAULT_DOWN_GRACE.as_secs(),
        }
    }
}

/// The longest `certificates.down_grace_seconds`: a day.
const MAX_DOWN_GRACE_SECS: u64 = 86_400;

impl CertificateSettings {
    /// How long a Machine is not observed up before the others issue in its place.
    pub fn down_grace(&self) -> Duration {
        Duration::from_secs(self.down_grace_seconds)
    }

    /// Refuses a grace over a day: a new hostname would wait that long for a Machine gone.
    pub fn validate(&self) -> anyhow::Result<()> {
        let secs = self.down_grace_seconds;
        if secs > MAX_DOWN_GRACE_SECS {
            anyhow::bail!(
                "certificates.down_grace_seconds = {secs} ([certificates] in the config file) would keep a new hostname without a certificate for more than a day while the Machine that would order it is down: give at most {MAX_DOWN_GRACE_SECS} (default {})",
                ployz_acme::DEFAULT_DOWN_GRACE.as_secs()
            );
        }
        Ok(())
    }
}

/// `[dns]`: the internal DNS.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DnsSettings {
    /// Where it listens.
    pub listen: DnsListen,
    /// Where it forwards names outside `.internal`; empty: the nameservers of
    /// `/etc/resolv.conf`.
    #[serde(deserialize_with = "socket_addr::list")]
    pub upstreams: Vec<SocketAddr>,
    /// Forwarded answers kept for their TTL; 0 keeps none.
    pub cache_entries: usize,
}

impl Default for DnsSettings {
    fn default() -> Self {
        DnsSettings {
            listen: DnsListen::default(),
            upstreams: Vec::new(),
            cache_entries: 10_000,
        }
    }
}

/// `[mesh]`: how this Machine joins the others: the WireGuard interface, the management API's
/// mesh listener, membership gossip and the store's replication.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MeshSettings {
    /// Off: no interface, no firewall chain, no gossip, no replication (a Machine on its own).
    pub enabled: bool,
    /// The WireGuard interface's name. The userspace backend's control socket is
    /// `/var/run/wireguard/<interface>.sock`, shared by every network namespace of the host, so
    /// Machines sharing a host need different names.
    pub interface: String,
    /// `auto` (the kernel module where it exists, otherwise userspace), `kernel` or `userspace`.
    pub backend: WireGuardBackendSetting,
    /// WireGuard's UDP port.
    pub wireguard_port: u16,
    /// The management API's mesh listener (TCP, on the Management Address).
    pub management_port: u16,
    /// Membership gossip (UDP, on the Management Address).
    pub gossip_port: u16,
    /// Membership timing: `lan` (a stopped Machine is down within 5 s) or `wan` (slower, fewer
    /// false downs over lossy long links).
    pub profile: MembershipProfileSetting,
    /// A remote record stamped further ahead of this Machine's clock than this is not merged
    /// (counted and logged): one Machine with a clock far ahead would otherwise win every
    /// cluster-scoped key until the others' clocks caught up.
    pub max_clock_drift_ms: u64,
    /// How often the interface and firewall rules are checked between the timer passes of
    /// `[reconcile]` (peers and routes are checked every second).
    pub reconcile_interval_ms: u64,
    /// Test only: shifts this daemon's clock (the store's timestamps) by this many milliseconds,
    /// so a lab can give one Machine a skewed clock without touching the host's.
    pub clock_offset_ms: i64,
}

impl Default for MeshSettings {
    fn default() -> Self {
        MeshSettings {
            enabled: true,
            interface: "ployz0".into(),
            backend: WireGuardBackendSetting::Auto,
            wireguard_port: 51820,
            management_port: 51000,
            gossip_port: 51001,
            profile: MembershipProfileSetting::Lan,
            max_clock_drift_ms: 500,
            reconcile_interval_ms: 10_000,
            clock_offset_ms: 0,
        }
    }
}

impl MeshSettings {
    /// Checks what the types cannot say; run before any side effect.
    pub fn validate(&self) -> anyhow::Result<()> {
        let name = &self.interface;
        if name.is_empty()
            || name.len() > 15
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        {
            anyhow::bail!(
                "mesh.interface '{name}' is not a usable interface name: use 1 to 15 letters, digits, '-', '_' or '.' (e.g. ployz0)"
            );
        }
        let ports = [
            ("mesh.wireguard_port", self.wireguard_port),
            ("mesh.management_port", self.management_port),
            ("mesh.gossip_port", self.gossip_port),
        ];
        for (key, port) in ports {
            if port == 0 {
                anyhow::bail!("{key} 0 is not a port this Machine's peers can reach; give a fixed port (e.g. the default)");
            }
        }
        if self.reconcile_interval_ms < 100 {
            anyhow::bail!(
                "mesh.reconcile_interval_ms {} is too short; use at least 100",
                self.reconcile_interval_ms
            );
        }
        Ok(())
    }
}

/// `[reconcile]`: the timer of the daemon's reconciliation of its Machine's plumbing (the
/// WireGuard interface, peers and routes, the firewall chain, the Docker `ployz` network, the
/// DNS listener, its Machine record). Passes also run at start, on store changes that concern
/// the Machine and after reconnects; the timer is what finds drift nothing announced.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReconcileSettings {
    /// Seconds between two timer passes over every concern; 1 to 86400.
    pub interval_secs: u64,
}

impl Default for ReconcileSettings {
    fn default() -> Self {
        ReconcileSettings { interval_secs: 60 }
    }
}

/// The longest `reconcile.interval_secs`: a day.
const MAX_RECONCILE_INTERVAL_SECS: u64 = 86_400;

impl ReconcileSettings {
    /// The time between two timer passes.
    pub fn interval(&self) -> Duration {
        Duration::from_secs(self.interval_secs)
    }

    /// Refuses an interval of zero (a pass without pause) or over a day (drift left standing).
    pub fn validate(&self) -> anyhow::Result<()> {
        let secs = self.interval_secs;
        if secs == 0 {
            anyhow::bail!(
                "reconcile.interval_secs = 0 ([reconcile] in the config file) would check the Machine's plumbing without pause: give at least 1 second (default 60)"
            );
        }
        if secs > MAX_RECONCILE_INTERVAL_SECS {
            anyhow::bail!(
                "reconcile.interval_secs = {secs} ([reconcile] in the config file) would leave drift standing for more than a day: give at most {MAX_RECONCILE_INTERVAL_SECS} (default 60)"
            );
        }
        Ok(())
    }
}

/// `mesh.backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum WireGuardBackendSetting {
    /// The kernel module where it exists, otherwise userspace.
    #[default]
    Auto,
    /// The kernel module; the daemon refuses to start without it.
    Kernel,
    /// The in-process userspace implementation (a TUN device).
    Userspace,
}

/// `mesh.profile`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum MembershipProfileSetting {
    /// Machines on one network: fast probes, a stopped Machine is down within 5 s.
    #[default]
    Lan,
    /// Machines across the internet: slower probes and more patience.
    Wan,
}

/// How log lines are written to stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
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

/// Where the internal DNS listens: `gateway`, `off` or `ADDR:PORT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(try_from = "String", into = "String")]
pub enum DnsListen {
    /// The Machine Gateway, port 53 (what containers ask), once this Machine is initialised.
    #[default]
    Gateway,
    /// Nowhere: the internal DNS is off.
    Off,
    /// This address.
    At(SocketAddr),
}

impl std::str::FromStr for DnsListen {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "gateway" => Ok(DnsListen::Gateway),
            "off" => Ok(DnsListen::Off),
            v => v.parse().map(DnsListen::At).map_err(|_| {
                format!("'{v}' is not `gateway`, `off` or ADDR:PORT (for example 127.0.0.1:5353)")
            }),
        }
    }
}

impl std::fmt::Display for DnsListen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DnsListen::Gateway => f.write_str("gateway"),
            DnsListen::Off => f.write_str("off"),
            DnsListen::At(addr) => addr.fmt(f),
        }
    }
}

impl TryFrom<String> for DnsListen {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl From<DnsListen> for String {
    fn from(listen: DnsListen) -> String {
        listen.to_string()
    }
}

/// Parses `ADDR:PORT` (`127.0.0.1:53`, `[::1]:53`): the parser of every address setting, in
/// the file and on the command line (a clap `value_parser`).
pub fn parse_socket_addr(value: &str) -> Result<SocketAddr, String> {
    value.parse().map_err(|_| {
        format!(
            "'{value}' is not ADDR:PORT (an IP address and a port, for example 127.0.0.1:53 or [::1]:53)"
        )
    })
}

/// Deserialisers of address settings through [`parse_socket_addr`], whose message says what
/// an address looks like.
mod socket_addr {
    use super::*;
    use serde::de::Error as _;

    pub fn one<'de, D: Deserializer<'de>>(d: D) -> Result<SocketAddr, D::Error> {
        parse_socket_addr(&String::deserialize(d)?).map_err(D::Error::custom)
    }

    pub fn optional<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SocketAddr>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|v| parse_socket_addr(&v).map_err(D::Error::custom))
            .transpose()
    }

    pub fn list<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<SocketAddr>, D::Error> {
        Vec::<String>::deserialize(d)?
            .iter()
            .map(|v| parse_socket_addr(v).map_err(D::Error::custom))
            .collect()
    }
}

/// `0` means no limit.
fn zero_is_unlimited<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    Ok(Some(u64::deserialize(d)?).filter(|v| *v > 0))
}

impl DaemonConfig {
    /// The configuration from the defaults, then `file` (TOML) if given, then `flags`, checked
    /// by [`DaemonConfig::validate`]. Nothing is bound or written.
    ///
    /// `flags` serialises to a table whose keys are the dotted keys they set
    /// (`"edge.fast_path"`); a `None` field sets nothing.
    pub fn load(file: Option<&Path>, flags: &impl Serialize) -> anyhow::Result<DaemonConfig> {
        let config = DaemonConfig::layered(file, flags)?;
        config.validate()?;
        Ok(config)
    }

    /// [`DaemonConfig::load`] without validation, for a caller that uses only some concerns
    /// (`daemon edge`) and validates those.
    pub fn layered(file: Option<&Path>, flags: &impl Serialize) -> anyhow::Result<DaemonConfig> {
        let mut table = match file {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("cannot read config file {}", path.display()))?;
                text.parse::<toml::Table>()
                    .with_context(|| format!("config file {} is invalid", path.display()))?
            }
            None => toml::Table::new(),
        };
        let overlay = flag_table(flags)?;
        lay_over(&mut table, overlay.clone());
        from_table(table).map_err(|(key, message)| {
            let from_flags = key.as_deref().is_some_and(|k| holds(&overlay, k));
            let at = key.map(|k| format!("{k}: ")).unwrap_or_default();
            match file {
                Some(path) if !from_flags => {
                    anyhow::anyhow!("config file {} is invalid: {at}{message}", path.display())
                }
                _ => anyhow::anyhow!("the flags are invalid: {at}{message}"),
            }
        })
    }

    /// Parses the text of a config file over the defaults, and validates the result.
    pub fn parse(text: &str) -> anyhow::Result<DaemonConfig> {
        let table = text.parse::<toml::Table>()?;
        let config = from_table(table).map_err(|(key, message)| match key {
            Some(k) => anyhow::anyhow!("{k}: {message}"),
            None => anyhow::anyhow!("{message}"),
        })?;
        config.validate()?;
        Ok(config)
    }

    /// Checks what no single value's type can say: each concern's own rules, and that no two
    /// of the edge's and the metrics listeners take the same port. Run before any side effect.
    pub fn validate(&self) -> anyhow::Result<()> {
        self.limits.validate()?;
        self.edge.validate()?;
        self.mesh.validate()?;
        self.reconcile.validate()?;
        self.certificates.validate()?;
        let listeners = [
            ("http_listen", self.http_listen),
            ("https_listen", self.https_listen),
            ("metrics_listen", self.metrics_listen),
        ];
        for (i, (key_a, a)) in listeners.iter().enumerate() {
            for (key_b, b) in &listeners[i + 1..] {
                if overlap(*a, *b) {
                    anyhow::bail!(
                        "{key_a} {a} and {key_b} {b} take the same port; give each listener its own (--{}, --{})",
                        key_a.replace('_', "-"),
                        key_b.replace('_', "-")
                    );
                }
            }
        }
        Ok(())
    }
}

/// Whether two TCP listeners would take the same port: same port (not 0, which picks a free
/// one), and the same address or either one every address.
fn overlap(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() == b.port()
        && a.port() != 0
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

/// Deserialises a merged table; the error is the key it concerns (`dns.listen`, when known)
/// and the message.
fn from_table(table: toml::Table) -> Result<DaemonConfig, (Option<String>, String)> {
    serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|e| {
        let key = e.path().to_string();
        let key = (key != ".").then_some(key);
        // The message alone: toml's own rendering repeats the key on a line of its own.
        (key, e.into_inner().message().trim_end().to_owned())
    })
}

/// The flags as a table of nested keys: `"edge.fast_path" = false` becomes `[edge] fast_path =
/// false`.
fn flag_table(flags: &impl Serialize) -> anyhow::Result<toml::Table> {
    let dotted = match toml::Value::try_from(flags) {
        Ok(toml::Value::Table(t)) => t,
        Ok(other) => anyhow::bail!("the flags are not a table of keys: {other}"),
        Err(e) => anyhow::bail!("the flags do not make config keys: {e}"),
    };
    let mut nested = toml::Table::new();
    for (key, value) in dotted {
        let mut parts = key.split('.').rev();
        let mut value = value;
        let mut first = parts.next().unwrap_or_default();
        for parent in parts {
            value = toml::Value::Table(toml::Table::from_iter([(first.to_owned(), value)]));
            first = parent;
        }
        lay_over(
            &mut nested,
            toml::Table::from_iter([(first.to_owned(), value)]),
        );
    }
    Ok(nested)
}

/// Lays `overlay` over `base`: tables merge key by key; any other value replaces.
fn lay_over(base: &mut toml::Table, overlay: toml::Table) {
    for (key, value) in overlay {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(below)), toml::Value::Table(above)) => lay_over(below, above),
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

/// Whether `table` holds the dotted `key`.
fn holds(table: &toml::Table, key: &str) -> bool {
    let mut parts = key.split('.');
    let Some(first) = parts.next() else {
        return false;
    };
    let mut at = table.get(first);
    for part in parts {
        at = at.and_then(|v| v.as_table()).and_then(|t| t.get(part));
    }
    at.is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Flags as the CLI gives them: keys renamed to the settings they set.
    #[derive(Serialize, Default)]
    struct Flags {
        #[serde(rename = "http_listen")]
        http_listen: Option<SocketAddr>,
        #[serde(rename = "edge.fast_path")]
        fast_path: Option<bool>,
        #[serde(rename = "limits.max_body_bytes")]
        max_body_bytes: Option<u64>,
        #[serde(rename = "dns.upstreams")]
        dns_upstreams: Option<Vec<SocketAddr>>,
        #[serde(rename = "dns.listen")]
        dns_listen: Option<DnsListen>,
    }

    fn file(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("daemon.toml");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    fn error(result: anyhow::Result<DaemonConfig>) -> String {
        format!("{:#}", result.unwrap_err())
    }

    #[test]
    fn the_shipped_example_states_the_defaults() {
        let text = include_str!("../../configs/daemon.toml");
        assert_eq!(DaemonConfig::parse(text).unwrap(), DaemonConfig::default());
        DaemonConfig::default().validate().unwrap();
    }

    #[test]
    fn unknown_keys_are_refused_by_name() {
        let err = error(DaemonConfig::parse("data_dri = \"/x\""));
        assert!(err.contains("data_dri"), "{err}");
        let err = error(DaemonConfig::parse("[edge]\nfast_pat = true\n"));
        assert!(err.contains("edge.fast_pat"), "{err}");
        let err = error(DaemonConfig::parse("accept_data_loss = true\n"));
        assert!(err.contains("unknown field `accept_data_loss`"), "{err}");
    }

    #[test]
    fn edge_settings_come_from_their_section() {
        let c = DaemonConfig::parse(
            "[edge]\nupstream_connect_timeout_ms = 500\nunderscore_headers = \"pass\"\nfast_path = false\n",
        )
        .unwrap();
        assert_eq!(
            c.edge.upstream_connect_timeout(),
            Duration::from_millis(500)
        );
        assert_eq!(c.edge.underscore_headers, UnderscoreHeaders::Pass);
        assert!(!c.edge.fast_path);
        let err = error(DaemonConfig::parse(
            "[edge]\nunderscore_headers = \"keep\"\n",
        ));
        assert!(err.starts_with("edge.underscore_headers: "), "{err}");
        assert!(err.contains("keep"), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }

    #[test]
    fn file_values_override_defaults() {
        let c = DaemonConfig::parse(
            "socket = \"/tmp/p.sock\"\n[shutdown]\ngrace_seconds = 7\n[limits]\nmax_body_bytes = 1024\n",
        )
        .unwrap();
        assert_eq!(c.socket, PathBuf::from("/tmp/p.sock"));
        assert_eq!(c.shutdown.grace(), Duration::from_secs(7));
        assert_eq!(c.limits.max_body_bytes, Some(1024));
        assert_eq!(c.data_dir, PathBuf::from(DEFAULT_DATA_DIR));
        assert_eq!(c.shutdown.drain_delay_seconds, 5);
    }

    #[test]
    fn addresses_are_parsed_at_load_and_a_bad_one_is_named_by_its_key() {
        let c = DaemonConfig::parse(
            "http_listen = \"127.0.0.1:8080\"\n[certificates]\nverdict_resolver = \"[::1]:53\"\n[dns]\nlisten = \"127.0.0.1:5353\"\nupstreams = [\"127.0.0.53:53\"]\n",
        )
        .unwrap();
        assert_eq!(c.http_listen, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(
            c.certificates.verdict_resolver,
            Some("[::1]:53".parse().unwrap())
        );
        assert_eq!(
            c.dns.listen,
            DnsListen::At("127.0.0.1:5353".parse().unwrap())
        );
        assert_eq!(c.dns.upstreams, vec!["127.0.0.53:53".parse().unwrap()]);
        assert_eq!(
            DaemonConfig::parse("[dns]\nlisten = \"off\"\n")
                .unwrap()
                .dns
                .listen,
            DnsListen::Off
        );

        for (text, key, value) in [
            ("https_listen = \"0.0.0.0\"\n", "https_listen", "'0.0.0.0'"),
            (
                "[certificates]\nverdict_resolver = \"dns\"\n",
                "certificates.verdict_resolver",
                "'dns'",
            ),
            (
                "[dns]\nupstreams = [\"1.1.1.1:53\", \"x\"]\n",
                "dns.upstreams",
                "'x'",
            ),
            (
                "[dns]\nlisten = \"everywhere\"\n",
                "dns.listen",
                "'everywhere'",
            ),
        ] {
            let err = error(DaemonConfig::parse(text));
            assert!(err.starts_with(key), "{text}: {err}");
            assert!(err.contains(value), "{text}: {err}");
            assert!(err.contains("for example"), "{text}: {err}");
        }
    }

    #[test]
    fn zero_timeouts_are_refused_naming_the_key_and_the_flag() {
        let err = error(DaemonConfig::parse(
            "[limits]\nheader_timeout_seconds = 0\n",
        ));
        assert!(err.contains("header_timeout_seconds = 0"), "{err}");
        assert!(err.contains("--header-timeout"), "{err}");
        let err = error(DaemonConfig::parse(
            "[edge]\nupstream_connect_timeout_ms = 0\n",
        ));
        assert!(err.contains("upstream_connect_timeout_ms = 0"), "{err}");
        assert!(err.contains("--upstream-connect-timeout-ms"), "{err}");
    }

    #[test]
    fn a_reconcile_interval_out_of_range_is_refused_naming_the_key_and_the_fix() {
        let err = error(DaemonConfig::parse("[reconcile]\ninterval_secs = 0\n"));
        assert!(err.contains("reconcile.interval_secs = 0"), "{err}");
        assert!(err.contains("give at least 1 second"), "{err}");
        let err = error(DaemonConfig::parse("[reconcile]\ninterval_secs = 100000\n"));
        assert!(err.contains("reconcile.interval_secs = 100000"), "{err}");
        assert!(err.contains("at most 86400"), "{err}");
        let config = DaemonConfig::parse("[reconcile]\ninterval_secs = 2\n").unwrap();
        assert_eq!(config.reconcile.interval(), Duration::from_secs(2));
        let err = error(DaemonConfig::parse("[reconcile]\ninterval = 2\n"));
        assert!(err.contains("interval"), "{err}");
    }

    #[test]
    fn a_down_grace_over_a_day_is_refused_naming_the_key_and_the_fix() {
        let err = error(DaemonConfig::parse(
            "[certificates]\ndown_grace_seconds = 90000\n",
        ));
        assert!(
            err.contains("certificates.down_grace_seconds = 90000"),
            "{err}"
        );
        assert!(err.contains("at most 86400 (default 600)"), "{err}");
        let config = DaemonConfig::parse("[certificates]\ndown_grace_seconds = 0\n").unwrap();
        assert_eq!(config.certificates.down_grace(), Duration::ZERO);
        assert_eq!(
            DaemonConfig::default().certificates.down_grace(),
            Duration::from_secs(600)
        );
    }

    #[test]
    fn listeners_on_one_port_are_refused() {
        let err = error(DaemonConfig::parse("https_listen = \"127.0.0.1:80\"\n"));
        assert!(
            err.contains("http_listen 0.0.0.0:80 and https_listen 127.0.0.1:80"),
            "{err}"
        );
        assert!(err.contains("--https-listen"), "{err}");
        let err = error(DaemonConfig::parse(
            "http_listen = \"127.0.0.1:9000\"\nmetrics_listen = \"127.0.0.1:9000\"\n",
        ));
        assert!(err.contains("metrics_listen"), "{err}");
        // Different addresses, or port 0 (a free port each), do not collide.
        DaemonConfig::parse("http_listen = \"127.0.0.1:443\"\nhttps_listen = \"127.0.0.2:443\"\n")
            .unwrap();
        DaemonConfig::parse("http_listen = \"127.0.0.1:0\"\nhttps_listen = \"127.0.0.1:0\"\n")
            .unwrap();
    }

    #[test]
    fn flags_override_the_file_and_the_defaults() {
        let (_dir, path) = file(
            "http_listen = \"127.0.0.1:8080\"\nmetrics_listen = \"127.0.0.1:9090\"\n[edge]\nfast_path = true\nunderscore_headers = \"pass\"\n[dns]\nupstreams = [\"127.0.0.53:53\"]\n",
        );
        let flags = Flags {
            http_listen: Some("127.0.0.1:8081".parse().unwrap()),
            fast_path: Some(false),
            max_body_bytes: Some(0),
            ..Flags::default()
        };
        let c = DaemonConfig::load(Some(&path), &flags).unwrap();
        assert_eq!(c.http_listen, "127.0.0.1:8081".parse().unwrap());
        assert_eq!(c.metrics_listen, "127.0.0.1:9090".parse().unwrap());
        assert!(!c.edge.fast_path);
        assert_eq!(c.edge.underscore_headers, UnderscoreHeaders::Pass);
        assert_eq!(c.limits.max_body_bytes, None);
        assert_eq!(c.dns.upstreams, vec!["127.0.0.53:53".parse().unwrap()]);

        let flags = Flags {
            dns_upstreams: Some(vec!["127.0.0.1:5300".parse().unwrap()]),
            dns_listen: Some(DnsListen::Off),
            max_body_bytes: Some(100),
            ..Flags::default()
        };
        let c = DaemonConfig::load(Some(&path), &flags).unwrap();
        assert_eq!(c.dns.upstreams, vec!["127.0.0.1:5300".parse().unwrap()]);
        assert_eq!(c.dns.listen, DnsListen::Off);
        assert_eq!(c.limits.max_body_bytes, Some(100));

        let c = DaemonConfig::load(None, &Flags::default()).unwrap();
        assert_eq!(c, DaemonConfig::default());
    }

    #[test]
    fn a_bad_file_is_named_with_its_key() {
        let (_dir, path) = file("[dns]\nlisten = \"everywhere\"\n");
        let err = error(DaemonConfig::load(Some(&path), &Flags::default()));
        assert!(
            err.starts_with(&format!(
                "config file {} is invalid: dns.listen: 'everywhere'",
                path.display()
            )),
            "{err}"
        );
        // A flag replaces the bad value: the file is not read for it.
        let flags = Flags {
            dns_listen: Some(DnsListen::Gateway),
            ..Flags::default()
        };
        DaemonConfig::load(Some(&path), &flags).unwrap();

        let (_dir, path) = file("[dns\n");
        let err = error(DaemonConfig::load(Some(&path), &Flags::default()));
        assert!(err.contains("is invalid"), "{err}");
        assert!(err.contains("line 1"), "{err}");

        let err = error(DaemonConfig::load(
            Some(Path::new("/no/such/daemon.toml")),
            &Flags::default(),
        ));
        assert!(
            err.contains("cannot read config file /no/such/daemon.toml"),
            "{err}"
        );
    }

    #[test]
    fn a_flag_naming_no_key_is_reported_as_the_flags() {
        #[derive(Serialize)]
        struct Misnamed {
            #[serde(rename = "edge.fastpath")]
            fast_path: bool,
        }
        let err = error(DaemonConfig::layered(None, &Misnamed { fast_path: false }));
        assert!(
            err.starts_with("the flags are invalid: edge.fastpath"),
            "{err}"
        );
    }
}
