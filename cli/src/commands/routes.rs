//! `ployz routes`: the route table as one Machine's edge serves it now, so a user can see why a
//! request went where it went.

use clap::Args;
use ployz_core::api::{self, EdgeRoutes};

use crate::output::{print_json, print_table, table};
use crate::GlobalArgs;

#[derive(Debug, Args)]
pub struct RoutesArgs {
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// The Machine whose edge to show: a Name or Machine ID [default: the Machine reached].
    /// The call is forwarded to it over the mesh.
    #[arg(short = 'm', long = "machine", value_name = "MACHINE")]
    machine: Option<String>,
}

pub async fn run(global: &GlobalArgs, args: RoutesArgs) -> anyhow::Result<()> {
    let mut client = super::connect(global).await?;
    if let Some(wanted) = &args.machine {
        let (header, _) =
            crate::targets::header_for(&mut client, std::slice::from_ref(wanted)).await?;
        if header == "*" {
            anyhow::bail!("-m '*': `routes` shows one Machine's edge; name one Machine");
        }
        client.set_machine_target(Some(header));
    }
    let routes: EdgeRoutes = client.get(api::paths::ROUTES).await?;
    if args.json {
        return print_json(&routes);
    }
    if routes.routes.is_empty() && routes.ingress_ports.is_empty() {
        println!("No route: no Serving Container publishes an Ingress Hostname or an Ingress Port this edge knows.");
        return Ok(());
    }
    if !routes.routes.is_empty() {
        print_table(&routes_table(&routes));
    }
    if !routes.ingress_ports.is_empty() {
        if !routes.routes.is_empty() {
            println!();
        }
        print_table(&ports_table(&routes));
    }
    Ok(())
}

/// The states of an upstream, in words.
fn upstream_state(u: &api::EdgeUpstreamView) -> String {
    let mut state = vec![if u.local { "local" } else { "remote" }.to_owned()];
    if u.on_down_machine {
        state.push("Machine observed down (tried last)".into());
    }
    if u.failing {
        state.push("failing (skipped a few seconds)".into());
    }
    if u.in_flight > 0 {
        state.push(format!("{} in flight", u.in_flight));
    }
    state.join(", ")
}

/// One line per upstream of each Ingress Port; a port this edge cannot listen on says why.
fn ports_table(routes: &EdgeRoutes) -> comfy_table::Table {
    let mut t = table(&["PORT", "SERVICE", "UPSTREAM", "CONTAINER", "STATE"]);
    for p in &routes.ingress_ports {
        let port = format!("{}/{}", p.port, p.protocol);
        if let Some(why) = &p.not_listening {
            t.add_row(vec![
                port,
                p.service.clone(),
                "-".into(),
                "-".into(),
                format!("not listening: {why}"),
            ]);
            continue;
        }
        if p.upstreams.is_empty() {
            t.add_row(vec![
                port,
                p.service.clone(),
                "-".into(),
                "-".into(),
                "no Serving Container".into(),
            ]);
            continue;
        }
        for (i, u) in p.upstreams.iter().enumerate() {
            let first = i == 0;
            t.add_row(vec![
                if first { port.clone() } else { String::new() },
                if first {
                    p.service.clone()
                } else {
                    String::new()
                },
                u.address.clone(),
                u.container_id.as_str().chars().take(12).collect(),
                upstream_state(u),
            ]);
        }
    }
    t
}

