//! `ployz volume`: Docker Volumes, on the Machine reached or, with `-m`, on the Machines named
//! (a volume lives on one Machine; the same name on several Machines is several volumes).

use anyhow::{anyhow, bail};
use clap::{Args, Subcommand};
use ployz_core::api::docker_paths as paths;
use ployz_core::{DockerVolume, VolumeSpec};

use crate::output::{print_json, print_table, table};
use crate::GlobalArgs;

#[derive(Debug, Subcommand)]
pub enum VolumeCommand {
    /// Create a Docker Volume.
    Create(CreateArgs),
    /// List Docker Volumes.
    #[command(visible_alias = "list")]
    Ls(LsArgs),
    /// Show a Docker Volume: every volume of that name on the Machines asked.
    Inspect(InspectArgs),
    /// Remove Docker Volumes.
    #[command(visible_alias = "remove")]
    Rm(RmArgs),
}

#[derive(Debug, Args)]
pub struct JsonArg {
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct CreateArgs {
    name: String,
    /// Volume driver [default: local].
    #[arg(short, long)]
    driver: Option<String>,
    /// Labels, KEY=VALUE.
    #[arg(short, long = "label", value_name = "KEY=VALUE")]
    labels: Vec<String>,
    /// Driver options, KEY=VALUE.
    #[arg(short, long = "opt", value_name = "KEY=VALUE")]
    opts: Vec<String>,
    /// The Machine to create it on (a Name or Machine ID) [default: the Machine reached].
    #[arg(short = 'm', long = "machine", value_name = "MACHINE")]
    machine: Option<String>,
}

#[derive(Debug, Args)]
pub struct InspectArgs {
    name: String,
    /// Print JSON: `values` (every volume of that name, each with its `machine_id`) and
    /// `failures`.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    machines: crate::targets::MachinesArg,
}

#[derive(Debug, Args)]
pub struct LsArgs {
    /// Print JSON: `values` (the volumes, each with its `machine_id`) and `failures` (the
    /// Machines that did not answer).
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    machines: crate::targets::MachinesArg,
}

#[derive(Debug, Args)]
pub struct RmArgs {
    #[arg(required = true)]
    names: Vec<String>,
    /// Remove even if a container uses it.
    #[arg(short, long)]
    force: bool,
    /// Do not ask for confirmation.
    #[arg(short = 'y', long, env = "PLOYZ_AUTO_CONFIRM")]
    yes: bool,
    /// Remove it from these Machines only (repeatable) [default: every Machine that holds it].
    #[command(flatten)]
    machines: crate::targets::MachinesArg,
}

fn pairs(
    items: &[String],
    flag: &str,
) -> anyhow::Result<std::collections::BTreeMap<String, String>> {
    items
        .iter()
        .map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .ok_or_else(|| anyhow!("{flag} '{kv}' is not KEY=VALUE"))
        })
        .collect()
}

