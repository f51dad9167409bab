//! The planner: Deploy Intent + Deploy Snapshot -> Deploy Plan. A pure function.
//!
//! Rules (the reference's, under Ployz's names):
//! - a Service's identity is found by name among observed containers; a name shared by several
//!   Service IDs is Name Ambiguity and refuses the Deploy; mode never changes in place;
//! - a container is up to date when it runs, carries no drain mark, and its Resolved Service Spec
//!   equals the requested one field by field (container configuration, ports, placement; not
//!   replicas, hooks or update settings), unless `pull_policy: always` or `--recreate` force a
//!   replacement. A running container with a drain mark receives no requests (a drain whose
//!   stop never came), so it is replaced rather than counted as serving;
//! - replicated Services spread `replicas` round-robin over eligible Machines ordered by how many
//!   up-to-date containers they run, then by whether they hold any, then at random; global
//!   Services get one container per eligible Machine;
//! - a replacement is stop-first when asked, when the old container holds a host port the new one
//!   needs, or for a single replica that mounts a named volume; otherwise start-first;
//! - a pre-deploy hook runs before the first run or replacement, on that operation's Machine;
//! - containers that are not running and not kept are removed; Services not attempted are left
//!   alone, and nothing is pruned.

use std::collections::{BTreeMap, BTreeSet};

use ployz_core::{
    ContainerId, ContainerKind, ContainerRef, ContainerRuntimeObservation, DeployIntent,
    DeployPlan, MachineId, MachineSnapshot, MembershipObservation, Operation, PortSpec, PullPolicy,
    ServiceId, ServiceMode, ServicePlan, ServiceSpec, UpdateOrder,
};
use rand::seq::SliceRandom;
use rand::SeedableRng;

/// Knobs of one Deploy that change the plan.
#[derive(Debug, Clone, Default)]
pub struct PlanOptions {
    /// Replace every container of the attempted Services, up to date or not.
    pub recreate: bool,
    /// Seed of the random tiebreak between equally ranked Machines.
    pub seed: u64,
}

/// Why no plan could be made. Every variant names what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    #[error("service '{0}' is not in the Compose file; services there: {1}")]
    UnknownAttempt(String, String),
    #[error("Service Name '{name}' matches {} Services ({}); remove the extra ones (`ployz rm` by ID) or rename this one", ids.len(), ids.join(", "))]
    AmbiguousService { name: String, ids: Vec<String> },
    #[error(
        "service '{name}' runs in {from} mode; changing it to {to} needs `ployz rm {name}` first"
    )]
    ModeChange {
        name: String,
        from: &'static str,
        to: &'static str,
    },
    #[error("service '{name}': no Machine can run it ({why})")]
    NoEligibleMachine { name: String, why: String },
    #[error("service '{name}': image '{image}' is not on Machine {machine} and pull_policy is never; load it there or use pull_policy: missing")]
    ImageMissing {
        name: String,
        image: String,
        machine: String,
    },
    #[error("service '{name}' claims Ingress Hostname '{hostname}', already published by Service '{owner}' ({owner_id}); remove that Service or pick another hostname")]
    HostnameClaimed {
        name: String,
        hostname: String,
        owner: String,
        owner_id: String,
    },
    #[error("service '{name}' publishes host port {port} but would run {count} containers on Machine {machine}; use deploy.mode: global or fewer replicas")]
    HostPortClash {
        name: String,
        port: u16,
        count: u32,
        machine: String,
    },
    #[error("service '{name}': external volume '{volume}' does not exist on any Machine; create it with `ployz volume create {volume}`")]
    ExternalVolumeMissing { name: String, volume: String },
}

/// Docker's normal form of an image reference: a tag is added when absent.
pub fn normalize_image(image: &str) -> String {
    let last = image.rsplit('/').next().unwrap_or(image);
    if last.contains(':') || image.contains('@') {
        image.to_owned()
    } else {
        format!("{image}:latest")
    }
}

/// Whether a container needs no replacement for `spec`; `draining` holds the containers with a
/// drain mark.
fn up_to_date(
    c: &ContainerRuntimeObservation,
    spec: &ServiceSpec,
    opts: &PlanOptions,
    draining: &BTreeSet<&ContainerId>,
) -> bool {
    c.is_running()
        && !draining.contains(&c.id)
        && !opts.recreate
        && spec.container.pull_policy != PullPolicy::Always
        && c.spec
            .as_ref()
            .is_some_and(|old| same_container_config(old, spec))
}

/// Whether two specs would create the same container: name, mode, container configuration,
/// ports and placement. Replicas, dependencies, hooks and update settings shape the Deploy, not
/// the container, so changing them replaces nothing.
fn same_container_config(a: &ServiceSpec, b: &ServiceSpec) -> bool {
    a.name == b.name
        && a.mode == b.mode
        && a.container == b.container
        && a.ports == b.ports
        && a.machines == b.machines
}

