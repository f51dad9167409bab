//! `ployz deploy`: Compose in, Service Containers out, on every Machine the entry Machine
//! reaches.
//!
//! Compose -> Requested Service Specs -> Deploy Intent -> the Machines' leases -> Deploy
//! Snapshot (each Machine's Live Observation, through the entry Machine) -> Deploy Plan ->
//! Deploy Preview -> confirmation -> operations one at a time, each on its Machine -> Deploy
//! Outcome -> the leases released.
//!
//! The Machines asked are those the entry Machine observes and does not observe down; one that
//! does not answer (its lease, or its snapshot) is left out and named in the preview ("not
//! included"), and the Deploy plans and runs on the rest, unless a Service's `x-machines` names
//! it (refused before anything runs). Its containers are left as they are.
//!
//! Each Machine's lease makes one command at a time change it (`crate::leases`): a Deploy takes
//! them before it observes (so it plans from what the Machines show once no other command
//! changes them, and checks hostname claims then), every call it makes carries the lease token
//! of the Machine it goes to, and it waits a bounded time (`--lease-wait`) while another command
//! holds one, then gives up naming that command. `ployz rm`, `stop` and `start` take the leases
//! the same way. A dry run takes no lease: it changes nothing.
//!
//! A refused project is reported whole: every error of its Compose files, and every planning
//! problem of the Services that did load (`ployz_compose::load_partial`, then one read of the
//! Deploy Snapshot, without the lease, and the planner, which goes on past a Service it cannot
//! plan). Nothing is changed while there is one. Text mode writes warnings to stderr
//! (`warning: ...`), the plan to stdout and each problem to stderr (`error: ...`); `--json`
//! writes one document on stdout: the report, or for a refusal or any other failure an
//! [`ErrorDocument`] (`{"errors": [...], "warnings": [...]}`). `--json` still needs `-y` or
//! `--dry-run`, checked first, since a JSON run cannot be asked to confirm.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail, Context as _};
use clap::Args;
use ployz_compose::{self as compose, ComposeError, ComposeInput, ComposeWarning};
use ployz_core::api::{docker_paths, LeaseHolder, PeerPullAnswer, PeerPullRequest};
use ployz_core::{
    DeployIntent, DeployOutcome, DeployPlan, DeployPreview, ImageTransfer, MachineId,
    MachineSnapshot, NotIncluded, Operation, ServiceName, TransferOutcome,
};
use ployz_orchestrator::execute::{execute, ExecuteOptions, Progress};
use ployz_orchestrator::plan::{plan, PlanError, PlanOptions};
use ployz_orchestrator::preview;
use serde::Serialize;

use crate::client::ApiClient;
use crate::leases::{Leases, Reach, Reached};
use crate::output::{
    print_json, print_warnings, ErrorDocument, Problem, ProblemKind, Problems, Warning,
};
use crate::target::ApiTarget;
use crate::GlobalArgs;
use ployz_orchestrator::plan::binding::{PlanBinding, PlanId};

#[derive(Debug, Args)]
pub struct DeployArgs {
    /// Services to deploy (Service Attempts); default: every Service in the file. Others are
    /// left untouched.
    services: Vec<String>,
    /// Compose files, merged in order [default: those COMPOSE_FILE lists, from the environment
    /// or .env; else compose.yaml, compose.yml, docker-compose.yaml or docker-compose.yml in the
    /// current directory].
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    files: Vec<PathBuf>,
    /// Profiles to enable [default: those COMPOSE_PROFILES lists, from the environment or
    /// .env]. A Service named here is included whatever its profiles.
    #[arg(short = 'p', long = "profile", value_name = "PROFILE")]
    profiles: Vec<String>,
    /// Deploy without asking for confirmation.
    #[arg(short = 'y', long, env = "PLOYZ_AUTO_CONFIRM")]
    yes: bool,
    /// Print the Deploy Preview and stop.
    #[arg(long)]
    dry_run: bool,
    /// Replace every container of the deployed Services, up to date or not.
    #[arg(long)]
    recreate: bool,
    /// Do not wait for new containers to prove healthy.
    #[arg(long)]
    skip_health: bool,
    /// Print the preview and the Deploy Outcome as JSON (needs -y or --dry-run); a refused
    /// project or a failure prints {"errors": [...], "warnings": [...]} instead.
    #[arg(long)]
    json: bool,
    /// How long to wait for the Machine's lease while another command holds it.
    #[arg(long, value_name = "SECONDS", env = LEASE_WAIT_ENV, default_value_t = DEFAULT_LEASE_WAIT_SECONDS)]
    lease_wait: u64,
    #[command(flatten)]
    build: BuildArgs,
    /// Pass the Docker credentials of this user (`docker login`) to the Machines for pulling
    /// the images from their registries; used for those pulls alone, never stored.
    #[arg(long)]
    with_registry_auth: bool,
    /// Run only the plan that was reviewed: plan again under the Machines' leases and refuse,
    /// before any change, when its id differs from PLAN_ID (what `--dry-run` printed), naming
    /// what moved.
    #[arg(long, value_name = "PLAN_ID")]
    plan_id: Option<String>,
    /// With --plan-id: accept a plan whose images are bound only by a tag no Machine holds yet
    /// (the registry decides what it is at pull time).
    #[arg(long, requires = "plan_id")]
    allow_unresolved: bool,
}

/// How the images of Services with `build:` are built (with the Docker where the CLI runs).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct BuildArgs {
    /// A build argument for every Service with build: (repeatable; wins over the file's args).
    #[arg(long = "build-arg", value_name = "KEY=VALUE")]
    pub build_args: Vec<String>,
    /// Build without Docker's layer cache, even when an image with the build's tag exists.
    #[arg(long)]
    pub no_cache: bool,
    /// Build nothing: Services with build: use the image the local Docker has with the build's
    /// tag, or else what the Machines have.
    #[arg(long, conflicts_with = "no_cache")]
    pub no_build: bool,
}

/// The environment variable that sets `--lease-wait` for every command that takes the lease.
pub const LEASE_WAIT_ENV: &str = "PLOYZ_LEASE_WAIT";

/// How long a command waits for the Machine lease by default, in seconds.
pub const DEFAULT_LEASE_WAIT_SECONDS: u64 = 120;

/// What `--json` prints. Its specs carry secrets' digests, never their values.
#[derive(Serialize)]
pub struct DeployReport {
    /// What binds this plan (`ployz deploy --plan-id`); absent where no plan was made.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan_id: Option<String>,
    pub preview: DeployPreview,
    /// `None` for a dry run or when nothing needed doing.
    pub outcome: Option<DeployOutcome>,
}

