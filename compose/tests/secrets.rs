//! Secrets and the configs short form, through the Compose loader: where each file lands, with
//! which mode and owner, what the spec carries (a digest, and the value only for the daemon),
//! and that no message ever shows a value.

use std::path::Path;

use ployz_compose::{load, ComposeErrors, ComposeInput, LoadedProject};
use ployz_core::{SecretFile, SecretValue, ServiceSpec};

/// A value no message, label or preview may contain.
const DB_PASSWORD: &str = "correct-horse-battery-staple";
const API_TOKEN: &str = "tok_5f1c1b0e9a";

/// Writes `files` (name, content) into a fresh directory.
fn project(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, content) in files {
        let path = dir.path().join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(path, content).unwrap();
    }
    dir
}

fn load_in(dir: &Path, env: &[(&str, &str)]) -> Result<LoadedProject, ComposeErrors> {
    load(&ComposeInput {
        files: vec![dir.join("compose.yaml")],
        profiles: Vec::new(),
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    })
}

fn ok(files: &[(&str, &str)], env: &[(&str, &str)]) -> LoadedProject {
    let dir = project(files);
    load_in(dir.path(), env).unwrap_or_else(|e| panic!("expected the project to load:\n{e}"))
}

fn errors(files: &[(&str, &str)], env: &[(&str, &str)]) -> String {
    let dir = project(files);
    match load_in(dir.path(), env) {
        Ok(p) => panic!("expected errors, the project loaded: {:#?}", p.services),
        Err(e) => e.to_string(),
    }
}

fn service<'a>(p: &'a LoadedProject, name: &str) -> &'a ServiceSpec {
    p.services
        .iter()
        .find(|s| s.name.as_str() == name)
        .unwrap_or_else(|| panic!("no service {name}"))
}

fn value_of(s: &SecretFile) -> &[u8] {
    s.value
        .as_ref()
        .map(SecretValue::as_bytes)
        .unwrap_or_else(|| panic!("the secret {} carries no value", s.target))
}

/// Asserts nothing a person sees of the project (warnings, Debug output) shows a value.
fn assert_nothing_shows(p: &LoadedProject, values: &[&str]) {
    let warnings: Vec<String> = p.warnings.iter().map(|w| w.to_string()).collect();
    let seen = format!("{warnings:?} {:?}", p.services);
    for v in values {
        assert!(!seen.contains(v), "a secret value shows in:\n{seen}");
    }
}

/// A secret file's name, target, mode, uid and gid.
type Shape<'a> = (&'a str, &'a str, Option<u32>, Option<u32>, Option<u32>);

#[test]
fn short_and_long_secrets_land_under_run_secrets_with_their_values() {
    let yaml = r#"
services:
  db:
    image: postgres:16
    secrets:
      - db_password
      - source: api_token
        target: token.txt
        uid: "999"
        gid: 999
        mode: 0400
      - source: api_token
        target: /etc/app/token
secrets:
  db_password:
    file: ./secrets/db_password.txt
  api_token:
    environment: API_TOKEN
"#;
    let p = ok(
        &[
            ("compose.yaml", yaml),
            ("secrets/db_password.txt", DB_PASSWORD),
        ],
        &[("API_TOKEN", API_TOKEN)],
    );
    let secrets = &service(&p, "db").container.secrets;
    let shape: Vec<Shape<'_>> = secrets
        .iter()
        .map(|s| (s.name.as_str(), s.target.as_str(), s.mode, s.uid, s.gid))
        .collect();
    assert_eq!(
        shape,
        vec![
            ("api_token", "/etc/app/token", None, None, None),
            ("db_password", "/run/secrets/db_password", None, None, None),
            (
                "api_token",
                "/run/secrets/token.txt",
                Some(0o400),
                Some(999),
                Some(999)
            ),
        ],
        "sorted by target; a relative target lands under /run/secrets/, an absolute one stays; \
         the mode is unset (0444 in the container) unless given"
    );
    assert_eq!(value_of(&secrets[0]), API_TOKEN.as_bytes());
    assert_eq!(value_of(&secrets[1]), DB_PASSWORD.as_bytes());
    assert_eq!(value_of(&secrets[2]), API_TOKEN.as_bytes());
    assert_eq!(
        secrets[1].digest,
        SecretValue::new(DB_PASSWORD.as_bytes().to_vec()).digest()
    );
    assert!(secrets[1].digest.starts_with("sha256:"));
    assert_eq!(secrets[0].digest, secrets[2].digest);
    assert!(
        p.warnings.iter().all(|w| !w.key.starts_with("secrets")),
        "{:#?}",
        p.warnings
    );
    assert_nothing_shows(&p, &[DB_PASSWORD, API_TOKEN]);
}

