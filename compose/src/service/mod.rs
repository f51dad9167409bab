//! One Compose service to one Requested Service Spec.
//!
//! [`convert`] reads the service's keys in file order, handing each to the module of its group,
//! which fills [`Parts`]; then the groups that depend on more than one key (image and build,
//! environment and env files, mounts, resources, ports, replicas) are settled in [`finish`].
//!
//! - [`image`]: `image`, `build`, `command`, `entrypoint`, `pull_policy`;
//! - [`environment`]: `environment` and `env_file`;
//! - [`ports`]: `ports` and `x-ports`;
//! - [`volumes`]: `volumes` (short and long syntax) and `tmpfs`, and the mount checks;
//! - [`healthcheck`];
//! - [`runtime`]: how the container runs (`user`, `init`, `privileged`, capabilities, `sysctls`,
//!   `ulimits`, `shm_size`, `stop_grace_period`, `devices`, `logging`, `networks`, `restart`);
//! - [`deploy`]: `deploy` (mode, replicas, resources, update order) with `scale`, `cpus`,
//!   `mem_limit` and `mem_reservation`;
//! - [`configs`]: the service's `configs` entries (resolved by the project);
//! - [`secrets`]: the service's `secrets` entries (resolved by the project, like configs);
//! - [`extensions`]: `x-machines`, `x-pre_deploy`, `x-caddy` (`x-ports` is with [`ports`]);
//! - [`depends_on`]: read by the project, which knows every service;
//! - [`keys`]: the key table (kept, translated, warned, refused) and unknown keys;
//! - [`shapes`]: value shapes (text, numbers, durations, sizes, lists, mappings).

pub mod build;
mod configs;
mod depends_on;
mod deploy;
mod environment;
mod extensions;
mod healthcheck;
mod image;
pub(crate) mod keys;
mod ports;
mod routes;
pub(crate) use routes::{PendingUsers, USERS_FIX};
mod runtime;
mod secrets;
mod shapes;
mod volumes;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use ployz_core::{
    ContainerSpec, MachineTarget, PreDeployHook, Resources, ServiceName, ServiceSpec,
};

use crate::project::{Origins, VolumeDecl};
use crate::yaml::Node;
use crate::Diagnostics;

pub(crate) use depends_on::depends_on;
pub(crate) use environment::report_list_duplicates;
pub(crate) use shapes::{boolean, kv_entries, text};

/// A `depends_on` entry.
#[derive(Debug, Clone)]
pub(crate) struct Dep {
    pub name: String,
    pub required: bool,
    /// The key it came from, e.g. `depends_on[1]` or `depends_on.db`.
    pub key: String,
}

/// A service-level `configs` or `secrets` entry, resolved against the top-level `configs:` or
/// `secrets:` by the project.
#[derive(Debug, Clone)]
pub(crate) struct ConfigUse {
    pub key: String,
    pub source: String,
    pub target: String,
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
}

/// A converted Service: its spec (without `depends_on`, which the project fills), and what it
/// uses from the top level.
#[derive(Debug, Clone)]
pub(crate) struct Converted {
    pub spec: ServiceSpec,
    /// Top-level volume keys it mounts.
    pub volume_keys: BTreeSet<String>,
    pub configs: Vec<ConfigUse>,
    pub secrets: Vec<ConfigUse>,
    /// Routes whose basic authentication users list is a top-level secret.
    pub route_users: Vec<PendingUsers>,
    /// How its image is built, when `build:` says.
    pub build: Option<build::BuildSpec>,
}

/// What a service conversion needs from the project.
pub(crate) struct ServiceCtx<'a> {
    pub name: &'a ServiceName,
    pub files: &'a [String],
    pub origins: &'a Origins,
    pub d: &'a mut Diagnostics,
    pub dir: &'a Path,
    pub vars: &'a BTreeMap<String, String>,
    pub volumes: &'a BTreeMap<String, VolumeDecl>,
    /// `HOME` from the loader's environment, for `~` in bind sources.
    pub home: Option<&'a str>,
}

impl ServiceCtx<'_> {
    /// The file a key of this service came from (the last file that set its top-level key).
    pub(crate) fn file(&self, key: &str) -> String {
        let top = key.split(['.', '[']).next().unwrap_or(key);
        let idx = self.origins.service_file(self.name.as_str(), top);
        self.files.get(idx).cloned().unwrap_or_default()
    }

    pub(crate) fn err(
        &mut self,
        key: &str,
        value: Option<String>,
        message: impl Into<String>,
        fix: Option<&str>,
    ) {
        let file = self.file(key);
        let key = (!key.is_empty()).then_some(key);
        self.d.error(
            &file,
            Some(self.name.as_str()),
            key,
            value,
            message,
            fix.map(str::to_owned),
        );
    }

    /// An error about a value of the wrong shape or text; the value is shown.
    fn bad(&mut self, key: &str, node: &Node, message: impl Into<String>) {
        self.err(key, Some(node.short()), message, None);
    }

    pub(crate) fn warn(&mut self, key: &str, message: impl Into<String>) {
        let file = self.file(key);
        self.d.warn(&file, Some(self.name.as_str()), key, message);
    }

    /// Runs a conversion, recording its error against `key` with the value shown.
    fn get<T>(
        &mut self,
        key: &str,
        node: &Node,
        f: impl FnOnce(&Node) -> Result<T, String>,
    ) -> Option<T> {
        match f(node) {
            Ok(v) => Some(v),
            Err(m) => {
                self.bad(key, node, m);
                None
            }
        }
    }
}

