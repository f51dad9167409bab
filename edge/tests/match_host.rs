//! `match_host` against a plain reference implementation, on arbitrary Host header bytes:
//! never panics, and finds exactly the routes the reference finds.

use std::collections::HashSet;

use ployz_core::{
    ContainerKind, ContainerRuntimeObservation, ContainerSpec, ContainerState, IngressProtocol,
    MachineId, PortSpec, ServiceId, ServiceMode, ServiceSpec,
};
use ployz_edge::route_table::FreshCounters;
use ployz_edge::RouteTable;
use proptest::prelude::*;

const HOSTS: [&str; 4] = [
    "app.test",
    "a.b.c.example.com",
    "x-1.io",
    "localhost.localdomain",
];

fn table() -> RouteTable {
    let m = MachineId::generate();
    let obs: Vec<ContainerRuntimeObservation> = HOSTS
        .iter()
        .enumerate()
        .map(|(i, h)| ContainerRuntimeObservation {
            id: format!("{i:064x}").parse().unwrap(),
            name: format!("s{i}"),
            machine_id: m.clone(),
            service_id: ServiceId::generate(),
            service_name: format!("s{i}").parse().unwrap(),
            kind: ContainerKind::Service,
            state: ContainerState::Running,
            health: None,
            restart_count: 0,
            address: Some(std::net::Ipv4Addr::new(10, 210, 0, i as u8 + 2)),
            image: "x".into(),
            created_at: 0,
            spec: Some(ServiceSpec {
                name: format!("s{i}").parse().unwrap(),
                mode: ServiceMode::Replicated,
                replicas: 1,
                container: ContainerSpec::default(),
                ports: vec![PortSpec::Ingress {
                    hostname: Some((*h).into()),
                    published: None,
                    container_port: 80,
                    protocol: IngressProtocol::Http,
                }],
                machines: vec![],
                update: Default::default(),
                pre_deploy: None,
                depends_on: vec![],
                revisions: None,
                routes: vec![],
            }),
            plan_id: None,
            lease_token: None,
        })
        .collect();
    RouteTable::build(
        &obs,
        &HashSet::new(),
        (&m, &HashSet::new()),
        &FreshCounters,
        1,
    )
}

/// The reference: a name of letters, digits, `.`, `-` and `_` with an optional port of one to
/// five digits, else nothing; then strip the port and one trailing dot, lowercase, compare.
fn reference(host: &[u8]) -> Option<&'static str> {
    let text = String::from_utf8_lossy(host).to_string();
    let (name, port) = match text.split_once(':') {
        Some((n, p)) => (n, Some(p)),
        None => (&text[..], None),
    };
    if port.is_some_and(|p| p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()))
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    {
        return None;
    }
    let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
    HOSTS
        .iter()
        .copied()
        .find(|h| *h == name && name.len() <= 253)
}

fn variants() -> impl Strategy<Value = Vec<u8>> {
    let known = prop::sample::select(HOSTS.to_vec()).prop_flat_map(|h| {
        (
            Just(h),
            any::<bool>(),
            any::<bool>(),
            proptest::option::of(0u16..65535),
            any::<u64>(),
            prop::sample::select(vec![
                "",
                "",
                "",
                "@evil.test",
                ":1@evil",
                ":",
                ":123456",
                " x",
            ]),
        )
            .prop_map(|(h, upper, dot, port, flips, tail)| {
                let mut s: Vec<u8> = h.bytes().collect();
                if upper {
                    for (i, b) in s.iter_mut().enumerate() {
                        if flips >> (i % 64) & 1 == 1 {
                            *b = b.to_ascii_uppercase();
                        }
                    }
                }
                if dot {
                    s.push(b'.');
                }
                if let Some(p) = port {
                    s.extend_from_slice(format!(":{p}").as_bytes());
                }
                s.extend_from_slice(tail.as_bytes());
                s
            })
    });
    prop_oneof![known, prop::collection::vec(any::<u8>(), 0..300)]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn match_host_agrees_with_the_reference(host in variants()) {
        let t = table();
        let got = t.match_host(&host).map(|r| r.hostname.to_string());
        let want = reference(&host).map(str::to_owned);
        // Non-UTF-8 bytes can never equal a hostname; the reference's lossy decoding agrees.
        prop_assert_eq!(got, want, "host {:?}", String::from_utf8_lossy(&host));
    }
}
