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
//!
//! [`plan`] calls one module per step, Service by Service:
//! - `identity`: which Service a Requested Service Spec is (its Service ID, its mode, the
//!   Ingress Hostnames it may claim) and which of its containers are up to date;
//! - `placement`: how many containers each Machine should run, a pure function of the Deploy
//!   Snapshot;
//! - `operations`: per Machine, which containers are kept, replaced, run or removed, and where
//!   the pre-deploy hook goes;
//! - `update_order`: start-first or stop-first, and which removals stop before new containers
//!   start;
//! - `volumes`: which Machines hold each named volume, and the ones the plan creates;
//! - `host_ports`: a fixed host port is bound once per Machine: not by two Services, not by a
//!   Service and the daemon's own listeners (the edge, metrics, DNS).

mod host_ports;
mod identity;
mod operations;
mod placement;
mod update_order;
mod volumes;

use ployz_core::{
    ContainerRef, ContainerRuntimeObservation, DeployIntent, DeployPlan, HostProtocol,
    ListenerRole, MachineSnapshot, MembershipObservation, Operation, ServiceId, ServiceMode,
    ServicePlan, ServiceSpec,
};
use rand::rngs::StdRng;
use rand::SeedableRng;

use host_ports::HostPortLedger;
use identity::Freshness;
use placement::Placement;
use volumes::VolumeLedger;

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
    #[error(
        "service '{name}' and service '{other}' both publish host port {port}/{protocol} on Machine {machine}{}; give one of them another host port, or place them on different Machines with x-machines",
        if *other_running { format!(" ('{other}' already runs there)") } else { String::new() }
    )]
    HostPortTaken {
        name: String,
        other: String,
        port: u16,
        protocol: HostProtocol,
        machine: String,
        /// `other` is a Service this Deploy does not attempt, already running there.
        other_running: bool,
    },
    #[error("service '{name}' publishes host port {port}/{protocol} on Machine {machine}, where the daemon's {role} listens ({address}); {fix}")]
    HostPortHeldByDaemon {
        name: String,
        port: u16,
        protocol: HostProtocol,
        machine: String,
        role: ListenerRole,
        address: String,
        fix: String,
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

/// Plans one Deploy.
pub fn plan(
    intent: &DeployIntent,
    machines: &[MachineSnapshot],
    opts: &PlanOptions,
) -> Result<DeployPlan, PlanError> {
    check_attempts(intent)?;
    let mut rng = StdRng::seed_from_u64(opts.seed);
    let freshness = Freshness::new(machines, opts);
    let mut volumes = VolumeLedger::observed(machines);
    let mut host_ports = HostPortLedger::observed(intent, machines);
    let mut services = Vec::new();
    for spec in intent
        .services
        .iter()
        .filter(|s| intent.attempts.contains(&s.name))
    {
        services.push(plan_service(
            spec,
            intent,
            machines,
            &freshness,
            &mut volumes,
            &mut host_ports,
            &mut rng,
        )?);
    }
    Ok(DeployPlan {
        volume_operations: volumes.into_operations(),
        services,
    })
}

/// Refuses a Service Attempt the Compose file does not define.
fn check_attempts(intent: &DeployIntent) -> Result<(), PlanError> {
    for attempt in &intent.attempts {
        if !intent.services.iter().any(|s| &s.name == attempt) {
            let names: Vec<&str> = intent.services.iter().map(|s| s.name.as_str()).collect();
            return Err(PlanError::UnknownAttempt(
                attempt.to_string(),
                names.join(", "),
            ));
        }
    }
    Ok(())
}

/// Plans one attempted Service: its identity, its placement, then its operations Machine by
/// Machine. The named volumes it needs are added to `volumes`.
fn plan_service<'a>(
    spec: &ServiceSpec,
    intent: &DeployIntent,
    machines: &'a [MachineSnapshot],
    freshness: &Freshness<'_>,
    volumes: &mut VolumeLedger<'a>,
    host_ports: &mut HostPortLedger<'a>,
    rng: &mut StdRng,
) -> Result<ServicePlan, PlanError> {
    identity::check_hostnames(spec, machines)?;
    let existing = identity::containers_of(spec, machines);
    let service_id = identity::service_id(spec, &existing)?;
    identity::check_mode(spec, &existing)?;
    let placement = placement::place(
        &placement::Request {
            spec,
            machines,
            existing: &existing,
            volumes,
            declared: &intent.volumes,
            freshness,
        },
        rng,
    )?;
    host_ports.claim(spec, &placement, machines)?;

    let mut operations = Vec::new();
    let mut removals = Vec::new();
    // A Machine observed down is left alone: nothing can reach it to change its containers.
    for m in machines.iter().filter(|m| is_up(m)) {
        let machine_id = &m.machine.info.id;
        let want = placement.wanted(machine_id);
        if want > 0 {
            volumes.provide(machine_id, spec, &intent.volumes);
        }
        let mine = existing
            .iter()
            .copied()
            .filter(|c| &c.machine_id == machine_id)
            .collect();
        let removed = operations::for_machine(
            &mut operations,
            &operations::MachineRequest {
                machine_id,
                service_id: &service_id,
                spec,
                want,
                freshness,
            },
            mine,
        );
        removals.extend(
            removed
                .into_iter()
                .map(|c| operations::removal(machine_id, c)),
        );
    }
    operations.extend(removals);
    operations::insert_pre_deploy_hook(&mut operations, &service_id, spec);
    Ok(service_plan(
        spec, service_id, &existing, &placement, operations,
    ))
}

/// The Service's part of the plan, with what the preview shows about it.
fn service_plan(
    spec: &ServiceSpec,
    service_id: ServiceId,
    existing: &[&ContainerRuntimeObservation],
    placement: &Placement<'_>,
    operations: Vec<Operation>,
) -> ServicePlan {
    let image = spec.container.image.clone();
    let previous_image = existing
        .iter()
        .filter(|c| c.is_running())
        .map(|c| c.image.clone())
        .find(|i| normalize_image(i) != normalize_image(&image));
    ServicePlan {
        service_id,
        name: spec.name.clone(),
        mode: spec.mode,
        is_new: existing.is_empty(),
        replicas: match spec.mode {
            ServiceMode::Replicated => spec.replicas,
            ServiceMode::Global => placement.machine_count(),
        },
        previous_image,
        image,
        operations,
    }
}

/// Whether a Machine may be changed: one observed down is left alone.
fn is_up(m: &MachineSnapshot) -> bool {
    m.machine.membership != MembershipObservation::Down
}

fn container_ref(c: &ContainerRuntimeObservation) -> ContainerRef {
    ContainerRef {
        id: c.id.clone(),
        name: c.name.clone(),
    }
}
