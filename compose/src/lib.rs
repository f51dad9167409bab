//! The Compose loader: Compose files in, Requested Service Specs and warnings out, no Docker.
//!
//! [`load`] reads one or more Compose files (merged in order), the project's `.env`, and the
//! `env_file` and `configs` files they name; interpolates variables; applies profiles; and turns
//! every included Service into a normalised [`ServiceSpec`](ployz_core::ServiceSpec), in
//! dependency order. Nothing here touches Docker or the network.
//!
//! Every problem in the project is collected before returning, so one run shows them all
//! ([`load_partial`] also keeps the Services that did convert, so that their planning problems
//! can be found in the same run):
//! errors ([`ComposeError`]) name the file, the Service, the key, the value and the fix; keys that
//! Ployz does not support (or does not know) are warnings ([`ComposeWarning`]), never silently
//! dropped. Settings that give a container power over its Machine (privileged, capabilities, a
//! bind of `/` or the Docker socket, devices) are accepted with a warning, for the Deploy Preview.
//!
//! **Architecture Invariant:** the loader is pure apart from reading files; it never panics on
//! any input, and two equal configurations always produce equal specs.

mod interp;
mod port;
mod project;
mod service;
mod units;
mod yaml;

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

pub use port::parse_port;
pub use service::build::{BuildSpec, Dockerfile};
pub use service::keys::{key_rule, rule_under, support_matrix, KeyRule, Level, Support, KEY_RULES};

/// What to load: the `-f` files, the `-p` profiles and the process environment.
#[derive(Debug, Clone, Default)]
pub struct ComposeInput {
    /// Compose files, merged in order: a later file overrides an earlier one.
    pub files: Vec<PathBuf>,
    /// Services with `profiles:` are included only if one of them is listed here (`*`: all).
    /// Empty: the profiles `COMPOSE_PROFILES` lists, as Compose reads it.
    pub profiles: Vec<String>,
    /// The process environment (`std::env::vars()`); it wins over the project's `.env`.
    pub env: BTreeMap<String, String>,
}

/// A loaded project: the Requested Service Specs, the named Docker Volumes they use, and the
/// warnings to show before deploying.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedProject {
    /// Every included Service, dependencies first, ties by name.
    pub services: Vec<ployz_core::ServiceSpec>,
    /// The top-level named volumes some included Service mounts, by Docker Volume name.
    pub volumes: Vec<ployz_core::VolumeSpec>,
    /// How the included Services with `build:` have their image built, by Service Name (each
    /// spec's image is the repository to tag it in).
    pub builds: Vec<(ployz_core::ServiceName, BuildSpec)>,
    pub warnings: Vec<ComposeWarning>,
    /// The profiles in effect: [`ComposeInput::profiles`], else those `COMPOSE_PROFILES` lists
    /// (from the environment, else the project's `.env`).
    pub profiles: Vec<String>,
    /// The services left out because none of their profiles is in effect, with those profiles.
    pub left_out: BTreeMap<String, Vec<String>>,
}

/// Something in a Compose file that Ployz accepts but ignores, or that deserves a second look.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComposeWarning {
    pub file: String,
    pub service: Option<String>,
    pub key: String,
    pub message: String,
}

impl fmt::Display for ComposeWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", one_line(&self.file))?;
        if let Some(s) = &self.service {
            write!(f, ": service '{}'", one_line(s))?;
        }
        if !self.key.is_empty() {
            write!(f, ": {}", one_line(&self.key))?;
        }
        write!(f, ": {}", one_line(&self.message))
    }
}

/// One reason a Compose project cannot be deployed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComposeError {
    pub file: String,
    pub service: Option<String>,
    pub key: Option<String>,
    pub value: Option<String>,
    pub message: String,
    pub fix: Option<String>,
}

impl fmt::Display for ComposeError {
    /// One line: `compose.yaml: service 'web': ports[0] '8000-8001:80': <message>; <fix>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", one_line(&self.file))?;
        if let Some(s) = &self.service {
            write!(f, ": service '{}'", one_line(s))?;
        }
        match (&self.key, &self.value) {
            (Some(k), Some(v)) => write!(f, ": {} '{}'", one_line(k), bounded(v, 120))?,
            (Some(k), None) => write!(f, ": {}", one_line(k))?,
            (None, Some(v)) => write!(f, ": '{}'", bounded(v, 120))?,
            (None, None) => {}
        }
        write!(f, ": {}", one_line(&self.message))?;
        if let Some(fix) = &self.fix {
            write!(f, "; {}", one_line(fix))?;
        }
        Ok(())
    }
}

