//! The Ployz extensions of a service: `x-machines` (where it runs), `x-pre_deploy` (a hook
//! run before the Deploy changes the service) and `x-caddy` (refused: the edge routes from
//! `x-ports`, which is read with the other ports in [`super::ports`]).

use std::collections::BTreeMap;

use ployz_core::{MachineTarget, PreDeployHook};

use super::keys::nested_keys;
use super::shapes::{
    boolean, command, duration, expect_map, kv_entries, string_list, text, u32_of,
};
use super::{Node, ServiceCtx};

/// The default `x-pre_deploy.timeout`: 5 minutes.
const DEFAULT_HOOK_TIMEOUT_MS: u64 = 5 * 60 * 1000;

/// The key of the hook, and the prefix of its keys.
const HOOK: &str = "x-pre_deploy";

/// `x-machines:`: a list, or a comma-separated text, of Machine targets; sorted, unique.
pub(super) fn x_machines(ctx: &mut ServiceCtx<'_>, n: &Node) -> Vec<MachineTarget> {
    let texts: Vec<String> = match n {
        Node::Null => Vec::new(),
        Node::Seq(_) => match ctx.get("x-machines", n, string_list) {
            Some(l) => l,
            None => return Vec::new(),
        },
        other => match ctx.get("x-machines", other, text) {
            Some(t) => t.split(',').map(str::to_owned).collect(),
            None => return Vec::new(),
        },
    };
    let mut out: Vec<MachineTarget> = texts
        .iter()
        .map(|t| t.trim())
        .filter(|t| !t.is_empty())
        .filter_map(|t| t.parse().ok())
        .collect();
    out.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    out.dedup();
    out
}

/// The most Service Revisions `x-revisions` may keep.
pub const MAX_REVISIONS: u32 = ployz_core::api::MAX_KEPT_REVISIONS as u32;

/// `x-revisions:`: how many Service Revisions are kept, 1 to [`MAX_REVISIONS`].
pub(super) fn x_revisions(ctx: &mut ServiceCtx<'_>, n: &Node) -> Option<u32> {
    let kept = ctx.get("x-revisions", n, u32_of)?;
    if !(1..=MAX_REVISIONS).contains(&kept) {
        ctx.err(
            "x-revisions",
            Some(kept.to_string()),
            format!("x-revisions keeps 1 to {MAX_REVISIONS} Service Revisions"),
            Some("set a number from 1 to 100, or leave it out to keep 5"),
        );
        return None;
    }
    Some(kept)
}

/// `x-caddy:` is refused: Ployz's edge routes by hostname from `x-ports`.
pub(super) fn x_caddy(ctx: &mut ServiceCtx<'_>) {
    ctx.err(
        "x-caddy",
        None,
        "x-caddy is not supported: Ployz's edge routes by hostname from x-ports",
        Some("publish through the edge with x-ports, e.g. x-ports: [app.example.com:8080/https]; path routing, redirects and headers come as typed extensions"),
    );
}

/// `x-pre_deploy:`: a command (required), its environment, `privileged`, `user` and `timeout`.
pub(super) fn x_pre_deploy(ctx: &mut ServiceCtx<'_>, n: &Node) -> Option<PreDeployHook> {
    expect_map(ctx, HOOK, n)?;
    nested_keys(ctx, HOOK, HOOK, n);
    let command = hook_command(ctx, n)?;
    let env = hook_env(ctx, n)?;
    let privileged = match n.get("privileged") {
        None => false,
        Some(p) => ctx.get(&format!("{HOOK}.privileged"), p, boolean)?,
    };
    if privileged {
        ctx.warn(
            &format!("{HOOK}.privileged"),
            "the hook container runs privileged, with full control of its Machine",
        );
    }
    let user = match n.get("user") {
        None | Some(Node::Null) => None,
        Some(u) => Some(ctx.get(&format!("{HOOK}.user"), u, text)?),
    };
    let timeout_ms = hook_timeout(ctx, n)?;
    Some(PreDeployHook {
        command,
        env,
        privileged,
        user,
        timeout_ms,
    })
}

/// `x-pre_deploy.command`: required and not empty.
fn hook_command(ctx: &mut ServiceCtx<'_>, n: &Node) -> Option<Vec<String>> {
    let command = match n.get("command") {
        None | Some(Node::Null) => {
            ctx.err(
                HOOK,
                None,
                "x-pre_deploy needs command:",
                Some("add e.g. command: ./migrate up"),
            );
            return None;
        }
        Some(c) => ctx.get(&format!("{HOOK}.command"), c, command)?,
    };
    if command.is_empty() {
        ctx.err(
            &format!("{HOOK}.command"),
            None,
            "the hook command is empty",
            None,
        );
        return None;
    }
    Some(command)
}

/// `x-pre_deploy.environment`: a variable without a value takes the process environment's,
/// or is left out with a warning.
fn hook_env(ctx: &mut ServiceCtx<'_>, n: &Node) -> Option<BTreeMap<String, String>> {
    let Some(e) = n.get("environment") else {
        return Some(BTreeMap::new());
    };
    let entries = ctx.get(&format!("{HOOK}.environment"), e, kv_entries)?;
    let mut env = BTreeMap::new();
    for (k, v) in entries {
        match v.or_else(|| ctx.vars.get(&k).cloned()) {
            Some(v) => {
                env.insert(k, v);
            }
            None => ctx.warn(
                &format!("{HOOK}.environment.{k}"),
                format!("'{k}' has no value and is not set in the environment; it is left out"),
            ),
        }
    }
    Some(env)
}

/// `x-pre_deploy.timeout`: a duration longer than zero, 5 minutes by default.
fn hook_timeout(ctx: &mut ServiceCtx<'_>, n: &Node) -> Option<u64> {
    let timeout_ms = match n.get("timeout") {
        None | Some(Node::Null) => DEFAULT_HOOK_TIMEOUT_MS,
        Some(t) => ctx.get(&format!("{HOOK}.timeout"), t, duration)?,
    };
    if timeout_ms == 0 {
        ctx.err(
            &format!("{HOOK}.timeout"),
            Some("0".into()),
            "the hook timeout must be longer than zero",
            Some("leave it out for the default of 5m"),
        );
        return None;
    }
    Some(timeout_ms)
}
