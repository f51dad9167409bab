//! The firewall applied for real with iptables and ip6tables, inside a fresh network namespace
//! (so the host's own rules are never touched): reconcile builds the chain, the jumps and the
//! forwarding rules; a deleted rule comes back at its place at the next reconcile; remove leaves
//! nothing of it behind.
//!
//! Namespaces are named `plztf-<pid>-<n>`; each is deleted on drop (also on panic), and ones left
//! by a process that no longer runs are swept at start. Needs root.

use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

use ployz_core::ClusterNetwork;
use ployz_mesh::firewall::{CommandOutput, CommandRunner, Firewall, FirewallConfig, CHAIN};

const PREFIX: &str = "plztf";

fn run(program: &str, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|err| panic!("{program} {args:?}: {err}"))
}

fn sweep_leftovers() {
    let listing = run("ip", &["netns", "list"]);
    for line in String::from_utf8_lossy(&listing.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or_default();
        let Some(rest) = name.strip_prefix(&format!("{PREFIX}-")) else {
            continue;
        };
        let pid = rest.split('-').next().unwrap_or_default();
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = run("ip", &["netns", "del", name]);
        }
    }
}

/// A network namespace, deleted on drop; also the firewall's runner, running each command in it.
struct Netns {
    name: String,
}

impl Netns {
    fn new() -> Netns {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "{PREFIX}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let output = run("ip", &["netns", "add", &name]);
        assert!(output.status.success(), "ip netns add {name}: {output:?}");
        Netns { name }
    }

    /// Runs a command in the namespace and returns its standard output; panics on failure.
    fn must(&self, program: &str, args: &[&str]) -> String {
        let output = self.exec(program, args);
        assert!(
            output.success,
            "{program} {} in {}: {}",
            args.join(" "),
            self.name,
            output.stderr
        );
        output.stdout
    }

