//! Watches by key prefix.

use tokio::sync::broadcast;

use crate::{KeyPrefix, Record};

/// A record that changed what a key resolves to, locally written or merged from a peer, or a key
/// removed because its Machine was forgotten.
#[derive(Debug, Clone)]
pub struct Change {
    /// The record that now wins for its key (a tombstone for a delete). For a key removed by
    /// [`Store::forget_origin`](crate::Store::forget_origin), a tombstone that is not stored: the
    /// removed version's origin, HLC and sequence, no value; the key now reads as absent.
    pub record: Record,
}

/// What a watcher receives.
#[derive(Debug, Clone)]
pub enum WatchEvent {
    /// A key under the prefix changed.
    Changed(Change),
    /// The watcher fell behind and changes were dropped; rescan the prefix.
    Lagged,
}

/// A stream of changes under one key prefix (or any of several). Dropping it stops the watch.
#[derive(Debug)]
pub struct Watch {
    pub(crate) prefixes: Vec<KeyPrefix>,
    pub(crate) rx: broadcast::Receiver<Change>,
}

impl Watch {
    /// The next change under the prefixes, or `None` once the store is gone.
    pub async fn next(&mut self) -> Option<WatchEvent> {
        loop {
            match self.rx.recv().await {
                Ok(change) if self.prefixes.iter().any(|p| p.matches(&change.record.key)) => {
                    return Some(WatchEvent::Changed(change))
                }
                Ok(_) => continue,
                Err(broadcast::error::RecvError::Lagged(_)) => return Some(WatchEvent::Lagged),
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }
}
