//! `ployz machine`: init, add, token, join, ls, rm, rename, update, status, upgrade.

use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::{Args, Subcommand};
use ployz_core::api::{
    self, Admission, AdmitRequest, JoinRequest, MachineInitRequest, MachineList, MachineView,
    Member, RemoveMachineOutcome, RemoveMachineRequest, UpdateMachineRequest, VersionInfo,
};
use ployz_core::{ContainerRuntimeObservation, LocalMachinePhase, MachineName};

use crate::client::ApiClient;
use crate::connection::Connection;

use crate::output::{print_json, print_table, table};
use crate::GlobalArgs;

#[derive(Debug, Subcommand)]
pub enum MachineCommand {
    /// Create this Cluster's first Machine on the daemon reached.
    Init(InitArgs),
    /// Add a Machine to the Cluster of the daemon reached, over SSH to the new host.
    Add(AddArgs),
    /// Print a Join Token of the Machine reached, for a new Machine to join its Cluster with
    /// `ployz machine join TOKEN` (when one CLI cannot reach both hosts).
    Token(TokenArgs),
    /// Join in two steps: on the new Machine, `join TOKEN` takes a Join Token and prints a join
    /// request; on a Machine of the Cluster, `join REQUEST` admits it.
    Join(JoinArgs),
    /// List the Machines the daemon reached observes.
    #[command(visible_alias = "list")]
    Ls(LsArgs),
    /// Remove a Machine from the Cluster (and reset it, when it can be reached).
    #[command(visible_alias = "remove")]
    Rm(RmArgs),
    /// Give a Machine another Machine Name.
    Rename(RenameArgs),
    /// Change a Machine: its public addresses, its WireGuard endpoints.
    Update(UpdateArgs),
    /// Show what a Machine last did to keep its plumbing as it should be, per concern.
    Status(super::machine_status::StatusArgs),
    /// Upgrade Machines to this CLI's own build over SSH, one at a time, each participating
    /// again before the next.
    Upgrade(UpgradeArgs),
}

/// Installing on a host reached over SSH.
#[derive(Debug, Args)]
pub struct InstallArgs {
    /// Install nothing: fail when Ployz (or Docker) is missing on the host.
    #[arg(long)]
    no_install: bool,
    /// Install Docker from the distribution's packages without asking, when it is missing.
    #[arg(short, long)]
    yes: bool,
}