impl std::error::Error for ComposeError {}

/// Every error found in a project, in file order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComposeErrors(pub Vec<ComposeError>);

impl fmt::Display for ComposeErrors {
    /// One error per line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ComposeErrors {}

impl From<ComposeError> for ComposeErrors {
    fn from(e: ComposeError) -> Self {
        ComposeErrors(vec![e])
    }
}

/// Loads a Compose project. Either every included Service converts, or every error found is
/// returned together.
pub fn load(input: &ComposeInput) -> Result<LoadedProject, ComposeErrors> {
    project::load(input)
}

/// A Compose project loaded as far as it goes: what [`load_partial`] returns.
#[derive(Debug, Clone, PartialEq)]
pub struct PartialProject {
    /// The Services that converted without an error (dependencies first, ties by name), the
    /// named volumes they use, and every warning found. A Service named in an error is not
    /// here; none is when the files could not be read or the project as a whole could not be
    /// converted (no services, every one in a disabled profile, a `depends_on` cycle).
    pub project: LoadedProject,
    /// Every error found, in file order; empty when [`load`] would succeed.
    pub errors: Vec<ComposeError>,
}

/// A `COMPOSE_*` setting (`COMPOSE_FILE`, `COMPOSE_PATH_SEPARATOR`, ...) as Compose reads it:
/// the process environment's (`env`), else the one in the `.env` of `dir`. An `.env` that cannot
/// be read gives none here; loading the project reports it.
pub fn compose_setting(
    dir: &std::path::Path,
    name: &str,
    env: &BTreeMap<String, String>,
) -> Option<String> {
    project::setting(dir, name, env)
}

/// Loads a Compose project and keeps what converted even when something did not: the CLI plans
/// those Services to report their planning problems together with the file's errors, and deploys
/// nothing while `errors` is not empty. With no error this is [`load`]'s project.
pub fn load_partial(input: &ComposeInput) -> PartialProject {
    let (project, errors) = project::load_partial(input);
    PartialProject { project, errors }
}

/// Text with its line breaks escaped and its length bounded, so every message stays one line.
fn one_line(s: &str) -> String {
    bounded(s, 1000)
}

/// [`one_line`] with a custom bound, for values that may be long (file contents, commands).
fn bounded(s: &str, max: usize) -> String {
    let mut out = String::with_capacity(s.len().min(max + 3));
    for (i, c) in s.chars().enumerate() {
        if i >= max {
            out.push_str("...");
            break;
        }
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push('?'),
            c => out.push(c),
        }
    }
    out
}

/// Errors and warnings collected while loading.
#[derive(Debug, Default)]
pub(crate) struct Diagnostics {
    pub errors: Vec<ComposeError>,
    pub warnings: Vec<ComposeWarning>,
    /// The variables interpolation put into the files, with their values: an error shows a
    /// value as the file had it after interpolation, so these are taken back out of it
    /// ([`Diagnostics::into_errors`]).
    pub substituted: std::collections::BTreeMap<String, String>,
}

/// A substituted value shorter than this stays in messages: no secret is that short, and
/// replacing every `80` or `on` would garble them.
const REDACTED_FROM: usize = 3;

impl Diagnostics {
    /// The errors, with every value interpolation put into the files shown as the reference
    /// that brought it (`${NAME}`): it may come from an env file or the environment, where
    /// secrets live, and a message names where a value came from, never the value.
    pub(crate) fn into_errors(self) -> Vec<ComposeError> {
        let mut values: Vec<(&String, &String)> = self
            .substituted
            .iter()
            .filter(|(_, v)| v.chars().count() >= REDACTED_FROM)
            .collect();
        // The longest first, so a value inside another is not replaced within it.
        values.sort_by_key(|(_, v)| std::cmp::Reverse(v.len()));
        let redact = |text: &mut String| {
            for (name, value) in &values {
                if text.contains(value.as_str()) {
                    *text = text.replace(value.as_str(), &format!("${{{name}}}"));
                }
            }
        };
        let mut errors = self.errors;
        for e in &mut errors {
            if let Some(v) = &mut e.value {
                redact(v);
            }
            redact(&mut e.message);
            if let Some(fix) = &mut e.fix {
                redact(fix);
            }
        }
        errors
    }

