//! Edge Features: every Machine's edge serves every Service's Ingress Hostnames, so a Service
//! whose routes need a feature of the edge is refused while any Machine of the Cluster does not
//! publish it, the ones this Deploy leaves out included (their edges serve again when they come
//! back). Without this, a Machine still on an older release would serve a `basic_auth` route
//! without asking for credentials.

use ployz_core::{MachineSnapshot, NotIncluded, ServiceSpec};

use super::PlanError;

/// The first Edge Feature `spec` needs that a Machine does not publish, by Machine ID order
/// (answering Machines first), then feature order.
pub(super) fn check_edge_features(
    spec: &ServiceSpec,
    machines: &[MachineSnapshot],
    not_included: &[NotIncluded],
) -> Result<(), PlanError> {
    let needed = spec.edge_features();
    if needed.is_empty() {
        return Ok(());
    }
    // Each Machine: its name, what it publishes, and how this Deploy knows it.
    let answering = machines.iter().map(|m| {
        let info = &m.machine.info;
        let how = format!("its daemon, release '{}',", info.version);
        (info.name.to_string(), &info.edge_features[..], how)
    });
    // A Machine whose own record was not read says nothing either way.
    let left_out = not_included.iter().filter_map(|n| {
        let how = "it is left out of this Deploy, and its last record".to_owned();
        Some((n.name.clone(), n.edge_features.as_deref()?, how))
    });
    for (machine, published, how) in answering.chain(left_out) {
        let Some(feature) = needed
            .iter()
            .find(|f| !published.iter().any(|p| p == f.name()))
        else {
            continue;
        };
        let published = match published {
            [] => "none".to_owned(),
            names => names.join(", "),
        };
        return Err(PlanError::EdgeFeatureMissing {
            name: spec.name.to_string(),
            feature: *feature,
            machine,
            why: format!("{how} publishes {published}"),
        });
    }
    Ok(())
}
