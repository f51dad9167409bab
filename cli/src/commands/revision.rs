//! `ployz history` and `ployz rollback`: the Resolved Service Specs a Service ran, as the store
//! keeps them after each Deploy that changed it, and deploying one of them again through the
//! same preview, confirmation, drain and health gates as any Deploy.

use anyhow::{anyhow, bail};
use clap::Args;
use ployz_core::api::{self, ServiceRevision};
use ployz_core::{ContainerKind, ContainerState, DeployIntent};
use ployz_orchestrator::plan::binding::spec_digest;

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

/// The Service's revisions, and the digest of the spec its running containers carry.
async fn revisions(
    client: &mut crate::client::ApiClient,
    selector: &str,
) -> anyhow::Result<(String, Vec<ServiceRevision>, Option<String>)> {
    let everywhere = Everywhere::ask(client, &[]).await?;
    let all = services(&everywhere.containers);
    let service = one_service(&all, selector)?;
    let running = everywhere
        .containers
        .iter()
        .filter(|c| c.service_id == service.id && c.kind == ContainerKind::Service)
        .filter(|c| c.state == ContainerState::Running)
        .find_map(|c| c.spec.as_ref())
        .map(spec_digest);
    let kept: Vec<ServiceRevision> = client
        .get(&format!("{}?service={}", api::paths::REVISIONS, service.id))
        .await?;
    Ok((service.name.clone(), kept, running))
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
    let mut t = table(&["REVISION", "RECORDED", "BY", "IMAGE", "SPEC", ""]);
    for r in &kept {
        t.add_row(vec![
            r.revision.to_string(),
            when(r.recorded_at),
            r.by.clone(),
            r.spec.container.image.clone(),
            r.spec_digest.clone(),
            if running.as_deref() == Some(r.spec_digest.as_str()) {
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
    running: Option<&str>,
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
            .find(|r| Some(r.spec_digest.as_str()) != running)
            .ok_or_else(|| {
                anyhow!("no kept revision differs from what runs now; `ployz history` lists them")
            }),
    }
}

pub async fn rollback(global: &GlobalArgs, args: RollbackArgs) -> anyhow::Result<()> {
    let mut client = super::connect(global).await?;
    let (name, kept, running) = revisions(&mut client, &args.service).await?;
    let target = choose(&kept, running.as_deref(), args.to)?;
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

    fn revision(n: u64, digest: &str) -> ServiceRevision {
        ServiceRevision {
            service_id: "0123456789abcdef0123456789abcdef".parse().unwrap(),
            revision: n,
            recorded_at: 0,
            by: "me@here".into(),
            spec_digest: digest.into(),
            spec: serde_json::from_value(serde_json::json!({
                "name": "web",
                "mode": "replicated",
                "replicas": 1,
                "container": {"image": "app:1"},
            }))
            .unwrap(),
        }
    }

    #[test]
    fn rollback_picks_the_newest_revision_that_is_not_running_or_the_one_asked() {
        let kept = vec![revision(1, "a"), revision(2, "b"), revision(3, "c")];
        assert_eq!(choose(&kept, Some("c"), None).unwrap().revision, 2);
        // Running b after a rollback: the newest other revision is the one rolled back from
        // (as `kubectl rollout undo` toggles); --to goes further back.
        assert_eq!(choose(&kept, Some("b"), None).unwrap().revision, 3);
        assert_eq!(choose(&kept, Some("c"), Some(1)).unwrap().revision, 1);
        let err = choose(&kept, Some("c"), Some(9)).unwrap_err().to_string();
        assert!(err.contains("kept: 1, 2, 3"), "{err}");
        let only = vec![revision(1, "a")];
        assert!(choose(&only, Some("a"), None).is_err());
    }
}
