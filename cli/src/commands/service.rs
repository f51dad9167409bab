//! Commands over Services and their containers: ls, ps, inspect, logs, exec, rm, start, stop,
//! scale. Services are derived from the containers the Machine observes; a Service Selector
//! that matches several Service IDs is reported, never guessed.

use std::collections::BTreeMap;

use anyhow::{anyhow, bail};
use clap::Args;
use ployz_core::api::{docker_paths as paths, ExecRequest, ExecResult, StopContainerRequest};
use ployz_core::{
    ContainerKind, ContainerRuntimeObservation, ContainerSelector, DeployIntent, DrainMark,
    Identified, IngressProtocol, PortSpec, ServiceId, ServiceMode, ServiceSelector, ServiceSpec,
};
use serde::Serialize;

use crate::client::ApiClient;
use crate::leases::{Leases, Reach};
use crate::output::{print_json, print_table, table};
use crate::GlobalArgs;

/// One Service as derived from its observed containers.
#[derive(Debug, Clone, Serialize)]
pub struct ServiceView {
    pub id: ServiceId,
    pub name: String,
    pub mode: ServiceMode,
    /// Running containers / all containers.
    pub running: usize,
    pub containers: usize,
    pub image: String,
    pub endpoints: Vec<String>,
    /// The Machines its containers are on.
    pub machines: Vec<ployz_core::MachineId>,
    /// The newest container's Resolved Service Spec.
    #[serde(skip)]
    pub spec: Option<ServiceSpec>,
}

impl Identified for ServiceView {
    fn id(&self) -> &str {
        self.id.as_str()
    }
    fn name(&self) -> &str {
        &self.name
    }
}

fn endpoints(spec: &ServiceSpec) -> Vec<String> {
    spec.ports
        .iter()
        .filter_map(|p| match p {
            PortSpec::Ingress {
                hostname: Some(h),
                published,
                protocol,
                ..
            } => {
                let scheme = match protocol {
                    IngressProtocol::Http => "http",
                    IngressProtocol::Https => "https",
                };
                Some(match published {
                    Some(port) => format!("{scheme}://{h}:{port}"),
                    None => format!("{scheme}://{h}"),
                })
            }
            PortSpec::Host {
                host_port: Some(host_port),
                container_port,
                ..
            } => Some(format!("{host_port}->{container_port} (host)")),
            // Docker picked the host port; the spec does not know which.
            PortSpec::Host {
                host_port: None,
                container_port,
                ..
            } => Some(format!("*->{container_port} (host)")),
            PortSpec::Stream {
                published,
                container_port,
                protocol,
            } => Some(format!(
                "{published}/{protocol}->{container_port} (every edge)"
            )),
            _ => None,
        })
        .collect()
}

/// Every managed container the connected Machine runs.
pub async fn containers(
    client: &mut ApiClient,
) -> anyhow::Result<Vec<ContainerRuntimeObservation>> {
    client.get(paths::CONTAINERS).await
}

/// What the Machines `wanted` names (every Machine by default) run, through the Machine the CLI
/// reaches: every container, the Machine Names by ID, the Machines that did not answer, and how
/// many were asked.
pub struct Everywhere {
    pub containers: Vec<ContainerRuntimeObservation>,
    pub names: BTreeMap<ployz_core::MachineId, String>,
    pub failures: Vec<ployz_core::TargetFailure>,
    pub asked: usize,
}

impl Everywhere {
    pub async fn ask(client: &mut ApiClient, wanted: &[String]) -> anyhow::Result<Everywhere> {
        let (answers, failures) = crate::targets::get_all::<Vec<ContainerRuntimeObservation>>(
            client,
            wanted,
            paths::CONTAINERS,
        )
        .await?;
        let asked = answers.len() + failures.len();
        let mut names = BTreeMap::new();
        let mut containers = Vec::new();
        for (machine, list) in answers {
            names.insert(machine.machine.clone(), machine.name.clone());
            containers.extend(list);
        }
        Ok(Everywhere {
            containers,
            names,
            failures,
            asked,
        })
    }

    /// The Machine Name of `id` (its ID's first characters when unknown).
    pub fn name(&self, id: &ployz_core::MachineId) -> String {
        self.names
            .get(id)
            .filter(|n| !n.is_empty())
            .cloned()
            .unwrap_or_else(|| id.as_str().chars().take(12).collect())
    }
}

