//! The top-level `secrets:`: each secret a service uses becomes a read-only file in its
//! container, with its value read now (`file:` or `environment:`). A value never appears in a
//! message: errors name the file or the variable, and the spec carries it next to a digest
//! that is all labels, previews and reports show.

use ployz_core::{SecretFile, SecretValue};

use crate::service::keys::{note_under, unknown_under};
use crate::service::{boolean, text, Converted, ServiceCtx};
use crate::yaml::Node;
use crate::Diagnostics;

use super::configs::refuse_shared_targets;
use super::Project;

impl Project<'_> {
    /// Checks every top-level secret, used or not: a mapping with one of `file:` and
    /// `environment:`; `external`, `driver` and `content` are refused; `template_driver` and
    /// `labels` are warnings (nothing uses them); `name` is accepted and has no effect.
    pub(super) fn check_secrets(&self, d: &mut Diagnostics) {
        let entries = match self.root.get("secrets") {
            None | Some(Node::Null) => return,
            Some(Node::Map(entries)) => entries,
            Some(other) => {
                d.error(
                    self.top_file("secrets"),
                    None,
                    Some("secrets"),
                    Some(other.short()),
                    format!("expected a mapping of secrets, found {}", other.kind()),
                    Some("e.g. secrets: { db_password: { file: ./db_password.txt } }".into()),
                );
                return;
            }
        };
        for (name, decl) in entries {
            let file = self.section_file("secrets", name);
            let key = format!("secrets.{name}");
            if check_secret_keys(&key, decl, file, d).is_some() {
                secret_source(&key, decl, file, d);
            }
        }
    }

    /// Reads the users list of each route whose basic authentication names a top-level
    /// secret, and checks it is one a route accepts (bcrypt or argon2 hashes).
    pub(super) fn resolve_route_users(&self, ctx: &mut ServiceCtx<'_>, c: &mut Converted) {
        for p in std::mem::take(&mut c.route_users) {
            let Some((decl, decl_file)) = self
                .root
                .get("secrets")
                .and_then(|t| t.get(&p.secret))
                .map(|decl| (decl, self.section_file("secrets", &p.secret).to_owned()))
            else {
                ctx.err(
                    &p.key,
                    Some(p.secret.clone()),
                    format!(
                        "the secret '{}' is not declared in the top-level secrets:",
                        p.secret
                    ),
                    Some(&format!(
                        "add it at the top level: secrets: {{ {0}: {{ file: ./{0}.htpasswd }} }}",
                        p.secret
                    )),
                );
                continue;
            };
            let Some(value) = self.secret_value(&p.secret, decl, &decl_file, ctx.d) else {
                continue;
            };
            if let Err(e) = ployz_core::users::parse_users(value.as_bytes()) {
                ctx.err(
                    &p.key,
                    Some(p.secret.clone()),
                    format!("the secret's {e}"),
                    Some(crate::service::USERS_FIX),
                );
                continue;
            }
            if let Some(route) = c
                .spec
                .routes
                .iter_mut()
                .find(|r| r.hostname == p.hostname && r.path == p.path)
            {
                route.basic_auth = Some(ployz_core::BasicAuth::new(p.realm, value));
            }
        }
    }

    /// Turns the service's secret uses into files, reading each value now.
    pub(super) fn resolve_secrets(&self, ctx: &mut ServiceCtx<'_>, c: &mut Converted) {
        // Read-only file binds the service carries like secrets are already there.
        let mut files: Vec<SecretFile> = std::mem::take(&mut c.spec.container.secrets);
        for u in std::mem::take(&mut c.secrets) {
            let example = format!(
                "secrets: {{ {0}: {{ file: ./{0}.txt }} }} (or environment: VARIABLE)",
                u.source
            );
            let Some((decl, decl_file)) = self.declaration(ctx, "secrets", "secret", &u, &example)
            else {
                continue;
            };
            let Some(value) = self.secret_value(&u.source, decl, &decl_file, ctx.d) else {
                continue;
            };
            files.push(SecretFile::new(
                u.source, u.target, value, u.mode, u.uid, u.gid,
            ));
        }
        files.sort_by(|a, b| a.target.cmp(&b.target));
        let named: Vec<(&str, &str)> = files
            .iter()
            .map(|f| (f.name.as_str(), f.target.as_str()))
            .collect();
        refuse_shared_targets(ctx, "secrets", "secret", &named);
        for s in &files {
            if let Some(cfg) = c
                .spec
                .container
                .configs
                .iter()
                .find(|f| f.target == s.target)
            {
                ctx.err(
                    "secrets",
                    Some(s.target.clone()),
                    format!(
                        "the secret '{}' and the config '{}' share one target",
                        s.name, cfg.name
                    ),
                    Some("give the secret or the config another target"),
                );
            }
        }
        c.spec.container.secrets = files;
        refuse_files_under_tmpfs(ctx, &c.spec.container);
    }

    /// The value of the top-level secret `name`, declared in `file`. Its errors were checked
    /// (and recorded) by [`Project::check_secrets`] already; recording them again adds nothing.
    fn secret_value(
        &self,
        name: &str,
        decl: &Node,
        file: &str,
        d: &mut Diagnostics,
    ) -> Option<SecretValue> {
        let key = format!("secrets.{name}");
        check_secret_keys(&key, decl, file, d)?;
        let (kind, v) = secret_source(&key, decl, file, d)?;
        match kind {
            "environment" => match self.vars.get(&v) {
                Some(value) => Some(SecretValue::new(value.clone().into_bytes())),
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
            _ => self.secret_file(&key, v, file, d),
        }
    }

    /// A `file:` secret's bytes, read relative to the project directory. Messages name the
    /// path, never the content.
    fn secret_file(
        &self,
        key: &str,
        v: String,
        file: &str,
        d: &mut Diagnostics,
    ) -> Option<SecretValue> {
        let path = self.local_path(&v);
        let error = |d: &mut Diagnostics, why: String, fix: &str| {
            d.error(
                file,
                None,
                Some(&format!("{key}.file")),
                Some(v.clone()),
                why,
                Some(fix.into()),
            )
        };
        match std::fs::metadata(&path) {
            Ok(m) if m.is_dir() => {
                error(
                    d,
                    format!("the secret file {} is a directory", path.display()),
                    "a secret is one file; name the file that holds the value",
                );
                return None;
            }
            Ok(_) => {}
            Err(e) => {
                let why = if e.kind() == std::io::ErrorKind::NotFound {
                    format!("the secret file {} does not exist", path.display())
                } else {
                    format!("cannot read the secret file {}: {e}", path.display())
                };
                error(
                    d,
                    why,
                    "paths are relative to the project directory (the first -f file's)",
                );
                return None;
            }
        }
        match std::fs::read(&path) {
            Ok(bytes) => Some(SecretValue::new(bytes)),
            Err(e) => {
                error(
                    d,
                    format!("cannot read the secret file {}: {e}", path.display()),
                    "make the file readable by the user running ployz",
                );
                None
            }
        }
    }
}

