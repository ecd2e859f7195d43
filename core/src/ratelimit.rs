//! Client-side token buckets, one per API class (e.g. EC2's mutating and
//! describe actions).
//!
//! A cloud throttles per account with token buckets that every caller of
//! the account shares: all the nodes of every cluster in it. One node
//! retrying or resyncing hard can empty the account's bucket for the whole
//! fleet. A [`TokenBucket`] in front of each API class keeps one agent well
//! under the account's rate: a call past the local burst waits
//! (asynchronously) for its token instead of spending the account's.
//!
//! The bucket is kept as GCRA (the generic cell rate algorithm): one
//! instant, the "theoretical arrival time", instead of a token count, so
//! the arithmetic is exact in `Duration`s and every caller reserves its
//! own slot in arrival order.

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

/// Default of both clouds' `api.mutating_rate`: one a second, four at
/// once (one ENI's create, attach and follow-up go without waiting).
pub const DEFAULT_MUTATING_RATE: RateLimit = RateLimit::new(Duration::from_secs(1), 4);
/// Default of both clouds' `api.read_rate`: two a second, ten at once.
pub const DEFAULT_READ_RATE: RateLimit = RateLimit::new(Duration::from_millis(500), 10);

/// One token every `every`, at most `burst` taken at once after a quiet
/// spell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    /// The refill interval: the steady rate is one call per `every`.
    #[serde(with = "humantime_serde")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub every: Duration,
    /// Tokens the bucket holds when full (calls that go at once).
    pub burst: u32,
}

impl RateLimit {
    pub const fn new(every: Duration, burst: u32) -> Self {
        RateLimit { every, burst }
    }

    /// Config validation: `Err` names what is wrong; the caller prefixes
    /// the key.
    pub fn validate(&self) -> Result<(), String> {
        if self.every.is_zero() {
            return Err("every must be above zero".into());
        }
        if self.burst == 0 {
            return Err("burst must be at least 1".into());
        }
        Ok(())
    }

    /// Calls per second at the steady rate (for logs).
    pub fn per_second(&self) -> f64 {
        1.0 / self.every.as_secs_f64()
    }
}

/// A token bucket shared by every caller of one API class. Cheap to wait
/// on: a waiter sleeps on tokio's timer, holding no lock and no thread.
#[derive(Debug)]
pub struct TokenBucket {
    limit: RateLimit,
    /// When the bucket would have handed out every token reserved so far
    /// at the steady rate (GCRA's theoretical arrival time); `None` while
    /// it was never used, i.e. full.
    tat: Mutex<Option<Instant>>,
}

impl TokenBucket {
    /// A full bucket. `limit` should be validated; a zero `every` or
    /// `burst` is read as 1 ns and 1.
    pub fn new(limit: RateLimit) -> Self {
        TokenBucket {
            limit: RateLimit {
                every: limit.every.max(Duration::from_nanos(1)),
                burst: limit.burst.max(1),
            },
            tat: Mutex::new(None),
        }
    }

    pub fn limit(&self) -> RateLimit {
        self.limit
    }

    fn state(&self) -> MutexGuard<'_, Option<Instant>> {
        // Only an Instant lives behind the lock: always consistent.
        self.tat.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How far ahead of `tat` a call may still go now: the tokens of a
    /// full bucket but one.
    fn tolerance(&self) -> Duration {
        self.limit.every.saturating_mul(self.limit.burst - 1)
    }

    /// Reserves the next token and says when it is due (`now` or later).
    fn reserve(&self, now: Instant) -> Instant {
        let mut tat = self.state();
        let base = tat.map_or(now, |t| t.max(now));
        *tat = Some(base + self.limit.every);
        match base.checked_sub(self.tolerance()) {
            Some(due) if due > now => due,
            _ => now,
        }
    }

    /// Takes a token now if one is there; never waits.
    pub fn try_acquire(&self) -> bool {
        let now = Instant::now();
        let mut tat = self.state();
        let base = tat.map_or(now, |t| t.max(now));
        let due_now = base.checked_sub(self.tolerance()).is_none_or(|d| d <= now);
        if due_now {
            *tat = Some(base + self.limit.every);
        }
        due_now
    }

    /// Takes a token, waiting until one is due; returns how long it
    /// waited. Callers are served in the order they arrived. A wait that
    /// is cancelled (its future dropped) gives its token back.
    pub async fn acquire(&self) -> Duration {
        let now = Instant::now();
        let due = self.reserve(now);
        if due <= now {
            return Duration::ZERO;
        }
        let mut reservation = Reservation {
            bucket: self,
            kept: false,
        };
        tokio::time::sleep_until(due).await;
        reservation.kept = true;
        due - now
    }
}

