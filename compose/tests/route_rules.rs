//! `x-routes` rules beyond the path: basic authentication (users lists of bcrypt or argon2
//! hashes, from a file or a secret), timeouts, body limits and error pages; and each refusal,
//! named by its field, never showing a list's content.

use std::path::Path;

use ployz_compose::{load, ComposeInput, LoadedProject};
use ployz_core::{PathMatch, SecretValue};

const BCRYPT: &str = "alice:$2y$12$abcdefghijklmnopqrstuuAbCdEfGhIjKlMnOpQrStUvWxYz01234\n";
const ARGON2: &str =
    "bob:$argon2id$v=19$m=19456,t=2,p=1$c29tZXNhbHQ$aGFzaGhhc2hoYXNoaGFzaGhhc2hoYXNoaGFzaA\n";

/// Loads `compose.yaml` beside `files` in a fresh folder.
fn load_with(yaml: &str, files: &[(&str, &str)]) -> Result<LoadedProject, String> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("compose.yaml"), yaml).unwrap();
    for (name, content) in files {
        std::fs::write(dir.path().join(name), content).unwrap();
    }
    load(&input(dir.path())).map_err(|e| e.to_string())
}

fn input(dir: &Path) -> ComposeInput {
    ComposeInput {
        files: vec![dir.join("compose.yaml")],
        profiles: Vec::new(),
        env: [("STAFF".to_owned(), ARGON2.to_owned())].into(),
    }
}

const HEAD: &str =
    "services:\n  web:\n    image: nginx\n    x-ports: [a.example.com:80/http]\n    x-routes:\n";