#[test]
fn a_changed_secret_changes_the_spec_and_an_unchanged_one_does_not() {
    let yaml = "services:\n  db:\n    image: postgres:16\n    secrets: [pw]\nsecrets:\n  pw:\n    file: pw.txt\n";
    let first = ok(&[("compose.yaml", yaml), ("pw.txt", "one")], &[]);
    let again = ok(&[("compose.yaml", yaml), ("pw.txt", "one")], &[]);
    let changed = ok(&[("compose.yaml", yaml), ("pw.txt", "two")], &[]);
    assert_eq!(service(&first, "db"), service(&again, "db"));
    assert_ne!(service(&first, "db"), service(&changed, "db"));
    // What a label carries (no value) still equals what the file asks for.
    assert_eq!(
        &service(&first, "db").without_secret_values(),
        service(&again, "db")
    );
}

#[test]
fn secret_files_keep_their_bytes_as_they_are() {
    let dir = project(&[(
        "compose.yaml",
        "services:\n  app:\n    image: busybox\n    secrets: [key]\nsecrets:\n  key:\n    file: ./key.bin\n",
    )]);
    let bytes = vec![0u8, 0xff, b'\n', 0x80, b' '];
    std::fs::write(dir.path().join("key.bin"), &bytes).unwrap();
    let p = load_in(dir.path(), &[]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        value_of(&service(&p, "app").container.secrets[0]),
        &bytes[..]
    );
}

#[test]
fn an_undeclared_secret_is_an_error_with_the_fix() {
    let text = errors(
        &[(
            "compose.yaml",
            "services:\n  web:\n    image: nginx\n    secrets:\n      - db_password\n",
        )],
        &[],
    );
    assert!(text.contains("service 'web'"), "{text}");
    assert!(text.contains("secrets[0].source 'db_password'"), "{text}");
    assert!(
        text.contains("the secret 'db_password' is not declared in the top-level secrets:"),
        "{text}"
    );
    assert!(
        text.contains("secrets: { db_password: { file: ./db_password.txt } }"),
        "{text}"
    );
}

#[test]
fn a_secret_file_that_cannot_be_read_is_named_without_its_content() {
    let yaml = r#"
services:
  web:
    image: nginx
    secrets: [missing, folder, through_a_file]
secrets:
  missing:
    file: ./nope.txt
  folder:
    file: ./secrets
  through_a_file:
    file: ./real.txt/inner
"#;
    let text = errors(
        &[
            ("compose.yaml", yaml),
            ("secrets/readme.txt", DB_PASSWORD),
            ("real.txt", DB_PASSWORD),
        ],
        &[],
    );
    assert!(!text.contains(DB_PASSWORD), "{text}");
    assert!(text.contains("secrets.missing.file './nope.txt'"), "{text}");
    assert!(text.contains("nope.txt does not exist"), "{text}");
    assert!(text.contains("secrets.folder.file './secrets'"), "{text}");
    assert!(text.contains("is a directory"), "{text}");
    assert!(
        text.contains("secrets.through_a_file.file './real.txt/inner'"),
        "{text}"
    );
    assert!(text.contains("cannot read the secret file"), "{text}");
    assert_eq!(text.lines().count(), 3, "one error per secret:\n{text}");
}

#[test]
fn a_secret_whose_variable_is_not_set_names_the_variable() {
    let yaml = "services:\n  web:\n    image: nginx\n    secrets: [token]\nsecrets:\n  token:\n    environment: API_TOKEN\n";
    let text = errors(&[("compose.yaml", yaml)], &[("OTHER", API_TOKEN)]);
    assert!(
        text.contains("secrets.token.environment 'API_TOKEN'"),
        "{text}"
    );
    assert!(
        text.contains("the variable 'API_TOKEN' is not set"),
        "{text}"
    );
    assert!(!text.contains(API_TOKEN), "{text}");
}

