//! Compose `extends`: a service built on another, of the same file (`extends: base` or
//! `extends: {service: base}`) or of another file (`extends: {file: common.yaml, service:
//! base}`), resolved in each file as it is read, before the `-f` files merge, as Compose does.
//!
//! The base is resolved first (chains of any length; a cycle is refused naming every link), then
//! the extending service's own keys are merged over it by the rules the `-f` merge follows
//! ([`merge_value`]: mappings key by key, `command` and `entrypoint` replaced, `volumes` by
//! target, `ports` without repeats, other lists appended). A base from another file brings its
//! relative paths resolved against that file's own folder (`build`, `env_file`, bind mounts'
//! sources, the last kept relative so that they stay paths of the computer that deploys), and
//! may not carry what ties it to its own file's other services: `depends_on`,
//! `links` and `volumes_from` are refused there, as Compose refuses them.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use crate::yaml::Node;
use crate::Diagnostics;

use super::files::{merge_value, read_file};

/// What a base from another file may not carry.
const NOT_FROM_ANOTHER_FILE: &[&str] = &["depends_on", "links", "volumes_from"];

/// One file's services as read, for bases to be taken from.
struct Source {
    /// As messages name it.
    name: String,
    /// Its folder, where its relative paths start.
    dir: PathBuf,
    services: BTreeMap<String, Node>,
}

impl Source {
    fn of(doc: &Node, name: &str, path: &Path) -> Source {
        let services = match doc.get("services") {
            Some(Node::Map(entries)) => entries.iter().cloned().collect(),
            _ => BTreeMap::new(),
        };
        Source {
            name: name.to_owned(),
            dir: folder(path),
            services,
        }
    }
}

/// The folder of `path` (`.` for a bare file name).
fn folder(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Where a service was asked for: its file (a key of the sources) and its name.
type Link = (PathBuf, String);

struct Resolver<'a> {
    vars: &'a BTreeMap<String, String>,
    /// Every file read so far, by the path it was read from (lexically normalised).
    sources: BTreeMap<PathBuf, Source>,
    /// The cycles reported, each as its sorted links: one error per cycle.
    cycles: std::collections::BTreeSet<Vec<Link>>,
}

/// Resolves every `extends` in `doc`, the file read from `path` (named `name` in messages).
/// Each error names the extending file, the service, the key and the fix (a cycle once, from
/// where it starts); a service whose base cannot be resolved keeps its own keys only (without
/// `extends`), and the image check does not report it again as having no image.
pub(super) fn resolve(
    doc: &mut Node,
    path: &Path,
    name: &str,
    vars: &BTreeMap<String, String>,
    d: &mut Diagnostics,
) {
    let extending: Vec<String> = match doc.get("services") {
        Some(Node::Map(entries)) => entries
            .iter()
            .filter(|(_, body)| body.get("extends").is_some())
            .map(|(k, _)| k.clone())
            .collect(),
        _ => return,
    };
    if extending.is_empty() {
        return;
    }
    let key = normalise(path);
    let mut r = Resolver {
        vars,
        sources: BTreeMap::from([(key.clone(), Source::of(doc, name, path))]),
        cycles: Default::default(),
    };
    let mut resolved = Vec::new();
    for service in extending {
        let mut chain = Vec::new();
        let body = r
            .service(&key, &service, &mut chain, d)
            .unwrap_or_else(|| without_extends(&r.sources[&key].services[&service]));
        resolved.push((service, body));
    }
    if let Some(Node::Map(entries)) = doc_services(doc) {
        for (service, body) in resolved {
            if let Some(slot) = entries.iter_mut().find(|(k, _)| *k == service) {
                slot.1 = body;
            }
        }
    }
}

fn doc_services(doc: &mut Node) -> Option<&mut Node> {
    match doc {
        Node::Map(entries) => entries
            .iter_mut()
            .find(|(k, _)| k == "services")
            .map(|(_, v)| v),
        _ => None,
    }
}

