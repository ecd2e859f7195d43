//! The one retry policy of every provider: exponential backoff with jitter.
//!
//! Nodes of a fleet fail together (a throttled cloud API, a metadata
//! service restarting), so a delay that is the same on every node brings
//! them all back at the same instant. Every delay drawn here is jittered
//! unless a caller asks for [`Jitter::None`].
//!
//! - [`Backoff`]: the policy (initial step, cap, multiplier, jitter);
//! - [`Delays`]: its delays one after another, with a reset after success;
//! - [`retry`]: a bounded retry of one operation on transient errors;
//! - [`RetryPolicy`]: such a retry as a cloud API client configures it;
//! - [`Poll`]: polling toward a deadline, the last wait cut at the deadline.

use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// How much of a step is random.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Jitter {
    /// The step itself: only where callers cannot act in lockstep.
    None,
    /// Uniform in `[0, step]`: the widest spread.
    Full,
    /// Uniform in `[step / 2, step]`: spread, yet never much shorter than
    /// the step, so a throttled API still gets its pause.
    #[default]
    Equal,
}

impl Jitter {
    /// A delay drawn for `step`; never longer than `step`.
    pub fn apply(self, step: Duration) -> Duration {
        match self {
            Jitter::None => step,
            Jitter::Full => uniform_up_to(step),
            Jitter::Equal => {
                let half = step / 2;
                half + uniform_up_to(step - half)
            }
        }
    }
}

/// Uniform in `[0, d]`, drawn in whole nanoseconds (no float rounding can
/// push it past `d`).
fn uniform_up_to(d: Duration) -> Duration {
    // u64 nanoseconds reach 584 years; a longer step is no real wait, and
    // saturating keeps the draw within `[0, d]`.
    let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    Duration::from_nanos(fastrand::u64(0..=nanos))
}

/// Exponential backoff: step `n` (0-based) is `initial * multiplier^n`,
/// capped at `max`, then jittered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub initial: Duration,
    pub max: Duration,
    /// Growth per step; 1 polls at a steady `initial`, 0 counts as 1.
    pub multiplier: u32,
    pub jitter: Jitter,
}

impl Backoff {
    /// Doubling from `initial` to `max`, with [`Jitter::Equal`].
    pub const fn new(initial: Duration, max: Duration) -> Self {
        Backoff {
            initial,
            max,
            multiplier: 2,
            jitter: Jitter::Equal,
        }
    }

    /// A steady `interval` between polls, jittered.
    pub const fn steady(interval: Duration) -> Self {
        Backoff::new(interval, interval).with_multiplier(1)
    }

    pub const fn with_multiplier(mut self, multiplier: u32) -> Self {
        self.multiplier = multiplier;
        self
    }

    pub const fn with_jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    /// Step `n` (0-based) before jitter.
    pub fn step(&self, n: u32) -> Duration {
        // An overflowing factor only means the cap is reached.
        let factor = self.multiplier.max(1).checked_pow(n).unwrap_or(u32::MAX);
        self.initial.saturating_mul(factor).min(self.max)
    }

    /// The delay after failure `n` (0-based): step `n`, jittered.
    pub fn delay(&self, n: u32) -> Duration {
        self.jitter.apply(self.step(n))
    }

    /// The delays of this policy, one per failure.
    pub fn delays(&self) -> Delays {
        Delays {
            policy: *self,
            failures: 0,
        }
    }
}

/// The delays of a [`Backoff`] in turn, back at the first after
/// [`Delays::reset`]. Never ends.
#[derive(Debug, Clone)]
pub struct Delays {
    policy: Backoff,
    failures: u32,
}

impl Delays {
    pub fn next_delay(&mut self) -> Duration {
        let d = self.policy.delay(self.failures);
        self.failures = self.failures.saturating_add(1);
        d
    }

    /// After a success: the next failure starts at the first step again.
    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

impl Iterator for Delays {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        Some(self.next_delay())
    }
}

