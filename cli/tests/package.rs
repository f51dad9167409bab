//! The Debian package and the tarball `scripts/package.sh` builds, each test from the test-built
//! `ployz` into a temp dir of its own: what they hold and with which modes, the unit as systemd
//! reads it, lintian's verdict against the list docs/install.md keeps, the tarball's installer,
//! and the maintainer scripts installing, upgrading, removing and purging in a scratch root.
//! Nothing is installed on this machine's own root.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::*;

/// The workspace: the parent of this crate's directory.
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Runs `cmd`, panicking with its output when it does not succeed.
fn ok(cmd: &mut Command) -> Output {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?} did not run: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}{}",
        out.status,
        stdout(&out),
        stderr(&out)
    );
    out
}

fn tool_output(program: &str, args: &[&str]) -> String {
    stdout(&ok(Command::new(program).args(args)))
        .trim()
        .to_owned()
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The artefacts of one `scripts/package.sh` run.
struct Built {
    deb: PathBuf,
    tarball: PathBuf,
    /// The tarball's top directory.
    top: String,
}

/// `scripts/package.sh --bin PLOYZ --version VERSION --out DIR --fast`; `None` as the version
/// leaves the workspace's.
fn package(dir: &Path, version: Option<&str>) -> Built {
    let mut cmd = Command::new(repo().join("scripts/package.sh"));
    cmd.args(["--bin", PLOYZ, "--fast", "--out"]).arg(dir);
    if let Some(v) = version {
        cmd.args(["--version", v]);
    }
    let out = ok(&mut cmd);
    let version = version.unwrap_or(env!("CARGO_PKG_VERSION"));
    let debarch = tool_output("dpkg", &["--print-architecture"]);
    let arch = tool_output("uname", &["-m"]);
    let deb = dir.join(format!("ployz_{version}_{debarch}.deb"));
    let top = format!("ployz-{version}-linux-{arch}");
    let tarball = dir.join(format!("{top}.tar.gz"));
    // One line per artefact: its path and its size.
    let printed = stdout(&out);
    let lines: Vec<&str> = printed.lines().collect();
    assert_eq!(lines.len(), 2, "package.sh printed: {printed}");
    for (line, path) in lines.iter().zip([&deb, &tarball]) {
        let size = std::fs::metadata(path)
            .unwrap_or_else(|e| panic!("{}: {e} (package.sh printed {printed})", path.display()))
            .len();
        assert!(
            line.starts_with(&path.display().to_string()) && line.contains(&size.to_string()),
            "'{line}' does not name {} and its size {size}",
            path.display()
        );
    }
    Built { deb, tarball, top }
}

fn temp_dir(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(prefix).tempdir().unwrap()
}

/// One entry of a `tar -tv` listing (`dpkg-deb -c` prints the same).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    kind: char,
    /// Octal, as `0644`.
    mode: String,
    owner: String,
}

/// `-rwxr-xr-x root/root 123 2026-01-01 00:00 ./usr/bin/ployz` lines, by path (without the
/// leading `./` and a directory's trailing `/`).
fn tar_listing(text: &str) -> BTreeMap<String, Entry> {
    let mut entries = BTreeMap::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        assert!(fields.len() >= 6, "unexpected listing line '{line}'");
        let perms = fields[0];
        let mode = octal(mode_of(&perms[1..]));
        let path = fields[5]
            .trim_start_matches("./")
            .trim_end_matches('/')
            .to_owned();
        if path.is_empty() {
            continue;
        }
        let entry = Entry {
            kind: perms.chars().next().unwrap(),
            mode,
            owner: fields[1].to_owned(),
        };
        entries.insert(path, entry);
    }
    entries
}

/// `rwsr-xr-x` as 0o4755.
fn mode_of(perms: &str) -> u32 {
    let mut mode = 0;
    for (i, c) in perms.chars().enumerate() {
        if !matches!(c, '-' | 'S' | 'T') {
            mode |= 1 << (8 - i);
        }
        if i % 3 == 2 && matches!(c, 's' | 'S' | 't' | 'T') {
            mode |= 0o4000 >> (i / 3);
        }
    }
    mode
}

fn octal(mode: u32) -> String {
    format!("{mode:04o}")
}

fn file(mode: u32) -> Entry {
    Entry {
        kind: '-',
        mode: octal(mode),
        owner: "root/root".to_owned(),
    }
}