/// The update order for replacing `old` with a container of `spec`.
fn update_order(old: &ContainerRuntimeObservation, spec: &ServiceSpec) -> UpdateOrder {
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

fn container_ref(c: &ContainerRuntimeObservation) -> ContainerRef {
    ContainerRef {
        id: c.id.clone(),
        name: c.name.clone(),
    }
}

fn matches_target(m: &MachineSnapshot, spec: &ServiceSpec) -> bool {
    spec.machines.is_empty()
        || spec.machines.iter().any(|t| {
            t.as_str() == m.machine.info.id.as_str() || t.as_str() == m.machine.info.name.as_str()
        })
}

/// Plans one Deploy.
pub fn plan(
    intent: &DeployIntent,
    machines: &[MachineSnapshot],
    opts: &PlanOptions,
) -> Result<DeployPlan, PlanError> {
    for attempt in &intent.attempts {
        if !intent.services.iter().any(|s| &s.name == attempt) {
            let names: Vec<&str> = intent.services.iter().map(|s| s.name.as_str()).collect();
            return Err(PlanError::UnknownAttempt(
                attempt.to_string(),
                names.join(", "),
            ));
        }
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(opts.seed);
    let draining: BTreeSet<&ContainerId> = machines
        .iter()
        .flat_map(|m| m.drains.iter().map(|d| &d.container_id))
        .collect();
    let up_to_date =
        |c: &ContainerRuntimeObservation, spec: &ServiceSpec| up_to_date(c, spec, opts, &draining);
    let mut volume_operations = Vec::new();
    // Volumes that exist or that this plan creates, per Machine.
    let mut volumes: BTreeMap<&MachineId, BTreeSet<String>> = machines
        .iter()
        .map(|m| {
            (
                &m.machine.info.id,
                m.volumes.iter().map(|v| v.name.clone()).collect(),
            )
        })
        .collect();
    let mut services = Vec::new();
    for spec in intent
        .services
        .iter()
        .filter(|s| intent.attempts.contains(&s.name))
    {
        check_hostnames(spec, machines)?;
        let existing: Vec<&ContainerRuntimeObservation> = machines
            .iter()
            .flat_map(|m| m.containers.iter())
            .filter(|c| c.kind == ContainerKind::Service && c.service_name == spec.name)
            .collect();
        let ids: BTreeSet<&ServiceId> = existing.iter().map(|c| &c.service_id).collect();
        let service_id = match ids.len() {
            0 => ServiceId::generate(),
            1 => (*ids.iter().next().expect("one id")).clone(),
            _ => {
                return Err(PlanError::AmbiguousService {
                    name: spec.name.to_string(),
                    ids: ids.iter().map(|i| i.to_string()).collect(),
                })
            }
        };
        if let Some(old) = existing.iter().find_map(|c| c.spec.as_ref()) {
            if old.mode != spec.mode {
                return Err(PlanError::ModeChange {
                    name: spec.name.to_string(),
                    from: old.mode.as_str(),
                    to: spec.mode.as_str(),
                });
            }
        }

        // Eligible Machines: not observed down, matching x-machines, holding the volumes.
        let mut eligible: Vec<&MachineSnapshot> = machines
            .iter()
            .filter(|m| m.machine.membership != MembershipObservation::Down)
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
        let mounted: Vec<&str> = spec.volume_names().collect();
        for v in &mounted {
            let holders: Vec<&MachineId> = volumes
                .iter()
                .filter(|(_, names)| names.contains(*v))
                .map(|(m, _)| *m)
                .collect();
            if !holders.is_empty() {
                eligible.retain(|m| holders.contains(&&m.machine.info.id));
            } else if intent.volumes.iter().any(|vs| vs.name == *v && vs.external) {
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

        // Order: random, then up-to-date running containers first, then any containers.
        eligible.shuffle(&mut rng);
        let rank = |m: &MachineSnapshot| {
            let mine: Vec<_> = existing
                .iter()
                .filter(|c| c.machine_id == m.machine.info.id)
                .collect();
            let fresh = mine.iter().filter(|c| up_to_date(c, spec)).count();
            (std::cmp::Reverse(fresh), std::cmp::Reverse(mine.len()))
        };
        eligible.sort_by_key(|m| rank(m));

        // How many containers each Machine should run.
        let mut wanted: BTreeMap<&MachineId, u32> = BTreeMap::new();
        match spec.mode {
            ServiceMode::Global => {
                for m in &eligible {
                    wanted.insert(&m.machine.info.id, 1);
                }
            }
            ServiceMode::Replicated => {
                // Replicas sharing a named volume must share its Machine.
                let spread = if mounted.is_empty() {
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

        let mut operations = Vec::new();
        let mut removals = Vec::new();
        // A Machine observed down is left alone: nothing can reach it to change its containers.
        for m in machines
            .iter()
            .filter(|m| m.machine.membership != MembershipObservation::Down)
        {
            let machine_id = &m.machine.info.id;
            let mut mine: Vec<&ContainerRuntimeObservation> = existing
                .iter()
                .copied()
                .filter(|c| &c.machine_id == machine_id)
                .collect();
            mine.sort_by_key(|c| (std::cmp::Reverse(c.is_running()), c.created_at));
            let want = wanted.get(machine_id).copied().unwrap_or(0);
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
            if want > 0 {
                if spec.container.pull_policy == PullPolicy::Never {
                    let image = normalize_image(&spec.container.image);
                    if !m.images.iter().any(|i| normalize_image(i) == image) {
                        return Err(PlanError::ImageMissing {
                            name: spec.name.to_string(),
                            image: spec.container.image.clone(),
                            machine: m.machine.info.name.to_string(),
                        });
                    }
                }
                for v in &mounted {
                    let held = volumes.entry(machine_id).or_default();
                    if !held.contains(*v) {
                        let volume = intent
                            .volumes
                            .iter()
                            .find(|vs| vs.name == *v)
                            .cloned()
                            .unwrap_or_else(|| ployz_core::VolumeSpec {
                                name: v.to_string(),
                                driver: None,
                                driver_opts: Default::default(),
                                labels: Default::default(),
                                external: false,
                            });
                        held.insert(v.to_string());
                        volume_operations.push(Operation::CreateVolume {
                            machine_id: machine_id.clone(),
                            volume,
                        });
                    }
                }
            }
            let (fresh, stale): (Vec<_>, Vec<_>) =
                mine.into_iter().partition(|c| up_to_date(c, spec));
            let keep = fresh.len().min(want as usize);
            removals.extend(fresh[keep..].iter().map(|c| (machine_id, *c)));
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
                    removals.push((machine_id, old));
                }
            }
            for _ in 0..missing {
                operations.push(Operation::RunContainer {
                    machine_id: machine_id.clone(),
                    service_id: service_id.clone(),
                    spec: spec.clone(),
                });
            }
            // A running container about to be removed that holds a host port the new ones
            // need is stopped before they start.
            let wanted_ports: BTreeSet<_> = spec.host_ports().collect();
            if want > 0 && !wanted_ports.is_empty() {
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
                    .filter(|(m, c)| {
                        *m == machine_id
                            && c.is_running()
                            && c.spec
                                .as_ref()
                                .is_some_and(|s| s.host_ports().any(|p| wanted_ports.contains(&p)))
                    })
                    .map(|(_, c)| Operation::StopContainer {
                        machine_id: machine_id.clone(),
                        container: container_ref(c),
                    })
                    .collect();
                for (i, op) in blocking.into_iter().enumerate() {
                    operations.insert(first_start + i, op);
                }
            }
        }
        operations.extend(
            removals
                .into_iter()
                .map(|(m, c)| Operation::RemoveContainer {
                    machine_id: m.clone(),
                    container: container_ref(c),
                }),
        );
        if let Some(hook) = &spec.pre_deploy {
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
        let image = spec.container.image.clone();
        let previous_image = existing
            .iter()
            .filter(|c| c.is_running())
            .map(|c| c.image.clone())
            .find(|i| normalize_image(i) != normalize_image(&image));
        services.push(ServicePlan {
            service_id,
            name: spec.name.clone(),
            mode: spec.mode,
            is_new: existing.is_empty(),
            replicas: match spec.mode {
                ServiceMode::Replicated => spec.replicas,
                ServiceMode::Global => wanted.len() as u32,
            },
            previous_image,
            image,
            operations,
        });
    }
    Ok(DeployPlan {
        volume_operations,
        services,
    })
}

/// Refuses a hostname another Service (another name) already publishes.
fn check_hostnames(spec: &ServiceSpec, machines: &[MachineSnapshot]) -> Result<(), PlanError> {
    for port in &spec.ports {
        let PortSpec::Ingress {
            hostname: Some(host),
            ..
        } = port
        else {
            continue;
        };
        for c in machines.iter().flat_map(|m| m.containers.iter()) {
            if c.service_name == spec.name || c.kind != ContainerKind::Service {
                continue;
            }
            let claims = c.spec.as_ref().is_some_and(|s| {
                s.ports
                    .iter()
                    .any(|p| matches!(p, PortSpec::Ingress { hostname: Some(h), .. } if h == host))
            });
            if claims {
                return Err(PlanError::HostnameClaimed {
                    name: spec.name.to_string(),
                    hostname: host.clone(),
                    owner: c.service_name.to_string(),
                    owner_id: c.service_id.to_string(),
                });
            }
        }
    }
    Ok(())
}
