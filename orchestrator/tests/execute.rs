//! The executor against an in-memory target: the Deploy Outcome (completed prefix, failed
//! operation, unexecuted suffix), start-first and stop-first replacements with their
//! compensation, health monitoring, hooks, and what happens to a failed container.

mod fake_target;

use std::time::Duration;

use fake_target::{Behaviour, FakeTarget, HookEnd, Look, Step};
use ployz_core::{
    ConfiguredHealthcheck, ContainerHealth, ContainerRef, ContainerSpec, ContainerState,
    DeployOutcome, DeployPlan, Healthcheck, MachineId, Operation, PreDeployHook, ServiceId,
    ServiceMode, ServicePlan, ServiceSpec, UpdateConfig, UpdateOrder, VolumeSpec,
};
use ployz_orchestrator::execute::{execute, ExecuteOptions, Progress};

fn spec(name: &str) -> ServiceSpec {
    ServiceSpec {
        name: name.parse().unwrap(),
        mode: ServiceMode::Replicated,
        replicas: 1,
        container: ContainerSpec {
            image: "app:1".into(),
            ..Default::default()
        },
        ports: vec![],
        machines: vec![],
        update: UpdateConfig::default(),
        pre_deploy: None,
        depends_on: vec![],
        revisions: None,
        routes: vec![],
    }
}

/// `spec(name)` with a Healthcheck whose own settings allow no wait past the monitor window.
fn checked_spec(name: &str) -> ServiceSpec {
    let mut hc = ConfiguredHealthcheck::new(vec!["CMD".into(), "true".into()]).unwrap();
    hc.interval_ms = Some(1);
    hc.timeout_ms = Some(1);
    hc.retries = Some(0);
    hc.start_period_ms = Some(0);
    let mut s = spec(name);
    s.container.healthcheck = Some(Healthcheck::Configured(hc));
    s
}

/// A short monitor window, looked at often. A container whose fate shows only after a few looks
/// needs a long window of its own (`LONG_WINDOW_MS`), or a slow machine would end the window
/// first and count it.
fn opts() -> ExecuteOptions {
    ExecuteOptions {
        skip_health: false,
        default_monitor: Duration::from_millis(20),
        poll: Duration::from_millis(1),
        log_tail: 2,
    }
}

/// A monitor window no case waits out: its container's looks decide first.
const LONG_WINDOW_MS: u64 = 600_000;

fn volume(machine: &MachineId, name: &str) -> Operation {
    Operation::CreateVolume {
        machine_id: machine.clone(),
        volume: VolumeSpec {
            name: name.into(),
            driver: None,
            driver_opts: Default::default(),
            labels: Default::default(),
            external: false,
        },
    }
}

fn run(machine: &MachineId, spec: &ServiceSpec) -> Operation {
    Operation::RunContainer {
        machine_id: machine.clone(),
        service_id: ServiceId::generate(),
        spec: spec.clone(),
    }
}

fn replace(
    machine: &MachineId,
    service_id: &ServiceId,
    old: &ContainerRef,
    spec: &ServiceSpec,
    order: UpdateOrder,
) -> Operation {
    Operation::ReplaceContainer {
        machine_id: machine.clone(),
        service_id: service_id.clone(),
        old: old.clone(),
        spec: spec.clone(),
        order,
    }
}

fn remove(machine: &MachineId, container: &ContainerRef) -> Operation {
    Operation::RemoveContainer {
        machine_id: machine.clone(),
        container: container.clone(),
    }
}

fn stop(machine: &MachineId, container: &ContainerRef) -> Operation {
    Operation::StopContainer {
        machine_id: machine.clone(),
        container: container.clone(),
    }
}

fn hook(machine: &MachineId, spec: &ServiceSpec) -> Operation {
    Operation::RunHook {
        machine_id: machine.clone(),
        service_id: ServiceId::generate(),
        spec: spec.clone(),
        hook: PreDeployHook {
            command: vec!["migrate".into()],
            env: Default::default(),
            privileged: false,
            user: None,
            timeout_ms: 60_000,
        },
    }
}

