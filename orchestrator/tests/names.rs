//! Service Names in the planner and the preview: a Service whose DNS name another deployed
//! Service already answers at is refused, and the preview shows the DNS name when it is not the
//! Service Name.

use ployz_core::api::{MachineInfo, MachineView};
use ployz_core::{
    ClusterNetwork, ContainerKind, ContainerRuntimeObservation, ContainerSpec, ContainerState,
    DeployIntent, DeployPreview, LocalMachinePhase, MachineId, MachineSnapshot, ManagementAddress,
    MembershipObservation, ServiceId, ServiceMode, ServiceSpec, UpdateConfig,
};
use ployz_orchestrator::plan::{plan, PlanError, PlanOptions};
use ployz_orchestrator::preview;

fn machine(name: &str) -> MachineSnapshot {
    MachineSnapshot {
        machine: MachineView {
            info: MachineInfo {
                id: MachineId::generate(),
                name: name.parse().unwrap(),
                phase: LocalMachinePhase::Participating,
                subnet: ClusterNetwork::default().first_free_subnet(&[]).unwrap(),
                public_key: String::new(),
                management_address: ManagementAddress::from_public_key(&[0; 32]),
            },
            membership: MembershipObservation::Up,
        },
        containers: vec![],
        volumes: vec![],
        images: vec![],
        drains: vec![],
        listeners: vec![],
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
    }
}

/// Adds a running container of `spec` to `m`.
fn add(m: &mut MachineSnapshot, service_id: &ServiceId, spec: &ServiceSpec) {
    let n = m.containers.len() + 1;
    m.containers.push(ContainerRuntimeObservation {
        id: format!("{n:064x}").parse().unwrap(),
        name: format!("{}-{n:04}", spec.name.container_stem()),
        machine_id: m.machine.info.id.clone(),
        service_id: service_id.clone(),
        service_name: spec.name.clone(),
        kind: ContainerKind::Service,
        state: ContainerState::Running,
        health: None,
        restart_count: 0,
        address: Some("10.210.0.2".parse().unwrap()),
        image: spec.container.image.clone(),
        created_at: n as i64,
        spec: Some(spec.clone()),
    });
}

#[test]
fn a_dns_name_another_deployed_service_has_is_refused_naming_it() {
    let mut m = machine("a");
    let owner = ServiceId::generate();
    add(&mut m, &owner, &spec("my-app"));
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
    add(&mut m, &id, &spec("my_app"));
    // The same Service again, and a Service with another label, plan as usual.
    let mut changed = spec("my_app");
    changed.container.image = "app:2".into();
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