/// The names of an ELF file's sections (`readelf -S`).
fn sections(path: &Path) -> BTreeSet<String> {
    let text = stdout(&ok(Command::new("readelf").args(["-S", "-W"]).arg(path)));
    text.lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let rest = l.strip_prefix('[')?;
            let (_, after) = rest.split_once(']')?;
            after.split_whitespace().next().map(str::to_owned)
        })
        .collect()
}

#[test]
fn the_deb_holds_the_promised_files_and_fields() {
    let dir = temp_dir("ployz-package-deb-");
    let built = package(dir.path(), Some("0.1.7"));

    let listing = tar_listing(&stdout(&ok(Command::new("dpkg-deb")
        .arg("-c")
        .arg(&built.deb))));
    let files: BTreeMap<String, Entry> = listing
        .iter()
        .filter(|(_, e)| e.kind != 'd')
        .map(|(p, e)| (p.clone(), e.clone()))
        .collect();
    let promised: BTreeMap<String, Entry> = [
        ("usr/bin/ployz", file(0o755)),
        ("lib/systemd/system/ployz.service", file(0o644)),
        ("etc/ployz/daemon.toml", file(0o644)),
        ("usr/share/doc/ployz/copyright", file(0o644)),
        ("usr/share/doc/ployz/changelog.gz", file(0o644)),
        ("usr/share/man/man1/ployz.1.gz", file(0o644)),
        ("usr/share/lintian/overrides/ployz", file(0o644)),
    ]
    .into_iter()
    .map(|(p, e)| (p.to_owned(), e))
    .collect();
    assert_eq!(files, promised, "the package's files");
    for (path, entry) in &listing {
        if entry.kind == 'd' {
            assert_eq!(
                (entry.mode.as_str(), entry.owner.as_str()),
                ("0755", "root/root"),
                "directory {path}"
            );
        }
    }

    let field = |name: &str| tool_output("dpkg-deb", &["-f", built.deb.to_str().unwrap(), name]);
    assert_eq!(field("Package"), "ployz");
    assert_eq!(field("Version"), "0.1.7");
    assert_eq!(
        field("Architecture"),
        tool_output("dpkg", &["--print-architecture"])
    );
    assert_eq!(field("Section"), "admin");
    assert_eq!(field("Priority"), "optional");
    assert_eq!(field("Recommends"), "docker.io | docker-ce");
    assert!(
        field("Maintainer").contains('<'),
        "Maintainer: {}",
        field("Maintainer")
    );
    let depends = field("Depends");
    assert!(
        depends.split(", ").any(|d| d.starts_with("libc6 (>= 2.")),
        "Depends has no libc6 with a minimum version: {depends}"
    );
    let installed_size: u64 = field("Installed-Size").parse().unwrap();
    let description = field("Description");
    assert!(
        description.lines().count() > 3,
        "Description has no long part: {description}"
    );

    // The control files: conffiles, md5sums, the maintainer scripts.
    let control = dir.path().join("control");
    ok(Command::new("dpkg-deb")
        .arg("-e")
        .arg(&built.deb)
        .arg(&control));
    assert_eq!(read(&control.join("conffiles")), "/etc/ployz/daemon.toml\n");
    for script in ["postinst", "prerm", "postrm"] {
        let mode = std::fs::metadata(control.join(script))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, 0o755, "{script}'s mode");
    }

    // What the files hold: the repository's unit and configuration, a stripped program that
    // runs, and md5sums that match.
    let root = dir.path().join("root");
    ok(Command::new("dpkg-deb")
        .arg("-x")
        .arg(&built.deb)
        .arg(&root));
    assert_eq!(
        read(&root.join("lib/systemd/system/ployz.service")),
        read(&repo().join("packaging/ployz.service"))
    );
    assert_eq!(
        read(&root.join("etc/ployz/daemon.toml")),
        read(&repo().join("configs/daemon.toml"))
    );
    let bin = root.join("usr/bin/ployz");
    let version = stdout(&ok(Command::new(&bin).arg("--version")));
    assert_eq!(
        version.trim(),
        format!("ployz {}", env!("CARGO_PKG_VERSION"))
    );
    let found = sections(&bin);
    for unwanted in [".symtab", ".debug_info", ".comment"] {
        assert!(
            !found.contains(unwanted),
            "the packaged program is not stripped: it has {unwanted}"
        );
    }
    let size_kib = std::fs::metadata(&bin).unwrap().len().div_ceil(1024);
    assert!(
        installed_size >= size_kib && installed_size < size_kib + 100,
        "Installed-Size {installed_size} KiB for a program of {size_kib} KiB"
    );
    let md5sums = read(&control.join("md5sums"));
    let summed: BTreeSet<&str> = md5sums
        .lines()
        .map(|l| l.split_once("  ").unwrap().1)
        .collect();
    let expected: BTreeSet<&str> = promised
        .keys()
        .map(String::as_str)
        .filter(|p| *p != "etc/ployz/daemon.toml")
        .collect();
    assert_eq!(
        summed, expected,
        "md5sums lists every file but the conffile"
    );
    ok(Command::new("md5sum")
        .args(["--check", "--quiet"])
        .arg(control.join("md5sums"))
        .current_dir(&root));
}

