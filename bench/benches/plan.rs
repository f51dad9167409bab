//! The Deploy planner on 200 Services of 2 replicas each, all already up to date (the common
//! redeploy), and all new.

use criterion::{criterion_group, criterion_main, Criterion};
use ployz_core::api::{MachineInfo, MachineView};
use ployz_core::{
    ClusterNetwork, ContainerKind, ContainerRuntimeObservation, ContainerSpec, ContainerState,
    DeployIntent, LocalMachinePhase, MachineId, MachineSnapshot, ManagementAddress,
    MembershipObservation, ServiceId, ServiceMode, ServiceSpec, UpdateConfig,
};
use ployz_orchestrator::plan::{plan, PlanOptions};

fn spec(i: usize) -> ServiceSpec {
    ServiceSpec {
        name: format!("svc-{i}").parse().unwrap(),
        mode: ServiceMode::Replicated,
        replicas: 2,
        container: ContainerSpec {
            image: format!("app:{i}"),
            env: (0..10)
                .map(|k| (format!("K{k}"), format!("v{k}")))
                .collect(),
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

fn machine() -> MachineSnapshot {
    let net = ClusterNetwork::default();
    MachineSnapshot {
        machine: MachineView {
            info: MachineInfo {
                id: MachineId::generate(),
                name: "m1".parse().unwrap(),
                phase: LocalMachinePhase::Participating,
                subnet: net.first_free_subnet(&[]).unwrap(),
                public_key: String::new(),
                management_address: ManagementAddress::from_public_key(&[0; 32]),
                endpoints: Vec::new(),
                version: String::new(),
                wireguard_backend: None,
                edge_features: ployz_core::EdgeFeature::published(),
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

fn bench(c: &mut Criterion) {
    let services: Vec<ServiceSpec> = (0..200).map(spec).collect();
    let intent = DeployIntent::all(services.clone(), vec![]);
    let empty = vec![machine()];
    let mut full = machine();
    let mut n = 0u64;
    for s in &services {
        let id = ServiceId::generate();
        for _ in 0..2 {
            n += 1;
            full.containers.push(ContainerRuntimeObservation {
                id: format!("{n:064x}").parse().unwrap(),
                name: format!("{}-{n}", s.name),
                machine_id: full.machine.info.id.clone(),
                service_id: id.clone(),
                service_name: s.name.clone(),
                kind: ContainerKind::Service,
                state: ContainerState::Running,
                health: None,
                restart_count: 0,
                address: None,
                image: s.container.image.clone(),
                created_at: n as i64,
                spec: Some(s.clone()),
                plan_id: None,
                lease_token: None,
            });
        }
    }
    let full = vec![full];
    let opts = PlanOptions::default();
    assert!(plan(&intent, &full, &opts).unwrap().is_empty());
    c.bench_function("plan/200_services_up_to_date", |b| {
        b.iter(|| plan(&intent, &full, &opts).unwrap())
    });
    c.bench_function("plan/200_services_new", |b| {
        b.iter(|| plan(&intent, &empty, &opts).unwrap())
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
