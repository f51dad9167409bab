//! One Compose service to one Requested Service Spec.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use ployz_core::{
    ConfiguredHealthcheck, ContainerSpec, Healthcheck, HostProtocol, Logging, MachineTarget, Mount,
    PortSpec, PreDeployHook, PullPolicy, Resources, ServiceMode, ServiceName, ServiceSpec, Ulimit,
    UpdateConfig, UpdateOrder,
};

use super::interp::{parse_env_file, shown_key};
use super::port::{parse_host_ip, parse_port, parse_port_number};
use super::project::{Origins, VolumeDecl};
use super::units::{
    check_mode, cpus_to_nano, parse_duration_ms, parse_octal_mode, parse_size_bytes,
};
use super::yaml::Node;
use super::Diagnostics;

/// The default `x-pre_deploy.timeout`: 5 minutes.
const DEFAULT_HOOK_TIMEOUT_MS: u64 = 5 * 60 * 1000;

/// Keys this loader converts into the spec (or refuses with a clear error).
const HANDLED_KEYS: &[&str] = &[
    "image",
    "build",
    "command",
    "entrypoint",
    "environment",
    "env_file",
    "healthcheck",
    "ports",
    "volumes",
    "tmpfs",
    "user",
    "init",
    "privileged",
    "cap_add",
    "cap_drop",
    "sysctls",
    "ulimits",
    "shm_size",
    "stop_grace_period",
    "cpus",
    "mem_limit",
    "mem_reservation",
    "deploy",
    "scale",
    "depends_on",
    "pull_policy",
    "logging",
    "configs",
    "profiles",
    "networks",
    "devices",
    "expose",
    "extends",
    "x-ports",
    "x-machines",
    "x-pre_deploy",
    "x-caddy",
];

/// Compose keys Ployz knows but does not support: each is a warning naming what is ignored.
const UNSUPPORTED_KEYS: &[(&str, &str)] = &[
    ("annotations", "is not supported and is ignored"),
    ("attach", "is not supported and is ignored"),
    (
        "blkio_config",
        "is not supported and is ignored; no block IO limits are set",
    ),
    ("cgroup", "is not supported and is ignored"),
    ("cgroup_parent", "is not supported and is ignored"),
    (
        "container_name",
        "is ignored: Service Container names are generated as <service>-<4 characters>",
    ),
    ("cpu_count", "is not supported and is ignored; use cpus"),
    ("cpu_percent", "is not supported and is ignored; use cpus"),
    ("cpu_period", "is not supported and is ignored; use cpus"),
    ("cpu_quota", "is not supported and is ignored; use cpus"),
    ("cpu_rt_period", "is not supported and is ignored"),
    ("cpu_rt_runtime", "is not supported and is ignored"),
    ("cpu_shares", "is not supported and is ignored; use cpus"),
    ("cpuset", "is not supported and is ignored"),
    ("credential_spec", "is not supported and is ignored"),
    ("develop", "is not supported and is ignored"),
    ("device_cgroup_rules", "is not supported and is ignored"),
    (
        "dns",
        "is not supported and is ignored; containers use Ployz's internal DNS",
    ),
    (
        "dns_opt",
        "is not supported and is ignored; containers use Ployz's internal DNS",
    ),
    (
        "dns_search",
        "is not supported and is ignored; containers use Ployz's internal DNS",
    ),
    ("domainname", "is not supported and is ignored"),
    ("external_links", "is not supported and is ignored"),
    (
        "extra_hosts",
        "is not supported and is ignored; no /etc/hosts entries are added",
    ),
    (
        "gpus",
        "is not supported yet and is ignored; the container gets no GPU",
    ),
    ("group_add", "is not supported and is ignored"),
    (
        "hostname",
        "is not supported and is ignored; the container keeps Docker's hostname",
    ),
    ("ipc", "is not supported and is ignored"),
    ("isolation", "is not supported and is ignored"),
    ("label_file", "is not supported and is ignored"),
    (
        "labels",
        "is not supported and is ignored; Ployz sets its own ployz.* labels",
    ),
    (
        "links",
        "is not supported and is ignored; reach other Services by <service>.internal",
    ),
    ("lifecycle", "is not supported and is ignored"),
    ("mac_address", "is not supported and is ignored"),
    ("mem_swappiness", "is not supported and is ignored"),
    ("memswap_limit", "is not supported and is ignored"),
    ("models", "is not supported and is ignored"),
    (
        "network_mode",
        "is not supported and is ignored; containers join the Ployz network",
    ),
    ("oom_kill_disable", "is not supported and is ignored"),
    ("oom_score_adj", "is not supported and is ignored"),
    ("pid", "is not supported and is ignored"),
    (
        "pids_limit",
        "is not supported and is ignored; no PID limit is set",
    ),
    (
        "platform",
        "is not supported and is ignored; the Machine's platform is used",
    ),
    ("post_start", "is not supported and is ignored"),
    ("pre_stop", "is not supported and is ignored"),
    ("provider", "is not supported and is ignored"),
    (
        "read_only",
        "is not supported and is ignored; the root filesystem stays writable",
    ),
    (
        "restart",
        "is ignored: Ployz runs every Service Container with restart policy unless-stopped",
    ),
    ("runtime", "is not supported and is ignored"),
    (
        "secrets",
        "is not supported and is ignored; no secret files are mounted",
    ),
    (
        "security_opt",
        "is not supported and is ignored; Docker's default security options apply",
    ),
    ("stdin_open", "is not supported and is ignored"),
    (
        "stop_signal",
        "is not supported and is ignored; containers stop with the image's stop signal",
    ),
    ("storage_opt", "is not supported and is ignored"),
    ("tty", "is not supported and is ignored"),
    ("use_api_socket", "is not supported and is ignored"),
    ("userns_mode", "is not supported and is ignored"),
    ("uts", "is not supported and is ignored"),
    ("volumes_from", "is not supported and is ignored"),
    (
        "working_dir",
        "is not supported yet and is ignored; the image's working directory is used",
    ),
];

/// The Ployz extensions a Service may carry.
const EXTENSIONS: &[&str] = &["x-ports", "x-machines", "x-pre_deploy", "x-caddy"];

/// A `depends_on` entry.
#[derive(Debug, Clone)]
pub(crate) struct Dep {
    pub name: String,
    pub required: bool,
    /// The key it came from, e.g. `depends_on[1]` or `depends_on.db`.
    pub key: String,
}

/// A service-level `configs` entry, resolved against the top-level `configs:` by the project.
#[derive(Debug, Clone)]
pub(crate) struct ConfigUse {
    pub key: String,
    pub source: String,
    pub target: String,
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
}

/// A converted Service: its spec (without `depends_on`, which the project fills), and what it
/// uses from the top level.
#[derive(Debug, Clone)]
pub(crate) struct Converted {
    pub spec: ServiceSpec,
    /// Top-level volume keys it mounts.
    pub volume_keys: BTreeSet<String>,
    pub configs: Vec<ConfigUse>,
}

/// What a service conversion needs from the project.
pub(crate) struct ServiceCtx<'a> {
    pub name: &'a ServiceName,
    pub files: &'a [String],
    pub origins: &'a Origins,
    pub d: &'a mut Diagnostics,
    pub dir: &'a Path,
    pub vars: &'a BTreeMap<String, String>,
    pub volumes: &'a BTreeMap<String, VolumeDecl>,
}

impl ServiceCtx<'_> {
    /// The file a key of this service came from (the last file that set its top-level key).
    pub(crate) fn file(&self, key: &str) -> String {
        let top = key.split(['.', '[']).next().unwrap_or(key);
        let idx = self.origins.service_file(self.name.as_str(), top);
        self.files.get(idx).cloned().unwrap_or_default()
    }

    pub(crate) fn err(
        &mut self,
        key: &str,
        value: Option<String>,
        message: impl Into<String>,
        fix: Option<&str>,
    ) {
        let file = self.file(key);
        let key = (!key.is_empty()).then_some(key);
        self.d.error(
            &file,
            Some(self.name.as_str()),
            key,
            value,
            message,
            fix.map(str::to_owned),
        );
    }

    /// An error about a value of the wrong shape or text; the value is shown.
    fn bad(&mut self, key: &str, node: &Node, message: impl Into<String>) {
        self.err(key, Some(node.short()), message, None);
    }

    pub(crate) fn warn(&mut self, key: &str, message: impl Into<String>) {
        let file = self.file(key);
        self.d.warn(&file, Some(self.name.as_str()), key, message);
    }

    /// Runs a conversion, recording its error against `key` with the value shown.
    fn get<T>(
        &mut self,
        key: &str,
        node: &Node,
        f: impl FnOnce(&Node) -> Result<T, String>,
    ) -> Option<T> {
        match f(node) {
            Ok(v) => Some(v),
            Err(m) => {
                self.bad(key, node, m);
                None
            }
        }
    }
}

// ---- value shapes -------------------------------------------------------------------------