fn without_extends(body: &Node) -> Node {
    match body {
        Node::Map(entries) => Node::Map(
            entries
                .iter()
                .filter(|(k, _)| k != "extends")
                .cloned()
                .collect(),
        ),
        other => other.clone(),
    }
}

/// What an `extends` names.
struct Target {
    file: Option<String>,
    service: String,
}

impl Resolver<'_> {
    /// Service `service` of the file `file` with its `extends` resolved; `None` when it cannot
    /// be (reported).
    fn service(
        &mut self,
        file: &Path,
        service: &str,
        chain: &mut Vec<Link>,
        d: &mut Diagnostics,
    ) -> Option<Node> {
        let source = &self.sources[file];
        let body = source.services.get(service)?.clone();
        let Some(spec) = body.get("extends") else {
            return Some(body);
        };
        let source_name = source.name.clone();
        let source_dir = source.dir.clone();
        let target = parse_target(spec, &source_name, service, d)?;
        let base_file = match &target.file {
            Some(f) => {
                let path = normalise(&source_dir.join(f));
                if !self.sources.contains_key(&path) {
                    let shown = path.display().to_string();
                    if !path.is_file() {
                        d.error(
                            &source_name,
                            Some(service),
                            Some("extends.file"),
                            Some(f.clone()),
                            format!("the file to extend from, {shown}, does not exist"),
                            Some(format!(
                                "give the path of a Compose file, relative to {}'s folder",
                                source_name
                            )),
                        );
                        return None;
                    }
                    let doc = read_file(&path, &shown, self.vars, d)?;
                    self.sources
                        .insert(path.clone(), Source::of(&doc, &shown, &path));
                }
                path
            }
            None => file.to_path_buf(),
        };
        let link: Link = (file.to_path_buf(), service.to_owned());
        chain.push(link);
        let base_link: Link = (base_file.clone(), target.service.clone());
        if let Some(at) = chain.iter().position(|l| *l == base_link) {
            let mut members: Vec<Link> = chain[at..].to_vec();
            members.sort();
            if !self.cycles.insert(members) {
                // Reported already, from another of its services.
                chain.pop();
                return None;
            }
            // Named from where the cycle starts: the service the user extended first.
            let (start_file, start_service) = chain[at].clone();
            let start_name = self.sources[&start_file].name.clone();
            let extended = chain
                .get(at + 1)
                .map_or(target.service.clone(), |(_, s)| s.clone());
            let cycle: Vec<String> = chain[at..]
                .iter()
                .chain(std::iter::once(&base_link))
                .map(|(f, s)| {
                    if *f == start_file {
                        format!("'{s}'")
                    } else {
                        format!("'{s}' ({})", self.sources[f].name)
                    }
                })
                .collect();
            d.error(
                &start_name,
                Some(&start_service),
                Some("extends"),
                Some(extended),
                format!("extends goes round in a cycle: {}", cycle.join(" -> ")),
                Some("make one of these services stop extending the next".into()),
            );
            chain.pop();
            return None;
        }
        let base_name = self.sources[&base_file].name.clone();
        if !self.sources[&base_file]
            .services
            .contains_key(&target.service)
        {
            let known: Vec<&str> = self.sources[&base_file]
                .services
                .keys()
                .map(String::as_str)
                .collect();
            d.error(
                &source_name,
                Some(service),
                Some(if target.file.is_some() {
                    "extends.service"
                } else {
                    "extends"
                }),
                Some(target.service.clone()),
                format!(
                    "extends names the service '{}', which {base_name} does not define",
                    target.service
                ),
                Some(if known.is_empty() {
                    format!("{base_name} defines no service; name a file that does")
                } else {
                    format!("name one of its services: {}", known.join(", "))
                }),
            );
            chain.pop();
            return None;
        }
        let base = self.service(&base_file, &target.service, chain, d);
        chain.pop();
        let mut base = base?;
        if base_file != file {
            for key in NOT_FROM_ANOTHER_FILE {
                if base.get(key).is_some() {
                    d.error(
                        &source_name,
                        Some(service),
                        Some("extends"),
                        Some(target.service.clone()),
                        format!(
                            "the service '{}' of {base_name} has {key}, which a service extending it from another file cannot inherit (it names services of that file)",
                            target.service
                        ),
                        Some(format!(
                            "move {key} out of '{}' into the services that extend it, or extend it from within {base_name}",
                            target.service
                        )),
                    );
                    return None;
                }
            }
            let from = self.sources[&base_file].dir.clone();
            let to = self.sources[file].dir.clone();
            rebase(&mut base, &from, &to);
        }
        // The extending service's keys over its base's, by the `-f` merge's rules.
        let wrap = |body: Node| {
            Node::Map(vec![(
                "services".to_owned(),
                Node::Map(vec![(service.to_owned(), body)]),
            )])
        };
        let mut merged = wrap(without_extends(&base));
        merge_value(&mut merged, wrap(without_extends(&body)));
        match merged {
            Node::Map(mut top) => match top.pop() {
                Some((_, Node::Map(mut services))) => services.pop().map(|(_, b)| b),
                _ => None,
            },
            _ => None,
        }
    }
}

