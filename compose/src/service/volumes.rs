//! Mounts: `volumes:` (short `source:target[:options]` and long syntax) and `tmpfs:`.
//!
//! A named volume must be declared at the top level; a bind source is an absolute path on the
//! Machine (a relative one would not exist on other Machines); anonymous volumes are refused.
//! Binds of `/` or of the Docker socket are accepted with a warning, for the Deploy Preview.

use std::collections::BTreeSet;

use ployz_core::Mount;

use crate::units::{parse_octal_mode, parse_size_bytes};

use super::keys::warn_unknown_keys;
use super::shapes::{boolean, expect_map, mode, size, text};
use super::{Node, ServiceCtx};

/// The keys of a long-syntax volume.
const LONG_VOLUME_KEYS: &[&str] = &[
    "type",
    "source",
    "target",
    "read_only",
    "volume",
    "bind",
    "tmpfs",
    "consistency",
];

/// Mounts sorted by target, one per target: a second mount of a target is an error.
pub(super) fn check_mounts(
    ctx: &mut ServiceCtx<'_>,
    mut mounts: Vec<(String, Mount)>,
) -> Vec<Mount> {
    mounts.sort_by(|a, b| a.1.target().cmp(b.1.target()));
    for pair in mounts.windows(2) {
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
    mounts.into_iter().map(|(_, m)| m).collect()
}

/// `volumes:`: each entry with the key it came from; `used` gets the top-level volume keys.
pub(super) fn service_volumes(
    ctx: &mut ServiceCtx<'_>,
    n: &Node,
    mounts: &mut Vec<(String, Mount)>,
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
        if let Some(m) = mount {
            if let Mount::Bind { source, .. } = &m {
                warn_privileged_bind(ctx, &key, source);
            }
            mounts.push((key, m));
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

/// What a mount source names.
enum Source {
    /// An absolute path on the Machine, normalised.
    Bind(String),
    /// A top-level volume key.
    Volume(String),
}

/// An absolute path is a bind, a plain name a volume; a relative path is an error.
fn classify_source(ctx: &mut ServiceCtx<'_>, key: &str, source: &str) -> Option<Source> {
    if source.starts_with('/') {
        return Some(Source::Bind(normalise_path(source)));
    }
    if source.starts_with('.') || source.starts_with('~') || source.contains('/') {
        ctx.err(
            key,
            Some(source.to_owned()),
            "a relative bind source is not supported: Service Containers run on other Machines, where this path does not exist",
            Some("ship files with configs: (file: or content:), or bind an absolute path that exists on every Machine"),
        );
        return None;
    }
    Some(Source::Volume(source.to_owned()))
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

/// A short-syntax volume: `source:target[:options]`.
fn short_volume(
    ctx: &mut ServiceCtx<'_>,
    key: &str,
    t: &str,
    used: &mut BTreeSet<String>,
) -> Option<Mount> {
    let (source, target, options) = short_volume_parts(ctx, key, t)?;
    if source.is_empty() {
        ctx.err(key, Some(t.to_owned()), "the volume source is empty", None);
        return None;
    }
    if !check_target(ctx, key, target) {
        return None;
    }
    let (read_only, no_copy) = short_volume_options(ctx, key, t, options)?;
    let target = normalise_path(target);
    match classify_source(ctx, key, source)? {
        Source::Bind(source) => {
            if no_copy {
                ctx.warn(
                    key,
                    "nocopy applies to volumes only and is ignored for a bind",
                );
            }
            Some(Mount::Bind {
                source,
                target,
                read_only,
            })
        }
        Source::Volume(name) => Some(Mount::Volume {
            source: named_volume(ctx, key, &name, used)?,
            target,
            read_only,
            no_copy,
        }),
    }
}

/// Splits a short-syntax volume into source, target and options; a bare target (an anonymous
/// volume) is an error.
fn short_volume_parts<'t>(
    ctx: &mut ServiceCtx<'_>,
    key: &str,
    t: &'t str,
) -> Option<(&'t str, &'t str, &'t str)> {
    let parts: Vec<&str> = t.split(':').collect();
    match parts.as_slice() {
        [target] => {
            ctx.err(
                key,
                Some(t.to_owned()),
                "anonymous volumes are not supported",
                Some(&format!(
                    "name the volume and declare it at the top level, e.g. data:{target}"
                )),
            );
            None
        }
        [s, tg] => Some((*s, *tg, "")),
        [s, tg, o] => Some((*s, *tg, *o)),
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
) -> Option<Mount> {
    warn_unknown_keys(ctx, key, n, LONG_VOLUME_KEYS);
    let m = long_mount(ctx, key, n)?;
    match m.kind.as_str() {
        "volume" => long_named_volume(ctx, key, n, m, used),
        "bind" => long_bind(ctx, key, n, m),
        "tmpfs" => long_tmpfs(ctx, key, n, m),
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

/// `type: volume`: a named volume declared at the top level, with `volume.nocopy`.
fn long_named_volume(
    ctx: &mut ServiceCtx<'_>,
    key: &str,
    n: &Node,
    m: LongMount,
    used: &mut BTreeSet<String>,
) -> Option<Mount> {
    let Some(name) = m.source.filter(|s| !s.is_empty()) else {
        ctx.err(
            key,
            None,
            "anonymous volumes are not supported",
            Some("give source: a named volume declared at the top level"),
        );
        return None;
    };
    let no_copy = volume_options(ctx, key, n)?;
    match classify_source(ctx, &format!("{key}.source"), &name)? {
        Source::Volume(name) => Some(Mount::Volume {
            source: named_volume(ctx, &format!("{key}.source"), &name, used)?,
            target: m.target,
            read_only: m.read_only,
            no_copy,
        }),
        Source::Bind(path) => {
            ctx.err(
                &format!("{key}.source"),
                Some(path),
                "a volume's source is a volume name, not a path",
                Some("use type: bind for a host path"),
            );
            None
        }
    }
}

/// `volume:` options of a long-syntax volume: whether `nocopy` is set (`subpath` is ignored).
fn volume_options(ctx: &mut ServiceCtx<'_>, key: &str, n: &Node) -> Option<bool> {
    let mut no_copy = false;
    if let Some(v) = n.get("volume") {
        if expect_map(ctx, &format!("{key}.volume"), v).is_some() {
            warn_unknown_keys(ctx, &format!("{key}.volume"), v, &["nocopy", "subpath"]);
            if let Some(nc) = v.get("nocopy") {
                no_copy = ctx.get(&format!("{key}.volume.nocopy"), nc, boolean)?;
            }
            if v.get("subpath").is_some() {
                ctx.warn(
                    &format!("{key}.volume.subpath"),
                    "is not supported yet and is ignored; the whole volume is mounted",
                );
            }
        }
    }
    Some(no_copy)
}

/// `type: bind`: an absolute path on the Machine.
fn long_bind(ctx: &mut ServiceCtx<'_>, key: &str, n: &Node, m: LongMount) -> Option<Mount> {
    let Some(source) = m.source.filter(|s| !s.is_empty()) else {
        ctx.err(
            key,
            None,
            "a bind needs source: (an absolute path on the Machine)",
            None,
        );
        return None;
    };
    bind_options(ctx, key, n);
    match classify_source(ctx, &format!("{key}.source"), &source)? {
        Source::Bind(source) => Some(Mount::Bind {
            source,
            target: m.target,
            read_only: m.read_only,
        }),
        Source::Volume(name) => {
            ctx.err(
                &format!("{key}.source"),
                Some(name),
                "a bind's source is an absolute path on the Machine",
                Some("use type: volume for a named volume"),
            );
            None
        }
    }
}

/// `bind:` options of a long-syntax bind: all ignored, with a warning each.
fn bind_options(ctx: &mut ServiceCtx<'_>, key: &str, n: &Node) {
    let Some(b) = n.get("bind") else {
        return;
    };
    if expect_map(ctx, &format!("{key}.bind"), b).is_none() {
        return;
    }
    warn_unknown_keys(
        ctx,
        &format!("{key}.bind"),
        b,
        &["propagation", "create_host_path", "selinux", "recursive"],
    );
    for opt in ["propagation", "selinux", "recursive"] {
        if b.get(opt).is_some() {
            ctx.warn(
                &format!("{key}.bind.{opt}"),
                "is not supported and is ignored",
            );
        }
    }
    if let Some(c) = b.get("create_host_path") {
        if ctx.get(&format!("{key}.bind.create_host_path"), c, boolean) == Some(false) {
            ctx.warn(
                &format!("{key}.bind.create_host_path"),
                "false is not supported and is ignored; a missing host path is created",
            );
        }
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
            warn_unknown_keys(ctx, &format!("{key}.tmpfs"), t, &["size", "mode"]);
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
pub(super) fn tmpfs_key(ctx: &mut ServiceCtx<'_>, n: &Node, mounts: &mut Vec<(String, Mount)>) {
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
            mounts.push((
                key,
                Mount::Tmpfs {
                    target: normalise_path(target),
                    size_bytes,
                    mode: mode_bits,
                },
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
