//! Placement: how many containers of one Service each Machine should run.
//!
//! A pure function of the Deploy Snapshot: [`Request`] in, [`Placement`] out, with the random
//! tiebreak drawn from the caller's generator (one draw per Service, so a seeded plan is
//! reproducible). A Machine is eligible when it is not observed down, matches the Service's
//! `x-machines` and holds every named volume the Service mounts that some Machine holds. Eligible
//! Machines are ranked by how many up-to-date containers of the Service they run, then by how
//! many containers of it they hold, then at random; a replicated Service spreads its replicas
//! round-robin over them (over the first one only when it mounts a named volume: its replicas
//! share it), a global one gets one container on each. A Service whose `x-machines` names a
//! Machine the Deploy Snapshot leaves out (observed down, or it did not answer) is refused.

use std::cmp::Reverse;
use std::collections::BTreeMap;

use ployz_core::{
    ContainerRuntimeObservation, MachineId, MachineSnapshot, NotIncluded, PullPolicy, ServiceMode,
    ServiceSpec, VolumeSpec,
};
use rand::seq::SliceRandom;
use rand::Rng;

use super::identity::Freshness;
use super::volumes::VolumeLedger;
use super::{is_up, normalize_image, PlanError};

/// What placing one Service looks at.
pub(super) struct Request<'r, 'a> {
    /// The Service to place.
    pub spec: &'r ServiceSpec,
    /// Every Machine of the Deploy Snapshot, in snapshot order.
    pub machines: &'a [MachineSnapshot],
    /// The Service's observed containers, on every Machine.
    pub existing: &'r [&'a ContainerRuntimeObservation],
    /// The named volumes each Machine holds, or will once the plan's earlier operations ran.
    pub volumes: &'r VolumeLedger<'a>,
    /// The Deploy Intent's top-level volumes (an `external` one must exist somewhere).
    pub declared: &'r [VolumeSpec],
    /// Which containers count as up to date.
    pub freshness: &'r Freshness<'r>,
    /// The Machines the Deploy Snapshot leaves out.
    pub not_included: &'r [NotIncluded],
}

/// How many containers of one Service each Machine should run. A Machine it does not name
/// should run none.
#[derive(Debug)]
pub(super) struct Placement<'a> {
    wanted: BTreeMap<&'a MachineId, u32>,
}

impl Placement<'_> {
    /// How many containers `machine` should run.
    pub(super) fn wanted(&self, machine: &MachineId) -> u32 {
        self.wanted.get(machine).copied().unwrap_or(0)
    }

    /// How many Machines run at least one container.
    pub(super) fn machine_count(&self) -> u32 {
        u32::try_from(self.wanted.len()).unwrap_or(u32::MAX)
    }
}

/// Places `request.spec`'s containers, or says why no Machine can run them (none eligible, an
/// external volume missing, a host port it would publish twice on one Machine, an image
/// `pull_policy: never` cannot find).
pub(super) fn place<'a, R: Rng + ?Sized>(
    request: &Request<'_, 'a>,
    rng: &mut R,
) -> Result<Placement<'a>, PlanError> {
    let spec = request.spec;
    let mut eligible = eligible(request)?;
    // Order: random, then up-to-date running containers first, then any containers.
    eligible.shuffle(rng);
    eligible.sort_by_key(|m| {
        let mine: Vec<_> = request
            .existing
            .iter()
            .filter(|c| c.machine_id == m.machine.info.id)
            .collect();
        let fresh = mine
            .iter()
            .filter(|c| request.freshness.is_up_to_date(c, spec))
            .count();
        (Reverse(fresh), Reverse(mine.len()))
    });

    let mut wanted: BTreeMap<&'a MachineId, u32> = BTreeMap::new();
    match spec.mode {
        ServiceMode::Global => {
            for m in &eligible {
                wanted.insert(&m.machine.info.id, 1);
            }
        }
        ServiceMode::Replicated => {
            // Replicas sharing a named volume must share its Machine.
            let spread = if spec.volume_names().next().is_none() {
                eligible.len()
            } else {
                1
            };
            for i in 0..spec.replicas as usize {
                *wanted
                    .entry(&eligible[i % spread].machine.info.id)
                    .or_default() += 1;
            }
        }
    }
    let placement = Placement { wanted };
    check_machines(request, &placement)?;
    Ok(placement)
}

