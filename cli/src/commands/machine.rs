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
}

#[derive(Debug, Args)]
pub struct InitArgs {
    /// The Machine Name [default: the daemon's sanitised hostname].
    #[arg(short, long)]
    name: Option<String>,
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
    }
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
            &MachineInitRequest { name: args.name },
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
