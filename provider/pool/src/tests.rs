use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use enim_core::{Eni, EniOwner, ProviderError};
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

fn config(min_free: usize, max_free: usize) -> PoolConfig {
    PoolConfig {
        min_free,
        max_free,
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
/// pool's first fill has reached `min_free`.
async fn filled(limit: usize, config: PoolConfig) -> (Arc<FakeCloud>, Arc<WarmPool>) {
    let cloud = FakeCloud::new(limit);
    let min_free = config.min_free;
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
    assert_eq!((d.min_free, d.max_free), (1, 3));
    assert_eq!(d.initial_retry, Duration::from_secs(1));
    assert_eq!(d.max_backoff, Duration::from_secs(60));
    assert_eq!(d.resync_interval, Duration::from_secs(30));
    d.validate().unwrap();

    let c: PoolConfig =
        serde_json::from_str(r#"{"min_free": 2, "max_backoff": "2m", "resync_interval": "500ms"}"#)
            .unwrap();
    assert_eq!(c.min_free, 2);
    assert_eq!(c.max_free, 3);
    assert_eq!(c.max_backoff, Duration::from_secs(120));
    assert_eq!(c.resync_interval, Duration::from_millis(500));
    assert!(serde_json::from_str::<PoolConfig>(r#"{"min_fre": 2}"#).is_err());

    let bad = [
        config(4, 3),
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
    assert!(matches!(
        WarmPool::start(cloud.clone(), config(3, 1)).await,
        Err(ProviderError::Config(_))
    ));
}
