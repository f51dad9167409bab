//! The loader against `docker-compose config` (Debian's docker-compose) where the two overlap:
//! merging of several files, `.env` and `${VAR}` interpolation, `$$`, environment forms,
//! command and healthcheck strings, replicas, host ports and volumes. Each case is loaded by
//! both, and the fields Ployz keeps must agree.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use ployz_compose::{load, ComposeInput};
use ployz_core::{Healthcheck, Mount, PortSpec, ServiceSpec};
use serde_yaml_ng::Value;

fn reference_config(dir: &Path, files: &[&str], env: &BTreeMap<String, String>) -> Value {
    let mut cmd = Command::new("docker-compose");
    cmd.current_dir(dir).env_clear().envs(env);
    if let Ok(path) = std::env::var("PATH") {
        cmd.env("PATH", path);
    }
    for f in files {
        cmd.args(["-f", f]);
    }
    let out = cmd.arg("config").output().expect(
        "docker-compose runs (Debian package docker-compose; scripts/setup.sh installs it)",
    );
    assert!(
        out.status.success(),
        "docker-compose config failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_yaml_ng::from_slice(&out.stdout).unwrap()
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
