//! The top-level `configs:`: each config a service uses becomes a file in its container, with
//! its content read now (`file:`, `content:` or `environment:`).

use ployz_core::ConfigFile;

use crate::service::keys::{note_under, unknown_under};
use crate::service::{boolean, text, ConfigUse, Converted, ServiceCtx};
use crate::yaml::Node;
use crate::Diagnostics;

use super::Project;

impl Project<'_> {
    /// Turns the service's config uses into files, reading `file:` configs now.
    pub(super) fn resolve_configs(&self, ctx: &mut ServiceCtx<'_>, c: &mut Converted) {
        let mut files: Vec<ConfigFile> = Vec::new();
        for u in std::mem::take(&mut c.configs) {
            let example = format!("configs: {{ {0}: {{ file: ./{0} }} }}", u.source);
            let Some((decl, decl_file)) = self.declaration(ctx, "configs", "config", &u, &example)
            else {
                continue;
            };
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
        let named: Vec<(&str, &str)> = files
            .iter()
            .map(|f| (f.name.as_str(), f.target.as_str()))
            .collect();
        refuse_shared_targets(ctx, "configs", "config", &named);
        c.spec.container.configs = files;
    }

    /// The top-level declaration a service's `configs`/`secrets` entry names, with the file that
    /// declares it; an entry naming nothing declared is an error with the declaration to add.
    pub(super) fn declaration<'n>(
        &'n self,
        ctx: &mut ServiceCtx<'_>,
        section: &str,
        kind: &str,
        u: &ConfigUse,
        example: &str,
    ) -> Option<(&'n Node, String)> {
        match self.root.get(section).and_then(|t| t.get(&u.source)) {
            Some(decl) => Some((decl, self.section_file(section, &u.source).to_owned())),
            None => {
                ctx.err(
                    &format!("{}.source", u.key),
                    Some(u.source.clone()),
                    format!(
                        "the {kind} '{}' is not declared in the top-level {section}:",
                        u.source
                    ),
                    Some(&format!("add it at the top level: {example}")),
                );
                None
            }
        }
    }

    /// A `file:` path of a config or secret: `~` and `~/...` from the home directory (`HOME`
    /// of the project's variables), anything else from the project directory.
    pub(super) fn local_path(&self, v: &str) -> std::path::PathBuf {
        let home = self.vars.get("HOME").map(std::path::Path::new);
        match (v, v.strip_prefix("~/"), home) {
            ("~", _, Some(home)) => home.to_path_buf(),
            (_, Some(rest), Some(home)) => home.join(rest),
            _ => self.dir.join(v),
        }
    }

    /// The content of the top-level config `name`, declared in `file`.
    fn config_content(
        &self,
        name: &str,
        decl: &Node,
        file: &str,
        d: &mut Diagnostics,
    ) -> Option<String> {
        let key = format!("configs.{name}");
        check_config_keys(&key, decl, file, d)?;
        let (kind, v) = config_source(&key, decl, file, d)?;
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
            _ => self.config_file(&key, v, file, d),
        }
    }

    /// A `file:` config's content, read relative to the project directory; UTF-8 text only.
    fn config_file(&self, key: &str, v: String, file: &str, d: &mut Diagnostics) -> Option<String> {
        let path = self.local_path(&v);
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
                        Some(
                            "configs carry text; ship binary files in the image or a volume".into(),
                        ),
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
                        "paths are relative to the project directory (the first -f file's)".into(),
                    ),
                );
                None
            }
        }
    }
}

/// A config declaration is a mapping, not `external`; unknown keys are warnings.
fn check_config_keys(key: &str, decl: &Node, file: &str, d: &mut Diagnostics) -> Option<()> {
    let Node::Map(entries) = decl else {
        d.error(
            file,
            None,
            Some(key),
            Some(decl.short()),
            "a config needs file: or content:",
            Some("e.g. configs: { app: { file: ./app.conf } }".into()),
        );
        return None;
    };
    for (k, _) in entries {
        match k.as_str() {
            "file" | "content" | "environment" | "external" | "name" => {}
            "template_driver" | "labels" => d.warn(
                file,
                None,
                &format!("{key}.{k}"),
                note_under("configs.*", k),
            ),
            _ if k.starts_with("x-") => {}
            _ => d.warn(
                file,
                None,
                &format!("{key}.{k}"),
                unknown_under("configs.*", k),
            ),
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
                Some(note_under("configs.*", "external").into()),
            );
            return None;
        }
    }
    Some(())
}

/// Which one of `file:`, `content:` and `environment:` the config has, and its text.
fn config_source(
    key: &str,
    decl: &Node,
    file: &str,
    d: &mut Diagnostics,
) -> Option<(&'static str, String)> {
    let sources: Vec<&'static str> = ["file", "content", "environment"]
        .into_iter()
        .filter(|k| decl.get(k).is_some())
        .collect();
    if sources.len() != 1 {
        d.error(
            file,
            None,
            Some(key),
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
    Some((kind, v))
}

/// Refuses two files of one kind (`(name, target)`, sorted by target) at one target.
pub(super) fn refuse_shared_targets(
    ctx: &mut ServiceCtx<'_>,
    key: &str,
    kind: &str,
    files: &[(&str, &str)],
) {
    for pair in files.windows(2) {
        if pair[0].1 == pair[1].1 {
            ctx.err(
                key,
                Some(pair[1].1.to_owned()),
                format!(
                    "the {key} '{}' and '{}' share one target",
                    pair[0].0, pair[1].0
                ),
                Some(&format!("give each {kind} its own target")),
            );
        }
    }
}
