//! Keys: who may write a record, and where it sorts.
//!
//! On disk a key is `m/<namespace>/<machine-id>/<name>` (machine-owned) or `c/<namespace>/<name>`
//! (cluster-scoped). The namespace comes first so that one prefix scan finds a kind of record
//! across every Machine (say, every container observation), and a longer one narrows to one
//! Machine.

use std::fmt;
use std::str::FromStr;

use ployz_core::MachineId;
use serde::{Deserialize, Serialize};

use crate::StoreError;

/// Who may write a key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Owner {
    /// Only this Machine writes the key; it holds that Machine's observations.
    Machine(MachineId),
    /// Any Machine writes the key; the last writer by HLC wins, ties broken by Machine ID.
    Cluster,
}

/// A record's key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Key {
    owner: Owner,
    namespace: String,
    name: String,
}

fn check_namespace(namespace: &str) {
    assert!(
        !namespace.is_empty() && !namespace.contains('/'),
        "a key namespace is a non-empty word without '/', got {namespace:?}"
    );
}

impl Key {
    /// A machine-owned key: only `machine` writes it.
    ///
    /// # Panics
    /// If `namespace` is empty or contains `/`; namespaces are constants in code, not input.
    pub fn machine(machine: &MachineId, namespace: &str, name: impl Into<String>) -> Key {
        check_namespace(namespace);
        Key {
            owner: Owner::Machine(machine.clone()),
            namespace: namespace.to_owned(),
            name: name.into(),
        }
    }

    /// A cluster-scoped key: any Machine writes it, last writer wins.
    ///
    /// # Panics
    /// If `namespace` is empty or contains `/`; namespaces are constants in code, not input.
    pub fn cluster(namespace: &str, name: impl Into<String>) -> Key {
        check_namespace(namespace);
        Key {
            owner: Owner::Cluster,
            namespace: namespace.to_owned(),
            name: name.into(),
        }
    }

    /// Who may write this key.
    pub fn owner(&self) -> &Owner {
        &self.owner
    }

    /// The kind of record (`machines`, `containers`, ...).
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The record's name within its namespace (and Machine, for machine-owned keys).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The on-disk form: what [`Display`](fmt::Display) shows, as bytes.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let parts: [&str; 3] = match &self.owner {
            Owner::Machine(m) => ["m/", &self.namespace, m.as_str()],
            Owner::Cluster => ["c/", &self.namespace, ""],
        };
        let mut out =
            Vec::with_capacity(parts.iter().map(|p| p.len() + 1).sum::<usize>() + self.name.len());
        out.extend_from_slice(parts[0].as_bytes());
        out.extend_from_slice(parts[1].as_bytes());
        out.push(b'/');
        if !parts[2].is_empty() {
            out.extend_from_slice(parts[2].as_bytes());
            out.push(b'/');
        }
        out.extend_from_slice(self.name.as_bytes());
        out
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<Key, StoreError> {
        let s = std::str::from_utf8(bytes)
            .map_err(|_| StoreError::Malformed("key is not UTF-8".into()))?;
        s.parse()
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.owner {
            Owner::Machine(m) => write!(f, "m/{}/{}/{}", self.namespace, m, self.name),
            Owner::Cluster => write!(f, "c/{}/{}", self.namespace, self.name),
        }
    }
}

impl FromStr for Key {
    type Err = StoreError;
    fn from_str(s: &str) -> Result<Key, StoreError> {
        let bad = || StoreError::Malformed(format!("'{s}' is not a store key"));
        let (kind, rest) = s.split_once('/').ok_or_else(bad)?;
        let (namespace, rest) = rest.split_once('/').ok_or_else(bad)?;
        if namespace.is_empty() {
            return Err(bad());
        }
        match kind {
            "m" => {
                let (machine, name) = rest.split_once('/').ok_or_else(bad)?;
                let machine: MachineId = machine.parse().map_err(|_| bad())?;
                Ok(Key {
                    owner: Owner::Machine(machine),
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                })
            }
            "c" => Ok(Key {
                owner: Owner::Cluster,
                namespace: namespace.to_owned(),
                name: rest.to_owned(),
            }),
            _ => Err(bad()),
        }
    }
}

impl TryFrom<String> for Key {
    type Error = StoreError;
    fn try_from(s: String) -> Result<Key, StoreError> {
        s.parse()
    }
}

impl From<Key> for String {
    fn from(k: Key) -> String {
        k.to_string()
    }
}

/// A prefix of keys, for scans and watches.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KeyPrefix(String);

impl KeyPrefix {
    /// Every key.
    pub fn everything() -> KeyPrefix {
        KeyPrefix(String::new())
    }

    /// Every machine-owned key of a namespace, of every Machine.
    pub fn machine_namespace(namespace: &str) -> KeyPrefix {
        check_namespace(namespace);
        KeyPrefix(format!("m/{namespace}/"))
    }

    /// Every machine-owned key of a namespace written by one Machine.
    pub fn machine_namespace_of(namespace: &str, machine: &MachineId) -> KeyPrefix {
        check_namespace(namespace);
        KeyPrefix(format!("m/{namespace}/{machine}/"))
    }

    /// Every cluster-scoped key of a namespace.
    pub fn cluster_namespace(namespace: &str) -> KeyPrefix {
        check_namespace(namespace);
        KeyPrefix(format!("c/{namespace}/"))
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }

    /// Whether a key starts with this prefix.
    pub fn matches(&self, key: &Key) -> bool {
        // Keys are short; formatting once per watch event is cheaper than it looks and keeps
        // one definition of the encoding.
        key.to_string().starts_with(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_through_their_encoding() {
        let m = MachineId::generate();
        for key in [
            Key::machine(&m, "containers", "abc/def"),
            Key::cluster("certificates", "app.example.com"),
            Key::cluster("policy", ""),
        ] {
            let text = key.to_string();
            assert_eq!(text.parse::<Key>().unwrap(), key, "{text}");
            assert_eq!(Key::decode(&key.encode()).unwrap(), key);
            assert_eq!(key.encode(), text.as_bytes(), "{text}");
        }
    }

    #[test]
    fn prefixes_select_by_namespace_then_machine() {
        let a = MachineId::generate();
        let b = MachineId::generate();
        let ka = Key::machine(&a, "containers", "1");
        let kb = Key::machine(&b, "containers", "2");
        let all = KeyPrefix::machine_namespace("containers");
        assert!(all.matches(&ka) && all.matches(&kb));
        let only_a = KeyPrefix::machine_namespace_of("containers", &a);
        assert!(only_a.matches(&ka) && !only_a.matches(&kb));
        assert!(!KeyPrefix::cluster_namespace("containers").matches(&ka));
    }

    #[test]
    fn malformed_keys_are_refused() {
        for bad in ["", "x/ns/name", "m/ns/not-an-id/name", "c//name", "m/ns"] {
            assert!(bad.parse::<Key>().is_err(), "{bad}");
        }
    }
}
