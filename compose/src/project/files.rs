//! One Compose file from disk to a checked, interpolated tree, and the files merged in order:
//! the project's `.env`, duplicate keys, merge keys, `${VAR}` interpolation, `!reset` and
//! `!override`, and which file each part of the merged project came from.

use std::collections::BTreeMap;
use std::path::Path;

use crate::interp::{interpolate, parse_env_file, shown_key};
use crate::service::kv_entries;
use crate::yaml::{self, join_path, Node};
use crate::Diagnostics;

use super::Origins;

/// Sections whose entries are named, for provenance.
const SECTIONS: &[&str] = &["services", "volumes", "configs", "secrets", "networks"];

/// Keys whose list form (`- KEY=VALUE`) is a mapping in disguise; merged key by key.
const KV_KEYS: &[&str] = &["environment", "labels", "sysctls"];

/// The variables for interpolation: the project's `.env`, overridden by the process environment.
pub(super) fn project_vars(
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
pub(super) fn read_file(
    path: &Path,
    name: &str,
    vars: &BTreeMap<String, String>,
    d: &mut Diagnostics,
) -> Option<Node> {
    let text = read_text(path, name, d)?;
    let mut node = parse_top(&text, name, d)?;
    report_duplicates(&mut node, name, d);
    report_merge_errors(&mut node, name, d);
    let used = std::cell::RefCell::new(Vec::new());
    let lookup = |n: &str| {
        let value = vars.get(n).cloned();
        if let Some(v) = &value {
            used.borrow_mut().push((n.to_owned(), v.clone()));
        }
        value
    };
    interpolate_node(&mut node, &mut Vec::new(), name, &lookup, d);
    d.substituted.extend(used.into_inner());
    crate::service::report_list_duplicates(&node, name, d);
    normalise_kv(&mut node);
    Some(node)
}

/// The file's text; an error when it is missing, unreadable or not UTF-8.
fn read_text(path: &Path, name: &str, d: &mut Diagnostics) -> Option<String> {
    match std::fs::read_to_string(path) {
        Ok(t) => Some(t),
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
            None
        }
    }
}

/// The file as YAML whose top level is a mapping.
fn parse_top(text: &str, name: &str, d: &mut Diagnostics) -> Option<Node> {
    let node = match yaml::parse(text) {
        Ok(n) => n,
        Err(m) => {
            d.error(name, None, None, None, format!("not valid YAML: {m}"), None);
            return None;
        }
    };
    match &node {
        Node::Map(_) => Some(node),
        Node::Null => {
            d.error(
                name,
                None,
                None,
                None,
                "the file is empty",
                Some("a Compose file needs at least services:".into()),
            );
            None
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
            None
        }
    }
}

/// Removes duplicate keys, with an error for each.
fn report_duplicates(node: &mut Node, name: &str, d: &mut Diagnostics) {
    let mut dups = Vec::new();
    yaml::remove_duplicates(node, &mut Vec::new(), &mut dups);
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
}

/// Applies merge keys (`<<`), with an error for each that cannot be applied.
fn report_merge_errors(node: &mut Node, name: &str, d: &mut Diagnostics) {
    let mut merge_errs = Vec::new();
    yaml::apply_merges(node, &mut Vec::new(), &mut merge_errs);
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
}

/// Splits a path into the service it is under (if any) and the key text shown in messages.
fn locate(path: &[String]) -> (Option<&str>, String) {
    match path {
        [s, name, rest @ ..] if s == "services" => (Some(name.as_str()), join_path(rest)),
        _ => (None, join_path(path)),
    }
}

/// Interpolates every text in the tree; an unset variable is a warning, a broken reference an
/// error.
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

/// Records which file set each top-level key, section entry and service key.
pub(super) fn record_origins(doc: &Node, idx: usize, origins: &mut Origins) {
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

/// Merges `over` into `base` by the Compose specification's rules: mappings key by key
/// (recursively); sequences appended, except that `command`, `entrypoint` and `healthcheck.test`
/// are replaced and that `volumes`, `secrets` and `configs` entries replace the entry with the
/// same target (`ports` and `x-ports` entries already present are not added twice); scalars
/// replaced (and so are `x-pre_deploy.command` and `x-machines`). `!reset` removes a key,
/// `!override` replaces it without merging.
pub(super) fn merge_value(base: &mut Node, over: Node) {
    merge_at(base, over, &mut Vec::new());
}

/// The service key at `path` when it is one Compose writes in a short and a long form.
fn two_forms(path: &[String]) -> Option<&'static str> {
    match path {
        [top, _service, key] if top == "services" => [
            "build",
            "env_file",
            "depends_on",
            "dns",
            "dns_search",
            "tmpfs",
        ]
        .into_iter()
        .find(|k| key == k),
        _ => None,
    }
}

