//! How many containers run, with what resources, replaced in what order: `deploy:` (mode,
//! replicas, resources, update order; the rest is ignored with a warning) with the top-level
//! `scale`, `cpus`, `mem_limit` and `mem_reservation`.

use ployz_core::{Resources, ServiceMode, UpdateConfig, UpdateOrder};

use super::keys::warn_unknown_keys;
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
    const KEYS: &[&str] = &[
        "mode",
        "replicas",
        "resources",
        "update_config",
        "placement",
        "labels",
        "restart_policy",
        "rollback_config",
        "endpoint_mode",
    ];
    let mut out = DeployParts::default();
    let Some(entries) = expect_map(ctx, "deploy", n) else {
        return out;
    };
    warn_unknown_keys(ctx, "deploy", n, KEYS);
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
            "placement" => ctx.warn(
                &key,
                "is not supported and is ignored; choose Machines with x-machines",
            ),
            "labels" => ctx.warn(&key, "is not supported and is ignored"),
            "restart_policy" => ctx.warn(
                &key,
                "is not supported and is ignored: Ployz runs every Service Container with restart policy unless-stopped",
            ),
            "rollback_config" => ctx.warn(&key, "is not supported and is ignored"),
            "endpoint_mode" => ctx.warn(&key, "is not supported and is ignored"),
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
    warn_unknown_keys(ctx, "deploy.resources", n, &["limits", "reservations"]);
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
    warn_unknown_keys(
        ctx,
        "deploy.resources.limits",
        limits,
        &["cpus", "memory", "pids", "devices"],
    );
    if let Some(v) = limits.get("cpus") {
        out.nano_cpus = ctx.get("deploy.resources.limits.cpus", v, cpus).flatten();
    }
    if let Some(v) = limits.get("memory") {
        out.memory_limit_bytes = ctx.get("deploy.resources.limits.memory", v, size);
    }
    if limits.get("pids").is_some() {
        ctx.warn(
            "deploy.resources.limits.pids",
            "is not supported and is ignored; no PID limit is set",
        );
    }
    if limits.get("devices").is_some() {
        ctx.warn(
            "deploy.resources.limits.devices",
            "is not supported and is ignored",
        );
    }
}

/// `deploy.resources.reservations`: `memory`.
fn resource_reservations(ctx: &mut ServiceCtx<'_>, res: &Node, out: &mut Resources) {
    if expect_map(ctx, "deploy.resources.reservations", res).is_none() {
        return;
    }
    warn_unknown_keys(
        ctx,
        "deploy.resources.reservations",
        res,
        &["cpus", "memory", "devices", "generic_resources"],
    );
    if let Some(v) = res.get("memory") {
        out.memory_reservation_bytes = ctx.get("deploy.resources.reservations.memory", v, size);
    }
    for k in ["cpus", "devices", "generic_resources"] {
        if res.get(k).is_some() {
            ctx.warn(
                &format!("deploy.resources.reservations.{k}"),
                "is not supported yet and is ignored",
            );
        }
    }
}

/// `deploy.update_config`: `order` and `monitor`.
fn update_config(ctx: &mut ServiceCtx<'_>, n: &Node) -> UpdateConfig {
    let mut out = UpdateConfig::default();
    let Some(entries) = expect_map(ctx, "deploy.update_config", n) else {
        return out;
    };
    const KEYS: &[&str] = &[
        "order",
        "monitor",
        "parallelism",
        "delay",
        "failure_action",
        "max_failure_ratio",
    ];
    warn_unknown_keys(ctx, "deploy.update_config", n, KEYS);
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
            "parallelism" => ctx.warn(
                &key,
                "is not supported and is ignored; containers are replaced one at a time",
            ),
            "delay" | "failure_action" | "max_failure_ratio" => {
                ctx.warn(&key, "is not supported and is ignored")
            }
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