/// What the keys of one service said, gathered before the groups that span several keys are
/// settled.
#[derive(Default)]
struct Parts<'n> {
    /// The container settings filled key by key; image, env, mounts and resources come last.
    container: ContainerSpec,
    image: Option<String>,
    /// Whether `build:` is set (and not null), and what it said when it was not refused.
    build_set: bool,
    build: Option<build::BuildSpec>,
    /// `pull_policy: build`.
    pull_policy_build: bool,
    env_file_entries: Vec<environment::EnvFileLine>,
    environment: Vec<(String, Option<String>)>,
    compose_ports: Option<&'n Node>,
    x_ports: Option<&'n Node>,
    /// The mounts, with the key each came from.
    mounts: volumes::Mounts,
    /// Top-level volume keys the service mounts.
    volume_keys: BTreeSet<String>,
    /// `cpus`, `mem_limit`, `mem_reservation`.
    top_resources: Resources,
    /// `deploy.resources`, which wins over the top-level keys.
    deploy_resources: Resources,
    scale: Option<u32>,
    deploy: deploy::DeployParts,
    machines: Vec<MachineTarget>,
    pre_deploy: Option<PreDeployHook>,
    revisions: Option<u32>,
    routes: Vec<routes::RawRoute>,
    configs: Vec<ConfigUse>,
    secrets: Vec<ConfigUse>,
}

/// Converts one service. `None` when it has errors (recorded in the context).
pub(crate) fn convert(ctx: &mut ServiceCtx<'_>, node: &Node) -> Option<Converted> {
    let errors_before = ctx.d.errors.len();
    let entries: &[(String, Node)] = match node {
        Node::Map(e) => e,
        Node::Null => &[],
        other => {
            ctx.err(
                "",
                Some(other.short()),
                format!(
                    "a service must be a mapping (image:, ...), found {}",
                    other.kind()
                ),
                None,
            );
            return None;
        }
    };
    let mut parts = Parts::default();
    for (key, value) in entries {
        read_key(ctx, &mut parts, key, value);
    }
    finish(ctx, parts, errors_before)
}

/// Hands one key of the service to the group that reads it.
fn read_key<'n>(ctx: &mut ServiceCtx<'_>, p: &mut Parts<'n>, k: &str, value: &'n Node) {
    match k {
        "image" | "build" | "command" | "entrypoint" | "pull_policy" => {
            image::read(ctx, p, k, value)
        }
        "environment" => environment::read_environment(ctx, p, value),
        "env_file" => p.env_file_entries = environment::env_files(ctx, value),
        "healthcheck" => p.container.healthcheck = healthcheck::healthcheck(ctx, value),
        "ports" => p.compose_ports = Some(value),
        "x-ports" => p.x_ports = Some(value),
        "volumes" => volumes::service_volumes(ctx, value, &mut p.mounts, &mut p.volume_keys),
        "tmpfs" => volumes::tmpfs_key(ctx, value, &mut p.mounts),
        "user" | "init" | "privileged" | "cap_add" | "cap_drop" | "sysctls" | "ulimits"
        | "shm_size" | "stop_grace_period" | "devices" | "logging" | "networks" | "restart" => {
            runtime::read(ctx, &mut p.container, k, value)
        }
        "cpus" | "mem_limit" | "mem_reservation" | "scale" | "deploy" => {
            deploy::read(ctx, p, k, value)
        }
        "configs" => p.configs = configs::service_configs(ctx, value),
        "secrets" => p.secrets = secrets::service_secrets(ctx, value),
        "x-machines" => p.machines = extensions::x_machines(ctx, value),
        "x-pre_deploy" => p.pre_deploy = extensions::x_pre_deploy(ctx, value),
        "x-revisions" => p.revisions = extensions::x_revisions(ctx, value),
        "x-routes" => p.routes = routes::read(ctx, value),
        "x-caddy" => extensions::x_caddy(ctx),
        // Read by the project, which knows every service.
        "depends_on" | "profiles" => {}
        // Warned and refused keys, and unknown ones, as the key table says.
        _ => keys::table_key(ctx, k, value),
    }
}

/// Settles what spans several keys, in a fixed order (so messages come in a fixed order), and
/// builds the spec. `None` when this service recorded any error.
fn finish(ctx: &mut ServiceCtx<'_>, p: Parts<'_>, errors_before: usize) -> Option<Converted> {
    let mut c = p.container;
    c.image = image::check_image(
        ctx,
        p.image,
        p.build.as_ref(),
        p.build_set,
        p.pull_policy_build,
    );
    c.env = environment::merge(ctx, p.env_file_entries, p.environment);
    (c.mounts, c.secrets) = volumes::settle_mounts(ctx, p.mounts);
    c.resources = deploy::resources(p.top_resources, p.deploy_resources);
    let ports = ports::ports(ctx, p.compose_ports, p.x_ports);
    let (routes, route_users) = routes::settle(ctx, p.routes, &ports);
    let replicas = deploy::replicas(ctx, p.scale, &p.deploy);
    if ctx.d.errors.len() > errors_before {
        return None;
    }
    Some(Converted {
        spec: ServiceSpec {
            name: ctx.name.clone(),
            mode: p.deploy.mode,
            replicas,
            container: c,
            ports,
            machines: p.machines,
            update: p.deploy.update,
            pre_deploy: p.pre_deploy,
            depends_on: Vec::new(),
            revisions: p.revisions,
            routes,
        },
        volume_keys: p.volume_keys,
        configs: p.configs,
        secrets: p.secrets,
        route_users,
        build: p.build,
    })
}
