//! Several `-f` files merge by the Compose specification's rules: an override file adds ports,
//! volumes and other list entries to the base file's instead of dropping them, replaces a
//! mount of the same target, and replaces commands whole.

use std::path::Path;

use ployz_compose::{load, ComposeInput, LoadedProject};
use ployz_core::{Mount, ServiceSpec};

fn load_two(base: &str, over: &str) -> LoadedProject {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("compose.yaml"), base).unwrap();
    std::fs::write(dir.path().join("compose.override.yaml"), over).unwrap();
    load(&input(dir.path())).unwrap_or_else(|e| panic!("the files load: {e}"))
}

fn input(dir: &Path) -> ComposeInput {
    ComposeInput {
        files: vec![dir.join("compose.yaml"), dir.join("compose.override.yaml")],
        profiles: Vec::new(),
        env: Default::default(),
    }
}

fn web(p: &LoadedProject) -> &ServiceSpec {
    p.services
        .iter()
        .find(|s| s.name.as_str() == "web")
        .unwrap()
}

#[test]
fn an_override_file_adds_ports_and_keeps_the_base_files() {
    let p = load_two(
        "services:\n  web:\n    image: nginx\n    x-ports: ['app.example.com:80/https']\n",
        "services:\n  web:\n    x-ports: ['admin.example.com:8080/https', 'app.example.com:80/https']\n",
    );
    let ports: Vec<String> = web(&p).ports.iter().map(|p| p.to_string()).collect();
    assert_eq!(
        ports,
        ["admin.example.com:8080/https", "app.example.com:80/https"],
        "the base file's port is kept and the one written in both files appears once"
    );
}

#[test]
fn an_override_file_replaces_the_mount_of_a_target_and_adds_the_others() {
    let p = load_two(
        "services:\n  web:\n    image: nginx\n    volumes: ['data:/data', 'logs:/logs']\nvolumes:\n  data: {}\n  logs: {}\n  other: {}\n",
        "services:\n  web:\n    volumes: ['other:/data', {type: tmpfs, target: /tmp}]\n",
    );
    let mounts: Vec<(String, String)> = web(&p)
        .container
        .mounts
        .iter()
        .map(|m| match m {
            Mount::Volume { source, target, .. } => (source.clone(), target.clone()),
            Mount::Tmpfs { target, .. } => ("tmpfs".to_owned(), target.clone()),
            other => panic!("unexpected mount {other:?}"),
        })
        .collect();
    let names: Vec<(&str, &str)> = mounts
        .iter()
        .map(|(s, t)| (s.rsplit('_').next().unwrap_or(s), t.as_str()))
        .collect();
    assert_eq!(
        names,
        [("other", "/data"), ("logs", "/logs"), ("tmpfs", "/tmp")],
        "/data is replaced by the override's volume, /logs kept, /tmp added: {mounts:?}"
    );
}

#[test]
fn an_override_file_replaces_commands_whole_and_appends_other_lists() {
    let p = load_two(
        "services:\n  web:\n    image: nginx\n    command: [nginx, -g, 'daemon off;']\n    cap_add: [NET_ADMIN]\n    healthcheck:\n      test: [CMD, 'true']\n",
        "services:\n  web:\n    command: [nginx-debug]\n    cap_add: [SYS_TIME]\n    healthcheck:\n      test: [CMD, 'false']\n",
    );
    let spec = web(&p);
    assert_eq!(spec.container.command, Some(vec!["nginx-debug".to_owned()]));
    assert_eq!(spec.container.cap_add, ["NET_ADMIN", "SYS_TIME"]);
    let hc = format!("{:?}", spec.container.healthcheck);
    assert!(
        hc.contains("\"false\"") && !hc.contains("\"true\""),
        "healthcheck.test is replaced: {hc}"
    );
}

