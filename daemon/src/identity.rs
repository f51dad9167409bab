//! The Machine's local identity on disk: who this Machine is, before and beside the store.
//!
//! `machine.json` holds the Machine ID, Machine Name, Local Machine Phase, Machine Subnet and
//! public key; `wireguard.key` holds the private key (mode 0600). Both are written atomically.
//! The identity file is written last during `init`, so a crash midway leaves an uninitialised
//! Machine that can simply be initialised again. Once it exists, the key must be there and
//! match it: a missing or different key is never replaced silently ([`KeyPair::check`]).

use std::path::{Path, PathBuf};

use base64::Engine as _;
use std::collections::BTreeMap;
use std::net::SocketAddr;

use ployz_core::api::{MachineInfo, Member};
use ployz_core::{
    ClusterId, ClusterNetwork, LocalMachinePhase, MachineId, MachineName, MachineSubnet,
    ManagementAddress,
};
use serde::{Deserialize, Serialize};

use crate::fsutil::write_atomic;

/// The paths inside the data dir.
#[derive(Debug, Clone)]
pub struct DataDir {
    root: PathBuf,
}

impl DataDir {
    pub fn new(root: impl Into<PathBuf>) -> DataDir {
        DataDir { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn identity_file(&self) -> PathBuf {
        self.root.join("machine.json")
    }

    pub fn private_key_file(&self) -> PathBuf {
        self.root.join("wireguard.key")
    }

    pub fn store_dir(&self) -> PathBuf {
        self.root.join("store")
    }

    /// The store's acknowledgement record: beside the store's directory, not in it, so that
    /// losing the directory does not lose the record.
    pub fn acknowledged_file(&self) -> PathBuf {
        self.root.join("store.ack")
    }

    /// The Machine ID and public key an uninitialised Machine offers when asked to join
    /// ([`PendingJoin`]); its private key is in [`DataDir::private_key_file`].
    pub fn pending_join_file(&self) -> PathBuf {
        self.root.join("join.json")
    }

    /// The Join Token an uninitialised Machine was given (`ployz machine join TOKEN`): it
    /// fetches its grant from the inviting Machine until it joins.
    pub fn join_token_file(&self) -> PathBuf {
        self.root.join("join-token.json")
    }
}

/// Moves `path` aside as `<name>.lost-<unix seconds>` when it exists, and says where: what an
/// uninitialised Machine finds of an earlier identity (its `machine.json` lost, or an init cut
/// short) is kept for an operator to restore, never deleted by a new init or join.
pub fn set_aside(path: &Path) -> std::io::Result<Option<PathBuf>> {
    if std::fs::symlink_metadata(path).is_err() {
        return Ok(None);
    }
    let seconds = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut aside = path.with_file_name(format!("{name}.lost-{seconds}"));
    let mut n = 1;
    while std::fs::symlink_metadata(&aside).is_ok() {
        aside = path.with_file_name(format!("{name}.lost-{seconds}-{n}"));
        n += 1;
    }
    std::fs::rename(path, &aside)?;
    tracing::warn!(
        from = %path.display(),
        to = %aside.display(),
        "what an earlier identity of this Machine left was set aside, not deleted (restore it with machine.json to get that Machine back)"
    );
    Ok(Some(aside))
}

/// What an uninitialised Machine offers to a Cluster it is asked to join: kept from the first
/// join request until it joins (or is initialised), so that asking twice offers the same key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingJoin {
    pub id: MachineId,
    pub public_key: String,
}

impl PendingJoin {
    /// The pending offer, made (key pair included) when there is none or its key is gone.
    pub fn load_or_make(dir: &DataDir) -> std::io::Result<PendingJoin> {
        if let Ok(bytes) = std::fs::read(dir.pending_join_file()) {
            if let Ok(p) = serde_json::from_slice::<PendingJoin>(&bytes) {
                if KeyPair::check(dir, &p.public_key).is_ok() {
                    return Ok(p);
                }
            }
        }
        // A key without an offer of its own is an earlier identity's: kept aside.
        if std::fs::symlink_metadata(dir.pending_join_file()).is_err() {
            set_aside(&dir.private_key_file())?;
        }
        let keys = KeyPair::generate();
        keys.save_private(dir)?;
        let pending = PendingJoin {
            id: MachineId::generate(),
            public_key: keys.public_key,
        };
        let bytes = serde_json::to_vec_pretty(&pending).expect("pending join serialises");
        write_atomic(&dir.pending_join_file(), &bytes, 0o600)?;
        Ok(pending)
    }

