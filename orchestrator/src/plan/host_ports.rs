//! Host ports across Services: a host port is bound once per Machine.
//!
//! After a Service is placed, each fixed host port it publishes (`8080:80`; a port Docker picks
//! never conflicts) is checked on every Machine it lands on against
//! - the daemon's own listeners there (the edge, metrics, the internal DNS), from the Deploy
//!   Snapshot;
//! - the host ports of the Services placed before it in this Deploy;
//! - the host ports of containers already running there for Services this Deploy does not
//!   attempt (their Resolved Service Spec says what they hold).
//!
//! Two bindings overlap when their protocol and port are equal and their addresses overlap: no
//! address or an unspecified one (`0.0.0.0`, `::`) overlaps every address, a CIDR overlaps the
//! addresses inside it, and otherwise only equal addresses overlap.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ployz_core::{
    ContainerKind, ContainerState, DeployIntent, HostProtocol, Listener, MachineId,
    MachineSnapshot, PortSpec, ServiceSpec,
};

use super::placement::Placement;
use super::{is_up, PlanError};

/// One fixed host port a Service holds on a Machine.
#[derive(Debug, Clone)]
struct Binding {
    /// The Service that holds it.
    service: String,
    /// Held by a running container of a Service this Deploy does not attempt.
    already_running: bool,
    host_ip: Option<String>,
    port: u16,
    protocol: HostProtocol,
}

/// The host ports held on each Machine: by running Services this Deploy leaves alone, and by
/// the Services it has placed so far.
#[derive(Debug, Default)]
pub(super) struct HostPortLedger<'a> {
    held: BTreeMap<&'a MachineId, Vec<Binding>>,
}

impl<'a> HostPortLedger<'a> {
    /// The host ports held by the running containers of Services `intent` does not attempt
    /// (an attempted Service's containers are replaced or kept by its own plan).
    pub(super) fn observed(intent: &DeployIntent, machines: &'a [MachineSnapshot]) -> Self {
        let mut held: BTreeMap<&'a MachineId, Vec<Binding>> = BTreeMap::new();
        for m in machines {
            for c in &m.containers {
                let holds_ports = matches!(
                    c.state,
                    ContainerState::Running | ContainerState::Restarting | ContainerState::Paused
                );
                if c.kind != ContainerKind::Service
                    || !holds_ports
                    || intent.attempts.contains(&c.service_name)
                {
                    continue;
                }
                let Some(spec) = &c.spec else { continue };
                held.entry(&m.machine.info.id)
                    .or_default()
                    .extend(bindings(spec, true));
            }
        }
        HostPortLedger { held }
    }

    /// Refuses `spec`'s placement when a host port it publishes on a Machine is held there by
    /// the daemon or by another Service; else records its host ports as held.
    pub(super) fn claim(
        &mut self,
        spec: &ServiceSpec,
        placement: &Placement<'_>,
        machines: &'a [MachineSnapshot],
    ) -> Result<(), PlanError> {
        let wanted = bindings(spec, false);
        if wanted.is_empty() {
            return Ok(());
        }
        for m in machines.iter().filter(|m| is_up(m)) {
            let machine_id = &m.machine.info.id;
            if placement.wanted(machine_id) == 0 {
                continue;
            }
            let machine = m.machine.info.name.to_string();
            for b in &wanted {
                if let Some(l) = m.listeners.iter().find(|l| held_by_listener(b, l)) {
                    return Err(listener_error(spec, b, l, machine));
                }
                let held = self.held.get(machine_id).into_iter().flatten();
                if let Some(other) = held
                    .filter(|o| o.service != b.service)
                    .find(|o| same_binding(b, o))
                {
                    return Err(PlanError::HostPortTaken {
                        name: b.service.clone(),
                        other: other.service.clone(),
                        port: b.port,
                        protocol: b.protocol,
                        machine,
                        other_running: other.already_running,
                    });
                }
            }
            self.held
                .entry(machine_id)
                .or_default()
                .extend(wanted.iter().cloned());
        }
        Ok(())
    }
}

/// Refuses a port one Service would take on every Machine while another holds it: an Ingress
/// Port of `spec` another deployed Service publishes as an Ingress Port or a fixed host port
/// (on any Machine), a fixed host port of `spec` another publishes as an Ingress Port, or an
/// Ingress Port one of the daemon's listeners holds on a Machine that is up.
pub(super) fn check_ingress_ports(
    spec: &ServiceSpec,
    machines: &[MachineSnapshot],
) -> Result<(), PlanError> {
    let mine: Vec<(u16, HostProtocol)> = spec
        .ingress_ports()
        .map(|(p, _, proto)| (p, proto))
        .collect();
    let my_host: Vec<(u16, HostProtocol)> = spec.host_ports().collect();
    if mine.is_empty() && my_host.is_empty() {
        return Ok(());
    }
    for c in machines.iter().flat_map(|m| m.containers.iter()) {
        if c.kind != ContainerKind::Service || c.service_name == spec.name {
            continue;
        }
        let Some(theirs) = &c.spec else { continue };
        let taken =
            |port: u16, protocol: HostProtocol, how: &'static str| PlanError::IngressPortTaken {
                name: spec.name.to_string(),
                port,
                protocol,
                owner: c.service_name.to_string(),
                owner_id: c.service_id.to_string(),
                how,
            };
        for (port, _, protocol) in theirs.ingress_ports() {
            if mine.contains(&(port, protocol)) || my_host.contains(&(port, protocol)) {
                return Err(taken(port, protocol, "as an Ingress Port"));
            }
        }
        for (port, protocol) in theirs.host_ports() {
            if mine.contains(&(port, protocol)) {
                return Err(taken(port, protocol, "as a host port"));
            }
        }
    }
    for m in machines.iter().filter(|m| is_up(m)) {
        for &(port, protocol) in &mine {
            if let Some(l) = m
                .listeners
                .iter()
                .find(|l| l.port == port && l.protocol == protocol)
            {
                return Err(PlanError::IngressPortHeldByDaemon {
                    name: spec.name.to_string(),
                    port,
                    protocol,
                    machine: m.machine.info.name.to_string(),
                    role: l.role,
                    address: l.socket_text(),
                });
            }
        }
    }
    Ok(())
}

