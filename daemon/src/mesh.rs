//! The mesh module of the daemon: what this Machine observes of its peers (shared with the
//! management API), and the task that keeps the WireGuard interface, membership and replication
//! in line with the member roster.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::Duration;

use ployz_core::api::{Member, MeshStatus};
use ployz_core::MachineId;

use crate::config::MeshSettings;
use crate::local_machine::PeerObservation;

/// What the mesh task observes, for the API to show: per peer, its Membership Observation and
/// Selected Endpoint; the interface's status. Empty until the mesh runs.
pub struct MeshView {
    settings: MeshSettings,
    observations: Mutex<BTreeMap<MachineId, PeerObservation>>,
    status: Mutex<Option<MeshStatus>>,
    not_running: Mutex<String>,
    metrics: Mutex<MeshMetrics>,
    /// Set by a peer's reset request (`machine rm` elsewhere): the mesh task tears down and the
    /// daemon starts again uninitialised.
    reset: tokio::sync::watch::Sender<Option<bool>>,
    /// What the last try to fetch this (uninitialised) Machine's grant from the Machine that
    /// invited it met.
    pending_attempt: Mutex<Option<String>>,
    /// The Machines observed down, for the modules that order by it (the edge).
    down: tokio::sync::watch::Sender<std::collections::BTreeSet<MachineId>>,
    /// The members not observed up (down, suspect, unknown), for the certificate issuer.
    not_up: tokio::sync::watch::Sender<std::collections::BTreeSet<MachineId>>,
    /// Turned true once an anti-entropy round with a peer has completed: this Machine's store
    /// held what that peer held.
    caught_up: tokio::sync::watch::Sender<bool>,
}

/// How long `machine rm` waits for the removed Machine to answer its reset.
const RESET_TIMEOUT: Duration = Duration::from_secs(10);

impl MeshView {
    /// A view for a mesh run with `settings`; nothing observed yet.
    pub fn new(settings: MeshSettings) -> MeshView {
        let not_running = if settings.enabled {
            "the mesh is not running yet: it starts once this Machine is initialised".to_owned()
        } else {
            "the mesh is off on this Machine (mesh.enabled = false, or --no-mesh)".to_owned()
        };
        MeshView {
            settings,
            observations: Mutex::default(),
            status: Mutex::default(),
            not_running: Mutex::new(not_running),
            metrics: Mutex::default(),
            reset: tokio::sync::watch::channel(None).0,
            pending_attempt: Mutex::default(),
            down: tokio::sync::watch::channel(Default::default()).0,
            not_up: tokio::sync::watch::channel(Default::default()).0,
            caught_up: tokio::sync::watch::channel(false).0,
        }
    }

    /// What the last try to fetch this Machine's grant met (while it holds a Join Token).
    pub fn pending_attempt(&self) -> Option<String> {
        self.pending_attempt
            .lock()
            .expect("mesh view poisoned")
            .clone()
    }

    /// Records what a try to fetch the grant met.
    pub fn set_pending_attempt(&self, attempt: Option<String>) {
        *self.pending_attempt.lock().expect("mesh view poisoned") = attempt;
    }

    /// Asks the mesh task to reset this Machine (`Some(stop_containers)`).
    pub fn request_reset(&self, stop_containers: bool) {
        self.reset.send_replace(Some(stop_containers));
    }

    /// Watches for a reset request.
    pub fn reset_requests(&self) -> tokio::sync::watch::Receiver<Option<bool>> {
        self.reset.subscribe()
    }

    /// The settings the mesh runs with.
    pub fn settings(&self) -> &MeshSettings {
        &self.settings
    }

    /// Why there is no status to show.
    pub fn not_running_reason(&self) -> String {
        self.not_running.lock().expect("mesh view poisoned").clone()
    }

    /// Says why the mesh does not run (a start that failed).
    pub fn set_not_running(&self, reason: String) {
        *self.not_running.lock().expect("mesh view poisoned") = reason;
    }

