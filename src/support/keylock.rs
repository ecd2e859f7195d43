//! Per-attachment locks: operations on one attachment key run one at a
//! time, different keys in parallel. Shared by both modes' managers.

use std::collections::HashMap;
use std::sync::Arc;

use enim_api::model::AttachmentKey;
use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

/// Serialises operations on one attachment key while letting different
/// keys run in parallel.
#[derive(Default)]
pub(crate) struct KeyLocks {
    map: std::sync::Mutex<HashMap<AttachmentKey, Arc<AsyncMutex<()>>>>,
}

pub(crate) struct KeyGuard<'a> {
    locks: &'a KeyLocks,
    key: AttachmentKey,
    guard: Option<OwnedMutexGuard<()>>,
}

impl KeyLocks {
    pub(crate) async fn lock(&self, key: &AttachmentKey) -> KeyGuard<'_> {
        let mutex = {
            let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
            map.entry(key.clone()).or_default().clone()
        };
        KeyGuard {
            locks: self,
            key: key.clone(),
            guard: Some(mutex.lock_owned().await),
        }
    }
}

impl Drop for KeyGuard<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut map = self.locks.map.lock().unwrap_or_else(|p| p.into_inner());
        // Clones are only made under the map lock, so a count of one means
        // nobody waits on this key any more.
        if map
            .get(&self.key)
            .is_some_and(|m| Arc::strong_count(m) == 1)
        {
            map.remove(&self.key);
        }
    }
}