pub(crate) fn text(n: &Node) -> Result<String, String> {
    n.scalar_text()
        .ok_or_else(|| format!("expected text, found {}", n.kind()))
}

pub(crate) fn boolean(n: &Node) -> Result<bool, String> {
    match n {
        Node::Bool(b) => Ok(*b),
        Node::Str(s) if s.eq_ignore_ascii_case("true") => Ok(true),
        Node::Str(s) if s.eq_ignore_ascii_case("false") => Ok(false),
        other => Err(format!("expected true or false, found {}", other.kind())),
    }
}

pub(crate) fn uint(n: &Node) -> Result<u64, String> {
    match n {
        Node::Int(i) if *i < 0 => Err("must not be negative".into()),
        Node::Int(i) => u64::try_from(*i).map_err(|_| "is too large".into()),
        Node::Str(s)
            if s.trim().starts_with('-') && s.trim()[1..].chars().all(|c| c.is_ascii_digit()) =>
        {
            Err("must not be negative".into())
        }
        Node::Str(s) => s
            .trim()
            .parse::<u64>()
            .map_err(|_| format!("expected a whole number, found '{s}'")),
        other => Err(format!("expected a whole number, found {}", other.kind())),
    }
}

fn int(n: &Node) -> Result<i64, String> {
    match n {
        Node::Int(i) => i64::try_from(*i).map_err(|_| "is too large".into()),
        Node::Str(s) => s
            .trim()
            .parse::<i64>()
            .map_err(|_| format!("expected a whole number, found '{s}'")),
        other => Err(format!("expected a whole number, found {}", other.kind())),
    }
}

fn u32_of(n: &Node) -> Result<u32, String> {
    let v = uint(n)?;
    u32::try_from(v).map_err(|_| "is too large".into())
}

fn number(n: &Node) -> Result<f64, String> {
    match n {
        Node::Int(i) => Ok(*i as f64),
        Node::Float(f) => Ok(*f),
        Node::Str(s) => s
            .trim()
            .parse::<f64>()
            .map_err(|_| format!("expected a number, found '{s}'")),
        other => Err(format!("expected a number, found {}", other.kind())),
    }
}

fn string_list(n: &Node) -> Result<Vec<String>, String> {
    match n {
        Node::Seq(items) => items.iter().map(text).collect(),
        other => Err(format!("expected a list, found {}", other.kind())),
    }
}

fn duration(n: &Node) -> Result<u64, String> {
    match n {
        Node::Int(0) => Ok(0),
        Node::Int(i) => Err(format!(
            "a duration needs a unit; write e.g. '{i}s' (units: ns, us, ms, s, m, h)"
        )),
        Node::Str(s) => parse_duration_ms(s),
        other => Err(format!(
            "expected a duration such as '10s' or '1m30s', found {}",
            other.kind()
        )),
    }
}

fn size(n: &Node) -> Result<u64, String> {
    match n {
        Node::Int(i) if *i < 0 => Err("a size must not be negative".into()),
        Node::Int(i) => u64::try_from(*i).map_err(|_| "is too large".into()),
        Node::Str(s) => parse_size_bytes(s),
        other => Err(format!(
            "expected a size such as '64m' or '1g', found {}",
            other.kind()
        )),
    }
}

fn cpus(n: &Node) -> Result<Option<u64>, String> {
    let text = n.scalar_text().unwrap_or_default();
    cpus_to_nano(number(n)?, &text)
}

fn mode(n: &Node) -> Result<u32, String> {
    match n {
        Node::Int(i) => {
            let v = u32::try_from(*i).map_err(|_| format!("'{i}' is not a file mode"))?;
            check_mode(v, &i.to_string())
        }
        Node::Str(s) => parse_octal_mode(s),
        other => Err(format!(
            "expected an octal file mode such as 0440, found {}",
            other.kind()
        )),
    }
}

/// A `KEY: value` mapping or a `KEY=value` list; a value of `None` is a bare `KEY` (or `KEY:`).
pub(crate) fn kv_entries(n: &Node) -> Result<Vec<(String, Option<String>)>, String> {
    match n {
        Node::Null => Ok(Vec::new()),
        Node::Map(entries) => entries
            .iter()
            .map(|(k, v)| match v {
                Node::Null => Ok((k.clone(), None)),
                v => v
                    .scalar_text()
                    .map(|t| (k.clone(), Some(t)))
                    .ok_or_else(|| format!("the value of '{k}' must be text, found {}", v.kind())),
            })
            .collect(),
        Node::Seq(items) => items
            .iter()
            .map(|item| {
                let t = item.scalar_text().ok_or_else(|| {
                    format!("list entries must be KEY=VALUE text, found {}", item.kind())
                })?;
                Ok(match t.split_once('=') {
                    Some((k, v)) => (k.to_owned(), Some(v.to_owned())),
                    None => (t, None),
                })
            })
            .collect(),
        other => Err(format!(
            "expected a mapping or a list of KEY=VALUE, found {}",
            other.kind()
        )),
    }
}

fn string_map(n: &Node) -> Result<BTreeMap<String, String>, String> {
    Ok(kv_entries(n)?
        .into_iter()
        .map(|(k, v)| (k, v.unwrap_or_default()))
        .collect())
}

/// A command as a list: a string is split like a shell would (quotes group words).
fn command(n: &Node) -> Result<Vec<String>, String> {
    match n {
        Node::Str(s) => shlex::split(s).ok_or_else(|| {
            "cannot split the command into words: a quote is not closed".to_string()
        }),
        Node::Seq(_) => string_list(n),
        other => Err(format!(
            "expected a command as text or a list, found {}",
            other.kind()
        )),
    }
}

/// The closest known key to a typo, if any is within two edits.
pub(crate) fn suggest<'a>(key: &str, known: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    known
        .map(|k| (edit_distance(key, k), k))
        .filter(|(d, _)| *d <= 2)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != cb);
            cur[j + 1] = (prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

fn warn_unknown_keys(ctx: &mut ServiceCtx<'_>, prefix: &str, n: &Node, known: &[&str]) {
    if let Node::Map(entries) = n {
        for (k, _) in entries {
            if known.contains(&k.as_str()) || k.starts_with("x-") {
                continue;
            }
            let key = format!("{prefix}.{k}");
            let hint = match suggest(k, known.iter().copied()) {
                Some(s) => format!("; did you mean '{s}'?"),
                None => String::new(),
            };
            ctx.warn(&key, format!("unknown key, ignored{hint}"));
        }
    }
}

fn expect_map<'n>(
    ctx: &mut ServiceCtx<'_>,
    key: &str,
    n: &'n Node,
) -> Option<&'n [(String, Node)]> {
    match n {
        Node::Map(entries) => Some(entries),
        Node::Null => Some(&[]),
        other => {
            ctx.bad(
                key,
                other,
                format!("expected a mapping, found {}", other.kind()),
            );
            None
        }
    }
}

// ---- the conversion -----------------------------------------------------------------------