#[test]
fn errors_elsewhere_in_a_project_never_show_a_secret_value() {
    let yaml = "services:\n  web:\n    image: nginx\n    secrets: [pw]\n    ports: [\"99999:80\"]\n  broken: 5\nsecrets:\n  pw:\n    file: pw.txt\n";
    let text = errors(&[("compose.yaml", yaml), ("pw.txt", DB_PASSWORD)], &[]);
    assert!(!text.contains(DB_PASSWORD), "{text}");
}

#[test]
fn secret_declarations_are_checked_key_by_key() {
    let cases: &[(&str, &[&str])] = &[
        (
            "secrets:\n  t:\n    external: true\n",
            &["secrets.t.external", "external secrets are not supported"],
        ),
        (
            "secrets:\n  t:\n    file: t.txt\n    driver: vault\n",
            &[
                "secrets.t.driver",
                "secret drivers are not supported",
                "drop driver:",
            ],
        ),
        (
            "secrets:\n  t:\n    content: hunter2\n",
            &[
                "secrets.t.content",
                "not content: (content: is for configs)",
            ],
        ),
        (
            "secrets:\n  t:\n    file: t.txt\n    environment: T\n",
            &["secrets.t", "one of file: and environment:, not both"],
        ),
        (
            "secrets:\n  t: {}\n",
            &["secrets.t", "a secret needs file: or environment:"],
        ),
        (
            "secrets:\n  t: ./t.txt\n",
            &["secrets.t './t.txt'", "needs file: or environment:"],
        ),
        (
            "secrets: [t]\n",
            &["secrets", "expected a mapping of secrets"],
        ),
    ];
    for (top, wanted) in cases {
        let yaml = format!("services:\n  web:\n    image: nginx\n{top}");
        let text = errors(&[("compose.yaml", &yaml), ("t.txt", "x")], &[("T", "y")]);
        for w in *wanted {
            assert!(text.contains(w), "for\n{top}\nexpected '{w}' in:\n{text}");
        }
        assert!(!text.contains("hunter2"), "{text}");
    }
}

#[test]
fn secret_keys_ployz_does_not_use_are_warnings() {
    let yaml = "services:\n  web:\n    image: nginx\n    secrets: [t]\nsecrets:\n  t:\n    file: t.txt\n    name: prod_t\n    template_driver: golang\n    labels: {a: b}\n    fiel: x\n    x-note: mine\n";
    let p = ok(&[("compose.yaml", yaml), ("t.txt", "x")], &[]);
    let said = |key: &str| {
        p.warnings
            .iter()
            .find(|w| w.key == key)
            .map(|w| w.message.clone())
            .unwrap_or_else(|| panic!("no warning for {key}: {:#?}", p.warnings))
    };
    assert!(said("secrets.t.template_driver").contains("not rendered as a template"));
    assert!(said("secrets.t.labels").contains("ignored"));
    assert!(said("secrets.t.fiel").contains("did you mean 'file'?"));
    assert!(!p
        .warnings
        .iter()
        .any(|w| w.key == "secrets.t.name" || w.key == "secrets.t.x-note"));
    assert!(
        !p.warnings.iter().any(|w| w.key == "secrets"),
        "{:#?}",
        p.warnings
    );
}

#[test]
fn service_secret_entries_are_checked() {
    let top = "secrets:\n  pw:\n    file: pw.txt\nconfigs:\n  pw:\n    content: x\n";
    let cases: &[(&str, &[&str])] = &[
        (
            "    secrets:\n      - source: pw\n        target: ../etc/passwd\n",
            &[
                "secrets[0].target '/run/secrets/../etc/passwd'",
                "must not contain '..'",
            ],
        ),
        (
            "    secrets:\n      - target: /x\n",
            &["secrets[0]", "a secret needs source:"],
        ),
        (
            "    secrets: [pw, {source: pw}]\n",
            &[
                "secrets '/run/secrets/pw'",
                "the secrets 'pw' and 'pw' share one target",
            ],
        ),
        (
            "    secrets: [{source: pw, target: /pw}]\n    configs: [pw]\n",
            &["the secret 'pw' and the config 'pw' share one target"],
        ),
        (
            "    secrets: [{source: pw, mode: rwx}]\n",
            &["secrets[0].mode"],
        ),
        ("    secrets: pw\n", &["secrets 'pw'", "expected a list"]),
    ];
    for (entries, wanted) in cases {
        let yaml = format!("services:\n  web:\n    image: nginx\n{entries}{top}");
        let text = errors(&[("compose.yaml", &yaml), ("pw.txt", DB_PASSWORD)], &[]);
        for w in *wanted {
            assert!(
                text.contains(w),
                "for\n{entries}\nexpected '{w}' in:\n{text}"
            );
        }
        assert!(!text.contains(DB_PASSWORD), "{text}");
    }
}

