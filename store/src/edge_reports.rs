//! Where each Machine's edge reports what it serves ([`EdgeReport`]): one machine-owned record
//! per Machine, written by its edge whenever its published table or the requests in flight to a
//! drained container change, and read by the Machine draining a container to learn whether every
//! other edge has let it go.

use ployz_core::{EdgeReport, MachineId};

use crate::{Key, KeyPrefix, Owner, Store, StoreError};

/// Store namespace of edge reports: machine-owned, one record named [`REPORT_NAME`].
pub const EDGE_NAMESPACE: &str = "edge";

/// The name of a Machine's edge report within [`EDGE_NAMESPACE`].
pub const REPORT_NAME: &str = "report";

/// The key of `machine`'s edge report.
pub fn report_key(machine: &MachineId) -> Key {
    Key::machine(machine, EDGE_NAMESPACE, REPORT_NAME)
}

/// The prefix every edge report is under (for watching them).
pub fn reports_prefix() -> KeyPrefix {
    KeyPrefix::machine_namespace(EDGE_NAMESPACE)
}

/// Writes this Machine's report (flushed when this returns).
pub fn put_report(store: &Store, report: &EdgeReport) -> Result<(), StoreError> {
    store.put(
        &report_key(store.local()),
        serde_json::to_vec(report).expect("an edge report serialises"),
    )?;
    Ok(())
}

/// Every Machine's report this store holds; a record that does not decode is left out (its
/// edge has not reported anything this Machine understands).
pub fn reports(store: &Store) -> Result<Vec<(MachineId, EdgeReport)>, StoreError> {
    Ok(store
        .scan_live(&reports_prefix())?
        .iter()
        .filter(|r| r.key.name() == REPORT_NAME)
        .filter_map(|r| {
            let Owner::Machine(machine) = r.key.owner() else {
                return None;
            };
            let report = serde_json::from_slice(r.live_value()?).ok()?;
            Some((machine.clone(), report))
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use ployz_core::{AppliedDrain, ContainerId};

    use super::*;

    #[test]
    fn a_report_reads_back_by_machine_and_settles_only_its_own_drain() {
        let here = MachineId::generate();
        let store = Store::temporary(here.clone()).unwrap();
        assert!(reports(&store).unwrap().is_empty());
        let c: ContainerId = format!("{:064x}", 7).parse().unwrap();
        let report = EdgeReport {
            generation: 4,
            drains: vec![AppliedDrain {
                container_id: c.clone(),
                set_at_ms: 100,
                in_flight: 0,
            }],
        };
        put_report(&store, &report).unwrap();
        let read = reports(&store).unwrap();
        assert_eq!(read, vec![(here, report.clone())]);
        assert!(report.settled(&c, 100));
        assert!(
            !report.settled(&c, 99),
            "another drain of the same container"
        );
        let busy = EdgeReport {
            drains: vec![AppliedDrain {
                in_flight: 2,
                ..report.drains[0].clone()
            }],
            ..report
        };
        assert!(!busy.settled(&c, 100), "requests still in flight");
    }
}
