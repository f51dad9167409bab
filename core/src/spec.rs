//! Service specifications: what a Deploy is asked for and what each Service Container carries.
//!
//! A [`ServiceSpec`] is the normalised configuration of one Service. Given to a Deploy it is the
//! Requested Service Spec; attached to a Service Container when it is created (as a label) it is
//! that container's Resolved Service Spec. Two specs are compared field by field to decide whether
//! a container is up to date, so every field is normalised (sorted maps, canonical ports) at
//! construction and two equal configurations always compare equal.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{Healthcheck, MachineTarget, ServiceName};

/// How many containers a Service runs and where.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ServiceMode {
    /// `replicas` containers spread over the eligible Machines.
    #[default]
    Replicated,
    /// One container on every eligible Machine.
    Global,
}

impl ServiceMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ServiceMode::Replicated => "replicated",
            ServiceMode::Global => "global",
        }
    }
}

/// Whether a replacement starts the new container before stopping the old one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum UpdateOrder {
    StartFirst,
    StopFirst,
}

impl UpdateOrder {
    pub fn as_str(self) -> &'static str {
        match self {
            UpdateOrder::StartFirst => "start-first",
            UpdateOrder::StopFirst => "stop-first",
        }
    }
}

/// When the Machine's Docker pulls the image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum PullPolicy {
    /// Pull only when the Machine does not have the image (Compose `missing`, `if_not_present`).
    #[default]
    Missing,
    /// Pull before every create; a container with this policy is always recreated.
    Always,
    /// Never pull; a missing image is an error before anything runs.
    Never,
}

/// One Service's normalised configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServiceSpec {
    pub name: ServiceName,
    #[serde(default)]
    pub mode: ServiceMode,
    /// Containers to run in [`ServiceMode::Replicated`]; ignored for global Services.
    #[serde(default = "one")]
    pub replicas: u32,
    pub container: ContainerSpec,
    /// Ingress and host ports, canonical and sorted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<PortSpec>,
    /// `x-machines`: the Machines this Service may run on; empty means every Machine.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub machines: Vec<MachineTarget>,
    #[serde(default)]
    pub update: UpdateConfig,
    /// `x-pre_deploy`: a Hook Container run before the Service's first run or replace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pre_deploy: Option<PreDeployHook>,
    /// `depends_on`: Services deployed before this one (order only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub depends_on: Vec<ServiceName>,
    /// `x-revisions`: how many Service Revisions are kept for `ployz rollback`; `None` keeps
    /// [`crate::api::KEPT_REVISIONS`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revisions: Option<u32>,
    /// `x-routes`: the paths of its Ingress Hostnames the Service serves; a hostname without
    /// one is served whole. Sorted, unique.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<RouteSpec>,
}

/// One `x-routes` entry: requests for `hostname` whose path matches `path` reach the Service.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RouteSpec {
    /// An Ingress Hostname the Service publishes in `x-ports`, lowercase.
    pub hostname: String,
    pub path: PathMatch,
    /// The container gets the path without the prefix (`/api/users` as `/users`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub strip_prefix: bool,
    /// The edge answers these requests with a redirect instead of sending them on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redirect: Option<Redirect>,
    /// Fields the edge changes in the request before it goes to the container.
    #[serde(default, skip_serializing_if = "HeaderRules::is_empty")]
    pub request_headers: HeaderRules,
    /// Fields the edge changes in the container's response.
    #[serde(default, skip_serializing_if = "HeaderRules::is_empty")]
    pub response_headers: HeaderRules,
    /// The client addresses admitted, as networks (`10.0.0.0/8`, `192.0.2.7/32`); empty admits
    /// every one. Others get 403.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
    /// Only the users of this list get through; others are asked for credentials (401).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub basic_auth: Option<BasicAuth>,
    /// How long the container may take to answer, in milliseconds: to begin its response and
    /// between any two reads of it. `None`: the edge's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// The largest request body the route takes, in bytes; larger ones get 413. `None`: the
    /// edge's own limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_body_bytes: Option<u64>,
    /// Pages the edge answers with, by status (502, 503 or 504), when it cannot get an answer
    /// from a container itself. A container's own error responses pass unchanged.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub error_pages: std::collections::BTreeMap<u16, String>,
}

