//! ADD's wait for an ENI on its way, and the line of pods waiting for one
//! (demand on top of `pre_allocate`; see [`PoolConfig::allocate_wait`]).
//!
//! [`PoolConfig::allocate_wait`]: crate::PoolConfig::allocate_wait

use std::time::Duration;

use enim_core::EniOwner;

use crate::{Inner, PoolRole, State};

/// A pod waiting for an ENI.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Waiting {
    /// Since when: pods are served in this order.
    since: tokio::time::Instant,
    /// When it last asked: it has gone if it asks no more.
    seen: tokio::time::Instant,
    /// Its ADDs waiting in [`wait_for_free`] now. One that is
    /// not (told to try again, its retry not yet here) keeps its place but
    /// does not hold up those waiting behind it.
    present: u32,
}

impl State {
    /// Notes `owner` as waiting for an ENI, keeping its place in line.
    pub(crate) fn note_waiting(&mut self, owner: &EniOwner) {
        let now = tokio::time::Instant::now();
        self.waiting
            .entry(waiting_key(owner))
            .and_modify(|w| w.seen = now)
            .or_insert(Waiting {
                since: now,
                seen: now,
                present: 0,
            });
    }

    /// Forgets pods that have not asked for [`WAITING_TTL`].
    pub(crate) fn expire_waiting(&mut self) {
        let now = tokio::time::Instant::now();
        self.waiting
            .retain(|_, w| w.present > 0 || now.duration_since(w.seen) < WAITING_TTL);
    }

    /// How many pods waiting now are ahead of `owner` in line.
    fn ahead_of(&self, owner: &EniOwner) -> usize {
        let key = waiting_key(owner);
        let Some(mine) = self.waiting.get(&key) else {
            return self.waiting.len();
        };
        self.waiting
            .iter()
            .filter(|(k, w)| w.present > 0 && (w.since, *k) < (mine.since, &key))
            .count()
    }

    /// `owner`'s ADD starts (`true`) or stops waiting in line.
    fn set_present(&mut self, owner: &EniOwner, entering: bool) {
        if entering {
            self.note_waiting(owner);
        }
        if let Some(w) = self.waiting.get_mut(&waiting_key(owner)) {
            w.present = if entering {
                w.present + 1
            } else {
                w.present.saturating_sub(1)
            };
        }
    }
}

/// How long a pod told "try again later" counts as waiting: the kubelet
/// retries a failed sandbox within about 15 s, so one not back by then
/// has gone.
pub const WAITING_TTL: Duration = Duration::from_secs(60);

pub(crate) fn waiting_key(owner: &EniOwner) -> (String, String, String) {
    let (n, c, i) = owner.key();
    (n.to_string(), c.to_string(), i.to_string())
}

/// An ADD waiting in line for an ENI, until dropped (also when the client
/// hangs up and the wait is cancelled).
struct InLine<'a> {
    inner: &'a Inner,
    owner: &'a EniOwner,
}

impl<'a> InLine<'a> {
    fn enter(inner: &'a Inner, owner: &'a EniOwner) -> Self {
        inner.state().set_present(owner, true);
        InLine { inner, owner }
    }
}

impl Drop for InLine<'_> {
    fn drop(&mut self) {
        self.inner.state().set_present(self.owner, false);
    }
}

impl Inner {
    /// Whether one more ENI can still come: this role creates them, the
    /// cloud answers, and the instance has room for it (the primary
    /// interface counts toward the limit).
    fn can_grow(&self, st: &State) -> bool {
        self.role == PoolRole::PodEnis
            && st.cloud_down.is_none()
            && st
                .eni_limit
                .is_some_and(|limit| st.members.len() + 1 < limit)
    }
}

/// Waits, up to `allocate_wait`, until an ENI is free for `owner` (its
/// turn in line) or none can come any more; see
/// [`EniProvider::wait_for_free`](enim_provider::EniProvider::wait_for_free).
pub(crate) async fn wait_for_free(inner: &Inner, owner: &EniOwner) {
    let wait = inner.config.allocate_wait;
    if wait.is_zero() {
        return;
    }
    let deadline = tokio::time::Instant::now() + wait;
    let _in_line = InLine::enter(inner, owner);
    let mut waited = false;
    loop {
        // Every change of the members publishes, and wakes the waiters;
        // registered before the look, so none is missed.
        let changed = inner.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        {
            let mut st = inner.state();
            // In line, as a pod told to try again is: demand beyond
            // `pre_allocate`, served first come, first served, so one ENI
            // landing does not send every waiting pod to race for it.
            st.note_waiting(owner);
            let holds = st.members.iter().any(|m| m.held_by(owner));
            let served = holds || st.free_count() > st.ahead_of(owner);
            if served || !inner.can_grow(&st) {
                if waited {
                    tracing::debug!(pod = ?owner.key(), served, "done waiting for an ENI");
                }
                return;
            }
        }
        if !waited {
            // Once: from now on the loop counts this pod as demand, and
            // every change it makes comes back here.
            inner.wake.notify_one();
            waited = true;
        }
        if tokio::time::timeout_at(deadline, changed).await.is_err() {
            // The deadline passed.
            return;
        }
    }
}
