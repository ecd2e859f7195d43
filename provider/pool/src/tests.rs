use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use enim_provider::testing::{allocate_concurrently, owner};
use enim_provider::{Eni, EniOwner, EniProvider, ProviderError};
use tokio::time::Instant;

use super::*;

mod fake;
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
    assert_eq!(b.jitter, enim_provider::retry::Jitter::Equal);
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

#[tokio::test]
async fn fills_to_min_free() {
    let cloud = FakeCloud::new(8);
    let pool = start(&cloud, config(2, 3)).await;
    let s = wait_stats(&pool, |s| s.available == 2).await;
    assert_eq!(
        s,
        PoolStats {
            used: 0,
            available: 2,
            needed: 0,
            excess: 0,
            remaining_interfaces: 5,
        }
    );
    pool.resync_now().await.unwrap();
    assert_eq!(cloud.st().creates, 2, "filled past min_free");
    assert_eq!(pool.list().await.unwrap().len(), 2);

    // Taking one wakes the loop to replace it.
    let a = pool.allocate_next(&owner("a")).await.unwrap();
    let s = wait_stats(&pool, |s| s.available == 2).await;
    assert_eq!((s.used, s.remaining_interfaces), (1, 4));
    assert_eq!(cloud.st().creates, 3);
    let listed = pool.list().await.unwrap();
    let held: Vec<_> = listed.iter().filter(|e| e.owner.is_some()).collect();
    assert_eq!(held.len(), 1);
    assert_eq!(held[0].id, a.id);
    pool.shutdown().await;
}