/// A token reserved for a waiting caller; handed back if the wait is
/// dropped, so cancelled calls do not slow down the ones still coming.
struct Reservation<'a> {
    bucket: &'a TokenBucket,
    kept: bool,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if self.kept {
            return;
        }
        let mut tat = self.bucket.state();
        if let Some(t) = *tat {
            *tat = t.checked_sub(self.bucket.limit.every).or(Some(t));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn bucket(every_ms: u64, burst: u32) -> Arc<TokenBucket> {
        Arc::new(TokenBucket::new(RateLimit::new(
            Duration::from_millis(every_ms),
            burst,
        )))
    }

    #[test]
    fn validation_and_parsing() {
        assert!(RateLimit::new(MS, 1).validate().is_ok());
        let e = RateLimit::new(Duration::ZERO, 1).validate().unwrap_err();
        assert!(e.contains("every"), "{e}");
        let e = RateLimit::new(MS, 0).validate().unwrap_err();
        assert!(e.contains("burst"), "{e}");
        let r: RateLimit = serde_json::from_str(r#"{"every": "250ms", "burst": 8}"#).unwrap();
        assert_eq!(r, RateLimit::new(250 * MS, 8));
        assert_eq!(r.per_second(), 4.0);
        assert!(serde_json::from_str::<RateLimit>(r#"{"every": "1s", "bursts": 2}"#).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_goes_at_once_then_one_per_interval() {
        let b = bucket(100, 3);
        let t0 = Instant::now();
        let mut at = Vec::new();
        for _ in 0..7 {
            b.acquire().await;
            at.push(t0.elapsed());
        }
        assert_eq!(at, [0, 0, 0, 100, 200, 300, 400].map(|m| m * MS));
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_bucket_refills_up_to_its_burst_only() {
        let b = bucket(100, 3);
        for _ in 0..3 {
            assert!(b.try_acquire());
        }
        assert!(!b.try_acquire(), "empty");
        // One interval: one token.
        tokio::time::advance(100 * MS).await;
        assert!(b.try_acquire());
        assert!(!b.try_acquire());
        // A long quiet spell fills it to the burst, not beyond.
        tokio::time::advance(3600 * 1000 * MS).await;
        for _ in 0..3 {
            assert!(b.try_acquire());
        }
        assert!(!b.try_acquire());
        // Half an interval is no token yet; the rest of it is.
        tokio::time::advance(50 * MS).await;
        assert!(!b.try_acquire());
        tokio::time::advance(50 * MS).await;
        assert!(b.try_acquire());
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_callers_are_spread_at_the_rate_in_arrival_order() {
        let b = bucket(50, 4);
        let t0 = Instant::now();
        let mut tasks = Vec::new();
        for i in 0..20u32 {
            let b = b.clone();
            tasks.push(tokio::spawn(async move {
                let waited = b.acquire().await;
                (i, t0.elapsed(), waited)
            }));
            // Arrival order is spawn order.
            tokio::task::yield_now().await;
        }
        for t in tasks {
            let (i, at, waited) = t.await.unwrap();
            let want = i.saturating_sub(3) * 50 * MS;
            assert_eq!((at, waited), (want, want), "caller {i}");
        }
        // 20 calls took (20 - 4) intervals: the configured rate.
        assert_eq!(t0.elapsed(), 16 * 50 * MS);
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_wait_gives_its_token_back() {
        let b = bucket(100, 1);
        assert_eq!(b.acquire().await, Duration::ZERO);
        // This one would wait 100 ms; it is given up after 10.
        let gave_up = tokio::time::timeout(10 * MS, b.acquire()).await;
        assert!(gave_up.is_err());
        // The next caller gets the slot the cancelled one had reserved,
        // not the one after it.
        let t0 = Instant::now();
        assert_eq!(b.acquire().await, 90 * MS);
        assert_eq!(t0.elapsed(), 90 * MS);
    }

    #[tokio::test(start_paused = true)]
    async fn a_steady_rate_over_a_long_run() {
        let b = bucket(7, 2);
        let t0 = Instant::now();
        for _ in 0..1002 {
            b.acquire().await;
        }
        assert_eq!(t0.elapsed(), 1000 * 7 * MS);
    }
}
