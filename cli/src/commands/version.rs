//! `ployz version`.

use clap::Args;
use ployz_core::api::{self, VersionInfo};
use serde::Serialize;

use crate::output::print_json;
use crate::GlobalArgs;

#[derive(Debug, Args)]
pub struct VersionArgs {
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct Versions {
    client: ClientVersion,
    /// The daemon's answer, when it could be reached.
    daemon: Option<VersionInfo>,
    /// Why the daemon could not be reached.
    #[serde(skip_serializing_if = "Option::is_none")]
    daemon_error: Option<String>,
}

#[derive(Serialize)]
struct ClientVersion {
    version: &'static str,
    api: u32,
}

pub async fn run(global: &GlobalArgs, args: VersionArgs) -> anyhow::Result<()> {
    let daemon = match super::connect(global).await {
        Ok(mut client) => client.get::<VersionInfo>(api::paths::VERSION).await,
        Err(e) => Err(e),
    };
    let versions = Versions {
        client: ClientVersion {
            version: env!("CARGO_PKG_VERSION"),
            api: api::API_VERSION,
        },
        daemon_error: daemon.as_ref().err().map(|e| format!("{e:#}")),
        daemon: daemon.ok(),
    };
    if args.json {
        return print_json(&versions);
    }
    println!(
        "client: {} (api {})",
        versions.client.version, versions.client.api
    );
    match (&versions.daemon, &versions.daemon_error) {
        (Some(d), _) => println!("daemon: {} (api {}, {})", d.version, d.api, d.phase),
        (None, Some(e)) => println!("daemon: unreachable ({e})"),
        (None, None) => {}
    }
    Ok(())
}