impl DeployReport {
    /// The report of `preview` and `outcome`, every secret value dropped (digests kept).
    pub fn new(preview: &DeployPreview, outcome: Option<&DeployOutcome>) -> DeployReport {
        let mut preview = preview.clone();
        for op in preview.plan.volume_operations.iter_mut().chain(
            preview
                .plan
                .services
                .iter_mut()
                .flat_map(|s| s.operations.iter_mut()),
        ) {
            strip_secret_values(op);
        }
        let outcome = outcome.cloned().map(|mut o| {
            for c in &mut o.completed {
                strip_secret_values(&mut c.operation);
            }
            if let Some(f) = &mut o.failed {
                strip_secret_values(&mut f.operation);
            }
            for op in &mut o.unexecuted {
                strip_secret_values(op);
            }
            o
        });
        DeployReport {
            plan_id: None,
            preview,
            outcome,
        }
    }

    /// The report with the plan's id.
    pub fn bound_by(self, plan_id: &PlanId) -> DeployReport {
        DeployReport {
            plan_id: Some(plan_id.to_string()),
            ..self
        }
    }
}

/// Why a Deploy bound to `reviewed` may not run the plan made now: each part of the plan id
/// that moved, with what it holds now, and images bound by a tag alone unless allowed.
fn binding_problems(reviewed: &PlanId, now: &PlanBinding, allow_unresolved: bool) -> Vec<Problem> {
    let mut problems = Vec::new();
    for part in reviewed.moved(&now.id()) {
        let facts = now.facts(part);
        let shown: Vec<&str> = facts.iter().take(12).map(String::as_str).collect();
        let more = facts.len().saturating_sub(shown.len());
        let mut what = format!(
            "the plan moved since it was reviewed (plan id {reviewed}, now {}): {}; now: {}",
            now.id(),
            part.moved(),
            if shown.is_empty() {
                "nothing".to_owned()
            } else {
                shown.join(" | ")
            }
        );
        if more > 0 {
            what.push_str(&format!(" | and {more} more"));
        }
        problems.push(Problem::from_text(
            ProblemKind::Plan,
            format!(
                "{what}; review again with `ployz deploy --dry-run`, which prints the new plan id"
            ),
        ));
    }
    if !allow_unresolved {
        for image in now.unresolved() {
            problems.push(Problem::from_text(
                ProblemKind::Plan,
                format!(
                    "{image} is bound by its tag alone (the Machine does not hold it, so the registry decides what it is at pull time); pin it by digest (image@sha256:...), pull it first, or pass --allow-unresolved"
                ),
            ));
        }
    }
    problems
}

/// Drops the secret values of the spec an operation carries.
fn strip_secret_values(op: &mut Operation) {
    match op {
        Operation::RunHook { spec, .. }
        | Operation::RunContainer { spec, .. }
        | Operation::ReplaceContainer { spec, .. } => spec.strip_secret_values(),
        Operation::CreateVolume { .. }
        | Operation::StopContainer { .. }
        | Operation::RemoveContainer { .. } => {}
    }
}

/// Refuses, before anything runs, a plan that would create a container from a spec whose
/// secrets lost their values: a spec read back from a container (as `ployz scale` uses) carries
/// only their digests, and its new containers would lack the secret files.
fn check_secret_values(plan: &DeployPlan) -> anyhow::Result<()> {
    for op in plan.operations() {
        let (Operation::RunContainer { spec, .. } | Operation::ReplaceContainer { spec, .. }) = op
        else {
            continue;
        };
        if let Some(s) = spec.container.secrets.iter().find(|s| s.value.is_none()) {
            bail!(
                "service '{}': the secret '{}' ({}) is known here by its digest only, so no new container can get it; deploy the Service from its Compose file (`ployz deploy {}`, with deploy.replicas set there to scale it); nothing was changed",
                spec.name,
                s.name,
                s.target,
                spec.name
            );
        }
    }
    Ok(())
}

/// The Compose files when no -f names one: those `COMPOSE_FILE` lists (the environment's, else
/// the `.env` here; separated by `COMPOSE_PATH_SEPARATOR`, `:` by default), else the first of
/// the usual names here.
pub(crate) fn default_files() -> anyhow::Result<Vec<PathBuf>> {
    let env: BTreeMap<String, String> = std::env::vars().collect();
    let here = std::path::Path::new(".");
    if let Some(list) =
        compose::compose_setting(here, "COMPOSE_FILE", &env).filter(|v| !v.trim().is_empty())
    {
        let separator = compose::compose_setting(here, "COMPOSE_PATH_SEPARATOR", &env)
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| ":".to_owned());
        return Ok(list
            .split(separator.as_str())
            .map(str::trim)
            .filter(|f| !f.is_empty())
            .map(PathBuf::from)
            .collect());
    }
    for name in [
        "compose.yaml",
        "compose.yml",
        "docker-compose.yaml",
        "docker-compose.yml",
    ] {
        let p = PathBuf::from(name);
        if p.exists() {
            return Ok(vec![p]);
        }
    }
    bail!("no Compose file here (compose.yaml, compose.yml, docker-compose.yaml, docker-compose.yml); name one with -f FILE")
}

/// Loads the files. A Service named on the command line that a profile not in effect left out
/// is loaded too, its profiles enabled: Compose runs a service it is asked for by name whatever
/// its profiles.
pub(crate) fn load_naming(input: ComposeInput, named: &[String]) -> compose::PartialProject {
    let loaded = compose::load_partial(&input);
    let mut profiles = loaded.project.profiles.clone();
    for name in named {
        for p in loaded.project.left_out.get(name).into_iter().flatten() {
            if !profiles.contains(p) {
                profiles.push(p.clone());
            }
        }
    }
    if profiles == loaded.project.profiles {
        return loaded;
    }
    compose::load_partial(&ComposeInput { profiles, ..input })
}

pub async fn run(global: &GlobalArgs, args: DeployArgs) -> anyhow::Result<()> {
    let json = args.json;
    deploy_files(global, args)
        .await
        .map_err(|stop| stop.into_error(json))
}

