//! Drift in a Machine's plumbing, made by hand, is found and corrected by its daemon's
//! reconciliation within one timer period, counted on its metrics endpoint
//! (`ployz_reconcile_corrections_total{concern}`) and shown by `ployz machine status`: the
//! Docker `ployz` network removed, a WireGuard peer removed, the firewall chain deleted, the
//! internal DNS's sockets taken away from under it.

mod common;

use std::time::{Duration, Instant};

use common::*;
use ployz_lab::{Lab, LabOptions, MachineOptions};
use serde_json::Value;

/// The daemons' `reconcile.interval_secs` here.
const INTERVAL_SECS: u64 = 3;

/// How long a correction may take: a few timer periods (it is due within one).
fn deadline() -> Duration {
    Duration::from_secs(INTERVAL_SECS * 4)
}

/// Two Machines in a Cluster, with the internal DNS on and the short timer.
fn reconcile_cluster() -> Lab {
    let machine = MachineOptions {
        daemon_toml: format!("[reconcile]\ninterval_secs = {INTERVAL_SECS}\n"),
        ..MachineOptions::default()
    };
    let lab = cluster_with(LabOptions {
        dns: true,
        per_machine: vec![machine.clone(), machine],
        ..LabOptions::machines(2)
    });
    // Every concern has had its first pass on Machine 0.
    wait_for(&lab, "a first pass of every concern", deadline(), || {
        let status = lab.json(0, &["machine", "status", "--json"]);
        status["concerns"]
            .as_array()?
            .iter()
            .all(|c| !c["last"].is_null())
            .then_some(())
    });
    lab
}

/// `ployz_reconcile_corrections_total{concern}` on Machine `i`'s metrics endpoint.
fn corrections_metric(lab: &Lab, i: usize, concern: &str) -> Option<u64> {
    let out = lab.exec_in(i, &["curl", "-sf", "http://127.0.0.1:51090/metrics"]);
    if !out.status.success() {
        return None;
    }
    let prefix = format!("ployz_reconcile_corrections_total{{concern=\"{concern}\"}} ");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix(&prefix)?.trim().parse().ok())
}

/// What `machine status --json` on Machine `i` shows of `concern`.
fn concern_status(lab: &Lab, i: usize, concern: &str) -> Value {
    let status = lab.json(i, &["machine", "status", "--json"]);
    status["concerns"]
        .as_array()
        .and_then(|a| a.iter().find(|c| c["concern"] == concern).cloned())
        .unwrap_or_else(|| panic!("machine status shows no {concern}: {status}"))
}

/// The counts of `concern` on Machine `i` before the drift: the metric's and the status's.
fn counts_before(lab: &Lab, i: usize, concern: &str) -> (u64, u64) {
    let metric = corrections_metric(lab, i, concern)
        .unwrap_or_else(|| panic!("no corrections metric for {concern}\n{}", logs(lab)));
    let shown = concern_status(lab, i, concern)["corrections"]
        .as_u64()
        .expect("a corrections count");
    (metric, shown)
}

/// Waits until Machine `i` counted one more correction of `concern` on its metrics endpoint,
/// shows it in `machine status` (JSON and text), and logged it.
fn assert_counted_and_shown(lab: &Lab, i: usize, concern: &str, before: (u64, u64)) {
    wait_for(
        lab,
        &format!("a {concern} correction counted"),
        deadline(),
        || {
            corrections_metric(lab, i, concern)
                .is_some_and(|n| n > before.0)
                .then_some(())
        },
    );
    let shown = concern_status(lab, i, concern);
    assert!(
        shown["corrections"].as_u64().unwrap_or(0) > before.1,
        "machine status shows the correction of {concern}: {shown}"
    );
    let text = ok(lab, i, &["machine", "status"]);
    let text = String::from_utf8_lossy(&text.stdout).into_owned();
    assert!(
        text.lines().any(|l| l.starts_with(concern)),
        "machine status names {concern}:\n{text}"
    );
    let logged = format!("concern=\"{concern}\"");
    let log = lab.log(i);
    let line = log
        .lines()
        .rev()
        .find(|l| l.contains("drift corrected") && l.contains(&logged))
        .unwrap_or_else(|| {
            panic!(
                "one log line for the correction of {concern}\n{}",
                logs(lab)
            )
        });
    for failed in log
        .lines()
        .filter(|l| l.contains("reconciliation could not"))
    {
        eprintln!("{failed}");
    }
    eprintln!("{line}\n{text}");
}

/// Machine `i`'s Machine Subnet, as it observes itself.
fn own_subnet(lab: &Lab, i: usize) -> String {
    let id = own_id(lab, i);
    machines(lab, i)
        .expect("machine ls answers")
        .into_iter()
        .find(|m| m["id"] == id.as_str())
        .and_then(|m| m["subnet"].as_str().map(str::to_owned))
        .expect("its own subnet")
}

