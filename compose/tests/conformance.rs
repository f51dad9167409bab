//! The loader against the Compose specification: every key the specification defines is in the
//! key table, and a file using every key loads with each one landing in the Requested Service
//! Spec, in a warning, or in a refusal; none vanishes without a word. Also: `docs/compose.md`
//! is the support matrix generated from the key table.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use ployz_compose::{
    key_rule, load, rule_under, support_matrix, ComposeErrors, ComposeInput, Level, LoadedProject,
    Support, KEY_RULES,
};
use serde_yaml_ng::Value;

// The key lists below are the Compose specification's JSON schema, `schema/compose-spec.json`
// of github.com/compose-spec/compose-spec at commit 00655e2222608fa6eaecdf12ac5195889ca2244a,
// compared key by key. The schema's other nested objects are not in SPEC_NESTED_KEYS: most
// (`deploy.placement`, `deploy.restart_policy`, `deploy.rollback_config`, `build`,
// `blkio_config`, a long volume's `image`, ...) sit under a key the table warns about or refuses
// and go with it; the long `env_file` items, `ulimits` entries and a volume's
// `external: {name}` are read by their modules without rows of their own.

/// The top-level keys of the Compose specification (`properties` of compose-spec.json).
const SPEC_TOP_LEVEL_KEYS: &[&str] = &[
    "version", "name", "include", "services", "models", "networks", "volumes", "secrets", "configs",
];

/// The service keys of the Compose specification (`definitions.service.properties` of
/// compose-spec.json).
const SPEC_SERVICE_KEYS: &[&str] = &[
    "develop",
    "deploy",
    "annotations",
    "attach",
    "build",
    "blkio_config",
    "cap_add",
    "cap_drop",
    "cgroup",
    "cgroup_parent",
    "command",
    "configs",
    "container_name",
    "cpu_count",
    "cpu_percent",
    "cpu_shares",
    "cpu_quota",
    "cpu_period",
    "cpu_rt_period",
    "cpu_rt_runtime",
    "cpus",
    "cpuset",
    "credential_spec",
    "depends_on",
    "device_cgroup_rules",
    "devices",
    "dns",
    "dns_opt",
    "dns_search",
    "domainname",
    "entrypoint",
    "env_file",
    "label_file",
    "environment",
    "expose",
    "extends",
    "provider",
    "external_links",
    "extra_hosts",
    "gpus",
    "group_add",
    "healthcheck",
    "hostname",
    "image",
    "init",
    "ipc",
    "isolation",
    "labels",
    "links",
    "logging",
    "mac_address",
    "mem_limit",
    "mem_reservation",
    "mem_swappiness",
    "memswap_limit",
    "network_mode",
    "models",
    "networks",
    "oom_kill_disable",
    "oom_score_adj",
    "pid",
    "pids_limit",
    "platform",
    "ports",
    "post_start",
    "pre_stop",
    "privileged",
    "profiles",
    "pull_policy",
    "pull_refresh_after",
    "read_only",
    "restart",
    "runtime",
    "scale",
    "security_opt",
    "shm_size",
    "secrets",
    "sysctls",
    "stdin_open",
    "stop_grace_period",
    "stop_signal",
    "storage_opt",
    "tmpfs",
    "tty",
    "ulimits",
    "use_api_socket",
    "user",
    "uts",
    "userns_mode",
    "volumes",
    "volumes_from",
    "working_dir",
];

