//! Pool tests: Filling, serving, shrinking and backing off.

use super::*;

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
    let pool = restored(&cloud, cfg).await;
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
    let pool = restored(&cloud, config(1, 2)).await;
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
    let listed = listed_ids(&*pool).await;
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
    let pool = restored(&cloud, config(0, 2)).await;
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