/// A plan running `operations` in order: the volume creations first, as the planner puts them.
fn plan_of(operations: Vec<Operation>) -> DeployPlan {
    let (volume_operations, operations): (Vec<_>, Vec<_>) = operations
        .into_iter()
        .partition(|op| matches!(op, Operation::CreateVolume { .. }));
    DeployPlan {
        volume_operations,
        services: vec![ServicePlan {
            service_id: ServiceId::generate(),
            name: "web".parse().unwrap(),
            mode: ServiceMode::Replicated,
            is_new: false,
            replicas: 1,
            previous_image: None,
            image: "app:1".into(),
            operations,
        }],
        transfers: Vec::new(),
        left_unverified: Vec::new(),
    }
}

/// Executes `plan`, and the progress it reported: `started`, `finished`, `failed` per operation.
async fn execute_with(
    plan: &DeployPlan,
    target: &mut FakeTarget,
    opts: &ExecuteOptions,
) -> (DeployOutcome, Vec<&'static str>) {
    let mut progress = Vec::new();
    let outcome = execute(plan, target, opts, |p| {
        progress.push(match p {
            Progress::Started(_) => "started",
            Progress::Finished(..) => "finished",
            Progress::Failed(..) => "failed",
        })
    })
    .await;
    (outcome, progress)
}

fn service_of(op: &Operation) -> Option<&str> {
    match op {
        Operation::RunContainer { spec, .. } => Some(spec.name.as_str()),
        _ => None,
    }
}

#[tokio::test]
async fn the_outcome_is_the_completed_prefix_the_failed_operation_and_the_unexecuted_suffix() {
    type Setup = fn(&mut FakeTarget);
    // (case, setup, index of the failed operation, a part of its reason)
    let cases: [(&str, Setup, Option<usize>, &str); 7] = [
        ("nothing fails", |_| {}, None, ""),
        (
            "the volume is refused",
            |t| t.fail(Step::CreateVolume, Some("data"), "no space left on device"),
            Some(0),
            "no space left on device",
        ),
        (
            "Docker refuses the run",
            |t| t.fail(Step::RunContainer, Some("api"), "image app:1 not found"),
            Some(2),
            "image app:1 not found",
        ),
        (
            "the new container exits",
            |t| t.behave("api", Behaviour::exits_after(0)),
            Some(2),
            "exited",
        ),
        (
            "the removal's drain fails",
            |t| t.fail(Step::Drain, Some("legacy"), "the daemon did not answer"),
            Some(3),
            "the daemon did not answer",
        ),
        (
            "the removal is refused",
            |t| t.fail(Step::Remove, Some("legacy"), "Docker did not answer"),
            Some(3),
            "Docker did not answer",
        ),
        (
            "the last run is refused",
            |t| t.fail(Step::RunContainer, Some("worker"), "image app:1 not found"),
            Some(4),
            "image app:1 not found",
        ),
    ];
    for (case, setup, failed_at, reason) in cases {
        let (mut target, m) = FakeTarget::with_machine();
        let legacy = target.add_container(
            &m,
            &ServiceId::generate(),
            &spec("legacy"),
            ContainerState::Running,
        );
        setup(&mut target);
        let ops = vec![
            volume(&m, "data"),
            run(&m, &spec("web")),
            run(&m, &spec("api")),
            remove(&m, &legacy),
            run(&m, &spec("worker")),
        ];
        let (outcome, progress) = execute_with(&plan_of(ops.clone()), &mut target, &opts()).await;

        let k = failed_at.unwrap_or(ops.len());
        let completed: Vec<&Operation> = outcome.completed.iter().map(|c| &c.operation).collect();
        assert_eq!(completed, ops[..k].iter().collect::<Vec<_>>(), "{case}");
        assert_eq!(
            outcome.failed.as_ref().map(|f| &f.operation),
            ops.get(k),
            "{case}"
        );
        let suffix = if k < ops.len() { &ops[k + 1..] } else { &[] };
        assert_eq!(outcome.unexecuted, suffix, "{case}");
        assert_eq!(outcome.succeeded(), failed_at.is_none(), "{case}");
        if let Some(f) = &outcome.failed {
            assert!(f.reason.contains(reason), "{case}: {}", f.reason);
        }
        let expected_progress: Vec<&str> = (0..k)
            .flat_map(|_| ["started", "finished"])
            .chain(
                failed_at
                    .map(|_| ["started", "failed"])
                    .into_iter()
                    .flatten(),
            )
            .collect();
        assert_eq!(progress, expected_progress, "{case}");

        // The target shows the same: what completed happened, what was not run did not.
        for done in &outcome.completed {
            match &done.operation {
                Operation::CreateVolume { .. } => assert!(target.has_volume(&m, "data"), "{case}"),
                Operation::RunContainer { .. } => {
                    let c = done.container.as_ref().expect("a run names its container");
                    assert_eq!(
                        target.state_of(&c.name),
                        Some(ContainerState::Running),
                        "{case}"
                    );
                }
                Operation::RemoveContainer { .. } => {
                    assert_eq!(target.state_of(&legacy.name), None, "{case}")
                }
                other => panic!("{case}: unexpected {other:?}"),
            }
        }
        for op in &outcome.unexecuted {
            if let Some(service) = service_of(op) {
                assert!(target.names_of(service).is_empty(), "{case}");
            }
            if matches!(op, Operation::RemoveContainer { .. }) {
                assert_eq!(
                    target.state_of(&legacy.name),
                    Some(ContainerState::Running),
                    "{case}"
                );
            }
        }
    }
}

