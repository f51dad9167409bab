//! The Machine leases of a command that changes containers (a Deploy, `ployz rm`, `stop`,
//! `start`), on every Machine it changes.
//!
//! Each Machine has its own lease (`daemon/src/lease.rs`): one command at a time changes it, and
//! every call the command makes there carries that Machine's fencing token. A command that
//! changes several Machines takes their leases one by one in Machine ID order (two commands
//! wanting the same Machines never each hold one the other waits for), through the Machine the
//! CLI reaches, which forwards each call. A Machine that cannot be reached is left out (the
//! command goes on without it, and says so); a Machine whose lease another command holds is
//! waited for (`--lease-wait`), then the command gives up, releasing what it took.
//!
//! A lease lapses its TTL (`LeaseHolder::ttl_ms`, 10 s) after its holder's last call there,
//! and a Deploy may work on one Machine for minutes while another waits its turn (or wait for
//! one Machine's lease while holding another's), or send a built image for longer than that
//! before its first call that carries the token: a second connection renews every lease taken
//! so far every few seconds until they are released, one Machine or many.

use std::time::Duration;

use anyhow::{anyhow, Context as _};
use ployz_core::api::{docker_paths, LeaseAnswer, LeaseHolder, LeaseRequest};
use ployz_core::{MachineId, NotIncluded};

use crate::client::ApiClient;

/// A Machine a command would change: `id` is `None` for the Machine reached when it knows no
/// Cluster (before `machine init`), whose calls carry no Machine Target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reached {
    pub id: Option<MachineId>,
    pub name: String,
    /// The Edge Features its record publishes (`None`: no record of its own was read); kept
    /// for when it is left out.
    pub edge_features: Option<Vec<String>>,
}

/// The Machines a command asks, and the ones the Machine reached knows of but observes down.
#[derive(Debug, Clone)]
pub struct Reach {
    /// In Machine ID order.
    pub machines: Vec<Reached>,
    pub not_included: Vec<NotIncluded>,
}

impl Reach {
    /// Every Machine the Machine reached observes, except the ones it observes down (those are
    /// not asked: a call to them would wait out its timeout) and the ones whose record it cannot
    /// read. A Machine that is not initialised is asked alone (what it answers next says so);
    /// any other failure to list the Machines is the command's error: planning from one
    /// Machine's view while others run the Services would be planning blind.
    pub async fn observe(client: &mut ApiClient) -> anyhow::Result<Reach> {
        let list = match client
            .get::<ployz_core::api::MachineList>(ployz_core::api::paths::MACHINES)
            .await
        {
            Ok(list) => list,
            Err(e) if not_initialised(&e) => return Ok(Reach::alone()),
            Err(e) => return Err(e.context("cannot list the Machines of the Cluster")),
        };
        let mut machines = Vec::new();
        let mut not_included: Vec<NotIncluded> = list
            .failures
            .iter()
            .filter_map(|f| {
                Some(NotIncluded {
                    machine: f.target.parse().ok()?,
                    name: f.target.clone(),
                    reason: format!("its record cannot be read here: {}", f.reason),
                    edge_features: None,
                    services: Vec::new(),
                })
            })
            .collect();
        for m in list.values {
            if m.membership == ployz_core::MembershipObservation::Down {
                not_included.push(NotIncluded {
                    machine: m.info.id.clone(),
                    name: m.info.name.to_string(),
                    reason: "the Machine reached observes it down".into(),
                    edge_features: m.info.published_edge_features().map(<[String]>::to_vec),
                    services: Vec::new(),
                });
            } else {
                machines.push(Reached {
                    id: Some(m.info.id.clone()),
                    name: m.info.name.to_string(),
                    edge_features: m.info.published_edge_features().map(<[String]>::to_vec),
                });
            }
        }
        if machines.is_empty() {
            return Ok(Reach::alone());
        }
        machines.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(Reach {
            machines,
            not_included,
        })
    }

    /// The Machine reached, alone, named by no Machine Target.
    pub fn alone() -> Reach {
        Reach {
            machines: vec![Reached {
                id: None,
                name: String::new(),
                edge_features: None,
            }],
            not_included: Vec::new(),
        }
    }

    /// Only the Machines in `ids` (and the Machine reached when it is asked alone).
    pub fn only(mut self, ids: &[MachineId]) -> Reach {
        self.machines
            .retain(|m| m.id.as_ref().is_none_or(|id| ids.contains(id)));
        self.not_included.retain(|n| ids.contains(&n.machine));
        self
    }

    /// How a message names `m`: "this Machine" when the command asks one Machine.
    pub fn subject(&self, m: &Reached) -> String {
        if self.machines.len() == 1 {
            "this Machine".to_owned()
        } else {
            format!("Machine {}", m.name)
        }
    }
}

/// One lease this command holds.
#[derive(Debug, Clone)]
pub struct Held {
    pub machine: Reached,
    pub token: u64,
    pub ttl: Duration,
}