/// Loads the Compose files and deploys what they ask for, or refuses with every problem of the
/// files and of planning what loaded.
async fn deploy_files(global: &GlobalArgs, args: DeployArgs) -> Result<(), Stop> {
    if args.json && !(args.yes || args.dry_run) {
        return Err(Stop::Failed(
            ProblemKind::Usage,
            anyhow!(
                "--json cannot prompt for confirmation; add -y to deploy or --dry-run to preview"
            ),
        ));
    }
    let files = if args.files.is_empty() {
        default_files().stop_as(ProblemKind::Usage)?
    } else {
        args.files.clone()
    };
    let env: BTreeMap<String, String> = std::env::vars().collect();
    let loaded = load_naming(
        ComposeInput {
            files,
            profiles: args.profiles.clone(),
            env,
        },
        &args.services,
    );
    let project = loaded.project;
    let warnings: Vec<Warning> = project.warnings.iter().map(compose_warning).collect();
    if !args.json {
        print_warnings(&warnings);
    }
    let mut attempts: Vec<ServiceName> = if args.services.is_empty() {
        project.services.iter().map(|s| s.name.clone()).collect()
    } else {
        args.services
            .iter()
            .map(|s| s.parse().map_err(|e| anyhow!("{e}")))
            .collect::<anyhow::Result<_>>()
            .stop_as(ProblemKind::Usage)?
    };
    // A Service the files refused is reported by its errors; planning it would only add that
    // it is not there.
    let refused: BTreeSet<&str> = loaded
        .errors
        .iter()
        .filter_map(|e| e.service.as_deref())
        .collect();
    attempts
        .retain(|a| !refused.contains(a.as_str()) || project.services.iter().any(|s| &s.name == a));
    let mut intent = DeployIntent {
        services: project.services,
        attempts,
        volumes: project.volumes,
    };
    let built = if loaded.errors.is_empty() {
        prepare_builds(
            &mut intent,
            &project.builds,
            &args.build,
            args.dry_run,
            args.json,
        )
        .await
        .stop_as(ProblemKind::Failed)?
    } else {
        Vec::new()
    };
    let bound = match &args.plan_id {
        Some(id) => Some((
            id.parse::<PlanId>()
                .map_err(|e| anyhow!("--plan-id: {e}"))
                .stop_as(ProblemKind::Usage)?,
            args.allow_unresolved,
        )),
        None => None,
    };
    let registry_auth = if args.with_registry_auth {
        let images: Vec<&str> = intent
            .services
            .iter()
            .filter(|s| intent.attempts.contains(&s.name))
            .map(|s| s.container.image.as_str())
            .filter(|i| !built.iter().any(|b| b == i))
            .collect();
        let (found, missing) =
            crate::registry_auth::credentials(&images).stop_as(ProblemKind::Usage)?;
        if !args.json {
            for registry in missing {
                eprintln!("warning: --with-registry-auth: no credentials for {registry} in the Docker configuration; its images are pulled without");
            }
        }
        found
    } else {
        Vec::new()
    };
    let flow = Flow {
        yes: args.yes,
        dry_run: args.dry_run,
        json: args.json,
        plan: PlanOptions {
            recreate: args.recreate,
            seed: rand_seed(),
            not_included: Vec::new(),
            built,
        },
        execute: ExecuteOptions {
            skip_health: args.skip_health,
            ..monitor_defaults()
        },
        lease_wait: Duration::from_secs(args.lease_wait),
        command: None,
        registry_auth,
        bound,
    };
    if !loaded.errors.is_empty() {
        let mut errors: Vec<Problem> = loaded.errors.iter().map(compose_problem).collect();
        errors.extend(planning_problems(global, &intent, &flow.plan).await);
        return Err(Stop::Refused { errors, warnings });
    }
    let mut client = super::connect(global).await.stop_as(ProblemKind::Daemon)?;
    deploy_project(&mut client, &intent, warnings, &flow).await
}

/// Gives each attempted Service with `build:` its image's tag, derived from the build's inputs
/// (so an unchanged build is the same image and plans as up to date), and builds what the local
/// Docker does not have yet (not for a dry run or with `--no-build`; always with
/// `--no-cache`). The images the local Docker has now, which the Machines that lack them get
/// from it.
pub async fn prepare_builds(
    intent: &mut DeployIntent,
    builds: &[(ServiceName, ployz_compose::BuildSpec)],
    how: &BuildArgs,
    dry_run: bool,
    quiet: bool,
) -> anyhow::Result<Vec<String>> {
    let overrides: BTreeMap<String, String> = how
        .build_args
        .iter()
        .map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .ok_or_else(|| {
                    anyhow!(
                        "--build-arg '{kv}' is not KEY=VALUE; write it as --build-arg NAME=value"
                    )
                })
        })
        .collect::<anyhow::Result<_>>()?;
    let attempted: Vec<&(ServiceName, ployz_compose::BuildSpec)> = builds
        .iter()
        .filter(|(name, _)| intent.attempts.contains(name))
        .collect();
    if attempted.is_empty() {
        return Ok(Vec::new());
    }
    // Every tag first: a context that cannot be read stops the Deploy before anything is built.
    let mut planned = Vec::new();
    for (name, build) in attempted {
        let mut args = build.args.clone();
        args.extend(overrides.clone());
        let tag = crate::build::content_tag(build, &args)
            .with_context(|| format!("service '{name}': the build's inputs cannot be read"))?;
        let spec = intent
            .services
            .iter_mut()
            .find(|s| &s.name == name)
            .expect("an attempted Service with a build is in the intent");
        let reference = format!("{}:{tag}", crate::build::repository(&spec.container.image));
        spec.container.image = reference.clone();
        planned.push((name, build, args, reference));
    }
    // A dry run, or --no-build, needs no local Docker: without one, nothing is built there.
    let local = match super::image::local_docker().await {
        Ok(local) => Some(local),
        Err(_) if dry_run || how.no_build => None,
        Err(e) => return Err(e),
    };
    let mut have = Vec::new();
    for (name, build, args, reference) in planned {
        let present = match &local {
            Some((local, shown)) => ployz_orchestrator::images::describe(local, shown, &reference)
                .await
                .map_err(|e| anyhow!("{e}"))?
                .is_some(),
            None => false,
        };
        let context = build.context.display();
        if dry_run || how.no_build || (present && !how.no_cache) {
            if !quiet {
                let why = if present {
                    "built already"
                } else if dry_run {
                    "to build (not in a dry run)"
                } else {
                    "not built (--no-build)"
                };
                eprintln!("build {name} → {reference} from {context}: {why}");
            }
            if present {
                have.push(reference);
            }
            continue;
        }
        if !quiet {
            eprintln!("build {name} → {reference} from {context} ...");
        }
        let (local, _) = local
            .as_ref()
            .expect("a local Docker unless a dry run or --no-build");
        crate::build::build_image(local, build, &args, &reference, how.no_cache, |line| {
            if !quiet {
                eprintln!("  │ {line}");
            }
        })
        .await
        .with_context(|| format!("service '{name}': building {reference} from {context}"))?;
        have.push(reference);
    }
    Ok(have)
}

