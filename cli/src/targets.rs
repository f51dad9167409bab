//! `-m/--machine`: which Machines a command asks, through the Machine the CLI reaches, and how
//! their answers come back (a Partial Result: every answer, and per Machine what failed).

use anyhow::bail;
use ployz_core::api::{self, FanOutAnswer, MachineAnswer, MachineList};
use serde::de::DeserializeOwned;

use crate::client::ApiClient;

/// `-m/--machine`, for the listings that ask every Machine.
#[derive(Debug, Clone, clap::Args)]
pub struct MachinesArg {
    /// The Machines to ask: a Name or Machine ID (repeatable), or `*` [default: every Machine
    /// the Machine reached observes]. A Machine that does not answer is reported and the others
    /// are listed (a Partial Result; exit code 3).
    #[arg(short = 'm', long = "machine", value_name = "MACHINE")]
    pub machines: Vec<String>,
}

/// Ends a command whose listing is a Partial Result with failures: what answered was printed;
/// the exit code says some Machines did not answer.
#[derive(Debug)]
pub struct PartialFailure {
    pub failed: usize,
    pub asked: usize,
}

impl std::fmt::Display for PartialFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "a Partial Result: {} of {} Machines did not answer (listed above)",
            self.failed, self.asked
        )
    }
}

impl std::error::Error for PartialFailure {}

/// The exit code of a Partial Result with failures.
pub const PARTIAL_EXIT_CODE: u8 = 3;

/// The Machine Target header for `wanted` (`-m` values; none or `*`: every Machine), with Names
/// resolved to Machine IDs through the Machine the CLI reaches (a Name two Machines share is
/// refused with both IDs).
/// With the header, the Name of each Machine named (empty for `*`: the answers carry them).
pub async fn header_for(
    client: &mut ApiClient,
    wanted: &[String],
) -> anyhow::Result<(String, Vec<String>)> {
    if wanted.is_empty() || wanted.iter().any(|w| w == "*") {
        if wanted.len() > 1 {
            bail!("-m '*' already names every Machine; give it alone");
        }
        return Ok(("*".to_owned(), Vec::new()));
    }
    let list: MachineList = client.get(api::paths::MACHINES).await?;
    let mut ids: Vec<String> = Vec::new();
    let mut names = Vec::new();
    for w in wanted {
        let found = crate::commands::machine::resolve(&list, w)?;
        let id = found.info.id.to_string();
        if !ids.contains(&id) {
            ids.push(id);
            names.push(found.info.name.to_string());
        }
    }
    Ok((ids.join(","), names))
}

/// `GET path` on every Machine `wanted` names: each answer decoded, with the Machine that gave
/// it; the failures as they came.
pub async fn get_all<T: DeserializeOwned>(
    client: &mut ApiClient,
    wanted: &[String],
    path: &str,
) -> anyhow::Result<(Vec<(MachineAnswer, T)>, Vec<ployz_core::TargetFailure>)> {
    let (header, names) = header_for(client, wanted).await?;
    get_with_header(client, &header, &names, path).await
}

/// `GET path` on each of `machines` (Machine ID and Name), as [`get_all`].
pub async fn get_from<T: DeserializeOwned>(
    client: &mut ApiClient,
    machines: &[(ployz_core::MachineId, String)],
    path: &str,
) -> anyhow::Result<(Vec<(MachineAnswer, T)>, Vec<ployz_core::TargetFailure>)> {
    if machines.is_empty() {
        return Ok((Vec::new(), Vec::new()));
    }
    let header: Vec<String> = machines.iter().map(|(id, _)| id.to_string()).collect();
    let names: Vec<String> = machines.iter().map(|(_, name)| name.clone()).collect();
    get_with_header(client, &header.join(","), &names, path).await
}

async fn get_with_header<T: DeserializeOwned>(
    client: &mut ApiClient,
    header: &str,
    names: &[String],
    path: &str,
) -> anyhow::Result<(Vec<(MachineAnswer, T)>, Vec<ployz_core::TargetFailure>)> {
    client.set_machine_target(Some(header.to_owned()));
    let answered = if header.contains(',') || header == "*" {
        client.get::<FanOutAnswer>(path).await
    } else {
        // One Machine: the daemon forwards and hands back its answer as it is.
        let value: Result<serde_json::Value, _> = client.get(path).await;
        match value {
            Ok(answer) => {
                let id: ployz_core::MachineId = header.parse().expect("resolved from the list");
                Ok(FanOutAnswer {
                    values: vec![MachineAnswer {
                        machine: id,
                        name: names.first().cloned().unwrap_or_default(),
                        answer,
                    }],
                    failures: Vec::new(),
                })
            }
            // A Machine that does not answer is a failure of the Partial Result, as in a
            // fan-out; any other refusal is the command's.
            Err(e) if is_unavailable(&e) => Ok(FanOutAnswer {
                values: Vec::new(),
                failures: vec![ployz_core::TargetFailure {
                    target: header.to_owned(),
                    reason: format!("{e:#}"),
                }],
            }),
            Err(e) => Err(e),
        }
    };
    client.set_machine_target(None);
    let answered = answered?;
    let mut values = Vec::with_capacity(answered.values.len());
    let mut failures = answered.failures;
    for a in answered.values {
        match serde_json::from_value::<T>(a.answer.clone()) {
            Ok(v) => values.push((a, v)),
            Err(e) => failures.push(ployz_core::TargetFailure {
                target: a.machine.to_string(),
                reason: format!("its answer is not what this CLI understands ({e}); compare `ployz version` there"),
            }),
        }
    }
    Ok((values, failures))
}

/// Whether a failed call means the Machine it went to did not answer.
pub fn is_unavailable(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause
            .downcast_ref::<api::ApiError>()
            .is_some_and(|a| a.code == api::ErrorCode::Unavailable)
    })
}

/// Prints each failure on stderr and ends with [`PartialFailure`] when there was any.
pub fn report_failures(failures: &[ployz_core::TargetFailure], asked: usize) -> anyhow::Result<()> {
    for f in failures {
        eprintln!("warning: Machine {}: {}", f.target, f.reason);
    }
    if failures.is_empty() {
        Ok(())
    } else {
        // A Machine may fail more than once (a command over several images): counted once.
        let failed = failures
            .iter()
            .map(|f| f.target.as_str())
            .collect::<std::collections::BTreeSet<_>>()
            .len();
        Err(PartialFailure { failed, asked }.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ployz_core::TargetFailure;

    #[test]
    fn a_machine_that_failed_twice_is_one_machine_that_did_not_answer() {
        let failure = |target: &str| TargetFailure {
            target: target.to_owned(),
            reason: "it did not answer".to_owned(),
        };
        let err = report_failures(&[failure("m2"), failure("m2"), failure("m3")], 4).unwrap_err();
        let partial = err
            .downcast_ref::<PartialFailure>()
            .expect("a Partial Result");
        assert_eq!((partial.failed, partial.asked), (2, 4));
        assert!(report_failures(&[], 4).is_ok());
    }
}