    fn exec(&self, program: &str, args: &[&str]) -> CommandOutput {
        let mut full = vec!["netns", "exec", self.name.as_str(), program];
        full.extend_from_slice(args);
        let output = run("ip", &full);
        CommandOutput {
            success: output.status.success(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    /// Every rule of both families and the tables the firewall touches, as `-S` prints them.
    fn ruleset(&self) -> String {
        let mut all = String::new();
        for program in ["iptables", "ip6tables"] {
            for table in ["filter", "nat", "raw"] {
                all.push_str(&format!("# {program} -t {table}\n"));
                all.push_str(&self.must(program, &["-w", "5", "-t", table, "-S"]));
            }
        }
        all
    }
}

impl CommandRunner for &Netns {
    fn run(&self, program: &str, args: &[String]) -> std::io::Result<CommandOutput> {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Ok(self.exec(program, &args))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = run("ip", &["netns", "del", &self.name]);
    }
}

fn config() -> FirewallConfig {
    FirewallConfig {
        mesh_interface: "plztwg0".into(),
        docker_bridge: "plztbr0".into(),
        wireguard_port: 51820,
        management_port: 51000,
        gossip_port: 51001,
        machine_subnet: "10.210.4.0/24".parse().unwrap(),
        cluster_network: ClusterNetwork::default(),
    }
}

#[test]
#[ignore = "needs root"]
fn reconcile_restores_and_remove_clears_in_a_namespace() {
    sweep_leftovers();
    let netns = Netns::new();
    // An INPUT chain like a host's: the jump must go before its DROP.
    netns.must(
        "iptables",
        &["-w", "5", "-A", "INPUT", "-i", "lo", "-j", "ACCEPT"],
    );
    netns.must(
        "iptables",
        &[
            "-w", "5", "-A", "INPUT", "-p", "tcp", "--dport", "22", "-j", "ACCEPT",
        ],
    );
    netns.must("iptables", &["-w", "5", "-A", "INPUT", "-j", "DROP"]);
    let pristine = netns.ruleset();

    let firewall = Firewall::new(config(), &netns);
    assert_eq!(firewall.reconcile().expect("reconcile"), 14);

    let v4 = netns.must("iptables", &["-w", "5", "-S"]);
    let input: Vec<&str> = v4.lines().filter(|l| l.starts_with("-A INPUT")).collect();
    assert_eq!(
        input,
        [
            "-A INPUT -i lo -j ACCEPT",
            "-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT",
            "-A INPUT -j PLOYZ-INPUT",
            "-A INPUT -j DROP",
        ]
    );
    assert!(
        v4.contains("-A PLOYZ-INPUT -p udp -m udp --dport 51820 -j ACCEPT"),
        "{v4}"
    );
    assert!(v4.contains("-A FORWARD -j DOCKER-USER"), "{v4}");
    assert!(
        v4.contains("-A DOCKER-USER -i plztwg0 -o plztbr0 -j ACCEPT"),
        "{v4}"
    );
    assert!(
        v4.contains("-A DOCKER-USER -i plztbr0 -o plztwg0 -j ACCEPT"),
        "{v4}"
    );
    let v6 = netns.must("ip6tables", &["-w", "5", "-S"]);
    let chain: Vec<&str> = v6
        .lines()
        .filter(|l| l.starts_with("-A PLOYZ-INPUT"))
        .collect();
    assert_eq!(
        chain,
        [
            "-A PLOYZ-INPUT -i lo -p tcp -m tcp --dport 51000 -j REJECT --reject-with tcp-reset",
            "-A PLOYZ-INPUT -i lo -p udp -m udp --dport 51001 -j REJECT --reject-with icmp6-port-unreachable",
            "-A PLOYZ-INPUT -s fdcc::/16 -i plztwg0 -p tcp -m tcp --dport 51000 -j ACCEPT",
            "-A PLOYZ-INPUT -s fdcc::/16 -i plztwg0 -p udp -m udp --dport 51001 -j ACCEPT",
            "-A PLOYZ-INPUT -p tcp -m tcp --dport 51000 -j DROP",
            "-A PLOYZ-INPUT -p udp -m udp --dport 51001 -j DROP",
        ]
    );
    assert!(v6.contains("-A INPUT -j PLOYZ-INPUT"), "{v6}");
    let nat = netns.must("iptables", &["-w", "5", "-t", "nat", "-S", "POSTROUTING"]);
    assert!(
        nat.contains("-A POSTROUTING -s 10.210.4.0/24 -d 10.210.0.0/16 -j RETURN"),
        "{nat}"
    );
    let raw = netns.must("iptables", &["-w", "5", "-t", "raw", "-S", "PREROUTING"]);
    assert!(
        raw.contains("-A PREROUTING -d 10.210.4.0/24 -i plztwg0 -j ACCEPT"),
        "{raw}"
    );

    // A second reconcile finds everything in place.
    let reconciled = netns.ruleset();
    assert_eq!(firewall.reconcile().expect("reconcile"), 0);
    assert_eq!(netns.ruleset(), reconciled);

    // A deleted ACCEPT comes back ahead of the DROPs; a deleted jump and NAT rule come back.
    netns.must(
        "ip6tables",
        &[
            "-w",
            "5",
            "-D",
            CHAIN,
            "-s",
            "fdcc::/16",
            "-i",
            "plztwg0",
            "-p",
            "tcp",
            "--dport",
            "51000",
            "-j",
            "ACCEPT",
        ],
    );
    netns.must("iptables", &["-w", "5", "-D", "INPUT", "-j", CHAIN]);
    netns.must(
        "iptables",
        &[
            "-w",
            "5",
            "-t",
            "nat",
            "-D",
            "POSTROUTING",
            "-s",
            "10.210.4.0/24",
            "-d",
            "10.210.0.0/16",
            "-j",
            "RETURN",
        ],
    );
    assert_ne!(netns.ruleset(), reconciled);
    assert_eq!(firewall.reconcile().expect("reconcile"), 3);
    assert_eq!(netns.ruleset(), reconciled);

    // A chain as an earlier release left it (loopback returned to INPUT first, ahead of the
    // refusals): the old rule goes and the chain ends as a fresh one.
    for spec in [
        "-i lo -p tcp --dport 51000 -j REJECT --reject-with tcp-reset",
        "-i lo -p udp --dport 51001 -j REJECT --reject-with icmp6-port-unreachable",
    ] {
        let mut args = vec!["-w", "5", "-D", CHAIN];
        args.extend(spec.split(' '));
        netns.must("ip6tables", &args);
    }
    netns.must(
        "ip6tables",
        &["-w", "5", "-I", CHAIN, "1", "-i", "lo", "-j", "RETURN"],
    );
    assert_eq!(
        firewall.reconcile().expect("reconcile"),
        3,
        "1 deleted, 2 put back"
    );
    assert_eq!(netns.ruleset(), reconciled);

    // Remove leaves no chain, no jump and no rule of ours; DOCKER-USER stays (Docker's), empty.
    firewall.remove().expect("remove");
    let after = netns.ruleset();
    assert!(!after.contains("PLOYZ"), "{after}");
    assert!(!after.contains("plztwg0"), "{after}");
    assert!(!after.contains("10.210."), "{after}");
    let without_docker_user: String = after
        .lines()
        .filter(|l| !l.contains("DOCKER-USER"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(without_docker_user, pristine);
    firewall.remove().expect("a second remove does nothing");
    assert_eq!(netns.ruleset(), after);
}