/// `extends: NAME` or `extends: {service: NAME, file: PATH}`.
fn parse_target(spec: &Node, file: &str, service: &str, d: &mut Diagnostics) -> Option<Target> {
    let bad = |d: &mut Diagnostics, key: &str, message: &str| {
        d.error(
            file,
            Some(service),
            Some(key),
            spec.scalar_text(),
            message.to_owned(),
            Some("write `extends: BASE` or `extends: {service: BASE, file: other.yaml}`".into()),
        );
        None
    };
    match spec {
        Node::Str(s) if !s.is_empty() => Some(Target {
            file: None,
            service: s.clone(),
        }),
        Node::Map(entries) => {
            for (k, _) in entries {
                if k != "service" && k != "file" {
                    return bad(d, &format!("extends.{k}"), "is not a key of extends");
                }
            }
            let service_name = match spec.get("service") {
                Some(Node::Str(s)) if !s.is_empty() => s.clone(),
                _ => return bad(d, "extends.service", "extends needs the service to extend"),
            };
            let file_name = match spec.get("file") {
                None | Some(Node::Null) => None,
                Some(Node::Str(f)) if !f.is_empty() => Some(f.clone()),
                Some(_) => return bad(d, "extends.file", "extends.file must be a path"),
            };
            Some(Target {
                file: file_name,
                service: service_name,
            })
        }
        _ => bad(
            d,
            "extends",
            "extends must name a service, or a service and a file",
        ),
    }
}

/// `path` without `.` components and with `..` applied where it can be.
fn normalise(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if matches!(out.components().next_back(), Some(Component::Normal(_))) {
                    out.pop();
                } else {
                    out.push("..");
                }
            }
            other => out.push(other),
        }
    }
    if out.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        out
    }
}

/// Whether a path written in a Compose file is relative to its file's folder.
fn relative(p: &str) -> bool {
    !(p.is_empty()
        || p.starts_with('/')
        || p.starts_with('~')
        || p.contains("://")
        || p.starts_with("git@"))
}

/// `p` (relative to `from`) as a path the extending file's loader resolves to the same place:
/// absolute.
fn moved(p: &str, from: &Path) -> String {
    let joined = normalise(&from.join(p));
    let absolute = std::path::absolute(&joined).unwrap_or(joined);
    normalise(&absolute).display().to_string()
}

/// `p` (relative to `from`) relative to `to` instead (`./x`, `../x`), so that it stays a path
/// of the computer that deploys, relative as the file had it: a bind mount's source is read
/// that way, where an absolute one names a path on the Machine. Absolute when the two folders
/// share no root.
fn moved_relative(p: &str, from: &Path, to: &Path) -> String {
    let absolute = |d: &Path| normalise(&std::path::absolute(normalise(d)).unwrap_or(d.into()));
    let target = absolute(&from.join(p));
    let base = absolute(to);
    let (t, b): (Vec<Component>, Vec<Component>) =
        (target.components().collect(), base.components().collect());
    if t.first() != b.first() {
        return moved(p, from);
    }
    let shared = t.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let mut out: Vec<String> = Vec::new();
    if shared == b.len() {
        out.push(".".to_owned());
    }
    out.extend(b[shared..].iter().map(|_| "..".to_owned()));
    out.extend(
        t[shared..]
            .iter()
            .map(|c| c.as_os_str().to_string_lossy().into_owned()),
    );
    out.join("/")
}

