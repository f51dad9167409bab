//! `ployz machine`: init, ls.

use clap::{Args, Subcommand};
use ployz_core::api::{self, MachineInitRequest, MachineList, MachineView};
use ployz_core::MachineName;

use crate::output::{print_json, print_table, table};
use crate::GlobalArgs;

#[derive(Debug, Subcommand)]
pub enum MachineCommand {
    /// Create this Cluster's first Machine on the daemon reached.
    Init(InitArgs),
    /// List the Machines the daemon reached observes.
    #[command(visible_alias = "list")]
    Ls(LsArgs),
    /// Change the Machine the daemon reached runs on.
    Update(UpdateArgs),
}

#[derive(Debug, Args)]
pub struct UpdateArgs {
    /// A public address of this Machine (repeatable); replaces the current ones.
    #[arg(
        long = "public-ip",
        value_name = "IP",
        required_unless_present = "detect_public_ip"
    )]
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
}

pub async fn run(global: &GlobalArgs, cmd: MachineCommand) -> anyhow::Result<()> {
    match cmd {
        MachineCommand::Init(args) => init(global, args).await,
        MachineCommand::Ls(args) => ls(global, args).await,
        MachineCommand::Update(args) => update(global, args).await,
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
    let mut client = super::connect(global).await?;
    let now: api::PublicAddresses = client
        .put(
            api::paths::MACHINE_PUBLIC_ADDRESSES,
            &api::SetPublicAddressesRequest {
                addresses: if args.detect_public_ip {
                    Vec::new()
                } else {
                    args.public_ips
                },
            },
        )
        .await?;
    if args.json {
        return print_json(&now);
    }
    println!("Public addresses: {}.", describe_public(&now));
    Ok(())
}

async fn init(global: &GlobalArgs, args: InitArgs) -> anyhow::Result<()> {
    // Refuse a bad name before reaching anything.
    if let Some(name) = &args.name {
        name.parse::<MachineName>()
            .map_err(|e| anyhow::anyhow!("--name: {e}"))?;
    }
    let mut client = super::connect(global).await?;
    let view: MachineView = client
        .post(
            api::paths::MACHINE_INIT,
            &MachineInitRequest {
                name: args.name,
                public_addresses: args.public_ips,
            },
        )
        .await?;
    if args.json {
        return print_json(&view);
    }
    let info = &view.info;
    println!("Machine '{}' initialised and {}.", info.name, info.phase);
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
    let list: MachineList = client.get(api::paths::MACHINES).await?;
    if args.json {
        return print_json(&list);
    }
    let mut t = table(&["NAME", "ID", "PHASE", "SUBNET", "MEMBERSHIP"]);
    for m in &list.values {
        t.add_row(vec![
            m.info.name.to_string(),
            m.info.id.to_string(),
            m.info.phase.to_string(),
            m.info.subnet.to_string(),
            m.membership.to_string(),
        ]);
    }
    print_table(&t);
    for f in &list.failures {
        eprintln!("warning: Machine {}: {}", f.target, f.reason);
    }
    Ok(())
}