#[test]
fn reset_and_override_tags_still_win_over_the_merge_rules() {
    let p = load_two(
        "services:\n  web:\n    image: nginx\n    cap_add: [NET_ADMIN]\n    x-ports: ['app.example.com:80/https']\n",
        "services:\n  web:\n    cap_add: !reset []\n    x-ports: !override ['other.example.com:80/https']\n",
    );
    let spec = web(&p);
    assert!(spec.container.cap_add.is_empty());
    let ports: Vec<String> = spec.ports.iter().map(|p| p.to_string()).collect();
    assert_eq!(ports, ["other.example.com:80/https"]);
}

#[test]
fn one_secret_written_short_then_long_merges_into_one_entry() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("db.txt"), "pw").unwrap();
    std::fs::write(
        dir.path().join("compose.yaml"),
        "services:\n  web:\n    image: nginx\n    secrets: [db]\nsecrets:\n  db: { file: ./db.txt }\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("compose.override.yaml"),
        "services:\n  web:\n    secrets:\n      - { source: db, target: db, mode: 0400 }\n",
    )
    .unwrap();
    let p = load(&input(dir.path())).unwrap_or_else(|e| panic!("the files load: {e}"));
    let secrets = &web(&p).container.secrets;
    assert_eq!(secrets.len(), 1, "{secrets:?}");
    assert_eq!(secrets[0].target, "/run/secrets/db");
    assert_eq!(secrets[0].mode, Some(0o400), "the later file's entry wins");
}

#[test]
fn an_override_file_moves_a_service_and_replaces_its_hook_command() {
    let p = load_two(
        "services:\n  web:\n    image: nginx\n    x-machines: [m1]\n    x-pre_deploy:\n      command: [./manage.py, migrate]\n",
        "services:\n  web:\n    x-machines: [m2]\n    x-pre_deploy:\n      command: [./manage.py, migrate, --noinput]\n",
    );
    let spec = web(&p);
    let machines: Vec<String> = spec.machines.iter().map(|m| m.to_string()).collect();
    assert_eq!(machines, ["m2"]);
    assert_eq!(
        spec.pre_deploy.as_ref().unwrap().command,
        ["./manage.py", "migrate", "--noinput"]
    );
}

#[test]
fn keys_written_short_in_one_file_and_long_in_the_other_merge_as_compose_merges_them() {
    let dir = tempfile::tempdir().unwrap();
    let files = [
        (
            "compose.yaml",
            "services:\n  web:\n    image: app\n    env_file: base.env\n    build: ./api\n    depends_on: [redis]\n  redis:\n    image: redis\n  db:\n    image: postgres\n",
        ),
        (
            "compose.override.yaml",
            "services:\n  web:\n    env_file: prod.env\n    build: {target: prod}\n    depends_on: {db: {condition: service_healthy}}\n",
        ),
        ("base.env", "A=1\nB=base\n"),
        ("prod.env", "B=prod\n"),
    ];
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    std::fs::create_dir(dir.path().join("api")).unwrap();
    std::fs::write(dir.path().join("api/Dockerfile"), "FROM scratch\n").unwrap();
    let p = load(&input(dir.path())).unwrap_or_else(|e| panic!("the files load: {e}"));

    // Both env files, the base file's first; the later file wins a name set in both
    // (docker-compose 1.29's `config` gives the same).
    let env = &web(&p).container.env;
    assert_eq!(env.get("A").map(String::as_str), Some("1"), "{env:?}");
    assert_eq!(env.get("B").map(String::as_str), Some("prod"), "{env:?}");
    // The base's context with the override's target.
    let (_, build) = p
        .builds
        .iter()
        .find(|(name, _)| name.as_str() == "web")
        .expect("web is built");
    assert!(build.context.ends_with("api"), "{:?}", build.context);
    assert_eq!(build.target.as_deref(), Some("prod"));
    // Both dependencies.
    let mut deps: Vec<&str> = web(&p).depends_on.iter().map(|d| d.as_str()).collect();
    deps.sort();
    assert_eq!(deps, ["db", "redis"]);
}
