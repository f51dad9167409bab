//! The project: reading and merging the files, interpolation, profiles, top-level volumes and
//! configs, `depends_on` order and Ingress Hostname ownership.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use ployz_core::{ConfigFile, PortSpec, ServiceName, ServiceSpec, VolumeSpec};

use super::interp::{interpolate, parse_env_file, shown_key};
use super::service::{self, boolean, kv_entries, suggest, text, Converted, Dep, ServiceCtx};
use super::yaml::{self, join_path, Node};
use super::{ComposeError, ComposeErrors, ComposeInput, Diagnostics, LoadedProject};

/// Top-level keys of a Compose file.
const TOP_LEVEL_KEYS: &[&str] = &[
    "version", "name", "services", "volumes", "configs", "secrets", "networks", "include",
];

/// Sections whose entries are named, for provenance.
const SECTIONS: &[&str] = &["services", "volumes", "configs", "secrets", "networks"];

/// Keys whose list form (`- KEY=VALUE`) is a mapping in disguise; merged key by key.
const KV_KEYS: &[&str] = &["environment", "labels", "sysctls"];

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

pub(crate) fn load(input: &ComposeInput) -> Result<LoadedProject, ComposeErrors> {
    let mut d = Diagnostics::default();
    let Some(first) = input.files.first() else {
        return Err(ComposeError {
            file: "compose.yaml".into(),
            service: None,
            key: None,
            value: None,
            message: "no Compose file was given".into(),
            fix: Some("pass one with -f, e.g. -f compose.yaml".into()),
        }
        .into());
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
            Some(doc) => docs.push((idx, doc)),
            None => fatal = true,
        }
    }
    if fatal {
        return Err(ComposeErrors(d.errors));
    }

    // Merge in order.
    let mut root = Node::Map(Vec::new());
    let mut origins = Origins::default();
    for (idx, doc) in docs {
        record_origins(&doc, idx, &mut origins);
        merge_value(&mut root, doc);
    }
    report_tags(&mut root, &mut Vec::new(), &files, &origins, &mut d);

    let project = Project {
        root: &root,
        files: &files,
        origins: &origins,
        dir: &dir,
        vars: &vars,
    };
    let result = project.convert(input, &mut d);
    if !d.errors.is_empty() {
        return Err(ComposeErrors(d.errors));
    }
    let (services, volumes) = result.ok_or_else(|| ComposeErrors(d.errors.clone()))?;
    Ok(LoadedProject {
        services,
        volumes,
        warnings: d.warnings,
    })
}

/// The variables for interpolation: the project's `.env`, overridden by the process environment.
fn project_vars(
    dir: &Path,
    env: &BTreeMap<String, String>,
    d: &mut Diagnostics,
) -> BTreeMap<String, String> {
    let mut vars = BTreeMap::new();
    let path = dir.join(".env");
    let name = path.display().to_string();
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let lookup = |n: &str| env.get(n).cloned();
            // Messages name the file and line, never a value: `.env` files hold secrets.
            match parse_env_file(&text, &lookup) {
                Ok(parsed) => {
                    for u in &parsed.unset {
                        d.warn(
                            &format!("{name}:{}", u.line),
                            None,
                            "",
                            format!(
                                "the value of {} refers to a variable that is not set; it becomes empty there (quote the value with '...' if its '$' is literal)",
                                shown_key(u.key.as_deref())
                            ),
                        );
                    }
                    for line in parsed.lines {
                        if let (k, Some(v)) = line.entry {
                            vars.insert(k, v);
                        }
                    }
                }
                Err(e) => d.error(
                    &format!("{name}:{}", e.line),
                    None,
                    None,
                    None,
                    e.message,
                    e.fix,
                ),
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => d.error(
            &name,
            None,
            None,
            None,
            format!("cannot read it: {e}"),
            None,
        ),
    }
    for (k, v) in env {
        vars.insert(k.clone(), v.clone());
    }
    vars
}

