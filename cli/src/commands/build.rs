//! `ployz build`: builds the images of a Compose file's Services with `build:`, with the Docker
//! where the CLI runs, each tagged from its inputs as a Deploy tags it; `--push` sends them to
//! the Machines (only the layers each lacks).

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{anyhow, bail};
use clap::Args;
use ployz_compose::{self as compose, ComposeInput};
use ployz_core::{DeployIntent, ServiceName};
use serde::Serialize;

use super::deploy::BuildArgs;
use crate::output::{bytes, print_json};
use crate::GlobalArgs;

#[derive(Debug, Args)]
pub struct BuildCommandArgs {
    /// Services to build [default: every Service with build:].
    services: Vec<String>,
    /// Compose files, merged in order [default: compose.yaml ... in the current directory].
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    files: Vec<PathBuf>,
    /// Profiles to enable [default: those COMPOSE_PROFILES lists, from the environment or
    /// .env]. A Service named here is included whatever its profiles.
    #[arg(short = 'p', long = "profile", value_name = "PROFILE")]
    profiles: Vec<String>,
    #[command(flatten)]
    build: BuildArgs,
    /// Send each image to the Machines (every Machine, or those -m names).
    #[arg(long)]
    push: bool,
    /// Print JSON: per Service, its image and, with --push, each Machine's outcome.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    machines: crate::targets::MachinesArg,
}

#[derive(Serialize)]
struct Built {
    service: String,
    image: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pushed: Option<serde_json::Value>,
}

pub async fn run(global: &GlobalArgs, args: BuildCommandArgs) -> anyhow::Result<()> {
    if !args.machines.machines.is_empty() && !args.push {
        bail!("-m names the Machines to send to: add --push");
    }
    let files = if args.files.is_empty() {
        super::deploy::default_files()?
    } else {
        args.files.clone()
    };
    let loaded = super::deploy::load_naming(
        ComposeInput {
            files,
            profiles: args.profiles.clone(),
            env: std::env::vars().collect(),
        },
        &args.services,
    );
    if !loaded.errors.is_empty() {
        bail!("{}", compose::ComposeErrors(loaded.errors));
    }
    let loaded = loaded.project;
    let with_build: Vec<ServiceName> = loaded.builds.iter().map(|(n, _)| n.clone()).collect();
    let attempts: Vec<ServiceName> = if args.services.is_empty() {
        with_build.clone()
    } else {
        let mut out = Vec::new();
        for s in &args.services {
            let name: ServiceName = s.parse().map_err(|e| anyhow!("{e}"))?;
            if !with_build.contains(&name) {
                bail!(
                    "service '{s}' has no build: in the Compose file; the Services with one are: {}",
                    with_build.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(", ")
                );
            }
            out.push(name);
        }
        out
    };
    if attempts.is_empty() {
        bail!("no Service of the Compose file has build:; nothing to build");
    }
    let mut intent = DeployIntent {
        services: loaded.services,
        attempts: attempts.clone(),
        volumes: Vec::new(),
    };
    super::deploy::prepare_builds(&mut intent, &loaded.builds, &args.build, false, args.json)
        .await?;
    let images: BTreeMap<&ServiceName, &str> = intent
        .services
        .iter()
        .filter(|s| attempts.contains(&s.name))
        .map(|s| (&s.name, s.container.image.as_str()))
        .collect();
    let mut report = Vec::new();
    let mut failures = Vec::new();
    let mut asked = 0;
    for (name, image) in &images {
        let mut pushed = None;
        if args.push {
            let (local, shown) = super::image::local_docker().await?;
            let offer = super::image::local_offer(&local, &shown, image).await?;
            let mut client = super::connect(global).await?;
            let targets = super::image::machines(&mut client, &args.machines.machines).await?;
            drop(client);
            asked = targets.len();
            let (values, f) =
                super::image::push_image(global, &local, &offer, &targets, args.json).await;
            if !args.json {
                let sent: u64 = values.iter().map(|v| v.bytes_sent).sum();
                println!(
                    "{name}: {image} on {} of {} Machines, {} sent.",
                    values.len(),
                    targets.len(),
                    bytes(sent)
                );
            }
            pushed = Some(serde_json::json!({ "values": values, "failures": f }));
            failures.extend(f);
        } else if !args.json {
            println!("{name}: {image}");
        }
        report.push(Built {
            service: name.to_string(),
            image: image.to_string(),
            pushed,
        });
    }
    if args.json {
        print_json(&report)?;
    }
    crate::targets::report_failures(&failures, asked)
}