#[tokio::test]
async fn a_failed_container_is_stopped_and_kept_with_its_last_log_lines() {
    let (mut target, m) = FakeTarget::with_machine();
    target.behave(
        "web",
        Behaviour::exits_after(0).with_logs(&["starting", "listening", "panic: no database"]),
    );
    let (outcome, _) =
        execute_with(&plan_of(vec![run(&m, &spec("web"))]), &mut target, &opts()).await;
    let failed = outcome.failed.expect("the run failed");
    assert_eq!(failed.reason, "container web-0001 exited");
    let kept = failed.container.expect("the failed container is named");
    assert_eq!(kept.name, "web-0001");
    assert_eq!(target.state_of("web-0001"), Some(ContainerState::Exited));
    assert_eq!(failed.logs, ["listening", "panic: no database"]);
    assert_eq!(failed.stop_error, None);
    assert_eq!(target.journal(), ["run web-0001", "stop web-0001"]);
}

/// What a replacement ends with: success or not, the calls made, the compensation (action and
/// error), and the old container's state and drain mark.
struct Replaced {
    succeeded: bool,
    journal: &'static [&'static str],
    compensation: Option<(&'static str, Option<&'static str>)>,
    old_state: Option<ContainerState>,
    old_draining: bool,
}

async fn check_replacement(
    case: &str,
    order: UpdateOrder,
    old_state: ContainerState,
    setup: fn(&mut FakeTarget),
    expected: Replaced,
) {
    let (mut target, m) = FakeTarget::with_machine();
    let service_id = ServiceId::generate();
    let old = target.add_container(&m, &service_id, &spec("web"), old_state);
    assert_eq!(old.name, "web-0001");
    setup(&mut target);
    let mut new_spec = spec("web");
    new_spec.container.image = "app:2".into();
    let ops = vec![
        replace(&m, &service_id, &old, &new_spec, order),
        run(&m, &spec("worker")),
    ];
    let (outcome, _) = execute_with(&plan_of(ops.clone()), &mut target, &opts()).await;

    assert_eq!(
        outcome.succeeded(),
        expected.succeeded,
        "{case}: {outcome:?}"
    );
    if !expected.succeeded {
        assert_eq!(outcome.unexecuted, ops[1..], "{case}");
    }
    assert_eq!(target.journal(), expected.journal, "{case}");
    let compensation = outcome
        .compensation
        .as_ref()
        .map(|c| (c.action.as_str(), c.error.as_deref()));
    assert_eq!(compensation, expected.compensation, "{case}");
    assert_eq!(target.state_of("web-0001"), expected.old_state, "{case}");
    assert_eq!(
        target.is_draining("web-0001"),
        expected.old_draining,
        "{case}"
    );
}