/// Converts one service. `None` when it has errors (recorded in the context).
pub(crate) fn convert(ctx: &mut ServiceCtx<'_>, node: &Node) -> Option<Converted> {
    let errors_before = ctx.d.errors.len();
    let entries: &[(String, Node)] = match node {
        Node::Map(e) => e,
        Node::Null => &[],
        other => {
            ctx.err(
                "",
                Some(other.short()),
                format!(
                    "a service must be a mapping (image:, ...), found {}",
                    other.kind()
                ),
                None,
            );
            return None;
        }
    };

    let mut c = ContainerSpec::default();
    let mut image: Option<String> = None;
    let mut build = false;
    // With where each entry came from (`path:line`).
    let mut env_file_entries: Vec<(String, Option<String>, Option<String>)> = Vec::new();
    let mut environment: Vec<(String, Option<String>)> = Vec::new();
    let mut compose_ports: Option<&Node> = None;
    let mut x_ports: Option<&Node> = None;
    let mut mounts: Vec<(String, Mount)> = Vec::new();
    let mut volume_keys = BTreeSet::new();
    let mut top_resources = Resources::default();
    let mut deploy_resources = Resources::default();
    let mut scale: Option<u32> = None;
    let mut deploy = DeployParts::default();
    let mut machines: Vec<MachineTarget> = Vec::new();
    let mut pre_deploy = None;
    let mut configs = Vec::new();

    for (key, value) in entries {
        let k = key.as_str();
        match k {
            "image" => {
                if let Some(t) = ctx.get(k, value, text) {
                    if t.trim().is_empty() {
                        ctx.err(k, Some(t), "the image must not be empty", Some("name an image, e.g. image: nginx:1.27"));
                    } else if t.chars().any(char::is_whitespace) {
                        ctx.err(k, Some(t), "an image reference has no whitespace", None);
                    } else {
                        image = Some(t);
                    }
                }
            }
            "build" => build = !matches!(value, Node::Null),
            "command" => {
                if !matches!(value, Node::Null) {
                    c.command = ctx.get(k, value, command);
                }
            }
            "entrypoint" => {
                if !matches!(value, Node::Null) {
                    c.entrypoint = ctx.get(k, value, command);
                }
            }
            "environment" => {
                if let Some(e) = ctx.get(k, value, kv_entries) {
                    environment = e;
                }
            }
            "env_file" => env_file_entries = env_files(ctx, value),
            "healthcheck" => c.healthcheck = healthcheck(ctx, value),
            "ports" => compose_ports = Some(value),
            "x-ports" => x_ports = Some(value),
            "volumes" => service_volumes(ctx, value, &mut mounts, &mut volume_keys),
            "tmpfs" => tmpfs_key(ctx, value, &mut mounts),
            "user" => {
                if !matches!(value, Node::Null) {
                    c.user = ctx.get(k, value, text);
                }
            }
            "init" => c.init = ctx.get(k, value, boolean),
            "privileged" => {
                c.privileged = ctx.get(k, value, boolean).unwrap_or(false);
                if c.privileged {
                    ctx.warn(
                        k,
                        "privileged: true gives the container full control of its Machine (all devices and capabilities)",
                    );
                }
            }
            "cap_add" => {
                if let Some(caps) = ctx.get(k, value, string_list) {
                    c.cap_add = sorted_unique(caps);
                    if !c.cap_add.is_empty() {
                        ctx.warn(
                            k,
                            format!(
                                "adds Linux capabilities to the container: {}",
                                c.cap_add.join(", ")
                            ),
                        );
                    }
                }
            }
            "cap_drop" => {
                if let Some(caps) = ctx.get(k, value, string_list) {
                    c.cap_drop = sorted_unique(caps);
                }
            }
            "sysctls" => {
                if let Some(m) = ctx.get(k, value, string_map) {
                    c.sysctls = m;
                }
            }
            "ulimits" => c.ulimits = ulimits(ctx, value),
            "shm_size" => c.shm_size_bytes = ctx.get(k, value, size),
            "stop_grace_period" => c.stop_grace_period_ms = ctx.get(k, value, duration),
            "cpus" => top_resources.nano_cpus = ctx.get(k, value, cpus).flatten(),
            "mem_limit" => top_resources.memory_limit_bytes = ctx.get(k, value, size),
            "mem_reservation" => top_resources.memory_reservation_bytes = ctx.get(k, value, size),
            "scale" => {
                scale = ctx.get(k, value, u32_of);
            }
            "deploy" => deploy = deploy_key(ctx, value, &mut deploy_resources),
            "depends_on" => {} // Read by the project, which knows every service.
            "pull_policy" => {
                if let Some(p) = ctx.get(k, value, text) {
                    c.pull_policy = match p.as_str() {
                        "always" => PullPolicy::Always,
                        "missing" | "if_not_present" => PullPolicy::Missing,
                        "never" => PullPolicy::Never,
                        "build" => {
                            ctx.err(
                                k,
                                Some(p),
                                "pull_policy build needs build:, which is not supported yet",
                                Some("build and tag the image locally, then use image: with pull_policy missing or never"),
                            );
                            PullPolicy::Missing
                        }
                        _ => {
                            ctx.err(
                                k,
                                Some(p),
                                "unknown pull policy",
                                Some("use always, missing (or if_not_present) or never"),
                            );
                            PullPolicy::Missing
                        }
                    };
                }
            }
            "logging" => c.logging = logging(ctx, value),
            "configs" => configs = service_configs(ctx, value),
            "profiles" => {} // Applied by the project.
            "networks" => networks(ctx, value),
            "devices" => {
                let list = ctx.get(k, value, |n| match n {
                    Node::Seq(items) => Ok(items.iter().map(|i| i.short()).collect::<Vec<_>>()),
                    other => Err(format!("expected a list, found {}", other.kind())),
                });
                if let Some(list) = list.filter(|l| !l.is_empty()) {
                    ctx.warn(
                        k,
                        format!(
                            "devices are not supported yet and are ignored; they would give the container access to the Machine's devices: {}",
                            list.join(", ")
                        ),
                    );
                }
            }
            "expose" => {} // Every port is reachable on the Ployz network; expose changes nothing.
            "extends" => ctx.err(
                k,
                Some(value.short()),
                "extends is not supported",
                Some("copy the shared settings, or share them with a YAML anchor and merge key (<<: *base)"),
            ),
            "x-machines" => machines = x_machines(ctx, value),
            "x-pre_deploy" => pre_deploy = x_pre_deploy(ctx, value),
            "x-caddy" => ctx.err(
                k,
                None,
                "x-caddy is not supported: Ployz's edge routes by hostname from x-ports",
                Some("publish through the edge with x-ports, e.g. x-ports: [app.example.com:8080/https]; path routing, redirects and headers come as typed extensions"),
            ),
            _ => unknown_key(ctx, k),
        }
    }

    // image / build
    match (&image, build) {
        (None, true) => ctx.err(
            "build",
            None,
            "build is not supported yet",
            Some("build and tag the image locally, then use image:"),
        ),
        (None, false) => ctx.err(
            "image",
            None,
            "the service has no image",
            Some("add image:, e.g. image: nginx:1.27"),
        ),
        (Some(i), true) => ctx.warn(
            "build",
            format!("build is not supported yet and is ignored; the image '{i}' is used as it is"),
        ),
        (Some(_), false) => {}
    }
    c.image = image.unwrap_or_default();

    // environment: env_file first, then environment overrides.
    let mut env: BTreeMap<String, String> = BTreeMap::new();
    let environment = environment.into_iter().map(|(k, v)| (k, v, None)).collect();
    for (source, entries) in [("env_file", env_file_entries), ("environment", environment)] {
        for (k, v, origin) in entries {
            if k.is_empty() {
                ctx.err(source, None, "a variable name must not be empty", None);
                continue;
            }
            match v.or_else(|| ctx.vars.get(&k).cloned()) {
                Some(v) => {
                    env.insert(k, v);
                }
                None if env.contains_key(&k) => {}
                // An env file's line is shown by its place only: it may be a secret.
                None => match origin {
                    Some(at) => ctx.warn(
                        source,
                        format!("{at}: this line names a variable without a value, and it is not set in the environment; it is left out"),
                    ),
                    None => ctx.warn(
                        &format!("{source}.{k}"),
                        format!("'{k}' has no value and is not set in the environment; it is left out"),
                    ),
                },
            }
        }
    }
    for (k, v) in &env {
        if v.starts_with("secret://") {
            ctx.warn(
                &format!("environment.{k}"),
                "secret:// references are not resolved by Ployz yet; the container gets the text as written",
            );
        }
    }
    c.env = env;

    // mounts: sorted by target, one per target.
    mounts.sort_by(|a, b| a.1.target().cmp(b.1.target()));
    for pair in mounts.windows(2) {
        if pair[0].1.target() == pair[1].1.target() {
            let target = pair[1].1.target().to_owned();
            ctx.err(
                &pair[1].0.clone(),
                Some(target),
                "two mounts share this target",
                Some("mount one volume, bind or tmpfs per container path"),
            );
        }
    }
    c.mounts = mounts.into_iter().map(|(_, m)| m).collect();

    // resources: deploy.resources wins over the top-level keys.
    c.resources = Resources {
        nano_cpus: deploy_resources.nano_cpus.or(top_resources.nano_cpus),
        memory_limit_bytes: deploy_resources
            .memory_limit_bytes
            .or(top_resources.memory_limit_bytes),
        memory_reservation_bytes: deploy_resources
            .memory_reservation_bytes
            .or(top_resources.memory_reservation_bytes),
    };

    // ports
    let ports = match (compose_ports, x_ports) {
        (Some(p), Some(x)) => {
            ctx.err(
                "x-ports",
                None,
                "ports and x-ports cannot be used together on one service",
                Some("use only x-ports (e.g. app.example.com:8080/https, 8080:80/tcp@host), or only ports with mode: host"),
            );
            // Each key's own problems are still worth reporting in the same run.
            let _ = compose_ports_key(ctx, p);
            let _ = x_ports_key(ctx, x);
            Vec::new()
        }
        (Some(p), None) => compose_ports_key(ctx, p),
        (None, Some(x)) => x_ports_key(ctx, x),
        (None, None) => Vec::new(),
    };
    let ports_key = if x_ports.is_some() {
        "x-ports"
    } else {
        "ports"
    };
    let ports = check_host_ports(ctx, ports_key, ports);

    // replicas
    let replicas = match (scale, deploy.replicas) {
        (Some(s), Some(r)) if s != r => {
            ctx.err(
                "scale",
                Some(s.to_string()),
                format!("scale and deploy.replicas ({r}) disagree"),
                Some("keep one of them"),
            );
            r
        }
        (_, Some(r)) => r,
        (Some(s), None) => s,
        (None, None) => 1,
    };
    if deploy.mode == ServiceMode::Global && (deploy.replicas.is_some() || scale.is_some()) {
        ctx.err(
            "deploy.mode",
            Some("global".into()),
            "a global service runs one container on every eligible Machine; it cannot also set replicas or scale",
            Some("remove replicas/scale, or use mode: replicated"),
        );
    }

    if ctx.d.errors.len() > errors_before {
        return None;
    }
    Some(Converted {
        spec: ServiceSpec {
            name: ctx.name.clone(),
            mode: deploy.mode,
            replicas,
            container: c,
            ports,
            machines,
            update: deploy.update,
            pre_deploy,
            depends_on: Vec::new(),
        },
        volume_keys,
        configs,
    })
}