impl RouteSpec {
    /// Whether the route asks the edge for more than matching and stripping a path: what
    /// only the edge's full proxy does (the fast paths decline such routes).
    pub fn has_rules(&self) -> bool {
        self.redirect.is_some()
            || !self.request_headers.is_empty()
            || !self.response_headers.is_empty()
            || !self.allow.is_empty()
            || self.basic_auth.is_some()
            || self.timeout_ms.is_some()
            || self.max_body_bytes.is_some()
            || !self.error_pages.is_empty()
    }
}

/// A route's basic authentication: a list of users with bcrypt or argon2 hashes (htpasswd
/// lines, `user:$2y$...`), from a file or a secret. Like a secret's, its content travels only in
/// the request that creates a container; labels, previews and reports carry its digest, and
/// every edge reads the list from the store by that digest.
///
/// Equality, hashing and order ignore [`BasicAuth::users`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BasicAuth {
    /// The realm the `WWW-Authenticate` challenge names.
    pub realm: String,
    /// `sha256:<hex>` of the users list.
    pub digest: String,
    /// The users list, present only while the spec travels to a daemon.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub users: Option<SecretValue>,
}

impl BasicAuth {
    /// Basic authentication against `users`, its digest computed from it.
    pub fn new(realm: String, users: SecretValue) -> BasicAuth {
        BasicAuth {
            realm,
            digest: users.digest(),
            users: Some(users),
        }
    }
}

impl PartialEq for BasicAuth {
    fn eq(&self, other: &BasicAuth) -> bool {
        (&self.realm, &self.digest) == (&other.realm, &other.digest)
    }
}

impl Eq for BasicAuth {}

impl std::hash::Hash for BasicAuth {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.realm.hash(state);
        self.digest.hash(state);
    }
}

impl PartialOrd for BasicAuth {
    fn partial_cmp(&self, other: &BasicAuth) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for BasicAuth {
    fn cmp(&self, other: &BasicAuth) -> std::cmp::Ordering {
        (&self.realm, &self.digest).cmp(&(&other.realm, &other.digest))
    }
}

/// Header fields a route changes, in this order: `remove`, then `set` (replacing any field of
/// the name), then `add` (beside any). Names are lowercase.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct HeaderRules {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remove: Vec<String>,
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub set: std::collections::BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub add: std::collections::BTreeMap<String, String>,
}

impl HeaderRules {
    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        self.remove.is_empty() && self.set.is_empty() && self.add.is_empty()
    }
}

/// A redirect an edge answers itself: `Location` is `to` followed by the request's path (less a
/// stripped prefix) and query.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Redirect {
    /// `http://` or `https://`, a host, an optional port and base path; no query, no trailing
    /// `/`.
    pub to: String,
    /// 301, 302, 303, 307 or 308.
    pub status: u16,
}

/// Which request paths a route takes: the query is never part of the match.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PathMatch {
    /// The path and everything under it, on a segment boundary: `/api` takes `/api`, `/api/`
    /// and `/api/v1`, not `/apis`. Written without a trailing `/`, except the root `/`.
    Prefix(String),
    /// That path alone.
    Exact(String),
}

impl Default for PathMatch {
    /// The whole hostname.
    fn default() -> PathMatch {
        PathMatch::root()
    }
}

impl PathMatch {
    /// The whole hostname.
    pub fn root() -> PathMatch {
        PathMatch::Prefix("/".to_owned())
    }

    /// Whether it takes every path of its hostname.
    pub fn is_root(&self) -> bool {
        matches!(self, PathMatch::Prefix(p) if p == "/")
    }

    /// The path it is written with.
    pub fn path(&self) -> &str {
        match self {
            PathMatch::Prefix(p) | PathMatch::Exact(p) => p,
        }
    }
}

impl std::fmt::Display for PathMatch {
    /// `/api/*` for a prefix (`/*` for the root), `= /healthz` for an exact path.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PathMatch::Prefix(p) if p == "/" => f.write_str("/*"),
            PathMatch::Prefix(p) => write!(f, "{p}/*"),
            PathMatch::Exact(p) => write!(f, "= {p}"),
        }
    }
}

/// One path of an Ingress Hostname a Service serves, and where in its containers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedPath<'a> {
    pub hostname: &'a str,
    pub path: PathMatch,
    pub strip_prefix: bool,
    pub redirect: Option<&'a Redirect>,
    /// The route's header rules (request, response), when it has any.
    pub headers: Option<(&'a HeaderRules, &'a HeaderRules)>,
    /// The client networks it admits; empty: every client.
    pub allow: &'a [String],
    /// The `x-routes` entry it comes from; `None` for a hostname served whole.
    pub route: Option<&'a RouteSpec>,
    pub container_port: u16,
    pub protocol: IngressProtocol,
}

