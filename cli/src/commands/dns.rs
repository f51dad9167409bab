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
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Percent-encodes a query-string value.
fn encode(v: &str) -> String {
    v.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

pub async fn run(global: &GlobalArgs, cmd: DnsCommand) -> anyhow::Result<()> {
    let DnsCommand::Lookup { name, qtype, json } = cmd;
    // Refuse a bad type before reaching anything.
    qtype
        .parse::<QueryType>()
        .map_err(|e| anyhow::anyhow!("--type: {e}"))?;
    let mut client = super::connect(global).await?;
    let answer: LookupAnswer = client
        .get(&format!(
            "{}?name={}&type={}",
            paths::DNS_LOOKUP,
            encode(&name),
            encode(&qtype)
        ))
        .await?;
    if json {
        return print_json(&answer);
    }
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
    Ok(())
}
