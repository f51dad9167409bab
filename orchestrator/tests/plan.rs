//! The planner, case by case: Deploy Intent + Deploy Snapshot in, Deploy Plan out.

use ployz_core::api::{MachineInfo, MachineView};
use ployz_core::{
    ClusterNetwork, ContainerKind, ContainerRuntimeObservation, ContainerSpec, ContainerState,
    DeployIntent, DeployPreview, DockerVolume, EdgeFeature, HostProtocol, IngressProtocol,
    Listener, ListenerRole, LocalMachinePhase, MachineId, MachineSnapshot, ManagementAddress,
    MembershipObservation, Mount, NotIncluded, Operation, PortSpec, PreDeployHook, PullPolicy,
    ServiceId, ServiceMode, ServiceSpec, UpdateConfig, UpdateOrder, VolumeSpec,
};
use ployz_orchestrator::plan::{plan, PlanError, PlanOptions};
use ployz_orchestrator::preview;

fn machine(name: &str) -> MachineSnapshot {
    let net = ClusterNetwork::default();
    MachineSnapshot {
        machine: MachineView {
            info: MachineInfo {
                id: MachineId::generate(),
                name: name.parse().unwrap(),
                phase: LocalMachinePhase::Participating,
                subnet: net.first_free_subnet(&[]).unwrap(),
                public_key: String::new(),
                management_address: ManagementAddress::from_public_key(&[0; 32]),
                endpoints: Vec::new(),
                version: "0.1.0".to_owned(),
                wireguard_backend: None,
                edge_features: EdgeFeature::published(),
            },
            membership: MembershipObservation::Up,
            selected_endpoint: None,
            subnet_collisions: Vec::new(),
        },
        containers: vec![],
        volumes: vec![],
        images: vec![],
        image_ids: Default::default(),
        drains: vec![],
        listeners: vec![],
        interrupted: vec![],
    }
}

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

fn host_port(port: u16) -> PortSpec {
    PortSpec::Host {
        host_ip: None,
        host_port: Some(port),
        container_port: 80,
        protocol: HostProtocol::Tcp,
    }
}

static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// Adds a container of `spec` (its Resolved Service Spec) to machine `m`.
fn add(
    m: &mut MachineSnapshot,
    service_id: &ServiceId,
    spec: &ServiceSpec,
    state: ContainerState,
) -> String {
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = format!("{}-{n:04}", spec.name);
    m.containers.push(ContainerRuntimeObservation {
        id: format!("{n:064x}").parse().unwrap(),
        name: name.clone(),
        machine_id: m.machine.info.id.clone(),
        service_id: service_id.clone(),
        service_name: spec.name.clone(),
        kind: ContainerKind::Service,
        state,
        health: None,
        restart_count: 0,
        address: Some("10.210.0.2".parse().unwrap()),
        image: spec.container.image.clone(),
        created_at: n as i64,
        spec: Some(spec.clone()),
        plan_id: None,
        lease_token: None,
    });
    name
}

fn ops_of(plan: &ployz_core::DeployPlan) -> Vec<String> {
    plan.operations()
        .map(|op| match op {
            Operation::CreateVolume { volume, .. } => format!("volume {}", volume.name),
            Operation::RunHook { .. } => "hook".into(),
            Operation::RunContainer { .. } => "run".into(),
            Operation::ReplaceContainer { old, order, .. } => {
                format!("replace {} {}", old.name, order.as_str())
            }
            Operation::StopContainer { container, .. } => format!("stop {}", container.name),
            Operation::RemoveContainer { container, .. } => format!("remove {}", container.name),
        })
        .collect()
}

fn plan_all(services: Vec<ServiceSpec>, machines: &[MachineSnapshot]) -> Vec<String> {
    let intent = DeployIntent::all(services, vec![]);
    ops_of(&plan(&intent, machines, &PlanOptions::default()).unwrap())
}

#[test]
fn a_new_service_runs_its_replicas_round_robin() {
    let machines = [machine("a"), machine("b")];
    let mut s = spec("web");
    s.replicas = 3;
    let intent = DeployIntent::all(vec![s], vec![]);
    let p = plan(&intent, &machines, &PlanOptions::default()).unwrap();
    assert_eq!(ops_of(&p), ["run", "run", "run"]);
    assert!(p.services[0].is_new);
    let per_machine = |m: &MachineSnapshot| {
        p.operations()
            .filter(|op| op.machine_id() == &m.machine.info.id)
            .count()
    };
    let mut counts = [per_machine(&machines[0]), per_machine(&machines[1])];
    counts.sort();
    assert_eq!(counts, [1, 2]);
}

#[test]
fn an_unchanged_spec_plans_nothing_and_says_so() {
    let mut m = machine("a");
    let s = spec("web");
    let id = ServiceId::generate();
    add(&mut m, &id, &s, ContainerState::Running);
    let intent = DeployIntent::all(vec![s], vec![]);
    let p = plan(&intent, std::slice::from_ref(&m), &PlanOptions::default()).unwrap();
    assert!(p.is_empty());
    assert_eq!(p.services[0].service_id, id, "the Service keeps its ID");
    let text = preview::render(
        &DeployPreview {
            plan: p,
            warnings: vec![],
            not_included: vec![],
        },
        &[m],
    );
    assert_eq!(text, "Services are up to date.\n");
}

#[test]
fn a_running_container_left_with_a_drain_mark_is_replaced_not_up_to_date() {
    let mut m = machine("a");
    let mut s = spec("web");
    s.replicas = 2;
    let id = ServiceId::generate();
    let marked = add(&mut m, &id, &s, ContainerState::Running);
    let serving = add(&mut m, &id, &s, ContainerState::Running);
    let marked_id = m.containers[0].id.clone();
    m.drains.push(ployz_core::DrainMark {
        container_id: marked_id,
        machine_id: m.machine.info.id.clone(),
        lease_token: Some(3),
        set_by: "alice@build-1 (pid 7), running `deploy of web`".into(),
        set_at_ms: 1_000,
        deadline_ms: 100_000,
    });
    // The marked one receives no requests: it is replaced, the other is kept as it is.
    let ops = plan_all(vec![s.clone()], std::slice::from_ref(&m));
    assert_eq!(ops, [format!("replace {marked} start-first")]);
    assert!(!ops.iter().any(|o| o.contains(&serving)), "{ops:?}");
    // Without the mark, nothing to do.
    m.drains.clear();
    assert!(plan_all(vec![s], &[m]).is_empty());
}

#[test]
fn an_env_change_replaces_every_container_start_first() {
    let mut m = machine("a");
    let mut s = spec("web");
    s.replicas = 2;
    let id = ServiceId::generate();
    let c1 = add(&mut m, &id, &s, ContainerState::Running);
    let c2 = add(&mut m, &id, &s, ContainerState::Running);
    s.container.env.insert("A".into(), "2".into());
    assert_eq!(
        plan_all(vec![s], &[m]),
        [
            format!("replace {c1} start-first"),
            format!("replace {c2} start-first")
        ]
    );
}

#[test]
fn a_host_port_held_by_the_old_container_forces_stop_first() {
    let mut m = machine("a");
    let mut s = spec("web");
    s.ports = vec![host_port(8080)];
    let id = ServiceId::generate();
    let c1 = add(&mut m, &id, &s, ContainerState::Running);
    let mut changed = s.clone();
    changed.container.image = "app:2".into();
    assert_eq!(
        plan_all(vec![changed.clone()], std::slice::from_ref(&m)),
        [format!("replace {c1} stop-first")]
    );
    // A different host port does not conflict: start-first.
    changed.ports = vec![host_port(8081)];
    assert_eq!(
        plan_all(vec![changed], &[m]),
        [format!("replace {c1} start-first")]
    );
}

#[test]
fn an_explicit_order_wins() {
    let mut m = machine("a");
    let mut s = spec("web");
    let id = ServiceId::generate();
    let c1 = add(&mut m, &id, &s, ContainerState::Running);
    s.update.order = Some(UpdateOrder::StopFirst);
    // The order alone changes no container.
    assert!(plan_all(vec![s.clone()], std::slice::from_ref(&m)).is_empty());
    s.container.image = "app:2".into();
    assert_eq!(
        plan_all(vec![s], &[m]),
        [format!("replace {c1} stop-first")]
    );
}