/// The keys nested under another of the Compose specification, by parent path (the
/// `properties` of the nested objects of compose-spec.json: `deployment`, `resources`,
/// `healthcheck`, a service's long `ports`, `volumes`, `configs` and `secrets` items, `logging`,
/// `depends_on` entries, and the top-level `volume`, `config` and `secret` definitions).
const SPEC_NESTED_KEYS: &[(&str, &[&str])] = &[
    (
        "deploy",
        &[
            "mode",
            "endpoint_mode",
            "replicas",
            "labels",
            "rollback_config",
            "update_config",
            "resources",
            "restart_policy",
            "placement",
        ],
    ),
    ("deploy.resources", &["limits", "reservations"]),
    ("deploy.resources.limits", &["cpus", "memory", "pids"]),
    (
        "deploy.resources.reservations",
        &["cpus", "memory", "generic_resources", "devices"],
    ),
    (
        "deploy.update_config",
        &[
            "parallelism",
            "delay",
            "failure_action",
            "monitor",
            "max_failure_ratio",
            "order",
        ],
    ),
    (
        "healthcheck",
        &[
            "disable",
            "interval",
            "retries",
            "test",
            "timeout",
            "start_period",
            "start_interval",
        ],
    ),
    (
        "ports[]",
        &[
            "name",
            "mode",
            "host_ip",
            "target",
            "published",
            "protocol",
            "app_protocol",
        ],
    ),
    (
        "volumes[]",
        &[
            "type",
            "source",
            "target",
            "read_only",
            "consistency",
            "bind",
            "volume",
            "tmpfs",
            "image",
        ],
    ),
    (
        "volumes[].bind",
        &["propagation", "create_host_path", "recursive", "selinux"],
    ),
    ("volumes[].volume", &["labels", "nocopy", "subpath"]),
    ("volumes[].tmpfs", &["size", "mode"]),
    ("configs[]", &["source", "target", "uid", "gid", "mode"]),
    ("secrets[]", &["source", "target", "uid", "gid", "mode"]),
    ("logging", &["driver", "options"]),
    ("depends_on.*", &["condition", "restart", "required"]),
    (
        "volumes.*",
        &["name", "driver", "driver_opts", "external", "labels"],
    ),
    (
        "configs.*",
        &[
            "name",
            "content",
            "environment",
            "file",
            "external",
            "labels",
            "template_driver",
        ],
    ),
    (
        "secrets.*",
        &[
            "name",
            "environment",
            "file",
            "external",
            "labels",
            "driver",
            "driver_opts",
            "template_driver",
        ],
    ),
];

/// Nested keys Ployz knows that the specification does not have: its own extension's keys,
/// `content:` on a secret (refused, pointing to file: or environment:), and
/// `deploy.resources.limits.devices` (which Docker's Compose accepts).
const PLOYZ_NESTED_KEYS: &[(&str, &[&str])] = &[
    (
        "x-pre_deploy",
        &["command", "environment", "privileged", "user", "timeout"],
    ),
    ("secrets.*", &["content"]),
    ("deploy.resources.limits", &["devices"]),
    (
        "x-routes[]",
        &[
            "allow",
            "basic_auth",
            "error_pages",
            "exact",
            "hostname",
            "path",
            "redirect",
            "request_headers",
            "max_body_size",
            "response_headers",
            "status",
            "strip_prefix",
            "timeout",
        ],
    ),
    (
        "x-routes[].basic_auth",
        &["realm", "users_file", "users_secret"],
    ),
    ("x-routes[].request_headers", &["add", "remove", "set"]),
    ("x-routes[].response_headers", &["add", "remove", "set"]),
];

/// Nested keys that change nothing the loader gives, and why that is not a key vanishing:
/// each is accepted on purpose, as the key table's note says.
const ACCEPTED_WITHOUT_EFFECT: &[(&str, &str)] = &[
    // The file in the container is known by the declaration's key; Compose's `name` is the
    // platform's name for it, which Ployz has no use for (tests/secrets.rs keeps it silent).
    ("configs.*", "name"),
    ("secrets.*", "name"),
    // host and ingress both publish on the Machine where the container runs (one engine per
    // Machine); any other value is refused.
    ("ports[]", "mode"),
    // A port's name and application protocol describe it for people and tools; Docker publishes
    // the port the same with or without them, so a warning would only be noise.
    ("ports[]", "name"),
    ("ports[]", "app_protocol"),
];

