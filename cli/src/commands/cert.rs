//! `ployz cert`: Certificate Material for Ingress Hostnames.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use ployz_core::api::{paths, ImportCertificateRequest, SetCertificatePolicyRequest};
use ployz_core::{CertificateKeyType, CertificatePolicy, CertificateStatus, CertificateSummary};

use crate::output::{print_json, print_table, table};
use crate::GlobalArgs;

#[derive(Debug, Subcommand)]
pub enum CertCommand {
    /// Store a certificate and key for an Ingress Hostname; every edge serves it by SNI.
    Import(ImportArgs),
    /// List certificates: the material held (names covered, expiry; never keys) and, for
    /// hostnames ordered by ACME, their status, issuer Machine, last error and next attempt.
    #[command(visible_alias = "list")]
    Ls {
        /// Print JSON: `material` and `status`.
        #[arg(long)]
        json: bool,
    },
    /// Show or change the Certificate Policy (how certificates are ordered by ACME).
    #[command(subcommand)]
    Policy(PolicyCommand),
}

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Show the policy in force (built-in defaults for what is not set).
    Show {
        /// Print JSON (the fields as set; absent ones are defaults).
        #[arg(long)]
        json: bool,
    },
    /// Change the policy: each flag given replaces that value; the daemon refuses a policy it
    /// cannot follow, and nothing changes then.
    Set(Box<PolicySetArgs>),
    /// Back to the built-in defaults.
    Reset,
}

#[derive(Debug, Args)]
pub struct PolicySetArgs {
    /// ACME directory URL [default: Let's Encrypt production].
    #[arg(long, value_name = "URL")]
    directory: Option<String>,
    /// PEM CA bundle to trust for the directory's TLS (a private CA, a test server).
    #[arg(long, value_name = "FILE")]
    ca_file: Option<PathBuf>,
    /// External account binding key ID.
    #[arg(long, value_name = "KID")]
    eab_kid: Option<String>,
    /// External account binding HMAC key (base64url). Prefer --eab-hmac-file or
    /// PLOYZ_EAB_HMAC: a command line is visible to every user of the machine.
    #[arg(
        long,
        value_name = "KEY",
        env = "PLOYZ_EAB_HMAC",
        hide_env_values = true
    )]
    eab_hmac: Option<String>,
    /// A file holding the external account binding HMAC key.
    #[arg(long, value_name = "FILE", conflicts_with = "eab_hmac")]
    eab_hmac_file: Option<PathBuf>,
    /// Certificate key type: ecdsa-p256 or rsa-2048 [default: ecdsa-p256].
    #[arg(long, value_name = "TYPE")]
    key_type: Option<String>,
    /// Renew when this fraction of a certificate's lifetime has passed, in (0, 1)
    /// [default: 0.667].
    #[arg(long, value_name = "FRACTION")]
    renew_fraction: Option<f64>,
    /// Shortest wait after a failed attempt, e.g. 60s, 5m [default: 60s].
    #[arg(long, value_name = "DURATION")]
    backoff_min: Option<String>,
    /// Longest wait after failed attempts, e.g. 6h [default: 6h].
    #[arg(long, value_name = "DURATION")]
    backoff_max: Option<String>,
    /// How long the Cluster DNS Verdict waits for DNS, e.g. 5s [default: 5s].
    #[arg(long, value_name = "DURATION")]
    probe_timeout: Option<String>,
    /// Challenge kind; Ployz performs http-01 [default: http-01].
    #[arg(long, value_name = "KIND")]
    challenge: Option<String>,
    /// Start from the built-in defaults instead of the current policy.
    #[arg(long)]
    reset: bool,
    /// Print the resulting policy as JSON.
    #[arg(long)]
    json: bool,
}

/// Parses `90`, `90s`, `5m`, `6h` or `1d` into milliseconds; the error names the flag.
fn duration_ms(flag: &str, value: &str) -> anyhow::Result<u64> {
    let v = value.trim();
    let (digits, unit_ms) = match v.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        None => (v, 1000),
        Some((i, _)) => (
            &v[..i],
            match &v[i..] {
                "ms" => 1,
                "s" => 1000,
                "m" => 60_000,
                "h" => 3_600_000,
                "d" => 86_400_000,
                other => anyhow::bail!(
                    "--{flag} '{value}': unknown unit '{other}'; use ms, s, m, h or d (e.g. 5m)"
                ),
            },
        ),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| anyhow::anyhow!("--{flag} '{value}' is not a duration such as 30s or 5m"))?;
    n.checked_mul(unit_ms)
        .ok_or_else(|| anyhow::anyhow!("--{flag} '{value}' is too long"))
}

