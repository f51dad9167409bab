//! The loader's messages, word for word: restart policies, image references Docker would
//! refuse, templates in an image, duplicate environment names, the keys the key table warns
//! about or refuses, and no follow-on errors.

use ployz_compose::{
    load, ComposeError, ComposeErrors, ComposeInput, ComposeWarning, LoadedProject,
};

/// Loads one `compose.yaml` from a fresh folder, with an empty environment.
fn load_yaml(yaml: &str) -> Result<LoadedProject, ComposeErrors> {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let path = dir.path().join("compose.yaml");
    std::fs::write(&path, yaml).expect("compose.yaml is writable");
    load(&ComposeInput {
        files: vec![path],
        ..ComposeInput::default()
    })
}

fn ok(yaml: &str) -> LoadedProject {
    load_yaml(yaml).unwrap_or_else(|e| panic!("expected the project to load:\n{e}"))
}

fn errors(yaml: &str) -> Vec<ComposeError> {
    match load_yaml(yaml) {
        Ok(p) => panic!("expected errors, the project loaded: {p:#?}"),
        Err(e) => e.0,
    }
}

/// The one warning about `key`.
fn warning<'a>(p: &'a LoadedProject, key: &str) -> &'a ComposeWarning {
    let found: Vec<&ComposeWarning> = p.warnings.iter().filter(|w| w.key == key).collect();
    assert_eq!(found.len(), 1, "one warning for {key}: {:#?}", p.warnings);
    found[0]
}

/// The only error, with its key, value, message and fix.
fn only_error(yaml: &str) -> ComposeError {
    let e = errors(yaml);
    assert_eq!(e.len(), 1, "one error: {e:#?}");
    e.into_iter().next().expect("one error")
}

fn service_with(line: &str) -> String {
    format!("services:\n  web:\n    image: nginx:1.27\n    {line}\n")
}

// ---- restart ------------------------------------------------------------------------------

#[test]
fn restart_unless_stopped_and_always_say_nothing() {
    for policy in ["unless-stopped", "always"] {
        let p = ok(&service_with(&format!("restart: {policy}")));
        assert!(p.warnings.is_empty(), "{policy}: {:#?}", p.warnings);
    }
}

#[test]
fn restart_no_and_on_failure_warn_naming_the_value() {
    let p = ok(&service_with("restart: \"no\""));
    assert_eq!(
        warning(&p, "restart").message,
        "restart 'no' is not what Ployz does: it restarts containers unless they are stopped (restart policy unless-stopped)"
    );
    for policy in ["on-failure", "on-failure:5"] {
        let p = ok(&service_with(&format!("restart: {policy}")));
        let w = warning(&p, "restart");
        assert_eq!(
            w.message,
            format!("restart '{policy}' is not what Ployz does: it restarts containers unless they are stopped, whatever their exit code (restart policy unless-stopped)")
        );
        assert_eq!(w.service.as_deref(), Some("web"));
    }
}

#[test]
fn an_unknown_restart_policy_is_a_warning_naming_it() {
    let p = ok(&service_with("restart: sometimes"));
    assert_eq!(
        warning(&p, "restart").message,
        "restart 'sometimes' is not a restart policy (no, always, on-failure[:N], unless-stopped) and is ignored: Ployz restarts containers unless they are stopped (restart policy unless-stopped)"
    );
}

// ---- image references ---------------------------------------------------------------------

fn image_error(image: &str) -> ComposeError {
    let e = only_error(&format!("services:\n  web:\n    image: '{image}'\n"));
    assert_eq!(e.key.as_deref(), Some("image"), "{e}");
    assert_eq!(e.value.as_deref(), Some(image), "{e}");
    assert_eq!(e.service.as_deref(), Some("web"), "{e}");
    e
}

