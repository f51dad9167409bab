//! Partial Results: successes and per-target failures together.

use serde::{Deserialize, Serialize};

/// A command or fan-out result holding every successful value and every target that failed or
/// was left out. Failures are an expected outcome, not a reason to discard the successes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartialResult<T> {
    /// What the targets that answered returned.
    pub values: Vec<T>,
    /// One entry per target that failed or was omitted.
    #[serde(default)]
    pub failures: Vec<TargetFailure>,
}

/// Why one target of a fan-out contributed nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetFailure {
    /// The target as the caller knows it (a Machine ID, or a Machine Name where no ID is known).
    pub target: String,
    /// What went wrong, in a sentence.
    pub reason: String,
}

impl<T> PartialResult<T> {
    /// A result every target answered.
    pub fn complete(values: Vec<T>) -> Self {
        PartialResult {
            values,
            failures: Vec::new(),
        }
    }

    /// Whether some target failed or was omitted.
    pub fn is_partial(&self) -> bool {
        !self.failures.is_empty()
    }
}

impl<T> Default for PartialResult<T> {
    fn default() -> Self {
        PartialResult::complete(Vec::new())
    }
}