/// The leases a command holds, released by [`Leases::release`] (a lease not released lapses
/// on its own once the command stops calling).
pub struct Leases {
    pub held: Vec<Held>,
    /// What the renewer renews: the leases taken so far, shared with it.
    renewing: std::sync::Arc<std::sync::Mutex<Vec<Held>>>,
    renewer: Option<tokio::task::JoinHandle<()>>,
}

impl Leases {
    /// Takes the lease of every Machine of `reach` in order, each waiting up to `wait` while
    /// another command holds it. A Machine that does not answer is moved to `not_included`; a
    /// Machine still busy after the wait ends the command, with every lease taken released.
    pub async fn take(
        client: &mut ApiClient,
        reach: &mut Reach,
        command: &str,
        wait: Duration,
    ) -> anyhow::Result<Leases> {
        let mut leases = Leases {
            held: Vec::new(),
            renewing: Default::default(),
            renewer: None,
        };
        // Kept while the next Machine's is waited for, and while nothing else calls with them
        // (an image sent to the only Machine may take minutes over a slow link).
        leases.renewer = Some(renew_in_background(client, leases.renewing.clone()).await?);
        let mut left_out = Vec::new();
        for m in reach.machines.clone() {
            client.set_machine_target(m.id.as_ref().map(|id| id.to_string()));
            let taken = take_one(client, &reach.subject(&m), command, wait).await;
            client.set_machine_target(None);
            match taken {
                Ok(holder) => {
                    let held = Held {
                        machine: m,
                        token: holder.token,
                        ttl: Duration::from_millis(holder.ttl_ms),
                    };
                    leases
                        .renewing
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push(held.clone());
                    leases.held.push(held);
                }
                Err(e)
                    if m.id.is_some()
                        && reach.machines.len() > 1
                        && crate::targets::is_unavailable(&e) =>
                {
                    left_out.push((m, format!("{e:#}")));
                }
                Err(e) => {
                    leases.release(client).await;
                    return Err(e);
                }
            }
        }
        for (m, reason) in left_out {
            reach.machines.retain(|r| r != &m);
            reach.not_included.push(NotIncluded {
                machine: m.id.expect("checked above"),
                name: m.name,
                reason,
                edge_features: m.edge_features,
                services: Vec::new(),
            });
        }
        Ok(leases)
    }

    /// The lease held on `machine` (`None`: the Machine reached, asked alone).
    pub fn on(&self, machine: Option<&MachineId>) -> Option<&Held> {
        self.held
            .iter()
            .find(|h| h.machine.id.as_ref() == machine || h.machine.id.is_none())
    }

    /// Points `client` at `machine` with its lease's token: every call until [`Leases::aim_off`]
    /// goes there under this command's lease. A Machine this command holds no lease on is
    /// refused.
    pub fn aim(&self, client: &mut ApiClient, machine: &MachineId) -> Result<(), String> {
        let held = self.on(Some(machine)).ok_or_else(|| {
            format!("this command holds no lease on Machine {machine}, so it changes nothing there")
        })?;
        client.set_machine_target(held.machine.id.as_ref().map(|id| id.to_string()));
        client.set_lease_token(Some(held.token));
        Ok(())
    }

    /// Calls go to the Machine reached again, under no lease.
    pub fn aim_off(client: &mut ApiClient) {
        client.set_machine_target(None);
        client.set_lease_token(None);
    }

    /// Renews every lease now (a person is deciding whether to go on).
    pub async fn renew(&self, client: &mut ApiClient) -> anyhow::Result<()> {
        for h in &self.held {
            client.set_machine_target(h.machine.id.as_ref().map(|id| id.to_string()));
            client.set_lease_token(Some(h.token));
            let renewed: anyhow::Result<LeaseHolder> = client.put(docker_paths::LEASE, &()).await;
            Leases::aim_off(client);
            renewed.with_context(|| {
                format!(
                    "the lease of {} could not be kept while waiting for the answer",
                    if self.held.len() == 1 {
                        "this Machine".to_owned()
                    } else {
                        format!("Machine {}", h.machine.name)
                    }
                )
            })?;
        }
        Ok(())
    }

    /// Releases the lease on `machine` alone (the command leaves that Machine out).
    pub async fn release_one(&mut self, client: &mut ApiClient, machine: &MachineId) {
        let Some(i) = self
            .held
            .iter()
            .position(|h| h.machine.id.as_ref() == Some(machine))
        else {
            return;
        };
        let h = self.held.remove(i);
        self.renewing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .retain(|r| r.token != h.token || r.machine != h.machine);
        client.set_machine_target(Some(machine.to_string()));
        client.set_lease_token(Some(h.token));
        let _ = client.delete(docker_paths::LEASE).await;
        Leases::aim_off(client);
    }

