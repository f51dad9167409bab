//! `ployz cert`: Certificate Material for Ingress Hostnames.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use ployz_core::api::{paths, ImportCertificateRequest};
use ployz_core::CertificateSummary;

use crate::output::{print_json, print_table, table};
use crate::GlobalArgs;

#[derive(Debug, Subcommand)]
pub enum CertCommand {
    /// Store a certificate and key for an Ingress Hostname; every edge serves it by SNI.
    Import(ImportArgs),
    /// List Certificate Material (hostnames, names covered, expiry; never keys).
    #[command(visible_alias = "list")]
    Ls {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
pub struct ImportArgs {
    /// The Ingress Hostname.
    hostname: String,
    /// PEM certificate chain, leaf first.
    #[arg(long, value_name = "FILE")]
    cert: PathBuf,
    /// PEM private key of the leaf.
    #[arg(long, value_name = "FILE")]
    key: PathBuf,
}

pub async fn run(global: &GlobalArgs, cmd: CertCommand) -> anyhow::Result<()> {
    match cmd {
        CertCommand::Import(args) => {
            let chain_pem = std::fs::read_to_string(&args.cert)
                .with_context(|| format!("cannot read --cert {}", args.cert.display()))?;
            let key_pem = std::fs::read_to_string(&args.key)
                .with_context(|| format!("cannot read --key {}", args.key.display()))?;
            // Refuse a bad pair before reaching anything; the daemon checks again.
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64);
            ployz_edge::certificates::validate(&args.hostname, &chain_pem, &key_pem, now)
                .map_err(|e| anyhow::anyhow!("certificate for '{}': {e}", args.hostname))?;
            let mut client = super::connect(global).await?;
            let summary: CertificateSummary = client
                .post(
                    paths::CERTIFICATES,
                    &ImportCertificateRequest {
                        hostname: args.hostname,
                        chain_pem,
                        key_pem,
                    },
                )
                .await?;
            println!(
                "Certificate for '{}' stored (covers {}; expires at Unix time {}).",
                summary.hostname,
                summary.names.join(", "),
                summary.not_after
            );
            Ok(())
        }
        CertCommand::Ls { json } => {
            let mut client = super::connect(global).await?;
            let all: Vec<CertificateSummary> = client.get(paths::CERTIFICATES).await?;
            if json {
                return print_json(&all);
            }
            let mut t = table(&["HOSTNAME", "NAMES", "NOT AFTER (UNIX)"]);
            for c in &all {
                t.add_row(vec![
                    c.hostname.clone(),
                    c.names.join(", "),
                    c.not_after.to_string(),
                ]);
            }
            print_table(&t);
            Ok(())
        }
    }
}
