//! The container's environment: `env_file` entries first, then `environment`, which overrides
//! them. A variable without a value takes the process environment's, or is left out.
//!
//! Env files hold secrets: what is said about them names the file and the line, never a value.

use std::collections::BTreeMap;
use std::path::Path;

use crate::interp::{parse_env_file, shown_key};

use super::shapes::{boolean, kv_entries, text};
use super::{Node, Parts, ServiceCtx};
use crate::Diagnostics;

/// One variable from an env file, with where it came from.
pub(super) struct EnvFileLine {
    name: String,
    /// `None` for a line that names a variable without a value.
    value: Option<String>,
    /// `path:line`, shown instead of the line itself.
    origin: String,
}

/// `environment:`, as a mapping or a `KEY=value` list; kept only if it reads as one.
pub(super) fn read_environment(ctx: &mut ServiceCtx<'_>, p: &mut Parts<'_>, value: &Node) {
    if let Some(e) = ctx.get("environment", value, kv_entries) {
        p.environment = e;
    }
}

/// Refuses each name set more than once in a service's `environment` list, naming the items;
/// values are never shown (they may be secrets). Runs on each file as read, before its lists
/// become mappings for the merge (which would keep the last value without a word). The
/// mapping form's duplicates are duplicate YAML keys, refused when the file is parsed.
pub(crate) fn report_list_duplicates(root: &Node, file: &str, d: &mut Diagnostics) {
    let Some(Node::Map(services)) = root.get("services") else {
        return;
    };
    for (service, node) in services {
        let Some(Node::Seq(items)) = node.get("environment") else {
            continue;
        };
        let mut seen: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (i, item) in items.iter().enumerate() {
            if let Some(t) = item.scalar_text() {
                let name = t.split_once('=').map_or(t.as_str(), |(k, _)| k).to_owned();
                seen.entry(name).or_default().push(i);
            }
        }
        for (name, at) in seen.into_iter().filter(|(_, at)| at.len() > 1) {
            let shown: Vec<String> = at.iter().map(|i| format!("environment[{i}]")).collect();
            let first = at.first().copied().unwrap_or_default();
            let last = at.last().copied().unwrap_or_default();
            d.error(
                file,
                Some(service),
                Some(&format!("environment[{last}]")),
                None,
                format!(
                    "'{name}' is set more than once in the environment list ({}): only one value can reach the container",
                    shown.join(", ")
                ),
                Some(format!("keep one line for {name}, e.g. delete environment[{first}]")),
            );
        }
    }
}

/// The entries of the service's env files, each with where it came from (`path:line`).
pub(super) fn env_files(ctx: &mut ServiceCtx<'_>, n: &Node) -> Vec<EnvFileLine> {
    let items: Vec<(String, &Node)> = match n {
        Node::Null => return Vec::new(),
        Node::Seq(items) => items
            .iter()
            .enumerate()
            .map(|(i, item)| (format!("env_file[{i}]"), item))
            .collect(),
        other => vec![("env_file".to_string(), other)],
    };
    let mut out = Vec::new();
    for (key, item) in items {
        let Some((path, required)) = env_file_ref(ctx, &key, item) else {
            continue;
        };
        read_env_file(ctx, &key, path, required, &mut out);
    }
    out
}

/// An `env_file` entry: a path, or `path:` with `required:` (default true) and `format:`.
fn env_file_ref(ctx: &mut ServiceCtx<'_>, key: &str, item: &Node) -> Option<(String, bool)> {
    match item {
        Node::Map(_) => {
            let Some(path) = item.get("path") else {
                ctx.bad(key, item, "an env_file entry needs path:");
                return None;
            };
            let path = ctx.get(&format!("{key}.path"), path, text)?;
            let required = match item.get("required") {
                Some(r) => ctx
                    .get(&format!("{key}.required"), r, boolean)
                    .unwrap_or(true),
                None => true,
            };
            if let Some(f) = item.get("format") {
                ctx.warn(
                    &format!("{key}.format"),
                    format!(
                        "only the default env file format is supported; '{}' is ignored",
                        f.short()
                    ),
                );
            }
            Some((path, required))
        }
        other => ctx.get(key, other, text).map(|p| (p, true)),
    }
}

