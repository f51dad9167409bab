//! Mounts: `volumes:` (short `source:target[:options]` and long syntax) and `tmpfs:`.
//!
//! Sources follow Compose: in the short syntax a source starting with `/`, `.` or `~` is a path
//! and any other is a named volume, which must be declared at the top level; in the long syntax
//! `type: bind` takes a path and `type: volume` a name.
//!
//! - An absolute path names a path on the Machine and is bound as written (normalised).
//! - A path written from the project directory (`./data`, `../x`, `.`, or any relative source of
//!   a long-syntax bind) or from the home directory (`~`, `~/x`, with `HOME` from the loader's
//!   environment) names a path on the computer that deploys. It is resolved to a normalised
//!   absolute path and looked at now: a regular UTF-8 file of at most
//!   [`MAX_FILE_AS_CONFIG_BYTES`] mounted read-only becomes a [`SecretFile`] (named by the
//!   source as written, e.g. `./nginx.conf`, with the file's mode and owner), whose content is
//!   copied into the container at creation on whichever Machine runs it. It travels as a
//!   secret does (labels, previews and reports show its digest, never its content), since a
//!   file bound read-only is often a key or a password file. Anything else (a directory, a writable file, a
//!   missing path) stays a bind of the resolved path, and the Service gets one warning listing
//!   those paths: they must exist on every Machine it runs on. Ployz never creates a missing
//!   host path; with `bind.create_host_path: false` a missing one is an error now.
//! - An anonymous volume (`- /app/node_modules`, or `type: volume` without a source) is created
//!   by Docker with the container and removed with it (Ployz removes containers with their
//!   anonymous volumes), so every new container (each replica, each replacement) starts with a
//!   fresh one seeded from the image, as Compose does when it recreates a container. It is not a
//!   named volume: it does not tie the Service to a Machine.
//!
//! Binds of `/` or of the Docker socket are accepted with a warning, for the Deploy Preview.

use std::collections::BTreeSet;
use std::path::Path;

use std::os::unix::fs::MetadataExt;

use ployz_core::{Mount, SecretFile, SecretValue};

use crate::units::{parse_octal_mode, parse_size_bytes};

use super::keys::nested_keys;
use super::shapes::{boolean, expect_map, mode, size, text};
use super::{Node, ServiceCtx};

/// The largest read-only file bind carried as a [`SecretFile`] (512 KiB); a larger one stays a
/// bind. Its content travels in the deploy request, which may not exceed
/// [`ployz_core::api::MAX_BODY_BYTES`] for the whole project.
pub(crate) const MAX_FILE_AS_CONFIG_BYTES: u64 = (ployz_core::api::MAX_BODY_BYTES / 4) as u64;

/// The keys of a long-syntax volume.
/// The mounts of one service as its keys give them, settled by [`settle_mounts`].
#[derive(Default)]
pub(super) struct Mounts {
    /// Each mount with the key it came from, in file order.
    list: Vec<(String, Entry)>,
    /// Binds of paths resolved from the project or home directory, which must exist on every
    /// Machine the Service runs on; in file order, each once.
    local_binds: Vec<String>,
}

/// What one mount entry became.
enum Entry {
    Mount(Mount),
    /// A read-only file bind carried like a secret.
    File(SecretFile),
}

impl Entry {
    fn target(&self) -> &str {
        match self {
            Entry::Mount(m) => m.target(),
            Entry::File(f) => &f.target,
        }
    }
}

/// Mounts sorted by target, one per target: a second mount of a target is an error (a
/// read-only file carried as a config counts as a mount of its target). Binds of paths from the
/// project or home directory get one warning for the Service. Answers the mounts and the files
/// carried as configs.
pub(super) fn settle_mounts(
    ctx: &mut ServiceCtx<'_>,
    mounts: Mounts,
) -> (Vec<Mount>, Vec<SecretFile>) {
    let Mounts {
        mut list,
        local_binds,
    } = mounts;
    list.sort_by(|a, b| a.1.target().cmp(b.1.target()));
    for pair in list.windows(2) {
        if pair[0].1.target() == pair[1].1.target() {
            let target = pair[1].1.target().to_owned();
            ctx.err(
                &pair[1].0.clone(),
                Some(target),
                "two mounts share this target",
                Some("mount one volume, bind or tmpfs per container path"),
            );
        }
    }
    if !local_binds.is_empty() {
        let what = if local_binds.len() == 1 {
            "bind mount"
        } else {
            "bind mounts"
        };
        ctx.warn(
            "volumes",
            format!(
                "{what} {} must exist on every Machine the Service runs on",
                local_binds.join(", ")
            ),
        );
    }
    let mut out = (Vec::new(), Vec::new());
    for (_, e) in list {
        match e {
            Entry::Mount(m) => out.0.push(m),
            Entry::File(f) => out.1.push(f),
        }
    }
    out
}

