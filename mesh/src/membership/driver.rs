//! The task that drives foca: the socket, the timers, the announces and the observations.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use foca::{
    Foca, Incarnation, Member, NoCustomBroadcast, Notification, PostcardCodec, Runtime, State,
    Timer,
};
use foca_rand::rngs::SmallRng;
use foca_rand::SeedableRng;
use ployz_core::{MachineId, MembershipObservation};
use tokio::net::UdpSocket;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};

use super::identity::MemberIdentity;
use super::link::{LinkFilter, LinkVerdict};
use super::profile::{Profile, MAX_PACKET_SIZE};
use super::{MembershipConfig, MembershipCounters, PeerObservation};

/// What the handle asks of the task.
#[derive(Debug)]
pub(super) enum Command {
    /// Replace the set of Machines to know.
    SetPeers(Vec<(MachineId, SocketAddr)>),
}

/// The counters, shared between the task (and its delayed sends) and the handle.
#[derive(Debug, Default)]
pub(super) struct Counters {
    datagrams_sent: AtomicU64,
    bytes_sent: AtomicU64,
    datagrams_received: AtomicU64,
    bytes_received: AtomicU64,
    datagrams_rejected: AtomicU64,
    send_errors: AtomicU64,
    receive_errors: AtomicU64,
    datagrams_dropped_by_link: AtomicU64,
    probes_failed: AtomicU64,
    state_changes: AtomicU64,
    announces_sent: AtomicU64,
    renewals: AtomicU64,
    protocol_errors: AtomicU64,
}

fn add(counter: &AtomicU64, by: u64) {
    counter.fetch_add(by, Ordering::Relaxed);
}

impl Counters {
    pub(super) fn snapshot(&self) -> MembershipCounters {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        MembershipCounters {
            datagrams_sent: get(&self.datagrams_sent),
            bytes_sent: get(&self.bytes_sent),
            datagrams_received: get(&self.datagrams_received),
            bytes_received: get(&self.bytes_received),
            datagrams_rejected: get(&self.datagrams_rejected),
            send_errors: get(&self.send_errors),
            receive_errors: get(&self.receive_errors),
            datagrams_dropped_by_link: get(&self.datagrams_dropped_by_link),
            probes_failed: get(&self.probes_failed),
            state_changes: get(&self.state_changes),
            announces_sent: get(&self.announces_sent),
            renewals: get(&self.renewals),
            protocol_errors: get(&self.protocol_errors),
        }
    }
}

/// What one interaction with foca asked for, collected to be carried out right after it.
#[derive(Default)]
struct Effects {
    sends: Vec<(SocketAddr, Vec<u8>)>,
    timers: Vec<(Duration, Timer<MemberIdentity>)>,
    probes_failed: u64,
    renewed_to: Option<MemberIdentity>,
    defunct: bool,
}

impl Runtime<MemberIdentity> for Effects {
    fn notify(&mut self, notification: Notification<'_, MemberIdentity>) {
        match notification {
            Notification::MemberUp(id) => tracing::debug!(member = ?id, "foca: member up"),
            Notification::MemberDown(id) => tracing::debug!(member = ?id, "foca: member down"),
            Notification::Rename(old, new) => {
                tracing::debug!(old = ?old, new = ?new, "foca: member renamed")
            }
            Notification::Active => tracing::debug!("foca: joined the Cluster"),
            Notification::Idle => tracing::debug!("foca: no active member left"),
            Notification::Defunct => self.defunct = true,
            Notification::Rejoin(id) => self.renewed_to = Some(id.clone()),
        }
    }

    fn send_to(&mut self, to: MemberIdentity, data: &[u8]) {
        self.sends.push((to.gossip, data.to_vec()));
    }

    fn submit_after(&mut self, event: Timer<MemberIdentity>, after: Duration) {
        // foca schedules a suspicion's deadline exactly when one of its probes failed and the
        // member is still active: the count of those is the count of failed probes.
        if matches!(event, Timer::ChangeSuspectToDown { .. }) {
            self.probes_failed += 1;
        }
        self.timers.push((after, event));
    }
}

type Swim = Foca<MemberIdentity, PostcardCodec, SmallRng, NoCustomBroadcast>;