/// The fixed host ports of `spec`.
fn bindings(spec: &ServiceSpec, already_running: bool) -> Vec<Binding> {
    spec.ports
        .iter()
        .filter_map(|p| match p {
            PortSpec::Host {
                host_ip,
                host_port: Some(port),
                protocol,
                ..
            } => Some(Binding {
                service: spec.name.to_string(),
                already_running,
                host_ip: host_ip.clone(),
                port: *port,
                protocol: *protocol,
            }),
            _ => None,
        })
        .collect()
}

fn same_binding(a: &Binding, b: &Binding) -> bool {
    a.port == b.port
        && a.protocol == b.protocol
        && addresses_overlap(a.host_ip.as_deref(), b.host_ip.as_deref())
}

fn held_by_listener(b: &Binding, l: &Listener) -> bool {
    b.port == l.port
        && b.protocol == l.protocol
        && addresses_overlap(b.host_ip.as_deref(), Some(&l.address))
}

/// The refusal for a host port one of the daemon's listeners holds, with the fix: a web port
/// belongs behind the edge.
fn listener_error(spec: &ServiceSpec, b: &Binding, l: &Listener, machine: String) -> PlanError {
    let container_port = spec
        .ports
        .iter()
        .find_map(|p| match p {
            PortSpec::Host {
                host_port: Some(port),
                container_port,
                protocol,
                ..
            } if *port == b.port && *protocol == b.protocol => Some(*container_port),
            _ => None,
        })
        .unwrap_or(b.port);
    let on_one_address = l
        .address
        .parse::<std::net::IpAddr>()
        .is_ok_and(|ip| !ip.is_unspecified());
    let fix = if l.role.is_edge() {
        format!(
            "publish the web port through the edge with x-ports (e.g. x-ports: ['app.example.com:{container_port}/https']) or pick another host port"
        )
    } else if b.host_ip.is_none() && on_one_address {
        // The listener holds one address; the port is free on the Machine's others.
        format!(
            "pick another host port, or publish it on one of the Machine's other addresses (e.g. 'MACHINE_IP:{}:{container_port}/{}', with an address other than {})",
            b.port, b.protocol, l.address
        )
    } else {
        "pick another host port".to_owned()
    };
    PlanError::HostPortHeldByDaemon {
        name: b.service.clone(),
        port: b.port,
        protocol: b.protocol,
        machine,
        role: l.role,
        address: l.socket_text(),
        fix,
    }
}

/// An address or CIDR as (address, prefix length).
fn network(text: &str) -> Option<(IpAddr, u8)> {
    let text = text.trim_start_matches('[').replace(']', "");
    match text.split_once('/') {
        Some((ip, bits)) => Some((ip.parse().ok()?, bits.parse().ok()?)),
        None => {
            let ip: IpAddr = text.parse().ok()?;
            Some((ip, if ip.is_ipv4() { 32 } else { 128 }))
        }
    }
}

/// Whether two host addresses (`None`: every address) can hold the same port.
fn addresses_overlap(a: Option<&str>, b: Option<&str>) -> bool {
    let (Some(a), Some(b)) = (a, b) else {
        return true;
    };
    let (Some(na), Some(nb)) = (network(a), network(b)) else {
        // Not an address: only the same text is surely the same.
        return a == b;
    };
    let everywhere = |(ip, bits): (IpAddr, u8)| ip.is_unspecified() || bits == 0;
    if everywhere(na) || everywhere(nb) {
        return true;
    }
    contains(na, nb.0) || contains(nb, na.0)
}

/// Whether the network `(base, bits)` contains `ip`.
fn contains((base, bits): (IpAddr, u8), ip: IpAddr) -> bool {
    let (base, ip, width) = match (base, ip) {
        (IpAddr::V4(b), IpAddr::V4(i)) => (u128::from(u32::from(b)), u128::from(u32::from(i)), 32),
        (IpAddr::V6(b), IpAddr::V6(i)) => (u128::from(b), u128::from(i), 128),
        _ => return false,
    };
    let bits = u32::from(bits).min(width);
    if bits == 0 {
        return true;
    }
    let shift = width - bits;
    base >> shift == ip >> shift
}

#[cfg(test)]
mod tests {
    use super::addresses_overlap;

    #[test]
    fn addresses_overlap_as_the_kernel_binds_them() {
        let cases = [
            (None, None, true),
            (None, Some("127.0.0.1"), true),
            (Some("0.0.0.0"), Some("127.0.0.1"), true),
            (Some("::"), Some("10.0.0.1"), true),
            (Some("127.0.0.1"), Some("127.0.0.1"), true),
            (Some("127.0.0.1"), Some("127.0.0.2"), false),
            (Some("::1"), Some("[::1]"), true),
            (Some("::1"), Some("127.0.0.1"), false),
            (Some("10.0.0.0/8"), Some("10.1.2.3"), true),
            (Some("10.0.0.0/8"), Some("11.0.0.1"), false),
            (Some("fd00::/8"), Some("fd12::1"), true),
        ];
        for (a, b, want) in cases {
            assert_eq!(addresses_overlap(a, b), want, "{a:?} {b:?}");
            assert_eq!(addresses_overlap(b, a), want, "{b:?} {a:?}");
        }
    }
}