/// Reads one env file (relative to the project directory) into `out`. A missing file that is
/// not required is skipped.
fn read_env_file(
    ctx: &mut ServiceCtx<'_>,
    key: &str,
    path: String,
    required: bool,
    out: &mut Vec<EnvFileLine>,
) {
    let full = ctx.dir.join(&path);
    let Some(content) = env_file_content(ctx, key, path, required, &full) else {
        return;
    };
    let vars = ctx.vars;
    let lookup = |name: &str| vars.get(name).cloned();
    // Messages name the file and line, never a value: env files hold secrets (and a path
    // may name a file that is not an env file at all).
    let shown = full.display().to_string();
    match parse_env_file(&content, &lookup) {
        Ok(parsed) => {
            for u in &parsed.unset {
                ctx.warn(
                    key,
                    format!(
                        "{shown}:{}: the value of {} refers to a variable that is not set; it becomes empty there (quote the value with '...' if its '$' is literal)",
                        u.line,
                        shown_key(u.key.as_deref())
                    ),
                );
            }
            out.extend(parsed.lines.into_iter().map(|l| EnvFileLine {
                name: l.entry.0,
                value: l.entry.1,
                origin: format!("{shown}:{}", l.line),
            }));
        }
        Err(e) => ctx.err(
            key,
            None,
            format!("{shown}:{}: {}", e.line, e.message),
            e.fix.as_deref(),
        ),
    }
}

/// The text of an env file; `None` when it is missing and not required, or cannot be read
/// (an error).
fn env_file_content(
    ctx: &mut ServiceCtx<'_>,
    key: &str,
    path: String,
    required: bool,
    full: &Path,
) -> Option<String> {
    match std::fs::read_to_string(full) {
        Ok(t) => Some(t),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => None,
        Err(e) => {
            let why = if e.kind() == std::io::ErrorKind::NotFound {
                format!("the env file {} does not exist", full.display())
            } else {
                format!("cannot read the env file {}: {e}", full.display())
            };
            ctx.err(
                key,
                Some(path),
                why,
                Some("create it, fix the path (relative to the project directory), or mark it required: false"),
            );
            None
        }
    }
}

/// The container's environment: env files first, then `environment` overrides. A variable
/// without a value takes the process environment's, or is left out with a warning.
pub(super) fn merge(
    ctx: &mut ServiceCtx<'_>,
    env_file_entries: Vec<EnvFileLine>,
    environment: Vec<(String, Option<String>)>,
) -> BTreeMap<String, String> {
    let mut env: BTreeMap<String, String> = BTreeMap::new();
    let env_file_entries: Vec<(String, Option<String>, Option<String>)> = env_file_entries
        .into_iter()
        .map(|e| (e.name, e.value, Some(e.origin)))
        .collect();
    let environment = environment.into_iter().map(|(k, v)| (k, v, None)).collect();
    for (source, entries) in [("env_file", env_file_entries), ("environment", environment)] {
        for (k, v, origin) in entries {
            merge_one(ctx, &mut env, source, k, v, origin);
        }
    }
    for (k, v) in &env {
        if v.starts_with("secret://") {
            ctx.warn(
                &format!("environment.{k}"),
                "secret:// references are not resolved by Ployz yet; the container gets the text as written",
            );
        }
    }
    env
}

/// Sets one variable from `source` (`env_file` or `environment`).
fn merge_one(
    ctx: &mut ServiceCtx<'_>,
    env: &mut BTreeMap<String, String>,
    source: &str,
    k: String,
    v: Option<String>,
    origin: Option<String>,
) {
    if k.is_empty() {
        ctx.err(source, None, "a variable name must not be empty", None);
        return;
    }
    match v.or_else(|| ctx.vars.get(&k).cloned()) {
        Some(v) => {
            env.insert(k, v);
        }
        None if env.contains_key(&k) => {}
        // An env file's line is shown by its place only: it may be a secret.
        None => match origin {
            Some(at) => ctx.warn(
                source,
                format!("{at}: this line names a variable without a value, and it is not set in the environment; it is left out"),
            ),
            None => ctx.warn(
                &format!("{source}.{k}"),
                format!("'{k}' has no value and is not set in the environment; it is left out"),
            ),
        },
    }
}
