//! The spam filter: a token bucket per object an event is about, as the
//! kubelet's event recorder keeps one per source and object (burst 25, one
//! token back every 5 minutes). A sink is one source, so the key here is
//! the object. A storm of failures about one object posts its burst and
//! then one event every 5 minutes; other objects keep their own buckets.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

/// The kubelet's bucket: 25 at once, then one every 5 minutes.
pub const DEFAULT_BURST: u32 = 25;
pub const DEFAULT_REFILL: Duration = Duration::from_secs(5 * 60);
/// Objects remembered at most (the kubelet's LRU holds 4096).
pub const DEFAULT_MAX_OBJECTS: usize = 4096;

/// The filter's bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpamLimits {
    /// Events posted at once about one object after a quiet spell.
    pub burst: u32,
    /// One more event may be posted about the object after each of these.
    pub refill: Duration,
    /// Buckets kept; past it, full buckets go first, then the least
    /// recently used.
    pub max_objects: usize,
}

impl Default for SpamLimits {
    fn default() -> Self {
        SpamLimits {
            burst: DEFAULT_BURST,
            refill: DEFAULT_REFILL,
            max_objects: DEFAULT_MAX_OBJECTS,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: u32,
    /// When the last token was added back (or the bucket made).
    refilled_at: Instant,
    used_at: Instant,
}

/// Per-object token buckets.
#[derive(Debug)]
pub struct SpamFilter {
    limits: SpamLimits,
    buckets: HashMap<String, Bucket>,
}

impl SpamFilter {
    pub fn new(limits: SpamLimits) -> SpamFilter {
        SpamFilter {
            limits,
            buckets: HashMap::new(),
        }
    }

    /// Whether one more event about `object` may be posted at `now`; takes
    /// its token if so.
    pub fn allow(&mut self, object: &str, now: Instant) -> bool {
        let limits = self.limits;
        if !self.buckets.contains_key(object) && self.buckets.len() >= limits.max_objects {
            self.evict(now);
        }
        let bucket = self.buckets.entry(object.to_string()).or_insert(Bucket {
            tokens: limits.burst,
            refilled_at: now,
            used_at: now,
        });
        refill(bucket, limits, now);
        bucket.used_at = now;
        if bucket.tokens == 0 {
            return false;
        }
        bucket.tokens -= 1;
        true
    }

    /// Objects with a bucket now.
    pub fn tracked(&self) -> usize {
        self.buckets.len()
    }

    /// Makes room for one bucket: those full again are forgotten (a new
    /// bucket would be the same), else the least recently used.
    fn evict(&mut self, now: Instant) {
        let limits = self.limits;
        self.buckets.retain(|_, b| {
            refill(b, limits, now);
            b.tokens < limits.burst
        });
        if self.buckets.len() < limits.max_objects {
            return;
        }
        let oldest = self
            .buckets
            .iter()
            .min_by_key(|(_, b)| b.used_at)
            .map(|(k, _)| k.clone());
        if let Some(k) = oldest {
            self.buckets.remove(&k);
        }
    }
}

/// Adds back the tokens earned since the bucket's last refill.
fn refill(bucket: &mut Bucket, limits: SpamLimits, now: Instant) {
    if limits.refill.is_zero() {
        bucket.tokens = limits.burst;
        return;
    }
    let elapsed = now.saturating_duration_since(bucket.refilled_at);
    let earned = elapsed.as_nanos() / limits.refill.as_nanos();
    if earned == 0 {
        return;
    }
    let earned = u32::try_from(earned).unwrap_or(u32::MAX);
    bucket.tokens = bucket.tokens.saturating_add(earned).min(limits.burst);
    // Whole refill periods only: the part of one not yet earned stays.
    bucket.refilled_at += limits.refill * earned;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(burst: u32, refill_secs: u64, max_objects: usize) -> SpamLimits {
        SpamLimits {
            burst,
            refill: Duration::from_secs(refill_secs),
            max_objects,
        }
    }

    fn allowed(f: &mut SpamFilter, object: &str, n: usize, now: Instant) -> usize {
        (0..n).filter(|_| f.allow(object, now)).count()
    }

    #[test]
    fn a_storm_about_one_object_posts_its_burst_then_one_a_refill() {
        let mut f = SpamFilter::new(SpamLimits::default());
        let t0 = Instant::now();
        assert_eq!(allowed(&mut f, "pod/a", 1000, t0), 25);
        // Just short of a refill period: still nothing.
        let almost = t0 + DEFAULT_REFILL - Duration::from_millis(1);
        assert_eq!(allowed(&mut f, "pod/a", 10, almost), 0);
        assert_eq!(allowed(&mut f, "pod/a", 10, t0 + DEFAULT_REFILL), 1);
        // Two more periods: two more, not a burst.
        assert_eq!(allowed(&mut f, "pod/a", 10, t0 + DEFAULT_REFILL * 3), 2);
    }

    #[test]
    fn the_part_of_a_period_not_yet_earned_is_kept() {
        let mut f = SpamFilter::new(limits(1, 10, 8));
        let t0 = Instant::now();
        assert!(f.allow("x", t0));
        // 6 s: nothing; 12 s: one (earned at 10 s); 20 s: the next one,
        // because the 2 s past 10 s were kept.
        assert!(!f.allow("x", t0 + Duration::from_secs(6)));
        assert!(f.allow("x", t0 + Duration::from_secs(12)));
        assert!(!f.allow("x", t0 + Duration::from_secs(19)));
        assert!(f.allow("x", t0 + Duration::from_secs(20)));
    }

    #[test]
    fn a_long_quiet_spell_refills_to_the_burst_and_no_further() {
        let mut f = SpamFilter::new(limits(3, 1, 8));
        let t0 = Instant::now();
        assert_eq!(allowed(&mut f, "x", 3, t0), 3);
        assert_eq!(allowed(&mut f, "x", 10, t0 + Duration::from_secs(3600)), 3);
    }

    #[test]
    fn each_object_has_its_own_bucket() {
        let mut f = SpamFilter::new(limits(2, 300, 8));
        let t0 = Instant::now();
        assert_eq!(allowed(&mut f, "pod/a", 5, t0), 2);
        assert_eq!(allowed(&mut f, "pod/b", 5, t0), 2);
        assert_eq!(allowed(&mut f, "node/a", 5, t0), 2);
        assert_eq!(f.tracked(), 3);
    }

    #[test]
    fn the_filter_stays_bounded_forgetting_full_buckets_first() {
        let mut f = SpamFilter::new(limits(2, 300, 2));
        let t0 = Instant::now();
        // "busy" is emptied; "quiet" used once, then refills to full.
        assert_eq!(allowed(&mut f, "busy", 5, t0), 2);
        assert!(f.allow("quiet", t0));
        let later = t0 + Duration::from_secs(300);
        // A third object: "quiet" is full again by now and goes, "busy"
        // (one token back only) keeps its bucket.
        assert!(f.allow("third", later));
        assert_eq!(f.tracked(), 2);
        assert_eq!(allowed(&mut f, "busy", 5, later), 1);
    }

    #[test]
    fn with_no_full_bucket_the_least_recently_used_goes() {
        let mut f = SpamFilter::new(limits(1, 300, 2));
        let t0 = Instant::now();
        assert!(f.allow("old", t0));
        assert!(f.allow("recent", t0 + Duration::from_secs(1)));
        assert!(f.allow("new", t0 + Duration::from_secs(2)));
        assert_eq!(f.tracked(), 2);
        // "recent" kept its empty bucket; "old" was forgotten (a new,
        // full one takes its first event).
        assert!(!f.allow("recent", t0 + Duration::from_secs(3)));
        assert!(f.allow("old", t0 + Duration::from_secs(4)));
    }
}