/// How a kept or translated key shows in the spec: a path into the spec (as YAML) and what
/// must be there.
enum Lands {
    /// The value at the path equals this YAML.
    Eq(&'static str, &'static str),
    /// The value at the path is a list with an item holding every entry of this YAML mapping.
    Has(&'static str, &'static str),
    /// Something other than null, false or empty is at the path.
    Set(&'static str),
}

/// Where each kept or translated service key of `every_key.yaml` lands in `web`'s spec (or
/// `api`'s, for `x-ports`).
fn service_landings() -> Vec<(&'static str, &'static str, Lands)> {
    use Lands::*;
    vec![
        ("cap_add", "web", Eq("container.cap_add", "[NET_ADMIN]")),
        ("cap_drop", "web", Eq("container.cap_drop", "[MKNOD]")),
        (
            "command",
            "web",
            Eq("container.command", "[./server, --port, '8080']"),
        ),
        (
            "configs",
            "web",
            Has(
                "container.configs",
                "{target: /etc/app/config.toml, content: listen = 8080}",
            ),
        ),
        (
            "cpus",
            "web",
            Eq("container.resources.nano_cpus", "500000000"),
        ),
        ("depends_on", "web", Eq("depends_on", "[db]")),
        ("deploy", "web", Eq("update.order", "start-first")),
        (
            "entrypoint",
            "web",
            Eq("container.entrypoint", "[/sbin/tini, --]"),
        ),
        ("env_file", "web", Eq("container.env.FROM_FILE", "yes")),
        ("environment", "web", Eq("container.env.PORT", "'8080'")),
        ("healthcheck", "web", Set("container.healthcheck")),
        (
            "image",
            "web",
            Eq("container.image", "ghcr.io/acme/web:1.2"),
        ),
        ("init", "web", Eq("container.init", "true")),
        ("logging", "web", Eq("container.logging.driver", "local")),
        (
            "mem_limit",
            "web",
            Eq("container.resources.memory_limit_bytes", "536870912"),
        ),
        (
            "mem_reservation",
            "web",
            Eq("container.resources.memory_reservation_bytes", "268435456"),
        ),
        ("ports", "web", Set("ports")),
        ("privileged", "web", Eq("container.privileged", "true")),
        ("pull_policy", "web", Eq("container.pull_policy", "always")),
        ("scale", "web", Eq("replicas", "2")),
        (
            "secrets",
            "web",
            Has(
                "container.secrets",
                "{name: api_token, target: /run/secrets/api_token}",
            ),
        ),
        (
            "shm_size",
            "web",
            Eq("container.shm_size_bytes", "67108864"),
        ),
        (
            "stop_grace_period",
            "web",
            Eq("container.stop_grace_period_ms", "60000"),
        ),
        (
            "sysctls",
            "web",
            Eq("container.sysctls", "{net.core.somaxconn: '1024'}"),
        ),
        (
            "tmpfs",
            "web",
            Has("container.mounts", "{type: tmpfs, target: /var/run/app}"),
        ),
        (
            "ulimits",
            "web",
            Eq("container.ulimits.nofile", "{soft: 1024, hard: 4096}"),
        ),
        ("user", "web", Eq("container.user", "'1000:1000'")),
        (
            "volumes",
            "web",
            Has("container.mounts", "{type: volume, target: /var/lib/web}"),
        ),
        ("x-machines", "web", Set("machines")),
        ("x-pre_deploy", "web", Set("pre_deploy")),
        ("x-ports", "api", Set("ports")),
        ("x-routes", "api", Set("routes")),
        (
            "extends",
            "api",
            Has(
                "container.mounts",
                "{type: volume, target: /var/lib/postgresql/data}",
            ),
        ),
    ]
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/conformance")
}

fn load_fixture(file: &str, profiles: &[&str]) -> Result<LoadedProject, ComposeErrors> {
    load(&ComposeInput {
        files: vec![fixtures().join(file)],
        profiles: profiles.iter().map(|p| p.to_string()).collect(),
        env: Default::default(),
    })
}

fn yaml(text: &str) -> Value {
    serde_yaml_ng::from_str(text).unwrap_or_else(|e| panic!("bad YAML in the test {text:?}: {e}"))
}

/// The value at a dotted path (mapping keys only).
fn at<'v>(v: &'v Value, path: &str) -> Option<&'v Value> {
    path.split('.').try_fold(v, |v, k| v.get(k))
}

/// Whether `item` holds every entry of the mapping `want`.
fn holds(item: &Value, want: &Value) -> bool {
    match (item, want) {
        (Value::Mapping(item), Value::Mapping(want)) => want
            .iter()
            .all(|(k, w)| item.get(k).is_some_and(|v| v == w)),
        (item, want) => item == want,
    }
}