fn one() -> u32 {
    1
}

/// `deploy.update_config`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct UpdateConfig {
    /// An explicit order; `None` lets the Deploy choose by the reference's rules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<UpdateOrder>,
    /// How long a new container is watched before it counts as good; `None` is the default
    /// (5 s), `Some(0)` skips the wait.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub monitor_ms: Option<u64>,
}

/// The container part of a Service's configuration.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ContainerSpec {
    pub image: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    /// `Some(vec![])` resets the image's entrypoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entrypoint: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// `None`: the image's probe is inherited, or there is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub healthcheck: Option<Healthcheck>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init: Option<bool>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub privileged: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cap_add: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cap_drop: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub sysctls: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub ulimits: BTreeMap<String, Ulimit>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shm_size_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_grace_period_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Resources::is_empty")]
    pub resources: Resources,
    /// Volumes, binds and tmpfs, sorted by target.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
    #[serde(default)]
    pub pull_policy: PullPolicy,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logging: Option<Logging>,
    /// Files copied into the container before it starts, sorted by target.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub configs: Vec<ConfigFile>,
    /// Secret files copied into the container before it starts, sorted by target. Compared by
    /// digest: the values travel only to the daemon that creates the container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<SecretFile>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// One `ulimits` entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Ulimit {
    pub soft: i64,
    pub hard: i64,
}

/// CPU and memory limits.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Resources {
    /// CPUs in billionths (`cpus: 0.5` is 500,000,000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nano_cpus: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_limit_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_reservation_bytes: Option<u64>,
}

impl Resources {
    pub fn is_empty(&self) -> bool {
        self == &Resources::default()
    }
}

/// One mount of a Service Container.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Mount {
    /// A Docker Volume on the container's Machine, by its name there.
    Volume {
        source: String,
        target: String,
        #[serde(default, skip_serializing_if = "is_false")]
        read_only: bool,
        #[serde(default, skip_serializing_if = "is_false")]
        no_copy: bool,
    },
    /// A Bind Mount of a path on the Machine; `source` is always absolute and normalised.
    Bind {
        source: String,
        target: String,
        #[serde(default, skip_serializing_if = "is_false")]
        read_only: bool,
    },
    /// An anonymous volume (Compose's `- /app/node_modules`): Docker creates it, empty or
    /// seeded from the image, with the container, and removes it with the container, so each new
    /// container starts with a fresh one. It is not a named volume: it neither ties the Service
    /// to a Machine nor makes a single-replica update stop-first.
    Anonymous {
        target: String,
        #[serde(default, skip_serializing_if = "is_false")]
        read_only: bool,
    },
    /// A Tmpfs Mount.
    Tmpfs {
        target: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        size_bytes: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mode: Option<u32>,
    },
}

impl Mount {
    /// Where the mount appears inside the container.
    pub fn target(&self) -> &str {
        match self {
            Mount::Volume { target, .. }
            | Mount::Bind { target, .. }
            | Mount::Anonymous { target, .. }
            | Mount::Tmpfs { target, .. } => target,
        }
    }
}

/// `logging`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Logging {
    pub driver: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub options: BTreeMap<String, String>,
}

/// A `configs` entry: content copied into the container before start.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ConfigFile {
    /// The config's name in the Compose file.
    pub name: String,
    /// Absolute path inside the container.
    pub target: String,
    /// The file's content.
    pub content: String,
    /// File mode; 0o444 when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
}

/// A `secrets` entry: a file copied into the container before start, like a config, whose
/// content never appears in labels, previews, reports or logs.
///
/// Equality and hashing ignore [`SecretFile::value`]: two secret files are the same when their
/// name, target, digest and ownership are, so a Resolved Service Spec read back from a label
/// (which carries no value) equals the Requested Service Spec it was created from, and a changed
/// value (a changed digest) replaces the container.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SecretFile {
    /// The secret's name in the Compose file.
    pub name: String,
    /// Absolute path inside the container.
    pub target: String,
    /// `sha256:<hex>` of the value.
    pub digest: String,
    /// File mode; 0o444 when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
    /// The content, present only while the spec travels to the daemon that creates the
    /// container; `None` in labels, previews and reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<SecretValue>,
}