/// The membership task's state.
pub(super) struct Driver {
    foca: Swim,
    identity: MemberIdentity,
    socket: Arc<UdpSocket>,
    link: Option<Arc<dyn LinkFilter>>,
    /// Sends the simulated network delays; dropped (cancelled) with the task.
    delayed: JoinSet<()>,
    /// Pending foca timers by deadline, with a sequence number to keep equal deadlines apart.
    timers: BTreeMap<(Instant, u64), Timer<MemberIdentity>>,
    next_timer_seq: u64,
    profile: Profile,
    announce_interval: Duration,
    peers: BTreeMap<MachineId, SocketAddr>,
    observed: BTreeMap<MachineId, PeerObservation>,
    observations: watch::Sender<BTreeMap<MachineId, PeerObservation>>,
    counters: Arc<Counters>,
    /// How long foca's suspicion lasts at the Cluster's current size.
    suspicion: Duration,
    /// Members foca holds as suspect, with the incarnation, when this task first saw them so
    /// (after the foca call that made them so) and how long a suspicion lasted then: see
    /// [`Driver::down_stale_suspects`].
    suspected: HashMap<MemberIdentity, (Incarnation, Instant, Duration)>,
}

impl Driver {
    pub(super) fn new(
        identity: MemberIdentity,
        config: &MembershipConfig,
        socket: UdpSocket,
        observations: watch::Sender<BTreeMap<MachineId, PeerObservation>>,
        counters: Arc<Counters>,
    ) -> Self {
        // Sized for this Machine alone until `set_peers` says how many there are.
        let foca_config = config.profile.foca_config(NonZeroU32::MIN);
        let suspicion = foca_config.suspect_to_down_after;
        let rng = SmallRng::seed_from_u64(rand::random());
        Self {
            foca: Foca::new(identity.clone(), foca_config, rng, PostcardCodec),
            identity,
            socket: Arc::new(socket),
            link: config.link.clone(),
            delayed: JoinSet::new(),
            timers: BTreeMap::new(),
            next_timer_seq: 0,
            profile: config.profile,
            announce_interval: config.profile.announce_interval(),
            peers: BTreeMap::new(),
            observed: BTreeMap::new(),
            observations,
            counters,
            suspicion,
            suspected: HashMap::new(),
        }
    }

