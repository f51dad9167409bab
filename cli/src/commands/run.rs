//! `ployz run IMAGE [COMMAND...]`: a Service from flags instead of a Compose file.

use anyhow::{anyhow, bail};
use clap::Args;
use ployz_compose::parse_port;
use ployz_core::{
    ContainerSpec, DeployIntent, MachineTarget, PullPolicy, ServiceMode, ServiceName, ServiceSpec,
    UpdateConfig,
};

use crate::GlobalArgs;

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The image to run.
    image: String,
    /// The command and its arguments [default: the image's].
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<String>,
    /// The Service Name [default: the image's base name and 4 random characters].
    #[arg(short, long)]
    name: Option<String>,
    /// `replicated` or `global`.
    #[arg(long, default_value = "replicated")]
    mode: String,
    /// Containers to run (replicated mode).
    #[arg(long, default_value_t = 1)]
    replicas: u32,
    /// Publish a port, in x-ports form: `app.example.com:8080/https`, `8000/http`, or
    /// `127.0.0.1:8080:80@host`. Repeatable.
    #[arg(short, long = "publish", value_name = "PORT")]
    publish: Vec<String>,
    /// Environment variable `KEY=VALUE` (or `KEY`, taken from this shell). Repeatable.
    #[arg(short, long = "env", value_name = "KEY[=VALUE]")]
    env: Vec<String>,
    /// User to run as.
    #[arg(short, long)]
    user: Option<String>,
    /// Replace the image's entrypoint ("" resets it).
    #[arg(long)]
    entrypoint: Option<String>,
    /// Give the container extended privileges.
    #[arg(long)]
    privileged: bool,
    /// `missing`, `always` or `never`.
    #[arg(long, default_value = "missing")]
    pull: String,
    /// Run only on this Machine (a Name or Machine ID; repeatable), as `x-machines` does
    /// [default: wherever placement puts it, over every Machine the Deploy includes].
    #[arg(short = 'm', long = "machine", value_name = "MACHINE")]
    machines: Vec<String>,
    /// Do not ask for confirmation.
    #[arg(short = 'y', long, env = "PLOYZ_AUTO_CONFIRM")]
    yes: bool,
}

fn default_name(image: &str) -> String {
    let base = image
        .rsplit('/')
        .next()
        .unwrap_or(image)
        .split([':', '@'])
        .next()
        .unwrap_or("service");
    let cleaned: String = base
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    use rand::Rng;
    let mut rng = rand::thread_rng();
    let suffix: String = (0..4)
        .map(|_| b"abcdefghijklmnopqrstuvwxyz0123456789"[rng.gen_range(0..36)] as char)
        .collect();
    format!("{}-{suffix}", cleaned.trim_matches('-'))
}

/// Builds the Service the flags describe, refusing bad flags before anything is sent.
pub fn spec_from(args: &RunArgs) -> anyhow::Result<ServiceSpec> {
    let name: ServiceName = args
        .name
        .clone()
        .unwrap_or_else(|| default_name(&args.image))
        .parse()
        .map_err(|e| anyhow!("--name: {e}"))?;
    let mode = match args.mode.as_str() {
        "replicated" => ServiceMode::Replicated,
        "global" => ServiceMode::Global,
        other => bail!("--mode '{other}' is not one of: replicated, global"),
    };
    if args.replicas == 0 {
        bail!("--replicas must be at least 1");
    }
    let pull_policy = match args.pull.as_str() {
        "missing" => PullPolicy::Missing,
        "always" => PullPolicy::Always,
        "never" => PullPolicy::Never,
        other => bail!("--pull '{other}' is not one of: missing, always, never"),
    };
    let mut env = std::collections::BTreeMap::new();
    for e in &args.env {
        match e.split_once('=') {
            Some((k, v)) if !k.is_empty() => {
                env.insert(k.to_owned(), v.to_owned());
            }
            None if !e.is_empty() => {
                let v = std::env::var(e).map_err(|_| {
                    anyhow!("--env '{e}' has no value and is not set in this shell")
                })?;
                env.insert(e.clone(), v);
            }
            _ => bail!("--env '{e}' is not KEY=VALUE"),
        }
    }
    let mut ports = Vec::new();
    for p in &args.publish {
        ports.push(parse_port(p, &name).map_err(|e| anyhow!("--publish '{p}': {e}"))?);
    }
    ports.sort();
    ports.dedup();
    let mut machines = Vec::new();
    for m in &args.machines {
        machines.push(
            m.parse::<MachineTarget>()
                .map_err(|e| anyhow!("--machine '{m}': {e}"))?,
        );
    }
    machines.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    machines.dedup();
    Ok(ServiceSpec {
        name,
        mode,
        replicas: args.replicas,
        container: ContainerSpec {
            image: args.image.clone(),
            command: (!args.command.is_empty()).then(|| args.command.clone()),
            entrypoint: args.entrypoint.as_ref().map(|e| {
                if e.is_empty() {
                    vec![]
                } else {
                    shlex::split(e).unwrap_or_else(|| vec![e.clone()])
                }
            }),
            env,
            user: args.user.clone(),
            privileged: args.privileged,
            pull_policy,
            ..Default::default()
        },
        ports,
        machines,
        update: UpdateConfig::default(),
        pre_deploy: None,
        depends_on: vec![],
        revisions: None,
        routes: vec![],
    })
}

pub async fn run(global: &GlobalArgs, args: RunArgs) -> anyhow::Result<()> {
    let spec = spec_from(&args)?;
    let mut warnings = Vec::new();
    if spec.container.privileged {
        warnings.push(format!(
            "service '{}': privileged gives the container full access to the Machine",
            spec.name
        ));
    }
    let intent = DeployIntent::all(vec![spec], vec![]);
    let mut client = super::connect(global).await?;
    let flow = super::deploy::Flow::confirmed(args.yes);
    super::deploy::deploy_intent(&mut client, &intent, warnings, &flow).await
}
