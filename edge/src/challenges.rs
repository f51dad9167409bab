//! The HTTP-01 responder: answers `GET /.well-known/acme-challenge/TOKEN` on the plain-HTTP
//! listener, for any Host, from the replicated challenge records the certificate issuer writes
//! (so whichever Machine the authority reaches can answer).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use ployz_store::certificates::{stored_challenges, CHALLENGES_NAMESPACE};
use ployz_store::{KeyPrefix, Store};
use tokio::sync::watch;

/// A pending challenge as the edge serves it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Pending {
    key_authorization: String,
    expires_at: i64,
}

/// Token -> key authorization, rebuilt off the request path when challenge records change.
#[derive(Clone, Default)]
pub struct ChallengeResponder {
    table: Arc<ArcSwap<HashMap<String, Pending>>>,
}

impl ChallengeResponder {
    /// The body to answer a challenge request with, if `token` is pending and not expired.
    pub fn response(&self, token: &str) -> Option<String> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        self.table
            .load()
            .get(token)
            .filter(|p| p.expires_at > now)
            .map(|p| p.key_authorization.clone())
    }

    /// Reads every challenge record and publishes the table.
    pub fn rebuild(&self, store: &Store) {
        let table = stored_challenges(store)
            .into_iter()
            .map(|c| {
                (
                    c.token,
                    Pending {
                        key_authorization: c.key_authorization,
                        expires_at: c.expires_at,
                    },
                )
            })
            .collect();
        self.table.store(Arc::new(table));
    }

    /// Keeps the table current until `shutdown` turns true.
    pub async fn run(&self, store: Arc<Store>, mut shutdown: watch::Receiver<bool>) {
        let mut changes = store.watch(KeyPrefix::cluster_namespace(CHALLENGES_NAMESPACE));
        loop {
            let s = store.clone();
            let this = self.clone();
            let _ = tokio::task::spawn_blocking(move || this.rebuild(&s)).await;
            tokio::select! {
                _ = shutdown.changed() => return,
                event = changes.next() => if event.is_none() { return },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ployz_core::MachineId;
    use ployz_store::certificates::{challenge_key, ChallengeRecord};

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
    fn pending_unexpired_tokens_are_answered_and_nothing_else() {
        let store = Store::temporary(MachineId::generate()).unwrap();
        put(&store, "live", i64::MAX);
        put(&store, "old", 1);
        let responder = ChallengeResponder::default();
        responder.rebuild(&store);
        assert_eq!(responder.response("live").as_deref(), Some("live.thumb"));
        assert_eq!(responder.response("old"), None);
        assert_eq!(responder.response("unknown"), None);
        store.delete(&challenge_key("live")).unwrap();
        responder.rebuild(&store);
        assert_eq!(responder.response("live"), None);
    }
}