/// Services derived from containers (hook containers excluded).
pub fn services(containers: &[ContainerRuntimeObservation]) -> Vec<ServiceView> {
    let mut by_id: BTreeMap<&ServiceId, Vec<&ContainerRuntimeObservation>> = BTreeMap::new();
    for c in containers
        .iter()
        .filter(|c| c.kind == ContainerKind::Service)
    {
        by_id.entry(&c.service_id).or_default().push(c);
    }
    let mut out: Vec<ServiceView> = by_id
        .into_iter()
        .map(|(id, cs)| {
            // What the Service is: its newest running container's spec. A Deploy that failed
            // keeps its new container stopped for inspection and the old one serving; that
            // stopped one is not what the Service runs (nor what `scale` should deploy again).
            let newest = cs
                .iter()
                .filter(|c| c.is_running())
                .max_by_key(|c| c.created_at)
                .or_else(|| cs.iter().max_by_key(|c| c.created_at))
                .expect("non-empty");
            let spec = newest.spec.clone();
            ServiceView {
                id: id.clone(),
                name: newest.service_name.to_string(),
                mode: spec.as_ref().map(|s| s.mode).unwrap_or_default(),
                running: cs.iter().filter(|c| c.is_running()).count(),
                containers: cs.len(),
                image: newest.image.clone(),
                endpoints: spec.as_ref().map(endpoints).unwrap_or_default(),
                machines: {
                    let mut on: Vec<ployz_core::MachineId> =
                        cs.iter().map(|c| c.machine_id.clone()).collect();
                    on.sort();
                    on.dedup();
                    on
                },
                spec,
            }
        })
        .collect();
    out.sort_by(|a, b| (&a.name, &a.id).cmp(&(&b.name, &b.id)));
    out
}

/// The one Service a selector names.
pub(crate) fn one_service<'a>(
    all: &'a [ServiceView],
    selector: &str,
) -> anyhow::Result<&'a ServiceView> {
    let sel: ServiceSelector = selector.parse().map_err(|e| anyhow!("{e}"))?;
    sel.resolve(all)
        .one()
        .map_err(|e| anyhow!("{e}; `ployz ls` lists the Services"))
}

#[derive(Debug, Args)]
pub struct LsArgs {
    /// Print JSON: `values` (the Services, each with the Machines it runs on) and `failures`
    /// (the Machines that did not answer).
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    machines: crate::targets::MachinesArg,
}

pub async fn ls(global: &GlobalArgs, args: LsArgs) -> anyhow::Result<()> {
    let mut client = super::connect(global).await?;
    let everywhere = Everywhere::ask(&mut client, &args.machines.machines).await?;
    let all = services(&everywhere.containers);
    if args.json {
        print_json(&serde_json::json!({ "values": all, "failures": everywhere.failures }))?;
        return crate::targets::report_failures(&everywhere.failures, everywhere.asked);
    }
    let shared_names = {
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for s in &all {
            *counts.entry(&s.name).or_default() += 1;
        }
        counts.values().any(|n| *n > 1)
    };
    let mut header = vec!["NAME"];
    if shared_names {
        header.push("ID");
    }
    header.extend(["MODE", "REPLICAS", "MACHINES", "IMAGE", "ENDPOINTS"]);
    let mut t = table(&header);
    for s in &all {
        let mut row = vec![s.name.clone()];
        if shared_names {
            row.push(s.id.to_string());
        }
        row.extend([
            s.mode.as_str().to_owned(),
            format!("{}/{}", s.running, s.containers),
            s.machines
                .iter()
                .map(|m| everywhere.name(m))
                .collect::<Vec<_>>()
                .join(", "),
            s.image.clone(),
            s.endpoints.join(", "),
        ]);
        t.add_row(row);
    }
    print_table(&t);
    crate::targets::report_failures(&everywhere.failures, everywhere.asked)
}

#[derive(Debug, Args)]
pub struct PsArgs {
    /// Print JSON: `values` (the containers, each with its `machine_name`) and `failures` (the
    /// Machines that did not answer).
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    machines: crate::targets::MachinesArg,
    /// Show what the Machine's store holds (Replicated Observation, possibly stale) instead of
    /// asking Docker now.
    #[arg(long)]
    replicated: bool,
}

