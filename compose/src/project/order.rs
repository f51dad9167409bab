//! `depends_on` across the project: dependencies checked against every service (and the
//! enabled profiles), then the services in dependency order, a cycle being an error.

use std::collections::{BTreeMap, BTreeSet};

use ployz_core::{ServiceName, ServiceSpec};

use crate::service::{Converted, Dep, ServiceCtx};
use crate::Diagnostics;

use super::Project;

impl Project<'_> {
    /// The dependencies a service keeps: not itself, not a missing service (an error, or a
    /// warning when optional), not a service left out by its profiles.
    pub(super) fn check_deps(
        &self,
        ctx: &mut ServiceCtx<'_>,
        deps: Vec<Dep>,
        all: &BTreeSet<String>,
        disabled: &BTreeMap<String, Vec<String>>,
    ) -> Vec<String> {
        let mut kept = Vec::new();
        for dep in deps {
            if dep.name == ctx.name.as_str() {
                ctx.err(
                    &dep.key,
                    Some(dep.name.clone()),
                    "a service cannot depend on itself",
                    Some("remove it from depends_on"),
                );
                continue;
            }
            if !all.contains(&dep.name) {
                if dep.required {
                    ctx.err(
                        &dep.key,
                        Some(dep.name.clone()),
                        format!(
                            "depends on '{}', which is not a service of this project",
                            dep.name
                        ),
                        Some("fix the name, or add the service"),
                    );
                } else {
                    ctx.warn(&dep.key, format!("'{}' is not a service of this project; the optional dependency is ignored", dep.name));
                }
                continue;
            }
            if let Some(profiles) = disabled.get(&dep.name) {
                if dep.required {
                    ctx.err(
                        &dep.key,
                        Some(dep.name.clone()),
                        format!(
                            "depends on '{}', which is in a profile that is not enabled",
                            dep.name
                        ),
                        Some(&format!("enable it with -p {}", profiles.join(" or -p "))),
                    );
                }
                continue;
            }
            kept.push(dep.name);
        }
        kept
    }

    /// Services in dependency order, ties by name; a cycle is an error naming it.
    pub(super) fn dependency_order(
        &self,
        deps: &BTreeMap<String, Vec<String>>,
        d: &mut Diagnostics,
    ) -> Option<Vec<String>> {
        let mut remaining: BTreeMap<&str, BTreeSet<&str>> = deps
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str(),
                    v.iter()
                        .map(String::as_str)
                        .filter(|n| deps.contains_key(*n))
                        .collect(),
                )
            })
            .collect();
        let mut order = Vec::new();
        loop {
            let ready: Option<&str> = remaining
                .iter()
                .find(|(_, ds)| ds.is_empty())
                .map(|(k, _)| *k);
            let Some(next) = ready else { break };
            remaining.remove(next);
            for ds in remaining.values_mut() {
                ds.remove(next);
            }
            order.push(next.to_owned());
        }
        if remaining.is_empty() {
            return Some(order);
        }
        let cycle = find_cycle(&remaining)?;
        let file = self.section_file("services", cycle[0]);
        let file = self
            .files
            .get(self.origins.service_file(cycle[0], "depends_on"))
            .map(String::as_str)
            .unwrap_or(file);
        d.error(
            file,
            Some(cycle[0]),
            Some("depends_on"),
            None,
            format!("depends_on forms a cycle: {}", cycle.join(" -> ")),
            Some("remove one of these dependencies".into()),
        );
        None
    }
}

/// A cycle among the services left (each with a dependency left), from the first service of
/// the cycle back to it.
fn find_cycle<'s>(remaining: &BTreeMap<&'s str, BTreeSet<&'s str>>) -> Option<Vec<&'s str>> {
    // Walk from the smallest name left until a service repeats: that is a cycle.
    let start = *remaining.keys().next()?;
    let mut path = vec![start];
    let mut cur = start;
    loop {
        let next = *remaining.get(cur)?.iter().next()?;
        if let Some(pos) = path.iter().position(|n| *n == next) {
            let mut cycle: Vec<&str> = path[pos..].to_vec();
            cycle.push(next);
            return Some(cycle);
        }
        path.push(next);
        cur = next;
    }
}

/// The specs in `order`, each with its kept dependencies (sorted, unique).
pub(super) fn in_order(
    converted: Vec<Converted>,
    deps: &BTreeMap<String, Vec<String>>,
    order: Vec<String>,
) -> Vec<ServiceSpec> {
    let mut by_name: BTreeMap<String, ServiceSpec> = converted
        .into_iter()
        .map(|c| (c.spec.name.to_string(), c.spec))
        .collect();
    let mut specs = Vec::new();
    for name in order {
        if let Some(mut spec) = by_name.remove(&name) {
            let mut names: Vec<ServiceName> = deps
                .get(&name)
                .into_iter()
                .flatten()
                .filter_map(|n| n.parse().ok())
                .collect();
            names.sort();
            names.dedup();
            spec.depends_on = names;
            specs.push(spec);
        }
    }
    specs
}