impl SecretFile {
    /// A secret file carrying `value`, its digest computed from it.
    pub fn new(
        name: String,
        target: String,
        value: SecretValue,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
    ) -> SecretFile {
        SecretFile {
            name,
            target,
            digest: value.digest(),
            mode,
            uid,
            gid,
            value: Some(value),
        }
    }

    /// The same secret file without its value: what labels, previews and reports carry.
    pub fn without_value(&self) -> SecretFile {
        SecretFile {
            value: None,
            ..self.clone()
        }
    }
}

impl PartialEq for SecretFile {
    fn eq(&self, other: &SecretFile) -> bool {
        self.name == other.name
            && self.target == other.target
            && self.digest == other.digest
            && self.mode == other.mode
            && self.uid == other.uid
            && self.gid == other.gid
    }
}

impl Eq for SecretFile {}

impl std::hash::Hash for SecretFile {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.name.hash(state);
        self.target.hash(state);
        self.digest.hash(state);
        self.mode.hash(state);
        self.uid.hash(state);
        self.gid.hash(state);
    }
}

/// A secret's content. It serialises as base64 (for the one request that carries it to the
/// daemon) and its `Debug` shows only its length.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretValue(Vec<u8>);

impl SecretValue {
    /// Wraps a secret's bytes.
    pub fn new(bytes: Vec<u8>) -> SecretValue {
        SecretValue(bytes)
    }

    /// The secret's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// `sha256:<hex>` of the bytes: what specs compare and labels carry instead of the value.
    pub fn digest(&self) -> String {
        let d = ring::digest::digest(&ring::digest::SHA256, &self.0);
        format!("sha256:{}", hex::encode(d.as_ref()))
    }
}

impl std::fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SecretValue(<redacted, {} bytes>)", self.0.len())
    }
}

impl Serialize for SecretValue {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use base64::Engine as _;
        serializer.serialize_str(&base64::engine::general_purpose::STANDARD.encode(&self.0))
    }
}

impl<'de> Deserialize<'de> for SecretValue {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<SecretValue, D::Error> {
        use base64::Engine as _;
        let text = String::deserialize(deserializer)?;
        base64::engine::general_purpose::STANDARD
            .decode(text.as_bytes())
            .map(SecretValue)
            .map_err(|e| {
                serde::de::Error::custom(format!(
                    "a secret value must be standard base64 ({e}); the value is not shown"
                ))
            })
    }
}

/// `x-pre_deploy`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PreDeployHook {
    pub command: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub privileged: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Default 5 minutes.
    pub timeout_ms: u64,
}

/// A named Docker Volume a Deploy may create (top-level `volumes:`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeSpec {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub driver_opts: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Must already exist; never created by a Deploy.
    #[serde(default, skip_serializing_if = "is_false")]
    pub external: bool,
}

/// A published port: through the edge by hostname, or bound on the Machine's own addresses.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum PortSpec {
    /// `[hostname:][lb_port:]container_port[/http|https]` in `x-ports`.
    Ingress {
        /// The Ingress Hostname, lowercase; `None` until a cluster domain assigns one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        hostname: Option<String>,
        /// The port shown in endpoints; the edge listens on 80/443 regardless.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        published: Option<u16>,
        container_port: u16,
        protocol: IngressProtocol,
    },
    /// `[host_ip:]host_port:container_port[/tcp|udp]@host`, a plain Docker port binding on the
    /// Machine that runs the container (Compose's `ports:`).
    Host {
        /// The Machine address to bind; `None`: every address.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        host_ip: Option<String>,
        /// The port bound on the Machine; `None`: Docker picks a free one (Compose's `"3000"`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        host_port: Option<u16>,
        container_port: u16,
        protocol: HostProtocol,
    },
    /// `[published:]container_port/tcp|udp` in `x-ports`: an Ingress Port, which every
    /// Machine's edge listens on and forwards (TCP: each connection, UDP: each flow) to the
    /// Service's Serving Containers.
    Stream {
        /// The port every edge listens on; the container port unless written.
        published: u16,
        container_port: u16,
        protocol: HostProtocol,
    },
}

/// Protocol of an ingress port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IngressProtocol {
    Http,
    Https,
}

/// Protocol of a host port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HostProtocol {
    Tcp,
    Udp,
}