/// `volumes:`: each entry with the key it came from; `used` gets the top-level volume keys.
pub(super) fn service_volumes(
    ctx: &mut ServiceCtx<'_>,
    n: &Node,
    mounts: &mut Mounts,
    used: &mut BTreeSet<String>,
) {
    let items = match n {
        Node::Null => return,
        Node::Seq(items) => items,
        other => {
            ctx.bad(
                "volumes",
                other,
                format!("expected a list, found {}", other.kind()),
            );
            return;
        }
    };
    for (i, item) in items.iter().enumerate() {
        let key = format!("volumes[{i}]");
        let mount = match item {
            Node::Map(_) => long_volume(ctx, &key, item, used),
            other => match ctx.get(&key, other, text) {
                Some(t) => short_volume(ctx, &key, &t, used),
                None => None,
            },
        };
        match mount {
            Some(Parsed::Mount(m)) => {
                if let Mount::Bind { source, .. } = &m {
                    warn_privileged_bind(ctx, &key, source);
                }
                mounts.list.push((key, Entry::Mount(m)));
            }
            Some(Parsed::Local(b)) => local_bind(ctx, key, b, mounts),
            None => {}
        }
    }
}

/// A mount target is an absolute path inside the container.
pub(super) fn check_target(ctx: &mut ServiceCtx<'_>, key: &str, target: &str) -> bool {
    if !target.starts_with('/') {
        ctx.err(
            key,
            Some(target.to_owned()),
            "the mount target must be an absolute path inside the container",
            Some("write it from the root, e.g. /data"),
        );
        return false;
    }
    true
}

/// One `volumes` entry, read.
enum Parsed {
    /// A mount as it is: a volume, an anonymous volume, a tmpfs or a bind of an absolute path.
    Mount(Mount),
    /// A bind of a path on the computer that deploys, settled by [`local_bind`].
    Local(LocalBind),
}

/// A bind whose source was written from the project or the home directory.
struct LocalBind {
    /// The source as written, normalised: `./conf/app.conf`, `../x`, `.`, `~/x`.
    written: String,
    /// The source resolved: absolute and normalised.
    path: String,
    target: String,
    read_only: bool,
    /// `bind.create_host_path` (Compose's default is true); false makes a missing path an error.
    create_host_path: bool,
    /// The key of the source, for messages: `volumes[0]` or `volumes[0].source`.
    source_key: String,
}

/// What a short-syntax mount source names.
enum Source {
    Path(BindSource),
    /// A top-level volume key.
    Volume(String),
}

/// Where a bind's path is.
enum BindSource {
    /// An absolute path on the Machine, normalised.
    Machine(String),
    /// A path on the computer that deploys: (as written, resolved), both normalised.
    Local(String, String),
}

/// A short-syntax source: a path when it starts with `/`, `.` or `~` (as in Compose), else the
/// name of a volume.
fn classify_short_source(ctx: &mut ServiceCtx<'_>, key: &str, source: &str) -> Option<Source> {
    if source.starts_with(['/', '.', '~']) {
        return path_source(ctx, key, source).map(Source::Path);
    }
    if source.contains('/') {
        ctx.err(
            key,
            Some(source.to_owned()),
            "a source that does not start with '.', '/' or '~' is a named volume, and a volume name has no '/'",
            Some(&format!(
                "for a path in the project directory, write ./{source}"
            )),
        );
        return None;
    }
    Some(Source::Volume(source.to_owned()))
}