/// The planning problems of the Services of a project refused for its files: the Deploy Snapshot
/// read once, without the lease (nothing changes), and the Services that loaded planned against
/// it. When the snapshot cannot be read, one problem says that planning was not checked.
async fn planning_problems(
    global: &GlobalArgs,
    intent: &DeployIntent,
    opts: &PlanOptions,
) -> Vec<Problem> {
    if intent.attempts.is_empty() {
        return Vec::new();
    }
    let gathered = async {
        let mut client = super::connect(global).await?;
        let mut reach = Reach::observe(&mut client).await?;
        let machines = gather(&mut client, &mut reach, None).await?;
        anyhow::Ok((machines, reach))
    }
    .await;
    let (machines, reach) = match gathered {
        Ok(gathered) => gathered,
        Err(e) => {
            return vec![Problem::from_text(
                ProblemKind::Daemon,
                format!("planning problems were not checked: {e:#}"),
            )]
        }
    };
    let opts = &PlanOptions {
        not_included: reach.not_included,
        ..opts.clone()
    };
    match plan(intent, &machines, opts) {
        Ok(plan) => match crate::client::check_plan_bodies(&plan) {
            Ok(()) => Vec::new(),
            Err(e) => vec![Problem::from_text(ProblemKind::Plan, format!("{e:#}"))],
        },
        Err(errors) => errors.iter().map(plan_problem).collect(),
    }
}

/// Why a Deploy stopped, and whether its report is out already.
enum Stop {
    /// Problems of the project (its files, its planning): nothing was changed.
    Refused {
        errors: Vec<Problem>,
        warnings: Vec<Warning>,
    },
    /// Anything else, before any report was printed.
    Failed(ProblemKind, anyhow::Error),
    /// The Deploy ran and its report is printed; the error says how it ended.
    Reported(anyhow::Error),
}

impl Stop {
    /// Prints what `--json` promises for this stop (one document on stdout) and gives the error
    /// `main` prints on stderr: in text mode every problem, one per line.
    fn into_error(self, json: bool) -> anyhow::Error {
        match self {
            Stop::Refused { errors, warnings } if json => {
                let count = errors.len();
                if let Err(e) = print_json(&ErrorDocument { errors, warnings }) {
                    return e;
                }
                anyhow!(
                    "the Deploy was refused: {count} problem{} (in the JSON on stdout); nothing was changed",
                    if count == 1 { "" } else { "s" }
                )
            }
            Stop::Refused { errors, .. } => anyhow::Error::new(Problems(errors)),
            Stop::Failed(kind, e) if json => {
                let document = ErrorDocument {
                    errors: vec![Problem::from_text(kind, format!("{e:#}"))],
                    warnings: Vec::new(),
                };
                match print_json(&document) {
                    Ok(()) => e,
                    Err(printing) => e.context(format!("{printing:#}")),
                }
            }
            Stop::Failed(_, e) | Stop::Reported(e) => e,
        }
    }
}

/// Names where a failure happened, for `--json`.
trait StopAs<T> {
    fn stop_as(self, kind: ProblemKind) -> Result<T, Stop>;
}

impl<T> StopAs<T> for anyhow::Result<T> {
    fn stop_as(self, kind: ProblemKind) -> Result<T, Stop> {
        self.map_err(|e| Stop::Failed(kind, e))
    }
}

/// A loader error as a reported problem: every field the loader names.
fn compose_problem(e: &ComposeError) -> Problem {
    Problem {
        kind: ProblemKind::Compose,
        file: Some(e.file.clone()),
        service: e.service.clone(),
        key: e.key.clone(),
        value: e.value.clone(),
        message: e.message.clone(),
        fix: e.fix.clone(),
        line: e.to_string(),
    }
}

/// A planning problem as a reported problem: its Service, what is wrong and what to do.
fn plan_problem(e: &PlanError) -> Problem {
    Problem {
        kind: ProblemKind::Plan,
        file: None,
        service: e.service().map(str::to_owned),
        key: None,
        value: None,
        message: e.message(),
        fix: e.fix(),
        line: e.to_string(),
    }
}

/// A loader warning as reported.
fn compose_warning(w: &ComposeWarning) -> Warning {
    Warning {
        file: Some(w.file.clone()),
        service: w.service.clone(),
        key: (!w.key.is_empty()).then(|| w.key.clone()),
        message: w.message.clone(),
        line: w.to_string(),
    }
}

/// How one Deploy asks, plans and watches.
pub struct Flow {
    pub yes: bool,
    pub dry_run: bool,
    pub json: bool,
    pub plan: PlanOptions,
    pub execute: ExecuteOptions,
    /// How long to wait for the Machine lease while another command holds it.
    pub lease_wait: Duration,
    /// What the lease names as this command; `None`: `deploy of <services>`.
    pub command: Option<String>,
    /// Registry credentials passed with the calls that may pull (`--with-registry-auth`).
    pub registry_auth: Vec<ployz_core::api::RegistryAuth>,
    /// The plan id this Deploy must plan to (`--plan-id`), and whether unresolved images may
    /// be bound (`--allow-unresolved`).
    pub bound: Option<(PlanId, bool)>,
}

impl Flow {
    /// A Deploy that asks (unless `yes`), with default planning and monitoring.
    pub fn confirmed(yes: bool) -> Flow {
        Flow {
            yes,
            dry_run: false,
            json: false,
            plan: PlanOptions {
                recreate: false,
                seed: rand_seed(),
                not_included: Vec::new(),
                built: Vec::new(),
            },
            execute: monitor_defaults(),
            lease_wait: lease_wait_from_env(),
            command: None,
            registry_auth: Vec::new(),
            bound: None,
        }
    }
}

/// `PLOYZ_LEASE_WAIT` (seconds) when set, else the default.
pub fn lease_wait_from_env() -> Duration {
    let seconds = match std::env::var(LEASE_WAIT_ENV) {
        Err(_) => DEFAULT_LEASE_WAIT_SECONDS,
        Ok(v) => v.trim().parse().unwrap_or_else(|_| {
            eprintln!(
                "warning: {LEASE_WAIT_ENV}='{v}' is not a number of seconds; waiting up to {DEFAULT_LEASE_WAIT_SECONDS} s for the lease"
            );
            DEFAULT_LEASE_WAIT_SECONDS
        }),
    };
    Duration::from_secs(seconds)
}

