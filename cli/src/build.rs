//! Building a Service's image (`build:`) with the Docker where the CLI runs: its tag derived
//! from what goes into the build, so an unchanged build has the same tag (and a Deploy plans it
//! as up to date without building or sending anything), and the context sent to Docker as the
//! docker CLI sends it (`.dockerignore` applied).

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context as _};
use futures_util::StreamExt as _;
use ployz_compose::{BuildSpec, Dockerfile};

/// `.dockerignore`: patterns of paths (relative to the context, `/`-separated) left out of it,
/// in order, a later one winning; `!` brings a path back. `*` and `?` match within one part of
/// a path, `**` any number of parts; a pattern that matches a folder leaves out what is in it.
#[derive(Debug, Default, Clone)]
pub struct Ignore {
    patterns: Vec<(bool, Vec<String>)>,
}

impl Ignore {
    /// The `.dockerignore` of `context`, if any.
    pub fn of(context: &Path) -> anyhow::Result<Ignore> {
        match std::fs::read_to_string(context.join(".dockerignore")) {
            Ok(text) => Ok(Ignore::parse(&text)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Ignore::default()),
            Err(e) => Err(anyhow!(
                "cannot read {}: {e}",
                context.join(".dockerignore").display()
            )),
        }
    }

    pub fn parse(text: &str) -> Ignore {
        let patterns = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(|l| {
                let (negate, l) = match l.strip_prefix('!') {
                    Some(rest) => (true, rest.trim()),
                    None => (false, l),
                };
                let parts = l
                    .trim_start_matches("./")
                    .split('/')
                    .filter(|p| !p.is_empty() && *p != ".")
                    .map(str::to_owned)
                    .collect();
                (negate, parts)
            })
            .filter(|(_, parts): &(bool, Vec<String>)| !parts.is_empty())
            .collect();
        Ignore { patterns }
    }

    /// Whether `path` (relative, `/`-separated) is left out.
    pub fn ignored(&self, path: &str) -> bool {
        let parts: Vec<&str> = path.split('/').collect();
        let mut ignored = false;
        for (negate, pattern) in &self.patterns {
            // The path itself, or a folder it is in.
            let hit = (1..=parts.len()).any(|n| matches_parts(pattern, &parts[..n]));
            if hit {
                ignored = !negate;
            }
        }
        ignored
    }

    /// Whether any pattern brings paths back (then a left-out folder is still looked into).
    fn has_exceptions(&self) -> bool {
        self.patterns.iter().any(|(negate, _)| *negate)
    }
}

fn matches_parts(pattern: &[String], path: &[&str]) -> bool {
    match (pattern.first(), path.first()) {
        (None, None) => true,
        (None, Some(_)) => false,
        (Some(p), _) if p == "**" => {
            (0..=path.len()).any(|skip| matches_parts(&pattern[1..], &path[skip..]))
        }
        (Some(_), None) => false,
        (Some(p), Some(s)) => {
            glob(p.as_bytes(), s.as_bytes()) && matches_parts(&pattern[1..], &path[1..])
        }
    }
}

/// `*` (any run) and `?` (one character) within one part of a path; `\` escapes.
fn glob(p: &[u8], s: &[u8]) -> bool {
    match (p.first(), s.first()) {
        (None, None) => true,
        (Some(b'*'), _) => glob(&p[1..], s) || (!s.is_empty() && glob(p, &s[1..])),
        (Some(b'?'), Some(_)) => glob(&p[1..], &s[1..]),
        (Some(b'\\'), Some(c)) if p.len() > 1 && p[1] == *c => glob(&p[2..], &s[1..]),
        (Some(a), Some(b)) if a == b => glob(&p[1..], &s[1..]),
        _ => false,
    }
}

/// One path of the context, as it goes into the tag's digest and the archive.
struct ContextEntry {
    /// Relative, `/`-separated.
    name: String,
    path: PathBuf,
    kind: EntryKind,
}

enum EntryKind {
    Dir,
    File,
    Symlink(PathBuf),
}

/// The context's paths Docker is sent, sorted (folders before what is in them); `.git` is never
/// among them.
fn context_entries(context: &Path, ignore: &Ignore) -> anyhow::Result<Vec<ContextEntry>> {
    let mut out = Vec::new();
    walk(context, "", ignore, &mut out)?;
    Ok(out)
}

