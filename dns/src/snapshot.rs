//! The immutable table every Internal DNS Answer is read from, built off the query path by pure
//! functions from replicated observations (or from a zone file, for benchmarks).

use std::collections::HashMap;
use std::net::Ipv4Addr;

use ployz_core::api::MachineInfo;
use ployz_core::{ContainerRuntimeObservation, MachineId, MachineSubnet};

/// The zone this server owns, lowercase, without the trailing dot.
pub const ZONE: &str = "internal";

/// The label between a Machine and a Service DNS Label in a Machine-Service DNS Selector
/// (`<machine>.m.<service-label>.internal`).
pub const MACHINE_LABEL: &str = "m";

/// The addresses one name answers with, those inside the observing Machine's subnet first.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct AddressSet {
    /// Local addresses (sorted), then the others (sorted); no duplicates.
    addrs: Box<[Ipv4Addr]>,
    /// How many of `addrs`, from the front, lie inside the local Machine Subnet.
    local: usize,
}

impl AddressSet {
    fn new(mut addrs: Vec<Ipv4Addr>, local_subnet: Option<MachineSubnet>) -> AddressSet {
        let is_local = |a: &Ipv4Addr| local_subnet.is_some_and(|s| s.contains(*a));
        // Local first, each group in address order.
        addrs.sort_unstable_by_key(|a| (!is_local(a), *a));
        addrs.dedup();
        let local = addrs.iter().take_while(|a| is_local(a)).count();
        AddressSet {
            addrs: addrs.into_boxed_slice(),
            local,
        }
    }

    /// Every address, local group first.
    pub(crate) fn addrs(&self) -> &[Ipv4Addr] {
        &self.addrs
    }

    /// How many addresses, from the front, are in the local Machine Subnet.
    pub(crate) fn local(&self) -> usize {
        self.local
    }

    /// A name that exists but has no address (an empty non-terminal such as `m.web.internal`).
    pub(crate) fn is_empty(&self) -> bool {
        self.addrs.is_empty()
    }
}

/// An immutable answer table: lowercase name -> addresses, for the `.internal` zone as one
/// observing Machine sees it.
///
/// Names it holds (all lowercase, under `internal.`), where `<service-label>` is the Service
/// DNS Label of a Service Name (`My_App` -> `my-app`, see `ServiceName::dns_label`):
/// - `<service-label>.internal`: every Serving Container of every Service with that Service
///   DNS Label (Name Ambiguity is preserved: several Services may share it);
/// - `<service-id>.internal`: every Serving Container of that Service;
/// - `<machine-id>.m.<service-label>.internal`: the Serving Containers on one Machine of the
///   Services with that label (a Machine-Service DNS Selector);
/// - `<machine-name>.m.<service-label>.internal`, only while that Machine Name belongs to
///   exactly one Machine;
/// - `m.<service-label>.internal` as an empty non-terminal, so it answers NOERROR without data
///   rather than claiming nothing exists below it.
///
/// The `rr.` and `nearest.` selector prefixes are applied at query time, not stored.
#[derive(Debug, Clone, Default)]
pub struct DnsSnapshot {
    generation: u64,
    names: HashMap<Box<[u8]>, AddressSet>,
    local_subnet: Option<MachineSubnet>,
}

impl DnsSnapshot {
    /// An empty table: every `.internal` name is unknown.
    pub fn empty() -> DnsSnapshot {
        DnsSnapshot::default()
    }

    /// Builds the table from replicated Container Runtime Observations and Machine
    /// self-descriptions, as the Machine `local` observes them. Only Serving Containers
    /// contribute addresses; the local Machine's subnet decides what the Nearest DNS Selector
    /// puts first (no local Machine record means no address is local).
    pub fn build(
        observations: &[ContainerRuntimeObservation],
        machines: &[MachineInfo],
        local: &MachineId,
    ) -> DnsSnapshot {
        let local_subnet = machines.iter().find(|m| &m.id == local).map(|m| m.subnet);
        let unique_names = unique_machine_names(machines);
        let mut b = Builder::default();
        for o in observations.iter().filter(|o| o.is_serving()) {
            let Some(addr) = o.address else { continue };
            let service = o.service_name.dns_label();
            b.add(format!("{service}.{ZONE}"), addr);
            b.add(format!("{}.{ZONE}", o.service_id), addr);
            b.add(
                format!("{}.{MACHINE_LABEL}.{service}.{ZONE}", o.machine_id),
                addr,
            );
            if let Some(name) = unique_names.get(&o.machine_id) {
                b.add(format!("{name}.{MACHINE_LABEL}.{service}.{ZONE}"), addr);
            }
            b.declare(format!("{MACHINE_LABEL}.{service}.{ZONE}"));
        }
        b.finish(local_subnet)
    }