impl HostProtocol {
    /// `tcp` or `udp`.
    pub fn as_str(self) -> &'static str {
        match self {
            HostProtocol::Tcp => "tcp",
            HostProtocol::Udp => "udp",
        }
    }
}

impl std::fmt::Display for HostProtocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Display for PortSpec {
    /// The canonical text, as labels carry it and comparisons use it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PortSpec::Ingress {
                hostname,
                published,
                container_port,
                protocol,
            } => {
                if let Some(h) = hostname {
                    write!(f, "{h}:")?;
                }
                if let Some(p) = published {
                    write!(f, "{p}:")?;
                }
                let proto = match protocol {
                    IngressProtocol::Http => "http",
                    IngressProtocol::Https => "https",
                };
                write!(f, "{container_port}/{proto}")
            }
            PortSpec::Host {
                host_ip,
                host_port,
                container_port,
                protocol,
            } => {
                if let Some(ip) = host_ip {
                    if ip.contains(':') && !ip.contains('/') {
                        write!(f, "[{ip}]:")?;
                    } else {
                        write!(f, "{ip}:")?;
                    }
                }
                match (host_port, host_ip) {
                    (Some(p), _) => write!(f, "{p}:")?,
                    // The IP's ':' then an empty host port: `127.0.0.1::3000/tcp@host`.
                    (None, Some(_)) => write!(f, ":")?,
                    (None, None) => {}
                }
                write!(f, "{container_port}/{protocol}@host")
            }
            PortSpec::Stream {
                published,
                container_port,
                protocol,
            } => {
                if published != container_port {
                    write!(f, "{published}:")?;
                }
                write!(f, "{container_port}/{protocol}")
            }
        }
    }
}