fn walk(
    dir: &Path,
    prefix: &str,
    ignore: &Ignore,
    out: &mut Vec<ContextEntry>,
) -> anyhow::Result<()> {
    let mut names: Vec<(String, PathBuf)> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read the build context folder {}", dir.display()))?
        .map(|e| {
            let e = e?;
            Ok((e.file_name().to_string_lossy().into_owned(), e.path()))
        })
        .collect::<std::io::Result<_>>()
        .with_context(|| format!("cannot read the build context folder {}", dir.display()))?;
    names.sort();
    for (name, path) in names {
        let rel = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}/{name}")
        };
        if rel == ".git" {
            continue;
        }
        let meta = std::fs::symlink_metadata(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let left_out = ignore.ignored(&rel);
        if meta.is_dir() {
            if !left_out {
                out.push(ContextEntry {
                    name: rel.clone(),
                    path: path.clone(),
                    kind: EntryKind::Dir,
                });
            }
            if !left_out || ignore.has_exceptions() {
                walk(&path, &rel, ignore, out)?;
            }
        } else if !left_out {
            let kind = if meta.file_type().is_symlink() {
                EntryKind::Symlink(std::fs::read_link(&path)?)
            } else if meta.is_file() {
                EntryKind::File
            } else {
                continue;
            };
            out.push(ContextEntry {
                name: rel,
                path,
                kind,
            });
        }
    }
    Ok(())
}

/// The Dockerfile's name inside the archive, and its text when it is not a file of the context
/// (inline, or a file outside the context, which the docker CLI also adds).
fn dockerfile_in_archive(build: &BuildSpec) -> anyhow::Result<(String, Option<Vec<u8>>)> {
    match &build.dockerfile {
        Dockerfile::Inline(text) => Ok((
            ".ployz.Dockerfile".to_owned(),
            Some(text.clone().into_bytes()),
        )),
        Dockerfile::File(path) => match path.strip_prefix(&build.context) {
            Ok(rel) => Ok((rel.to_string_lossy().replace('\\', "/"), None)),
            Err(_) => Ok((
                ".ployz.Dockerfile".to_owned(),
                Some(
                    std::fs::read(path)
                        .with_context(|| format!("cannot read {}", path.display()))?,
                ),
            )),
        },
    }
}

/// The tag a build gets: a digest of everything that goes into it (the context as Docker is
/// sent it, the Dockerfile, the arguments, the target, the labels); with git, prefixed by the
/// last commit that changed the context, and `-dirty` when it has changes not committed.
pub fn content_tag(build: &BuildSpec, args: &BTreeMap<String, String>) -> anyhow::Result<String> {
    let ignore = Ignore::of(&build.context)?;
    let mut hash = ring::digest::Context::new(&ring::digest::SHA256);
    let (name, text) = dockerfile_in_archive(build)?;
    hash.update(format!("dockerfile\0{name}\0").as_bytes());
    if let Some(text) = &text {
        hash.update(text);
    }
    for (k, v) in args {
        hash.update(format!("arg\0{k}\0{v}\0").as_bytes());
    }
    if let Some(t) = &build.target {
        hash.update(format!("target\0{t}\0").as_bytes());
    }
    for (k, v) in &build.labels {
        hash.update(format!("label\0{k}\0{v}\0").as_bytes());
    }
    let mut buf = vec![0u8; 64 * 1024];
    for e in context_entries(&build.context, &ignore)? {
        match &e.kind {
            EntryKind::Dir => hash.update(format!("dir\0{}\0", e.name).as_bytes()),
            EntryKind::Symlink(to) => {
                hash.update(format!("link\0{}\0{}\0", e.name, to.display()).as_bytes())
            }
            EntryKind::File => {
                use std::os::unix::fs::PermissionsExt as _;
                let mut f = std::fs::File::open(&e.path)
                    .with_context(|| format!("cannot read {}", e.path.display()))?;
                let mode = f.metadata()?.permissions().mode() & 0o7777;
                hash.update(format!("file\0{}\0{mode:o}\0", e.name).as_bytes());
                loop {
                    let n = std::io::Read::read(&mut f, &mut buf)?;
                    if n == 0 {
                        break;
                    }
                    hash.update(&buf[..n]);
                }
                hash.update(b"\0");
            }
        }
    }
    let digest = hex::encode(hash.finish());
    Ok(match git_commit(&build.context) {
        Some((commit, dirty)) => format!(
            "{commit}{}-{}",
            if dirty { "-dirty" } else { "" },
            &digest[..8]
        ),
        None => digest[..12].to_owned(),
    })
}

/// The last commit that changed the context (12 digits; a commit elsewhere in the repository
/// leaves a Service's tag alone), and whether the context has changes not committed; `None`
/// outside a git repository, or without git.
fn git_commit(context: &Path) -> Option<(String, bool)> {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(context)
        .args(["log", "-1", "--format=%h", "--abbrev=12", "--", "."])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let commit = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if commit.is_empty() {
        return None;
    }
    let status = std::process::Command::new("git")
        .arg("-C")
        .arg(context)
        .args(["status", "--porcelain", "--", "."])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    Some((commit, !status.stdout.is_empty()))
}

