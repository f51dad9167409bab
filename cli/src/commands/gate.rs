//! `ployz service maintenance|live|pause|resume SERVICE`: Service Gates. Every Machine's edge
//! answers a Service in maintenance with a 503 page, and holds a paused Service's new requests
//! until it is resumed (or the pause ends), then sends them on.

use anyhow::Context as _;
use clap::{Args, Subcommand};
use ployz_core::api::{self, GateRequest, SetGateRequest};
use ployz_core::ServiceGate;

use super::service::{one_service, services, Everywhere};
use crate::output::print_json;
use crate::GlobalArgs;

#[derive(Debug, Subcommand)]
pub enum ServiceCommand {
    /// Answer every request of a Service with a 503 maintenance page, on every Machine's edge.
    Maintenance(MaintenanceArgs),
    /// End maintenance: requests reach the Service's containers again.
    Live(GateArgs),
    /// Hold a Service's new requests at the edges (while it is changed underneath), for at most
    /// --for; they go on once it is resumed.
    Pause(PauseArgs),
    /// Release a paused Service's held requests, and route new ones again.
    Resume(GateArgs),
}

#[derive(Debug, Args)]
pub struct GateArgs {
    /// The Service: its Name or Service ID.
    service: String,
    /// Print the outcome as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct MaintenanceArgs {
    #[command(flatten)]
    gate: GateArgs,
    /// The text of the maintenance page (HTML-escaped; up to 1 KiB).
    #[arg(long, default_value = "")]
    message: String,
}

#[derive(Debug, Args)]
pub struct PauseArgs {
    #[command(flatten)]
    gate: GateArgs,
    /// How long requests may be held at most, e.g. 30s or 2m (at most 5m).
    #[arg(long = "for", value_name = "DURATION", default_value = "30s", value_parser = parse_seconds)]
    seconds: u64,
}

/// `30s`, `2m`, `90`: whole seconds.
fn parse_seconds(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let (number, unit) = match t.strip_suffix('m') {
        Some(n) => (n, 60),
        None => (t.strip_suffix('s').unwrap_or(t), 1),
    };
    number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(unit))
        .filter(|s| (1..=ployz_core::gate::MAX_PAUSE_SECONDS).contains(s))
        .ok_or_else(|| format!("'{text}' is not a duration from 1s to 5m, such as 30s or 2m"))
}

pub async fn run(global: &GlobalArgs, cmd: ServiceCommand) -> anyhow::Result<()> {
    match cmd {
        ServiceCommand::Maintenance(a) => {
            set(
                global,
                &a.gate,
                GateRequest::Maintenance { message: a.message },
            )
            .await
        }
        ServiceCommand::Pause(a) => {
            set(global, &a.gate, GateRequest::Paused { seconds: a.seconds }).await
        }
        ServiceCommand::Live(a) => {
            lift(
                global,
                &a,
                "is live again: its requests reach its containers",
            )
            .await
        }
        ServiceCommand::Resume(a) => {
            lift(
                global,
                &a,
                "is resumed: held requests go on to its containers",
            )
            .await
        }
    }
}

/// The Service `selector` names, from every Machine's containers: (ID, Name).
async fn find(
    client: &mut crate::client::ApiClient,
    selector: &str,
) -> anyhow::Result<(ployz_core::ServiceId, String)> {
    let everywhere = Everywhere::ask(client, &[]).await?;
    let all = services(&everywhere.containers);
    let s = one_service(&all, selector)?;
    Ok((s.id.clone(), s.name.clone()))
}

async fn set(global: &GlobalArgs, args: &GateArgs, gate: GateRequest) -> anyhow::Result<()> {
    let mut client = super::connect(global).await?;
    let (service_id, name) = find(&mut client, &args.service).await?;
    let request = SetGateRequest {
        service_id,
        service_name: name
            .parse()
            .with_context(|| format!("'{name}' is not a Service Name"))?,
        gate,
        set_by: crate::leases::user_at_host(),
    };
    let set: ServiceGate = client.put(api::paths::GATES, &request).await?;
    if args.json {
        return print_json(&set);
    }
    match &request.gate {
        GateRequest::Maintenance { .. } => println!(
            "{name} is in maintenance: every Machine's edge answers its requests with 503 and the page; `ployz service live {name}` ends it"
        ),
        GateRequest::Paused { seconds } => println!(
            "{name} is paused: every Machine's edge holds its new requests for up to {seconds} s; `ployz service resume {name}` releases them"
        ),
    }
    Ok(())
}

async fn lift(global: &GlobalArgs, args: &GateArgs, done: &str) -> anyhow::Result<()> {
    let mut client = super::connect(global).await?;
    let (service_id, name) = find(&mut client, &args.service).await?;
    let answer: serde_json::Value = client
        .delete_value(&format!("{}?service={service_id}", api::paths::GATES))
        .await?;
    let lifted = answer["lifted"].as_bool().unwrap_or(false);
    if args.json {
        return print_json(&serde_json::json!({ "service": name, "lifted": lifted }));
    }
    if lifted {
        println!("{name} {done}");
    } else {
        println!("{name} had no gate: its requests already reach its containers");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pause_durations_are_whole_seconds_up_to_five_minutes() {
        assert_eq!(parse_seconds("30s"), Ok(30));
        assert_eq!(parse_seconds("2m"), Ok(120));
        assert_eq!(parse_seconds("90"), Ok(90));
        for bad in ["0s", "6m", "301", "soon", "-1s", ""] {
            let e = parse_seconds(bad).unwrap_err();
            assert!(e.contains("from 1s to 5m"), "{bad}: {e}");
        }
    }
}