#[derive(Debug, Args)]
pub struct UpgradeArgs {
    /// A Machine to upgrade: its Name or Machine ID (repeatable) [default: every Machine the
    /// current context has an ssh:// connection to; with --connect ssh://..., that host].
    #[arg(short = 'm', long = "machine", value_name = "MACHINE")]
    machines: Vec<String>,
    /// Seconds to wait for each Machine to participate again.
    #[arg(long, default_value_t = 120, value_name = "SECONDS")]
    wait: u64,
    /// Print the outcome as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct AddArgs {
    /// The new host: ssh://user@host[:port]. Ployz is installed there (as the ployz.service
    /// unit) when missing.
    #[arg(value_name = "SSH_URL")]
    host: Connection,
    #[command(flatten)]
    install: InstallArgs,
    /// The Machine Name [default: the new host's sanitised hostname].
    #[arg(short, long)]
    name: Option<String>,
    /// The new Machine's public address: tried first as its WireGuard endpoint.
    #[arg(long = "public-ip", value_name = "IP")]
    public_ip: Option<std::net::IpAddr>,
    /// Seconds to wait for the new Machine to catch up and participate (0: do not wait).
    #[arg(long, default_value_t = 120, value_name = "SECONDS")]
    wait: u64,
    /// Print the new Machine as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct TokenArgs {
    /// Print the token and what it says as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct JoinArgs {
    /// A Join Token (`ployz-join-token:...`, from `ployz machine token`), given to the new
    /// Machine; or a join request (`ployz-join-request:...`, what the new Machine printed),
    /// given to a Machine of the Cluster.
    #[arg(value_name = "TOKEN|REQUEST")]
    text: String,
    /// The Machine Name to take (with a token) or to give (with a request) [default: the new
    /// Machine's sanitised hostname].
    #[arg(short, long)]
    name: Option<String>,
    /// The new Machine's public address: tried first as its WireGuard endpoint.
    #[arg(long = "public-ip", value_name = "IP")]
    public_ip: Option<std::net::IpAddr>,
    /// Seconds to wait: with a token, for this Machine to be admitted and participate; with a
    /// request, for the new Machine to take its grant (0: do not wait) [default: 0 with a
    /// token, 120 with a request].
    #[arg(long, value_name = "SECONDS")]
    wait: Option<u64>,
    /// Print the outcome as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct RmArgs {
    /// The Machine: its Name or Machine ID.
    machine: String,
    /// Remove without asking.
    #[arg(short, long)]
    yes: bool,
    /// Stop and remove its containers too (default: they keep running outside the Cluster).
    #[arg(long)]
    stop_containers: bool,
    /// Print the outcome as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct RenameArgs {
    /// The Machine: its Name or Machine ID.
    machine: String,
    /// Its new Machine Name.
    new_name: String,
    /// Print the member record as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct UpdateArgs {
    /// The Machine (Name or Machine ID) whose WireGuard endpoints `--endpoint` sets [default:
    /// the Machine the CLI reaches].
    machine: Option<String>,
    /// A WireGuard endpoint of the Machine, ADDR:PORT (repeatable); replaces the ones given
    /// before and is tried before the ones it advertises.
    #[arg(long = "endpoint", value_name = "ADDR:PORT")]
    endpoints: Vec<std::net::SocketAddr>,
    /// Forget the endpoints given before.
    #[arg(long, conflicts_with = "endpoints")]
    clear_endpoints: bool,
    /// A public address of this Machine (repeatable); replaces the current ones.
    #[arg(long = "public-ip", value_name = "IP")]
    public_ips: Vec<std::net::IpAddr>,
    /// Detect the public addresses from the Machine's interfaces instead.
    #[arg(long, conflicts_with = "public_ips")]
    detect_public_ip: bool,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct InitArgs {
    /// The host of the Cluster's first Machine: ssh://user@host[:port]. Ployz is installed
    /// there (as the ployz.service unit) when missing, and the connection is saved in the
    /// context [default: the daemon `--connect` or the context reaches].
    #[arg(value_name = "SSH_URL")]
    host: Option<Connection>,
    #[command(flatten)]
    install: InstallArgs,
    /// The Machine Name [default: the daemon's sanitised hostname].
    #[arg(short, long)]
    name: Option<String>,
    /// A public address of this Machine, what its Ingress Hostnames resolve to (repeatable)
    /// [default: the global addresses on its interfaces].
    #[arg(long = "public-ip", value_name = "IP")]
    public_ips: Vec<std::net::IpAddr>,
    /// Print the new Machine as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct LsArgs {
    /// Print JSON: `values` (the Machines) and `failures` (Machines that could not be read).
    #[arg(long)]
    json: bool,
    /// The Machine whose view to show (its roster, its Membership Observations): a Name or
    /// Machine ID [default: the Machine reached]. The call is forwarded to it over the mesh.
    #[arg(short = 'm', long = "machine", value_name = "MACHINE")]
    machine: Option<String>,
}

pub async fn run(global: &GlobalArgs, cmd: MachineCommand) -> anyhow::Result<()> {
    match cmd {
        MachineCommand::Init(args) => init(global, args).await,
        MachineCommand::Add(args) => add(global, args).await,
        MachineCommand::Token(args) => token(global, args).await,
        MachineCommand::Join(args) => join(global, args).await,
        MachineCommand::Ls(args) => ls(global, args).await,
        MachineCommand::Rm(args) => rm(global, args).await,
        MachineCommand::Rename(args) => rename(global, args).await,
        MachineCommand::Update(args) => update(global, args).await,
        MachineCommand::Status(args) => super::machine_status::status(global, args).await,
        MachineCommand::Upgrade(args) => upgrade(global, args).await,
    }
}

fn describe_public(p: &api::PublicAddresses) -> String {
    let list = if p.addresses.is_empty() {
        "none".to_owned()
    } else {
        p.addresses
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    if p.detected {
        format!("{list} (detected)")
    } else {
        list
    }
}

async fn update(global: &GlobalArgs, args: UpdateArgs) -> anyhow::Result<()> {
    let public = !args.public_ips.is_empty() || args.detect_public_ip;
    let endpoints = !args.endpoints.is_empty() || args.clear_endpoints;
    if !public && !endpoints {
        bail!("nothing to change: give --public-ip IP, --detect-public-ip, --endpoint ADDR:PORT or --clear-endpoints");
    }
    if public && args.machine.is_some() {
        bail!("--public-ip and --detect-public-ip change the Machine the CLI reaches: run them with --connect to that Machine, without MACHINE");
    }
    let mut client = super::connect(global).await?;
    let target = match &args.machine {
        Some(m) => {
            let list: MachineList = client.get(api::paths::MACHINES).await?;
            Some(resolve(&list, m)?.info.id.clone())
        }
        None => None,
    };
    let mut result = serde_json::Map::new();
    if public {
        let now: api::PublicAddresses = client
            .put(
                api::paths::MACHINE_PUBLIC_ADDRESSES,
                &api::SetPublicAddressesRequest {
                    addresses: if args.detect_public_ip {
                        Vec::new()
                    } else {
                        args.public_ips.clone()
                    },
                },
            )
            .await?;
        if !args.json {
            println!("Public addresses: {}.", describe_public(&now));
        }
        result.insert("public_addresses".into(), serde_json::to_value(&now)?);
    }
    if endpoints {
        let member: Member = client
            .post(
                api::paths::MACHINE_UPDATE,
                &UpdateMachineRequest {
                    id: target,
                    name: None,
                    endpoints: Some(args.endpoints.clone()),
                },
            )
            .await?;
        if !args.json {
            println!(
                "WireGuard endpoints of '{}' given by hand: {}.",
                member.name,
                list_or_none(&member.endpoints)
            );
        }
        result.insert("member".into(), serde_json::to_value(&member)?);
    }
    if args.json {
        // One change prints its own document (what `--public-ip --json` always printed);
        // both print both, by name.
        return match (result.remove("public_addresses"), result.remove("member")) {
            (Some(p), None) => print_json(&p),
            (None, Some(m)) => print_json(&m),
            (p, m) => print_json(&serde_json::json!({ "public_addresses": p, "member": m })),
        };
    }
    Ok(())
}

fn list_or_none<T: ToString>(items: &[T]) -> String {
    if items.is_empty() {
        "none".to_owned()
    } else {
        items
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The one Machine `wanted` (a Name or a Machine ID) names among those `list` shows; several
/// with that Name are listed with their IDs (Name Ambiguity), none is an error naming the ones
/// there are.
pub(crate) fn resolve<'a>(list: &'a MachineList, wanted: &str) -> anyhow::Result<&'a MachineView> {
    if let Some(v) = list.values.iter().find(|v| v.info.id.as_str() == wanted) {
        return Ok(v);
    }
    let named: Vec<&MachineView> = list
        .values
        .iter()
        .filter(|v| v.info.name.as_str() == wanted)
        .collect();
    match named.as_slice() {
        [one] => Ok(one),
        [] => bail!(
            "no Machine is named or has the ID '{wanted}'; the Machines are: {}",
            list.values
                .iter()
                .map(|v| format!("{} ({})", v.info.name, v.info.id))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        several => bail!(
            "{} Machines are named '{wanted}': {}; give the Machine ID instead",
            several.len(),
            several
                .iter()
                .map(|v| v.info.id.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

async fn add(global: &GlobalArgs, args: AddArgs) -> anyhow::Result<()> {
    if !matches!(args.host, Connection::Ssh(_)) {
        bail!(
            "the new host must be given as ssh://user@host[:port], not '{}'",
            args.host
        );
    }
    if let Some(name) = &args.name {
        name.parse::<MachineName>()
            .map_err(|e| anyhow::anyhow!("--name: {e}"))?;
    }
    let mut entry = super::connect(global).await?;
    let entry_version: VersionInfo = entry.get(api::paths::VERSION).await?;
    if entry_version.phase != LocalMachinePhase::Participating {
        bail!(
            "the Machine the CLI reaches is {}, not participating; add Machines through a participating Machine (`ployz machine ls`)",
            entry_version.phase
        );
    }
    let remote = crate::host::Host::new(&args.host)?;
    crate::host::ensure_installed(&remote, install_options(&args.install, args.json)).await?;
    progress(&args, &format!("reaching {} ...", args.host));
    let mut new = tokio::time::timeout(Duration::from_secs(30), ApiClient::connect(&args.host))
        .await
        .map_err(|_| {
            anyhow::anyhow!(
                "{} did not answer within 30 s; check that the host is reachable over SSH",
                args.host
            )
        })?
        .map_err(|e| missing_daemon(&args.host, e))?;
    let request: JoinRequest =
        tokio::time::timeout(Duration::from_secs(30), new.get(api::paths::JOIN_REQUEST))
            .await
            .map_err(|_| anyhow::anyhow!("the daemon on {} did not answer within 30 s", args.host))?
            .map_err(|e| missing_daemon(&args.host, e))?;
    let admission: Admission = entry
        .post(
            api::paths::MACHINE_ADMIT,
            &AdmitRequest {
                request,
                name: args.name.clone(),
                public_ip: args.public_ip,
                token_cluster: None,
            },
        )
        .await?;
    for w in &admission.warnings {
        eprintln!("warning: {w}");
    }
    let member = admission.grant.member.clone();
    let joined: Result<MachineView, _> = new.post(api::paths::JOIN, &admission.grant).await;
    if let Err(e) = joined {
        // Undo the admission, so that nothing is left half-added.
        let undo: anyhow::Result<RemoveMachineOutcome> = entry
            .post(
                api::paths::MACHINE_REMOVE,
                &RemoveMachineRequest {
                    id: member.id.clone(),
                    stop_containers: false,
                },
            )
            .await;
        let undone = match undo {
            Ok(_) => "its admission was withdrawn".to_owned(),
            Err(u) => format!("withdrawing its admission failed too ({u:#}); remove it with `ployz machine rm {}`", member.id),
        };
        return Err(e.context(format!("the new Machine did not take its grant; {undone}")));
    }
    progress(
        &args,
        &format!(
            "Machine '{}' ({}) admitted with subnet {}; catching up with the Cluster ...",
            member.name, member.id, member.subnet
        ),
    );
    let deadline = Instant::now() + Duration::from_secs(args.wait);
    let mut phase = LocalMachinePhase::Joining;
    while args.wait > 0 && Instant::now() < deadline {
        let v: VersionInfo = new.get(api::paths::VERSION).await?;
        phase = v.phase;
        if phase == LocalMachinePhase::Participating {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let saved = remember(global, &args.host, false)?;
    if args.json {
        return print_json(&serde_json::json!({
            "member": member,
            "phase": phase,
            "warnings": admission.warnings,
        }));
    }
    eprintln!("{saved}");
    if phase == LocalMachinePhase::Participating {
        println!(
            "Machine '{}' ({}) joined and is participating; subnet {}, Management Address {}.",
            member.name, member.id, member.subnet, member.management_address
        );
    } else if args.wait > 0 {
        println!(
            "Machine '{}' ({}) joined and is still {} after {} s; `ployz machine ls` shows when it participates.",
            member.name, member.id, phase, args.wait
        );
    } else {
        println!("Machine '{}' ({}) joined; it participates once its store has caught up (`ployz machine ls`).", member.name, member.id);
    }
    Ok(())
}

fn progress(args: &AddArgs, line: &str) {
    if !args.json {
        eprintln!("{line}");
    }
}

async fn token(global: &GlobalArgs, args: TokenArgs) -> anyhow::Result<()> {
    let mut client = super::connect(global).await?;
    let answer: api::JoinTokenAnswer = client.get(api::paths::JOIN_TOKEN).await?;
    if args.json {
        return print_json(&answer);
    }
    println!("{}", answer.text);
    eprintln!(
        "A Join Token of Machine '{}' ({}) in Cluster {}. It is not a secret and grants nothing.\n\
         On the new Machine, run: ployz machine join <the token>\n\
         It prints a join request; run `ployz machine join <the request>` here to admit it.\n\
         The new Machine must reach this one over UDP at one of: {}.",
        answer.token.name,
        answer.token.machine,
        answer.token.cluster,
        answer
            .token
            .endpoints
            .iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(())
}

async fn join(global: &GlobalArgs, args: JoinArgs) -> anyhow::Result<()> {
    if let Some(name) = &args.name {
        name.parse::<MachineName>()
            .map_err(|e| anyhow::anyhow!("--name: {e}"))?;
    }
    let text = args.text.trim();
    if text.starts_with(api::JOIN_TOKEN_PREFIX) {
        // Check it here too, so a garbled token is refused before the daemon is reached.
        api::JoinToken::from_text(text)?;
        join_with_token(global, &args).await
    } else if text.starts_with(api::JOIN_REQUEST_PREFIX) {
        let request = AdmitRequest::from_text(text)?;
        admit_request(global, &args, request).await
    } else {
        bail!(
            "'{}' is neither a Join Token ('{}...', from `ployz machine token` on a Machine of the Cluster) nor a join request ('{}...', what `ployz machine join TOKEN` printed on the new Machine); copy the whole line",
            shorten(text),
            api::JOIN_TOKEN_PREFIX,
            api::JOIN_REQUEST_PREFIX
        )
    }
}

/// The first characters of a long text, for a message.
fn shorten(text: &str) -> String {
    let mut short: String = text.chars().take(24).collect();
    if short.len() < text.len() {
        short.push_str("...");
    }
    short
}

/// On the new Machine: take the Join Token, print the join request, and wait if asked.
async fn join_with_token(global: &GlobalArgs, args: &JoinArgs) -> anyhow::Result<()> {
    let mut client = super::connect_any(global).await?;
    let pending: api::PendingJoin = client
        .post(
            api::paths::JOIN_PENDING,
            &api::PendingJoinRequest {
                token: args.text.trim().to_owned(),
                name: args.name.clone(),
                public_ip: args.public_ip,
            },
        )
        .await?;
    let wait = args.wait.unwrap_or(0);
    if !args.json {
        println!("{}", pending.request_text);
        eprintln!(
            "This Machine waits to join Cluster {} through Machine '{}' ({}).\n\
             On a Machine of that Cluster, run: ployz machine join <the request above>\n\
             This Machine then fetches its grant from '{}' over WireGuard and joins; `ployz machine join --wait` or `ployz version` here shows when.",
            pending.token.cluster, pending.token.name, pending.token.machine, pending.token.name
        );
    }
    if wait == 0 {
        if args.json {
            return print_json(&pending);
        }
        return Ok(());
    }
    let deadline = Instant::now() + Duration::from_secs(wait);
    let mut last_said: Option<String> = None;
    let mut phase = LocalMachinePhase::Uninitialized;
    while Instant::now() < deadline {
        let version: VersionInfo = client.get(api::paths::VERSION).await?;
        phase = version.phase;
        if phase == LocalMachinePhase::Participating {
            break;
        }
        if phase == LocalMachinePhase::Uninitialized {
            let now: Result<api::PendingJoin, _> = client.get(api::paths::JOIN_PENDING).await;
            let attempt = now.ok().and_then(|p| p.last_attempt);
            if !args.json && attempt.is_some() && attempt != last_said {
                eprintln!("waiting: {}", attempt.as_deref().unwrap_or_default());
                last_said = attempt;
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    if args.json {
        return print_json(&serde_json::json!({
            "pending": pending,
            "phase": phase,
        }));
    }
    match phase {
        LocalMachinePhase::Participating => {
            println!("This Machine joined Cluster {} and is participating.", pending.token.cluster)
        }
        LocalMachinePhase::Uninitialized => bail!(
            "not admitted after {wait} s: {}; the Join Token stays here, so this Machine joins as soon as the request is admitted",
            last_said.unwrap_or_else(|| "no Machine of the Cluster has admitted the request yet".into())
        ),
        other => println!(
            "This Machine joined Cluster {} and is still {other} after {wait} s; `ployz machine ls` shows when it participates.",
            pending.token.cluster
        ),
    }
    Ok(())
}

/// On a Machine of the Cluster: admit the join request, then wait for the new Machine to take
/// its grant over the mesh.
async fn admit_request(
    global: &GlobalArgs,
    args: &JoinArgs,
    mut request: AdmitRequest,
) -> anyhow::Result<()> {
    if args.name.is_some() {
        request.name = args.name.clone();
    }
    if args.public_ip.is_some() {
        request.public_ip = args.public_ip;
    }
    let mut client = super::connect(global).await?;
    let admission: Admission = client.post(api::paths::MACHINE_ADMIT, &request).await?;
    for w in &admission.warnings {
        eprintln!("warning: {w}");
    }
    let member = admission.grant.member.clone();
    if !args.json {
        eprintln!(
            "Machine '{}' ({}) admitted with subnet {}; waiting for it to fetch its grant over the mesh ...",
            member.name, member.id, member.subnet
        );
    }
    let wait = args.wait.unwrap_or(120);
    let deadline = Instant::now() + Duration::from_secs(wait);
    let mut seen: Option<MachineView> = None;
    while wait > 0 && Instant::now() < deadline {
        let list: MachineList = client.get(api::paths::MACHINES).await?;
        // Its own self-description (with its release) arrives once it has joined.
        seen = list
            .values
            .into_iter()
            .find(|v| v.info.id == member.id && !v.info.version.is_empty());
        if seen.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    if args.json {
        return print_json(&serde_json::json!({
            "member": member,
            "phase": seen.as_ref().map(|v| v.info.phase),
            "warnings": admission.warnings,
        }));
    }
    match seen {
        Some(v) => println!(
            "Machine '{}' ({}) took its grant and is {}; subnet {}, Management Address {}.",
            member.name, member.id, v.info.phase, member.subnet, member.management_address
        ),
        None if wait > 0 => println!(
            "Machine '{}' ({}) is admitted but has not taken its grant within {wait} s: it fetches it when it reaches this Machine over WireGuard (`ployz machine join --wait 60 TOKEN` there says what it meets). To withdraw the admission: ployz machine rm {}",
            member.name, member.id, member.id
        ),
        None => println!(
            "Machine '{}' ({}) is admitted; it joins when it next asks for its grant (`ployz machine ls` shows it).",
            member.name, member.id
        ),
    }
    Ok(())
}

/// Reaching the new host failed: most likely no daemon runs there yet.
fn missing_daemon(host: &Connection, e: anyhow::Error) -> anyhow::Error {
    e.context(format!(
        "cannot reach the Ployz daemon on {host}: see `systemctl status ployz` and `journalctl -u ployz` there"
    ))
}

fn install_options(args: &InstallArgs, json: bool) -> crate::host::InstallOptions {
    crate::host::InstallOptions {
        no_install: args.no_install,
        yes: args.yes,
        quiet: json,
    }
}

/// Saves `host` among the connections of a context, so that later commands (and `machine
/// upgrade`) reach it. A server joining a Cluster (`add`) goes into the context in use: the one
/// `-c` names, else the current one. A new Cluster's first server (`create`, `init`) goes into a
/// context of its own, made current: `-c NAME` or `default`, suffixed `-1`, `-2`, … when that
/// one already reaches other servers (another Cluster's, which its connections would otherwise
/// stand in for when this one is down). Nothing is saved when `--connect` was given to reach
/// the Cluster. Returns the line saying what was done.
fn remember(global: &GlobalArgs, host: &Connection, create: bool) -> anyhow::Result<String> {
    use crate::config::CliConfig;
    use crate::connection::ConnectionConfig;
    if global.connect.is_some() && !create {
        return Ok(format!(
            "(reached through --connect: no context changed; `ployz ctx` saves {host})"
        ));
    }
    let path = super::config_path(global);
    let mut cfg = CliConfig::load(&path)?;
    let entry = ConnectionConfig::from_connection(host);
    let name = if create {
        context_for_new_cluster(&cfg, global.context.as_deref(), &entry)?
    } else {
        match global.context.clone().or(cfg.current_context.clone()) {
            Some(n) => n,
            None => {
                return Ok(format!(
                    "(no context in use: {host} is not saved; `ployz ctx add NAME --connect {host}` saves it)"
                ))
            }
        }
    };
    let context = cfg.contexts.entry(name.clone()).or_default();
    let new = !context.connections.contains(&entry);
    if new {
        context.connections.push(entry);
    }
    let made_current = (create || cfg.current_context.is_none())
        && cfg.current_context.as_deref() != Some(name.as_str());
    if made_current {
        cfg.current_context = Some(name.clone());
    }
    cfg.save(&path)?;
    let current = if made_current {
        ", now the current context"
    } else {
        ""
    };
    Ok(if new {
        format!(
            "context '{name}' now reaches {host} ({}{current})",
            path.display()
        )
    } else {
        format!("context '{name}' already reaches {host}{current}")
    })
}

/// The context a new Cluster's first server is saved in: the one `-c` names (`named`), which
/// must reach no other server; else `default`, or the first of `default-1`, `default-2`, …
/// that reaches none but this one.
fn context_for_new_cluster(
    cfg: &crate::config::CliConfig,
    named: Option<&str>,
    entry: &crate::connection::ConnectionConfig,
) -> anyhow::Result<String> {
    let fits = |name: &str| {
        cfg.contexts
            .get(name)
            .is_none_or(|c| c.connections.iter().all(|c| c == entry))
    };
    if let Some(name) = named {
        if !fits(name) {
            anyhow::bail!(
                "context '{name}' already reaches other servers, another Cluster's; the new Cluster needs a context of its own: name another with -c, or leave -c out (`ployz ctx ls` lists them)"
            );
        }
        return Ok(name.to_owned());
    }
    Ok(["default".to_owned()]
        .into_iter()
        .chain((1..).map(|n| format!("default-{n}")))
        .find(|name| fits(name))
        .expect("some suffix is free"))
}

/// One Machine of `machine upgrade`: the Machine and how the CLI reaches its host.
struct UpgradeTarget {
    id: ployz_core::MachineId,
    name: String,
    host: Connection,
}

async fn upgrade(global: &GlobalArgs, args: UpgradeArgs) -> anyhow::Result<()> {
    let options = crate::host::InstallOptions {
        no_install: false,
        yes: false,
        quiet: args.json,
    };
    // Every ssh:// connection the CLI knows, and the Machine each one reaches.
    let candidates: Vec<Connection> = super::connections(global)?
        .into_iter()
        .filter(|c| matches!(c, Connection::Ssh(_)))
        .collect();
    if candidates.is_empty() {
        bail!("`machine upgrade` reaches each Machine's host over SSH, and the CLI knows no ssh:// connection: give --connect ssh://user@host, or a context whose connections are ssh:// (`ployz machine add` saves them)");
    }
    let mut reached = Vec::new();
    let mut unreachable = Vec::new();
    let mut list: Option<MachineList> = None;
    for c in &candidates {
        match ApiClient::connect(c).await {
            Ok(mut client) => match client.get::<VersionInfo>(api::paths::VERSION).await {
                Ok(v) => {
                    if list.is_none() {
                        list = client.get::<MachineList>(api::paths::MACHINES).await.ok();
                    }
                    reached.push((c.clone(), v));
                }
                Err(e) => unreachable.push(format!("{c}: {e:#}")),
            },
            Err(e) => unreachable.push(format!("{c}: {e:#}")),
        }
    }
    let name_of = |id: &ployz_core::MachineId| {
        list.as_ref()
            .and_then(|l| l.values.iter().find(|v| &v.info.id == id))
            .map(|v| v.info.name.to_string())
            .unwrap_or_else(|| id.to_string())
    };
    let mut targets: Vec<UpgradeTarget> = Vec::new();
    for (host, v) in &reached {
        let Some(id) = &v.machine else { continue };
        if targets.iter().any(|t| &t.id == id) {
            continue;
        }
        targets.push(UpgradeTarget {
            id: id.clone(),
            name: name_of(id),
            host: host.clone(),
        });
    }
    if !args.machines.is_empty() {
        let list = list.clone().unwrap_or(MachineList {
            values: Vec::new(),
            failures: Vec::new(),
        });
        let mut chosen = Vec::new();
        for wanted in &args.machines {
            let id = resolve(&list, wanted)?.info.id.clone();
            match targets.iter().position(|t| t.id == id) {
                Some(i) => chosen.push(targets.remove(i)),
                None if chosen.iter().any(|t: &UpgradeTarget| t.id == id) => {}
                None => bail!(
                    "the CLI knows no ssh:// connection to Machine '{wanted}' ({id}){}; add one to the context (`ployz ctx add`) or give --connect ssh://user@host",
                    if unreachable.is_empty() { String::new() } else { format!(" (not reached: {})", unreachable.join("; ")) }
                ),
            }
        }
        targets = chosen;
    } else if !unreachable.is_empty() {
        bail!(
            "not every host answered, and `machine upgrade` upgrades one at a time only a Cluster it can see: {}; name the Machines to upgrade with -m",
            unreachable.join("; ")
        );
    }
    if targets.is_empty() {
        bail!(
            "no initialised Machine among the hosts reached ({}); `ployz machine init` one first",
            candidates
                .iter()
                .map(|c| c.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let mut outcomes = Vec::new();
    for t in &targets {
        if !args.json {
            eprintln!(
                "upgrading Machine '{}' ({}) on {} ...",
                t.name, t.id, t.host
            );
        }
        let host = crate::host::Host::new(&t.host)?;
        let from = crate::host::upgrade(&host, options)
            .await
            .with_context(|| {
                format!(
                    "Machine '{}' was not upgraded{}",
                    t.name,
                    if outcomes.is_empty() {
                        String::new()
                    } else {
                        "; the Machines before it were".to_owned()
                    }
                )
            })?;
        let Some(from) = from else {
            if !args.json {
                eprintln!("Machine '{}' already runs this build", t.name);
            }
            outcomes.push(serde_json::json!({"machine": t.id, "name": t.name, "upgraded": false, "version": crate::host::VERSION}));
            continue;
        };
        // Participating again (and answering with this release) before the next one.
        let deadline = Instant::now() + Duration::from_secs(args.wait);
        let mut phase = None;
        loop {
            if let Ok(mut c) = ApiClient::connect(&t.host).await {
                if let Ok(v) = c.get::<VersionInfo>(api::paths::VERSION).await {
                    if v.version == crate::host::VERSION
                        && v.phase == LocalMachinePhase::Participating
                    {
                        break;
                    }
                    phase = Some(v.phase);
                }
            }
            if Instant::now() >= deadline {
                bail!(
                    "Machine '{}' runs the new build but is {} after {} s; not upgrading the ones after it (`ployz machine ls`)",
                    t.name,
                    phase.map(|p| p.to_string()).unwrap_or_else(|| "not answering".into()),
                    args.wait
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        if !args.json {
            eprintln!(
                "Machine '{}' upgraded from {from} to {} and participating",
                t.name,
                crate::host::VERSION
            );
        }
        outcomes.push(serde_json::json!({"machine": t.id, "name": t.name, "upgraded": true, "from": from, "version": crate::host::VERSION}));
    }
    if args.json {
        return print_json(&serde_json::json!({ "machines": outcomes }));
    }
    println!(
        "{} of {} Machines upgraded to {}.",
        outcomes.iter().filter(|o| o["upgraded"] == true).count(),
        outcomes.len(),
        crate::host::VERSION
    );
    Ok(())
}

async fn rm(global: &GlobalArgs, args: RmArgs) -> anyhow::Result<()> {
    if args.json && !args.yes {
        bail!("--json cannot ask for confirmation; add -y to remove the Machine");
    }
    let mut client = super::connect(global).await?;
    let list: MachineList = client.get(api::paths::MACHINES).await?;
    let target = resolve(&list, &args.machine)?.clone();
    let containers: Vec<ContainerRuntimeObservation> = client
        .get(api::docker_paths::STORED_CONTAINERS)
        .await
        .unwrap_or_default();
    let theirs: Vec<&ContainerRuntimeObservation> = containers
        .iter()
        .filter(|c| c.machine_id == target.info.id)
        .collect();
    if !args.json {
        println!(
            "Removing Machine '{}' ({}, subnet {}) from the Cluster:",
            target.info.name, target.info.id, target.info.subnet
        );
        if theirs.is_empty() {
            println!("  it runs no Service Containers as this Machine observes it.");
        } else {
            println!(
                "  its {} Service Container(s) {}: {}",
                theirs.len(),
                if args.stop_containers {
                    "are stopped and removed"
                } else {
                    "keep running outside the Cluster (no routes, no DNS)"
                },
                theirs
                    .iter()
                    .map(|c| c.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        println!("  its volumes stay on it, and no other Machine has their data.");
    }
    if !args.yes {
        super::deploy::confirm("Remove it?")?;
    }
    let outcome: RemoveMachineOutcome = client
        .post(
            api::paths::MACHINE_REMOVE,
            &RemoveMachineRequest {
                id: target.info.id.clone(),
                stop_containers: args.stop_containers,
            },
        )
        .await
        .context("removing the Machine")?;
    if args.json {
        return print_json(&outcome);
    }
    println!(
        "Machine '{}' ({}) removed from the Cluster.",
        outcome.name, outcome.id
    );
    match &outcome.reset {
        Ok(()) => println!("It was reset to uninitialised; a context's connection to its host is passed over from now on (`ployz ctx add NAME --connect URL...` keeps only the connections you want)."),
        Err(why) => println!("It was not reset ({why}); reset it there, or reinstall it, before it joins a Cluster again."),
    }
    Ok(())
}

async fn rename(global: &GlobalArgs, args: RenameArgs) -> anyhow::Result<()> {
    args.new_name
        .parse::<MachineName>()
        .map_err(|e| anyhow::anyhow!("NEW_NAME: {e}"))?;
    let mut client = super::connect(global).await?;
    let list: MachineList = client.get(api::paths::MACHINES).await?;
    let target = resolve(&list, &args.machine)?;
    let taken: Vec<String> = list
        .values
        .iter()
        .filter(|v| v.info.name.as_str() == args.new_name && v.info.id != target.info.id)
        .map(|v| v.info.id.to_string())
        .collect();
    let member: Member = client
        .post(
            api::paths::MACHINE_UPDATE,
            &UpdateMachineRequest {
                id: Some(target.info.id.clone()),
                name: Some(args.new_name.clone()),
                endpoints: None,
            },
        )
        .await?;
    if !taken.is_empty() {
        eprintln!(
            "warning: Machine Name '{}' is also taken by {}; refer to them by Machine ID",
            args.new_name,
            taken.join(", ")
        );
    }
    if args.json {
        return print_json(&member);
    }
    println!("Machine {} is now named '{}'.", member.id, member.name);
    Ok(())
}

async fn init(global: &GlobalArgs, args: InitArgs) -> anyhow::Result<()> {
    // Refuse a bad name before reaching anything.
    if let Some(name) = &args.name {
        name.parse::<MachineName>()
            .map_err(|e| anyhow::anyhow!("--name: {e}"))?;
    }
    // And a context it could not be saved in (-c naming another Cluster's).
    if let Some(host) = &args.host {
        let cfg = crate::config::CliConfig::load(&super::config_path(global))?;
        let entry = crate::connection::ConnectionConfig::from_connection(host);
        context_for_new_cluster(&cfg, global.context.as_deref(), &entry)?;
    }
    let mut client = match &args.host {
        Some(host) => {
            let remote = crate::host::Host::new(host)?;
            crate::host::ensure_installed(&remote, install_options(&args.install, args.json))
                .await?;
            ApiClient::connect(host)
                .await
                .map_err(|e| missing_daemon(host, e))?
        }
        None => super::connect_any(global).await?,
    };
    let view: MachineView = client
        .post(
            api::paths::MACHINE_INIT,
            &MachineInitRequest {
                name: args.name,
                public_addresses: args.public_ips,
            },
        )
        .await?;
    let saved = match &args.host {
        Some(host) => Some(remember(global, host, true)?),
        None => None,
    };
    if args.json {
        return print_json(&view);
    }
    let info = &view.info;
    println!("Machine '{}' initialised and {}.", info.name, info.phase);
    if let Some(note) = saved {
        eprintln!("{note}");
    }
    println!("  ID                  {}", info.id);
    println!("  Machine Subnet      {}", info.subnet);
    println!("  Machine Gateway     {}", info.subnet.gateway());
    println!("  Management Address  {}", info.management_address);
    println!("  WireGuard key       {}", info.public_key);
    if let Ok(p) = client
        .get::<api::PublicAddresses>(api::paths::MACHINE_PUBLIC_ADDRESSES)
        .await
    {
        println!("  Public addresses    {}", describe_public(&p));
    }
    Ok(())
}

async fn ls(global: &GlobalArgs, args: LsArgs) -> anyhow::Result<()> {
    let mut client = super::connect(global).await?;
    if let Some(wanted) = &args.machine {
        let (header, _) =
            crate::targets::header_for(&mut client, std::slice::from_ref(wanted)).await?;
        if header == "*" {
            bail!("-m '*': `machine ls` shows one Machine's view of the Cluster; name one Machine");
        }
        client.set_machine_target(Some(header));
    }
    let list: MachineList = client.get(api::paths::MACHINES).await?;
    if args.json {
        return print_json(&list);
    }
    let mut t = table(&[
        "NAME",
        "ID",
        "PHASE",
        "MEMBERSHIP",
        "SUBNET",
        "ENDPOINT",
        "WIREGUARD",
    ]);
    for m in &list.values {
        let subnet = if m.subnet_collisions.is_empty() {
            m.info.subnet.to_string()
        } else {
            format!("{} (COLLISION)", m.info.subnet)
        };
        t.add_row(vec![
            m.info.name.to_string(),
            m.info.id.to_string(),
            m.info.phase.to_string(),
            m.membership.to_string(),
            subnet,
            m.selected_endpoint
                .map(|e| e.to_string())
                .unwrap_or_else(|| "-".to_owned()),
            m.info
                .wireguard_backend
                .clone()
                .unwrap_or_else(|| "-".to_owned()),
        ]);
    }
    print_table(&t);
    for m in list
        .values
        .iter()
        .filter(|m| !m.subnet_collisions.is_empty())
    {
        eprintln!(
            "warning: Machine '{}' ({}) shares subnet {} with {}: remove one of them (`ployz machine rm`) and add it again",
            m.info.name,
            m.info.id,
            m.info.subnet,
            m.subnet_collisions.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
        );
    }
    for f in &list.failures {
        eprintln!("warning: Machine {}: {}", f.target, f.reason);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{CliConfig, ContextConfig};
    use crate::connection::ConnectionConfig;

    fn entry(url: &str) -> ConnectionConfig {
        ConnectionConfig::from_connection(&url.parse::<Connection>().unwrap())
    }

    fn with(contexts: &[(&str, &[&str])]) -> CliConfig {
        let mut cfg = CliConfig::default();
        for (name, urls) in contexts {
            cfg.contexts.insert(
                (*name).to_owned(),
                ContextConfig {
                    connections: urls.iter().map(|u| entry(u)).collect(),
                },
            );
        }
        cfg
    }

    #[test]
    fn a_new_cluster_gets_a_context_no_other_cluster_uses() {
        let m1 = entry("ssh://root@m1.example.com");
        // Nothing yet, or a context that reaches only this server: that one.
        let chosen = |cfg: &CliConfig, named: Option<&str>| {
            context_for_new_cluster(cfg, named, &m1).map_err(|e| e.to_string())
        };
        assert_eq!(chosen(&with(&[]), None).unwrap(), "default");
        assert_eq!(
            chosen(&with(&[("default", &["ssh://root@m1.example.com"])]), None).unwrap(),
            "default"
        );
        assert_eq!(chosen(&with(&[("default", &[])]), None).unwrap(), "default");
        // Taken by another Cluster's servers: the first free suffix.
        let taken = with(&[
            ("default", &["ssh://root@a.example.com"]),
            (
                "default-1",
                &["ssh://root@b.example.com", "ssh://root@m1.example.com"],
            ),
        ]);
        assert_eq!(chosen(&taken, None).unwrap(), "default-2");
        // A name given with -c is that one, refused when another Cluster's servers are there.
        assert_eq!(chosen(&taken, Some("prod")).unwrap(), "prod");
        let refused = chosen(&taken, Some("default")).unwrap_err();
        assert!(
            refused.contains("context 'default' already reaches other servers"),
            "{refused}"
        );
    }
}