#[test]
fn rules_land_in_the_route_and_users_lists_travel_as_secrets() {
    let yaml = format!(
        "{HEAD}      - path: /admin\n        basic_auth: {{users_file: ./admins.htpasswd, realm: Admins}}\n        timeout: 90s\n        max_body_size: 10m\n        error_pages: {{502: ./502.html, 504: ./504.html}}\n      - exact: /staff\n        basic_auth: {{users_secret: staff}}\nsecrets:\n  staff: {{environment: STAFF}}\n"
    );
    let p = load_with(
        &yaml,
        &[
            ("admins.htpasswd", BCRYPT),
            ("502.html", "<p>down</p>"),
            ("504.html", "<p>slow</p>"),
        ],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let web = &p.services[0];
    let admin = web
        .routes
        .iter()
        .find(|r| r.path == PathMatch::Prefix("/admin".into()))
        .unwrap();
    let auth = admin.basic_auth.as_ref().unwrap();
    assert_eq!(auth.realm, "Admins");
    assert_eq!(
        auth.digest,
        SecretValue::new(BCRYPT.as_bytes().to_vec()).digest()
    );
    assert_eq!(auth.users.as_ref().unwrap().as_bytes(), BCRYPT.as_bytes());
    assert_eq!(admin.timeout_ms, Some(90_000));
    assert_eq!(admin.max_body_bytes, Some(10 * 1024 * 1024));
    assert_eq!(
        admin.error_pages,
        [
            (502, "<p>down</p>".to_owned()),
            (504, "<p>slow</p>".to_owned())
        ]
        .into()
    );
    let staff = web
        .routes
        .iter()
        .find(|r| r.path == PathMatch::Exact("/staff".into()))
        .unwrap();
    let auth = staff.basic_auth.as_ref().unwrap();
    assert_eq!(auth.realm, "restricted");
    assert_eq!(auth.users.as_ref().unwrap().as_bytes(), ARGON2.as_bytes());

    // What labels and previews carry: the digest, never the list; and it compares equal.
    assert!(web.has_secret_values());
    let shown = web.without_secret_values();
    assert!(!shown.has_secret_values());
    assert_eq!(&shown, web);
    let text = serde_json::to_string(&shown).unwrap() + &format!("{shown:?}");
    assert!(
        !text.contains("argon2id") && !text.contains("$2y$"),
        "{text}"
    );
    // A changed list is a changed spec: the containers are replaced.
    let other = load_with(
        &yaml,
        &[
            ("admins.htpasswd", ARGON2),
            ("502.html", "<p>down</p>"),
            ("504.html", "<p>slow</p>"),
        ],
    )
    .unwrap();
    assert_ne!(&other.services[0], web);
}

#[test]
fn bad_rules_are_refused_naming_the_field_and_never_the_list() {
    /// What is wrong, the Compose file, the files beside it, what the error says.
    type Case<'a> = (&'a str, String, Vec<(&'a str, &'a str)>, Vec<&'a str>);
    let cases: Vec<Case> = vec![
        (
            "a plain password",
            format!("{HEAD}      - {{path: /admin, basic_auth: {{users_file: ./a.htpasswd}}}}\n"),
            vec![("a.htpasswd", "# admins\nalice:open-sesame\n")],
            vec!["x-routes[0].basic_auth.users_file", "line 2 has a hash that is not bcrypt or argon2", "htpasswd -nBC"],
        ),
        (
            "an SHA1 hash",
            format!("{HEAD}      - {{path: /admin, basic_auth: {{users_file: ./a.htpasswd}}}}\n"),
            vec![("a.htpasswd", "alice:{SHA}W6ph5Mm5Pz8GgiULbPgzG37mj9g=\n")],
            vec!["x-routes[0].basic_auth.users_file", "line 1 has a hash"],
        ),
        (
            "an MD5 (apr1) hash in a secret",
            format!("{HEAD}      - {{path: /admin, basic_auth: {{users_secret: s}}}}\nsecrets:\n  s: {{file: ./s.txt}}\n"),
            vec![("s.txt", "alice:$apr1$r31.....$HqJZimcKQFAMYayBlzkrA/\n")],
            vec!["x-routes[0].basic_auth.users_secret", "line 1 has a hash that is not bcrypt or argon2"],
        ),
        (
            "a password in the Compose file",
            format!("{HEAD}      - {{path: /admin, basic_auth: 'alice:open-sesame'}}\n"),
            vec![],
            vec!["x-routes[0].basic_auth", "a password is never written in the Compose file"],
        ),
        (
            "both sources",
            format!("{HEAD}      - {{path: /admin, basic_auth: {{users_file: ./a.htpasswd, users_secret: s}}}}\n"),
            vec![("a.htpasswd", BCRYPT)],
            vec!["x-routes[0].basic_auth", "not both"],
        ),
        (
            "no source",
            format!("{HEAD}      - {{path: /admin, basic_auth: {{realm: Staff}}}}\n"),
            vec![],
            vec!["x-routes[0].basic_auth", "needs a users list"],
        ),
        (
            "a secret not declared",
            format!("{HEAD}      - {{path: /admin, basic_auth: {{users_secret: nope}}}}\n"),
            vec![],
            vec!["x-routes[0].basic_auth.users_secret", "'nope' is not declared"],
        ),
        (
            "a missing users file",
            format!("{HEAD}      - {{path: /admin, basic_auth: {{users_file: ./gone.htpasswd}}}}\n"),
            vec![],
            vec!["x-routes[0].basic_auth.users_file", "gone.htpasswd", "cannot be read"],
        ),
        (
            "a duplicated user",
            format!("{HEAD}      - {{path: /admin, basic_auth: {{users_file: ./a.htpasswd}}}}\n"),
            vec![("a.htpasswd", &*format!("{BCRYPT}{BCRYPT}").leak())],
            vec!["line 2 names a user already named on line 1"],
        ),
        (
            "a realm with a quote",
            format!("{HEAD}      - {{path: /admin, basic_auth: {{users_file: ./a.htpasswd, realm: 'a\"b'}}}}\n"),
            vec![("a.htpasswd", BCRYPT)],
            vec!["x-routes[0].basic_auth.realm", "no quote"],
        ),
        (
            "an error page for a status the edge does not make",
            format!("{HEAD}      - {{path: /, error_pages: {{500: ./500.html}}}}\n"),
            vec![("500.html", "x")],
            vec!["x-routes[0].error_pages.500", "for 502, 503 and 504"],
        ),
        (
            "a missing error page",
            format!("{HEAD}      - {{path: /, error_pages: {{502: ./502.html}}}}\n"),
            vec![],
            vec!["x-routes[0].error_pages.502", "502.html", "cannot be read"],
        ),
        (
            "a timeout under a second",
            format!("{HEAD}      - {{path: /slow, timeout: 500ms}}\n"),
            vec![],
            vec!["x-routes[0].timeout", "between 1s and 1h"],
        ),
        (
            "a timeout without a unit",
            format!("{HEAD}      - {{path: /slow, timeout: 30}}\n"),
            vec![],
            vec!["x-routes[0].timeout", "needs a unit"],
        ),
        (
            "a body limit that is no size",
            format!("{HEAD}      - {{path: /up, max_body_size: lots}}\n"),
            vec![],
            vec!["x-routes[0].max_body_size"],
        ),
    ];
    for (what, yaml, files, needles) in cases {
        let err = load_with(&yaml, &files).expect_err(what);
        for needle in needles {
            assert!(err.contains(needle), "{what}: no {needle:?} in\n{err}");
        }
        for secret in ["open-sesame", "W6ph5Mm5", "HqJZimc", "abcdefghijklmnop"] {
            assert!(!err.contains(secret), "{what} shows the list:\n{err}");
        }
    }
}

#[test]
fn a_rule_alone_takes_the_whole_hostname() {
    let p = load_with(&format!("{HEAD}      - {{timeout: 2m}}\n"), &[]).unwrap();
    let route = &p.services[0].routes[0];
    assert_eq!(route.path, PathMatch::root());
    assert_eq!(route.timeout_ms, Some(120_000));
}