#[tokio::test]
async fn allocate_is_idempotent_and_release_frees() {
    let (_cloud, pool) = filled(8, config(2, 3)).await;
    let a = pool.allocate_next(&owner("a")).await.unwrap();
    let mut same = owner("a");
    same.pod.name = "other metadata".into();
    assert_eq!(pool.allocate_next(&same).await.unwrap().id, a.id);
    assert_eq!(pool.stats().used, 1);
    pool.release(&owner("b")).await.unwrap(); // holds none: fine
    assert_eq!(pool.stats().used, 1);
    pool.release(&owner("a")).await.unwrap();
    pool.release(&owner("a")).await.unwrap();
    assert_eq!(pool.stats().used, 0);
    assert!(pool.list().await.unwrap().iter().all(|e| e.owner.is_none()));
    assert_eq!(pool.name(), "fake");
    pool.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn allocate_and_release_wake_the_loop_at_once() {
    let cloud = FakeCloud::new(16);
    let cfg = PoolConfig {
        resync_interval: Duration::from_secs(3600),
        ..config(1, 1)
    };
    let pool = start(&cloud, cfg).await;
    pool.restore(&[]).await.unwrap();
    wait_stats(&pool, |s| s.available == 1).await;
    // Let the loop settle into its long wait, with no wake-up pending.
    tokio::time::sleep(Duration::from_secs(1)).await;

    let t0 = Instant::now();
    pool.allocate_next(&owner("a")).await.unwrap();
    wait_stats(&pool, |s| s.available == 1 && s.used == 1).await;
    assert_eq!(cloud.st().create_times.last(), Some(&t0), "refill waited");
    tokio::time::sleep(Duration::from_secs(1)).await;

    let t1 = Instant::now();
    pool.release(&owner("a")).await.unwrap();
    wait_stats(&pool, |s| s.available == 1 && s.used == 0).await;
    assert_eq!(cloud.st().delete_times, [t1], "shrink waited");
    pool.shutdown().await;
}

#[tokio::test]
async fn eni_limit_is_respected() {
    // Primary + 2 secondaries, but the pool wants 5 free.
    let cloud = FakeCloud::new(3);
    let pool = start(&cloud, config(5, 5)).await;
    wait_stats(&pool, |s| s.available == 2).await;
    pool.resync_now().await.unwrap();
    assert_eq!(
        pool.stats(),
        PoolStats {
            used: 0,
            available: 2,
            needed: 0,
            excess: 0,
            remaining_interfaces: 0,
        }
    );
    two_then_exhausted(&pool, 2).await;
    pool.resync_now().await.unwrap();
    assert_eq!(cloud.st().creates_started, 2);
    assert_eq!(cloud.st().over_limit, 0);
    pool.shutdown().await;
}

#[tokio::test]
async fn shrinks_to_max_free_after_releases() {
    let cloud = FakeCloud::new(16);
    let pool = start(&cloud, config(1, 2)).await;
    pool.restore(&[]).await.unwrap();
    let owners: Vec<_> = (0..5).map(|i| owner(&format!("c{i}"))).collect();
    let mut ids = HashSet::new();
    for o in &owners {
        assert!(ids.insert(allocate_waiting(&pool, o).await.id));
    }
    wait_stats(&pool, |s| s.used == 5 && s.available == 1).await;
    assert!(cloud.st().deletes.is_empty());

    for o in &owners {
        pool.release(o).await.unwrap();
    }
    let s = wait_stats(&pool, |s| s.available == 2).await;
    assert_eq!((s.used, s.excess, s.needed), (0, 0, 0));
    pool.resync_now().await.unwrap();
    assert_eq!(cloud.st().deletes.len(), 4, "6 ENIs shrunk to 2");
    assert_eq!(cloud.attached_count(), 2);
    let listed = member_ids(&pool).await;
    let mut in_cloud: Vec<_> = cloud.st().enis.keys().cloned().collect();
    in_cloud.sort();
    assert_eq!(listed, in_cloud);
    pool.shutdown().await;
}

#[tokio::test]
async fn no_detach_before_restore_and_never_an_untagged_eni() {
    let cloud = FakeCloud::new(16);
    let held = cloud.add(true, true);
    for _ in 0..3 {
        cloud.add(true, true);
    }
    // Last, so a shrink that ignored the tag would pick it first.
    let foreign = cloud.add(true, false);
    let pool = start(&cloud, config(0, 1)).await;
    pool.resync_now().await.unwrap();
    assert_eq!(pool.stats().excess, 4);
    assert!(
        cloud.st().deletes.is_empty(),
        "detached before the checkpoint was restored"
    );

    pool.restore(&[(held.clone(), owner("pod"))]).await.unwrap();
    pool.resync_now().await.unwrap();
    let s = pool.stats();
    assert_eq!((s.used, s.available), (1, 1));
    let deletes = cloud.st().deletes.clone();
    assert_eq!(deletes.len(), 3);
    assert!(!deletes.contains(&held), "deleted a pod's ENI");
    assert!(!deletes.contains(&foreign), "deleted an untagged ENI");
    let free: Vec<_> = pool
        .list()
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.owner.is_none())
        .map(|e| e.id)
        .collect();
    assert_eq!(free, [foreign]);
    pool.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn leaving_eni_is_never_allocated_and_comes_back_on_failure() {
    let cloud = FakeCloud::new(16);
    for _ in 0..3 {
        cloud.add(true, true);
    }
    cloud.st().hold_deletes = true;
    let pool = start(&cloud, config(0, 2)).await;
    pool.restore(&[]).await.unwrap();
    // The loop marks the surplus ENI leaving and blocks in the delete.
    cloud.until(|st| st.delete_times.len() == 1).await;
    let s = pool.stats();
    assert_eq!((s.available, s.excess), (2, 0));
    let (a, b) = two_then_exhausted(&pool, 3).await;

    // The delete fails: the ENI is free again and can be taken.
    cloud.fail_next(1);
    cloud.delete_gate.add_permits(1);
    let s = wait_stats(&pool, |s| s.available == 1).await;
    assert_eq!(s.used, 2);
    assert!(cloud.st().deletes.is_empty());
    let c = pool.allocate_next(&owner("c")).await.unwrap();
    assert!(c.id != a.id && c.id != b.id);
    assert_eq!(cloud.attached_count(), 3);
    pool.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn backoff_grows_caps_and_resets() {
    let cloud = FakeCloud::new(16);
    let cfg = PoolConfig {
        initial_retry: Duration::from_secs(1),
        max_backoff: Duration::from_secs(4),
        resync_interval: Duration::from_secs(30),
        ..config(1, 3)
    };
    let gaps = |from: usize| -> Vec<Duration> {
        let t = cloud.st().create_times.clone();
        t[from..].windows(2).map(|w| w[1] - w[0]).collect()
    };

    // Five failures, then success: retries after steps of 1, 2, 4, 4
    // (capped), 4 s, each jittered.
    cloud.fail_next(5);
    let pool = start(&cloud, cfg).await;
    wait_stats(&pool, |s| s.available == 1).await;
    assert_jittered(&gaps(0), &[1, 2, 4, 4, 4]);
    // Not in lockstep: the jittered gaps are not the bare steps.
    assert_ne!(gaps(0), [1, 2, 4, 4, 4].map(Duration::from_secs));
    assert_eq!(cloud.st().creates, 1);

    // Allocations during the backoff did not cut it short.
    let before = cloud.st().create_times.len();
    cloud.fail_next(3);
    pool.allocate_next(&owner("a")).await.unwrap();
    cloud.until(|st| st.create_times.len() == before + 2).await;
    for i in 0..5 {
        let e = pool.allocate_next(&owner(&format!("x{i}"))).await;
        assert_eq!(e.unwrap_err(), ProviderError::Exhausted { total: 1 });
        tokio::task::yield_now().await;
    }
    // Their runtime gave up (DEL): no demand beyond min_free is left.
    for i in 0..5 {
        pool.release(&owner(&format!("x{i}"))).await.unwrap();
    }
    wait_stats(&pool, |s| s.available == 1).await;
    // Success reset the backoff: the next failures restart at 1 s.
    assert_jittered(&gaps(before), &[1, 2, 4]);

    let before = cloud.st().create_times.len();
    cloud.fail_next(2);
    pool.allocate_next(&owner("b")).await.unwrap();
    wait_stats(&pool, |s| s.available == 1).await;
    assert_jittered(&gaps(before), &[1, 2]);
    pool.shutdown().await;
}

#[tokio::test]
async fn allocate_on_empty_pool_never_waits_for_the_cloud() {
    let cloud = FakeCloud::new(16);
    cloud.st().hold_creates = true;
    let pool = start(&cloud, config(1, 3)).await;
    cloud.until(|st| st.creates_started == 1).await;
    // The create is in flight and held; allocation must answer now.
    let r = tokio::time::timeout(Duration::from_secs(5), pool.allocate_next(&owner("a")))
        .await
        .expect("allocate waited on the cloud");
    assert_eq!(r.unwrap_err(), ProviderError::Exhausted { total: 0 });
    assert_eq!(cloud.st().creates, 0);

    cloud.st().hold_creates = false;
    cloud.create_gate.add_permits(1);
    let e = allocate_waiting(&pool, &owner("a")).await;
    assert_eq!(e.owner, Some(owner("a")));
    pool.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_allocations_never_share() {
    // No room for more (8 and the primary): no ENI may appear mid-race
    // for the losers' demand, so the count of winners is exact.
    let cloud = FakeCloud::new(9);
    for _ in 0..8 {
        cloud.add(true, true);
    }
    let pool = start(&cloud, config(0, 8)).await;
    let (ids, exhausted) = allocate_concurrently(&pool, 32).await;
    assert_eq!((ids.len(), exhausted.len()), (8, 24));
    assert!(exhausted.iter().all(|&total| total == 8), "{exhausted:?}");
    let owners: HashSet<_> = pool
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.owner.unwrap().container_id)
        .collect();
    assert_eq!(owners.len(), 8);
    pool.shutdown().await;
}

#[tokio::test]
async fn restart_finds_attached_and_deletes_unattached_tagged() {
    let (cloud, pool) = filled(16, config(2, 3)).await;
    let a = pool.allocate_next(&owner("a")).await.unwrap();
    wait_stats(&pool, |s| s.available == 2).await;
    pool.shutdown().await;
    drop(pool);
    // A crash between create and attach left this one behind.
    let orphan = cloud.add(false, true);
    // Someone else's unattached ENI is not enim's to delete.
    let foreign = cloud.add(false, false);

    let pool = start(&cloud, config(2, 3)).await;
    assert!(cloud.st().deletes.contains(&orphan));
    assert!(!cloud.st().enis.contains_key(&orphan));
    assert!(cloud.st().enis.contains_key(&foreign));
    let listed = pool.list().await.unwrap();
    assert_eq!(listed.len(), 3);
    assert!(listed.iter().all(|e| e.owner.is_none()));
    pool.restore(&[(a.id.clone(), owner("a"))]).await.unwrap();
    assert_eq!(pool.allocate_next(&owner("a")).await.unwrap().id, a.id);
    pool.resync_now().await.unwrap();
    let s = pool.stats();
    assert_eq!((s.used, s.available), (1, 2));
    assert_eq!(cloud.st().creates, 3, "restart created ENIs it already had");
    pool.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn failed_orphan_delete_is_retried_by_the_loop() {
    let cloud = FakeCloud::new(16);
    let orphan = cloud.add(false, true);
    // Start's delete fails, so does the loop's first retry.
    cloud.fail_next(2);
    let pool = start(&cloud, config(0, 3)).await;
    cloud.until(|st| st.deletes.contains(&orphan)).await;
    let t = cloud.st().delete_times.clone();
    assert_eq!(t.len(), 3);
    assert_jittered(&[t[2] - t[1]], &[1]);
    assert!(!cloud.st().enis.contains_key(&orphan));
    assert!(pool.list().await.unwrap().is_empty());
    pool.shutdown().await;
}

#[tokio::test]
async fn restore_skips_unknown_and_rejects_conflicts_atomically() {
    let cloud = FakeCloud::new(16);
    let e1 = cloud.add(true, true);
    let e2 = cloud.add(true, true);
    let pool = start(&cloud, config(0, 3)).await;
    pool.restore(&[(e1.clone(), owner("x")), ("eni-gone".into(), owner("y"))])
        .await
        .unwrap();
    assert_eq!(pool.allocate_next(&owner("x")).await.unwrap().id, e1);
    assert_eq!(pool.stats().used, 1);
    // Same owner again: fine.
    pool.restore(&[(e1.clone(), owner("x"))]).await.unwrap();

    // One conflict in the batch: nothing of it applies.
    let err = pool
        .restore(&[(e2.clone(), owner("z")), (e1.clone(), owner("y"))])
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ProviderError::OwnedByOther { eni_id, .. } if *eni_id == e1),
        "{err}"
    );
    let listed = pool.list().await.unwrap();
    let e2_owner = listed.iter().find(|e| e.id == e2).unwrap().owner.clone();
    assert_eq!(e2_owner, None);
    pool.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn shutdown_stops_the_loop() {
    let (cloud, pool) = filled(16, config(1, 3)).await;
    pool.shutdown().await;
    pool.shutdown().await; // idempotent
    pool.allocate_next(&owner("a")).await.unwrap();
    assert!(pool.allocate_next(&owner("b")).await.is_err());
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert_eq!(cloud.st().creates_started, 1);
    // resync_now on a stopped pool does nothing either.
    pool.resync_now().await.unwrap();
    assert_eq!(cloud.st().creates_started, 1);
}

#[tokio::test(start_paused = true)]
async fn dropping_the_pool_stops_the_loop() {
    let (cloud, pool) = filled(16, config(1, 3)).await;
    drop(pool);
    tokio::time::sleep(Duration::from_secs(3600)).await;
    // The loop's task held the backend; it is gone once the loop ended.
    assert_eq!(Arc::strong_count(&cloud), 1);
}

async fn member_ids(pool: &WarmPool) -> Vec<String> {
    let mut ids: Vec<String> = pool
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.id)
        .collect();
    ids.sort();
    ids
}

/// Waits for the next round that asks the instance what is attached (a
/// timer round) and for the pool to take the answer in.
async fn next_timer_round(cloud: &FakeCloud) {
    let n = cloud.st().attached_times.len();
    cloud.until(|st| st.attached_times.len() > n).await;
    // The rest of the round makes no cloud call; the next timer wait is at
    // least half the resync interval, far above this.
    tokio::time::sleep(Duration::from_millis(1)).await;
}

/// Timer rounds compare the pool with the instance: an ENI attached from
/// outside becomes a free member (never detached as surplus: it is not
/// known to be enim's); a free member detached from outside leaves after
/// MISSING_ROUNDS rounds; one a pod holds stays however long it is missing.
#[tokio::test(start_paused = true)]
async fn timer_rounds_follow_enis_attached_and_detached_outside() {
    let cloud = FakeCloud::new(16);
    let held = cloud.add(true, true);
    let resync = Duration::from_secs(10);
    let pool = start(
        &cloud,
        PoolConfig {
            resync_interval: resync,
            ..config(0, 0)
        },
    )
    .await;
    pool.restore(&[]).await.unwrap();
    assert_eq!(pool.allocate_next(&owner("pod")).await.unwrap().id, held);

    // Someone attaches an ENI of their own: the next timer round takes it in.
    let outside = cloud.add(true, false);
    assert_eq!(member_ids(&pool).await, vec![held.clone()]);
    next_timer_round(&cloud).await;
    assert_eq!(member_ids(&pool).await, vec![held.clone(), outside.clone()]);
    // Free and above max_free = 0, yet never detached: not enim's.
    next_timer_round(&cloud).await;
    next_timer_round(&cloud).await;
    assert!(cloud.st().deletes.is_empty());
    assert_eq!(pool.allocate_next(&owner("p2")).await.unwrap().id, outside);
    pool.release(&owner("p2")).await.unwrap();

    // Someone detaches both. One round: nothing dropped yet (metadata may
    // lag an attach); after MISSING_ROUNDS rounds the free one is gone and
    // the one a pod holds stays.
    for id in [&held, &outside] {
        cloud.st().enis.get_mut(id.as_str()).unwrap().attached = false;
    }
    let detached_at = cloud.st().attached_times.len();
    next_timer_round(&cloud).await;
    assert_eq!(member_ids(&pool).await, vec![held.clone(), outside.clone()]);
    for _ in 1..MISSING_ROUNDS {
        next_timer_round(&cloud).await;
    }
    assert_eq!(member_ids(&pool).await, vec![held.clone()]);
    // Nothing woke the loop since the detach: the timer rounds came at
    // jittered delays of at most `resync`, not in lockstep.
    next_timer_round(&cloud).await;
    let t = cloud.st().attached_times[detached_at..].to_vec();
    let gaps: Vec<Duration> = t.windows(2).map(|w| w[1] - w[0]).collect();
    assert_jittered(&gaps, &[resync.as_secs(); 2]);
    assert_ne!(gaps[0], gaps[1], "resync delays in lockstep");
    let stats = pool.stats();
    assert_eq!((stats.used, stats.available), (1, 0), "{stats:?}");
    pool.shutdown().await;
}

/// The cloud API is down at start: the pool starts anyway, serves the ENIs
/// instance metadata shows attached, says it is degraded, creates nothing
/// and detaches nothing. When the API answers again, discovery finishes,
/// the degraded state clears and the pool grows to `min_free`.
#[tokio::test(start_paused = true)]
async fn starts_and_serves_without_the_cloud_then_grows_when_it_returns() {
    let cloud = FakeCloud::new(6);
    let ours = cloud.add(true, true);
    let orphan = cloud.add(false, true);
    cloud.st().api_down = true;
    let pool = start(&cloud, config(3, 5)).await;
    pool.restore(&[]).await.unwrap();
    let why = pool.degraded().expect("degraded");
    assert!(why.contains("cloud unreachable since"), "{why}");

    // The attached ENI is served; the next ADD is "try again later".
    let eni = pool.allocate_next(&owner("a")).await.unwrap();
    assert_eq!(eni.id, ours);
    let err = pool.allocate_next(&owner("b")).await.unwrap_err();
    assert!(matches!(err, ProviderError::Exhausted { .. }), "{err}");
    // Its runtime gives up on that sandbox (DEL): no demand is left.
    pool.release(&owner("b")).await.unwrap();
    // Release and DEL need no cloud.
    pool.release(&owner("a")).await.unwrap();
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(
        cloud.st().creates_started,
        0,
        "no create while undiscovered"
    );
    assert!(
        cloud.st().deletes.is_empty(),
        "nothing deleted while undiscovered"
    );
    assert!(pool.degraded().is_some());

    cloud.st().api_down = false;
    let stats = wait_stats(&pool, |s| s.available == 3).await;
    assert_eq!(stats.used, 0);
    assert!(pool.degraded().is_none(), "{:?}", pool.degraded());
    cloud.until(|st| st.deletes.contains(&orphan)).await;
    assert_eq!(cloud.attached_count(), 3);
}

/// Far below `min_free`, the pool creates `max_parallel_creates` ENIs at
/// once, never more, and still fills exactly to `min_free`.
#[tokio::test(start_paused = true)]
async fn creates_run_in_parallel_up_to_the_bound() {
    let cloud = FakeCloud::new(10);
    cloud.st().hold_creates = true;
    let pool = start(&cloud, config(4, 6)).await;
    cloud.until(|st| st.creates_started == 2).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(cloud.st().creates_started, 2, "at most 2 at once");
    cloud.create_gate.add_permits(2);
    cloud.until(|st| st.creates_started == 4).await;
    let times = cloud.st().create_times.clone();
    assert_eq!(times[0], times[1], "the first two started together");
    cloud.create_gate.add_permits(2);
    let stats = wait_stats(&pool, |s| s.available == 4).await;
    assert_eq!(stats.needed, 0);
    assert_eq!(cloud.st().creates, 4, "no more than min_free");
}

/// Pods told "try again later" are demand on top of `min_free`: the pool
/// creates for them too (at the bounded rate), and forgets a pod once it is
/// served or its DEL comes.
#[tokio::test(start_paused = true)]
async fn waiting_pods_are_demand_beyond_min_free() {
    let (cloud, pool) = filled(10, config(1, 8)).await;
    pool.allocate_next(&owner("a")).await.unwrap();
    for who in ["b", "c", "d"] {
        let e = pool.allocate_next(&owner(who)).await;
        assert!(matches!(e, Err(ProviderError::Exhausted { .. })), "{e:?}");
    }
    pool.release(&owner("d")).await.unwrap();
    // min_free 1 + b and c waiting: 3 free.
    wait_stats(&pool, |s| s.available == 3).await;
    for who in ["b", "c"] {
        pool.allocate_next(&owner(who)).await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(60)).await;
    let stats = pool.stats();
    assert_eq!((stats.used, stats.available), (3, 1), "{stats:?}");
    assert_eq!(cloud.st().creates, 4);
}

/// Secondary mode: the pool holds the node's host ENIs, never creates or
/// detaches one by watermark, attaches one when asked, and keeps each
/// member's addresses current through assign and unassign.
#[tokio::test]
async fn host_eni_role_attaches_on_request_and_tracks_addresses() {
    let cloud = FakeCloud::new(3);
    // Watermarks that would create (none is attached) and then shrink (two
    // free above one) in the pod role.
    let pool = WarmPool::start_as(cloud.clone(), config(1, 1), PoolRole::HostEnis)
        .await
        .unwrap();
    pool.restore(&[]).await.unwrap();
    pool.resync_now().await.unwrap();
    assert_eq!(cloud.attached_count(), 0, "no create by watermark");
    let ips = pool
        .secondary_ips()
        .expect("the host role assigns addresses");
    assert_eq!(ips.address_limits().await.unwrap().enis, 3);

    let first = ips.attach_eni().await.unwrap();
    assert!(first.device_index.is_some());
    let new = ips.assign(&first.id, 2, 0).await.unwrap();
    assert_eq!(new.len(), 2);
    assert_eq!(pool.list().await.unwrap()[0].secondary_ips, new);
    ips.unassign(&first.id, &new[..1]).await.unwrap();
    assert_eq!(pool.list().await.unwrap()[0].secondary_ips, new[1..]);
    // Unassigning again is no error.
    ips.unassign(&first.id, &new[..1]).await.unwrap();

    ips.attach_eni().await.unwrap();
    assert_eq!(pool.list().await.unwrap().len(), 2);
    // Two ENIs and the primary: the instance is full.
    assert!(matches!(
        ips.attach_eni().await,
        Err(ProviderError::Exhausted { total: 2 })
    ));
    pool.resync_now().await.unwrap();
    assert_eq!(cloud.attached_count(), 2, "free host ENIs are never shrunk");
}

#[tokio::test]
async fn pod_role_offers_no_address_verbs() {
    let cloud = FakeCloud::new(3);
    let pool = start(&cloud, config(0, 0)).await;
    assert!(pool.secondary_ips().is_none());
}

// ---- the fleet-wide reaper ----

const CLUSTER: &str = "c1";

/// A creation tag `ago` before now (wall clock, as the reaper reads it).
fn created_ago(ago: Duration) -> String {
    enim_provider::cloud::format_created_at(std::time::SystemTime::now() - ago)
}

const MIN: Duration = Duration::from_secs(60);

#[test]
fn reaper_config_defaults_and_validation() {
    let d = PoolConfig::default();
    assert_eq!(d.reap_interval, Duration::from_secs(3600));
    assert_eq!(d.reap_cooldown, Duration::from_secs(600));
    let c: PoolConfig =
        serde_json::from_str(r#"{"reap_interval": "2h", "reap_cooldown": "5m"}"#).unwrap();
    assert_eq!(
        (c.reap_interval, c.reap_cooldown),
        (Duration::from_secs(7200), 5 * MIN)
    );
    c.validate().unwrap();
    let e = PoolConfig {
        reap_interval: Duration::ZERO,
        ..d.clone()
    }
    .validate()
    .unwrap_err();
    assert!(e.to_string().contains("reap_interval"), "{e}");
    let e = PoolConfig {
        reap_cooldown: Duration::from_secs(30),
        ..d
    }
    .validate()
    .unwrap_err();
    assert!(e.to_string().contains("reap_cooldown"), "{e}");
}

#[tokio::test]
async fn reaper_deletes_only_old_unattached_enis_of_this_cluster() {
    let cloud = FakeCloud::in_cluster(8, CLUSTER);
    let old = created_ago(20 * MIN);
    let unix_old = (std::time::SystemTime::now() - 30 * MIN)
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        .to_string();
    let old_ours = cloud.add_in_cluster(Some(CLUSTER), Some(&old), false);
    let old_unix = cloud.add_in_cluster(Some(CLUSTER), Some(&unix_old), false);
    let young = cloud.add_in_cluster(Some(CLUSTER), Some(&created_ago(2 * MIN)), false);
    let future = cloud.add_in_cluster(Some(CLUSTER), Some(&created_ago(Duration::ZERO)), false);
    let unreadable = cloud.add_in_cluster(Some(CLUSTER), Some("last tuesday"), false);
    let missing = cloud.add_in_cluster(Some(CLUSTER), None, false);
    let other_cluster = cloud.add_in_cluster(Some("c2"), Some(&old), false);
    let untagged = cloud.add_in_cluster(None, Some(&old), false);
    let attached = cloud.add_in_cluster(Some(CLUSTER), Some(&old), true);

    let pool = start(&cloud, config(0, 3)).await;
    let r = pool.reap_now().await.unwrap();
    let sorted = |mut v: Vec<String>| {
        v.sort();
        v
    };
    assert_eq!(sorted(r.deleted), sorted(vec![old_ours.clone(), old_unix]));
    assert_eq!(sorted(r.young), sorted(vec![young.clone(), future.clone()]));
    assert_eq!(sorted(r.unreadable), sorted(vec![unreadable, missing]));
    assert!(r.gone.is_empty() && r.spared.is_empty() && r.failed.is_empty());
    {
        let st = cloud.st();
        for kept in [&young, &future, &other_cluster, &untagged, &attached] {
            assert!(st.enis.contains_key(kept), "{kept} was reaped");
        }
        assert!(!st.enis.contains_key(&old_ours));
        assert_eq!(st.enis.len(), 7);
    }
    // A second pass finds nothing more to delete.
    let r = pool.reap_now().await.unwrap();
    assert!(r.deleted.is_empty(), "{r:?}");
    pool.shutdown().await;
}

#[tokio::test]
async fn two_reapers_racing_on_the_same_enis_both_succeed() {
    let cloud = FakeCloud::in_cluster(8, CLUSTER);
    let old = created_ago(20 * MIN);
    let ids: HashSet<String> = (0..3)
        .map(|_| cloud.add_in_cluster(Some(CLUSTER), Some(&old), false))
        .collect();
    // Both nodes list before either deletes.
    cloud.st().hold_deletes = true;
    let pass = |cloud: Arc<FakeCloud>| {
        tokio::spawn(async move { reap_pass(cloud.as_ref(), 10 * MIN, || false).await })
    };
    let a = pass(cloud.clone());
    let b = pass(cloud.clone());
    cloud.until(|st| st.reap_lists.len() == 2).await;
    cloud.delete_gate.add_permits(6);
    let (a, b) = (a.await.unwrap().unwrap(), b.await.unwrap().unwrap());
    let deleted: HashSet<String> = a.deleted.iter().chain(&b.deleted).cloned().collect();
    assert_eq!(deleted, ids, "{a:?} {b:?}");
    assert_eq!(a.deleted.len() + b.deleted.len(), 3, "each deleted once");
    let gone: HashSet<String> = a.gone.iter().chain(&b.gone).cloned().collect();
    assert_eq!(gone, ids, "the loser of each race saw it gone");
    assert!(a.failed.is_empty() && b.failed.is_empty());
    assert!(cloud.st().enis.is_empty());
}

#[tokio::test(start_paused = true)]
async fn the_reaper_runs_on_its_own_jittered_timer_and_survives_failures() {
    let cloud = FakeCloud::in_cluster(8, CLUSTER);
    let leaked = cloud.add_in_cluster(Some(CLUSTER), Some(&created_ago(20 * MIN)), false);
    let cfg = PoolConfig {
        reap_interval: 60 * MIN,
        ..config(1, 3)
    };
    let t0 = Instant::now();
    let pool = start(&cloud, cfg).await;
    wait_stats(&pool, |s| s.available == 1).await;
    cloud
        .until_within(3 * 60 * MIN, |st| st.reap_lists.len() == 1)
        .await;
    let first = cloud.st().reap_lists[0] - t0;
    assert!(first <= 60 * MIN, "first pass after {first:?}");
    assert_eq!(cloud.st().reaped, [leaked]);

    // The API fails for the next two passes: logged, tried again on the
    // timer, and the pool keeps serving meanwhile.
    cloud.st().api_down = true;
    cloud
        .until_within(3 * 60 * MIN, |st| st.reap_lists.len() == 3)
        .await;
    let e = pool.allocate_next(&owner("a")).await.unwrap();
    assert_eq!(pool.allocate_next(&owner("a")).await.unwrap(), e);
    cloud.st().api_down = false;
    let late = cloud.add_in_cluster(Some(CLUSTER), Some(&created_ago(20 * MIN)), false);
    cloud
        .until_within(3 * 60 * MIN, |st| st.reaped.contains(&late))
        .await;

    let times = cloud.st().reap_lists.clone();
    let gaps: Vec<Duration> = times.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(gaps.len() >= 3, "{gaps:?}");
    for gap in &gaps {
        assert!(
            (30 * MIN..=60 * MIN).contains(gap),
            "gap {gap:?} outside the jittered interval: {gaps:?}"
        );
    }
    let distinct: HashSet<_> = gaps.iter().collect();
    assert!(distinct.len() > 1, "jittered: {gaps:?}");
    pool.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn the_reaper_is_off_without_a_cluster() {
    let cloud = FakeCloud::new(8);
    cloud.add_in_cluster(Some(CLUSTER), Some(&created_ago(20 * MIN)), false);
    let pool = start(&cloud, config(1, 3)).await;
    tokio::time::sleep(3 * 60 * MIN).await;
    assert!(cloud.st().reap_lists.is_empty());
    assert_eq!(pool.reap_now().await.unwrap(), ReapReport::default());
    assert_eq!(cloud.st().enis.len(), 2, "the leaked one and the pool's");
    pool.shutdown().await;
}

/// A throttling cloud never reaches a pod as anything but "try again
/// later": the pod's ADD is served from memory (or told Exhausted, which
/// the engine answers with CNI code 11), and the throttled answer shows as
/// the pool's transient, degraded state.
#[tokio::test(start_paused = true)]
async fn a_throttling_cloud_reaches_pods_only_as_try_again_later() {
    let cloud = FakeCloud::new(8);
    cloud.fail_next(usize::MAX);
    let pool = start(&cloud, config(1, 3)).await;
    let e = pool.resync_now().await.unwrap_err();
    assert!(matches!(e, ProviderError::Throttled(_)), "{e:?}");
    assert!(e.is_transient());
    let t0 = Instant::now();
    let e = pool.allocate_next(&owner("a")).await.unwrap_err();
    assert!(matches!(e, ProviderError::Exhausted { .. }), "{e:?}");
    assert_eq!(t0.elapsed(), Duration::ZERO, "the ADD waited on nothing");
    // The loop records the throttled round; the pool says it is degraded.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let degraded = pool.degraded().expect("degraded while throttled");
    assert!(degraded.contains("throttled"), "{degraded}");
    // The cloud recovers: the waiting pod is served.
    cloud.fail_next(0);
    let eni = allocate_waiting(&pool, &owner("a")).await;
    assert!(eni.id.starts_with("eni-"));
    pool.shutdown().await;
}
