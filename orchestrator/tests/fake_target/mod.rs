//! [`FakeTarget`]: an in-memory [`DeployTarget`] that keeps containers, their states, drain marks
//! and volumes the way a Machine's daemon does, so the executor can be tested without dockerd.
//!
//! What it mirrors (see `daemon/src/docker_api.rs`, `daemon/src/drain.rs` and
//! `orchestrator/src/docker.rs`):
//! - a Machine the target does not know is unreachable; a container of another Machine, or one
//!   that is gone, is "no such container" to every call but removal, for which gone is fine;
//! - run creates and starts a container (`<service>-<4 hex of its ID>`); right after the start its
//!   health is `starting` when its spec configures a Healthcheck;
//! - stop leaves a container exited (stopping a stopped one is fine) and its drain mark standing;
//!   start runs it again and lifts its mark; removal lifts its mark; drain sets one; undrain lifts
//!   it, if any;
//! - a hook removes the Service's earlier Hook Containers, then runs one
//!   (`<service>-pre-deploy-<4>`) to its end and keeps it, exited;
//! - a new container of a Service looks, observation after observation, the way that Service's
//!   [`Behaviour`] says, the last look repeating; once stopped or started it stays as that left it.
//!
//! Any call can be told to fail ([`FakeTarget::fail`]); a failing call changes nothing.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use ployz_core::api::HookResult;
use ployz_core::{
    ContainerHealth, ContainerId, ContainerKind, ContainerRef, ContainerRuntimeObservation,
    ContainerState, Healthcheck, MachineId, PreDeployHook, ServiceId, ServiceSpec, VolumeSpec,
};
use ployz_orchestrator::execute::DeployTarget;

/// One call of [`DeployTarget`], to make fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    CreateVolume,
    RunContainer,
    Observe,
    Start,
    Stop,
    Remove,
    TailLogs,
    Drain,
    Undrain,
    RunHook,
}

/// How a new container looks at one observation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Look {
    /// Running, with this health (`None`: no Healthcheck).
    Running(Option<ContainerHealth>),
    /// Exited on its own.
    Exited,
    /// Exited and restarted by Docker since the last look: running, one restart more.
    Restarted,
    /// Removed behind the Deploy's back.
    Gone,
}

/// How the new containers of one Service behave: the looks of successive observations, the last
/// one repeating, and the log lines they wrote.
#[derive(Debug, Clone)]
pub struct Behaviour {
    looks: Vec<Look>,
    logs: Vec<String>,
}

impl Behaviour {
    /// Successive looks; the last one repeats. An empty list is [`Behaviour::runs`].
    pub fn looks(looks: Vec<Look>) -> Behaviour {
        Behaviour {
            looks,
            logs: Vec::new(),
        }
    }

    /// Runs, without a Healthcheck verdict.
    pub fn runs() -> Behaviour {
        Behaviour::looks(vec![Look::Running(None)])
    }

    /// Starting for `observations` observations, then healthy.
    pub fn healthy_after(observations: usize) -> Behaviour {
        let mut looks = vec![Look::Running(Some(ContainerHealth::Starting)); observations];
        looks.push(Look::Running(Some(ContainerHealth::Healthy)));
        Behaviour::looks(looks)
    }

    /// Running for `observations` observations, then exited.
    pub fn exits_after(observations: usize) -> Behaviour {
        let mut looks = vec![Look::Running(None); observations];
        looks.push(Look::Exited);
        Behaviour::looks(looks)
    }

    /// The log lines its containers wrote.
    pub fn with_logs(mut self, lines: &[&str]) -> Behaviour {
        self.logs = lines.iter().map(|l| l.to_string()).collect();
        self
    }
}

/// How a Service's pre-deploy hook ends.
#[derive(Debug, Clone)]
pub struct HookEnd {
    /// `None`: it was stopped at its timeout.
    pub exit_code: Option<i64>,
    pub logs: Vec<String>,
}

struct Fault {
    step: Step,
    subject: Option<String>,
    reason: String,
}

struct FakeContainer {
    observation: ContainerRuntimeObservation,
    /// The looks still to come; the last one stays.
    script: VecDeque<Look>,
    logs: Vec<String>,
}