pub async fn ps(global: &GlobalArgs, args: PsArgs) -> anyhow::Result<()> {
    let mut client = super::connect(global).await?;
    let (all, names, failures, asked): (Vec<ContainerRuntimeObservation>, _, _, usize) = if args
        .replicated
    {
        // The store holds every Machine's observations already: one Machine answers.
        let all: Vec<ContainerRuntimeObservation> = client.get(paths::STORED_CONTAINERS).await?;
        let names = client
            .get::<ployz_core::api::MachineList>(ployz_core::api::paths::MACHINES)
            .await
            .map(|list| {
                list.values
                    .into_iter()
                    .map(|v| (v.info.id, v.info.name.to_string()))
                    .collect()
            })
            .unwrap_or_default();
        (all, names, Vec::new(), 1)
    } else {
        let e = Everywhere::ask(&mut client, &args.machines.machines).await?;
        (e.containers, e.names, e.failures, e.asked)
    };
    let machine_name = |c: &ContainerRuntimeObservation| {
        names
            .get(&c.machine_id)
            .filter(|n: &&String| !n.is_empty())
            .cloned()
            .unwrap_or_else(|| c.machine_id.as_str().chars().take(12).collect())
    };
    let drains: Vec<DrainMark> = match client.get(paths::DRAINS).await {
        Ok(marks) => marks,
        Err(e) => {
            // A daemon that does not list drain marks shows none.
            let absent = e
                .downcast_ref::<ployz_core::api::ApiError>()
                .is_some_and(|api| api.code == ployz_core::api::ErrorCode::NotFound);
            if !absent {
                eprintln!("warning: cannot show which containers are draining: {e:#}");
            }
            Vec::new()
        }
    };
    let mark_of = |c: &ContainerRuntimeObservation| {
        drains
            .iter()
            .find(|d| d.container_id == c.id && d.machine_id == c.machine_id)
    };
    if args.json {
        let mut listed = Vec::with_capacity(all.len());
        for c in &all {
            let mut value = serde_json::to_value(c)?;
            if let Some(object) = value.as_object_mut() {
                object.insert("machine_name".into(), machine_name(c).into());
                if let Some(mark) = mark_of(c) {
                    object.insert("draining".into(), serde_json::to_value(mark)?);
                }
            }
            listed.push(value);
        }
        print_json(&serde_json::json!({ "values": listed, "failures": failures }))?;
        return crate::targets::report_failures(&failures, asked);
    }
    let mut t = table(&[
        "MACHINE",
        "SERVICE",
        "CONTAINER ID",
        "NAME",
        "IMAGE",
        "STATUS",
        "HOOK",
        "IP ADDRESS",
    ]);
    for c in &all {
        t.add_row(vec![
            machine_name(c),
            c.service_name.to_string(),
            c.id.as_str().chars().take(12).collect(),
            c.name.clone(),
            c.image.clone(),
            match mark_of(c) {
                Some(_) => format!("{}, draining", c.status()),
                None => c.status(),
            },
            if c.kind == ContainerKind::Hook {
                "pre-deploy".into()
            } else {
                String::new()
            },
            c.address.map(|a| a.to_string()).unwrap_or_default(),
        ]);
    }
    print_table(&t);
    crate::targets::report_failures(&failures, asked)
}

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// Service name or ID.
    service: String,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    machines: crate::targets::MachinesArg,
}

