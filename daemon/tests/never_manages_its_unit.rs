//! The Architecture Invariant "the daemon never manages its own unit": no code path of
//! `ployz daemon run` starts, stops, restarts, enables or edits `ployz.service` (a host that
//! stops itself half way through leaves nothing running to fix it). The installation owns the
//! host (the package's maintainer scripts, `install.sh`, the CLI over SSH); the daemon only
//! tells the service manager how it is (`sd_notify`).
//!
//! Checked on the source of every crate the daemon is built from, and the CLI's `daemon`
//! commands: no `systemctl` (or `systemd-run`, `busctl`) command is spawned, no systemd D-Bus
//! name is spoken, no unit directory is written, the unit is never named, and no crate that
//! talks to systemd's bus is a dependency. Advice in messages ("restart it with `systemctl
//! restart docker`") is words for a person, in backquotes or prose, and stays allowed.

use std::path::{Path, PathBuf};

/// The daemon's crates, from the workspace root.
const DAEMON_CRATES: &[&str] = &[
    "daemon",
    "core",
    "store",
    "orchestrator",
    "edge",
    "dns",
    "acme",
    "mesh",
];
/// Single files of other crates that are the daemon's code path.
const DAEMON_FILES: &[&str] = &["cli/src/commands/daemon.rs"];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The string literals of a Rust source, with their line numbers (plain and raw strings; a
/// close approximation of the lexer that is exact for this code base's style).
fn string_literals(text: &str) -> Vec<(usize, String)> {
    let bytes = text.as_bytes();
    let (mut i, mut line) = (0usize, 1usize);
    let mut out = Vec::new();
    while i < bytes.len() {
        match bytes[i] {
            b'\n' => line += 1,
            b'/' if bytes.get(i + 1) == Some(&b'/') => {
                // A comment, to its end of line.
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
                continue;
            }
            b'\'' => {
                // A char literal ('"' among them) or a lifetime.
                if bytes.get(i + 2) == Some(&b'\'') {
                    i += 3;
                    continue;
                }
                if bytes.get(i + 1) == Some(&b'\\') && bytes.get(i + 3) == Some(&b'\'') {
                    i += 4;
                    continue;
                }
            }
            b'r' if matches!(bytes.get(i + 1), Some(b'"') | Some(b'#'))
                && (i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_')) =>
            {
                let mut j = i + 1;
                let mut hashes = 0;
                while bytes.get(j) == Some(&b'#') {
                    hashes += 1;
                    j += 1;
                }
                if bytes.get(j) == Some(&b'"') {
                    let close: String = std::iter::once('"')
                        .chain(std::iter::repeat_n('#', hashes))
                        .collect();
                    let start = j + 1;
                    let end = text[start..].find(&close).map_or(text.len(), |e| start + e);
                    let lit = &text[start..end];
                    out.push((line, lit.to_owned()));
                    line += lit.matches('\n').count();
                    i = end + close.len();
                    continue;
                }
            }
            b'"' => {
                let start = i + 1;
                let mut j = start;
                while j < bytes.len() && bytes[j] != b'"' {
                    if bytes[j] == b'\\' {
                        j += 1;
                    }
                    j += 1;
                }
                let lit = &text[start..j.min(text.len())];
                out.push((line, lit.to_owned()));
                line += lit.matches('\n').count();
                i = j + 1;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// What a string literal may not be: why, when it is one of them.
fn forbidden(lit: &str) -> Option<&'static str> {
    let first = lit.split_whitespace().next().unwrap_or("");
    let program = first.rsplit('/').next().unwrap_or(first);
    if matches!(program, "systemctl" | "systemd-run" | "busctl")
        && (lit.trim() == first || lit.contains(' ') && !lit.contains('`'))
    {
        return Some("a service manager command");
    }
    if lit.contains("org.freedesktop.systemd1") {
        return Some("systemd's D-Bus name");
    }
    if lit.contains("/systemd/system") {
        return Some("a unit directory");
    }
    let mut rest = lit;
    while let Some(at) = rest.find("ployz.service") {
        let after = &rest[at + "ployz.service".len()..];
        // `ployz.service.id` and friends are container labels, not the unit.
        if !after.starts_with('.') {
            return Some("the unit's name");
        }
        rest = after;
    }
    None
}

#[test]
fn no_code_path_of_the_daemon_manages_its_unit() {
    let root = root();
    let mut files = Vec::new();
    for krate in DAEMON_CRATES {
        rust_files(&root.join(krate).join("src"), &mut files);
    }
    files.extend(DAEMON_FILES.iter().map(|f| root.join(f)));
    assert!(files.len() > 50, "found only {} files", files.len());
    let mut found = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for (line, lit) in string_literals(&text) {
            if let Some(why) = forbidden(&lit) {
                found.push(format!(
                    "{}:{line}: {why}: {lit:?}",
                    file.strip_prefix(&root).unwrap().display()
                ));
            }
        }
    }
    assert!(
        found.is_empty(),
        "the daemon must never manage its own unit (ARCHITECTURE.md, Invariants):\n{}",
        found.join("\n")
    );
}

#[test]
fn no_crate_of_the_daemon_talks_to_systemds_bus() {
    let root = root();
    for krate in DAEMON_CRATES {
        let manifest = std::fs::read_to_string(root.join(krate).join("Cargo.toml")).unwrap();
        for bus in ["zbus", "dbus", "systemd", "libsystemd", "sd-bus"] {
            assert!(
                !manifest
                    .lines()
                    .any(|l| l.trim_start().starts_with(&format!("{bus} "))
                        || l.trim_start().starts_with(&format!("{bus}="))),
                "{krate}/Cargo.toml depends on {bus}"
            );
        }
    }
}

#[test]
fn the_check_sees_what_it_forbids() {
    // The scanner finds each kind of breach, and lets advice and labels through.
    let breach = r##"
        Command::new("systemctl").args(["restart", "ployz.service"]);
        let unit = "/etc/systemd/system/ployz.service";
        let bus = r#"org.freedesktop.systemd1"#;
        run("systemctl restart ployz");
    "##;
    let found: Vec<_> = string_literals(breach)
        .into_iter()
        .filter_map(|(line, l)| forbidden(&l).map(|why| (line, why)))
        .collect();
    assert_eq!(
        found,
        vec![
            (2, "a service manager command"),
            (2, "the unit's name"),
            (3, "a unit directory"),
            (4, "systemd's D-Bus name"),
            (5, "a service manager command"),
        ]
    );
    let allowed = r#"
        // systemctl restart ployz (a comment)
        let label = "ployz.service.id";
        bail!("dockerd may be hung: restart it (for example `systemctl restart docker`)");
        let c = '"'; let s = "systemctl is words here: see `systemctl status`";
    "#;
    let found: Vec<_> = string_literals(allowed)
        .into_iter()
        .filter_map(|(line, l)| forbidden(&l).map(|why| (line, why, l)))
        .collect();
    assert!(found.is_empty(), "{found:?}");
}
