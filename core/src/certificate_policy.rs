//! Certificate Policy, Cluster DNS Verdict and certificate status: the words certificate issuance
//! speaks.
//!
//! A **Certificate Policy** is the cluster-state value that steers issuance: the authority's
//! directory, an external account binding, the key type, the renewal fraction, the backoff bounds
//! and the probe timeout. Every field is optional: absence means the built-in default, read through
//! the accessors ([`CertificatePolicy::directory_url`], ...). A value the daemon cannot honour (a
//! challenge kind other than `http-01`, say) is a refusal reported by
//! [`CertificatePolicy::validate`], never silently replaced by a default.
//!
//! A **Cluster DNS Verdict** says whether an Ingress Hostname's resolved addresses intersect the
//! Cluster's Machine public addresses. It is not a Deploy failure and not a health signal: it only
//! decides whether ordering a certificate can succeed.

#![warn(missing_docs)]

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;
use std::time::Duration;

use rustls_pki_types::pem::{self, PemObject, SectionKind};
use serde::{Deserialize, Serialize};

use crate::MachineId;

/// The directory used when the Certificate Policy names none: Let's Encrypt's production CA.
pub const DEFAULT_DIRECTORY_URL: &str = "https://acme-v02.api.letsencrypt.org/directory";
/// The share of a certificate's lifetime after which it is renewed, by default.
pub const DEFAULT_RENEWAL_FRACTION: f64 = 2.0 / 3.0;
/// The first wait after a failed attempt, by default.
pub const DEFAULT_BACKOFF_MIN_SECS: u64 = 60;
/// The longest wait between failed attempts, by default.
pub const DEFAULT_BACKOFF_MAX_SECS: u64 = 6 * 3600;
/// How long one probe (a Cluster DNS Verdict lookup) may take, by default.
pub const DEFAULT_PROBE_TIMEOUT_MS: u64 = 5_000;
/// The longest backoff bound a policy may set: 30 days (longer would outlive a certificate's
/// renewal window and overflow time arithmetic).
pub const MAX_BACKOFF_SECS: u64 = 30 * 24 * 3600;
/// The longest probe timeout a policy may set: one minute.
pub const MAX_PROBE_TIMEOUT_MS: u64 = 60_000;
/// The only challenge kind Ployz performs.
pub const HTTP_01: &str = "http-01";

/// The key type of the certificates a Certificate Policy orders.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CertificateKeyType {
    /// ECDSA on P-256 with SHA-256 (the default).
    #[default]
    #[serde(rename = "ecdsa-p256")]
    EcdsaP256,
    /// RSA with a 2048-bit modulus, PKCS#1 v1.5 with SHA-256.
    #[serde(rename = "rsa-2048")]
    Rsa2048,
}

impl CertificateKeyType {
    /// The key type's word, as the policy and the CLI spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            CertificateKeyType::EcdsaP256 => "ecdsa-p256",
            CertificateKeyType::Rsa2048 => "rsa-2048",
        }
    }
}

impl fmt::Display for CertificateKeyType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for CertificateKeyType {
    type Err = PolicyError;
    fn from_str(s: &str) -> Result<Self, PolicyError> {
        match s.to_ascii_lowercase().as_str() {
            "ecdsa-p256" | "ec256" | "p256" => Ok(CertificateKeyType::EcdsaP256),
            "rsa-2048" | "rsa2048" => Ok(CertificateKeyType::Rsa2048),
            _ => Err(PolicyError::UnknownKeyType {
                value: s.to_owned(),
            }),
        }
    }
}

/// The cluster-state values steering certificate issuance. Every field is optional; absence
/// means the built-in default, which the accessors return.
///
/// The HMAC key of the external account binding is a secret: [`fmt::Debug`] withholds it.
#[derive(Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CertificatePolicy {
    /// The ACME directory URL; default [`DEFAULT_DIRECTORY_URL`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub directory_url: Option<String>,
    /// PEM certificates trusted for the directory's TLS, instead of the system's roots (for a
    /// private CA). `None` trusts the system's roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_bundle_pem: Option<String>,
    /// The external account binding's key identifier, as the CA gave it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eab_key_id: Option<String>,
    /// The external account binding's HMAC key, base64url as the CA gave it. Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eab_hmac_key: Option<String>,
    /// The key type of ordered certificates; default ECDSA P-256.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_type: Option<CertificateKeyType>,
    /// The share of a certificate's lifetime after which it is renewed, in (0, 1); default 2/3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renewal_fraction: Option<f64>,
    /// The first wait after a failed attempt, seconds; default 60.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff_min_secs: Option<u64>,
    /// The longest wait between failed attempts, seconds; default 6 hours.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff_max_secs: Option<u64>,
    /// How long one probe (a Cluster DNS Verdict lookup) may take, milliseconds; default 5000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_timeout_ms: Option<u64>,
    /// The challenge kind; only `http-01` can be performed, and it is the default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub challenge: Option<String>,
}

impl fmt::Debug for CertificatePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertificatePolicy")
            .field("directory_url", &self.directory_url)
            .field(
                "ca_bundle_pem",
                &self.ca_bundle_pem.as_ref().map(|_| "<pem>"),
            )
            .field("eab_key_id", &self.eab_key_id)
            .field(
                "eab_hmac_key",
                &self.eab_hmac_key.as_ref().map(|_| "<withheld>"),
            )
            .field("key_type", &self.key_type)
            .field("renewal_fraction", &self.renewal_fraction)
            .field("backoff_min_secs", &self.backoff_min_secs)
            .field("backoff_max_secs", &self.backoff_max_secs)
            .field("probe_timeout_ms", &self.probe_timeout_ms)
            .field("challenge", &self.challenge)
            .finish()
    }
}

/// An external account binding ready to use: the key identifier and the decoded HMAC key.
/// [`fmt::Debug`] withholds the key.
#[derive(Clone, PartialEq, Eq)]
pub struct ExternalAccountBinding {
    /// The key identifier the CA gave.
    pub key_id: String,
    /// The raw HMAC key bytes (decoded from base64url).
    pub hmac_key: Vec<u8>,
}