    /// Runs until the command channel closes, then leaves the Cluster.
    pub(super) async fn run(mut self, mut commands: mpsc::UnboundedReceiver<Command>) {
        // One byte more than foca accepts, so an oversized datagram reaches foca oversized (and
        // is refused) instead of silently truncated.
        let mut buf = vec![0u8; MAX_PACKET_SIZE + 1];
        let mut announce = tokio::time::interval(self.announce_interval);
        announce.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            let next_timer = self.timers.keys().next().map(|(at, _)| *at);
            tokio::select! {
                command = commands.recv() => match command {
                    Some(Command::SetPeers(peers)) => self.set_peers(peers).await,
                    None => break,
                },
                received = self.socket.recv_from(&mut buf) => match received {
                    Ok((len, from)) => self.handle_datagram(&buf[..len], from).await,
                    Err(e) => {
                        add(&self.counters.receive_errors, 1);
                        tracing::debug!(error = %e, "membership: receive failed");
                    }
                },
                () = sleep_until(next_timer) => self.fire_due_timers().await,
                _ = announce.tick() => {
                    self.down_stale_suspects().await;
                    self.announce_to_missing().await;
                }
            }
        }
        self.leave().await;
    }

    async fn handle_datagram(&mut self, data: &[u8], from: SocketAddr) {
        add(&self.counters.datagrams_received, 1);
        add(&self.counters.bytes_received, data.len() as u64);
        // Only a peer's own address speaks for a peer: over the mesh WireGuard vouches for the
        // source. Anything else that reaches the socket (a local process over loopback, from
        // this Machine's own address) would otherwise claim any member's identity.
        if !self.peers.values().any(|peer| peer.ip() == from.ip()) {
            add(&self.counters.datagrams_rejected, 1);
            tracing::debug!(%from, len = data.len(), "membership: datagram from no peer's address refused");
            return;
        }
        let mut effects = Effects::default();
        if let Err(e) = self.foca.handle_data(data, &mut effects) {
            match e {
                foca::Error::Decode(_)
                | foca::Error::MalformedPacket
                | foca::Error::DataTooBig
                | foca::Error::DataFromOurselves
                | foca::Error::IndirectForOurselves => {
                    add(&self.counters.datagrams_rejected, 1);
                    tracing::debug!(%from, len = data.len(), error = %e, "membership: datagram refused");
                }
                other => self.protocol_error(other),
            }
        }
        self.carry_out(effects).await;
    }

    async fn fire_due_timers(&mut self) {
        let now = Instant::now();
        let mut due = Vec::new();
        while let Some(entry) = self.timers.first_entry() {
            if entry.key().0 > now {
                break;
            }
            due.push(entry.remove());
        }
        // foca orders timers that fire together (a lagging runtime) by their kind.
        due.sort();
        for timer in due {
            let suspected = match &timer {
                Timer::ChangeSuspectToDown { member_id, .. } => Some(member_id.clone()),
                _ => None,
            };
            let mut effects = Effects::default();
            if let Err(e) = self.foca.handle_timer(timer, &mut effects) {
                self.protocol_error(e);
            }
            if let Some(member) = suspected {
                if !self.is_down(&member) {
                    // foca 2.0.0 tells the member it was declared down (`TurnUndead`) even when
                    // the suspicion was refuted and the member stays up; the member would then
                    // renew its identity and the Cluster would see its previous identity go
                    // down: a false down. That message is the only one this timer sends.
                    effects.sends.clear();
                }
            }
            self.carry_out(effects).await;
        }
    }

    /// Whether foca holds exactly this identity as down.
    fn is_down(&self, member: &MemberIdentity) -> bool {
        self.foca
            .iter_membership_state()
            .any(|m| m.id() == member && m.state() == State::Down)
    }

    async fn set_peers(&mut self, peers: Vec<(MachineId, SocketAddr)>) {
        let local = &self.identity.machine;
        self.peers = peers.into_iter().filter(|(id, _)| id != local).collect();
        // foca scales retransmissions and the suspicion's length with the Cluster's size.
        let size = u32::try_from(self.peers.len().saturating_add(1)).unwrap_or(u32::MAX);
        let size = NonZeroU32::new(size).unwrap_or(NonZeroU32::MIN);
        let config = self.profile.foca_config(size);
        self.suspicion = config.suspect_to_down_after;
        if let Err(e) = self.foca.set_config(config) {
            self.protocol_error(e);
        }
        let now = (Instant::now(), SystemTime::now());
        let before = self.observed.len();
        self.observed.retain(|id, _| self.peers.contains_key(id));
        let mut changed = self.observed.len() != before;
        for (id, address) in &self.peers {
            match self.observed.get_mut(id) {
                Some(observation) => {
                    if observation.address != *address {
                        observation.address = *address;
                        changed = true;
                    }
                }
                None => {
                    self.observed.insert(
                        id.clone(),
                        PeerObservation {
                            state: MembershipObservation::Unknown,
                            since: now.0.into_std(),
                            changed_at: now.1,
                            address: *address,
                            bump: None,
                        },
                    );
                    changed = true;
                }
            }
        }
        self.refresh_observations(changed);
        self.announce_to_missing().await;
    }

    /// Declares down every member foca has held as suspect, at the same incarnation, for half as
    /// long again as a suspicion lasts (the longer of its length then and now, as the Cluster's
    /// size changes it): what its lost suspicion timer would have done, or, for a suspicion
    /// this Machine only heard of, what its author's timer did. Timers fire on this task, on
    /// time; this runs on the announce tick, so up to one interval later.
    ///
    /// foca ends a suspicion with a timer bound to its timer token, and changes the token when
    /// this Machine renews its identity. A member this Machine suspected just before the Cluster
    /// declared this Machine down (both sides of a short cut suspect each other, and the side
    /// declared down first renews) then stays suspect here for good: its timer is ignored, and
    /// the member never refutes, because the suspicion was sent out while it could not hear and
    /// is not sent again. Its answered probes do not clear a suspicion either. Once declared down
    /// here, the member is told so on its next message (foca's `notify_down_members`) and
    /// renews, and is observed up again.
    async fn down_stale_suspects(&mut self) {
        let now = Instant::now();
        let current = self.suspicion;
        let stale: Vec<Member<MemberIdentity>> = self
            .suspected
            .iter()
            .filter(|(_, (_, since, then))| {
                now.duration_since(*since) >= (*then).max(current) * 3 / 2
            })
            .map(|(id, (incarnation, _, _))| Member::new(id.clone(), *incarnation, State::Down))
            .collect();
        if stale.is_empty() {
            return;
        }
        for member in &stale {
            tracing::info!(
                member = ?member.id(),
                "membership: a suspicion outlived its timer; the member is declared down so that it renews"
            );
            self.suspected.remove(member.id());
        }
        let mut effects = Effects::default();
        if let Err(e) = self.foca.apply_many(stale.into_iter(), true, &mut effects) {
            self.protocol_error(e);
        }
        self.carry_out(effects).await;
    }

    /// Keeps [`Driver::suspected`] to what foca holds as suspect now.
    fn follow_suspects(&mut self) {
        let now = Instant::now();
        let suspects: HashMap<&MemberIdentity, Incarnation> = self
            .foca
            .iter_membership_state()
            .filter(|m| m.state() == State::Suspect)
            .map(|m| (m.id(), m.incarnation()))
            .collect();
        self.suspected
            .retain(|id, (incarnation, _, _)| suspects.get(id) == Some(incarnation));
        for (id, incarnation) in suspects {
            self.suspected
                .entry(id.clone())
                .or_insert((incarnation, now, self.suspicion));
        }
    }

    /// Announces to every Machine of the set that foca does not hold as active.
    async fn announce_to_missing(&mut self) {
        let active: HashSet<&MachineId> =
            self.foca.iter_members().map(|m| &m.id().machine).collect();
        let missing: Vec<(MachineId, SocketAddr)> = self
            .peers
            .iter()
            .filter(|(id, _)| !active.contains(id))
            .map(|(id, addr)| (id.clone(), *addr))
            .collect();
        for (id, addr) in missing {
            let mut effects = Effects::default();
            match self
                .foca
                .announce(MemberIdentity::announce_target(id, addr), &mut effects)
            {
                Ok(()) => add(&self.counters.announces_sent, 1),
                Err(e) => self.protocol_error(e),
            }
            self.carry_out(effects).await;
        }
    }

    /// Leaves the Cluster: peers are told this identity is down.
    async fn leave(&mut self) {
        let mut effects = Effects::default();
        if let Err(e) = self.foca.leave_cluster(&mut effects) {
            self.protocol_error(e);
        }
        // foca tells a few random active members; telling a few more makes it likelier that the
        // news outruns the failed probes. The departure stays in foca's updates for this.
        if let Err(e) = self.foca.gossip(&mut effects) {
            self.protocol_error(e);
        }
        // Timers no longer matter: the task stops.
        effects.timers.clear();
        self.carry_out(effects).await;
        // Delayed sends (a simulated slow network) are part of leaving too.
        while self.delayed.join_next().await.is_some() {}
        tracing::info!(machine = %self.identity.machine, "membership left the Cluster");
    }

    fn protocol_error(&self, error: foca::Error) {
        add(&self.counters.protocol_errors, 1);
        tracing::warn!(error = %error, "membership: foca reported an error");
    }

    /// Sends what foca wrote, schedules what it asked for, and refreshes the observations.
    async fn carry_out(&mut self, effects: Effects) {
        let Effects {
            sends,
            timers,
            probes_failed,
            renewed_to,
            defunct,
        } = effects;
        for (to, data) in sends {
            self.send(to, data).await;
        }
        let now = Instant::now();
        for (after, timer) in timers {
            self.timers
                .insert((now + after, self.next_timer_seq), timer);
            self.next_timer_seq = self.next_timer_seq.wrapping_add(1);
        }
        add(&self.counters.probes_failed, probes_failed);
        if let Some(identity) = renewed_to {
            add(&self.counters.renewals, 1);
            tracing::info!(
                identity = ?identity,
                "membership: the Cluster declared this Machine down; rejoined with a renewed identity"
            );
            self.identity = identity;
        }
        if defunct {
            tracing::debug!(identity = ?self.identity, "membership: this identity is down");
        }
        self.refresh_observations(false);
    }

    async fn send(&mut self, to: SocketAddr, data: Vec<u8>) {
        let verdict = match &self.link {
            Some(link) => link.verdict(to, &data),
            None => LinkVerdict::Deliver,
        };
        match verdict {
            LinkVerdict::Deliver => {
                send_datagram(&self.socket, &self.counters, to, &data).await;
            }
            LinkVerdict::Drop => add(&self.counters.datagrams_dropped_by_link, 1),
            LinkVerdict::Delay(delay) => {
                let socket = Arc::clone(&self.socket);
                let counters = Arc::clone(&self.counters);
                // Reap the delayed sends already done, so the set stays small.
                while self.delayed.try_join_next().is_some() {}
                self.delayed.spawn(async move {
                    tokio::time::sleep(delay).await;
                    send_datagram(&socket, &counters, to, &data).await;
                });
            }
        }
    }

    /// Rebuilds every reported observation from foca's view, and publishes it when it changed
    /// (or when `changed` says the set itself changed).
    fn refresh_observations(&mut self, mut changed: bool) {
        self.follow_suspects();
        // foca holds one member per Machine ID (its `Identity::addr`): the freshest identity.
        let members: HashMap<&MachineId, (MembershipObservation, u64)> = self
            .foca
            .iter_membership_state()
            .map(|m| {
                let state = match m.state() {
                    State::Alive => MembershipObservation::Up,
                    State::Suspect => MembershipObservation::Suspect,
                    State::Down => MembershipObservation::Down,
                };
                (&m.id().machine, (state, m.id().bump))
            })
            .collect();
        let mut now = None;
        for (id, observation) in &mut self.observed {
            // A Machine foca no longer holds was forgotten after being down for long: the last
            // observation stands.
            let Some(&(state, bump)) = members.get(id) else {
                continue;
            };
            if observation.bump != Some(bump) {
                observation.bump = Some(bump);
                changed = true;
            }
            if observation.state != state {
                let (instant, wall) =
                    *now.get_or_insert_with(|| (Instant::now().into_std(), SystemTime::now()));
                log_change(id, observation.state, state, bump);
                observation.state = state;
                observation.since = instant;
                observation.changed_at = wall;
                add(&self.counters.state_changes, 1);
                changed = true;
            }
        }
        if changed {
            self.observations.send_replace(self.observed.clone());
        }
    }
}

