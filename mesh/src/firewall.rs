//! The packet-filter rules the mesh needs, kept in place by reconciliation.
//!
//! - Chain `PLOYZ-INPUT` (IPv4 and IPv6), jumped to from `INPUT` before its first DROP/REJECT
//!   rule (or first when it has none). IPv4: WireGuard's UDP port is accepted. IPv6: the
//!   management API (TCP) and gossip (UDP) are accepted from `fdcc::/16` arriving on the mesh
//!   interface and dropped arriving on any other. Over loopback they are refused at once
//!   (a TCP reset, an ICMP port unreachable): no local process reaches the mesh listener or
//!   gossip, whatever address it binds (a peer's, with `IP_FREEBIND`), and the daemon never
//!   calls its own Management Address.
//! - Forwarding (IPv4): `DOCKER-USER` accepts mesh interface -> Docker bridge and back, so
//!   containers reach containers on other Machines by Container Address; `nat POSTROUTING`
//!   returns before Docker's masquerade for traffic from this Machine Subnet to the Cluster
//!   network, so the receiving container sees the sender's own address; `raw PREROUTING`
//!   accepts traffic arriving on the mesh interface for this Machine Subnet before the per-
//!   container DROP rules Docker 28 puts there against direct routing from other interfaces.
//!   Docker's own answer to the latter is the bridge option
//!   `com.docker.network.bridge.trusted_host_interfaces` naming the mesh interface, which the
//!   `ployz` network must carry; the raw rule keeps the mesh working on a network made without it.
//!
//! [`Firewall::reconcile`] checks each rule with `-C` and puts back only what is missing, at its
//! place, so a deleted rule returns at the next call and a second call changes nothing.
//! [`Firewall::remove`] deletes every rule, jump and chain it adds (for `machine reset`).
//! Commands go through a [`CommandRunner`], so their construction is tested without a kernel.

use std::fmt;
use std::process::Command;

use ployz_core::{ClusterNetwork, MachineSubnet};

/// The chain this module owns in the filter table (IPv4 and IPv6).
pub const CHAIN: &str = "PLOYZ-INPUT";
/// The chain Docker reserves for its users' forwarding rules.
pub const DOCKER_USER: &str = "DOCKER-USER";
/// Where Management Addresses live.
pub const MANAGEMENT_NETWORK: &str = "fdcc::/16";
/// How long an iptables call waits for the xtables lock (`-w`), in seconds.
const LOCK_WAIT_SECONDS: &str = "5";
/// How many copies of one rule [`Firewall::remove`] deletes at most.
const MAX_COPIES: usize = 16;

/// What one command printed and whether it succeeded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommandOutput {
    /// Exit status zero.
    pub success: bool,
    /// Its standard output.
    pub stdout: String,
    /// Its standard error.
    pub stderr: String,
}

/// Runs one command. [`SystemRunner`] runs it for real; tests record or emulate.
pub trait CommandRunner {
    /// Runs `program` with `args` and waits for it.
    fn run(&self, program: &str, args: &[String]) -> std::io::Result<CommandOutput>;
}

/// Runs commands as child processes (in the calling thread's network namespace).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemRunner;

impl CommandRunner for SystemRunner {
    fn run(&self, program: &str, args: &[String]) -> std::io::Result<CommandOutput> {
        let output = Command::new(program).args(args).output()?;
        Ok(CommandOutput {
            success: output.status.success(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        })
    }
}

/// Why the firewall could not be put in place or removed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FirewallError {
    /// The command could not be started.
    #[error("could not run `{command}`: {detail}; the daemon needs iptables and ip6tables on its PATH and root")]
    Spawn {
        /// The command line.
        command: String,
        /// Why.
        detail: String,
    },
    /// The command ran and refused.
    #[error("`{command}` failed: {stderr}")]
    Refused {
        /// The command line.
        command: String,
        /// What it printed on standard error.
        stderr: String,
    },
}