pub async fn inspect(global: &GlobalArgs, args: InspectArgs) -> anyhow::Result<()> {
    let mut client = super::connect(global).await?;
    let everywhere = Everywhere::ask(&mut client, &args.machines.machines).await?;
    let all_containers = &everywhere.containers;
    let all = services(all_containers);
    let s = one_service(&all, &args.service)?;
    let mine: Vec<&ContainerRuntimeObservation> = all_containers
        .iter()
        .filter(|c| c.service_id == s.id)
        .collect();
    if args.json {
        #[derive(Serialize)]
        struct Inspect<'a> {
            service: &'a ServiceView,
            spec: &'a Option<ServiceSpec>,
            containers: Vec<&'a ContainerRuntimeObservation>,
        }
        print_json(&Inspect {
            service: s,
            spec: &s.spec,
            containers: mine,
        })?;
        return crate::targets::report_failures(&everywhere.failures, everywhere.asked);
    }
    println!("ID:    {}", s.id);
    println!("Name:  {}", s.name);
    println!("Mode:  {}", s.mode.as_str());
    println!();
    // The Plan ID column appears once a bound Deploy (`--plan-id`) ran one of the containers.
    let bound = mine.iter().any(|c| c.plan_id.is_some());
    let mut headers = vec![
        "MACHINE",
        "CONTAINER ID",
        "NAME",
        "IMAGE",
        "STATUS",
        "IP ADDRESS",
    ];
    if bound {
        headers.push("PLAN ID");
    }
    let mut t = table(&headers);
    for c in mine {
        let mut row = vec![
            everywhere.name(&c.machine_id),
            c.id.as_str().chars().take(12).collect(),
            c.name.clone(),
            c.image.clone(),
            c.status(),
            c.address.map(|a| a.to_string()).unwrap_or_default(),
        ];
        if bound {
            row.push(c.plan_id.clone().unwrap_or_else(|| "-".to_owned()));
        }
        t.add_row(row);
    }
    print_table(&t);
    crate::targets::report_failures(&everywhere.failures, everywhere.asked)
}

#[derive(Debug, Args)]
pub struct LogsArgs {
    /// `SERVICE` or `SERVICE/CONTAINER` (name, ID or ID prefix).
    target: String,
    /// Keep printing new lines, of every container of the Service at once (each line prefixed by
    /// its Machine and container), until they stop.
    #[arg(short, long)]
    follow: bool,
    /// Lines from the end of each container's log, or `all`.
    #[arg(short = 'n', long, default_value = "100")]
    tail: String,
    /// Only lines since this time: Unix seconds, a duration back from now (10m, 1h30m, 2d) or
    /// an RFC 3339 time (2026-12-01T10:00:00Z).
    #[arg(long, value_name = "TIME")]
    since: Option<crate::time_arg::TimeArg>,
    /// Only lines until this time, in the same forms as --since.
    #[arg(long, value_name = "TIME")]
    until: Option<crate::time_arg::TimeArg>,
    #[command(flatten)]
    machines: crate::targets::MachinesArg,
}

pub async fn logs(global: &GlobalArgs, args: LogsArgs) -> anyhow::Result<()> {
    let tail = match args.tail.as_str() {
        "all" => None,
        n => Some(
            n.parse::<usize>()
                .map_err(|_| anyhow!("--tail '{n}' is not a number or 'all'"))?,
        ),
    };
    let mut client = super::connect(global).await?;
    let everywhere = Everywhere::ask(&mut client, &args.machines.machines).await?;
    for f in &everywhere.failures {
        eprintln!("warning: Machine {}: {}", f.target, f.reason);
    }
    let all_containers = everywhere.containers.clone();
    let (service, container) = match args.target.split_once('/') {
        Some((s, c)) => (s, Some(c)),
        None => (args.target.as_str(), None),
    };
    let all = services(&all_containers);
    let s = one_service(&all, service)?;
    let mut mine: Vec<ContainerRuntimeObservation> = all_containers
        .into_iter()
        .filter(|c| c.service_id == s.id && c.kind == ContainerKind::Service)
        .collect();
    if let Some(sel) = container {
        let sel: ContainerSelector = sel.parse().map_err(|e| anyhow!("{e}"))?;
        let one = sel.resolve(&mine).one()?.clone();
        mine = vec![one];
    }
    let multi = mine.len() > 1;
    let machines: std::collections::BTreeSet<&ployz_core::MachineId> =
        mine.iter().map(|c| &c.machine_id).collect();
    let mut query = vec![format!("follow={}", args.follow)];
    if let Some(t) = tail {
        query.push(format!("tail={t}"));
    }
    if let Some(v) = args.since {
        query.push(format!("since={}", v.0));
    }
    if let Some(v) = args.until {
        query.push(format!("until={}", v.0));
    }
    let streams: Vec<LogStream> = mine
        .iter()
        .map(|c| LogStream {
            machine: c.machine_id.clone(),
            path: format!(
                "{}?{}",
                paths::fill(paths::CONTAINER_LOGS, c.id.as_str()),
                query.join("&")
            ),
            prefix: match (multi, machines.len() > 1) {
                (false, _) => None,
                (true, true) => Some(format!("{}/{} | ", everywhere.name(&c.machine_id), c.name)),
                (true, false) => Some(format!("{} | ", c.name)),
            },
            name: c.name.clone(),
        })
        .collect();
    let mut failures = everywhere.failures.clone();
    if args.follow && multi {
        // Every container at once, each over a connection of its own, lines merged as they come.
        let mut following = tokio::task::JoinSet::new();
        for stream in streams {
            let connection = client.connection().clone();
            following.spawn(async move {
                let streamed = async {
                    let mut own = ApiClient::connect(&connection).await?;
                    stream.run(&mut own).await
                }
                .await;
                (stream.name, streamed)
            });
        }
        while let Some(done) = following.join_next().await {
            if let Ok((name, Err(e))) = done {
                eprintln!("warning: the log of {name} stopped: {e:#}");
                failures.push(ployz_core::TargetFailure {
                    target: name,
                    reason: format!("{e:#}"),
                });
            }
        }
    } else {
        for stream in &streams {
            stream.run(&mut client).await?;
        }
    }
    crate::targets::report_failures(&failures, everywhere.asked)
}