/// Runs `op` up to `attempts` times (at least once), waiting the policy's
/// delays between tries for as long as `is_transient` says the error may
/// pass. `op` gets the attempt number, 1-based. Returns the first success,
/// or the error that ended the tries.
pub async fn retry<T, E, Fut>(
    policy: &Backoff,
    attempts: u32,
    is_transient: impl Fn(&E) -> bool,
    mut op: impl FnMut(u32) -> Fut,
) -> Result<T, E>
where
    Fut: Future<Output = Result<T, E>>,
    E: Display,
{
    let mut delays = policy.delays();
    let mut attempt = 1;
    loop {
        match op(attempt).await {
            Ok(v) => return Ok(v),
            Err(e) if attempt < attempts && is_transient(&e) => {
                let delay = delays.next_delay();
                tracing::debug!(attempt, ?delay, error = %e, "transient failure; retrying");
                tokio::time::sleep(delay).await;
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// The retry of a cloud API client's calls (EC2, BCE): `attempts` in all,
/// the waits between them `initial` doubling to `max`, each drawn from the
/// upper half of its step ([`Jitter::Equal`]), so that many nodes throttled
/// together do not retry in lockstep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included.
    pub attempts: u32,
    pub initial: Duration,
    pub max: Duration,
}

impl Default for RetryPolicy {
    /// 5 attempts, 200 ms doubling to 10 s.
    fn default() -> Self {
        RetryPolicy {
            attempts: 5,
            initial: Duration::from_millis(200),
            max: Duration::from_secs(10),
        }
    }
}

impl RetryPolicy {
    pub fn backoff(&self) -> Backoff {
        Backoff::new(self.initial, self.max)
    }

    /// Runs `op` under this policy: [`retry`] with its backoff and attempts.
    pub async fn run<T, E, Fut>(
        &self,
        is_transient: impl Fn(&E) -> bool,
        op: impl FnMut(u32) -> Fut,
    ) -> Result<T, E>
    where
        Fut: Future<Output = Result<T, E>>,
        E: Display,
    {
        retry(&self.backoff(), self.attempts, is_transient, op).await
    }
}

/// Polling toward a deadline: the policy's delays between polls, the last
/// one cut short so that one poll lands on the deadline itself.
#[derive(Debug, Clone)]
pub struct Poll {
    delays: Delays,
    start: Instant,
    deadline: Instant,
}

impl Poll {
    /// Polls for up to `limit` from now.
    pub fn within(policy: &Backoff, limit: Duration) -> Self {
        let start = Instant::now();
        Poll::until(policy, start + limit)
    }

    /// Polls until `deadline` (shared by several steps of one operation).
    pub fn until(policy: &Backoff, deadline: Instant) -> Self {
        Poll {
            delays: policy.delays(),
            start: Instant::now(),
            deadline,
        }
    }

    /// Since this poll began.
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// Waits before the next poll. `false`, at once, when the deadline has
    /// passed: time to give up.
    pub async fn wait(&mut self) -> bool {
        let now = Instant::now();
        if now >= self.deadline {
            return false;
        }
        let delay = self.delays.next_delay().min(self.deadline - now);
        tokio::time::sleep(delay).await;
        true
    }
}

/// How a background loop's wait between two rounds ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pause {
    /// Its `stop` signal changed: the loop ends.
    Stopped,
    /// The delay passed, or someone woke it.
    Go,
    /// The resync interval passed: the next round also checks the cloud
    /// for drift. (A wake at the same instant is kept for the next pause,
    /// which then ends at once.)
    Resync,
}

/// The wait between two rounds of a warm pool's loop. After a failed round
/// (`retry_in`) the backoff, deaf to wake-ups so callers hitting an empty
/// pool cannot hammer a throttling cloud; after a good round, up to the
/// jittered `resync` interval or until `wake`.
///
/// When several are ready at once, the first listed wins (`biased`): a
/// stop ends the loop before another round, and the resync timer goes
/// before a wake-up, whose permit `Notify` keeps for the next pause, so
/// neither the drift check nor the wake is lost. An unbiased `select!`
/// picks at random, with a generator no seed reaches, and the bench's
/// fleet simulation then differed run to run for one seed.
pub async fn pause(
    retry_in: Option<Duration>,
    resync: Duration,
    wake: &tokio::sync::Notify,
    stop: &mut tokio::sync::watch::Receiver<bool>,
) -> Pause {
    match retry_in {
        Some(delay) => tokio::select! {
            biased;
            _ = stop.changed() => Pause::Stopped,
            _ = tokio::time::sleep(delay) => Pause::Go,
        },
        None => tokio::select! {
            biased;
            _ = stop.changed() => Pause::Stopped,
            _ = tokio::time::sleep(Jitter::Equal.apply(resync)) => Pause::Resync,
            _ = wake.notified() => Pause::Go,
        },
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn steps_grow_by_the_multiplier_and_cap() {
        let b = Backoff::new(100 * MS, 1000 * MS);
        let steps: Vec<_> = (0..6).map(|n| b.step(n)).collect();
        assert_eq!(steps, [100, 200, 400, 800, 1000, 1000].map(|m| m * MS));
        let b3 = b.with_multiplier(3);
        assert_eq!(b3.step(2), 900 * MS);
        // Steady polling, and 0 read as 1.
        assert!((0..5).all(|n| Backoff::steady(50 * MS).step(n) == 50 * MS));
        assert_eq!(b.with_multiplier(0).step(7), 100 * MS);
        // Far past any overflow: still the cap.
        assert_eq!(b.step(u32::MAX), 1000 * MS);
        let huge = Backoff::new(Duration::MAX, Duration::MAX);
        assert_eq!(huge.step(3), Duration::MAX);
    }

    #[test]
    fn jitter_stays_in_range_and_varies() {
        let step = 800 * MS;
        for _ in 0..1000 {
            let e = Jitter::Equal.apply(step);
            assert!((400 * MS..=step).contains(&e), "{e:?}");
            let f = Jitter::Full.apply(step);
            assert!(f <= step, "{f:?}");
        }
        assert_eq!(Jitter::None.apply(step), step);
        // A fleet's delays spread out: 50 draws are not all alike.
        for j in [Jitter::Equal, Jitter::Full] {
            let draws: std::collections::HashSet<_> = (0..50).map(|_| j.apply(step)).collect();
            assert!(draws.len() > 40, "{j:?}: {}", draws.len());
        }
        // Odd nanoseconds and the extremes.
        assert!(Jitter::Equal.apply(Duration::from_nanos(3)) >= Duration::from_nanos(1));
        assert_eq!(Jitter::Equal.apply(Duration::ZERO), Duration::ZERO);
        assert!(Jitter::Full.apply(Duration::MAX) <= Duration::MAX);
    }

    #[test]
    fn delays_follow_the_steps_and_reset() {
        let b = Backoff::new(MS, 5 * MS);
        let mut d = b.with_jitter(Jitter::None).delays();
        let first: Vec<_> = d.by_ref().take(5).collect();
        assert_eq!(first, [1, 2, 4, 5, 5].map(|m| m * MS));
        d.reset();
        assert_eq!(d.next_delay(), MS);

        // Jittered: each delay within its own step's upper half.
        for _ in 0..100 {
            let mut d = b.delays();
            for n in 0..6 {
                let delay = d.next_delay();
                let step = b.step(n);
                assert!(delay >= step / 2 && delay <= step, "{n}: {delay:?}");
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn retry_stops_at_success_permanent_errors_and_the_limit() {
        let b = Backoff::new(100 * MS, 400 * MS);
        let calls = AtomicU32::new(0);
        // Fails twice, then succeeds; the waits are the jittered steps.
        let t0 = Instant::now();
        let r: Result<u32, String> = retry(
            &b,
            5,
            |_| true,
            |n| {
                calls.fetch_add(1, Ordering::Relaxed);
                async move {
                    if n < 3 {
                        Err(format!("try {n}"))
                    } else {
                        Ok(n)
                    }
                }
            },
        )
        .await;
        assert_eq!(r, Ok(3));
        let waited = t0.elapsed();
        assert!((150 * MS..=300 * MS).contains(&waited), "{waited:?}");

        // A permanent error: one call, no wait.
        calls.store(0, Ordering::Relaxed);
        let t0 = Instant::now();
        let r: Result<(), &str> = retry(
            &b,
            5,
            |e| *e != "permanent",
            |_| {
                calls.fetch_add(1, Ordering::Relaxed);
                async { Err("permanent") }
            },
        )
        .await;
        assert_eq!((r, calls.load(Ordering::Relaxed)), (Err("permanent"), 1));
        assert_eq!(t0.elapsed(), Duration::ZERO);

        // Always transient: exactly `attempts` calls, the last error back,
        // and the waits capped at 400 ms.
        calls.store(0, Ordering::Relaxed);
        let t0 = Instant::now();
        let r: Result<(), u32> = retry(
            &b,
            6,
            |_| true,
            |n| {
                calls.fetch_add(1, Ordering::Relaxed);
                async move { Err(n) }
            },
        )
        .await;
        assert_eq!((r, calls.load(Ordering::Relaxed)), (Err(6), 6));
        // Steps 100, 200, 400, 400, 400: between half and all of 1.5 s.
        let waited = t0.elapsed();
        assert!((750 * MS..=1500 * MS).contains(&waited), "{waited:?}");

        // Zero attempts still makes one.
        let r: Result<(), u32> = retry(&b, 0, |_| true, |n| async move { Err(n) }).await;
        assert_eq!(r, Err(1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_retry_policy_is_the_doubling_backoff_with_its_attempts() {
        let p = RetryPolicy {
            attempts: 3,
            initial: 100 * MS,
            max: 150 * MS,
        };
        assert_eq!(p.backoff(), Backoff::new(100 * MS, 150 * MS));
        assert_eq!(p.backoff().jitter, Jitter::Equal);
        let t0 = Instant::now();
        let r: Result<(), u32> = p.run(|_| true, |n| async move { Err(n) }).await;
        assert_eq!(r, Err(3));
        // Steps 100 and 150, each from its upper half.
        let waited = t0.elapsed();
        assert!((125 * MS..=250 * MS).contains(&waited), "{waited:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_pause_with_several_ready_ends_the_same_way_every_time() {
        let wake = tokio::sync::Notify::new();
        let (tx, mut stop) = tokio::sync::watch::channel(false);
        let hour = Duration::from_secs(3600);
        // Many tries: an unbiased select would pick at random.
        for _ in 0..50 {
            // The resync timer and a wake at once: the resync, and the
            // wake is kept for the next pause (which ends at once).
            wake.notify_one();
            assert_eq!(
                pause(None, Duration::ZERO, &wake, &mut stop).await,
                Pause::Resync
            );
            let t0 = Instant::now();
            assert_eq!(pause(None, hour, &wake, &mut stop).await, Pause::Go);
            assert_eq!(t0.elapsed(), Duration::ZERO);
        }
        // A stop goes before anything else ready.
        tx.send_replace(true);
        for _ in 0..50 {
            wake.notify_one();
            let mut s = stop.clone();
            assert_eq!(
                pause(None, Duration::ZERO, &wake, &mut s).await,
                Pause::Stopped
            );
            let mut s = stop.clone();
            let retry = Some(Duration::ZERO);
            assert_eq!(pause(retry, hour, &wake, &mut s).await, Pause::Stopped);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn poll_lands_on_the_deadline_then_gives_up() {
        let b = Backoff::new(100 * MS, 1000 * MS).with_jitter(Jitter::None);
        let t0 = Instant::now();
        let mut p = Poll::within(&b, 250 * MS);
        let mut polls = vec![];
        while p.wait().await {
            polls.push(t0.elapsed());
        }
        // 100, then 200 cut to the deadline at 250.
        assert_eq!(polls, [100 * MS, 250 * MS]);
        assert_eq!(p.elapsed(), 250 * MS);
        assert!(!p.wait().await, "gave up once, gives up again");

        // Jittered polls stay within their steps and the deadline.
        let t0 = Instant::now();
        let mut p = Poll::until(&Backoff::steady(100 * MS), t0 + 1000 * MS);
        let mut last = t0;
        let mut n = 0;
        while p.wait().await {
            let gap = last.elapsed();
            assert!(gap <= 100 * MS, "{gap:?}");
            last = Instant::now();
            n += 1;
        }
        assert_eq!(last - t0, 1000 * MS);
        assert!((10..=20).contains(&n), "{n} polls");
    }
}