#[test]
fn a_single_replica_with_a_named_volume_is_stop_first_and_its_volume_is_created() {
    let mut m = machine("a");
    let mut s = spec("db");
    s.container.mounts = vec![Mount::Volume {
        source: "data".into(),
        target: "/data".into(),
        read_only: false,
        no_copy: false,
    }];
    let intent = DeployIntent::all(
        vec![s.clone()],
        vec![VolumeSpec {
            name: "data".into(),
            driver: None,
            driver_opts: Default::default(),
            labels: Default::default(),
            external: false,
        }],
    );
    let p = plan(&intent, std::slice::from_ref(&m), &PlanOptions::default()).unwrap();
    assert_eq!(ops_of(&p), ["volume data", "run"]);

    let id = ServiceId::generate();
    let c1 = add(&mut m, &id, &s, ContainerState::Running);
    m.volumes.push(DockerVolume {
        machine_id: m.machine.info.id.clone(),
        name: "data".into(),
        driver: "local".into(),
        labels: Default::default(),
    });
    let mut changed = s.clone();
    changed.container.image = "app:2".into();
    assert_eq!(
        plan_all(vec![changed], &[m]),
        [format!("replace {c1} stop-first")]
    );
}

#[test]
fn global_services_get_one_container_per_machine_that_is_up() {
    let mut machines = [machine("a"), machine("b"), machine("c")];
    machines[2].machine.membership = MembershipObservation::Down;
    let mut s = spec("agent");
    s.mode = ServiceMode::Global;
    assert_eq!(plan_all(vec![s.clone()], &machines), ["run", "run"]);

    // A Machine with two containers keeps one up-to-date one and removes the other.
    let id = ServiceId::generate();
    let _keep = add(&mut machines[0], &id, &s, ContainerState::Running);
    let extra = add(&mut machines[0], &id, &s, ContainerState::Running);
    assert_eq!(
        plan_all(vec![s], &machines),
        ["run".to_string(), format!("remove {extra}")]
    );
}

#[test]
fn scaling_up_runs_more_and_scaling_down_removes_the_extra() {
    let mut m = machine("a");
    let mut s = spec("web");
    s.replicas = 2;
    let id = ServiceId::generate();
    add(&mut m, &id, &s, ContainerState::Running);
    let second = add(&mut m, &id, &s, ContainerState::Running);
    s.replicas = 3;
    // Replicas shape the Deploy, not the containers: the running ones stay.
    assert_eq!(plan_all(vec![s.clone()], std::slice::from_ref(&m)), ["run"]);
    s.replicas = 1;
    assert_eq!(plan_all(vec![s], &[m]), [format!("remove {second}")]);
}

#[test]
fn a_hook_runs_only_when_something_runs_and_first() {
    let mut m = machine("a");
    let mut s = spec("web");
    s.pre_deploy = Some(PreDeployHook {
        command: vec!["migrate".into()],
        env: Default::default(),
        privileged: false,
        user: None,
        timeout_ms: 300_000,
    });
    let id = ServiceId::generate();
    let c1 = add(&mut m, &id, &s, ContainerState::Running);
    assert!(plan_all(vec![s.clone()], std::slice::from_ref(&m)).is_empty());
    s.container.image = "app:2".into();
    assert_eq!(
        plan_all(vec![s], &[m]),
        ["hook".to_string(), format!("replace {c1} start-first")]
    );
}

#[test]
fn pull_policy_always_and_recreate_replace_even_when_equal() {
    let mut m = machine("a");
    let mut s = spec("web");
    s.container.pull_policy = PullPolicy::Always;
    let id = ServiceId::generate();
    let c1 = add(&mut m, &id, &s, ContainerState::Running);
    assert_eq!(
        plan_all(vec![s.clone()], std::slice::from_ref(&m)),
        [format!("replace {c1} start-first")]
    );
    s.container.pull_policy = PullPolicy::Missing;
    m.containers[0].spec = Some(s.clone());
    let intent = DeployIntent::all(vec![s], vec![]);
    let opts = PlanOptions {
        recreate: true,
        ..Default::default()
    };
    assert_eq!(
        ops_of(&plan(&intent, &[m], &opts).unwrap()),
        [format!("replace {c1} start-first")]
    );
}

#[test]
fn stopped_and_half_created_containers_are_cleaned_up() {
    let mut m = machine("a");
    let s = spec("web");
    let id = ServiceId::generate();
    let exited = add(&mut m, &id, &s, ContainerState::Exited);
    let created = add(&mut m, &id, &s, ContainerState::Created);
    assert_eq!(
        plan_all(vec![s], &[m]),
        [
            "run".to_string(),
            format!("remove {exited}"),
            format!("remove {created}")
        ]
    );
}

#[test]
fn only_attempted_services_are_planned() {
    let mut m = machine("a");
    let web = spec("web");
    let mut api = spec("api");
    let id = ServiceId::generate();
    add(&mut m, &id, &api, ContainerState::Running);
    api.container.image = "app:9".into();
    let intent = DeployIntent {
        services: vec![web.clone(), api],
        attempts: vec![web.name.clone()],
        volumes: vec![],
    };
    let p = plan(&intent, &[m], &PlanOptions::default()).unwrap();
    assert_eq!(p.services.len(), 1);
    assert_eq!(ops_of(&p), ["run"]);

    let unknown = DeployIntent {
        services: vec![web],
        attempts: vec!["nope".parse().unwrap()],
        volumes: vec![],
    };
    let err = plan(&unknown, &[machine("a")], &PlanOptions::default()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "service 'nope' is not in the Compose file; services there: web"
    );
}

#[test]
fn x_machines_restricts_placement_by_name_or_id() {
    let machines = [machine("a"), machine("b")];
    let mut s = spec("web");
    s.replicas = 2;
    s.machines = vec!["b".parse().unwrap()];
    let intent = DeployIntent::all(vec![s.clone()], vec![]);
    let p = plan(&intent, &machines, &PlanOptions::default()).unwrap();
    assert!(p
        .operations()
        .all(|op| op.machine_id() == &machines[1].machine.info.id));
    s.machines = vec!["zz".parse().unwrap()];
    let err = plan(
        &DeployIntent::all(vec![s], vec![]),
        &machines,
        &PlanOptions::default(),
    )
    .unwrap_err();
    assert!(
        matches!(err.0[..], [PlanError::NoEligibleMachine { .. }]),
        "{err}"
    );
    assert!(err.to_string().contains("x-machines zz"), "{err}");
    let e = &err.0[0];
    assert_eq!(e.service(), Some("web"));
    assert_eq!(
        e.message(),
        "service 'web': no Machine can run it (x-machines zz matches no Machine that is up)"
    );
    assert_eq!(
        e.fix().as_deref(),
        Some("name Machines that exist and are up in x-machines (`ployz machine ls` lists them)")
    );
}

#[test]
fn name_ambiguity_and_mode_changes_are_refused() {
    let mut m = machine("a");
    let s = spec("web");
    add(&mut m, &ServiceId::generate(), &s, ContainerState::Running);
    add(&mut m, &ServiceId::generate(), &s, ContainerState::Running);
    let err = plan(
        &DeployIntent::all(vec![s.clone()], vec![]),
        &[m],
        &PlanOptions::default(),
    )
    .unwrap_err();
    assert!(
        matches!(&err.0[..], [PlanError::AmbiguousService { ids, .. }] if ids.len() == 2),
        "{err}"
    );

    let mut m = machine("a");
    add(&mut m, &ServiceId::generate(), &s, ContainerState::Running);
    let mut global = s;
    global.mode = ServiceMode::Global;
    let err = plan(
        &DeployIntent::all(vec![global], vec![]),
        &[m],
        &PlanOptions::default(),
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("changing it to global needs `ployz rm web`"),
        "{err}"
    );
}