fn sorted_unique(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v.dedup();
    v
}

fn unknown_key(ctx: &mut ServiceCtx<'_>, k: &str) {
    if let Some((_, why)) = UNSUPPORTED_KEYS.iter().find(|(name, _)| *name == k) {
        ctx.warn(k, *why);
        return;
    }
    if k.starts_with("x-") {
        // A user's own extension; only a near miss of a Ployz extension is worth a word.
        if let Some(s) = suggest(k, EXTENSIONS.iter().copied()) {
            ctx.warn(
                k,
                format!("unknown extension, ignored; did you mean '{s}'?"),
            );
        }
        return;
    }
    let known = HANDLED_KEYS
        .iter()
        .copied()
        .chain(UNSUPPORTED_KEYS.iter().map(|(k, _)| *k));
    let hint = match suggest(k, known) {
        Some(s) => format!("; did you mean '{s}'?"),
        None => String::new(),
    };
    ctx.warn(k, format!("unknown key, ignored{hint}"));
}

/// The entries of the service's env files, each with where it came from (`path:line`).
fn env_files(ctx: &mut ServiceCtx<'_>, n: &Node) -> Vec<(String, Option<String>, Option<String>)> {
    let items: Vec<(String, &Node)> = match n {
        Node::Null => return Vec::new(),
        Node::Seq(items) => items
            .iter()
            .enumerate()
            .map(|(i, item)| (format!("env_file[{i}]"), item))
            .collect(),
        other => vec![("env_file".to_string(), other)],
    };
    let mut out = Vec::new();
    for (key, item) in items {
        let (path, required) = match item {
            Node::Map(_) => {
                let Some(path) = item.get("path") else {
                    ctx.bad(&key, item, "an env_file entry needs path:");
                    continue;
                };
                let Some(path) = ctx.get(&format!("{key}.path"), path, text) else {
                    continue;
                };
                let required = match item.get("required") {
                    Some(r) => ctx
                        .get(&format!("{key}.required"), r, boolean)
                        .unwrap_or(true),
                    None => true,
                };
                if let Some(f) = item.get("format") {
                    ctx.warn(
                        &format!("{key}.format"),
                        format!(
                            "only the default env file format is supported; '{}' is ignored",
                            f.short()
                        ),
                    );
                }
                (path, required)
            }
            other => match ctx.get(&key, other, text) {
                Some(p) => (p, true),
                None => continue,
            },
        };
        let full = ctx.dir.join(&path);
        let content = match std::fs::read_to_string(&full) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => continue,
            Err(e) => {
                let why = if e.kind() == std::io::ErrorKind::NotFound {
                    format!("the env file {} does not exist", full.display())
                } else {
                    format!("cannot read the env file {}: {e}", full.display())
                };
                ctx.err(
                    &key,
                    Some(path),
                    why,
                    Some("create it, fix the path (relative to the project directory), or mark it required: false"),
                );
                continue;
            }
        };
        let vars = ctx.vars;
        let lookup = |name: &str| vars.get(name).cloned();
        // Messages name the file and line, never a value: env files hold secrets (and a path
        // may name a file that is not an env file at all).
        let shown = full.display().to_string();
        match parse_env_file(&content, &lookup) {
            Ok(parsed) => {
                for u in &parsed.unset {
                    ctx.warn(
                        &key,
                        format!(
                            "{shown}:{}: the value of {} refers to a variable that is not set; it becomes empty there (quote the value with '...' if its '$' is literal)",
                            u.line,
                            shown_key(u.key.as_deref())
                        ),
                    );
                }
                out.extend(
                    parsed
                        .lines
                        .into_iter()
                        .map(|l| (l.entry.0, l.entry.1, Some(format!("{shown}:{}", l.line)))),
                );
            }
            Err(e) => ctx.err(
                &key,
                None,
                format!("{shown}:{}: {}", e.line, e.message),
                e.fix.as_deref(),
            ),
        }
    }
    out
}

fn healthcheck(ctx: &mut ServiceCtx<'_>, n: &Node) -> Option<Healthcheck> {
    const KEYS: &[&str] = &[
        "test",
        "interval",
        "timeout",
        "retries",
        "start_period",
        "start_interval",
        "disable",
    ];
    let entries = expect_map(ctx, "healthcheck", n)?;
    if entries.is_empty() {
        return None;
    }
    warn_unknown_keys(ctx, "healthcheck", n, KEYS);
    let disable = match n.get("disable") {
        Some(d) => ctx.get("healthcheck.disable", d, boolean).unwrap_or(false),
        None => false,
    };
    let test: Option<Vec<String>> = match n.get("test") {
        None | Some(Node::Null) => None,
        Some(Node::Str(s)) => Some(vec!["CMD-SHELL".to_owned(), s.clone()]),
        Some(t @ Node::Seq(_)) => ctx.get("healthcheck.test", t, string_list),
        Some(other) => {
            ctx.bad(
                "healthcheck.test",
                other,
                format!(
                    "expected a command as text or a list, found {}",
                    other.kind()
                ),
            );
            return None;
        }
    };
    let test_is_none = test
        .as_ref()
        .is_some_and(|t| t.first().map(String::as_str) == Some("NONE"));
    if disable {
        if test.is_some() && !test_is_none {
            ctx.err(
                "healthcheck.disable",
                Some("true".into()),
                "disable: true and a test cannot be combined",
                Some("remove one of them"),
            );
        }
        return Some(Healthcheck::Disabled);
    }
    if test_is_none {
        return Some(Healthcheck::Disabled);
    }
    let Some(test) = test else {
        let timings = entries.iter().any(|(k, _)| k != "disable");
        if timings {
            ctx.warn(
                "healthcheck",
                "a healthcheck without test keeps the image's probe; the timings given here are ignored (add test: to set them)",
            );
        }
        return None;
    };
    if let Some(first) = test.first() {
        if !matches!(first.as_str(), "CMD" | "CMD-SHELL") {
            ctx.err(
                "healthcheck.test",
                Some(format!("{test:?}")),
                "a test list starts with CMD, CMD-SHELL or NONE",
                Some(r#"write e.g. ["CMD", "curl", "-f", "http://localhost/"] or a plain string for a shell command"#),
            );
            return None;
        }
    }
    let mut hc = match ConfiguredHealthcheck::new(test) {
        Ok(hc) => hc,
        Err(e) => {
            ctx.err("healthcheck.test", None, e.to_string(), None);
            return None;
        }
    };
    let dur = |ctx: &mut ServiceCtx<'_>, key: &str| {
        n.get(key)
            .filter(|v| !matches!(v, Node::Null))
            .and_then(|v| ctx.get(&format!("healthcheck.{key}"), v, duration))
    };
    hc.interval_ms = dur(ctx, "interval");
    hc.timeout_ms = dur(ctx, "timeout");
    hc.start_period_ms = dur(ctx, "start_period");
    hc.start_interval_ms = dur(ctx, "start_interval");
    hc.retries = n
        .get("retries")
        .filter(|v| !matches!(v, Node::Null))
        .and_then(|v| ctx.get("healthcheck.retries", v, u32_of));
    Some(Healthcheck::Configured(hc))
}

fn ulimits(ctx: &mut ServiceCtx<'_>, n: &Node) -> BTreeMap<String, Ulimit> {
    let mut out = BTreeMap::new();
    let Some(entries) = expect_map(ctx, "ulimits", n) else {
        return out;
    };
    for (name, v) in entries {
        let key = format!("ulimits.{name}");
        let limit = match v {
            Node::Map(_) => {
                let soft = v
                    .get("soft")
                    .and_then(|s| ctx.get(&format!("{key}.soft"), s, int));
                let hard = v
                    .get("hard")
                    .and_then(|h| ctx.get(&format!("{key}.hard"), h, int));
                match (soft, hard) {
                    (Some(soft), Some(hard)) => Ulimit { soft, hard },
                    _ => {
                        if v.get("soft").is_none() || v.get("hard").is_none() {
                            ctx.bad(&key, v, "a ulimit mapping needs both soft: and hard:");
                        }
                        continue;
                    }
                }
            }
            other => match ctx.get(&key, other, int) {
                Some(l) => Ulimit { soft: l, hard: l },
                None => continue,
            },
        };
        if limit.hard >= 0 && (limit.soft > limit.hard || limit.soft < 0) {
            ctx.err(
                &key,
                Some(format!("soft {} hard {}", limit.soft, limit.hard)),
                "the soft limit is above the hard limit",
                Some("make soft at most hard"),
            );
            continue;
        }
        out.insert(name.clone(), limit);
    }
    out
}

