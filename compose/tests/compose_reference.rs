//! The loader against `docker-compose config` (Debian's docker-compose) where the two overlap:
//! merging of several files, `.env` and `${VAR}` interpolation, `$$`, environment forms,
//! command and healthcheck strings, replicas, host ports and volumes. Each case is loaded by
//! both, and the fields Ployz keeps must agree. Every project of the corpus (`tests/corpus/`) goes
//! through both too.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use ployz_compose::{load, ComposeInput};
use ployz_core::{Healthcheck, Mount, PortSpec, ServiceSpec};
use serde_yaml_ng::Value;

fn reference_config(dir: &Path, files: &[&str], env: &BTreeMap<String, String>) -> Value {
    reference_config_with(dir, files, &[], env)
}

/// `docker-compose config` of `files` in `dir` with `profiles` enabled; panics when it fails.
fn reference_config_with(
    dir: &Path,
    files: &[&str],
    profiles: &[String],
    env: &BTreeMap<String, String>,
) -> Value {
    let out = reference_output(dir, files, profiles, env);
    assert!(
        out.status.success(),
        "docker-compose config failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_yaml_ng::from_slice(&out.stdout).unwrap()
}

/// What `docker-compose config` printed, success or not.
fn reference_output(
    dir: &Path,
    files: &[&str],
    profiles: &[String],
    env: &BTreeMap<String, String>,
) -> std::process::Output {
    let mut cmd = Command::new("docker-compose");
    cmd.current_dir(dir).env_clear().envs(env);
    if let Ok(path) = std::env::var("PATH") {
        cmd.env("PATH", path);
    }
    for f in files {
        cmd.args(["-f", f]);
    }
    for p in profiles {
        cmd.args(["--profile", p]);
    }
    cmd.arg("config")
        .output()
        .expect("docker-compose runs (Debian package docker-compose; scripts/setup.sh installs it)")
}

/// `docker-compose config` re-escapes `$` as `$$` in its output.
fn unescape(s: &str) -> String {
    s.replace("$$", "$")
}

fn words(v: &Value) -> Vec<String> {
    match v {
        Value::String(s) => shlex::split(&unescape(s)).unwrap(),
        Value::Sequence(items) => items
            .iter()
            .map(|i| unescape(i.as_str().unwrap()))
            .collect(),
        other => panic!("unexpected {other:?}"),
    }
}

fn duration_ms(s: &str) -> u64 {
    let (num, unit) = s.split_at(s.find(|c: char| c.is_alphabetic()).unwrap());
    let n: f64 = num.parse().unwrap();
    (match unit {
        "ms" => n,
        "s" => n * 1000.0,
        "m" => n * 60_000.0,
        "h" => n * 3_600_000.0,
        other => panic!("unit {other}"),
    }) as u64
}

fn compare(service: &ServiceSpec, reference: &Value) {
    let r = &reference["services"][service.name.as_str()];
    let name = service.name.as_str();
    assert_eq!(
        service.container.image,
        r["image"].as_str().unwrap(),
        "{name}: image"
    );
    let env: BTreeMap<String, String> = match &r["environment"] {
        Value::Mapping(m) => m
            .iter()
            .map(|(k, v)| {
                let v = match v {
                    Value::String(s) => unescape(s),
                    Value::Null => String::new(),
                    other => serde_yaml_ng::to_string(other).unwrap().trim().to_owned(),
                };
                (k.as_str().unwrap().to_owned(), v)
            })
            .collect(),
        _ => BTreeMap::new(),
    };
    assert_eq!(service.container.env, env, "{name}: environment");
    if !r["command"].is_null() {
        assert_eq!(
            service.container.command.clone().unwrap(),
            words(&r["command"]),
            "{name}: command"
        );
    }
    if !r["entrypoint"].is_null() {
        assert_eq!(
            service.container.entrypoint.clone().unwrap(),
            words(&r["entrypoint"]),
            "{name}: entrypoint"
        );
    }
    let replicas = r["deploy"]["replicas"].as_u64().unwrap_or(1);
    assert_eq!(u64::from(service.replicas), replicas, "{name}: replicas");
    if let Value::Mapping(hc) = &r["healthcheck"] {
        match &service.container.healthcheck {
            Some(Healthcheck::Configured(c)) => {
                let test = &hc[&Value::from("test")];
                let expected = match test {
                    Value::String(s) => vec!["CMD-SHELL".to_owned(), unescape(s)],
                    other => words(other),
                };
                assert_eq!(c.test(), expected.as_slice(), "{name}: healthcheck test");
                if let Some(i) = hc.get("interval").and_then(Value::as_str) {
                    assert_eq!(c.interval_ms, Some(duration_ms(i)), "{name}: interval");
                }
                if let Some(n) = hc.get("retries").and_then(Value::as_u64) {
                    assert_eq!(c.retries, Some(n as u32), "{name}: retries");
                }
            }
            Some(Healthcheck::Disabled) => {
                assert!(
                    hc.get("disable").and_then(Value::as_bool).unwrap_or(false)
                        || hc
                            .get("test")
                            .map(|t| t == &Value::from(vec!["NONE"]))
                            .unwrap_or(false),
                    "{name}: disabled"
                );
            }
            None => panic!("{name}: healthcheck missing"),
        }
    }
    if let Value::Sequence(ports) = &r["ports"] {
        let mut expected: Vec<(u16, u16)> = ports
            .iter()
            .map(|p| {
                (
                    p["published"].as_u64().unwrap() as u16,
                    p["target"].as_u64().unwrap() as u16,
                )
            })
            .collect();
        expected.sort();
        let mut got: Vec<(u16, u16)> = service
            .ports
            .iter()
            .filter_map(|p| match p {
                PortSpec::Host {
                    host_port,
                    container_port,
                    ..
                } => host_port.map(|h| (h, *container_port)),
                _ => None,
            })
            .collect();
        got.sort();
        assert_eq!(got, expected, "{name}: ports");
    }
    if let Value::Sequence(vols) = &r["volumes"] {
        let mut expected: Vec<(String, String, bool)> = vols
            .iter()
            .map(|v| match v {
                // docker-compose v1 prints the short form: `source:target:rw|ro`.
                Value::String(short) => {
                    let parts: Vec<&str> = short.split(':').collect();
                    (
                        parts[0].to_owned(),
                        parts[1].to_owned(),
                        parts.get(2) == Some(&"ro"),
                    )
                }
                long => (
                    long["source"].as_str().unwrap_or("").to_owned(),
                    long["target"].as_str().unwrap().to_owned(),
                    long["read_only"].as_bool().unwrap_or(false),
                ),
            })
            .collect();
        expected.sort();
        let mut got: Vec<(String, String, bool)> = service
            .container
            .mounts
            .iter()
            .filter_map(|m| match m {
                Mount::Volume {
                    source,
                    target,
                    read_only,
                    ..
                }
                | Mount::Bind {
                    source,
                    target,
                    read_only,
                } => Some((source.clone(), target.clone(), *read_only)),
                Mount::Anonymous { target, read_only } => {
                    Some((String::new(), target.clone(), *read_only))
                }
                Mount::Tmpfs { .. } => None,
            })
            .collect();
        got.sort();
        assert_eq!(got, expected, "{name}: volumes");
    }
}

fn case(files: &[(&str, &str)], dotenv: Option<&str>, env: &[(&str, &str)]) {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    if let Some(text) = dotenv {
        std::fs::write(dir.path().join(".env"), text).unwrap();
    }
    let env: BTreeMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let names: Vec<&str> = files.iter().map(|(n, _)| *n).collect();
    let reference = reference_config(dir.path(), &names, &env);
    let ours = load(&ComposeInput {
        files: names.iter().map(|n| dir.path().join(n)).collect(),
        profiles: vec![],
        env,
    })
    .unwrap_or_else(|e| panic!("{e}"));
    let reference_names: Vec<&str> = reference["services"]
        .as_mapping()
        .unwrap()
        .keys()
        .map(|k| k.as_str().unwrap())
        .collect();
    assert_eq!(ours.services.len(), reference_names.len());
    for s in &ours.services {
        compare(s, &reference);
    }
}

#[test]
#[ignore = "needs docker-compose (scripts/test.sh installs it and runs this)"]
fn merged_files_interpolation_and_environment_agree() {
    case(
        &[
            (
                "a.yaml",
                r#"
services:
  web:
    image: "app:${TAG}"
    command: sh -c "echo $$HOME && sleep ${SLEEP:-1}"
    environment:
      - A=1
      - B=${B:-fallback}
      - EMPTY=
    healthcheck:
      test: wget -q -O- http://localhost/
      interval: 1m30s
      retries: 4
    ports:
      - target: 80
        published: 8080
        mode: host
    deploy:
      replicas: 2
"#,
            ),
            (
                "b.yaml",
                r#"
services:
  web:
    environment:
      C: "3"
      A: "override"
    deploy:
      replicas: 3
"#,
            ),
        ],
        Some("TAG=1.2\nSLEEP=5\n"),
        &[("B", "from-env")],
    );
}

#[test]
#[ignore = "needs docker-compose (scripts/test.sh installs it and runs this)"]
fn volumes_entrypoints_and_list_commands_agree() {
    case(
        &[(
            "compose.yaml",
            r#"
services:
  db:
    image: postgres:16
    entrypoint: ["/bin/sh", "-c"]
    command: ["exec postgres -c 'max_connections=${MAXC:-100}'"]
    volumes:
      - data:/var/lib/postgresql/data
      - /etc/localtime:/etc/localtime:ro
    healthcheck:
      test: ["CMD", "pg_isready"]
      interval: 5s
  cache:
    image: redis
    healthcheck:
      disable: true
volumes:
  data: {}
"#,
        )],
        None,
        &[("MAXC", "250")],
    );
}

// ---------------------------------------------------------------------------------------------
// The corpus (`tests/corpus/<project>/`): every project through both loaders.

/// Corpus projects Debian's docker-compose (1.29) cannot read, and why: newer Compose keys.
const REFERENCE_CANNOT_READ: &[(&str, &str)] = &[
    ("depends-conditions", "depends_on.<service>.restart"),
    ("healthcheck-forms", "healthcheck.start_interval"),
    ("immich-like", "the top-level name:"),
    (
        "long-ports",
        "ports[].host_ip and app_protocol in the long syntax",
    ),
    (
        "secrets-env-configs",
        "configs.<name>.content and secrets.<name>.environment",
    ),
];

fn corpus_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus")
}