/// One container's log, asked of its own Machine through the one reached.
struct LogStream {
    machine: ployz_core::MachineId,
    path: String,
    /// Put before each line when several containers' lines are printed together.
    prefix: Option<String>,
    name: String,
}

impl LogStream {
    /// Streams the log to stdout until its end (with `follow`, until the container stops).
    async fn run(&self, client: &mut ApiClient) -> anyhow::Result<()> {
        let mut pending = Vec::new();
        client.set_machine_target(Some(self.machine.to_string()));
        let streamed = client
            .get_stream(&self.path, |chunk| {
                let Some(prefix) = &self.prefix else {
                    // A reader that has gone (`ployz logs -f web | head`) ends the command.
                    let _ = crate::write_stdout(chunk);
                    return;
                };
                pending.extend_from_slice(chunk);
                while let Some(i) = pending.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = pending.drain(..=i).collect();
                    // One write per line: lines of streams printed together never interleave.
                    let mut text = prefix.clone().into_bytes();
                    text.extend_from_slice(&line);
                    let _ = crate::write_stdout(&text);
                }
            })
            .await;
        client.set_machine_target(None);
        streamed?;
        if let (Some(prefix), false) = (&self.prefix, pending.is_empty()) {
            let mut text = prefix.clone().into_bytes();
            text.extend_from_slice(&pending);
            text.push(b'\n');
            let _ = crate::write_stdout(&text);
        }
        Ok(())
    }
}

#[derive(Debug, Args)]
pub struct ExecArgs {
    /// Service name or ID.
    service: String,
    /// A container of the Service (name, ID or unique ID prefix); default: a running one.
    #[arg(long)]
    container: Option<String>,
    /// Only a container on these Machines (a Name or Machine ID, repeatable) [default: any].
    #[arg(short = 'm', long = "machine", value_name = "MACHINE")]
    machines: Vec<String>,
    /// The command and its arguments.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
    command: Vec<String>,
}

pub async fn exec(global: &GlobalArgs, args: ExecArgs) -> anyhow::Result<i32> {
    let mut client = super::connect(global).await?;
    let everywhere = Everywhere::ask(&mut client, &args.machines).await?;
    for f in &everywhere.failures {
        eprintln!("warning: Machine {}: {}", f.target, f.reason);
    }
    let all_containers = everywhere.containers;
    let all = services(&all_containers);
    let s = one_service(&all, &args.service)?;
    let mine: Vec<ContainerRuntimeObservation> = all_containers
        .into_iter()
        .filter(|c| c.service_id == s.id && c.kind == ContainerKind::Service)
        .collect();
    let chosen = match &args.container {
        Some(sel) => {
            let sel: ContainerSelector = sel.parse().map_err(|e| anyhow!("{e}"))?;
            sel.resolve(&mine).one()?.clone()
        }
        None => mine
            .iter()
            .find(|c| c.is_running())
            .cloned()
            .ok_or_else(|| anyhow!("Service '{}' has no running container", s.name))?,
    };
    // The container's own Machine runs it (the one reached forwards the call).
    client.set_machine_target(Some(chosen.machine_id.to_string()));
    let result: ExecResult = client
        .post(
            &paths::fill(paths::CONTAINER_EXEC, chosen.id.as_str()),
            &ExecRequest {
                command: args.command,
            },
        )
        .await?;
    print!("{}", result.stdout);
    eprint!("{}", result.stderr);
    Ok(result.exit_code as i32)
}

