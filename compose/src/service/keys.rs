//! The key table: every Compose key Ployz knows, top-level and per service, each classified
//! as kept, translated, warned or refused with a one-line note. The loader's warnings and
//! refusals for keys it does not read come from here, and so does the support matrix in
//! `docs/compose.md` ([`support_matrix`]); the conformance test holds the table against the
//! Compose specification's key lists. Keys nested under another key (`deploy.placement`,
//! `healthcheck.start_interval`, a long port's `app_protocol`, ...) are in the table too, under
//! their parent ([`Level::Under`]); the modules that read them take their known keys
//! ([`known_under`]) and their warnings ([`note_under`]) from it.

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
    /// A key nested under another, named by the parent's path: `deploy`,
    /// `deploy.resources.limits`, `ports[]` (a long-syntax item of a service's list),
    /// `volumes[].bind`, `depends_on.*` (the value of any entry of a service's mapping), and
    /// the top-level `volumes.*`, `configs.*` and `secrets.*` (one declaration).
    Under(&'static str),
}

impl Level {
    /// Whether a parent path names a key of the file itself rather than of a service: the
    /// top-level declarations (`volumes.*`, `configs.*`, `secrets.*`).
    pub fn is_top_level_parent(parent: &str) -> bool {
        matches!(parent, "volumes.*" | "configs.*" | "secrets.*")
    }
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

const fn under(
    parent: &'static str,
    key: &'static str,
    support: Support,
    note: &'static str,
) -> KeyRule {
    rule(Level::Under(parent), key, support, note)
}

use Support::{Kept, Refused, Translated, Warned};

/// Every Compose key Ployz knows: the top-level keys, then the service keys (the Compose
/// specification's, then the Ployz extensions), each in alphabetical order; then the keys
/// nested under another, grouped by parent.
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
    svc("build", Kept, "the CLI builds the image with its Docker (context, dockerfile, dockerfile_inline, args, target, labels, no_cache, pull; other build keys warned), tags it from its inputs and sends it to the Machines"),
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
    svc("extends", Translated, "resolved as Compose does: the base service (of the same file, or of file:) with the service's own keys merged over it"),
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
    svc("pull_policy", Kept, "always, missing (if_not_present) or never; build (with build:) as missing: the image comes from the CLI"),
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
    svc("x-ports", Translated, "Ingress Hostnames through the edge (http/https), Ingress Ports (tcp/udp on every Machine's edge) and host ports"),
    svc("x-pre_deploy", Kept, "a command run before the Deploy changes the Service"),
    svc("x-revisions", Kept, "how many Service Revisions are kept for ployz rollback (5 by default)"),
    svc("x-routes", Kept, "the paths of its Ingress Hostnames the Service serves (prefix or exact, strip_prefix)"),
    // ---- nested keys, by parent (the Compose specification's, then Ployz's own) ----
    under("deploy", "endpoint_mode", Warned, "is not supported and is ignored"),
    under("deploy", "labels", Warned, "is not supported and is ignored"),
    under("deploy", "mode", Kept, "replicated (the default) or global: one container on every eligible Machine"),
    under("deploy", "placement", Warned, "is not supported and is ignored; choose Machines with x-machines"),
    under("deploy", "replicas", Kept, "the number of replicas (wins over scale)"),
    under("deploy", "resources", Translated, "limits and reservations become the container's resources"),
    under("deploy", "restart_policy", Warned, "is not supported and is ignored: Ployz runs every Service Container with restart policy unless-stopped"),
    under("deploy", "rollback_config", Warned, "is not supported and is ignored"),
    under("deploy", "update_config", Translated, "order and monitor become the spec's update settings"),
    under("deploy.resources", "limits", Translated, "cpus and memory become the container's limits"),
    under("deploy.resources", "reservations", Translated, "memory becomes the container's memory reservation"),
    under("deploy.resources.limits", "cpus", Translated, "the container's CPU limit (wins over cpus)"),
    under("deploy.resources.limits", "devices", Warned, "is not supported and is ignored"),
    under("deploy.resources.limits", "memory", Translated, "the container's memory limit (wins over mem_limit)"),
    under("deploy.resources.limits", "pids", Warned, "is not supported and is ignored; no PID limit is set"),
    under("deploy.resources.reservations", "cpus", Warned, "is not supported yet and is ignored"),
    under("deploy.resources.reservations", "devices", Warned, "is not supported yet and is ignored"),
    under("deploy.resources.reservations", "generic_resources", Warned, "is not supported yet and is ignored"),
    under("deploy.resources.reservations", "memory", Translated, "the container's memory reservation (wins over mem_reservation)"),
    under("deploy.update_config", "delay", Warned, "is not supported and is ignored"),
    under("deploy.update_config", "failure_action", Warned, "is not supported and is ignored"),
    under("deploy.update_config", "max_failure_ratio", Warned, "is not supported and is ignored"),
    under("deploy.update_config", "monitor", Kept, "how long a new container is watched before the update goes on"),
    under("deploy.update_config", "order", Kept, "start-first or stop-first"),
    under("deploy.update_config", "parallelism", Warned, "is not supported and is ignored; containers are replaced one at a time"),
    under("depends_on.*", "condition", Kept, "service_started and service_healthy order the Deploy; service_completed_successfully warns and points to x-pre_deploy"),
    under("depends_on.*", "required", Kept, "false: a dependency left out of the project is not an error"),
    under("depends_on.*", "restart", Warned, "is not supported and is ignored"),
    under("healthcheck", "disable", Kept, "true turns the image's health check off"),
    under("healthcheck", "interval", Kept, "the time between two probes"),
    under("healthcheck", "retries", Kept, "the failed probes in a row that make the container unhealthy"),
    under("healthcheck", "start_interval", Kept, "the time between two probes during the start period"),
    under("healthcheck", "start_period", Kept, "the time failed probes do not count after a start"),
    under("healthcheck", "test", Kept, "the probe: [CMD, ...], [CMD-SHELL, ...], a shell command as text, or [NONE]"),
    under("healthcheck", "timeout", Kept, "how long one probe may take"),
    under("logging", "driver", Kept, "the container's log driver"),
    under("logging", "options", Kept, "the log driver's options (ignored with a warning without a driver)"),
    under("ports[]", "app_protocol", Kept, "accepted without effect, as in Compose on one engine: a hint for people and tools; for HTTP(S) through the edge use x-ports"),
    under("ports[]", "host_ip", Translated, "the host address the port is bound on"),
    under("ports[]", "mode", Translated, "ingress (the default) and host both publish on the Machine where the container runs"),
    under("ports[]", "name", Kept, "accepted without effect, as in Compose on one engine: a name for people and tools"),
    under("ports[]", "protocol", Translated, "tcp (the default) or udp"),
    under("ports[]", "published", Translated, "the host port or range; without it Docker picks a free host port"),
    under("ports[]", "target", Translated, "the container port"),
    under("volumes[]", "bind", Translated, "a bind's options: create_host_path"),
    under("volumes[]", "consistency", Warned, "has no effect on a Linux Machine and is ignored"),
    under("volumes[]", "image", Warned, "is ignored: image mounts are not supported (use type: volume, bind or tmpfs)"),
    under("volumes[]", "read_only", Translated, "mounts read-only"),
    under("volumes[]", "source", Translated, "the volume's name, or the bind's path"),
    under("volumes[]", "target", Translated, "the absolute path in the container"),
    under("volumes[]", "tmpfs", Translated, "a tmpfs's size and mode"),
    under("volumes[]", "type", Translated, "volume, bind or tmpfs; other types are refused"),
    under("volumes[]", "volume", Translated, "a volume's options: nocopy"),
    under("volumes[].bind", "create_host_path", Translated, "false: a missing project path is an error instead of an empty folder"),
    under("volumes[].bind", "propagation", Warned, "is not supported and is ignored"),
    under("volumes[].bind", "recursive", Warned, "is not supported and is ignored"),
    under("volumes[].bind", "selinux", Warned, "is not supported and is ignored"),
    under("volumes[].tmpfs", "mode", Translated, "the tmpfs's permission bits"),
    under("volumes[].tmpfs", "size", Translated, "the tmpfs's size"),
    under("volumes[].volume", "labels", Warned, "is ignored: a named volume's labels come from its top-level declaration (volumes.<name>.labels)"),
    under("volumes[].volume", "nocopy", Translated, "the volume is not seeded from the image"),
    under("volumes[].volume", "subpath", Warned, "is not supported yet and is ignored; the whole volume is mounted"),
    under("configs[]", "gid", Kept, "the group owning the file"),
    under("configs[]", "mode", Kept, "the file's permission bits"),
    under("configs[]", "source", Kept, "the top-level config"),
    under("configs[]", "target", Kept, "the path in the container (/<source> by default)"),
    under("configs[]", "uid", Kept, "the user owning the file"),
    under("secrets[]", "gid", Kept, "the group owning the file"),
    under("secrets[]", "mode", Kept, "the file's permission bits"),
    under("secrets[]", "source", Kept, "the top-level secret"),
    under("secrets[]", "target", Kept, "the path in the container (/run/secrets/<source> by default)"),
    under("secrets[]", "uid", Kept, "the user owning the file"),
    under("volumes.*", "driver", Kept, "the Docker Volume's driver"),
    under("volumes.*", "driver_opts", Kept, "the Docker Volume's driver options"),
    under("volumes.*", "external", Kept, "the Docker Volume is not created; it must exist"),
    under("volumes.*", "labels", Kept, "the Docker Volume's labels"),
    under("volumes.*", "name", Kept, "the Docker Volume's name"),
    under("configs.*", "content", Kept, "the config's value, written in the file"),
    under("configs.*", "environment", Kept, "the config's value from a variable"),
    under("configs.*", "external", Refused, "give the config a file:, content: or environment:"),
    under("configs.*", "file", Kept, "the config's value from a file (relative to the Compose file's folder)"),
    under("configs.*", "labels", Warned, "is ignored: the config is a file in the container, with nothing to label"),
    under("configs.*", "name", Kept, "accepted without effect: the config is known by its key in the file"),
    under("configs.*", "template_driver", Warned, "is not supported and is ignored; the value is copied as it is, not rendered as a template"),
    under("secrets.*", "driver", Refused, "drop driver: and driver_opts:, and give the secret a file: or environment:"),
    under("secrets.*", "driver_opts", Refused, "drop driver: and driver_opts:, and give the secret a file: or environment:"),
    under("secrets.*", "environment", Kept, "the secret's value from a variable"),
    under("secrets.*", "external", Refused, "give the secret a file:, or pass its value through the environment"),
    under("secrets.*", "file", Kept, "the secret's value from a file (relative to the Compose file's folder)"),
    under("secrets.*", "labels", Warned, "is ignored: the secret is a file in the container, with nothing to label"),
    under("secrets.*", "name", Kept, "accepted without effect: the secret is known by its key in the file"),
    under("secrets.*", "template_driver", Warned, "is not supported and is ignored; the value is mounted as it is, not rendered as a template"),
    under("secrets.*", "content", Refused, "put the value in a file (file: ./secret.txt) or a variable (environment: VARIABLE), out of the Compose file"),
    under("x-pre_deploy", "command", Kept, "the hook's command (required)"),
    under("x-routes[]", "allow", Kept, "the client addresses and networks admitted; others get 403"),
    under("x-routes[]", "basic_auth", Kept, "only the users of a list (bcrypt or argon2 hashes) get through; others get 401"),
    under("x-routes[].basic_auth", "realm", Kept, "the realm the browser's prompt names"),
    under("x-routes[].basic_auth", "users_file", Kept, "htpasswd lines (user:hash) in a file, relative to the Compose file's folder"),
    under("x-routes[].basic_auth", "users_secret", Kept, "a top-level secret holding htpasswd lines (user:hash)"),
    under("x-routes[]", "error_pages", Kept, "HTML files the edge answers its own 502, 503 and 504 with"),
    under("x-routes[]", "max_body_size", Kept, "the largest request body the route takes; larger ones get 413"),
    under("x-routes[]", "timeout", Kept, "how long the container may take to answer (and between reads of the answer); then 504"),
    under("x-routes[]", "exact", Kept, "one path, matched exactly"),
    under("x-routes[]", "hostname", Kept, "the Ingress Hostname of x-ports it routes (needed when there are several)"),
    under("x-routes[]", "path", Kept, "a path prefix, matched on a segment boundary, longest first"),
    under("x-routes[]", "redirect", Kept, "the edge answers a redirect there itself, the path and query kept"),
    under("x-routes[]", "request_headers", Kept, "fields the edge removes, sets or adds in the request"),
    under("x-routes[]", "response_headers", Kept, "fields the edge removes, sets or adds in the response"),
    under("x-routes[].request_headers", "add", Kept, "fields added beside any of the name"),
    under("x-routes[].request_headers", "remove", Kept, "fields removed"),
    under("x-routes[].request_headers", "set", Kept, "fields replacing any of the name"),
    under("x-routes[].response_headers", "add", Kept, "fields added beside any of the name"),
    under("x-routes[].response_headers", "remove", Kept, "fields removed"),
    under("x-routes[].response_headers", "set", Kept, "fields replacing any of the name"),
    under("x-routes[]", "status", Kept, "the redirect's status: 301, 302, 303, 307 or 308 (the default)"),
    under("x-routes[]", "strip_prefix", Kept, "the container sees the path without the prefix"),
    under("x-pre_deploy", "environment", Kept, "the hook container's environment"),
    under("x-pre_deploy", "privileged", Kept, "runs the hook container privileged, named in a warning"),
    under("x-pre_deploy", "timeout", Kept, "how long the hook may run"),
    under("x-pre_deploy", "user", Kept, "the user the hook runs as"),
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
         alone. Keys nested in these (`deploy.placement`, `logging.driver`, ...) are \
         classified the same way, under their parent.\n",
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
    let _ = write!(
        out,
        "\n## Nested keys\n\nKeys under another key, by the parent's path: `[]` is an item of \
         a list in its long syntax, `*` any entry of a mapping; `volumes.*`, `configs.*` and \
         `secrets.*` are the top-level declarations. A key nested in a warned key (`deploy.placement.constraints`) \
         is ignored with it.\n"
    );
    let mut parents: Vec<&str> = Vec::new();
    for r in KEY_RULES {
        if let Level::Under(p) = r.level {
            if !parents.contains(&p) {
                parents.push(p);
            }
        }
    }
    for parent in parents {
        let _ = write!(
            out,
            "\n### `{parent}`\n\n| Key | Support | Note |\n|---|---|---|\n"
        );
        for r in KEY_RULES.iter().filter(|r| r.level == Level::Under(parent)) {
            let _ = writeln!(
                out,
                "| `{parent}.{}` | {} | {} |",
                r.key,
                r.support.as_str(),
                r.note.replace('|', "\\|")
            );
        }
    }
    out
}

