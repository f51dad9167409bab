//! `ployz deploy`: Compose in, Service Containers out.
//!
//! Compose -> Requested Service Specs -> Deploy Intent -> Deploy Snapshot (Live Observation of
//! the entry Machine) -> Deploy Plan -> Deploy Preview -> confirmation -> operations one at a
//! time -> Deploy Outcome.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use anyhow::{anyhow, bail};
use clap::Args;
use ployz_core::api::docker_paths;
use ployz_core::{DeployIntent, DeployOutcome, DeployPreview, MachineSnapshot, ServiceName};
use ployz_orchestrator::compose::{self, ComposeInput};
use ployz_orchestrator::execute::{execute, ExecuteOptions, Progress};
use ployz_orchestrator::plan::{plan, PlanOptions};
use ployz_orchestrator::preview;
use serde::Serialize;

use crate::client::ApiClient;
use crate::target::ApiTarget;
use crate::GlobalArgs;

#[derive(Debug, Args)]
pub struct DeployArgs {
    /// Services to deploy (Service Attempts); default: every Service in the file. Others are
    /// left untouched.
    services: Vec<String>,
    /// Compose files, merged in order [default: compose.yaml, compose.yml, docker-compose.yaml
    /// or docker-compose.yml in the current directory].
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    files: Vec<PathBuf>,
    /// Profiles to enable.
    #[arg(short = 'p', long = "profile", value_name = "PROFILE")]
    profiles: Vec<String>,
    /// Deploy without asking for confirmation.
    #[arg(short = 'y', long, env = "PLOYZ_AUTO_CONFIRM")]
    yes: bool,
    /// Print the Deploy Preview and stop.
    #[arg(long)]
    dry_run: bool,
    /// Replace every container of the deployed Services, up to date or not.
    #[arg(long)]
    recreate: bool,
    /// Do not wait for new containers to prove healthy.
    #[arg(long)]
    skip_health: bool,
    /// Print the preview and the Deploy Outcome as JSON (needs -y or --dry-run).
    #[arg(long)]
    json: bool,
}

/// What `--json` prints.
#[derive(Serialize)]
pub struct DeployReport {
    pub preview: DeployPreview,
    /// `None` for a dry run or when nothing needed doing.
    pub outcome: Option<DeployOutcome>,
}

fn default_files() -> anyhow::Result<Vec<PathBuf>> {
    for name in [
        "compose.yaml",
        "compose.yml",
        "docker-compose.yaml",
        "docker-compose.yml",
    ] {
        let p = PathBuf::from(name);
        if p.exists() {
            return Ok(vec![p]);
        }
    }
    bail!("no Compose file here (compose.yaml, compose.yml, docker-compose.yaml, docker-compose.yml); name one with -f FILE")
}

pub async fn run(global: &GlobalArgs, args: DeployArgs) -> anyhow::Result<()> {
    if args.json && !(args.yes || args.dry_run) {
        bail!("--json cannot prompt for confirmation; add -y to deploy or --dry-run to preview");
    }
    let files = if args.files.is_empty() {
        default_files()?
    } else {
        args.files.clone()
    };
    let env: BTreeMap<String, String> = std::env::vars().collect();
    let project = compose::load(&ComposeInput {
        files,
        profiles: args.profiles.clone(),
        env,
    })
    .map_err(|errors| anyhow!("{errors}"))?;
    let attempts: Vec<ServiceName> = if args.services.is_empty() {
        project.services.iter().map(|s| s.name.clone()).collect()
    } else {
        args.services
            .iter()
            .map(|s| s.parse().map_err(|e| anyhow!("{e}")))
            .collect::<anyhow::Result<_>>()?
    };
    let intent = DeployIntent {
        services: project.services,
        attempts,
        volumes: project.volumes,
    };
    let warnings = project.warnings.iter().map(|w| w.to_string()).collect();
    let mut client = super::connect(global).await?;
    let flow = Flow {
        yes: args.yes,
        dry_run: args.dry_run,
        json: args.json,
        plan: PlanOptions {
            recreate: args.recreate,
            seed: rand_seed(),
        },
        execute: ExecuteOptions {
            skip_health: args.skip_health,
            ..monitor_defaults()
        },
    };
    deploy_intent(&mut client, &intent, warnings, &flow).await
}

/// How one Deploy asks, plans and watches.
pub struct Flow {
    pub yes: bool,
    pub dry_run: bool,
    pub json: bool,
    pub plan: PlanOptions,
    pub execute: ExecuteOptions,
}