/// The Machine Gateway of a /24 subnet `a.b.c.0/24`: `a.b.c.1`.
fn gateway(subnet: &str) -> String {
    let network = subnet.split('/').next().expect("a subnet");
    let (head, _) = network.rsplit_once('.').expect("an IPv4 network");
    format!("{head}.1")
}

#[test]
#[ignore = "needs root, dockerd and the lab (scripts/test.sh runs it)"]
fn a_removed_docker_network_is_made_again() {
    let lab = reconcile_cluster();
    let subnet = own_subnet(&lab, 0);
    let before = counts_before(&lab, 0, "docker_network");
    let out = lab.docker(0, &["network", "rm", "ployz"]);
    assert!(out.status.success(), "{}", text(&out));
    let removed = Instant::now();
    wait_for(&lab, "the ployz network back", deadline(), || {
        let out = lab.docker(
            0,
            &[
                "network",
                "inspect",
                "ployz",
                "--format",
                "{{range .IPAM.Config}}{{.Subnet}}{{end}}",
            ],
        );
        (out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == subnet)
            .then_some(())
    });
    eprintln!(
        "the ployz network was back {:.1} s after its removal",
        removed.elapsed().as_secs_f64()
    );
    assert_counted_and_shown(&lab, 0, "docker_network", before);
    // Observer-relative: Machine 1 shows Machine 0's record of its passes when asked for it.
    let id0 = own_id(&lab, 0);
    let forwarded = lab.json(1, &["machine", "status", "--json", "-m", "m0"]);
    assert_eq!(forwarded["machine"], id0.as_str(), "{forwarded}");
    let network = forwarded["concerns"]
        .as_array()
        .and_then(|a| a.iter().find(|c| c["concern"] == "docker_network"))
        .cloned()
        .unwrap_or_default();
    assert!(
        network["corrections"].as_u64().unwrap_or(0) > before.1,
        "{forwarded}"
    );
}

#[test]
#[ignore = "needs root, dockerd and the lab (scripts/test.sh runs it)"]
fn a_removed_wireguard_peer_is_put_back() {
    let lab = reconcile_cluster();
    let wg = lab.json(0, &["wg", "show", "--json"]);
    let key = wg["peers"][0]["public_key"]
        .as_str()
        .unwrap_or_else(|| panic!("a peer: {wg}"))
        .to_owned();
    let iface = lab.wg_interface(0).to_owned();
    let before = counts_before(&lab, 0, "peers");
    let out = lab.exec_in(0, &["wg", "set", &iface, "peer", &key, "remove"]);
    assert!(out.status.success(), "{}", text(&out));
    let removed = Instant::now();
    wait_for(&lab, "the peer back on the interface", deadline(), || {
        let out = lab.exec_in(0, &["wg", "show", &iface, "peers"]);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .any(|l| l.trim() == key)
            .then_some(())
    });
    eprintln!(
        "the peer was back {:.1} s after its removal",
        removed.elapsed().as_secs_f64()
    );
    assert_counted_and_shown(&lab, 0, "peers", before);
    // And the peer is reached again over the mesh.
    wait_until_whole(&lab, 2, deadline());
}

#[test]
#[ignore = "needs root, dockerd and the lab (scripts/test.sh runs it)"]
fn a_deleted_firewall_chain_is_made_again() {
    let lab = reconcile_cluster();
    let chain_in_place = || {
        lab.exec_in(0, &["iptables", "-w", "-C", "INPUT", "-j", "PLOYZ-INPUT"])
            .status
            .success()
            && lab
                .exec_in(
                    0,
                    &[
                        "iptables",
                        "-w",
                        "-C",
                        "PLOYZ-INPUT",
                        "-p",
                        "udp",
                        "-m",
                        "udp",
                        "--dport",
                        "51820",
                        "-j",
                        "ACCEPT",
                    ],
                )
                .status
                .success()
    };
    assert!(chain_in_place(), "the chain is there first\n{}", logs(&lab));
    let before = counts_before(&lab, 0, "firewall");
    // The jump, the rules and the chain; should a pass put the jump back in between, again.
    let delete = "iptables -w -D INPUT -j PLOYZ-INPUT && iptables -w -F PLOYZ-INPUT && iptables -w -X PLOYZ-INPUT";
    let deleted = (0..3).any(|_| lab.exec_in(0, &["sh", "-c", delete]).status.success());
    assert!(deleted, "the chain could not be deleted\n{}", logs(&lab));
    let out = lab.exec_in(0, &["iptables", "-w", "-n", "-L", "PLOYZ-INPUT"]);
    assert!(!out.status.success(), "the chain is gone: {}", text(&out));
    let removed = Instant::now();
    wait_for(&lab, "the chain and its jump back", deadline(), || {
        chain_in_place().then_some(())
    });
    eprintln!(
        "the chain was back {:.1} s after its deletion",
        removed.elapsed().as_secs_f64()
    );
    assert_counted_and_shown(&lab, 0, "firewall", before);
}

