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
//! [`plan`] calls one module per step, Service by Service; a Service that cannot be planned is
//! left out and the next one planned, and every problem found is returned together
//! ([`PlanErrors`]):
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

pub mod binding;
mod edge_features;
mod host_ports;
mod identity;
mod interrupted;
mod operations;
mod placement;
mod update_order;
mod volumes;

pub use identity::same_container_config;

use ployz_core::{
    ContainerRef, ContainerRuntimeObservation, DeployIntent, DeployPlan, HostProtocol,
    ImageTransfer, ListenerRole, MachineSnapshot, MembershipObservation, NotIncluded, Operation,
    PullPolicy, ServiceId, ServiceMode, ServicePlan, ServiceSpec,
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
    /// The Machines the Deploy Snapshot leaves out: a Service whose `x-machines` names one is
    /// refused (it would run elsewhere, or not at all, without anyone asking for that).
    pub not_included: Vec<NotIncluded>,
    /// Images the CLI built: a Machine that lacks one gets it from the CLI's Docker.
    pub built: Vec<String>,
}

/// Why one Service (or one Service Attempt) could not be planned. Every variant names what to
/// change.
///
/// Every variant's text is `<what is wrong>; <what to do>`, the first `; ` between the two and
/// none in what is wrong: [`PlanError::message`] and [`PlanError::fix`] are the two halves, for
/// reports that show them apart (`ployz deploy --json`).
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
    #[error("service '{name}': no Machine can run it ({why}); {}", no_machine_fix(.why))]
    NoEligibleMachine { name: String, why: String },
    #[error("service '{name}' names Machine {machine} in x-machines, but this Deploy cannot include it ({reason}); bring it back (`ployz machine ls` shows how the entry Machine observes it) or leave it out of x-machines")]
    PinnedMachineNotIncluded {
        name: String,
        machine: String,
        reason: String,
    },
    #[error("service '{name}' runs only on Machine {machine}, which this Deploy cannot include ({reason}), and planned on the others it would be a second Service with new, empty volumes; bring Machine {machine} back (`ployz machine ls` shows how the entry Machine observes it), remove it (`ployz machine rm {machine}`) if it is gone for good, or deploy the other Services by name")]
    OnlyOnMachineNotIncluded {
        name: String,
        machine: String,
        reason: String,
    },
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
    #[error("service '{name}' routes {path} of '{hostname}', which Service '{owner}' ({owner_id}) already routes; give one of them another path in x-routes, or remove that Service")]
    RouteClaimed {
        name: String,
        hostname: String,
        path: String,
        owner: String,
        owner_id: String,
    },
    #[error("service '{name}' has the DNS name {label}.internal, which Service '{owner}' ({owner_id}) already answers at; rename '{name}', or remove that Service (`ployz rm {owner_id}`)")]
    DnsLabelTaken {
        name: String,
        label: String,
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
    #[error("service '{name}' takes port {port}/{protocol}, which Service '{owner}' ({owner_id}) already takes ({how}); an Ingress Port is held on every Machine's edge, so give one of them another port")]
    IngressPortTaken {
        name: String,
        port: u16,
        protocol: HostProtocol,
        owner: String,
        owner_id: String,
        /// How the owner holds it: as an Ingress Port or as a host port.
        how: &'static str,
    },
    #[error("service '{name}' publishes Ingress Port {port}/{protocol}, which the daemon's {role} holds on Machine {machine} ({address}); publish it on another port ('OTHER:{port}/{protocol}' in x-ports)")]
    IngressPortHeldByDaemon {
        name: String,
        port: u16,
        protocol: HostProtocol,
        machine: String,
        role: ListenerRole,
        address: String,
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
    #[error("service '{name}' on Machine {machine} was left unfinished by {by}: {evidence}; this Deploy does not apply '{name}', so it can neither finish nor undo that: deploy '{name}' too (`ployz deploy {name}` with the Compose file that defines it), or remove it (`ployz rm {name}`)")]
    LeftUnfinished {
        name: String,
        machine: String,
        by: String,
        evidence: String,
    },
    #[error("service '{name}': external volume '{volume}' does not exist on any Machine; create it with `ployz volume create {volume}`")]
    ExternalVolumeMissing { name: String, volume: String },
    #[error("service '{name}' uses {}, which the edge of Machine {machine} does not enforce ({why}): every Machine's edge serves the Service's hostnames, and that one would serve them without it; upgrade Ployz on {machine} first (`ployz machine upgrade`), or remove it from the Cluster if it is gone for good (`ployz machine rm {machine}`)", feature.written_as())]
    EdgeFeatureMissing {
        name: String,
        feature: ployz_core::EdgeFeature,
        machine: String,
        /// What the Machine publishes, or why it was not asked.
        why: String,
    },
}

impl PlanError {
    /// The Service the problem is about, as the Compose file names it.
    pub fn service(&self) -> Option<&str> {
        match self {
            PlanError::UnknownAttempt(name, _)
            | PlanError::AmbiguousService { name, .. }
            | PlanError::ModeChange { name, .. }
            | PlanError::NoEligibleMachine { name, .. }
            | PlanError::PinnedMachineNotIncluded { name, .. }
            | PlanError::OnlyOnMachineNotIncluded { name, .. }
            | PlanError::ImageMissing { name, .. }
            | PlanError::HostnameClaimed { name, .. }
            | PlanError::RouteClaimed { name, .. }
            | PlanError::DnsLabelTaken { name, .. }
            | PlanError::HostPortClash { name, .. }
            | PlanError::HostPortTaken { name, .. }
            | PlanError::HostPortHeldByDaemon { name, .. }
            | PlanError::IngressPortTaken { name, .. }
            | PlanError::IngressPortHeldByDaemon { name, .. }
            | PlanError::LeftUnfinished { name, .. }
            | PlanError::ExternalVolumeMissing { name, .. }
            | PlanError::EdgeFeatureMissing { name, .. } => Some(name),
        }
    }

    /// What is wrong, without what to do about it.
    pub fn message(&self) -> String {
        let text = self.to_string();
        match text.split_once("; ") {
            Some((message, _)) => message.to_owned(),
            None => text,
        }
    }

    /// What to do about it, when the text says.
    pub fn fix(&self) -> Option<String> {
        self.to_string()
            .split_once("; ")
            .map(|(_, fix)| fix.to_owned())
    }
}

/// What to do when no Machine may run a Service, by the reason placement gave.
fn no_machine_fix(why: &str) -> &'static str {
    if why.starts_with("x-machines") {
        "name Machines that exist and are up in x-machines (`ployz machine ls` lists them)"
    } else if why.contains("volumes") {
        "keep the named volumes the Service mounts on one Machine (`ployz volume ls` lists them)"
    } else {
        "`ployz machine ls` shows which Machines are up"
    }
}

