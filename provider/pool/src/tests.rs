use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use enim_core::testing::{read_with_deprecations, read_without_warnings, warnings_of};
use enim_core::{AddressCount, Eni, EniOwner, ProviderError, Watermarks};
use enim_provider::testing::{allocate_concurrently, listed_ids, owner};
use enim_provider::EniProvider;
use tokio::time::Instant;

use super::*;

// By topic; the helpers below serve them all.
mod fake;
mod reaper;
mod restart;
mod rounds;
mod serving;
mod waiting;
use fake::{FakeCloud, WAIT_LIMIT};

/// A pool that keeps `min_free` to `max_free` ENIs free.
fn config(min_free: usize, max_free: usize) -> PoolConfig {
    let count = |n: usize| u32::try_from(n).unwrap();
    let w = Watermarks::from_free_range(count(min_free), count(max_free)).unwrap();
    PoolConfig {
        pre_allocate: w.pre_allocate,
        max_above_watermark: w.max_above_watermark,
        ..PoolConfig::default()
    }
}

async fn start(cloud: &Arc<FakeCloud>, config: PoolConfig) -> Arc<WarmPool> {
    WarmPool::start(cloud.clone(), config).await.unwrap()
}

/// A pool started on `cloud` and restored with nothing held, so it may
/// detach surplus ENIs.
async fn restored(cloud: &Arc<FakeCloud>, config: PoolConfig) -> Arc<WarmPool> {
    let pool = start(cloud, config).await;
    pool.restore(&[]).await.unwrap();
    pool
}

/// A cloud that takes `limit` ENIs and a pool started on it, once the
/// pool's first fill has reached `pre_allocate`.
async fn filled(limit: usize, config: PoolConfig) -> (Arc<FakeCloud>, Arc<WarmPool>) {
    let cloud = FakeCloud::new(limit);
    let min_free = usize::try_from(config.pre_allocate).unwrap();
    let pool = start(&cloud, config).await;
    wait_stats(&pool, |s| s.available == min_free).await;
    (cloud, pool)
}

async fn wait_stats(pool: &WarmPool, pred: impl Fn(&PoolStats) -> bool) -> PoolStats {
    let mut rx = pool.subscribe();
    let stats = tokio::time::timeout(WAIT_LIMIT, rx.wait_for(|s| pred(s)))
        .await
        .unwrap_or_else(|_| panic!("pool stuck at {:?}", pool.stats()))
        .unwrap();
    *stats
}

/// Owners `a` and `b` get an ENI each, two different ones; `c` is then
/// turned away: all `total` ENIs are in use.
async fn two_then_exhausted(pool: &WarmPool, total: usize) -> (Eni, Eni) {
    let a = pool.allocate_next(&owner("a")).await.unwrap();
    let b = pool.allocate_next(&owner("b")).await.unwrap();
    assert_ne!(a.id, b.id);
    assert_eq!(
        pool.allocate_next(&owner("c")).await.unwrap_err(),
        ProviderError::Exhausted { total }
    );
    (a, b)
}

/// Allocates, waiting for the filler when the pool is momentarily empty.
async fn allocate_waiting(pool: &WarmPool, o: &EniOwner) -> Eni {
    loop {
        match pool.allocate_next(o).await {
            Ok(e) => return e,
            Err(ProviderError::Exhausted { .. }) => {
                wait_stats(pool, |s| s.available > 0).await;
            }
            Err(e) => panic!("{e}"),
        }
    }
}

#[test]
fn the_mode_decides_what_the_pool_is_for() {
    assert_eq!(PoolRole::from(enim_core::Mode::Primary), PoolRole::PodEnis);
    assert_eq!(
        PoolRole::from(enim_core::Mode::Secondary),
        PoolRole::HostEnis
    );
}