#[test]
fn the_units_commands_are_the_programs() {
    // ExecStart= and ExecReload= name subcommands and flags the program has, and the unit waits
    // longer for a stop than the default configuration's shutdown takes.
    let unit = read(&repo().join("packaging/ployz.service"));
    let mut execs = 0;
    for line in unit.lines() {
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        if !key.starts_with("Exec") {
            continue;
        }
        execs += 1;
        let words: Vec<&str> = value.split_whitespace().collect();
        assert_eq!(words[0], "/usr/bin/ployz", "{line}");
        let config_at = words.iter().position(|w| *w == "--config").unwrap();
        let help = stdout(&ok(Command::new(PLOYZ)
            .args(&words[1..config_at])
            .arg("--help")));
        assert!(help.contains("--config <FILE>"), "{line}: {help}");
        let config = Path::new("/etc/ployz/daemon.toml");
        assert_eq!(words.get(config_at + 1), Some(&config.to_str().unwrap()));
    }
    assert_eq!(execs, 2, "ExecStart= and ExecReload=");

    let seconds = |text: &str, key: &str| -> u64 {
        let line = text
            .lines()
            .find(|l| l.starts_with(key) && l[key.len()..].trim_start().starts_with('='))
            .unwrap_or_else(|| panic!("no {key}"));
        let value = line.split_once('=').unwrap().1.trim();
        value.trim_end_matches('s').parse().unwrap()
    };
    let config = read(&repo().join("configs/daemon.toml"));
    let shutdown = seconds(&config, "drain_delay_seconds")
        + seconds(&config, "grace_seconds")
        + seconds(&config, "timeout_seconds");
    let stop = seconds(&unit, "TimeoutStopSec");
    assert!(
        stop > shutdown,
        "TimeoutStopSec={stop}s leaves no room for the default shutdown's {shutdown} s"
    );
}

#[test]
#[ignore = "needs systemd-analyze (the Debian package systemd; scripts/test.sh installs it)"]
fn the_unit_verifies_as_installed() {
    let dir = temp_dir("ployz-package-unit-");
    let built = package(dir.path(), None);
    // The package unpacked, with the system's own units beside it (systemd-analyze --root
    // looks for sysinit.target and the rest under the root): the unit's text as the package
    // installs it, and /usr/bin/ployz where ExecStart= says.
    let root = dir.path().join("root");
    ok(Command::new("dpkg-deb")
        .arg("-x")
        .arg(&built.deb)
        .arg(&root));
    let system_units = ["/usr/lib/systemd/system", "/lib/systemd/system"]
        .into_iter()
        .map(Path::new)
        .find(|p| p.join("sysinit.target").exists())
        .expect("no sysinit.target on this machine: is systemd installed?");
    std::fs::create_dir_all(root.join("usr/lib/systemd")).unwrap();
    ok(Command::new("cp")
        .arg("-a")
        .arg(system_units)
        .arg(root.join("usr/lib/systemd/")));
    let _ = std::fs::remove_file(root.join("usr/lib/systemd/system/ployz.service"));
    assert!(root.join("usr/bin/ployz").exists());

    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(format!("--root={}", root.display()))
        .arg("/lib/systemd/system/ployz.service")
        .stdin(Stdio::null())
        .output()
        .expect("systemd-analyze runs (the Debian package systemd)");
    let text = format!("{}{}", stdout(&out), stderr(&out));
    let about_unit: Vec<&str> = text.lines().filter(|l| l.contains("ployz")).collect();
    assert!(
        out.status.success() && about_unit.is_empty(),
        "systemd-analyze verify ({}):\n{text}",
        out.status
    );
}