    /// Builds a table from fixed `(name, address)` records, names relative to nothing (for
    /// example `host1.internal`); names without an address exist with no data. Used for zone
    /// files and tests.
    pub(crate) fn from_records(
        records: impl IntoIterator<Item = (String, Option<Ipv4Addr>)>,
        local_subnet: Option<MachineSubnet>,
    ) -> DnsSnapshot {
        let mut b = Builder::default();
        for (name, addr) in records {
            match addr {
                Some(addr) => b.add(name, addr),
                None => b.declare(name),
            }
        }
        b.finish(local_subnet)
    }

    /// The same table with another generation number.
    pub fn with_generation(mut self, generation: u64) -> DnsSnapshot {
        self.generation = generation;
        self
    }

    /// Which build this is: the controller counts up from 0 (the empty table).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// How many names the table holds (selector prefixes not counted).
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether the table holds no name.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// The observing Machine's subnet, which the Nearest DNS Selector puts first.
    pub fn local_subnet(&self) -> Option<MachineSubnet> {
        self.local_subnet
    }

    /// Every name the table holds, lowercase without the trailing dot, in no particular order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.names
            .keys()
            .filter_map(|k| std::str::from_utf8(k).ok())
    }

    /// Whether two tables give the same answers (generations aside): the controller publishes
    /// only when this is false.
    pub fn same_answers(&self, other: &DnsSnapshot) -> bool {
        self.local_subnet == other.local_subnet && self.names == other.names
    }

    /// The addresses of a lowercase name without trailing dot and without selector prefix.
    pub(crate) fn get(&self, name: &[u8]) -> Option<&AddressSet> {
        self.names.get(name)
    }
}

/// Machine ID -> Machine Name, for the names that belong to exactly one Machine.
fn unique_machine_names(machines: &[MachineInfo]) -> HashMap<MachineId, String> {
    let mut by_name: HashMap<String, Vec<&MachineId>> = HashMap::new();
    for m in machines {
        let ids = by_name
            .entry(m.name.as_str().to_ascii_lowercase())
            .or_default();
        if !ids.contains(&&m.id) {
            ids.push(&m.id);
        }
    }
    by_name
        .into_iter()
        .filter_map(|(name, ids)| match ids.as_slice() {
            [id] => Some(((*id).clone(), name)),
            _ => None,
        })
        .collect()
}

/// Collects name -> addresses before they are frozen into [`AddressSet`]s.
#[derive(Default)]
struct Builder {
    names: HashMap<String, Vec<Ipv4Addr>>,
}

impl Builder {
    fn add(&mut self, name: String, addr: Ipv4Addr) {
        self.names
            .entry(name.to_ascii_lowercase())
            .or_default()
            .push(addr);
    }

    fn declare(&mut self, name: String) {
        self.names.entry(name.to_ascii_lowercase()).or_default();
    }

    fn finish(self, local_subnet: Option<MachineSubnet>) -> DnsSnapshot {
        DnsSnapshot {
            generation: 0,
            names: self
                .names
                .into_iter()
                .map(|(name, addrs)| {
                    (
                        name.into_bytes().into_boxed_slice(),
                        AddressSet::new(addrs, local_subnet),
                    )
                })
                .collect(),
            local_subnet,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use ployz_core::{
        ContainerHealth, ContainerKind, ContainerState, LocalMachinePhase, ManagementAddress,
        ServiceId,
    };

    pub(crate) fn machine(name: &str, subnet: &str) -> MachineInfo {
        MachineInfo {
            id: MachineId::generate(),
            name: name.parse().unwrap(),
            phase: LocalMachinePhase::Participating,
            subnet: subnet.parse().unwrap(),
            public_key: String::new(),
            management_address: ManagementAddress::from_public_key(&[0; 32]),
            endpoints: Vec::new(),
            version: String::new(),
            wireguard_backend: None,
            edge_features: Vec::new(),
        }
    }

    pub(crate) fn serving(
        machine: &MachineId,
        service: &str,
        service_id: &ServiceId,
        addr: Ipv4Addr,
    ) -> ContainerRuntimeObservation {
        ContainerRuntimeObservation {
            id: format!("{:064x}", rand::random::<u128>()).parse().unwrap(),
            name: format!("{service}-abcd"),
            machine_id: machine.clone(),
            service_id: service_id.clone(),
            service_name: service.parse().unwrap(),
            kind: ContainerKind::Service,
            state: ContainerState::Running,
            health: None,
            restart_count: 0,
            address: Some(addr),
            image: "app".into(),
            created_at: 0,
            spec: None,
            plan_id: None,
            lease_token: None,
        }
    }

    fn addrs<'s>(s: &'s DnsSnapshot, name: &str) -> Option<&'s [Ipv4Addr]> {
        s.get(name.as_bytes()).map(|a| a.addrs())
    }

