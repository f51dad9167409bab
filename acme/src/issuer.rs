//! The CertificateIssuer: the long-running module that orders and renews Certificate Material
//! for the Ingress Hostnames this Machine issues.
//!
//! One pass: read the Certificate Policy, the container observations, the stored material and the
//! participating Machines; pick the hostnames this Machine issues (rendezvous hashing); write a
//! status record for each; and for each hostname that wants material and whose backoff has
//! elapsed, take the Cluster DNS Verdict and, when it permits, order over HTTP-01. Between passes
//! the issuer sleeps until the earliest renewal point or retry (at most
//! [`IssuerConfig::max_sleep`]) and wakes early on any change to observations, Certificate
//! Material, the Certificate Policy or Machine records.
//!
//! Failures back off exponentially between the policy's bounds; the next attempt time is in the
//! status record (and survives a restart of the daemon, which reads it back).
//!
//! A store that cannot be read skips the pass: the status records, the backoff and everything
//! else stay as they are (a pass that took an unreadable store for an empty one would delete the
//! status records, or order anew every certificate), the failure is counted
//! ([`IssuerCounters`]) and logged once per streak, and the pass is tried again soon. Store
//! writes flush to disk: they run through [`blocking`], off the runtime's worker threads.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use instant_acme::{
    Account, AuthorizationStatus, ChallengeType, Identifier, NewOrder, OrderStatus, RetryPolicy,
};
use ployz_core::{
    read_leaf, CertificateMaterial, CertificatePolicy, CertificateState, CertificateStatus,
    ClusterDnsVerdict, MachineId,
};
use ployz_store::machines::MACHINES_NAMESPACE;
use ployz_store::observations::{stored_observations, CONTAINERS_NAMESPACE};
use ployz_store::{KeyPrefix, Store, StoreError};
use tokio::sync::watch;

use crate::acme_client::{is_account_missing, key_and_csr, Accounts};
use crate::rendezvous::{issuer_for, participating_machines};
use crate::verdict::{VerdictProbe, VerdictResolver};
use crate::wanted::{assess, ingress_https_hostnames, renewal_point, Need};
use ployz_store::certificates::{
    certificate_key, challenge_key, is_valid_token, status_key, statuses_of, stored_policy,
    ChallengeRecord, CERTIFICATES_NAMESPACE, CHALLENGES_NAMESPACE, POLICY_NAMESPACE,
    STATUS_NAMESPACE,
};

/// The time source of the issuer's decisions (renewal points, status times). Sleeping uses the
/// runtime's timer; the clock only says what time it is.
#[derive(Clone)]
pub struct Clock(Arc<dyn Fn() -> SystemTime + Send + Sync>);

impl Clock {
    /// The system clock.
    pub fn system() -> Clock {
        Clock(Arc::new(SystemTime::now))
    }

    /// A clock reading `f` (for tests: a shifted or frozen time).
    pub fn from_fn(f: impl Fn() -> SystemTime + Send + Sync + 'static) -> Clock {
        Clock(Arc::new(f))
    }

    /// Now.
    pub fn now(&self) -> SystemTime {
        (self.0)()
    }

    /// Now in milliseconds since the Unix epoch.
    pub fn now_ms(&self) -> i64 {
        self.now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64)
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::system()
    }
}

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Clock")
    }
}

/// Reads the Cluster's Machine public addresses from the store.
pub type PublicAddressFn = Arc<dyn Fn(&Store) -> BTreeSet<IpAddr> + Send + Sync>;

/// Where the Cluster's Machine public addresses come from, for the Cluster DNS Verdict.
#[derive(Clone, Default)]
pub enum PublicAddressSource {
    /// Not known: every verdict is [`ClusterDnsVerdict::Unknown`] and ordering goes ahead.
    #[default]
    Unknown,
    /// A fixed set (a flag, a test).
    Fixed(BTreeSet<IpAddr>),
    /// Read from the store on every verdict (from Machine records, once they carry them).
    Dynamic(PublicAddressFn),
}

impl PublicAddressSource {
    /// The addresses now; empty means unknown.
    pub fn addresses(&self, store: &Store) -> BTreeSet<IpAddr> {
        match self {
            PublicAddressSource::Unknown => BTreeSet::new(),
            PublicAddressSource::Fixed(s) => s.clone(),
            PublicAddressSource::Dynamic(f) => f(store),
        }
    }
}

impl std::fmt::Debug for PublicAddressSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PublicAddressSource::Unknown => f.write_str("Unknown"),
            PublicAddressSource::Fixed(s) => f.debug_tuple("Fixed").field(s).finish(),
            PublicAddressSource::Dynamic(_) => f.write_str("Dynamic"),
        }
    }
}

/// How long after a pass the store could not be read for the next one is tried.
const RETRY_AFTER_READ_FAILURE: Duration = Duration::from_secs(5);

/// Runs `f`, a store call that may wait for the disk (a write flushes before it returns),
/// without holding up the other tasks of the runtime: in `block_in_place` on a multi-threaded
/// runtime (the daemon's), inline on a current-thread one (where `block_in_place` cannot run,
/// and nothing else shares the thread's tasks but the caller's own).
pub(crate) fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) if runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

/// The failures the issuer lives through, counted (for metrics). Clones share the counts: keep
/// one from [`IssuerConfig::counters`] before handing the config to [`CertificateIssuer::run`].
#[derive(Debug, Clone, Default)]
pub struct IssuerCounters(Arc<Counts>);

#[derive(Debug, Default)]
struct Counts {
    store_read_failures: AtomicU64,
    store_write_failures: AtomicU64,
    wrong_machine: AtomicU64,
}

impl IssuerCounters {
    /// Passes skipped because the store could not be read (each left every status record,
    /// backoff and certificate as it was).
    pub fn store_read_failures(&self) -> u64 {
        self.0.store_read_failures.load(Ordering::Relaxed)
    }

    /// Store writes (status records, challenge records, material, presence) that failed.
    pub fn store_write_failures(&self) -> u64 {
        self.0.store_write_failures.load(Ordering::Relaxed)
    }

    /// Starts of [`CertificateIssuer::run`] whose [`IssuerConfig::machine_id`] was not the
    /// store's Machine (the issuer ran as the store's Machine instead).
    pub fn wrong_machine(&self) -> u64 {
        self.0.wrong_machine.load(Ordering::Relaxed)
    }

    fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// What the daemon gives the issuer.
#[derive(Debug, Clone)]
pub struct IssuerConfig {
    /// This Machine (must be the store's local Machine: status records are machine-owned).
    pub machine_id: MachineId,
    /// The resolver the Cluster DNS Verdict asks (`--verdict-resolver ADDR:PORT`; default the
    /// system's).
    pub verdict_resolver: VerdictResolver,
    /// The Cluster's Machine public addresses.
    pub public_addresses: PublicAddressSource,
    /// The time source.
    pub clock: Clock,
    /// The longest sleep between passes (the issuer wakes at least this often).
    pub max_sleep: Duration,
    /// The longest one order may take, end to end.
    pub order_timeout: Duration,
    /// The longest the issuer polls an order for readiness, and again for its certificate.
    pub poll_timeout: Duration,
    /// How long a challenge record is served.
    pub challenge_ttl: Duration,
    /// The port the edges answer HTTP-01 on (their HTTP listener's): before the authority is
    /// told a challenge is ready, the issuer waits (bounded by [`CHALLENGE_CHECK_WAIT`]) until
    /// every Machine address the hostname resolves to serves it there, since the record
    /// reaches the other Machines by replication. `None`: no such check.
    pub challenge_port: Option<u16>,
    /// The failures the issuer lives through.
    pub counters: IssuerCounters,
    /// The Machines this Machine does not observe up (membership: down, suspect, or not heard
    /// from since membership started here), now and as they change. A Machine not observed up
    /// for [`IssuerConfig::down_grace`] in a row no longer counts among the issuers here: the
    /// hostnames it would issue are ordered and renewed by the others. (Not only those observed
    /// down: a daemon started after a Machine died never hears of it, and holds it unknown.)
    pub machines_not_up: watch::Receiver<BTreeSet<MachineId>>,
    /// How long a Machine is not observed up before the others issue in its place. Long enough
    /// that a reboot or a short partition does not order a hostname twice (the authority counts
    /// duplicate certificates), short enough that a new hostname does not wait long for a
    /// Machine that lost power.
    pub down_grace: Duration,
}

impl IssuerConfig {
    /// The defaults for `machine_id`: system resolver, public addresses unknown, system clock,
    /// hourly wake, 5-minute orders, 2-minute polls, 1-hour challenge records.
    pub fn new(machine_id: MachineId) -> IssuerConfig {
        IssuerConfig {
            machine_id,
            verdict_resolver: VerdictResolver::System,
            public_addresses: PublicAddressSource::Unknown,
            clock: Clock::system(),
            max_sleep: Duration::from_secs(3600),
            order_timeout: Duration::from_secs(300),
            poll_timeout: Duration::from_secs(120),
            challenge_ttl: Duration::from_secs(3600),
            challenge_port: None,
            counters: IssuerCounters::default(),
            machines_not_up: watch::channel(BTreeSet::new()).1,
            down_grace: DEFAULT_DOWN_GRACE,
        }
    }
}

/// How long a Machine is not observed up before the others issue the hostnames it would: 10
/// minutes (a reboot comes back within it; a renewal due has weeks of slack).
pub const DEFAULT_DOWN_GRACE: Duration = Duration::from_secs(600);

/// The longest the issuer waits for a challenge to be served where the authority will look
/// before it tells the authority to look anyway.
pub const CHALLENGE_CHECK_WAIT: Duration = Duration::from_secs(10);

/// The wait after `failures` failures in a row (at least 1): the minimum doubled per failure,
/// with up to 20% jitter, within `[min, max]`.
pub fn backoff_delay(failures: u32, min: Duration, max: Duration) -> Duration {
    let exp = failures.saturating_sub(1).min(30);
    let base = min.saturating_mul(1u32 << exp.min(31));
    let jitter = 1.0 + rand::random::<f64>() * 0.2;
    base.mul_f64(jitter).clamp(min, max.max(min))
}

/// How long a hostname that does not point here waits before its verdict is taken again: the
/// failure backoff, but never longer than 15 minutes (DNS changes should be noticed soon).
fn verdict_recheck_delay(failures: u32, min: Duration, max: Duration) -> Duration {
    let cap = max.min(Duration::from_secs(900)).max(min);
    backoff_delay(failures, min, cap)
}

/// A hostname waiting for its next attempt.
#[derive(Debug, Clone)]
struct Backoff {
    failures: u32,
    next_attempt_ms: i64,
}

/// The certificate issuer of one Machine. Start it with [`CertificateIssuer::run`].
pub struct CertificateIssuer {
    config: IssuerConfig,
    accounts: Accounts,
    backoff: HashMap<String, Backoff>,
    /// When this issuer last stored material per hostname (Unix ms): a renewal is not ordered
    /// sooner than the policy's minimum backoff after the previous issuance, so a renewal
    /// fraction close to zero cannot make the issuer order in a tight loop.
    last_issued_ms: HashMap<String, i64>,
    probe: Option<(Duration, Arc<VerdictProbe>)>,
    /// The policy of the previous pass: a changed policy (someone fixed something) ends every
    /// backoff.
    last_policy: Option<CertificatePolicy>,
    /// The previous pass could not read the store (its failure was logged).
    unreadable: bool,
    /// Since when (Unix ms, this issuer's clock) each Machine has not been observed up, in a row.
    down_since: HashMap<MachineId, i64>,
    /// The status records of hostnames that went to another Machine while their backoff
    /// lasted, written again if they come back within it (and dropped with it).
    left: HashMap<String, CertificateStatus>,
    /// The Machines passed over in the previous pass (each change is logged once).
    passed_over: BTreeSet<MachineId>,
    /// The previous pass held back from passing over Machines because this Machine observed
    /// fewer than half the issuing Machines up (logged once).
    outnumbered: bool,
}

impl std::fmt::Debug for CertificateIssuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertificateIssuer")
            .field("machine_id", &self.config.machine_id)
            .field("backoff", &self.backoff)
            .finish_non_exhaustive()
    }
}

fn ms_to_secs_ceil(ms: i64) -> i64 {
    ms.div_euclid(1000) + i64::from(ms.rem_euclid(1000) != 0)
}

impl CertificateIssuer {
    /// An issuer with `config`; nothing happens until [`CertificateIssuer::run`] or
    /// [`CertificateIssuer::pass`].
    pub fn new(config: IssuerConfig) -> CertificateIssuer {
        CertificateIssuer {
            config,
            accounts: Accounts::default(),
            backoff: HashMap::new(),
            last_issued_ms: HashMap::new(),
            probe: None,
            last_policy: None,
            unreadable: false,
            down_since: HashMap::new(),
            left: HashMap::new(),
            passed_over: BTreeSet::new(),
            outnumbered: false,
        }
    }

