//! The CLI's config file: named contexts, each a list of connections tried in order.
//!
//! Default path `~/.config/ployz/config.yaml` (`$XDG_CONFIG_HOME` respected), or `--ployz-config`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};
use serde::{Deserialize, Serialize};

use crate::connection::ConnectionConfig;

/// The whole file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CliConfig {
    /// The context used when none is named.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_context: Option<String>,
    #[serde(default)]
    pub contexts: BTreeMap<String, ContextConfig>,
}

/// One context: how to reach one Cluster.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContextConfig {
    /// Tried in order; the first that answers is used.
    #[serde(default)]
    pub connections: Vec<ConnectionConfig>,
}

/// The config file's default location.
pub fn default_path() -> PathBuf {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))
        .unwrap_or_else(|| PathBuf::from(".config"));
    base.join("ployz").join("config.yaml")
}

impl CliConfig {
    /// Reads the file; a missing file is an empty config.
    pub fn load(path: &Path) -> anyhow::Result<CliConfig> {
        match std::fs::read_to_string(path) {
            Ok(text) => serde_yaml_ng::from_str(&text)
                .with_context(|| format!("config file {} is invalid", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(CliConfig::default()),
            Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
        }
    }

    /// Writes the file atomically, creating its directory.
    pub fn save(&self, path: &Path) -> anyhow::Result<()> {
        let dir = path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let text = serde_yaml_ng::to_string(self)?;
        let tmp = path.with_extension("yaml.tmp");
        std::fs::write(&tmp, text).with_context(|| format!("cannot write {}", tmp.display()))?;
        std::fs::rename(&tmp, path)
            .with_context(|| format!("cannot replace {}", path.display()))?;
        Ok(())
    }

    /// A context by name, or an error listing the ones that exist.
    pub fn context(&self, name: &str) -> anyhow::Result<&ContextConfig> {
        match self.contexts.get(name) {
            Some(c) => Ok(c),
            None if self.contexts.is_empty() => {
                bail!("context '{name}' does not exist and none are configured; add one with `ployz ctx add {name} --connect URL`")
            }
            None => bail!(
                "context '{name}' does not exist; known contexts: {}",
                self.contexts.keys().cloned().collect::<Vec<_>>().join(", ")
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_round_trips_and_refuses_unknown_keys() {
        let text = "current_context: prod\ncontexts:\n  prod:\n    connections:\n      - ssh: root@h:22\n      - unix: /run/ployz/ployz.sock\n";
        let c: CliConfig = serde_yaml_ng::from_str(text).unwrap();
        assert_eq!(c.current_context.as_deref(), Some("prod"));
        assert_eq!(c.contexts["prod"].connections.len(), 2);
        let back: CliConfig =
            serde_yaml_ng::from_str(&serde_yaml_ng::to_string(&c).unwrap()).unwrap();
        assert_eq!(back, c);
        assert!(serde_yaml_ng::from_str::<CliConfig>("contxts: {}").is_err());
    }

    #[test]
    fn a_missing_context_lists_the_known_ones() {
        let mut c = CliConfig::default();
        c.contexts.insert("a".into(), ContextConfig::default());
        let err = c.context("b").unwrap_err().to_string();
        assert!(err.contains("known contexts: a"), "{err}");
    }
}