/// Reads, parses, checks and interpolates one file. `None` when the file cannot be used at all.
fn read_file(
    path: &Path,
    name: &str,
    vars: &BTreeMap<String, String>,
    d: &mut Diagnostics,
) -> Option<Node> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => {
            let message = match e.kind() {
                std::io::ErrorKind::NotFound => "the Compose file does not exist".to_owned(),
                std::io::ErrorKind::InvalidData => "the Compose file is not UTF-8 text".to_owned(),
                _ => format!("cannot read the Compose file: {e}"),
            };
            d.error(
                name,
                None,
                None,
                None,
                message,
                Some("check the path given with -f".into()),
            );
            return None;
        }
    };
    let mut node = match yaml::parse(&text) {
        Ok(n) => n,
        Err(m) => {
            d.error(name, None, None, None, format!("not valid YAML: {m}"), None);
            return None;
        }
    };
    match &node {
        Node::Map(_) => {}
        Node::Null => {
            d.error(
                name,
                None,
                None,
                None,
                "the file is empty",
                Some("a Compose file needs at least services:".into()),
            );
            return None;
        }
        other => {
            d.error(
                name,
                None,
                None,
                Some(other.short()),
                format!(
                    "the top level must be a mapping (services:, volumes:, ...), found {}",
                    other.kind()
                ),
                None,
            );
            return None;
        }
    }

    let mut dups = Vec::new();
    yaml::remove_duplicates(&mut node, &mut Vec::new(), &mut dups);
    for dup in dups {
        let (service, key) = locate(&dup.path);
        let (message, fix) = match (dup.path.as_slice(), service) {
            ([only], _) if only == "services" => (
                format!("duplicate service '{}'", dup.key),
                "a service name appears once per file; merge the two definitions".to_owned(),
            ),
            ([], _) => (
                format!("duplicate top-level key '{}'", dup.key),
                "keep one of them".to_owned(),
            ),
            _ => (
                format!("duplicate key '{}'", dup.key),
                "keep one of them".to_owned(),
            ),
        };
        let (svc, key) = if dup.path.len() == 1 && dup.path[0] == "services" {
            (Some(dup.key.as_str()), None)
        } else if key.is_empty() {
            (service, Some(dup.key.clone()))
        } else {
            (service, Some(format!("{key}.{}", dup.key)))
        };
        d.error(name, svc, key.as_deref(), None, message, Some(fix));
    }

    let mut merge_errs = Vec::new();
    yaml::apply_merges(&mut node, &mut Vec::new(), &mut merge_errs);
    for (path, message) in merge_errs {
        let (service, key) = locate(&path);
        d.error(
            name,
            service,
            (!key.is_empty()).then_some(key.as_str()),
            None,
            message,
            None,
        );
    }

    let lookup = |n: &str| vars.get(n).cloned();
    interpolate_node(&mut node, &mut Vec::new(), name, &lookup, d);
    normalise_kv(&mut node);
    Some(node)
}

/// Splits a path into the service it is under (if any) and the key text shown in messages.
fn locate(path: &[String]) -> (Option<&str>, String) {
    match path {
        [s, name, rest @ ..] if s == "services" => (Some(name.as_str()), join_path(rest)),
        _ => (None, join_path(path)),
    }
}

fn interpolate_node(
    node: &mut Node,
    path: &mut Vec<String>,
    file: &str,
    lookup: &dyn Fn(&str) -> Option<String>,
    d: &mut Diagnostics,
) {
    match node {
        Node::Str(s) => match interpolate(s, lookup) {
            Ok(e) => {
                let (service, key) = locate(path);
                for u in &e.undefined {
                    d.warn(
                        file,
                        service,
                        &key,
                        format!("variable '{u}' is not set; it becomes an empty string"),
                    );
                }
                *s = e.text;
            }
            Err(e) => {
                let (service, key) = locate(path);
                d.error(
                    file,
                    service,
                    (!key.is_empty()).then_some(key.as_str()),
                    Some(s.clone()),
                    e.message,
                    e.fix,
                );
            }
        },
        Node::Seq(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                path.push(format!("[{i}]"));
                interpolate_node(item, path, file, lookup, d);
                path.pop();
            }
        }
        Node::Map(entries) => {
            for (k, v) in entries.iter_mut() {
                path.push(k.clone());
                interpolate_node(v, path, file, lookup, d);
                path.pop();
            }
        }
        Node::Tagged(_, inner) => interpolate_node(inner, path, file, lookup, d),
        _ => {}
    }
}