/// A secret declaration is a mapping, not `external`, without a `driver` or `content`;
/// `template_driver` and `labels` are warnings, unknown keys too.
fn check_secret_keys(key: &str, decl: &Node, file: &str, d: &mut Diagnostics) -> Option<()> {
    let Node::Map(entries) = decl else {
        d.error(
            file,
            None,
            Some(key),
            Some(decl.short()),
            "a secret needs file: or environment:",
            Some("e.g. secrets: { db_password: { file: ./db_password.txt } }".into()),
        );
        return None;
    };
    let mut refused = false;
    for (k, _) in entries {
        let at = format!("{key}.{k}");
        match k.as_str() {
            "file" | "environment" | "external" | "name" => {}
            "driver" | "driver_opts" => {
                d.error(
                    file,
                    None,
                    Some(&at),
                    None,
                    "secret drivers are not supported: Ployz reads a secret's value from file: or environment:",
                    Some(note_under("secrets.*", k).into()),
                );
                refused = true;
            }
            "template_driver" | "labels" => d.warn(file, None, &at, note_under("secrets.*", k)),
            "content" => {
                d.error(
                    file,
                    None,
                    Some(&at),
                    None,
                    "a secret takes file: or environment:, not content: (content: is for configs)",
                    Some(note_under("secrets.*", "content").into()),
                );
                refused = true;
            }
            _ if k.starts_with("x-") => {}
            _ => d.warn(file, None, &at, unknown_under("secrets.*", k)),
        }
    }
    if let Some(ext) = decl.get("external") {
        let external = match ext {
            Node::Map(_) => true,
            other => boolean(other).unwrap_or(false),
        };
        if external {
            d.error(
                file,
                None,
                Some(&format!("{key}.external")),
                Some("true".into()),
                "external secrets are not supported",
                Some(note_under("secrets.*", "external").into()),
            );
            return None;
        }
    }
    (!refused).then_some(())
}

/// Which one of `file:` and `environment:` the secret has, and the path or variable it names.
fn secret_source(
    key: &str,
    decl: &Node,
    file: &str,
    d: &mut Diagnostics,
) -> Option<(&'static str, String)> {
    let sources: Vec<&'static str> = ["file", "environment"]
        .into_iter()
        .filter(|k| decl.get(k).is_some_and(|v| !matches!(v, Node::Null)))
        .collect();
    if sources.len() != 1 {
        d.error(
            file,
            None,
            Some(key),
            None,
            if sources.is_empty() {
                "a secret needs file: or environment:"
            } else {
                "a secret takes one of file: and environment:, not both"
            },
            Some("e.g. file: ./db_password.txt, or environment: DB_PASSWORD".into()),
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

/// Refuses a config or secret whose target a tmpfs mount covers: files are copied into the
/// container before it starts, and the tmpfs, mounted at start, would hide them.
fn refuse_files_under_tmpfs(ctx: &mut ServiceCtx<'_>, container: &ployz_core::ContainerSpec) {
    let under = |target: &str, dir: &str| {
        target == dir || dir == "/" || target.starts_with(&format!("{dir}/"))
    };
    let files = container
        .secrets
        .iter()
        .map(|s| ("secrets", "secret", s.name.as_str(), s.target.as_str()))
        .chain(
            container
                .configs
                .iter()
                .map(|c| ("configs", "config", c.name.as_str(), c.target.as_str())),
        );
    for (key, kind, name, target) in files {
        let tmpfs = container.mounts.iter().find_map(|m| match m {
            ployz_core::Mount::Tmpfs { target: dir, .. } if under(target, dir) => Some(dir),
            _ => None,
        });
        if let Some(dir) = tmpfs {
            ctx.err(
                key,
                Some(target.to_owned()),
                format!(
                    "the {kind} '{name}' at {target} would be hidden by the tmpfs mounted at {dir}: files are copied in before the container starts, and the tmpfs is mounted over them"
                ),
                Some(&format!(
                    "mount the tmpfs elsewhere (e.g. {dir}/tmp), or give the {kind} a target outside {dir}"
                )),
            );
        }
    }
}
