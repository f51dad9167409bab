//! `ployz volume`: Docker Volumes on the connected Machine.

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
    /// Show one Docker Volume.
    Inspect {
        name: String,
        #[arg(long)]
        json: bool,
    },
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
        VolumeCommand::Inspect { name, json } => {
            let mut client = super::connect(global).await?;
            let all: Vec<DockerVolume> = client.get(paths::VOLUMES).await?;
            let v = all.iter().find(|v| v.name == name).ok_or_else(|| {
                anyhow!("no volume '{name}' on this Machine; `ployz volume ls` lists them")
            })?;
            if json {
                return print_json(v);
            }
            println!("Name:    {}", v.name);
            println!("Driver:  {}", v.driver);
            println!("Machine: {}", v.machine_id);
            for (k, val) in &v.labels {
                println!("Label:   {k}={val}");
            }
            Ok(())
        }
        VolumeCommand::Rm(args) => {
            if !args.yes {
                super::deploy::confirm(&format!(
                    "Remove volume(s) {}? Their data is lost.",
                    args.names.join(", ")
                ))?;
            }
            let mut client = super::connect(global).await?;
            for name in &args.names {
                client
                    .delete(&format!(
                        "{}?force={}",
                        paths::fill(paths::VOLUME, name),
                        args.force
                    ))
                    .await?;
                println!("Volume '{name}' removed.");
            }
            Ok(())
        }
    }
}