impl ServiceSpec {
    /// Every path this Service serves through the edge: per Ingress Hostname of `x-ports`,
    /// its `x-routes` entries, or the whole hostname when it has none.
    pub fn served_paths(&self) -> Vec<ServedPath<'_>> {
        let mut out = Vec::new();
        for port in &self.ports {
            let PortSpec::Ingress {
                hostname: Some(hostname),
                container_port,
                protocol,
                ..
            } = port
            else {
                continue;
            };
            let served =
                |path: PathMatch, strip_prefix: bool, redirect, headers, allow, route| ServedPath {
                    hostname,
                    path,
                    strip_prefix,
                    redirect,
                    headers,
                    allow,
                    route,
                    container_port: *container_port,
                    protocol: *protocol,
                };
            let mut routed = self
                .routes
                .iter()
                .filter(|r| &r.hostname == hostname)
                .peekable();
            if routed.peek().is_none() {
                out.push(served(PathMatch::root(), false, None, None, &[], None));
            }
            for r in routed {
                let headers = (!r.request_headers.is_empty() || !r.response_headers.is_empty())
                    .then_some((&r.request_headers, &r.response_headers));
                out.push(served(
                    r.path.clone(),
                    r.strip_prefix,
                    r.redirect.as_ref(),
                    headers,
                    &r.allow,
                    Some(r),
                ));
            }
        }
        out
    }

    /// The fixed host ports this Service binds on its Machine, as (port, protocol). Ports
    /// Docker picks (`host_port: None`) are left out: they never hold a port another needs.
    pub fn host_ports(&self) -> impl Iterator<Item = (u16, HostProtocol)> + '_ {
        self.ports.iter().filter_map(|p| match p {
            PortSpec::Host {
                host_port: Some(port),
                protocol,
                ..
            } => Some((*port, *protocol)),
            PortSpec::Host { .. } | PortSpec::Ingress { .. } | PortSpec::Stream { .. } => None,
        })
    }

    /// The Ingress Ports this Service publishes on every Machine's edge, as (published port,
    /// container port, protocol).
    pub fn ingress_ports(&self) -> impl Iterator<Item = (u16, u16, HostProtocol)> + '_ {
        self.ports.iter().filter_map(|p| match p {
            PortSpec::Stream {
                published,
                container_port,
                protocol,
            } => Some((*published, *container_port, *protocol)),
            _ => None,
        })
    }

    /// The same spec without any secret's value (digests kept): the form that labels, previews,
    /// `--json` reports and logs carry. It compares equal to `self`.
    pub fn without_secret_values(&self) -> ServiceSpec {
        let mut spec = self.clone();
        spec.strip_secret_values();
        spec
    }

    /// Drops every secret's value in place, keeping the digests.
    pub fn strip_secret_values(&mut self) {
        for s in &mut self.container.secrets {
            s.value = None;
        }
        for auth in self.routes.iter_mut().filter_map(|r| r.basic_auth.as_mut()) {
            auth.users = None;
        }
    }

    /// Whether any secret of this spec (a route's users list included) carries its value.
    pub fn has_secret_values(&self) -> bool {
        self.container.secrets.iter().any(|s| s.value.is_some())
            || self
                .routes
                .iter()
                .filter_map(|r| r.basic_auth.as_ref())
                .any(|a| a.users.is_some())
    }

    /// The named Docker Volumes this Service mounts (not its anonymous volumes, which belong to
    /// each container).
    pub fn volume_names(&self) -> impl Iterator<Item = &str> + '_ {
        self.container.mounts.iter().filter_map(|m| match m {
            Mount::Volume { source, .. } => Some(source.as_str()),
            _ => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_print_in_canonical_form() {
        let ingress = PortSpec::Ingress {
            hostname: Some("app.example.com".into()),
            published: None,
            container_port: 8080,
            protocol: IngressProtocol::Https,
        };
        assert_eq!(ingress.to_string(), "app.example.com:8080/https");
        let host = PortSpec::Host {
            host_ip: Some("::1".into()),
            host_port: Some(53),
            container_port: 5353,
            protocol: HostProtocol::Udp,
        };
        assert_eq!(host.to_string(), "[::1]:53:5353/udp@host");
        let picked = PortSpec::Host {
            host_ip: None,
            host_port: None,
            container_port: 3000,
            protocol: HostProtocol::Tcp,
        };
        assert_eq!(picked.to_string(), "3000/tcp@host");
        let picked_on_ip = PortSpec::Host {
            host_ip: Some("127.0.0.1".into()),
            host_port: None,
            container_port: 3000,
            protocol: HostProtocol::Udp,
        };
        assert_eq!(picked_on_ip.to_string(), "127.0.0.1::3000/udp@host");
        let picked_on_v6 = PortSpec::Host {
            host_ip: Some("::1".into()),
            host_port: None,
            container_port: 3000,
            protocol: HostProtocol::Tcp,
        };
        assert_eq!(picked_on_v6.to_string(), "[::1]::3000/tcp@host");
    }

    #[test]
    fn a_host_port_label_written_with_a_number_still_reads() {
        let old = r#"{"mode":"host","host_port":8080,"container_port":80,"protocol":"tcp"}"#;
        let p: PortSpec = serde_json::from_str(old).unwrap();
        assert_eq!(p.to_string(), "8080:80/tcp@host");
        let picked = r#"{"mode":"host","container_port":80,"protocol":"tcp"}"#;
        let p: PortSpec = serde_json::from_str(picked).unwrap();
        assert_eq!(p.to_string(), "80/tcp@host");
        assert_eq!(serde_json::to_string(&p).unwrap(), picked);
    }

    #[test]
    fn a_spec_survives_its_label_round_trip_unchanged() {
        let spec = ServiceSpec {
            name: "web".parse().unwrap(),
            mode: ServiceMode::Replicated,
            replicas: 2,
            container: ContainerSpec {
                image: "busybox:latest".into(),
                env: [("A".to_string(), "1".to_string())].into(),
                ..Default::default()
            },
            ports: vec![],
            machines: vec![],
            update: UpdateConfig::default(),
            pre_deploy: None,
            depends_on: vec![],
            revisions: None,
            routes: vec![],
        };
        let label = serde_json::to_string(&spec).unwrap();
        let back: ServiceSpec = serde_json::from_str(&label).unwrap();
        assert_eq!(back, spec);
    }

    fn secret(value: &[u8]) -> SecretFile {
        SecretFile::new(
            "db_password".into(),
            "/run/secrets/db_password".into(),
            SecretValue::new(value.to_vec()),
            Some(0o400),
            Some(999),
            None,
        )
    }

    fn spec_with(secrets: Vec<SecretFile>) -> ServiceSpec {
        ServiceSpec {
            name: "db".parse().unwrap(),
            mode: ServiceMode::Replicated,
            replicas: 1,
            container: ContainerSpec {
                image: "postgres:16".into(),
                secrets,
                ..Default::default()
            },
            ports: vec![],
            machines: vec![],
            update: UpdateConfig::default(),
            pre_deploy: None,
            depends_on: vec![],
            revisions: None,
            routes: vec![],
        }
    }

    #[test]
    fn secret_files_compare_and_hash_by_digest_not_value() {
        use std::hash::{BuildHasher, RandomState};
        let with = secret(b"hunter2");
        let without = with.without_value();
        assert!(without.value.is_none());
        assert_eq!(with, without);
        let hasher = RandomState::new();
        assert_eq!(hasher.hash_one(&with), hasher.hash_one(&without));
        assert_eq!(
            spec_with(vec![with.clone()]),
            spec_with(vec![without.clone()])
        );
        let changed = secret(b"hunter3");
        assert_ne!(changed.digest, with.digest);
        assert_ne!(changed, with);
        assert_ne!(spec_with(vec![changed]), spec_with(vec![without]));
    }

    #[test]
    fn a_secret_digest_is_the_sha256_of_its_value() {
        assert_eq!(
            SecretValue::new(b"abc".to_vec()).digest(),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn debug_output_redacts_secret_values() {
        let spec = spec_with(vec![secret(b"hunter2")]);
        let shown = format!("{spec:?} {:#?}", spec.container.secrets[0]);
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(
            shown.contains("SecretValue(<redacted, 7 bytes>)"),
            "{shown}"
        );
    }

    #[test]
    fn a_secret_value_round_trips_as_base64_and_its_label_form_has_none() {
        let value: &[u8] = b"p\xffss\0word";
        let spec = spec_with(vec![secret(value)]);
        let wire = serde_json::to_string(&spec).unwrap();
        let back: ServiceSpec = serde_json::from_str(&wire).unwrap();
        assert_eq!(
            back.container.secrets[0]
                .value
                .as_ref()
                .map(SecretValue::as_bytes),
            Some(value)
        );
        assert!(wire.contains("\"value\":\"cP9zcwB3b3Jk\""), "{wire}");

        assert!(spec.has_secret_values());
        let label_form = spec.without_secret_values();
        assert!(!label_form.has_secret_values());
        assert_eq!(label_form, spec);
        let label = serde_json::to_string(&label_form).unwrap();
        assert!(!label.contains("value"), "{label}");
        assert!(!label.contains("cP9zcwB3b3Jk"), "{label}");
        assert!(label.contains(&spec.container.secrets[0].digest), "{label}");
        let read_back: ServiceSpec = serde_json::from_str(&label).unwrap();
        assert_eq!(read_back, spec);
        assert!(read_back.container.secrets[0].value.is_none());
    }

    #[test]
    fn a_secret_value_that_is_not_base64_is_refused_without_echoing_it() {
        let err = serde_json::from_str::<SecretValue>("\"not base64 hunter2!\"").unwrap_err();
        let text = err.to_string();
        assert!(text.contains("base64"), "{text}");
        assert!(!text.contains("hunter2"), "{text}");
    }

    #[test]
    fn an_anonymous_volume_round_trips_and_is_not_a_named_volume() {
        let mount = Mount::Anonymous {
            target: "/app/node_modules".into(),
            read_only: true,
        };
        let json = serde_json::to_value(&mount).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"type": "anonymous", "target": "/app/node_modules", "read_only": true})
        );
        assert_eq!(serde_json::from_value::<Mount>(json).unwrap(), mount);
        let writable: Mount =
            serde_json::from_str(r#"{"type":"anonymous","target":"/cache"}"#).unwrap();
        assert_eq!(
            writable,
            Mount::Anonymous {
                target: "/cache".into(),
                read_only: false
            }
        );
        assert_eq!(writable.target(), "/cache");

        let spec = ServiceSpec {
            name: "web".parse().unwrap(),
            mode: ServiceMode::Replicated,
            replicas: 1,
            container: ContainerSpec {
                image: "busybox:latest".into(),
                mounts: vec![
                    mount,
                    Mount::Volume {
                        source: "proj_data".into(),
                        target: "/data".into(),
                        read_only: false,
                        no_copy: false,
                    },
                ],
                ..Default::default()
            },
            ports: vec![],
            machines: vec![],
            update: UpdateConfig::default(),
            pre_deploy: None,
            depends_on: vec![],
            revisions: None,
            routes: vec![],
        };
        assert_eq!(spec.volume_names().collect::<Vec<_>>(), ["proj_data"]);
    }
}
