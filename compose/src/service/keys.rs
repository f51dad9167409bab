//! Which service keys Ployz reads, which it knows but ignores (a warning each), and the
//! "did you mean" hint for the rest.

use super::{Node, ServiceCtx};

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
    "secrets",
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

pub(super) fn unknown_key(ctx: &mut ServiceCtx<'_>, k: &str) {
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

/// `extends:` is refused: the project would need another file's service to be complete.
pub(super) fn extends(ctx: &mut ServiceCtx<'_>, value: &Node) {
    ctx.err(
        "extends",
        Some(value.short()),
        "extends is not supported",
        Some(
            "copy the shared settings, or share them with a YAML anchor and merge key (<<: *base)",
        ),
    );
}
