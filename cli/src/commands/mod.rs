//! One module per command group.

pub mod build;
pub mod cert;
pub mod ctx;
pub mod daemon;
pub mod deploy;
pub mod dial_stdio;
pub mod dns;
pub mod gate;
pub mod image;
pub mod machine;
pub mod machine_status;
pub mod revision;
pub mod routes;
pub mod run;
pub mod service;
pub mod store;
pub mod version;
pub mod volume;
pub mod wg;

use std::path::PathBuf;

use anyhow::Context as _;

use crate::client::ApiClient;
use crate::config::{self, CliConfig};
use crate::connection::{Connection, DEFAULT_SOCKET};
use crate::GlobalArgs;

/// The config file path in force.
pub fn config_path(global: &GlobalArgs) -> PathBuf {
    global.config.clone().unwrap_or_else(config::default_path)
}

/// The connections to try, in order: `--connect`; else the named or current context's
/// connections; else the local socket.
pub fn connections(global: &GlobalArgs) -> anyhow::Result<Vec<Connection>> {
    if let Some(c) = &global.connect {
        return Ok(vec![c.clone()]);
    }
    let path = config_path(global);
    let cfg = CliConfig::load(&path)?;
    let name = global.context.clone().or(cfg.current_context.clone());
    let Some(name) = name else {
        return Ok(vec![Connection::Unix(DEFAULT_SOCKET.into())]);
    };
    let context = cfg.context(&name)?;
    if context.connections.is_empty() {
        anyhow::bail!(
            "context '{name}' has no connections; add one with `ployz ctx add {name} --connect URL`"
        );
    }
    context
        .connections
        .iter()
        .map(|c| {
            c.to_connection()
                .with_context(|| format!("context '{name}' in {}", path.display()))
        })
        .collect()
}

/// Connects to the first connection that answers from an initialised Machine. With more than
/// one to choose from, a connection counts as answering once the daemon has answered through
/// it: over SSH, starting `ssh` succeeds whether or not the host is up, so a dead first host
/// would otherwise fail the command instead of being passed over. A daemon that answers as an
/// uninitialised Machine (one removed from the Cluster resets itself) is passed over too while
/// another connection reaches an initialised one, and used only when none does.
pub async fn connect(global: &GlobalArgs) -> anyhow::Result<ApiClient> {
    connect_to(global, Wanted::Initialised).await
}

/// [`connect`] for a command meant for an uninitialised Machine as well (`machine init`): the
/// first connection that answers.
pub async fn connect_any(global: &GlobalArgs) -> anyhow::Result<ApiClient> {
    connect_to(global, Wanted::Any).await
}

#[derive(PartialEq)]
enum Wanted {
    Initialised,
    Any,
}

async fn connect_to(global: &GlobalArgs, wanted: Wanted) -> anyhow::Result<ApiClient> {
    let candidates = connections(global)?;
    let choosing = candidates.len() > 1;
    let mut failures = Vec::new();
    // The connections reaching an uninitialised Machine; the first is kept in case no other
    // will do.
    let mut uninitialised: Vec<&Connection> = Vec::new();
    let mut fallback: Option<ApiClient> = None;
    for candidate in &candidates {
        let reached = match ApiClient::connect(candidate).await {
            Ok(mut client) if choosing => match client.answers().await {
                Ok(Some(v)) if v.machine.is_none() && wanted == Wanted::Initialised => {
                    uninitialised.push(candidate);
                    fallback.get_or_insert(client);
                    continue;
                }
                Ok(_) => Ok(client),
                Err(e) => Err(e),
            },
            reached => reached,
        };
        match reached {
            Ok(client) => {
                // Passed over silently, a server that is down would hide behind the next.
                warn_passed_over(&failures, &uninitialised, candidate);
                return Ok(client);
            }
            Err(e) => failures.push(e),
        }
    }
    if let (Some(client), Some((used, others))) = (fallback, uninitialised.split_first()) {
        warn_passed_over(&failures, others, used);
        return Ok(client);
    }
    if failures.len() == 1 {
        return Err(failures.remove(0));
    }
    let reasons: Vec<String> = failures.iter().map(|e| format!("{e:#}")).collect();
    anyhow::bail!("no connection answered: {}", reasons.join("; "))
}

/// A warning for each connection passed over before `used`: those that failed, and those that
/// reach an uninitialised Machine.
fn warn_passed_over(failures: &[anyhow::Error], uninitialised: &[&Connection], used: &Connection) {
    for passed in uninitialised {
        eprintln!(
            "warning: passed over: {passed} reaches a Machine that is not initialised (removed from the Cluster, or reset; `ployz ctx add NAME --connect URL...` keeps only the connections you want); using {used}"
        );
    }
    for failed in failures {
        eprintln!("warning: passed over: {failed:#}; using {used}");
    }
}