/// A bind source: absolute, from the home directory (`~`), or from the project directory.
fn path_source(ctx: &mut ServiceCtx<'_>, key: &str, source: &str) -> Option<BindSource> {
    if source.starts_with('/') {
        return Some(BindSource::Machine(normalise_path(source)));
    }
    if let Some(rest) = source.strip_prefix('~') {
        return home_source(ctx, key, source, rest);
    }
    let dir = project_dir(ctx, key, source)?;
    Some(BindSource::Local(
        written_relative(source),
        resolve(&dir, source),
    ))
}

/// `~` or `~/rest`, against `HOME` from the loader's environment; `~user` is refused.
fn home_source(
    ctx: &mut ServiceCtx<'_>,
    key: &str,
    source: &str,
    rest: &str,
) -> Option<BindSource> {
    if !(rest.is_empty() || rest.starts_with('/')) {
        let user = rest.split('/').next().unwrap_or(rest);
        let after = rest.strip_prefix(user).unwrap_or("");
        ctx.err(
            key,
            Some(source.to_owned()),
            format!("'~{user}' names another user's home directory, which Ployz does not expand"),
            Some(&format!(
                "write the path in full, e.g. /home/{user}{after}, or ~/path for your own home directory"
            )),
        );
        return None;
    }
    let home = ctx.home.filter(|h| h.starts_with('/'));
    let Some(home) = home else {
        ctx.err(
            key,
            Some(source.to_owned()),
            "'~' stands for the home directory, and HOME is not set to an absolute path",
            Some("set HOME, or write the path in full"),
        );
        return None;
    };
    let parts = components(rest);
    let written = if parts.is_empty() {
        "~".to_owned()
    } else {
        format!("~/{}", parts.join("/"))
    };
    Some(BindSource::Local(written, resolve(home, rest)))
}

/// The project directory (the first Compose file's) as an absolute UTF-8 path.
fn project_dir(ctx: &mut ServiceCtx<'_>, key: &str, source: &str) -> Option<String> {
    let dir = std::path::absolute(ctx.dir)
        .ok()
        .and_then(|d| d.to_str().map(str::to_owned));
    if dir.is_none() {
        ctx.err(
            key,
            Some(source.to_owned()),
            format!(
                "the project directory {} cannot be made an absolute UTF-8 path to resolve this source against",
                ctx.dir.display()
            ),
            Some("run from a directory whose path is UTF-8, or write the path in full"),
        );
    }
    dir
}

/// The path components of `p` with `.` and empty ones dropped and `..` applied lexically (a
/// leading `..` is kept).
fn components(p: &str) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    for c in p.split('/') {
        match c {
            "" | "." => {}
            ".." if out.last().is_some_and(|l| *l != "..") => {
                out.pop();
            }
            c => out.push(c),
        }
    }
    out
}

/// A relative source as written, normalised: `./a/b`, `../x`, or `.`.
fn written_relative(source: &str) -> String {
    let parts = components(source);
    match parts.first() {
        None => ".".to_owned(),
        Some(&"..") => parts.join("/"),
        Some(_) => format!("./{}", parts.join("/")),
    }
}

/// `rel` resolved against the absolute `base`, lexically: absolute, no `.` or `..`, no trailing
/// `/` (`..` at the root stays at the root).
fn resolve(base: &str, rel: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    for c in base.split('/').chain(rel.split('/')) {
        match c {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            c => out.push(c),
        }
    }
    format!("/{}", out.join("/"))
}

/// A path without its trailing `/` (but `/` itself).
pub(super) fn normalise_path(p: &str) -> String {
    let trimmed = p.trim_end_matches('/');
    if trimmed.is_empty() {
        "/".to_owned()
    } else {
        trimmed.to_owned()
    }
}