#[tokio::test]
async fn a_stop_first_replacement_whose_new_container_fails_starts_the_old_one_again() {
    type Setup = fn(&mut FakeTarget);
    let cases: [(&str, ContainerState, Setup, Replaced); 6] = [
        (
            "the new one runs",
            ContainerState::Running,
            |_| {},
            Replaced {
                succeeded: true,
                journal: &[
                    "drain web-0001",
                    "stop web-0001",
                    "run web-0002",
                    "remove web-0001",
                    "run worker-0003",
                ],
                compensation: None,
                old_state: None,
                old_draining: false,
            },
        ),
        (
            "the new one exits",
            ContainerState::Running,
            |t| t.behave("web", Behaviour::exits_after(0)),
            Replaced {
                succeeded: false,
                journal: &[
                    "drain web-0001",
                    "stop web-0001",
                    "run web-0002",
                    "stop web-0002",
                    "start web-0001",
                    "undrain web-0001",
                ],
                compensation: Some(("restarted web-0001 (stop-first replacement)", None)),
                old_state: Some(ContainerState::Running),
                old_draining: false,
            },
        ),
        (
            "Docker refuses the new one",
            ContainerState::Running,
            |t| t.fail(Step::RunContainer, Some("web"), "image app:2 not found"),
            Replaced {
                succeeded: false,
                journal: &[
                    "drain web-0001",
                    "stop web-0001",
                    "start web-0001",
                    "undrain web-0001",
                ],
                compensation: Some(("restarted web-0001 (stop-first replacement)", None)),
                old_state: Some(ContainerState::Running),
                old_draining: false,
            },
        ),
        (
            "the old one cannot be started again",
            ContainerState::Running,
            |t| {
                t.behave("web", Behaviour::exits_after(0));
                t.fail(Step::Start, Some("web-0001"), "port 8080 is taken");
            },
            Replaced {
                succeeded: false,
                journal: &[
                    "drain web-0001",
                    "stop web-0001",
                    "run web-0002",
                    "stop web-0002",
                ],
                compensation: Some((
                    "restarted web-0001 (stop-first replacement)",
                    Some("port 8080 is taken"),
                )),
                old_state: Some(ContainerState::Exited),
                old_draining: true,
            },
        ),
        (
            "the old one cannot be stopped",
            ContainerState::Running,
            |t| t.fail(Step::Stop, Some("web-0001"), "Docker did not answer"),
            Replaced {
                succeeded: false,
                journal: &["drain web-0001", "undrain web-0001"],
                compensation: Some((
                    "lifted the drain mark of web-0001 (it could not be stopped)",
                    None,
                )),
                old_state: Some(ContainerState::Running),
                old_draining: false,
            },
        ),
        (
            "the old one was not running",
            ContainerState::Exited,
            |t| t.behave("web", Behaviour::exits_after(0)),
            Replaced {
                succeeded: false,
                journal: &["stop web-0001", "run web-0002", "stop web-0002"],
                compensation: None,
                old_state: Some(ContainerState::Exited),
                old_draining: false,
            },
        ),
    ];
    for (case, old_state, setup, expected) in cases {
        check_replacement(case, UpdateOrder::StopFirst, old_state, setup, expected).await;
    }
}

