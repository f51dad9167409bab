//! The loader's mounts: bind sources written from the project or home directory, read-only files
//! carried as configs, the one warning per Service for binds that must exist on every Machine,
//! and anonymous volumes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ployz_compose::{load, ComposeError, ComposeErrors, ComposeInput, LoadedProject};
use std::os::unix::fs::{MetadataExt, PermissionsExt};

use ployz_core::{Mount, ServiceSpec};

/// A temporary tree: the project directory is `proj/` (holding `compose.yaml`), with `home/`
/// beside it for `HOME`.
struct Tree {
    dir: tempfile::TempDir,
}

impl Tree {
    fn new(compose: &str) -> Tree {
        let t = Tree {
            dir: tempfile::tempdir().unwrap(),
        };
        t.write("proj/compose.yaml", compose.as_bytes());
        t.mkdir("home");
        t
    }

    /// The tree's root as a string (absolute, as `tempdir` makes it).
    fn root(&self) -> String {
        self.dir.path().to_str().unwrap().to_owned()
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// The absolute path of `rel` as the loader writes it.
    fn abs(&self, rel: &str) -> String {
        format!("{}/{rel}", self.root())
    }

    fn write(&self, rel: &str, content: &[u8]) {
        let path = self.path(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, content).unwrap();
    }

    fn mkdir(&self, rel: &str) {
        std::fs::create_dir_all(self.path(rel)).unwrap();
    }

    fn input(&self, env: &[(&str, &str)]) -> ComposeInput {
        ComposeInput {
            files: vec![self.path("proj/compose.yaml")],
            profiles: vec![],
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
        }
    }

    /// Loads with `HOME` set to the tree's `home/`.
    fn load(&self) -> Result<LoadedProject, ComposeErrors> {
        let home = self.abs("home");
        load(&self.input(&[("HOME", &home)]))
    }

    fn ok(&self) -> LoadedProject {
        self.load()
            .unwrap_or_else(|e| panic!("expected the project to load:\n{e}"))
    }

    fn errors(&self) -> Vec<ComposeError> {
        match self.load() {
            Ok(p) => panic!("expected errors, loaded {p:#?}"),
            Err(e) => e.0,
        }
    }
}

fn web(p: &LoadedProject) -> &ServiceSpec {
    p.services
        .iter()
        .find(|s| s.name.as_str() == "web")
        .expect("a service named web")
}

fn bind(source: String, target: &str, read_only: bool) -> Mount {
    Mount::Bind {
        source,
        target: target.into(),
        read_only,
    }
}

/// An error's key, value, message and fix.
type ErrorParts<'a> = (Option<&'a str>, Option<&'a str>, &'a str, Option<&'a str>);

/// The warnings as (service, key, message).
fn warnings(p: &LoadedProject) -> Vec<(Option<&str>, &str, &str)> {
    p.warnings
        .iter()
        .map(|w| (w.service.as_deref(), w.key.as_str(), w.message.as_str()))
        .collect()
}

#[test]
fn relative_bind_sources_resolve_against_the_project_directory() {
    let t = Tree::new(
        r#"
services:
  web:
    image: nginx
    volumes:
      - ./data:/data
      - ../shared:/shared
      - .:/app
      - ././a/../b/:/b
      - type: bind
        source: data/sub
        target: /sub
      - type: bind
        source: ./data
        target: /again
"#,
    );
    t.mkdir("proj/data/sub");
    t.mkdir("proj/b");
    t.mkdir("shared");
    let p = t.ok();
    assert_eq!(
        web(&p).container.mounts,
        [
            bind(t.abs("proj/data"), "/again", false),
            bind(t.abs("proj"), "/app", false),
            bind(t.abs("proj/b"), "/b", false),
            bind(t.abs("proj/data"), "/data", false),
            bind(t.abs("shared"), "/shared", false),
            bind(t.abs("proj/data/sub"), "/sub", false),
        ]
    );
    assert!(web(&p).container.configs.is_empty());
    // One warning for the Service, each path once, in file order.
    assert_eq!(
        warnings(&p),
        [(
            Some("web"),
            "volumes",
            format!(
                "bind mounts {}, {}, {}, {}, {} must exist on every Machine the Service runs on",
                t.abs("proj/data"),
                t.abs("shared"),
                t.abs("proj"),
                t.abs("proj/b"),
                t.abs("proj/data/sub"),
            )
            .as_str()
        )]
    );
}

#[test]
fn a_relative_project_directory_is_made_absolute() {
    // The Compose file named by a relative path: the project directory is resolved against the
    // working directory, so the bind source is still absolute.
    let t = Tree::new("services:\n  web:\n    image: nginx\n    volumes: [\"./data:/data\"]\n");
    t.mkdir("proj/data");
    let cwd = std::env::current_dir().unwrap();
    let rel = pathdiff(&t.path("proj/compose.yaml"), &cwd);
    let p = load(&ComposeInput {
        files: vec![rel],
        profiles: vec![],
        env: BTreeMap::new(),
    })
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        web(&p).container.mounts,
        [bind(t.abs("proj/data"), "/data", false)]
    );
}