#[test]
fn services_share_a_hostname_by_path_and_the_same_path_twice_is_refused() {
    let mut m = machine("a");
    let ingress = PortSpec::Ingress {
        hostname: Some("app.example.com".into()),
        published: None,
        container_port: 80,
        protocol: IngressProtocol::Https,
    };
    let route = |path: &str| ployz_core::RouteSpec {
        hostname: "app.example.com".into(),
        path: ployz_core::PathMatch::Prefix(path.into()),
        strip_prefix: false,
        redirect: None,
        request_headers: Default::default(),
        response_headers: Default::default(),
        allow: vec![],
        ..Default::default()
    };
    let mut site = spec("site");
    site.ports = vec![ingress.clone()];
    add(
        &mut m,
        &ServiceId::generate(),
        &site,
        ContainerState::Running,
    );
    let mut api = spec("api");
    api.ports = vec![ingress.clone()];
    api.routes = vec![route("/api")];
    add(
        &mut m,
        &ServiceId::generate(),
        &api,
        ContainerState::Running,
    );

    // Another path of the hostname: planned.
    let mut docs = spec("docs");
    docs.ports = vec![ingress.clone()];
    docs.routes = vec![route("/docs")];
    let p = plan(
        &DeployIntent::all(vec![docs], vec![]),
        std::slice::from_ref(&m),
        &PlanOptions::default(),
    );
    assert_eq!(ops_of(&p.unwrap()), ["run"]);

    // The path `api` routes: refused, naming it.
    let mut v2 = spec("api-v2");
    v2.ports = vec![ingress];
    v2.routes = vec![route("/docs"), route("/api")];
    let err = plan(
        &DeployIntent::all(vec![v2], vec![]),
        &[m],
        &PlanOptions::default(),
    )
    .unwrap_err();
    let e = err.iter().next().unwrap();
    assert!(matches!(e, PlanError::RouteClaimed { .. }), "{e}");
    assert!(
        e.to_string().starts_with(
            "service 'api-v2' routes /api/* of 'app.example.com', which Service 'api' ("
        ),
        "{e}"
    );
}

#[test]
fn a_hostname_published_by_another_service_is_refused() {
    let mut m = machine("a");
    let ingress = PortSpec::Ingress {
        hostname: Some("app.example.com".into()),
        published: None,
        container_port: 80,
        protocol: IngressProtocol::Https,
    };
    let mut owner = spec("old");
    owner.ports = vec![ingress.clone()];
    add(
        &mut m,
        &ServiceId::generate(),
        &owner,
        ContainerState::Running,
    );
    let mut s = spec("new");
    s.ports = vec![ingress];
    let err = plan(
        &DeployIntent::all(vec![s], vec![]),
        &[m],
        &PlanOptions::default(),
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("already published by Service 'old'"),
        "{err}"
    );
}

#[test]
fn pull_policy_never_needs_the_image_on_the_machine() {
    let mut m = machine("a");
    let mut s = spec("web");
    s.container.image = "app".into();
    s.container.pull_policy = PullPolicy::Never;
    let err = plan(
        &DeployIntent::all(vec![s.clone()], vec![]),
        std::slice::from_ref(&m),
        &PlanOptions::default(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("pull_policy is never"), "{err}");
    m.images.push("app:latest".into());
    assert_eq!(plan_all(vec![s], &[m]), ["run"]);
}

#[test]
fn replicas_with_a_host_port_on_one_machine_are_refused() {
    let mut s = spec("web");
    s.replicas = 2;
    s.ports = vec![host_port(8080)];
    let err = plan(
        &DeployIntent::all(vec![s], vec![]),
        &[machine("a")],
        &PlanOptions::default(),
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("publishes host port 8080"),
        "{err}"
    );
}

#[test]
fn the_preview_shows_a_tree_and_the_summary_line() {
    let mut m = machine("a");
    let mut s = spec("web");
    let id = ServiceId::generate();
    let c1 = add(&mut m, &id, &s, ContainerState::Running);
    s.container.image = "app:2".into();
    let p = plan(
        &DeployIntent::all(vec![s, spec("api")], vec![]),
        std::slice::from_ref(&m),
        &PlanOptions::default(),
    )
    .unwrap();
    // Warnings are not part of the plan's text: the CLI writes them to stderr.
    let text = preview::render(
        &DeployPreview {
            plan: p,
            warnings: vec!["service 'web': privileged".into()],
            not_included: vec![],
        },
        &[m],
    );
    let expected = format!(
        "~ update service web\n│ image: app:1 → app:2\n│ replicas: 1\n└─ +/- replace container {c1} on a\n\n\
         + create service api\n│ image: app:1\n│ replicas: 1\n└─ + run container on a\n\n\
         1 create · 1 replace (start-first) · 0 replace (stop-first) · 0 remove · across 1 machine\n"
    );
    assert_eq!(text, expected);
}

#[test]
fn containers_on_a_machine_observed_down_are_left_alone() {
    let mut machines = [machine("a"), machine("b")];
    let s = spec("web");
    let id = ServiceId::generate();
    add(&mut machines[1], &id, &s, ContainerState::Running);
    machines[1].machine.membership = MembershipObservation::Down;
    let mut changed = s.clone();
    changed.container.image = "app:2".into();
    // Nothing can reach b: a new container runs on a, b's is neither replaced nor removed.
    assert_eq!(plan_all(vec![changed], &machines), ["run"]);
}

#[test]
fn every_service_that_cannot_be_planned_is_named_in_one_run() {
    let mut m = machine("a");
    // Name Ambiguity and a hostname another Service publishes: two problems of one Service.
    let ingress = PortSpec::Ingress {
        hostname: Some("app.example.com".into()),
        published: None,
        container_port: 80,
        protocol: IngressProtocol::Https,
    };
    let mut owner = spec("owner");
    owner.ports = vec![ingress.clone()];
    add(
        &mut m,
        &ServiceId::generate(),
        &owner,
        ContainerState::Running,
    );
    let mut twice = spec("twice");
    twice.ports = vec![ingress];
    add(
        &mut m,
        &ServiceId::generate(),
        &twice,
        ContainerState::Running,
    );
    add(
        &mut m,
        &ServiceId::generate(),
        &twice,
        ContainerState::Running,
    );
    let mut nowhere = spec("nowhere");
    nowhere.machines = vec!["zz".parse().unwrap()];
    let mut external = spec("external");
    external.container.mounts = vec![Mount::Volume {
        source: "ext".into(),
        target: "/data".into(),
        read_only: false,
        no_copy: false,
    }];
    let mut never = spec("never");
    never.container.image = "local-only:1".into();
    never.container.pull_policy = PullPolicy::Never;
    let good = spec("good");
    let services = vec![twice, nowhere, external, good, never];
    let mut attempts: Vec<_> = services.iter().map(|s| s.name.clone()).collect();
    attempts.push("missing".parse().unwrap());
    let intent = DeployIntent {
        services,
        attempts,
        volumes: vec![VolumeSpec {
            name: "ext".into(),
            driver: None,
            driver_opts: Default::default(),
            labels: Default::default(),
            external: true,
        }],
    };
    let err = plan(&intent, &[m], &PlanOptions::default()).unwrap_err();
    let found: Vec<(Option<&str>, &str)> = err
        .iter()
        .map(|e| {
            let kind = match e {
                PlanError::UnknownAttempt(..) => "unknown",
                PlanError::HostnameClaimed { .. } => "hostname",
                PlanError::AmbiguousService { .. } => "ambiguous",
                PlanError::NoEligibleMachine { .. } => "no machine",
                PlanError::ExternalVolumeMissing { .. } => "external volume",
                PlanError::ImageMissing { .. } => "image",
                _ => "other",
            };
            (e.service(), kind)
        })
        .collect();
    // The unknown attempt first, then Service by Service in the intent's order; the Service
    // that plans well is not named.
    assert_eq!(
        found,
        [
            (Some("missing"), "unknown"),
            (Some("twice"), "hostname"),
            (Some("twice"), "ambiguous"),
            (Some("nowhere"), "no machine"),
            (Some("external"), "external volume"),
            (Some("never"), "image"),
        ],
        "{err}"
    );
    // One line per problem, each with its fix.
    assert_eq!(err.to_string().lines().count(), found.len(), "{err}");
    for e in &err {
        let fix = e.fix().unwrap_or_else(|| panic!("no fix: {e}"));
        assert_eq!(format!("{}; {fix}", e.message()), e.to_string());
        assert!(!e.message().contains("; "), "{e}");
    }
    let missing = &err.0[4];
    assert_eq!(
        missing.message(),
        "service 'external': external volume 'ext' does not exist on any Machine"
    );
    assert_eq!(
        missing.fix().as_deref(),
        Some("create it with `ployz volume create ext`")
    );
}

/// A host port with every field chosen.
fn bound(ip: Option<&str>, port: Option<u16>, container_port: u16, udp: bool) -> PortSpec {
    PortSpec::Host {
        host_ip: ip.map(str::to_owned),
        host_port: port,
        container_port,
        protocol: if udp {
            HostProtocol::Udp
        } else {
            HostProtocol::Tcp
        },
    }
}

/// The daemon listeners a Machine with the default configuration reports.
fn default_listeners(m: &mut MachineSnapshot) {
    let listener = |role, address: &str, port, protocol| Listener {
        role,
        address: address.into(),
        port,
        protocol,
    };
    m.listeners = vec![
        listener(ListenerRole::EdgeHttp, "0.0.0.0", 80, HostProtocol::Tcp),
        listener(ListenerRole::EdgeHttps, "0.0.0.0", 443, HostProtocol::Tcp),
        listener(ListenerRole::Metrics, "127.0.0.1", 9090, HostProtocol::Tcp),
        listener(ListenerRole::Dns, "10.210.0.1", 53, HostProtocol::Udp),
        listener(ListenerRole::Dns, "10.210.0.1", 53, HostProtocol::Tcp),
    ];
}

fn plan_err(services: Vec<ServiceSpec>, machines: &[MachineSnapshot]) -> String {
    plan(
        &DeployIntent::all(services, vec![]),
        machines,
        &PlanOptions::default(),
    )
    .unwrap_err()
    .to_string()
}

#[test]
fn two_services_wanting_one_host_port_on_one_machine_are_refused_naming_both() {
    let mut web = spec("web");
    web.ports = vec![bound(None, Some(8080), 80, false)];
    let mut api = spec("api");
    api.ports = vec![bound(Some("127.0.0.1"), Some(8080), 3000, false)];
    assert_eq!(
        plan_err(vec![web.clone(), api.clone()], &[machine("m1")]),
        "service 'api' and service 'web' both publish host port 8080/tcp on Machine m1; give one of them another host port, or place them on different Machines with x-machines"
    );

    // Different protocols, different addresses or different Machines do not collide.
    let mut udp = api.clone();
    udp.ports = vec![bound(None, Some(8080), 3000, true)];
    assert_eq!(
        plan_all(vec![web.clone(), udp], &[machine("m1")]),
        ["run", "run"]
    );
    let mut two_ips = web.clone();
    two_ips.ports = vec![bound(Some("127.0.0.2"), Some(8080), 80, false)];
    assert_eq!(
        plan_all(vec![two_ips, api.clone()], &[machine("m1")]),
        ["run", "run"]
    );
    let machines = [machine("m1"), machine("m2")];
    let mut on_m2 = api.clone();
    on_m2.machines = vec!["m2".parse().unwrap()];
    let mut on_m1 = web.clone();
    on_m1.machines = vec!["m1".parse().unwrap()];
    assert_eq!(plan_all(vec![on_m1, on_m2], &machines), ["run", "run"]);

    // Ports Docker picks never collide.
    let mut picked = api;
    picked.ports = vec![bound(None, None, 80, false)];
    let mut picked_too = web;
    picked_too.ports = vec![bound(None, None, 80, false)];
    assert_eq!(
        plan_all(vec![picked, picked_too], &[machine("m1")]),
        ["run", "run"]
    );
}

#[test]
fn a_host_port_a_running_service_outside_the_deploy_holds_is_refused() {
    let mut m = machine("m1");
    let mut other = spec("legacy");
    other.ports = vec![bound(None, Some(5432), 5432, false)];
    add(
        &mut m,
        &ServiceId::generate(),
        &other,
        ContainerState::Running,
    );
    let mut db = spec("db");
    db.ports = vec![bound(Some("127.0.0.1"), Some(5432), 5432, false)];
    let intent = DeployIntent::all(vec![db.clone()], vec![]);
    let err = plan(&intent, std::slice::from_ref(&m), &PlanOptions::default())
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "service 'db' and service 'legacy' both publish host port 5432/tcp on Machine m1 ('legacy' already runs there); give one of them another host port, or place them on different Machines with x-machines"
    );
    // An exited container holds no port.
    m.containers[0].state = ContainerState::Exited;
    assert_eq!(
        plan_all(vec![db.clone()], std::slice::from_ref(&m)),
        ["run"]
    );
    // The Service's own old container is replaced, not a rival.
    let mut m = machine("m1");
    let id = ServiceId::generate();
    let old = add(&mut m, &id, &db, ContainerState::Running);
    let mut changed = db;
    changed.container.image = "app:2".into();
    assert_eq!(
        plan_all(vec![changed], &[m]),
        [format!("replace {old} stop-first")]
    );
}

