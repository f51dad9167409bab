//! Which Ingress Hostnames want Certificate Material, and when material is renewed. Pure
//! functions of observations, stored material, the Certificate Policy and the time.

use std::collections::{BTreeMap, BTreeSet};

use ployz_core::{
    CertificateMaterial, CertificatePolicy, ContainerKind, ContainerRuntimeObservation,
    IngressProtocol, PortSpec,
};

use ployz_core::{covers, read_leaf};

/// Whether `hostname` is a name an HTTP-01 order can be placed for: a lowercase DNS name of at
/// least two labels, not a wildcard (HTTP-01 cannot validate those), not an IP address.
pub fn orderable(hostname: &str) -> bool {
    if hostname.len() > 253 || hostname.parse::<std::net::IpAddr>().is_ok() {
        return false;
    }
    let labels: Vec<&str> = hostname.split('.').collect();
    labels.len() >= 2
        && labels.iter().all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        })
}

/// The Ingress Hostnames published over https by running Service containers (lowercase, without
/// a trailing dot; names that cannot be ordered over HTTP-01 are left out).
pub fn ingress_https_hostnames(observations: &[ContainerRuntimeObservation]) -> BTreeSet<String> {
    observations
        .iter()
        .filter(|o| o.kind == ContainerKind::Service && o.is_running())
        .filter_map(|o| o.spec.as_ref())
        .flat_map(|spec| spec.ports.iter())
        .filter_map(|p| match p {
            PortSpec::Ingress {
                hostname: Some(h),
                protocol: IngressProtocol::Https,
                ..
            } => Some(h.trim_end_matches('.').to_ascii_lowercase()),
            _ => None,
        })
        .filter(|h| orderable(h))
        .collect()
}

/// The renewal point of a certificate valid from `not_before` to `not_after` (Unix seconds):
/// when `fraction` of its lifetime has passed. Never later than `not_after`.
pub fn renewal_point(not_before: i64, not_after: i64, fraction: f64) -> i64 {
    let lifetime = (not_after - not_before).max(0) as f64;
    let offset = (lifetime * fraction.clamp(0.0, 1.0)).floor() as i64;
    (not_before + offset).min(not_after)
}

/// Why a hostname wants (new) Certificate Material.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Need {
    /// No material is stored.
    Missing,
    /// The stored material does not parse.
    Unreadable(String),
    /// The stored material's leaf does not cover the hostname.
    NotCovered {
        /// The names it covers.
        names: Vec<String>,
    },
    /// The renewal point has passed (or the material expired).
    Renewal {
        /// The renewal point, Unix seconds.
        renew_at: i64,
        /// The material's expiry, Unix seconds.
        not_after: i64,
    },
}

/// Current material that needs nothing yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Current {
    /// Expiry, Unix seconds.
    pub not_after: i64,
    /// Renewal point, Unix seconds.
    pub renew_at: i64,
}

/// The state of every hostname of a set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Assessment {
    /// Hostnames that want material, and why.
    pub wanted: BTreeMap<String, Need>,
    /// Hostnames whose material is current, with its renewal point.
    pub current: BTreeMap<String, Current>,
}

impl Assessment {
    /// The earliest renewal point of current material, if any.
    pub fn next_renewal(&self) -> Option<i64> {
        self.current.values().map(|c| c.renew_at).min()
    }
}

/// Assesses `hostnames` against stored `materials` under `policy` at `now_unix`.
pub fn assess(
    hostnames: &BTreeSet<String>,
    materials: &BTreeMap<String, CertificateMaterial>,
    policy: &CertificatePolicy,
    now_unix: i64,
) -> Assessment {
    let mut out = Assessment::default();
    for h in hostnames {
        let need = match materials.get(h) {
            None => Some(Need::Missing),
            Some(m) => match read_leaf(&m.chain_pem) {
                Err(e) => Some(Need::Unreadable(e.to_string())),
                Ok(leaf) if !leaf.names.iter().any(|n| covers(n, h)) => {
                    Some(Need::NotCovered { names: leaf.names })
                }
                Ok(leaf) => {
                    // Imported material is the user's choice: replaced only once it expires.
                    let renew_at = if m.imported {
                        leaf.not_after
                    } else {
                        renewal_point(leaf.not_before, leaf.not_after, policy.renewal_fraction())
                    };
                    if now_unix >= renew_at {
                        Some(Need::Renewal {
                            renew_at,
                            not_after: leaf.not_after,
                        })
                    } else {
                        out.current.insert(
                            h.clone(),
                            Current {
                                not_after: leaf.not_after,
                                renew_at,
                            },
                        );
                        None
                    }
                }
            },
        };
        if let Some(need) = need {
            out.wanted.insert(h.clone(), need);
        }
    }
    out
}

