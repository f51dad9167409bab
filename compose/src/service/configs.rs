//! The service's `configs:` entries (long syntax only). The project resolves each against the
//! top-level `configs:` and turns it into a file in the container.

use super::keys::warn_unknown_keys;
use super::shapes::{mode, text, u32_of};
use super::volumes::{check_target, normalise_path};
use super::{ConfigUse, Node, ServiceCtx};

/// `configs:`: a list of `source:`/`target:` entries with optional `uid`, `gid` and `mode`.
pub(super) fn service_configs(ctx: &mut ServiceCtx<'_>, n: &Node) -> Vec<ConfigUse> {
    let items = match n {
        Node::Null => return Vec::new(),
        Node::Seq(items) => items,
        other => {
            ctx.bad(
                "configs",
                other,
                format!("expected a list, found {}", other.kind()),
            );
            return Vec::new();
        }
    };
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        if let Some(c) = config_use(ctx, format!("configs[{i}]"), item) {
            out.push(c);
        }
    }
    out
}

/// One `configs` entry; the target defaults to `/<source>`.
fn config_use(ctx: &mut ServiceCtx<'_>, key: String, item: &Node) -> Option<ConfigUse> {
    if !matches!(item, Node::Map(_)) {
        let name = item.short();
        ctx.err(
            &key,
            Some(name.clone()),
            "the configs short syntax is not supported",
            Some(&format!(
                "use the long syntax: - source: {name}, target: /path/in/container"
            )),
        );
        return None;
    }
    warn_unknown_keys(ctx, &key, item, &["source", "target", "uid", "gid", "mode"]);
    let Some(source) = item
        .get("source")
        .and_then(|s| ctx.get(&format!("{key}.source"), s, text))
    else {
        if item.get("source").is_none() {
            ctx.bad(
                &key,
                item,
                "a config needs source: (a name under the top-level configs:)",
            );
        }
        return None;
    };
    let target = match item.get("target") {
        None | Some(Node::Null) => format!("/{source}"),
        Some(t) => ctx.get(&format!("{key}.target"), t, text)?,
    };
    if !check_target(ctx, &format!("{key}.target"), &target) {
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
