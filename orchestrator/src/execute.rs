//! Executing a Deploy Plan: operations one at a time, health-gated, ending in a Deploy Outcome.
//!
//! The executor does not talk to Docker itself: it drives a [`DeployTarget`] (the CLI's is the
//! management API of the Machines), so the sequencing, monitoring and compensation rules live in
//! one place.
//!
//! Per operation:
//! - run: create and start, then monitor;
//! - start-first replace: run the new container and monitor it; on success drain, stop and
//!   remove the old one; on failure stop the new one (kept for inspection) and leave the old one
//!   running;
//! - stop-first replace: drain and stop the old container, run and monitor the new one; on
//!   success remove the old one; on failure stop the new one and restart (and undrain) the old
//!   one (the compensation);
//! - stop and remove drain a running container first, so no edge sends it new requests and the
//!   ones in flight finish;
//! - a drain mark never outlives the operation that set it on purpose: a failed drain, or a
//!   drained container that cannot be stopped, gets its mark lifted again (and the daemon lifts
//!   whatever a Deploy that died left behind);
//! - hook: run the Hook Container to its end; a non-zero exit or a timeout fails the Deploy;
//! - the first failure stops the Deploy: the Outcome lists the completed prefix, the failed
//!   operation with the failed container's last log lines, and the unexecuted suffix;
//! - a failed container is stopped and kept for inspection; a stop that fails while it may still
//!   run is in the Outcome too (`FailedOperation::stop_error`), never dropped.
//!
//! `orchestrator/tests/execute.rs` tests these rules against `FakeTarget`, an in-memory target
//! that keeps containers, their states and drain marks as a Machine's daemon does.

use std::time::Duration;

use ployz_core::api::HookResult;
use ployz_core::{
    Compensation, CompletedOperation, ContainerHealth, ContainerRef, ContainerRuntimeObservation,
    ContainerState, DeployOutcome, DeployPlan, FailedOperation, Healthcheck, MachineId, Operation,
    PreDeployHook, ServiceId, ServiceSpec, UpdateOrder, VolumeSpec,
};

/// Where the operations of a Deploy are carried out. Errors are sentences for the Outcome.
#[allow(async_fn_in_trait)]
pub trait DeployTarget {
    async fn create_volume(
        &mut self,
        machine: &MachineId,
        volume: &VolumeSpec,
    ) -> Result<(), String>;
    async fn run_container(
        &mut self,
        machine: &MachineId,
        service_id: &ServiceId,
        spec: &ServiceSpec,
    ) -> Result<ContainerRuntimeObservation, String>;
    async fn observe_container(
        &mut self,
        machine: &MachineId,
        container: &ContainerRef,
    ) -> Result<Option<ContainerRuntimeObservation>, String>;
    async fn start_container(
        &mut self,
        machine: &MachineId,
        container: &ContainerRef,
    ) -> Result<(), String>;
    async fn stop_container(
        &mut self,
        machine: &MachineId,
        container: &ContainerRef,
    ) -> Result<(), String>;
    async fn remove_container(
        &mut self,
        machine: &MachineId,
        container: &ContainerRef,
    ) -> Result<(), String>;
    async fn tail_logs(
        &mut self,
        machine: &MachineId,
        container: &ContainerRef,
        lines: usize,
    ) -> Result<Vec<String>, String>;
    /// Marks a container draining and waits until the edges stop routing to it and its
    /// in-flight requests finished (bounded).
    async fn drain_container(
        &mut self,
        machine: &MachineId,
        container: &ContainerRef,
    ) -> Result<(), String>;
    /// Lifts a drain mark (a compensation restarted the container).
    async fn undrain_container(
        &mut self,
        machine: &MachineId,
        container: &ContainerRef,
    ) -> Result<(), String>;
    async fn run_hook(
        &mut self,
        machine: &MachineId,
        service_id: &ServiceId,
        spec: &ServiceSpec,
        hook: &PreDeployHook,
    ) -> Result<HookResult, String>;
}