/// The context as a tar archive, in a temporary file: what `.dockerignore` leaves in, and the
/// Dockerfile where it is not already.
fn context_archive(build: &BuildSpec) -> anyhow::Result<(std::fs::File, String)> {
    let ignore = Ignore::of(&build.context)?;
    let (dockerfile, text) = dockerfile_in_archive(build)?;
    let file =
        tempfile::tempfile().context("cannot make a temporary file for the build context")?;
    let mut tar = tar::Builder::new(std::io::BufWriter::new(file));
    tar.follow_symlinks(false);
    for e in context_entries(&build.context, &ignore)? {
        tar.append_path_with_name(&e.path, &e.name)
            .with_context(|| format!("cannot add {} to the build context", e.path.display()))?;
    }
    if let Some(text) = text {
        let mut header = tar::Header::new_gnu();
        header.set_size(text.len() as u64);
        header.set_mode(0o644);
        header.set_entry_type(tar::EntryType::Regular);
        tar.append_data(&mut header, &dockerfile, text.as_slice())?;
    } else if ignore.ignored(&dockerfile) {
        // Docker needs the Dockerfile even when .dockerignore leaves it out.
        tar.append_path_with_name(build.context.join(&dockerfile), &dockerfile)?;
    }
    let mut writer = tar.into_inner()?;
    writer.flush()?;
    let mut file = writer.into_inner().map_err(|e| anyhow!("{e}"))?;
    std::io::Seek::rewind(&mut file)?;
    Ok((file, dockerfile))
}

/// Builds `build` with `docker` and tags it `reference`, each line of Docker's output handed to
/// `line`. A failed build is an error with its last lines.
pub async fn build_image(
    docker: &bollard::Docker,
    build: &BuildSpec,
    args: &BTreeMap<String, String>,
    reference: &str,
    no_cache: bool,
    mut line: impl FnMut(&str),
) -> anyhow::Result<()> {
    let (archive, dockerfile) = {
        let build = build.clone();
        tokio::task::spawn_blocking(move || context_archive(&build)).await??
    };
    let options = bollard::query_parameters::BuildImageOptions {
        dockerfile,
        t: Some(reference.to_owned()),
        nocache: no_cache || build.no_cache,
        pull: build.pull.then(|| "1".to_owned()),
        rm: true,
        forcerm: true,
        buildargs: Some(args.clone().into_iter().collect()),
        labels: Some(build.labels.clone().into_iter().collect()),
        target: build.target.clone().unwrap_or_default(),
        ..Default::default()
    };
    let body = tokio_util::io::ReaderStream::new(tokio::fs::File::from_std(archive));
    let mut output = docker.build_image(options, None, Some(bollard::body_try_stream(body)));
    let mut last: Vec<String> = Vec::new();
    while let Some(item) = output.next().await {
        match item {
            Ok(info) => {
                if let Some(text) = info.stream {
                    for l in text.lines().filter(|l| !l.trim().is_empty()) {
                        line(l);
                        last.push(l.to_owned());
                        if last.len() > 10 {
                            last.remove(0);
                        }
                    }
                }
                if let Some(e) = info.error_detail.and_then(|d| d.message) {
                    bail!("the build failed: {e}\n{}", last.join("\n"));
                }
            }
            Err(e) => bail!("the build failed: {e}\n{}", last.join("\n")),
        }
    }
    Ok(())
}

