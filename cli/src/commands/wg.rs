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
    if let Some(d) = &status.datapath {
        println!("  data path           {}", datapath_line(d));
        println!("  throughput          {}", throughput_line(d));
    }
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

/// The userspace device's offloads and how many packets each system call moved.
fn datapath_line(d: &api::MeshDataPath) -> String {
    let on = |b: bool| if b { "on" } else { "off" };
    let per_call = |packets: u64, calls: u64| {
        if calls == 0 {
            "-".to_owned()
        } else {
            format!("{:.1}", packets as f64 / calls as f64)
        }
    };
    format!(
        "TUN segmentation {}, UDP GSO {}, UDP GRO {}; packets per call: {} per send, {} per receive",
        on(d.tun_offload),
        on(d.udp_gso),
        on(d.udp_gro),
        per_call(d.packets_sent, d.udp_sends),
        per_call(d.packets_received, d.udp_receives),
    )
}

/// The measured rates: the last interval's and the peak since the daemon started.
fn throughput_line(d: &api::MeshDataPath) -> String {
    let rate = |b: u64| format!("{}/s", crate::output::bytes(b));
    format!(
        "sending {} (peak {}), receiving {} (peak {}); {} sent, {} received, {} dropped",
        rate(d.send_rate),
        rate(d.peak_send_rate),
        rate(d.receive_rate),
        rate(d.peak_receive_rate),
        crate::output::bytes(d.bytes_sent),
        crate::output::bytes(d.bytes_received),
        d.dropped,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_data_path_lines_name_offloads_batching_and_rates() {
        let d = api::MeshDataPath {
            tun_offload: true,
            udp_gso: true,
            udp_gro: false,
            packets_sent: 450,
            udp_sends: 10,
            packets_received: 7,
            udp_receives: 7,
            send_rate: 200 << 20,
            peak_send_rate: 300 << 20,
            dropped: 2,
            ..api::MeshDataPath::default()
        };
        assert_eq!(
            datapath_line(&d),
            "TUN segmentation on, UDP GSO on, UDP GRO off; packets per call: 45.0 per send, 1.0 per receive"
        );
        let line = throughput_line(&d);
        assert!(line.starts_with("sending 200"), "{line}");
        assert!(line.contains("(peak 300"), "{line}");
        assert!(line.ends_with("2 dropped"), "{line}");
    }
}
