//! Update order: whether a replacement starts the new container before stopping the old one
//! (start-first) or stops the old one first (stop-first), and which removals stop before the new
//! containers of their Machine start.

use std::collections::BTreeSet;

use ployz_core::{
    ContainerRuntimeObservation, MachineId, Operation, ServiceMode, ServiceSpec, UpdateOrder,
};

use super::container_ref;

/// The order for replacing `old` with a container of `spec`: the one `update_config.order` asks
/// for; else stop-first when `old` holds a host port the new one needs, or for a single replica
/// that mounts a named volume; else start-first.
pub(super) fn update_order(old: &ContainerRuntimeObservation, spec: &ServiceSpec) -> UpdateOrder {
    if let Some(order) = spec.update.order {
        return order;
    }
    let old_ports: BTreeSet<_> = old
        .spec
        .as_ref()
        .map(|s| s.host_ports().collect())
        .unwrap_or_default();
    if spec.host_ports().any(|p| old_ports.contains(&p)) {
        return UpdateOrder::StopFirst;
    }
    if spec.mode == ServiceMode::Replicated
        && spec.replicas <= 1
        && spec.volume_names().next().is_some()
    {
        return UpdateOrder::StopFirst;
    }
    UpdateOrder::StartFirst
}

/// Stops, before the first container `operations` run or replace on `machine_id`, every running
/// container of `removals` that holds a host port `spec` publishes: it would keep the port from
/// the new ones. `want` is how many containers the Machine should run; none needs no port.
pub(super) fn stop_port_holders_first(
    operations: &mut Vec<Operation>,
    removals: &[&ContainerRuntimeObservation],
    machine_id: &MachineId,
    spec: &ServiceSpec,
    want: u32,
) {
    let wanted_ports: BTreeSet<_> = spec.host_ports().collect();
    if want == 0 || wanted_ports.is_empty() {
        return;
    }
    let first_start = operations
        .iter()
        .position(|op| {
            op.machine_id() == machine_id
                && matches!(
                    op,
                    Operation::RunContainer { .. } | Operation::ReplaceContainer { .. }
                )
        })
        .unwrap_or(operations.len());
    let blocking: Vec<Operation> = removals
        .iter()
        .filter(|c| {
            c.is_running()
                && c.spec
                    .as_ref()
                    .is_some_and(|s| s.host_ports().any(|p| wanted_ports.contains(&p)))
        })
        .map(|c| Operation::StopContainer {
            machine_id: machine_id.clone(),
            container: container_ref(c),
        })
        .collect();
    for (i, op) in blocking.into_iter().enumerate() {
        operations.insert(first_start + i, op);
    }
}
