//! What the cloud refused to make for an EniPolicy's pods: the allocator
//! notes each refused create of a claim from a policy's template, and the
//! leader's policy status says so (`Ready=False`, reason `CloudRefused`)
//! while refusals go on. A refused claim is tried again every
//! [`CLAIM_RETRY`], and each refusal is noted again, so a note older than
//! [`REMEMBERED`] means the cloud has stopped refusing (or the pods are
//! gone): it no longer counts.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a claim whose ENI the cloud refused waits before it is tried
/// again (a refusal is a setup to fix, not a blip: no need to ask sooner).
pub const CLAIM_RETRY: Duration = Duration::from_secs(60);
/// How long a refusal counts without being noted again: a few retries.
pub const REMEMBERED: Duration = Duration::from_secs(180);

/// The last refusal for one policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// What the ENI was for: `claim <namespace>/<name>`, or the policy's
    /// warm ENIs.
    pub made_for: String,
    /// What the cloud said.
    pub error: String,
}

/// The refusals of every policy, shared by the allocator (which notes
/// them) and the policy status writer (which reads them).
#[derive(Debug, Default)]
pub struct Refusals {
    by_policy: Mutex<HashMap<String, (Instant, Refusal)>>,
}

impl Refusals {
    /// The cloud refused an ENI for `policy`'s pods: a claim's, made from
    /// its template, or one of its warm ENIs.
    pub fn note(&self, policy: &str, refusal: Refusal) {
        self.lock()
            .insert(policy.to_string(), (Instant::now(), refusal));
    }

    /// `policy`'s refusal, if noted within [`REMEMBERED`].
    pub fn of(&self, policy: &str) -> Option<Refusal> {
        self.of_at(policy, Instant::now())
    }

    fn of_at(&self, policy: &str, now: Instant) -> Option<Refusal> {
        let mut map = self.lock();
        match map.get(policy) {
            Some((at, r)) if now.saturating_duration_since(*at) < REMEMBERED => Some(r.clone()),
            Some(_) => {
                map.remove(policy);
                None
            }
            None => None,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Instant, Refusal)>> {
        // A panic while holding it left a plain map: still whole.
        self.by_policy.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_counts_until_it_is_old() {
        let r = Refusals::default();
        assert_eq!(r.of("db"), None);
        let refusal = Refusal {
            made_for: "claim web/db-1-eni".into(),
            error: "InvalidSubnetID.NotFound".into(),
        };
        r.note("db", refusal.clone());
        assert_eq!(r.of("db"), Some(refusal));
        assert_eq!(r.of("other"), None);
        let later = Instant::now() + REMEMBERED + Duration::from_secs(1);
        assert_eq!(r.of_at("db", later), None);
        assert_eq!(r.of("db"), None, "forgotten once old");
    }
}