impl PolicySetArgs {
    /// The fields to set, checked as far as they can be without the stored policy.
    fn policy(&self) -> anyhow::Result<CertificatePolicy> {
        let key_type =
            match self.key_type.as_deref() {
                None => None,
                Some(t) => Some(
                    serde_json::from_value::<CertificateKeyType>(serde_json::Value::String(
                        t.into(),
                    ))
                    .map_err(|_| {
                        anyhow::anyhow!("--key-type '{t}' is not ecdsa-p256 or rsa-2048")
                    })?,
                ),
            };
        let ca_bundle_pem = match &self.ca_file {
            None => None,
            Some(path) => Some(
                std::fs::read_to_string(path)
                    .with_context(|| format!("cannot read --ca-file {}", path.display()))?,
            ),
        };
        let eab_hmac_key = match &self.eab_hmac_file {
            Some(path) => Some(
                std::fs::read_to_string(path)
                    .with_context(|| format!("cannot read --eab-hmac-file {}", path.display()))?
                    .trim()
                    .to_owned(),
            ),
            None => self.eab_hmac.clone(),
        };
        let policy = CertificatePolicy {
            directory_url: self.directory.clone(),
            ca_bundle_pem,
            eab_key_id: self.eab_kid.clone(),
            eab_hmac_key,
            key_type,
            renewal_fraction: self.renew_fraction,
            backoff_min_secs: self
                .backoff_min
                .as_deref()
                .map(|v| duration_ms("backoff-min", v).map(|ms| ms.div_ceil(1000)))
                .transpose()?,
            backoff_max_secs: self
                .backoff_max
                .as_deref()
                .map(|v| duration_ms("backoff-max", v).map(|ms| ms.div_ceil(1000)))
                .transpose()?,
            probe_timeout_ms: self
                .probe_timeout
                .as_deref()
                .map(|v| duration_ms("probe-timeout", v))
                .transpose()?,
            challenge: self.challenge.clone(),
        };
        // A binding needs both halves; the daemon checks the merged policy again.
        let mut alone = policy.clone();
        if alone.eab_key_id.is_some() != alone.eab_hmac_key.is_some() {
            alone.eab_key_id = None;
            alone.eab_hmac_key = None;
        }
        alone.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(policy)
    }
}

fn show_policy(p: &CertificatePolicy) {
    let set = |v: bool| if v { "" } else { " (default)" };
    println!("Certificate Policy");
    println!(
        "  directory       {}{}",
        p.directory_url(),
        set(p.directory_url.is_some())
    );
    println!(
        "  CA bundle       {}",
        if p.ca_bundle_pem.is_some() {
            "set (trusted for the directory)"
        } else {
            "system roots (default)"
        }
    );
    match &p.eab_key_id {
        Some(kid) => println!("  account binding key ID {kid}, HMAC key set"),
        None => println!("  account binding none (default)"),
    }
    println!(
        "  key type        {}{}",
        p.key_type().as_str(),
        set(p.key_type.is_some())
    );
    println!(
        "  renew after     {:.3} of the lifetime{}",
        p.renewal_fraction(),
        set(p.renewal_fraction.is_some())
    );
    println!(
        "  backoff         {} s to {} s{}",
        p.backoff_min().as_secs(),
        p.backoff_max().as_secs(),
        set(p.backoff_min_secs.is_some() || p.backoff_max_secs.is_some())
    );
    println!(
        "  probe timeout   {} ms{}",
        p.probe_timeout().as_millis(),
        set(p.probe_timeout_ms.is_some())
    );
    println!(
        "  challenge       {}{}",
        p.challenge_kind(),
        set(p.challenge.is_some())
    );
}

/// `ployz cert ls --json`.
#[derive(serde::Serialize)]
struct Listing {
    material: Vec<CertificateSummary>,
    status: Vec<CertificateStatus>,
    /// The statuses whose issuer has not done what they say it would, long past the time.
    overdue: Vec<Overdue>,
}

#[derive(Debug, PartialEq, Eq, serde::Serialize)]
struct Overdue {
    hostname: String,
    /// The Machine that was to act.
    issuer: ployz_core::MachineId,
    /// When it was to act (Unix seconds).
    due_at: i64,
}

/// How long after the time a status says its issuer would act (start or end an order, renew,
/// retry) it is taken as left alone, on top of the policy's minimum backoff (a renewal soon
/// after an issuance waits that long): the issuer wakes at each such time, and at least
/// hourly. And how long that issuer must have written no status at all: one working through
/// a long queue of orders (each up to 5 minutes) writes as it goes.
const OVERDUE_AFTER_SECS: i64 = 3600;