/// Turns `environment`/`labels`/`sysctls` lists into mappings so files merge key by key.
fn normalise_kv(root: &mut Node) {
    let Node::Map(top) = root else { return };
    for (section, services) in top.iter_mut() {
        if section != "services" {
            continue;
        }
        let Node::Map(services) = services else {
            continue;
        };
        for (_, svc) in services.iter_mut() {
            let Node::Map(keys) = svc else { continue };
            for (k, v) in keys.iter_mut() {
                if !KV_KEYS.contains(&k.as_str()) {
                    continue;
                }
                if let Node::Seq(_) = v {
                    if let Ok(entries) = kv_entries(v) {
                        let mut map: Vec<(String, Node)> = Vec::new();
                        for (key, value) in entries {
                            let value = value.map(Node::Str).unwrap_or(Node::Null);
                            match map.iter_mut().find(|(k, _)| *k == key) {
                                Some(slot) => slot.1 = value,
                                None => map.push((key, value)),
                            }
                        }
                        *v = Node::Map(map);
                    }
                }
            }
        }
    }
}

fn record_origins(doc: &Node, idx: usize, origins: &mut Origins) {
    let Node::Map(top) = doc else { return };
    for (k, v) in top {
        origins.top.insert(k.clone(), idx);
        if !SECTIONS.contains(&k.as_str()) {
            continue;
        }
        if let Node::Map(entries) = v {
            for (name, body) in entries {
                origins.sections.insert((k.clone(), name.clone()), idx);
                if k == "services" {
                    if let Node::Map(keys) = body {
                        for (key, _) in keys {
                            origins
                                .service_keys
                                .insert((name.clone(), key.clone()), idx);
                        }
                    }
                }
            }
        }
    }
}

/// Merges `over` into `base`: mappings key by key (recursively), anything else replaced.
/// `!reset` removes a key, `!override` replaces it without merging.
fn merge_value(base: &mut Node, over: Node) {
    match (base, over) {
        (Node::Map(b), Node::Map(o)) => {
            for (k, v) in o {
                match v {
                    Node::Tagged(tag, _) if tag == "reset" => b.retain(|(key, _)| *key != k),
                    Node::Tagged(tag, inner) if tag == "override" => {
                        let inner = clean(*inner);
                        match b.iter_mut().find(|(key, _)| *key == k) {
                            Some(slot) => slot.1 = inner,
                            None => b.push((k, inner)),
                        }
                    }
                    v => match b.iter_mut().find(|(key, _)| *key == k) {
                        Some(slot) => merge_value(&mut slot.1, v),
                        None => b.push((k, clean(v))),
                    },
                }
            }
        }
        (b, o) => *b = clean(o),
    }
}

/// Applies `!reset` / `!override` inside a value that is not merged into anything.
fn clean(node: Node) -> Node {
    match node {
        Node::Map(entries) => Node::Map(
            entries
                .into_iter()
                .filter_map(|(k, v)| match v {
                    Node::Tagged(tag, _) if tag == "reset" => None,
                    v => Some((k, clean(v))),
                })
                .collect(),
        ),
        Node::Seq(items) => Node::Seq(items.into_iter().map(clean).collect()),
        Node::Tagged(tag, inner) if tag == "override" => clean(*inner),
        other => other,
    }
}

/// Reports every tag other than `!reset`/`!override` and unwraps it, so the value is still
/// checked once (and not reported again as "a tagged value").
fn report_tags(
    node: &mut Node,
    path: &mut Vec<String>,
    files: &[String],
    origins: &Origins,
    d: &mut Diagnostics,
) {
    match node {
        Node::Tagged(tag, inner) => {
            let (service, key) = locate(path);
            let file = match (service, path.first()) {
                (Some(s), _) => {
                    origins.service_file(s, path.get(2).map(String::as_str).unwrap_or(""))
                }
                (None, Some(top)) => origins.top.get(top).copied().unwrap_or(0),
                _ => 0,
            };
            d.error(
                files.get(file).map(String::as_str).unwrap_or(""),
                service,
                (!key.is_empty()).then_some(key.as_str()),
                None,
                format!("the YAML tag '!{tag}' is not supported"),
                Some(
                    "Ployz understands !reset and !override in later -f files; remove the tag"
                        .into(),
                ),
            );
            let mut inner = std::mem::replace(inner.as_mut(), Node::Null);
            report_tags(&mut inner, path, files, origins, d);
            *node = inner;
        }
        Node::Seq(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                path.push(format!("[{i}]"));
                report_tags(item, path, files, origins, d);
                path.pop();
            }
        }
        Node::Map(entries) => {
            for (k, v) in entries.iter_mut() {
                path.push(k.clone());
                report_tags(v, path, files, origins, d);
                path.pop();
            }
        }
        _ => {}
    }
}