/// The closest known key to a typo, if any is within two edits.
fn suggest<'a>(key: &str, known: impl Iterator<Item = &'a str>) -> Option<&'a str> {
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

/// The rule for a key nested under `parent` (a path such as `deploy.resources.limits`), if the
/// table has one.
pub fn rule_under(parent: &str, key: &str) -> Option<&'static KeyRule> {
    KEY_RULES
        .iter()
        .find(|r| matches!(r.level, Level::Under(p) if p == parent) && r.key == key)
}

/// The keys the table knows under `parent`.
pub(crate) fn known_under(parent: &str) -> impl Iterator<Item = &'static str> + '_ {
    KEY_RULES
        .iter()
        .filter(move |r| matches!(r.level, Level::Under(p) if p == parent))
        .map(|r| r.key)
}

/// The table's note for a key nested under `parent`: the warning for a warned key, the fix
/// for a refused one. Empty if the table does not know the key, which a test rules out for
/// every key the loader asks about.
pub(crate) fn note_under(parent: &str, key: &str) -> &'static str {
    rule_under(parent, key).map_or("", |r| r.note)
}

/// The warning for a key the table does not know under `parent`, with the nearest known key.
pub(crate) fn unknown_under(parent: &str, key: &str) -> String {
    match suggest(key, known_under(parent)) {
        Some(s) => format!("unknown key, ignored; did you mean '{s}'?"),
        None => "unknown key, ignored".to_owned(),
    }
}

/// The keys of a mapping nested under `parent` (written at `prefix`, e.g. `ports[0]` for the
/// parent `ports[]`): a key the table warns about is a warning with the table's note, a
/// refused one an error with its fix, an unknown one a warning with the nearest known key;
/// kept and translated keys are left to the caller, and `x-` keys are the file's own.
pub(super) fn nested_keys(ctx: &mut ServiceCtx<'_>, parent: &str, prefix: &str, n: &Node) {
    let Node::Map(entries) = n else {
        return;
    };
    for (k, v) in entries {
        if k.starts_with("x-") {
            continue;
        }
        let key = format!("{prefix}.{k}");
        match rule_under(parent, k) {
            Some(r) if r.support == Warned => ctx.warn(&key, r.note),
            Some(r) if r.support == Refused => ctx.err(
                &key,
                Some(v.short()),
                format!("{k} is not supported"),
                Some(r.note),
            ),
            Some(_) => {}
            None => ctx.warn(&key, unknown_under(parent, k)),
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