impl Flow {
    /// A Deploy that asks (unless `yes`), with default planning and monitoring.
    pub fn confirmed(yes: bool) -> Flow {
        Flow {
            yes,
            dry_run: false,
            json: false,
            plan: PlanOptions {
                recreate: false,
                seed: rand_seed(),
            },
            execute: monitor_defaults(),
        }
    }
}

/// Execute options with `PLOYZ_HEALTH_MONITOR_PERIOD` (seconds) applied.
pub fn monitor_defaults() -> ExecuteOptions {
    let mut opts = ExecuteOptions::default();
    if let Some(secs) = std::env::var("PLOYZ_HEALTH_MONITOR_PERIOD")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
    {
        opts.default_monitor = std::time::Duration::from_secs_f64(secs.max(0.0));
    }
    opts
}

pub fn rand_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Snapshot, plan, preview, confirm, execute, report. Shared by `deploy` and `scale`.
pub async fn deploy_intent(
    client: &mut ApiClient,
    intent: &DeployIntent,
    warnings: Vec<String>,
    flow: &Flow,
) -> anyhow::Result<()> {
    let snapshot: MachineSnapshot = client.get(docker_paths::SNAPSHOT).await?;
    let machines = vec![snapshot];
    let plan = plan(intent, &machines, &flow.plan)?;
    let preview = DeployPreview { plan, warnings };
    if !flow.json {
        print!("{}", preview::render(&preview, &machines));
    }
    if preview.plan.is_empty() || flow.dry_run {
        if flow.json {
            crate::output::print_json(&DeployReport {
                preview,
                outcome: None,
            })?;
        }
        return Ok(());
    }
    if !flow.yes {
        confirm("Proceed with deployment?")?;
    }
    let machine = machines[0].machine.info.id.clone();
    let total = preview.plan.operations().count();
    let mut step = 0;
    let quiet = flow.json;
    let mut target = ApiTarget { client, machine };
    let outcome = execute(&preview.plan, &mut target, &flow.execute, |p| {
        if quiet {
            return;
        }
        match p {
            Progress::Started(op) => {
                step += 1;
                eprintln!("[{step}/{total}] {} ...", preview::describe(op, &machines));
            }
            Progress::Finished(_, Some(c)) => eprintln!("        done: {}", c.name),
            Progress::Finished(_, None) => eprintln!("        done"),
            Progress::Failed(_, reason) => eprintln!("        failed: {reason}"),
        }
    })
    .await;
    if flow.json {
        crate::output::print_json(&DeployReport {
            preview: preview.clone(),
            outcome: Some(outcome.clone()),
        })?;
    } else {
        print_outcome(&outcome, &machines);
    }
    if let Some(failed) = &outcome.failed {
        bail!(
            "deploy failed at '{}': {}",
            preview::describe(&failed.operation, &machines),
            failed.reason
        );
    }
    Ok(())
}

fn print_outcome(outcome: &DeployOutcome, machines: &[MachineSnapshot]) {
    match &outcome.failed {
        None => println!(
            "Deploy completed: {} operation{}.",
            outcome.completed.len(),
            if outcome.completed.len() == 1 {
                ""
            } else {
                "s"
            }
        ),
        Some(f) => {
            println!("Deploy failed.");
            println!(
                "  failed:      {}",
                preview::describe(&f.operation, machines)
            );
            println!("  reason:      {}", f.reason);
            if let Some(c) = &f.container {
                println!("  kept:        {} (stopped, for inspection)", c.name);
            }
            if !f.logs.is_empty() {
                println!("  last log lines:");
                for l in &f.logs {
                    println!("    {l}");
                }
            }
            println!("  completed:   {} operations", outcome.completed.len());
            println!("  not run:     {} operations", outcome.unexecuted.len());
            for op in &outcome.unexecuted {
                println!("    {}", preview::describe(op, machines));
            }
            if let Some(c) = &outcome.compensation {
                match &c.error {
                    None => println!("  compensation: {}", c.action),
                    Some(e) => println!("  compensation: {} FAILED: {e}", c.action),
                }
            }
        }
    }
}

/// Asks on the terminal; without one, refuses instead of assuming yes.
pub fn confirm(question: &str) -> anyhow::Result<()> {
    if !std::io::stdin().is_terminal() {
        bail!("no terminal to confirm on; pass -y to proceed without a prompt");
    }
    print!("{question} [y/N] ");
    std::io::stdout().flush()?;
    let mut answer = String::new();
    std::io::stdin().read_line(&mut answer)?;
    if matches!(answer.trim(), "y" | "Y" | "yes" | "Yes") {
        Ok(())
    } else {
        bail!("cancelled; nothing was changed")
    }
}
