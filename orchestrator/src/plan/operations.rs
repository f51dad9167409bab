//! The operations of one Service on one Machine, and where its pre-deploy hook goes.
//!
//! On each Machine, up-to-date containers are kept (running ones first, oldest first) up to how
//! many the Machine should run; each missing one replaces a running stale container, or else is
//! run anew; every other container is removed, after the Service's runs and replacements on every
//! Machine.

use ployz_core::{ContainerRuntimeObservation, MachineId, Operation, ServiceId, ServiceSpec};

use super::container_ref;
use super::identity::Freshness;
use super::update_order::{stop_port_holders_first, update_order};

/// One Service on one Machine.
pub(super) struct MachineRequest<'r> {
    pub machine_id: &'r MachineId,
    pub service_id: &'r ServiceId,
    pub spec: &'r ServiceSpec,
    /// How many containers the Machine should run (placement's answer).
    pub want: u32,
    /// Which containers count as up to date.
    pub freshness: &'r Freshness<'r>,
}

/// Appends to `operations` the replacements and runs that bring `mine` (the Service's containers
/// on this Machine) to `want` up-to-date containers, with the stops of removed containers that
/// hold a host port the new ones need before them. Answers the containers to remove.
pub(super) fn for_machine<'a>(
    operations: &mut Vec<Operation>,
    request: &MachineRequest<'_>,
    mut mine: Vec<&'a ContainerRuntimeObservation>,
) -> Vec<&'a ContainerRuntimeObservation> {
    let MachineRequest {
        machine_id,
        service_id,
        spec,
        want,
        freshness,
    } = *request;
    mine.sort_by_key(|c| (std::cmp::Reverse(c.is_running()), c.created_at));
    let (fresh, stale): (Vec<_>, Vec<_>) = mine
        .into_iter()
        .partition(|c| freshness.is_up_to_date(c, spec));
    let keep = fresh.len().min(want as usize);
    let mut removals: Vec<&'a ContainerRuntimeObservation> = fresh[keep..].to_vec();
    let mut missing = want as usize - keep;
    for old in stale {
        if missing > 0 && old.is_running() {
            operations.push(Operation::ReplaceContainer {
                machine_id: machine_id.clone(),
                service_id: service_id.clone(),
                old: container_ref(old),
                spec: spec.clone(),
                order: update_order(old, spec),
            });
            missing -= 1;
        } else {
            removals.push(old);
        }
    }
    for _ in 0..missing {
        operations.push(Operation::RunContainer {
            machine_id: machine_id.clone(),
            service_id: service_id.clone(),
            spec: spec.clone(),
        });
    }
    stop_port_holders_first(operations, &removals, machine_id, spec, want);
    removals
}

/// The operation removing `container` from `machine_id`.
pub(super) fn removal(
    machine_id: &MachineId,
    container: &ContainerRuntimeObservation,
) -> Operation {
    Operation::RemoveContainer {
        machine_id: machine_id.clone(),
        container: container_ref(container),
    }
}

/// Puts the Service's pre-deploy hook first, on the Machine of its first run or replacement;
/// a Service that runs and replaces nothing runs no hook.
pub(super) fn insert_pre_deploy_hook(
    operations: &mut Vec<Operation>,
    service_id: &ServiceId,
    spec: &ServiceSpec,
) {
    let Some(hook) = &spec.pre_deploy else {
        return;
    };
    let first_run = operations.iter().find(|op| {
        matches!(
            op,
            Operation::RunContainer { .. } | Operation::ReplaceContainer { .. }
        )
    });
    if let Some(op) = first_run {
        let hook_op = Operation::RunHook {
            machine_id: op.machine_id().clone(),
            service_id: service_id.clone(),
            spec: spec.clone(),
            hook: hook.clone(),
        };
        operations.insert(0, hook_op);
    }
}
