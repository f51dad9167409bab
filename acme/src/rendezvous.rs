//! Which Machine orders a hostname's certificate: rendezvous (highest random weight) hashing of
//! the hostname over the participating Machines' IDs.
//!
//! Every Machine computes the same answer from the same replicated Machine records, so exactly
//! one orders (while their views agree). When a Machine joins or leaves, only the hostnames it
//! wins or held move; every other hostname keeps its issuer.

use std::collections::BTreeSet;

use ployz_core::{LocalMachinePhase, MachineId};
use ployz_store::machines::{certificate_issuers, stored_machines};
use ployz_store::{Store, StoreError};

/// The weight of `machine` for `hostname`: the first 8 bytes of SHA-256(machine ID, 0, hostname).
pub fn weight(machine: &MachineId, hostname: &str) -> u64 {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(machine.as_str().as_bytes());
    ctx.update(&[0]);
    ctx.update(hostname.as_bytes());
    let digest = ctx.finish();
    u64::from_be_bytes(digest.as_ref()[..8].try_into().expect("8 bytes"))
}

/// The issuer of `hostname` among `machines`: the highest weight, ties broken by the greater
/// Machine ID. `None` when there is no Machine.
pub fn issuer_for<'a>(
    hostname: &str,
    machines: impl IntoIterator<Item = &'a MachineId>,
) -> Option<&'a MachineId> {
    machines
        .into_iter()
        .max_by_key(|m| (weight(m, hostname), m.as_str()))
}

