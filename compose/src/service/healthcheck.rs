//! `healthcheck:`: a test with its timings, `disable: true` or `test: ["NONE"]`, or nothing
//! (the image's own probe).

use ployz_core::{ConfiguredHealthcheck, Healthcheck};

use super::keys::nested_keys;
use super::shapes::{boolean, duration, expect_map, string_list, u32_of};
use super::{Node, ServiceCtx};

/// Reads `healthcheck:`. `None` keeps the image's probe (or follows an error).
pub(super) fn healthcheck(ctx: &mut ServiceCtx<'_>, n: &Node) -> Option<Healthcheck> {
    let entries = expect_map(ctx, "healthcheck", n)?;
    if entries.is_empty() {
        return None;
    }
    nested_keys(ctx, "healthcheck", "healthcheck", n);
    let disable = match n.get("disable") {
        Some(d) => ctx.get("healthcheck.disable", d, boolean).unwrap_or(false),
        None => false,
    };
    let test = test(ctx, n)?;
    let test_is_none = test
        .as_ref()
        .is_some_and(|t| t.first().map(String::as_str) == Some("NONE"));
    if disable {
        if test.is_some() && !test_is_none {
            ctx.err(
                "healthcheck.disable",
                Some("true".into()),
                "disable: true and a test cannot be combined",
                Some("remove one of them"),
            );
        }
        return Some(Healthcheck::Disabled);
    }
    if test_is_none {
        return Some(Healthcheck::Disabled);
    }
    let Some(test) = test else {
        let timings = entries.iter().any(|(k, _)| k != "disable");
        if timings {
            ctx.warn(
                "healthcheck",
                "a healthcheck without test keeps the image's probe; the timings given here are ignored (add test: to set them)",
            );
        }
        return None;
    };
    configured(ctx, n, test)
}

/// `test:` as a list (a string is a `CMD-SHELL` command). The outer `None` is an error that
/// ends the healthcheck; the inner one, no test given.
fn test(ctx: &mut ServiceCtx<'_>, n: &Node) -> Option<Option<Vec<String>>> {
    match n.get("test") {
        None | Some(Node::Null) => Some(None),
        Some(Node::Str(s)) => Some(Some(vec!["CMD-SHELL".to_owned(), s.clone()])),
        Some(t @ Node::Seq(_)) => Some(ctx.get("healthcheck.test", t, string_list)),
        Some(other) => {
            ctx.bad(
                "healthcheck.test",
                other,
                format!(
                    "expected a command as text or a list, found {}",
                    other.kind()
                ),
            );
            None
        }
    }
}

/// A healthcheck with a `CMD`/`CMD-SHELL` test, and its timings.
fn configured(ctx: &mut ServiceCtx<'_>, n: &Node, test: Vec<String>) -> Option<Healthcheck> {
    if let Some(first) = test.first() {
        if !matches!(first.as_str(), "CMD" | "CMD-SHELL") {
            ctx.err(
                "healthcheck.test",
                Some(format!("{test:?}")),
                "a test list starts with CMD, CMD-SHELL or NONE",
                Some(r#"write e.g. ["CMD", "curl", "-f", "http://localhost/"] or a plain string for a shell command"#),
            );
            return None;
        }
    }
    let mut hc = match ConfiguredHealthcheck::new(test) {
        Ok(hc) => hc,
        Err(e) => {
            ctx.err("healthcheck.test", None, e.to_string(), None);
            return None;
        }
    };
    let dur = |ctx: &mut ServiceCtx<'_>, key: &str| {
        n.get(key)
            .filter(|v| !matches!(v, Node::Null))
            .and_then(|v| ctx.get(&format!("healthcheck.{key}"), v, duration))
    };
    hc.interval_ms = dur(ctx, "interval");
    hc.timeout_ms = dur(ctx, "timeout");
    hc.start_period_ms = dur(ctx, "start_period");
    hc.start_interval_ms = dur(ctx, "start_interval");
    hc.retries = n
        .get("retries")
        .filter(|v| !matches!(v, Node::Null))
        .and_then(|v| ctx.get("healthcheck.retries", v, u32_of));
    Some(Healthcheck::Configured(hc))
}