type Result<T> = std::result::Result<T, FirewallError>;

/// IPv4 (`iptables`) or IPv6 (`ip6tables`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// `iptables`.
    V4,
    /// `ip6tables`.
    V6,
}

impl Family {
    /// The program that edits this family's tables.
    pub fn program(&self) -> &'static str {
        match self {
            Family::V4 => "iptables",
            Family::V6 => "ip6tables",
        }
    }
}

/// Where a missing rule is put back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// At this 1-based position of its chain (its place in a chain this module owns, or the top
    /// of a shared chain, ahead of what others put there).
    At(usize),
    /// Before the chain's first DROP or REJECT rule, or first when it has none.
    BeforeFirstDrop,
}

/// One rule this module keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// The family.
    pub family: Family,
    /// The table (`filter`, `nat`, `raw`).
    pub table: &'static str,
    /// The chain.
    pub chain: &'static str,
    /// The match and target, as given to `iptables -C/-I/-D <chain>`.
    pub spec: Vec<String>,
    /// Where it goes back when missing.
    pub placement: Placement,
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} -t {} {} {}",
            self.family.program(),
            self.table,
            self.chain,
            self.spec.join(" ")
        )
    }
}

/// What the rules are made from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FirewallConfig {
    /// The WireGuard interface (`[mesh] interface`).
    pub mesh_interface: String,
    /// The Docker bridge of the `ployz` network (its Linux interface name).
    pub docker_bridge: String,
    /// WireGuard's UDP port.
    pub wireguard_port: u16,
    /// The management API's mesh listener (TCP).
    pub management_port: u16,
    /// Gossip (UDP).
    pub gossip_port: u16,
    /// This Machine's Subnet.
    pub machine_subnet: MachineSubnet,
    /// The Cluster network.
    pub cluster_network: ClusterNetwork,
}

fn spec(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|p| (*p).to_owned()).collect()
}

/// The firewall of one Machine: [`Firewall::rules`] lists them, [`Firewall::reconcile`] puts
/// them in place, [`Firewall::remove`] takes them all away.
pub struct Firewall<R: CommandRunner = SystemRunner> {
    config: FirewallConfig,
    runner: R,
}

impl Firewall<SystemRunner> {
    /// A firewall applied with the real `iptables` and `ip6tables`.
    pub fn system(config: FirewallConfig) -> Firewall<SystemRunner> {
        Firewall::new(config, SystemRunner)
    }
}

impl<R: CommandRunner> Firewall<R> {
    /// A firewall applied through `runner`.
    pub fn new(config: FirewallConfig, runner: R) -> Firewall<R> {
        Firewall { config, runner }
    }

    /// The runner (tests inspect it).
    pub fn runner(&self) -> &R {
        &self.runner
    }

