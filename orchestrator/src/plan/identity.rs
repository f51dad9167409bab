//! Which Service a Requested Service Spec is, and which of its containers are up to date.
//!
//! A Service is found by its Service Name among the observed Service Containers: no container
//! means a new Service ID, one Service ID is that Service, several are Name Ambiguity and refuse
//! the Deploy. Its mode never changes in place, it may not claim an Ingress Hostname another
//! Service publishes, nor the Service DNS Label of a Service with another name.

use std::collections::BTreeSet;

use ployz_core::{
    ContainerId, ContainerKind, ContainerRuntimeObservation, MachineSnapshot, PullPolicy,
    ServiceId, ServiceSpec,
};

use super::{PlanError, PlanOptions};

/// The observed Service Containers named like `spec`'s Service, on every Machine (those observed
/// down too), in snapshot order.
pub(super) fn containers_of<'a>(
    spec: &ServiceSpec,
    machines: &'a [MachineSnapshot],
) -> Vec<&'a ContainerRuntimeObservation> {
    machines
        .iter()
        .flat_map(|m| m.containers.iter())
        .filter(|c| c.kind == ContainerKind::Service && c.service_name == spec.name)
        .collect()
}

/// The Service ID of `spec`'s Service: the one its `existing` containers carry, or a new one when
/// there are none. Several are Name Ambiguity: the Deploy is refused, naming them.
pub(super) fn service_id(
    spec: &ServiceSpec,
    existing: &[&ContainerRuntimeObservation],
) -> Result<ServiceId, PlanError> {
    let ids: BTreeSet<&ServiceId> = existing.iter().map(|c| &c.service_id).collect();
    if ids.len() > 1 {
        return Err(PlanError::AmbiguousService {
            name: spec.name.to_string(),
            ids: ids.iter().map(|i| i.to_string()).collect(),
        });
    }
    Ok(ids
        .into_iter()
        .next()
        .cloned()
        .unwrap_or_else(ServiceId::generate))
}

/// Refuses a change of mode (replicated, global): the first existing container that carries a
/// Resolved Service Spec says which mode the Service runs in.
pub(super) fn check_mode(
    spec: &ServiceSpec,
    existing: &[&ContainerRuntimeObservation],
) -> Result<(), PlanError> {
    match existing.iter().find_map(|c| c.spec.as_ref()) {
        Some(old) if old.mode != spec.mode => Err(PlanError::ModeChange {
            name: spec.name.to_string(),
            from: old.mode.as_str(),
            to: spec.mode.as_str(),
        }),
        _ => Ok(()),
    }
}

/// Refuses a path of an Ingress Hostname another Service (another name) already serves: the
/// whole hostname (`HostnameClaimed`), or the same `x-routes` path of it (`RouteClaimed`).
/// Services share a hostname when their paths differ.
pub(super) fn check_hostnames(
    spec: &ServiceSpec,
    machines: &[MachineSnapshot],
) -> Result<(), PlanError> {
    let mine = spec.served_paths();
    if mine.is_empty() {
        return Ok(());
    }
    for c in machines.iter().flat_map(|m| m.containers.iter()) {
        if c.service_name == spec.name || c.kind != ContainerKind::Service {
            continue;
        }
        let Some(theirs) = c.spec.as_ref().map(|s| s.served_paths()) else {
            continue;
        };
        for served in &mine {
            if !theirs
                .iter()
                .any(|t| t.hostname == served.hostname && t.path == served.path)
            {
                continue;
            }
            return Err(if served.path.is_root() {
                PlanError::HostnameClaimed {
                    name: spec.name.to_string(),
                    hostname: served.hostname.to_owned(),
                    owner: c.service_name.to_string(),
                    owner_id: c.service_id.to_string(),
                }
            } else {
                PlanError::RouteClaimed {
                    name: spec.name.to_string(),
                    hostname: served.hostname.to_owned(),
                    path: served.path.to_string(),
                    owner: c.service_name.to_string(),
                    owner_id: c.service_id.to_string(),
                }
            });
        }
    }
    Ok(())
}

/// Refuses a Service whose Service DNS Label a deployed Service of another name already has
/// (`my_app` while `my-app` runs): the internal DNS would answer for both under one name.
pub(super) fn check_dns_label(
    spec: &ServiceSpec,
    machines: &[MachineSnapshot],
) -> Result<(), PlanError> {
    let label = spec.name.dns_label();
    let owner = machines
        .iter()
        .flat_map(|m| m.containers.iter())
        .filter(|c| c.kind == ContainerKind::Service && c.service_name != spec.name)
        .find(|c| c.service_name.dns_label() == label);
    match owner {
        Some(c) => Err(PlanError::DnsLabelTaken {
            name: spec.name.to_string(),
            label,
            owner: c.service_name.to_string(),
            owner_id: c.service_id.to_string(),
        }),
        None => Ok(()),
    }
}

/// Decides which containers need no replacement, for every Service of one Deploy.
pub(super) struct Freshness<'a> {
    /// `--recreate`: nothing is up to date.
    recreate: bool,
    /// The containers with a drain mark standing.
    draining: BTreeSet<&'a ContainerId>,
    /// Containers an interrupted command left that never proved they serve.
    distrusted: BTreeSet<ContainerId>,
}

impl<'a> Freshness<'a> {
    /// The judge for a Deploy over `machines` with `opts`.
    pub(super) fn new(
        machines: &'a [MachineSnapshot],
        opts: &PlanOptions,
        distrusted: BTreeSet<ContainerId>,
    ) -> Freshness<'a> {
        Freshness {
            recreate: opts.recreate,
            distrusted,
            draining: machines
                .iter()
                .flat_map(|m| m.drains.iter().map(|d| &d.container_id))
                .collect(),
        }
    }

    /// Whether `c` needs no replacement for `spec`: it runs, carries no drain mark, is not an
    /// unverified container an interrupted command left, was created with the same container
    /// configuration, and neither `--recreate` nor `pull_policy: always` forces a new one.
    pub(super) fn is_up_to_date(
        &self,
        c: &ContainerRuntimeObservation,
        spec: &ServiceSpec,
    ) -> bool {
        c.is_running()
            && !self.draining.contains(&c.id)
            && !self.distrusted.contains(&c.id)
            && !self.recreate
            && spec.container.pull_policy != PullPolicy::Always
            && c.spec
                .as_ref()
                .is_some_and(|old| same_container_config(old, spec))
    }
}

/// Whether two specs would create the same container: name, mode, container configuration,
/// ports, routes (the edge reads them from the container's label) and placement. Replicas, dependencies, hooks and update settings shape the Deploy, not
/// the container, so changing them replaces nothing.
pub fn same_container_config(a: &ServiceSpec, b: &ServiceSpec) -> bool {
    a.name == b.name
        && a.mode == b.mode
        && a.container == b.container
        && a.ports == b.ports
        && a.routes == b.routes
        && a.machines == b.machines
}
