//! `ployz history` and `ployz rollback`: the Resolved Service Specs a Service ran, as the store
//! keeps them after each Deploy that changed it, and deploying one of them again through the
//! same preview, confirmation, drain and health gates as any Deploy.

use anyhow::{anyhow, bail};
use clap::Args;
use ployz_core::api::{self, ServiceRevision};
use ployz_core::{
    ContainerKind, ContainerRuntimeObservation, ContainerState, DeployIntent, ServiceId,
    ServiceMode, ServiceSpec,
};
use ployz_orchestrator::plan::same_container_config;

use super::deploy::{deploy_intent, Flow};
use super::service::{one_service, services, Everywhere};
use crate::output::{print_json, print_table, table};
use crate::GlobalArgs;

#[derive(Debug, Args)]
pub struct HistoryArgs {
    /// The Service: a name or Service ID.
    service: String,
    /// Print JSON: the revisions, oldest first, each with its spec.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct RollbackArgs {
    /// The Service: a name or Service ID.
    service: String,
    /// The revision to deploy again (`ployz history` lists them) [default: the newest one that
    /// is not what runs now].
    #[arg(long, value_name = "REVISION")]
    to: Option<u64>,
    /// Deploy without asking for confirmation.
    #[arg(short = 'y', long, env = "PLOYZ_AUTO_CONFIRM")]
    yes: bool,
    /// Print the Deploy Preview and stop.
    #[arg(long)]
    dry_run: bool,
}

/// What runs of one Service now, as its running containers say it.
///
/// A Deploy keeps a container whose configuration did not change, with the spec it was
/// created with: after a change of replicas, hooks or update settings alone, the containers
/// carry different specs, none of them the one deployed. So what runs is compared by what makes
/// the containers (their configuration, ports, routes, placement) and by how many run.
#[derive(Debug, Clone)]
pub struct Running {
    /// The spec of the newest running container.
    spec: ServiceSpec,
    /// How many run.
    count: usize,
}

impl Running {
    /// The Service's running containers among `containers`, or `None` when none runs.
    pub fn of<'a>(
        containers: impl IntoIterator<Item = &'a ContainerRuntimeObservation>,
        service: &ServiceId,
    ) -> Option<Running> {
        let running: Vec<&ContainerRuntimeObservation> = containers
            .into_iter()
            .filter(|c| &c.service_id == service && c.kind == ContainerKind::Service)
            .filter(|c| c.state == ContainerState::Running && c.spec.is_some())
            .collect();
        let newest = running
            .iter()
            .max_by_key(|c| (c.created_at, c.name.as_str()))?;
        let spec = newest.spec.clone()?;
        // Containers of another configuration (draining after a Deploy, or on a Machine a
        // Deploy left out) are not what runs now.
        let count = running
            .iter()
            .filter(|c| {
                c.spec
                    .as_ref()
                    .is_some_and(|s| same_container_config(s, &spec))
            })
            .count();
        Some(Running { spec, count })
    }

    /// Whether `spec` makes the containers that run (however many).
    pub fn same_containers(&self, spec: &ServiceSpec) -> bool {
        same_container_config(&self.spec, spec)
    }

    /// Whether `spec` is what runs: the same containers, and for a replicated Service as many.
    pub fn is(&self, spec: &ServiceSpec) -> bool {
        self.same_containers(spec)
            && (spec.mode != ServiceMode::Replicated || spec.replicas as usize == self.count)
    }

    /// What runs as one spec: the newest container's, with a replicated Service's replicas as
    /// many as run.
    pub fn spec(&self) -> ServiceSpec {
        let mut spec = self.spec.clone();
        if spec.mode == ServiceMode::Replicated {
            spec.replicas = u32::try_from(self.count).unwrap_or(u32::MAX);
        }
        spec
    }
}

/// The Service's revisions, and what runs of it.
async fn revisions(
    client: &mut crate::client::ApiClient,
    selector: &str,
) -> anyhow::Result<(String, Vec<ServiceRevision>, Option<Running>)> {
    let everywhere = Everywhere::ask(client, &[]).await?;
    let all = services(&everywhere.containers);
    let service = one_service(&all, selector)?;
    let running = Running::of(&everywhere.containers, &service.id);
    for f in &everywhere.failures {
        eprintln!(
            "warning: Machine {} did not answer ({}); what runs there is not counted",
            everywhere
                .names
                .iter()
                .find(|(id, _)| id.as_str() == f.target)
                .map_or(f.target.as_str(), |(_, name)| name.as_str()),
            f.reason
        );
    }
    let kept = kept_revisions(client, &service.id).await?;
    Ok((service.name.clone(), kept, running))
}

