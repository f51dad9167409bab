//! The top-level `configs:`: each config a service uses becomes a file in its container, with
//! its content read now (`file:`, `content:` or `environment:`).

use ployz_core::ConfigFile;

use crate::service::keys::{note_under, unknown_under};
use crate::service::{boolean, text, Converted, ServiceCtx};
use crate::yaml::Node;
use crate::Diagnostics;

use super::Project;

impl Project<'_> {
    /// Turns the service's config uses into files, reading `file:` configs now.
    pub(super) fn resolve_configs(&self, ctx: &mut ServiceCtx<'_>, c: &mut Converted) {
        let top = self.root.get("configs");
        // Read-only file binds the service carries as configs are already there.
        let mut files: Vec<ConfigFile> = std::mem::take(&mut c.spec.container.configs);
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
