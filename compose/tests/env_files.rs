//! Env files hold secrets: what the Compose loader says about them names the file and the line,
//! never a value.

use std::path::Path;

use ployz_compose::{load, ComposeInput};

/// A value no message may ever show.
const SECRET: &str = "s3cr3t-hunter2-value";

fn project(files: &[(&str, String)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, content) in files {
        std::fs::write(dir.path().join(name), content).unwrap();
    }
    dir
}

fn input(dir: &Path) -> ComposeInput {
    ComposeInput {
        files: vec![dir.join("compose.yaml")],
        profiles: Vec::new(),
        env: Default::default(),
    }
}

/// Everything the loader said: its errors or its warnings, one per line.
fn said(dir: &Path) -> String {
    match load(&input(dir)) {
        Ok(p) => p
            .warnings
            .iter()
            .map(|w| w.to_string())
            .collect::<Vec<_>>()
            .join("\n"),
        Err(errors) => errors.to_string(),
    }
}

const COMPOSE: &str = "services:\n  web:\n    image: nginx\n    env_file: app.env\n";

#[test]
fn an_env_file_that_is_not_one_is_refused_by_path_and_line_without_its_lines() {
    // `env_file: /etc/shadow`, as it were.
    let shadow = format!("root:{SECRET}:19000:0:99999:7:::\ndaemon:*:19000:0:99999:7:::\n");
    let dir = project(&[("compose.yaml", COMPOSE.into()), ("app.env", shadow)]);
    let text = said(dir.path());
    let path = dir.path().join("app.env");
    assert!(
        text.contains(&format!("{}:1:", path.display())),
        "path:line missing: {text}"
    );
    assert!(!text.contains(SECRET) && !text.contains("root:"), "{text}");
}

#[test]
fn env_file_problems_name_path_and_line_never_a_value() {
    let cases = [
        // A line that is a bare token: a name taken from the environment, which is not set.
        (format!("OK=1\n{SECRET}\n"), 2),
        // A value that refers to a variable that is not set (an unquoted `$` in a password).
        (format!("A=1\nB=2\nPASSWORD=ab$cd{SECRET}\n"), 3),
        // Broken interpolation and quoting.
        (format!("PASSWORD={SECRET}${{\n"), 1),
        (format!("A=1\nPASSWORD='{SECRET}\n"), 2),
        (format!("X=1\nY=2\nZ=3\nPASSWORD=\"{SECRET}\n"), 4),
        (format!("{SECRET} WITH SPACES=1\n"), 1),
    ];
    for (content, line) in cases {
        let dir = project(&[
            ("compose.yaml", COMPOSE.into()),
            ("app.env", content.clone()),
        ]);
        let text = said(dir.path());
        let path = dir.path().join("app.env");
        assert!(
            text.contains(&format!("{}:{line}:", path.display())),
            "{content:?}: path:line missing: {text}"
        );
        assert!(!text.contains(SECRET), "{content:?}: a value shown: {text}");
        assert!(
            !text.contains("hunter2") && !text.contains("s3cr3t"),
            "{content:?}: part of a value: {text}"
        );
    }
}

#[test]
fn the_projects_dot_env_is_named_by_path_and_line_too() {
    let dir = project(&[
        (
            "compose.yaml",
            "services:\n  web:\n    image: nginx\n".into(),
        ),
        (".env", format!("TAG=1\nTOKEN=x$y{SECRET}\n")),
    ]);
    let text = said(dir.path());
    let path = dir.path().join(".env");
    assert!(
        text.contains(&format!("{}:2:", path.display())),
        "path:line missing: {text}"
    );
    assert!(
        !text.contains("s3cr3t") && !text.contains("hunter2"),
        "{text}"
    );
}

#[test]
fn a_value_interpolated_from_the_env_file_is_shown_as_its_reference_in_errors() {
    // A command that cannot be split (the value's quote), a healthcheck test of the wrong
    // shape: both errors show the field, and the password as the reference that brought it.
    let compose = "services:\n  cache:\n    image: redis\n    command: redis-server --requirepass ${REDIS_PASSWORD}\n    healthcheck:\n      test: [\"redis-cli\", \"-a\", \"${REDIS_PASSWORD}\", \"ping\"]\n";
    let dir = project(&[
        ("compose.yaml", compose.into()),
        (".env", format!("REDIS_PASSWORD=it's-{SECRET}\n")),
    ]);
    let text = said(dir.path());
    assert!(text.contains("command"), "{text}");
    assert!(text.contains("${REDIS_PASSWORD}"), "{text}");
    assert!(!text.contains(SECRET), "{text}");
}