    /// The failures this issuer lived through.
    pub fn counters(&self) -> &IssuerCounters {
        &self.config.counters
    }

    /// Runs the issuer on `store` until `shutdown` turns true (or its sender is dropped). An
    /// order in flight is abandoned at shutdown; its challenge records expire.
    ///
    /// The issuer writes machine-owned status records, so it issues as the store's Machine: a
    /// `config.machine_id` naming another is logged, counted
    /// ([`IssuerCounters::wrong_machine`]) and replaced by the store's.
    pub async fn run(
        store: Arc<Store>,
        mut config: IssuerConfig,
        mut shutdown: watch::Receiver<bool>,
    ) {
        if store.local() != &config.machine_id {
            IssuerCounters::count(&config.counters.0.wrong_machine);
            tracing::error!(
                configured = %config.machine_id,
                store = %store.local(),
                "the certificate issuer was configured for another Machine than its store's; it \
                 writes machine-owned status records, so it issues as the store's Machine"
            );
            config.machine_id = store.local().clone();
        }
        // Other Machines count this one among the issuers only while this record lives.
        let presence = ployz_store::machines::certificate_issuer_key(store.local());
        if !matches!(store.get(&presence), Ok(Some(r)) if r.live_value().is_some()) {
            if let Err(e) = blocking(|| store.put(&presence, Vec::new())) {
                IssuerCounters::count(&config.counters.0.store_write_failures);
                tracing::warn!(error = %e, "cannot record this Machine as a certificate issuer");
            }
        }
        let mut issuer = CertificateIssuer::new(config);
        issuer.restore(&store);
        let mut containers = store.watch(KeyPrefix::machine_namespace(CONTAINERS_NAMESPACE));
        let mut certificates = store.watch(KeyPrefix::cluster_namespace(CERTIFICATES_NAMESPACE));
        let mut policy = store.watch(KeyPrefix::cluster_namespace(POLICY_NAMESPACE));
        let mut machines = store.watch(KeyPrefix::machine_namespace(MACHINES_NAMESPACE));
        let mut down = issuer.config.machines_not_up.clone();
        tracing::info!(machine = %issuer.config.machine_id, "certificate issuer started");
        loop {
            if *shutdown.borrow() {
                break;
            }
            let wait = tokio::select! {
                _ = shutdown.changed() => break,
                wait = issuer.pass(&store) => wait,
            };
            tokio::select! {
                _ = shutdown.changed() => break,
                _ = tokio::time::sleep(wait) => {}
                e = containers.next() => if e.is_none() { break },
                e = certificates.next() => if e.is_none() { break },
                e = policy.next() => if e.is_none() { break },
                e = machines.next() => if e.is_none() { break },
                _ = changed_or_never(&mut down) => {}
            }
            // Coalesce a burst of changes into one pass.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tracing::info!("certificate issuer stopped");
    }

    /// Reads back this Machine's status records so a restarted daemon keeps honouring the
    /// backoff it had promised.
    pub fn restore(&mut self, store: &Store) {
        for (h, s) in statuses_of(store, &self.config.machine_id) {
            if let (CertificateState::Failed | CertificateState::NotPointingHere, Some(next)) =
                (s.state, s.next_attempt_at)
            {
                self.backoff.insert(
                    h,
                    Backoff {
                        failures: s.consecutive_failures.max(1),
                        next_attempt_ms: next.saturating_mul(1000),
                    },
                );
            }
        }
    }

    fn now_ms(&self) -> i64 {
        self.config.clock.now_ms()
    }

    /// Follows the Machines not observed up: returns those not observed up for the grace in a
    /// row (never this Machine), when the next one's grace ends, and those not observed up now.
    fn pass_over_down(&mut self, now_ms: i64) -> PassOver {
        let local = self.config.machine_id.clone();
        let down = self.config.machines_not_up.borrow().clone();
        self.down_since.retain(|m, _| down.contains(m));
        for m in down.iter().filter(|m| **m != local).cloned() {
            self.down_since.entry(m).or_insert(now_ms);
        }
        let grace_ms = i64::try_from(self.config.down_grace.as_millis()).unwrap_or(i64::MAX);
        let mut passed_over = BTreeSet::new();
        let mut next_ms: Option<i64> = None;
        for (m, since) in &self.down_since {
            let ends = since.saturating_add(grace_ms);
            if ends <= now_ms {
                passed_over.insert(m.clone());
            } else {
                next_ms = Some(next_ms.map_or(ends, |n| n.min(ends)));
            }
        }
        PassOver {
            past_grace: passed_over,
            grace_ends_ms: next_ms,
            not_up: down,
        }
    }

    /// Logs each Machine passed over, and each no longer passed over, once; while outnumbered
    /// (none is passed over, and [`CertificateIssuer::note_outnumbered`] said why) nothing.
    fn note_passed_over(&mut self, passed_over: BTreeSet<MachineId>, outnumbered: bool) {
        if outnumbered {
            return;
        }
        for m in passed_over.difference(&self.passed_over) {
            tracing::info!(
                machine = %m,
                grace_s = self.config.down_grace.as_secs(),
                "a Machine not observed up for the grace is passed over: the hostnames it would issue are issued by the others"
            );
        }
        for m in self.passed_over.difference(&passed_over) {
            tracing::info!(machine = %m, "a Machine is no longer passed over: it issues its hostnames again");
        }
        self.passed_over = passed_over;
    }

    /// Logs once when this Machine starts and stops holding back from passing over Machines
    /// because it observes fewer than half the issuing Machines up.
    fn note_outnumbered(&mut self, quorum: &Quorum) {
        if quorum.outnumbered == self.outnumbered {
            return;
        }
        self.outnumbered = quorum.outnumbered;
        if quorum.outnumbered {
            tracing::warn!(
                up = quorum.up,
                issuers = quorum.issuers,
                "this Machine observes fewer than half the issuing Machines up, itself included: it may be the one cut off, so it passes over none of them; the hostnames of those not up wait for them, or for a Machine that observes at least half up (remove a Machine gone for good: ployz machine rm)"
            );
        } else if quorum.half_up {
            // (Not outnumbered with fewer than half up: no Machine is past its grace any more,
            // and there is nothing to say.)
            tracing::info!(
                up = quorum.up,
                issuers = quorum.issuers,
                "this Machine observes at least half the issuing Machines up again: those not up past the grace are passed over"
            );
        }
    }

    /// One pass over every hostname; returns how long to sleep before the next one (unless a
    /// store change comes first).
    pub async fn pass(&mut self, store: &Store) -> Duration {
        let local = self.config.machine_id.clone();
        let now_ms = self.now_ms();
        let now = now_ms.div_euclid(1000);
        self.sweep_expired_challenges(store, now);
        let PassOver {
            past_grace,
            grace_ends_ms,
            not_up,
        } = self.pass_over_down(now_ms);
        // The pass ends early on several paths; a grace ending wakes it whichever it took.
        let within_grace = |wait: Duration| match grace_ends_ms.map(|t| (t - now_ms).max(0) as u64)
        {
            Some(ms) => wait.min(Duration::from_millis(ms).max(Duration::from_millis(200))),
            None => wait,
        };

        let PassInputs {
            mine,
            mut statuses,
            materials,
            quorum,
            passed_over,
        } = match read_pass_inputs(store, &local, &past_grace, &not_up) {
            Ok(inputs) => inputs,
            Err(e) => {
                IssuerCounters::count(&self.config.counters.0.store_read_failures);
                if !self.unreadable {
                    tracing::warn!(
                        error = %e,
                        retry_in_s = RETRY_AFTER_READ_FAILURE.as_secs(),
                        "certificate pass skipped: the store cannot be read; status records and \
                         certificates stay as they are"
                    );
                    self.unreadable = true;
                }
                return within_grace(RETRY_AFTER_READ_FAILURE.min(self.config.max_sleep));
            }
        };
        if std::mem::take(&mut self.unreadable) {
            tracing::info!("certificate passes resumed: the store reads again");
        }
        self.note_outnumbered(&quorum);
        self.note_passed_over(passed_over, quorum.outnumbered);
        for h in statuses.keys().filter(|h| !mine.contains(*h)) {
            if let Err(e) = blocking(|| store.delete(&status_key(&local, h))) {
                IssuerCounters::count(&self.config.counters.0.store_write_failures);
                tracing::warn!(hostname = %h, error = %e, "removing a certificate status failed");
            }
        }
        // A hostname that is no longer this Machine's keeps the wait promised for it while it
        // lasts, and its status: if it comes back (the Machine it went to goes, or this
        // Machine's view of who is up flips back), it is not ordered before then, and says so.
        self.backoff
            .retain(|h, b| mine.contains(h) || b.next_attempt_ms > now_ms);
        for (h, status) in statuses.iter().filter(|(h, _)| !mine.contains(*h)) {
            if self.backoff.contains_key(h) {
                self.left.insert(h.clone(), status.clone());
            }
        }
        self.left.retain(|h, _| self.backoff.contains_key(h));
        statuses.retain(|h, _| mine.contains(h));

        let policy = match stored_policy(store) {
            Ok(p) => p,
            Err(refusal) => {
                let message = refusal.to_string();
                for h in &mine {
                    let leaf = materials.get(h).and_then(|m| read_leaf(&m.chain_pem).ok());
                    let status = CertificateStatus {
                        hostname: h.clone(),
                        state: CertificateState::PolicyRefused,
                        not_after: leaf.as_ref().map(|l| l.not_after),
                        renew_at: None,
                        issuer: local.clone(),
                        last_error: Some(message.clone()),
                        consecutive_failures: 0,
                        last_attempt_at: None,
                        next_attempt_at: None,
                        verdict: None,
                        updated_at: now,
                    };
                    write_status(&self.config.counters, store, statuses.get(h), status);
                }
                if !mine.is_empty() {
                    tracing::warn!(error = %message, "certificate issuance held: the Certificate Policy is refused");
                }
                return within_grace(self.config.max_sleep);
            }
        };

        if self.last_policy.as_ref().is_some_and(|p| *p != policy) {
            tracing::info!("the Certificate Policy changed; retrying every held hostname now");
            self.backoff.clear();
            self.last_issued_ms.clear();
        }
        self.last_policy = Some(policy.clone());
        let backoff_min_ms = i64::try_from(policy.backoff_min().as_millis()).unwrap_or(i64::MAX);
        self.last_issued_ms
            .retain(|h, t| mine.contains(h) || t.saturating_add(backoff_min_ms) > now_ms);

        let assessment = assess(&mine, &materials, &policy, now);
        for (h, current) in &assessment.current {
            self.backoff.remove(h);
            let held = statuses.get(h);
            let status = CertificateStatus {
                hostname: h.clone(),
                state: CertificateState::Valid,
                not_after: Some(current.not_after),
                renew_at: Some(current.renew_at),
                issuer: local.clone(),
                last_error: None,
                consecutive_failures: 0,
                last_attempt_at: held.and_then(|s| s.last_attempt_at),
                next_attempt_at: None,
                verdict: held.and_then(|s| s.verdict.clone()),
                updated_at: now,
            };
            write_status(&self.config.counters, store, held, status);
        }
        for (h, need) in &assessment.wanted {
            // Back within the backoff it left with: its status says so again (the order waits).
            if !statuses.contains_key(h) && self.backoff.contains_key(h) {
                if let Some(mut status) = self.left.remove(h) {
                    status.updated_at = now;
                    write_status(&self.config.counters, store, None, status.clone());
                    statuses.insert(h.clone(), status);
                }
            }
            let held = statuses.get(h);
            let fresh = held.is_none_or(|s| {
                matches!(
                    s.state,
                    CertificateState::Valid | CertificateState::PolicyRefused
                )
            });
            if fresh && !self.backoff.contains_key(h) {
                let status = CertificateStatus {
                    hostname: h.clone(),
                    state: CertificateState::Pending,
                    not_after: need_not_after(need, materials.get(h)),
                    renew_at: None,
                    issuer: local.clone(),
                    last_error: None,
                    consecutive_failures: 0,
                    last_attempt_at: held.and_then(|s| s.last_attempt_at),
                    next_attempt_at: None,
                    verdict: held.and_then(|s| s.verdict.clone()),
                    updated_at: now,
                };
                write_status(&self.config.counters, store, held, status);
            }
        }

        let mut wake_ms: Vec<i64> = assessment
            .next_renewal()
            .map(|s| s.saturating_mul(1000))
            .into_iter()
            .chain(grace_ends_ms)
            .collect();
        for (h, need) in &assessment.wanted {
            if let Some(b) = self.backoff.get(h) {
                if b.next_attempt_ms > self.now_ms() {
                    wake_ms.push(b.next_attempt_ms);
                    continue;
                }
            }
            if matches!(need, Need::Renewal { .. }) {
                if let Some(last) = self.last_issued_ms.get(h) {
                    let earliest = last + policy.backoff_min().as_millis() as i64;
                    if earliest > self.now_ms() {
                        wake_ms.push(earliest);
                        continue;
                    }
                }
            }
            let held = status_of(store, &local, h);
            self.attempt(store, &policy, h, need, &materials, held.as_ref())
                .await;
            if let Some(b) = self.backoff.get(h) {
                wake_ms.push(b.next_attempt_ms);
            }
        }
        let now_ms = self.now_ms();
        let wait = wake_ms
            .into_iter()
            .map(|t| Duration::from_millis((t - now_ms).max(0) as u64))
            .min()
            .unwrap_or(self.config.max_sleep)
            .min(self.config.max_sleep);
        // Never spin, whatever the clock says.
        wait.max(Duration::from_millis(200))
    }

    /// Removes challenge records whose time is up (left by an abandoned order, on any Machine).
    /// A store that cannot be read is left for the pass to report.
    fn sweep_expired_challenges(&self, store: &Store, now: i64) {
        let Ok(records) = store.scan_live(&KeyPrefix::cluster_namespace(CHALLENGES_NAMESPACE))
        else {
            return;
        };
        for r in records {
            let expired = serde_json::from_slice::<ChallengeRecord>(&r.value)
                .map_or(true, |c| c.expires_at <= now);
            if expired {
                if let Err(e) = blocking(|| store.delete(&r.key)) {
                    IssuerCounters::count(&self.config.counters.0.store_write_failures);
                    tracing::warn!(key = %r.key, error = %e, "removing an expired challenge record failed");
                }
            }
        }
    }

    fn probe(&mut self, policy: &CertificatePolicy) -> Result<Arc<VerdictProbe>, String> {
        let timeout = policy.probe_timeout();
        if let Some((t, p)) = &self.probe {
            if *t == timeout {
                return Ok(p.clone());
            }
        }
        let p = Arc::new(VerdictProbe::new(self.config.verdict_resolver, timeout)?);
        self.probe = Some((timeout, p.clone()));
        Ok(p)
    }

    /// Verdict, then order, for one hostname; records the outcome in the store and the backoff.
    async fn attempt(
        &mut self,
        store: &Store,
        policy: &CertificatePolicy,
        hostname: &str,
        need: &Need,
        materials: &BTreeMap<String, CertificateMaterial>,
        held: Option<&CertificateStatus>,
    ) {
        let local = self.config.machine_id.clone();
        let started = self.now_ms().div_euclid(1000);
        let failures = self.backoff.get(hostname).map_or(0, |b| b.failures);
        let not_after = need_not_after(need, materials.get(hostname));
        let expected = self.config.public_addresses.addresses(store);
        let verdict = match self.probe(policy) {
            Ok(p) => p.verdict(hostname, &expected).await,
            Err(reason) => ClusterDnsVerdict::Unknown { reason },
        };
        if !verdict.permits_order() {
            let failures = failures + 1;
            let delay = verdict_recheck_delay(failures, policy.backoff_min(), policy.backoff_max());
            let next_ms = self.now_ms() + delay.as_millis() as i64;
            self.backoff.insert(
                hostname.to_owned(),
                Backoff {
                    failures,
                    next_attempt_ms: next_ms,
                },
            );
            tracing::info!(hostname, %verdict, "not ordering a certificate: the hostname does not point at this Cluster");
            let status = CertificateStatus {
                hostname: hostname.to_owned(),
                state: CertificateState::NotPointingHere,
                not_after,
                renew_at: None,
                issuer: local,
                last_error: Some(format!("not ordered: {hostname} {verdict}")),
                consecutive_failures: failures,
                last_attempt_at: Some(started),
                next_attempt_at: Some(ms_to_secs_ceil(next_ms)),
                verdict: Some(verdict),
                updated_at: started,
            };
            write_status(&self.config.counters, store, held, status);
            return;
        }
        if let ClusterDnsVerdict::Unknown { reason } = &verdict {
            tracing::info!(hostname, reason = %reason, "Cluster DNS Verdict unknown; ordering anyway");
        }
        let ordering = CertificateStatus {
            hostname: hostname.to_owned(),
            state: CertificateState::Ordering,
            not_after,
            renew_at: None,
            issuer: local.clone(),
            last_error: held.and_then(|s| s.last_error.clone()),
            consecutive_failures: failures,
            last_attempt_at: Some(started),
            next_attempt_at: None,
            verdict: Some(verdict.clone()),
            updated_at: started,
        };
        write_status(&self.config.counters, store, held, ordering.clone());
        tracing::info!(hostname, ?need, "ordering a certificate");

        // Where the authority will look: the Machine public addresses the hostname resolves to.
        let look_at = match &verdict {
            ClusterDnsVerdict::Points { matching, .. } => matching.clone(),
            _ => Vec::new(),
        };
        let outcome = match tokio::time::timeout(
            self.config.order_timeout,
            self.order(store, policy, hostname, &look_at),
        )
        .await
        {
            Ok(r) => r,
            Err(_) => Err(format!(
                "the order did not complete within {} s",
                self.config.order_timeout.as_secs()
            )),
        };
        let stored = outcome.and_then(|material| {
            let value = serde_json::to_vec(&material).expect("material serialises");
            blocking(|| store.put(&certificate_key(hostname), value))
                .map(|_| material)
                .map_err(|e| {
                    IssuerCounters::count(&self.config.counters.0.store_write_failures);
                    format!("storing the Certificate Material failed: {e}")
                })
        });
        let now_ms = self.now_ms();
        let now = now_ms.div_euclid(1000);
        match stored {
            Ok(material) => {
                self.backoff.remove(hostname);
                self.last_issued_ms.insert(hostname.to_owned(), now_ms);
                let leaf = read_leaf(&material.chain_pem).ok();
                tracing::info!(
                    hostname,
                    not_after = material.not_after,
                    serial = leaf.as_ref().map(|l| l.serial.as_str()).unwrap_or_default(),
                    "Certificate Material issued and stored"
                );
                let status = CertificateStatus {
                    hostname: hostname.to_owned(),
                    state: CertificateState::Valid,
                    not_after: Some(material.not_after),
                    renew_at: leaf.map(|l| {
                        renewal_point(l.not_before, l.not_after, policy.renewal_fraction())
                    }),
                    issuer: local,
                    last_error: None,
                    consecutive_failures: 0,
                    last_attempt_at: Some(started),
                    next_attempt_at: None,
                    verdict: Some(verdict),
                    updated_at: now,
                };
                write_status(&self.config.counters, store, Some(&ordering), status);
            }
            Err(error) => {
                let failures = failures + 1;
                let delay = backoff_delay(failures, policy.backoff_min(), policy.backoff_max());
                let next_ms = now_ms + delay.as_millis() as i64;
                self.backoff.insert(
                    hostname.to_owned(),
                    Backoff {
                        failures,
                        next_attempt_ms: next_ms,
                    },
                );
                tracing::warn!(hostname, %error, failures, retry_in_s = delay.as_secs_f64(), "ordering a certificate failed");
                let status = CertificateStatus {
                    hostname: hostname.to_owned(),
                    state: CertificateState::Failed,
                    not_after,
                    renew_at: None,
                    issuer: local,
                    last_error: Some(error),
                    consecutive_failures: failures,
                    last_attempt_at: Some(started),
                    next_attempt_at: Some(ms_to_secs_ceil(next_ms)),
                    verdict: Some(verdict),
                    updated_at: now,
                };
                write_status(&self.config.counters, store, Some(&ordering), status);
            }
        }
    }

    /// Orders a certificate for `hostname`; a vanished account is replaced once.
    async fn order(
        &mut self,
        store: &Store,
        policy: &CertificatePolicy,
        hostname: &str,
        look_at: &[IpAddr],
    ) -> Result<CertificateMaterial, String> {
        let account = self.accounts.account(store, policy).await?;
        let order = Order {
            store,
            policy,
            hostname,
            look_at,
            config: &self.config,
        };
        match order_once(&account, &order).await {
            Err(OrderFailure {
                account_missing: true,
                message,
            }) => {
                tracing::info!(%message, "the ACME account is gone; registering a new one");
                blocking(|| self.accounts.forget(store, policy));
                let account = self.accounts.account(store, policy).await?;
                order_once(&account, &order).await.map_err(|f| f.message)
            }
            other => other.map_err(|f| f.message),
        }
    }
}

/// What a pass reads from the store before it decides anything.
struct PassInputs {
    /// The hostnames this Machine issues.
    mine: BTreeSet<String>,
    /// This Machine's status records, by hostname.
    statuses: BTreeMap<String, CertificateStatus>,
    /// The stored Certificate Material, by hostname.
    materials: BTreeMap<String, CertificateMaterial>,
    /// How many of the issuing Machines this Machine observes up.
    quorum: Quorum,
    /// The issuing Machines left out of the choice (past their grace, unless outnumbered).
    passed_over: BTreeSet<MachineId>,
}

/// What [`CertificateIssuer::pass_over_down`] found.
struct PassOver {
    /// Not observed up for the grace in a row (never this Machine).
    past_grace: BTreeSet<MachineId>,
    /// When the next Machine's grace ends (Unix ms).
    grace_ends_ms: Option<i64>,
    /// Not observed up now.
    not_up: BTreeSet<MachineId>,
}

/// How many of the issuing Machines this Machine observes up, itself included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Quorum {
    up: usize,
    issuers: usize,
    /// At least half are up.
    half_up: bool,
    /// Fewer than half are up, and some are past their grace: none is passed over.
    outnumbered: bool,
}