impl fmt::Debug for ExternalAccountBinding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExternalAccountBinding")
            .field("key_id", &self.key_id)
            .field("hmac_key", &"<withheld>")
            .finish()
    }
}

/// Why a Certificate Policy is refused. Each message names the field, the value (never a secret)
/// and the fix.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// `directory_url` is not an http(s) URL.
    #[error("directory_url '{value}' is not an http(s) URL ({reason}); give the ACME directory URL, such as {DEFAULT_DIRECTORY_URL}")]
    InvalidDirectoryUrl {
        /// The URL given.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// `eab_hmac_key` does not decode.
    #[error("eab_hmac_key is not base64url ({detail}; the value is withheld); paste the HMAC key exactly as the CA gave it")]
    EabHmacNotBase64 {
        /// Where decoding failed (never the key itself).
        detail: String,
    },
    /// Only one half of the external account binding is set.
    #[error("{present} is set but {missing} is not; an external account binding needs both eab_key_id and eab_hmac_key, or neither")]
    EabIncomplete {
        /// The field that is set.
        present: &'static str,
        /// The field that is missing.
        missing: &'static str,
    },
    /// A challenge kind the daemon cannot perform.
    #[error("challenge '{value}' cannot be performed: Ployz performs only http-01 (served by every Machine's edge on port 80); set challenge to http-01 or remove it")]
    UnsupportedChallenge {
        /// The challenge kind given.
        value: String,
    },
    /// `renewal_fraction` outside (0, 1).
    #[error("renewal_fraction {value} is outside (0, 1); give the share of a certificate's lifetime after which it is renewed, such as 0.6667 (two thirds)")]
    RenewalFractionOutOfRange {
        /// The fraction given.
        value: f64,
    },
    /// `backoff_min_secs` is zero.
    #[error("backoff_min_secs 0 would retry failures without waiting; give at least 1 second (default {DEFAULT_BACKOFF_MIN_SECS})")]
    ZeroBackoff,
    /// `backoff_min_secs` above `backoff_max_secs`.
    #[error("backoff_min_secs {min} is greater than backoff_max_secs {max}; make the minimum at most the maximum")]
    BackoffInverted {
        /// The effective minimum.
        min: u64,
        /// The effective maximum.
        max: u64,
    },
    /// A backoff bound above [`MAX_BACKOFF_SECS`].
    #[error("{field} {value} s is longer than {MAX_BACKOFF_SECS} s (30 days); give at most that")]
    BackoffTooLong {
        /// `backoff_min_secs` or `backoff_max_secs`.
        field: &'static str,
        /// The seconds given.
        value: u64,
    },
    /// `probe_timeout_ms` above [`MAX_PROBE_TIMEOUT_MS`].
    #[error("probe_timeout_ms {value} is longer than {MAX_PROBE_TIMEOUT_MS} ms (1 minute); give at most that")]
    ProbeTimeoutTooLong {
        /// The milliseconds given.
        value: u64,
    },
    /// `probe_timeout_ms` is zero.
    #[error("probe_timeout_ms 0 leaves no time for a probe; give a positive number of milliseconds (default {DEFAULT_PROBE_TIMEOUT_MS})")]
    ZeroProbeTimeout,
    /// `ca_bundle_pem` is not PEM certificates.
    #[error("ca_bundle_pem is not PEM certificates ({detail}); give the PEM block(s) '-----BEGIN CERTIFICATE-----' of the CA that signs the directory's TLS certificate")]
    CaBundleNotPem {
        /// What is wrong with it.
        detail: String,
    },
    /// A key type word that is not known.
    #[error("key_type '{value}' is not known; use ecdsa-p256 (the default) or rsa-2048")]
    UnknownKeyType {
        /// The word given.
        value: String,
    },
}

impl CertificatePolicy {
    /// The ACME directory URL in force.
    pub fn directory_url(&self) -> &str {
        self.directory_url
            .as_deref()
            .unwrap_or(DEFAULT_DIRECTORY_URL)
    }

    /// The key type in force.
    pub fn key_type(&self) -> CertificateKeyType {
        self.key_type.unwrap_or_default()
    }

    /// The renewal fraction in force.
    pub fn renewal_fraction(&self) -> f64 {
        self.renewal_fraction.unwrap_or(DEFAULT_RENEWAL_FRACTION)
    }

    /// The first wait after a failure.
    pub fn backoff_min(&self) -> Duration {
        Duration::from_secs(self.backoff_min_secs.unwrap_or(DEFAULT_BACKOFF_MIN_SECS))
    }

    /// The longest wait between failures.
    pub fn backoff_max(&self) -> Duration {
        Duration::from_secs(self.backoff_max_secs.unwrap_or(DEFAULT_BACKOFF_MAX_SECS))
    }

    /// The time one probe may take.
    pub fn probe_timeout(&self) -> Duration {
        Duration::from_millis(self.probe_timeout_ms.unwrap_or(DEFAULT_PROBE_TIMEOUT_MS))
    }

    /// The challenge kind in force (`http-01` unless the policy names another, which
    /// [`CertificatePolicy::validate`] refuses).
    pub fn challenge_kind(&self) -> &str {
        self.challenge.as_deref().unwrap_or(HTTP_01)
    }

