//! [`Pacing`]: one client's adaptive pacing of its calls, per API action,
//! by the cloud's throttle replies (the idea of the AWS SDKs' "adaptive"
//! retry mode, in a simpler form).
//!
//! A cloud throttles per account and action, and every node of a fleet
//! draws from the same buckets. A node cannot see the others, only its
//! own replies: a throttle says the action's bucket is drained, a success
//! that it is not. So after a throttle the client spaces its calls of
//! that action by a gap (doubled on each further throttle, up to a cap)
//! and narrows the gap on each success, until below a floor it stops
//! pacing. Many nodes throttled together thus spread their calls out
//! instead of hammering the drained bucket, and a node alone at the end
//! is back to full speed after a few successes.
//!
//! Every node paced alike would be served alike, and the nodes that had
//! bad luck early would still need the most when the crowd has thinned
//! out and the buckets sit part idle. So the caller says how full its
//! pool is ([`Pacing::set_fill`]), and an emptier pool spaces its calls
//! by a smaller share of the gap: the nodes furthest behind are served
//! first, and the last nodes of a start-up need less.
//!
//! Invariants: an action is paced only after one of its calls was
//! throttled; its gap is then within `[floor, cap]`; two calls of one
//! action are never let through less than half a gap's share apart
//! while it is paced (each slot is drawn from `[share gap / 2,
//! 3 share gap / 2]`, so that nodes throttled together do not come back
//! together). Other actions are not slowed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use crate::retry::Jitter;

/// How a [`Pacing`] reacts to replies.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PacingPolicy {
    /// The gap after the first throttle; a gap narrowed below it ends the
    /// pacing.
    pub floor: Duration,
    /// The widest gap: how long a node may sit out at most between two
    /// calls of a drained action.
    pub cap: Duration,
    /// The gap's factor on a success, in `(0, 1)`.
    pub narrow: f64,
    /// The share of the gap an empty pool waits, in `(0, 1]`; a full one
    /// waits the whole gap, and between, in proportion.
    pub empty_share: f64,
}

/// The agent's pacing: a first gap of 0.5 s, at most 10 s, halved on each
/// success; an empty pool waits a quarter of it. Chosen by the bench's
/// fleet simulation (200 nodes starting at once on one account): a 5 s
/// cap throttled 45 % more, a 20 s cap left the attach bucket idle at the
/// end (nodes sat out the gap while it refilled), and narrowing by 3/4
/// instead of 1/2 did no better.
pub const AGENT_PACING: PacingPolicy = PacingPolicy {
    floor: Duration::from_millis(500),
    cap: Duration::from_secs(10),
    narrow: 0.5,
    empty_share: 0.25,
};

/// One action's pacing state.
#[derive(Debug, Clone, Copy)]
struct Pace {
    /// The mean gap between two calls; zero while not paced.
    gap: Duration,
    /// The earliest the next call may go.
    next: Instant,
}

/// The pacing of one client's calls (shared by its callers).
#[derive(Debug)]
pub struct Pacing {
    policy: PacingPolicy,
    by_action: Mutex<HashMap<String, Pace>>,
    /// The share of each gap a call waits ([`Pacing::set_fill`]), as
    /// `f64` bits.
    share: AtomicU64,
}

impl Pacing {
    pub fn new(policy: PacingPolicy) -> Self {
        Pacing {
            policy,
            by_action: Mutex::new(HashMap::new()),
            share: AtomicU64::new(1.0f64.to_bits()),
        }
    }

    /// How full the caller's pool is, from 0 (empty) to 1 (at its goal):
    /// from now on its calls wait that share of each gap, from the
    /// policy's `empty_share` up to the whole.
    pub fn set_fill(&self, fill: f64) {
        let low = self.policy.empty_share.clamp(f64::MIN_POSITIVE, 1.0);
        let fill = if fill.is_nan() {
            1.0
        } else {
            fill.clamp(0.0, 1.0)
        };
        let share = low + (1.0 - low) * fill;
        self.share.store(share.to_bits(), Ordering::Relaxed);
    }

    fn share(&self) -> f64 {
        f64::from_bits(self.share.load(Ordering::Relaxed))
    }

    fn state(&self) -> MutexGuard<'_, HashMap<String, Pace>> {
        // Only plain values live behind the lock: always consistent.
        self.by_action.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The gap of `action` now (zero: not paced).
    pub fn gap(&self, action: &str) -> Duration {
        self.state().get(action).map_or(Duration::ZERO, |p| p.gap)
    }

    /// Waits for `action`'s next slot and takes it; at once while the
    /// action is not paced. Each slot comes the gap's share
    /// ([`Pacing::set_fill`]) after the one before. Returns how long it
    /// waited. A wait that is dropped keeps its slot taken (the next call
    /// only goes that share of a gap later).
    pub async fn wait(&self, action: &str) -> Duration {
        let now = Instant::now();
        let due = {
            let mut st = self.state();
            let Some(pace) = st.get_mut(action).filter(|p| !p.gap.is_zero()) else {
                return Duration::ZERO;
            };
            let due = pace.next.max(now);
            let gap = pace.gap.mul_f64(self.share());
            pace.next = due + gap / 2 + Jitter::Full.apply(gap);
            due
        };
        tokio::time::sleep_until(due).await;
        due - now
    }