/// How the executor watches new containers.
#[derive(Debug, Clone)]
pub struct ExecuteOptions {
    /// Skip health monitoring entirely (`--skip-health`).
    pub skip_health: bool,
    /// The monitor window when a Service sets none (`update_config.monitor`).
    pub default_monitor: Duration,
    /// How often a container is looked at while monitored.
    pub poll: Duration,
    /// How many log lines of a failed container the Outcome carries.
    pub log_tail: usize,
}

impl Default for ExecuteOptions {
    fn default() -> Self {
        ExecuteOptions {
            skip_health: false,
            default_monitor: Duration::from_secs(5),
            poll: Duration::from_millis(500),
            log_tail: 10,
        }
    }
}

/// What the executor reports while it works.
#[derive(Debug)]
pub enum Progress<'a> {
    Started(&'a Operation),
    Finished(&'a Operation, Option<&'a ContainerRef>),
    Failed(&'a Operation, &'a str),
}

struct Failure {
    reason: String,
    container: Option<ContainerRef>,
    /// Why the failed `container` could not be stopped, while it may still run.
    stop_error: Option<String>,
    compensation: Option<Compensation>,
}

impl Failure {
    fn because(reason: impl Into<String>) -> Failure {
        Failure {
            reason: reason.into(),
            container: None,
            stop_error: None,
            compensation: None,
        }
    }

    /// The failure of `container`, created by the operation and kept for inspection.
    fn of_container(reason: impl Into<String>, container: ContainerRef) -> Failure {
        Failure {
            container: Some(container),
            ..Failure::because(reason)
        }
    }
}

fn container_ref(c: &ContainerRuntimeObservation) -> ContainerRef {
    ContainerRef {
        id: c.id.clone(),
        name: c.name.clone(),
    }
}