/// The statuses among `statuses` whose issuer is late ([`overdue`]) and has written none of
/// its statuses for [`OVERDUE_AFTER_SECS`].
fn overdue_statuses(
    statuses: &[CertificateStatus],
    now: i64,
    backoff_min_secs: i64,
) -> Vec<Overdue> {
    let mut last_write: std::collections::HashMap<&ployz_core::MachineId, i64> =
        std::collections::HashMap::new();
    for s in statuses {
        let t = last_write.entry(&s.issuer).or_insert(s.updated_at);
        *t = (*t).max(s.updated_at);
    }
    statuses
        .iter()
        .filter(|s| now > last_write[&s.issuer].saturating_add(OVERDUE_AFTER_SECS))
        .filter_map(|s| overdue(s, now, backoff_min_secs))
        .collect()
}

/// When `status`'s issuer was to act on it, if that is more than [`OVERDUE_AFTER_SECS`] and
/// `backoff_min_secs` before `now`: a Valid status past its renewal point, a failed one past its
/// next attempt, an order begun and never ended. Its issuer is down, cut off, or passed over by
/// no one (a Machine gone for good and not removed).
fn overdue(status: &CertificateStatus, now: i64, backoff_min_secs: i64) -> Option<Overdue> {
    use ployz_core::CertificateState as S;
    let due_at = match status.state {
        S::Valid => status.renew_at?,
        S::Failed | S::NotPointingHere => status.next_attempt_at?,
        S::Pending | S::Ordering => status.updated_at,
        S::PolicyRefused => return None,
    };
    (now > due_at
        .saturating_add(OVERDUE_AFTER_SECS)
        .saturating_add(backoff_min_secs))
    .then(|| Overdue {
        hostname: status.hostname.clone(),
        issuer: status.issuer.clone(),
        due_at,
    })
}