    pub(crate) fn error(
        &mut self,
        file: &str,
        service: Option<&str>,
        key: Option<&str>,
        value: Option<String>,
        message: impl Into<String>,
        fix: Option<String>,
    ) {
        let e = ComposeError {
            file: file.to_owned(),
            service: service.map(str::to_owned),
            key: key.map(str::to_owned),
            value,
            message: message.into(),
            fix,
        };
        if !self.errors.contains(&e) {
            self.errors.push(e);
        }
    }

    pub(crate) fn warn(
        &mut self,
        file: &str,
        service: Option<&str>,
        key: &str,
        message: impl Into<String>,
    ) {
        let w = ComposeWarning {
            file: file.to_owned(),
            service: service.map(str::to_owned),
            key: key.to_owned(),
            message: message.into(),
        };
        if !self.warnings.contains(&w) {
            self.warnings.push(w);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_display_on_one_line_with_every_part() {
        let e = ComposeError {
            file: "compose.yaml".into(),
            service: Some("web".into()),
            key: Some("ports[0]".into()),
            value: Some("8000-8001:80".into()),
            message: "published port ranges are not supported".into(),
            fix: Some("publish each port on its own line".into()),
        };
        assert_eq!(
            e.to_string(),
            "compose.yaml: service 'web': ports[0] '8000-8001:80': published port ranges are not supported; publish each port on its own line"
        );
        let bare = ComposeError {
            file: "a.yaml".into(),
            service: None,
            key: None,
            value: Some("x\ny".into()),
            message: "m".into(),
            fix: None,
        };
        assert_eq!(bare.to_string(), "a.yaml: 'x\\ny': m");
        let all = ComposeErrors(vec![e.clone(), bare]);
        assert_eq!(all.to_string().lines().count(), 2);
        let w = ComposeWarning {
            file: "compose.yaml".into(),
            service: Some("web".into()),
            key: "dns".into(),
            message: "is not supported".into(),
        };
        assert_eq!(
            w.to_string(),
            "compose.yaml: service 'web': dns: is not supported"
        );
    }

    fn input_for(text: &str) -> (tempfile::TempDir, ComposeInput) {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("compose.yaml");
        std::fs::write(&file, text).unwrap();
        let input = ComposeInput {
            files: vec![file],
            ..Default::default()
        };
        (dir, input)
    }

    #[test]
    fn a_partial_load_keeps_the_services_that_converted() {
        let (_dir, input) = input_for(
            "services:\n  web:\n    image: app:1\n    mem_limit: lots\n  \
             api:\n    image: app:1\n    unknown_thing: 1\n  db:\n    image: db:1\n    cpus: many\n",
        );
        let partial = load_partial(&input);
        let names: Vec<&str> = partial
            .project
            .services
            .iter()
            .map(|s| s.name.as_str())
            .collect();
        assert_eq!(names, ["api"]);
        let refused: Vec<Option<&str>> = partial
            .errors
            .iter()
            .map(|e| e.service.as_deref())
            .collect();
        assert_eq!(refused, [Some("web"), Some("db")], "{:?}", partial.errors);
        assert!(
            partial
                .project
                .warnings
                .iter()
                .any(|w| w.key == "unknown_thing"),
            "{:?}",
            partial.project.warnings
        );
        // `load` refuses the same project with the same errors.
        assert_eq!(load(&input).unwrap_err().0, partial.errors);
    }

    #[test]
    fn a_partial_load_of_a_good_project_is_the_load() {
        let (_dir, input) = input_for("services:\n  web:\n    image: app:1\n");
        let partial = load_partial(&input);
        assert!(partial.errors.is_empty());
        assert_eq!(Ok(partial.project), load(&input));
        let (_dir, broken) = input_for("services: [\n");
        let partial = load_partial(&broken);
        assert!(partial.project.services.is_empty());
        assert!(!partial.errors.is_empty());
    }
}