#[tokio::test]
async fn a_start_first_replacement_leaves_the_old_one_serving_until_the_new_one_proved_itself() {
    type Setup = fn(&mut FakeTarget);
    let cases: [(&str, Setup, Replaced); 3] = [
        (
            "the new one runs",
            |_| {},
            Replaced {
                succeeded: true,
                journal: &[
                    "run web-0002",
                    "drain web-0001",
                    "stop web-0001",
                    "remove web-0001",
                    "run worker-0003",
                ],
                compensation: None,
                old_state: None,
                old_draining: false,
            },
        ),
        (
            "the new one exits",
            |t| t.behave("web", Behaviour::exits_after(0)),
            Replaced {
                succeeded: false,
                journal: &["run web-0002", "stop web-0002"],
                compensation: None,
                old_state: Some(ContainerState::Running),
                old_draining: false,
            },
        ),
        (
            "the old one's drain fails",
            |t| t.fail(Step::Drain, Some("web-0001"), "the daemon did not answer"),
            Replaced {
                succeeded: false,
                journal: &["run web-0002", "undrain web-0001"],
                compensation: Some(("lifted the drain mark of web-0001 (its drain failed)", None)),
                old_state: Some(ContainerState::Running),
                old_draining: false,
            },
        ),
    ];
    for (case, setup, expected) in cases {
        check_replacement(
            case,
            UpdateOrder::StartFirst,
            ContainerState::Running,
            setup,
            expected,
        )
        .await;
    }
}

#[tokio::test]
async fn health_monitoring_decides_whether_a_new_container_counts() {
    /// How the case's Service is set up: a Healthcheck, its monitor window, `--skip-health`.
    struct Case {
        name: &'static str,
        healthcheck: bool,
        monitor_ms: Option<u64>,
        skip_health: bool,
        behaviour: Behaviour,
        fault: Option<Step>,
        /// `None`: it counts; else a part of the failure's reason.
        fails_with: Option<&'static str>,
    }
    let case = |name, behaviour, fails_with| Case {
        name,
        healthcheck: false,
        monitor_ms: None,
        skip_health: false,
        behaviour,
        fault: None,
        fails_with,
    };
    let unhealthy = Behaviour::looks(vec![Look::Running(Some(ContainerHealth::Unhealthy))]);
    let starting = Behaviour::looks(vec![Look::Running(Some(ContainerHealth::Starting))]);
    let cases = [
        case("runs through the window", Behaviour::runs(), None),
        Case {
            healthcheck: true,
            monitor_ms: Some(LONG_WINDOW_MS),
            ..case("turns healthy", Behaviour::healthy_after(3), None)
        },
        Case {
            monitor_ms: Some(LONG_WINDOW_MS),
            ..case(
                "exits",
                Behaviour::exits_after(2),
                Some("container web-0001 exited"),
            )
        },
        Case {
            monitor_ms: Some(LONG_WINDOW_MS),
            ..case(
                "is restarted by Docker",
                Behaviour::looks(vec![Look::Running(None), Look::Restarted]),
                Some("crash loop"),
            )
        },
        Case {
            healthcheck: true,
            ..case(
                "stays unhealthy",
                unhealthy,
                Some("is unhealthy after the 0.02 s monitor window"),
            )
        },
        Case {
            healthcheck: true,
            ..case(
                "never turns healthy",
                starting,
                Some("did not turn healthy"),
            )
        },
        Case {
            monitor_ms: Some(LONG_WINDOW_MS),
            ..case(
                "disappears",
                Behaviour::looks(vec![Look::Running(None), Look::Gone]),
                Some("container web-0001 disappeared"),
            )
        },
        Case {
            skip_health: true,
            ..case("exits, with --skip-health", Behaviour::exits_after(0), None)
        },
        Case {
            monitor_ms: Some(0),
            ..case(
                "exits, with no monitor window",
                Behaviour::exits_after(0),
                None,
            )
        },
        Case {
            fault: Some(Step::Observe),
            ..case(
                "cannot be observed",
                Behaviour::runs(),
                Some("the daemon did not answer"),
            )
        },
    ];
    for c in cases {
        let (mut target, m) = FakeTarget::with_machine();
        target.behave("web", c.behaviour);
        if let Some(step) = c.fault {
            target.fail(step, Some("web"), "the daemon did not answer");
        }
        let mut s = if c.healthcheck {
            checked_spec("web")
        } else {
            spec("web")
        };
        s.update.monitor_ms = c.monitor_ms;
        let opts = ExecuteOptions {
            skip_health: c.skip_health,
            ..opts()
        };
        let (outcome, _) = execute_with(&plan_of(vec![run(&m, &s)]), &mut target, &opts).await;
        match c.fails_with {
            None => {
                assert!(outcome.succeeded(), "{}: {outcome:?}", c.name);
                assert_eq!(target.journal(), ["run web-0001"], "{}", c.name);
            }
            Some(reason) => {
                let failed = outcome.failed.expect(c.name);
                assert!(
                    failed.reason.contains(reason),
                    "{}: {}",
                    c.name,
                    failed.reason
                );
                assert_eq!(
                    failed.container.map(|c| c.name).as_deref(),
                    Some("web-0001"),
                    "{}",
                    c.name
                );
                assert_ne!(
                    target.state_of("web-0001"),
                    Some(ContainerState::Running),
                    "{}: a failed container is not left running",
                    c.name
                );
            }
        }
    }
}