/// The revisions the store keeps of a Service, oldest first.
pub async fn kept_revisions(
    client: &mut crate::client::ApiClient,
    service: &ServiceId,
) -> anyhow::Result<Vec<ServiceRevision>> {
    client
        .get(&format!("{}?service={}", api::paths::REVISIONS, service))
        .await
}

/// The revision that runs: the newest kept one whose spec is what runs; failing that (a
/// replica not running, a Machine that did not answer), the newest that makes the same
/// containers.
fn running_revision<'a>(
    kept: &'a [ServiceRevision],
    running: Option<&Running>,
) -> Option<&'a ServiceRevision> {
    let running = running?;
    kept.iter()
        .rev()
        .find(|r| running.is(&r.spec))
        .or_else(|| kept.iter().rev().find(|r| running.same_containers(&r.spec)))
}

/// Whether two specs run the same: the same containers, as many for a replicated Service.
fn equivalent(a: &ServiceSpec, b: &ServiceSpec) -> bool {
    same_container_config(a, b) && (a.mode != ServiceMode::Replicated || a.replicas == b.replicas)
}

fn when(unix: u64) -> String {
    time::OffsetDateTime::from_unix_timestamp(unix as i64)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| unix.to_string())
}

pub async fn history(global: &GlobalArgs, args: HistoryArgs) -> anyhow::Result<()> {
    let mut client = super::connect(global).await?;
    let (name, kept, running) = revisions(&mut client, &args.service).await?;
    if args.json {
        return print_json(&kept);
    }
    if kept.is_empty() {
        println!("No revisions of '{name}' are kept yet: each Deploy that changes it keeps one.");
        return Ok(());
    }
    let runs = running_revision(&kept, running.as_ref()).map(|r| r.revision);
    let mut t = table(&["REVISION", "RECORDED", "BY", "IMAGE", "SPEC", ""]);
    for r in &kept {
        t.add_row(vec![
            r.revision.to_string(),
            when(r.recorded_at),
            r.by.clone(),
            r.spec.container.image.clone(),
            r.spec_digest.clone(),
            if runs == Some(r.revision) {
                "running".to_owned()
            } else {
                String::new()
            },
        ]);
    }
    print_table(&t);
    Ok(())
}

/// The revision `rollback` deploys: `to`, or the newest whose spec is not what runs now.
pub fn choose<'a>(
    kept: &'a [ServiceRevision],
    running: Option<&Running>,
    to: Option<u64>,
) -> anyhow::Result<&'a ServiceRevision> {
    match to {
        Some(n) => kept.iter().find(|r| r.revision == n).ok_or_else(|| {
            let listed: Vec<String> = kept.iter().map(|r| r.revision.to_string()).collect();
            anyhow!(
                "--to {n}: no such revision is kept (kept: {}); `ployz history` lists them",
                if listed.is_empty() {
                    "none".to_owned()
                } else {
                    listed.join(", ")
                }
            )
        }),
        None => kept
            .iter()
            .rev()
            .find(|r| {
                !running_revision(kept, running).is_some_and(|x| equivalent(&x.spec, &r.spec))
            })
            .ok_or_else(|| {
                anyhow!("no kept revision differs from what runs now; `ployz history` lists them")
            }),
    }
}