/// Settles a bind of a path on the computer that deploys: a read-only regular UTF-8 file small
/// enough becomes a config; anything else stays a bind, listed for the Service's warning. With
/// `create_host_path: false`, a missing path is an error.
fn local_bind(ctx: &mut ServiceCtx<'_>, key: String, b: LocalBind, mounts: &mut Mounts) {
    let meta = std::fs::metadata(&b.path);
    if !b.create_host_path {
        if let Err(e) = &meta {
            if e.kind() == std::io::ErrorKind::NotFound {
                ctx.err(
                    &b.source_key,
                    Some(b.written.clone()),
                    format!(
                        "the bind source {} does not exist, and bind.create_host_path is false",
                        b.path
                    ),
                    Some("create it, or fix the path (a relative path starts from the project directory, the first -f file's)"),
                );
                return;
            }
        }
    }
    if b.read_only {
        if let Ok(m) = &meta {
            if m.is_file() && m.len() <= MAX_FILE_AS_CONFIG_BYTES {
                if let Some(content) = read_text(Path::new(&b.path)) {
                    mounts.list.push((
                        key,
                        // Copied with the file's permission bits and owner, as the bind
                        // would show it (an entrypoint script keeps its execute bit).
                        Entry::File(SecretFile::new(
                            b.written,
                            b.target,
                            SecretValue::new(content.into_bytes()),
                            Some(m.mode() & 0o7777),
                            Some(m.uid()),
                            Some(m.gid()),
                        )),
                    ));
                    return;
                }
            }
        }
    }
    warn_privileged_bind(ctx, &key, &b.path);
    if !mounts.local_binds.contains(&b.path) {
        mounts.local_binds.push(b.path.clone());
    }
    mounts.list.push((
        key,
        Entry::Mount(Mount::Bind {
            source: b.path,
            target: b.target,
            read_only: b.read_only,
        }),
    ));
}

/// A file's content when it is UTF-8 text (read at most [`MAX_FILE_AS_CONFIG_BYTES`] and one
/// more byte, in case it grew since it was looked at).
fn read_text(path: &Path) -> Option<String> {
    use std::io::Read;
    let file = std::fs::File::open(path).ok()?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE_AS_CONFIG_BYTES + 1)
        .read_to_end(&mut bytes)
        .ok()?;
    if bytes.len() as u64 > MAX_FILE_AS_CONFIG_BYTES {
        return None;
    }
    String::from_utf8(bytes).ok()
}

/// The Docker Volume name of a top-level volume key, recorded in `used`; an undeclared one is
/// an error.
fn named_volume(
    ctx: &mut ServiceCtx<'_>,
    key: &str,
    name: &str,
    used: &mut BTreeSet<String>,
) -> Option<String> {
    match ctx.volumes.get(name) {
        Some(decl) => {
            used.insert(name.to_owned());
            Some(decl.spec.name.clone())
        }
        None => {
            ctx.err(
                key,
                Some(name.to_owned()),
                format!("the named volume '{name}' is not declared in the top-level volumes:"),
                Some(&format!(
                    "add it at the top level: volumes: {{ {name}: {{}} }}"
                )),
            );
            None
        }
    }
}

/// A short-syntax volume: `source:target[:options]`, or a bare `target` (an anonymous volume,
/// also `target:ro`).
fn short_volume(
    ctx: &mut ServiceCtx<'_>,
    key: &str,
    t: &str,
    used: &mut BTreeSet<String>,
) -> Option<Parsed> {
    let (source, target, options) = short_volume_parts(ctx, key, t)?;
    if !check_target(ctx, key, target) {
        return None;
    }
    let (read_only, no_copy) = short_volume_options(ctx, key, t, options)?;
    let target = normalise_path(target);
    let Some(source) = source else {
        return Some(Parsed::Mount(Mount::Anonymous { target, read_only }));
    };
    if source.is_empty() {
        ctx.err(key, Some(t.to_owned()), "the volume source is empty", None);
        return None;
    }
    let source = classify_short_source(ctx, key, source)?;
    if no_copy && !matches!(source, Source::Volume(_)) {
        ctx.warn(
            key,
            "nocopy applies to volumes only and is ignored for a bind",
        );
    }
    match source {
        Source::Path(BindSource::Machine(source)) => Some(Parsed::Mount(Mount::Bind {
            source,
            target,
            read_only,
        })),
        Source::Path(BindSource::Local(written, path)) => Some(Parsed::Local(LocalBind {
            written,
            path,
            target,
            read_only,
            create_host_path: true,
            source_key: key.to_owned(),
        })),
        Source::Volume(name) => Some(Parsed::Mount(Mount::Volume {
            source: named_volume(ctx, key, &name, used)?,
            target,
            read_only,
            no_copy,
        })),
    }
}

