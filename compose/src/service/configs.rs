//! The service's `configs:` entries, short (`- name`) and long syntax. The project resolves each
//! against the top-level `configs:` and turns it into a file in the container. The service's
//! `secrets:` entries share the reading here ([`file_uses`]); only their target rule differs.

use super::keys::nested_keys;
use super::shapes::{mode, text, u32_of};
use super::volumes::{check_target, normalise_path};
use super::{ConfigUse, Node, ServiceCtx};

/// Which service key a list of file uses comes from: it decides where a file lands when the
/// entry names no absolute target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FileKind {
    /// `configs`: the target defaults to `/<source>` and must be absolute.
    Config,
    /// `secrets`: the target defaults to `/run/secrets/<source>`; a relative target lands
    /// under `/run/secrets/`, as Compose does.
    Secret,
}

impl FileKind {
    fn key(self) -> &'static str {
        match self {
            FileKind::Config => "configs",
            FileKind::Secret => "secrets",
        }
    }

    /// The key table's parent of a long-syntax entry's keys.
    fn parent(self) -> &'static str {
        match self {
            FileKind::Config => "configs[]",
            FileKind::Secret => "secrets[]",
        }
    }

    /// What a use's source names, for messages.
    fn what(self) -> &'static str {
        match self {
            FileKind::Config => "a config",
            FileKind::Secret => "a secret",
        }
    }

    /// Where the file lands when the entry gives no target.
    fn default_target(self, source: &str) -> String {
        match self {
            FileKind::Config => format!("/{source}"),
            FileKind::Secret => format!("/run/secrets/{source}"),
        }
    }
}

/// `configs:`: a list of names (short syntax) or `source:`/`target:` entries with optional
/// `uid`, `gid` and `mode`.
pub(super) fn service_configs(ctx: &mut ServiceCtx<'_>, n: &Node) -> Vec<ConfigUse> {
    file_uses(ctx, n, FileKind::Config)
}

/// The entries of a service's `configs:` or `secrets:` list.
pub(super) fn file_uses(ctx: &mut ServiceCtx<'_>, n: &Node, kind: FileKind) -> Vec<ConfigUse> {
    let items = match n {
        Node::Null => return Vec::new(),
        Node::Seq(items) => items,
        other => {
            ctx.bad(
                kind.key(),
                other,
                format!("expected a list, found {}", other.kind()),
            );
            return Vec::new();
        }
    };
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let key = format!("{}[{i}]", kind.key());
        let used = match item {
            Node::Map(_) => long_use(ctx, key, item, kind),
            _ => short_use(ctx, key, item, kind),
        };
        if let Some(c) = used {
            out.push(c);
        }
    }
    out
}

/// A short-syntax entry: the name of a top-level declaration, mounted at its default target.
fn short_use(
    ctx: &mut ServiceCtx<'_>,
    key: String,
    item: &Node,
    kind: FileKind,
) -> Option<ConfigUse> {
    let source = ctx.get(&key, item, text)?;
    if source.is_empty() {
        ctx.bad(
            &key,
            item,
            format!(
                "{} needs a name (one under the top-level {}:)",
                kind.what(),
                kind.key()
            ),
        );
        return None;
    }
    let target = kind.default_target(&source);
    if !check_file_target(ctx, &key, &target, kind) {
        return None;
    }
    Some(ConfigUse {
        key,
        source,
        target: normalise_path(&target),
        mode: None,
        uid: None,
        gid: None,
    })
}

/// A long-syntax entry: `source`, `target`, `uid`, `gid`, `mode`.
fn long_use(
    ctx: &mut ServiceCtx<'_>,
    key: String,
    item: &Node,
    kind: FileKind,
) -> Option<ConfigUse> {
    nested_keys(ctx, kind.parent(), &key, item);
    let Some(source) = item
        .get("source")
        .and_then(|s| ctx.get(&format!("{key}.source"), s, text))
    else {
        if item.get("source").is_none() {
            ctx.bad(
                &key,
                item,
                format!(
                    "{} needs source: (a name under the top-level {}:)",
                    kind.what(),
                    kind.key()
                ),
            );
        }
        return None;
    };
    let target_key = format!("{key}.target");
    let target = match item.get("target") {
        None | Some(Node::Null) => kind.default_target(&source),
        Some(t) => {
            let written = ctx.get(&target_key, t, text)?;
            match kind {
                FileKind::Secret if !written.starts_with('/') => {
                    format!("/run/secrets/{written}")
                }
                _ => written,
            }
        }
    };
    if !check_file_target(ctx, &target_key, &target, kind) {
        return None;
    }
    let id = |ctx: &mut ServiceCtx<'_>, k: &str| {
        item.get(k)
            .filter(|v| !matches!(v, Node::Null))
            .and_then(|v| ctx.get(&format!("{key}.{k}"), v, u32_of))
    };
    let uid = id(ctx, "uid");
    let gid = id(ctx, "gid");
    let mode_bits = item
        .get("mode")
        .filter(|v| !matches!(v, Node::Null))
        .and_then(|m| ctx.get(&format!("{key}.mode"), m, mode));
    Some(ConfigUse {
        key,
        source,
        target: normalise_path(&target),
        mode: mode_bits,
        uid,
        gid,
    })
}

/// A config target must be absolute; a secret's (made absolute under `/run/secrets/`) must not
/// climb out of where it was put with `..`.
fn check_file_target(ctx: &mut ServiceCtx<'_>, key: &str, target: &str, kind: FileKind) -> bool {
    if !check_target(ctx, key, target) {
        return false;
    }
    if kind == FileKind::Secret && target.split('/').any(|part| part == "..") {
        ctx.err(
            key,
            Some(target.to_owned()),
            "a secret target must not contain '..'",
            Some(
                "name the file directly, e.g. target: db_password or target: /etc/app/db_password",
            ),
        );
        return false;
    }
    true
}