fn unix_time(t: Option<i64>) -> String {
    t.map_or_else(|| "-".to_owned(), |t| t.to_string())
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
            ployz_core::CertificateMaterial::check(&args.hostname, &chain_pem, &key_pem, now)
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
            let material: Vec<CertificateSummary> = client.get(paths::CERTIFICATES).await?;
            let status: Vec<CertificateStatus> = client.get(paths::CERTIFICATE_STATUS).await?;
            let backoff_min = client
                .get::<CertificatePolicy>(paths::CERTIFICATE_POLICY)
                .await
                .map_or(
                    ployz_core::certificate_policy::DEFAULT_BACKOFF_MIN_SECS,
                    |p| p.backoff_min().as_secs(),
                );
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64);
            let overdue =
                overdue_statuses(&status, now, i64::try_from(backoff_min).unwrap_or(i64::MAX));
            if json {
                return print_json(&Listing {
                    material,
                    status,
                    overdue,
                });
            }
            let mut hostnames: Vec<&str> = material
                .iter()
                .map(|m| m.hostname.as_str())
                .chain(status.iter().map(|s| s.hostname.as_str()))
                .collect();
            hostnames.sort();
            hostnames.dedup();
            // Issuers by Machine Name, and how the Machine reached observes them (best effort:
            // an ID's first characters, and no observation, without it).
            let machines: Vec<ployz_core::api::MachineView> = client
                .get::<ployz_core::api::MachineList>(paths::MACHINES)
                .await
                .map(|l| l.values)
                .unwrap_or_default();
            let issuer = |id: &ployz_core::MachineId| -> (String, Option<&'static str>) {
                match machines.iter().find(|v| v.info.id == *id) {
                    Some(v) => (v.info.name.to_string(), Some(v.membership.as_str())),
                    None => (id.as_str().chars().take(12).collect(), None),
                }
            };
            let mut t = table(&[
                "HOSTNAME",
                "STATUS",
                "NOT AFTER (UNIX)",
                "ISSUER",
                "NEXT ATTEMPT (UNIX)",
                "LAST ERROR / WHY",
            ]);
            for h in hostnames {
                let m = material.iter().find(|m| m.hostname == h);
                let s = status.iter().find(|s| s.hostname == h);
                let late = overdue.iter().find(|o| o.hostname == h);
                let state = match (s, m) {
                    (Some(s), _) if late.is_some() => format!("{} (overdue)", s.state),
                    (Some(s), _) => s.state.to_string(),
                    (None, Some(_)) => "imported".to_owned(),
                    (None, None) => "-".to_owned(),
                };
                let mut why = s
                    .and_then(|s| {
                        s.last_error
                            .clone()
                            .or_else(|| s.verdict.as_ref().map(ToString::to_string))
                    })
                    .unwrap_or_default();
                if let Some(o) = late {
                    let late = match issuer(&o.issuer) {
                        (name, Some(seen)) => format!(
                            "its issuer {name} ({seen} as this Machine observes it) was to act at {} and has not; `ployz machine ls`",
                            o.due_at
                        ),
                        (name, None) => format!(
                            "its issuer {name} (not a Machine of this Cluster as this Machine knows it) was to act at {} and has not",
                            o.due_at
                        ),
                    };
                    why = if why.is_empty() {
                        late
                    } else {
                        format!("{late} Before: {why}")
                    };
                }
                t.add_row(vec![
                    h.to_owned(),
                    state,
                    unix_time(m.map(|m| m.not_after).or(s.and_then(|s| s.not_after))),
                    s.map_or_else(|| "-".to_owned(), |s| issuer(&s.issuer).0),
                    unix_time(s.and_then(|s| s.next_attempt_at)),
                    why,
                ]);
            }
            print_table(&t);
            Ok(())
        }
        CertCommand::Policy(PolicyCommand::Show { json }) => {
            let mut client = super::connect(global).await?;
            let policy: CertificatePolicy = client.get(paths::CERTIFICATE_POLICY).await?;
            if json {
                return print_json(&policy);
            }
            show_policy(&policy);
            Ok(())
        }
        CertCommand::Policy(PolicyCommand::Set(args)) => {
            let policy = args.policy()?;
            let mut client = super::connect(global).await?;
            let now: CertificatePolicy = client
                .put(
                    paths::CERTIFICATE_POLICY,
                    &SetCertificatePolicyRequest {
                        policy,
                        reset: args.reset,
                    },
                )
                .await?;
            if args.json {
                return print_json(&now);
            }
            show_policy(&now);
            Ok(())
        }
        CertCommand::Policy(PolicyCommand::Reset) => {
            let mut client = super::connect(global).await?;
            client.delete(paths::CERTIFICATE_POLICY).await?;
            println!("Certificate Policy reset to the built-in defaults.");
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ployz_core::CertificateState;

    fn status(state: CertificateState) -> CertificateStatus {
        CertificateStatus {
            hostname: "app.example.com".into(),
            state,
            not_after: Some(10_000_000),
            renew_at: Some(1_000_000),
            issuer: "0123456789abcdef0123456789abcdef".parse().unwrap(),
            last_error: None,
            consecutive_failures: 0,
            last_attempt_at: None,
            next_attempt_at: Some(2_000_000),
            verdict: None,
            updated_at: 500_000,
        }
    }

    #[test]
    fn a_status_is_overdue_an_hour_and_the_minimum_backoff_after_its_issuer_was_to_act() {
        let valid = status(CertificateState::Valid);
        // Renewal at 1,000,000: on time until an hour and a minute later.
        assert_eq!(overdue(&valid, 1_000_000 + 3_660, 60), None);
        let late = overdue(&valid, 1_000_000 + 3_661, 60).expect("overdue");
        assert_eq!(late.due_at, 1_000_000);
        assert_eq!(late.hostname, "app.example.com");
        // A longer minimum backoff holds a renewal back longer.
        assert_eq!(overdue(&valid, 1_000_000 + 7_000, 3_600), None);

        // A failure is retried at its next attempt, not its renewal point.
        let failed = status(CertificateState::Failed);
        assert_eq!(overdue(&failed, 1_500_000, 60), None);
        assert!(overdue(&failed, 2_003_661, 60).is_some());
        let elsewhere = status(CertificateState::NotPointingHere);
        assert!(overdue(&elsewhere, 2_003_661, 60).is_some());

        // An order begun and never ended: from when it was written.
        for state in [CertificateState::Pending, CertificateState::Ordering] {
            assert_eq!(overdue(&status(state), 503_660, 60), None);
            assert!(overdue(&status(state), 503_661, 60).is_some(), "{state}");
        }
        // A policy the issuer cannot follow waits for a person, never for a time.
        assert_eq!(
            overdue(&status(CertificateState::PolicyRefused), i64::MAX, 60),
            None
        );
        // Without the time it names, nothing is late.
        let mut unknown = status(CertificateState::Valid);
        unknown.renew_at = None;
        assert_eq!(overdue(&unknown, i64::MAX, 60), None);
    }

    #[test]
    fn an_issuer_that_wrote_a_status_within_the_hour_is_at_work_not_late() {
        // One hostname waits at the end of a long queue of orders; another, ordered just now,
        // shows its issuer at work.
        let mut waiting = status(CertificateState::Pending);
        waiting.updated_at = 1_000_000;
        let mut ordering = status(CertificateState::Ordering);
        ordering.hostname = "other.example.com".into();
        ordering.updated_at = 1_000_000 + 7_000;
        let now = 1_000_000 + 7_200;
        assert!(overdue(&waiting, now, 60).is_some());
        assert_eq!(
            overdue_statuses(&[waiting.clone(), ordering.clone()], now, 60),
            vec![]
        );
        // Another issuer's writes say nothing of this one.
        ordering.issuer = "fedcba9876543210fedcba9876543210".parse().unwrap();
        let late = overdue_statuses(&[waiting, ordering], now, 60);
        assert_eq!(late.len(), 1);
        assert_eq!(late[0].hostname, "app.example.com");
    }
}