/// Whether a short-syntax part is a list of options (`ro`, `rw`, `nocopy`), not a path.
fn is_option_list(part: &str) -> bool {
    !part.is_empty() && part.split(',').all(|o| matches!(o, "ro" | "rw" | "nocopy"))
}

/// Splits a short-syntax volume into source (none for an anonymous volume), target and options.
fn short_volume_parts<'t>(
    ctx: &mut ServiceCtx<'_>,
    key: &str,
    t: &'t str,
) -> Option<(Option<&'t str>, &'t str, &'t str)> {
    let parts: Vec<&str> = t.split(':').collect();
    match parts.as_slice() {
        [target] => Some((None, *target, "")),
        // `/app/node_modules:ro`: Docker and Compose refuse it, but it can only mean this.
        [target, o] if target.starts_with('/') && is_option_list(o) => Some((None, *target, *o)),
        [s, tg] => Some((Some(*s), *tg, "")),
        [s, tg, o] => Some((Some(*s), *tg, *o)),
        _ => {
            ctx.err(
                key,
                Some(t.to_owned()),
                "expected source:target[:options]",
                None,
            );
            None
        }
    }
}

/// A short-syntax volume's options: `(read_only, no_copy)`.
fn short_volume_options(
    ctx: &mut ServiceCtx<'_>,
    key: &str,
    t: &str,
    options: &str,
) -> Option<(bool, bool)> {
    let mut read_only = false;
    let mut no_copy = false;
    for opt in options.split(',').filter(|o| !o.is_empty()) {
        match opt {
            "ro" => read_only = true,
            "rw" => read_only = false,
            "nocopy" => no_copy = true,
            // macOS-only consistency hints: no effect on a Linux Machine.
            "cached" | "delegated" | "consistent" => {}
            "z" | "Z" | "shared" | "rshared" | "slave" | "rslave" | "private" | "rprivate" => ctx
                .warn(
                    key,
                    format!("the mount option '{opt}' is not supported and is ignored"),
                ),
            other => {
                ctx.err(
                    key,
                    Some(t.to_owned()),
                    format!("unknown mount option '{other}'"),
                    Some("use ro, rw or nocopy"),
                );
                return None;
            }
        }
    }
    Some((read_only, no_copy))
}

/// What every long-syntax mount has: its type, target, `read_only` and source.
struct LongMount {
    kind: String,
    /// Absolute and normalised.
    target: String,
    read_only: bool,
    source: Option<String>,
}

/// A long-syntax volume: `type: volume`, `bind` or `tmpfs`, each with its own options.
fn long_volume(
    ctx: &mut ServiceCtx<'_>,
    key: &str,
    n: &Node,
    used: &mut BTreeSet<String>,
) -> Option<Parsed> {
    nested_keys(ctx, "volumes[]", key, n);
    let m = long_mount(ctx, key, n)?;
    match m.kind.as_str() {
        "volume" => long_named_volume(ctx, key, n, m, used).map(Parsed::Mount),
        "bind" => long_bind(ctx, key, n, m),
        "tmpfs" => long_tmpfs(ctx, key, n, m).map(Parsed::Mount),
        other => {
            ctx.err(
                &format!("{key}.type"),
                Some(other.to_owned()),
                "unsupported mount type",
                Some("use volume, bind or tmpfs"),
            );
            None
        }
    }
}

/// Reads `type:` and `target:` (both required), `read_only:` and `source:`.
fn long_mount(ctx: &mut ServiceCtx<'_>, key: &str, n: &Node) -> Option<LongMount> {
    let kind = match n.get("type") {
        Some(t) => ctx.get(&format!("{key}.type"), t, text)?,
        None => {
            ctx.bad(key, n, "the long syntax needs type: volume, bind or tmpfs");
            return None;
        }
    };
    let target = match n.get("target") {
        Some(t) => ctx.get(&format!("{key}.target"), t, text)?,
        None => {
            ctx.bad(
                key,
                n,
                "a mount needs target: (the path inside the container)",
            );
            return None;
        }
    };
    if !check_target(ctx, &format!("{key}.target"), &target) {
        return None;
    }
    let read_only = match n.get("read_only") {
        Some(r) => ctx.get(&format!("{key}.read_only"), r, boolean)?,
        None => false,
    };
    let source = match n.get("source") {
        None | Some(Node::Null) => None,
        Some(s) => Some(ctx.get(&format!("{key}.source"), s, text)?),
    };
    Some(LongMount {
        kind,
        target: normalise_path(&target),
        read_only,
        source,
    })
}