/// One line per upstream of each route (a route without one shows `-`); a route's hostname,
/// path and Service are written on its first line only. The PATH column reads as the edge
/// matches: `= /healthz` exactly, `/api/*` the prefix, `/*` the whole hostname.
fn routes_table(routes: &EdgeRoutes) -> comfy_table::Table {
    let mut t = table(&[
        "HOSTNAME",
        "PATH",
        "SERVICE",
        "UPSTREAM",
        "CONTAINER",
        "STATE",
    ]);
    for r in &routes.routes {
        let mut path = if r.strips {
            format!("{} (stripped)", r.path)
        } else {
            r.path.to_string()
        };
        // The route's rules, one per line under its path.
        for rule in &r.rules {
            path.push_str("\n  ");
            path.push_str(rule);
        }
        let service = match &r.gate {
            Some(gate) => format!("{} ({gate})", r.service),
            None => r.service.clone(),
        };
        let host = if r.https {
            format!("{} (https)", r.hostname)
        } else {
            r.hostname.clone()
        };
        // A route with no upstream to list is one line saying what the edge answers.
        let answer = match &r.redirect {
            Some(redirect) => Some(format!(
                "redirects ({}) to {}",
                redirect.status, redirect.to
            )),
            None if r.upstreams.is_empty() => Some("no Serving Container: 503".to_owned()),
            None => None,
        };
        if let Some(answer) = answer {
            t.add_row(vec![host, path, service, "-".into(), "-".into(), answer]);
            continue;
        }
        for (i, u) in r.upstreams.iter().enumerate() {
            let first = i == 0;
            t.add_row(vec![
                if first { host.clone() } else { String::new() },
                if first { path.clone() } else { String::new() },
                if first {
                    service.clone()
                } else {
                    String::new()
                },
                u.address.clone(),
                u.container_id.as_str().chars().take(12).collect(),
                upstream_state(u),
            ]);
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use ployz_core::api::{EdgeRouteView, EdgeUpstreamView};
    use ployz_core::PathMatch;

    #[test]
    fn each_upstream_is_a_line_and_the_path_reads_as_the_edge_matches() {
        let up = |n: u8, local, failing| EdgeUpstreamView {
            address: format!("10.210.0.{n}:8080"),
            container_id: format!("{n:064x}").parse().unwrap(),
            local,
            on_down_machine: !local,
            failing,
            in_flight: n as usize,
        };
        let routes = EdgeRoutes {
            generation: 7,
            routes: vec![
                EdgeRouteView {
                    hostname: "shop.example.com".into(),
                    path: PathMatch::Prefix("/api".into()),
                    service: "api".into(),
                    strips: true,
                    https: true,
                    gate: None,
                    redirect: None,
                    rules: vec![],
                    upstreams: vec![up(2, true, false), up(3, false, true)],
                },
                EdgeRouteView {
                    hostname: "shop.example.com".into(),
                    path: PathMatch::Exact("/healthz".into()),
                    service: "health".into(),
                    strips: false,
                    https: false,
                    gate: Some("maintenance".into()),
                    redirect: None,
                    rules: vec![],
                    upstreams: vec![],
                },
            ],
            ingress_ports: vec![],
        };
        let text = routes_table(&routes).to_string();
        let lines: Vec<&str> = text.lines().map(str::trim_end).collect();
        assert_eq!(lines.len(), 4, "{text}");
        for (line, parts) in lines.iter().zip([
            &["HOSTNAME", "PATH", "SERVICE", "UPSTREAM", "CONTAINER", "STATE"][..],
            &["shop.example.com (https)", "/api/* (stripped)", "api", "10.210.0.2:8080", "000000000000", "local, 2 in flight"],
            &["10.210.0.3:8080", "remote, Machine observed down (tried last), failing (skipped a few seconds), 3 in flight"],
            &["shop.example.com", "= /healthz", "health (maintenance)", "-", "no Serving Container: 503"],
        ]) {
            for p in parts {
                assert!(line.contains(p), "{p} not in {line}\n{text}");
            }
        }
    }

    #[test]
    fn ingress_ports_are_a_table_of_their_own_and_one_not_listening_says_why() {
        let routes = EdgeRoutes {
            generation: 1,
            routes: vec![],
            ingress_ports: vec![
                api::EdgeIngressPortView {
                    port: 5432,
                    protocol: ployz_core::HostProtocol::Tcp,
                    service: "db".into(),
                    not_listening: None,
                    upstreams: vec![EdgeUpstreamView {
                        address: "10.210.0.2:5432".into(),
                        container_id: format!("{:064x}", 2).parse().unwrap(),
                        local: true,
                        on_down_machine: false,
                        failing: false,
                        in_flight: 3,
                    }],
                },
                api::EdgeIngressPortView {
                    port: 53,
                    protocol: ployz_core::HostProtocol::Udp,
                    service: "dns".into(),
                    not_listening: Some("cannot listen on [::]:53: Address in use".into()),
                    upstreams: vec![],
                },
            ],
        };
        let text = ports_table(&routes).to_string();
        let lines: Vec<&str> = text.lines().map(str::trim_end).collect();
        assert_eq!(lines.len(), 3, "{text}");
        for (line, parts) in lines.iter().zip([
            &["PORT", "SERVICE", "UPSTREAM", "CONTAINER", "STATE"][..],
            &["5432/tcp", "db", "10.210.0.2:5432", "local, 3 in flight"],
            &[
                "53/udp",
                "dns",
                "not listening: cannot listen on [::]:53: Address in use",
            ],
        ]) {
            for p in parts {
                assert!(line.contains(p), "{p} not in {line}\n{text}");
            }
        }
    }

    #[test]
    fn a_routes_rules_are_lines_under_its_path() {
        let routes = EdgeRoutes {
            generation: 1,
            routes: vec![EdgeRouteView {
                hostname: "shop.example.com".into(),
                path: PathMatch::Prefix("/admin".into()),
                service: "admin".into(),
                strips: false,
                https: false,
                gate: None,
                redirect: None,
                rules: vec!["basic auth 'Staff'".into(), "timeout 90s".into()],
                upstreams: vec![],
            }],
            ingress_ports: vec![],
        };
        let text = routes_table(&routes).to_string();
        let lines: Vec<&str> = text.lines().map(str::trim_end).collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert!(lines[1].contains("/admin/*") && lines[1].contains("no Serving Container"));
        assert!(lines[2].contains("  basic auth 'Staff'"), "{text}");
        assert!(lines[3].contains("  timeout 90s"), "{text}");
    }
}
