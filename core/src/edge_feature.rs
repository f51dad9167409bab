//! Edge Features: what a Machine's edge enforces beyond sending a hostname to a Service.
//!
//! Every Machine's edge serves every Service's Ingress Hostnames, so a rule in one Service's
//! spec is only as good as the oldest edge of the Cluster: a daemon that does not know
//! `basic_auth` reads a route without it and serves it openly. Each Machine publishes the
//! features its edge enforces ([`crate::api::MachineInfo::edge_features`]); a Deploy whose
//! Services need one is refused while a Machine of the Cluster does not publish it.

use std::collections::BTreeSet;

use crate::{PathMatch, ServiceSpec};

/// One thing an edge enforces, by the name Machines publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EdgeFeature {
    /// `x-routes`: paths, exact paths, `strip_prefix`, redirects, header rules, allow lists.
    Routes,
    /// `basic_auth` in `x-routes`.
    RouteAuth,
    /// `timeout`, `max_body_size` and `error_pages` in `x-routes`.
    RouteLimits,
    /// `tcp` and `udp` entries in `x-ports`: Ingress Ports.
    IngressPorts,
}

impl EdgeFeature {
    /// Every feature this build's edge enforces: what its Machine publishes.
    pub const ALL: [EdgeFeature; 4] = [
        EdgeFeature::Routes,
        EdgeFeature::RouteAuth,
        EdgeFeature::RouteLimits,
        EdgeFeature::IngressPorts,
    ];

    /// The name a Machine publishes.
    pub fn name(self) -> &'static str {
        match self {
            EdgeFeature::Routes => "routes",
            EdgeFeature::RouteAuth => "route-auth",
            EdgeFeature::RouteLimits => "route-limits",
            EdgeFeature::IngressPorts => "ingress-ports",
        }
    }

    /// What a Compose file writes to need it.
    pub fn written_as(self) -> &'static str {
        match self {
            EdgeFeature::Routes => "x-routes",
            EdgeFeature::RouteAuth => "basic_auth in x-routes",
            EdgeFeature::RouteLimits => "timeout, max_body_size or error_pages in x-routes",
            EdgeFeature::IngressPorts => "an Ingress Port (a tcp or udp entry in x-ports)",
        }
    }

    /// The names of [`EdgeFeature::ALL`], as a Machine publishes them.
    pub fn published() -> Vec<String> {
        EdgeFeature::ALL
            .iter()
            .map(|f| f.name().to_owned())
            .collect()
    }
}

impl ServiceSpec {
    /// The Edge Features every edge of the Cluster must enforce before this spec is deployed.
    /// A route that only names a hostname's whole path (`/`, no rule) needs none: every edge
    /// serves it so.
    pub fn edge_features(&self) -> BTreeSet<EdgeFeature> {
        let mut needed = BTreeSet::new();
        for r in &self.routes {
            let plain = r.path == PathMatch::root() && !r.strip_prefix && !r.has_rules();
            if !plain {
                needed.insert(EdgeFeature::Routes);
            }
            if r.basic_auth.is_some() {
                needed.insert(EdgeFeature::RouteAuth);
            }
            if r.timeout_ms.is_some() || r.max_body_bytes.is_some() || !r.error_pages.is_empty() {
                needed.insert(EdgeFeature::RouteLimits);
            }
        }
        if self.ingress_ports().next().is_some() {
            needed.insert(EdgeFeature::IngressPorts);
        }
        needed
    }
}