pub async fn rollback(global: &GlobalArgs, args: RollbackArgs) -> anyhow::Result<()> {
    let mut client = super::connect(global).await?;
    let (name, kept, running) = revisions(&mut client, &args.service).await?;
    let target = choose(&kept, running.as_ref(), args.to)?;
    if !target.spec.container.secrets.is_empty() {
        bail!(
            "service '{name}': revision {} mounts secrets, which a revision keeps by digest only; deploy that release from its Compose file instead",
            target.revision
        );
    }
    let intent = DeployIntent {
        services: vec![target.spec.clone()],
        attempts: vec![target.spec.name.clone()],
        volumes: Vec::new(),
    };
    let mut flow = Flow::confirmed(args.yes);
    flow.dry_run = args.dry_run;
    flow.command = Some(format!(
        "rollback of {name} to revision {}",
        target.revision
    ));
    eprintln!(
        "Rolling '{name}' back to revision {} ({}, recorded {} by {}).",
        target.revision,
        target.spec.container.image,
        when(target.recorded_at),
        target.by
    );
    deploy_intent(&mut client, &intent, Vec::new(), &flow).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(env: &str, replicas: u32) -> ServiceSpec {
        serde_json::from_value(serde_json::json!({
            "name": "web",
            "mode": "replicated",
            "replicas": replicas,
            "container": {"image": "app:1", "env": {"VER": env}},
        }))
        .unwrap()
    }

    fn revision(n: u64, spec: ServiceSpec) -> ServiceRevision {
        ServiceRevision {
            service_id: "0123456789abcdef0123456789abcdef".parse().unwrap(),
            revision: n,
            recorded_at: 0,
            by: "me@here".into(),
            spec_digest: format!("digest-{n}"),
            spec,
        }
    }

    fn container(n: i64, spec: ServiceSpec) -> ContainerRuntimeObservation {
        serde_json::from_value(serde_json::json!({
            "id": format!("{n:064x}"),
            "name": format!("web-{n}"),
            "machine_id": "fedcba9876543210fedcba9876543210",
            "service_id": "0123456789abcdef0123456789abcdef",
            "service_name": "web",
            "kind": "service",
            "state": "running",
            "restart_count": 0,
            "image": "app:1",
            "created_at": n,
            "spec": spec,
        }))
        .unwrap()
    }

    fn service() -> ServiceId {
        "0123456789abcdef0123456789abcdef".parse().unwrap()
    }

    #[test]
    fn rollback_picks_the_newest_revision_that_is_not_running_or_the_one_asked() {
        let kept = vec![
            revision(1, spec("a", 1)),
            revision(2, spec("b", 1)),
            revision(3, spec("c", 1)),
        ];
        let runs = |env: &str| Running::of(&[container(1, spec(env, 1))], &service()).unwrap();
        assert_eq!(choose(&kept, Some(&runs("c")), None).unwrap().revision, 2);
        // Running b after a rollback: the newest other revision is the one rolled back from
        // (as `kubectl rollout undo` toggles); --to goes further back.
        assert_eq!(choose(&kept, Some(&runs("b")), None).unwrap().revision, 3);
        assert_eq!(
            choose(&kept, Some(&runs("c")), Some(1)).unwrap().revision,
            1
        );
        let err = choose(&kept, Some(&runs("c")), Some(9))
            .unwrap_err()
            .to_string();
        assert!(err.contains("kept: 1, 2, 3"), "{err}");
        let only = vec![revision(1, spec("a", 1))];
        assert!(choose(&only, Some(&runs("a")), None).is_err());
    }

    #[test]
    fn what_runs_after_a_change_of_replicas_alone_is_the_newest_spec_with_as_many_replicas() {
        // a with 2 replicas, then 4: the Deploy kept the first two, which still say 2.
        let containers = [
            container(1, spec("a", 2)),
            container(2, spec("a", 2)),
            container(3, spec("a", 4)),
            container(4, spec("a", 4)),
        ];
        let running = Running::of(&containers, &service()).unwrap();
        assert_eq!(running.spec(), spec("a", 4));
        assert!(running.is(&spec("a", 4)));
        assert!(!running.is(&spec("a", 2)), "2 replicas taken for 4 running");
        // Kept: a×2, a×4, b×4. Rolling back from b×4 gives a×4, not a×2 (half the capacity).
        let kept = vec![
            revision(1, spec("a", 2)),
            revision(2, spec("a", 4)),
            revision(3, spec("b", 4)),
        ];
        let b: Vec<_> = (5..9).map(|n| container(n, spec("b", 4))).collect();
        let on_b = Running::of(&b, &service()).unwrap();
        assert_eq!(
            running_revision(&kept, Some(&on_b)).map(|r| r.revision),
            Some(3)
        );
        assert_eq!(choose(&kept, Some(&on_b), None).unwrap().revision, 2);
        // Scaled down from 4 to 2: the two kept say 4, and 2 run.
        let down = Running::of(
            &containers[..2]
                .iter()
                .map(|c| {
                    let mut c = c.clone();
                    c.spec = Some(spec("a", 4));
                    c
                })
                .collect::<Vec<_>>(),
            &service(),
        )
        .unwrap();
        assert_eq!(down.spec(), spec("a", 2));
        // One of b's four is down (or on a Machine that did not answer): b still runs, and
        // a rollback goes back to a, not to b again.
        let three = Running::of(&b[..3], &service()).unwrap();
        assert_eq!(
            running_revision(&kept, Some(&three)).map(|r| r.revision),
            Some(3)
        );
        assert_eq!(choose(&kept, Some(&three), None).unwrap().revision, 2);
        // Right after a Deploy, the old release's containers still drain beside the new ones:
        // only the new configuration's count.
        let mut both = containers.to_vec();
        both.extend(b.iter().cloned());
        let after = Running::of(&both, &service()).unwrap();
        assert_eq!(after.spec(), spec("b", 4));
        // Nothing runs: no revision is marked, and the newest is the one rolled back to.
        assert!(running_revision(&kept, None).is_none());
        assert_eq!(choose(&kept, None, None).unwrap().revision, 3);
    }
}