/// Every reason one Deploy could not be planned, in the order found: the unknown Service
/// Attempts, then Service by Service. A Service that cannot be planned is skipped and the next
/// one is planned, so one run names every problem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanErrors(pub Vec<PlanError>);

impl PlanErrors {
    /// The problems, in the order found.
    pub fn iter(&self) -> std::slice::Iter<'_, PlanError> {
        self.0.iter()
    }
}

impl std::fmt::Display for PlanErrors {
    /// One problem per line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for PlanErrors {}

impl From<PlanError> for PlanErrors {
    fn from(e: PlanError) -> Self {
        PlanErrors(vec![e])
    }
}

impl<'a> IntoIterator for &'a PlanErrors {
    type Item = &'a PlanError;
    type IntoIter = std::slice::Iter<'a, PlanError>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
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

/// Plans one Deploy, or says every reason it cannot: each attempted Service is planned even
/// when an earlier one could not be (that one is left out of the plan), and the problems of all
/// of them are returned together.
pub fn plan(
    intent: &DeployIntent,
    machines: &[MachineSnapshot],
    opts: &PlanOptions,
) -> Result<DeployPlan, PlanErrors> {
    let mut errors = unknown_attempts(intent);
    let review = interrupted::review(intent, machines);
    errors.extend(review.errors);
    let mut rng = StdRng::seed_from_u64(opts.seed);
    let freshness = Freshness::new(machines, opts, review.distrusted);
    let mut volumes = VolumeLedger::observed(machines);
    let mut host_ports = HostPortLedger::observed(intent, machines);
    let mut services = Vec::new();
    for spec in intent
        .services
        .iter()
        .filter(|s| intent.attempts.contains(&s.name))
    {
        match plan_service(
            spec,
            intent,
            (machines, &opts.not_included),
            &freshness,
            &mut volumes,
            &mut host_ports,
            &mut rng,
        ) {
            Ok(service) => services.push(service),
            Err(problems) => errors.extend(problems),
        }
    }
    if !errors.is_empty() {
        return Err(PlanErrors(errors));
    }
    let transfers = peer_transfers(&services, machines, &opts.built);
    Ok(DeployPlan {
        volume_operations: volumes.into_operations(),
        services,
        transfers,
        left_unverified: review.left_unverified,
    })
}

/// The images Machines get before the operations run: for each container (or hook) to run on a
/// Machine whose snapshot lacks its image, with `pull_policy: missing`, an image the CLI built
/// (in `built`) from the CLI's Docker, any other from another Machine of the snapshot that has
/// it. Each image once per Machine; the source is the first Machine (by Machine ID) that has
/// it. A Machine none has it from pulls from the registry, as it always did.
pub fn peer_transfers(
    services: &[ServicePlan],
    machines: &[MachineSnapshot],
    built: &[String],
) -> Vec<ImageTransfer> {
    let has =
        |m: &MachineSnapshot, image: &str| m.images.iter().any(|i| normalize_image(i) == image);
    let mut sources: Vec<&MachineSnapshot> = machines.iter().collect();
    sources.sort_by(|a, b| a.machine.info.id.cmp(&b.machine.info.id));
    let mut out: Vec<ImageTransfer> = Vec::new();
    for op in services.iter().flat_map(|s| s.operations.iter()) {
        let (machine_id, spec) = match op {
            Operation::RunContainer {
                machine_id, spec, ..
            }
            | Operation::ReplaceContainer {
                machine_id, spec, ..
            }
            | Operation::RunHook {
                machine_id, spec, ..
            } => (machine_id, spec),
            _ => continue,
        };
        if spec.container.pull_policy != PullPolicy::Missing {
            continue;
        }
        let image = normalize_image(&spec.container.image);
        let Some(target) = machines.iter().find(|m| &m.machine.info.id == machine_id) else {
            continue;
        };
        if has(target, &image)
            || out
                .iter()
                .any(|t| &t.machine_id == machine_id && t.image == image)
        {
            continue;
        }
        if built.iter().any(|b| normalize_image(b) == image) {
            out.push(ImageTransfer {
                image,
                machine_id: machine_id.clone(),
                from: None,
            });
        } else if let Some(source) = sources
            .iter()
            .find(|m| &m.machine.info.id != machine_id && has(m, &image))
        {
            out.push(ImageTransfer {
                image,
                machine_id: machine_id.clone(),
                from: Some(source.machine.info.id.clone()),
            });
        }
    }
    out
}

/// The Service Attempts the Compose file does not define, each refused.
fn unknown_attempts(intent: &DeployIntent) -> Vec<PlanError> {
    let names: Vec<&str> = intent.services.iter().map(|s| s.name.as_str()).collect();
    intent
        .attempts
        .iter()
        .filter(|attempt| !intent.services.iter().any(|s| &s.name == *attempt))
        .map(|attempt| PlanError::UnknownAttempt(attempt.to_string(), names.join(", ")))
        .collect()
}

/// Plans one attempted Service: its identity, its placement, then its operations Machine by
/// Machine. The named volumes it needs are added to `volumes`. The checks that do not depend on
/// each other (hostname claims, Name Ambiguity, a mode change, placement) all run, and every
/// problem they find is returned; `volumes` is changed only once none was found.
fn plan_service<'a>(
    spec: &ServiceSpec,
    intent: &DeployIntent,
    (machines, not_included): (&'a [MachineSnapshot], &[NotIncluded]),
    freshness: &Freshness<'_>,
    volumes: &mut VolumeLedger<'a>,
    host_ports: &mut HostPortLedger<'a>,
    rng: &mut StdRng,
) -> Result<ServicePlan, Vec<PlanError>> {
    let mut errors = Vec::new();
    if let Err(e) = identity::check_hostnames(spec, machines) {
        errors.push(e);
    }
    if let Err(e) = identity::check_dns_label(spec, machines) {
        errors.push(e);
    }
    if let Err(e) = host_ports::check_ingress_ports(spec, machines) {
        errors.push(e);
    }
    if let Err(e) = edge_features::check_edge_features(spec, machines, not_included) {
        errors.push(e);
    }
    let existing = identity::containers_of(spec, machines);
    // Containers nowhere in this Deploy but last seen on a Machine it leaves out: the Service
    // is there, not new.
    if existing.is_empty() {
        if let Some(there) = not_included
            .iter()
            .find(|n| n.services.iter().any(|s| s == spec.name.as_str()))
        {
            errors.push(PlanError::OnlyOnMachineNotIncluded {
                name: spec.name.to_string(),
                machine: there.name.clone(),
                reason: there.reason.clone(),
            });
            return Err(errors);
        }
    }
    let service_id = identity::service_id(spec, &existing)
        .map_err(|e| errors.push(e))
        .ok();
    if let Err(e) = identity::check_mode(spec, &existing) {
        errors.push(e);
    }
    let placement = placement::place(
        &placement::Request {
            spec,
            machines,
            existing: &existing,
            volumes,
            declared: &intent.volumes,
            freshness,
            not_included,
        },
        rng,
    )
    .map_err(|e| errors.push(e))
    .ok();
    if let Some(placement) = &placement {
        if let Err(e) = host_ports.claim(spec, placement, machines) {
            errors.push(e);
        }
    }
    let (Some(service_id), Some(placement), true) = (service_id, placement, errors.is_empty())
    else {
        return Err(errors);
    };

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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every variant's text is `<message>; <fix>`, so reports can show the two apart.
    #[test]
    fn every_plan_error_splits_into_message_and_fix() {
        let name = || "web".to_owned();
        let all = [
            PlanError::UnknownAttempt(name(), "api, db".into()),
            PlanError::AmbiguousService {
                name: name(),
                ids: vec!["a".into(), "b".into()],
            },
            PlanError::ModeChange {
                name: name(),
                from: "replicated",
                to: "global",
            },
            PlanError::NoEligibleMachine {
                name: name(),
                why: "x-machines zz matches no Machine that is up".into(),
            },
            PlanError::NoEligibleMachine {
                name: name(),
                why: "no Machine holds all of its volumes".into(),
            },
            PlanError::NoEligibleMachine {
                name: name(),
                why: "every Machine is down".into(),
            },
            PlanError::PinnedMachineNotIncluded {
                name: name(),
                machine: "m3".into(),
                reason: "observed down".into(),
            },
            PlanError::OnlyOnMachineNotIncluded {
                name: name(),
                machine: "m3".into(),
                reason: "observed down".into(),
            },
            PlanError::ImageMissing {
                name: name(),
                image: "app:1".into(),
                machine: "a".into(),
            },
            PlanError::HostnameClaimed {
                name: name(),
                hostname: "app.example.com".into(),
                owner: "old".into(),
                owner_id: "svc-1".into(),
            },
            PlanError::RouteClaimed {
                name: name(),
                hostname: "app.example.com".into(),
                path: "/api/*".into(),
                owner: "old".into(),
                owner_id: "svc-1".into(),
            },
            PlanError::HostPortClash {
                name: name(),
                port: 8080,
                count: 2,
                machine: "a".into(),
            },
            PlanError::ExternalVolumeMissing {
                name: name(),
                volume: "data".into(),
            },
            PlanError::LeftUnfinished {
                name: name(),
                machine: "m1".into(),
                by: "`deploy of web` by ci@runner (pid 7) (lease 3, granted 12:00:00 UTC, never released)".into(),
                evidence: "web-ab12 (running (starting), created under lease 3)".into(),
            },
        ];
        for e in all {
            assert_eq!(e.service(), Some("web"), "{e}");
            let fix = e.fix().unwrap_or_else(|| panic!("no fix: {e}"));
            assert!(!fix.is_empty(), "{e}");
            assert!(!e.message().contains("; "), "{e}");
            assert_eq!(format!("{}; {fix}", e.message()), e.to_string());
        }
    }
}
