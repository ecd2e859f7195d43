//! Pool tests: Restart, restore and shutdown.

use super::*;

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

/// Uninstall: the free ENIs of the pool's own and a tagged one attached
/// nowhere go back to the cloud; a pod's ENI and one attached from
/// outside stay; the pool makes no more after it.
#[tokio::test]
async fn release_unused_gives_back_what_no_pod_holds_and_nothing_else() {
    let (cloud, pool) = filled(16, config(2, 3)).await;
    pool.restore(&[]).await.unwrap();
    let held = pool.allocate_next(&owner("a")).await.unwrap();
    wait_stats(&pool, |s| s.available == 2).await;
    let foreign = cloud.add(true, false);
    pool.resync_now().await.unwrap();
    let orphan = cloud.add(false, true);
    let free: HashSet<String> = pool
        .list()
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.owner.is_none() && e.id != foreign)
        .map(|e| e.id)
        .collect();
    assert_eq!(free.len(), 2);

    let released = pool.release_unused().await;
    let deleted: HashSet<String> = released.deleted.iter().cloned().collect();
    let mut expected = free.clone();
    expected.insert(orphan.clone());
    assert_eq!(deleted, expected);
    assert!(released.failed.is_empty(), "{:?}", released.failed);
    let kept: HashSet<String> = released.kept.iter().cloned().collect();
    assert_eq!(kept, HashSet::from([held.id.clone(), foreign.clone()]));
    let left: HashSet<String> = cloud.st().enis.keys().cloned().collect();
    assert_eq!(left, HashSet::from([held.id.clone(), foreign]));
    // The loop is stopped: nothing refills the pool.
    let creates = cloud.st().creates;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(cloud.st().creates, creates);
}

/// A delete the cloud refuses is reported, not dropped; and a pool never
/// restored gives nothing back (it cannot tell a free ENI from a held one).
#[tokio::test]
async fn release_unused_reports_failures_and_needs_a_restore() {
    let (cloud, pool) = filled(16, config(2, 3)).await;
    let before: HashSet<String> = cloud.st().enis.keys().cloned().collect();
    let released = pool.release_unused().await;
    assert!(released.deleted.is_empty() && released.failed.is_empty());
    assert_eq!(released.kept.len(), 2);
    assert_eq!(
        cloud.st().enis.keys().cloned().collect::<HashSet<_>>(),
        before
    );

    let (cloud, pool) = filled(16, config(2, 3)).await;
    pool.restore(&[]).await.unwrap();
    cloud.fail_next(1);
    let released = pool.release_unused().await;
    assert_eq!(released.deleted.len() + released.failed.len(), 2);
    assert_eq!(released.failed.len(), 1, "{released:?}");
    assert_eq!(cloud.st().enis.len(), 1);
}