/// Executes every operation of `plan` in order and returns the evidence.
pub async fn execute<T: DeployTarget>(
    plan: &DeployPlan,
    target: &mut T,
    opts: &ExecuteOptions,
    mut progress: impl FnMut(Progress<'_>),
) -> DeployOutcome {
    let ops: Vec<&Operation> = plan.operations().collect();
    let mut outcome = DeployOutcome {
        images: Vec::new(),
        completed: Vec::new(),
        failed: None,
        unexecuted: Vec::new(),
        compensation: None,
    };
    for (i, op) in ops.iter().enumerate() {
        progress(Progress::Started(op));
        match run_operation(op, target, opts).await {
            Ok(container) => {
                progress(Progress::Finished(op, container.as_ref()));
                outcome.completed.push(CompletedOperation {
                    operation: (*op).clone(),
                    container,
                });
            }
            Err(failure) => {
                progress(Progress::Failed(op, &failure.reason));
                let logs = match &failure.container {
                    Some(c) => target
                        .tail_logs(op.machine_id(), c, opts.log_tail)
                        .await
                        .unwrap_or_default(),
                    None => Vec::new(),
                };
                outcome.failed = Some(FailedOperation {
                    operation: (*op).clone(),
                    reason: failure.reason,
                    container: failure.container,
                    logs,
                    stop_error: failure.stop_error,
                });
                outcome.compensation = failure.compensation;
                outcome.unexecuted = ops[i + 1..].iter().map(|o| (*o).clone()).collect();
                break;
            }
        }
    }
    outcome
}

async fn run_operation<T: DeployTarget>(
    op: &Operation,
    target: &mut T,
    opts: &ExecuteOptions,
) -> Result<Option<ContainerRef>, Failure> {
    match op {
        Operation::CreateVolume { machine_id, volume } => {
            target
                .create_volume(machine_id, volume)
                .await
                .map_err(Failure::because)?;
            Ok(None)
        }
        Operation::RunHook {
            machine_id,
            service_id,
            spec,
            hook,
        } => {
            let result = target
                .run_hook(machine_id, service_id, spec, hook)
                .await
                .map_err(Failure::because)?;
            match result.exit_code {
                Some(0) => Ok(Some(result.container)),
                Some(code) => Err(Failure::of_container(
                    format!("pre-deploy hook exited with code {code}"),
                    result.container,
                )),
                None => Err(Failure::of_container(
                    format!(
                        "pre-deploy hook did not finish within its timeout ({} s)",
                        hook.timeout_ms / 1000
                    ),
                    result.container,
                )),
            }
        }
        Operation::RunContainer {
            machine_id,
            service_id,
            spec,
        } => run_and_monitor(target, machine_id, service_id, spec, opts)
            .await
            .map(Some),
        Operation::ReplaceContainer {
            machine_id,
            service_id,
            old,
            spec,
            order,
        } => match order {
            UpdateOrder::StartFirst => {
                let new = run_and_monitor(target, machine_id, service_id, spec, opts).await?;
                drain(target, machine_id, old).await?;
                stop_drained(target, machine_id, old).await?;
                target
                    .remove_container(machine_id, old)
                    .await
                    .map_err(Failure::because)?;
                Ok(Some(new))
            }
            UpdateOrder::StopFirst => {
                let was_running = matches!(
                    target.observe_container(machine_id, old).await,
                    Ok(Some(c)) if c.is_running()
                );
                if was_running {
                    drain(target, machine_id, old).await?;
                }
                stop_drained(target, machine_id, old).await?;
                match run_and_monitor(target, machine_id, service_id, spec, opts).await {
                    Ok(new) => {
                        target
                            .remove_container(machine_id, old)
                            .await
                            .map_err(Failure::because)?;
                        Ok(Some(new))
                    }
                    Err(mut failure) => {
                        if was_running {
                            let mut error = target.start_container(machine_id, old).await.err();
                            if error.is_none() {
                                error = target.undrain_container(machine_id, old).await.err();
                            }
                            failure.compensation = Some(Compensation {
                                action: format!("restarted {} (stop-first replacement)", old.name),
                                error,
                            });
                        }
                        Err(failure)
                    }
                }
            }
        },
        Operation::StopContainer {
            machine_id,
            container,
        } => {
            drain_if_running(target, machine_id, container).await?;
            target
                .stop_container(machine_id, container)
                .await
                .map_err(Failure::because)?;
            Ok(None)
        }
        Operation::RemoveContainer {
            machine_id,
            container,
        } => {
            drain_if_running(target, machine_id, container).await?;
            target
                .remove_container(machine_id, container)
                .await
                .map_err(Failure::because)?;
            Ok(None)
        }
    }
}

/// Drains a container; if the drain fails, lifts whatever mark it may have left so the container
/// keeps serving.
async fn drain<T: DeployTarget>(
    target: &mut T,
    machine: &MachineId,
    container: &ContainerRef,
) -> Result<(), Failure> {
    match target.drain_container(machine, container).await {
        Ok(()) => Ok(()),
        Err(reason) => {
            Err(undrain_after(target, machine, container, reason, "its drain failed").await)
        }
    }
}

/// The failure `reason` of an operation on a drained `container`, after lifting its drain mark
/// so that it keeps serving.
async fn undrain_after<T: DeployTarget>(
    target: &mut T,
    machine: &MachineId,
    container: &ContainerRef,
    reason: String,
    why: &str,
) -> Failure {
    let error = target.undrain_container(machine, container).await.err();
    Failure {
        compensation: Some(Compensation {
            action: format!("lifted the drain mark of {} ({why})", container.name),
            error,
        }),
        ..Failure::because(reason)
    }
}

/// Stops a drained container; if that fails, lifts the drain mark so it serves again.
async fn stop_drained<T: DeployTarget>(
    target: &mut T,
    machine: &MachineId,
    container: &ContainerRef,
) -> Result<(), Failure> {
    match target.stop_container(machine, container).await {
        Ok(()) => Ok(()),
        Err(reason) => Err(undrain_after(
            target,
            machine,
            container,
            reason,
            "it could not be stopped",
        )
        .await),
    }
}

async fn drain_if_running<T: DeployTarget>(
    target: &mut T,
    machine: &MachineId,
    container: &ContainerRef,
) -> Result<(), Failure> {
    if let Ok(Some(c)) = target.observe_container(machine, container).await {
        if c.is_running() {
            drain(target, machine, container).await?;
        }
    }
    Ok(())
}

/// Runs a new container and watches it; a failed one is stopped and kept for inspection (a stop
/// that fails while it may still run is part of the failure).
async fn run_and_monitor<T: DeployTarget>(
    target: &mut T,
    machine: &MachineId,
    service_id: &ServiceId,
    spec: &ServiceSpec,
    opts: &ExecuteOptions,
) -> Result<ContainerRef, Failure> {
    let created = target
        .run_container(machine, service_id, spec)
        .await
        .map_err(Failure::because)?;
    let new = container_ref(&created);
    if let Err(reason) = monitor(target, machine, &created, spec, opts).await {
        let stop_error = stop_failed(target, machine, &new).await;
        return Err(Failure {
            stop_error,
            ..Failure::of_container(reason, new)
        });
    }
    Ok(new)
}

/// Stops a container that failed its monitoring. Answers why it could not be stopped when it may
/// still run: a container that is gone, exited or dead needs no stop, so a stop refused for it
/// is no news.
async fn stop_failed<T: DeployTarget>(
    target: &mut T,
    machine: &MachineId,
    container: &ContainerRef,
) -> Option<String> {
    let reason = target.stop_container(machine, container).await.err()?;
    match target.observe_container(machine, container).await {
        Ok(None) => None,
        Ok(Some(c)) if matches!(c.state, ContainerState::Exited | ContainerState::Dead) => None,
        _ => Some(reason),
    }
}

/// Watches a new container for the monitor window. With a Healthcheck, healthy ends the wait
/// early and unhealthy after the window fails; without one, it must still run (and not have
/// restarted) when the window ends. Exiting fails at once.
async fn monitor<T: DeployTarget>(
    target: &mut T,
    machine: &MachineId,
    created: &ContainerRuntimeObservation,
    spec: &ServiceSpec,
    opts: &ExecuteOptions,
) -> Result<(), String> {
    let window = spec
        .update
        .monitor_ms
        .map(Duration::from_millis)
        .unwrap_or(opts.default_monitor);
    if opts.skip_health || window.is_zero() {
        return Ok(());
    }
    // With a Healthcheck that is still starting, wait past the window up to what its own
    // settings allow before calling it failed.
    let cap = match &spec.container.healthcheck {
        Some(Healthcheck::Configured(hc)) => {
            let interval = hc.interval_ms.unwrap_or(30_000);
            let timeout = hc.timeout_ms.unwrap_or(30_000);
            let retries = u64::from(hc.retries.unwrap_or(3));
            let start = hc.start_period_ms.unwrap_or(0);
            window.max(Duration::from_millis(
                start.saturating_add(
                    interval
                        .saturating_add(timeout)
                        .saturating_mul(retries.saturating_add(1)),
                ),
            ))
        }
        Some(Healthcheck::Disabled) => window,
        // The image's own probe, with Docker's defaults: 30 s interval and timeout, 3 retries.
        None => window.max(Duration::from_secs(240)),
    };
    let reference = container_ref(created);
    let restarts_at_start = created.restart_count;
    let started = tokio::time::Instant::now();
    loop {
        let elapsed = started.elapsed();
        let Some(c) = target.observe_container(machine, &reference).await? else {
            return Err(format!("container {} disappeared", reference.name));
        };
        if c.restart_count > restarts_at_start || c.state == ContainerState::Restarting {
            return Err(format!(
                "container {} exited and was restarted by Docker (crash loop)",
                reference.name
            ));
        }
        if matches!(c.state, ContainerState::Exited | ContainerState::Dead) {
            return Err(format!("container {} exited", reference.name));
        }
        match c.health {
            Some(ContainerHealth::Healthy) => return Ok(()),
            Some(ContainerHealth::Unhealthy) if elapsed >= window => {
                return Err(format!(
                    "container {} is unhealthy after the {} s monitor window",
                    reference.name,
                    window.as_secs_f32()
                ))
            }
            Some(ContainerHealth::Starting) if elapsed >= cap => {
                return Err(format!(
                    "container {} did not turn healthy within {} s",
                    reference.name,
                    cap.as_secs()
                ))
            }
            None if elapsed >= window => {
                return if c.is_running() {
                    Ok(())
                } else {
                    Err(format!(
                        "container {} is {} after the monitor window",
                        reference.name,
                        c.state.as_str()
                    ))
                };
            }
            _ => {}
        }
        tokio::time::sleep(opts.poll).await;
    }
}