#[derive(Default)]
struct DeployParts {
    mode: ServiceMode,
    replicas: Option<u32>,
    update: UpdateConfig,
}

fn deploy_key(ctx: &mut ServiceCtx<'_>, n: &Node, resources: &mut Resources) -> DeployParts {
    const KEYS: &[&str] = &[
        "mode",
        "replicas",
        "resources",
        "update_config",
        "placement",
        "labels",
        "restart_policy",
        "rollback_config",
        "endpoint_mode",
    ];
    let mut out = DeployParts::default();
    let Some(entries) = expect_map(ctx, "deploy", n) else {
        return out;
    };
    warn_unknown_keys(ctx, "deploy", n, KEYS);
    for (k, v) in entries {
        let key = format!("deploy.{k}");
        match k.as_str() {
            "mode" => {
                if let Some(m) = ctx.get(&key, v, text) {
                    match m.as_str() {
                        "replicated" => out.mode = ServiceMode::Replicated,
                        "global" => out.mode = ServiceMode::Global,
                        _ => ctx.err(
                            &key,
                            Some(m),
                            "unknown deploy mode",
                            Some("use replicated or global"),
                        ),
                    }
                }
            }
            "replicas" if !matches!(v, Node::Null) => out.replicas = ctx.get(&key, v, u32_of),
            "resources" => deploy_resources(ctx, v, resources),
            "update_config" => out.update = update_config(ctx, v),
            "placement" => ctx.warn(
                &key,
                "is not supported and is ignored; choose Machines with x-machines",
            ),
            "labels" => ctx.warn(&key, "is not supported and is ignored"),
            "restart_policy" => ctx.warn(
                &key,
                "is not supported and is ignored: Ployz runs every Service Container with restart policy unless-stopped",
            ),
            "rollback_config" => ctx.warn(&key, "is not supported and is ignored"),
            "endpoint_mode" => ctx.warn(&key, "is not supported and is ignored"),
            _ => {}
        }
    }
    out
}

fn deploy_resources(ctx: &mut ServiceCtx<'_>, n: &Node, out: &mut Resources) {
    if expect_map(ctx, "deploy.resources", n).is_none() {
        return;
    }
    warn_unknown_keys(ctx, "deploy.resources", n, &["limits", "reservations"]);
    if let Some(limits) = n.get("limits") {
        if expect_map(ctx, "deploy.resources.limits", limits).is_some() {
            warn_unknown_keys(
                ctx,
                "deploy.resources.limits",
                limits,
                &["cpus", "memory", "pids", "devices"],
            );
            if let Some(v) = limits.get("cpus") {
                out.nano_cpus = ctx.get("deploy.resources.limits.cpus", v, cpus).flatten();
            }
            if let Some(v) = limits.get("memory") {
                out.memory_limit_bytes = ctx.get("deploy.resources.limits.memory", v, size);
            }
            if limits.get("pids").is_some() {
                ctx.warn(
                    "deploy.resources.limits.pids",
                    "is not supported and is ignored; no PID limit is set",
                );
            }
            if limits.get("devices").is_some() {
                ctx.warn(
                    "deploy.resources.limits.devices",
                    "is not supported and is ignored",
                );
            }
        }
    }
    if let Some(res) = n.get("reservations") {
        if expect_map(ctx, "deploy.resources.reservations", res).is_some() {
            warn_unknown_keys(
                ctx,
                "deploy.resources.reservations",
                res,
                &["cpus", "memory", "devices", "generic_resources"],
            );
            if let Some(v) = res.get("memory") {
                out.memory_reservation_bytes =
                    ctx.get("deploy.resources.reservations.memory", v, size);
            }
            for k in ["cpus", "devices", "generic_resources"] {
                if res.get(k).is_some() {
                    ctx.warn(
                        &format!("deploy.resources.reservations.{k}"),
                        "is not supported yet and is ignored",
                    );
                }
            }
        }
    }
}

fn update_config(ctx: &mut ServiceCtx<'_>, n: &Node) -> UpdateConfig {
    let mut out = UpdateConfig::default();
    let Some(entries) = expect_map(ctx, "deploy.update_config", n) else {
        return out;
    };
    const KEYS: &[&str] = &[
        "order",
        "monitor",
        "parallelism",
        "delay",
        "failure_action",
        "max_failure_ratio",
    ];
    warn_unknown_keys(ctx, "deploy.update_config", n, KEYS);
    for (k, v) in entries {
        let key = format!("deploy.update_config.{k}");
        match k.as_str() {
            "order" => {
                if let Some(o) = ctx.get(&key, v, text) {
                    match o.as_str() {
                        "start-first" => out.order = Some(UpdateOrder::StartFirst),
                        "stop-first" => out.order = Some(UpdateOrder::StopFirst),
                        _ => ctx.err(
                            &key,
                            Some(o),
                            "unknown update order",
                            Some("use start-first or stop-first"),
                        ),
                    }
                }
            }
            "monitor" if !matches!(v, Node::Null) => out.monitor_ms = ctx.get(&key, v, duration),
            "parallelism" => ctx.warn(
                &key,
                "is not supported and is ignored; containers are replaced one at a time",
            ),
            "delay" | "failure_action" | "max_failure_ratio" => {
                ctx.warn(&key, "is not supported and is ignored")
            }
            _ => {}
        }
    }
    out
}

fn logging(ctx: &mut ServiceCtx<'_>, n: &Node) -> Option<Logging> {
    expect_map(ctx, "logging", n)?;
    warn_unknown_keys(ctx, "logging", n, &["driver", "options"]);
    let options = match n.get("options") {
        Some(o) => ctx
            .get("logging.options", o, string_map)
            .unwrap_or_default(),
        None => BTreeMap::new(),
    };
    let driver = match n.get("driver") {
        None | Some(Node::Null) => None,
        Some(d) => ctx.get("logging.driver", d, text),
    };
    match driver {
        Some(driver) if !driver.is_empty() => Some(Logging { driver, options }),
        _ => {
            if !options.is_empty() {
                ctx.warn(
                    "logging.options",
                    "options without a driver are ignored; name the driver, e.g. driver: local",
                );
            }
            None
        }
    }
}

fn networks(ctx: &mut ServiceCtx<'_>, n: &Node) {
    let names: Vec<String> = match n {
        Node::Null => Vec::new(),
        Node::Seq(_) => ctx.get("networks", n, string_list).unwrap_or_default(),
        Node::Map(entries) => entries.iter().map(|(k, _)| k.clone()).collect(),
        other => {
            ctx.bad(
                "networks",
                other,
                format!("expected a list or a mapping, found {}", other.kind()),
            );
            Vec::new()
        }
    };
    let others: Vec<String> = names.into_iter().filter(|n| n != "default").collect();
    if !others.is_empty() {
        ctx.warn(
            "networks",
            format!(
                "networks other than default are not supported and are ignored ({}); every Service Container joins the Ployz network",
                others.join(", ")
            ),
        );
    }
}

// ---- ports --------------------------------------------------------------------------------

fn x_ports_key(ctx: &mut ServiceCtx<'_>, n: &Node) -> Vec<PortSpec> {
    let items = match n {
        Node::Null => return Vec::new(),
        Node::Seq(items) => items,
        other => {
            ctx.bad(
                "x-ports",
                other,
                format!("expected a list of ports, found {}", other.kind()),
            );
            return Vec::new();
        }
    };
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let key = format!("x-ports[{i}]");
        let Some(t) = ctx.get(&key, item, text) else {
            continue;
        };
        match parse_port(&t, ctx.name) {
            Ok(p) => out.push(p),
            Err(m) => ctx.err(&key, Some(t), m, None),
        }
    }
    out
}

fn compose_ports_key(ctx: &mut ServiceCtx<'_>, n: &Node) -> Vec<PortSpec> {
    let items = match n {
        Node::Null => return Vec::new(),
        Node::Seq(items) => items,
        other => {
            ctx.bad(
                "ports",
                other,
                format!("expected a list, found {}", other.kind()),
            );
            return Vec::new();
        }
    };
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let key = format!("ports[{i}]");
        match item {
            Node::Map(_) => {
                if let Some(p) = long_port(ctx, &key, item) {
                    out.push(p);
                }
            }
            other => {
                let Some(t) = ctx.get(&key, other, text) else {
                    continue;
                };
                short_port(ctx, &key, &t);
            }
        }
    }
    out
}