/// An in-memory set of Machines' containers, volumes and drain marks.
#[derive(Default)]
pub struct FakeTarget {
    machines: BTreeSet<MachineId>,
    containers: BTreeMap<ContainerId, FakeContainer>,
    volumes: BTreeSet<(MachineId, String)>,
    drains: BTreeSet<ContainerId>,
    behaviours: BTreeMap<String, Behaviour>,
    hooks: BTreeMap<String, HookEnd>,
    faults: Vec<Fault>,
    journal: Vec<String>,
    created: u32,
}

impl FakeTarget {
    /// A target with one Machine, and that Machine.
    pub fn with_machine() -> (FakeTarget, MachineId) {
        let mut target = FakeTarget::default();
        let machine = target.add_machine();
        (target, machine)
    }

    /// A Machine the target reaches.
    pub fn add_machine(&mut self) -> MachineId {
        let machine = MachineId::generate();
        self.machines.insert(machine.clone());
        machine
    }

    /// How the new containers of Service `service` behave (by default they run).
    pub fn behave(&mut self, service: &str, behaviour: Behaviour) {
        self.behaviours.insert(service.to_owned(), behaviour);
    }

    /// How the pre-deploy hook of Service `service` ends (by default with exit code 0).
    pub fn hook_ends(&mut self, service: &str, end: HookEnd) {
        self.hooks.insert(service.to_owned(), end);
    }

    /// Makes every call of `step` about `subject` fail with `reason`, changing nothing. The
    /// subject is a container's name or its Service's Name (for a run or a hook: the Service's
    /// Name; for a volume: its name); `None` is every call of that step.
    pub fn fail(&mut self, step: Step, subject: Option<&str>, reason: &str) {
        self.faults.push(Fault {
            step,
            subject: subject.map(str::to_owned),
            reason: reason.to_owned(),
        });
    }

    /// An existing Service Container of `spec` on `machine`, in `state`, as an earlier Deploy
    /// left it.
    pub fn add_container(
        &mut self,
        machine: &MachineId,
        service_id: &ServiceId,
        spec: &ServiceSpec,
        state: ContainerState,
    ) -> ContainerRef {
        let observation =
            self.new_observation(machine, service_id, spec, ContainerKind::Service, None);
        let reference = reference(&observation);
        let mut container = FakeContainer {
            observation,
            script: VecDeque::new(),
            logs: Vec::new(),
        };
        container.observation.state = state;
        self.containers.insert(reference.id.clone(), container);
        reference
    }

    /// A drain mark on `container`, as a drain whose stop never came left it.
    pub fn mark_draining(&mut self, container: &ContainerRef) {
        self.drains.insert(container.id.clone());
    }

    /// The calls that changed something, in order: `run web-0001`, `drain web-0001`, ...
    pub fn journal(&self) -> &[String] {
        &self.journal
    }

    /// The container named `name`, as it is now.
    pub fn container(&self, name: &str) -> Option<&ContainerRuntimeObservation> {
        self.containers
            .values()
            .map(|c| &c.observation)
            .find(|o| o.name == name)
    }

    /// The state of the container named `name`; `None` when there is none.
    pub fn state_of(&self, name: &str) -> Option<ContainerState> {
        self.container(name).map(|c| c.state)
    }

    /// Whether a drain mark stands on the container named `name`.
    pub fn is_draining(&self, name: &str) -> bool {
        self.container(name)
            .is_some_and(|c| self.drains.contains(&c.id))
    }

    /// The names of Service `service`'s containers (Hook Containers included), oldest first.
    pub fn names_of(&self, service: &str) -> Vec<String> {
        let mut of: Vec<&ContainerRuntimeObservation> = self
            .containers
            .values()
            .map(|c| &c.observation)
            .filter(|o| o.service_name.as_str() == service)
            .collect();
        of.sort_by_key(|o| o.created_at);
        of.into_iter().map(|o| o.name.clone()).collect()
    }

    /// Whether `machine` holds a volume named `name`.
    pub fn has_volume(&self, machine: &MachineId, name: &str) -> bool {
        self.volumes.contains(&(machine.clone(), name.to_owned()))
    }

