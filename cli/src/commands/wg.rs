//! `ployz wg show`: the WireGuard interface and peers, as the Machine reached observes them.

use clap::{Args, Subcommand};
use ployz_core::api::{self, MeshStatus};

use crate::output::{print_json, print_table, table};
use crate::GlobalArgs;

#[derive(Debug, Subcommand)]
pub enum WgCommand {
    /// Show the interface and, per peer, the Selected Endpoint, last handshake and traffic.
    Show(ShowArgs),
}

#[derive(Debug, Args)]
pub struct ShowArgs {
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// The Machine whose interface to show, as it observes its peers: a Name or Machine ID
    /// [default: the Machine reached]. The call is forwarded to it over the mesh.
    #[arg(short = 'm', long = "machine", value_name = "MACHINE")]
    machine: Option<String>,
}

pub async fn run(global: &GlobalArgs, cmd: WgCommand) -> anyhow::Result<()> {
    match cmd {
        WgCommand::Show(args) => show(global, args).await,
    }
}

async fn show(global: &GlobalArgs, args: ShowArgs) -> anyhow::Result<()> {
    let mut client = super::connect(global).await?;
    if let Some(wanted) = &args.machine {
        let (header, _) =
            crate::targets::header_for(&mut client, std::slice::from_ref(wanted)).await?;
        if header == "*" {
            anyhow::bail!("-m '*': `wg show` shows one Machine's interface; name one Machine");
        }
        client.set_machine_target(Some(header));
    }
    let status: MeshStatus = client.get(api::paths::MESH).await?;
    if args.json {
        return print_json(&status);
    }
    println!(
        "interface {} ({} WireGuard), port {}, MTU {}",
        status.interface, status.backend, status.listen_port, status.mtu
    );
    println!("  public key          {}", status.public_key);
    println!("  Management Address  {}", status.management_address);
    let mut t = table(&[
        "PEER",
        "ID",
        "SUBNET",
        "ENDPOINT",
        "STATUS",
        "HANDSHAKE",
        "RX",
        "TX",
        "MEMBERSHIP",
    ]);
    for p in &status.peers {
        t.add_row(vec![
            p.name.to_string(),
            p.id.to_string(),
            p.subnet.to_string(),
            p.selected_endpoint
                .map(|e| e.to_string())
                .unwrap_or_else(|| "-".to_owned()),
            p.endpoint_status.clone(),
            p.last_handshake_secs
                .map(|s| format!("{s} s ago"))
                .unwrap_or_else(|| "never".to_owned()),
            crate::output::bytes(p.rx_bytes),
            crate::output::bytes(p.tx_bytes),
            p.membership.to_string(),
        ]);
    }
    print_table(&t);
    Ok(())
}
