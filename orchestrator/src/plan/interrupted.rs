//! What interrupted commands left on a Machine, reviewed before anything is planned from it.
//!
//! A command whose Machine lease ended without its release (killed, cut off when its lease
//! lapsed, or under a daemon that restarted) may have stopped half way: a container created
//! and not yet through its health gate, beside the one it was to replace. The snapshot reports
//! such commands ([`MachineSnapshot::interrupted`]) and each Service Container the token it was
//! created under, so the containers an interrupted command made are known.
//!
//! - Of a Service this Deploy attempts, a container left that is not Serving is not counted as
//!   up to date: the Service's containers are replaced through the health gates again, and the
//!   unverified one removed. Nothing that never proved it serves is kept in place of one that
//!   did.
//! - Of a Service it does not attempt, unfinished work (a container left that is not Serving,
//!   or the containers it was replacing still beside it) is a state this Deploy cannot plan
//!   from: it would neither finish nor undo it. The Deploy is refused with the evidence.

use std::collections::{BTreeMap, BTreeSet};

use ployz_core::api::InterruptedLease;
use ployz_core::{
    ContainerId, ContainerKind, ContainerRuntimeObservation, DeployIntent, LeftUnverified,
    MachineSnapshot, ServiceName,
};

use super::identity::same_container_config;
use super::{container_ref, is_up, PlanError};

/// The review of every Machine's interrupted commands.
#[derive(Debug, Default)]
pub(super) struct Review {
    /// Containers not counted as up to date.
    pub distrusted: BTreeSet<ContainerId>,
    /// The same, as the preview names them.
    pub left_unverified: Vec<LeftUnverified>,
    /// The unfinished work of Services this Deploy does not attempt.
    pub errors: Vec<PlanError>,
}

/// Reviews what the interrupted commands of the Machines observed up left, for `intent`.
pub(super) fn review(intent: &DeployIntent, machines: &[MachineSnapshot]) -> Review {
    let mut out = Review::default();
    for m in machines.iter().filter(|m| is_up(m)) {
        let by_token: BTreeMap<u64, &InterruptedLease> =
            m.interrupted.iter().map(|l| (l.token, l)).collect();
        if by_token.is_empty() {
            continue;
        }
        let mut left: BTreeMap<
            &ServiceName,
            Vec<(&ContainerRuntimeObservation, &InterruptedLease)>,
        > = BTreeMap::new();
        for c in m
            .containers
            .iter()
            .filter(|c| c.kind == ContainerKind::Service)
        {
            if let Some(lease) = c.lease_token.and_then(|t| by_token.get(&t)) {
                left.entry(&c.service_name).or_default().push((c, lease));
            }
        }
        for (name, cs) in left {
            let unverified: Vec<_> = cs.iter().filter(|(c, _)| !c.is_serving()).collect();
            if intent.attempts.contains(name) {
                for (c, lease) in unverified {
                    out.distrusted.insert(c.id.clone());
                    out.left_unverified.push(LeftUnverified {
                        machine_id: m.machine.info.id.clone(),
                        service_name: name.clone(),
                        container: container_ref(c),
                        status: c.status(),
                        lease: (*lease).clone(),
                    });
                }
                continue;
            }
            let replaced = being_replaced(m, name, &cs);
            if unverified.is_empty() && replaced.is_empty() {
                continue;
            }
            let mut evidence: Vec<String> = cs
                .iter()
                .map(|(c, lease)| {
                    format!(
                        "{} ({}, created under lease {})",
                        c.name,
                        c.status(),
                        lease.token
                    )
                })
                .collect();
            evidence.extend(replaced.iter().map(|c| {
                format!(
                    "{} ({}, the container it was replacing, still there)",
                    c.name,
                    c.status()
                )
            }));
            let mut by: Vec<String> = cs.iter().map(|(_, l)| l.to_string()).collect();
            by.dedup();
            out.errors.push(PlanError::LeftUnfinished {
                name: name.to_string(),
                machine: m.machine.info.name.to_string(),
                by: by.join(" and "),
                evidence: evidence.join(", "),
            });
        }
    }
    out
}

/// The running containers of `name` on `m` that the interrupted work `left` was replacing:
/// created before the newest container left, with another container configuration.
fn being_replaced<'a>(
    m: &'a MachineSnapshot,
    name: &ServiceName,
    left: &[(&ContainerRuntimeObservation, &InterruptedLease)],
) -> Vec<&'a ContainerRuntimeObservation> {
    let newest = left.iter().map(|(c, _)| c.created_at).max().unwrap_or(0);
    let left_ids: BTreeSet<&ContainerId> = left.iter().map(|(c, _)| &c.id).collect();
    m.containers
        .iter()
        .filter(|c| c.kind == ContainerKind::Service && &c.service_name == name)
        .filter(|c| !left_ids.contains(&c.id) && c.is_running() && c.created_at <= newest)
        .filter(|c| {
            left.iter().any(|(l, _)| match (&c.spec, &l.spec) {
                (Some(old), Some(new)) => !same_container_config(old, new),
                _ => true,
            })
        })
        .collect()
}
