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
    let answering = machines.iter().map(|m| {
        let info = &m.machine.info;
        let why = if info.edge_features.is_empty() {
            format!("its daemon, release '{}', publishes none", info.version)
        } else {
            format!("it publishes {}", info.edge_features.join(", "))
        };
        (info.name.to_string(), info.edge_features.as_slice(), why)
    });
    // A Machine whose own record was not read says nothing either way.
    let left_out = not_included.iter().filter_map(|n| {
        let published = n.edge_features.as_deref()?;
        let why = format!(
            "it is left out of this Deploy ({}), and its last record publishes {}",
            n.reason,
            if published.is_empty() {
                "none".to_owned()
            } else {
                published.join(", ")
            }
        );
        Some((n.name.clone(), published, why))
    });
    for (machine, published, why) in answering.chain(left_out) {
        if let Some(feature) = needed
            .iter()
            .find(|f| !published.iter().any(|p| p == f.name()))
        {
            return Err(PlanError::EdgeFeatureMissing {
                name: spec.name.to_string(),
                feature: *feature,
                machine,
                why,
            });
        }
    }
    Ok(())
}