    /// The WireGuard endpoints this Machine advertises: its interface addresses (up, global
    /// unicast, not the mesh's, Docker's or the `ployz` bridge's) with the WireGuard port.
    pub fn advertised_endpoints(&self) -> Vec<SocketAddr> {
        // The `ployz` bridge holds the Machine Gateway, reachable only through the mesh itself.
        let interfaces: Vec<_> = ployz_mesh::endpoints::interface_addresses()
            .unwrap_or_default()
            .into_iter()
            .filter(|a| a.interface != ployz_orchestrator::docker::BRIDGE_NAME)
            .collect();
        ployz_mesh::endpoints::advertised_endpoints(
            &interfaces,
            &self.settings.interface,
            &[],
            &[],
            self.settings.wireguard_port,
        )
    }

    /// Asks a member, over the mesh, to reset itself to uninitialised (`machine rm`); `Err`
    /// says why it was not reached or refused.
    pub async fn reset_peer(&self, member: &Member, stop_containers: bool) -> Result<(), String> {
        let addr = SocketAddr::new(
            IpAddr::V6(member.management_address.addr()),
            self.settings.management_port,
        );
        let body = serde_json::json!({ "stop_containers": stop_containers }).to_string();
        match tokio::time::timeout(
            RESET_TIMEOUT,
            peer_request(addr, "POST", PEER_RESET, Some(body)),
        )
        .await
        {
            Ok(Ok((status, _))) if status.is_success() => Ok(()),
            Ok(Ok((status, text))) => Err(format!("it answered {status}: {text}")),
            Ok(Err(e)) => Err(format!("it could not be reached at {addr}: {e}")),
            Err(_) => Err(format!(
                "it did not answer at {addr} within {} s",
                RESET_TIMEOUT.as_secs()
            )),
        }
    }

    /// Per peer, what this Machine observes of it now.
    pub fn observations(&self) -> BTreeMap<MachineId, PeerObservation> {
        self.observations
            .lock()
            .expect("mesh view poisoned")
            .clone()
    }

    /// Replaces the observations.
    pub fn set_observations(&self, observations: BTreeMap<MachineId, PeerObservation>) {
        let observed = |pick: fn(Option<ployz_core::MembershipObservation>) -> bool| {
            observations
                .iter()
                .filter(|(_, o)| pick(o.membership))
                .map(|(id, _)| id.clone())
                .collect::<std::collections::BTreeSet<MachineId>>()
        };
        let down = observed(|m| m == Some(ployz_core::MembershipObservation::Down));
        let not_up = observed(|m| m != Some(ployz_core::MembershipObservation::Up));
        *self.observations.lock().expect("mesh view poisoned") = observations;
        self.down.send_if_modified(|current| {
            let changed = *current != down;
            *current = down;
            changed
        });
        self.not_up.send_if_modified(|current| {
            let changed = *current != not_up;
            *current = not_up;
            changed
        });
    }

    /// The members not observed up (down, suspect, or not heard from since membership started
    /// here), now and as they change.
    pub fn machines_not_up(
        &self,
    ) -> tokio::sync::watch::Receiver<std::collections::BTreeSet<MachineId>> {
        self.not_up.subscribe()
    }

    /// Notes that an anti-entropy round with a peer completed.
    pub fn set_caught_up(&self) {
        self.caught_up
            .send_if_modified(|c| !std::mem::replace(c, true));
    }

    /// Turns true once an anti-entropy round with a peer has completed.
    pub fn caught_up(&self) -> tokio::sync::watch::Receiver<bool> {
        self.caught_up.subscribe()
    }

    /// The Machines observed down, now and as they change.
    pub fn machines_down(
        &self,
    ) -> tokio::sync::watch::Receiver<std::collections::BTreeSet<MachineId>> {
        self.down.subscribe()
    }