/// A short-syntax `ports` entry publishes in ingress mode, which Ployz cannot route without a
/// protocol: always an error, with the nearest working spelling.
fn short_port(ctx: &mut ServiceCtx<'_>, key: &str, t: &str) {
    let (body, proto) = t.rsplit_once('/').unwrap_or((t, "tcp"));
    let parts: Vec<&str> = body.rsplitn(3, ':').collect();
    let target = parts.first().copied().unwrap_or("");
    let published = parts.get(1).copied();
    if target.contains('-') || published.is_some_and(|p| p.contains('-')) {
        ctx.err(
            key,
            Some(t.to_owned()),
            "published port ranges are not supported",
            Some("publish each port on its own line"),
        );
        return;
    }
    let fix = match published {
        Some(p) if !p.is_empty() => format!(
            "use x-ports for a web port (e.g. x-ports: ['app.example.com:{target}/https']), or bind it on the Machine with the long syntax (target: {target}, published: {p}, protocol: {proto}, mode: host) or x-ports: ['{p}:{target}/{proto}@host']"
        ),
        _ => format!(
            "use x-ports for a web port (e.g. x-ports: ['{target}/https']), or bind it on the Machine with the long syntax (target: {target}, published: {target}, mode: host)"
        ),
    };
    ctx.err(
        key,
        Some(t.to_owned()),
        "short syntax ports publish in ingress mode, which Ployz routes only for http or https",
        Some(&fix),
    );
}

fn long_port(ctx: &mut ServiceCtx<'_>, key: &str, n: &Node) -> Option<PortSpec> {
    warn_unknown_keys(
        ctx,
        key,
        n,
        &[
            "target",
            "published",
            "host_ip",
            "protocol",
            "mode",
            "name",
            "app_protocol",
        ],
    );
    let target = match n.get("target") {
        Some(t) => {
            let s = ctx.get(&format!("{key}.target"), t, text)?;
            match parse_port_number(&s, "target port") {
                Ok(p) => p,
                Err(m) => {
                    let fix = s
                        .contains('-')
                        .then_some("publish each port on its own line");
                    ctx.err(&format!("{key}.target"), Some(s), m, fix);
                    return None;
                }
            }
        }
        None => {
            ctx.bad(key, n, "a port needs target: (the container port)");
            return None;
        }
    };
    let published = match n.get("published") {
        None | Some(Node::Null) => None,
        Some(p) => {
            let s = ctx.get(&format!("{key}.published"), p, text)?;
            if s.contains('-') {
                ctx.err(
                    &format!("{key}.published"),
                    Some(s),
                    "published port ranges are not supported",
                    Some("publish each port on its own line"),
                );
                return None;
            }
            match parse_port_number(&s, "published port") {
                Ok(p) => Some(p),
                Err(m) => {
                    ctx.err(&format!("{key}.published"), Some(s), m, None);
                    return None;
                }
            }
        }
    };
    let protocol = match n.get("protocol") {
        None | Some(Node::Null) => HostProtocol::Tcp,
        Some(p) => match ctx.get(&format!("{key}.protocol"), p, text)?.as_str() {
            "tcp" => HostProtocol::Tcp,
            "udp" => HostProtocol::Udp,
            other => {
                ctx.err(
                    &format!("{key}.protocol"),
                    Some(other.to_owned()),
                    "unknown protocol",
                    Some("use tcp or udp"),
                );
                return None;
            }
        },
    };
    let host_ip = match n.get("host_ip") {
        None | Some(Node::Null) => None,
        Some(ip) => {
            let s = ctx.get(&format!("{key}.host_ip"), ip, text)?;
            let bracketed = if s.contains(':') && !s.starts_with('[') {
                format!("[{s}]")
            } else {
                s.clone()
            };
            match parse_host_ip(&bracketed) {
                Ok(ip) => Some(ip),
                Err(m) => {
                    ctx.err(&format!("{key}.host_ip"), Some(s), m, None);
                    return None;
                }
            }
        }
    };
    let mode = match n.get("mode") {
        None | Some(Node::Null) => "ingress".to_owned(),
        Some(m) => ctx.get(&format!("{key}.mode"), m, text)?,
    };
    match mode.as_str() {
        "host" => {}
        "ingress" => {
            let p = published.unwrap_or(target);
            ctx.err(
                &format!("{key}.mode"),
                Some(mode.clone()),
                "ingress-mode ports need http or https, which the ports key cannot say",
                Some(&format!(
                    "use x-ports for a web port (e.g. x-ports: ['app.example.com:{target}/https']), or set mode: host to bind {p} on the Machine"
                )),
            );
            return None;
        }
        other => {
            ctx.err(
                &format!("{key}.mode"),
                Some(other.to_owned()),
                "unknown port mode",
                Some("use mode: host (or x-ports for http/https through the ingress)"),
            );
            return None;
        }
    }
    let Some(host_port) = published else {
        ctx.err(
            key,
            Some(n.short()),
            "a host-mode port needs published: (the port bound on the Machine)",
            Some(&format!("add published: {target}")),
        );
        return None;
    };
    Some(PortSpec::Host {
        host_ip,
        host_port,
        container_port: target,
        protocol,
    })
}

/// Sorts and deduplicates ports, and refuses two bindings of one host port.
fn check_host_ports(
    ctx: &mut ServiceCtx<'_>,
    key: &str,
    mut ports: Vec<PortSpec>,
) -> Vec<PortSpec> {
    ports.sort();
    ports.dedup();
    let mut seen: BTreeMap<(Option<String>, u16, HostProtocol), u16> = BTreeMap::new();
    for p in &ports {
        if let PortSpec::Host {
            host_ip,
            host_port,
            container_port,
            protocol,
        } = p
        {
            if let Some(other) =
                seen.insert((host_ip.clone(), *host_port, *protocol), *container_port)
            {
                ctx.err(
                    key,
                    Some(p.to_string()),
                    format!("host port {host_port} is bound twice (to container ports {other} and {container_port})"),
                    Some("bind each host port once"),
                );
            }
        }
    }
    ports
}

// ---- volumes ------------------------------------------------------------------------------

fn service_volumes(
    ctx: &mut ServiceCtx<'_>,
    n: &Node,
    mounts: &mut Vec<(String, Mount)>,
    used: &mut BTreeSet<String>,
) {
    let items = match n {
        Node::Null => return,
        Node::Seq(items) => items,
        other => {
            ctx.bad(
                "volumes",
                other,
                format!("expected a list, found {}", other.kind()),
            );
            return;
        }
    };
    for (i, item) in items.iter().enumerate() {
        let key = format!("volumes[{i}]");
        let mount = match item {
            Node::Map(_) => long_volume(ctx, &key, item, used),
            other => match ctx.get(&key, other, text) {
                Some(t) => short_volume(ctx, &key, &t, used),
                None => None,
            },
        };
        if let Some(m) = mount {
            if let Mount::Bind { source, .. } = &m {
                warn_privileged_bind(ctx, &key, source);
            }
            mounts.push((key, m));
        }
    }
}

fn check_target(ctx: &mut ServiceCtx<'_>, key: &str, target: &str) -> bool {
    if !target.starts_with('/') {
        ctx.err(
            key,
            Some(target.to_owned()),
            "the mount target must be an absolute path inside the container",
            Some("write it from the root, e.g. /data"),
        );
        return false;
    }
    true
}

enum Source {
    Bind(String),
    Volume(String),
}

fn classify_source(ctx: &mut ServiceCtx<'_>, key: &str, source: &str) -> Option<Source> {
    if source.starts_with('/') {
        return Some(Source::Bind(normalise_path(source)));
    }
    if source.starts_with('.') || source.starts_with('~') || source.contains('/') {
        ctx.err(
            key,
            Some(source.to_owned()),
            "a relative bind source is not supported: Service Containers run on other Machines, where this path does not exist",
            Some("ship files with configs: (file: or content:), or bind an absolute path that exists on every Machine"),
        );
        return None;
    }
    Some(Source::Volume(source.to_owned()))
}

fn normalise_path(p: &str) -> String {
    let trimmed = p.trim_end_matches('/');
    if trimmed.is_empty() {
        "/".to_owned()
    } else {
        trimmed.to_owned()
    }
}

fn named_volume(
    ctx: &mut ServiceCtx<'_>,
    key: &str,
    name: &str,
    used: &mut BTreeSet<String>,
) -> Option<String> {
    match ctx.volumes.get(name) {
        Some(decl) => {
            used.insert(name.to_owned());
            Some(decl.spec.name.clone())
        }
        None => {
            ctx.err(
                key,
                Some(name.to_owned()),
                format!("the named volume '{name}' is not declared in the top-level volumes:"),
                Some(&format!(
                    "add it at the top level: volumes: {{ {name}: {{}} }}"
                )),
            );
            None
        }
    }
}