    fn new_observation(
        &mut self,
        machine: &MachineId,
        service_id: &ServiceId,
        spec: &ServiceSpec,
        kind: ContainerKind,
        health: Option<ContainerHealth>,
    ) -> ContainerRuntimeObservation {
        self.created += 1;
        let n = self.created;
        let id: ContainerId = format!("{n:04x}{}", "0".repeat(60))
            .parse()
            .expect("lowercase hex is a Container ID");
        let name = match kind {
            ContainerKind::Service => format!("{}-{n:04x}", spec.name),
            ContainerKind::Hook => format!("{}-pre-deploy-{n:04x}", spec.name),
        };
        ContainerRuntimeObservation {
            id,
            name,
            machine_id: machine.clone(),
            service_id: service_id.clone(),
            service_name: spec.name.clone(),
            kind,
            state: ContainerState::Running,
            health,
            restart_count: 0,
            address: Some(std::net::Ipv4Addr::new(10, 210, 0, 2)),
            image: spec.container.image.clone(),
            created_at: i64::from(n),
            spec: Some(spec.clone()),
            plan_id: None,
            lease_token: None,
        }
    }

    fn check(&self, step: Step, subjects: &[&str]) -> Result<(), String> {
        match self
            .faults
            .iter()
            .find(|f| f.step == step && f.subject.as_deref().is_none_or(|s| subjects.contains(&s)))
        {
            Some(fault) => Err(fault.reason.clone()),
            None => Ok(()),
        }
    }

    fn reach(&self, machine: &MachineId) -> Result<(), String> {
        if self.machines.contains(machine) {
            Ok(())
        } else {
            Err(format!("Machine {machine} is not reachable"))
        }
    }

    /// The container `reference` names on `machine`, after the faults of `step` for it; `None`
    /// when it is gone or another Machine's.
    fn find(
        &mut self,
        step: Step,
        machine: &MachineId,
        reference: &ContainerRef,
    ) -> Result<Option<&mut FakeContainer>, String> {
        self.reach(machine)?;
        let service = self
            .containers
            .get(&reference.id)
            .map(|c| c.observation.service_name.to_string())
            .unwrap_or_default();
        self.check(step, &[&reference.name, &service])?;
        Ok(self
            .containers
            .get_mut(&reference.id)
            .filter(|c| &c.observation.machine_id == machine))
    }
}

fn no_such(reference: &ContainerRef) -> String {
    format!("no such container: {}", reference.name)
}

fn reference(c: &ContainerRuntimeObservation) -> ContainerRef {
    ContainerRef {
        id: c.id.clone(),
        name: c.name.clone(),
    }
}

impl DeployTarget for FakeTarget {
    async fn create_volume(
        &mut self,
        machine: &MachineId,
        volume: &VolumeSpec,
    ) -> Result<(), String> {
        self.reach(machine)?;
        self.check(Step::CreateVolume, &[&volume.name])?;
        self.volumes.insert((machine.clone(), volume.name.clone()));
        self.journal.push(format!("create volume {}", volume.name));
        Ok(())
    }

    async fn run_container(
        &mut self,
        machine: &MachineId,
        service_id: &ServiceId,
        spec: &ServiceSpec,
    ) -> Result<ContainerRuntimeObservation, String> {
        self.reach(machine)?;
        self.check(Step::RunContainer, &[spec.name.as_str()])?;
        let health = match spec.container.healthcheck {
            Some(Healthcheck::Configured(_)) => Some(ContainerHealth::Starting),
            _ => None,
        };
        let observation =
            self.new_observation(machine, service_id, spec, ContainerKind::Service, health);
        let behaviour = self
            .behaviours
            .get(spec.name.as_str())
            .cloned()
            .unwrap_or_else(Behaviour::runs);
        let mut script: VecDeque<Look> = behaviour.looks.into();
        if script.is_empty() {
            script.push_back(Look::Running(None));
        }
        self.journal.push(format!("run {}", observation.name));
        self.containers.insert(
            observation.id.clone(),
            FakeContainer {
                observation: observation.clone(),
                script,
                logs: behaviour.logs,
            },
        );
        Ok(observation)
    }

    async fn observe_container(
        &mut self,
        machine: &MachineId,
        container: &ContainerRef,
    ) -> Result<Option<ContainerRuntimeObservation>, String> {
        let Some(c) = self.find(Step::Observe, machine, container)? else {
            return Ok(None);
        };
        let look = if c.script.len() > 1 {
            c.script.pop_front()
        } else {
            c.script.front().copied()
        };
        let o = &mut c.observation;
        match look {
            None => {}
            Some(Look::Running(health)) => {
                o.state = ContainerState::Running;
                o.health = health;
            }
            Some(Look::Exited) => {
                o.state = ContainerState::Exited;
                o.health = None;
            }
            Some(Look::Restarted) => {
                o.state = ContainerState::Running;
                o.restart_count += 1;
            }
            Some(Look::Gone) => {
                self.containers.remove(&container.id);
                return Ok(None);
            }
        }
        Ok(Some(c.observation.clone()))
    }