    /// The WireGuard interface and its peers, when the mesh runs.
    pub fn status(&self) -> Option<MeshStatus> {
        self.status.lock().expect("mesh view poisoned").clone()
    }

    /// Replaces the interface's status.
    pub fn set_status(&self, status: Option<MeshStatus>) {
        *self.status.lock().expect("mesh view poisoned") = status;
    }
}

/// The peer route a removed Machine is reset through.
pub const PEER_RESET: &str = "/v1/peer/reset";
/// The peer route a Machine admitted through a Join Token fetches its grant from (`GET`).
pub const PEER_GRANT: &str = "/v1/peer/grant";

/// One HTTP/1.1 request to a peer's management API over the mesh; the status and body text.
pub async fn peer_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<String>,
) -> anyhow::Result<(axum::http::StatusCode, String)> {
    use http_body_util::BodyExt as _;
    let stream = tokio::net::TcpStream::connect(addr).await?;
    let io = hyper_util::rt::TokioIo::new(stream);
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let request = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header(hyper::header::HOST, "ployz")
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(
            body.unwrap_or_default(),
        )))?;
    let response = sender.send_request(request).await?;
    let status = response.status();
    let bytes = response.into_body().collect().await?.to_bytes();
    Ok((status, String::from_utf8_lossy(&bytes).into_owned()))
}

/// What the mesh task counted, for `/metrics`.
#[derive(Debug, Clone, Default)]
pub struct MeshMetrics {
    /// `kernel` or `userspace`, once the interface is up.
    pub backend: Option<&'static str>,
    /// Peers per Membership Observation word.
    pub membership: BTreeMap<&'static str, u64>,
    /// Members whose Machine Subnet another member holds too.
    pub subnet_collisions: u64,
    /// Remote records refused for a clock too far ahead, per origin.
    pub clock_refusals: BTreeMap<MachineId, u64>,
    /// How far this Machine's store clock runs ahead of its wall clock, in milliseconds.
    pub clock_ahead_ms: u64,
    /// Replication's totals.
    pub replication: crate::replication::ReplicationCounters,
    /// Membership gossip's totals: datagrams and bytes each way.
    pub gossip: [u64; 4],
    /// Firewall rules put back by reconciliation.
    pub firewall_repairs: u64,
    /// The userspace device's offloads and counters; `None` with the kernel module.
    pub datapath: Option<ployz_core::api::MeshDataPath>,
}

impl MeshView {
    /// Replaces the metrics.
    pub fn set_metrics(&self, metrics: MeshMetrics) {
        *self.metrics.lock().expect("mesh view poisoned") = metrics;
    }

