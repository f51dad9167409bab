//! How many containers run, with what resources, replaced in what order: `deploy:` (mode,
//! replicas, resources, update order; the rest is ignored with a warning) with the top-level
//! `scale`, `cpus`, `mem_limit` and `mem_reservation`.

use ployz_core::{Resources, ServiceMode, UpdateConfig, UpdateOrder};

use super::keys::nested_keys;
use super::shapes::{cpus, duration, expect_map, size, text, u32_of};
use super::{Node, Parts, ServiceCtx};

/// What `deploy:` says besides resources.
#[derive(Default)]
pub(super) struct DeployParts {
    pub(super) mode: ServiceMode,
    pub(super) replicas: Option<u32>,
    pub(super) update: UpdateConfig,
}

/// Reads one of `cpus`, `mem_limit`, `mem_reservation`, `scale` or `deploy`.
pub(super) fn read(ctx: &mut ServiceCtx<'_>, p: &mut Parts<'_>, k: &str, value: &Node) {
    match k {
        "cpus" => p.top_resources.nano_cpus = ctx.get(k, value, cpus).flatten(),
        "mem_limit" => p.top_resources.memory_limit_bytes = ctx.get(k, value, size),
        "mem_reservation" => p.top_resources.memory_reservation_bytes = ctx.get(k, value, size),
        "scale" => p.scale = ctx.get(k, value, u32_of),
        "deploy" => p.deploy = deploy_key(ctx, value, &mut p.deploy_resources),
        _ => {}
    }
}

/// Reads `deploy:`; its resources go to `resources`.
fn deploy_key(ctx: &mut ServiceCtx<'_>, n: &Node, resources: &mut Resources) -> DeployParts {
    let mut out = DeployParts::default();
    let Some(entries) = expect_map(ctx, "deploy", n) else {
        return out;
    };
    nested_keys(ctx, "deploy", "deploy", n);
    for (k, v) in entries {
        let key = format!("deploy.{k}");
        match k.as_str() {
            "mode" => {
                if let Some(m) = ctx.get(&key, v, text) {
                    match m.as_str() {
                        "replicated" => out.mode = ServiceMode::Replicated,
                        "global" => out.mode = ServiceMode::Global,
                        _ => ctx.err(
                            &key,
                            Some(m),
                            "unknown deploy mode",
                            Some("use replicated or global"),
                        ),
                    }
                }
            }
            "replicas" if !matches!(v, Node::Null) => out.replicas = ctx.get(&key, v, u32_of),
            "resources" => deploy_resources(ctx, v, resources),
            "update_config" => out.update = update_config(ctx, v),
            // The others are warnings from the key table (nested_keys above).
            _ => {}
        }
    }
    out
}

/// `deploy.resources`: CPU and memory limits and the memory reservation.
fn deploy_resources(ctx: &mut ServiceCtx<'_>, n: &Node, out: &mut Resources) {
    if expect_map(ctx, "deploy.resources", n).is_none() {
        return;
    }
    nested_keys(ctx, "deploy.resources", "deploy.resources", n);
    if let Some(limits) = n.get("limits") {
        resource_limits(ctx, limits, out);
    }
    if let Some(res) = n.get("reservations") {
        resource_reservations(ctx, res, out);
    }
}

/// `deploy.resources.limits`: `cpus` and `memory`.
fn resource_limits(ctx: &mut ServiceCtx<'_>, limits: &Node, out: &mut Resources) {
    if expect_map(ctx, "deploy.resources.limits", limits).is_none() {
        return;
    }
    nested_keys(
        ctx,
        "deploy.resources.limits",
        "deploy.resources.limits",
        limits,
    );
    if let Some(v) = limits.get("cpus") {
        out.nano_cpus = ctx.get("deploy.resources.limits.cpus", v, cpus).flatten();
    }
    if let Some(v) = limits.get("memory") {
        out.memory_limit_bytes = ctx.get("deploy.resources.limits.memory", v, size);
    }
}

/// `deploy.resources.reservations`: `memory`.
fn resource_reservations(ctx: &mut ServiceCtx<'_>, res: &Node, out: &mut Resources) {
    if expect_map(ctx, "deploy.resources.reservations", res).is_none() {
        return;
    }
    nested_keys(
        ctx,
        "deploy.resources.reservations",
        "deploy.resources.reservations",
        res,
    );
    if let Some(v) = res.get("memory") {
        out.memory_reservation_bytes = ctx.get("deploy.resources.reservations.memory", v, size);
    }
}

/// `deploy.update_config`: `order` and `monitor`.
fn update_config(ctx: &mut ServiceCtx<'_>, n: &Node) -> UpdateConfig {
    let mut out = UpdateConfig::default();
    let Some(entries) = expect_map(ctx, "deploy.update_config", n) else {
        return out;
    };
    nested_keys(ctx, "deploy.update_config", "deploy.update_config", n);
    for (k, v) in entries {
        let key = format!("deploy.update_config.{k}");
        match k.as_str() {
            "order" => {
                if let Some(o) = ctx.get(&key, v, text) {
                    match o.as_str() {
                        "start-first" => out.order = Some(UpdateOrder::StartFirst),
                        "stop-first" => out.order = Some(UpdateOrder::StopFirst),
                        _ => ctx.err(
                            &key,
                            Some(o),
                            "unknown update order",
                            Some("use start-first or stop-first"),
                        ),
                    }
                }
            }
            "monitor" if !matches!(v, Node::Null) => out.monitor_ms = ctx.get(&key, v, duration),
            // The others are warnings from the key table (nested_keys above).
            _ => {}
        }
    }
    out
}

/// The container's resources: `deploy.resources` wins over the top-level keys.
pub(super) fn resources(top: Resources, deploy: Resources) -> Resources {
    Resources {
        nano_cpus: deploy.nano_cpus.or(top.nano_cpus),
        memory_limit_bytes: deploy.memory_limit_bytes.or(top.memory_limit_bytes),
        memory_reservation_bytes: deploy
            .memory_reservation_bytes
            .or(top.memory_reservation_bytes),
    }
}

/// The number of replicas from `scale` and `deploy.replicas` (1 without either); a global
/// service can set neither.
pub(super) fn replicas(ctx: &mut ServiceCtx<'_>, scale: Option<u32>, deploy: &DeployParts) -> u32 {
    let replicas = match (scale, deploy.replicas) {
        (Some(s), Some(r)) if s != r => {
            ctx.err(
                "scale",
                Some(s.to_string()),
                format!("scale and deploy.replicas ({r}) disagree"),
                Some("keep one of them"),
            );
            r
        }
        (_, Some(r)) => r,
        (Some(s), None) => s,
        (None, None) => 1,
    };
    if deploy.mode == ServiceMode::Global && (deploy.replicas.is_some() || scale.is_some()) {
        ctx.err(
            "deploy.mode",
            Some("global".into()),
            "a global service runs one container on every eligible Machine; it cannot also set replicas or scale",
            Some("remove replicas/scale, or use mode: replicated"),
        );
    }
    replicas
}