    /// Releases every lease. One that cannot be released (its Machine is gone) lapses on its
    /// own.
    pub async fn release(&mut self, client: &mut ApiClient) {
        if let Some(renewer) = self.renewer.take() {
            renewer.abort();
        }
        for h in self.held.drain(..) {
            client.set_machine_target(h.machine.id.as_ref().map(|id| id.to_string()));
            client.set_lease_token(Some(h.token));
            let _ = client.delete(docker_paths::LEASE).await;
        }
        Leases::aim_off(client);
    }
}

impl Drop for Leases {
    fn drop(&mut self) {
        if let Some(renewer) = self.renewer.take() {
            renewer.abort();
        }
    }
}

/// Whether a failed call says the Machine reached is not initialised.
fn not_initialised(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause
            .downcast_ref::<ployz_core::api::ApiError>()
            .is_some_and(|a| a.code == ployz_core::api::ErrorCode::FailedPrecondition)
    })
}

/// A task renewing the leases in `held` (as they are taken) over a connection of its own,
/// every 3 s or a third of the shortest lease's lifetime if that is shorter.
async fn renew_in_background(
    client: &ApiClient,
    held: std::sync::Arc<std::sync::Mutex<Vec<Held>>>,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let mut renewing = ApiClient::connect(client.connection())
        .await
        .context("cannot open a second connection to keep the Machines' leases")?;
    Ok(tokio::spawn(async move {
        loop {
            let now: Vec<Held> = held
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone();
            let every = now
                .iter()
                .map(|h| h.ttl / 3)
                .min()
                .unwrap_or(Duration::from_secs(3))
                .clamp(Duration::from_millis(500), Duration::from_secs(3));
            tokio::time::sleep(every).await;
            for h in &now {
                renewing.set_machine_target(h.machine.id.as_ref().map(|id| id.to_string()));
                renewing.set_lease_token(Some(h.token));
                // A lease that cannot be renewed lapses; the next call there says so.
                let _: anyhow::Result<LeaseHolder> = renewing.put(docker_paths::LEASE, &()).await;
            }
        }
    }))
}

/// Takes one Machine's lease for `command` (the client aimed at it), waiting up to `wait` (with
/// a progress line) while another command holds it, then refusing with who holds it. `subject`
/// names the Machine in messages.
async fn take_one(
    client: &mut ApiClient,
    subject: &str,
    command: &str,
    wait: Duration,
) -> anyhow::Result<LeaseHolder> {
    let request = LeaseRequest {
        holder: holder_name(),
        command: command.to_owned(),
    };
    let started = std::time::Instant::now();
    let mut last_said: Option<std::time::Instant> = None;
    loop {
        let answer: LeaseAnswer = client
            .post(docker_paths::LEASE, &request)
            .await
            .with_context(|| format!("cannot take {}'s lease", possessive(subject)))?;
        let (busy, ttl_ms) = match answer {
            LeaseAnswer::Granted { holder, took_over } => {
                if let Some(previous) = took_over {
                    eprintln!(
                        "took over {} lease from {previous}: it made no call for {} s",
                        possessive(subject),
                        holder.ttl_ms / 1000
                    );
                }
                return Ok(holder);
            }
            LeaseAnswer::Held { holder } => {
                let ttl = holder.ttl_ms;
                (format!("its lease is held by {holder}"), Some(ttl))
            }
            LeaseAnswer::Busy { operations } => (
                format!("{operations} call(s) made without a lease are changing it"),
                None,
            ),
        };
        let waited = started.elapsed();
        if waited >= wait {
            let lapse = ttl_ms.map_or(String::new(), |ms| {
                format!(
                    " (a holder that died loses the lease {} s after its last call)",
                    ms / 1000
                )
            });
            return Err(anyhow!(
                "{subject} is busy: {busy}; nothing was changed; run this again once that command ends, or wait longer with --lease-wait SECONDS{lapse}"
            ));
        }
        if last_said.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
            eprintln!(
                "waiting for {} lease: {busy} (waited {} s of up to {} s)",
                possessive(subject),
                waited.as_secs(),
                wait.as_secs()
            );
            last_said = Some(std::time::Instant::now());
        }
        tokio::time::sleep((wait - waited).min(Duration::from_millis(500))).await;
    }
}

/// "this Machine's", "Machine m2's".
fn possessive(subject: &str) -> String {
    format!("{subject}'s")
}

/// Who this command is, as the lease names its holder: user, host and process.
fn holder_name() -> String {
    format!("{} (pid {})", user_at_host(), std::process::id())
}

/// Who runs this command, as records of what a person did name them (a lease's holder, a
/// Service Revision's and a Service Gate's setter): `user@host`, control characters dropped.
pub fn user_at_host() -> String {
    let clean = |s: String| -> String {
        s.chars()
            .filter(|c| !c.is_control())
            .take(60)
            .collect::<String>()
    };
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .map(clean)
        .ok()
        .filter(|u| !u.trim().is_empty())
        .unwrap_or_else(|| "unknown user".to_owned());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| clean(h.trim().to_owned()))
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown host".to_owned());
    format!("{user}@{host}")
}