/// Execute options with `PLOYZ_HEALTH_MONITOR_PERIOD` (seconds) applied.
pub fn monitor_defaults() -> ExecuteOptions {
    let mut opts = ExecuteOptions::default();
    if let Some(secs) = std::env::var("PLOYZ_HEALTH_MONITOR_PERIOD")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
    {
        opts.default_monitor = std::time::Duration::from_secs_f64(secs.max(0.0));
    }
    opts
}

pub fn rand_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Lease, snapshot, plan, preview, confirm, execute, report, release. Shared by `run` and
/// `scale`; `warnings` go to stderr (into the report with `--json`).
pub async fn deploy_intent(
    client: &mut ApiClient,
    intent: &DeployIntent,
    warnings: Vec<String>,
    flow: &Flow,
) -> anyhow::Result<()> {
    let warnings: Vec<Warning> = warnings.into_iter().map(Warning::from_text).collect();
    if !flow.json {
        print_warnings(&warnings);
    }
    deploy_project(client, intent, warnings, flow)
        .await
        .map_err(|stop| stop.into_error(flow.json))
}

/// [`deploy_intent`] once the warnings are shown (text mode): the Machines reached, their
/// leases (none for a dry run), the Deploy, the leases released.
async fn deploy_project(
    client: &mut ApiClient,
    intent: &DeployIntent,
    warnings: Vec<Warning>,
    flow: &Flow,
) -> Result<(), Stop> {
    let mut reach = Reach::observe(client).await.stop_as(ProblemKind::Daemon)?;
    if flow.dry_run {
        note_held_leases(client, &reach).await;
        return deploy_holding(client, intent, warnings, flow, &mut reach, None).await;
    }
    let command = flow.command.clone().unwrap_or_else(|| {
        let names: Vec<&str> = intent.attempts.iter().map(|n| n.as_str()).collect();
        format!("deploy of {}", names.join(", "))
    });
    let mut leases = Leases::take(client, &mut reach, &command, flow.lease_wait)
        .await
        .stop_as(ProblemKind::Lease)?;
    let result = deploy_holding(
        client,
        intent,
        warnings,
        flow,
        &mut reach,
        Some(&mut leases),
    )
    .await;
    leases.release(client).await;
    result
}

/// A dry run takes no lease, but says when another command holds one: the Machines may change
/// before a Deploy runs.
async fn note_held_leases(client: &mut ApiClient, reach: &Reach) {
    for m in &reach.machines {
        client.set_machine_target(m.id.as_ref().map(|id| id.to_string()));
        if let Ok(Some(holder)) = client.get::<Option<LeaseHolder>>(docker_paths::LEASE).await {
            let subject = reach.subject(m);
            eprintln!(
                "note: {subject}'s lease is held by {holder}; {} may change before a Deploy runs",
                if subject == "this Machine" {
                    "the Machine"
                } else {
                    "it"
                }
            );
        }
    }
    client.set_machine_target(None);
}

/// The Deploy Snapshot: every Machine of `reach` asked for its own observation (Live
/// Observation), through the Machine reached. A Machine that does not answer is moved to
/// `reach.not_included` (and its lease released); when none answers, the first one's failure is
/// the error.
async fn gather(
    client: &mut ApiClient,
    reach: &mut Reach,
    mut leases: Option<&mut Leases>,
) -> anyhow::Result<Vec<MachineSnapshot>> {
    if reach.machines.iter().any(|m| m.id.is_none()) {
        return Ok(vec![client.get(docker_paths::SNAPSHOT).await?]);
    }
    let asked: Vec<(MachineId, String)> = reach
        .machines
        .iter()
        .filter_map(|m| Some((m.id.clone()?, m.name.clone())))
        .collect();
    let (answers, failures) =
        crate::targets::get_from::<MachineSnapshot>(client, &asked, docker_paths::SNAPSHOT).await?;
    let answered: Vec<MachineId> = answers.iter().map(|(a, _)| a.machine.clone()).collect();
    let mut machines: Vec<MachineSnapshot> = answers.into_iter().map(|(_, s)| s).collect();
    machines.sort_by(|a, b| a.machine.info.id.cmp(&b.machine.info.id));
    let left_out = unanswered(&reach.machines, &answered, &failures);
    if machines.is_empty() {
        let first = left_out
            .first()
            .map_or("no Machine answered".to_owned(), |n| n.reason.clone());
        bail!("{first}");
    }
    for n in left_out {
        reach.machines.retain(|m| m.id.as_ref() != Some(&n.machine));
        if let Some(leases) = leases.as_deref_mut() {
            leases.release_one(client, &n.machine).await;
        }
        reach.not_included.push(n);
    }
    last_seen_on(client, &mut reach.not_included).await?;
    Ok(machines)
}

/// Notes on each Machine left out the Services it had containers of, as the Machine reached
/// holds its observations (replicated, possibly stale), so that a Service found only there is
/// not planned as a new one. When they cannot be read, nothing can be told apart: the Deploy
/// stops rather than risk a second copy of a Service.
async fn last_seen_on(
    client: &mut ApiClient,
    not_included: &mut [NotIncluded],
) -> anyhow::Result<()> {
    if not_included.is_empty() {
        return Ok(());
    }
    client.set_machine_target(None);
    let stored: Vec<ployz_core::ContainerRuntimeObservation> = client
        .get(docker_paths::STORED_CONTAINERS)
        .await
        .context("cannot read what the Machines left out last ran")?;
    for n in not_included.iter_mut() {
        let on: BTreeSet<String> = stored
            .iter()
            .filter(|c| c.machine_id == n.machine && c.kind == ployz_core::ContainerKind::Service)
            .map(|c| c.service_name.to_string())
            .collect();
        n.services = on.into_iter().collect();
    }
    Ok(())
}

/// The Machines of `asked` that gave no answer, each with the failure that names it (a fan-out
/// names a Machine `name (id)`, a single forward by its ID).
fn unanswered(
    asked: &[Reached],
    answered: &[MachineId],
    failures: &[ployz_core::TargetFailure],
) -> Vec<NotIncluded> {
    asked
        .iter()
        .filter_map(|m| Some((m.id.as_ref()?, m)))
        .filter(|(id, _)| !answered.contains(id))
        .map(|(id, m)| NotIncluded {
            machine: id.clone(),
            name: m.name.clone(),
            reason: failures
                .iter()
                .find(|f| f.target.contains(id.as_str()))
                .map_or_else(|| "it gave no answer".to_owned(), |f| f.reason.clone()),
            edge_features: m.edge_features.clone(),
            services: Vec::new(),
        })
        .collect()
}

