//! Human-facing selectors that may be ambiguous: Machine Name and Service Name.
//!
//! A Machine Name is a DNS label: 1 to 63 characters of lowercase letters, digits and hyphens,
//! starting and ending with a letter or digit. A Service Name is what Compose accepts for a
//! service (`[a-zA-Z0-9._-]+`), 1 to 63 characters, kept exactly as written; where it appears in
//! DNS (`.internal` names) its Service DNS Label is used instead ([`ServiceName::dns_label`]).
//! A name is never an identity; two Machines or two Services may carry the same one (Name
//! Ambiguity).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The longest DNS label. A Service Name has the same bound: its DNS label is at most as long as
/// the name, so every accepted name has a valid label.
const MAX_LABEL_LEN: usize = 63;

/// The characters a Machine Name may hold, as messages say it.
const MACHINE_ALLOWED: &str = "lowercase letters, digits and '-'";

/// The characters a Service Name may hold (the Compose specification's rule), as messages say it.
const SERVICE_ALLOWED: &str = "letters, digits, '_', '.' and '-'";

/// Which rule of a name a text broke, with what to do about it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NameError {
    #[error("{kind} must not be empty; use 1 to 63 {allowed}")]
    Empty {
        kind: &'static str,
        allowed: &'static str,
    },
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
    #[error("{kind} '{value}' has '{ch}' at position {position}; only {allowed} are allowed")]
    InvalidCharacter {
        kind: &'static str,
        value: String,
        ch: char,
        position: usize,
        allowed: &'static str,
    },
    #[error("{kind} '{value}' must start and end with a letter or digit, not '-'")]
    EdgeHyphen { kind: &'static str, value: String },
    #[error(
        "{kind} '{value}' has no letter or digit, so it has no DNS label (the name lowercased, \
         '_' and '.' turned to '-', edge '-' dropped); add a letter or digit"
    )]
    NoLetterOrDigit { kind: &'static str, value: String },
}

/// The checks both names share: not empty, at most 63 characters, only `allowed(c)` characters.
fn validate_common(
    kind: &'static str,
    value: &str,
    allowed_text: &'static str,
    allowed: impl Fn(char) -> bool,
) -> Result<(), NameError> {
    if value.is_empty() {
        return Err(NameError::Empty {
            kind,
            allowed: allowed_text,
        });
    }
    let len = value.chars().count();
    if len > MAX_LABEL_LEN {
        return Err(NameError::TooLong {
            kind,
            value: value.to_owned(),
            len,
        });
    }
    if let Some((position, ch)) = value.chars().enumerate().find(|(_, c)| !allowed(*c)) {
        return Err(NameError::InvalidCharacter {
            kind,
            value: value.to_owned(),
            ch,
            position: position + 1,
            allowed: allowed_text,
        });
    }
    Ok(())
}

/// A DNS label: lowercase letters, digits and inner hyphens, 1 to 63 characters.
fn validate_label(kind: &'static str, value: &str) -> Result<(), NameError> {
    if !value.is_empty()
        && value.chars().count() <= MAX_LABEL_LEN
        && value.chars().any(|c| c.is_ascii_uppercase())
        && value.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
    {
        return Err(NameError::Uppercase {
            kind,
            value: value.to_owned(),
            suggestion: value.to_ascii_lowercase(),
        });
    }
    validate_common(
        kind,
        value,
        MACHINE_ALLOWED,
        |c| matches!(c, 'a'..='z' | '0'..='9' | '-'),
    )?;
    if value.starts_with('-') || value.ends_with('-') {
        return Err(NameError::EdgeHyphen {
            kind,
            value: value.to_owned(),
        });
    }
    Ok(())
}

/// A Compose service name (`[a-zA-Z0-9._-]+`), 1 to 63 characters, with at least one letter or
/// digit so that its DNS label is not empty.
fn validate_service(kind: &'static str, value: &str) -> Result<(), NameError> {
    validate_common(kind, value, SERVICE_ALLOWED, |c| {
        c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')
    })?;
    if !value.chars().any(|c| c.is_ascii_alphanumeric()) {
        return Err(NameError::NoLetterOrDigit {
            kind,
            value: value.to_owned(),
        });
    }
    Ok(())
}

