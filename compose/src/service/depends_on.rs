//! `depends_on:` (list or mapping form), read by the project, which knows every service.

use super::keys::nested_keys;
use super::shapes::{boolean, text};
use super::{Dep, Node, ServiceCtx};

/// Reads `depends_on` (list or mapping form). Order only; conditions other than
/// `service_completed_successfully` (a warning) change nothing.
pub(crate) fn depends_on(ctx: &mut ServiceCtx<'_>, n: &Node) -> Vec<Dep> {
    let mut out = Vec::new();
    match n {
        Node::Null => {}
        Node::Seq(items) => {
            for (i, item) in items.iter().enumerate() {
                let key = format!("depends_on[{i}]");
                if let Some(name) = ctx.get(&key, item, text) {
                    out.push(Dep {
                        name,
                        required: true,
                        key,
                    });
                }
            }
        }
        Node::Map(entries) => {
            for (name, v) in entries {
                let key = format!("depends_on.{name}");
                let required = dependency_options(ctx, &key, name, v);
                out.push(Dep {
                    name: name.clone(),
                    required,
                    key,
                });
            }
        }
        other => ctx.bad(
            "depends_on",
            other,
            format!(
                "expected a list or a mapping of services, found {}",
                other.kind()
            ),
        ),
    }
    out
}

/// The options of a mapping-form dependency (`condition`, `required`, `restart`); returns
/// whether it is required (the default).
fn dependency_options(ctx: &mut ServiceCtx<'_>, key: &str, name: &str, v: &Node) -> bool {
    if !matches!(v, Node::Map(_)) {
        if !matches!(v, Node::Null) {
            ctx.bad(
                key,
                v,
                format!(
                    "expected a mapping (condition:, required:), found {}",
                    v.kind()
                ),
            );
        }
        return true;
    }
    nested_keys(ctx, "depends_on.*", key, v);
    if let Some(c) = v.get("condition") {
        condition(ctx, key, name, c);
    }
    let mut required = true;
    if let Some(r) = v.get("required") {
        required = ctx
            .get(&format!("{key}.required"), r, boolean)
            .unwrap_or(true);
    }
    required
}

/// `condition:`: every known condition only orders the Deploy.
fn condition(ctx: &mut ServiceCtx<'_>, key: &str, name: &str, c: &Node) {
    let Some(c) = ctx.get(&format!("{key}.condition"), c, text) else {
        return;
    };
    match c.as_str() {
        "service_started" | "service_healthy" => {}
        "service_completed_successfully" => ctx.warn(
            &format!("{key}.condition"),
            format!(
                "service_completed_successfully only orders the deploy; to run '{name}' to completion before this service, make it an x-pre_deploy hook"
            ),
        ),
        _ => ctx.err(
            &format!("{key}.condition"),
            Some(c),
            "unknown condition",
            Some("use service_started, service_healthy or service_completed_successfully"),
        ),
    }
}
