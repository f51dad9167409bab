//! Certificates across Machines: Pebble (Let's Encrypt's test CA) on the lab's bridge, its mock
//! DNS pointing every name at Machine 2. Each hostname is issued by the Machine rendezvous
//! hashing picks, whichever that is; the challenge record replicates so Machine 2's edge answers
//! the validation, the Cluster DNS Verdict counts every Machine's public address, and every
//! Machine's edge then serves the certificate by SNI. A Machine that loses power is passed over
//! once not observed up for the grace (down, or unknown to a daemon started since): a hostname
//! it would issue is issued by another.

mod common;

#[path = "../../acme/tests/support/pebble.rs"]
mod pebble;

use std::net::IpAddr;
use std::time::Duration;

use common::*;
use ployz_lab::{MachineOptions, LAB_IMAGE};

const HOSTS: [&str; 6] = [
    "a.lab.test",
    "b.lab.test",
    "c.lab.test",
    "d.lab.test",
    "e.lab.test",
    "f.lab.test",
];

#[test]
#[ignore = "needs root, dockerd, pebble and the lab (scripts/test.sh runs it)"]
fn a_hostname_pointing_at_one_machine_is_issued_by_another_and_served_by_every_edge() {
    let mut lab = cluster(3);
    let bridge = IpAddr::V4(lab.bridge_addr());
    let dns_port = pebble::free_port();
    let ca = pebble::Pebble::start_on(bridge, 80, dns_port, lab.underlay_addr(2));

    // Each Machine's public address is its underlay address; the issuer runs (the lab turns
    // it off otherwise) and its verdict asks Pebble's DNS.
    let ids: Vec<String> = (0..3).map(|i| own_id(&lab, i)).collect();
    for i in 0..3 {
        let ip = lab.underlay_addr(i).to_string();
        ok(&lab, i, &["machine", "update", "--public-ip", &ip]);
        lab.set_machine_options(
            i,
            MachineOptions {
                daemon_toml: format!(
                    "[certificates]\nenabled = true\nverdict_resolver = \"{}\"\ndown_grace_seconds = 5\n",
                    std::net::SocketAddr::new(bridge, dns_port)
                ),
                ..Default::default()
            },
        );
        lab.term_daemon(i);
        lab.start_daemon(i);
    }
    wait_until_whole(&lab, 3, Duration::from_secs(60));

    let ca_file = lab.dir().join("pebble-listener-ca.pem");
    std::fs::write(&ca_file, &ca.ca_pem).expect("CA file");
    ok(
        &lab,
        0,
        &[
            "cert",
            "policy",
            "set",
            "--directory",
            &ca.directory_url(),
            "--ca-file",
            ca_file.to_str().unwrap(),
            "--backoff-min",
            "1s",
            "--backoff-max",
            "4s",
            "--probe-timeout",
            "1s",
        ],
    );
    let compose = lab.dir().join("secure.yaml");
    write_compose(&compose, &HOSTS);
    ok(&lab, 0, &["deploy", "-y", "-f", compose.to_str().unwrap()]);

    // Every hostname issued, as every Machine sees it (the status and material replicate).
    let statuses = wait_for(
        &lab,
        "every hostname issued",
        Duration::from_secs(120),
        || {
            let v = lab.json(1, &["cert", "ls", "--json"]);
            let statuses: Vec<serde_json::Value> = HOSTS
                .iter()
                .filter_map(|h| {
                    v["status"]
                        .as_array()?
                        .iter()
                        .find(|s| s["hostname"] == *h && s["state"] == "valid")
                        .cloned()
                })
                .collect();
            let material = HOSTS.iter().all(|h| {
                v["material"]
                    .as_array()
                    .is_some_and(|m| m.iter().any(|x| x["hostname"] == *h))
            });
            (statuses.len() == HOSTS.len() && material).then_some(statuses)
        },
    );
    // The CA reached Machine 2 for every validation; some hostnames were issued elsewhere.
    let issuers: Vec<&str> = statuses
        .iter()
        .map(|s| s["issuer"].as_str().unwrap_or_default())
        .collect();
    assert!(
        issuers.iter().any(|i| *i != ids[2]),
        "every hostname was issued by Machine 2 itself: {statuses:?}"
    );
    // Whichever Machine issued it, the verdict found Machine 2's public address among the
    // Cluster's.
    for s in &statuses {
        assert_eq!(s["verdict"]["verdict"], "points", "{s}");
        assert_eq!(
            s["verdict"]["matching"],
            serde_json::json!([lab.underlay_addr(2).to_string()]),
            "{s}"
        );
    }

    // Every edge serves every hostname by SNI with the issued certificate.
    let root = lab.dir().join("pebble-root.pem");
    std::fs::write(&root, ca.issuing_root()).expect("root file");
    for i in 0..3 {
        for h in HOSTS {
            let resolve = format!("{h}:443:{}", lab.underlay_addr(i));
            let out = std::process::Command::new("curl")
                .args([
                    "-sS",
                    "-m",
                    "10",
                    "--cacert",
                    root.to_str().unwrap(),
                    "--resolve",
                    &resolve,
                    &format!("https://{h}/"),
                ])
                .output()
                .expect("curl runs");
            let body = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success() && body.trim() == format!("secure-on-{}", ids[1]),
                "{h} through Machine {i}'s edge: {}",
                text(&out)
            );
        }
    }

    // Machine 0 loses power (kill -9: its record as an issuer stays). A new hostname that
    // rendezvous hashing gives Machine 0 is issued by another once Machines 1 and 2 have observed
    // it down for the grace (5 s here); before, it waited for Machine 0 for ever.
    let machine_ids: Vec<ployz_core::MachineId> = ids.iter().map(|i| i.parse().unwrap()).collect();
    let orphan = won_by(&machine_ids, 0, "g");
    lab.kill_daemon(0);
    wait_for(
        &lab,
        "Machines 1 and 2 observe Machine 0 down",
        Duration::from_secs(30),
        || {
            [1, 2]
                .iter()
                .all(|&i| {
                    observed(&lab, i)
                        .and_then(|o| o.get(&ids[0]).cloned())
                        .is_some_and(|(_, m)| m == "down")
                })
                .then_some(())
        },
    );
    let mut hosts: Vec<&str> = HOSTS.to_vec();
    hosts.push(&orphan);
    deploy_and_see_issued_elsewhere(&lab, &compose, &hosts, &ids[0]);

    // Machines 1 and 2 restart while Machine 0 stays dead: they never hear of it again, so they
    // hold it unknown, not down; not observed up for the grace, it is passed over all the same.
    for i in [1, 2] {
        lab.term_daemon(i);
        lab.start_daemon(i);
    }
    for i in [1, 2] {
        let seen = observed(&lab, i).and_then(|o| o.get(&ids[0]).cloned());
        eprintln!("after its restart, Machine {i} observes Machine 0 as {seen:?}");
    }
    let orphan2 = won_by(&machine_ids, 0, "h");
    hosts.push(&orphan2);
    deploy_and_see_issued_elsewhere(&lab, &compose, &hosts, &ids[0]);
}