/// Machines past their grace are passed over only while this Machine observes at least half
/// of the issuing Machines up, itself included. A Machine cut off from its peers (its own
/// link to them down, the internet still up) observes every other one not up; were it to pass
/// them over, it would order every hostname of the Cluster, spending the authority's limits on
/// duplicates and on validations that reach the other Machines' edges. Half, not a majority:
/// in a Cluster of two, the one left passes over the one that lost power (and, cut in two,
/// each side orders the other's hostnames once, as any two-sided partition at most does).
fn quorum(
    issuers: &BTreeSet<MachineId>,
    local: &MachineId,
    not_up: &BTreeSet<MachineId>,
    past_grace: &BTreeSet<MachineId>,
) -> Quorum {
    let up = issuers
        .iter()
        .filter(|m| *m == local || !not_up.contains(*m))
        .count();
    let half_up = up * 2 >= issuers.len();
    Quorum {
        up,
        issuers: issuers.len(),
        half_up,
        outnumbered: !half_up && issuers.iter().any(|m| past_grace.contains(m)),
    }
}

/// Completes when `rx` changes; never, once its sender is gone (an issuer given no membership
/// keeps every Machine).
async fn changed_or_never<T>(rx: &mut watch::Receiver<T>) {
    if rx.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Reads what a pass needs; any read the store refuses is an error, never an empty answer (no
/// hostname would be this Machine's, and every status record would be deleted; no material
/// would be stored, and every certificate ordered anew). Records that do not decode are
/// skipped.
fn read_pass_inputs(
    store: &Store,
    local: &MachineId,
    past_grace: &BTreeSet<MachineId>,
    not_up: &BTreeSet<MachineId>,
) -> Result<PassInputs, StoreError> {
    let hostnames = ingress_https_hostnames(&stored_observations(store)?);
    let mut participants = participating_machines(store, local)?;
    let quorum = quorum(&participants, local, not_up, past_grace);
    let passed_over: BTreeSet<MachineId> = if quorum.outnumbered {
        BTreeSet::new()
    } else {
        participants.intersection(past_grace).cloned().collect()
    };
    participants.retain(|m| !passed_over.contains(m));
    let mine = hostnames
        .into_iter()
        .filter(|h| issuer_for(h, &participants) == Some(local))
        .collect();
    // As `statuses_of` and `stored_materials` read them, with the store's refusal kept.
    let statuses = store
        .scan_live(&KeyPrefix::machine_namespace_of(STATUS_NAMESPACE, local))?
        .into_iter()
        .filter_map(|r| serde_json::from_slice::<CertificateStatus>(&r.value).ok())
        .map(|s| (s.hostname.clone(), s))
        .collect();
    let materials = store
        .scan_live(&KeyPrefix::cluster_namespace(CERTIFICATES_NAMESPACE))?
        .into_iter()
        .filter_map(|r| serde_json::from_slice::<CertificateMaterial>(&r.value).ok())
        .map(|m| (m.hostname.clone(), m))
        .collect();
    Ok(PassInputs {
        mine,
        statuses,
        materials,
        quorum,
        passed_over,
    })
}

fn need_not_after(need: &Need, material: Option<&CertificateMaterial>) -> Option<i64> {
    match need {
        Need::Missing | Need::Unreadable(_) => None,
        Need::Renewal { not_after, .. } => Some(*not_after),
        Need::NotCovered { .. } => material.map(|m| m.not_after),
    }
}

fn status_of(store: &Store, local: &MachineId, hostname: &str) -> Option<CertificateStatus> {
    store
        .get(&status_key(local, hostname))
        .ok()
        .flatten()
        .and_then(|r| r.live_value().map(<[u8]>::to_vec))
        .and_then(|v| serde_json::from_slice(&v).ok())
}

/// Writes `status` unless it says what `held` already says (ignoring the write time), so an
/// idle issuer does not churn the store.
fn write_status(
    counters: &IssuerCounters,
    store: &Store,
    held: Option<&CertificateStatus>,
    status: CertificateStatus,
) {
    if let Some(h) = held {
        let mut same = h.clone();
        same.updated_at = status.updated_at;
        if same == status {
            return;
        }
    }
    let key = status_key(&status.issuer, &status.hostname);
    let value = serde_json::to_vec(&status).expect("status serialises");
    if let Err(e) = blocking(|| store.put(&key, value)) {
        IssuerCounters::count(&counters.0.store_write_failures);
        tracing::warn!(hostname = %status.hostname, error = %e, "writing a certificate status failed");
    }
}

struct OrderFailure {
    message: String,
    account_missing: bool,
}

fn acme_failure(step: &'static str) -> impl Fn(instant_acme::Error) -> OrderFailure {
    move |e| OrderFailure {
        account_missing: is_account_missing(&e),
        message: format!("{step}: {}", ployz_core::error_chain(&e)),
    }
}

fn failure(message: String) -> OrderFailure {
    OrderFailure {
        message,
        account_missing: false,
    }
}

/// What one order is for.
struct Order<'a> {
    store: &'a Store,
    policy: &'a CertificatePolicy,
    hostname: &'a str,
    /// The Machine addresses the hostname resolves to, where the authority will look.
    look_at: &'a [IpAddr],
    config: &'a IssuerConfig,
}

/// One order, start to finish: new order, HTTP-01 for each authorization not yet valid (records
/// written to the store, and served where the authority will look, before it is told),
/// readiness, CSR, certificate. The challenge records are removed whatever happens.
async fn order_once(account: &Account, o: &Order<'_>) -> Result<CertificateMaterial, OrderFailure> {
    let Order {
        store,
        policy,
        hostname,
        look_at,
        config,
    } = *o;
    let identifiers = [Identifier::Dns(hostname.to_owned())];
    let mut order = account
        .new_order(&NewOrder::new(&identifiers))
        .await
        .map_err(acme_failure("creating the order failed"))?;
    let mut tokens: Vec<String> = Vec::new();
    let result = async {
        let expires_at = config.clock.now_ms().div_euclid(1000) + config.challenge_ttl.as_secs() as i64;
        {
            let mut authorizations = order.authorizations();
            while let Some(authz) = authorizations.next().await {
                let mut authz = authz.map_err(acme_failure("fetching an authorization failed"))?;
                match authz.status {
                    // Reused from an earlier order: nothing to prove.
                    AuthorizationStatus::Valid => continue,
                    AuthorizationStatus::Pending => {}
                    other => {
                        return Err(failure(format!(
                            "the authorization for {hostname} is {other:?}, not pending"
                        )))
                    }
                }
                let mut challenge = authz.challenge(ChallengeType::Http01).ok_or_else(|| {
                    failure(format!(
                        "the authority offers no http-01 challenge for {hostname}; Ployz performs only http-01"
                    ))
                })?;
                if !is_valid_token(&challenge.token) {
                    return Err(failure(format!(
                        "the authority's http-01 token for {hostname} is not base64url; it cannot be served"
                    )));
                }
                let record = ChallengeRecord {
                    token: challenge.token.clone(),
                    key_authorization: challenge.key_authorization().as_str().to_owned(),
                    hostname: hostname.to_owned(),
                    expires_at,
                };
                // Durable (flushed) before the authority is told to look.
                let value = serde_json::to_vec(&record).expect("challenge serialises");
                blocking(|| store.put(&challenge_key(&record.token), value)).map_err(|e| {
                    IssuerCounters::count(&config.counters.0.store_write_failures);
                    failure(format!("storing the challenge failed: {e}"))
                })?;
                tokens.push(record.token.clone());
                if let Some(port) = config.challenge_port {
                    let missing = wait_served(look_at, port, &record).await;
                    if !missing.is_empty() {
                        tracing::warn!(
                            hostname,
                            addresses = ?missing,
                            "the challenge is not served at every address the hostname resolves to \
                             within {} s; telling the authority anyway",
                            CHALLENGE_CHECK_WAIT.as_secs()
                        );
                    }
                }
                challenge
                    .set_ready()
                    .await
                    .map_err(acme_failure("telling the authority the challenge is ready failed"))?;
            }
        }
        let retry = RetryPolicy::new()
            .initial_delay(Duration::from_millis(250))
            .backoff(1.5)
            .timeout(config.poll_timeout);
        let status = order
            .poll_ready(&retry)
            .await
            .map_err(acme_failure("waiting for validation failed"))?;
        if status != OrderStatus::Ready {
            let mut reasons = Vec::new();
            let mut authorizations = order.authorizations();
            while let Some(Ok(mut authz)) = authorizations.next().await {
                if let Ok(state) = authz.refresh().await {
                    reasons.extend(state.challenges.iter().filter_map(|c| {
                        c.error.as_ref().map(|p| format!("{:?}: {p}", c.r#type))
                    }));
                }
            }
            return Err(failure(format!(
                "validation of {hostname} failed (order {status:?}){}",
                if reasons.is_empty() {
                    String::new()
                } else {
                    format!(": {}", reasons.join("; "))
                }
            )));
        }
        let key_type = policy.key_type();
        let name = hostname.to_owned();
        let (key_pem, csr) = tokio::task::spawn_blocking(move || key_and_csr(&name, key_type))
            .await
            .map_err(|e| failure(format!("generating the key failed: {e}")))?
            .map_err(failure)?;
        order
            .finalize_csr(&csr)
            .await
            .map_err(acme_failure("finalizing the order failed"))?;
        let chain = order
            .poll_certificate(&retry)
            .await
            .map_err(acme_failure("downloading the certificate failed"))?;
        CertificateMaterial::check(hostname, &chain, &key_pem, config.clock.now_ms().div_euclid(1000))
            .map_err(|e| failure(format!("the issued certificate is not usable: {e}")))
    }
    .await;
    for token in &tokens {
        if let Err(e) = blocking(|| store.delete(&challenge_key(token))) {
            IssuerCounters::count(&config.counters.0.store_write_failures);
            tracing::warn!(error = %e, "removing a challenge record failed");
        }
    }
    result
}

/// Waits until `http://ADDR:port/.well-known/acme-challenge/TOKEN` (with the hostname as
/// `Host`) answers the key authorization at every address of `look_at`, or until
/// [`CHALLENGE_CHECK_WAIT`]; answers the addresses that did not.
async fn wait_served(look_at: &[IpAddr], port: u16, record: &ChallengeRecord) -> Vec<IpAddr> {
    let deadline = tokio::time::Instant::now() + CHALLENGE_CHECK_WAIT;
    let mut missing: Vec<IpAddr> = look_at.to_vec();
    loop {
        let mut still = Vec::new();
        for addr in missing {
            if !serves(std::net::SocketAddr::new(addr, port), record).await {
                still.push(addr);
            }
        }
        missing = still;
        if missing.is_empty() || tokio::time::Instant::now() >= deadline {
            return missing;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether the edge at `addr` answers `record`'s challenge request with its key authorization.
async fn serves(addr: std::net::SocketAddr, record: &ChallengeRecord) -> bool {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let ask = async {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        let request = format!(
            "GET /.well-known/acme-challenge/{} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            record.token, record.hostname
        );
        s.write_all(request.as_bytes()).await?;
        let mut answer = Vec::new();
        s.take(64 * 1024).read_to_end(&mut answer).await?;
        Ok::<_, std::io::Error>(answer)
    };
    let Ok(Ok(answer)) = tokio::time::timeout(Duration::from_secs(1), ask).await else {
        return false;
    };
    let text = String::from_utf8_lossy(&answer);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return false;
    };
    head.starts_with("HTTP/1.1 200") && body.trim() == record.key_authorization
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_within_bounds() {
        let min = Duration::from_secs(60);
        let max = Duration::from_secs(6 * 3600);
        for _ in 0..50 {
            let d1 = backoff_delay(1, min, max);
            assert!(d1 >= min && d1 <= min.mul_f64(1.2), "{d1:?}");
            let d3 = backoff_delay(3, min, max);
            assert!(d3 >= min * 4 && d3 <= (min * 4).mul_f64(1.2), "{d3:?}");
            let d20 = backoff_delay(20, min, max);
            assert_eq!(d20, max);
            assert_eq!(backoff_delay(u32::MAX, min, max), max);
        }
        // min == max: always that.
        assert_eq!(
            backoff_delay(5, Duration::from_secs(1), Duration::from_secs(1)),
            Duration::from_secs(1)
        );
        // Verdict rechecks stay within 15 minutes unless the minimum is longer.
        assert!(verdict_recheck_delay(30, min, max) <= Duration::from_secs(900));
        let long_min = Duration::from_secs(1800);
        assert_eq!(verdict_recheck_delay(30, long_min, max), long_min);
    }

    fn observation(machine: &MachineId, hostname: &str) -> ployz_core::ContainerRuntimeObservation {
        let mut spec: ployz_core::ServiceSpec = serde_json::from_value(serde_json::json!({
            "name": "web",
            "container": { "image": "busybox" },
        }))
        .unwrap();
        spec.ports = vec![ployz_core::PortSpec::Ingress {
            hostname: Some(hostname.to_owned()),
            published: None,
            container_port: 8080,
            protocol: ployz_core::IngressProtocol::Https,
        }];
        ployz_core::ContainerRuntimeObservation {
            id: MachineId::generate().as_str().parse().unwrap(),
            name: "web-abcd".into(),
            machine_id: machine.clone(),
            service_id: ployz_core::ServiceId::generate(),
            service_name: "web".parse().unwrap(),
            kind: ployz_core::ContainerKind::Service,
            state: ployz_core::ContainerState::Running,
            health: None,
            restart_count: 0,
            address: None,
            image: "busybox".into(),
            created_at: 0,
            spec: Some(spec),
            plan_id: None,
            lease_token: None,
        }
    }

    #[tokio::test]
    async fn a_store_that_cannot_be_read_leaves_the_status_records() {
        let store = Store::temporary(MachineId::generate()).unwrap();
        let local = store.local().clone();
        let o = observation(&local, "keep.example.test");
        store
            .put(
                &ployz_store::observations::container_key(&o),
                serde_json::to_vec(&o).unwrap(),
            )
            .unwrap();
        let held = CertificateStatus {
            hostname: "keep.example.test".into(),
            state: CertificateState::Failed,
            not_after: None,
            renew_at: None,
            issuer: local.clone(),
            last_error: Some("the authority did not answer".into()),
            consecutive_failures: 2,
            last_attempt_at: Some(1),
            next_attempt_at: Some(2),
            verdict: None,
            updated_at: 1,
        };
        store
            .put(
                &status_key(&local, &held.hostname),
                serde_json::to_vec(&held).unwrap(),
            )
            .unwrap();
        let config = IssuerConfig::new(local.clone());
        let counters = config.counters.clone();
        let mut issuer = CertificateIssuer::new(config);

        // The observations, then the Machine records, cannot be read: no pass happens (no
        // order: the default policy names a public authority), and the status stays.
        for (n, namespace) in [CONTAINERS_NAMESPACE, MACHINES_NAMESPACE]
            .into_iter()
            .enumerate()
        {
            store.fail_reads_under(
                &KeyPrefix::machine_namespace(namespace),
                "injected read failure",
            );
            let wait = issuer.pass(&store).await;
            assert_eq!(wait, RETRY_AFTER_READ_FAILURE);
            assert_eq!(counters.store_read_failures(), n as u64 + 1);
            store.fail_reads(None);
            assert_eq!(
                statuses_of(&store, &local).get("keep.example.test"),
                Some(&held),
                "after a pass that could not read {namespace}"
            );
        }
        assert_eq!(counters.store_write_failures(), 0);
    }

    #[tokio::test]
    async fn an_issuer_configured_for_another_machine_issues_as_the_stores() {
        let store = Arc::new(Store::temporary(MachineId::generate()).unwrap());
        let config = IssuerConfig::new(MachineId::generate());
        let counters = config.counters.clone();
        let (_stop, shutdown) = watch::channel(true);
        CertificateIssuer::run(store.clone(), config, shutdown).await;
        assert_eq!(counters.wrong_machine(), 1);
        let presence = ployz_store::machines::certificate_issuer_key(store.local());
        assert!(store.get(&presence).unwrap().is_some_and(|r| !r.tombstone));
    }

    #[test]
    fn seconds_round_up() {
        assert_eq!(ms_to_secs_ceil(1_000), 1);
        assert_eq!(ms_to_secs_ceil(1_001), 2);
        assert_eq!(ms_to_secs_ceil(0), 0);
    }
}
