//! Compose `extends`: what it inherits and how, and each refusal naming the file, the service,
//! the key and the fix. The merge itself is compared with `docker-compose config` by the
//! corpus project `extends-file` (`compose_reference.rs`).

use ployz_compose::{load, ComposeError, ComposeInput, LoadedProject};
use ployz_core::ServiceSpec;

/// Writes `files` (path, text) into a fresh folder and loads its `compose.yaml`.
fn load_files(
    files: &[(&str, &str)],
) -> (tempfile::TempDir, Result<LoadedProject, Vec<ComposeError>>) {
    let dir = tempfile::tempdir().expect("a temporary folder");
    for (name, text) in files {
        let path = dir.path().join(name);
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("a folder");
        std::fs::write(&path, text).expect("a writable file");
    }
    let loaded = load(&ComposeInput {
        files: vec![dir.path().join("compose.yaml")],
        ..ComposeInput::default()
    })
    .map_err(|e| e.0);
    (dir, loaded)
}

fn service<'a>(p: &'a LoadedProject, name: &str) -> &'a ServiceSpec {
    p.services
        .iter()
        .find(|s| s.name.as_str() == name)
        .unwrap_or_else(|| panic!("no service {name}"))
}

fn only_error(files: &[(&str, &str)]) -> ComposeError {
    let (_dir, loaded) = load_files(files);
    let errors = match loaded {
        Ok(p) => panic!("expected an error, the project loaded: {p:#?}"),
        Err(e) => e,
    };
    assert_eq!(errors.len(), 1, "one error: {errors:#?}");
    errors.into_iter().next().expect("one error")
}

#[test]
fn a_same_file_base_is_inherited_with_the_services_own_keys_over_it() {
    let (_dir, loaded) = load_files(&[(
        "compose.yaml",
        r#"
services:
  base:
    image: example/app:1
    command: ["serve"]
    environment: { LOG: info, ROLE: none }
    depends_on: [db]
  web:
    extends: base
    environment: { ROLE: web }
  worker:
    extends: { service: web }
    command: ["work"]
  db:
    image: postgres:16
"#,
    )]);
    let p = loaded.unwrap_or_else(|e| panic!("{e:#?}"));
    let web = service(&p, "web");
    assert_eq!(web.container.image, "example/app:1");
    assert_eq!(web.container.env["LOG"], "info");
    assert_eq!(web.container.env["ROLE"], "web");
    assert_eq!(web.container.command, Some(vec!["serve".to_owned()]));
    // A chain: worker -> web -> base, command replaced, environment merged.
    let worker = service(&p, "worker");
    assert_eq!(worker.container.command, Some(vec!["work".to_owned()]));
    assert_eq!(worker.container.env["ROLE"], "web");
    // Within one file, depends_on is inherited.
    let deps: Vec<&str> = worker.depends_on.iter().map(|d| d.as_str()).collect();
    assert_eq!(deps, ["db"]);
}

#[test]
fn a_base_of_another_file_brings_its_paths_resolved_against_its_own_folder() {
    let (dir, loaded) = load_files(&[
        (
            "compose.yaml",
            "services:\n  web:\n    extends: { file: shared/base.yaml, service: app }\n",
        ),
        (
            "shared/base.yaml",
            "services:\n  app:\n    image: example/app:1\n    volumes: [\"./static:/srv/static:ro\"]\n",
        ),
        ("shared/static/index.html", "hello\n"),
    ]);
    let p = loaded.unwrap_or_else(|e| panic!("{e:#?}"));
    let web = service(&p, "web");
    let mounts = serde_yaml_ng::to_string(&web.container.mounts).expect("mounts serialise");
    let want = dir.path().join("shared/static");
    assert!(
        mounts.contains(&*want.to_string_lossy()),
        "{mounts} does not bind {}",
        want.display()
    );
}

#[test]
fn a_read_only_file_bound_by_a_base_of_another_file_travels_as_the_files_own_would() {
    // Written in compose.yaml, `./common/nginx.conf:...:ro` becomes a file copied into the
    // containers, and a folder a bind the Service is warned about; through extends the same.
    let (_dir, loaded) = load_files(&[
        (
            "compose.yaml",
            "services:\n  web:\n    extends: { file: common/base.yaml, service: proxy }\n",
        ),
        (
            "common/base.yaml",
            "services:\n  proxy:\n    image: nginx:1.27\n    volumes: [\"./nginx.conf:/etc/nginx/nginx.conf:ro\", \"./html:/usr/share/nginx/html\"]\n",
        ),
        ("common/nginx.conf", "events {}\n"),
        ("common/html/index.html", "hello\n"),
    ]);
    let p = loaded.unwrap_or_else(|e| panic!("{e:#?}"));
    let web = service(&p, "web");
    assert!(
        web.container
            .secrets
            .iter()
            .any(|f| f.target == "/etc/nginx/nginx.conf"),
        "nginx.conf is not copied in: {:#?}",
        web.container
    );
    assert!(
        !web.container.mounts.iter().any(|m| matches!(
            m,
            ployz_core::Mount::Bind { target, .. } if target == "/etc/nginx/nginx.conf"
        )),
        "nginx.conf is bound from the Machine: {:#?}",
        web.container.mounts
    );
    assert!(
        p.warnings
            .iter()
            .any(|w| w.service.as_deref() == Some("web") && w.message.contains("html")),
        "no warning for the folder bound from the project: {:#?}",
        p.warnings
    );
}