/// `path` relative to `base` (both absolute), with `..` as needed.
fn pathdiff(path: &Path, base: &Path) -> PathBuf {
    let p: Vec<_> = path.components().collect();
    let b: Vec<_> = base.components().collect();
    let common = p.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let mut out = PathBuf::new();
    for _ in common..b.len() {
        out.push("..");
    }
    for c in &p[common..] {
        out.push(c);
    }
    out
}

#[test]
fn home_sources_resolve_against_home_from_the_environment() {
    let t = Tree::new(
        r#"
services:
  web:
    image: nginx
    volumes:
      - ~/site:/site
      - type: bind
        source: "~"
        target: /home
      - ~/x/../y/:/y
"#,
    );
    t.mkdir("home/site");
    let p = t.ok();
    assert_eq!(
        web(&p).container.mounts,
        [
            bind(t.abs("home"), "/home", false),
            bind(t.abs("home/site"), "/site", false),
            bind(t.abs("home/y"), "/y", false),
        ]
    );
    assert_eq!(
        warnings(&p),
        [(
            Some("web"),
            "volumes",
            format!(
                "bind mounts {}, {}, {} must exist on every Machine the Service runs on",
                t.abs("home/site"),
                t.abs("home"),
                t.abs("home/y"),
            )
            .as_str()
        )]
    );
}

#[test]
fn home_comes_from_the_loader_environment_not_the_process() {
    let t = Tree::new("services:\n  web:\n    image: nginx\n    volumes: [\"~/site:/site\"]\n");
    // No HOME in the input, whatever the process has.
    let errs = match load(&t.input(&[])) {
        Ok(p) => panic!("expected an error, loaded {p:#?}"),
        Err(e) => e.0,
    };
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert_eq!(errs[0].service.as_deref(), Some("web"));
    assert_eq!(errs[0].key.as_deref(), Some("volumes[0]"));
    assert_eq!(errs[0].value.as_deref(), Some("~/site"));
    assert_eq!(
        errs[0].message,
        "'~' stands for the home directory, and HOME is not set to an absolute path"
    );
    assert_eq!(
        errs[0].fix.as_deref(),
        Some("set HOME, or write the path in full")
    );
    assert!(
        !errs[0].to_string().contains("relative"),
        "a home path is not called relative: {}",
        errs[0]
    );
}

#[test]
fn another_users_home_is_refused_with_the_fix() {
    let t = Tree::new(
        r#"
services:
  web:
    image: nginx
    volumes:
      - ~alice/site:/site
      - type: bind
        source: ~bob
        target: /bob
"#,
    );
    let errs = t.errors();
    let got: Vec<ErrorParts<'_>> = errs
        .iter()
        .map(|e| {
            (
                e.key.as_deref(),
                e.value.as_deref(),
                e.message.as_str(),
                e.fix.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (
                Some("volumes[0]"),
                Some("~alice/site"),
                "'~alice' names another user's home directory, which Ployz does not expand",
                Some("write the path in full, e.g. /home/alice/site, or ~/path for your own home directory"),
            ),
            (
                Some("volumes[1].source"),
                Some("~bob"),
                "'~bob' names another user's home directory, which Ployz does not expand",
                Some("write the path in full, e.g. /home/bob, or ~/path for your own home directory"),
            ),
        ]
    );
}

#[test]
fn a_bare_relative_short_source_is_a_volume_name_and_cannot_hold_a_slash() {
    // Compose reads a short-syntax source not starting with '.', '/' or '~' as a volume name.
    let t = Tree::new("services:\n  web:\n    image: nginx\n    volumes: [\"data/x:/x\"]\n");
    t.mkdir("proj/data/x");
    let errs = t.errors();
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert_eq!(errs[0].key.as_deref(), Some("volumes[0]"));
    assert_eq!(errs[0].value.as_deref(), Some("data/x"));
    assert_eq!(
        errs[0].message,
        "a source that does not start with '.', '/' or '~' is a named volume, and a volume name has no '/'"
    );
    assert_eq!(
        errs[0].fix.as_deref(),
        Some("for a path in the project directory, write ./data/x")
    );
}

/// A file carried into the container: name, target, content, mode, owner.
type CarriedFile<'a> = (&'a str, &'a str, &'a [u8], Option<u32>, Option<u32>);