#[tokio::test]
async fn a_failed_container_that_could_not_be_stopped_is_reported() {
    type Setup = fn(&mut FakeTarget);
    // (case, setup, stop_error, the container's state after)
    let unhealthy: Setup = |t| {
        t.behave(
            "web",
            Behaviour::looks(vec![Look::Running(Some(ContainerHealth::Unhealthy))]),
        )
    };
    let cases: [(&str, Setup, Option<&str>, Option<ContainerState>); 4] = [
        (
            "it is stopped",
            unhealthy,
            None,
            Some(ContainerState::Exited),
        ),
        (
            "its stop is refused while it runs",
            |t| {
                t.behave(
                    "web",
                    Behaviour::looks(vec![Look::Running(Some(ContainerHealth::Unhealthy))]),
                );
                t.fail(Step::Stop, Some("web-0001"), "Docker did not answer");
            },
            Some("Docker did not answer"),
            Some(ContainerState::Running),
        ),
        (
            "its stop is refused but it exited anyway",
            |t| {
                t.behave("web", Behaviour::exits_after(0));
                t.fail(Step::Stop, Some("web-0001"), "Docker did not answer");
            },
            None,
            Some(ContainerState::Exited),
        ),
        (
            "it is gone",
            |t| t.behave("web", Behaviour::looks(vec![Look::Gone])),
            None,
            None,
        ),
    ];
    for (case, setup, stop_error, state) in cases {
        let (mut target, m) = FakeTarget::with_machine();
        setup(&mut target);
        let (outcome, _) = execute_with(
            &plan_of(vec![run(&m, &checked_spec("web"))]),
            &mut target,
            &opts(),
        )
        .await;
        // `ployz deploy --json` prints the Outcome as serde gives it.
        let json = serde_json::to_value(&outcome).expect("an Outcome is JSON");
        assert_eq!(
            json["failed"].get("stop_error").and_then(|e| e.as_str()),
            stop_error,
            "{case}"
        );
        let failed = outcome.failed.expect(case);
        assert_eq!(failed.stop_error.as_deref(), stop_error, "{case}");
        assert_eq!(target.state_of("web-0001"), state, "{case}");
    }
}

#[tokio::test]
async fn a_hook_that_fails_stops_the_deploy_before_the_service_changes() {
    // (case, how the hook ends, a part of the failure's reason; `None`: it succeeded)
    let cases: [(&str, Option<i64>, Option<&str>); 3] = [
        ("exits 0", Some(0), None),
        (
            "exits 3",
            Some(3),
            Some("pre-deploy hook exited with code 3"),
        ),
        (
            "times out",
            None,
            Some("pre-deploy hook did not finish within its timeout (60 s)"),
        ),
    ];
    for (case, exit_code, fails_with) in cases {
        let (mut target, m) = FakeTarget::with_machine();
        target.hook_ends(
            "web",
            HookEnd {
                exit_code,
                logs: vec!["migrating".into(), "table users exists".into()],
            },
        );
        let s = spec("web");
        let ops = vec![hook(&m, &s), run(&m, &s)];
        let (outcome, _) = execute_with(&plan_of(ops.clone()), &mut target, &opts()).await;
        match fails_with {
            None => {
                assert!(outcome.succeeded(), "{case}: {outcome:?}");
                assert_eq!(
                    outcome.completed[0]
                        .container
                        .as_ref()
                        .map(|c| c.name.as_str()),
                    Some("web-pre-deploy-0001"),
                    "{case}"
                );
                assert_eq!(
                    target.journal(),
                    ["hook web-pre-deploy-0001", "run web-0002"],
                    "{case}"
                );
            }
            Some(reason) => {
                let failed = outcome.failed.expect(case);
                assert_eq!(failed.reason, reason, "{case}");
                assert_eq!(
                    failed.container.map(|c| c.name).as_deref(),
                    Some("web-pre-deploy-0001"),
                    "{case}"
                );
                assert_eq!(failed.logs, ["migrating", "table users exists"], "{case}");
                assert_eq!(outcome.unexecuted, ops[1..], "{case}");
                assert_eq!(target.journal(), ["hook web-pre-deploy-0001"], "{case}");
            }
        }
    }
}