    fn ip(last: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, 210, 0, last)
    }

    #[test]
    fn only_serving_containers_answer() {
        let m = machine("alpha", "10.210.0.0/24");
        let svc = ServiceId::generate();
        let ok = serving(&m.id, "web", &svc, ip(2));
        let mut unhealthy = serving(&m.id, "web", &svc, ip(3));
        unhealthy.health = Some(ContainerHealth::Unhealthy);
        let mut starting = serving(&m.id, "web", &svc, ip(4));
        starting.health = Some(ContainerHealth::Starting);
        let mut healthy = serving(&m.id, "web", &svc, ip(5));
        healthy.health = Some(ContainerHealth::Healthy);
        let mut exited = serving(&m.id, "web", &svc, ip(6));
        exited.state = ContainerState::Exited;
        let mut hook = serving(&m.id, "web", &svc, ip(7));
        hook.kind = ContainerKind::Hook;
        let mut no_addr = serving(&m.id, "web", &svc, ip(8));
        no_addr.address = None;
        let s = DnsSnapshot::build(
            &[ok, unhealthy, starting, healthy, exited, hook, no_addr],
            std::slice::from_ref(&m),
            &m.id,
        );
        assert_eq!(addrs(&s, "web.internal"), Some(&[ip(2), ip(5)][..]));
        assert_eq!(
            addrs(&s, &format!("{svc}.internal")),
            Some(&[ip(2), ip(5)][..])
        );
    }

    #[test]
    fn a_name_without_serving_containers_does_not_exist() {
        let m = machine("alpha", "10.210.0.0/24");
        let mut down = serving(&m.id, "web", &ServiceId::generate(), ip(2));
        down.state = ContainerState::Restarting;
        let s = DnsSnapshot::build(&[down], std::slice::from_ref(&m), &m.id);
        assert!(s.is_empty());
        assert_eq!(addrs(&s, "web.internal"), None);
    }

    #[test]
    fn services_sharing_a_name_answer_together() {
        let m = machine("alpha", "10.210.0.0/24");
        let (a, b) = (ServiceId::generate(), ServiceId::generate());
        let s = DnsSnapshot::build(
            &[
                serving(&m.id, "web", &a, ip(2)),
                serving(&m.id, "web", &b, ip(3)),
            ],
            std::slice::from_ref(&m),
            &m.id,
        );
        assert_eq!(addrs(&s, "web.internal"), Some(&[ip(2), ip(3)][..]));
        assert_eq!(addrs(&s, &format!("{a}.internal")), Some(&[ip(2)][..]));
        assert_eq!(addrs(&s, &format!("{b}.internal")), Some(&[ip(3)][..]));
    }

    #[test]
    fn machine_scoped_names_by_id_and_unique_name() {
        let alpha = machine("alpha", "10.210.0.0/24");
        let beta = machine("beta", "10.210.1.0/24");
        let svc = ServiceId::generate();
        let s = DnsSnapshot::build(
            &[
                serving(&alpha.id, "web", &svc, ip(2)),
                serving(&beta.id, "web", &svc, Ipv4Addr::new(10, 210, 1, 2)),
            ],
            &[alpha.clone(), beta.clone()],
            &alpha.id,
        );
        assert_eq!(addrs(&s, "alpha.m.web.internal"), Some(&[ip(2)][..]));
        assert_eq!(
            addrs(&s, &format!("{}.m.web.internal", beta.id)),
            Some(&[Ipv4Addr::new(10, 210, 1, 2)][..])
        );
        assert_eq!(
            addrs(&s, "beta.m.web.internal"),
            Some(&[Ipv4Addr::new(10, 210, 1, 2)][..])
        );
        // The empty non-terminal exists without data.
        assert!(s.get(b"m.web.internal").unwrap().is_empty());
    }

    #[test]
    fn ambiguous_machine_names_answer_only_by_id() {
        let one = machine("twin", "10.210.0.0/24");
        let two = machine("twin", "10.210.1.0/24");
        let svc = ServiceId::generate();
        let s = DnsSnapshot::build(
            &[
                serving(&one.id, "web", &svc, ip(2)),
                serving(&two.id, "web", &svc, Ipv4Addr::new(10, 210, 1, 2)),
            ],
            &[one.clone(), two.clone()],
            &one.id,
        );
        assert_eq!(addrs(&s, "twin.m.web.internal"), None);
        assert_eq!(
            addrs(&s, &format!("{}.m.web.internal", one.id)),
            Some(&[ip(2)][..])
        );
        // Ambiguity is counted over every Machine, not only those with containers.
        let s = DnsSnapshot::build(
            &[serving(&one.id, "web", &svc, ip(2))],
            &[one.clone(), two],
            &one.id,
        );
        assert_eq!(addrs(&s, "twin.m.web.internal"), None);
    }

    #[test]
    fn service_names_answer_under_their_dns_label() {
        let alpha = machine("alpha", "10.210.0.0/24");
        let (a, b) = (ServiceId::generate(), ServiceId::generate());
        let s = DnsSnapshot::build(
            &[
                serving(&alpha.id, "My_App", &a, ip(2)),
                serving(&alpha.id, "_api.v2", &b, ip(3)),
            ],
            std::slice::from_ref(&alpha),
            &alpha.id,
        );
        assert_eq!(addrs(&s, "my-app.internal"), Some(&[ip(2)][..]));
        assert_eq!(addrs(&s, "alpha.m.my-app.internal"), Some(&[ip(2)][..]));
        assert_eq!(
            addrs(&s, &format!("{}.m.my-app.internal", alpha.id)),
            Some(&[ip(2)][..])
        );
        assert!(s.get(b"m.my-app.internal").unwrap().is_empty());
        assert_eq!(addrs(&s, "api-v2.internal"), Some(&[ip(3)][..]));
        // The name as written is not a DNS name.
        for written in ["my_app.internal", "My_App.internal", "_api.v2.internal"] {
            assert_eq!(addrs(&s, &written.to_ascii_lowercase()), None, "{written}");
        }
        // Every name the table holds is a lowercase DNS name.
        for name in s.names() {
            assert!(
                name.chars()
                    .all(|c| matches!(c, 'a'..='z' | '0'..='9' | '-' | '.')),
                "{name}"
            );
        }
    }

    #[test]
    fn local_subnet_addresses_come_first() {
        let alpha = machine("alpha", "10.210.5.0/24");
        let beta = machine("beta", "10.210.1.0/24");
        let svc = ServiceId::generate();
        let remote = Ipv4Addr::new(10, 210, 1, 9);
        let local = Ipv4Addr::new(10, 210, 5, 20);
        let s = DnsSnapshot::build(
            &[
                serving(&beta.id, "web", &svc, remote),
                serving(&alpha.id, "web", &svc, local),
                serving(&alpha.id, "web", &svc, local),
            ],
            &[alpha.clone(), beta],
            &alpha.id,
        );
        let set = s.get(b"web.internal").unwrap();
        assert_eq!(set.addrs(), &[local, remote]);
        assert_eq!(set.local(), 1);
        assert_eq!(s.local_subnet(), Some(alpha.subnet));
    }

    #[test]
    fn same_answers_ignores_generation_and_order() {
        let m = machine("alpha", "10.210.0.0/24");
        let svc = ServiceId::generate();
        let a = serving(&m.id, "web", &svc, ip(2));
        let b = serving(&m.id, "web", &svc, ip(3));
        let one = DnsSnapshot::build(&[a.clone(), b.clone()], std::slice::from_ref(&m), &m.id);
        let two =
            DnsSnapshot::build(&[b, a.clone()], std::slice::from_ref(&m), &m.id).with_generation(9);
        assert!(one.same_answers(&two));
        let three = DnsSnapshot::build(&[a], std::slice::from_ref(&m), &m.id);
        assert!(!one.same_answers(&three));
    }
}