    /// Every rule this module keeps, in the order they are reconciled. The rules of
    /// [`CHAIN`] come in chain order (each at its position); the jumps into it come after them.
    pub fn rules(&self) -> Vec<Rule> {
        let c = &self.config;
        let wg = c.wireguard_port.to_string();
        let management = c.management_port.to_string();
        let gossip = c.gossip_port.to_string();
        let mesh = c.mesh_interface.as_str();
        let bridge = c.docker_bridge.as_str();
        let subnet = c.machine_subnet.to_string();
        let cluster = c.cluster_network.to_string();

        let own = |family, position, parts: &[&str]| Rule {
            family,
            table: "filter",
            chain: CHAIN,
            spec: spec(parts),
            placement: Placement::At(position),
        };
        let mut rules = vec![
            own(
                Family::V4,
                1,
                &["-p", "udp", "--dport", &wg, "-j", "ACCEPT"],
            ),
            own(
                Family::V6,
                1,
                &[
                    "-i",
                    "lo",
                    "-p",
                    "tcp",
                    "--dport",
                    &management,
                    "-j",
                    "REJECT",
                    "--reject-with",
                    "tcp-reset",
                ],
            ),
            own(
                Family::V6,
                2,
                &[
                    "-i",
                    "lo",
                    "-p",
                    "udp",
                    "--dport",
                    &gossip,
                    "-j",
                    "REJECT",
                    "--reject-with",
                    "icmp6-port-unreachable",
                ],
            ),
            own(
                Family::V6,
                3,
                &[
                    "-s",
                    MANAGEMENT_NETWORK,
                    "-i",
                    mesh,
                    "-p",
                    "tcp",
                    "--dport",
                    &management,
                    "-j",
                    "ACCEPT",
                ],
            ),
            own(
                Family::V6,
                4,
                &[
                    "-s",
                    MANAGEMENT_NETWORK,
                    "-i",
                    mesh,
                    "-p",
                    "udp",
                    "--dport",
                    &gossip,
                    "-j",
                    "ACCEPT",
                ],
            ),
            own(
                Family::V6,
                5,
                &["-p", "tcp", "--dport", &management, "-j", "DROP"],
            ),
            own(
                Family::V6,
                6,
                &["-p", "udp", "--dport", &gossip, "-j", "DROP"],
            ),
        ];
        for family in [Family::V4, Family::V6] {
            rules.push(Rule {
                family,
                table: "filter",
                chain: "INPUT",
                spec: spec(&["-j", CHAIN]),
                placement: Placement::BeforeFirstDrop,
            });
        }
        let top = |table, chain, parts: &[&str]| Rule {
            family: Family::V4,
            table,
            chain,
            spec: spec(parts),
            placement: Placement::At(1),
        };
        rules.extend([
            top(
                "filter",
                DOCKER_USER,
                &["-i", mesh, "-o", bridge, "-j", "ACCEPT"],
            ),
            top(
                "filter",
                DOCKER_USER,
                &["-i", bridge, "-o", mesh, "-j", "ACCEPT"],
            ),
            top(
                "nat",
                "POSTROUTING",
                &["-s", &subnet, "-d", &cluster, "-j", "RETURN"],
            ),
            top(
                "raw",
                "PREROUTING",
                &["-i", mesh, "-d", &subnet, "-j", "ACCEPT"],
            ),
        ]);
        rules
    }

    /// Rules earlier releases kept that no longer belong: [`Firewall::reconcile`] deletes them
    /// before it puts anything back (the positions of [`CHAIN`]'s rules count without them).
    fn retired(&self) -> Vec<Rule> {
        vec![Rule {
            family: Family::V6,
            table: "filter",
            chain: CHAIN,
            // Loopback went back to INPUT, so any local process reached the management API's
            // mesh listener and gossip (a peer's address bound with IP_FREEBIND).
            spec: spec(&["-i", "lo", "-j", "RETURN"]),
            placement: Placement::At(1),
        }]
    }

    fn iptables(&self, family: Family, table: &str, args: &[&str]) -> Result<CommandOutput> {
        let mut full: Vec<String> = vec![
            "-w".into(),
            LOCK_WAIT_SECONDS.into(),
            "-t".into(),
            table.into(),
        ];
        full.extend(args.iter().map(|a| (*a).to_owned()));
        let program = family.program();
        self.runner
            .run(program, &full)
            .map_err(|err| FirewallError::Spawn {
                command: format!("{program} {}", full.join(" ")),
                detail: err.to_string(),
            })
    }

    fn must(&self, family: Family, table: &str, args: &[&str]) -> Result<CommandOutput> {
        let output = self.iptables(family, table, args)?;
        if output.success {
            Ok(output)
        } else {
            Err(FirewallError::Refused {
                command: format!(
                    "{} -w {LOCK_WAIT_SECONDS} -t {table} {}",
                    family.program(),
                    args.join(" ")
                ),
                stderr: output.stderr.trim().to_owned(),
            })
        }
    }

    fn chain_exists(&self, family: Family, table: &str, chain: &str) -> Result<bool> {
        Ok(self.iptables(family, table, &["-n", "-L", chain])?.success)
    }

