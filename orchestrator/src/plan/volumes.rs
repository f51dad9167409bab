//! Named volumes: which Machines hold each one, and the ones the plan creates.
//!
//! A Docker Volume's name means something only with its Machine. The ledger starts from the
//! volumes the Deploy Snapshot shows and grows as the plan creates volumes for the Services it
//! places, so a later Service that mounts the same volume is placed with it.

use std::collections::{BTreeMap, BTreeSet};

use ployz_core::{MachineId, MachineSnapshot, Operation, ServiceSpec, VolumeSpec};

/// The named volumes per Machine, observed or planned, and the operations creating the planned
/// ones in the order they were asked for.
pub(super) struct VolumeLedger<'a> {
    held: BTreeMap<&'a MachineId, BTreeSet<String>>,
    operations: Vec<Operation>,
}

impl<'a> VolumeLedger<'a> {
    /// The volumes the Deploy Snapshot shows on each Machine.
    pub(super) fn observed(machines: &'a [MachineSnapshot]) -> VolumeLedger<'a> {
        VolumeLedger {
            held: machines
                .iter()
                .map(|m| {
                    (
                        &m.machine.info.id,
                        m.volumes.iter().map(|v| v.name.clone()).collect(),
                    )
                })
                .collect(),
            operations: Vec::new(),
        }
    }

    /// The Machines that hold `volume` (or will, once the plan's operations ran).
    pub(super) fn holders(&self, volume: &str) -> Vec<&'a MachineId> {
        self.held
            .iter()
            .filter(|(_, names)| names.contains(volume))
            .map(|(m, _)| *m)
            .collect()
    }

    /// Plans creating, on `machine`, every named volume `spec` mounts that it does not hold yet,
    /// as the Deploy Intent declares it (or with Docker's defaults when it declares none).
    pub(super) fn provide(
        &mut self,
        machine: &'a MachineId,
        spec: &ServiceSpec,
        declared: &[VolumeSpec],
    ) {
        for v in spec.volume_names() {
            let held = self.held.entry(machine).or_default();
            if held.contains(v) {
                continue;
            }
            let volume = declared
                .iter()
                .find(|vs| vs.name == v)
                .cloned()
                .unwrap_or_else(|| VolumeSpec {
                    name: v.to_string(),
                    driver: None,
                    driver_opts: Default::default(),
                    labels: Default::default(),
                    external: false,
                });
            held.insert(v.to_string());
            self.operations.push(Operation::CreateVolume {
                machine_id: machine.clone(),
                volume,
            });
        }
    }

    /// The volume creations, in the order they were planned.
    pub(super) fn into_operations(self) -> Vec<Operation> {
        self.operations
    }
}