/// The Deploy itself, holding the leases (`None` for a dry run).
async fn deploy_holding(
    client: &mut ApiClient,
    intent: &DeployIntent,
    warnings: Vec<Warning>,
    flow: &Flow,
    reach: &mut Reach,
    mut leases: Option<&mut Leases>,
) -> Result<(), Stop> {
    let machines = gather(client, reach, leases.as_deref_mut())
        .await
        .stop_as(ProblemKind::Daemon)?;
    // What binds this plan; a real Deploy holds the leases while it is read and compared, so
    // nothing moves between the comparison and the first operation.
    let binding = PlanBinding::of(intent, &machines, &reach.not_included, &flow.plan.built);
    let plan_id = binding.id();
    if let Some((reviewed, allow_unresolved)) = &flow.bound {
        let problems = binding_problems(reviewed, &binding, *allow_unresolved);
        if !problems.is_empty() {
            return Err(Stop::Refused {
                errors: problems,
                warnings,
            });
        }
    }
    let opts = PlanOptions {
        not_included: reach.not_included.clone(),
        // The same facts plan the same operations: the preview is what a bound Deploy runs.
        seed: binding.seed(),
        ..flow.plan.clone()
    };
    let plan = match plan(intent, &machines, &opts) {
        Ok(plan) => plan,
        Err(errors) => {
            return Err(Stop::Refused {
                errors: errors.iter().map(plan_problem).collect(),
                warnings,
            })
        }
    };
    // A request over the API's body limit fails here, in a dry run too, not midway.
    if let Err(e) =
        crate::client::check_plan_bodies(&plan).and_then(|()| check_secret_values(&plan))
    {
        return Err(Stop::Refused {
            errors: vec![Problem::from_text(ProblemKind::Plan, format!("{e:#}"))],
            warnings,
        });
    }
    let preview = DeployPreview {
        plan,
        warnings: warnings.into_iter().map(|w| w.line).collect(),
        not_included: reach.not_included.clone(),
    };
    if !flow.json {
        print!("{}", preview::render(&preview, &machines));
        if !preview.plan.is_empty() {
            println!("\nPlan id: {plan_id}");
            if flow.dry_run {
                println!("Run exactly this plan, or nothing if anything it depends on moves: ployz deploy --plan-id {plan_id}");
                for image in binding.unresolved() {
                    println!("  note: {image} is bound by its tag alone (no Machine holds it yet): a bound Deploy needs --allow-unresolved");
                }
            }
        }
    }
    let Some(leases) = leases.filter(|_| !preview.plan.is_empty() && !flow.dry_run) else {
        if flow.json {
            print_json(&DeployReport::new(&preview, None).bound_by(&plan_id))
                .stop_as(ProblemKind::Failed)?;
        }
        return Ok(());
    };
    if !flow.yes {
        confirm_holding(client, "Proceed with deployment?", leases)
            .await
            .stop_as(ProblemKind::Failed)?;
    }
    let quiet = flow.json;
    let fetched = fetch_images(client, &preview.plan.transfers, &machines, quiet).await;
    // An image built here is in no registry: without it a Machine's container cannot start, so
    // the Deploy stops before its first operation.
    if let Some(failed) = fetched
        .iter()
        .find(|f| f.transfer.from.is_none() && f.error.is_some())
    {
        let on = machines
            .iter()
            .find(|m| m.machine.info.id == failed.transfer.machine_id)
            .map(|m| m.machine.info.name.to_string())
            .unwrap_or_else(|| failed.transfer.machine_id.to_string());
        return Err(Stop::Reported(anyhow!(
            "the built image {} did not reach Machine '{on}': {}; no operation ran, deploy again to continue",
            failed.transfer.image,
            failed.error.as_deref().unwrap_or("it failed")
        )));
    }
    let total = preview.plan.operations().count();
    let mut step = 0;
    let mut target = ApiTarget {
        client,
        leases: &*leases,
        registry_auth: &flow.registry_auth,
        plan_id: flow.bound.as_ref().map(|_| plan_id.to_string()),
    };
    let outcome = execute(&preview.plan, &mut target, &flow.execute, |p| {
        if quiet {
            return;
        }
        match p {
            Progress::Started(op) => {
                step += 1;
                eprintln!("[{step}/{total}] {} ...", preview::describe(op, &machines));
            }
            Progress::Finished(_, Some(c)) => eprintln!("        done: {}", c.name),
            Progress::Finished(_, None) => eprintln!("        done"),
            Progress::Failed(_, reason) => eprintln!("        failed: {reason}"),
        }
    })
    .await;
    let outcome = DeployOutcome {
        images: fetched,
        ..outcome
    };
    Leases::aim_off(client);
    if outcome.failed.is_none() {
        record_revisions(client, intent, &preview.plan, &machines, quiet).await;
    }
    if flow.json {
        print_json(&DeployReport::new(&preview, Some(&outcome)).bound_by(&plan_id))
            .map_err(Stop::Reported)?;
    } else {
        print_outcome(&outcome, &machines);
    }
    if let Some(failed) = &outcome.failed {
        return Err(Stop::Reported(anyhow!(
            "deploy failed at '{}': {}",
            preview::describe(&failed.operation, &machines),
            failed.reason
        )));
    }
    Ok(())
}

/// Runs the plan's image transfers, one after the other: a Machine fetching from another over
/// the mesh (a peer pull), or an image the CLI built sent from its Docker. A transfer that fails
/// is reported and the Deploy goes on: the container's own pull, from its registry, comes next.
async fn fetch_images(
    client: &mut ApiClient,
    transfers: &[ImageTransfer],
    machines: &[MachineSnapshot],
    quiet: bool,
) -> Vec<TransferOutcome> {
    let mut out = Vec::with_capacity(transfers.len());
    for (i, t) in transfers.iter().enumerate() {
        if !quiet {
            eprintln!(
                "[image {}/{}] {} ...",
                i + 1,
                transfers.len(),
                preview::describe_transfer(t, machines)
            );
        }
        let answer: anyhow::Result<PeerPullAnswer> = match &t.from {
            Some(from) => {
                client.set_machine_target(Some(t.machine_id.to_string()));
                let answer = client
                    .post(
                        docker_paths::IMAGE_PULL_FROM_PEER,
                        &PeerPullRequest {
                            image: t.image.clone(),
                            from: from.clone(),
                        },
                    )
                    .await;
                client.set_machine_target(None);
                answer
            }
            None => send_built(client, t, machines).await,
        };
        let outcome = match answer {
            Ok(a) => {
                if !quiet {
                    if a.present {
                        eprintln!("        done: it was there already");
                    } else {
                        eprintln!(
                            "        done: {} of {} layers, {}",
                            a.layers_sent,
                            a.layers,
                            crate::output::bytes(a.received)
                        );
                    }
                }
                TransferOutcome {
                    transfer: t.clone(),
                    present: a.present,
                    layers_sent: a.layers_sent,
                    layers: a.layers,
                    bytes: a.received,
                    error: None,
                }
            }
            Err(e) => {
                if !quiet {
                    eprintln!("        failed: {e:#}; the container's own pull comes next");
                }
                TransferOutcome {
                    transfer: t.clone(),
                    present: false,
                    layers_sent: 0,
                    layers: 0,
                    bytes: 0,
                    error: Some(format!("{e:#}")),
                }
            }
        };
        out.push(outcome);
    }
    out
}

