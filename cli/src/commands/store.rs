//! `ployz store`: the store as the Machine reached holds it. `digest` says how much of each
//! origin it holds (equal digests on two Machines mean equal stores); `put`, `ls` and `rm` work
//! on the scratch namespace, cluster-scoped values nothing in Ployz reads, for checking
//! replication by hand.

use anyhow::bail;
use clap::{Args, Subcommand};
use ployz_core::api::{self, PutScratchRequest, ScratchRecord, StoreDigest};

use crate::output::{print_json, print_table, table};
use crate::GlobalArgs;

#[derive(Debug, Subcommand)]
pub enum StoreCommand {
    /// Per origin Machine, the highest sequence this Machine's store holds.
    Digest(JsonArgs),
    /// Write scratch values: NAME=VALUE (repeatable), each one write.
    Put(PutArgs),
    /// List the scratch values and which Machine's write wins for each.
    Ls(JsonArgs),
    /// Delete scratch values.
    Rm(RmArgs),
}

#[derive(Debug, Args)]
pub struct JsonArgs {
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct PutArgs {
    /// NAME=VALUE pairs.
    #[arg(required = true, value_name = "NAME=VALUE")]
    pairs: Vec<String>,
}

#[derive(Debug, Args)]
pub struct RmArgs {
    /// Names to delete.
    #[arg(required = true, value_name = "NAME")]
    names: Vec<String>,
}

pub async fn run(global: &GlobalArgs, cmd: StoreCommand) -> anyhow::Result<()> {
    match cmd {
        StoreCommand::Digest(args) => digest(global, args).await,
        StoreCommand::Put(args) => put(global, args).await,
        StoreCommand::Ls(args) => ls(global, args).await,
        StoreCommand::Rm(args) => rm(global, args).await,
    }
}

async fn digest(global: &GlobalArgs, args: JsonArgs) -> anyhow::Result<()> {
    let mut client = super::connect(global).await?;
    let d: StoreDigest = client.get(api::paths::STORE_DIGEST).await?;
    if args.json {
        return print_json(&d);
    }
    let mut t = table(&["ORIGIN", "SEQUENCE", "CLOCK REFUSALS"]);
    for (origin, seq) in &d.digest {
        t.add_row(vec![
            origin.to_string(),
            seq.to_string(),
            d.clock_refusals
                .get(origin)
                .copied()
                .unwrap_or(0)
                .to_string(),
        ]);
    }
    print_table(&t);
    for id in &d.forgotten {
        println!("forgotten (removed from the Cluster): {id}");
    }
    if let Some(ms) = d.clock_went_back_ms {
        eprintln!(
            "warning: this Machine's clock went back {} s behind its own timestamps (a jump forward, corrected): the others refuse its writes until it catches up",
            ms.div_ceil(1000)
        );
    }
    Ok(())
}

async fn put(global: &GlobalArgs, args: PutArgs) -> anyhow::Result<()> {
    let mut request = PutScratchRequest::default();
    for pair in &args.pairs {
        let Some((name, value)) = pair.split_once('=') else {
            bail!("'{pair}' is not NAME=VALUE");
        };
        request.values.insert(name.to_owned(), value.to_owned());
    }
    let mut client = super::connect(global).await?;
    let _: serde_json::Value = client.put(api::paths::STORE_SCRATCH, &request).await?;
    println!("{} value(s) written.", request.values.len());
    Ok(())
}

async fn ls(global: &GlobalArgs, args: JsonArgs) -> anyhow::Result<()> {
    let mut client = super::connect(global).await?;
    let records: Vec<ScratchRecord> = client.get(api::paths::STORE_SCRATCH).await?;
    if args.json {
        return print_json(&records);
    }
    let mut t = table(&["NAME", "VALUE", "ORIGIN", "HLC"]);
    for r in &records {
        t.add_row(vec![
            r.name.clone(),
            r.value.clone(),
            r.origin.to_string(),
            r.hlc.clone(),
        ]);
    }
    print_table(&t);
    Ok(())
}

async fn rm(global: &GlobalArgs, args: RmArgs) -> anyhow::Result<()> {
    let mut client = super::connect(global).await?;
    for name in &args.names {
        // The daemon checks names fully; this keeps the query string what it says.
        if !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        {
            bail!("scratch name '{name}' is not usable: use letters, digits, '.', '_' or '-'");
        }
        client
            .delete(&format!("{}?name={name}", api::paths::STORE_SCRATCH))
            .await?;
    }
    println!("{} value(s) deleted.", args.names.len());
    Ok(())
}