macro_rules! label_name {
    ($(#[$doc:meta])* $name:ident, $kind:literal, $validate:ident) => {
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
                $validate($kind, s)?;
                Ok(Self(s.to_owned()))
            }
        }

        impl TryFrom<String> for $name {
            type Error = NameError;
            fn try_from(s: String) -> Result<Self, NameError> {
                $validate($kind, &s)?;
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
    "Machine Name",
    validate_label
);

label_name!(
    /// A human-facing selector for a Service; it may resolve to several Service IDs. Kept as
    /// written (case included): labels, listings and selectors show and match it exactly.
    ServiceName,
    "Service Name",
    validate_service
);

impl ServiceName {
    /// The Service DNS Label: the name lowercased, `_` and `.` turned to `-`, leading and
    /// trailing `-` dropped (`My_App` -> `my-app`, `_app` -> `app`). Never empty and at most 63
    /// characters, since parsing refuses a name without a letter or digit. It is what DNS answers
    /// for (`<label>.internal`); two Services whose labels are equal share those answers.
    pub fn dns_label(&self) -> String {
        let mapped: String = self
            .0
            .chars()
            .map(|c| match c {
                '_' | '.' => '-',
                c => c.to_ascii_lowercase(),
            })
            .collect();
        mapped.trim_matches('-').to_owned()
    }

    /// The start of the names of this Service's containers: the name as written without the
    /// leading `_`, `.` or `-`, since Docker wants a container name to start with a letter or
    /// digit. Never empty.
    pub fn container_stem(&self) -> &str {
        self.0
            .trim_start_matches(|c: char| !c.is_ascii_alphanumeric())
    }
}

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
    fn service_names_are_what_compose_accepts_kept_as_written() {
        let long = "A_b.".repeat(15) + "xyz";
        for ok in [
            "web",
            "web_1",
            "my_app",
            "My-App",
            "WEB",
            "api.v2",
            "_app",
            ".hidden",
            "-x-",
            "0",
            "a__b",
            long.as_str(),
        ] {
            let name = ok.parse::<ServiceName>().unwrap();
            assert_eq!(name.as_str(), ok);
            assert_eq!(name.to_string(), ok);
            let back: ServiceName =
                serde_json::from_str(&serde_json::to_string(&name).unwrap()).unwrap();
            assert_eq!(back, name);
        }
    }

    #[test]
    fn each_broken_service_name_rule_is_named() {
        let cases: &[(&str, &str)] = &[
            (
                "",
                "must not be empty; use 1 to 63 letters, digits, '_', '.' and '-'",
            ),
            (&"x".repeat(64), "is 64 characters long; the limit is 63"),
            (
                "a b",
                "has ' ' at position 2; only letters, digits, '_', '.' and '-' are allowed",
            ),
            ("../etc", "has '/' at position 3"),
            ("web:1", "has ':' at position 4"),
            ("café", "has 'é' at position 4"),
            ("___", "has no letter or digit, so it has no DNS label"),
            ("-", "add a letter or digit"),
            ("._-", "has no letter or digit"),
        ];
        for (input, expected) in cases {
            let err = input.parse::<ServiceName>().unwrap_err().to_string();
            assert!(err.contains(expected), "{input:?}: {err}");
            assert!(err.starts_with("Service Name"), "{err}");
        }
        // Deserialising applies the same rule.
        let err = serde_json::from_str::<ServiceName>("\"a b\"").unwrap_err();
        assert!(err.to_string().contains("has ' ' at position 2"), "{err}");
    }

    #[test]
    fn the_dns_label_is_lowercase_with_hyphens_and_no_edge_hyphens() {
        let cases = [
            ("web", "web"),
            ("my_app", "my-app"),
            ("My_App", "my-app"),
            ("WEB", "web"),
            ("api.v2", "api-v2"),
            ("_app", "app"),
            ("app_", "app"),
            ("__a.b__", "a-b"),
            ("-x-", "x"),
            ("a__b", "a--b"),
            ("0", "0"),
        ];
        for (name, label) in cases {
            let n: ServiceName = name.parse().unwrap();
            assert_eq!(n.dns_label(), label, "{name}");
        }
        let long: ServiceName = "A".repeat(63).parse().unwrap();
        assert_eq!(long.dns_label(), "a".repeat(63));
    }

    #[test]
    fn the_container_stem_starts_with_a_letter_or_digit() {
        let cases = [
            ("web", "web"),
            ("My_App", "My_App"),
            ("_app", "app"),
            ("._x.y_", "x.y_"),
            ("-0", "0"),
        ];
        for (name, stem) in cases {
            let n: ServiceName = name.parse().unwrap();
            assert_eq!(n.container_stem(), stem, "{name}");
        }
    }

    #[test]
    fn machine_names_stay_dns_labels() {
        for bad in ["web_1", "My-Laptop", "api.v2", "_x"] {
            assert!(bad.parse::<MachineName>().is_err(), "{bad}");
        }
        let err = "".parse::<MachineName>().unwrap_err().to_string();
        assert!(
            err.contains("use 1 to 63 lowercase letters, digits and '-'"),
            "{err}"
        );
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