#[derive(Debug, Args)]
pub struct ServicesArgs {
    /// Service names or IDs.
    #[arg(required = true)]
    services: Vec<String>,
    /// Do not ask for confirmation.
    #[arg(short = 'y', long, env = "PLOYZ_AUTO_CONFIRM")]
    yes: bool,
    /// How long to wait for each Machine's lease while another command holds it.
    #[arg(long, value_name = "SECONDS", env = super::deploy::LEASE_WAIT_ENV, default_value_t = super::deploy::DEFAULT_LEASE_WAIT_SECONDS)]
    lease_wait: u64,
    /// Act on these Machines only: a Name or Machine ID (repeatable), or `*` [default: every
    /// Machine the Machine reached observes]. A Machine that does not answer is reported (a
    /// Partial Result; exit code 3) and the others are acted on.
    #[arg(short = 'm', long = "machine", value_name = "MACHINE")]
    machines: Vec<String>,
}

/// `rm`, `start` and `stop` over every container of the named Services, on every Machine that
/// runs one. They hold the leases of those Machines like a Deploy: while another command holds
/// one they wait (`--lease-wait`), then give up naming it, and on each Machine they act on the
/// containers it shows once its lease is theirs. A Machine that does not answer is reported
/// and the others are acted on (a Partial Result).
pub async fn lifecycle(global: &GlobalArgs, verb: &str, args: ServicesArgs) -> anyhow::Result<()> {
    let mut client = super::connect(global).await?;
    let everywhere = Everywhere::ask(&mut client, &args.machines).await?;
    let all = services(&everywhere.containers);
    let mut chosen = Vec::new();
    for sel in &args.services {
        chosen.push(one_service(&all, sel)?.clone());
    }
    if verb == "rm" && !args.yes {
        let names: Vec<&str> = chosen.iter().map(|s| s.name.as_str()).collect();
        super::deploy::confirm(&format!(
            "Remove Service(s) {} and all their containers?",
            names.join(", ")
        ))?;
    }
    let holding: Vec<ployz_core::MachineId> = everywhere
        .containers
        .iter()
        .filter(|c| chosen.iter().any(|s| s.id == c.service_id))
        .map(|c| c.machine_id.clone())
        .collect();
    let mut reach = Reach::observe(&mut client).await?.only(&holding);
    let command = format!("{verb} {}", args.services.join(" "));
    let mut leases = Leases::take(
        &mut client,
        &mut reach,
        &command,
        std::time::Duration::from_secs(args.lease_wait),
    )
    .await?;
    let result = lifecycle_holding(&mut client, verb, &chosen, &leases, &reach).await;
    leases.release(&mut client).await;
    result?;
    let mut failures = everywhere.failures;
    failures.extend(
        reach
            .not_included
            .iter()
            .map(|n| ployz_core::TargetFailure {
                target: n.name.clone(),
                reason: n.reason.clone(),
            }),
    );
    crate::targets::report_failures(&failures, everywhere.asked)
}

/// Acts on the chosen Services' containers, Machine by Machine under each one's lease.
async fn lifecycle_holding(
    client: &mut ApiClient,
    verb: &str,
    chosen: &[ServiceView],
    leases: &Leases,
    reach: &Reach,
) -> anyhow::Result<()> {
    for held in &leases.held {
        if let Some(id) = &held.machine.id {
            leases.aim(client, id).map_err(|e| anyhow!(e))?;
        } else {
            client.set_lease_token(Some(held.token));
        }
        let acted = lifecycle_on_machine(client, verb, chosen).await;
        Leases::aim_off(client);
        acted.map_err(|e| {
            if reach.machines.len() > 1 {
                e.context(format!("on Machine {}", held.machine.name))
            } else {
                e
            }
        })?;
    }
    for s in chosen {
        let done = match verb {
            "rm" => "removed",
            "stop" => "stopped",
            _ => "started",
        };
        println!("Service '{}' {done}.", s.name);
    }
    Ok(())
}