/// Sends an image the CLI built from its Docker to the Machine `t` names, as `image push` does,
/// through the Machine reached.
async fn send_built(
    client: &mut ApiClient,
    t: &ImageTransfer,
    machines: &[MachineSnapshot],
) -> anyhow::Result<PeerPullAnswer> {
    let (local, shown) = super::image::local_docker().await?;
    let offer = super::image::local_offer(&local, &shown, &t.image).await?;
    let name = machines
        .iter()
        .find(|m| m.machine.info.id == t.machine_id)
        .map(|m| m.machine.info.name.to_string())
        .unwrap_or_else(|| t.machine_id.to_string());
    let share = super::image::Share::new(&name, offer.layers.len());
    let sent = super::image::send_to(client, &local, &offer, &t.machine_id, &name, share).await?;
    Ok(PeerPullAnswer {
        id: offer.id,
        present: sent.present,
        layers_sent: sent.layers_sent,
        layers: sent.layers,
        received: sent.bytes_sent,
    })
}

fn print_outcome(outcome: &DeployOutcome, machines: &[MachineSnapshot]) {
    if !outcome.images.is_empty() {
        let fetched: Vec<&TransferOutcome> = outcome
            .images
            .iter()
            .filter(|i| i.error.is_none())
            .collect();
        println!(
            "Images: {} of {} sent to the Machines that lacked them, {} over the network.",
            fetched.len(),
            outcome.images.len(),
            crate::output::bytes(fetched.iter().map(|i| i.bytes).sum())
        );
    }
    match &outcome.failed {
        None => println!(
            "Deploy completed: {} operation{}.",
            outcome.completed.len(),
            if outcome.completed.len() == 1 {
                ""
            } else {
                "s"
            }
        ),
        Some(f) => {
            println!("Deploy failed.");
            println!(
                "  failed:      {}",
                preview::describe(&f.operation, machines)
            );
            println!("  reason:      {}", f.reason);
            if let Some(c) = &f.container {
                match &f.stop_error {
                    None => println!("  kept:        {} (stopped, for inspection)", c.name),
                    Some(e) => println!(
                        "  kept:        {} (NOT stopped: {e}; it may still be running)",
                        c.name
                    ),
                }
            }
            if !f.logs.is_empty() {
                println!("  last log lines:");
                for l in &f.logs {
                    println!("    {l}");
                }
            }
            println!("  completed:   {} operations", outcome.completed.len());
            println!("  not run:     {} operations", outcome.unexecuted.len());
            for op in &outcome.unexecuted {
                println!("    {}", preview::describe(op, machines));
            }
            if let Some(c) = &outcome.compensation {
                match &c.error {
                    None => println!("  compensation: {}", c.action),
                    Some(e) => println!("  compensation: {} FAILED: {e}", c.action),
                }
            }
        }
    }
}

/// Asks on the terminal while holding the lease, renewing it while the person decides; without a
/// terminal, refuses instead of assuming yes.
async fn confirm_holding(
    client: &mut ApiClient,
    question: &str,
    leases: &Leases,
) -> anyhow::Result<()> {
    let ttl = leases
        .held
        .iter()
        .map(|h| h.ttl)
        .min()
        .unwrap_or(Duration::from_secs(10));
    if !std::io::stdin().is_terminal() {
        bail!("no terminal to confirm on; pass -y to proceed without a prompt");
    }
    print!("{question} [y/N] ");
    std::io::stdout().flush()?;
    // A thread of its own, not the runtime's blocking pool: a process that gives up on the
    // answer must not wait for it on the way out.
    let (answered, mut reading) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let mut answer = String::new();
        let _ = answered.send(std::io::stdin().read_line(&mut answer).map(|_| answer));
    });
    let every = (ttl / 3).max(Duration::from_millis(500));
    let answer = loop {
        tokio::select! {
            read = &mut reading => break read.context("the terminal closed")??,
            _ = tokio::time::sleep(every) => leases.renew(client).await?,
        }
    };
    if matches!(answer.trim(), "y" | "Y" | "yes" | "Yes") {
        Ok(())
    } else {
        bail!("cancelled; nothing was changed")
    }
}

/// Asks on the terminal; without one, refuses instead of assuming yes.
pub fn confirm(question: &str) -> anyhow::Result<()> {
    if !std::io::stdin().is_terminal() {
        bail!("no terminal to confirm on; pass -y to proceed without a prompt");
    }
    print!("{question} [y/N] ");
    std::io::stdout().flush()?;
    let mut answer = String::new();
    std::io::stdin().read_line(&mut answer)?;
    if matches!(answer.trim(), "y" | "Y" | "yes" | "Yes") {
        Ok(())
    } else {
        bail!("cancelled; nothing was changed")
    }
}