    fn ensure_chain(&self, family: Family, table: &str, chain: &str) -> Result<bool> {
        if self.chain_exists(family, table, chain)? {
            return Ok(false);
        }
        self.must(family, table, &["-N", chain])?;
        Ok(true)
    }

    fn rule_exists(&self, rule: &Rule) -> Result<bool> {
        let mut args = vec!["-C", rule.chain];
        args.extend(rule.spec.iter().map(String::as_str));
        Ok(self.iptables(rule.family, rule.table, &args)?.success)
    }

    /// The 1-based position of the first DROP or REJECT rule of a chain, or 1.
    fn before_first_drop(&self, family: Family, table: &str, chain: &str) -> Result<usize> {
        let listing = self.must(family, table, &["-S", chain])?;
        let prefix = format!("-A {chain} ");
        let position = listing
            .stdout
            .lines()
            .filter(|line| line.starts_with(&prefix))
            .position(|line| {
                let target = line.split(" -j ").nth(1).unwrap_or_default();
                target == "DROP" || target == "REJECT" || target.starts_with("REJECT ")
            });
        Ok(position.map_or(1, |i| i + 1))
    }

    /// What is missing now, without changing anything: each of the chains this module keeps
    /// that does not exist (`PLOYZ-INPUT` per family, `DOCKER-USER`), then each rule
    /// [`Firewall::reconcile`] would put back, in that order, then each retired rule it would
    /// delete. Empty when everything is as it should be.
    pub fn missing(&self) -> Result<Vec<String>> {
        let mut missing = Vec::new();
        for (family, chain) in [
            (Family::V4, CHAIN),
            (Family::V6, CHAIN),
            (Family::V4, DOCKER_USER),
        ] {
            if !self.chain_exists(family, "filter", chain)? {
                missing.push(format!("chain {chain} ({})", family.program()));
            }
        }
        let forward_jump = Rule {
            family: Family::V4,
            table: "filter",
            chain: "FORWARD",
            spec: spec(&["-j", DOCKER_USER]),
            placement: Placement::At(1),
        };
        for rule in std::iter::once(forward_jump).chain(self.rules()) {
            if !self.rule_exists(&rule)? {
                missing.push(format!("rule {rule}"));
            }
        }
        for rule in self.retired() {
            if self.rule_exists(&rule)? {
                missing.push(format!("retired rule {rule} to delete"));
            }
        }
        Ok(missing)
    }

    /// Deletes every retired rule, puts every missing rule, chain and jump back, each exactly
    /// where it belongs, and returns how many rules it deleted or put back (zero when
    /// everything was as it should be). Creates `DOCKER-USER` and
    /// its jump from `FORWARD` when Docker has not (yet): Docker keeps both when it starts.
    pub fn reconcile(&self) -> Result<usize> {
        for family in [Family::V4, Family::V6] {
            self.ensure_chain(family, "filter", CHAIN)?;
        }
        if self.ensure_chain(Family::V4, "filter", DOCKER_USER)? {
            tracing::info!("created the DOCKER-USER chain Docker has not made yet");
        }
        let forward_jump = Rule {
            family: Family::V4,
            table: "filter",
            chain: "FORWARD",
            spec: spec(&["-j", DOCKER_USER]),
            placement: Placement::At(1),
        };
        let mut restored = 0;
        for rule in self.retired() {
            let mut args = vec!["-D", rule.chain];
            args.extend(rule.spec.iter().map(String::as_str));
            for _ in 0..MAX_COPIES {
                if !self.rule_exists(&rule)? {
                    break;
                }
                self.must(rule.family, rule.table, &args)?;
                tracing::info!(rule = %rule, "retired firewall rule deleted");
                restored += 1;
            }
        }
        for rule in std::iter::once(forward_jump).chain(self.rules()) {
            if self.rule_exists(&rule)? {
                continue;
            }
            let position = match rule.placement {
                Placement::At(position) => position,
                Placement::BeforeFirstDrop => {
                    self.before_first_drop(rule.family, rule.table, rule.chain)?
                }
            };
            let position = position.to_string();
            let mut args = vec!["-I", rule.chain, &position];
            args.extend(rule.spec.iter().map(String::as_str));
            self.must(rule.family, rule.table, &args)?;
            tracing::info!(rule = %rule, "firewall rule put in place");
            restored += 1;
        }
        Ok(restored)
    }