    /// The pending offer, if one was made.
    pub fn load(dir: &DataDir) -> Option<PendingJoin> {
        let bytes = std::fs::read(dir.pending_join_file()).ok()?;
        serde_json::from_slice(&bytes).ok()
    }
}

/// What this Machine knows about itself, independent of the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalIdentity {
    pub id: MachineId,
    pub name: MachineName,
    pub phase: LocalMachinePhase,
    pub cluster_network: ClusterNetwork,
    pub subnet: MachineSubnet,
    /// WireGuard public key, base64.
    pub public_key: String,
    /// The Cluster this Machine is in. Absent only in identity files written before Clusters
    /// had an identity; one is made for them at start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterId>,
    /// The members the admitting Machine named when this Machine joined: its first peers, used
    /// while it is `joining` (its store has not caught up to the roster yet).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bootstrap: Vec<Member>,
    /// The admitting Machine's digest when this Machine joined: it is `joining` until its store
    /// holds at least that much of every origin.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub catch_up: BTreeMap<MachineId, u64>,
    /// The WireGuard endpoints it advertises, as last detected.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub advertised: Vec<SocketAddr>,
    /// The WireGuard backend its mesh last started with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wireguard_backend: Option<String>,
}

impl LocalIdentity {
    /// Reads the identity file; `None` when this Machine was never initialised.
    pub fn load(dir: &DataDir) -> anyhow::Result<Option<LocalIdentity>> {
        let path = dir.identity_file();
        match std::fs::read(&path) {
            Ok(bytes) => Ok(Some(serde_json::from_slice(&bytes).map_err(|e| {
                anyhow::anyhow!(
                    "{} is not a valid identity file ({e}); move it away to start this Machine anew",
                    path.display()
                )
            })?)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(anyhow::anyhow!("cannot read {}: {e}", path.display())),
        }
    }

    /// Writes the identity file atomically.
    pub fn save(&self, dir: &DataDir) -> std::io::Result<()> {
        let bytes = serde_json::to_vec_pretty(self).expect("identity serialises");
        write_atomic(&dir.identity_file(), &bytes, 0o600)
    }

    /// The Management Address derived from the public key.
    pub fn management_address(&self) -> ManagementAddress {
        let raw = base64::engine::general_purpose::STANDARD
            .decode(&self.public_key)
            .ok()
            .and_then(|v| <[u8; 32]>::try_from(v).ok())
            .unwrap_or([0; 32]);
        ManagementAddress::from_public_key(&raw)
    }

    /// What this Machine publishes about itself in the store.
    pub fn info(&self) -> MachineInfo {
        MachineInfo {
            id: self.id.clone(),
            name: self.name.clone(),
            phase: self.phase,
            subnet: self.subnet,
            public_key: self.public_key.clone(),
            management_address: self.management_address(),
            endpoints: self.advertised.clone(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            wireguard_backend: self.wireguard_backend.clone(),
            edge_features: ployz_core::EdgeFeature::published(),
        }
    }

    /// This Machine as the member roster holds it (what `machine init` writes for the first
    /// Machine, and what a Machine whose record is missing writes again).
    pub fn member(&self) -> Member {
        Member {
            id: self.id.clone(),
            name: self.name.clone(),
            subnet: self.subnet,
            public_key: self.public_key.clone(),
            management_address: self.management_address(),
            endpoints: Vec::new(),
        }
    }
}

/// A new WireGuard key pair, both halves base64 as `wg` prints them.
pub struct KeyPair {
    pub private_key: String,
    pub public_key: String,
}

impl KeyPair {
    pub fn generate() -> KeyPair {
        let secret = x25519_dalek::StaticSecret::from(rand::random::<[u8; 32]>());
        let public = x25519_dalek::PublicKey::from(&secret);
        let b64 = base64::engine::general_purpose::STANDARD;
        KeyPair {
            private_key: b64.encode(secret.to_bytes()),
            public_key: b64.encode(public.as_bytes()),
        }
    }

    /// Writes the private key, mode 0600, atomically.
    pub fn save_private(&self, dir: &DataDir) -> std::io::Result<()> {
        write_atomic(
            &dir.private_key_file(),
            format!("{}\n", self.private_key).as_bytes(),
            0o600,
        )
    }

    /// Checks that `wireguard.key` holds the private half of `public_key` (base64), the key
    /// `machine.json` names. Never says why with the key's content.
    pub fn check(dir: &DataDir, public_key: &str) -> Result<(), KeyProblem> {
        let text = match std::fs::read_to_string(dir.private_key_file()) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(KeyProblem::Missing),
            Err(e) => return Err(KeyProblem::CannotRead(e.to_string())),
        };
        let b64 = base64::engine::general_purpose::STANDARD;
        let private: [u8; 32] = b64
            .decode(text.trim())
            .ok()
            .and_then(|v| v.try_into().ok())
            .ok_or_else(|| KeyProblem::Unreadable("it is not a base64 32-byte key".into()))?;
        let public = x25519_dalek::PublicKey::from(&x25519_dalek::StaticSecret::from(private));
        if b64.encode(public.as_bytes()) != public_key {
            return Err(KeyProblem::Mismatch);
        }
        Ok(())
    }
}

/// What is wrong with `wireguard.key` for an initialised Machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyProblem {
    /// The file is gone.
    Missing,
    /// The file is there but cannot be read (permissions, a failing disk): no loss, a fault
    /// to fix.
    CannotRead(String),
    /// The file does not hold a key; says why, never what it holds.
    Unreadable(String),
    /// It holds a key, but not the one `machine.json` names.
    Mismatch,
}

