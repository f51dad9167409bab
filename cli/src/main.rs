//! `ployz`: the CLI, and (as `ployz daemon run`) the daemon. One binary to install.

mod client;
mod commands;
mod config;
mod connection;
mod output;
mod target;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, CommandFactory, Parser, Subcommand};

use crate::connection::Connection;

/// Deploy Docker Compose apps onto your machines, with HTTPS ingress, internal DNS and rolling
/// deploys. No control plane to babysit.
#[derive(Debug, Parser)]
#[command(
    name = "ployz",
    version,
    propagate_version = true,
    max_term_width = 100
)]
pub struct Cli {
    #[command(flatten)]
    global: GlobalArgs,
    #[command(subcommand)]
    command: Command,
}

/// How to reach a daemon; every command that talks to one honours these.
#[derive(Debug, Args, Clone)]
pub struct GlobalArgs {
    /// Reach the daemon at unix:///path/to/ployz.sock or ssh://user@host[:port] (overrides any
    /// context).
    #[arg(long, global = true, env = "PLOYZ_CONNECT", value_name = "URL")]
    connect: Option<Connection>,
    /// Use this context from the config file instead of the current one.
    #[arg(
        short = 'c',
        long,
        global = true,
        env = "PLOYZ_CONTEXT",
        value_name = "NAME"
    )]
    context: Option<String>,
    /// The CLI config file [default: ~/.config/ployz/config.yaml].
    #[arg(
        long = "ployz-config",
        global = true,
        env = "PLOYZ_CONFIG",
        value_name = "FILE"
    )]
    config: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Manage Machines: init, ls.
    #[command(subcommand, visible_alias = "m")]
    Machine(commands::machine::MachineCommand),
    /// Deploy Services from a Compose file: preview, confirm, roll out one operation at a time.
    Deploy(commands::deploy::DeployArgs),
    /// Run an image as a Service, without a Compose file.
    Run(commands::run::RunArgs),
    /// List Services.
    #[command(visible_alias = "list")]
    Ls(commands::service::LsArgs),
    /// List the containers of every Service.
    Ps(commands::service::PsArgs),
    /// Show one Service and its containers.
    Inspect(commands::service::InspectArgs),
    /// Print a Service's logs.
    Logs(commands::service::LogsArgs),
    /// Run a command in a container of a Service.
    Exec(commands::service::ExecArgs),
    /// Remove Services and all their containers (named volumes are kept).
    #[command(visible_alias = "remove")]
    Rm(commands::service::ServicesArgs),
    /// Start the stopped containers of Services.
    Start(commands::service::ServicesArgs),
    /// Stop the containers of Services.
    Stop(commands::service::ServicesArgs),
    /// Change how many containers a replicated Service runs.
    Scale(commands::service::ScaleArgs),
    /// Manage Certificate Material for Ingress Hostnames.
    #[command(subcommand)]
    Cert(commands::cert::CertCommand),
    /// Internal DNS: what a Machine would answer for a name.
    #[command(subcommand)]
    Dns(commands::dns::DnsCommand),
    /// Manage Docker Volumes.
    #[command(subcommand)]
    Volume(commands::volume::VolumeCommand),
    /// Manage contexts: named ways to reach a Cluster.
    #[command(subcommand, visible_alias = "context")]
    Ctx(commands::ctx::CtxCommand),
    /// Run the daemon.
    #[command(subcommand)]
    Daemon(commands::daemon::DaemonCommand),
    /// Pipe stdin/stdout to the local daemon's socket (what `--connect ssh://` runs remotely).
    DialStdio(commands::dial_stdio::DialStdioArgs),
    /// Print the CLI's and the daemon's versions.
    Version(commands::version::VersionArgs),
    /// Print a shell completion script.
    Completion {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        // The daemon and dial-stdio run without the client runtime: Pingora starts its own.
        Command::Daemon(cmd) => commands::daemon::run(cmd),
        Command::DialStdio(args) => commands::dial_stdio::run(args),
        Command::Completion { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "ployz", &mut std::io::stdout());
            Ok(())
        }
        Command::Ctx(cmd) => commands::ctx::run(&cli.global, cmd),
        Command::Machine(cmd) => client_runtime(commands::machine::run(&cli.global, cmd)),
        Command::Version(args) => client_runtime(commands::version::run(&cli.global, args)),
        Command::Deploy(args) => client_runtime(commands::deploy::run(&cli.global, args)),
        Command::Run(args) => client_runtime(commands::run::run(&cli.global, args)),
        Command::Ls(args) => client_runtime(commands::service::ls(&cli.global, args)),
        Command::Ps(args) => client_runtime(commands::service::ps(&cli.global, args)),
        Command::Inspect(args) => client_runtime(commands::service::inspect(&cli.global, args)),
        Command::Logs(args) => client_runtime(commands::service::logs(&cli.global, args)),
        Command::Exec(args) => {
            return match client_runtime_value(commands::service::exec(&cli.global, args)) {
                Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
                Err(e) => {
                    output::print_error(&e);
                    ExitCode::FAILURE
                }
            }
        }
        Command::Rm(args) => client_runtime(commands::service::lifecycle(&cli.global, "rm", args)),
        Command::Start(args) => {
            client_runtime(commands::service::lifecycle(&cli.global, "start", args))
        }
        Command::Stop(args) => {
            client_runtime(commands::service::lifecycle(&cli.global, "stop", args))
        }
        Command::Scale(args) => client_runtime(commands::service::scale(&cli.global, args)),
        Command::Cert(cmd) => client_runtime(commands::cert::run(&cli.global, cmd)),
        Command::Dns(cmd) => client_runtime(commands::dns::run(&cli.global, cmd)),
        Command::Volume(cmd) => client_runtime(commands::volume::run(&cli.global, cmd)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            output::print_error(&e);
            ExitCode::FAILURE
        }
    }
}

/// Runs a client command on a small single-threaded runtime.
fn client_runtime(f: impl std::future::Future<Output = anyhow::Result<()>>) -> anyhow::Result<()> {
    client_runtime_value(f)
}

fn client_runtime_value<T>(
    f: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_tree_is_consistent() {
        Cli::command().debug_assert();
    }
}