    async fn start_container(
        &mut self,
        machine: &MachineId,
        container: &ContainerRef,
    ) -> Result<(), String> {
        let c = self
            .find(Step::Start, machine, container)?
            .ok_or_else(|| no_such(container))?;
        c.script.clear();
        c.observation.state = ContainerState::Running;
        self.drains.remove(&container.id);
        self.journal.push(format!("start {}", container.name));
        Ok(())
    }

    async fn stop_container(
        &mut self,
        machine: &MachineId,
        container: &ContainerRef,
    ) -> Result<(), String> {
        let c = self
            .find(Step::Stop, machine, container)?
            .ok_or_else(|| no_such(container))?;
        c.script.clear();
        c.observation.state = ContainerState::Exited;
        c.observation.health = None;
        self.journal.push(format!("stop {}", container.name));
        Ok(())
    }

    async fn remove_container(
        &mut self,
        machine: &MachineId,
        container: &ContainerRef,
    ) -> Result<(), String> {
        let found = self.find(Step::Remove, machine, container)?.is_some();
        if found {
            self.containers.remove(&container.id);
            self.drains.remove(&container.id);
        } else if self.containers.contains_key(&container.id) {
            // Another Machine's container; a gone one is fine, it is not there either way.
            return Err(no_such(container));
        }
        self.journal.push(format!("remove {}", container.name));
        Ok(())
    }

    async fn tail_logs(
        &mut self,
        machine: &MachineId,
        container: &ContainerRef,
        lines: usize,
    ) -> Result<Vec<String>, String> {
        let c = self
            .find(Step::TailLogs, machine, container)?
            .ok_or_else(|| no_such(container))?;
        let skip = c.logs.len().saturating_sub(lines);
        Ok(c.logs[skip..].to_vec())
    }

    async fn drain_container(
        &mut self,
        machine: &MachineId,
        container: &ContainerRef,
    ) -> Result<(), String> {
        self.find(Step::Drain, machine, container)?
            .ok_or_else(|| no_such(container))?;
        self.drains.insert(container.id.clone());
        self.journal.push(format!("drain {}", container.name));
        Ok(())
    }

    async fn undrain_container(
        &mut self,
        machine: &MachineId,
        container: &ContainerRef,
    ) -> Result<(), String> {
        self.reach(machine)?;
        let service = self
            .containers
            .get(&container.id)
            .map(|c| c.observation.service_name.to_string())
            .unwrap_or_default();
        self.check(Step::Undrain, &[&container.name, &service])?;
        self.drains.remove(&container.id);
        self.journal.push(format!("undrain {}", container.name));
        Ok(())
    }

    async fn run_hook(
        &mut self,
        machine: &MachineId,
        service_id: &ServiceId,
        spec: &ServiceSpec,
        _hook: &PreDeployHook,
    ) -> Result<HookResult, String> {
        self.reach(machine)?;
        self.check(Step::RunHook, &[spec.name.as_str()])?;
        self.containers.retain(|_, c| {
            !(c.observation.kind == ContainerKind::Hook
                && &c.observation.service_id == service_id
                && &c.observation.machine_id == machine)
        });
        let end = self
            .hooks
            .get(spec.name.as_str())
            .cloned()
            .unwrap_or(HookEnd {
                exit_code: Some(0),
                logs: Vec::new(),
            });
        let mut observation =
            self.new_observation(machine, service_id, spec, ContainerKind::Hook, None);
        observation.state = ContainerState::Exited;
        observation.address = None;
        let container = reference(&observation);
        self.journal.push(format!("hook {}", container.name));
        self.containers.insert(
            container.id.clone(),
            FakeContainer {
                observation,
                script: VecDeque::new(),
                logs: end.logs.clone(),
            },
        );
        Ok(HookResult {
            container,
            exit_code: end.exit_code,
            logs: end.logs,
        })
    }
}
