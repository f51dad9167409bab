//! `ployz dns`: what a Machine's internal DNS would answer.

use clap::Subcommand;
use ployz_core::api::{paths, AnswerKind, LookupAnswer, QueryType};

use crate::output::print_json;
use crate::GlobalArgs;

#[derive(Debug, Subcommand)]
pub enum DnsCommand {
    /// Ask what the Machine reached would answer for a name, from its current snapshot
    /// (`web.internal`, `nearest.web.internal`, `<machine>.m.web.internal`, or any other name,
    /// which it forwards).
    Lookup {
        /// The name.
        name: String,
        /// The record type: A, AAAA, ANY, TXT... [default: A].
        #[arg(long = "type", short = 't', value_name = "TYPE", default_value = "A")]
        qtype: String,
        /// Print JSON (with -m: `values`, each Machine's answer with its Machine, and
        /// `failures`).
        #[arg(long)]
        json: bool,
        /// Ask these Machines instead (a Name or Machine ID, repeatable, or `*`): each answers
        /// from its own snapshot [default: the Machine reached].
        #[arg(short = 'm', long = "machine", value_name = "MACHINE")]
        machines: Vec<String>,
    },
}

pub async fn run(global: &GlobalArgs, cmd: DnsCommand) -> anyhow::Result<()> {
    let DnsCommand::Lookup {
        name,
        qtype,
        json,
        machines,
    } = cmd;
    // Refuse a bad type before reaching anything.
    qtype
        .parse::<QueryType>()
        .map_err(|e| anyhow::anyhow!("--type: {e}"))?;
    let mut client = super::connect(global).await?;
    let path = format!(
        "{}?name={}&type={}",
        paths::DNS_LOOKUP,
        ployz_core::api::query_value(&name),
        ployz_core::api::query_value(&qtype)
    );
    if !machines.is_empty() {
        let (answers, failures) =
            crate::targets::get_all::<LookupAnswer>(&mut client, &machines, &path).await?;
        let asked = answers.len() + failures.len();
        if json {
            let values: Vec<serde_json::Value> = answers
                .iter()
                .map(|(m, a)| {
                    serde_json::json!({ "machine": m.machine, "machine_name": m.name, "answer": a })
                })
                .collect();
            print_json(&serde_json::json!({ "values": values, "failures": failures }))?;
        } else {
            for (m, answer) in &answers {
                println!(
                    "Machine {}:",
                    if m.name.is_empty() {
                        m.machine.as_str()
                    } else {
                        &m.name
                    }
                );
                print_answer(answer);
            }
        }
        return crate::targets::report_failures(&failures, asked);
    }
    let answer: LookupAnswer = client.get(&path).await?;
    if json {
        return print_json(&answer);
    }
    print_answer(&answer);
    Ok(())
}

/// One Machine's answer, as dig would show its records.
fn print_answer(answer: &LookupAnswer) {
    match answer.kind {
        AnswerKind::Forwarded => {
            println!(
                "{} is outside .internal: forwarded to the Machine's upstream resolvers.",
                answer.name
            );
        }
        AnswerKind::Unknown => {
            let rcode = answer.rcode.map_or_else(
                || "NXDOMAIN".to_owned(),
                |r| format!("{r:?}").to_uppercase(),
            );
            println!("{} {}: {rcode}.", answer.name, answer.qtype);
        }
        AnswerKind::Internal if answer.addresses.is_empty() => {
            println!(
                "{} {}: no records (the name exists; no Serving Container answers this type).",
                answer.name, answer.qtype
            );
        }
        AnswerKind::Internal => {
            for (i, a) in answer.addresses.iter().enumerate() {
                let local = if i < answer.local_addresses {
                    "  (this Machine's subnet)"
                } else {
                    ""
                };
                println!("{}\t0\tIN\tA\t{a}{local}", answer.name);
            }
        }
    }
}
