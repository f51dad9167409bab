//! Joining: Machine Subnet allocation and collisions, as one Machine observes the member roster.
//!
//! Allocation is optimistic (the glossary's Machine Subnet): the admitting Machine picks the first
//! /24 that no member it observes holds. Two Machines admitting at once through different entry
//! Machines that have not yet seen each other's admission can pick the same /24; nothing can stop
//! that without a coordinator, so it is detected instead ([`subnet_collisions`]) and shown on
//! every Machine that observes both members, never silently shared.

use std::collections::BTreeMap;

use ployz_core::api::Member;
use ployz_core::{ClusterNetwork, MachineId, MachineSubnet};

/// Why a Machine cannot be admitted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdmitError {
    #[error("the Cluster network {network} has no free /24 left for a new Machine; remove a Machine that is gone for good (`ployz machine rm`)")]
    Exhausted { network: String },
}

/// The first /24 of `network` that no member of `roster` holds.
pub fn allocate_subnet(
    network: &ClusterNetwork,
    roster: &[Member],
) -> Result<MachineSubnet, AdmitError> {
    let taken: Vec<MachineSubnet> = roster.iter().map(|m| m.subnet).collect();
    network
        .first_free_subnet(&taken)
        .map_err(|_| AdmitError::Exhausted {
            network: network.to_string(),
        })
}

/// For every member whose Machine Subnet another member holds too, the other members holding
/// it (sorted). Members with a subnet of their own are absent.
pub fn subnet_collisions(roster: &[Member]) -> BTreeMap<MachineId, Vec<MachineId>> {
    let mut by_subnet: BTreeMap<MachineSubnet, Vec<&MachineId>> = BTreeMap::new();
    for m in roster {
        by_subnet.entry(m.subnet).or_default().push(&m.id);
    }
    let mut out = BTreeMap::new();
    for holders in by_subnet.values().filter(|h| h.len() > 1) {
        for id in holders {
            let mut others: Vec<MachineId> = holders
                .iter()
                .filter(|o| *o != id)
                .map(|o| (*o).clone())
                .collect();
            others.sort();
            out.insert((*id).clone(), others);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use ployz_core::ManagementAddress;

    fn member(id: &str, subnet: &str) -> Member {
        Member {
            id: id.parse().unwrap(),
            name: "m".parse().unwrap(),
            subnet: subnet.parse().unwrap(),
            public_key: String::new(),
            management_address: ManagementAddress::from_public_key(&[0; 32]),
            endpoints: vec![],
        }
    }

    const A: &str = "0000000000000000000000000000000a";
    const B: &str = "0000000000000000000000000000000b";
    const C: &str = "0000000000000000000000000000000c";

    #[test]
    fn the_first_free_subnet_skips_every_member_s() {
        let net = ClusterNetwork::default();
        let roster = [member(A, "10.210.0.0/24"), member(B, "10.210.2.0/24")];
        assert_eq!(
            allocate_subnet(&net, &roster).unwrap().to_string(),
            "10.210.1.0/24"
        );
        assert_eq!(
            allocate_subnet(&net, &[]).unwrap().to_string(),
            "10.210.0.0/24"
        );
    }

    #[test]
    fn a_full_network_is_refused_with_the_fix() {
        let net: ClusterNetwork = "10.210.0.0/23".parse().unwrap();
        let roster = [member(A, "10.210.0.0/24"), member(B, "10.210.1.0/24")];
        let e = allocate_subnet(&net, &roster).unwrap_err().to_string();
        assert!(
            e.contains("10.210.0.0/23") && e.contains("ployz machine rm"),
            "{e}"
        );
    }

    #[test]
    fn members_sharing_a_subnet_each_name_the_others() {
        let roster = [
            member(A, "10.210.1.0/24"),
            member(B, "10.210.1.0/24"),
            member(C, "10.210.2.0/24"),
        ];
        let c = subnet_collisions(&roster);
        assert_eq!(c.len(), 2);
        assert_eq!(
            c[&A.parse::<MachineId>().unwrap()],
            vec![B.parse().unwrap()]
        );
        assert_eq!(
            c[&B.parse::<MachineId>().unwrap()],
            vec![A.parse().unwrap()]
        );
        assert!(!c.contains_key(&C.parse::<MachineId>().unwrap()));
    }
}