#[test]
#[ignore = "needs root, dockerd and the lab (scripts/test.sh runs it)"]
fn a_dns_listener_whose_sockets_were_taken_away_is_bound_again_and_answers() {
    let lab = reconcile_cluster();
    let gw = gateway(&own_subnet(&lab, 0));
    let server = format!("@{gw}");
    let answers = || {
        let out = lab.exec_in(
            0,
            &[
                "dig",
                &server,
                "+time=1",
                "+tries=1",
                "reconcile-test.internal",
                "A",
            ],
        );
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        out.status.success()
            && (text.contains("status: NXDOMAIN") || text.contains("status: NOERROR"))
    };
    wait_for(&lab, "the internal DNS answering", deadline(), || {
        answers().then_some(())
    });
    let before = counts_before(&lab, 0, "dns_listener");
    let pid = lab.daemon_pid(0).expect("Machine 0's daemon runs");
    // The daemon's UDP sockets on port 53, by descriptor.
    let descriptors = || -> Vec<String> {
        let out = lab.exec_in(0, &["ss", "-H", "-u", "-a", "-n", "-p", "sport = :53"]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let owner = format!("pid={pid},fd=");
        text.split(owner.as_str())
            .skip(1)
            .filter_map(|rest| {
                let fd: String = rest.chars().take_while(char::is_ascii_digit).collect();
                (!fd.is_empty()).then_some(fd)
            })
            .collect()
    };
    let fds = descriptors();
    assert!(!fds.is_empty(), "the daemon's DNS sockets are listed first");
    // By hand, as an administrator can: `ss -K` destroys a socket in the kernel (its receives
    // fail with ECONNABORTED), one of the port's sockets a call. Each is closed by the daemon's
    // worker that served it; once all are, the daemon binds the listener again.
    let taken = Instant::now();
    let mut left = fds.len();
    while left > 0 {
        let out = lab.exec_in(0, &["ss", "-K", "-H", "-u", "-a", "-n", "sport = :53"]);
        assert!(out.status.success(), "{}", text(&out));
        left = wait_for(&lab, "a destroyed DNS socket closed", deadline(), || {
            let n = descriptors().len();
            (n < left).then_some(n)
        });
    }
    assert!(!answers(), "the DNS does not answer without its sockets");
    wait_for(
        &lab,
        "the DNS listening and answering again",
        deadline(),
        || (!descriptors().is_empty() && answers()).then_some(()),
    );
    eprintln!(
        "the DNS answered again {:.1} s after its sockets were taken away",
        taken.elapsed().as_secs_f64()
    );
    assert_counted_and_shown(&lab, 0, "dns_listener", before);
}

#[test]
#[ignore = "needs root, dockerd and the lab (scripts/test.sh runs it)"]
fn a_downed_wireguard_interface_is_set_up_again_with_its_address() {
    let lab = reconcile_cluster();
    let iface = lab.wg_interface(0).to_owned();
    let wg = lab.json(0, &["wg", "show", "--json"]);
    let address = wg["management_address"]
        .as_str()
        .unwrap_or_else(|| panic!("a Management Address: {wg}"))
        .to_owned();
    let link = || -> (bool, bool) {
        let out = lab.exec_in(0, &["ip", "-j", "addr", "show", "dev", &iface]);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let link = &v[0];
        let up = link["flags"]
            .as_array()
            .is_some_and(|f| f.iter().any(|f| f == "UP"));
        let has_address = link["addr_info"]
            .as_array()
            .is_some_and(|a| a.iter().any(|a| a["local"] == address.as_str()));
        (up, has_address)
    };
    assert_eq!(
        link(),
        (true, true),
        "the interface is up with its address first"
    );
    let before = counts_before(&lab, 0, "interface");
    let out = lab.exec_in(0, &["ip", "link", "set", "dev", &iface, "down"]);
    assert!(out.status.success(), "{}", text(&out));
    let downed = Instant::now();
    wait_for(
        &lab,
        "the interface up with its address",
        deadline(),
        || (link() == (true, true)).then_some(()),
    );
    eprintln!(
        "the interface was up again {:.1} s after it was set down",
        downed.elapsed().as_secs_f64()
    );
    assert_counted_and_shown(&lab, 0, "interface", before);
    // Its routes come back with the next pass of peers and routes: the peer is reached again.
    wait_until_whole(&lab, 2, deadline());
}
