//! Where the store keeps Certificate Material and HTTP-01 challenge records, so the module that
//! writes them (the certificate issuer, `ployz cert import`) and the one that serves them (the
//! edge) meet here and nowhere else.

use serde::{Deserialize, Serialize};

use crate::{Key, KeyPrefix, Store};

/// Store namespace of Certificate Material (cluster-scoped, named by hostname).
pub const CERTIFICATES_NAMESPACE: &str = "certificates";

/// The record key of a hostname's Certificate Material.
pub fn certificate_key(hostname: &str) -> Key {
    Key::cluster(CERTIFICATES_NAMESPACE, hostname)
}

/// Store namespace of HTTP-01 challenge records (cluster-scoped, named by token).
pub const CHALLENGES_NAMESPACE: &str = "acme-challenges";

/// The record key of an HTTP-01 challenge.
pub fn challenge_key(token: &str) -> Key {
    Key::cluster(CHALLENGES_NAMESPACE, token)
}

/// The path prefix of HTTP-01 challenge requests.
pub const CHALLENGE_PATH_PREFIX: &str = "/.well-known/acme-challenge/";

/// The longest token accepted. RFC 8555 tokens carry at least 128 bits of entropy in base64url
/// (22+ characters); authorities use 43. Anything far longer is not a token.
pub const MAX_TOKEN_LEN: usize = 256;

/// One pending HTTP-01 challenge, as stored under [`challenge_key`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChallengeRecord {
    /// The challenge token (base64url).
    pub token: String,
    /// The response body: `token.thumbprint`. Public by design (the authority fetches it over
    /// plain HTTP); it reveals nothing of the account key.
    pub key_authorization: String,
    /// The Ingress Hostname being validated.
    pub hostname: String,
    /// After this (Unix seconds) the record is stale: it is not served and any issuer removes it.
    pub expires_at: i64,
}

/// Whether `token` can be an ACME token: 1 to [`MAX_TOKEN_LEN`] characters of the base64url
/// alphabet `[A-Za-z0-9_-]`. Checked before the token goes anywhere near a store key.
pub fn is_valid_token(token: &str) -> bool {
    !token.is_empty()
        && token.len() <= MAX_TOKEN_LEN
        && token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The token of a request path, if the path is an HTTP-01 challenge path with a valid token.
pub fn token_from_path(path: &str) -> Option<&str> {
    let token = path.strip_prefix(CHALLENGE_PATH_PREFIX)?;
    is_valid_token(token).then_some(token)
}

/// Every challenge record in the store, skipping records that do not decode or whose name is
/// not their token.
pub fn stored_challenges(store: &Store) -> Vec<ChallengeRecord> {
    store
        .scan_live(&KeyPrefix::cluster_namespace(CHALLENGES_NAMESPACE))
        .unwrap_or_default()
        .into_iter()
        .filter_map(|r| {
            let c: ChallengeRecord = serde_json::from_slice(&r.value).ok()?;
            (r.key.name() == c.token && is_valid_token(&c.token)).then_some(c)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_charset_is_base64url_only() {
        for ok in [
            "abc",
            "A-b_9",
            "LoqXcYV8q5ONbJQxbmR7SCTNo3tiAXDfowyjxAjEuX0",
        ] {
            assert!(is_valid_token(ok), "{ok}");
        }
        for bad in [
            "",
            "a/b",
            "..",
            "a.b",
            "a b",
            "a%2Fb",
            "tok\n",
            "ü",
            "a+b",
            "a=",
            &"x".repeat(MAX_TOKEN_LEN + 1),
        ] {
            assert!(!is_valid_token(bad), "{bad:?}");
        }
    }

    #[test]
    fn paths_yield_tokens() {
        assert_eq!(
            token_from_path("/.well-known/acme-challenge/abc_-1"),
            Some("abc_-1")
        );
        assert_eq!(token_from_path("/.well-known/acme-challenge/"), None);
        assert_eq!(token_from_path("/.well-known/acme-challenge/a/b"), None);
        assert_eq!(token_from_path("/other/abc"), None);
    }
}
