//! Human-facing selectors that may be ambiguous: Machine Name and Service Name.
//!
//! Both are DNS labels (they appear in `.internal` names): 1 to 63 characters of lowercase
//! letters, digits and hyphens, starting and ending with a letter or digit. A name is never an
//! identity; two Machines or two Services may carry the same one (Name Ambiguity).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The longest DNS label.
const MAX_LABEL_LEN: usize = 63;

/// Which rule of a DNS-label name a text broke, with what to do about it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NameError {
    #[error("{kind} must not be empty; use 1 to 63 lowercase letters, digits or hyphens")]
    Empty { kind: &'static str },
    #[error("{kind} '{value}' is {len} characters long; the limit is 63 (a DNS label)")]
    TooLong {
        kind: &'static str,
        value: String,
        len: usize,
    },
    #[error("{kind} '{value}' has uppercase letters; names are lowercase, try '{suggestion}'")]
    Uppercase {
        kind: &'static str,
        value: String,
        suggestion: String,
    },
    #[error(
        "{kind} '{value}' has '{ch}' at position {position}; only lowercase letters, digits and '-' are allowed"
    )]
    InvalidCharacter {
        kind: &'static str,
        value: String,
        ch: char,
        position: usize,
    },
    #[error("{kind} '{value}' must start and end with a letter or digit, not '-'")]
    EdgeHyphen { kind: &'static str, value: String },
}

fn validate_label(kind: &'static str, value: &str) -> Result<(), NameError> {
    if value.is_empty() {
        return Err(NameError::Empty { kind });
    }
    let len = value.chars().count();
    if len > MAX_LABEL_LEN {
        return Err(NameError::TooLong {
            kind,
            value: value.to_owned(),
            len,
        });
    }
    if value.chars().any(|c| c.is_ascii_uppercase())
        && value.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
    {
        return Err(NameError::Uppercase {
            kind,
            value: value.to_owned(),
            suggestion: value.to_ascii_lowercase(),
        });
    }
    if let Some((position, ch)) = value
        .chars()
        .enumerate()
        .find(|(_, c)| !matches!(c, 'a'..='z' | '0'..='9' | '-'))
    {
        return Err(NameError::InvalidCharacter {
            kind,
            value: value.to_owned(),
            ch,
            position: position + 1,
        });
    }
    if value.starts_with('-') || value.ends_with('-') {
        return Err(NameError::EdgeHyphen {
            kind,
            value: value.to_owned(),
        });
    }
    Ok(())
}

macro_rules! label_name {
    ($(#[$doc:meta])* $name:ident, $kind:literal) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// The name as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl FromStr for $name {
            type Err = NameError;
            fn from_str(s: &str) -> Result<Self, NameError> {
                validate_label($kind, s)?;
                Ok(Self(s.to_owned()))
            }
        }

        impl TryFrom<String> for $name {
            type Error = NameError;
            fn try_from(s: String) -> Result<Self, NameError> {
                validate_label($kind, &s)?;
                Ok(Self(s))
            }
        }

        impl From<$name> for String {
            fn from(n: $name) -> String {
                n.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({:?})", stringify!($name), self.0)
            }
        }
    };
}

label_name!(
    /// A human-facing selector for a Machine. Not an identity and not unique.
    MachineName,
    "Machine Name"
);

label_name!(
    /// A human-facing selector for a Service; it may resolve to several Service IDs.
    ServiceName,
    "Service Name"
);

impl MachineName {
    /// A Machine Name made from a hostname: its first label, lowercased, with every character
    /// outside `[a-z0-9-]` replaced by `-`, runs of `-` folded, edges trimmed and cut to 63.
    /// `None` when nothing usable is left (the caller picks a fallback such as `machine-xxxx`).
    pub fn sanitize_hostname(hostname: &str) -> Option<MachineName> {
        let short = hostname.trim().split('.').next().unwrap_or("");
        let mut out = String::with_capacity(short.len());
        for c in short.chars() {
            let c = c.to_ascii_lowercase();
            let c = if matches!(c, 'a'..='z' | '0'..='9') {
                c
            } else {
                '-'
            };
            if c == '-' && (out.is_empty() || out.ends_with('-')) {
                continue;
            }
            out.push(c);
        }
        out.truncate(MAX_LABEL_LEN);
        while out.ends_with('-') {
            out.pop();
        }
        out.parse().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_labels_parse() {
        for ok in ["a", "web", "web-1", "0day", &"x".repeat(63)] {
            assert_eq!(ok.parse::<ServiceName>().unwrap().as_str(), ok);
        }
    }

    #[test]
    fn each_broken_rule_is_named() {
        let cases: &[(&str, &str)] = &[
            ("", "must not be empty"),
            (&"x".repeat(64), "is 64 characters long; the limit is 63"),
            (
                "Web",
                "has uppercase letters; names are lowercase, try 'web'",
            ),
            ("web_1", "has '_' at position 4"),
            ("../etc", "has '.' at position 1"),
            ("a b", "has ' ' at position 2"),
            ("-web", "must start and end with a letter or digit"),
            ("web-", "must start and end with a letter or digit"),
        ];
        for (input, expected) in cases {
            let err = input.parse::<MachineName>().unwrap_err().to_string();
            assert!(err.contains(expected), "{input:?}: {err}");
            assert!(err.starts_with("Machine Name"), "{err}");
        }
    }

    #[test]
    fn hostnames_are_sanitised_into_names() {
        let cases = [
            ("web1.example.com", Some("web1")),
            ("My_Laptop", Some("my-laptop")),
            ("--x--y--", Some("x-y")),
            ("___", None),
            ("", None),
        ];
        for (host, want) in cases {
            let got = MachineName::sanitize_hostname(host);
            assert_eq!(got.as_ref().map(|n| n.as_str()), want, "{host}");
        }
        let long = "a".repeat(80);
        assert_eq!(
            MachineName::sanitize_hostname(&long)
                .unwrap()
                .as_str()
                .len(),
            63
        );
    }
}