    /// The external account binding, decoded; `None` when the policy has none.
    pub fn external_account_binding(&self) -> Result<Option<ExternalAccountBinding>, PolicyError> {
        match (&self.eab_key_id, &self.eab_hmac_key) {
            (None, None) => Ok(None),
            (Some(_), None) => Err(PolicyError::EabIncomplete {
                present: "eab_key_id",
                missing: "eab_hmac_key",
            }),
            (None, Some(_)) => Err(PolicyError::EabIncomplete {
                present: "eab_hmac_key",
                missing: "eab_key_id",
            }),
            (Some(kid), Some(hmac)) => {
                let hmac_key = decode_hmac_key(hmac.trim())
                    .map_err(|detail| PolicyError::EabHmacNotBase64 { detail })?;
                if hmac_key.is_empty() {
                    return Err(PolicyError::EabHmacNotBase64 {
                        detail: "it is empty".into(),
                    });
                }
                Ok(Some(ExternalAccountBinding {
                    key_id: kid.clone(),
                    hmac_key,
                }))
            }
        }
    }

    /// The DER certificates of `ca_bundle_pem`; empty when the policy has none.
    pub fn ca_bundle_der(&self) -> Result<Vec<Vec<u8>>, PolicyError> {
        match &self.ca_bundle_pem {
            None => Ok(Vec::new()),
            Some(pem) => {
                pem_certificates(pem).map_err(|detail| PolicyError::CaBundleNotPem { detail })
            }
        }
    }

    /// This policy with every field `changes` sets replacing its own: what changing the
    /// Certificate Policy field by field does (`ployz cert policy set`). A field `changes`
    /// leaves unset keeps this policy's value; nothing is validated here.
    pub fn merged_with(self, changes: CertificatePolicy) -> CertificatePolicy {
        // Destructured whole, so that a new field cannot be forgotten here.
        let CertificatePolicy {
            directory_url,
            ca_bundle_pem,
            eab_key_id,
            eab_hmac_key,
            key_type,
            renewal_fraction,
            backoff_min_secs,
            backoff_max_secs,
            probe_timeout_ms,
            challenge,
        } = changes;
        CertificatePolicy {
            directory_url: directory_url.or(self.directory_url),
            ca_bundle_pem: ca_bundle_pem.or(self.ca_bundle_pem),
            eab_key_id: eab_key_id.or(self.eab_key_id),
            eab_hmac_key: eab_hmac_key.or(self.eab_hmac_key),
            key_type: key_type.or(self.key_type),
            renewal_fraction: renewal_fraction.or(self.renewal_fraction),
            backoff_min_secs: backoff_min_secs.or(self.backoff_min_secs),
            backoff_max_secs: backoff_max_secs.or(self.backoff_max_secs),
            probe_timeout_ms: probe_timeout_ms.or(self.probe_timeout_ms),
            challenge: challenge.or(self.challenge),
        }
    }

    /// Checks every field; the first refusal is returned. A policy that does not validate must
    /// not be used, and is never replaced by the defaults.
    pub fn validate(&self) -> Result<(), PolicyError> {
        if let Some(url) = &self.directory_url {
            check_http_url(url).map_err(|reason| PolicyError::InvalidDirectoryUrl {
                value: url.clone(),
                reason,
            })?;
        }
        self.ca_bundle_der()?;
        self.external_account_binding()?;
        if let Some(kind) = &self.challenge {
            if !kind.eq_ignore_ascii_case(HTTP_01) {
                return Err(PolicyError::UnsupportedChallenge {
                    value: kind.clone(),
                });
            }
        }
        if let Some(f) = self.renewal_fraction {
            // NaN fails both comparisons and is refused too.
            if !(f > 0.0 && f < 1.0) {
                return Err(PolicyError::RenewalFractionOutOfRange { value: f });
            }
        }
        if self.backoff_min_secs == Some(0) {
            return Err(PolicyError::ZeroBackoff);
        }
        for (field, value) in [
            ("backoff_min_secs", self.backoff_min_secs),
            ("backoff_max_secs", self.backoff_max_secs),
        ] {
            if let Some(value) = value.filter(|v| *v > MAX_BACKOFF_SECS) {
                return Err(PolicyError::BackoffTooLong { field, value });
            }
        }
        if let Some(value) = self.probe_timeout_ms.filter(|v| *v > MAX_PROBE_TIMEOUT_MS) {
            return Err(PolicyError::ProbeTimeoutTooLong { value });
        }
        let (min, max) = (self.backoff_min().as_secs(), self.backoff_max().as_secs());
        if min > max {
            return Err(PolicyError::BackoffInverted { min, max });
        }
        if self.probe_timeout_ms == Some(0) {
            return Err(PolicyError::ZeroProbeTimeout);
        }
        Ok(())
    }
}

/// Checks that `text` is an absolute http(s) URL with a host, as an HTTP client can request it.
///
/// The `url` crate parses it; on top of what it accepts, the directory URL must be spelled out
/// in full (`https://` or `http://`, then a host), carry no credentials, no port 0, and only
/// ASCII without whitespace, so that what is validated is what the ACME client requests (the
/// crate would silently drop a tab, percent-encode a space or read `https:///dir` as host `dir`).
fn check_http_url(text: &str) -> Result<(), String> {
    if text.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("it contains whitespace".into());
    }
    if !text.is_ascii() || text.contains('\\') {
        return Err(
            "it contains characters a URL cannot carry as written (non-ASCII or '\\'); percent-encode them, and give an international host name in its xn-- form"
                .into(),
        );
    }
    let lower = text.to_ascii_lowercase();
    let Some(rest) = lower
        .strip_prefix("https://")
        .or_else(|| lower.strip_prefix("http://"))
    else {
        return Err("it must start with https:// or http://".into());
    };
    // The authority as written: everything up to the path, query or fragment.
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if authority.is_empty() {
        return Err("it has no host".into());
    }
    // Even an empty user name (`https://@host`) is refused: the URL is used as written.
    if authority.contains('@') {
        return Err("it must not carry credentials".into());
    }
    let url = url::Url::parse(text).map_err(|e| match e {
        url::ParseError::EmptyHost => "it has no host".to_owned(),
        url::ParseError::InvalidPort => {
            let port = authority.rsplit_once(':').map_or("", |(_, p)| p);
            format!("port '{port}' is not a number from 1 to 65535")
        }
        url::ParseError::InvalidIpv6Address => {
            "its IPv6 host is not an IPv6 address in brackets".to_owned()
        }
        other => format!("it does not parse as a URL: {other}"),
    })?;
    if !url.username().is_empty() || url.password().is_some() {
        return Err("it must not carry credentials".into());
    }
    match url.host() {
        None => return Err("it has no host".into()),
        Some(url::Host::Domain(host)) => {
            if !host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
            {
                return Err(format!(
                    "host '{host}' has characters a host name cannot have"
                ));
            }
        }
        Some(url::Host::Ipv4(_) | url::Host::Ipv6(_)) => {}
    }
    if url.port() == Some(0) {
        return Err("port '0' is not a number from 1 to 65535".into());
    }
    Ok(())
}