fn short_volume(
    ctx: &mut ServiceCtx<'_>,
    key: &str,
    t: &str,
    used: &mut BTreeSet<String>,
) -> Option<Mount> {
    let parts: Vec<&str> = t.split(':').collect();
    let (source, target, options) = match parts.as_slice() {
        [target] => {
            ctx.err(
                key,
                Some(t.to_owned()),
                "anonymous volumes are not supported",
                Some(&format!(
                    "name the volume and declare it at the top level, e.g. data:{target}"
                )),
            );
            return None;
        }
        [s, tg] => (*s, *tg, ""),
        [s, tg, o] => (*s, *tg, *o),
        _ => {
            ctx.err(
                key,
                Some(t.to_owned()),
                "expected source:target[:options]",
                None,
            );
            return None;
        }
    };
    if source.is_empty() {
        ctx.err(key, Some(t.to_owned()), "the volume source is empty", None);
        return None;
    }
    if !check_target(ctx, key, target) {
        return None;
    }
    let mut read_only = false;
    let mut no_copy = false;
    for opt in options.split(',').filter(|o| !o.is_empty()) {
        match opt {
            "ro" => read_only = true,
            "rw" => read_only = false,
            "nocopy" => no_copy = true,
            // macOS-only consistency hints: no effect on a Linux Machine.
            "cached" | "delegated" | "consistent" => {}
            "z" | "Z" | "shared" | "rshared" | "slave" | "rslave" | "private" | "rprivate" => ctx
                .warn(
                    key,
                    format!("the mount option '{opt}' is not supported and is ignored"),
                ),
            other => {
                ctx.err(
                    key,
                    Some(t.to_owned()),
                    format!("unknown mount option '{other}'"),
                    Some("use ro, rw or nocopy"),
                );
                return None;
            }
        }
    }
    let target = normalise_path(target);
    match classify_source(ctx, key, source)? {
        Source::Bind(source) => {
            if no_copy {
                ctx.warn(
                    key,
                    "nocopy applies to volumes only and is ignored for a bind",
                );
            }
            Some(Mount::Bind {
                source,
                target,
                read_only,
            })
        }
        Source::Volume(name) => Some(Mount::Volume {
            source: named_volume(ctx, key, &name, used)?,
            target,
            read_only,
            no_copy,
        }),
    }
}

fn long_volume(
    ctx: &mut ServiceCtx<'_>,
    key: &str,
    n: &Node,
    used: &mut BTreeSet<String>,
) -> Option<Mount> {
    warn_unknown_keys(
        ctx,
        key,
        n,
        &[
            "type",
            "source",
            "target",
            "read_only",
            "volume",
            "bind",
            "tmpfs",
            "consistency",
        ],
    );
    let kind = match n.get("type") {
        Some(t) => ctx.get(&format!("{key}.type"), t, text)?,
        None => {
            ctx.bad(key, n, "the long syntax needs type: volume, bind or tmpfs");
            return None;
        }
    };
    let target = match n.get("target") {
        Some(t) => ctx.get(&format!("{key}.target"), t, text)?,
        None => {
            ctx.bad(
                key,
                n,
                "a mount needs target: (the path inside the container)",
            );
            return None;
        }
    };
    if !check_target(ctx, &format!("{key}.target"), &target) {
        return None;
    }
    let target = normalise_path(&target);
    let read_only = match n.get("read_only") {
        Some(r) => ctx.get(&format!("{key}.read_only"), r, boolean)?,
        None => false,
    };
    let source = match n.get("source") {
        None | Some(Node::Null) => None,
        Some(s) => Some(ctx.get(&format!("{key}.source"), s, text)?),
    };
    match kind.as_str() {
        "volume" => {
            let Some(name) = source.filter(|s| !s.is_empty()) else {
                ctx.err(
                    key,
                    None,
                    "anonymous volumes are not supported",
                    Some("give source: a named volume declared at the top level"),
                );
                return None;
            };
            let mut no_copy = false;
            if let Some(v) = n.get("volume") {
                if expect_map(ctx, &format!("{key}.volume"), v).is_some() {
                    warn_unknown_keys(ctx, &format!("{key}.volume"), v, &["nocopy", "subpath"]);
                    if let Some(nc) = v.get("nocopy") {
                        no_copy = ctx.get(&format!("{key}.volume.nocopy"), nc, boolean)?;
                    }
                    if v.get("subpath").is_some() {
                        ctx.warn(
                            &format!("{key}.volume.subpath"),
                            "is not supported yet and is ignored; the whole volume is mounted",
                        );
                    }
                }
            }
            match classify_source(ctx, &format!("{key}.source"), &name)? {
                Source::Volume(name) => Some(Mount::Volume {
                    source: named_volume(ctx, &format!("{key}.source"), &name, used)?,
                    target,
                    read_only,
                    no_copy,
                }),
                Source::Bind(path) => {
                    ctx.err(
                        &format!("{key}.source"),
                        Some(path),
                        "a volume's source is a volume name, not a path",
                        Some("use type: bind for a host path"),
                    );
                    None
                }
            }
        }
        "bind" => {
            let Some(source) = source.filter(|s| !s.is_empty()) else {
                ctx.err(
                    key,
                    None,
                    "a bind needs source: (an absolute path on the Machine)",
                    None,
                );
                return None;
            };
            if let Some(b) = n.get("bind") {
                if expect_map(ctx, &format!("{key}.bind"), b).is_some() {
                    warn_unknown_keys(
                        ctx,
                        &format!("{key}.bind"),
                        b,
                        &["propagation", "create_host_path", "selinux", "recursive"],
                    );
                    for opt in ["propagation", "selinux", "recursive"] {
                        if b.get(opt).is_some() {
                            ctx.warn(
                                &format!("{key}.bind.{opt}"),
                                "is not supported and is ignored",
                            );
                        }
                    }
                    if let Some(c) = b.get("create_host_path") {
                        if ctx.get(&format!("{key}.bind.create_host_path"), c, boolean)
                            == Some(false)
                        {
                            ctx.warn(
                                &format!("{key}.bind.create_host_path"),
                                "false is not supported and is ignored; a missing host path is created",
                            );
                        }
                    }
                }
            }
            match classify_source(ctx, &format!("{key}.source"), &source)? {
                Source::Bind(source) => Some(Mount::Bind {
                    source,
                    target,
                    read_only,
                }),
                Source::Volume(name) => {
                    ctx.err(
                        &format!("{key}.source"),
                        Some(name),
                        "a bind's source is an absolute path on the Machine",
                        Some("use type: volume for a named volume"),
                    );
                    None
                }
            }
        }
        "tmpfs" => {
            if source.is_some() {
                ctx.warn(
                    &format!("{key}.source"),
                    "a tmpfs has no source; it is ignored",
                );
            }
            let mut size_bytes = None;
            let mut mode_bits = None;
            if let Some(t) = n.get("tmpfs") {
                if expect_map(ctx, &format!("{key}.tmpfs"), t).is_some() {
                    warn_unknown_keys(ctx, &format!("{key}.tmpfs"), t, &["size", "mode"]);
                    if let Some(s) = t.get("size") {
                        size_bytes = Some(ctx.get(&format!("{key}.tmpfs.size"), s, size)?);
                    }
                    if let Some(m) = t.get("mode") {
                        mode_bits = Some(ctx.get(&format!("{key}.tmpfs.mode"), m, mode)?);
                    }
                }
            }
            if read_only {
                ctx.warn(
                    &format!("{key}.read_only"),
                    "a read-only tmpfs is not supported; it stays writable",
                );
            }
            Some(Mount::Tmpfs {
                target,
                size_bytes,
                mode: mode_bits,
            })
        }
        other => {
            ctx.err(
                &format!("{key}.type"),
                Some(other.to_owned()),
                "unsupported mount type",
                Some("use volume, bind or tmpfs"),
            );
            None
        }
    }
}

/// The service-level `tmpfs:` key: a path or a list of paths, each with optional
/// `:size=<bytes>,mode=<octal>`.
fn tmpfs_key(ctx: &mut ServiceCtx<'_>, n: &Node, mounts: &mut Vec<(String, Mount)>) {
    let items: Vec<(String, &Node)> = match n {
        Node::Null => return,
        Node::Seq(items) => items
            .iter()
            .enumerate()
            .map(|(i, item)| (format!("tmpfs[{i}]"), item))
            .collect(),
        other => vec![("tmpfs".to_owned(), other)],
    };
    for (key, item) in items {
        let Some(t) = ctx.get(&key, item, text) else {
            continue;
        };
        let (target, opts) = t.split_once(':').unwrap_or((t.as_str(), ""));
        if !check_target(ctx, &key, target) {
            continue;
        }
        let mut size_bytes = None;
        let mut mode_bits = None;
        let mut ok = true;
        for opt in opts.split(',').filter(|o| !o.is_empty()) {
            match opt.split_once('=') {
                Some(("size", v)) => match parse_size_bytes(v) {
                    Ok(s) => size_bytes = Some(s),
                    Err(m) => {
                        ctx.err(&key, Some(t.clone()), m, None);
                        ok = false;
                    }
                },
                Some(("mode", v)) => match parse_octal_mode(v) {
                    Ok(m) => mode_bits = Some(m),
                    Err(m) => {
                        ctx.err(&key, Some(t.clone()), m, None);
                        ok = false;
                    }
                },
                _ => ctx.warn(
                    &key,
                    format!("the tmpfs option '{opt}' is not supported and is ignored"),
                ),
            }
        }
        if ok {
            mounts.push((
                key,
                Mount::Tmpfs {
                    target: normalise_path(target),
                    size_bytes,
                    mode: mode_bits,
                },
            ));
        }
    }
}