/// The lines of an optional list file of a project (`files`, `profiles`).
fn corpus_list(dir: &Path, name: &str) -> Vec<String> {
    std::fs::read_to_string(dir.join(name))
        .map(|t| {
            t.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// A project's `-f` files, relative to its folder.
fn corpus_files(dir: &Path) -> Vec<String> {
    let listed = corpus_list(dir, "files");
    if !listed.is_empty() {
        return listed;
    }
    [
        "compose.yaml",
        "compose.yml",
        "docker-compose.yaml",
        "docker-compose.yml",
    ]
    .iter()
    .find(|n| dir.join(n).exists())
    .map(|n| vec![n.to_string()])
    .unwrap_or_else(|| panic!("{}: no Compose file", dir.display()))
}

/// `path` with `.` and `..` components folded, without touching the file system.
fn lexical(path: &Path) -> String {
    let mut out = std::path::PathBuf::new();
    for c in path.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out.to_string_lossy().into_owned()
}

/// A host port as both sides can say it: (host IP, published port, container port, protocol).
type HostPort = (Option<String>, Option<u64>, u64, String);

/// docker-compose's ports: the long form `{target, published, protocol}`, or (with a host IP)
/// the short `ip:published:target/proto` where the IP may itself hold colons.
fn reference_ports(r: &Value) -> Vec<HostPort> {
    let mut out: Vec<HostPort> = r["ports"]
        .as_sequence()
        .into_iter()
        .flatten()
        .map(|p| match p {
            Value::String(s) => {
                let (rest, proto) = s.split_once('/').unwrap_or((s.as_str(), "tcp"));
                let mut parts: Vec<&str> = rest.rsplitn(3, ':').collect();
                parts.reverse();
                let (ip, published, target) = match parts.as_slice() {
                    [ip, published, target] => (Some(*ip), Some(*published), *target),
                    [published, target] => (None, Some(*published), *target),
                    [target] => (None, None, *target),
                    _ => panic!("unexpected port {s}"),
                };
                (
                    ip.filter(|i| !i.is_empty()).map(str::to_owned),
                    published
                        .filter(|p| !p.is_empty())
                        .map(|p| p.parse().unwrap()),
                    target.parse().unwrap(),
                    proto.to_owned(),
                )
            }
            long => (
                long["host_ip"].as_str().map(str::to_owned),
                long["published"].as_u64(),
                long["target"].as_u64().unwrap(),
                long["protocol"].as_str().unwrap_or("tcp").to_owned(),
            ),
        })
        .collect();
    // `x-ports` is Ployz's own key, which docker-compose keeps as written: its host ports are
    // read with Ployz's parser, so both sides list every host port the service binds.
    for p in r["x-ports"].as_sequence().into_iter().flatten() {
        let text = p.as_str().expect("x-ports entries are text");
        let name: ployz_core::ServiceName = "reference".parse().unwrap();
        if let Ok(PortSpec::Host {
            host_ip,
            host_port,
            container_port,
            protocol,
        }) = ployz_compose::parse_port(text, &name)
        {
            out.push((
                host_ip,
                host_port.map(u64::from),
                u64::from(container_port),
                protocol.to_string(),
            ));
        }
    }
    out.sort();
    out
}

/// Our host ports, read from the serialised spec (the shape of `PortSpec::Host` may grow).
fn our_ports(service: &ServiceSpec) -> Vec<HostPort> {
    let mut out: Vec<HostPort> = service
        .ports
        .iter()
        .map(|p| serde_yaml_ng::to_value(p).unwrap())
        .filter(|p| p["mode"].as_str() == Some("host"))
        .map(|p| {
            (
                p["host_ip"].as_str().map(str::to_owned),
                p["host_port"].as_u64(),
                p["container_port"].as_u64().unwrap(),
                p["protocol"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    out.sort();
    out
}

/// A mount as both sides can say it: (source, empty for an anonymous volume; target; read-only).
type MountLine = (String, String, bool);

/// docker-compose's volumes (tmpfs left out): `source:target:mode`, a lone `target` for an
/// anonymous volume, or the long form.
fn reference_mounts(r: &Value) -> Vec<MountLine> {
    let mut out: Vec<MountLine> = r["volumes"]
        .as_sequence()
        .into_iter()
        .flatten()
        .filter(|v| v["type"].as_str() != Some("tmpfs"))
        .map(|v| match v {
            Value::String(short) => {
                let parts: Vec<&str> = short.split(':').collect();
                match parts.as_slice() {
                    [target] => (String::new(), (*target).to_owned(), false),
                    [source, target, rest @ ..] => (
                        (*source).to_owned(),
                        (*target).to_owned(),
                        rest.first() == Some(&"ro"),
                    ),
                    [] => panic!("empty volume"),
                }
            }
            long => (
                long["source"].as_str().unwrap_or("").to_owned(),
                long["target"].as_str().unwrap().to_owned(),
                long["read_only"].as_bool().unwrap_or(false),
            ),
        })
        .collect();
    out.sort();
    out
}

/// Our mounts (tmpfs left out), plus the read-only single-file binds that travel like secrets:
/// a secret file whose name is a path (`./nginx.conf`) was a bind of that file, resolved
/// against the first Compose file's folder.
fn our_mounts(service: &ServiceSpec, compose_dir: &Path) -> Vec<MountLine> {
    let container = serde_yaml_ng::to_value(&service.container).unwrap();
    let mut out: Vec<MountLine> = container["mounts"]
        .as_sequence()
        .into_iter()
        .flatten()
        .filter(|m| m["type"].as_str() != Some("tmpfs"))
        .map(|m| {
            (
                m["source"].as_str().unwrap_or("").to_owned(),
                m["target"].as_str().unwrap().to_owned(),
                m["read_only"].as_bool().unwrap_or(false),
            )
        })
        .collect();
    for c in container["secrets"].as_sequence().into_iter().flatten() {
        let name = c["name"].as_str().unwrap();
        if is_bound_file(name) {
            let source = match name.strip_prefix("~/") {
                Some(rest) => Path::new(&std::env::var("HOME").unwrap()).join(rest),
                None => compose_dir.join(name),
            };
            out.push((
                lexical(&source),
                c["target"].as_str().unwrap().to_owned(),
                true,
            ));
        }
    }
    out.sort();
    out
}

/// The secret targets docker-compose gives a service (`/run/secrets/<source>` by default).
fn reference_secret_targets(r: &Value) -> Vec<String> {
    let mut out: Vec<String> = r["secrets"]
        .as_sequence()
        .into_iter()
        .flatten()
        .map(|s| match s {
            Value::String(name) => format!("/run/secrets/{name}"),
            long => match long["target"].as_str() {
                Some(t) if t.starts_with('/') => t.to_owned(),
                Some(t) => format!("/run/secrets/{t}"),
                None => format!("/run/secrets/{}", long["source"].as_str().unwrap()),
            },
        })
        .collect();
    out.sort();
    out
}

/// Whether a secret file of ours was a read-only bind of a file (named by its path) rather
/// than a `secrets:` entry (named by its key).
fn is_bound_file(name: &str) -> bool {
    name.starts_with('.') || name.starts_with('/') || name.starts_with('~')
}

fn our_secret_targets(service: &ServiceSpec) -> Vec<String> {
    let container = serde_yaml_ng::to_value(&service.container).unwrap();
    let mut out: Vec<String> = container["secrets"]
        .as_sequence()
        .into_iter()
        .flatten()
        .filter(|s| !is_bound_file(s["name"].as_str().unwrap()))
        .map(|s| s["target"].as_str().unwrap().to_owned())
        .collect();
    out.sort();
    out
}

/// One corpus service against docker-compose's: what `compare` checks for the hand-written
/// cases, under the forms the corpus uses (ports without a published port, anonymous volumes,
/// files bound read-only, secrets). Returns the differences.
fn compare_corpus(service: &ServiceSpec, reference: &Value, compose_dir: &Path) -> Vec<String> {
    let name = service.name.as_str();
    let r = &reference["services"][name];
    let mut diffs = Vec::new();
    let mut check = |what: &str, ours: String, theirs: String| {
        if ours != theirs {
            diffs.push(format!(
                "{name}: {what}: ours {ours}, docker-compose {theirs}"
            ));
        }
    };
    check(
        "image",
        service.container.image.clone(),
        r["image"].as_str().unwrap_or("").to_owned(),
    );
    let env: BTreeMap<String, String> = match &r["environment"] {
        Value::Mapping(m) => m
            .iter()
            .map(|(k, v)| {
                let v = match v {
                    Value::String(s) => unescape(s),
                    Value::Null => String::new(),
                    other => serde_yaml_ng::to_string(other).unwrap().trim().to_owned(),
                };
                (k.as_str().unwrap().to_owned(), v)
            })
            .collect(),
        _ => BTreeMap::new(),
    };
    check(
        "environment",
        format!("{:?}", service.container.env),
        format!("{env:?}"),
    );
    if !r["command"].is_null() {
        check(
            "command",
            format!("{:?}", service.container.command),
            format!("{:?}", Some(words(&r["command"]))),
        );
    }
    if !r["entrypoint"].is_null() {
        check(
            "entrypoint",
            format!("{:?}", service.container.entrypoint),
            format!("{:?}", Some(words(&r["entrypoint"]))),
        );
    }
    if service.mode == ployz_core::ServiceMode::Replicated {
        check(
            "replicas",
            service.replicas.to_string(),
            r["deploy"]["replicas"].as_u64().unwrap_or(1).to_string(),
        );
    }
    if let Some(Healthcheck::Configured(c)) = &service.container.healthcheck {
        let test = &r["healthcheck"]["test"];
        let expected = match test {
            Value::String(s) => vec!["CMD-SHELL".to_owned(), unescape(s)],
            Value::Null => vec![],
            other => words(other),
        };
        check(
            "healthcheck test",
            format!("{:?}", c.test()),
            format!("{expected:?}"),
        );
        if let Some(i) = r["healthcheck"]["interval"].as_str() {
            check(
                "healthcheck interval",
                format!("{:?}", c.interval_ms),
                format!("{:?}", Some(duration_ms(i))),
            );
        }
    }
    check(
        "ports",
        format!("{:?}", our_ports(service)),
        format!("{:?}", reference_ports(r)),
    );
    check(
        "volumes",
        format!("{:?}", our_mounts(service, compose_dir)),
        format!("{:?}", reference_mounts(r)),
    );
    check(
        "secrets",
        format!("{:?}", our_secret_targets(service)),
        format!("{:?}", reference_secret_targets(r)),
    );
    diffs
}

#[test]
#[ignore = "needs docker-compose (scripts/test.sh installs it and runs this)"]
fn every_corpus_project_agrees_with_docker_compose() {
    let mut projects: Vec<std::path::PathBuf> = std::fs::read_dir(corpus_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    projects.sort();
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let env: BTreeMap<String, String> = [("HOME".to_owned(), home)].into();
    let mut problems = Vec::new();
    let mut compared = 0;
    for dir in &projects {
        let project = dir.file_name().unwrap().to_string_lossy().into_owned();
        let files = corpus_files(dir);
        let names: Vec<&str> = files.iter().map(String::as_str).collect();
        let profiles = corpus_list(dir, "profiles");
        let out = reference_output(dir, &names, &profiles, &env);
        let cannot = REFERENCE_CANNOT_READ.iter().find(|(p, _)| *p == project);
        match (out.status.success(), cannot) {
            (false, Some(_)) => continue,
            (true, Some((_, why))) => {
                problems.push(format!(
                    "{project}: docker-compose now reads it ({why}); take it off REFERENCE_CANNOT_READ"
                ));
                continue;
            }
            (false, None) => {
                problems.push(format!(
                    "{project}: docker-compose config failed: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
                continue;
            }
            (true, None) => {}
        }
        let reference: Value = serde_yaml_ng::from_slice(&out.stdout).unwrap();
        let ours_profiles = profiles.clone();
        let ours = match load(&ComposeInput {
            files: files.iter().map(|f| dir.join(f)).collect(),
            profiles,
            env: env.clone(),
        }) {
            Ok(p) => p,
            Err(e) => {
                problems.push(format!("{project}: ours refuses it:\n{e}"));
                continue;
            }
        };
        // docker-compose 1.29's `config` lists every service whatever its profiles; the ones
        // a run with these profiles would start are those without profiles or with a selected one.
        let mut theirs: Vec<String> = reference["services"]
            .as_mapping()
            .into_iter()
            .flatten()
            .filter(|(_, body)| match body["profiles"].as_sequence() {
                None => true,
                Some(listed) => listed
                    .iter()
                    .any(|p| ours_profiles.iter().any(|s| Some(s.as_str()) == p.as_str())),
            })
            .map(|(k, _)| k.as_str().unwrap().to_owned())
            .collect();
        theirs.sort();
        let mut our_names: Vec<String> = ours.services.iter().map(|s| s.name.to_string()).collect();
        our_names.sort();
        if our_names != theirs {
            problems.push(format!(
                "{project}: services: ours {our_names:?}, docker-compose {theirs:?}"
            ));
            continue;
        }
        let compose_dir = dir.join(&files[0]);
        let compose_dir = compose_dir.parent().unwrap();
        for s in &ours.services {
            for d in compare_corpus(s, &reference, compose_dir) {
                problems.push(format!("{project}: {d}"));
            }
        }
        compared += 1;
    }
    println!(
        "{compared} corpus projects compared with docker-compose, {} it cannot read",
        REFERENCE_CANNOT_READ.len()
    );
    assert!(
        problems.is_empty(),
        "{} differences:\n{}",
        problems.len(),
        problems.join("\n")
    );
    assert!(compared >= 40, "only {compared} corpus projects compared");
}