#[test]
fn a_read_only_file_is_carried_like_a_secret_with_its_mode_and_owner() {
    let t = Tree::new(
        r#"
services:
  web:
    image: nginx
    entrypoint: /entrypoint.sh
    volumes:
      - ./conf/nginx.conf:/etc/nginx/nginx.conf:ro
      - type: bind
        source: ././conf/../conf/app.conf
        target: /etc/app.conf
        read_only: true
      - ~/motd:/etc/motd:ro
      - ./entrypoint.sh:/entrypoint.sh:ro
"#,
    );
    t.write("proj/conf/nginx.conf", b"worker_processes 1;\n");
    t.write("proj/conf/app.conf", b"key = value\n");
    t.write("home/motd", b"hello\n");
    t.write("proj/entrypoint.sh", b"#!/bin/sh\nexec nginx\n");
    let script = t.path("proj/entrypoint.sh");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o750)).unwrap();
    let p = t.ok();
    let w = web(&p);
    assert!(w.container.mounts.is_empty(), "{:#?}", w.container.mounts);
    assert!(w.container.configs.is_empty(), "{:#?}", w.container.configs);
    let owner = std::fs::metadata(&script).unwrap();
    let got: Vec<CarriedFile> = w
        .container
        .secrets
        .iter()
        .map(|s| {
            assert_eq!(s.gid, Some(owner.gid()), "{s:?}");
            (
                s.name.as_str(),
                s.target.as_str(),
                s.value.as_ref().expect("the value travels").as_bytes(),
                s.mode,
                s.uid,
            )
        })
        .collect();
    let mode_of = |rel: &str| Some(std::fs::metadata(t.path(rel)).unwrap().mode() & 0o7777);
    let uid = Some(owner.uid());
    assert_eq!(
        got,
        [
            (
                "./entrypoint.sh",
                "/entrypoint.sh",
                &b"#!/bin/sh\nexec nginx\n"[..],
                Some(0o750),
                uid
            ),
            (
                "./conf/app.conf",
                "/etc/app.conf",
                &b"key = value\n"[..],
                mode_of("proj/conf/app.conf"),
                uid
            ),
            (
                "~/motd",
                "/etc/motd",
                &b"hello\n"[..],
                mode_of("home/motd"),
                uid
            ),
            (
                "./conf/nginx.conf",
                "/etc/nginx/nginx.conf",
                &b"worker_processes 1;\n"[..],
                mode_of("proj/conf/nginx.conf"),
                uid
            ),
        ]
    );
    // What labels, previews and reports carry: a digest, never the file's content.
    let shown = format!("{:?}", w.without_secret_values());
    assert!(
        !shown.contains("worker_processes") && !shown.contains("key = value"),
        "{shown}"
    );
    assert!(p.warnings.is_empty(), "{:#?}", p.warnings);
}

#[test]
fn a_file_bind_that_is_not_copied_stays_a_bind_with_the_warning() {
    let t = Tree::new(
        r#"
services:
  web:
    image: nginx
    volumes:
      - ./conf:/conf:ro
      - ./state.db:/state.db
      - ./logo.png:/logo.png:ro
      - ./big.txt:/big.txt:ro
      - ./missing.conf:/missing.conf:ro
"#,
    );
    t.mkdir("proj/conf");
    t.write("proj/state.db", b"writable\n");
    t.write("proj/logo.png", &[0x89, b'P', b'N', b'G', 0xff, 0xfe]);
    t.write("proj/big.txt", "x".repeat(512 * 1024 + 1).as_bytes());
    let p = t.ok();
    assert_eq!(
        web(&p).container.mounts,
        [
            bind(t.abs("proj/big.txt"), "/big.txt", true),
            bind(t.abs("proj/conf"), "/conf", true),
            bind(t.abs("proj/logo.png"), "/logo.png", true),
            bind(t.abs("proj/missing.conf"), "/missing.conf", true),
            bind(t.abs("proj/state.db"), "/state.db", false),
        ]
    );
    assert!(web(&p).container.configs.is_empty());
    assert_eq!(
        warnings(&p),
        [(
            Some("web"),
            "volumes",
            format!(
                "bind mounts {}, {}, {}, {}, {} must exist on every Machine the Service runs on",
                t.abs("proj/conf"),
                t.abs("proj/state.db"),
                t.abs("proj/logo.png"),
                t.abs("proj/big.txt"),
                t.abs("proj/missing.conf"),
            )
            .as_str()
        )]
    );
}