#[test]
fn image_references_docker_would_refuse_are_refused_with_the_rule() {
    let cases = [
        (
            "nginx:",
            "the image's tag is empty (nothing after ':')",
            "write a tag after ':' (e.g. nginx:1.27), or drop the ':' for latest; a ${VAR} that is not set leaves the tag empty",
        ),
        (
            ":1.27",
            "the image has no repository name before the tag or digest",
            "name the repository, e.g. image: nginx:1.27",
        ),
        (
            "Nginx:latest",
            "the image's repository name must be lowercase: 'Nginx' has upper case",
            "write 'nginx' (only the tag may have upper case)",
        ),
        (
            "ghcr.io/Acme/web:1.2",
            "the image's repository name must be lowercase: 'Acme' has upper case",
            "write 'acme' (only the tag may have upper case)",
        ),
        (
            "ngin!x",
            "the image's repository name 'ngin!x' has '!', which Docker does not allow",
            "a repository name has lowercase letters, digits and the separators '.', '_', '__' and '-'",
        ),
        (
            "nginx@sha256:abc",
            "the image's digest 'sha256:abc' is not valid: a digest is algorithm:hex, e.g. sha256: and at least 32 hexadecimal digits",
            "write the digest as algorithm:hex, e.g. @sha256:<64 hexadecimal digits>",
        ),
        (
            "nginx:.1",
            "the image's tag '.1' is not valid: a tag has letters, digits, '_', '.' and '-', and does not start with '.' or '-'",
            "fix the tag, e.g. nginx:1.27-alpine",
        ),
        (
            "registry.example.com:http/app",
            "the image's registry 'registry.example.com:http' is not valid: the port after ':' must be digits",
            "write the registry as host[:port], e.g. registry.example.com:5000/team/app:1.0",
        ),
    ];
    for (image, message, fix) in cases {
        let e = image_error(image);
        assert_eq!(e.message, message, "{image}");
        assert_eq!(e.fix.as_deref(), Some(fix), "{image}");
    }
}

#[test]
fn image_references_docker_accepts_load() {
    for image in [
        "nginx",
        "nginx:Latest",
        "localhost:5000/team/app:v1",
        "[::1]:5000/app:1",
        "my_org/my__app-x.y:1",
        "nginx:1.27@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
    ] {
        let p = ok(&format!("services:\n  web:\n    image: '{image}'\n"));
        assert_eq!(p.services[0].container.image, image);
    }
}

#[test]
fn a_template_in_the_image_is_named_as_one() {
    let e = image_error("ghcr.io/acme/web:{{.Version}}");
    assert_eq!(
        e.message,
        "the image holds a template ({{...}}), which Ployz does not expand"
    );
    assert_eq!(
        e.fix.as_deref(),
        Some("write the value, or use ${VAR} interpolation with the variable set in the environment or .env")
    );
}

#[test]
fn a_refused_image_is_not_also_a_missing_image() {
    // One error for the image; not a second one saying the service has no image.
    let e = image_error("Nginx");
    assert!(e.message.contains("lowercase"), "{e}");
    // With build: too, the refusal stands alone: no "the service has no image".
    let e = errors("services:\n  web:\n    build: ./nowhere\n    image: 'nginx:'\n");
    let keys: Vec<Option<&str>> = e.iter().map(|e| e.key.as_deref()).collect();
    assert_eq!(keys, [Some("build.context"), Some("image")], "{e:#?}");
    // A build that is refused is not also a missing image.
    let e = only_error("services:\n  web:\n    build: ./nowhere\n");
    assert_eq!(e.key.as_deref(), Some("build.context"));
    // pull_policy build needs build:, and with it is accepted.
    let e = only_error("services:\n  web:\n    image: app\n    pull_policy: build\n");
    assert_eq!(e.message, "pull_policy build needs build:");
    let p = ok("services:\n  web:\n    build:\n      dockerfile_inline: FROM scratch\n    pull_policy: build\n");
    assert!(
        p.services[0].container.image.ends_with("-web"),
        "{:?}",
        p.services[0].container.image
    );
    assert_eq!(p.builds.len(), 1);
    // An empty image is refused once.
    let e = only_error("services:\n  web:\n    image: ''\n");
    assert_eq!(e.message, "the image must not be empty");
}

// ---- environment --------------------------------------------------------------------------

