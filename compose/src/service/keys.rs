//! The key table: every Compose key Ployz knows, top-level and per service, each classified
//! as kept, translated, warned or refused with a one-line note. The loader's warnings and
//! refusals for keys it does not read come from here, and so does the support matrix in
//! `docs/compose.md` ([`support_matrix`]); the conformance test holds the table against the
//! Compose specification's key list. Keys nested under another key (`deploy.placement`,
//! `healthcheck.disable`, ...) are classified by the module that reads that key.

use std::fmt::Write as _;

use super::{Node, ServiceCtx};
use crate::Diagnostics;

/// How Ployz treats a Compose key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Support {
    /// Lands in the Requested Service Spec as written.
    Kept,
    /// Lands in the Requested Service Spec in another form (`mem_limit` becomes resources,
    /// `scale` replicas, short ports host ports).
    Translated,
    /// Ignored with a warning that says what Ployz does instead.
    Warned,
    /// Refused: an error with the fix.
    Refused,
}

impl Support {
    /// The word used in the support matrix.
    pub fn as_str(self) -> &'static str {
        match self {
            Support::Kept => "kept",
            Support::Translated => "translated",
            Support::Warned => "warned",
            Support::Refused => "refused",
        }
    }
}

/// Where a key sits in a Compose file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Level {
    /// A key of the file itself (`services`, `volumes`, `include`, ...).
    TopLevel,
    /// A key of one service (`image`, `ports`, ...), including the Ployz extensions.
    Service,
}

/// One Compose key and what Ployz does with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyRule {
    /// Where the key sits.
    pub level: Level,
    /// The key as written in a Compose file.
    pub key: &'static str,
    /// How Ployz treats it.
    pub support: Support,
    /// One line: for a warned key, the warning's text (after the key); for a refused key, the
    /// fix; for the others, what the key becomes. Also the support matrix's note.
    pub note: &'static str,
}

const fn rule(level: Level, key: &'static str, support: Support, note: &'static str) -> KeyRule {
    KeyRule {
        level,
        key,
        support,
        note,
    }
}

const fn top(key: &'static str, support: Support, note: &'static str) -> KeyRule {
    rule(Level::TopLevel, key, support, note)
}

const fn svc(key: &'static str, support: Support, note: &'static str) -> KeyRule {
    rule(Level::Service, key, support, note)
}

use Support::{Kept, Refused, Translated, Warned};

