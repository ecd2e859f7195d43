//! [`KeptEnis`]: ENIs a node's backend created but could not attach only
//! because the cloud throttled the attach (or the look before it), kept
//! for the backend's next create instead of deleted.
//!
//! A throttle means the account's buckets, which every node shares, are
//! drained. Deleting the new ENI then spends a delete more, and the next
//! create spends a create again, out of those very buckets; kept, the next
//! `create_and_attach` attaches it and makes no create at all.
//!
//! Invariants: an ENI is here only while no call holds it (taking one
//! hands it to one caller alone); every one carries the node's tags, so an
//! agent restarted meanwhile finds it with `tagged` (an orphan the pool
//! deletes) and never leaks it; only a throttled attach keeps one
//! ([`keeps`]), any other failure deletes the ENI as before.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};

use enim_core::ProviderError;

/// Whether a new ENI whose attach failed with `e` is worth keeping for the
/// next create: the cloud only said "later" (throttled), so the ENI is as
/// good as when it was made. A refusal or any other failure is not: the
/// ENI is deleted, as it may never attach (or may be attached already,
/// which the delete path sorts out).
pub fn keeps(e: &ProviderError) -> bool {
    matches!(e, ProviderError::Throttled(_))
}

/// New ENIs of one node waiting for an attach the cloud throttled; `T` is
/// what the backend needs to attach one (its id, and what else it read
/// from the create's reply). Handed out oldest first.
#[derive(Debug)]
pub struct KeptEnis<T> {
    kept: Mutex<VecDeque<T>>,
}

impl<T> Default for KeptEnis<T> {
    fn default() -> Self {
        KeptEnis {
            kept: Mutex::new(VecDeque::new()),
        }
    }
}

impl<T> KeptEnis<T> {
    fn lock(&self) -> MutexGuard<'_, VecDeque<T>> {
        // A push or a pop cannot leave the queue half-changed.
        self.kept.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps `eni` for the next create.
    pub fn keep(&self, eni: T) {
        self.lock().push_back(eni);
    }

    /// The oldest kept ENI, now the caller's alone.
    pub fn take(&self) -> Option<T> {
        self.lock().pop_front()
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_throttle_keeps_an_eni() {
        assert!(keeps(&ProviderError::Throttled("x".into())));
        for e in [
            ProviderError::Unavailable("attachment limit".into()),
            ProviderError::Config("denied".into()),
            ProviderError::UnknownEni("eni-1".into()),
        ] {
            assert!(!keeps(&e), "{e:?}");
        }
    }

    #[test]
    fn kept_enis_go_out_oldest_first_and_once() {
        let kept = KeptEnis::default();
        assert!(kept.is_empty());
        kept.keep("eni-1");
        kept.keep("eni-2");
        assert_eq!(kept.len(), 2);
        assert_eq!(kept.take(), Some("eni-1"));
        assert_eq!(kept.take(), Some("eni-2"));
        assert_eq!(kept.take(), None);
    }
}