fn warn_privileged_bind(ctx: &mut ServiceCtx<'_>, key: &str, source: &str) {
    let what = match source {
        "/" => "the Machine's whole root filesystem",
        "/var/run/docker.sock" | "/run/docker.sock" => {
            "the Machine's Docker socket, which gives the container control of the Machine"
        }
        "/var/run" | "/run" | "/var/run/docker" | "/run/docker" => {
            "a directory holding the Machine's Docker socket, which gives the container control of the Machine"
        }
        _ => return,
    };
    ctx.warn(key, format!("binds '{source}', {what}"));
}

// ---- configs ------------------------------------------------------------------------------

fn service_configs(ctx: &mut ServiceCtx<'_>, n: &Node) -> Vec<ConfigUse> {
    let items = match n {
        Node::Null => return Vec::new(),
        Node::Seq(items) => items,
        other => {
            ctx.bad(
                "configs",
                other,
                format!("expected a list, found {}", other.kind()),
            );
            return Vec::new();
        }
    };
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let key = format!("configs[{i}]");
        if !matches!(item, Node::Map(_)) {
            let name = item.short();
            ctx.err(
                &key,
                Some(name.clone()),
                "the configs short syntax is not supported",
                Some(&format!(
                    "use the long syntax: - source: {name}, target: /path/in/container"
                )),
            );
            continue;
        }
        warn_unknown_keys(ctx, &key, item, &["source", "target", "uid", "gid", "mode"]);
        let Some(source) = item
            .get("source")
            .and_then(|s| ctx.get(&format!("{key}.source"), s, text))
        else {
            if item.get("source").is_none() {
                ctx.bad(
                    &key,
                    item,
                    "a config needs source: (a name under the top-level configs:)",
                );
            }
            continue;
        };
        let target = match item.get("target") {
            None | Some(Node::Null) => format!("/{source}"),
            Some(t) => match ctx.get(&format!("{key}.target"), t, text) {
                Some(t) => t,
                None => continue,
            },
        };
        if !check_target(ctx, &format!("{key}.target"), &target) {
            continue;
        }
        let id = |ctx: &mut ServiceCtx<'_>, k: &str| {
            item.get(k)
                .filter(|v| !matches!(v, Node::Null))
                .and_then(|v| ctx.get(&format!("{key}.{k}"), v, u32_of))
        };
        let uid = id(ctx, "uid");
        let gid = id(ctx, "gid");
        let mode_bits = item
            .get("mode")
            .filter(|v| !matches!(v, Node::Null))
            .and_then(|m| ctx.get(&format!("{key}.mode"), m, mode));
        out.push(ConfigUse {
            key,
            source,
            target: normalise_path(&target),
            mode: mode_bits,
            uid,
            gid,
        });
    }
    out
}

// ---- extensions ---------------------------------------------------------------------------

fn x_machines(ctx: &mut ServiceCtx<'_>, n: &Node) -> Vec<MachineTarget> {
    let texts: Vec<String> = match n {
        Node::Null => Vec::new(),
        Node::Seq(_) => match ctx.get("x-machines", n, string_list) {
            Some(l) => l,
            None => return Vec::new(),
        },
        other => match ctx.get("x-machines", other, text) {
            Some(t) => t.split(',').map(str::to_owned).collect(),
            None => return Vec::new(),
        },
    };
    let mut out: Vec<MachineTarget> = texts
        .iter()
        .map(|t| t.trim())
        .filter(|t| !t.is_empty())
        .filter_map(|t| t.parse().ok())
        .collect();
    out.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    out.dedup();
    out
}

fn x_pre_deploy(ctx: &mut ServiceCtx<'_>, n: &Node) -> Option<PreDeployHook> {
    const KEY: &str = "x-pre_deploy";
    expect_map(ctx, KEY, n)?;
    warn_unknown_keys(
        ctx,
        KEY,
        n,
        &["command", "environment", "privileged", "user", "timeout"],
    );
    let command = match n.get("command") {
        None | Some(Node::Null) => {
            ctx.err(
                KEY,
                None,
                "x-pre_deploy needs command:",
                Some("add e.g. command: ./migrate up"),
            );
            return None;
        }
        Some(c) => ctx.get(&format!("{KEY}.command"), c, command)?,
    };
    if command.is_empty() {
        ctx.err(
            &format!("{KEY}.command"),
            None,
            "the hook command is empty",
            None,
        );
        return None;
    }
    let env: BTreeMap<String, String> = match n.get("environment") {
        None => BTreeMap::new(),
        Some(e) => {
            let entries = ctx.get(&format!("{KEY}.environment"), e, kv_entries)?;
            let mut env = BTreeMap::new();
            for (k, v) in entries {
                match v.or_else(|| ctx.vars.get(&k).cloned()) {
                    Some(v) => {
                        env.insert(k, v);
                    }
                    None => ctx.warn(
                        &format!("{KEY}.environment.{k}"),
                        format!(
                            "'{k}' has no value and is not set in the environment; it is left out"
                        ),
                    ),
                }
            }
            env
        }
    };
    let privileged = match n.get("privileged") {
        None => false,
        Some(p) => ctx.get(&format!("{KEY}.privileged"), p, boolean)?,
    };
    if privileged {
        ctx.warn(
            &format!("{KEY}.privileged"),
            "the hook container runs privileged, with full control of its Machine",
        );
    }
    let user = match n.get("user") {
        None | Some(Node::Null) => None,
        Some(u) => Some(ctx.get(&format!("{KEY}.user"), u, text)?),
    };
    let timeout_ms = match n.get("timeout") {
        None | Some(Node::Null) => DEFAULT_HOOK_TIMEOUT_MS,
        Some(t) => ctx.get(&format!("{KEY}.timeout"), t, duration)?,
    };
    if timeout_ms == 0 {
        ctx.err(
            &format!("{KEY}.timeout"),
            Some("0".into()),
            "the hook timeout must be longer than zero",
            Some("leave it out for the default of 5m"),
        );
        return None;
    }
    Some(PreDeployHook {
        command,
        env,
        privileged,
        user,
        timeout_ms,
    })
}

/// Reads `depends_on` (list or mapping form). Order only; conditions other than
/// `service_completed_successfully` (a warning) change nothing.
pub(crate) fn depends_on(ctx: &mut ServiceCtx<'_>, n: &Node) -> Vec<Dep> {
    let mut out = Vec::new();
    match n {
        Node::Null => {}
        Node::Seq(items) => {
            for (i, item) in items.iter().enumerate() {
                let key = format!("depends_on[{i}]");
                if let Some(name) = ctx.get(&key, item, text) {
                    out.push(Dep {
                        name,
                        required: true,
                        key,
                    });
                }
            }
        }
        Node::Map(entries) => {
            for (name, v) in entries {
                let key = format!("depends_on.{name}");
                let mut required = true;
                if let Node::Map(_) = v {
                    warn_unknown_keys(ctx, &key, v, &["condition", "restart", "required"]);
                    if let Some(c) = v.get("condition") {
                        if let Some(c) = ctx.get(&format!("{key}.condition"), c, text) {
                            match c.as_str() {
                                "service_started" | "service_healthy" => {}
                                "service_completed_successfully" => ctx.warn(
                                    &format!("{key}.condition"),
                                    format!(
                                        "service_completed_successfully only orders the deploy; to run '{name}' to completion before this service, make it an x-pre_deploy hook"
                                    ),
                                ),
                                _ => ctx.err(
                                    &format!("{key}.condition"),
                                    Some(c),
                                    "unknown condition",
                                    Some("use service_started, service_healthy or service_completed_successfully"),
                                ),
                            }
                        }
                    }
                    if let Some(r) = v.get("required") {
                        required = ctx
                            .get(&format!("{key}.required"), r, boolean)
                            .unwrap_or(true);
                    }
                    if v.get("restart").is_some() {
                        ctx.warn(&format!("{key}.restart"), "is not supported and is ignored");
                    }
                } else if !matches!(v, Node::Null) {
                    ctx.bad(
                        &key,
                        v,
                        format!(
                            "expected a mapping (condition:, required:), found {}",
                            v.kind()
                        ),
                    );
                }
                out.push(Dep {
                    name: name.clone(),
                    required,
                    key,
                });
            }
        }
        other => ctx.bad(
            "depends_on",
            other,
            format!(
                "expected a list or a mapping of services, found {}",
                other.kind()
            ),
        ),
    }
    out
}