#[test]
fn a_cycle_is_refused_once_naming_every_link() {
    let e = only_error(&[
        (
            "compose.yaml",
            "services:\n  web:\n    image: a\n    extends: { file: other.yaml, service: x }\n",
        ),
        (
            "other.yaml",
            "services:\n  x:\n    image: b\n    extends: { file: compose.yaml, service: web }\n",
        ),
    ]);
    assert_eq!(e.service.as_deref(), Some("web"));
    assert_eq!(e.key.as_deref(), Some("extends"));
    assert!(
        e.message
            .starts_with("extends goes round in a cycle: 'web' -> 'x' ("),
        "{e}"
    );
    assert!(e.message.ends_with("other.yaml) -> 'web'"), "{e}");
}

#[test]
fn a_missing_file_or_service_is_refused_naming_both() {
    let e = only_error(&[(
        "compose.yaml",
        "services:\n  web:\n    image: a\n    extends: { file: nowhere.yaml, service: app }\n",
    )]);
    assert_eq!(e.service.as_deref(), Some("web"));
    assert_eq!(e.key.as_deref(), Some("extends.file"));
    assert_eq!(e.value.as_deref(), Some("nowhere.yaml"));
    assert!(e.message.contains("nowhere.yaml, does not exist"), "{e}");

    let e = only_error(&[
        (
            "compose.yaml",
            "services:\n  web:\n    image: a\n    extends: { file: base.yaml, service: ap }\n",
        ),
        (
            "base.yaml",
            "services:\n  app: { image: b }\n  db: { image: c }\n",
        ),
    ]);
    assert_eq!(e.key.as_deref(), Some("extends.service"));
    assert_eq!(e.value.as_deref(), Some("ap"));
    assert!(
        e.message
            .starts_with("extends names the service 'ap', which ")
            && e.message.ends_with("base.yaml does not define"),
        "{e}"
    );
    assert_eq!(e.fix.as_deref(), Some("name one of its services: app, db"));

    let e = only_error(&[(
        "compose.yaml",
        "services:\n  web:\n    image: a\n    extends: bse\n  base: { image: b }\n",
    )]);
    assert_eq!(e.key.as_deref(), Some("extends"));
    assert_eq!(e.value.as_deref(), Some("bse"));
}

#[test]
fn what_ties_a_base_to_its_own_file_is_refused_from_another_file() {
    for (key, line) in [
        ("depends_on", "depends_on: [db]"),
        ("links", "links: [db]"),
        ("volumes_from", "volumes_from: [db]"),
    ] {
        let e = only_error(&[
            (
                "compose.yaml",
                "services:\n  web:\n    extends: { file: base.yaml, service: app }\n",
            ),
            (
                "base.yaml",
                &format!("services:\n  app:\n    image: b\n    {line}\n  db: {{ image: c }}\n"),
            ),
        ]);
        assert_eq!(e.service.as_deref(), Some("web"), "{e}");
        assert_eq!(e.key.as_deref(), Some("extends"), "{e}");
        assert!(
            e.message.contains(&format!(
                "has {key}, which a service extending it from another file cannot inherit"
            )),
            "{e}"
        );
        assert!(
            e.fix
                .as_deref()
                .is_some_and(|f| f.starts_with(&format!("move {key} out of 'app'"))),
            "{e}"
        );
    }
}

#[test]
fn a_malformed_extends_is_refused_with_its_forms() {
    for (extends, key) in [
        ("{ file: base.yaml }", "extends.service"),
        ("{ service: base, path: x }", "extends.path"),
        ("[base]", "extends"),
    ] {
        let e = only_error(&[(
            "compose.yaml",
            &format!(
                "services:\n  base: {{ image: b }}\n  web:\n    image: a\n    extends: {extends}\n"
            ),
        )]);
        assert_eq!(e.key.as_deref(), Some(key), "{extends}: {e}");
        assert_eq!(
            e.fix.as_deref(),
            Some("write `extends: BASE` or `extends: {service: BASE, file: other.yaml}`"),
            "{e}"
        );
    }
}