    /// Appends the mesh's series in the Prometheus text format.
    pub fn render(&self, out: &mut String) {
        use std::fmt::Write as _;
        let m = self.metrics.lock().expect("mesh view poisoned").clone();
        if !self.settings.enabled {
            return;
        }
        let _ = writeln!(out, "# HELP ployz_mesh_info The mesh's WireGuard backend on this Machine (1 once the interface is up).");
        let _ = writeln!(out, "# TYPE ployz_mesh_info gauge");
        if let Some(backend) = m.backend {
            let _ = writeln!(
                out,
                "ployz_mesh_info{{backend=\"{backend}\",interface=\"{}\"}} 1",
                self.settings.interface
            );
        }
        let _ = writeln!(
            out,
            "# HELP ployz_mesh_peers Peers by this Machine's Membership Observation of them."
        );
        let _ = writeln!(out, "# TYPE ployz_mesh_peers gauge");
        for (state, n) in &m.membership {
            let _ = writeln!(out, "ployz_mesh_peers{{membership=\"{state}\"}} {n}");
        }
        if let Some(d) = &m.datapath {
            render_datapath(out, d);
        }
        let _ = writeln!(out, "# HELP ployz_mesh_subnet_collisions Members whose Machine Subnet another member holds too.");
        let _ = writeln!(out, "# TYPE ployz_mesh_subnet_collisions gauge");
        let _ = writeln!(out, "ployz_mesh_subnet_collisions {}", m.subnet_collisions);
        let _ = writeln!(out, "# HELP ployz_store_clock_ahead_seconds How far this Machine's store clock runs ahead of its wall clock; beyond the drift bound its clock went back, and the others refuse its writes until it catches up.");
        let _ = writeln!(out, "# TYPE ployz_store_clock_ahead_seconds gauge");
        let _ = writeln!(
            out,
            "ployz_store_clock_ahead_seconds {}",
            m.clock_ahead_ms as f64 / 1000.0
        );
        let _ = writeln!(out, "# HELP ployz_store_clock_refusals_total Remote records not merged because their timestamp was too far ahead of this Machine's clock.");
        let _ = writeln!(out, "# TYPE ployz_store_clock_refusals_total counter");
        for (origin, n) in &m.clock_refusals {
            let _ = writeln!(
                out,
                "ployz_store_clock_refusals_total{{origin=\"{origin}\"}} {n}"
            );
        }
        let r = &m.replication;
        for (name, help, value) in [
            (
                "records_pushed",
                "Records sent to peers as they were written",
                r.records_pushed,
            ),
            (
                "records_pulled",
                "Records fetched from peers by anti-entropy",
                r.records_pulled,
            ),
            (
                "records_applied",
                "Records from peers this store took",
                r.records_applied,
            ),
            ("bytes_sent", "Replication bytes sent", r.bytes_sent),
            (
                "bytes_received",
                "Replication bytes received",
                r.bytes_received,
            ),
            (
                "anti_entropy_rounds",
                "Anti-entropy rounds run",
                r.anti_entropy_rounds,
            ),
            ("failures", "Replication requests that failed", r.failures),
        ] {
            let _ = writeln!(out, "# HELP ployz_replication_{name}_total {help}.");
            let _ = writeln!(out, "# TYPE ployz_replication_{name}_total counter");
            let _ = writeln!(out, "ployz_replication_{name}_total {value}");
        }
        let [sent, received, bytes_sent, bytes_received] = m.gossip;
        for (name, value) in [
            ("datagrams_sent", sent),
            ("datagrams_received", received),
            ("bytes_sent", bytes_sent),
            ("bytes_received", bytes_received),
        ] {
            let _ = writeln!(
                out,
                "# HELP ployz_gossip_{name}_total Membership gossip {}.",
                name.replace('_', " ")
            );
            let _ = writeln!(out, "# TYPE ployz_gossip_{name}_total counter");
            let _ = writeln!(out, "ployz_gossip_{name}_total {value}");
        }
        let _ = writeln!(
            out,
            "# HELP ployz_firewall_repairs_total Firewall rules put back (or, retired, deleted) by reconciliation."
        );
        let _ = writeln!(out, "# TYPE ployz_firewall_repairs_total counter");
        let _ = writeln!(out, "ployz_firewall_repairs_total {}", m.firewall_repairs);
    }
}