/// Decodes an external account binding's HMAC key: base64url or standard base64, padded or
/// not (what CAs hand out varies), the two alphabets possibly mixed. Errors say where decoding
/// failed, never echoing the key.
fn decode_hmac_key(text: &str) -> Result<Vec<u8>, String> {
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
    use base64::Engine as _;

    /// base64url as padded or unpadded as a CA gave it (but a padded key padded exactly);
    /// bits after the last byte are ignored, as CAs do not always zero them.
    const fn lenient(padding: DecodePaddingMode) -> GeneralPurpose {
        GeneralPurpose::new(
            &base64::alphabet::URL_SAFE,
            GeneralPurposeConfig::new()
                .with_decode_padding_mode(padding)
                .with_decode_allow_trailing_bits(true),
        )
    }
    const PADDED: GeneralPurpose = lenient(DecodePaddingMode::RequireCanonical);
    const UNPADDED: GeneralPurpose = lenient(DecodePaddingMode::RequireNone);
    // The standard alphabet differs from base64url in two characters only.
    let url_safe: String = text
        .chars()
        .map(|c| match c {
            '+' => '-',
            '/' => '_',
            c => c,
        })
        .collect();
    let engine = if text.ends_with('=') {
        &PADDED
    } else {
        &UNPADDED
    };
    engine.decode(url_safe).map_err(|e| base64_error(text, e))
}

/// Describes a base64 decoding error by position, never by the bytes of the input.
fn base64_error(text: &str, error: base64::DecodeError) -> String {
    // The crate reports byte offsets; users count characters (the one holding the byte).
    let character = |offset: usize| {
        text.char_indices()
            .take_while(|(start, _)| *start <= offset)
            .count()
    };
    match error {
        base64::DecodeError::InvalidByte(offset, b'=') => {
            format!(
                "character {} is '=' padding before the end",
                character(offset)
            )
        }
        base64::DecodeError::InvalidByte(offset, _) => {
            format!("character {} is not a base64 character", character(offset))
        }
        base64::DecodeError::InvalidLength(_) => {
            "its length is not a possible base64 length".into()
        }
        base64::DecodeError::InvalidPadding => "its '=' padding is wrong".into(),
        base64::DecodeError::InvalidLastSymbol(offset, _) => {
            format!(
                "character {} is not a possible last character",
                character(offset)
            )
        }
    }
}

/// The PEM word of a section kind, as its BEGIN line spells it.
fn section_label(kind: SectionKind) -> &'static str {
    match kind {
        SectionKind::Certificate => "CERTIFICATE",
        SectionKind::PublicKey => "PUBLIC KEY",
        SectionKind::RsaPrivateKey => "RSA PRIVATE KEY",
        SectionKind::PrivateKey => "PRIVATE KEY",
        SectionKind::EcPrivateKey => "EC PRIVATE KEY",
        SectionKind::Crl => "X509 CRL",
        SectionKind::Csr => "CERTIFICATE REQUEST",
        SectionKind::EchConfigList => "ECHCONFIG",
        _ => "non-certificate",
    }
}

/// The DER bodies of the `CERTIFICATE` blocks of a PEM text, refusing any other block (a key
/// pasted by mistake, say); text outside the blocks is ignored.
fn pem_certificates(pem: &str) -> Result<Vec<Vec<u8>>, String> {
    let mut out = Vec::new();
    for section in <(SectionKind, Vec<u8>)>::pem_slice_iter(pem.as_bytes()) {
        let n = out.len() + 1;
        let (kind, der) = section.map_err(|e| match e {
            pem::Error::MissingSectionEnd { end_marker } if end_marker == b"CERTIFICATE" => {
                format!("certificate {n} has no END line")
            }
            pem::Error::MissingSectionEnd { .. } => format!("block {n} has no END line"),
            pem::Error::IllegalSectionStart { .. } => {
                format!("block {n} has a BEGIN line that does not end in '-----'")
            }
            pem::Error::Base64Decode(detail) => {
                format!("block {n}: its body is not base64 ({detail})")
            }
            other => format!("block {n}: {other}"),
        })?;
        if kind != SectionKind::Certificate {
            return Err(format!(
                "block {n} is '-----BEGIN {}-----', not a certificate",
                section_label(kind)
            ));
        }
        // A certificate is a DER SEQUENCE.
        if der.len() < 16 || der[0] != 0x30 {
            return Err(format!("certificate {n} does not hold a DER certificate"));
        }
        out.push(der);
    }
    // Blocks of a kind the PEM reader does not know (`TRUSTED CERTIFICATE`, say) are skipped
    // by it; they are refused here all the same.
    let blocks = pem.lines().filter(|l| l.starts_with("-----BEGIN ")).count();
    if blocks > out.len() {
        return Err(format!(
            "{} block(s) are not '-----BEGIN CERTIFICATE-----' blocks",
            blocks - out.len()
        ));
    }
    if out.is_empty() {
        return Err("no '-----BEGIN CERTIFICATE-----' block found".into());
    }
    Ok(out)
}