/// The Machines that may run the Service: not observed down, matching `x-machines`, holding the
/// named volumes it mounts that exist somewhere. Never empty.
fn eligible<'a>(request: &Request<'_, 'a>) -> Result<Vec<&'a MachineSnapshot>, PlanError> {
    let spec = request.spec;
    // A Machine the Service is pinned to must be in the Deploy: the file asks for it by name.
    if let Some(left_out) = request.not_included.iter().find(|n| {
        spec.machines
            .iter()
            .any(|t| t.as_str() == n.machine.as_str() || t.as_str() == n.name)
    }) {
        return Err(PlanError::PinnedMachineNotIncluded {
            name: spec.name.to_string(),
            machine: left_out.name.clone(),
            reason: left_out.reason.clone(),
        });
    }
    let mut eligible: Vec<&'a MachineSnapshot> = request
        .machines
        .iter()
        .filter(|m| is_up(m))
        .filter(|m| matches_target(m, spec))
        .collect();
    if eligible.is_empty() {
        return Err(PlanError::NoEligibleMachine {
            name: spec.name.to_string(),
            why: if spec.machines.is_empty() {
                "every Machine is down".into()
            } else {
                format!(
                    "x-machines {} matches no Machine that is up",
                    spec.machines
                        .iter()
                        .map(|t| t.as_str())
                        .collect::<Vec<_>>()
                        .join(",")
                )
            },
        });
    }
    for v in spec.volume_names() {
        let holders = request.volumes.holders(v);
        if !holders.is_empty() {
            eligible.retain(|m| holders.contains(&&m.machine.info.id));
        } else if request
            .declared
            .iter()
            .any(|vs| vs.name == v && vs.external)
        {
            return Err(PlanError::ExternalVolumeMissing {
                name: spec.name.to_string(),
                volume: v.to_string(),
            });
        }
    }
    if eligible.is_empty() {
        return Err(PlanError::NoEligibleMachine {
            name: spec.name.to_string(),
            why: "no Machine holds all of its volumes".into(),
        });
    }
    Ok(eligible)
}

/// Whether `m` is one the Service's `x-machines` names (by Machine ID or Machine Name); no
/// `x-machines` names every Machine.
fn matches_target(m: &MachineSnapshot, spec: &ServiceSpec) -> bool {
    spec.machines.is_empty()
        || spec.machines.iter().any(|t| {
            t.as_str() == m.machine.info.id.as_str() || t.as_str() == m.machine.info.name.as_str()
        })
}

/// Refuses a placement a Machine cannot carry out, Machine by Machine in snapshot order: more
/// than one container publishing the same host port, or an image `pull_policy: never` does not
/// find there.
fn check_machines(request: &Request<'_, '_>, placement: &Placement<'_>) -> Result<(), PlanError> {
    let spec = request.spec;
    for m in request.machines.iter().filter(|m| is_up(m)) {
        let want = placement.wanted(&m.machine.info.id);
        if want > 1 {
            if let Some((port, _)) = spec.host_ports().next() {
                return Err(PlanError::HostPortClash {
                    name: spec.name.to_string(),
                    port,
                    count: want,
                    machine: m.machine.info.name.to_string(),
                });
            }
        }
        if want > 0 && spec.container.pull_policy == PullPolicy::Never {
            let image = normalize_image(&spec.container.image);
            if !m.images.iter().any(|i| normalize_image(i) == image) {
                return Err(PlanError::ImageMissing {
                    name: spec.name.to_string(),
                    image: spec.container.image.clone(),
                    machine: m.machine.info.name.to_string(),
                });
            }
        }
    }
    Ok(())
}