    /// Deletes every rule this module adds (every copy of it), the jumps to [`CHAIN`] and the
    /// chain itself. `DOCKER-USER` and its jump from `FORWARD` stay: they are Docker's. Calling
    /// it when nothing is there does nothing.
    pub fn remove(&self) -> Result<()> {
        for rule in self.rules().iter().rev() {
            if rule.chain == CHAIN || !self.chain_exists(rule.family, rule.table, rule.chain)? {
                continue;
            }
            let mut args = vec!["-D", rule.chain];
            args.extend(rule.spec.iter().map(String::as_str));
            for _ in 0..MAX_COPIES {
                if !self.rule_exists(rule)? {
                    break;
                }
                self.must(rule.family, rule.table, &args)?;
            }
        }
        for family in [Family::V4, Family::V6] {
            if self.chain_exists(family, "filter", CHAIN)? {
                self.must(family, "filter", &["-F", CHAIN])?;
                self.must(family, "filter", &["-X", CHAIN])?;
            }
        }
        tracing::info!("firewall rules removed");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::collections::BTreeMap;

    use super::*;

    /// A small iptables: chains of rules per (program, table), answering the commands the
    /// firewall sends, and recording them.
    #[derive(Default)]
    struct FakeTables {
        chains: RefCell<BTreeMap<(String, String, String), Vec<String>>>,
        log: RefCell<Vec<String>>,
    }

    impl FakeTables {
        fn with_builtins() -> FakeTables {
            let fake = FakeTables::default();
            for program in ["iptables", "ip6tables"] {
                for (table, chain) in [
                    ("filter", "INPUT"),
                    ("filter", "FORWARD"),
                    ("nat", "POSTROUTING"),
                    ("raw", "PREROUTING"),
                ] {
                    fake.chains
                        .borrow_mut()
                        .insert((program.into(), table.into(), chain.into()), Vec::new());
                }
            }
            fake
        }

        fn chain(&self, program: &str, table: &str, chain: &str) -> Option<Vec<String>> {
            self.chains
                .borrow()
                .get(&(program.into(), table.into(), chain.into()))
                .cloned()
        }

        fn set_chain(&self, program: &str, table: &str, chain: &str, rules: &[&str]) {
            self.chains.borrow_mut().insert(
                (program.into(), table.into(), chain.into()),
                rules.iter().map(|r| (*r).to_owned()).collect(),
            );
        }
    }

    impl CommandRunner for FakeTables {
        fn run(&self, program: &str, args: &[String]) -> std::io::Result<CommandOutput> {
            self.log
                .borrow_mut()
                .push(format!("{program} {}", args.join(" ")));
            assert_eq!(
                &args[..2],
                ["-w", LOCK_WAIT_SECONDS],
                "every call waits for the lock"
            );
            assert_eq!(args[2], "-t");
            let table = args[3].clone();
            let rest = &args[4..];
            let (op, chain) = if rest[0] == "-n" {
                (rest[1].as_str(), rest[2].clone())
            } else {
                (rest[0].as_str(), rest[1].clone())
            };
            let key = (program.to_owned(), table, chain.clone());
            let mut chains = self.chains.borrow_mut();
            let ok = |stdout: String| {
                Ok(CommandOutput {
                    success: true,
                    stdout,
                    stderr: String::new(),
                })
            };
            let fail = || {
                Ok(CommandOutput {
                    success: false,
                    stdout: String::new(),
                    stderr: "iptables: Bad rule (does a matching rule exist in that chain?)."
                        .into(),
                })
            };
            match op {
                "-L" => {
                    if chains.contains_key(&key) {
                        ok(String::new())
                    } else {
                        fail()
                    }
                }
                "-N" => {
                    assert!(!chains.contains_key(&key), "-N of an existing chain");
                    chains.insert(key, Vec::new());
                    ok(String::new())
                }
                "-X" => {
                    assert!(chains[&key].is_empty(), "-X of a chain with rules");
                    chains.remove(&key);
                    ok(String::new())
                }
                "-F" => {
                    chains.get_mut(&key).map(Vec::clear);
                    ok(String::new())
                }
                "-S" => {
                    let mut out = format!("-N {chain}\n");
                    for rule in &chains[&key] {
                        out.push_str(&format!("-A {chain} {rule}\n"));
                    }
                    ok(out)
                }
                "-C" | "-D" | "-I" => {
                    let Some(rules) = chains.get_mut(&key) else {
                        return fail();
                    };
                    let (position, spec) = if op == "-I" {
                        (Some(rest[2].parse::<usize>().unwrap()), rest[3..].join(" "))
                    } else {
                        (None, rest[2..].join(" "))
                    };
                    let found = rules.iter().position(|r| *r == spec);
                    match (op, found) {
                        ("-C", Some(_)) => ok(String::new()),
                        ("-D", Some(i)) => {
                            rules.remove(i);
                            ok(String::new())
                        }
                        ("-I", _) => {
                            let at = position.unwrap() - 1;
                            assert!(
                                at <= rules.len(),
                                "-I {} in a chain of {}",
                                at + 1,
                                rules.len()
                            );
                            rules.insert(at, spec);
                            ok(String::new())
                        }
                        _ => fail(),
                    }
                }
                other => panic!("unexpected iptables operation {other}"),
            }
        }
    }

    fn config() -> FirewallConfig {
        FirewallConfig {
            mesh_interface: "ployz0".into(),
            docker_bridge: "ployz".into(),
            wireguard_port: 51820,
            management_port: 51000,
            gossip_port: 51001,
            machine_subnet: "10.210.3.0/24".parse().unwrap(),
            cluster_network: ClusterNetwork::default(),
        }
    }

    #[test]
    fn reconcile_builds_the_chains_and_jumps() {
        let fake = FakeTables::with_builtins();
        fake.set_chain(
            "iptables",
            "filter",
            "INPUT",
            &["-i lo -j ACCEPT", "-p tcp --dport 22 -j ACCEPT", "-j DROP"],
        );
        let firewall = Firewall::new(config(), fake);
        assert_eq!(firewall.reconcile().unwrap(), 14);
        let fake = firewall.runner();
        assert_eq!(
            fake.chain("iptables", "filter", CHAIN).unwrap(),
            ["-p udp --dport 51820 -j ACCEPT"]
        );
        assert_eq!(
            fake.chain("ip6tables", "filter", CHAIN).unwrap(),
            [
                "-i lo -p tcp --dport 51000 -j REJECT --reject-with tcp-reset",
                "-i lo -p udp --dport 51001 -j REJECT --reject-with icmp6-port-unreachable",
                "-s fdcc::/16 -i ployz0 -p tcp --dport 51000 -j ACCEPT",
                "-s fdcc::/16 -i ployz0 -p udp --dport 51001 -j ACCEPT",
                "-p tcp --dport 51000 -j DROP",
                "-p udp --dport 51001 -j DROP",
            ]
        );
        assert_eq!(
            fake.chain("iptables", "filter", "INPUT").unwrap(),
            [
                "-i lo -j ACCEPT",
                "-p tcp --dport 22 -j ACCEPT",
                "-j PLOYZ-INPUT",
                "-j DROP"
            ],
            "the jump goes before the first DROP"
        );
        assert_eq!(
            fake.chain("ip6tables", "filter", "INPUT").unwrap(),
            ["-j PLOYZ-INPUT"]
        );
        assert_eq!(
            fake.chain("iptables", "filter", "FORWARD").unwrap(),
            ["-j DOCKER-USER"]
        );
        let mut docker_user = fake.chain("iptables", "filter", DOCKER_USER).unwrap();
        docker_user.sort();
        assert_eq!(
            docker_user,
            [
                "-i ployz -o ployz0 -j ACCEPT",
                "-i ployz0 -o ployz -j ACCEPT"
            ]
        );
        assert_eq!(
            fake.chain("iptables", "nat", "POSTROUTING").unwrap(),
            ["-s 10.210.3.0/24 -d 10.210.0.0/16 -j RETURN"]
        );
        assert_eq!(
            fake.chain("iptables", "raw", "PREROUTING").unwrap(),
            ["-i ployz0 -d 10.210.3.0/24 -j ACCEPT"]
        );
        assert!(fake.chain("ip6tables", "filter", DOCKER_USER).is_none());
    }

    #[test]
    fn missing_names_what_reconcile_would_put_back_and_changes_nothing() {
        let firewall = Firewall::new(config(), FakeTables::with_builtins());
        let before = firewall.missing().unwrap();
        assert!(
            before.contains(&"chain PLOYZ-INPUT (iptables)".to_owned()),
            "{before:?}"
        );
        assert!(
            before.contains(&"chain DOCKER-USER (iptables)".to_owned()),
            "{before:?}"
        );
        assert!(firewall
            .runner()
            .chain("iptables", "filter", CHAIN)
            .is_none());
        firewall.reconcile().unwrap();
        assert_eq!(firewall.missing().unwrap(), Vec::<String>::new());
        // The chain deleted from outside, its jump with it.
        firewall.runner().chains.borrow_mut().remove(&(
            "iptables".into(),
            "filter".into(),
            CHAIN.into(),
        ));
        firewall
            .runner()
            .set_chain("iptables", "filter", "INPUT", &[]);
        let missing = firewall.missing().unwrap();
        assert_eq!(
            missing,
            [
                "chain PLOYZ-INPUT (iptables)",
                "rule iptables -t filter PLOYZ-INPUT -p udp --dport 51820 -j ACCEPT",
                "rule iptables -t filter INPUT -j PLOYZ-INPUT",
            ],
        );
        assert_eq!(firewall.reconcile().unwrap(), 2);
        assert!(firewall.missing().unwrap().is_empty());
    }

    #[test]
    fn a_chain_an_earlier_release_left_loses_its_retired_rule_and_ends_as_a_fresh_one() {
        let fresh = Firewall::new(config(), FakeTables::with_builtins());
        fresh.reconcile().unwrap();
        let want = fresh.runner().chain("ip6tables", "filter", CHAIN).unwrap();

        let firewall = Firewall::new(config(), FakeTables::with_builtins());
        firewall.reconcile().unwrap();
        // Loopback let through first, and the refusals over it not there yet.
        firewall.runner().set_chain(
            "ip6tables",
            "filter",
            CHAIN,
            &[
                "-i lo -j RETURN",
                "-s fdcc::/16 -i ployz0 -p tcp --dport 51000 -j ACCEPT",
                "-s fdcc::/16 -i ployz0 -p udp --dport 51001 -j ACCEPT",
                "-p tcp --dport 51000 -j DROP",
                "-p udp --dport 51001 -j DROP",
            ],
        );
        let missing = firewall.missing().unwrap();
        assert_eq!(
            missing.last().map(String::as_str),
            Some("retired rule ip6tables -t filter PLOYZ-INPUT -i lo -j RETURN to delete"),
            "{missing:?}"
        );
        assert_eq!(firewall.reconcile().unwrap(), 3, "1 deleted, 2 put back");
        assert_eq!(
            firewall
                .runner()
                .chain("ip6tables", "filter", CHAIN)
                .unwrap(),
            want
        );
        assert!(firewall.missing().unwrap().is_empty());
    }

    #[test]
    fn reconcile_is_idempotent_and_restores_a_deleted_rule_in_place() {
        let firewall = Firewall::new(config(), FakeTables::with_builtins());
        firewall.reconcile().unwrap();
        let before = firewall.runner().chains.borrow().clone();
        firewall.runner().log.borrow_mut().clear();
        assert_eq!(firewall.reconcile().unwrap(), 0);
        assert!(
            firewall
                .runner()
                .log
                .borrow()
                .iter()
                .all(|c| c.contains(" -C ") || c.contains(" -L ")),
            "a second reconcile only checks: {:?}",
            firewall.runner().log.borrow()
        );
        assert_eq!(*firewall.runner().chains.borrow(), before);

        // An ACCEPT deleted from the middle of the chain comes back ahead of the DROPs.
        let key = (
            "ip6tables".to_owned(),
            "filter".to_owned(),
            CHAIN.to_owned(),
        );
        firewall
            .runner()
            .chains
            .borrow_mut()
            .get_mut(&key)
            .unwrap()
            .remove(2);
        assert_eq!(firewall.reconcile().unwrap(), 1);
        assert_eq!(*firewall.runner().chains.borrow(), before);

        // A deleted jump and a deleted chain come back too.
        firewall
            .runner()
            .set_chain("iptables", "filter", "INPUT", &[]);
        firewall.runner().chains.borrow_mut().remove(&(
            "iptables".into(),
            "filter".into(),
            CHAIN.into(),
        ));
        assert_eq!(firewall.reconcile().unwrap(), 2);
        assert_eq!(*firewall.runner().chains.borrow(), before);
    }

    #[test]
    fn remove_takes_away_everything_it_added_and_is_idempotent() {
        let fake = FakeTables::with_builtins();
        fake.set_chain(
            "iptables",
            "nat",
            "POSTROUTING",
            &["-s 172.17.0.0/16 ! -o docker0 -j MASQUERADE"],
        );
        let firewall = Firewall::new(config(), fake);
        firewall.reconcile().unwrap();
        // A duplicate someone added by hand goes too.
        firewall.runner().set_chain(
            "ip6tables",
            "filter",
            "INPUT",
            &["-j PLOYZ-INPUT", "-j PLOYZ-INPUT"],
        );
        firewall.remove().unwrap();
        let fake = firewall.runner();
        assert!(fake.chain("iptables", "filter", CHAIN).is_none());
        assert!(fake.chain("ip6tables", "filter", CHAIN).is_none());
        assert!(fake
            .chain("iptables", "filter", "INPUT")
            .unwrap()
            .is_empty());
        assert!(fake
            .chain("ip6tables", "filter", "INPUT")
            .unwrap()
            .is_empty());
        assert!(fake
            .chain("iptables", "filter", DOCKER_USER)
            .unwrap()
            .is_empty());
        assert_eq!(
            fake.chain("iptables", "nat", "POSTROUTING").unwrap(),
            ["-s 172.17.0.0/16 ! -o docker0 -j MASQUERADE"]
        );
        assert!(fake
            .chain("iptables", "raw", "PREROUTING")
            .unwrap()
            .is_empty());
        firewall.remove().unwrap();
    }

    #[test]
    fn a_refusal_names_the_command() {
        struct Refusing;
        impl CommandRunner for Refusing {
            fn run(&self, _: &str, _: &[String]) -> std::io::Result<CommandOutput> {
                Ok(CommandOutput {
                    success: false,
                    stdout: String::new(),
                    stderr: "iptables v1.8.9 (nf_tables): Could not fetch rule set generation id: Permission denied (you must be root)\n".into(),
                })
            }
        }
        let err = Firewall::new(config(), Refusing)
            .reconcile()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("iptables -w 5 -t filter -N PLOYZ-INPUT"),
            "{err}"
        );
        assert!(err.contains("you must be root"), "{err}");
    }
}
