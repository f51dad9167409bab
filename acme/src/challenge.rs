//! HTTP-01 challenge records and the response the edge serves for them.
//!
//! The issuer writes one cluster-scoped [`ChallengeRecord`] per pending challenge before telling
//! the authority it is ready; every Machine's edge answers
//! `GET /.well-known/acme-challenge/TOKEN` with [`challenge_response`] (status 200, body the key
//! authorization, `Content-Type: text/plain`), and 404 when it returns `None`.

use std::time::{SystemTime, UNIX_EPOCH};

use ployz_store::Store;

use crate::layout::challenge_key;

pub use ployz_store::certificates::{
    is_valid_token, token_from_path, ChallengeRecord, CHALLENGE_PATH_PREFIX, MAX_TOKEN_LEN,
};

/// The body to answer `GET /.well-known/acme-challenge/TOKEN` with, or `None` (answer 404) when
/// the token is malformed, unknown or expired. Reads the store only.
pub fn challenge_response(store: &Store, token: &str) -> Option<String> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    challenge_response_at(store, token, now)
}

/// [`challenge_response`] at a given time (Unix seconds).
pub fn challenge_response_at(store: &Store, token: &str, now_unix: i64) -> Option<String> {
    if !is_valid_token(token) {
        return None;
    }
    let record = store.get(&challenge_key(token)).ok()??;
    let value = record.live_value()?;
    let challenge: ChallengeRecord = serde_json::from_slice(value).ok()?;
    (challenge.token == token && challenge.expires_at > now_unix)
        .then_some(challenge.key_authorization)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ployz_core::MachineId;

    fn put(store: &Store, token: &str, expires_at: i64) {
        let r = ChallengeRecord {
            token: token.into(),
            key_authorization: format!("{token}.thumb"),
            hostname: "app.test".into(),
            expires_at,
        };
        store
            .put(&challenge_key(token), serde_json::to_vec(&r).unwrap())
            .unwrap();
    }

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
    fn responses_come_from_live_unexpired_records_only() {
        let store = Store::temporary(MachineId::generate()).unwrap();
        put(&store, "tok", 1_000);
        assert_eq!(
            challenge_response_at(&store, "tok", 999).as_deref(),
            Some("tok.thumb")
        );
        assert_eq!(challenge_response_at(&store, "tok", 1_000), None);
        assert_eq!(challenge_response_at(&store, "other", 1), None);
        // A malformed token never reaches the store, even one that would spell another key.
        assert_eq!(challenge_response_at(&store, "tok/../tok", 1), None);
        store.delete(&challenge_key("tok")).unwrap();
        assert_eq!(challenge_response_at(&store, "tok", 1), None);
        put(&store, "live", i64::MAX);
        assert_eq!(
            challenge_response(&store, "live").as_deref(),
            Some("live.thumb")
        );
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