fn lands(spec: &Value, how: &Lands) -> Result<(), String> {
    let (path, found) = match how {
        Lands::Eq(p, _) | Lands::Has(p, _) | Lands::Set(p) => (*p, at(spec, p)),
    };
    let ok = match (how, found) {
        (_, None) => false,
        (Lands::Eq(_, want), Some(v)) => *v == yaml(want),
        (Lands::Has(_, want), Some(Value::Sequence(items))) => {
            let want = yaml(want);
            items.iter().any(|i| holds(i, &want))
        }
        (Lands::Has(..), Some(_)) => false,
        (Lands::Set(_), Some(v)) => {
            !matches!(v, Value::Null | Value::Bool(false))
                && v.as_sequence().is_none_or(|s| !s.is_empty())
                && v.as_mapping().is_none_or(|m| !m.is_empty())
        }
    };
    if ok {
        Ok(())
    } else {
        Err(format!("{path} is {found:?}"))
    }
}

/// The keys each service of a fixture sets, and its top-level keys.
fn keys_in(file: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let text = std::fs::read_to_string(fixtures().join(file)).expect("the fixture is readable");
    let doc = yaml(&text);
    let mapping_keys = |v: &Value| -> Vec<String> {
        v.as_mapping()
            .map(|m| {
                m.keys()
                    .filter_map(|k| k.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let top = mapping_keys(&doc).into_iter().collect();
    let services = doc
        .get("services")
        .and_then(Value::as_mapping)
        .map(|m| m.values().flat_map(mapping_keys).collect())
        .unwrap_or_default();
    (top, services)
}

#[test]
fn the_key_table_covers_the_compose_specification() {
    let mut missing = Vec::new();
    for (level, keys) in [
        (Level::TopLevel, SPEC_TOP_LEVEL_KEYS),
        (Level::Service, SPEC_SERVICE_KEYS),
    ] {
        for k in keys {
            if key_rule(level, k).is_none() {
                missing.push(format!("{level:?} {k}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "keys the table does not classify: {missing:?}"
    );
    for (parent, keys) in SPEC_NESTED_KEYS {
        for k in *keys {
            if rule_under(parent, k).is_none() {
                missing.push(format!("{parent}.{k}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "nested keys the table does not classify: {missing:?}"
    );
    // And nothing in the table that the specification does not have, but Ployz's own keys.
    let listed = |lists: &[(&str, &[&str])], parent: &str, key: &str| {
        lists
            .iter()
            .any(|(p, keys)| *p == parent && keys.contains(&key))
    };
    for r in KEY_RULES {
        let known = match r.level {
            Level::TopLevel => SPEC_TOP_LEVEL_KEYS.contains(&r.key),
            Level::Service => SPEC_SERVICE_KEYS.contains(&r.key),
            Level::Under(parent) => {
                listed(SPEC_NESTED_KEYS, parent, r.key) || listed(PLOYZ_NESTED_KEYS, parent, r.key)
            }
        };
        assert!(
            known || r.key.starts_with("x-"),
            "the table has {:?} {}, which the Compose specification does not",
            r.level,
            r.key
        );
        assert!(!r.note.is_empty(), "{} has no note", r.key);
    }
    let mut seen = BTreeSet::new();
    for r in KEY_RULES {
        assert!(
            seen.insert((format!("{:?}", r.level), r.key)),
            "{:?} {} is in the table twice",
            r.level,
            r.key
        );
    }
}

#[test]
fn the_fixtures_use_every_key_of_the_specification() {
    let (top_a, svc_a) = keys_in("every_key.yaml");
    let (top_b, svc_b) = keys_in("refused.yaml");
    for k in SPEC_TOP_LEVEL_KEYS {
        assert!(
            top_a.contains(*k) || top_b.contains(*k),
            "no fixture uses the top-level key {k}"
        );
    }
    for k in SPEC_SERVICE_KEYS {
        assert!(
            svc_a.contains(*k) || svc_b.contains(*k),
            "no fixture uses the service key {k}"
        );
    }
}

#[test]
fn every_key_lands_in_the_spec_a_warning_or_a_refusal() {
    let p = load_fixture("every_key.yaml", &["web"])
        .unwrap_or_else(|e| panic!("every_key.yaml must load:\n{e}"));
    let spec_of = |name: &str| -> Value {
        let s = p
            .services
            .iter()
            .find(|s| s.name.as_str() == name)
            .unwrap_or_else(|| panic!("no service {name}"));
        serde_yaml_ng::to_value(s).expect("a spec serialises")
    };
    let warned = |service: Option<&str>, key: &str| {
        p.warnings
            .iter()
            .any(|w| w.key == key && (service.is_none() || w.service.as_deref() == service))
    };
    let landings = service_landings();
    let (_, used) = keys_in("every_key.yaml");
    let mut silent = Vec::new();
    for key in &used {
        let rule = key_rule(Level::Service, key)
            .unwrap_or_else(|| panic!("{key} is not in the key table"));
        let landing = landings.iter().find(|(k, _, _)| k == key);
        let said = warned(None, key);
        match rule.support {
            Support::Warned => {
                if !said {
                    silent.push(format!(
                        "{key}: warned in the table, but no warning names it"
                    ));
                }
            }
            Support::Refused => silent.push(format!(
                "{key}: refused in the table, but every_key.yaml loaded"
            )),
            Support::Kept | Support::Translated if key == "profiles" => {
                // Lands as the selection: without the profile, web is left out.
                let without = load_fixture("every_key.yaml", &[]).expect("loads without profiles");
                if without.services.iter().any(|s| s.name.as_str() == "web") {
                    silent.push("profiles: web is included without its profile".into());
                }
            }
            Support::Kept | Support::Translated if key == "build" => {
                // Lands beside the spec: how the CLI builds web's image.
                if !p
                    .builds
                    .iter()
                    .any(|(n, b)| n.as_str() == "web" && b.context.ends_with("web"))
                {
                    silent.push("build: web has no build".into());
                }
            }
            Support::Kept | Support::Translated => match landing {
                Some((_, service, how)) => {
                    if let Err(why) = lands(&spec_of(service), how) {
                        if !said {
                            silent.push(format!(
                                "{key}: not in the spec ({why}) and no warning names it"
                            ));
                        }
                    }
                }
                // restart has no field: the fixture's value (no) is warned.
                None if said => {}
                None => silent.push(format!("{key}: the test does not say where it lands")),
            },
        }
    }
    // The top-level keys: services and volumes land; the rest is warned, or lands through the
    // services that use it.
    let (top, _) = keys_in("every_key.yaml");
    for key in &top {
        if key.starts_with("x-") {
            continue;
        }
        let rule = key_rule(Level::TopLevel, key)
            .unwrap_or_else(|| panic!("top-level {key} is not in the key table"));
        let ok = match key.as_str() {
            "services" => p.services.len() == 3,
            "volumes" => p.volumes.len() == 2,
            "configs" => lands(&spec_of("web"), &Lands::Set("container.configs")).is_ok(),
            "secrets" => {
                lands(&spec_of("web"), &Lands::Set("container.secrets")).is_ok()
                    || warned(Some("web"), "secrets")
            }
            _ => rule.support == Support::Warned && warned(None, key),
        };
        if !ok {
            silent.push(format!(
                "top-level {key}: lands nowhere and no warning names it"
            ));
        }
    }
    assert!(
        silent.is_empty(),
        "keys that vanish without a word:\n{}\nwarnings: {:#?}",
        silent.join("\n"),
        p.warnings
    );
}

#[test]
fn every_refused_key_is_an_error_naming_it() {
    let errors = load_fixture("refused.yaml", &[]).expect_err("refused.yaml must be refused");
    let refused = KEY_RULES
        .iter()
        .filter(|r| r.support == Support::Refused && !matches!(r.level, Level::Under(_)));
    for r in refused {
        let found = errors.0.iter().find(|e| e.key.as_deref() == Some(r.key));
        let e = found.unwrap_or_else(|| panic!("no error names {}: {errors}", r.key));
        assert!(e.fix.is_some(), "the refusal of {} has no fix: {e}", r.key);
    }
    // Nothing else is refused: each refusal stands alone.
    assert_eq!(errors.0.len(), 2, "{errors}");
}

/// One step of a path into a YAML document.
#[derive(Debug, Clone)]
enum Step {
    Key(String),
    Index(usize),
}

/// A nested key as a fixture uses it: the rule's parent, the key, and where its mapping is.
#[derive(Debug)]
struct NestedUse {
    parent: &'static str,
    key: String,
    at: Vec<Step>,
}

/// The parents the key table has nested keys under.
fn parents() -> Vec<&'static str> {
    let mut out = Vec::new();
    for r in KEY_RULES {
        if let Level::Under(p) = r.level {
            if !out.contains(&p) {
                out.push(p);
            }
        }
    }
    out
}

/// The mappings of a document that a parent path names (`ports[]`: each mapping item of a
/// service's `ports`; `depends_on.*`: each mapping value of a service's `depends_on`; the
/// top-level `volumes.*`: each volume declaration).
fn mappings_at(doc: &Value, parent: &str) -> Vec<Vec<Step>> {
    let mut found: Vec<Vec<Step>> = if Level::is_top_level_parent(parent) {
        vec![Vec::new()]
    } else {
        doc.get("services")
            .and_then(Value::as_mapping)
            .map(|m| {
                m.keys()
                    .filter_map(Value::as_str)
                    .map(|s| vec![Step::Key("services".into()), Step::Key(s.into())])
                    .collect()
            })
            .unwrap_or_default()
    };
    for segment in parent.split('.') {
        let mut next = Vec::new();
        for at in &found {
            let Some(v) = get(doc, at) else { continue };
            if segment == "*" {
                for k in v.as_mapping().into_iter().flat_map(|m| m.keys()) {
                    if let Some(k) = k.as_str() {
                        next.push(with(at, Step::Key(k.into())));
                    }
                }
            } else if let Some(list) = segment.strip_suffix("[]") {
                let items = v.get(list).and_then(Value::as_sequence);
                for i in 0..items.map_or(0, Vec::len) {
                    next.push(with(&with(at, Step::Key(list.into())), Step::Index(i)));
                }
            } else if v.get(segment).is_some() {
                next.push(with(at, Step::Key(segment.into())));
            }
        }
        found = next;
    }
    found
        .into_iter()
        .filter(|at| get(doc, at).is_some_and(Value::is_mapping))
        .collect()
}

fn with(at: &[Step], step: Step) -> Vec<Step> {
    let mut out = at.to_vec();
    out.push(step);
    out
}

fn get<'v>(doc: &'v Value, at: &[Step]) -> Option<&'v Value> {
    at.iter().try_fold(doc, |v, s| match s {
        Step::Key(k) => v.get(k.as_str()),
        Step::Index(i) => v.get(*i),
    })
}

fn get_mut<'v>(doc: &'v mut Value, at: &[Step]) -> Option<&'v mut Value> {
    at.iter().try_fold(doc, |v, s| match s {
        Step::Key(k) => v.get_mut(k.as_str()),
        Step::Index(i) => v.get_mut(*i),
    })
}

/// Every nested key a fixture uses, under each parent of the key table (`x-` keys are the
/// file's own).
fn nested_uses(doc: &Value) -> Vec<NestedUse> {
    let mut out = Vec::new();
    for parent in parents() {
        for at in mappings_at(doc, parent) {
            let keys: Vec<String> = get(doc, &at)
                .and_then(Value::as_mapping)
                .map(|m| {
                    m.keys()
                        .filter_map(Value::as_str)
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default();
            for key in keys.into_iter().filter(|k| !k.starts_with("x-")) {
                out.push(NestedUse {
                    parent,
                    key,
                    at: at.clone(),
                });
            }
        }
    }
    out
}

/// A fixture loaded from a copy of the fixtures folder, so that a changed document can be
/// loaded next to the files it names; the copy is removed on drop, also on panic.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir =
            std::env::temp_dir().join(format!("ployz-conformance-{name}-{}", std::process::id()));
        copy_dir(&fixtures(), &dir);
        Scratch(dir)
    }

    /// What the loader gives for this document: the project, or the errors, as text.
    fn outcome(&self, doc: &Value) -> String {
        let path = self.0.join("changed.yaml");
        let text = serde_yaml_ng::to_string(doc).expect("a document serialises");
        std::fs::write(&path, text).expect("the scratch folder is writable");
        let env = [("CONF_VALUE", "conf"), ("TOKEN_VALUE", "token")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        match load(&ComposeInput {
            files: vec![path],
            profiles: Vec::new(),
            env,
        }) {
            Ok(p) => format!("{p:#?}"),
            Err(e) => format!("refused:\n{e}"),
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("the scratch folder can be made");
    for entry in std::fs::read_dir(from).expect("the fixtures are readable") {
        let entry = entry.expect("the fixtures are readable");
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("a fixture can be copied");
        }
    }
}

fn fixture_doc(file: &str) -> Value {
    let text = std::fs::read_to_string(fixtures().join(file)).expect("the fixture is readable");
    yaml(&text)
}

#[test]
fn the_fixtures_use_every_nested_key_of_the_table() {
    let mut used = BTreeSet::new();
    for file in ["nested.yaml", "nested_refused.yaml"] {
        for u in nested_uses(&fixture_doc(file)) {
            used.insert((u.parent, u.key));
        }
    }
    let unused: Vec<String> = KEY_RULES
        .iter()
        .filter_map(|r| match r.level {
            Level::Under(p) if !used.contains(&(p, r.key.to_owned())) => {
                Some(format!("{p}.{}", r.key))
            }
            _ => None,
        })
        .collect();
    assert!(
        unused.is_empty(),
        "no fixture uses the nested keys {unused:?}"
    );
    for (parent, key) in &used {
        assert!(
            rule_under(parent, key).is_some(),
            "a fixture uses {parent}.{key}, which the key table does not have"
        );
    }
}

/// Takes each nested key out of a fixture in turn: what the loader gives must change (the
/// spec, the volumes, a warning or an error), or the key vanished without a word.
fn each_nested_key_counts(file: &str, scratch: &Scratch) -> Vec<String> {
    let doc = fixture_doc(file);
    let base = scratch.outcome(&doc);
    let mut silent = Vec::new();
    for u in nested_uses(&doc) {
        let mut changed = doc.clone();
        if let Some(Value::Mapping(m)) = get_mut(&mut changed, &u.at) {
            // shift_remove keeps the order of the other keys, and so of their warnings.
            m.shift_remove(u.key.as_str());
        }
        let accepted = ACCEPTED_WITHOUT_EFFECT
            .iter()
            .any(|(p, k)| *p == u.parent && *k == u.key);
        if scratch.outcome(&changed) == base && !accepted {
            silent.push(format!("{}.{} (at {:?})", u.parent, u.key, u.at));
        }
    }
    silent
}

#[test]
fn every_nested_key_lands_in_the_spec_a_warning_or_a_refusal() {
    let scratch = Scratch::new("nested");
    let doc = fixture_doc("nested.yaml");
    let base = scratch.outcome(&doc);
    assert!(
        !base.starts_with("refused:"),
        "nested.yaml must load:\n{base}"
    );
    let mut silent = each_nested_key_counts("nested.yaml", &scratch);
    // A key the table warns about is a warning naming its path, with the table's note.
    for u in nested_uses(&doc) {
        let Some(rule) = rule_under(u.parent, &u.key) else {
            continue;
        };
        if rule.support == Support::Warned && !base.contains(rule.note) {
            silent.push(format!(
                "{}.{}: warned in the table, but no warning has its note",
                u.parent, u.key
            ));
        }
    }
    silent.extend(each_nested_key_counts("nested_refused.yaml", &scratch));
    assert!(
        silent.is_empty(),
        "nested keys that vanish without a word:\n{}\nloaded: {base}",
        silent.join("\n")
    );
}

#[test]
fn every_refused_nested_key_is_an_error_naming_it() {
    let errors =
        load_fixture("nested_refused.yaml", &[]).expect_err("nested_refused.yaml must be refused");
    for r in KEY_RULES.iter().filter(|r| r.support == Support::Refused) {
        let Level::Under(parent) = r.level else {
            continue;
        };
        let e = errors
            .0
            .iter()
            .find(|e| {
                e.key.as_deref().is_some_and(|k| {
                    // A top-level declaration's key starts with its section (configs.<name>).
                    let section = parent
                        .strip_suffix(".*")
                        .filter(|_| Level::is_top_level_parent(parent));
                    k.ends_with(&format!(".{}", r.key))
                        && section.is_none_or(|s| k.starts_with(&format!("{s}.")))
                })
            })
            .unwrap_or_else(|| panic!("no error names {parent}.{}: {errors}", r.key));
        assert!(
            e.fix.is_some(),
            "the refusal of {parent}.{} has no fix: {e}",
            r.key
        );
    }
}

#[test]
fn docs_compose_md_is_the_support_matrix() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/compose.md");
    let want = support_matrix();
    if std::env::var_os("PLOYZ_BLESS").is_some() {
        std::fs::write(&path, &want).expect("docs/compose.md is writable");
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "docs/compose.md is not the support matrix generated from the key table; regenerate it with\n  PLOYZ_BLESS=1 cargo test -p ployz-compose --test conformance"
    );
}