/// The userspace WireGuard device's series.
fn render_datapath(out: &mut String, d: &ployz_core::api::MeshDataPath) {
    use std::fmt::Write as _;
    let mut family = |name: &str, kind: &str, help: &str, samples: &[(&str, u64)]| {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (labels, value) in samples {
            if labels.is_empty() {
                let _ = writeln!(out, "{name} {value}");
            } else {
                let _ = writeln!(out, "{name}{{{labels}}} {value}");
            }
        }
    };
    let on = u64::from;
    family(
        "ployz_mesh_datapath_offload",
        "gauge",
        "Offloads the userspace WireGuard device has (1) or went without (0).",
        &[
            (r#"kind="tun_tso""#, on(d.tun_offload)),
            (r#"kind="udp_gso""#, on(d.udp_gso)),
            (r#"kind="udp_gro""#, on(d.udp_gro)),
        ],
    );
    family(
        "ployz_mesh_datapath_bytes_total",
        "counter",
        "Encrypted bytes the userspace WireGuard device moved.",
        &[
            (r#"direction="sent""#, d.bytes_sent),
            (r#"direction="received""#, d.bytes_received),
        ],
    );
    family(
        "ployz_mesh_datapath_packets_total",
        "counter",
        "WireGuard packets the userspace device moved.",
        &[
            (r#"direction="sent""#, d.packets_sent),
            (r#"direction="received""#, d.packets_received),
        ],
    );
    family(
        "ployz_mesh_datapath_syscalls_total",
        "counter",
        "System calls that moved packets, by kind (each may move many).",
        &[
            (r#"kind="tun_read""#, d.tun_reads),
            (r#"kind="tun_write""#, d.tun_writes),
            (r#"kind="udp_send""#, d.udp_sends),
            (r#"kind="udp_receive""#, d.udp_receives),
        ],
    );
    family(
        "ployz_mesh_datapath_dropped_total",
        "counter",
        "Packets the userspace device dropped (no peer, no endpoint, or not valid).",
        &[("", d.dropped)],
    );
    family(
        "ployz_mesh_datapath_rate_bytes",
        "gauge",
        "Encrypted bytes per second over the last observation interval, and the peak since start.",
        &[
            (r#"direction="sent",window="last""#, d.send_rate),
            (r#"direction="received",window="last""#, d.receive_rate),
            (r#"direction="sent",window="peak""#, d.peak_send_rate),
            (r#"direction="received",window="peak""#, d.peak_receive_rate),
        ],
    );
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_edge_hears_of_machines_down_and_the_issuer_of_every_machine_not_up() {
        use ployz_core::MembershipObservation::{Down, Suspect, Unknown, Up};
        let view = super::MeshView::new(crate::config::MeshSettings::default());
        let ids: Vec<ployz_core::MachineId> =
            (0..5).map(|_| ployz_core::MachineId::generate()).collect();
        let observations = [Some(Up), Some(Down), Some(Suspect), Some(Unknown), None]
            .into_iter()
            .zip(&ids)
            .map(|(membership, id)| {
                (
                    id.clone(),
                    crate::local_machine::PeerObservation {
                        membership,
                        selected_endpoint: None,
                    },
                )
            })
            .collect();
        view.set_observations(observations);
        // A suspect Machine keeps its exchanges and its place in the routes.
        assert_eq!(
            *view.machines_down().borrow(),
            std::collections::BTreeSet::from([ids[1].clone()])
        );
        assert_eq!(
            *view.machines_not_up().borrow(),
            ids[1..].iter().cloned().collect()
        );
    }

    #[test]
    fn the_data_path_series_carry_offloads_counters_and_rates() {
        let d = ployz_core::api::MeshDataPath {
            tun_offload: true,
            udp_gro: true,
            bytes_sent: 1 << 30,
            udp_sends: 12,
            dropped: 3,
            peak_receive_rate: 600_000_000,
            ..Default::default()
        };
        let mut out = String::new();
        super::render_datapath(&mut out, &d);
        for line in [
            "# TYPE ployz_mesh_datapath_offload gauge",
            r#"ployz_mesh_datapath_offload{kind="tun_tso"} 1"#,
            r#"ployz_mesh_datapath_offload{kind="udp_gso"} 0"#,
            r#"ployz_mesh_datapath_bytes_total{direction="sent"} 1073741824"#,
            r#"ployz_mesh_datapath_syscalls_total{kind="udp_send"} 12"#,
            "ployz_mesh_datapath_dropped_total 3",
            r#"ployz_mesh_datapath_rate_bytes{direction="received",window="peak"} 600000000"#,
        ] {
            assert!(out.lines().any(|l| l == line), "{line} in:\n{out}");
        }
    }
}
