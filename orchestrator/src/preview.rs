//! The Deploy Preview as a person reads it: a tree per Service and a summary line.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use ployz_core::{
    DeployPreview, MachineId, MachineSnapshot, Operation, PortSpec, ServicePlan, UpdateOrder,
};

/// Counts of the preview's summary line.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    pub create: usize,
    pub replace_start_first: usize,
    pub replace_stop_first: usize,
    pub remove: usize,
    pub machines: usize,
}

/// Counts what a plan does.
pub fn summary(preview: &DeployPreview) -> Summary {
    let mut s = Summary::default();
    let mut machines = BTreeSet::new();
    for op in preview.plan.operations() {
        machines.insert(op.machine_id().clone());
        match op {
            Operation::RunContainer { .. } => s.create += 1,
            Operation::ReplaceContainer { order, .. } => match order {
                UpdateOrder::StartFirst => s.replace_start_first += 1,
                UpdateOrder::StopFirst => s.replace_stop_first += 1,
            },
            Operation::RemoveContainer { .. } => s.remove += 1,
            _ => {}
        }
    }
    s.machines = machines.len();
    s
}

fn machine_name<'a>(machines: &'a [MachineSnapshot], id: &'a MachineId) -> &'a str {
    machines
        .iter()
        .find(|m| &m.machine.info.id == id)
        .map(|m| m.machine.info.name.as_str())
        .unwrap_or(id.as_str())
}