/// The lintian tags docs/install.md lists under `### Warnings` and `### Overrides` of its
/// `## What lintian says`.
fn documented_lintian_tags() -> (BTreeSet<String>, BTreeSet<String>) {
    let doc = read(&repo().join("docs/install.md"));
    let mut section = "";
    let mut sub = "";
    let (mut warnings, mut overrides) = (BTreeSet::new(), BTreeSet::new());
    for line in doc.lines() {
        if let Some(h) = line.strip_prefix("## ") {
            section = h.trim();
            sub = "";
        } else if let Some(h) = line.strip_prefix("### ") {
            sub = h.trim();
        } else if section == "What lintian says" {
            let Some(rest) = line.strip_prefix("- `") else {
                continue;
            };
            let tag = rest.split('`').next().unwrap().to_owned();
            match sub {
                "Warnings" => warnings.insert(tag),
                "Overrides" => overrides.insert(tag),
                other => panic!("docs/install.md lists lintian tag {tag} under '{other}'"),
            };
        }
    }
    assert!(
        !overrides.is_empty(),
        "docs/install.md has no '### Overrides' list under '## What lintian says'"
    );
    (warnings, overrides)
}

#[test]
#[ignore = "needs lintian (scripts/test.sh installs it)"]
fn lintian_finds_no_error_and_only_the_documented_warnings() {
    let dir = temp_dir("ployz-package-lintian-");
    let built = package(dir.path(), None);
    let out = Command::new("lintian")
        .args(["--tag-display-limit", "0", "--show-overrides", "--info"])
        .arg(&built.deb)
        .stdin(Stdio::null())
        .output()
        .expect("lintian runs (the Debian package lintian)");
    let text = stdout(&out);
    // `E: ployz: tag [context]`, `W: ...`, `O: ...` (overridden), `I: ...`.
    let tags = |kind: &str| -> BTreeSet<String> {
        text.lines()
            .filter_map(|l| l.strip_prefix(&format!("{kind}: ployz: ")))
            .map(|rest| rest.split_whitespace().next().unwrap().to_owned())
            .collect()
    };
    let errors: Vec<&str> = text.lines().filter(|l| l.starts_with("E: ")).collect();
    assert!(
        errors.is_empty(),
        "lintian reports errors:\n{}\n(all it said:\n{text}{})",
        errors.join("\n"),
        stderr(&out)
    );
    assert!(
        !text.contains("unused-override") && !text.contains("mismatched-override"),
        "a lintian override no longer matches:\n{text}"
    );
    let (warnings, overrides) = documented_lintian_tags();
    assert_eq!(
        tags("W"),
        warnings,
        "lintian's warnings (left) and the ones docs/install.md lists (right); lintian said:\n{text}"
    );
    assert_eq!(
        tags("O"),
        overrides,
        "the overridden tags (left) and the ones docs/install.md lists (right); lintian said:\n{text}"
    );
    let override_file = read(&repo().join("packaging/debian/lintian-overrides"));
    let listed: BTreeSet<String> = override_file
        .lines()
        .filter_map(|l| l.strip_prefix("ployz: "))
        .map(|rest| rest.split_whitespace().next().unwrap().to_owned())
        .collect();
    assert_eq!(listed, overrides, "packaging/debian/lintian-overrides");
}

/// A dir anyone may read and enter, for running what it holds as another user.
fn world_readable(path: &Path) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// Every file under `dir` with its mode and contents.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, (u32, Vec<u8>)> {
    let mut all = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let contents = if meta.is_dir() {
                stack.push(path.clone());
                Vec::new()
            } else {
                std::fs::read(&path).unwrap_or_default()
            };
            all.insert(path, (meta.permissions().mode(), contents));
        }
    }
    all
}

