//! Durable opaque identities: Machine ID, Service ID and Container ID.
//!
//! An identity never changes and never means anything to a person; the human-facing selectors
//! (Machine Name, Service Name, container display names) are separate types in [`crate::name`].

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Length in hex characters of the identities Ployz generates (128 random bits).
const GENERATED_ID_LEN: usize = 32;

/// Why a text is not a valid identity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IdError {
    #[error("{kind} '{value}' must be {GENERATED_ID_LEN} lowercase hex characters, it has {len}")]
    WrongLength {
        kind: &'static str,
        value: String,
        len: usize,
    },
    #[error("{kind} '{value}' must be lowercase hex (0-9, a-f); '{ch}' is not")]
    NotLowercaseHex {
        kind: &'static str,
        value: String,
        ch: char,
    },
    #[error("{kind} must not be empty")]
    Empty { kind: &'static str },
}

fn validate_generated(kind: &'static str, value: &str) -> Result<(), IdError> {
    if value.len() != GENERATED_ID_LEN {
        return Err(IdError::WrongLength {
            kind,
            value: value.to_owned(),
            len: value.chars().count(),
        });
    }
    if let Some(ch) = value.chars().find(|c| !matches!(c, '0'..='9' | 'a'..='f')) {
        return Err(IdError::NotLowercaseHex {
            kind,
            value: value.to_owned(),
            ch,
        });
    }
    Ok(())
}

fn generate_hex() -> String {
    let bytes: [u8; GENERATED_ID_LEN / 2] = rand::random();
    hex::encode(bytes)
}

/// Defines an identity Ployz generates: 32 lowercase hex characters, validated on parse and on
/// deserialisation, so a malformed identity never enters the program.
macro_rules! generated_id {
    ($(#[$doc:meta])* $name:ident, $kind:literal) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// A new random identity.
            pub fn generate() -> Self {
                Self(generate_hex())
            }

            /// The identity as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl FromStr for $name {
            type Err = IdError;
            fn from_str(s: &str) -> Result<Self, IdError> {
                validate_generated($kind, s)?;
                Ok(Self(s.to_owned()))
            }
        }

        impl TryFrom<String> for $name {
            type Error = IdError;
            fn try_from(s: String) -> Result<Self, IdError> {
                validate_generated($kind, &s)?;
                Ok(Self(s))
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), self.0)
            }
        }
    };
}

generated_id!(
    /// The durable opaque identity of one Machine. Distinct from its mutable Machine Name.
    MachineId,
    "Machine ID"
);

generated_id!(
    /// The identity of one Cluster, created by `ployz machine init` on its first Machine and
    /// handed to every Machine that joins it: what tells "already in this Cluster" from
    /// "in another Cluster".
    ClusterId,
    "Cluster ID"
);

generated_id!(
    /// The durable opaque identity that groups Service Containers into a Service. Assigned on a
    /// Service's first Deploy. Distinct from the Service Name.
    ServiceId,
    "Service ID"
);

/// The durable runtime identity of one managed Docker container, as Docker assigned it.
/// Generated container names are display values, not identities.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ContainerId(String);

impl ContainerId {
    /// The identity as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for ContainerId {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, IdError> {
        Self::try_from(s.to_owned())
    }
}

impl TryFrom<String> for ContainerId {
    type Error = IdError;
    fn try_from(s: String) -> Result<Self, IdError> {
        if s.is_empty() {
            return Err(IdError::Empty {
                kind: "Container ID",
            });
        }
        if let Some(ch) = s.chars().find(|c| !matches!(c, '0'..='9' | 'a'..='f')) {
            return Err(IdError::NotLowercaseHex {
                kind: "Container ID",
                value: s,
                ch,
            });
        }
        Ok(Self(s))
    }
}

impl From<ContainerId> for String {
    fn from(id: ContainerId) -> String {
        id.0
    }
}

impl fmt::Display for ContainerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ContainerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ContainerId({})", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_are_32_lowercase_hex_and_distinct() {
        let a = MachineId::generate();
        let b = MachineId::generate();
        assert_eq!(a.as_str().len(), 32);
        assert!(a
            .as_str()
            .chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_ne!(a, b);
        assert_eq!(a.as_str().parse::<MachineId>().unwrap(), a);
    }

    #[test]
    fn malformed_ids_are_refused_with_the_rule_they_broke() {
        let err = "abc".parse::<ServiceId>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "Service ID 'abc' must be 32 lowercase hex characters, it has 3"
        );
        let err = "0123456789ABCDEF0123456789abcdef"
            .parse::<MachineId>()
            .unwrap_err();
        assert!(matches!(err, IdError::NotLowercaseHex { ch: 'A', .. }));
        assert!("".parse::<ContainerId>().is_err());
        assert!(serde_json::from_str::<MachineId>("\"nope\"").is_err());
    }

    #[test]
    fn ids_serialise_as_plain_strings() {
        let id: MachineId = "0123456789abcdef0123456789abcdef".parse().unwrap();
        assert_eq!(
            serde_json::to_string(&id).unwrap(),
            "\"0123456789abcdef0123456789abcdef\""
        );
    }
}