/// `type: volume`: a named volume declared at the top level, with `volume.nocopy`; without a
/// source, an anonymous volume.
fn long_named_volume(
    ctx: &mut ServiceCtx<'_>,
    key: &str,
    n: &Node,
    m: LongMount,
    used: &mut BTreeSet<String>,
) -> Option<Mount> {
    let no_copy = volume_options(ctx, key, n)?;
    let Some(name) = m.source.filter(|s| !s.is_empty()) else {
        if no_copy {
            ctx.warn(
                &format!("{key}.volume.nocopy"),
                "is ignored for an anonymous volume, which Docker seeds from the image",
            );
        }
        return Some(Mount::Anonymous {
            target: m.target,
            read_only: m.read_only,
        });
    };
    if name.starts_with(['/', '.', '~']) || name.contains('/') {
        ctx.err(
            &format!("{key}.source"),
            Some(name),
            "a volume's source is a volume name, not a path",
            Some("use type: bind for a host path"),
        );
        return None;
    }
    Some(Mount::Volume {
        source: named_volume(ctx, &format!("{key}.source"), &name, used)?,
        target: m.target,
        read_only: m.read_only,
        no_copy,
    })
}

/// `volume:` options of a long-syntax volume: whether `nocopy` is set (`subpath` is ignored).
fn volume_options(ctx: &mut ServiceCtx<'_>, key: &str, n: &Node) -> Option<bool> {
    let mut no_copy = false;
    if let Some(v) = n.get("volume") {
        if expect_map(ctx, &format!("{key}.volume"), v).is_some() {
            nested_keys(ctx, "volumes[].volume", &format!("{key}.volume"), v);
            if let Some(nc) = v.get("nocopy") {
                no_copy = ctx.get(&format!("{key}.volume.nocopy"), nc, boolean)?;
            }
        }
    }
    Some(no_copy)
}

/// `type: bind`: an absolute path on the Machine, or a path from the home directory (`~`) or
/// the project directory (any other).
fn long_bind(ctx: &mut ServiceCtx<'_>, key: &str, n: &Node, m: LongMount) -> Option<Parsed> {
    let Some(source) = m.source.filter(|s| !s.is_empty()) else {
        ctx.err(
            key,
            None,
            "a bind needs source: (a path on the Machine, or one in the project directory)",
            None,
        );
        return None;
    };
    let create_host_path = bind_options(ctx, key, n);
    let source_key = format!("{key}.source");
    match path_source(ctx, &source_key, &source)? {
        BindSource::Machine(source) => Some(Parsed::Mount(Mount::Bind {
            source,
            target: m.target,
            read_only: m.read_only,
        })),
        BindSource::Local(written, path) => Some(Parsed::Local(LocalBind {
            written,
            path,
            target: m.target,
            read_only: m.read_only,
            create_host_path,
            source_key,
        })),
    }
}

/// `bind:` options of a long-syntax bind: `create_host_path` (answered; true when absent), the
/// others ignored with a warning each.
fn bind_options(ctx: &mut ServiceCtx<'_>, key: &str, n: &Node) -> bool {
    let Some(b) = n.get("bind") else {
        return true;
    };
    if expect_map(ctx, &format!("{key}.bind"), b).is_none() {
        return true;
    }
    nested_keys(ctx, "volumes[].bind", &format!("{key}.bind"), b);
    match b.get("create_host_path") {
        Some(c) => ctx
            .get(&format!("{key}.bind.create_host_path"), c, boolean)
            .unwrap_or(true),
        None => true,
    }
}