#[test]
fn one_bind_gets_a_singular_warning_and_each_service_its_own() {
    let t = Tree::new(
        r#"
services:
  web:
    image: nginx
    volumes: ["./data:/data:ro"]
  api:
    image: api
    volumes: ["./data:/data", "./data:/again"]
"#,
    );
    t.mkdir("proj/data");
    let p = t.ok();
    let data = t.abs("proj/data");
    assert_eq!(
        warnings(&p),
        [
            (
                Some("web"),
                "volumes",
                format!("bind mount {data} must exist on every Machine the Service runs on")
                    .as_str()
            ),
            (
                Some("api"),
                "volumes",
                format!("bind mount {data} must exist on every Machine the Service runs on")
                    .as_str()
            ),
        ]
    );
}

#[test]
fn absolute_binds_are_kept_without_the_warning() {
    let t = Tree::new(
        "services:\n  web:\n    image: nginx\n    volumes: [\"/srv/www/:/www:ro\", \"/etc/hosts:/etc/extra-hosts:ro\"]\n",
    );
    let p = t.ok();
    assert_eq!(
        web(&p).container.mounts,
        [
            bind("/etc/hosts".into(), "/etc/extra-hosts", true),
            bind("/srv/www".into(), "/www", true),
        ]
    );
    assert!(web(&p).container.configs.is_empty());
    assert!(p.warnings.is_empty(), "{:#?}", p.warnings);
}

#[test]
fn a_missing_source_with_create_host_path_false_is_an_error() {
    let t = Tree::new(
        r#"
services:
  web:
    image: nginx
    volumes:
      - type: bind
        source: ./nope.conf
        target: /etc/nope.conf
        read_only: true
        bind: { create_host_path: false }
      - type: bind
        source: ./here
        target: /here
        bind: { create_host_path: false }
"#,
    );
    t.mkdir("proj/here");
    let errs = t.errors();
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert_eq!(errs[0].service.as_deref(), Some("web"));
    assert_eq!(errs[0].key.as_deref(), Some("volumes[0].source"));
    assert_eq!(errs[0].value.as_deref(), Some("./nope.conf"));
    assert_eq!(
        errs[0].message,
        format!(
            "the bind source {} does not exist, and bind.create_host_path is false",
            t.abs("proj/nope.conf")
        )
    );
    assert_eq!(
        errs[0].fix.as_deref(),
        Some("create it, or fix the path (a relative path starts from the project directory, the first -f file's)")
    );
}

#[test]
fn anonymous_volumes_in_short_and_long_syntax() {
    let t = Tree::new(
        r#"
services:
  web:
    image: node
    volumes:
      - /app/node_modules
      - /app/cache/:ro
      - type: volume
        target: /tmp/build
      - type: volume
        target: /seed
        read_only: true
"#,
    );
    let p = t.ok();
    let anon = |target: &str, read_only| Mount::Anonymous {
        target: target.into(),
        read_only,
    };
    assert_eq!(
        web(&p).container.mounts,
        [
            anon("/app/cache", true),
            anon("/app/node_modules", false),
            anon("/seed", true),
            anon("/tmp/build", false),
        ]
    );
    assert!(p.volumes.is_empty(), "no named volume: {:#?}", p.volumes);
    assert_eq!(web(&p).volume_names().count(), 0);
    assert!(p.warnings.is_empty(), "{:#?}", p.warnings);
}

#[test]
fn a_file_carried_like_a_secret_still_owns_its_target() {
    let t = Tree::new(
        r#"
services:
  web:
    image: nginx
    volumes:
      - ./a.conf:/etc/app.conf:ro
      - /srv/app.conf:/etc/app.conf
    configs:
      - { source: other, target: /etc/other.conf }
  api:
    image: api
    volumes: ["./a.conf:/etc/other.conf:ro"]
    configs:
      - { source: other, target: /etc/other.conf }
configs:
  other: { content: "x" }
"#,
    );
    t.write("proj/a.conf", b"a\n");
    let errs = t.errors();
    let got: Vec<(Option<&str>, Option<&str>, &str)> = errs
        .iter()
        .map(|e| (e.service.as_deref(), e.key.as_deref(), e.message.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            (
                Some("web"),
                Some("volumes[1]"),
                "two mounts share this target"
            ),
            (
                Some("api"),
                Some("secrets"),
                "the secret './a.conf' and the config 'other' share one target"
            ),
        ]
    );
}
