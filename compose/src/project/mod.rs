//! The project: reading and merging the files, interpolation, profiles, top-level volumes and
//! configs, `depends_on` order and Ingress Hostname ownership.
//!
//! - [`files`]: one file from disk to a checked, interpolated tree, and the merge of several;
//! - this module: the merged project's top level, profiles, and each included service handed
//!   to [`crate::service`];
//! - [`volumes`], [`configs`], [`secrets`]: the top-level `volumes:`, `configs:` and `secrets:`;
//! - [`order`]: `depends_on` checked across the project, and the dependency order.

mod configs;
mod extends;
mod files;
mod order;
mod secrets;
mod volumes;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use ployz_core::{PathMatch, ServiceName, ServiceSpec, VolumeSpec};

use crate::service::{self, Converted, ServiceCtx};
use crate::yaml::Node;
use crate::{ComposeError, ComposeErrors, ComposeInput, Diagnostics, LoadedProject};

use files::{merge_value, project_vars, read_file, record_origins, report_tags};

/// Which file each part of the merged project came from (indexes into the file list).
#[derive(Debug, Default)]
pub(crate) struct Origins {
    top: BTreeMap<String, usize>,
    sections: BTreeMap<(String, String), usize>,
    service_keys: BTreeMap<(String, String), usize>,
}

impl Origins {
    /// The file of a service's key: the last file that set it, else the last file that named
    /// the service.
    pub(crate) fn service_file(&self, service: &str, key: &str) -> usize {
        self.service_keys
            .get(&(service.to_owned(), key.to_owned()))
            .copied()
            .unwrap_or_else(|| self.section_file("services", service))
    }

    /// The file of a section's entry (`services.web`): the last file that named it, else the
    /// last file that set the section.
    pub(crate) fn section_file(&self, section: &str, name: &str) -> usize {
        self.sections
            .get(&(section.to_owned(), name.to_owned()))
            .or_else(|| self.top.get(section))
            .copied()
            .unwrap_or(0)
    }
}

/// A top-level named volume, converted.
#[derive(Debug, Clone)]
pub(crate) struct VolumeDecl {
    pub spec: VolumeSpec,
    /// Warnings to show if a Service uses it: (key, message).
    pub warnings: Vec<(String, String)>,
    pub file: String,
}

/// Loads a project: every file read and merged, then every included service converted. The
/// project holds the services that converted (none when the files could not be read or the
/// project as a whole could not be converted), with every error and warning found.
pub(crate) fn load_partial(input: &ComposeInput) -> (LoadedProject, Vec<ComposeError>) {
    let mut d = Diagnostics::default();
    let empty = |mut d: Diagnostics, profiles: Vec<String>, left_out| {
        (
            LoadedProject {
                services: Vec::new(),
                volumes: Vec::new(),
                builds: Vec::new(),
                warnings: std::mem::take(&mut d.warnings),
                profiles,
                left_out,
            },
            d.into_errors(),
        )
    };
    let Some(first) = input.files.first() else {
        d.errors.push(ComposeError {
            file: "compose.yaml".into(),
            service: None,
            key: None,
            value: None,
            message: "no Compose file was given".into(),
            fix: Some("pass one with -f, e.g. -f compose.yaml".into()),
        });
        return empty(d, input.profiles.clone(), BTreeMap::new());
    };
    let dir: PathBuf = match first.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let vars = project_vars(&dir, &input.env, &mut d);
    let files: Vec<String> = input
        .files
        .iter()
        .map(|f| f.display().to_string())
        .collect();

    // Read, parse and interpolate each file on its own.
    let mut docs = Vec::new();
    let mut fatal = false;
    for (idx, path) in input.files.iter().enumerate() {
        match read_file(path, &files[idx], &vars, &mut d) {
            Some(mut doc) => {
                extends::resolve(&mut doc, path, &files[idx], &vars, &mut d);
                docs.push((idx, doc))
            }
            None => fatal = true,
        }
    }
    if fatal {
        return empty(d, input.profiles.clone(), BTreeMap::new());
    }

    // Merge in order.
    let mut root = Node::Map(Vec::new());
    let mut origins = Origins::default();
    for (idx, doc) in docs {
        record_origins(&doc, idx, &mut origins);
        merge_value(&mut root, doc);
    }
    report_tags(&mut root, &mut Vec::new(), &files, &origins, &mut d);

    let profiles = profiles_in_effect(input, &vars);
    let project = Project {
        root: &root,
        files: &files,
        origins: &origins,
        dir: &dir,
        vars: &vars,
        profiles: &profiles,
    };
    let mut left_out = BTreeMap::new();
    let converted = project.convert(input, &mut left_out, &mut d);
    let Some((services, volumes, builds)) = converted else {
        if d.errors.is_empty() {
            // Every path that gives up records why; this one keeps a refusal from being silent.
            d.errors.push(ComposeError {
                file: files.first().cloned().unwrap_or_default(),
                service: None,
                key: None,
                value: None,
                message: "the project could not be converted".into(),
                fix: None,
            });
        }
        return empty(d, profiles, left_out);
    };
    (
        LoadedProject {
            services,
            volumes,
            builds,
            warnings: std::mem::take(&mut d.warnings),
            profiles,
            left_out,
        },
        d.into_errors(),
    )
}

