//! Records: a key's value with everything replication needs to order it.

use std::cmp::Ordering;

use base64::Engine as _;
use ployz_core::MachineId;
use serde::{Deserialize, Serialize};

use crate::{Hlc, Key, StoreError};

/// The on-disk header before a record's value: version, origin, wall ms, counter, seq,
/// tombstone.
pub(crate) const HEADER: usize = 1 + 32 + 8 + 4 + 8 + 1;

/// One version of one key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub key: Key,
    /// The value's bytes; empty for a tombstone.
    #[serde(with = "base64_bytes")]
    pub value: Vec<u8>,
    /// The Machine that wrote this version.
    pub origin: MachineId,
    /// When the origin wrote it, by its hybrid logical clock.
    pub hlc: Hlc,
    /// The origin's sequence number for this write; each origin numbers its writes 1, 2, 3...
    pub seq: u64,
    /// Whether this version deletes the key. Tombstones are kept so a delete wins over older
    /// versions arriving late; they never resurrect.
    pub tombstone: bool,
}

impl Record {
    /// Orders two versions of the same key: the higher HLC wins, ties broken by Machine ID.
    /// Two distinct writes never compare equal (one origin never issues the same HLC twice).
    pub fn precedence(&self, other: &Record) -> Ordering {
        (self.hlc, &self.origin).cmp(&(other.hlc, &other.origin))
    }

    /// The value, or `None` for a tombstone.
    pub fn live_value(&self) -> Option<&[u8]> {
        (!self.tombstone).then_some(self.value.as_slice())
    }

    /// The bytes this record takes in the store: its key, its value and a 54-byte header. What
    /// [`Store::records_after_within`](crate::Store::records_after_within) bounds a batch by; a
    /// transport's encoding adds its own overhead (base64 in JSON adds a third to the value).
    pub fn stored_len(&self) -> usize {
        self.key.encode().len() + HEADER + self.value.len()
    }

    /// The on-disk form, without the key (the key is the sled key).
    ///
    /// Layout: version `1`, origin (32 ASCII hex), wall ms (u64 BE), counter (u32 BE),
    /// seq (u64 BE), tombstone (u8), value bytes.
    #[cfg(test)]
    pub(crate) fn encode_value(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER + self.value.len());
        self.encode_value_into(&mut out);
        out
    }

    /// [`Record::encode_value`], appended to `out`.
    pub(crate) fn encode_value_into(&self, out: &mut Vec<u8>) {
        out.push(1);
        out.extend_from_slice(self.origin.as_str().as_bytes());
        out.extend_from_slice(&self.hlc.wall_ms.to_be_bytes());
        out.extend_from_slice(&self.hlc.counter.to_be_bytes());
        out.extend_from_slice(&self.seq.to_be_bytes());
        out.push(self.tombstone as u8);
        out.extend_from_slice(&self.value);
    }

    pub(crate) fn decode(key: Key, bytes: &[u8]) -> Result<Record, StoreError> {
        if bytes.len() < HEADER || bytes[0] != 1 {
            return Err(StoreError::Malformed(format!(
                "record for '{key}' has an unknown layout"
            )));
        }
        let origin = std::str::from_utf8(&bytes[1..33])
            .ok()
            .and_then(|s| s.parse::<MachineId>().ok())
            .ok_or_else(|| StoreError::Malformed(format!("record for '{key}' has a bad origin")))?;
        let u64_at = |at: usize| u64::from_be_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        let wall_ms = u64_at(33);
        let counter = u32::from_be_bytes(bytes[41..45].try_into().expect("4 bytes"));
        let seq = u64_at(45);
        let tombstone = bytes[53] != 0;
        Ok(Record {
            key,
            value: bytes[HEADER..].to_vec(),
            origin,
            hlc: Hlc { wall_ms, counter },
            seq,
            tombstone,
        })
    }
}

mod base64_bytes {
    use super::*;
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(v))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(tombstone: bool) -> Record {
        Record {
            key: Key::cluster("policy", "acme"),
            value: if tombstone { vec![] } else { b"hello".to_vec() },
            origin: MachineId::generate(),
            hlc: Hlc {
                wall_ms: 1_700_000_000_000,
                counter: 3,
            },
            seq: 42,
            tombstone,
        }
    }

    #[test]
    fn the_disk_form_round_trips() {
        for r in [record(false), record(true)] {
            let back = Record::decode(r.key.clone(), &r.encode_value()).unwrap();
            assert_eq!(back, r);
            assert_eq!(
                r.stored_len(),
                r.key.encode().len() + r.encode_value().len()
            );
        }
        assert!(Record::decode(Key::cluster("x", "y"), b"\x02garbage").is_err());
    }

    #[test]
    fn the_wire_form_round_trips() {
        let r = record(false);
        let json = serde_json::to_string(&r).unwrap();
        assert!(json.contains("\"aGVsbG8=\""), "{json}");
        assert_eq!(serde_json::from_str::<Record>(&json).unwrap(), r);
    }
}