/// Keeps, for each Service this Deploy changed, what ran before (the Resolved Service Spec of
/// its containers, when the store does not have it yet) and what runs now, as revisions in the
/// store (`ployz history`, `ployz rollback`). A revision that cannot be written is a warning:
/// the Deploy itself is done.
async fn record_revisions(
    client: &mut ApiClient,
    intent: &DeployIntent,
    plan: &ployz_core::DeployPlan,
    machines: &[MachineSnapshot],
    quiet: bool,
) {
    let by = crate::leases::user_at_host();
    for service in plan.services.iter().filter(|s| !s.operations.is_empty()) {
        // What ran, unless the newest kept revision makes those containers already: it is what
        // the last Deploy recorded. (A Deploy that kept some containers leaves them with the
        // spec they were created with: taken as it is, an old replica count would be recorded
        // as a revision of its own; and a Machine left out runs containers the snapshot lacks.)
        let running = super::revision::Running::of(
            machines.iter().flat_map(|m| &m.containers),
            &service.service_id,
        );
        let before = match running {
            Some(running) => {
                let kept = match super::revision::kept_revisions(client, &service.service_id).await
                {
                    Ok(kept) => kept,
                    Err(e) => {
                        // Recorded again at worst: one revision more in `ployz history`.
                        if !quiet {
                            eprintln!(
                                "warning: service '{}': its kept revisions could not be read ({e:#}); what ran before is recorded as a revision again",
                                service.name
                            );
                        }
                        Vec::new()
                    }
                };
                (!kept
                    .last()
                    .is_some_and(|newest| running.same_containers(&newest.spec)))
                .then(|| running.spec())
            }
            None => None,
        };
        let now = intent
            .services
            .iter()
            .find(|s| s.name == service.name)
            .cloned();
        for spec in before.into_iter().chain(now) {
            let mut spec = spec;
            spec.strip_secret_values();
            let request = ployz_core::api::RecordRevisionRequest {
                service_id: service.service_id.clone(),
                by: by.clone(),
                spec,
            };
            let answer: anyhow::Result<serde_json::Value> = client
                .post(ployz_core::api::paths::REVISIONS, &request)
                .await;
            if let Err(e) = answer {
                if !quiet {
                    eprintln!(
                        "warning: service '{}': its revision was not kept ({e:#}); `ployz rollback` will not offer it",
                        service.name
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ployz_core::{
        CompletedOperation, ContainerSpec, DeployPlan, FailedOperation, MachineId, SecretFile,
        SecretValue, ServiceId, ServicePlan, ServiceSpec,
    };

    const VALUE: &[u8] = b"s3cret-in-the-plan";

    fn spec() -> ServiceSpec {
        ServiceSpec {
            name: "db".parse().unwrap(),
            mode: Default::default(),
            replicas: 1,
            container: ContainerSpec {
                image: "postgres:16".into(),
                secrets: vec![SecretFile::new(
                    "pw".into(),
                    "/run/secrets/pw".into(),
                    SecretValue::new(VALUE.to_vec()),
                    None,
                    None,
                    None,
                )],
                ..Default::default()
            },
            ports: vec![],
            machines: vec![],
            update: Default::default(),
            pre_deploy: None,
            depends_on: vec![],
            revisions: None,
            routes: vec![],
        }
    }

    fn run_op() -> Operation {
        Operation::RunContainer {
            machine_id: MachineId::generate(),
            service_id: ServiceId::generate(),
            spec: spec(),
        }
    }

    fn plan() -> DeployPlan {
        DeployPlan {
            volume_operations: vec![],
            services: vec![ServicePlan {
                service_id: ServiceId::generate(),
                name: "db".parse().unwrap(),
                mode: Default::default(),
                is_new: true,
                replicas: 1,
                previous_image: None,
                image: "postgres:16".into(),
                operations: vec![run_op()],
            }],
            transfers: Vec::new(),
            left_unverified: Vec::new(),
        }
    }

    /// A Machine a fan-out failed on is left out whatever way its failure names it; one that
    /// answered never is.
    #[test]
    fn machines_without_a_snapshot_are_left_out_with_their_failure() {
        let (a, b, c) = (
            MachineId::generate(),
            MachineId::generate(),
            MachineId::generate(),
        );
        let reached = |id: &MachineId, name: &str| Reached {
            id: Some(id.clone()),
            name: name.to_owned(),
            edge_features: Some(vec!["routes".to_owned()]),
        };
        let asked = vec![reached(&a, "m0"), reached(&b, "m1"), reached(&c, "m2")];
        let failures = vec![
            ployz_core::TargetFailure {
                target: format!("m1 ({b})"),
                reason: "no connection within 5 s".into(),
            },
            ployz_core::TargetFailure {
                target: c.to_string(),
                reason: "Docker does not answer".into(),
            },
        ];
        let left = unanswered(&asked, std::slice::from_ref(&a), &failures);
        let got: Vec<(&str, &str)> = left
            .iter()
            .map(|n| (n.name.as_str(), n.reason.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("m1", "no connection within 5 s"),
                ("m2", "Docker does not answer")
            ]
        );
        // What their records published goes with them: their edges serve again later.
        assert!(left
            .iter()
            .all(|n| n.edge_features == Some(vec!["routes".to_owned()])));
        assert!(unanswered(&asked, &[a, b, c], &failures).is_empty());
    }

    #[test]
    fn the_json_report_carries_secret_digests_and_no_values() {
        let preview = DeployPreview {
            plan: plan(),
            warnings: vec![],
            not_included: vec![],
        };
        let outcome = DeployOutcome {
            images: vec![],
            completed: vec![CompletedOperation {
                operation: run_op(),
                container: None,
            }],
            failed: Some(FailedOperation {
                operation: run_op(),
                reason: "exited".into(),
                container: None,
                logs: vec![],
                stop_error: None,
            }),
            unexecuted: vec![run_op()],
            compensation: None,
        };
        let encoded = serde_json::to_string(&SecretValue::new(VALUE.to_vec())).unwrap();
        let encoded = encoded.trim_matches('"');
        // The plan itself carries the value, for the daemon.
        assert!(serde_json::to_string(&preview).unwrap().contains(encoded));
        let text = serde_json::to_string(&DeployReport::new(&preview, Some(&outcome))).unwrap();
        assert!(!text.contains(encoded), "{text}");
        assert!(!text.contains("s3cret"), "{text}");
        assert!(!text.contains("\"value\""), "{text}");
        let digest = SecretValue::new(VALUE.to_vec()).digest();
        assert_eq!(text.matches(&digest).count(), 4, "{text}");
    }

    #[test]
    fn a_plan_from_specs_without_secret_values_is_refused_before_it_runs() {
        assert!(check_secret_values(&plan()).is_ok());
        let mut stripped = plan();
        for op in &mut stripped.services[0].operations {
            strip_secret_values(op);
        }
        let err = check_secret_values(&stripped).unwrap_err().to_string();
        assert!(err.contains("service 'db'"), "{err}");
        assert!(err.contains("the secret 'pw' (/run/secrets/pw)"), "{err}");
        assert!(
            err.contains("deploy the Service from its Compose file"),
            "{err}"
        );
        assert!(err.contains("nothing was changed"), "{err}");
    }
}
