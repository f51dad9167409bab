//! The loader against the Compose specification: every key the specification defines is in the
//! key table, and a file using every key loads with each one landing in the Requested Service
//! Spec, in a warning, or in a refusal; none vanishes without a word. Also: `docs/compose.md`
//! is the support matrix generated from the key table.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use ployz_compose::{
    key_rule, load, support_matrix, ComposeErrors, ComposeInput, Level, LoadedProject, Support,
    KEY_RULES,
};
use serde_yaml_ng::Value;

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
            Has("container.mounts", "{type: tmpfs, target: /run}"),
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
    // And nothing in the table that the specification does not have, but Ployz's extensions.
    for r in KEY_RULES {
        let spec = match r.level {
            Level::TopLevel => SPEC_TOP_LEVEL_KEYS,
            Level::Service => SPEC_SERVICE_KEYS,
        };
        assert!(
            spec.contains(&r.key) || r.key.starts_with("x-"),
            "the table has {:?} {}, which the Compose specification does not",
            r.level,
            r.key
        );
        assert!(!r.note.is_empty(), "{} has no note", r.key);
    }
    let mut seen = BTreeSet::new();
    for r in KEY_RULES {
        assert!(
            seen.insert((r.level as u8, r.key)),
            "{} is in the table twice",
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
    for r in KEY_RULES.iter().filter(|r| r.support == Support::Refused) {
        let found = errors.0.iter().find(|e| e.key.as_deref() == Some(r.key));
        let e = found.unwrap_or_else(|| panic!("no error names {}: {errors}", r.key));
        assert!(e.fix.is_some(), "the refusal of {} has no fix: {e}", r.key);
    }
    // Nothing else is refused: each refusal stands alone.
    assert_eq!(errors.0.len(), 3, "{errors}");
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
