//! SWIM membership over UDP: which Machines this one observes up, suspect or down.
//!
//! [`Membership::spawn`] binds a UDP socket (the Management Address and the gossip port in
//! production) and drives [foca], the SWIM implementation, on a tokio task: every datagram
//! goes to `Foca::handle_data`, every timer foca asks for is a `tokio::time` deadline, every
//! message foca writes leaves through the socket, encoded with foca's postcard codec.
//!
//! The daemon tells membership which Machines it should know ([`Membership::set_peers`], from the
//! store's Machine records). Membership announces itself to those it does not observe up, on
//! start and then periodically while one is not up (bootstrap, restarts, healed partitions), and
//! reports one [`PeerObservation`] per Machine of that set: the observer's own judgment
//! ([`MembershipObservation`]), `unknown` until the Machine is first heard of. The local Machine
//! never appears in it. Observations are readable at any time ([`Membership::observations`]) and
//! watchable ([`Membership::subscribe`]).
//!
//! SWIM's members are whoever speaks the protocol to this Machine (in production, only WireGuard
//! peers can reach the gossip port); the set passed to `set_peers` bounds what is reported and
//! whom membership announces to. A Machine removed from the set stops being reported at once.
//!
//! Each start of membership is a new [`MemberIdentity`] (same Machine ID, newer bump), so a
//! restarted Machine is accepted back at once, replacing its previous start everywhere; foca keeps
//! one member per Machine ID, so the observation always follows the freshest identity.
//!
//! [`Membership::shutdown`] (and dropping the handle) leaves the Cluster gracefully: peers are
//! told this Machine is down instead of finding out by failed probes.

mod driver;
mod identity;
mod link;
mod profile;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use ployz_core::{MachineId, MembershipObservation};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

pub use identity::MemberIdentity;
pub use link::{LinkFilter, LinkVerdict};
pub use profile::Profile;

use driver::{Command, Counters, Driver};

/// How membership runs.
#[derive(Debug, Clone)]
pub struct MembershipConfig {
    /// The local Machine.
    pub machine_id: MachineId,
    /// Where to bind the UDP socket: the Management Address and the gossip port (51001) in
    /// production.
    pub bind: SocketAddr,
    /// The address peers send gossip to, when it is not `bind` (`bind` on an unspecified address
    /// such as `[::]`, or behind a translation). It must name a specific address and port.
    pub advertise: Option<SocketAddr>,
    /// The timing profile: the daemon's `[mesh] profile`.
    pub profile: Profile,
    /// A simulated network every outgoing datagram passes through. Tests set it to simulate loss,
    /// delay and partitions; production leaves it `None`.
    pub link: Option<Arc<dyn LinkFilter>>,
}

impl MembershipConfig {
    /// A configuration for `machine_id` gossiping on `bind`, with the given profile and the
    /// defaults for the rest.
    pub fn new(machine_id: MachineId, bind: SocketAddr, profile: Profile) -> Self {
        Self {
            machine_id,
            bind,
            advertise: None,
            profile,
            link: None,
        }
    }
}

/// Why membership could not start or take a request.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MembershipError {
    /// The gossip socket could not be bound.
    #[error(
        "cannot bind the membership gossip socket on udp {addr}: {source}; \
         check that nothing else uses the port ([mesh] gossip_port) and that the address exists \
         on this Machine"
    )]
    Bind {
        /// The address of `MembershipConfig::bind`.
        addr: SocketAddr,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The address peers would be told to gossip to is not one they can reach.
    #[error(
        "membership advertise address {addr} is not a specific address and port; set \
         MembershipConfig::advertise to the Management Address and gossip port"
    )]
    UnusableAdvertise {
        /// The address that would have been advertised.
        addr: SocketAddr,
    },
    /// `spawn` was called outside a tokio runtime.
    #[error("membership must be started from within a tokio runtime: {0}")]
    NoRuntime(String),
    /// The membership task has stopped (it was shut down or aborted).
    #[error("membership of Machine {machine} has stopped; start it again with Membership::spawn")]
    Stopped {
        /// The local Machine.
        machine: MachineId,
    },
}

/// One observer's judgment of one peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerObservation {
    /// The judgment: `unknown` until the peer is first heard of.
    pub state: MembershipObservation,
    /// When `state` last changed (or when the peer entered the set), on this process's
    /// monotonic clock.
    pub since: Instant,
    /// `since` on the wall clock, for display.
    pub changed_at: SystemTime,
    /// The gossip address the peer was given with (`set_peers`).
    pub address: SocketAddr,
    /// The bump of the freshest identity heard of for the peer (a new value means the peer
    /// restarted or renewed itself); `None` while unknown.
    pub bump: Option<u64>,
}

/// Counts since start, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MembershipCounters {
    /// Datagrams handed to the socket.
    pub datagrams_sent: u64,
    /// Bytes of the datagrams handed to the socket.
    pub bytes_sent: u64,
    /// Datagrams received.
    pub datagrams_received: u64,
    /// Bytes of the datagrams received.
    pub bytes_received: u64,
    /// Received datagrams refused as garbled, oversized, or claiming to come from this Machine.
    pub datagrams_rejected: u64,
    /// Sends the socket refused.
    pub send_errors: u64,
    /// Receives the socket failed.
    pub receive_errors: u64,
    /// Datagrams the simulated network ([`MembershipConfig::link`]) dropped.
    pub datagrams_dropped_by_link: u64,
    /// Probes of this Machine that got no answer, directly or through others (each raises a
    /// suspicion).
    pub probes_failed: u64,
    /// Changes of a reported peer's observation.
    pub state_changes: u64,
    /// Announces sent to Machines of the set not observed up.
    pub announces_sent: u64,
    /// Times this Machine learnt it was declared down and renewed its identity.
    pub renewals: u64,
    /// Protocol errors foca reported that are not about a received datagram.
    pub protocol_errors: u64,
}