fn human_ms(ms: u64) -> String {
    if ms.is_multiple_of(60_000) && ms > 0 {
        format!("{}m", ms / 60_000)
    } else if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

/// One line for an operation, without the tree prefix.
/// A container an interrupted command left unverified, and what this Deploy does about it.
pub fn describe_left_unverified(
    left: &ployz_core::LeftUnverified,
    machines: &[MachineSnapshot],
) -> String {
    format!(
        "{} on {} ({}) was left unverified by {}: it is not kept; {} is deployed through its health gates again",
        left.container.name,
        machine_name(machines, &left.machine_id),
        left.status,
        left.lease,
        left.service_name
    )
}

/// One image transfer, as the preview and the progress lines show it.
pub fn describe_transfer(t: &ployz_core::ImageTransfer, machines: &[MachineSnapshot]) -> String {
    match &t.from {
        Some(from) => format!(
            "⇣ fetch image {} on {} from {} (over the mesh, only the layers it lacks)",
            t.image,
            machine_name(machines, &t.machine_id),
            machine_name(machines, from)
        ),
        None => format!(
            "⇡ send image {} to {} from the local Docker (only the layers it lacks)",
            t.image,
            machine_name(machines, &t.machine_id)
        ),
    }
}

pub fn describe(op: &Operation, machines: &[MachineSnapshot]) -> String {
    let on = |id: &MachineId| format!(" on {}", machine_name(machines, id));
    match op {
        Operation::CreateVolume { machine_id, volume } => {
            format!("+ create volume {}{}", volume.name, on(machine_id))
        }
        Operation::RunHook {
            machine_id, hook, ..
        } => format!(
            "▶ run pre-deploy hook [{}] (timeout {}){}",
            hook.command.join(" "),
            human_ms(hook.timeout_ms),
            on(machine_id)
        ),
        Operation::RunContainer { machine_id, .. } => format!("+ run container{}", on(machine_id)),
        Operation::ReplaceContainer {
            machine_id,
            old,
            order,
            ..
        } => match order {
            UpdateOrder::StartFirst => {
                format!("+/- replace container {}{}", old.name, on(machine_id))
            }
            UpdateOrder::StopFirst => {
                format!(
                    "-/+ replace container {} (stop-first){}",
                    old.name,
                    on(machine_id)
                )
            }
        },
        Operation::StopContainer {
            machine_id,
            container,
        } => format!("- stop container {}{}", container.name, on(machine_id)),
        Operation::RemoveContainer {
            machine_id,
            container,
        } => format!("- remove container {}{}", container.name, on(machine_id)),
    }
}

/// The host ports a Service's new containers bind, one line per port with the Machines it is
/// bound on: `port: 0.0.0.0:8080 → 80/tcp on m1, m2`, or `port: (any free port) → 3000/tcp on m1`
/// when Docker picks.
pub fn port_lines(service: &ServicePlan, machines: &[MachineSnapshot]) -> Vec<String> {
    let mut on: Vec<(&PortSpec, Vec<&str>)> = Vec::new();
    for op in &service.operations {
        let (Operation::RunContainer {
            machine_id, spec, ..
        }
        | Operation::ReplaceContainer {
            machine_id, spec, ..
        }) = op
        else {
            continue;
        };
        let name = machine_name(machines, machine_id);
        for p in spec
            .ports
            .iter()
            .filter(|p| matches!(p, PortSpec::Host { .. }))
        {
            match on.iter_mut().find(|(q, _)| *q == p) {
                Some((_, names)) if names.contains(&name) => {}
                Some((_, names)) => names.push(name),
                None => on.push((p, vec![name])),
            }
        }
    }
    on.into_iter()
        .filter_map(|(p, names)| {
            let PortSpec::Host {
                host_ip,
                host_port,
                container_port,
                protocol,
            } = p
            else {
                return None;
            };
            let port = host_port.map_or("(any free port)".to_owned(), |p| p.to_string());
            let address = match host_ip.as_deref() {
                None if host_port.is_none() => port,
                None => format!("0.0.0.0:{port}"),
                Some(ip) if ip.contains(':') && !ip.contains('/') => format!("[{ip}]:{port}"),
                Some(ip) => format!("{ip}:{port}"),
            };
            Some(format!(
                "port: {address} → {container_port}/{protocol} on {}",
                names.join(", ")
            ))
        })
        .collect()
}

/// The plan as a person reads it: volume operations, a tree per Service with work to do, and the
/// summary line, or "Services are up to date." when nothing changes; then the Machines the
/// Deploy leaves out. The preview's warnings are
/// not part of it: the CLI writes them to stderr (`warning: ...`), so that stdout holds only the
/// plan, and `--json` carries them in the report.
pub fn render(preview: &DeployPreview, machines: &[MachineSnapshot]) -> String {
    let mut out = String::new();
    if preview.plan.is_empty() {
        out.push_str("Services are up to date.\n");
        not_included_lines(&mut out, preview);
        return out;
    }
    for left in &preview.plan.left_unverified {
        let _ = writeln!(out, "{}", describe_left_unverified(left, machines));
    }
    if !preview.plan.left_unverified.is_empty() {
        out.push('\n');
    }
    for t in &preview.plan.transfers {
        let _ = writeln!(out, "{}", describe_transfer(t, machines));
    }
    if !preview.plan.transfers.is_empty() {
        out.push('\n');
    }
    for op in &preview.plan.volume_operations {
        let _ = writeln!(out, "{}", describe(op, machines));
    }
    for service in preview
        .plan
        .services
        .iter()
        .filter(|s| !s.operations.is_empty())
    {
        let header = if service.is_new {
            "+ create service"
        } else {
            "~ update service"
        };
        let global = if service.mode == ployz_core::ServiceMode::Global {
            " (global)"
        } else {
            ""
        };
        // The DNS name, where it is not simply the Service Name (the zone is the dns crate's).
        let label = service.name.dns_label();
        let dns = if label == service.name.as_str() {
            String::new()
        } else {
            format!(" (DNS: {label}.internal)")
        };
        let _ = writeln!(out, "{header} {}{dns}{global}", service.name);
        match &service.previous_image {
            Some(prev) => {
                let _ = writeln!(out, "│ image: {prev} → {}", service.image);
            }
            None if service.is_new => {
                let _ = writeln!(out, "│ image: {}", service.image);
            }
            None => {}
        }
        if service.mode == ployz_core::ServiceMode::Replicated {
            let _ = writeln!(out, "│ replicas: {}", service.replicas);
        }
        for line in port_lines(service, machines) {
            let _ = writeln!(out, "│ {line}");
        }
        let last = service.operations.len() - 1;
        for (i, op) in service.operations.iter().enumerate() {
            let branch = if i == last { "└─" } else { "├─" };
            let _ = writeln!(out, "{branch} {}", describe(op, machines));
        }
        out.push('\n');
    }
    let s = summary(preview);
    let _ = writeln!(
        out,
        "{} create · {} replace (start-first) · {} replace (stop-first) · {} remove · across {} machine{}",
        s.create,
        s.replace_start_first,
        s.replace_stop_first,
        s.remove,
        s.machines,
        if s.machines == 1 { "" } else { "s" }
    );
    not_included_lines(&mut out, preview);
    out
}

/// One line per Machine the Deploy leaves out: it was not asked what it runs, and nothing on it
/// changes.
fn not_included_lines(out: &mut String, preview: &DeployPreview) {
    for n in &preview.not_included {
        let _ = writeln!(
            out,
            "not included: Machine {} ({}): {}; its containers are left as they are",
            n.name, n.machine, n.reason
        );
    }
}