/// Whether an Ingress Hostname's resolved addresses intersect this Cluster's Machine public
/// addresses. Not a Deploy failure and not health: it only says whether ordering can succeed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum ClusterDnsVerdict {
    /// At least one resolved address is a Machine public address.
    Points {
        /// Every address the hostname resolved to.
        resolved: Vec<IpAddr>,
        /// The resolved addresses that are Machine public addresses.
        matching: Vec<IpAddr>,
    },
    /// The hostname resolves to no Machine public address (or to nothing at all).
    ElsewhereOrUnresolved {
        /// Every address the hostname resolved to (empty: it does not resolve).
        resolved: Vec<IpAddr>,
        /// The Cluster's Machine public addresses.
        expected: Vec<IpAddr>,
    },
    /// No verdict could be reached (the lookup failed, or no Machine public address is known).
    Unknown {
        /// Why.
        reason: String,
    },
}

impl ClusterDnsVerdict {
    /// Judges resolved addresses against the Cluster's Machine public addresses. An empty
    /// `expected` set means the public addresses are unknown: the verdict is
    /// [`ClusterDnsVerdict::Unknown`].
    pub fn judge(resolved: &[IpAddr], expected: &[IpAddr]) -> ClusterDnsVerdict {
        let mut resolved: Vec<IpAddr> = resolved.to_vec();
        resolved.sort();
        resolved.dedup();
        let mut expected: Vec<IpAddr> = expected.to_vec();
        expected.sort();
        expected.dedup();
        if expected.is_empty() {
            return ClusterDnsVerdict::Unknown {
                reason: "no Machine public address is known, so the DNS answer cannot be judged"
                    .into(),
            };
        }
        let matching: Vec<IpAddr> = resolved
            .iter()
            .filter(|a| expected.contains(a))
            .copied()
            .collect();
        if matching.is_empty() {
            ClusterDnsVerdict::ElsewhereOrUnresolved { resolved, expected }
        } else {
            ClusterDnsVerdict::Points { resolved, matching }
        }
    }

    /// Whether a certificate is ordered under this verdict: only a hostname known to point
    /// elsewhere (or nowhere) is held back; an unknown verdict does not block ordering, the
    /// authority's own validation decides.
    pub fn permits_order(&self) -> bool {
        !matches!(self, ClusterDnsVerdict::ElsewhereOrUnresolved { .. })
    }
}

fn join_addrs(a: &[IpAddr]) -> String {
    if a.is_empty() {
        return "nothing".into();
    }
    a.iter()
        .map(IpAddr::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

impl fmt::Display for ClusterDnsVerdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClusterDnsVerdict::Points { matching, .. } => {
                write!(f, "points here ({})", join_addrs(matching))
            }
            ClusterDnsVerdict::ElsewhereOrUnresolved { resolved, expected } => write!(
                f,
                "resolves to {} but no Machine of this Cluster has that address (public addresses: {}); point the hostname's A/AAAA records at a Machine",
                join_addrs(resolved),
                join_addrs(expected)
            ),
            ClusterDnsVerdict::Unknown { reason } => write!(f, "unknown: {reason}"),
        }
    }
}

/// Where one Ingress Hostname's certificate stands, as its issuer Machine records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CertificateState {
    /// Certificate Material is present, covers the hostname and is before its renewal point.
    Valid,
    /// Certificate Material is wanted and the issuer will order it (first attempt not made yet).
    Pending,
    /// An order is in progress.
    Ordering,
    /// The last attempt failed; the next one is at `next_attempt_at`.
    Failed,
    /// The Cluster DNS Verdict says the hostname points elsewhere or nowhere: nothing is ordered
    /// until it points at a Machine (rechecked at `next_attempt_at`).
    NotPointingHere,
    /// The Certificate Policy is refused (for example a challenge kind Ployz cannot perform):
    /// nothing is ordered until it is fixed.
    PolicyRefused,
}

impl CertificateState {
    /// The state's word, as `ployz cert ls` prints it.
    pub fn as_str(self) -> &'static str {
        match self {
            CertificateState::Valid => "valid",
            CertificateState::Pending => "pending",
            CertificateState::Ordering => "ordering",
            CertificateState::Failed => "failed",
            CertificateState::NotPointingHere => "not-pointing-here",
            CertificateState::PolicyRefused => "policy-refused",
        }
    }
}