/// The Ingress Hostnames that want Certificate Material: published over https by a running
/// Service container, and without material, with material that does not cover the name, or with
/// material past the policy's renewal point.
pub fn wanted_hostnames(
    observations: &[ContainerRuntimeObservation],
    materials: &BTreeMap<String, CertificateMaterial>,
    policy: &CertificatePolicy,
    now_unix: i64,
) -> BTreeMap<String, Need> {
    assess(
        &ingress_https_hostnames(observations),
        materials,
        policy,
        now_unix,
    )
    .wanted
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use ployz_core::{
        ContainerId, ContainerSpec, ContainerState, MachineId, ServiceId, ServiceSpec,
    };

    /// A self-signed certificate for `names`, valid between the two Unix times, and its key.
    pub(crate) fn self_signed(names: &[&str], not_before: i64, not_after: i64) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params =
            rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        params.not_before = rcgen::date_time_ymd(1970, 1, 1)
            + std::time::Duration::from_secs(not_before.max(0) as u64);
        params.not_after = rcgen::date_time_ymd(1970, 1, 1)
            + std::time::Duration::from_secs(not_after.max(0) as u64);
        let cert = params.self_signed(&key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    /// An observation of a container of `kind` in `state` publishing `ports`.
    pub(crate) fn observation(
        ports: Vec<PortSpec>,
        kind: ContainerKind,
        state: ContainerState,
    ) -> ContainerRuntimeObservation {
        let spec: ServiceSpec = serde_json::from_value(serde_json::json!({
            "name": "web",
            "container": ContainerSpec { image: "busybox".into(), ..Default::default() },
        }))
        .unwrap();
        ContainerRuntimeObservation {
            id: MachineId::generate()
                .as_str()
                .parse::<ContainerId>()
                .unwrap(),
            name: "web-abcd".into(),
            machine_id: MachineId::generate(),
            service_id: ServiceId::generate(),
            service_name: "web".parse().unwrap(),
            kind,
            state,
            health: None,
            restart_count: 0,
            address: None,
            image: "busybox".into(),
            created_at: 0,
            spec: Some(ServiceSpec { ports, ..spec }),
            plan_id: None,
            lease_token: None,
        }
    }

    /// An Ingress port for `host` over `protocol`.
    pub(crate) fn ingress(host: &str, protocol: IngressProtocol) -> PortSpec {
        PortSpec::Ingress {
            hostname: Some(host.into()),
            published: None,
            container_port: 8080,
            protocol,
        }
    }

    #[test]
    fn only_https_ingress_of_running_service_containers_counts() {
        use ContainerKind::*;
        use ContainerState::*;
        let obs = vec![
            observation(
                vec![
                    ingress("App.Test.", IngressProtocol::Https),
                    ingress("plain.test", IngressProtocol::Http),
                ],
                Service,
                Running,
            ),
            observation(
                vec![ingress("stopped.test", IngressProtocol::Https)],
                Service,
                Exited,
            ),
            observation(
                vec![ingress("hook.test", IngressProtocol::Https)],
                Hook,
                Running,
            ),
            observation(
                vec![ingress("*.wild.test", IngressProtocol::Https)],
                Service,
                Running,
            ),
            observation(
                vec![ingress("localhost", IngressProtocol::Https)],
                Service,
                Running,
            ),
            observation(
                vec![ingress("b.test", IngressProtocol::Https)],
                Service,
                Running,
            ),
            observation(
                vec![ingress("app.test", IngressProtocol::Https)],
                Service,
                Running,
            ),
            observation(
                vec![PortSpec::Ingress {
                    hostname: None,
                    published: None,
                    container_port: 80,
                    protocol: IngressProtocol::Https,
                }],
                Service,
                Running,
            ),
        ];
        let mut no_spec = observation(vec![], Service, Running);
        no_spec.spec = None;
        let mut all = obs.clone();
        all.push(no_spec);
        let hosts: Vec<String> = ingress_https_hostnames(&all).into_iter().collect();
        assert_eq!(hosts, ["app.test", "b.test"]);
    }

    #[test]
    fn imported_material_is_left_alone_until_it_expires() {
        let obs = vec![observation(
            vec![ingress("mine.test", IngressProtocol::Https)],
            ContainerKind::Service,
            ContainerState::Running,
        )];
        let (chain, key) = self_signed(&["mine.test"], 0, 1_500);
        let material = |imported| {
            BTreeMap::from([(
                "mine.test".to_owned(),
                CertificateMaterial {
                    hostname: "mine.test".into(),
                    chain_pem: chain.clone(),
                    key_pem: key.clone(),
                    not_after: 1_500,
                    names: vec!["mine.test".into()],
                    imported,
                },
            )])
        };
        let policy = CertificatePolicy::default();
        // Past two thirds of its lifetime: issued material is due, imported material is not.
        assert!(wanted_hostnames(&obs, &material(false), &policy, 1_200).contains_key("mine.test"));
        assert!(wanted_hostnames(&obs, &material(true), &policy, 1_200).is_empty());
        // Expired, it is replaced whatever its origin.
        assert!(wanted_hostnames(&obs, &material(true), &policy, 1_500).contains_key("mine.test"));
    }

    #[test]
    fn renewal_point_is_the_fraction_of_the_lifetime() {
        assert_eq!(renewal_point(0, 90, 2.0 / 3.0), 60);
        assert_eq!(
            renewal_point(1_000, 1_000 + 90 * 86_400, 2.0 / 3.0),
            1_000 + 60 * 86_400
        );
        assert_eq!(renewal_point(100, 200, 0.5), 150);
        assert_eq!(renewal_point(100, 200, 1e-9), 100);
        assert_eq!(renewal_point(100, 200, 0.999), 199);
        // A certificate whose validity is inverted renews at once.
        assert_eq!(renewal_point(200, 100, 0.5), 100);
    }

    #[test]
    fn hostnames_want_material_when_missing_uncovering_unreadable_or_due() {
        let obs = vec![observation(
            [
                "fresh.test",
                "due.test",
                "missing.test",
                "wrong.test",
                "broken.test",
            ]
            .into_iter()
            .map(|h| ingress(h, IngressProtocol::Https))
            .collect(),
            ContainerKind::Service,
            ContainerState::Running,
        )];
        let mut materials = BTreeMap::new();
        let mut add = |host: &str, names: &[&str], nb: i64, na: i64| {
            let (chain, key) = self_signed(names, nb, na);
            materials.insert(
                host.to_owned(),
                CertificateMaterial {
                    hostname: host.into(),
                    chain_pem: chain,
                    key_pem: key,
                    not_after: na,
                    names: names.iter().map(|n| n.to_string()).collect(),
                    imported: false,
                },
            );
        };
        // Lifetime 900 s from t=1000: default renewal point at 1600.
        add("fresh.test", &["fresh.test"], 1_000, 1_900);
        add("due.test", &["due.test"], 0, 1_500);
        add("wrong.test", &["other.test"], 1_000, 1_900);
        materials.insert(
            "broken.test".into(),
            CertificateMaterial {
                hostname: "broken.test".into(),
                chain_pem: "nope".into(),
                key_pem: String::new(),
                not_after: 0,
                names: vec![],
                imported: false,
            },
        );
        let policy = CertificatePolicy::default();
        let wanted = wanted_hostnames(&obs, &materials, &policy, 1_200);
        assert_eq!(
            wanted.keys().map(String::as_str).collect::<Vec<_>>(),
            ["broken.test", "due.test", "missing.test", "wrong.test"]
        );
        assert_eq!(wanted["missing.test"], Need::Missing);
        assert_eq!(
            wanted["due.test"],
            Need::Renewal {
                renew_at: 1_000,
                not_after: 1_500
            }
        );
        assert_eq!(
            wanted["wrong.test"],
            Need::NotCovered {
                names: vec!["other.test".into()]
            }
        );
        assert!(matches!(wanted["broken.test"], Need::Unreadable(_)));

        let hosts = ingress_https_hostnames(&obs);
        let a = assess(&hosts, &materials, &policy, 1_200);
        assert_eq!(
            a.current["fresh.test"],
            Current {
                not_after: 1_900,
                renew_at: 1_600
            }
        );
        assert_eq!(a.next_renewal(), Some(1_600));
        // At its renewal point fresh.test is due too.
        let a = assess(&hosts, &materials, &policy, 1_600);
        assert!(a.wanted.contains_key("fresh.test"));
        // A smaller fraction moves the point earlier.
        let early = CertificatePolicy {
            renewal_fraction: Some(0.1),
            ..Default::default()
        };
        let a = assess(&hosts, &materials, &early, 1_100);
        assert!(a.wanted.contains_key("fresh.test"));
        let a = assess(&hosts, &materials, &early, 1_089);
        assert!(!a.wanted.contains_key("fresh.test"));
    }

    #[test]
    fn orderable_names() {
        for ok in ["app.test", "a-b.example.com", "x1.y2"] {
            assert!(orderable(ok), "{ok}");
        }
        for bad in [
            "localhost",
            "*.a.test",
            "-a.test",
            "a..test",
            "10.0.0.1",
            "A.test",
            "a_b.test",
        ] {
            assert!(!orderable(bad), "{bad}");
        }
    }
}