impl std::fmt::Display for KeyProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyProblem::Missing => f.write_str("is missing"),
            KeyProblem::CannotRead(why) => write!(f, "cannot be read ({why})"),
            KeyProblem::Unreadable(why) => write!(f, "cannot be used ({why})"),
            KeyProblem::Mismatch => {
                f.write_str("holds a key other than the one machine.json names")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_a_matching_curve25519_pair() {
        let kp = KeyPair::generate();
        let b64 = base64::engine::general_purpose::STANDARD;
        let private: [u8; 32] = b64.decode(&kp.private_key).unwrap().try_into().unwrap();
        let public = x25519_dalek::PublicKey::from(&x25519_dalek::StaticSecret::from(private));
        assert_eq!(b64.encode(public.as_bytes()), kp.public_key);
    }

    #[test]
    fn the_key_check_finds_a_missing_a_garbled_and_another_key() {
        let dir = tempfile::tempdir().unwrap();
        let dd = DataDir::new(dir.path());
        let kp = KeyPair::generate();
        assert_eq!(
            KeyPair::check(&dd, &kp.public_key),
            Err(KeyProblem::Missing)
        );
        kp.save_private(&dd).unwrap();
        assert_eq!(KeyPair::check(&dd, &kp.public_key), Ok(()));
        assert_eq!(
            KeyPair::check(&dd, &KeyPair::generate().public_key),
            Err(KeyProblem::Mismatch)
        );
        std::fs::write(dd.private_key_file(), "not a key\n").unwrap();
        assert!(matches!(
            KeyPair::check(&dd, &kp.public_key),
            Err(KeyProblem::Unreadable(_))
        ));
    }

    #[test]
    fn identity_round_trips_through_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let dd = DataDir::new(dir.path());
        assert!(LocalIdentity::load(&dd).unwrap().is_none());
        let net = ClusterNetwork::default();
        let id = LocalIdentity {
            id: MachineId::generate(),
            name: "m1".parse().unwrap(),
            phase: LocalMachinePhase::Participating,
            cluster_network: net,
            subnet: net.first_free_subnet(&[]).unwrap(),
            public_key: KeyPair::generate().public_key,
            cluster: Some(ClusterId::generate()),
            bootstrap: vec![],
            catch_up: BTreeMap::new(),
            advertised: vec![],
            wireguard_backend: None,
        };
        id.save(&dd).unwrap();
        assert_eq!(LocalIdentity::load(&dd).unwrap().unwrap(), id);
        assert!(id.management_address().to_string().starts_with("fdcc:"));
    }
}