#[test]
fn a_host_port_the_daemon_listens_on_is_refused_with_the_fix() {
    let mut m = machine("m1");
    default_listeners(&mut m);
    let mut web = spec("web");
    web.ports = vec![bound(None, Some(80), 8080, false)];
    assert_eq!(
        plan_err(vec![web.clone()], std::slice::from_ref(&m)),
        "service 'web' publishes host port 80/tcp on Machine m1, where the daemon's edge HTTP listener listens (0.0.0.0:80); publish the web port through the edge with x-ports (e.g. x-ports: ['app.example.com:8080/https']) or pick another host port"
    );
    web.ports = vec![bound(Some("127.0.0.1"), Some(443), 443, false)];
    assert!(plan_err(vec![web.clone()], std::slice::from_ref(&m))
        .contains("the daemon's edge HTTPS listener listens (0.0.0.0:443); publish the web port through the edge with x-ports (e.g. x-ports: ['app.example.com:443/https'])"));
    web.ports = vec![bound(None, Some(9090), 9090, false)];
    assert_eq!(
        plan_err(vec![web.clone()], std::slice::from_ref(&m)),
        "service 'web' publishes host port 9090/tcp on Machine m1, where the daemon's metrics listener listens (127.0.0.1:9090); pick another host port, or publish it on one of the Machine's other addresses (e.g. 'MACHINE_IP:9090:9090/tcp', with an address other than 127.0.0.1)"
    );
    web.ports = vec![bound(None, Some(53), 53, true)];
    assert!(plan_err(vec![web.clone()], std::slice::from_ref(&m))
        .contains("host port 53/udp on Machine m1, where the daemon's internal DNS listens (10.210.0.1:53); pick another host port, or publish it on one of the Machine's other addresses (e.g. 'MACHINE_IP:53:53/udp', with an address other than 10.210.0.1)"));
    // A port already bound to one address gets the plain fix: another address is its own choice.
    web.ports = vec![bound(Some("10.210.0.1"), Some(53), 53, true)];
    assert!(plan_err(vec![web.clone()], std::slice::from_ref(&m))
        .ends_with("(10.210.0.1:53); pick another host port"));

    // Another address than the listener's, another protocol, or a port Docker picks is fine.
    for ports in [
        vec![bound(Some("127.0.0.2"), Some(9090), 9090, false)],
        vec![bound(None, Some(80), 80, true)],
        vec![bound(Some("127.0.0.1"), Some(53), 53, true)],
        vec![bound(None, None, 80, false)],
    ] {
        web.ports = ports;
        assert_eq!(
            plan_all(vec![web.clone()], std::slice::from_ref(&m)),
            ["run"]
        );
    }
}

#[test]
fn the_preview_shows_each_host_port_with_its_machines() {
    let machines = [machine("m1"), machine("m2")];
    let mut s = spec("web");
    s.mode = ServiceMode::Global;
    s.ports = vec![
        bound(None, Some(8080), 80, false),
        bound(None, None, 3000, false),
        bound(Some("::1"), Some(53), 53, true),
        bound(Some("127.0.0.1"), None, 9000, false),
    ];
    let p = plan(
        &DeployIntent::all(vec![s], vec![]),
        &machines,
        &PlanOptions::default(),
    )
    .unwrap();
    let text = preview::render(
        &DeployPreview {
            plan: p,
            warnings: vec![],
            not_included: vec![],
        },
        &machines,
    );
    for line in [
        "│ port: (any free port) → 3000/tcp on m1, m2\n",
        "│ port: 0.0.0.0:8080 → 80/tcp on m1, m2\n",
        "│ port: 127.0.0.1:(any free port) → 9000/tcp on m1, m2\n",
        "│ port: [::1]:53 → 53/udp on m1, m2\n",
    ] {
        assert!(text.contains(line), "{line} not in\n{text}");
    }
    assert_eq!(text.matches("│ port:").count(), 4, "{text}");
}