/// A variable of the project's `.env`, or of `env` (which wins), without interpolating anything.
pub(crate) fn setting(dir: &Path, name: &str, env: &BTreeMap<String, String>) -> Option<String> {
    project_vars(dir, env, &mut Diagnostics::default()).remove(name)
}

/// Loads a project: either every included service converts, or every error found is returned.
pub(crate) fn load(input: &ComposeInput) -> Result<LoadedProject, ComposeErrors> {
    let (project, errors) = load_partial(input);
    if errors.is_empty() {
        Ok(project)
    } else {
        Err(ComposeErrors(errors))
    }
}

/// A project converted: the specs in dependency order, the Docker Volumes they use, and how
/// the Services with `build:` are built.
type ConvertedProject = (
    Vec<ServiceSpec>,
    Vec<VolumeSpec>,
    Vec<(ServiceName, crate::service::build::BuildSpec)>,
);

/// The merged project, with what converting it needs.
struct Project<'a> {
    root: &'a Node,
    files: &'a [String],
    origins: &'a Origins,
    dir: &'a Path,
    vars: &'a BTreeMap<String, String>,
    /// The profiles in effect (see [`profiles_in_effect`]).
    profiles: &'a [String],
}

/// The profiles in effect: `-p`'s, else those `COMPOSE_PROFILES` lists (comma-separated), from
/// the environment or the project's `.env`, as Compose reads it.
fn profiles_in_effect(input: &ComposeInput, vars: &BTreeMap<String, String>) -> Vec<String> {
    if !input.profiles.is_empty() {
        return input.profiles.clone();
    }
    vars.get("COMPOSE_PROFILES")
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// Refuses a Service Name whose Service DNS Label an earlier service of the project already has
/// (`my_app` after `my-app`, `Web` after `web`): their DNS names would merge. Profiles do not
/// matter, since the two may be deployed together later. `labels` maps each label seen to the
/// name that brought it; whether `name` was accepted.
fn check_dns_label(
    name: &ServiceName,
    labels: &mut BTreeMap<String, ServiceName>,
    file: &str,
    d: &mut Diagnostics,
) -> bool {
    let label = name.dns_label();
    match labels.get(&label) {
        Some(first) => {
            d.error(
                file,
                Some(name.as_str()),
                None,
                None,
                format!(
                    "has the DNS name {label}.internal, which service '{first}' already has \
                     (for DNS a Service Name is lowercased and '_' and '.' become '-')"
                ),
                Some(format!("rename one of them ('{name}' or '{first}')")),
            );
            false
        }
        None => {
            labels.insert(label, name.clone());
            true
        }
    }
}

/// The services the profiles include, and what is known of the others.
struct Selection<'n> {
    /// Included services with a valid name, in file order.
    enabled: Vec<(ServiceName, &'n Node)>,
    /// Services left out by their profiles, with those profiles.
    disabled: BTreeMap<String, Vec<String>>,
    /// Every service name in the project.
    all_names: BTreeSet<String>,
}

/// The included services converted, with their kept dependencies and the volumes they use.
#[derive(Default)]
struct ConvertedServices {
    converted: Vec<Converted>,
    deps: BTreeMap<String, Vec<String>>,
    used_volumes: BTreeSet<String>,
}

impl Project<'_> {
    /// The file that last set a top-level key.
    fn top_file(&self, key: &str) -> &str {
        let idx = self.origins.top.get(key).copied().unwrap_or(0);
        self.files.get(idx).map(String::as_str).unwrap_or("")
    }

    /// The file that last named a section's entry.
    fn section_file(&self, section: &str, name: &str) -> &str {
        let idx = self.origins.section_file(section, name);
        self.files.get(idx).map(String::as_str).unwrap_or("")
    }

    /// The specs of the included services in dependency order, and the Docker Volumes they
    /// use. `None` when the project cannot be converted (errors are recorded).
    fn convert(
        &self,
        input: &ComposeInput,
        left_out: &mut BTreeMap<String, Vec<String>>,
        d: &mut Diagnostics,
    ) -> Option<ConvertedProject> {
        let Node::Map(top) = self.root else {
            return None;
        };
        for (k, v) in top {
            self.top_level_key(k, v, d);
        }
        let volumes = self.volumes(d);
        self.check_secrets(d);
        let services = self.services(d)?;
        let selection = self.select(services, left_out, d)?;
        let home = input.env.get("HOME").map(String::as_str);
        let done = self.convert_services(&selection, &volumes, home, d);
        volumes::used_volume_warnings(&done.used_volumes, &volumes, d);
        self.check_hostnames(&done.converted, d);
        self.check_ingress_ports(&done.converted, d);
        let order = self.dependency_order(&done.deps, d)?;
        let builds = done
            .converted
            .iter()
            .filter_map(|c| Some((c.spec.name.clone(), c.build.clone()?)))
            .collect();
        let specs = order::in_order(done.converted, &done.deps, order);
        let volumes = volumes::used_volumes(&done.used_volumes, &volumes, d);
        Some((specs, volumes, builds))
    }

    /// The `services:` entries; a project needs at least one.
    fn services(&self, d: &mut Diagnostics) -> Option<&[(String, Node)]> {
        match self.root.get("services") {
            Some(Node::Map(entries)) if !entries.is_empty() => Some(entries.as_slice()),
            Some(Node::Map(_)) | Some(Node::Null) | None => {
                d.error(
                    self.files.first().map(String::as_str).unwrap_or(""),
                    None,
                    Some("services"),
                    None,
                    "the project has no services",
                    Some("add services: with at least one service".into()),
                );
                None
            }
            Some(other) => {
                d.error(
                    self.top_file("services"),
                    None,
                    Some("services"),
                    Some(other.short()),
                    format!("expected a mapping of services, found {}", other.kind()),
                    None,
                );
                None
            }
        }
    }

    /// Names and profiles of every service: which ones the profiles include. `None` when none
    /// is included because of the profiles.
    fn select<'n>(
        &self,
        services: &'n [(String, Node)],
        left_out: &mut BTreeMap<String, Vec<String>>,
        d: &mut Diagnostics,
    ) -> Option<Selection<'n>> {
        let mut s = Selection {
            enabled: Vec::new(),
            disabled: BTreeMap::new(),
            all_names: BTreeSet::new(),
        };
        let mut labels = BTreeMap::new();
        for (name, node) in services {
            s.all_names.insert(name.clone());
            let file = self.section_file("services", name);
            let profiles = match node.get("profiles") {
                None | Some(Node::Null) => Vec::new(),
                Some(Node::Seq(items)) => items.iter().filter_map(Node::scalar_text).collect(),
                Some(other) => {
                    d.error(
                        file,
                        Some(name),
                        Some("profiles"),
                        Some(other.short()),
                        format!("expected a list of profile names, found {}", other.kind()),
                        None,
                    );
                    continue;
                }
            };
            let parsed = match name.parse::<ServiceName>() {
                Ok(n) if check_dns_label(&n, &mut labels, file, d) => Some(n),
                Ok(_) => None,
                Err(e) => {
                    d.error(file, Some(name), None, None, e.to_string(), None);
                    None
                }
            };
            let on = profiles.is_empty()
                || self
                    .profiles
                    .iter()
                    .any(|p| p == "*" || profiles.contains(p));
            if !on {
                s.disabled.insert(name.clone(), profiles);
                continue;
            }
            if let Some(n) = parsed {
                s.enabled.push((n, node));
            }
        }
        left_out.clone_from(&s.disabled);
        if s.enabled.is_empty() && !s.disabled.is_empty() && d.errors.is_empty() {
            self.all_profiles_off(&s.disabled, d);
            return None;
        }
        Some(s)
    }

    /// The error for a project whose every service is in a profile that is not enabled.
    fn all_profiles_off(&self, disabled: &BTreeMap<String, Vec<String>>, d: &mut Diagnostics) {
        let profiles: BTreeSet<&String> = disabled.values().flatten().collect();
        d.error(
            self.top_file("services"),
            None,
            Some("profiles"),
            None,
            "every service is in a profile that is not enabled",
            Some(format!(
                "enable one with -p (profiles: {})",
                profiles.into_iter().cloned().collect::<Vec<_>>().join(", ")
            )),
        );
    }

    /// Converts each included service, with its dependencies and configs.
    fn convert_services(
        &self,
        s: &Selection<'_>,
        volumes: &BTreeMap<String, VolumeDecl>,
        home: Option<&str>,
        d: &mut Diagnostics,
    ) -> ConvertedServices {
        let mut out = ConvertedServices::default();
        for (name, node) in &s.enabled {
            let mut ctx = ServiceCtx {
                name,
                files: self.files,
                origins: self.origins,
                d,
                dir: self.dir,
                vars: self.vars,
                volumes,
                home,
            };
            let dep_list = match node.get("depends_on") {
                Some(n) => service::depends_on(&mut ctx, n),
                None => Vec::new(),
            };
            let kept = self.check_deps(&mut ctx, dep_list, &s.all_names, &s.disabled);
            out.deps.insert(name.to_string(), kept);
            if let Some(mut c) = service::convert(&mut ctx, node) {
                self.resolve_configs(&mut ctx, &mut c);
                self.resolve_secrets(&mut ctx, &mut c);
                self.resolve_route_users(&mut ctx, &mut c);
                out.used_volumes.extend(c.volume_keys.iter().cloned());
                out.converted.push(c);
            }
        }
        out
    }

    /// A top-level key other than the sections the project reads: `x-volumes` is ignored with
    /// a warning; the rest is as the key table says (`include` refused, `version` warned, ...).
    fn top_level_key(&self, k: &str, v: &Node, d: &mut Diagnostics) {
        let file = self.top_file(k);
        match k {
            "services" | "volumes" | "configs" | "secrets" => {}
            "x-volumes" => d.warn(
                file,
                None,
                k,
                "Provisioned Volumes (x-volumes) are not supported yet and are ignored; the volumes are plain Docker Volumes",
            ),
            _ => service::keys::top_level_key(d, file, k, v),
        }
    }

    /// An Ingress Port is held on every Machine's edge: two Services publishing the same port
    /// and protocol, as Ingress Ports or one of them as a fixed host port, is an error naming
    /// both.
    fn check_ingress_ports(&self, converted: &[Converted], d: &mut Diagnostics) {
        let mut holders: BTreeMap<(u16, ployz_core::HostProtocol), BTreeSet<String>> =
            BTreeMap::new();
        let mut ingress: BTreeSet<(u16, ployz_core::HostProtocol)> = BTreeSet::new();
        for c in converted {
            for (port, _, proto) in c.spec.ingress_ports() {
                ingress.insert((port, proto));
                holders
                    .entry((port, proto))
                    .or_default()
                    .insert(c.spec.name.to_string());
            }
            for (port, proto) in c.spec.host_ports() {
                holders
                    .entry((port, proto))
                    .or_default()
                    .insert(c.spec.name.to_string());
            }
        }
        for ((port, proto), services) in holders {
            if services.len() < 2 || !ingress.contains(&(port, proto)) {
                continue;
            }
            let names: Vec<String> = services.iter().map(|s| format!("'{s}'")).collect();
            let first = services.iter().next().cloned().unwrap_or_default();
            let idx = self.origins.service_file(&first, "x-ports");
            d.error(
                self.files.get(idx).map(String::as_str).unwrap_or(""),
                None,
                Some("x-ports"),
                Some(format!("{port}/{proto}")),
                format!(
                    "port {port}/{proto} is taken by services {}, and an Ingress Port is held on every Machine's edge",
                    names.join(" and ")
                ),
                Some("give one of them another port ('OTHER:CONTAINER_PORT/tcp' publishes the container's port as OTHER)".into()),
            );
        }
    }

    /// A path of an Ingress Hostname belongs to one Service: several Services may share a
    /// hostname when their paths (`x-routes`) differ, and two taking the same path of it is an
    /// error naming both.
    fn check_hostnames(&self, converted: &[Converted], d: &mut Diagnostics) {
        let mut owners: BTreeMap<(String, PathMatch), BTreeSet<String>> = BTreeMap::new();
        for c in converted {
            for served in c.spec.served_paths() {
                owners
                    .entry((served.hostname.to_owned(), served.path))
                    .or_default()
                    .insert(c.spec.name.to_string());
            }
        }
        for ((host, path), services) in owners {
            if services.len() < 2 {
                continue;
            }
            let names: Vec<String> = services.iter().map(|s| format!("'{s}'")).collect();
            let first = services.iter().next().cloned().unwrap_or_default();
            let key = if path.is_root() {
                "x-ports"
            } else {
                "x-routes"
            };
            let idx = self.origins.service_file(&first, key);
            let (message, fix) = if path.is_root() {
                (
                    format!(
                        "the Ingress Hostname '{host}' is claimed by services {}",
                        names.join(" and ")
                    ),
                    "a hostname served whole belongs to one Service; keep it on one of them, or give each its paths with x-routes",
                )
            } else {
                (
                    format!(
                        "the path {path} of '{host}' is routed by services {}",
                        names.join(" and ")
                    ),
                    "a path of a hostname belongs to one Service; give one of them another path in x-routes",
                )
            };
            d.error(
                self.files.get(idx).map(String::as_str).unwrap_or(""),
                None,
                Some(key),
                Some(if path.is_root() {
                    host.clone()
                } else {
                    format!("{host}{}", path.path())
                }),
                message,
                Some(fix.into()),
            );
        }
    }
}