/// The running membership of the local Machine. Dropping it leaves the Cluster gracefully, like
/// [`Membership::shutdown`], without waiting.
#[derive(Debug)]
pub struct Membership {
    identity: MemberIdentity,
    local_addr: SocketAddr,
    commands: Option<mpsc::UnboundedSender<Command>>,
    observations: watch::Receiver<BTreeMap<MachineId, PeerObservation>>,
    counters: Arc<Counters>,
    task: Option<JoinHandle<()>>,
}

impl Membership {
    /// Binds the gossip socket and starts membership on the current tokio runtime, knowing no
    /// peer yet ([`Membership::set_peers`] gives them).
    pub fn spawn(config: MembershipConfig) -> Result<Membership, MembershipError> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|e| MembershipError::NoRuntime(e.to_string()))?;
        let socket = bind(config.bind)?;
        let local_addr = socket
            .local_addr()
            .map_err(|source| MembershipError::Bind {
                addr: config.bind,
                source,
            })?;
        let advertise = config.advertise.unwrap_or(local_addr);
        if advertise.ip().is_unspecified() || advertise.port() == 0 {
            return Err(MembershipError::UnusableAdvertise { addr: advertise });
        }
        let socket = {
            let _entered = runtime.enter();
            tokio::net::UdpSocket::from_std(socket).map_err(|source| MembershipError::Bind {
                addr: config.bind,
                source,
            })?
        };
        let identity = MemberIdentity::fresh(config.machine_id.clone(), advertise);
        let (commands, commands_rx) = mpsc::unbounded_channel();
        let (observations_tx, observations) = watch::channel(BTreeMap::new());
        let counters = Arc::new(Counters::default());
        let driver = Driver::new(
            identity.clone(),
            &config,
            socket,
            observations_tx,
            Arc::clone(&counters),
        );
        let task = runtime.spawn(driver.run(commands_rx));
        tracing::info!(
            machine = %config.machine_id,
            gossip = %advertise,
            bind = %local_addr,
            profile = config.profile.as_str(),
            "membership started"
        );
        Ok(Membership {
            identity,
            local_addr,
            commands: Some(commands),
            observations,
            counters,
            task: Some(task),
        })
    }

    /// The local Machine.
    pub fn machine_id(&self) -> &MachineId {
        &self.identity.machine
    }

    /// The identity this start began with (a renewal after being declared down moves on from
    /// it; [`MembershipCounters::renewals`] counts those).
    pub fn identity(&self) -> &MemberIdentity {
        &self.identity
    }

    /// The address the socket is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Replaces the set of Machines this one should know with `peers` (Machine ID and gossip
    /// address each; the local Machine, if present, is ignored). Membership announces itself
    /// to those it does not observe up, now and periodically while they are not up; Machines no
    /// longer in the set stop being reported.
    pub fn set_peers(&self, peers: Vec<(MachineId, SocketAddr)>) -> Result<(), MembershipError> {
        self.command(Command::SetPeers(peers))
    }

    /// The current observation of every Machine of the set.
    pub fn observations(&self) -> BTreeMap<MachineId, PeerObservation> {
        self.observations.borrow().clone()
    }

    /// A receiver that sees every change of [`Membership::observations`].
    pub fn subscribe(&self) -> watch::Receiver<BTreeMap<MachineId, PeerObservation>> {
        self.observations.clone()
    }

    /// The counters since start.
    pub fn counters(&self) -> MembershipCounters {
        self.counters.snapshot()
    }

    /// Leaves the Cluster (peers are told this Machine is down), stops the task and closes the
    /// socket; returns once the socket is closed.
    pub async fn shutdown(mut self) {
        // Closing the command channel is the task's signal to leave and stop.
        self.commands = None;
        if let Some(task) = self.task.take() {
            if let Err(e) = task.await {
                tracing::warn!(machine = %self.identity.machine, error = %e, "membership task failed");
            }
        }
    }

    /// Stops at once without telling peers, as a crash would (peers find out by failed probes);
    /// returns once the socket is closed.
    pub async fn abort(mut self) {
        // Cancelled before the command channel closes, which would make it leave.
        if let Some(task) = self.task.take() {
            task.abort();
            // The task is cancelled: the error says so and is expected.
            let _ = task.await;
        }
    }

    fn command(&self, command: Command) -> Result<(), MembershipError> {
        let stopped = || MembershipError::Stopped {
            machine: self.identity.machine.clone(),
        };
        self.commands
            .as_ref()
            .ok_or_else(stopped)?
            .send(command)
            .map_err(|_| stopped())
    }
}

impl Drop for Membership {
    fn drop(&mut self) {
        // Dropping the command sender makes the task leave the Cluster and stop on its own.
        self.commands = None;
    }
}

/// Binds the gossip socket, non-blocking, ready for tokio.
fn bind(addr: SocketAddr) -> Result<std::net::UdpSocket, MembershipError> {
    let socket =
        std::net::UdpSocket::bind(addr).map_err(|source| MembershipError::Bind { addr, source })?;
    socket
        .set_nonblocking(true)
        .map_err(|source| MembershipError::Bind { addr, source })?;
    Ok(socket)
}