impl fmt::Display for CertificateState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One row of `ployz cert ls`: a machine-owned record written by the hostname's issuer Machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CertificateStatus {
    /// The Ingress Hostname, lowercase.
    pub hostname: String,
    /// Where it stands.
    pub state: CertificateState,
    /// The current Certificate Material's expiry (Unix seconds), if there is material.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_after: Option<i64>,
    /// When the current material will be renewed (Unix seconds), if there is material.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renew_at: Option<i64>,
    /// The Machine that issues this hostname's certificates.
    pub issuer: MachineId,
    /// The last failure, in words; `None` after a success.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// Failed attempts in a row.
    #[serde(default)]
    pub consecutive_failures: u32,
    /// When the last attempt started (Unix seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_attempt_at: Option<i64>,
    /// When the next attempt is due (Unix seconds), for failed or held-back hostnames.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_attempt_at: Option<i64>,
    /// The last Cluster DNS Verdict, if one was taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<ClusterDnsVerdict>,
    /// When this record was written (Unix seconds).
    pub updated_at: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(p: CertificatePolicy) -> String {
        p.validate().expect_err("must be refused").to_string()
    }

    #[test]
    fn absence_means_the_built_in_defaults() {
        let p: CertificatePolicy = serde_json::from_str("{}").unwrap();
        assert!(p.validate().is_ok());
        assert_eq!(p.directory_url(), DEFAULT_DIRECTORY_URL);
        assert_eq!(p.key_type(), CertificateKeyType::EcdsaP256);
        assert!((p.renewal_fraction() - 2.0 / 3.0).abs() < 1e-12);
        assert_eq!(p.backoff_min(), Duration::from_secs(60));
        assert_eq!(p.backoff_max(), Duration::from_secs(6 * 3600));
        assert_eq!(p.probe_timeout(), Duration::from_secs(5));
        assert_eq!(p.challenge_kind(), "http-01");
        assert_eq!(p.external_account_binding().unwrap(), None);
        assert_eq!(serde_json::to_string(&p).unwrap(), "{}");
    }

    #[test]
    fn a_full_policy_round_trips_and_validates() {
        let p = CertificatePolicy {
            directory_url: Some("https://127.0.0.1:14000/dir".into()),
            eab_key_id: Some("kid-1".into()),
            eab_hmac_key: Some("c2VjcmV0LWtleS1ieXRlcw".into()),
            key_type: Some(CertificateKeyType::Rsa2048),
            renewal_fraction: Some(0.5),
            backoff_min_secs: Some(1),
            backoff_max_secs: Some(1),
            probe_timeout_ms: Some(100),
            challenge: Some("HTTP-01".into()),
            ca_bundle_pem: None,
        };
        p.validate().unwrap();
        let text = serde_json::to_string(&p).unwrap();
        assert!(text.contains("\"rsa-2048\""), "{text}");
        let back: CertificatePolicy = serde_json::from_str(&text).unwrap();
        assert_eq!(back, p);
        let eab = p.external_account_binding().unwrap().unwrap();
        assert_eq!(eab.hmac_key, b"secret-key-bytes");
        assert_eq!(eab.key_id, "kid-1");
    }

    #[test]
    fn bad_directory_urls_are_refused_naming_field_value_and_fix() {
        for (url, why) in [
            (
                "ftp://ca.example/dir",
                "must start with https:// or http://",
            ),
            ("acme.example/dir", "must start with https://"),
            ("https:///dir", "no host"),
            ("https://ca.example:99999/dir", "port '99999'"),
            ("https://ca example/dir", "whitespace"),
            ("https://user:pw@ca.example/dir", "credentials"),
        ] {
            let m = err(CertificatePolicy {
                directory_url: Some(url.into()),
                ..Default::default()
            });
            assert!(m.starts_with(&format!("directory_url '{url}'")), "{m}");
            assert!(m.contains(why), "{url}: {m}");
            assert!(m.contains("give the ACME directory URL"), "{m}");
        }
        for ok in [
            "http://127.0.0.1:14000/dir",
            "https://[::1]:14000/dir",
            "https://acme.example.com/directory?x=1",
        ] {
            CertificatePolicy {
                directory_url: Some(ok.into()),
                ..Default::default()
            }
            .validate()
            .unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
    }

    #[test]
    fn eab_needs_both_halves_and_a_base64_key_never_echoed() {
        let m = err(CertificatePolicy {
            eab_key_id: Some("kid".into()),
            ..Default::default()
        });
        assert_eq!(m, "eab_key_id is set but eab_hmac_key is not; an external account binding needs both eab_key_id and eab_hmac_key, or neither");
        let m = err(CertificatePolicy {
            eab_hmac_key: Some("abcd".into()),
            ..Default::default()
        });
        assert!(
            m.starts_with("eab_hmac_key is set but eab_key_id is not"),
            "{m}"
        );
        let m = err(CertificatePolicy {
            eab_key_id: Some("kid".into()),
            eab_hmac_key: Some("not*base64secret".into()),
            ..Default::default()
        });
        assert!(
            m.starts_with("eab_hmac_key is not base64url (character 4"),
            "{m}"
        );
        assert!(m.contains("paste the HMAC key"), "{m}");
        assert!(!m.contains("secret"), "the key leaked: {m}");
        let m = err(CertificatePolicy {
            eab_key_id: Some("kid".into()),
            eab_hmac_key: Some("a".into()),
            ..Default::default()
        });
        assert!(m.contains("length"), "{m}");
    }

    #[test]
    fn a_challenge_kind_ployz_cannot_perform_is_refused_not_defaulted() {
        let p = CertificatePolicy {
            challenge: Some("dns-01".into()),
            ..Default::default()
        };
        let m = err(p.clone());
        assert_eq!(m, "challenge 'dns-01' cannot be performed: Ployz performs only http-01 (served by every Machine's edge on port 80); set challenge to http-01 or remove it");
        // The accessor reports what was asked, never silently http-01.
        assert_eq!(p.challenge_kind(), "dns-01");
    }

    #[test]
    fn renewal_fraction_must_lie_strictly_between_zero_and_one() {
        for f in [0.0, 1.0, -0.5, 1.5, f64::NAN] {
            let m = err(CertificatePolicy {
                renewal_fraction: Some(f),
                ..Default::default()
            });
            assert!(m.starts_with("renewal_fraction "), "{m}");
            assert!(m.contains("outside (0, 1)"), "{m}");
        }
        for f in [1e-9, 0.5, 0.999] {
            CertificatePolicy {
                renewal_fraction: Some(f),
                ..Default::default()
            }
            .validate()
            .unwrap();
        }
    }

    #[test]
    fn backoff_bounds_and_probe_timeout_are_checked() {
        let m = err(CertificatePolicy {
            backoff_min_secs: Some(600),
            backoff_max_secs: Some(60),
            ..Default::default()
        });
        assert_eq!(m, "backoff_min_secs 600 is greater than backoff_max_secs 60; make the minimum at most the maximum");
        // Against the default maximum too.
        let m = err(CertificatePolicy {
            backoff_min_secs: Some(7 * 3600),
            ..Default::default()
        });
        assert!(m.contains("backoff_max_secs 21600"), "{m}");
        let m = err(CertificatePolicy {
            backoff_min_secs: Some(0),
            ..Default::default()
        });
        assert!(m.starts_with("backoff_min_secs 0"), "{m}");
        let m = err(CertificatePolicy {
            probe_timeout_ms: Some(0),
            ..Default::default()
        });
        assert!(m.starts_with("probe_timeout_ms 0"), "{m}");
    }

    #[test]
    fn ca_bundle_must_be_pem_certificates() {
        let m = err(CertificatePolicy {
            ca_bundle_pem: Some("hello".into()),
            ..Default::default()
        });
        assert!(
            m.starts_with("ca_bundle_pem is not PEM certificates (no '-----BEGIN CERTIFICATE-----' block found)"),
            "{m}"
        );
        let m = err(CertificatePolicy {
            ca_bundle_pem: Some(
                "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n".into(),
            ),
            ..Default::default()
        });
        assert!(m.contains("not a certificate"), "{m}");
        let m = err(CertificatePolicy {
            ca_bundle_pem: Some(
                "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n".into(),
            ),
            ..Default::default()
        });
        assert!(m.contains("block 1: its body is not base64"), "{m}");
        let m = err(CertificatePolicy {
            ca_bundle_pem: Some("-----BEGIN CERTIFICATE-----\nMIIB\n".into()),
            ..Default::default()
        });
        assert!(m.contains("no END line"), "{m}");
    }

    #[test]
    fn hmac_keys_decode_in_both_alphabets_with_or_without_padding() {
        assert_eq!(decode_hmac_key("aGk").unwrap(), b"hi");
        assert_eq!(decode_hmac_key("aGk=").unwrap(), b"hi");
        assert_eq!(decode_hmac_key("aA==").unwrap(), b"h");
        assert_eq!(decode_hmac_key("aA").unwrap(), b"h");
        assert_eq!(decode_hmac_key("-_-_").unwrap(), [0xfb, 0xff, 0xbf]);
        assert_eq!(decode_hmac_key("+/+/").unwrap(), [0xfb, 0xff, 0xbf]);
        // The alphabets mixed, as a hand-edited key may be.
        assert_eq!(decode_hmac_key("-/+_").unwrap(), [0xfb, 0xff, 0xbf]);
        // Bits after the last byte need not be zero.
        assert_eq!(decode_hmac_key("aGl").unwrap(), b"hi");
        assert_eq!(decode_hmac_key("").unwrap(), b"");
    }

    #[test]
    fn hmac_key_errors_say_where_never_what() {
        for (key, why) in [
            ("not*base64secret", "character 4 is not a base64 character"),
            ("ab cd", "character 3 is not a base64 character"),
            ("abcé", "character 4 is not a base64 character"),
            ("aG=k", "character 3 is '=' padding before the end"),
            ("aA==aGk=", "character 3 is '=' padding before the end"),
            ("a", "its length is not a possible base64 length"),
            ("abcde", "its length is not a possible base64 length"),
            ("aGk==", "padding"),
            ("aA=", "padding"),
            ("==", "padding"),
        ] {
            let e = decode_hmac_key(key).expect_err(key);
            assert!(e.contains(why), "{key:?}: {e}");
            assert!(!e.contains("secret"), "{key:?}: the key leaked: {e}");
        }
    }

    #[test]
    fn directory_url_edge_cases() {
        for (url, why) in [
            (
                "HTTPS:ca.example/dir",
                "must start with https:// or http://",
            ),
            ("https://", "no host"),
            ("https://?x", "no host"),
            ("https://:443/dir", "no host"),
            ("https://ca.example:0/dir", "port '0'"),
            ("https://ca.example:x/dir", "port 'x'"),
            ("https://[::1/dir", "IPv6"),
            ("https://[::g]/dir", "IPv6"),
            ("https://ca!example/dir", "host 'ca!example'"),
            ("https://ca\texample/dir", "whitespace"),
            ("https://bücher.example/dir", "non-ASCII"),
            ("https://ca.example/dïr", "non-ASCII"),
            ("https://\\ca.example/dir", "'\\'"),
            ("https://@ca.example/dir", "credentials"),
            ("https://user@ca.example/dir", "credentials"),
        ] {
            let e = check_http_url(url).expect_err(url);
            assert!(e.contains(why), "{url}: {e}");
        }
        for ok in [
            "HTTPS://CA.Example/Dir",
            "https://ca.example",
            "https://ca_1.example:443/dir#x",
            "http://10.0.0.1/dir",
            "https://[2001:db8::1]/dir",
            "https://xn--bcher-kva.example/dir",
            "https://ca.example/dir%20x",
        ] {
            check_http_url(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
    }

    #[test]
    fn ca_bundle_blocks_other_than_certificates_are_refused() {
        let der = {
            let mut d = vec![0x30, 0x82, 0x01, 0x00];
            d.extend([0u8; 20]);
            d
        };
        use base64::Engine as _;
        let body = base64::engine::general_purpose::STANDARD.encode(&der);
        let cert = format!("-----BEGIN CERTIFICATE-----\n{body}\n-----END CERTIFICATE-----\n");
        assert_eq!(pem_certificates(&cert).unwrap(), vec![der.clone()]);
        // Explanatory text around blocks, CRLF line ends and two certificates.
        let two = format!(
            "Issuer: test CA\r\n{}\r\nmore text\n{cert}",
            cert.replace('\n', "\r\n")
        );
        assert_eq!(
            pem_certificates(&two).unwrap(),
            vec![der.clone(), der.clone()]
        );
        for (pem, why) in [
            (
                format!("{cert}-----BEGIN EC PRIVATE KEY-----\nAAAA\n-----END EC PRIVATE KEY-----\n"),
                "block 2 is '-----BEGIN EC PRIVATE KEY-----', not a certificate",
            ),
            (
                format!("{cert}-----BEGIN TRUSTED CERTIFICATE-----\n{body}\n-----END TRUSTED CERTIFICATE-----\n"),
                "1 block(s) are not '-----BEGIN CERTIFICATE-----' blocks",
            ),
            (
                "-----BEGIN CERTIFICATE-----\nMIIBAAAA\n-----END CERTIFICATE-----\n".to_owned(),
                "certificate 1 does not hold a DER certificate",
            ),
            (
                "-----BEGIN CERTIFICATE\nAAAA\n-----END CERTIFICATE-----\n".to_owned(),
                "block 1 has a BEGIN line",
            ),
            (
                format!("{cert}-----BEGIN PRIVATE KEY-----\nAAAA\n"),
                "block 2 has no END line",
            ),
        ] {
            let e = pem_certificates(&pem).expect_err(why);
            assert!(e.contains(why), "{why}: {e}");
        }
    }

    #[test]
    fn merging_replaces_exactly_the_fields_the_changes_set() {
        let stored = CertificatePolicy {
            directory_url: Some("https://ca.example/dir".into()),
            ca_bundle_pem: Some("pem".into()),
            eab_key_id: Some("kid".into()),
            eab_hmac_key: Some("aGk".into()),
            key_type: Some(CertificateKeyType::Rsa2048),
            renewal_fraction: Some(0.5),
            backoff_min_secs: Some(10),
            backoff_max_secs: Some(100),
            probe_timeout_ms: Some(1000),
            challenge: Some("http-01".into()),
        };
        // No change keeps everything.
        assert_eq!(
            stored.clone().merged_with(CertificatePolicy::default()),
            stored
        );
        // Every field changed takes every change.
        let changes = CertificatePolicy {
            directory_url: Some("https://other.example/dir".into()),
            ca_bundle_pem: Some("other pem".into()),
            eab_key_id: Some("kid-2".into()),
            eab_hmac_key: Some("aGl".into()),
            key_type: Some(CertificateKeyType::EcdsaP256),
            renewal_fraction: Some(0.75),
            backoff_min_secs: Some(20),
            backoff_max_secs: Some(200),
            probe_timeout_ms: Some(2000),
            challenge: Some("HTTP-01".into()),
        };
        assert_eq!(stored.clone().merged_with(changes.clone()), changes);
        // One field changed takes that one only.
        let merged = stored.clone().merged_with(CertificatePolicy {
            backoff_max_secs: Some(300),
            ..Default::default()
        });
        assert_eq!(
            merged,
            CertificatePolicy {
                backoff_max_secs: Some(300),
                ..stored.clone()
            }
        );
        // Onto the defaults, the changes are the policy.
        assert_eq!(
            CertificatePolicy::default().merged_with(changes.clone()),
            changes
        );
    }

    #[test]
    fn key_type_words() {
        assert_eq!(
            "rsa-2048".parse::<CertificateKeyType>().unwrap(),
            CertificateKeyType::Rsa2048
        );
        assert_eq!(
            "ECDSA-P256".parse::<CertificateKeyType>().unwrap(),
            CertificateKeyType::EcdsaP256
        );
        let m = "ed25519"
            .parse::<CertificateKeyType>()
            .unwrap_err()
            .to_string();
        assert_eq!(
            m,
            "key_type 'ed25519' is not known; use ecdsa-p256 (the default) or rsa-2048"
        );
    }

    #[test]
    fn debug_withholds_the_hmac_key() {
        let p = CertificatePolicy {
            eab_key_id: Some("kid".into()),
            eab_hmac_key: Some("c2VjcmV0".into()),
            ..Default::default()
        };
        let d = format!("{p:?}");
        assert!(!d.contains("c2VjcmV0"), "{d}");
        let eab = p.external_account_binding().unwrap().unwrap();
        let d = format!("{eab:?}");
        assert!(!d.contains("secret") && !d.contains("115"), "{d}");
    }

    #[test]
    fn verdicts_judge_intersection() {
        let a: IpAddr = "203.0.113.7".parse().unwrap();
        let b: IpAddr = "198.51.100.1".parse().unwrap();
        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        let v = ClusterDnsVerdict::judge(&[a, v6], &[v6, b]);
        assert_eq!(
            v,
            ClusterDnsVerdict::Points {
                resolved: vec![a, v6],
                matching: vec![v6]
            }
        );
        assert!(v.permits_order());
        let v = ClusterDnsVerdict::judge(&[a], &[b]);
        assert!(matches!(v, ClusterDnsVerdict::ElsewhereOrUnresolved { .. }));
        assert!(!v.permits_order());
        assert!(v.to_string().contains("resolves to 203.0.113.7"), "{v}");
        let v = ClusterDnsVerdict::judge(&[], &[b]);
        assert!(v.to_string().starts_with("resolves to nothing"), "{v}");
        let v = ClusterDnsVerdict::judge(&[a], &[]);
        assert!(matches!(v, ClusterDnsVerdict::Unknown { .. }));
        assert!(v.permits_order());
        let text = serde_json::to_string(&ClusterDnsVerdict::judge(&[a], &[b])).unwrap();
        assert!(
            text.contains("\"verdict\":\"elsewhere_or_unresolved\""),
            "{text}"
        );
    }

    #[test]
    fn durations_beyond_their_bounds_are_refused() {
        let long = CertificatePolicy {
            backoff_max_secs: Some(MAX_BACKOFF_SECS + 1),
            ..Default::default()
        };
        let e = long.validate().unwrap_err().to_string();
        assert!(
            e.contains("backoff_max_secs") && e.contains("30 days"),
            "{e}"
        );
        let huge_min = CertificatePolicy {
            backoff_min_secs: Some(u64::MAX / 2),
            backoff_max_secs: Some(u64::MAX),
            ..Default::default()
        };
        assert!(matches!(
            huge_min.validate(),
            Err(PolicyError::BackoffTooLong {
                field: "backoff_min_secs",
                ..
            })
        ));
        let probe = CertificatePolicy {
            probe_timeout_ms: Some(MAX_PROBE_TIMEOUT_MS + 1),
            ..Default::default()
        };
        assert!(matches!(
            probe.validate(),
            Err(PolicyError::ProbeTimeoutTooLong { .. })
        ));
        let edge = CertificatePolicy {
            backoff_min_secs: Some(MAX_BACKOFF_SECS),
            backoff_max_secs: Some(MAX_BACKOFF_SECS),
            probe_timeout_ms: Some(MAX_PROBE_TIMEOUT_MS),
            ..Default::default()
        };
        assert_eq!(edge.validate(), Ok(()));
    }
}