/// `verb` on the chosen Services' containers of the Machine `client` is aimed at.
async fn lifecycle_on_machine(
    client: &mut ApiClient,
    verb: &str,
    chosen: &[ServiceView],
) -> anyhow::Result<()> {
    let all_containers = containers(client).await?;
    for s in chosen {
        for c in all_containers.iter().filter(|c| c.service_id == s.id) {
            // No edge sends new requests to a container about to stop, and the ones in flight
            // finish first (up to its stop_grace_period, else 30 s).
            if matches!(verb, "rm" | "stop")
                && c.kind == ContainerKind::Service
                && c.state == ployz_core::ContainerState::Running
            {
                let result: ployz_core::api::DrainResult = client
                    .post(
                        &paths::fill(paths::CONTAINER_DRAIN, c.id.as_str()),
                        &ployz_core::api::DrainRequest::default(),
                    )
                    .await?;
                if result.in_flight_left > 0 {
                    eprintln!(
                        "warning: {} still had {} requests in flight after the drain timeout",
                        c.name, result.in_flight_left
                    );
                }
                if !result.unconfirmed.is_empty() {
                    eprintln!(
                        "warning: the edges of {} did not confirm they let {} go before the drain timeout",
                        result.unconfirmed.join(", "),
                        c.name
                    );
                }
            }
            match verb {
                "rm" => {
                    client
                        .delete(&paths::fill(paths::CONTAINER, c.id.as_str()))
                        .await?
                }
                "stop" => {
                    let _: serde_json::Value = client
                        .post(
                            &paths::fill(paths::CONTAINER_STOP, c.id.as_str()),
                            &StopContainerRequest::default(),
                        )
                        .await?;
                }
                "start" if c.kind == ContainerKind::Service => {
                    let _: serde_json::Value = client
                        .post(&paths::fill(paths::CONTAINER_START, c.id.as_str()), &())
                        .await?;
                }
                _ => {}
            }
        }
    }
    Ok(())
}

#[derive(Debug, Args)]
pub struct ScaleArgs {
    /// Service name or ID.
    service: String,
    /// How many containers it should run (1 or more).
    replicas: u32,
    /// Do not ask for confirmation.
    #[arg(short = 'y', long, env = "PLOYZ_AUTO_CONFIRM")]
    yes: bool,
    /// How long to wait for the Machine's lease while another command holds it.
    #[arg(long, value_name = "SECONDS", env = super::deploy::LEASE_WAIT_ENV, default_value_t = super::deploy::DEFAULT_LEASE_WAIT_SECONDS)]
    lease_wait: u64,
}

pub async fn scale(global: &GlobalArgs, args: ScaleArgs) -> anyhow::Result<()> {
    if args.replicas == 0 {
        bail!(
            "scaling to 0 is refused; use `ployz stop {}` or `ployz rm {}`",
            args.service,
            args.service
        );
    }
    let mut client = super::connect(global).await?;
    let everywhere = Everywhere::ask(&mut client, &[]).await?;
    for f in &everywhere.failures {
        eprintln!("warning: Machine {}: {}", f.target, f.reason);
    }
    let all = services(&everywhere.containers);
    let s = one_service(&all, &args.service)?;
    let mut spec = s
        .spec
        .clone()
        .ok_or_else(|| anyhow!("Service '{}' carries no readable spec; redeploy it", s.name))?;
    if spec.mode == ServiceMode::Global {
        bail!(
            "Service '{}' is global: it runs one container per Machine and cannot be scaled",
            s.name
        );
    }
    spec.replicas = args.replicas;
    let intent = DeployIntent::all(vec![spec], vec![]);
    let mut flow = super::deploy::Flow::confirmed(args.yes);
    flow.lease_wait = std::time::Duration::from_secs(args.lease_wait);
    flow.command = Some(format!("scale {} to {}", s.name, args.replicas));
    super::deploy::deploy_intent(&mut client, &intent, vec![], &flow).await
}
