//! `ployz machine status`: what one Machine's daemon last did to keep its own plumbing as it
//! should be (the WireGuard interface, peers and routes, the firewall chain, the Docker `ployz`
//! network, the DNS listener, its Machine record), per concern, as that Machine records it.

use clap::Args;
use ployz_core::api::{self, ReconcileOutcome, ReconcileStatus};

use crate::output::{print_json, table};
use crate::GlobalArgs;

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// The Machine whose reconciliation to show: a Name or Machine ID [default: the Machine
    /// reached]. The call is forwarded to it over the mesh.
    #[arg(short = 'm', long = "machine", value_name = "MACHINE")]
    machine: Option<String>,
}

pub async fn status(global: &GlobalArgs, args: StatusArgs) -> anyhow::Result<()> {
    let mut client = super::connect(global).await?;
    if let Some(wanted) = &args.machine {
        let (header, _) =
            crate::targets::header_for(&mut client, std::slice::from_ref(wanted)).await?;
        if header == "*" {
            anyhow::bail!(
                "-m '*': `machine status` shows one Machine's reconciliation; name one Machine"
            );
        }
        client.set_machine_target(Some(header));
    }
    let status: ReconcileStatus = client.get(api::paths::RECONCILE).await?;
    if args.json {
        return print_json(&status);
    }
    print!("{}", render(&status));
    Ok(())
}

/// How long ago, in words a reader takes in at a glance.
fn ago(secs: u64) -> String {
    match secs {
        0..=119 => format!("{secs} s ago"),
        120..=7199 => format!("{} min ago", secs / 60),
        _ => format!("{} h ago", secs / 3600),
    }
}

/// The status as text: a heading naming the Machine whose record it is, one row per concern,
/// then the details of each correction and failure the last passes met.
fn render(status: &ReconcileStatus) -> String {
    let mut out = format!(
        "Machine '{}' ({}) reconciles its plumbing every {} s; as it records its passes now:\n",
        status.machine_name, status.machine, status.interval_secs
    );
    let mut t = table(&[
        "CONCERN",
        "LAST PASS",
        "TRIGGER",
        "OUTCOME",
        "PASSES",
        "CORRECTIONS",
        "FAILURES",
    ]);
    let mut details = Vec::new();
    for c in &status.concerns {
        let (when, trigger, outcome) = match &c.last {
            None => ("never".to_owned(), "-".to_owned(), "-".to_owned()),
            Some(pass) => {
                let outcome = match &pass.outcome {
                    ReconcileOutcome::InSync => "in sync".to_owned(),
                    ReconcileOutcome::Corrected { found, done } => {
                        details.push(format!("  {}: corrected: {found}: {done}", c.concern));
                        "corrected".to_owned()
                    }
                    ReconcileOutcome::CouldNot { error } => {
                        details.push(format!("  {}: could not: {error}", c.concern));
                        "could not".to_owned()
                    }
                };
                (ago(pass.secs_ago), pass.trigger.clone(), outcome)
            }
        };
        t.add_row(vec![
            c.concern.clone(),
            when,
            trigger,
            outcome,
            c.passes.to_string(),
            c.corrections.to_string(),
            c.failures.to_string(),
        ]);
    }
    for line in t.to_string().lines() {
        out.push_str(line.trim_end());
        out.push('\n');
    }
    if !details.is_empty() {
        out.push_str("Last passes that found something:\n");
        for d in details {
            out.push_str(&d);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use ployz_core::api::{ConcernPass, ConcernStatus};

    #[test]
    fn a_status_names_its_machine_each_concern_and_what_was_corrected() {
        let status = ReconcileStatus {
            machine: ployz_core::MachineId::generate(),
            machine_name: "m0".parse().unwrap(),
            interval_secs: 60,
            observed_at: 0,
            concerns: vec![
                ConcernStatus {
                    concern: "firewall".into(),
                    last: Some(ConcernPass {
                        secs_ago: 3,
                        trigger: "timer".into(),
                        outcome: ReconcileOutcome::Corrected {
                            found: "missing: chain PLOYZ-INPUT (iptables)".into(),
                            done: "firewall rules put back: 2".into(),
                        },
                    }),
                    passes: 4,
                    corrections: 1,
                    failures: 0,
                },
                ConcernStatus {
                    concern: "dns_listener".into(),
                    last: None,
                    passes: 0,
                    corrections: 0,
                    failures: 0,
                },
            ],
        };
        let text = render(&status);
        assert!(text.starts_with("Machine 'm0' ("), "{text}");
        assert!(text.contains("every 60 s"), "{text}");
        let row = text.lines().find(|l| l.starts_with("firewall")).unwrap();
        for part in ["3 s ago", "timer", "corrected", "4", "1"] {
            assert!(row.contains(part), "{part} in {row}");
        }
        assert!(text
            .lines()
            .any(|l| l.starts_with("dns_listener") && l.contains("never")));
        assert!(text.contains(
            "firewall: corrected: missing: chain PLOYZ-INPUT (iptables): firewall rules put back: 2"
        ));
        assert_eq!(ago(3600), "60 min ago");
        assert_eq!(ago(7200), "2 h ago");
    }
}