fn log_change(
    id: &MachineId,
    from: MembershipObservation,
    to: MembershipObservation,
    identity_bump: u64,
) {
    match (from, to) {
        (_, MembershipObservation::Down) | (MembershipObservation::Down, _) => {
            tracing::info!(machine = %id, %from, %to, bump = identity_bump, "membership observation changed")
        }
        _ => {
            tracing::debug!(machine = %id, %from, %to, bump = identity_bump, "membership observation changed")
        }
    }
}

async fn send_datagram(socket: &UdpSocket, counters: &Counters, to: SocketAddr, data: &[u8]) {
    match socket.send_to(data, to).await {
        Ok(_) => {
            add(&counters.datagrams_sent, 1);
            add(&counters.bytes_sent, data.len() as u64);
        }
        Err(e) => {
            add(&counters.send_errors, 1);
            tracing::debug!(%to, error = %e, "membership: send failed");
        }
    }
}

/// Sleeps until `deadline`, or forever without one.
async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_probe_is_counted_from_its_suspicion_timer() {
        let mut effects = Effects::default();
        let id = MemberIdentity::fresh(MachineId::generate(), "127.0.0.1:1".parse().unwrap());
        effects.submit_after(Timer::ProbeRandomMember(0), Duration::from_secs(1));
        assert_eq!(effects.probes_failed, 0);
        effects.submit_after(
            Timer::ChangeSuspectToDown {
                member_id: id.clone(),
                incarnation: 0,
                token: 0,
            },
            Duration::from_secs(1),
        );
        assert_eq!(effects.probes_failed, 1);
        effects.send_to(id.clone(), b"x");
        assert_eq!(effects.sends, vec![(id.gossip, b"x".to_vec())]);
    }
}