/// Every Compose key Ployz knows: the top-level keys, then the service keys (the Compose
/// specification's, then the Ployz extensions), each in alphabetical order.
pub const KEY_RULES: &[KeyRule] = &[
    // ---- top level ----
    top("configs", Translated, "each config a Service uses becomes a file copied into its containers (file:, content: or environment:)"),
    top("include", Refused, "pass each file with its own -f instead"),
    top("models", Warned, "is not supported and is ignored"),
    top("name", Warned, "is ignored: Ployz has no project name; each Service is known by its own key"),
    top("networks", Warned, "networks are not created: every Service Container joins the Ployz network"),
    top("secrets", Translated, "each secret a Service uses becomes a read-only file under /run/secrets (file: or environment:); external secrets are refused"),
    top("services", Kept, "each included Service becomes a Requested Service Spec"),
    top("version", Warned, "is obsolete and ignored, as in Compose v2; remove it"),
    top("volumes", Kept, "named volumes become Docker Volumes (name, driver, driver_opts, labels, external)"),
    // ---- services ----
    svc("annotations", Warned, "is not supported and is ignored"),
    svc("attach", Warned, "is not supported and is ignored"),
    svc("blkio_config", Warned, "is not supported and is ignored; no block IO limits are set"),
    svc("build", Warned, "is not supported yet: with image: the image is used as it is (a warning); without image: refused"),
    svc("cap_add", Kept, "added Linux capabilities, named in a warning for the Deploy Preview"),
    svc("cap_drop", Kept, "dropped Linux capabilities"),
    svc("cgroup", Warned, "is not supported and is ignored"),
    svc("cgroup_parent", Warned, "is not supported and is ignored"),
    svc("command", Kept, "the container's command (text is split like a shell would)"),
    svc("configs", Translated, "short (- name, target /name) and long syntax; each becomes a file copied into the container"),
    svc("container_name", Warned, "is ignored: Service Container names are generated as <service>-<4 characters>"),
    svc("cpu_count", Warned, "is not supported and is ignored; use cpus"),
    svc("cpu_percent", Warned, "is not supported and is ignored; use cpus"),
    svc("cpu_period", Warned, "is not supported and is ignored; use cpus"),
    svc("cpu_quota", Warned, "is not supported and is ignored; use cpus"),
    svc("cpu_rt_period", Warned, "is not supported and is ignored"),
    svc("cpu_rt_runtime", Warned, "is not supported and is ignored"),
    svc("cpu_shares", Warned, "is not supported and is ignored; use cpus"),
    svc("cpus", Translated, "the container's CPU limit (deploy.resources.limits.cpus wins)"),
    svc("cpuset", Warned, "is not supported and is ignored"),
    svc("credential_spec", Warned, "is not supported and is ignored"),
    svc("depends_on", Kept, "start order; service_completed_successfully warns and points to x-pre_deploy"),
    svc("deploy", Translated, "mode, replicas, resources and update order become the spec's; the rest is ignored with a warning"),
    svc("develop", Warned, "is not supported and is ignored"),
    svc("device_cgroup_rules", Warned, "is not supported and is ignored"),
    svc("devices", Warned, "devices are not supported yet and are ignored (the warning names them)"),
    svc("dns", Warned, "is not supported and is ignored; containers use Ployz's internal DNS"),
    svc("dns_opt", Warned, "is not supported and is ignored; containers use Ployz's internal DNS"),
    svc("dns_search", Warned, "is not supported and is ignored; containers use Ployz's internal DNS"),
    svc("domainname", Warned, "is not supported and is ignored"),
    svc("entrypoint", Kept, "the container's entrypoint"),
    svc("env_file", Translated, "read at load time into the container's environment (environment: wins)"),
    svc("environment", Kept, "the container's environment; a name twice in the list form is refused"),
    svc("expose", Warned, "has no effect: every container port is reachable from the other Services on the Ployz network"),
    svc("extends", Refused, "copy the shared settings, or share them with a YAML anchor and merge key (<<: *base)"),
    svc("external_links", Warned, "is not supported and is ignored"),
    svc("extra_hosts", Warned, "is not supported and is ignored; no /etc/hosts entries are added"),
    svc("gpus", Warned, "is not supported yet and is ignored; the container gets no GPU"),
    svc("group_add", Warned, "is not supported and is ignored"),
    svc("healthcheck", Kept, "the container's health check (disable: true or test: [NONE] turns the image's off)"),
    svc("hostname", Warned, "is not supported and is ignored; the container keeps Docker's hostname"),
    svc("image", Kept, "the image reference, checked against Docker's grammar at load time"),
    svc("init", Kept, "runs an init process in the container"),
    svc("ipc", Warned, "is not supported and is ignored"),
    svc("isolation", Warned, "is not supported and is ignored"),
    svc("label_file", Warned, "is not supported and is ignored"),
    svc("labels", Warned, "is not supported and is ignored; Ployz sets its own ployz.* labels"),
    svc("links", Warned, "is not supported and is ignored; reach other Services by <service>.internal"),
    svc("logging", Kept, "the container's log driver and its options"),
    svc("mac_address", Warned, "is not supported and is ignored"),
    svc("mem_limit", Translated, "the container's memory limit (deploy.resources.limits.memory wins)"),
    svc("mem_reservation", Translated, "the container's memory reservation (deploy.resources.reservations.memory wins)"),
    svc("mem_swappiness", Warned, "is not supported and is ignored"),
    svc("memswap_limit", Warned, "is not supported and is ignored"),
    svc("models", Warned, "is not supported and is ignored"),
    svc("network_mode", Warned, "is not supported and is ignored; containers join the Ployz network"),
    svc("networks", Warned, "networks other than default are ignored (the warning names them); every Service Container joins the Ployz network"),
    svc("oom_kill_disable", Warned, "is not supported and is ignored"),
    svc("oom_score_adj", Warned, "is not supported and is ignored"),
    svc("pid", Warned, "is not supported and is ignored"),
    svc("pids_limit", Warned, "is not supported and is ignored; no PID limit is set"),
    svc("platform", Warned, "is not supported and is ignored; the Machine's platform is used"),
    svc("ports", Translated, "short and long syntax publish a host port on the Machine where the container runs (x-ports publishes through the edge)"),
    svc("post_start", Warned, "is not supported and is ignored"),
    svc("pre_stop", Warned, "is not supported and is ignored"),
    svc("privileged", Kept, "full access to the Machine, named in a warning for the Deploy Preview"),
    svc("profiles", Kept, "the Service is included only when one of its profiles is selected (-p)"),
    svc("provider", Warned, "is not supported and is ignored"),
    svc("pull_policy", Kept, "always, missing (if_not_present) or never; build is refused"),
    svc("pull_refresh_after", Warned, "is not supported and is ignored; use pull_policy always to pull on every Deploy"),
    svc("read_only", Warned, "is not supported and is ignored; the root filesystem stays writable"),
    svc("restart", Translated, "Ployz restarts containers unless they are stopped: unless-stopped and always say just that; any other value warns"),
    svc("runtime", Warned, "is not supported and is ignored"),
    svc("scale", Translated, "the number of replicas (deploy.replicas wins)"),
    svc("secrets", Translated, "short and long syntax; each becomes a read-only file, /run/secrets/<name> by default; only its digest is shown"),
    svc("security_opt", Warned, "is not supported and is ignored; Docker's default security options apply"),
    svc("shm_size", Kept, "the size of /dev/shm"),
    svc("stdin_open", Warned, "is not supported and is ignored"),
    svc("stop_grace_period", Kept, "how long a container has to stop before it is killed"),
    svc("stop_signal", Warned, "is not supported and is ignored; containers stop with the image's stop signal"),
    svc("storage_opt", Warned, "is not supported and is ignored"),
    svc("sysctls", Kept, "the container's kernel parameters"),
    svc("tmpfs", Translated, "tmpfs mounts"),
    svc("tty", Warned, "is not supported and is ignored"),
    svc("ulimits", Kept, "the container's ulimits"),
    svc("use_api_socket", Warned, "is not supported and is ignored"),
    svc("user", Kept, "the user the container runs as"),
    svc("userns_mode", Warned, "is not supported and is ignored"),
    svc("uts", Warned, "is not supported and is ignored"),
    svc("volumes", Translated, "named volumes, binds (relative paths resolved against the Compose file's folder, ~ against the home directory; a read-only single file is copied like a config), anonymous volumes and tmpfs"),
    svc("volumes_from", Warned, "is not supported and is ignored"),
    svc("working_dir", Warned, "is not supported yet and is ignored; the image's working directory is used"),
    // ---- Ployz extensions ----
    svc("x-caddy", Refused, "publish through the edge with x-ports, e.g. x-ports: [app.example.com:8080/https]; path routing, redirects and headers come as typed extensions"),
    svc("x-machines", Kept, "the Machines the Service may run on"),
    svc("x-ports", Translated, "Ingress Hostnames through the edge (http/https) and host ports"),
    svc("x-pre_deploy", Kept, "a command run before the Deploy changes the Service"),
];