struct Project<'a> {
    root: &'a Node,
    files: &'a [String],
    origins: &'a Origins,
    dir: &'a Path,
    vars: &'a BTreeMap<String, String>,
}

impl Project<'_> {
    fn top_file(&self, key: &str) -> &str {
        let idx = self.origins.top.get(key).copied().unwrap_or(0);
        self.files.get(idx).map(String::as_str).unwrap_or("")
    }

    fn section_file(&self, section: &str, name: &str) -> &str {
        let idx = self.origins.section_file(section, name);
        self.files.get(idx).map(String::as_str).unwrap_or("")
    }

    fn convert(
        &self,
        input: &ComposeInput,
        d: &mut Diagnostics,
    ) -> Option<(Vec<ServiceSpec>, Vec<VolumeSpec>)> {
        let Node::Map(top) = self.root else {
            return None;
        };
        for (k, v) in top {
            self.top_level_key(k, v, d);
        }
        let volumes = self.volumes(d);
        self.check_secrets(d);

        let services = match self.root.get("services") {
            Some(Node::Map(entries)) if !entries.is_empty() => entries.as_slice(),
            Some(Node::Map(_)) | Some(Node::Null) | None => {
                d.error(
                    self.files.first().map(String::as_str).unwrap_or(""),
                    None,
                    Some("services"),
                    None,
                    "the project has no services",
                    Some("add services: with at least one service".into()),
                );
                return None;
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
                return None;
            }
        };

        // Names and profiles of every service.
        let mut enabled: Vec<(ServiceName, &Node)> = Vec::new();
        let mut disabled: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut all_names: BTreeSet<String> = BTreeSet::new();
        for (name, node) in services {
            all_names.insert(name.clone());
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
                Ok(n) => Some(n),
                Err(e) => {
                    d.error(file, Some(name), None, None, e.to_string(), None);
                    None
                }
            };
            let on = profiles.is_empty()
                || input
                    .profiles
                    .iter()
                    .any(|p| p == "*" || profiles.contains(p));
            if !on {
                disabled.insert(name.clone(), profiles);
                continue;
            }
            if let Some(n) = parsed {
                enabled.push((n, node));
            }
        }
        if enabled.is_empty() && !disabled.is_empty() && d.errors.is_empty() {
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
            return None;
        }

        // Convert each enabled service.
        let mut converted: Vec<Converted> = Vec::new();
        let mut deps: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut used_volumes: BTreeSet<String> = BTreeSet::new();
        for (name, node) in &enabled {
            let mut ctx = ServiceCtx {
                name,
                files: self.files,
                origins: self.origins,
                d,
                dir: self.dir,
                vars: self.vars,
                volumes: &volumes,
            };
            let dep_list = match node.get("depends_on") {
                Some(n) => service::depends_on(&mut ctx, n),
                None => Vec::new(),
            };
            let kept = self.check_deps(&mut ctx, dep_list, &all_names, &disabled);
            deps.insert(name.to_string(), kept);
            if let Some(mut c) = service::convert(&mut ctx, node) {
                self.resolve_configs(&mut ctx, &mut c);
                used_volumes.extend(c.volume_keys.iter().cloned());
                converted.push(c);
            }
        }

        // Volume warnings, for the volumes in use only.
        for key in &used_volumes {
            if let Some(decl) = volumes.get(key) {
                for (k, m) in &decl.warnings {
                    d.warn(&decl.file, None, k, m.clone());
                }
            }
        }

        self.check_hostnames(&converted, d);
        let order = self.dependency_order(&deps, d)?;

        let mut by_name: BTreeMap<String, ServiceSpec> = converted
            .into_iter()
            .map(|c| (c.spec.name.to_string(), c.spec))
            .collect();
        let mut specs = Vec::new();
        for name in order {
            if let Some(mut spec) = by_name.remove(&name) {
                let mut names: Vec<ServiceName> = deps
                    .get(&name)
                    .into_iter()
                    .flatten()
                    .filter_map(|n| n.parse().ok())
                    .collect();
                names.sort();
                names.dedup();
                spec.depends_on = names;
                specs.push(spec);
            }
        }

        let mut out_volumes: BTreeMap<String, VolumeSpec> = BTreeMap::new();
        for key in &used_volumes {
            let Some(decl) = volumes.get(key) else {
                continue;
            };
            match out_volumes.get(&decl.spec.name) {
                Some(existing) if *existing != decl.spec => d.error(
                    &decl.file,
                    None,
                    Some(&format!("volumes.{key}")),
                    Some(decl.spec.name.clone()),
                    "two top-level volumes name the same Docker Volume with different settings",
                    Some("give them different name: values, or the same settings".into()),
                ),
                _ => {
                    out_volumes.insert(decl.spec.name.clone(), decl.spec.clone());
                }
            }
        }
        Some((specs, out_volumes.into_values().collect()))
    }

    fn top_level_key(&self, k: &str, v: &Node, d: &mut Diagnostics) {
        let file = self.top_file(k);
        match k {
            "version" | "name" | "services" | "volumes" | "configs" | "secrets" | "networks" => {}
            "include" => d.error(
                file,
                None,
                Some(k),
                Some(v.short()),
                "include is not supported",
                Some("pass each file with its own -f instead".into()),
            ),
            "x-volumes" => d.warn(
                file,
                None,
                k,
                "Provisioned Volumes (x-volumes) are not supported yet and are ignored; the volumes are plain Docker Volumes",
            ),
            _ if k.starts_with("x-") => {} // x-context and the user's own extensions.
            _ => {
                let hint = match suggest(k, TOP_LEVEL_KEYS.iter().copied()) {
                    Some(s) => format!("; did you mean '{s}'?"),
                    None => String::new(),
                };
                d.warn(file, None, k, format!("unknown top-level key, ignored{hint}"));
            }
        }
    }

    /// Every top-level volume, converted (errors for all, warnings kept for the used ones).
    fn volumes(&self, d: &mut Diagnostics) -> BTreeMap<String, VolumeDecl> {
        let mut out = BTreeMap::new();
        let entries = match self.root.get("volumes") {
            None | Some(Node::Null) => return out,
            Some(Node::Map(e)) => e,
            Some(other) => {
                d.error(
                    self.top_file("volumes"),
                    None,
                    Some("volumes"),
                    Some(other.short()),
                    format!("expected a mapping of volumes, found {}", other.kind()),
                    None,
                );
                return out;
            }
        };
        for (key, node) in entries {
            let file = self.section_file("volumes", key).to_owned();
            out.insert(key.clone(), volume_decl(key, node, &file, d));
        }
        out
    }

    fn check_secrets(&self, d: &mut Diagnostics) {
        let Some(Node::Map(entries)) = self.root.get("secrets") else {
            return;
        };
        for (name, node) in entries {
            if let Some(ext) = node.get("external") {
                let external = match ext {
                    Node::Map(_) => true,
                    other => boolean(other).unwrap_or(false),
                };
                if external {
                    d.error(
                        self.section_file("secrets", name),
                        None,
                        Some(&format!("secrets.{name}.external")),
                        Some("true".into()),
                        "external secrets are not supported",
                        Some(
                            "give the secret a file:, or pass its value through the environment"
                                .into(),
                        ),
                    );
                }
            }
        }
    }

    fn check_deps(
        &self,
        ctx: &mut ServiceCtx<'_>,
        deps: Vec<Dep>,
        all: &BTreeSet<String>,
        disabled: &BTreeMap<String, Vec<String>>,
    ) -> Vec<String> {
        let mut kept = Vec::new();
        for dep in deps {
            if dep.name == ctx.name.as_str() {
                ctx.err(
                    &dep.key,
                    Some(dep.name.clone()),
                    "a service cannot depend on itself",
                    Some("remove it from depends_on"),
                );
                continue;
            }
            if !all.contains(&dep.name) {
                if dep.required {
                    ctx.err(
                        &dep.key,
                        Some(dep.name.clone()),
                        format!(
                            "depends on '{}', which is not a service of this project",
                            dep.name
                        ),
                        Some("fix the name, or add the service"),
                    );
                } else {
                    ctx.warn(&dep.key, format!("'{}' is not a service of this project; the optional dependency is ignored", dep.name));
                }
                continue;
            }
            if let Some(profiles) = disabled.get(&dep.name) {
                if dep.required {
                    ctx.err(
                        &dep.key,
                        Some(dep.name.clone()),
                        format!(
                            "depends on '{}', which is in a profile that is not enabled",
                            dep.name
                        ),
                        Some(&format!("enable it with -p {}", profiles.join(" or -p "))),
                    );
                }
                continue;
            }
            kept.push(dep.name);
        }
        kept
    }

    /// Turns the service's config uses into files, reading `file:` configs now.
    fn resolve_configs(&self, ctx: &mut ServiceCtx<'_>, c: &mut Converted) {
        let top = self.root.get("configs");
        let mut files: Vec<ConfigFile> = Vec::new();
        for u in std::mem::take(&mut c.configs) {
            let Some(decl) = top.and_then(|t| t.get(&u.source)) else {
                ctx.err(
                    &format!("{}.source", u.key),
                    Some(u.source.clone()),
                    format!(
                        "the config '{}' is not declared in the top-level configs:",
                        u.source
                    ),
                    Some(&format!(
                        "add it at the top level: configs: {{ {}: {{ file: ./{} }} }}",
                        u.source, u.source
                    )),
                );
                continue;
            };
            let decl_file = self.section_file("configs", &u.source).to_owned();
            let Some(content) = self.config_content(&u.source, decl, &decl_file, ctx.d) else {
                continue;
            };
            files.push(ConfigFile {
                name: u.source,
                target: u.target,
                content,
                mode: u.mode,
                uid: u.uid,
                gid: u.gid,
            });
        }
        files.sort_by(|a, b| a.target.cmp(&b.target));
        for pair in files.windows(2) {
            if pair[0].target == pair[1].target {
                ctx.err(
                    "configs",
                    Some(pair[1].target.clone()),
                    format!(
                        "the configs '{}' and '{}' share one target",
                        pair[0].name, pair[1].name
                    ),
                    Some("give each config its own target"),
                );
            }
        }
        c.spec.container.configs = files;
    }

    fn config_content(
        &self,
        name: &str,
        decl: &Node,
        file: &str,
        d: &mut Diagnostics,
    ) -> Option<String> {
        let key = format!("configs.{name}");
        if !matches!(decl, Node::Map(_)) {
            d.error(
                file,
                None,
                Some(&key),
                Some(decl.short()),
                "a config needs file: or content:",
                Some("e.g. configs: { app: { file: ./app.conf } }".into()),
            );
            return None;
        }
        if let Node::Map(entries) = decl {
            for (k, _) in entries {
                match k.as_str() {
                    "file" | "content" | "environment" | "external" | "name" => {}
                    "template_driver" => d.warn(
                        file,
                        None,
                        &format!("{key}.{k}"),
                        "is not supported and is ignored",
                    ),
                    _ if k.starts_with("x-") => {}
                    _ => d.warn(file, None, &format!("{key}.{k}"), "unknown key, ignored"),
                }
            }
        }
        if let Some(ext) = decl.get("external") {
            if matches!(ext, Node::Map(_)) || boolean(ext).unwrap_or(false) {
                d.error(
                    file,
                    None,
                    Some(&format!("{key}.external")),
                    Some("true".into()),
                    "external configs are not supported",
                    Some("give the config a file: or content:".into()),
                );
                return None;
            }
        }
        let sources: Vec<&str> = ["file", "content", "environment"]
            .into_iter()
            .filter(|k| decl.get(k).is_some())
            .collect();
        if sources.len() != 1 {
            d.error(
                file,
                None,
                Some(&key),
                None,
                if sources.is_empty() {
                    "a config needs file:, content: or environment:".to_owned()
                } else {
                    format!(
                        "a config takes one of file:, content: and environment:, not {}",
                        sources.join(" and ")
                    )
                },
                None,
            );
            return None;
        }
        let kind = sources[0];
        let value = decl.get(kind)?;
        let Ok(v) = text(value) else {
            d.error(
                file,
                None,
                Some(&format!("{key}.{kind}")),
                Some(value.short()),
                "expected text",
                None,
            );
            return None;
        };
        match kind {
            "content" => Some(v),
            "environment" => match self.vars.get(&v) {
                Some(content) => Some(content.clone()),
                None => {
                    d.error(
                        file,
                        None,
                        Some(&format!("{key}.environment")),
                        Some(v.clone()),
                        format!("the variable '{v}' is not set"),
                        Some("set it in the environment or in .env".into()),
                    );
                    None
                }
            },
            _ => {
                let path = self.dir.join(&v);
                match std::fs::read(&path) {
                    Ok(bytes) => match String::from_utf8(bytes) {
                        Ok(s) => Some(s),
                        Err(_) => {
                            d.error(
                                file,
                                None,
                                Some(&format!("{key}.file")),
                                Some(v),
                                "the config file is not UTF-8 text",
                                Some("configs carry text; ship binary files in the image or a volume".into()),
                            );
                            None
                        }
                    },
                    Err(e) => {
                        let why = if e.kind() == std::io::ErrorKind::NotFound {
                            format!("the config file {} does not exist", path.display())
                        } else {
                            format!("cannot read the config file {}: {e}", path.display())
                        };
                        d.error(
                            file,
                            None,
                            Some(&format!("{key}.file")),
                            Some(v),
                            why,
                            Some(
                                "paths are relative to the project directory (the first -f file's)"
                                    .into(),
                            ),
                        );
                        None
                    }
                }
            }
        }
    }

    fn check_hostnames(&self, converted: &[Converted], d: &mut Diagnostics) {
        let mut owners: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for c in converted {
            for p in &c.spec.ports {
                if let PortSpec::Ingress {
                    hostname: Some(h), ..
                } = p
                {
                    owners
                        .entry(h.clone())
                        .or_default()
                        .insert(c.spec.name.to_string());
                }
            }
        }
        for (host, services) in owners {
            if services.len() < 2 {
                continue;
            }
            let names: Vec<String> = services.iter().map(|s| format!("'{s}'")).collect();
            let first = services.iter().next().cloned().unwrap_or_default();
            let idx = self.origins.service_file(&first, "x-ports");
            d.error(
                self.files.get(idx).map(String::as_str).unwrap_or(""),
                None,
                Some("x-ports"),
                Some(host.clone()),
                format!(
                    "the Ingress Hostname '{host}' is claimed by services {}",
                    names.join(" and ")
                ),
                Some("an Ingress Hostname belongs to one Service; keep it on one of them".into()),
            );
        }
    }

    /// Services in dependency order, ties by name; a cycle is an error naming it.
    fn dependency_order(
        &self,
        deps: &BTreeMap<String, Vec<String>>,
        d: &mut Diagnostics,
    ) -> Option<Vec<String>> {
        let mut remaining: BTreeMap<&str, BTreeSet<&str>> = deps
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str(),
                    v.iter()
                        .map(String::as_str)
                        .filter(|n| deps.contains_key(*n))
                        .collect(),
                )
            })
            .collect();
        let mut order = Vec::new();
        loop {
            let ready: Option<&str> = remaining
                .iter()
                .find(|(_, ds)| ds.is_empty())
                .map(|(k, _)| *k);
            let Some(next) = ready else { break };
            remaining.remove(next);
            for ds in remaining.values_mut() {
                ds.remove(next);
            }
            order.push(next.to_owned());
        }
        if remaining.is_empty() {
            return Some(order);
        }
        // Walk from the smallest name left until a service repeats: that is a cycle.
        let start = *remaining.keys().next()?;
        let mut path = vec![start];
        let mut cur = start;
        let cycle = loop {
            let next = *remaining.get(cur)?.iter().next()?;
            if let Some(pos) = path.iter().position(|n| *n == next) {
                let mut cycle: Vec<&str> = path[pos..].to_vec();
                cycle.push(next);
                break cycle;
            }
            path.push(next);
            cur = next;
        };
        let file = self.section_file("services", cycle[0]);
        let file = self
            .files
            .get(self.origins.service_file(cycle[0], "depends_on"))
            .map(String::as_str)
            .unwrap_or(file);
        d.error(
            file,
            Some(cycle[0]),
            Some("depends_on"),
            None,
            format!("depends_on forms a cycle: {}", cycle.join(" -> ")),
            Some("remove one of these dependencies".into()),
        );
        None
    }
}

