//! `ployz ctx`: named ways to reach a Cluster, kept in the CLI config file.

use anyhow::bail;
use clap::{Args, Subcommand};
use serde::Serialize;

use crate::config::{CliConfig, ContextConfig};
use crate::connection::{Connection, ConnectionConfig, DEFAULT_SOCKET};
use crate::output::{print_json, print_table, table};
use crate::GlobalArgs;

#[derive(Debug, Subcommand)]
pub enum CtxCommand {
    /// List contexts; the current one is marked.
    #[command(visible_alias = "list")]
    Ls(JsonArg),
    /// Make a context the current one.
    Use {
        /// The context's name.
        name: String,
    },
    /// Show the context in force and the connections it tries.
    Show(JsonArg),
    /// Add a context, or replace its connections.
    Add(AddArgs),
    /// Remove a context.
    #[command(visible_alias = "remove")]
    Rm {
        /// The context's name.
        name: String,
    },
}

#[derive(Debug, Args)]
pub struct JsonArg {
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct AddArgs {
    /// The context's name.
    name: String,
    /// Connections, tried in order: unix:///path or ssh://user@host[:port].
    #[arg(required = true, value_name = "URL")]
    connections: Vec<Connection>,
    /// A private key for the ssh connections.
    #[arg(long, value_name = "FILE")]
    ssh_key: Option<std::path::PathBuf>,
    /// Also make it the current context.
    #[arg(long = "use")]
    make_current: bool,
}

#[derive(Serialize)]
struct ContextView {
    name: String,
    current: bool,
    connections: Vec<String>,
}

fn view(cfg: &CliConfig, name: &str, context: &ContextConfig) -> ContextView {
    ContextView {
        name: name.to_owned(),
        current: cfg.current_context.as_deref() == Some(name),
        connections: context
            .connections
            .iter()
            .map(|c| match c.to_connection() {
                Ok(conn) => conn.to_string(),
                Err(e) => format!("invalid: {e}"),
            })
            .collect(),
    }
}

pub fn run(global: &GlobalArgs, cmd: CtxCommand) -> anyhow::Result<()> {
    let path = super::config_path(global);
    let mut cfg = CliConfig::load(&path)?;
    match cmd {
        CtxCommand::Ls(args) => {
            let views: Vec<ContextView> =
                cfg.contexts.iter().map(|(n, c)| view(&cfg, n, c)).collect();
            if args.json {
                return print_json(&views);
            }
            let mut t = table(&["NAME", "CURRENT", "CONNECTIONS"]);
            for v in &views {
                t.add_row(vec![
                    v.name.clone(),
                    if v.current { "*".into() } else { String::new() },
                    v.connections.join(", "),
                ]);
            }
            print_table(&t);
            Ok(())
        }
        CtxCommand::Use { name } => {
            cfg.context(&name)?;
            cfg.current_context = Some(name.clone());
            cfg.save(&path)?;
            println!("Current context is now '{name}'.");
            Ok(())
        }
        CtxCommand::Show(args) => {
            let name = global.context.clone().or(cfg.current_context.clone());
            let shown = match &name {
                Some(n) => view(&cfg, n, cfg.context(n)?),
                None => ContextView {
                    name: String::new(),
                    current: false,
                    connections: vec![format!("unix://{DEFAULT_SOCKET}")],
                },
            };
            if args.json {
                return print_json(&shown);
            }
            match name {
                Some(n) => println!("Context '{n}', connections tried in order:"),
                None => println!("No context is set; the local daemon's socket is used:"),
            }
            for c in &shown.connections {
                println!("  {c}");
            }
            Ok(())
        }
        CtxCommand::Add(args) => {
            let mut connections: Vec<ConnectionConfig> = args
                .connections
                .iter()
                .map(ConnectionConfig::from_connection)
                .collect();
            if let Some(key) = &args.ssh_key {
                for c in connections.iter_mut().filter(|c| c.ssh.is_some()) {
                    c.ssh_key_file = Some(key.clone());
                }
            }
            let replaced = cfg
                .contexts
                .insert(args.name.clone(), ContextConfig { connections })
                .is_some();
            if args.make_current || cfg.current_context.is_none() {
                cfg.current_context = Some(args.name.clone());
            }
            cfg.save(&path)?;
            let verb = if replaced { "Replaced" } else { "Added" };
            println!("{verb} context '{}'.", args.name);
            Ok(())
        }
        CtxCommand::Rm { name } => {
            if cfg.contexts.remove(&name).is_none() {
                bail!("context '{name}' does not exist; `ployz ctx ls` lists them");
            }
            if cfg.current_context.as_deref() == Some(name.as_str()) {
                cfg.current_context = None;
            }
            cfg.save(&path)?;
            println!("Removed context '{name}'.");
            Ok(())
        }
    }
}