#[test]
fn the_tarball_holds_the_installer_and_refuses_before_changing_anything() {
    let dir = temp_dir("ployz-package-tarball-");
    let built = package(dir.path(), None);
    assert!(
        built
            .top
            .starts_with(&format!("ployz-{}-linux-", env!("CARGO_PKG_VERSION"))),
        "the version defaults to the workspace's: {}",
        built.top
    );

    let listing = tar_listing(&stdout(&ok(Command::new("tar")
        .args(["--numeric-owner", "-tvzf"])
        .arg(&built.tarball))));
    let top_entry = Entry {
        kind: 'd',
        mode: octal(0o755),
        owner: "0/0".to_owned(),
    };
    let entry = |mode| Entry {
        kind: '-',
        mode: octal(mode),
        owner: "0/0".to_owned(),
    };
    let expected: BTreeMap<String, Entry> = [
        (String::new(), top_entry),
        ("/ployz".to_owned(), entry(0o755)),
        ("/install.sh".to_owned(), entry(0o755)),
        ("/ployz.service".to_owned(), entry(0o644)),
        ("/daemon.toml".to_owned(), entry(0o644)),
        ("/README".to_owned(), entry(0o644)),
    ]
    .into_iter()
    .map(|(p, e)| (format!("{}{p}", built.top), e))
    .collect();
    assert_eq!(
        listing, expected,
        "one top directory and its five files, root's"
    );

    let unpacked = dir.path().join("unpacked");
    std::fs::create_dir(&unpacked).unwrap();
    ok(Command::new("tar")
        .arg("-xzf")
        .arg(&built.tarball)
        .arg("-C")
        .arg(&unpacked));
    let top = unpacked.join(&built.top);
    for (name, source) in [
        ("install.sh", "packaging/install.sh"),
        ("ployz.service", "packaging/ployz.service"),
        ("daemon.toml", "configs/daemon.toml"),
    ] {
        assert_eq!(
            read(&top.join(name)),
            read(&repo().join(source)),
            "{name} is {source}"
        );
    }
    let version = stdout(&ok(Command::new(top.join("ployz")).arg("--version")));
    assert_eq!(
        version.trim(),
        format!("ployz {}", env!("CARGO_PKG_VERSION"))
    );
    assert!(!sections(&top.join("ployz")).contains(".symtab"));
    assert!(read(&top.join("README")).contains("sudo sh install.sh"));

    // POSIX sh: the shells that will run it parse it.
    let install = top.join("install.sh");
    ok(Command::new("sh").arg("-n").arg(&install));
    if Path::new("/bin/dash").exists() {
        ok(Command::new("/bin/dash").arg("-n").arg(&install));
    }

    // --help: the usage on stdout, status 0.
    let help = ok(Command::new("sh").arg(&install).arg("--help"));
    let usage = stdout(&help);
    for needle in ["Usage: sh install.sh", "--uninstall", "--purge"] {
        assert!(usage.contains(needle), "--help lacks '{needle}':\n{usage}");
    }

    // As a user other than root, with systemctl and the group tools replaced by stubs that
    // record being called: a bad argument is reported as such (before the user is checked),
    // and no argument fails on the user. Neither calls anything nor touches the directory.
    world_readable(dir.path());
    world_readable(&unpacked);
    let stubs = dir.path().join("stubs");
    std::fs::create_dir(&stubs).unwrap();
    let calls = dir.path().join("calls");
    std::fs::create_dir(&calls).unwrap();
    std::fs::set_permissions(&calls, std::fs::Permissions::from_mode(0o777)).unwrap();
    world_readable(&stubs);
    for tool in ["systemctl", "groupadd", "groupdel", "usermod", "dpkg-query"] {
        let stub = stubs.join(tool);
        std::fs::write(
            &stub,
            format!("#!/bin/sh\necho \"{tool} $*\" >> {}/log\n", calls.display()),
        )
        .unwrap();
        std::fs::set_permissions(&stub, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let before = snapshot(&unpacked);
    let system = ["/usr/bin/ployz", "/etc/ployz", "/var/lib/ployz"].map(|p| Path::new(p).exists());
    let as_user = |args: &[&str]| -> Output {
        let mut cmd = if is_root() {
            let mut c = Command::new("setpriv");
            c.args(["--reuid=65534", "--regid=65534", "--clear-groups"]);
            c.arg("sh");
            c
        } else {
            Command::new("sh")
        };
        cmd.arg(&install)
            .args(args)
            .env(
                "PATH",
                format!("{}:/usr/sbin:/usr/bin:/sbin:/bin", stubs.display()),
            )
            .current_dir("/")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let bad = as_user(&["--frobnicate"]);
    assert!(!bad.status.success());
    assert!(
        stderr(&bad).contains("unknown argument '--frobnicate'"),
        "a bad argument: {}",
        stderr(&bad)
    );
    let bad_after_good = as_user(&["--uninstall", "--frobnicate"]);
    assert!(stderr(&bad_after_good).contains("unknown argument '--frobnicate'"));
    assert!(!bad_after_good.status.success());
    for args in [&[][..], &["--uninstall"][..], &["--purge"][..]] {
        let out = as_user(args);
        assert!(!out.status.success(), "{args:?} as another user succeeded");
        assert!(
            stderr(&out).contains("must run as root"),
            "{args:?} as another user: {}",
            stderr(&out)
        );
    }
    assert!(
        !calls.join("log").exists(),
        "install.sh called tools before refusing: {}",
        read(&calls.join("log"))
    );
    assert_eq!(
        snapshot(&unpacked),
        before,
        "the unpacked directory changed"
    );
    assert_eq!(
        ["/usr/bin/ployz", "/etc/ployz", "/var/lib/ployz"].map(|p| Path::new(p).exists()),
        system
    );
}

#[test]
fn package_sh_names_what_is_missing() {
    let dir = temp_dir("ployz-package-missing-");
    let script = repo().join("scripts/package.sh");
    let missing = dir.path().join("no-such-ployz");
    let out = Command::new(&script)
        .arg("--bin")
        .arg(&missing)
        .arg("--out")
        .arg(dir.path().join("out"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains(&missing.display().to_string()),
        "a missing executable: {}",
        stderr(&out)
    );

    // A PATH with every program of this machine but dpkg-deb.
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    for d in ["/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin"] {
        let Ok(entries) = std::fs::read_dir(d) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            if name == "dpkg-deb" || bin.join(&name).exists() {
                continue;
            }
            std::os::unix::fs::symlink(entry.path(), bin.join(&name)).unwrap();
        }
    }
    let out = Command::new(&script)
        .args(["--bin", PLOYZ, "--out"])
        .arg(dir.path().join("out"))
        .env("PATH", &bin)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("dpkg-deb not found"),
        "without dpkg-deb: {}",
        stderr(&out)
    );
    assert!(
        !dir.path().join("out").exists()
            || std::fs::read_dir(dir.path().join("out"))
                .unwrap()
                .next()
                .is_none()
    );

    let out = Command::new(&script)
        .args(["--bin", PLOYZ, "--version", "v1"])
        .arg("--out")
        .arg(dir.path().join("out"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("'v1' is not a Debian version"),
        "{}",
        stderr(&out)
    );
}

/// `dpkg` acting on the scratch root `root` only: its database there, the maintainer scripts
/// run outside a chroot with `DPKG_ROOT` set (they honour it), dependencies not looked for.
fn dpkg(root: &Path, args: &[&str]) -> Output {
    let out = Command::new("dpkg")
        .arg(format!("--root={}", root.display()))
        .args([
            "--force-not-root",
            "--force-script-chrootless",
            "--force-depends",
        ])
        .args(args)
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdin(Stdio::null())
        .output()
        .expect("dpkg runs");
    assert!(
        out.status.success(),
        "dpkg {args:?} failed ({}):\n{}{}",
        out.status,
        stdout(&out),
        stderr(&out)
    );
    out
}

/// `Status Version` of the package in the scratch root's database.
fn status(root: &Path) -> String {
    let out = Command::new("dpkg-query")
        .arg(format!("--admindir={}/var/lib/dpkg", root.display()))
        .args(["-W", "-f", "${Status} ${Version}", "ployz"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    stdout(&out).trim().to_owned()
}

fn group_line(root: &Path) -> Option<String> {
    read(&root.join("etc/group"))
        .lines()
        .find(|l| l.starts_with("ployz:"))
        .map(str::to_owned)
}

/// What the maintainer scripts could touch on this machine's own root, to show they did not.
fn host_state() -> (bool, bool, bool, bool) {
    let group = Command::new("getent")
        .args(["group", "ployz"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    (
        group,
        Path::new("/var/lib/ployz").exists(),
        Path::new("/etc/ployz").exists(),
        std::fs::symlink_metadata("/etc/systemd/system/multi-user.target.wants/ployz.service")
            .is_ok(),
    )
}

#[test]
#[ignore = "needs root: dpkg installs into a scratch root (scripts/test.sh runs it)"]
fn the_maintainer_scripts_install_upgrade_remove_and_purge_in_a_scratch_root() {
    assert!(
        is_root(),
        "dpkg --root installs root-owned files: run this test as root"
    );
    let dir = temp_dir("ployz-package-dpkg-");
    let old = package(dir.path(), Some("0.1.0"));
    let new = package(dir.path(), Some("0.1.1"));

    let control = dir.path().join("control");
    ok(Command::new("dpkg-deb")
        .arg("-e")
        .arg(&old.deb)
        .arg(&control));
    for script in ["postinst", "prerm", "postrm"] {
        ok(Command::new("sh").arg("-n").arg(control.join(script)));
        if Path::new("/bin/dash").exists() {
            ok(Command::new("/bin/dash")
                .arg("-n")
                .arg(control.join(script)));
        }
    }

    // A root with an empty dpkg database and the files groupadd --prefix edits.
    let root = dir.path().join("root");
    for d in [
        "var/lib/dpkg/info",
        "var/lib/dpkg/updates",
        "var/lib/dpkg/triggers",
        "etc",
    ] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    for (f, text) in [
        ("var/lib/dpkg/status", ""),
        ("var/lib/dpkg/available", ""),
        ("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n"),
        ("etc/group", "root:x:0:\n"),
        ("etc/gshadow", "root:*::\n"),
    ] {
        std::fs::write(root.join(f), text).unwrap();
    }
    let host_before = host_state();
    let wants = root.join("etc/systemd/system/multi-user.target.wants/ployz.service");
    let state = root.join("var/lib/ployz");
    let conf = root.join("etc/ployz/daemon.toml");

    // A fresh install: the files, the group (a system one), the state dir 0700, the unit
    // enabled (no systemd runs for this root: the symlink alone).
    dpkg(&root, &["--install", old.deb.to_str().unwrap()]);
    assert_eq!(status(&root), "install ok installed 0.1.0");
    assert!(root.join("usr/bin/ployz").exists());
    assert!(root.join("lib/systemd/system/ployz.service").exists());
    let group = group_line(&root).expect("postinst created the group ployz");
    let gid: u32 = group.split(':').nth(2).unwrap().parse().unwrap();
    assert!(gid < 1000, "ployz's group is not a system group: {group}");
    let mode = std::fs::metadata(&state).unwrap().permissions().mode();
    assert_eq!(mode & 0o7777, 0o700, "/var/lib/ployz's mode");
    assert_eq!(
        std::fs::read_link(&wants).expect("the unit is enabled"),
        Path::new("/lib/systemd/system/ployz.service")
    );

    // An upgrade keeps a changed conffile, the state and the one group.
    let mut changed = read(&conf);
    changed.push_str("# changed here\n");
    std::fs::write(&conf, &changed).unwrap();
    std::fs::write(state.join("kept"), "state").unwrap();
    dpkg(&root, &["--install", new.deb.to_str().unwrap()]);
    assert_eq!(status(&root), "install ok installed 0.1.1");
    assert_eq!(
        read(&conf),
        changed,
        "the upgrade kept the changed conffile"
    );
    assert!(state.join("kept").exists());
    assert_eq!(group_line(&root), Some(group.clone()));
    assert!(
        std::fs::read_link(&wants).is_ok(),
        "the upgrade left the unit enabled"
    );

    // Remove: program and unit gone, the unit disabled; state, configuration and group kept.
    dpkg(&root, &["--remove", "ployz"]);
    assert_eq!(status(&root), "deinstall ok config-files 0.1.1");
    assert!(!root.join("usr/bin/ployz").exists());
    assert!(!root.join("lib/systemd/system/ployz.service").exists());
    assert!(std::fs::symlink_metadata(&wants).is_err(), "still enabled");
    assert_eq!(read(&conf), changed);
    assert!(state.join("kept").exists());
    assert_eq!(group_line(&root), Some(group));

    // Purge: the state, the configuration and the group go too.
    dpkg(&root, &["--purge", "ployz"]);
    assert!(
        !status(&root).starts_with("deinstall") && !status(&root).starts_with("install"),
        "after purge: {}",
        status(&root)
    );
    assert!(!state.exists(), "purge left /var/lib/ployz");
    assert!(!root.join("etc/ployz").exists(), "purge left /etc/ployz");
    assert_eq!(group_line(&root), None, "purge left the group");

    assert_eq!(
        host_state(),
        host_before,
        "the maintainer scripts touched this machine's own root"
    );
}