/// One top-level volume.
fn volume_decl(key: &str, node: &Node, file: &str, d: &mut Diagnostics) -> VolumeDecl {
    let k = format!("volumes.{key}");
    let mut spec = VolumeSpec {
        name: key.to_owned(),
        driver: None,
        driver_opts: BTreeMap::new(),
        labels: BTreeMap::new(),
        external: false,
    };
    let mut warnings = Vec::new();
    match node {
        Node::Null => {}
        Node::Map(entries) => {
            for (field, v) in entries {
                let fk = format!("{k}.{field}");
                match field.as_str() {
                    "name" => match text(v) {
                        Ok(n) => spec.name = n,
                        Err(m) => d.error(file, None, Some(&fk), Some(v.short()), m, None),
                    },
                    "driver" => match text(v) {
                        Ok(n) => spec.driver = Some(n),
                        Err(m) => d.error(file, None, Some(&fk), Some(v.short()), m, None),
                    },
                    "driver_opts" | "labels" => match kv_entries(v) {
                        Ok(entries) => {
                            let map = entries
                                .into_iter()
                                .map(|(a, b)| (a, b.unwrap_or_default()))
                                .collect();
                            if field == "labels" {
                                spec.labels = map;
                            } else {
                                spec.driver_opts = map;
                            }
                        }
                        Err(m) => d.error(file, None, Some(&fk), Some(v.short()), m, None),
                    },
                    "external" => match v {
                        Node::Map(_) => {
                            spec.external = true;
                            if let Some(n) = v.get("name").and_then(Node::scalar_text) {
                                spec.name = n;
                            }
                        }
                        other => match boolean(other) {
                            Ok(b) => spec.external = b,
                            Err(m) => d.error(file, None, Some(&fk), Some(other.short()), m, None),
                        },
                    },
                    _ if field.starts_with("x-") => {}
                    other => {
                        let hint = match suggest(
                            other,
                            ["name", "driver", "driver_opts", "labels", "external"].into_iter(),
                        ) {
                            Some(s) => format!("; did you mean '{s}'?"),
                            None => String::new(),
                        };
                        warnings.push((fk, format!("unknown key, ignored{hint}")));
                    }
                }
            }
        }
        other => {
            d.error(
                file,
                None,
                Some(&k),
                Some(other.short()),
                format!(
                    "expected a mapping (driver:, name:, ...) or nothing, found {}",
                    other.kind()
                ),
                None,
            );
        }
    }
    if spec.external
        && (spec.driver.is_some() || !spec.driver_opts.is_empty() || !spec.labels.is_empty())
    {
        d.error(
            file,
            None,
            Some(&k),
            None,
            "an external volume cannot set driver, driver_opts or labels: it already exists",
            Some("remove them, or drop external: true to let the Deploy create it".into()),
        );
    }
    if !valid_volume_name(&spec.name) {
        d.error(
            file,
            None,
            Some(&k),
            Some(spec.name.clone()),
            "not a valid Docker Volume name",
            Some("use at least 2 characters of letters, digits, '_', '.' and '-', starting with a letter or digit".into()),
        );
    }
    let o = spec.driver_opts.get("o").cloned().unwrap_or_default();
    if o.contains("bind") {
        if let Some(device) = spec.driver_opts.get("device") {
            warnings.push((
                format!("{k}.driver_opts"),
                format!(
                    "this volume binds the Machine's path '{device}' (driver_opts o: {o}), a Bind Mount in disguise"
                ),
            ));
        }
    }
    // Declared even when broken, so services mounting it get no second "not declared" error.
    VolumeDecl {
        spec,
        warnings,
        file: file.to_owned(),
    }
}

fn valid_volume_name(name: &str) -> bool {
    let mut chars = name.chars();
    name.len() >= 2
        && chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}