/// Resolves the relative paths of a base taken from another file against that file's folder
/// (`from`): `build` and `env_file` as absolute paths, bind mounts' sources relative to the
/// extending file's folder (`to`), so that they stay the project's (see [`moved_relative`]).
fn rebase(base: &mut Node, from: &Path, to: &Path) {
    let Node::Map(entries) = base else { return };
    for (key, value) in entries.iter_mut() {
        match key.as_str() {
            "build" => match value {
                Node::Str(s) if relative(s) => *s = moved(s, from),
                Node::Map(build) => {
                    for (k, v) in build.iter_mut() {
                        if k == "context" {
                            if let Node::Str(s) = v {
                                if relative(s) {
                                    *s = moved(s, from);
                                }
                            }
                        }
                    }
                }
                _ => {}
            },
            "env_file" => match value {
                Node::Str(s) if relative(s) => *s = moved(s, from),
                Node::Seq(items) => {
                    for item in items {
                        match item {
                            Node::Str(s) if relative(s) => *s = moved(s, from),
                            Node::Map(m) => {
                                for (k, v) in m.iter_mut() {
                                    if let (true, Node::Str(s)) = (k == "path", v) {
                                        if relative(s) {
                                            *s = moved(s, from);
                                        }
                                    }
                                }
                            }
                            _ => {}
                        }
                    }
                }
                _ => {}
            },
            "volumes" => {
                let Node::Seq(items) = value else { continue };
                for item in items {
                    match item {
                        // `./data:/data[:ro]`: only a source that is a path (starts with `.`)
                        // is a bind mount's; a bare name is a volume.
                        Node::Str(s) => {
                            if let Some((source, rest)) = s.split_once(':') {
                                if source.starts_with('.') {
                                    *s = format!("{}:{rest}", moved_relative(source, from, to));
                                }
                            }
                        }
                        Node::Map(m) => {
                            let bind = m
                                .iter()
                                .any(|(k, v)| k == "type" && *v == Node::Str("bind".into()));
                            for (k, v) in m.iter_mut() {
                                if let (true, Node::Str(s)) = (k == "source", v) {
                                    if s.starts_with('.') || (bind && relative(s)) {
                                        *s = moved_relative(s, from, to);
                                    }
                                }
                            }
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_normalised_lexically() {
        assert_eq!(normalise(Path::new("./a/./b/../c")), PathBuf::from("a/c"));
        assert_eq!(normalise(Path::new("../x")), PathBuf::from("../x"));
        assert_eq!(normalise(Path::new("./")), PathBuf::from("."));
        assert_eq!(normalise(Path::new("/a/../b")), PathBuf::from("/b"));
    }

    #[test]
    fn only_paths_relative_to_the_file_are_moved() {
        assert!(relative("./app"));
        assert!(relative("app"));
        assert!(!relative("/srv/app"));
        assert!(!relative("~/app"));
        assert!(!relative("https://example.com/repo.git"));
        assert!(!relative("git@example.com:repo.git"));
        assert_eq!(moved("./app", Path::new("/p/common")), "/p/common/app");
        assert_eq!(moved("../app", Path::new("/p/common")), "/p/app");
    }

    #[test]
    fn a_path_moved_between_folders_stays_relative() {
        let root = Path::new("/p");
        assert_eq!(
            moved_relative("./conf/a", &root.join("common"), root),
            "./common/conf/a"
        );
        assert_eq!(moved_relative("../x", &root.join("common"), root), "./x");
        assert_eq!(moved_relative("./y", Path::new("/q"), root), "../q/y");
        assert_eq!(
            moved_relative("../../z", &root.join("a/b"), &root.join("c")),
            "../z"
        );
        assert_eq!(moved_relative(".", &root.join("d"), root), "./d");
    }
}