// Service Names: a Service whose DNS name another deployed Service already answers at is
// refused, and the preview shows the DNS name when it is not the Service Name.

#[test]
fn a_dns_name_another_deployed_service_has_is_refused_naming_it() {
    let mut m = machine("a");
    let owner = ServiceId::generate();
    add(&mut m, &owner, &spec("my-app"), ContainerState::Running);
    let err = plan(
        &DeployIntent::all(vec![spec("my_app")], vec![]),
        std::slice::from_ref(&m),
        &PlanOptions::default(),
    )
    .unwrap_err();
    assert_eq!(
        err.0,
        [PlanError::DnsLabelTaken {
            name: "my_app".into(),
            label: "my-app".into(),
            owner: "my-app".into(),
            owner_id: owner.to_string(),
        }]
    );
    assert_eq!(
        err.to_string(),
        format!(
            "service 'my_app' has the DNS name my-app.internal, which Service 'my-app' ({owner}) \
             already answers at; rename 'my_app', or remove that Service (`ployz rm {owner}`)"
        )
    );
    // Case alone collides too.
    let err = plan(
        &DeployIntent::all(vec![spec("My-App")], vec![]),
        std::slice::from_ref(&m),
        &PlanOptions::default(),
    )
    .unwrap_err();
    assert!(
        matches!(err.0.as_slice(), [PlanError::DnsLabelTaken { .. }]),
        "{err}"
    );
}

#[test]
fn the_same_name_and_other_labels_are_not_collisions() {
    let mut m = machine("a");
    let id = ServiceId::generate();
    add(&mut m, &id, &spec("my_app"), ContainerState::Running);
    // The same Service again, and a Service with another label, plan as usual.
    let mut changed = spec("my_app");
    changed.container.image = "other:2".into();
    let p = plan(
        &DeployIntent::all(vec![changed, spec("my_app2")], vec![]),
        std::slice::from_ref(&m),
        &PlanOptions::default(),
    )
    .unwrap();
    assert_eq!(p.services.len(), 2);
    assert_eq!(p.services[0].service_id, id);
}

#[test]
fn the_preview_shows_the_dns_name_when_it_differs() {
    let m = machine("a");
    let p = plan(
        &DeployIntent::all(vec![spec("my_app"), spec("web"), spec("Api.V2")], vec![]),
        std::slice::from_ref(&m),
        &PlanOptions::default(),
    )
    .unwrap();
    let text = preview::render(
        &DeployPreview {
            plan: p,
            warnings: vec![],
            not_included: vec![],
        },
        &[m],
    );
    assert!(
        text.contains("+ create service my_app (DNS: my-app.internal)\n"),
        "{text}"
    );
    assert!(
        text.contains("+ create service Api.V2 (DNS: api-v2.internal)\n"),
        "{text}"
    );
    assert!(text.contains("+ create service web\n"), "{text}");
}

/// Per Service of `p`, how many containers each Machine of `machines` gets run (by name).
fn runs_per_machine(
    p: &ployz_core::DeployPlan,
    machines: &[MachineSnapshot],
) -> std::collections::BTreeMap<String, Vec<(String, usize)>> {
    let mut out = std::collections::BTreeMap::new();
    for s in &p.services {
        let counts: Vec<(String, usize)> = machines
            .iter()
            .map(|m| {
                let n = s
                    .operations
                    .iter()
                    .filter(|op| {
                        matches!(op, Operation::RunContainer { .. })
                            && op.machine_id() == &m.machine.info.id
                    })
                    .count();
                (m.machine.info.name.to_string(), n)
            })
            .collect();
        out.insert(s.name.to_string(), counts);
    }
    out
}

fn counts(list: &[(&str, usize)]) -> Vec<(String, usize)> {
    list.iter().map(|(n, c)| (n.to_string(), *c)).collect()
}

#[test]
fn three_machines_get_a_replica_each_a_global_container_each_and_the_pinned_one_in_place() {
    let machines = [machine("m1"), machine("m2"), machine("m3")];
    let mut web = spec("web");
    web.replicas = 3;
    let mut agent = spec("agent");
    agent.mode = ServiceMode::Global;
    let mut db = spec("db");
    db.machines = vec!["m2".parse().unwrap()];
    let mut cache = spec("cache");
    // By Machine ID as well as by Name.
    cache.machines = vec![machines[2].machine.info.id.as_str().parse().unwrap()];
    let intent = DeployIntent::all(vec![web, agent, db, cache], vec![]);
    // Whatever the tiebreak draws.
    for seed in 0..32 {
        let p = plan(
            &intent,
            &machines,
            &PlanOptions {
                seed,
                ..Default::default()
            },
        )
        .unwrap();
        let runs = runs_per_machine(&p, &machines);
        assert_eq!(runs["web"], counts(&[("m1", 1), ("m2", 1), ("m3", 1)]));
        assert_eq!(runs["agent"], counts(&[("m1", 1), ("m2", 1), ("m3", 1)]));
        assert_eq!(runs["db"], counts(&[("m1", 0), ("m2", 1), ("m3", 0)]));
        assert_eq!(runs["cache"], counts(&[("m1", 0), ("m2", 0), ("m3", 1)]));
        let text = preview::render(
            &DeployPreview {
                plan: p,
                warnings: vec![],
                not_included: vec![],
            },
            &machines,
        );
        assert!(
            text.ends_with("8 create · 0 replace (start-first) · 0 replace (stop-first) · 0 remove · across 3 machines\n"),
            "{text}"
        );
        for name in ["m1", "m2", "m3"] {
            assert!(
                text.contains(&format!("+ run container on {name}\n")),
                "{text}"
            );
        }
    }
}

