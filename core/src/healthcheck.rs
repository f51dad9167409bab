//! Healthchecks: a present probe declaration, Disabled or Configured.
//!
//! There is no third kind: where a Service declares nothing, the value is `Option::None`, which
//! means the image's probe is inherited or there is none.

use serde::{Deserialize, Serialize};

/// A present probe declaration on a Service Container.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Healthcheck {
    /// An explicit Healthcheck that turns probing off (Compose `disable: true` or `test: ["NONE"]`).
    Disabled,
    /// A probe with a non-empty command.
    Configured(ConfiguredHealthcheck),
}

/// A Healthcheck with a non-empty command that probes the container. Durations are milliseconds;
/// `None` means Docker's default for that field.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ConfiguredHealthcheck {
    test: Vec<String>,
    /// Time between probes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval_ms: Option<u64>,
    /// Time one probe may take.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Consecutive failures before the container is unhealthy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retries: Option<u32>,
    /// Grace period during which failures do not count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_period_ms: Option<u64>,
    /// Time between probes during the start period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_interval_ms: Option<u64>,
}

/// Why a probe declaration is not a Configured Healthcheck.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a configured healthcheck needs a non-empty test command, e.g. [\"CMD\", \"wget\", \"-q\", \"-O-\", \"http://localhost/\"]")]
pub struct EmptyHealthcheckCommand;

impl ConfiguredHealthcheck {
    /// A probe running `test` (Docker's form: `["CMD", ...]`, `["CMD-SHELL", "..."]`), with every
    /// timing left to Docker's defaults.
    pub fn new(test: Vec<String>) -> Result<Self, EmptyHealthcheckCommand> {
        let has_command = match test.first().map(String::as_str) {
            Some("CMD") | Some("CMD-SHELL") => test.iter().skip(1).any(|s| !s.is_empty()),
            Some(_) => test.iter().any(|s| !s.is_empty()),
            None => false,
        };
        if !has_command {
            return Err(EmptyHealthcheckCommand);
        }
        Ok(ConfiguredHealthcheck {
            test,
            interval_ms: None,
            timeout_ms: None,
            retries: None,
            start_period_ms: None,
            start_interval_ms: None,
        })
    }

    /// The probe command in Docker's form.
    pub fn test(&self) -> &[String] {
        &self.test
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_configured_healthcheck_needs_a_command() {
        assert!(ConfiguredHealthcheck::new(vec![]).is_err());
        assert!(ConfiguredHealthcheck::new(vec!["CMD".into()]).is_err());
        assert!(ConfiguredHealthcheck::new(vec!["CMD-SHELL".into(), "".into()]).is_err());
        let hc = ConfiguredHealthcheck::new(vec!["CMD".into(), "true".into()]).unwrap();
        assert_eq!(hc.test(), ["CMD", "true"]);
    }

    #[test]
    fn absence_is_none_not_a_third_kind() {
        let absent: Option<Healthcheck> = serde_json::from_str("null").unwrap();
        assert_eq!(absent, None);
        let disabled: Option<Healthcheck> = serde_json::from_str(r#"{"kind":"disabled"}"#).unwrap();
        assert_eq!(disabled, Some(Healthcheck::Disabled));
    }
}