/// `type: tmpfs`, with `tmpfs.size` and `tmpfs.mode`; it has no source and is never read-only.
fn long_tmpfs(ctx: &mut ServiceCtx<'_>, key: &str, n: &Node, m: LongMount) -> Option<Mount> {
    if m.source.is_some() {
        ctx.warn(
            &format!("{key}.source"),
            "a tmpfs has no source; it is ignored",
        );
    }
    let mut size_bytes = None;
    let mut mode_bits = None;
    if let Some(t) = n.get("tmpfs") {
        if expect_map(ctx, &format!("{key}.tmpfs"), t).is_some() {
            nested_keys(ctx, "volumes[].tmpfs", &format!("{key}.tmpfs"), t);
            if let Some(s) = t.get("size") {
                size_bytes = Some(ctx.get(&format!("{key}.tmpfs.size"), s, size)?);
            }
            if let Some(md) = t.get("mode") {
                mode_bits = Some(ctx.get(&format!("{key}.tmpfs.mode"), md, mode)?);
            }
        }
    }
    if m.read_only {
        ctx.warn(
            &format!("{key}.read_only"),
            "a read-only tmpfs is not supported; it stays writable",
        );
    }
    Some(Mount::Tmpfs {
        target: m.target,
        size_bytes,
        mode: mode_bits,
    })
}

/// The service-level `tmpfs:` key: a path or a list of paths, each with optional
/// `:size=<bytes>,mode=<octal>`.
pub(super) fn tmpfs_key(ctx: &mut ServiceCtx<'_>, n: &Node, mounts: &mut Mounts) {
    let items: Vec<(String, &Node)> = match n {
        Node::Null => return,
        Node::Seq(items) => items
            .iter()
            .enumerate()
            .map(|(i, item)| (format!("tmpfs[{i}]"), item))
            .collect(),
        other => vec![("tmpfs".to_owned(), other)],
    };
    for (key, item) in items {
        let Some(t) = ctx.get(&key, item, text) else {
            continue;
        };
        let (target, opts) = t.split_once(':').unwrap_or((t.as_str(), ""));
        if !check_target(ctx, &key, target) {
            continue;
        }
        let mut size_bytes = None;
        let mut mode_bits = None;
        let mut ok = true;
        for opt in opts.split(',').filter(|o| !o.is_empty()) {
            match opt.split_once('=') {
                Some(("size", v)) => match parse_size_bytes(v) {
                    Ok(s) => size_bytes = Some(s),
                    Err(m) => {
                        ctx.err(&key, Some(t.clone()), m, None);
                        ok = false;
                    }
                },
                Some(("mode", v)) => match parse_octal_mode(v) {
                    Ok(m) => mode_bits = Some(m),
                    Err(m) => {
                        ctx.err(&key, Some(t.clone()), m, None);
                        ok = false;
                    }
                },
                _ => ctx.warn(
                    &key,
                    format!("the tmpfs option '{opt}' is not supported and is ignored"),
                ),
            }
        }
        if ok {
            mounts.list.push((
                key,
                Entry::Mount(Mount::Tmpfs {
                    target: normalise_path(target),
                    size_bytes,
                    mode: mode_bits,
                }),
            ));
        }
    }
}

/// A bind of `/` or of the Docker socket is worth a second look.
fn warn_privileged_bind(ctx: &mut ServiceCtx<'_>, key: &str, source: &str) {
    let what = match source {
        "/" => "the Machine's whole root filesystem",
        "/var/run/docker.sock" | "/run/docker.sock" => {
            "the Machine's Docker socket, which gives the container control of the Machine"
        }
        "/var/run" | "/run" | "/var/run/docker" | "/run/docker" => {
            "a directory holding the Machine's Docker socket, which gives the container control of the Machine"
        }
        _ => return,
    };
    ctx.warn(key, format!("binds '{source}', {what}"));
}

#[cfg(test)]
mod tests {
    use super::{resolve, written_relative};

    #[test]
    fn paths_resolve_lexically() {
        assert_eq!(resolve("/p/proj", "./a/./b/"), "/p/proj/a/b");
        assert_eq!(resolve("/p/proj", "../../../x"), "/x");
        assert_eq!(resolve("/p/proj", "."), "/p/proj");
        assert_eq!(resolve("/", ".."), "/");
        assert_eq!(written_relative("././a/../b"), "./b");
        assert_eq!(written_relative("../x/./y/"), "../x/y");
        assert_eq!(written_relative("a/../.."), "..");
        assert_eq!(written_relative("./"), ".");
        assert_eq!(written_relative("data/x"), "./data/x");
    }
}
