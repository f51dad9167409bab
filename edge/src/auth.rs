//! Basic authentication on a route: the users list (bcrypt or argon2 hashes) a Service's
//! `x-routes` names, read from the store by its digest, and the check of a request's
//! `Authorization` field against it.
//!
//! A hash check is made to be slow (tens of milliseconds of CPU for bcrypt at cost 10), so it
//! never runs on the event loop: it runs on the blocking pool, at most [`CHECKS_AT_ONCE`] at a
//! time, and a field that passed is remembered (by a SHA-256 of the list's digest and the field,
//! never the password) so a browser's next requests cost one hash lookup. A field that failed
//! is never remembered: every wrong guess pays the full check.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use ployz_core::users::{hash_scheme, parse_users, HashScheme};

/// Hash checks running at once; the rest wait. A guesser cannot take every core.
const CHECKS_AT_ONCE: usize = 2;

/// Fields remembered as passed; the memory is emptied when it is full.
const REMEMBERED: usize = 4096;

/// How long a request waits for a hash check to start before it is answered 503: guesses
/// pouring in delay the others, never without end.
const CHECK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// A users list: each user's hash.
#[derive(Debug)]
pub struct Users {
    hashes: HashMap<String, (HashScheme, String)>,
    /// The list's first user's hash, checked for a user the list does not name, so that an
    /// unknown user costs as long as a known one with a wrong password.
    stand_in: (HashScheme, String),
}

impl Users {
    /// The list in `bytes`, or `None` when it is not one a route accepts (a record from
    /// elsewhere that Compose did not check admits no one).
    pub fn parse(bytes: &[u8]) -> Option<Users> {
        let users = parse_users(bytes).ok()?;
        let hashes: HashMap<String, (HashScheme, String)> = users
            .iter()
            .filter_map(|(u, h)| Some((u.clone(), (hash_scheme(h)?, h.clone()))))
            .collect();
        let (_, first) = users.first()?;
        Some(Users {
            stand_in: (hash_scheme(first)?, first.clone()),
            hashes,
        })
    }

    /// Whether `user` with `password` is in the list: the hash check itself, slow by design.
    fn check(&self, user: &str, password: &[u8]) -> bool {
        match self.hashes.get(user) {
            Some((scheme, hash)) => verify(*scheme, hash, password),
            None => {
                let (scheme, hash) = &self.stand_in;
                let _ = verify(*scheme, hash, password);
                false
            }
        }
    }
}

/// Whether `password` matches `hash`.
fn verify(scheme: HashScheme, hash: &str, password: &[u8]) -> bool {
    match scheme {
        HashScheme::Bcrypt => bcrypt::verify(password, hash).unwrap_or(false),
        HashScheme::Argon2 => {
            use argon2::password_hash::{PasswordHash, PasswordVerifier};
            PasswordHash::new(hash).is_ok_and(|parsed| {
                argon2::Argon2::default()
                    .verify_password(password, &parsed)
                    .is_ok()
            })
        }
    }
}

/// A route's basic authentication as the edge holds it.
#[derive(Debug, Clone)]
pub struct RouteAuth {
    /// The realm the challenge names.
    pub realm: Arc<str>,
    /// The digest of the users list, which names it in the store.
    pub digest: Arc<str>,
    /// The list; `None` while this Machine's store has no list of that digest yet.
    pub users: Option<Arc<Users>>,
}

/// What a request's credentials come to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Admitted,
    /// No credentials, credentials that are not Basic, or a user and password the list does
    /// not hold: 401 with the challenge.
    Refused,
    /// The list is not known here yet: 503, for a moment.
    ListUnknown,
    /// Too many checks waiting: 503, for a moment.
    Busy,
}

/// Checks credentials against users lists and remembers those that passed.
pub struct AuthChecker {
    passed: Mutex<std::collections::HashSet<[u8; 32]>>,
    checks: Arc<tokio::sync::Semaphore>,
}

impl Default for AuthChecker {
    fn default() -> AuthChecker {
        AuthChecker {
            passed: Mutex::new(std::collections::HashSet::new()),
            checks: Arc::new(tokio::sync::Semaphore::new(CHECKS_AT_ONCE)),
        }
    }
}

impl AuthChecker {
    /// The verdict on a request's `Authorization` field values for a route's `auth`.
    pub async fn check(&self, auth: &RouteAuth, authorization: Option<&[u8]>) -> Verdict {
        let Some(users) = auth.users.clone() else {
            return Verdict::ListUnknown;
        };
        let Some((user, password)) = authorization.and_then(basic_credentials) else {
            return Verdict::Refused;
        };
        let key = remembered_key(&auth.digest, authorization.unwrap_or_default());
        if self.passed.lock().expect("not poisoned").contains(&key) {
            return Verdict::Admitted;
        }
        let permit =
            match tokio::time::timeout(CHECK_WAIT, self.checks.clone().acquire_owned()).await {
                Ok(Ok(permit)) => permit,
                Ok(Err(_)) => return Verdict::Refused,
                Err(_) => return Verdict::Busy,
            };
        // The permit goes with the check: a client that leaves does not free a place while its
        // check still runs.
        let admitted = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            users.check(&user, &password)
        })
        .await
        .unwrap_or(false);
        if !admitted {
            return Verdict::Refused;
        }
        let mut passed = self.passed.lock().expect("not poisoned");
        if passed.len() >= REMEMBERED {
            passed.clear();
        }
        passed.insert(key);
        Verdict::Admitted
    }
}