/// `node` (the value of service key `key`) in its long form, when it is in the short one:
/// `build: DIR` is `{context: DIR}`, `depends_on: [a]` is `{a: null}` (required, started), a
/// single text of `env_file`, `dns`, `dns_search` or `tmpfs` a list of one. Anything else is
/// left for the service's converter to judge.
fn long_form(node: &mut Node, key: &str) {
    match (key, &*node) {
        ("build", Node::Str(dir)) => {
            *node = Node::Map(vec![("context".to_owned(), Node::Str(dir.clone()))]);
        }
        ("depends_on", Node::Seq(items)) => {
            let names: Option<Vec<String>> = items
                .iter()
                .map(|i| match i {
                    Node::Str(name) => Some(name.clone()),
                    _ => None,
                })
                .collect();
            if let Some(names) = names {
                let mut map: Vec<(String, Node)> = Vec::new();
                for name in names {
                    if !map.iter().any(|(n, _)| *n == name) {
                        map.push((name, Node::Null));
                    }
                }
                *node = Node::Map(map);
            }
        }
        ("env_file" | "dns" | "dns_search" | "tmpfs", Node::Str(one)) => {
            *node = Node::Seq(vec![Node::Str(one.clone())]);
        }
        _ => {}
    }
}

/// [`merge_value`] at `path` (the keys from the root), which decides how sequences merge.
fn merge_at(base: &mut Node, over: Node, path: &mut Vec<String>) {
    // A key written in its short form in one file and its long form in the other merges as
    // the long form, as Compose merges them: `env_file: a.env` and `env_file: [b.env]` are both
    // read, `build: ./api` keeps its context beside another file's `target:`.
    let mut over = over;
    if let Some(key) = two_forms(path) {
        long_form(base, key);
        long_form(&mut over, key);
    }
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
                        Some(slot) => {
                            path.push(k);
                            merge_at(&mut slot.1, v, path);
                            path.pop();
                        }
                        None => b.push((k, clean(v))),
                    },
                }
            }
        }
        (Node::Seq(b), Node::Seq(o)) => match sequence_rule(path) {
            SequenceRule::Replace => *b = o.into_iter().map(clean).collect(),
            SequenceRule::Append => b.extend(o.into_iter().map(clean)),
            SequenceRule::AppendNew => {
                for item in o.into_iter().map(clean) {
                    if !b.contains(&item) {
                        b.push(item);
                    }
                }
            }
            SequenceRule::ByTarget(target_of) => {
                for item in o.into_iter().map(clean) {
                    let target = target_of(&item);
                    match b
                        .iter_mut()
                        .find(|old| target.is_some() && target_of(old) == target)
                    {
                        Some(old) => *old = item,
                        None => b.push(item),
                    }
                }
            }
        },
        (b, o) => *b = clean(o),
    }
}

/// How a sequence of a later file merges into the same sequence of an earlier one.
enum SequenceRule {
    /// The later file's sequence wins whole (commands: appending arguments makes no sense).
    Replace,
    /// The later file's entries follow the earlier ones.
    Append,
    /// Appended, but an entry written the same way in both files is kept once.
    AppendNew,
    /// An entry replaces the earlier entry with the same target, else it is appended.
    ByTarget(fn(&Node) -> Option<String>),
}

/// The rule for the sequence at `path` (`services.<name>.<key>...`).
fn sequence_rule(path: &[String]) -> SequenceRule {
    let in_service: Vec<&str> = match path {
        [top, _service, rest @ ..] if top == "services" => {
            rest.iter().map(String::as_str).collect()
        }
        _ => return SequenceRule::Append,
    };
    match in_service.as_slice() {
        // Ployz's own lists that name one thing whole: the hook's command and where the
        // Service may run (an override that names other Machines moves it there).
        ["command"]
        | ["entrypoint"]
        | ["healthcheck", "test"]
        | ["x-pre_deploy", "command"]
        | ["x-machines"] => SequenceRule::Replace,
        ["ports"] | ["x-ports"] => SequenceRule::AppendNew,
        ["volumes"] => SequenceRule::ByTarget(volume_target),
        ["secrets"] => SequenceRule::ByTarget(secret_target),
        ["configs"] => SequenceRule::ByTarget(config_target),
        _ => SequenceRule::Append,
    }
}

/// The container path of a `volumes` entry: `source:target[:options]`, a bare target, or the
/// long syntax's `target:`. `None` when it cannot be told (the entry is appended; the service
/// converter reports what is wrong with it).
fn volume_target(n: &Node) -> Option<String> {
    match n {
        Node::Str(s) => {
            let mut parts = s.split(':');
            let first = parts.next()?;
            Some(parts.next().unwrap_or(first).to_owned())
        }
        Node::Map(_) => match n.get("target") {
            Some(Node::Str(t)) => Some(t.clone()),
            _ => None,
        },
        _ => None,
    }
}

/// Where a `secrets` entry lands: `/run/secrets/<name>` for the short syntax, the long
/// syntax's `target:` (a relative one under `/run/secrets`) or its `source:`, as Compose keys
/// them, so one secret written both ways merges into one entry.
fn secret_target(n: &Node) -> Option<String> {
    file_target(n, "/run/secrets")
}

/// Where a `configs` entry lands: `/<name>` for the short syntax, the long syntax's `target:`
/// or `/<source>`.
fn config_target(n: &Node) -> Option<String> {
    file_target(n, "")
}

fn file_target(n: &Node, dir: &str) -> Option<String> {
    let under = |t: &str| {
        if t.starts_with('/') {
            t.to_owned()
        } else {
            format!("{dir}/{t}")
        }
    };
    match n {
        Node::Str(s) => Some(under(s)),
        Node::Map(_) => match (n.get("target"), n.get("source")) {
            (Some(Node::Str(t)), _) | (None, Some(Node::Str(t))) => Some(under(t)),
            _ => None,
        },
        _ => None,
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
pub(super) fn report_tags(
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