pub async fn run(global: &GlobalArgs, cmd: VolumeCommand) -> anyhow::Result<()> {
    match cmd {
        VolumeCommand::Create(args) => {
            if args.name.is_empty() || args.name.contains('/') {
                bail!(
                    "volume name '{}' must be non-empty and without '/'",
                    args.name
                );
            }
            let spec = VolumeSpec {
                name: args.name.clone(),
                driver: args.driver,
                driver_opts: pairs(&args.opts, "--opt")?,
                labels: pairs(&args.labels, "--label")?,
                external: false,
            };
            let mut client = super::connect(global).await?;
            let on = match &args.machine {
                None => None,
                Some(m) if m == "*" => {
                    bail!("-m '*': a volume is created on one Machine; name it with -m MACHINE")
                }
                Some(m) => Some(
                    crate::targets::header_for(&mut client, std::slice::from_ref(m))
                        .await?
                        .0,
                ),
            };
            client.set_machine_target(on);
            let v: DockerVolume = client.post(paths::VOLUMES, &spec).await?;
            println!("Volume '{}' created on Machine {}.", v.name, v.machine_id);
            Ok(())
        }
        VolumeCommand::Ls(args) => {
            let mut client = super::connect(global).await?;
            let (answers, failures) = crate::targets::get_all::<Vec<DockerVolume>>(
                &mut client,
                &args.machines.machines,
                paths::VOLUMES,
            )
            .await?;
            let asked = answers.len() + failures.len();
            let mut all: Vec<(String, DockerVolume)> = Vec::new();
            for (machine, volumes) in answers {
                let name = if machine.name.is_empty() {
                    machine.machine.to_string()
                } else {
                    machine.name.clone()
                };
                all.extend(volumes.into_iter().map(|v| (name.clone(), v)));
            }
            if args.json {
                let values: Vec<&DockerVolume> = all.iter().map(|(_, v)| v).collect();
                print_json(&serde_json::json!({ "values": values, "failures": failures }))?;
                return crate::targets::report_failures(&failures, asked);
            }
            let mut t = table(&["NAME", "DRIVER", "MACHINE"]);
            for (machine, v) in &all {
                t.add_row(vec![v.name.clone(), v.driver.clone(), machine.clone()]);
            }
            print_table(&t);
            crate::targets::report_failures(&failures, asked)
        }
        VolumeCommand::Inspect(args) => {
            let mut client = super::connect(global).await?;
            let (found, failures, asked) =
                holding(&mut client, &args.machines.machines, &args.name).await?;
            if found.is_empty() && failures.is_empty() {
                bail!(
                    "no volume '{}' on the Machines asked; `ployz volume ls` lists them",
                    args.name
                );
            }
            if args.json {
                let values: Vec<&DockerVolume> = found.iter().map(|(_, v)| v).collect();
                print_json(&serde_json::json!({ "values": values, "failures": failures }))?;
                return crate::targets::report_failures(&failures, asked);
            }
            for (i, (machine, v)) in found.iter().enumerate() {
                if i > 0 {
                    println!();
                }
                println!("Name:    {}", v.name);
                println!("Driver:  {}", v.driver);
                println!("Machine: {machine} ({})", v.machine_id);
                for (k, val) in &v.labels {
                    println!("Label:   {k}={val}");
                }
            }
            crate::targets::report_failures(&failures, asked)
        }
        VolumeCommand::Rm(args) => {
            if !args.yes {
                super::deploy::confirm(&format!(
                    "Remove volume(s) {}? Their data is lost.",
                    args.names.join(", ")
                ))?;
            }
            let mut client = super::connect(global).await?;
            let mut all_failures = Vec::new();
            let mut asked = 0;
            for name in &args.names {
                let (found, failures, n) =
                    holding(&mut client, &args.machines.machines, name).await?;
                asked = asked.max(n);
                if found.is_empty() && failures.is_empty() {
                    bail!("no volume '{name}' on the Machines asked; `ployz volume ls` lists them");
                }
                for (machine, v) in &found {
                    client.set_machine_target(Some(v.machine_id.to_string()));
                    let removed = client
                        .delete(&format!(
                            "{}?force={}",
                            paths::fill(paths::VOLUME, name),
                            args.force
                        ))
                        .await;
                    client.set_machine_target(None);
                    removed?;
                    println!("Volume '{name}' removed from Machine {machine}.");
                }
                all_failures.extend(failures);
            }
            crate::targets::report_failures(&all_failures, asked)
        }
    }
}

/// Every volume named `name` on the Machines `wanted` names (every Machine by default), with
/// each one's Machine Name; the Machines that did not answer; how many were asked.
async fn holding(
    client: &mut crate::client::ApiClient,
    wanted: &[String],
    name: &str,
) -> anyhow::Result<(
    Vec<(String, DockerVolume)>,
    Vec<ployz_core::TargetFailure>,
    usize,
)> {
    let (answers, failures) =
        crate::targets::get_all::<Vec<DockerVolume>>(client, wanted, paths::VOLUMES).await?;
    let asked = answers.len() + failures.len();
    let mut found = Vec::new();
    for (machine, volumes) in answers {
        let label = if machine.name.is_empty() {
            machine.machine.to_string()
        } else {
            machine.name.clone()
        };
        found.extend(
            volumes
                .into_iter()
                .filter(|v| v.name == name)
                .map(|v| (label.clone(), v)),
        );
    }
    Ok((found, failures, asked))
}