#[test]
fn a_name_twice_in_an_environment_list_is_refused_without_its_values() {
    let e = only_error(
        "services:\n  web:\n    image: nginx\n    environment:\n      - A=1\n      - B=2\n      - A=secret-two\n",
    );
    assert_eq!(e.key.as_deref(), Some("environment[2]"));
    assert_eq!(e.value, None);
    assert_eq!(
        e.message,
        "'A' is set more than once in the environment list (environment[0], environment[2]): only one value can reach the container"
    );
    assert_eq!(
        e.fix.as_deref(),
        Some("keep one line for A, e.g. delete environment[0]")
    );
    assert!(!e.to_string().contains("secret-two"), "{e}");
    // The same line twice too, as Compose does; a name without a value counts.
    let e = errors("services:\n  web:\n    image: nginx\n    environment: [A=1, A=1, B, B]\n");
    let keys: Vec<_> = e.iter().map(|e| e.key.as_deref()).collect();
    assert_eq!(
        keys,
        [Some("environment[1]"), Some("environment[3]")],
        "{e:#?}"
    );
}

#[test]
fn a_name_twice_in_an_environment_mapping_is_a_duplicate_key() {
    let e =
        errors("services:\n  web:\n    image: nginx\n    environment:\n      A: 1\n      A: 2\n");
    assert_eq!(e.len(), 1, "{e:#?}");
    assert!(e[0].message.contains("duplicate"), "{}", e[0]);
}

// ---- keys from the table --------------------------------------------------------------------

#[test]
fn warned_and_refused_keys_say_what_the_table_says() {
    let p = ok(&service_with("expose: [\"8080\"]"));
    assert_eq!(
        warning(&p, "expose").message,
        "has no effect: every container port is reachable from the other Services on the Ployz network"
    );
    let p = ok(&service_with("pull_refresh_after: 1h"));
    assert_eq!(
        warning(&p, "pull_refresh_after").message,
        "is not supported and is ignored; use pull_policy always to pull on every Deploy"
    );
    let p = ok("version: '3.8'\nname: shop\nservices:\n  web: { image: nginx }\n");
    assert_eq!(
        warning(&p, "version").to_string(),
        format!(
            "{}: version: is obsolete and ignored, as in Compose v2; remove it",
            p.warnings[0].file
        )
    );
    assert_eq!(
        warning(&p, "name").message,
        "is ignored: Ployz has no project name; each Service is known by its own key"
    );
    let e = only_error(
        "services:\n  base: { image: nginx, extends: web }\n  web:\n    image: nginx\n    extends: base\n",
    );
    assert_eq!(e.service.as_deref(), Some("base"));
    assert_eq!(e.key.as_deref(), Some("extends"));
    assert_eq!(e.value.as_deref(), Some("web"));
    assert_eq!(
        e.message,
        "extends goes round in a cycle: 'base' -> 'web' -> 'base'"
    );
    assert_eq!(
        e.fix.as_deref(),
        Some("make one of these services stop extending the next")
    );
    let e = only_error("include: [other.yaml]\nservices:\n  web: { image: nginx }\n");
    assert_eq!(e.key.as_deref(), Some("include"));
    assert_eq!(e.message, "include is not supported");
    assert_eq!(
        e.fix.as_deref(),
        Some("pass each file with its own -f instead")
    );
}

#[test]
fn unknown_keys_suggest_the_nearest_known_one() {
    let p = ok(&service_with("restrat: always"));
    assert_eq!(
        warning(&p, "restrat").message,
        "unknown key, ignored; did you mean 'restart'?"
    );
    let p = ok(&service_with("x-port: [\"app.example.com:80\"]"));
    assert_eq!(
        warning(&p, "x-port").message,
        "unknown extension, ignored; did you mean 'x-ports'?"
    );
    let p = ok("servics: {}\nservices:\n  web: { image: nginx }\n");
    assert_eq!(
        warning(&p, "servics").message,
        "unknown top-level key, ignored; did you mean 'services'?"
    );
    // The file's own extensions are left alone.
    let p = ok("x-common: {}\nservices:\n  web: { image: nginx, x-team: web }\n");
    assert!(p.warnings.is_empty(), "{:#?}", p.warnings);
}