/// The rule for a key at a level, if the table has one.
pub fn key_rule(level: Level, key: &str) -> Option<&'static KeyRule> {
    KEY_RULES.iter().find(|r| r.level == level && r.key == key)
}

/// The keys the table knows at a level.
fn keys_at(level: Level) -> impl Iterator<Item = &'static str> {
    KEY_RULES
        .iter()
        .filter(move |r| r.level == level)
        .map(|r| r.key)
}

/// The support matrix: one Markdown table per level, from [`KEY_RULES`]. `docs/compose.md`
/// is this text; a test keeps them equal.
pub fn support_matrix() -> String {
    let mut out = String::new();
    out.push_str("# Compose support\n\n");
    out.push_str(
        "<!-- Generated from the key table in compose/src/service/keys.rs; do not edit by hand.\n     \
         Regenerate: PLOYZ_BLESS=1 cargo test -p ployz-compose --test conformance -->\n\n",
    );
    out.push_str(
        "What `ployz deploy` does with each key of a Compose file. **kept**: it lands in the \
         Requested Service Spec as written; **translated**: it lands in another form; \
         **warned**: it is ignored with a warning that says what Ployz does instead; \
         **refused**: the file is refused with the fix. Unknown keys are warnings (with the \
         nearest known key); `x-` keys other than Ployz's are the file's own and are left \
         alone. Keys nested in these (`deploy.placement`, `logging.driver`, ...) \
         are read with the key they belong to; the ones Ployz ignores are warnings too.\n",
    );
    // Writing to a String cannot fail.
    for (level, title) in [
        (Level::TopLevel, "Top-level keys"),
        (Level::Service, "Service keys"),
    ] {
        let _ = write!(
            out,
            "\n## {title}\n\n| Key | Support | Note |\n|---|---|---|\n"
        );
        for r in KEY_RULES.iter().filter(|r| r.level == level) {
            let _ = writeln!(
                out,
                "| `{}` | {} | {} |",
                r.key,
                r.support.as_str(),
                r.note.replace('|', "\\|")
            );
        }
    }
    out
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

pub(super) fn warn_unknown_keys(ctx: &mut ServiceCtx<'_>, prefix: &str, n: &Node, known: &[&str]) {
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

/// A service key no group reads: warned and refused keys say what the table says; an
/// unknown key is a warning with the nearest known key.
pub(super) fn table_key(ctx: &mut ServiceCtx<'_>, k: &str, value: &Node) {
    match key_rule(Level::Service, k) {
        Some(r) => match r.support {
            Warned => ctx.warn(k, r.note),
            Refused => ctx.err(
                k,
                Some(value.short()),
                format!("{k} is not supported"),
                Some(r.note),
            ),
            // A key the table says lands in the spec but no group reads: never silent.
            Kept | Translated => ctx.warn(k, "is not read by this version of Ployz and is ignored"),
        },
        None => unknown_key(ctx, k),
    }
}

/// A key the table does not know.
fn unknown_key(ctx: &mut ServiceCtx<'_>, k: &str) {
    if k.starts_with("x-") {
        // A user's own extension; only a near miss of a Ployz extension is worth a word.
        let extensions = keys_at(Level::Service).filter(|e| e.starts_with("x-"));
        if let Some(s) = suggest(k, extensions) {
            ctx.warn(
                k,
                format!("unknown extension, ignored; did you mean '{s}'?"),
            );
        }
        return;
    }
    let hint = match suggest(k, keys_at(Level::Service).filter(|e| !e.starts_with("x-"))) {
        Some(s) => format!("; did you mean '{s}'?"),
        None => String::new(),
    };
    ctx.warn(k, format!("unknown key, ignored{hint}"));
}

/// A top-level key the project does not read itself: warned and refused keys say what the
/// table says; an unknown key is a warning with the nearest known key; `x-` keys are the
/// file's own.
pub(crate) fn top_level_key(d: &mut Diagnostics, file: &str, k: &str, value: &Node) {
    match key_rule(Level::TopLevel, k) {
        Some(r) if r.support == Warned => d.warn(file, None, k, r.note),
        Some(r) if r.support == Refused => d.error(
            file,
            None,
            Some(k),
            Some(value.short()),
            format!("{k} is not supported"),
            Some(r.note.to_owned()),
        ),
        Some(_) => {}
        None if k.starts_with("x-") => {}
        None => {
            let hint = match suggest(k, keys_at(Level::TopLevel)) {
                Some(s) => format!("; did you mean '{s}'?"),
                None => String::new(),
            };
            d.warn(
                file,
                None,
                k,
                format!("unknown top-level key, ignored{hint}"),
            );
        }
    }
}