/// The key a passed field is remembered by: SHA-256 of the list's digest and the field.
fn remembered_key(digest: &str, field: &[u8]) -> [u8; 32] {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(digest.as_bytes());
    ctx.update(&[0]);
    ctx.update(field);
    ctx.finish().as_ref().try_into().expect("32 bytes")
}

/// The user and password of a `Basic` field (RFC 7617), or `None` for any other field.
pub fn basic_credentials(field: &[u8]) -> Option<(String, Vec<u8>)> {
    use base64::Engine as _;
    let field = std::str::from_utf8(field).ok()?.trim();
    let (scheme, token) = field.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(token.trim())
        .ok()?;
    let colon = decoded.iter().position(|b| *b == b':')?;
    let user = String::from_utf8(decoded[..colon].to_vec()).ok()?;
    Some((user, decoded[colon + 1..].to_vec()))
}

/// The `WWW-Authenticate` challenge of a realm.
pub fn challenge(realm: &str) -> String {
    format!("Basic realm=\"{realm}\", charset=\"UTF-8\"")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list() -> (String, Users) {
        let alice = bcrypt::hash("s3cret", 4).unwrap();
        let bob = {
            use argon2::password_hash::{PasswordHasher, SaltString};
            let salt = SaltString::encode_b64(b"saltsaltsalt").unwrap();
            argon2::Argon2::default()
                .hash_password(b"hunter2", &salt)
                .unwrap()
                .to_string()
        };
        let text = format!("alice:{alice}\nbob:{bob}\n");
        let users = Users::parse(text.as_bytes()).unwrap();
        (text, users)
    }

    fn field(user: &str, password: &str) -> Vec<u8> {
        use base64::Engine as _;
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
        )
        .into_bytes()
    }

    #[tokio::test]
    async fn bcrypt_and_argon2_users_are_admitted_and_wrong_ones_refused() {
        let (_, users) = list();
        let auth = RouteAuth {
            realm: "staff".into(),
            digest: "sha256:x".into(),
            users: Some(Arc::new(users)),
        };
        let checker = AuthChecker::default();
        for (f, verdict) in [
            (Some(field("alice", "s3cret")), Verdict::Admitted),
            (Some(field("bob", "hunter2")), Verdict::Admitted),
            (Some(field("alice", "hunter2")), Verdict::Refused),
            (Some(field("carol", "s3cret")), Verdict::Refused),
            (Some(b"Bearer abc".to_vec()), Verdict::Refused),
            (Some(b"Basic !!!".to_vec()), Verdict::Refused),
            (None, Verdict::Refused),
        ] {
            assert_eq!(checker.check(&auth, f.as_deref()).await, verdict, "{f:?}");
        }
        // Passed fields are remembered; a wrong one is not.
        assert_eq!(checker.passed.lock().unwrap().len(), 2);
        assert_eq!(
            checker.check(&auth, Some(&field("alice", "s3cret"))).await,
            Verdict::Admitted
        );
        // A list not known yet admits no one, and says so.
        let unknown = RouteAuth {
            users: None,
            ..auth
        };
        assert_eq!(
            checker
                .check(&unknown, Some(&field("alice", "s3cret")))
                .await,
            Verdict::ListUnknown
        );
    }

    #[test]
    fn a_field_remembered_for_one_list_is_not_for_another() {
        assert_ne!(
            remembered_key("sha256:a", b"Basic x"),
            remembered_key("sha256:b", b"Basic x")
        );
    }

    #[test]
    fn an_unknown_user_is_checked_against_the_lists_own_first_hash() {
        let (_, users) = list();
        assert_eq!(users.stand_in.0, HashScheme::Bcrypt);
        assert_eq!(&users.stand_in.1, &users.hashes["alice"].1);
        assert!(!users.check("mallory", b"s3cret"));
    }

    #[test]
    fn basic_fields_are_read_per_rfc_7617() {
        assert_eq!(
            basic_credentials(&field("a", "p:q")),
            Some(("a".into(), b"p:q".to_vec()))
        );
        assert_eq!(
            basic_credentials(b"basic YTpi"),
            Some(("a".into(), b"b".to_vec()))
        );
        assert_eq!(basic_credentials(b"Basic"), None);
        assert_eq!(basic_credentials(b"Digest YTpi"), None);
    }
}
