//! The edge's hot-path host match: 10,000 Ingress Hostnames, mixed-case Host headers with a
//! port; a path among 10,000 `x-routes` prefixes of one hostname; and what every request adds to the metrics. Also counts heap allocations per match
//! and per metrics observation (both must be zero).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use ployz_core::{
    ContainerKind, ContainerRuntimeObservation, ContainerSpec, ContainerState, IngressProtocol,
    MachineId, PathMatch, PortSpec, RouteSpec, ServiceId, ServiceMode, ServiceSpec,
};
use ployz_edge::metrics::EdgeMetrics;
use ployz_edge::RouteTable;

struct Counting;
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// `n` Services, each with its own hostname; `paths`: instead, all on one hostname, each at
/// its own `x-routes` prefix `/team-<i % 97>/svc-<i>` (and one serving the whole host).
fn table(n: usize, paths: bool) -> RouteTable {
    let machine = MachineId::generate();
    let observations: Vec<ContainerRuntimeObservation> = (0..n)
        .map(|i| ContainerRuntimeObservation {
            id: format!("{i:064x}").parse().unwrap(),
            name: format!("svc-{i}-abcd"),
            machine_id: machine.clone(),
            service_id: ServiceId::generate(),
            service_name: format!("svc-{i}").parse().unwrap(),
            kind: ContainerKind::Service,
            state: ContainerState::Running,
            health: None,
            restart_count: 0,
            address: Some(std::net::Ipv4Addr::new(
                10,
                210,
                (i / 250) as u8,
                (i % 250) as u8 + 2,
            )),
            image: "app".into(),
            created_at: 0,
            spec: Some(ServiceSpec {
                name: format!("svc-{i}").parse().unwrap(),
                mode: ServiceMode::Replicated,
                replicas: 1,
                container: ContainerSpec::default(),
                ports: vec![PortSpec::Ingress {
                    hostname: Some(if paths {
                        "shop.example.com".to_owned()
                    } else {
                        format!("app-{i}.customer-{}.example.com", i % 97)
                    }),
                    published: None,
                    container_port: 8080,
                    protocol: IngressProtocol::Https,
                }],
                machines: vec![],
                update: Default::default(),
                pre_deploy: None,
                depends_on: vec![],
                revisions: None,
                routes: if paths && i > 0 {
                    vec![RouteSpec {
                        hostname: "shop.example.com".into(),
                        path: PathMatch::Prefix(format!("/team-{}/svc-{i}", i % 97)),
                        strip_prefix: true,
                        redirect: None,
                        request_headers: Default::default(),
                        response_headers: Default::default(),
                        allow: vec![],
                        ..Default::default()
                    }]
                } else {
                    vec![]
                },
            }),
            plan_id: None,
            lease_token: None,
        })
        .collect();
    RouteTable::build(
        &observations,
        &Default::default(),
        (&machine, &Default::default()),
        &ployz_edge::route_table::FreshCounters,
        1,
    )
}

fn bench(c: &mut Criterion) {
    let t = table(10_000, false);
    assert_eq!(t.len(), 10_000);
    let host = b"App-7321.Customer-46.Example.COM:443";
    assert!(t.match_host(host).is_some());
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    for _ in 0..1000 {
        black_box(t.match_host(black_box(host)));
        black_box(t.match_host(black_box(b"unknown.example.com")));
    }
    let per_match = (ALLOCATIONS.load(Ordering::Relaxed) - before) as f64 / 2000.0;
    assert_eq!(per_match, 0.0, "match_host allocated");
    println!("route/match allocations per match: {per_match}");
    c.bench_function("route/match_hit_10k_hosts", |b| {
        b.iter(|| black_box(t.match_host(black_box(host))))
    });
    // As browsers send it: lowercase, no port (looked up without a copy).
    let as_sent = b"app-7321.customer-46.example.com";
    assert!(t.match_host(as_sent).is_some());
    c.bench_function("route/match_hit_as_sent_10k_hosts", |b| {
        b.iter(|| black_box(t.match_host(black_box(as_sent))))
    });
    c.bench_function("route/match_miss_10k_hosts", |b| {
        b.iter(|| black_box(t.match_host(black_box(b"unknown.example.com"))))
    });
    let route = t.match_host(host).unwrap().clone();
    c.bench_function("route/pick_round_robin", |b| {
        b.iter(|| black_box(route.pick(black_box(0), &[])))
    });

    // Paths: 10,000 Services on one hostname, each at its own prefix.
    let t = table(10_000, true);
    assert_eq!(t.routes().count(), 10_000);
    let deep = b"/team-46/svc-7321/orders/2026/12?page=2";
    let routed = |target: &[u8]| {
        t.match_request(b"shop.example.com", target)
            .map(|r| r.service.to_string())
    };
    assert_eq!(routed(deep).as_deref(), Some("svc-7321"));
    assert_eq!(routed(b"/team-46/svc-7321").as_deref(), Some("svc-7321"));
    assert_eq!(routed(b"/team-46/nothing/here").as_deref(), Some("svc-0"));
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    for _ in 0..1000 {
        black_box(t.match_request(black_box(b"shop.example.com"), black_box(deep)));
        black_box(t.match_request(
            black_box(b"Shop.Example.com:443"),
            black_box(b"/team-1/none/a/b/c/d"),
        ));
    }
    let per_match = (ALLOCATIONS.load(Ordering::Relaxed) - before) as f64 / 2000.0;
    assert_eq!(per_match, 0.0, "match_request allocated");
    println!("route/path match allocations per match: {per_match}");
    c.bench_function("route/path_prefix_hit_10k_routes", |b| {
        b.iter(|| black_box(t.match_request(black_box(b"shop.example.com"), black_box(deep))))
    });
    c.bench_function("route/path_fallback_to_host_10k_routes", |b| {
        b.iter(|| {
            black_box(t.match_request(
                black_box(b"shop.example.com"),
                black_box(b"/team-1/none/a/b/c/d"),
            ))
        })
    });
    c.bench_function("route/path_root_10k_routes", |b| {
        b.iter(|| black_box(t.match_request(black_box(b"shop.example.com"), black_box(b"/"))))
    });

    let metrics = EdgeMetrics::default();
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    for i in 0..1000u16 {
        metrics.observe(200 + (i % 4) * 100, 0.002, i % 7 == 0);
    }
    let per_observation = (ALLOCATIONS.load(Ordering::Relaxed) - before) as f64 / 1000.0;
    assert_eq!(per_observation, 0.0, "EdgeMetrics::observe allocated");
    println!("metrics/observe allocations per request: {per_observation}");
    c.bench_function("metrics/observe_per_request", |b| {
        b.iter(|| metrics.observe(black_box(200), black_box(0.0021), black_box(false)))
    });
    c.bench_function("metrics/render_scrape", |b| {
        b.iter(|| black_box(metrics.render(black_box(7), black_box(10_000))))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