/// The first hostname `PREFIX<n>.lab.test` that rendezvous hashing gives Machine `i`.
fn won_by(machines: &[ployz_core::MachineId], i: usize, prefix: &str) -> String {
    (0..)
        .map(|n| format!("{prefix}{n}.lab.test"))
        .find(|h| ployz_acme::rendezvous::issuer_for(h, machines) == Some(&machines[i]))
        .expect("some hostname hashes to every Machine")
}

/// Deploys `secure` publishing `hosts` (through Machine 1), and waits until the last of them
/// is issued, by another Machine than `dead`.
fn deploy_and_see_issued_elsewhere(
    lab: &ployz_lab::Lab,
    compose: &std::path::Path,
    hosts: &[&str],
    dead: &str,
) {
    let new = *hosts.last().expect("a hostname");
    write_compose(compose, hosts);
    ok(lab, 1, &["deploy", "-y", "-f", compose.to_str().unwrap()]);
    let status = wait_for(
        lab,
        &format!("{new}, which the dead Machine would issue, issued by another"),
        Duration::from_secs(120),
        || {
            let v = lab.json(1, &["cert", "ls", "--json"]);
            v["status"]
                .as_array()?
                .iter()
                .find(|s| s["hostname"] == new && s["state"] == "valid")
                .cloned()
        },
    );
    assert_ne!(status["issuer"], dead, "{status}");
}

/// The Service `secure` on Machine 1, publishing `hosts` over https.
fn write_compose(path: &std::path::Path, hosts: &[&str]) {
    let ports: String = hosts
        .iter()
        .map(|h| format!("      - {h}:8080/https\n"))
        .collect();
    std::fs::write(
        path,
        format!(
            "services:\n  secure:\n    image: {LAB_IMAGE}\n    command: [\"sh\", \"-c\", \"echo secure-on-$$PLOYZ_MACHINE_ID > /index.html && exec httpd -f -p 8080 -h /\"]\n    x-machines: m1\n    x-ports:\n{ports}"
        ),
    )
    .expect("compose file");
}