/// The Machines that take part in issuing: those whose self-description says they are
/// participating and whose daemon runs the issuer (its presence record; `local` runs it, being
/// the caller), plus `local` when it has not published a description yet (a Machine alone, or a
/// test). A Machine whose own record says it is joining or resetting does not issue, nor does
/// one started with `--no-certificates`: otherwise the hostnames it wins would never be ordered.
/// A store that cannot be read is an error (taken for "no Machine but this one", every hostname
/// would be this Machine's). Membership is not looked at here: the issuer passes over the
/// Machines it has not observed up for its grace.
pub fn participating_machines(
    store: &Store,
    local: &MachineId,
) -> Result<BTreeSet<MachineId>, StoreError> {
    let machines = stored_machines(store)?;
    let issuers = certificate_issuers(store)?;
    let mut out: BTreeSet<MachineId> = machines
        .iter()
        .filter(|m| m.phase == LocalMachinePhase::Participating)
        .filter(|m| &m.id == local || issuers.contains(&m.id))
        .map(|m| m.id.clone())
        .collect();
    if !machines.iter().any(|m| &m.id == local) {
        out.insert(local.clone());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn machines(n: usize) -> Vec<MachineId> {
        (0..n).map(|_| MachineId::generate()).collect()
    }

    fn hostnames(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("app{i}.example.com")).collect()
    }

    #[test]
    fn deterministic_and_order_independent() {
        let ms = machines(5);
        let mut reversed = ms.clone();
        reversed.reverse();
        for h in hostnames(50) {
            let a = issuer_for(&h, &ms).unwrap();
            assert_eq!(a, issuer_for(&h, &ms).unwrap());
            assert_eq!(a, issuer_for(&h, &reversed).unwrap());
        }
        assert_eq!(issuer_for("a.test", &Vec::<MachineId>::new()), None);
        // Fixed inputs give a fixed weight (the same on every Machine and every version).
        let m: MachineId = "0123456789abcdef0123456789abcdef".parse().unwrap();
        assert_eq!(weight(&m, "app.test"), weight(&m, "app.test"));
        assert_ne!(weight(&m, "app.test"), weight(&m, "app2.test"));
    }

    #[test]
    fn hostnames_spread_evenly() {
        let ms = machines(4);
        let mut counts: BTreeMap<&MachineId, usize> = BTreeMap::new();
        let hs = hostnames(4000);
        for h in &hs {
            *counts.entry(issuer_for(h, &ms).unwrap()).or_default() += 1;
        }
        assert_eq!(counts.len(), 4);
        for (m, c) in counts {
            // Expect 1000 each; a binomial deviation beyond 150 is astronomically unlikely.
            assert!((850..=1150).contains(&c), "{m}: {c}");
        }
    }

    #[test]
    fn only_affected_hostnames_move_when_machines_come_and_go() {
        let ms = machines(5);
        let hs = hostnames(2000);
        let before: Vec<MachineId> = hs
            .iter()
            .map(|h| issuer_for(h, &ms).unwrap().clone())
            .collect();

        // A Machine leaves: only its hostnames move, spread over the others.
        let gone = ms[2].clone();
        let remaining: Vec<MachineId> = ms.iter().filter(|m| **m != gone).cloned().collect();
        for (h, b) in hs.iter().zip(&before) {
            let after = issuer_for(h, &remaining).unwrap();
            if *b != gone {
                assert_eq!(after, b, "{h} moved though its issuer stayed");
            }
        }

        // A Machine joins: hostnames move only to it, about 1/6 of them.
        let newcomer = MachineId::generate();
        let mut grown = ms.clone();
        grown.push(newcomer.clone());
        let mut moved = 0;
        for (h, b) in hs.iter().zip(&before) {
            let after = issuer_for(h, &grown).unwrap();
            if after != b {
                assert_eq!(after, &newcomer, "{h} moved to an old Machine");
                moved += 1;
            }
        }
        assert!((200..=470).contains(&moved), "moved {moved} of 2000");
    }

    #[test]
    fn participants_come_from_machine_records() {
        use ployz_core::api::MachineInfo;
        use ployz_store::machines::{certificate_issuer_key, machine_key};
        let local = MachineId::generate();
        let store = Store::temporary(local.clone()).unwrap();
        // Alone and unpublished: the local Machine issues.
        assert_eq!(
            participating_machines(&store, &local).unwrap(),
            BTreeSet::from([local.clone()])
        );
        let info = |id: &MachineId, phase: LocalMachinePhase| MachineInfo {
            id: id.clone(),
            name: "m1".parse().unwrap(),
            phase,
            subnet: "10.210.1.0/24".parse().unwrap(),
            public_key: "k".into(),
            management_address: ployz_core::ManagementAddress::from_public_key(&[7; 32]),
            endpoints: Vec::new(),
            version: String::new(),
            wireguard_backend: None,
            edge_features: Vec::new(),
        };
        store
            .put(
                &machine_key(&local),
                serde_json::to_vec(&info(&local, LocalMachinePhase::Joining)).unwrap(),
            )
            .unwrap();
        // Its own record says joining: it does not issue.
        assert!(participating_machines(&store, &local).unwrap().is_empty());
        store
            .put(
                &machine_key(&local),
                serde_json::to_vec(&info(&local, LocalMachinePhase::Participating)).unwrap(),
            )
            .unwrap();
        assert_eq!(
            participating_machines(&store, &local).unwrap(),
            BTreeSet::from([local.clone()])
        );
        // Another participating Machine counts only while its daemon runs the issuer.
        let other = MachineId::generate();
        let peer = Store::temporary(other.clone()).unwrap();
        peer.put(
            &machine_key(&other),
            serde_json::to_vec(&info(&other, LocalMachinePhase::Participating)).unwrap(),
        )
        .unwrap();
        store
            .merge(&peer.scan(&ployz_store::KeyPrefix::everything()).unwrap())
            .unwrap();
        assert_eq!(
            participating_machines(&store, &local).unwrap(),
            BTreeSet::from([local.clone()])
        );
        peer.put(&certificate_issuer_key(&other), Vec::new())
            .unwrap();
        store
            .merge(&peer.scan(&ployz_store::KeyPrefix::everything()).unwrap())
            .unwrap();
        assert_eq!(
            participating_machines(&store, &local).unwrap(),
            BTreeSet::from([local.clone(), other.clone()])
        );
        peer.delete(&certificate_issuer_key(&other)).unwrap();
        store
            .merge(&peer.scan(&ployz_store::KeyPrefix::everything()).unwrap())
            .unwrap();
        assert_eq!(
            participating_machines(&store, &local).unwrap(),
            BTreeSet::from([local.clone()])
        );
    }
}
