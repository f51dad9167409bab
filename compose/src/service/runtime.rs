//! How the container runs on its Machine: `user`, `init`, `privileged`, `cap_add`, `cap_drop`,
//! `sysctls`, `ulimits`, `shm_size`, `stop_grace_period`, `devices`, `logging`, `networks` and
//! `restart`.
//!
//! Settings that give a container power over its Machine (`privileged`, added capabilities,
//! devices) are accepted with a warning, for the Deploy Preview.

use std::collections::BTreeMap;

use ployz_core::{ContainerSpec, Logging, Ulimit};

use super::keys::nested_keys;
use super::shapes::{
    boolean, duration, expect_map, int, size, sorted_unique, string_list, string_map, text,
};
use super::{Node, ServiceCtx};

/// Reads one of the keys above into the container's settings.
pub(super) fn read(ctx: &mut ServiceCtx<'_>, c: &mut ContainerSpec, k: &str, value: &Node) {
    match k {
        "user" if !matches!(value, Node::Null) => c.user = ctx.get(k, value, text),
        "init" => c.init = ctx.get(k, value, boolean),
        "privileged" => {
            c.privileged = ctx.get(k, value, boolean).unwrap_or(false);
            if c.privileged {
                ctx.warn(
                    k,
                    "privileged: true gives the container full control of its Machine (all devices and capabilities)",
                );
            }
        }
        "cap_add" => {
            if let Some(caps) = ctx.get(k, value, string_list) {
                c.cap_add = sorted_unique(caps);
                if !c.cap_add.is_empty() {
                    ctx.warn(
                        k,
                        format!(
                            "adds Linux capabilities to the container: {}",
                            c.cap_add.join(", ")
                        ),
                    );
                }
            }
        }
        "cap_drop" => {
            if let Some(caps) = ctx.get(k, value, string_list) {
                c.cap_drop = sorted_unique(caps);
            }
        }
        "sysctls" => {
            if let Some(m) = ctx.get(k, value, string_map) {
                c.sysctls = m;
            }
        }
        "ulimits" => c.ulimits = ulimits(ctx, value),
        "shm_size" => c.shm_size_bytes = ctx.get(k, value, size),
        "stop_grace_period" => c.stop_grace_period_ms = ctx.get(k, value, duration),
        "devices" => devices(ctx, value),
        "logging" => c.logging = logging(ctx, value),
        "networks" => networks(ctx, value),
        "restart" => restart(ctx, value),
        _ => {}
    }
}

/// `restart:`: Ployz restarts every Service Container unless it is stopped. `unless-stopped`
/// and `always` say just that; any other value (`no`, `on-failure[:N]`, or one Docker does not
/// know) is a warning naming it and saying what Ployz does.
fn restart(ctx: &mut ServiceCtx<'_>, value: &Node) {
    if matches!(value, Node::Null) {
        return;
    }
    let policy = value.scalar_text().unwrap_or_else(|| value.short());
    let on_failure = policy.strip_prefix("on-failure").is_some_and(|rest| {
        rest.is_empty()
            || rest
                .strip_prefix(':')
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    });
    let message = match policy.as_str() {
        "unless-stopped" | "always" => return,
        "no" => "restart 'no' is not what Ployz does: it restarts containers unless they are stopped (restart policy unless-stopped)".to_owned(),
        _ if on_failure => format!(
            "restart '{policy}' is not what Ployz does: it restarts containers unless they are stopped, whatever their exit code (restart policy unless-stopped)"
        ),
        _ => format!(
            "restart '{policy}' is not a restart policy (no, always, on-failure[:N], unless-stopped) and is ignored: Ployz restarts containers unless they are stopped (restart policy unless-stopped)"
        ),
    };
    ctx.warn("restart", message);
}

/// `devices:` are not supported yet: a warning that names them.
fn devices(ctx: &mut ServiceCtx<'_>, value: &Node) {
    let list = ctx.get("devices", value, |n| match n {
        Node::Seq(items) => Ok(items.iter().map(|i| i.short()).collect::<Vec<_>>()),
        other => Err(format!("expected a list, found {}", other.kind())),
    });
    if let Some(list) = list.filter(|l| !l.is_empty()) {
        ctx.warn(
            "devices",
            format!(
                "devices are not supported yet and are ignored; they would give the container access to the Machine's devices: {}",
                list.join(", ")
            ),
        );
    }
}

/// `ulimits:`: a number (soft and hard alike) or `soft:` and `hard:` per limit.
fn ulimits(ctx: &mut ServiceCtx<'_>, n: &Node) -> BTreeMap<String, Ulimit> {
    let mut out = BTreeMap::new();
    let Some(entries) = expect_map(ctx, "ulimits", n) else {
        return out;
    };
    for (name, v) in entries {
        let key = format!("ulimits.{name}");
        let limit = match v {
            Node::Map(_) => {
                let soft = v
                    .get("soft")
                    .and_then(|s| ctx.get(&format!("{key}.soft"), s, int));
                let hard = v
                    .get("hard")
                    .and_then(|h| ctx.get(&format!("{key}.hard"), h, int));
                match (soft, hard) {
                    (Some(soft), Some(hard)) => Ulimit { soft, hard },
                    _ => {
                        if v.get("soft").is_none() || v.get("hard").is_none() {
                            ctx.bad(&key, v, "a ulimit mapping needs both soft: and hard:");
                        }
                        continue;
                    }
                }
            }
            other => match ctx.get(&key, other, int) {
                Some(l) => Ulimit { soft: l, hard: l },
                None => continue,
            },
        };
        if limit.hard >= 0 && (limit.soft > limit.hard || limit.soft < 0) {
            ctx.err(
                &key,
                Some(format!("soft {} hard {}", limit.soft, limit.hard)),
                "the soft limit is above the hard limit",
                Some("make soft at most hard"),
            );
            continue;
        }
        out.insert(name.clone(), limit);
    }
    out
}

/// `logging:`: a driver and its options; options without a driver are ignored.
fn logging(ctx: &mut ServiceCtx<'_>, n: &Node) -> Option<Logging> {
    expect_map(ctx, "logging", n)?;
    nested_keys(ctx, "logging", "logging", n);
    let options = match n.get("options") {
        Some(o) => ctx
            .get("logging.options", o, string_map)
            .unwrap_or_default(),
        None => BTreeMap::new(),
    };
    let driver = match n.get("driver") {
        None | Some(Node::Null) => None,
        Some(d) => ctx.get("logging.driver", d, text),
    };
    match driver {
        Some(driver) if !driver.is_empty() => Some(Logging { driver, options }),
        _ => {
            if !options.is_empty() {
                ctx.warn(
                    "logging.options",
                    "options without a driver are ignored; name the driver, e.g. driver: local",
                );
            }
            None
        }
    }
}

/// `networks:`: every Service Container joins the Ployz network; others are ignored.
fn networks(ctx: &mut ServiceCtx<'_>, n: &Node) {
    let names: Vec<String> = match n {
        Node::Null => Vec::new(),
        Node::Seq(_) => ctx.get("networks", n, string_list).unwrap_or_default(),
        Node::Map(entries) => entries.iter().map(|(k, _)| k.clone()).collect(),
        other => {
            ctx.bad(
                "networks",
                other,
                format!("expected a list or a mapping, found {}", other.kind()),
            );
            Vec::new()
        }
    };
    let others: Vec<String> = names.into_iter().filter(|n| n != "default").collect();
    if !others.is_empty() {
        ctx.warn(
            "networks",
            format!(
                "networks other than default are not supported and are ignored ({}); every Service Container joins the Ployz network",
                others.join(", ")
            ),
        );
    }
}
