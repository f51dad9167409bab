//! The acknowledgement record: what a store has acknowledged, written down beside it.
//!
//! A store can come back smaller than it was: a file truncated or emptied, bytes flipped, noise
//! written over its end, the directory deleted or restored from an old copy. sled may then refuse
//! to open, panic, or open without complaint holding older data or none. The record is how the
//! store notices the last case: a small file outside the store's directory, checksummed, replaced
//! atomically (temp file, fsync, rename, fsync of the directory) after every change the store
//! acknowledged, and compared with the store when it opens.
//!
//! It holds the digest (per origin, the highest sequence incorporated), the clock, and this
//! Machine's last local write (key, sequence, timestamp, CRC-32 of the value), so that a store
//! whose counters survived but whose last write did not is caught too.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use ployz_core::MachineId;
use serde::{Deserialize, Serialize};

use crate::{Digest, Hlc, Key, Record};

/// The file's format version.
const FORMAT: u32 = 1;

/// What a store had acknowledged when it last wrote its record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Acknowledged {
    /// The Machine whose store this is.
    pub machine_id: MachineId,
    /// Per origin, the highest sequence the store had incorporated.
    pub digest: Digest,
    /// The store's clock: the last timestamp issued or observed.
    pub clock: Hlc,
    /// This Machine's last local write, when its record is still held.
    pub last_local: Option<AcknowledgedWrite>,
}

/// One acknowledged local write, by what identifies it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcknowledgedWrite {
    pub key: Key,
    pub seq: u64,
    pub hlc: Hlc,
    pub tombstone: bool,
    /// CRC-32 (IEEE) of the value.
    pub value_crc32: u32,
}

impl AcknowledgedWrite {
    pub(crate) fn of(record: &Record) -> AcknowledgedWrite {
        AcknowledgedWrite {
            key: record.key.clone(),
            seq: record.seq,
            hlc: record.hlc,
            tombstone: record.tombstone,
            value_crc32: crc32fast::hash(&record.value),
        }
    }

    /// Whether `record` is this very write, value included.
    pub(crate) fn is(&self, record: &Record) -> bool {
        record.seq == self.seq
            && record.hlc == self.hlc
            && record.tombstone == self.tombstone
            && crc32fast::hash(&record.value) == self.value_crc32
    }
}

/// The file: the record and a checksum of its JSON form.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct OnDisk {
    format: u32,
    acknowledged: Acknowledged,
    crc32: u32,
}

impl Acknowledged {
    /// Reads the record at `path`: `Ok(None)` when there is none, `Err` (saying why) when the
    /// file is there but cannot be trusted.
    pub fn read(path: &Path) -> Result<Option<Acknowledged>, String> {
        let bytes = match fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("cannot read it: {e}")),
        };
        let on_disk: OnDisk = serde_json::from_slice(&bytes)
            .map_err(|e| format!("it is not an acknowledgement record ({e})"))?;
        if on_disk.format != FORMAT {
            return Err(format!(
                "its format {} is not the one this version writes ({FORMAT})",
                on_disk.format
            ));
        }
        let body = serde_json::to_vec(&on_disk.acknowledged)
            .map_err(|e| format!("it does not serialise back ({e})"))?;
        if crc32fast::hash(&body) != on_disk.crc32 {
            return Err("its checksum does not match its content".into());
        }
        Ok(Some(on_disk.acknowledged))
    }

    /// Replaces the record at `path` atomically (mode 0600).
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let body = serde_json::to_vec(self).map_err(std::io::Error::other)?;
        let on_disk = OnDisk {
            format: FORMAT,
            acknowledged: self.clone(),
            crc32: crc32fast::hash(&body),
        };
        let mut bytes = serde_json::to_vec_pretty(&on_disk).map_err(std::io::Error::other)?;
        bytes.push(b'\n');
        write_atomic(path, &bytes, 0o600)
    }
}

/// Where the temp file of an atomic write of `path` lives.
pub(crate) fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.tmp"))
}

/// Writes `bytes` to `path` so that a reader, or a crash at any point, sees either the old file
/// or the complete new one: a temp file beside it ([`temp_path`]) with `mode`, fsync, rename,
/// fsync of the directory. Every file whose loss or tearing matters is written this way: the
/// acknowledgement record here, the Machine's identity and key in the daemon.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let tmp = temp_path(path);
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, path)?;
        File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_writes_get_their_mode_and_replace_whole() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("key");
        write_atomic(&p, b"one", 0o600).unwrap();
        write_atomic(&p, b"two", 0o600).unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        let mode = fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(
            fs::read_dir(dir.path()).unwrap().count(),
            1,
            "no temp file left"
        );
    }

    fn sample() -> Acknowledged {
        let id = MachineId::generate();
        let mut digest = Digest::default();
        digest.0.insert(id.clone(), 7);
        Acknowledged {
            machine_id: id.clone(),
            digest,
            clock: Hlc {
                wall_ms: 1_700_000_000_000,
                counter: 2,
            },
            last_local: Some(AcknowledgedWrite {
                key: Key::machine(&id, "machines", "info"),
                seq: 7,
                hlc: Hlc {
                    wall_ms: 1_700_000_000_000,
                    counter: 2,
                },
                tombstone: false,
                value_crc32: crc32fast::hash(b"v"),
            }),
        }
    }

    #[test]
    fn the_record_round_trips_and_a_missing_one_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.ack");
        assert_eq!(Acknowledged::read(&path).unwrap(), None);
        let a = sample();
        a.write(&path).unwrap();
        assert_eq!(Acknowledged::read(&path).unwrap(), Some(a));
        assert!(!temp_path(&path).exists(), "no temp file left behind");
    }

    #[test]
    fn a_changed_byte_or_a_truncated_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.ack");
        sample().write(&path).unwrap();
        let text = fs::read_to_string(&path).unwrap();
        // One digit of the acknowledged sequence changed: still valid JSON, wrong checksum.
        let changed = text.replacen(": 7", ": 3", 1);
        assert_ne!(changed, text);
        fs::write(&path, changed).unwrap();
        let err = Acknowledged::read(&path).unwrap_err();
        assert!(err.contains("checksum"), "{err}");
        fs::write(&path, &text.as_bytes()[..text.len() / 2]).unwrap();
        let err = Acknowledged::read(&path).unwrap_err();
        assert!(err.contains("not an acknowledgement record"), "{err}");
    }
}