#[test]
fn config_defaults_parse_and_validation() {
    let d = PoolConfig::default();
    assert_eq!((d.pre_allocate, d.watermarks().high()), (1, 3));
    assert_eq!(d.initial_retry, Duration::from_secs(1));
    assert_eq!(d.max_backoff, Duration::from_secs(60));
    assert_eq!(d.resync_interval, Duration::from_secs(30));
    d.validate().unwrap();

    let c: PoolConfig =
        serde_json::from_str(r#"{"min_free": 2, "max_backoff": "2m", "resync_interval": "500ms"}"#)
            .unwrap();
    assert_eq!(c.pre_allocate, 2);
    assert_eq!(c.watermarks().high(), 3);
    assert_eq!(c.max_backoff, Duration::from_secs(120));
    assert_eq!(c.resync_interval, Duration::from_millis(500));
    assert!(serde_json::from_str::<PoolConfig>(r#"{"min_fre": 2}"#).is_err());

    // max_free below min_free: the old keys' one bad pair, refused as the
    // file is read (the watermarks have no such pair).
    assert!(serde_json::from_str::<PoolConfig>(r#"{"min_free": 4, "max_free": 3}"#).is_err());

    let bad = [
        PoolConfig {
            initial_retry: Duration::ZERO,
            ..config(1, 3)
        },
        PoolConfig {
            max_backoff: Duration::from_millis(500),
            ..config(1, 3)
        },
        PoolConfig {
            resync_interval: Duration::ZERO,
            ..config(1, 3)
        },
    ];
    for c in bad {
        assert!(
            matches!(c.validate(), Err(ProviderError::Config(_))),
            "{c:?} accepted"
        );
    }
}

/// The keys of the free range before the watermarks: each still read,
/// with a warning that names its new key, meaning what it meant.
#[test]
fn old_free_range_keys_are_read_with_a_deprecation_warning() {
    let read = |text: &str| serde_json::from_str::<PoolConfig>(text).map_err(|e| e.to_string());
    let (c, logged) = warnings_of(|| read(r#"{"min_free": 2, "max_free": 4}"#));
    let c = c.unwrap();
    assert_eq!((c.pre_allocate, c.max_above_watermark), (2, 2));
    assert_eq!(logged.len(), 2, "{logged:#?}");
    assert!(
        logged[0].contains(
            "[provider.pool] min_free is deprecated: it is read as pre_allocate; \
             write pre_allocate instead"
        ),
        "{logged:#?}"
    );
    assert!(
        logged[1].contains(
            "[provider.pool] max_free is deprecated: it is read as max_above_watermark = \
             max_free - pre_allocate; write max_above_watermark instead"
        ),
        "{logged:#?}"
    );

    // What the old keys leave out takes the old defaults (1 and 3).
    let c = read_with_deprecations("provider.pool", &FREE_RANGE_MOVES[..1], || {
        read(r#"{"min_free": 2}"#)
    });
    assert_eq!((c.pre_allocate, c.watermarks().high()), (2, 3));
    let (c, logged) = warnings_of(|| read(r#"{"max_free": 5}"#));
    assert_eq!(logged.len(), 1, "{logged:#?}");
    assert_eq!(
        c.unwrap().watermarks(),
        Watermarks::from_free_range(1, 5).unwrap()
    );
    // An old key beside the new key of the other watermark.
    let (c, _) = warnings_of(|| read(r#"{"pre_allocate": 2, "max_free": 5}"#));
    assert_eq!(c.unwrap().max_above_watermark, 3);
    let (c, _) = warnings_of(|| read(r#"{"min_free": 2, "max_above_watermark": 7}"#));
    assert_eq!(c.unwrap().watermarks().high(), 9);

    // The new keys alone: no warning; written back, the new keys.
    let c = read_without_warnings(|| read(r#"{"pre_allocate": 2, "max_above_watermark": 1}"#));
    let written = serde_json::to_string(&c).unwrap();
    assert!(
        written.contains(r#""pre_allocate":2"#) && !written.contains("min_free"),
        "{written}"
    );
    assert_eq!(read(&written).unwrap(), c);
}

#[test]
fn old_and_new_free_range_keys_together_are_refused() {
    let read = |text: &str| {
        serde_json::from_str::<PoolConfig>(text)
            .unwrap_err()
            .to_string()
    };
    let e = read(r#"{"min_free": 2, "pre_allocate": 2}"#);
    assert!(e.contains("keep only pre_allocate"), "{e}");
    let e = read(r#"{"max_free": 4, "max_above_watermark": 1}"#);
    assert!(e.contains("keep only max_above_watermark"), "{e}");
    // A bound below the free ones to keep, given or by the old default.
    let e = read(r#"{"min_free": 5}"#);
    assert!(e.contains("max_free (3) must be >= min_free (5)"), "{e}");
    let e = read(r#"{"min_free": 4, "max_free": 3}"#);
    assert!(e.contains("max_free (3) must be >= min_free (4)"), "{e}");
    let e = read(r#"{"min_free": -1}"#);
    assert!(e.contains("min_free"), "{e}");
}

#[test]
fn retry_backoff_follows_the_config() {
    let cfg = PoolConfig {
        initial_retry: Duration::from_secs(1),
        max_backoff: Duration::from_secs(5),
        ..config(1, 3)
    };
    let b = cfg.retry_backoff();
    let steps: Vec<u64> = (0..5).map(|n| b.step(n).as_secs()).collect();
    assert_eq!(steps, [1, 2, 4, 5, 5]);
    assert_eq!(b.jitter, enim_core::retry::Jitter::Equal);
}

/// Each gap is its step, jittered: within the step's upper half. With
/// doubling steps those ranges only touch, so the check still tells every
/// step (and a reset to the first) apart.
fn assert_jittered(gaps: &[Duration], steps_secs: &[u64]) {
    assert_eq!(gaps.len(), steps_secs.len(), "{gaps:?}");
    for (gap, &step) in gaps.iter().zip(steps_secs) {
        let step = Duration::from_secs(step);
        assert!(
            *gap >= step / 2 && *gap <= step,
            "gap {gap:?} outside the jitter range of step {step:?}: {gaps:?}"
        );
    }
}

#[tokio::test]
async fn invalid_config_fails_start() {
    let cloud = FakeCloud::new(8);
    // (A max_free below min_free, once the example here, is refused as
    // the file is read now: the watermarks cannot hold it.)
    let invalid = PoolConfig {
        initial_retry: Duration::ZERO,
        ..config(1, 3)
    };
    assert!(matches!(
        WarmPool::start(cloud.clone(), invalid).await,
        Err(ProviderError::Config(_))
    ));
}
