//! `build:`: a Service whose image the CLI builds with the Docker where it runs, from a context
//! folder, before a Deploy (or with `ployz build`). The short form is the context; the long
//! form's `context`, `dockerfile`, `dockerfile_inline`, `args`, `target`, `labels`,
//! `no_cache` and `pull` are kept; the rest of Compose's build keys are warned and ignored.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::shapes::{boolean, kv_entries, string_map, text};
use super::ServiceCtx;
use crate::yaml::Node;

/// How one Service's image is built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildSpec {
    /// The context folder (absolute).
    pub context: PathBuf,
    pub dockerfile: Dockerfile,
    /// `--build-arg`s: an argument written without a value takes the environment's, and is left
    /// out when the environment has none (as Compose does).
    pub args: BTreeMap<String, String>,
    /// The stage of a multi-stage Dockerfile to build.
    pub target: Option<String>,
    pub labels: BTreeMap<String, String>,
    /// Build without Docker's layer cache.
    pub no_cache: bool,
    /// Pull the base images again.
    pub pull: bool,
}

/// Where the Dockerfile is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dockerfile {
    /// A file (absolute), usually inside the context.
    File(PathBuf),
    /// `dockerfile_inline`: the Dockerfile's text.
    Inline(String),
}

/// Compose's build keys Ployz does not apply; each is a warning.
const IGNORED: &[&str] = &[
    "additional_contexts",
    "cache_from",
    "cache_to",
    "entitlements",
    "extra_hosts",
    "isolation",
    "network",
    "platforms",
    "privileged",
    "secrets",
    "shm_size",
    "ssh",
    "tags",
    "ulimits",
];

/// Reads `build:`. `None` when it is null or refused (the error is recorded).
pub(super) fn read(ctx: &mut ServiceCtx<'_>, node: &Node) -> Option<BuildSpec> {
    let mut context: Option<String> = None;
    let mut dockerfile: Option<String> = None;
    let mut inline: Option<String> = None;
    let mut spec = BuildSpec {
        context: PathBuf::new(),
        dockerfile: Dockerfile::Inline(String::new()),
        args: BTreeMap::new(),
        target: None,
        labels: BTreeMap::new(),
        no_cache: false,
        pull: false,
    };
    match node {
        Node::Null => return None,
        Node::Map(entries) => {
            for (k, v) in entries {
                let key = format!("build.{k}");
                match k.as_str() {
                    "context" => context = ctx.get(&key, v, text),
                    "dockerfile" => dockerfile = ctx.get(&key, v, text),
                    "dockerfile_inline" => inline = ctx.get(&key, v, text),
                    "args" => {
                        let entries = ctx.get(&key, v, kv_entries).unwrap_or_default();
                        for (name, value) in entries {
                            match value.or_else(|| ctx.vars.get(&name).cloned()) {
                                Some(value) => {
                                    spec.args.insert(name, value);
                                }
                                None => ctx.warn(
                                    &key,
                                    format!("'{name}' has no value here and is not in the environment; it is not passed"),
                                ),
                            }
                        }
                    }
                    "target" => spec.target = ctx.get(&key, v, text),
                    "labels" => spec.labels = ctx.get(&key, v, string_map).unwrap_or_default(),
                    "no_cache" => spec.no_cache = ctx.get(&key, v, boolean).unwrap_or(false),
                    "pull" => spec.pull = ctx.get(&key, v, boolean).unwrap_or(false),
                    k if IGNORED.contains(&k) => {
                        ctx.warn(&key, "is not supported and is ignored");
                    }
                    other => ctx.err(
                        &key,
                        Some(other.to_owned()),
                        format!("'{other}' is not a key of build"),
                        Some("use context, dockerfile, dockerfile_inline, args, target, labels, no_cache or pull"),
                    ),
                }
            }
        }
        other => context = ctx.get("build", other, text),
    }
    let context = context.unwrap_or_else(|| ".".to_owned());
    if context.contains("://") || context.starts_with("git@") {
        ctx.err(
            "build.context",
            Some(context),
            "a remote build context is not supported",
            Some("clone it and point build.context at the folder"),
        );
        return None;
    }
    let dir = ctx.dir.join(&context);
    if !dir.is_dir() {
        ctx.err(
            "build.context",
            Some(context.clone()),
            format!("no folder at {}", dir.display()),
            Some("point build.context at the folder the image is built from, relative to the Compose file"),
        );
        return None;
    }
    spec.context = dir.canonicalize().unwrap_or(dir);
    spec.dockerfile = match (inline, dockerfile) {
        (Some(_), Some(file)) => {
            ctx.err(
                "build.dockerfile_inline",
                Some(file),
                "dockerfile and dockerfile_inline are both set",
                Some("keep one of them"),
            );
            return None;
        }
        (Some(text), None) => Dockerfile::Inline(text),
        (None, file) => {
            let file = file.unwrap_or_else(|| "Dockerfile".to_owned());
            let path = spec.context.join(&file);
            if !path.is_file() {
                ctx.err(
                    "build.dockerfile",
                    Some(file),
                    format!("no Dockerfile at {}", path.display()),
                    Some("write one there, or point build.dockerfile at it (relative to the context)"),
                );
                return None;
            }
            Dockerfile::File(path)
        }
    };
    Some(spec)
}

/// The repository a build without `image:` is tagged in, as Compose names it: the project (the
/// first Compose file's folder) and the Service, `myapp-web`, each reduced to what an image
/// name may hold.
pub(super) fn repository(ctx: &ServiceCtx<'_>) -> String {
    let dir = ctx
        .dir
        .canonicalize()
        .unwrap_or_else(|_| ctx.dir.to_path_buf());
    let project: String = dir
        .file_name()
        .map(|n| n.to_string_lossy().to_lowercase())
        .unwrap_or_default()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'))
        .collect();
    let project = project.trim_matches(['-', '_']);
    let project = if project.is_empty() { "ployz" } else { project };
    format!("{project}-{}", ctx.name.dns_label())
}