#[tokio::test]
async fn stop_and_remove_drain_a_running_container_first() {
    type Op = fn(&MachineId, &ContainerRef) -> Operation;
    // (case, the operation, the container's state before, the calls made, whether a drain mark
    // stands after: a stopped container keeps its mark until it is started or removed)
    let cases: [(&str, Op, ContainerState, &[&str], bool); 4] = [
        (
            "stop, running",
            stop,
            ContainerState::Running,
            &["drain web-0001", "stop web-0001"],
            true,
        ),
        (
            "stop, exited",
            stop,
            ContainerState::Exited,
            &["stop web-0001"],
            false,
        ),
        (
            "remove, running",
            remove,
            ContainerState::Running,
            &["drain web-0001", "remove web-0001"],
            false,
        ),
        (
            "remove, exited",
            remove,
            ContainerState::Exited,
            &["remove web-0001"],
            false,
        ),
    ];
    for (case, op, state, journal, draining) in cases {
        let (mut target, m) = FakeTarget::with_machine();
        let c = target.add_container(&m, &ServiceId::generate(), &spec("web"), state);
        let (outcome, _) = execute_with(&plan_of(vec![op(&m, &c)]), &mut target, &opts()).await;
        assert!(outcome.succeeded(), "{case}: {outcome:?}");
        assert_eq!(target.journal(), journal, "{case}");
        assert_eq!(target.is_draining("web-0001"), draining, "{case}");
    }
}

#[tokio::test]
async fn a_failed_drain_lifts_the_mark_it_may_have_left() {
    let (mut target, m) = FakeTarget::with_machine();
    let c = target.add_container(
        &m,
        &ServiceId::generate(),
        &spec("web"),
        ContainerState::Running,
    );
    // A mark is left behind even though the drain call fails (the daemon wrote it, then the
    // answer was lost).
    target.mark_draining(&c);
    target.fail(Step::Drain, Some("web-0001"), "the daemon did not answer");
    let (outcome, _) = execute_with(&plan_of(vec![remove(&m, &c)]), &mut target, &opts()).await;
    assert_eq!(target.journal(), ["undrain web-0001"]);
    assert!(!target.is_draining("web-0001"));
    assert_eq!(target.state_of("web-0001"), Some(ContainerState::Running));
    let failed = outcome.failed.expect("the removal failed");
    assert_eq!(failed.reason, "the daemon did not answer");
    let compensation = outcome.compensation.expect("a compensation");
    assert_eq!(
        compensation.action,
        "lifted the drain mark of web-0001 (its drain failed)"
    );
    assert_eq!(compensation.error, None);
}

#[tokio::test]
async fn an_operation_for_a_machine_the_target_cannot_reach_fails_and_changes_nothing() {
    let (mut target, m) = FakeTarget::with_machine();
    let elsewhere = MachineId::generate();
    let ops = vec![run(&elsewhere, &spec("web")), run(&m, &spec("api"))];
    let (outcome, _) = execute_with(&plan_of(ops.clone()), &mut target, &opts()).await;
    let failed = outcome.failed.expect("the run failed");
    assert_eq!(
        failed.reason,
        format!("Machine {elsewhere} is not reachable")
    );
    assert_eq!(outcome.unexecuted, ops[1..]);
    assert!(target.journal().is_empty());
}