    /// `action` was throttled: its gap doubles (the floor at first), up to
    /// the cap.
    pub fn throttled(&self, action: &str) {
        let now = Instant::now();
        let PacingPolicy { floor, cap, .. } = self.policy;
        let mut st = self.state();
        let pace = st.entry(action.to_string()).or_insert(Pace {
            gap: Duration::ZERO,
            next: now,
        });
        pace.gap = pace.gap.saturating_mul(2).clamp(floor, cap.max(floor));
    }

    /// `action` got through: its gap narrows, and below the floor the
    /// action is no longer paced.
    pub fn answered(&self, action: &str) {
        let mut st = self.state();
        let Some(pace) = st.get_mut(action) else {
            return;
        };
        pace.gap = pace.gap.mul_f64(self.policy.narrow.clamp(0.0, 1.0));
        if pace.gap < self.policy.floor {
            pace.gap = Duration::ZERO;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn pacing() -> Pacing {
        Pacing::new(PacingPolicy {
            floor: 100 * MS,
            cap: 400 * MS,
            narrow: 0.5,
            empty_share: 0.25,
        })
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_waits_before_a_throttle() {
        let p = pacing();
        for _ in 0..10 {
            assert_eq!(p.wait("Attach").await, Duration::ZERO);
        }
        p.answered("Attach");
        assert_eq!(p.gap("Attach"), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_throttle_spaces_that_action_only() {
        let p = pacing();
        p.throttled("Attach");
        assert_eq!(p.gap("Attach"), 100 * MS);
        let t0 = Instant::now();
        let mut at = Vec::new();
        for _ in 0..5 {
            p.wait("Attach").await;
            at.push(t0.elapsed());
        }
        // The first at once, then each half a gap to 1.5 gaps later.
        assert_eq!(at[0], Duration::ZERO);
        for w in at.windows(2) {
            let gap = w[1] - w[0];
            assert!((50 * MS..=150 * MS).contains(&gap), "{at:?}");
        }
        // Another action goes at once.
        assert_eq!(p.wait("Create").await, Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn throttles_double_the_gap_to_the_cap_and_successes_end_it() {
        let p = pacing();
        let gaps: Vec<Duration> = (0..5)
            .map(|_| {
                p.throttled("Attach");
                p.gap("Attach")
            })
            .collect();
        assert_eq!(gaps, [100, 200, 400, 400, 400].map(|m| m * MS));
        p.answered("Attach");
        assert_eq!(p.gap("Attach"), 200 * MS);
        p.answered("Attach");
        assert_eq!(p.gap("Attach"), 100 * MS);
        p.answered("Attach");
        assert_eq!(p.gap("Attach"), Duration::ZERO, "below the floor: off");
        let t0 = Instant::now();
        p.wait("Attach").await;
        p.wait("Attach").await;
        assert_eq!(t0.elapsed(), Duration::ZERO);
    }

    /// Slots `p` lets through in a row, from now, after one throttle.
    async fn gaps_after_a_throttle(p: &Pacing) -> Vec<Duration> {
        p.throttled("Attach");
        let t0 = Instant::now();
        let mut at = Vec::new();
        for _ in 0..20 {
            p.wait("Attach").await;
            at.push(t0.elapsed());
        }
        at.windows(2).map(|w| w[1] - w[0]).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn an_emptier_pool_waits_a_smaller_share_of_the_gap() {
        // Gap 100 ms: a full pool's slots are 50-150 ms apart; an empty
        // one waits a quarter, 12.5-37.5 ms.
        for (fill, apart) in [(1.0, 50 * MS..=150 * MS), (0.0, 12 * MS..=38 * MS)] {
            let p = pacing();
            p.set_fill(fill);
            let gaps = gaps_after_a_throttle(&p).await;
            assert!(
                gaps.iter().all(|g| apart.contains(g)),
                "fill {fill}: {gaps:?}"
            );
            // The share spaces slots only: the gap itself is the replies'.
            assert_eq!(p.gap("Attach"), 100 * MS);
        }
        // Half full: 0.625 of the gap; out of range and NaN clamp.
        let half = pacing();
        half.set_fill(0.5);
        assert!((half.share() - 0.625).abs() < 1e-9);
        half.set_fill(-3.0);
        assert!((half.share() - 0.25).abs() < 1e-9);
        half.set_fill(f64::NAN);
        assert!((half.share() - 1.0).abs() < 1e-9);
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_callers_take_one_slot_each() {
        let p = std::sync::Arc::new(pacing());
        for _ in 0..3 {
            p.throttled("Attach");
        }
        let t0 = Instant::now();
        let tasks: Vec<_> = (0..4)
            .map(|_| {
                let p = p.clone();
                tokio::spawn(async move {
                    p.wait("Attach").await;
                    t0.elapsed()
                })
            })
            .collect();
        let mut at = Vec::new();
        for t in tasks {
            at.push(t.await.unwrap());
        }
        at.sort();
        // Gap 400 ms: slots at least 200 ms apart.
        for w in at.windows(2) {
            assert!(w[1] - w[0] >= 200 * MS, "{at:?}");
        }
    }
}
