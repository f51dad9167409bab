//! `ployz`: the CLI, and (as `ployz daemon run`) the daemon. One binary to install.

/// The CLI's `println!`: a reader that has gone (`ployz deploy -y | head -1`) ends the output,
/// never the command: a Deploy carries on to its outcome, and the exit code says how it went.
/// Defined before the modules so that every `println!` in the crate is this one.
macro_rules! println {
    () => {
        $crate::output::print_out(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::output::print_out(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// The CLI's `print!`, as [`println!`] without the line end.
#[allow(unused_macros)]
macro_rules! print {
    ($($arg:tt)*) => {
        $crate::output::print_out(format_args!($($arg)*))
    };
}

mod build;
mod client;
mod commands;
mod config;
mod connection;
mod host;
mod leases;
mod memory;
mod output;
mod registry_auth;
mod target;
mod targets;
mod time_arg;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};

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
    /// Manage Machines: init, add, ls, rm, rename, update.
    #[command(subcommand, visible_alias = "m")]
    Machine(commands::machine::MachineCommand),
    /// Deploy Services from a Compose file: preview, confirm, roll out one operation at a time.
    Deploy(commands::deploy::DeployArgs),
    /// Build the images of Services with build: (with the local Docker), tagged from their
    /// inputs; --push sends them to the Machines.
    Build(commands::build::BuildCommandArgs),
    /// Run an image as a Service, without a Compose file.
    Run(commands::run::RunArgs),
    /// List Services.
    #[command(visible_alias = "list")]
    Ls(commands::service::LsArgs),
    /// List the containers of every Service.
    Ps(commands::service::PsArgs),
    /// Show one Service and its containers.
    Inspect(commands::service::InspectArgs),
    /// List the revisions of a Service the store keeps (the last 5 Deploys that changed it).
    History(commands::revision::HistoryArgs),
    /// Deploy a kept revision of a Service again (the one before what runs now, or --to N).
    Rollback(commands::revision::RollbackArgs),
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
    /// Images on the Machines: send them from the local Docker without a registry, list,
    /// remove.
    #[command(subcommand)]
    Image(commands::image::ImageCommand),
    /// Manage Docker Volumes.
    #[command(subcommand)]
    Volume(commands::volume::VolumeCommand),
    /// The store as the Machine reached holds it: its digest, and scratch values for checking
    /// replication by hand.
    #[command(subcommand)]
    Store(commands::store::StoreCommand),
    /// The WireGuard mesh as the Machine reached observes it.
    #[command(subcommand)]
    Wg(commands::wg::WgCommand),
    /// The routes a Machine's edge serves now: hostname, path, Service and upstreams.
    Routes(commands::routes::RoutesArgs),
    /// Service Gates: maintenance pages, and holding requests while a Service changes.
    #[command(subcommand)]
    Service(commands::gate::ServiceCommand),
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

/// The command tree as users see it: the client's options (how to reach a daemon) are global,
/// but `ployz daemon run` and `ployz daemon edge` are the daemon side and do not show them.
/// clap copies a global option into each subcommand that has none of that ID; copying them
/// first, hidden, keeps them parseable there (and their values typed) but out of the help.
fn command_tree() -> clap::Command {
    let tree = Cli::command();
    let client_options: Vec<clap::Arg> = tree
        .get_arguments()
        .filter(|a| a.is_global_set())
        .cloned()
        .collect();
    let hide_client_options = move |sub: clap::Command| {
        client_options.iter().fold(sub, |sub, option| {
            if sub.get_arguments().any(|a| a.get_id() == option.get_id()) {
                sub
            } else {
                sub.arg(option.clone().hide(true))
            }
        })
    };
    tree.mut_subcommand("daemon", |daemon| {
        daemon
            .mut_subcommand("run", hide_client_options.clone())
            .mut_subcommand("edge", hide_client_options)
    })
}

fn main() -> ExitCode {
    exit_quietly_on_broken_pipe();
    let cli = match Cli::from_arg_matches(&command_tree().get_matches()) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let result = match cli.command {
        // The daemon and dial-stdio run without the client runtime: Pingora starts its own.
        Command::Daemon(cmd) => {
            memory::configure_for_daemon();
            commands::daemon::run(cmd)
        }
        Command::DialStdio(args) => commands::dial_stdio::run(args),
        Command::Completion { shell } => {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "ployz", &mut script);
            write_stdout(&script)
        }
        Command::Ctx(cmd) => commands::ctx::run(&cli.global, cmd),
        Command::Machine(cmd) => client_runtime(commands::machine::run(&cli.global, cmd)),
        Command::Store(cmd) => client_runtime(commands::store::run(&cli.global, cmd)),
        Command::Wg(cmd) => client_runtime(commands::wg::run(&cli.global, cmd)),
        Command::Routes(args) => client_runtime(commands::routes::run(&cli.global, args)),
        Command::Service(cmd) => client_runtime(commands::gate::run(&cli.global, cmd)),
        Command::Version(args) => client_runtime(commands::version::run(&cli.global, args)),
        Command::Deploy(args) => client_runtime(commands::deploy::run(&cli.global, args)),
        Command::Run(args) => client_runtime(commands::run::run(&cli.global, args)),
        Command::Ls(args) => client_runtime(commands::service::ls(&cli.global, args)),
        Command::Ps(args) => client_runtime(commands::service::ps(&cli.global, args)),
        Command::Inspect(args) => client_runtime(commands::service::inspect(&cli.global, args)),
        Command::History(args) => client_runtime(commands::revision::history(&cli.global, args)),
        Command::Rollback(args) => client_runtime(commands::revision::rollback(&cli.global, args)),
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
        Command::Build(args) => client_runtime(commands::build::run(&cli.global, args)),
        Command::Image(cmd) => client_runtime(commands::image::run(&cli.global, cmd)),
        Command::Volume(cmd) => client_runtime(commands::volume::run(&cli.global, cmd)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.downcast_ref::<targets::PartialFailure>().is_some() => {
            output::print_error(&e);
            ExitCode::from(targets::PARTIAL_EXIT_CODE)
        }
        Err(e) => {
            output::print_error(&e);
            ExitCode::FAILURE
        }
    }
}

/// Ends the process quietly, with success, when a write this crate's `println!` does not make
/// (a library's, `std::println!`) finds stdout or stderr a pipe whose reader has gone: what was
/// asked for was read. Without this, such a write panics on the broken pipe.
fn exit_quietly_on_broken_pipe() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or_default();
        if message.starts_with("failed printing to std") && is_broken_pipe_text(message) {
            std::process::exit(0);
        }
        report(info);
    }));
}

/// Whether an error's text is EPIPE's, as `std::io::Error` displays it ("Broken pipe (os
/// error 32)").
fn is_broken_pipe_text(message: &str) -> bool {
    message.contains("Broken pipe")
}

/// Writes all of `bytes` to stdout; a reader that has gone ends the process quietly.
fn write_stdout(bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        Err(e) => Err(anyhow::anyhow!("cannot write to stdout: {e}")),
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
        command_tree().debug_assert();
    }

    #[test]
    fn daemon_run_help_shows_no_client_options() {
        let mut tree = command_tree();
        tree.build();
        let help = tree
            .find_subcommand_mut("daemon")
            .and_then(|d| d.find_subcommand_mut("run"))
            .expect("daemon run exists")
            .render_long_help()
            .to_string();
        assert!(help.contains("--data-dir"), "{help}");
        for client_only in ["--connect", "--context", "--ployz-config"] {
            assert!(!help.contains(client_only), "{client_only} in: {help}");
        }
        let mut tree = command_tree();
        tree.build();
        let ps_help = tree
            .find_subcommand_mut("ps")
            .expect("ps exists")
            .render_long_help()
            .to_string();
        assert!(ps_help.contains("--connect"), "{ps_help}");
    }
}