#[test]
fn the_configs_short_form_lands_at_slash_name() {
    let yaml = "services:\n  web:\n    image: nginx\n    configs:\n      - nginx_conf\n      - source: motd\nconfigs:\n  nginx_conf:\n    file: ./nginx.conf\n  motd:\n    content: hello\n";
    let p = ok(
        &[
            ("compose.yaml", yaml),
            ("nginx.conf", "worker_processes 1;\n"),
        ],
        &[],
    );
    let configs: Vec<(&str, &str, &str, Option<u32>)> = service(&p, "web")
        .container
        .configs
        .iter()
        .map(|c| {
            (
                c.name.as_str(),
                c.target.as_str(),
                c.content.as_str(),
                c.mode,
            )
        })
        .collect();
    assert_eq!(
        configs,
        vec![
            ("motd", "/motd", "hello", None),
            ("nginx_conf", "/nginx_conf", "worker_processes 1;\n", None),
        ]
    );
}

#[test]
fn the_configs_short_form_must_name_a_declared_config() {
    let text = errors(
        &[(
            "compose.yaml",
            "services:\n  web:\n    image: nginx\n    configs: [nginx_conf]\n",
        )],
        &[],
    );
    assert!(text.contains("configs[0].source 'nginx_conf'"), "{text}");
    assert!(
        text.contains("not declared in the top-level configs:"),
        "{text}"
    );
}

#[test]
fn a_tmpfs_over_a_secret_or_config_target_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("pw.txt"), "pw").unwrap();
    std::fs::write(
        dir.path().join("compose.yaml"),
        "services:\n  db:\n    image: postgres:16\n    tmpfs: [/run]\n    secrets: [pw]\n    configs: [conf]\n  web:\n    image: nginx\n    tmpfs: [/run/nginx]\n    secrets: [pw]\nsecrets:\n  pw: { file: ./pw.txt }\nconfigs:\n  conf: { content: x }\n",
    )
    .unwrap();
    let errors = ployz_compose::load(&ployz_compose::ComposeInput {
        files: vec![dir.path().join("compose.yaml")],
        profiles: Vec::new(),
        env: Default::default(),
    })
    .unwrap_err()
    .to_string();
    assert!(
        errors.contains("service 'db': secrets '/run/secrets/pw': the secret 'pw' at /run/secrets/pw would be hidden by the tmpfs mounted at /run"),
        "{errors}"
    );
    assert!(
        errors.contains("mount the tmpfs elsewhere (e.g. /run/tmp)"),
        "{errors}"
    );
    assert_eq!(
        errors.lines().count(),
        1,
        "a config at /conf and /run/nginx hide nothing: {errors}"
    );
}

#[test]
fn a_secret_or_config_file_under_the_home_directory_is_read_from_there() {
    let project = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(home.path().join(".config/app")).unwrap();
    std::fs::write(home.path().join(".config/app/token"), "t0k3n").unwrap();
    std::fs::write(home.path().join("app.conf"), "key = value\n").unwrap();
    std::fs::write(
        project.path().join("compose.yaml"),
        "services:\n  web:\n    image: nginx\n    secrets: [tok]\n    configs: [conf]\nsecrets:\n  tok: { file: ~/.config/app/token }\nconfigs:\n  conf: { file: ~/app.conf }\n",
    )
    .unwrap();
    let p = ployz_compose::load(&ployz_compose::ComposeInput {
        files: vec![project.path().join("compose.yaml")],
        profiles: Vec::new(),
        env: [(
            "HOME".to_owned(),
            home.path().to_string_lossy().into_owned(),
        )]
        .into(),
    })
    .unwrap_or_else(|e| panic!("{e}"));
    let web = &p.services[0].container;
    assert_eq!(web.secrets[0].value.as_ref().unwrap().as_bytes(), b"t0k3n");
    assert_eq!(web.configs[0].content, "key = value\n");
}
