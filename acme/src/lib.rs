//! The certificate issuer: Certificate Policy, ACME issuance and renewal over HTTP-01, and the
//! Cluster DNS Verdict.
//!
//! Every Machine runs one [`CertificateIssuer`]. It watches the store and, for each Ingress
//! Hostname published over https by a running Service container, makes sure Certificate Material
//! exists, covers the hostname and is renewed when the Certificate Policy's renewal fraction of
//! its lifetime has passed. Exactly one Machine orders for a hostname: the rendezvous-hashing
//! winner among the participating Machines ([`rendezvous`]), less those this Machine has not
//! observed up for [`IssuerConfig::down_grace`] in a row (a Machine that lost power must not hold its
//! hostnames' certificates back for ever; a reboot must not order them twice). Before ordering,
//! the issuer takes the hostname's Cluster DNS Verdict ([`verdict`]) and orders only when the hostname points at a
//! Machine (or when that cannot be known).
//!
//! HTTP-01 challenges are answered by every Machine's edge: the issuer writes a cluster-scoped
//! challenge record ([`ChallengeRecord`], laid out in `ployz_store::certificates`) and the edge
//! answers `GET /.well-known/acme-challenge/TOKEN` from it. Because the record replicates, it does not matter which Machine the
//! authority's validation request reaches.
//!
//! Store layout (all keys in `ployz_store::certificates`):
//!
//! | record | key | value |
//! |---|---|---|
//! | Certificate Material | `Key::cluster("certificates", hostname)` | [`ployz_core::CertificateMaterial`] |
//! | Certificate Policy | `Key::cluster("certificate-policy", "policy")` | [`ployz_core::CertificatePolicy`] |
//! | HTTP-01 challenge | `Key::cluster("acme-challenges", token)` | [`ChallengeRecord`] |
//! | ACME account | `Key::cluster("acme-accounts", sha256(directory URL))` | `ployz_store::certificates::StoredAccount` |
//! | certificate status | `Key::machine(issuer, "certificate-status", hostname)` | [`ployz_core::CertificateStatus`] |
//!
//! **Architecture Invariant:** no private key (certificate key, account key, EAB HMAC key) ever
//! reaches a log line: every type holding one has a `Debug` that withholds it.

#![warn(missing_docs)]

mod acme_client;
pub mod issuer;
pub mod rendezvous;
pub mod verdict;
pub mod wanted;

pub use issuer::{
    CertificateIssuer, Clock, IssuerConfig, IssuerCounters, PublicAddressFn, PublicAddressSource,
    DEFAULT_DOWN_GRACE,
};
pub use ployz_store::certificates::{is_valid_token, ChallengeRecord};
pub use verdict::{VerdictProbe, VerdictResolver};