#[test]
fn scaling_from_three_to_five_over_three_machines_adds_two_on_different_machines() {
    let mut machines = [machine("m1"), machine("m2"), machine("m3")];
    let mut web = spec("web");
    web.replicas = 3;
    let id = ServiceId::generate();
    for m in &mut machines {
        add(m, &id, &web, ContainerState::Running);
    }
    // Unchanged: nothing to do.
    assert_eq!(plan_all(vec![web.clone()], &machines), Vec::<String>::new());
    web.replicas = 5;
    for seed in 0..32 {
        let p = plan(
            &DeployIntent::all(vec![web.clone()], vec![]),
            &machines,
            &PlanOptions {
                seed,
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(ops_of(&p), ["run", "run"], "seed {seed}");
        let on: std::collections::BTreeSet<_> =
            p.operations().map(|op| op.machine_id().clone()).collect();
        assert_eq!(on.len(), 2, "seed {seed}: both on one Machine");
    }
}

fn left_out(m: &MachineSnapshot) -> NotIncluded {
    NotIncluded {
        machine: m.machine.info.id.clone(),
        name: m.machine.info.name.to_string(),
        reason: "it did not answer".into(),
        edge_features: m
            .machine
            .info
            .published_edge_features()
            .map(<[String]>::to_vec),
        services: Vec::new(),
    }
}

#[test]
fn a_machine_not_included_is_planned_around_unless_a_service_is_pinned_to_it() {
    let machines = [machine("m1"), machine("m2"), machine("m3")];
    let (answered, gone) = machines.split_at(2);
    let opts = PlanOptions {
        not_included: vec![left_out(&gone[0])],
        ..Default::default()
    };
    let mut web = spec("web");
    web.replicas = 3;
    // Replicas go to the Machines that answered.
    let p = plan(
        &DeployIntent::all(vec![web.clone()], vec![]),
        answered,
        &opts,
    )
    .unwrap();
    let runs = runs_per_machine(&p, answered);
    assert_eq!(runs["web"].iter().map(|(_, n)| n).sum::<usize>(), 3);
    assert!(runs["web"].iter().all(|(_, n)| *n >= 1), "{runs:?}");
    let text = preview::render(
        &DeployPreview {
            plan: p,
            warnings: vec![],
            not_included: opts.not_included.clone(),
        },
        answered,
    );
    assert!(
        text.ends_with(&format!(
            "across 2 machines\nnot included: Machine m3 ({}): it did not answer; its containers are left as they are\n",
            gone[0].machine.info.id
        )),
        "{text}"
    );

    // Pinned there, by Name or ID: refused, naming the Machine and why, with the other
    // Services' problems.
    for target in ["m3", gone[0].machine.info.id.as_str()] {
        let mut db = spec("db");
        db.machines = vec![target.parse().unwrap()];
        let err = plan(
            &DeployIntent::all(vec![web.clone(), db], vec![]),
            answered,
            &opts,
        )
        .unwrap_err();
        assert_eq!(err.0.len(), 1, "{err}");
        assert!(matches!(
            err.0[0],
            PlanError::PinnedMachineNotIncluded { .. }
        ));
        assert_eq!(
            err.to_string(),
            "service 'db' names Machine m3 in x-machines, but this Deploy cannot include it (it did not answer); bring it back (`ployz machine ls` shows how the entry Machine observes it) or leave it out of x-machines"
        );
    }
}

#[test]
fn a_service_that_runs_only_on_a_machine_left_out_is_refused_not_planned_anew() {
    let machines = [machine("m1"), machine("m2"), machine("m3")];
    let (answered, gone) = machines.split_at(2);
    let mut db = spec("db");
    db.container.mounts = vec![Mount::Volume {
        source: "pgdata".into(),
        target: "/data".into(),
        read_only: false,
        no_copy: false,
    }];
    let volume = VolumeSpec {
        name: "pgdata".into(),
        driver: None,
        driver_opts: Default::default(),
        labels: Default::default(),
        external: false,
    };
    let intent = DeployIntent::all(vec![db.clone(), spec("web")], vec![volume]);
    let mut last_seen = left_out(&gone[0]);
    last_seen.services = vec!["db".into()];
    let opts = PlanOptions {
        not_included: vec![last_seen],
        ..Default::default()
    };
    let err = plan(&intent, answered, &opts).unwrap_err();
    assert_eq!(err.0.len(), 1, "{err}");
    assert!(
        matches!(err.0[0], PlanError::OnlyOnMachineNotIncluded { ref name, ref machine, .. } if name == "db" && machine == "m3"),
        "{err}"
    );
    // Not last seen there: a new Service, planned on the Machines that answered.
    let p = plan(
        &intent,
        answered,
        &PlanOptions {
            not_included: vec![left_out(&gone[0])],
            ..Default::default()
        },
    )
    .unwrap();
    assert!(p.operations().count() >= 2);
}

#[test]
fn a_machine_that_lacks_an_image_another_has_fetches_it_from_there_first() {
    let mut machines = [machine("a"), machine("b"), machine("c")];
    machines[1].images = vec!["app:1".into()];
    let (b, c) = (
        machines[1].machine.info.id.clone(),
        machines[2].machine.info.id.clone(),
    );
    let mut s = spec("web");
    s.mode = ServiceMode::Global;
    let mut hooked = spec("job");
    hooked.container.image = "tool".into();
    hooked.machines = vec![c.to_string().parse().unwrap()];
    machines[0].images = vec!["tool:latest".into()];
    let intent = DeployIntent::all(vec![s.clone(), hooked], vec![]);
    let p = plan(&intent, &machines, &PlanOptions::default()).unwrap();
    let mut got: Vec<(String, String, String)> = p
        .transfers
        .iter()
        .map(|t| {
            let name = |id: &MachineId| {
                machines
                    .iter()
                    .find(|m| &m.machine.info.id == id)
                    .unwrap()
                    .machine
                    .info
                    .name
                    .to_string()
            };
            (
                t.image.clone(),
                name(&t.machine_id),
                name(t.from.as_ref().expect("from a Machine")),
            )
        })
        .collect();
    got.sort();
    // Each Machine lacking an image fetches it once, from one that has it; `tool` means
    // `tool:latest`; the Machine that has `app:1` fetches nothing.
    assert_eq!(
        got,
        [
            ("app:1".to_owned(), "a".to_owned(), "b".to_owned()),
            ("app:1".to_owned(), "c".to_owned(), "b".to_owned()),
            ("tool:latest".to_owned(), "c".to_owned(), "a".to_owned()),
        ]
    );
    assert!(p
        .transfers
        .iter()
        .all(|t| t.machine_id != b || t.image != "app:1"));

    // `always` pulls from the registry; an image no Machine has is the registry's, as before.
    let mut always = s.clone();
    always.container.pull_policy = PullPolicy::Always;
    let p = plan(
        &DeployIntent::all(vec![always], vec![]),
        &machines,
        &PlanOptions::default(),
    )
    .unwrap();
    assert!(p.transfers.is_empty(), "{:?}", p.transfers);
    let mut nobody = spec("other");
    nobody.container.image = "elsewhere:2".into();
    let p = plan(
        &DeployIntent::all(vec![nobody], vec![]),
        &machines,
        &PlanOptions::default(),
    )
    .unwrap();
    assert!(p.transfers.is_empty());

    // An image the CLI built comes from its Docker, to each Machine that lacks it, even where
    // another Machine has it.
    let p = plan(
        &intent,
        &machines,
        &PlanOptions {
            built: vec!["app:1".into()],
            ..Default::default()
        },
    )
    .unwrap();
    let sent: Vec<_> = p
        .transfers
        .iter()
        .filter(|t| t.image == "app:1")
        .map(|t| (t.machine_id.clone(), t.from.clone()))
        .collect();
    assert_eq!(
        sent,
        [
            (machines[0].machine.info.id.clone(), None),
            (c.clone(), None)
        ]
    );

    // The preview shows each fetch as a step.
    let text = preview::render(
        &DeployPreview {
            plan: plan(&intent, &machines, &PlanOptions::default()).unwrap(),
            warnings: vec![],
            not_included: vec![],
        },
        &machines,
    );
    assert!(text.contains("⇣ fetch image app:1 on a from b"), "{text}");
}

mod binding {
    use super::*;
    use ployz_orchestrator::plan::binding::{Part, PlanBinding, PlanId};

    fn three_machines() -> (Vec<MachineSnapshot>, ServiceId, ServiceSpec) {
        let mut machines = vec![machine("m1"), machine("m2"), machine("m3")];
        let web = spec("web");
        let id = ServiceId::generate();
        for m in &mut machines {
            add(m, &id, &web, ContainerState::Running);
            m.images = vec!["app:1".into()];
            m.image_ids = [("app:1".to_owned(), "sha256:aaaa".to_owned())].into();
        }
        (machines, id, web)
    }

    fn id_of(intent: &DeployIntent, machines: &[MachineSnapshot]) -> PlanId {
        PlanBinding::of(intent, machines, &[], &[]).id()
    }

    #[test]
    fn the_same_facts_give_the_same_id_seed_and_operations() {
        let (machines, _, web) = three_machines();
        let mut more = spec("web");
        more.replicas = 5;
        let intent = DeployIntent::all(vec![more], vec![]);
        let a = PlanBinding::of(&intent, &machines, &[], &[]);
        let b = PlanBinding::of(&intent, &machines, &[], &[]);
        assert_eq!(a.id(), b.id());
        assert_eq!(a.seed(), b.seed());
        let plan_with = |seed| {
            let opts = PlanOptions {
                seed,
                ..PlanOptions::default()
            };
            ops_of(&plan(&intent, &machines, &opts).unwrap())
        };
        assert_eq!(plan_with(a.seed()), plan_with(b.seed()));
        // The id round-trips through its text.
        let text = a.id().to_string();
        assert!(
            text.starts_with("p1.") && text.len() == 3 + 5 * 9 - 1,
            "{text}"
        );
        assert_eq!(text.parse::<PlanId>().unwrap(), a.id());
        let _ = web;
    }

    #[test]
    fn each_kind_of_drift_moves_its_own_part() {
        let (machines, _, web) = three_machines();
        let intent = DeployIntent::all(vec![web.clone()], vec![]);
        let reviewed = id_of(&intent, &machines);

        // A Compose value changed.
        let mut changed = web.clone();
        changed.container.env.insert("MODE".into(), "b".into());
        let moved = reviewed.moved(&id_of(&DeployIntent::all(vec![changed], vec![]), &machines));
        assert_eq!(moved, vec![Part::Intent]);

        // A container removed by hand, or stopped.
        let mut removed = machines.clone();
        removed[1].containers.clear();
        assert_eq!(
            reviewed.moved(&id_of(&intent, &removed)),
            vec![Part::Containers]
        );
        let mut stopped = machines.clone();
        stopped[2].containers[0].state = ContainerState::Exited;
        assert_eq!(
            reviewed.moved(&id_of(&intent, &stopped)),
            vec![Part::Containers]
        );

        // The image's tag retagged to another image on one Machine.
        let mut retagged = machines.clone();
        retagged[0]
            .image_ids
            .insert("app:1".into(), "sha256:bbbb".into());
        assert_eq!(
            reviewed.moved(&id_of(&intent, &retagged)),
            vec![Part::Images]
        );

        // A Machine no longer answers: left out, with its containers and images.
        let left: Vec<MachineSnapshot> = machines[..2].to_vec();
        let gone = NotIncluded {
            machine: machines[2].machine.info.id.clone(),
            name: "m3".into(),
            reason: "observed down".into(),
            edge_features: None,
            services: Vec::new(),
        };
        let moved = reviewed.moved(&PlanBinding::of(&intent, &left, &[gone], &[]).id());
        assert!(moved.contains(&Part::Machines), "{moved:?}");

        // A container of a Service not attempted is not a fact of this plan.
        let mut other = machines.clone();
        add(
            &mut other[0],
            &ServiceId::generate(),
            &spec("db"),
            ContainerState::Running,
        );
        assert_eq!(reviewed.moved(&id_of(&intent, &other)), vec![]);
    }

    #[test]
    fn a_tag_no_machine_holds_is_unresolved_and_a_digest_is_not() {
        let (mut machines, _, mut web) = three_machines();
        for m in &mut machines {
            m.images.clear();
            m.image_ids.clear();
        }
        let intent = DeployIntent::all(vec![web.clone()], vec![]);
        let binding = PlanBinding::of(&intent, &machines, &[], &[]);
        assert_eq!(
            binding.unresolved(),
            ["app:1 on m1", "app:1 on m2", "app:1 on m3"]
        );
        // A Build Tag is bound by the build's inputs.
        let built = PlanBinding::of(&intent, &machines, &[], &["app:1".to_owned()]);
        assert!(built.unresolved().is_empty());
        web.container.image = format!("app@sha256:{}", "c".repeat(64));
        let binding = PlanBinding::of(&DeployIntent::all(vec![web], vec![]), &machines, &[], &[]);
        assert!(binding.unresolved().is_empty());
    }

    #[test]
    fn a_malformed_plan_id_is_refused_with_what_one_looks_like() {
        for bad in [
            "",
            "p2.00000000.00000000.00000000.00000000.00000000",
            "p1.0000000.00000000.00000000.00000000.00000000",
            "p1.00000000.00000000.00000000.00000000",
            "p1.00000000.00000000.00000000.00000000.00000000.00000000",
            "p1.0000000g.00000000.00000000.00000000.00000000",
        ] {
            let err = bad.parse::<PlanId>().unwrap_err();
            assert!(err.contains("ployz deploy --dry-run"), "{bad}: {err}");
        }
    }
}

/// What interrupted commands left: their containers carry the lease token the snapshot reports
/// as never released.
mod interrupted {
    use super::*;
    use ployz_core::api::InterruptedLease;
    use ployz_core::ContainerHealth;
    use ployz_orchestrator::plan::binding::{Part, PlanBinding};

    fn killed(token: u64) -> InterruptedLease {
        InterruptedLease {
            token,
            holder: "ci@runner (pid 4411)".into(),
            command: "deploy of web".into(),
            since_ms: 1_700_000_000_000,
        }
    }

    /// `web` v1 running; the killed command made a v2 container under lease 7 that is still
    /// waiting for its health check. Answers the machine and both names.
    fn half_done_replacement(
        health: ContainerHealth,
    ) -> (MachineSnapshot, ServiceSpec, String, String) {
        let mut m = machine("m1");
        let id = ServiceId::generate();
        let v1 = spec("web");
        let old = add(&mut m, &id, &v1, ContainerState::Running);
        let mut v2 = spec("web");
        v2.container.image = "app:2".into();
        let new = add(&mut m, &id, &v2, ContainerState::Running);
        let left = m.containers.last_mut().unwrap();
        left.lease_token = Some(7);
        left.health = Some(health);
        m.interrupted = vec![killed(7)];
        (m, v2, old, new)
    }

    #[test]
    fn an_unverified_container_left_is_not_kept_and_the_service_goes_through_its_gates_again() {
        let (m, v2, old, new) = half_done_replacement(ContainerHealth::Starting);
        let p = plan(
            &DeployIntent::all(vec![v2], vec![]),
            std::slice::from_ref(&m),
            &PlanOptions::default(),
        )
        .unwrap();
        // Without the review, the v2 container would count as up to date and v1 be removed
        // while nothing that serves replaced it.
        assert_eq!(
            ops_of(&p),
            [
                format!("replace {old} start-first"),
                format!("remove {new}")
            ]
        );
        assert_eq!(p.left_unverified.len(), 1);
        assert_eq!(p.left_unverified[0].container.name, new);
        assert_eq!(p.left_unverified[0].lease.token, 7);
        let shown = preview::render(
            &DeployPreview {
                plan: p,
                warnings: vec![],
                not_included: vec![],
            },
            &[m],
        );
        assert!(
            shown.contains(&format!("{new} on m1 (running (starting)) was left unverified by `deploy of web` by ci@runner (pid 4411) (lease 7,")),
            "{shown}"
        );
    }

    #[test]
    fn a_container_left_that_serves_is_kept_and_the_replacement_is_finished() {
        let (m, v2, old, _) = half_done_replacement(ContainerHealth::Healthy);
        let p = plan(
            &DeployIntent::all(vec![v2], vec![]),
            &[m],
            &PlanOptions::default(),
        )
        .unwrap();
        assert_eq!(ops_of(&p), [format!("remove {old}")]);
        assert!(p.left_unverified.is_empty());
    }

    #[test]
    fn a_token_no_interrupted_command_holds_changes_nothing() {
        let (mut m, v2, old, _) = half_done_replacement(ContainerHealth::Starting);
        m.interrupted.clear();
        let p = plan(
            &DeployIntent::all(vec![v2], vec![]),
            &[m],
            &PlanOptions::default(),
        )
        .unwrap();
        assert_eq!(ops_of(&p), [format!("remove {old}")]);
    }

    #[test]
    fn unfinished_work_on_a_service_this_deploy_does_not_apply_is_refused_with_the_evidence() {
        let (m, v2, old, new) = half_done_replacement(ContainerHealth::Starting);
        let other = spec("api");
        let intent = DeployIntent {
            services: vec![v2, other.clone()],
            attempts: vec![other.name.clone()],
            volumes: vec![],
        };
        let err = plan(&intent, std::slice::from_ref(&m), &PlanOptions::default()).unwrap_err();
        let e = err.iter().next().unwrap();
        assert!(matches!(e, PlanError::LeftUnfinished { .. }), "{e}");
        assert_eq!(e.service(), Some("web"));
        let text = e.to_string();
        for part in [
            "service 'web' on Machine m1 was left unfinished by `deploy of web` by ci@runner (pid 4411) (lease 7,",
            &format!("{new} (running (starting), created under lease 7)"),
            &format!("{old} (running, the container it was replacing, still there)"),
            "deploy 'web' too",
        ] {
            assert!(text.contains(part), "{part}\n{text}");
        }

        // Verified, but the container it replaced still runs beside it: still unfinished.
        let (m, v2, old, _) = half_done_replacement(ContainerHealth::Healthy);
        let intent = DeployIntent {
            services: vec![v2.clone(), other.clone()],
            attempts: vec![other.name.clone()],
            volumes: vec![],
        };
        let err = plan(&intent, std::slice::from_ref(&m), &PlanOptions::default()).unwrap_err();
        assert!(
            err.to_string()
                .contains(&format!("{old} (running, the container it was replacing")),
            "{err}"
        );

        // Finished: the replaced container is gone and the one left serves.
        let mut done = m.clone();
        done.containers.retain(|c| c.name != old);
        let p = plan(&intent, &[done], &PlanOptions::default()).unwrap();
        assert_eq!(ops_of(&p), ["run"]);

        // A Machine observed down is left alone, its leftovers too.
        let mut down = m;
        down.machine.membership = MembershipObservation::Down;
        let err = plan(&intent, &[down, machine("m2")], &PlanOptions::default());
        assert!(err.is_ok(), "{err:?}");
    }

    #[test]
    fn a_left_container_starting_to_serve_moves_the_plan_id() {
        let (m, v2, _, _) = half_done_replacement(ContainerHealth::Starting);
        let intent = DeployIntent::all(vec![v2], vec![]);
        let reviewed = PlanBinding::of(&intent, std::slice::from_ref(&m), &[], &[]).id();
        let mut now = m;
        now.containers.last_mut().unwrap().health = Some(ContainerHealth::Healthy);
        let moved = reviewed.moved(&PlanBinding::of(&intent, &[now], &[], &[]).id());
        assert_eq!(moved, [Part::Containers]);
    }
}

#[test]
fn an_ingress_port_is_refused_where_another_service_or_the_daemon_holds_it() {
    let stream = |published: u16, protocol: HostProtocol| PortSpec::Stream {
        published,
        container_port: published,
        protocol,
    };
    let mut a = machine("a");
    let b = machine("b");
    default_listeners(&mut a);
    let mut db = spec("db");
    db.ports = vec![stream(5432, HostProtocol::Tcp)];
    add(&mut a, &ServiceId::generate(), &db, ContainerState::Running);
    let mut cache = spec("cache");
    cache.ports = vec![PortSpec::Host {
        host_ip: None,
        host_port: Some(6379),
        container_port: 6379,
        protocol: HostProtocol::Tcp,
    }];
    add(
        &mut a,
        &ServiceId::generate(),
        &cache,
        ContainerState::Running,
    );
    let machines = [a, b];
    let refusal = |ports: Vec<PortSpec>| {
        let mut s = spec("other");
        s.ports = ports;
        plan(
            &DeployIntent::all(vec![s], vec![]),
            &machines,
            &PlanOptions::default(),
        )
        .map(|_| ())
        .map_err(|e| e.iter().next().unwrap().to_string())
    };
    // Free ports, and the same port in the other protocol: planned.
    assert_eq!(refusal(vec![stream(15432, HostProtocol::Tcp)]), Ok(()));
    assert_eq!(refusal(vec![stream(5432, HostProtocol::Udp)]), Ok(()));
    // Another Service's Ingress Port, as an Ingress Port or a host port on any Machine.
    let e = refusal(vec![stream(5432, HostProtocol::Tcp)]).unwrap_err();
    assert!(
        e.starts_with("service 'other' takes port 5432/tcp, which Service 'db' (")
            && e.contains("(as an Ingress Port); an Ingress Port is held on every Machine's edge"),
        "{e}"
    );
    let e = refusal(vec![PortSpec::Host {
        host_ip: Some("10.0.0.7".into()),
        host_port: Some(5432),
        container_port: 5432,
        protocol: HostProtocol::Tcp,
    }])
    .unwrap_err();
    assert!(e.contains("Service 'db'"), "{e}");
    // Another Service's host port: an edge would bind it on every Machine.
    let e = refusal(vec![stream(6379, HostProtocol::Tcp)]).unwrap_err();
    assert!(
        e.contains("Service 'cache'") && e.contains("(as a host port)"),
        "{e}"
    );
    // The daemon's own listeners: the edge's HTTP port on Machine a.
    let e = refusal(vec![stream(80, HostProtocol::Tcp)]).unwrap_err();
    assert!(
        e.starts_with("service 'other' publishes Ingress Port 80/tcp, which the daemon's")
            && e.contains("on Machine a"),
        "{e}"
    );
}

/// Every Machine's edge serves every Service's hostnames: a Service whose routes need an Edge
/// Feature is refused while a Machine does not publish it (a daemon from before the feature
/// would serve a `basic_auth` route openly), left-out Machines included; a Service that needs
/// none deploys beside such a Machine.
#[test]
fn a_service_needing_an_edge_feature_is_refused_while_a_machine_does_not_publish_it() {
    let route = |path: &str| ployz_core::RouteSpec {
        hostname: "app.example.com".into(),
        path: ployz_core::PathMatch::Prefix(path.into()),
        ..Default::default()
    };
    let plain = {
        let mut s = spec("plain");
        s.routes = vec![route("/")];
        s
    };
    let by_path = {
        let mut s = spec("api");
        s.routes = vec![route("/api")];
        s
    };
    let guarded = {
        let mut s = spec("admin");
        let mut r = route("/admin");
        r.basic_auth = Some(ployz_core::BasicAuth::new(
            "admins".into(),
            ployz_core::SecretValue::new(b"ana:$2y$05$abcdefghijklmnopqrstuu".to_vec()),
        ));
        s.routes = vec![r];
        s
    };
    let tcp = {
        let mut s = spec("db");
        s.ports = vec![PortSpec::Stream {
            published: 5432,
            container_port: 5432,
            protocol: HostProtocol::Tcp,
        }];
        s
    };
    assert!(plain.edge_features().is_empty());
    assert_eq!(
        guarded.edge_features().into_iter().collect::<Vec<_>>(),
        [EdgeFeature::Routes, EdgeFeature::RouteAuth]
    );
    let outcome =
        |machines: &[MachineSnapshot], not_included: Vec<NotIncluded>, s: &ServiceSpec| {
            plan(
                &DeployIntent::all(vec![s.clone()], vec![]),
                machines,
                &PlanOptions {
                    not_included,
                    ..PlanOptions::default()
                },
            )
            .map(|_| ())
            .map_err(|e| {
                e.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("\n")
            })
        };

    // Every Machine current: all four planned.
    let current = [machine("a"), machine("b")];
    for s in [&plain, &by_path, &guarded, &tcp] {
        assert_eq!(outcome(&current, vec![], s), Ok(()), "{}", s.name);
    }

    // Machine b's daemon predates Edge Features: its snapshot, as that release sends it, has
    // no such field.
    let old: MachineSnapshot = {
        let mut v = serde_json::to_value(machine("b")).unwrap();
        assert!(v["machine"]
            .as_object_mut()
            .unwrap()
            .remove("edge_features")
            .is_some());
        serde_json::from_value(v).unwrap()
    };
    let mixed = [machine("a"), old];
    assert_eq!(outcome(&mixed, vec![], &plain), Ok(()));
    let e = outcome(&mixed, vec![], &guarded).unwrap_err();
    assert!(
        e.starts_with(
            "service 'admin' uses x-routes, which the edge of Machine b does not enforce (its daemon, release '0.1.0', publishes none): every Machine's edge serves the Service's hostnames"
        ) && e.contains("upgrade Ployz on b first (`ployz machine upgrade`)"),
        "{e}"
    );
    assert!(outcome(&mixed, vec![], &by_path).is_err());
    let e = outcome(&mixed, vec![], &tcp).unwrap_err();
    assert!(
        e.starts_with("service 'db' uses an Ingress Port (a tcp or udp entry in x-ports), which the edge of Machine b"),
        "{e}"
    );

    // b knows routes but not basic_auth: the feature it lacks is the one named.
    let mut older = machine("b");
    older.machine.info.edge_features = vec!["routes".into(), "some-later-feature".into()];
    let mixed = [machine("a"), older];
    assert_eq!(outcome(&mixed, vec![], &by_path), Ok(()));
    let e = outcome(&mixed, vec![], &guarded).unwrap_err();
    assert!(
        e.starts_with("service 'admin' uses basic_auth in x-routes, which the edge of Machine b does not enforce (its daemon, release '0.1.0', publishes routes, some-later-feature)"),
        "{e}"
    );

    // A Machine left out of the Deploy counts by its last record; one whose record was not
    // read says nothing.
    let a = machine("a");
    let mut gone = left_out(&machine("c"));
    gone.edge_features = Some(Vec::new());
    let e = outcome(std::slice::from_ref(&a), vec![gone.clone()], &guarded).unwrap_err();
    assert!(
        e.contains("the edge of Machine c does not enforce (it is left out of this Deploy, and its last record publishes none)"),
        "{e}"
    );
    gone.edge_features = None;
    assert_eq!(
        outcome(std::slice::from_ref(&a), vec![gone], &guarded),
        Ok(())
    );
    let current_gone = left_out(&machine("c"));
    assert_eq!(
        outcome(std::slice::from_ref(&a), vec![current_gone], &guarded),
        Ok(())
    );
}