/// The repository of an image reference, without its tag or digest.
pub fn repository(image: &str) -> &str {
    let image = image.split('@').next().unwrap_or(image);
    let last_slash = image.rfind('/').map_or(0, |i| i + 1);
    match image[last_slash..].rfind(':') {
        Some(i) => &image[..last_slash + i],
        None => image,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dockerignore_leaves_out_and_brings_back_as_docker_does() {
        let i = Ignore::parse("# comment\nnode_modules\n*.log\n**/tmp\n!keep.log\n./build/\n");
        for out in [
            "node_modules",
            "node_modules/x/y.js",
            "a.log",
            "src/tmp",
            "tmp/x",
            "build/out",
        ] {
            assert!(i.ignored(out), "{out}");
        }
        for kept in [
            "keep.log",
            "src/a.log",
            "src/main.rs",
            "builder",
            "Dockerfile",
        ] {
            assert!(!i.ignored(kept), "{kept}");
        }
    }

    #[test]
    fn the_repository_of_a_reference_drops_tag_and_digest() {
        assert_eq!(repository("app"), "app");
        assert_eq!(repository("app:1"), "app");
        assert_eq!(repository("reg:5000/team/app:1"), "reg:5000/team/app");
        assert_eq!(repository("reg:5000/app"), "reg:5000/app");
        assert_eq!(repository("app@sha256:00"), "app");
    }

    fn spec(dir: &Path) -> BuildSpec {
        BuildSpec {
            context: dir.to_path_buf(),
            dockerfile: Dockerfile::File(dir.join("Dockerfile")),
            args: BTreeMap::new(),
            target: None,
            labels: BTreeMap::new(),
            no_cache: false,
            pull: false,
        }
    }

    #[test]
    fn the_tag_changes_with_what_goes_into_the_build_and_only_with_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("Dockerfile"), "FROM scratch\nCOPY a /a\n").unwrap();
        std::fs::write(dir.path().join("a"), "one").unwrap();
        std::fs::write(dir.path().join(".dockerignore"), "*.log\n").unwrap();
        let b = spec(dir.path());
        let none = BTreeMap::new();
        let first = content_tag(&b, &none).unwrap();
        assert_eq!(content_tag(&b, &none).unwrap(), first, "the same inputs");
        // A file .dockerignore leaves out changes nothing.
        std::fs::write(dir.path().join("debug.log"), "noise").unwrap();
        assert_eq!(content_tag(&b, &none).unwrap(), first);
        // A file of the context, an argument, a target: each changes it.
        std::fs::write(dir.path().join("a"), "two").unwrap();
        let second = content_tag(&b, &none).unwrap();
        assert_ne!(second, first);
        let args = BTreeMap::from([("V".to_owned(), "1".to_owned())]);
        assert_ne!(content_tag(&b, &args).unwrap(), second);
        let mut t = b.clone();
        t.target = Some("prod".into());
        assert_ne!(content_tag(&t, &none).unwrap(), second);
        // Outside git, twelve hexadecimal digits.
        assert!(
            second.len() == 12 && second.bytes().all(|c| c.is_ascii_hexdigit()),
            "{second}"
        );
    }

    #[test]
    fn in_git_the_tag_starts_with_the_commit_and_says_dirty() {
        let dir = tempfile::tempdir().unwrap();
        let git = |args: &[&str]| {
            let out = std::process::Command::new("git")
                .arg("-C")
                .arg(dir.path())
                .args(["-c", "user.email=t@example.invalid", "-c", "user.name=t"])
                .args(args)
                .output()
                .expect("git runs");
            assert!(
                out.status.success(),
                "git {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).trim().to_owned()
        };
        git(&["init", "-q"]);
        std::fs::write(dir.path().join("Dockerfile"), "FROM scratch\nCOPY a /a\n").unwrap();
        std::fs::write(dir.path().join("a"), "one").unwrap();
        git(&["add", "."]);
        git(&["commit", "-q", "-m", "first"]);
        let commit = git(&["rev-parse", "--short=12", "HEAD"]);
        let b = spec(dir.path());
        let clean = content_tag(&b, &BTreeMap::new()).unwrap();
        assert!(
            clean.starts_with(&format!("{commit}-")) && !clean.contains("dirty"),
            "{clean}"
        );
        std::fs::write(dir.path().join("a"), "two").unwrap();
        let dirty = content_tag(&b, &BTreeMap::new()).unwrap();
        assert!(dirty.starts_with(&format!("{commit}-dirty-")), "{dirty}");
        // Another uncommitted change is another tag: dirty is not one tag for every change.
        std::fs::write(dir.path().join("a"), "three").unwrap();
        assert_ne!(content_tag(&b, &BTreeMap::new()).unwrap(), dirty);
        // A commit elsewhere in the repository leaves the context's tag alone.
        std::fs::write(dir.path().join("a"), "one").unwrap();
        std::fs::create_dir(dir.path().join("ctx")).unwrap();
        std::fs::write(dir.path().join("ctx/Dockerfile"), "FROM scratch\n").unwrap();
        git(&["add", "."]);
        git(&["commit", "-q", "-m", "a context"]);
        let other = spec(&dir.path().join("ctx"));
        let before = content_tag(&other, &BTreeMap::new()).unwrap();
        std::fs::write(dir.path().join("elsewhere"), "x").unwrap();
        git(&["add", "elsewhere"]);
        git(&["commit", "-q", "-m", "elsewhere"]);
        assert_eq!(content_tag(&other, &BTreeMap::new()).unwrap(), before);
    }
}
