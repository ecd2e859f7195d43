//! The warm pool over the BCE backend: watermarks, the quota, restarts,
//! `build`, and a start through an API outage with the id cache.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use enim_core::ProviderError;
use enim_provider::testing::listed_ids;
use enim_provider::EniProvider;
use enim_provider_pool::PoolRole;
use enim_testkit::bce::{FakeCloud, INSTANCE, VPC};

use crate::{config, owner, pod_pool, wait_for};

#[tokio::test]
async fn pool_fills_to_min_free_and_shrinks_to_max_free() {
    let cloud = FakeCloud::start().await;
    let cfg = config(&cloud);
    let pool = pod_pool(&cfg).await;
    let s = wait_for(&pool, "min_free ENIs", |s| s.available == 2).await;
    assert_eq!(s.used, 0);
    assert_eq!(cloud.world().ours().len(), 2);
    assert_eq!(cloud.world().attached_to_us().len(), 2);

    // Nothing is detached before restore; then three pods take ENIs and the
    // pool refills behind them.
    pool.restore(&[]).await.unwrap();
    let mut held = Vec::new();
    for n in 0..3 {
        held.push(pool.allocate_next(&owner(n)).await.unwrap_or_else(|e| {
            // The pool may be between refills; wait and retry once.
            panic!("allocation {n} failed: {e}")
        }));
        wait_for(&pool, "refill", |s| {
            s.available >= 2 || s.remaining_interfaces == 0
        })
        .await;
    }
    let s = wait_for(&pool, "refill after 3 pods", |s| {
        s.used == 3 && s.available == 2
    })
    .await;
    assert_eq!(s.remaining_interfaces, 8 - 1 - 5);
    assert_eq!(cloud.world().ours().len(), 5);
    // Every handed-out ENI is a distinct, attached one.
    let mut ids: Vec<_> = held.iter().map(|e| e.id.clone()).collect();
    ids.dedup();
    assert_eq!(ids.len(), 3);

    for n in 0..3 {
        pool.release(&owner(n)).await.unwrap();
    }
    // Five free: two above max_free are detached and deleted.
    wait_for(&pool, "shrink to max_free", |s| {
        s.used == 0 && s.available == 3
    })
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(pool.stats().available, 3);
    {
        let w = cloud.world();
        assert_eq!(
            w.ours().len(),
            3,
            "surplus ENIs must be deleted, not just detached"
        );
        assert_eq!(w.attached_to_us().len(), 3);
        assert_eq!(w.count("DELETE", "/v1/eni/"), 2);
    }
    pool.shutdown().await;
}

#[tokio::test]
async fn the_quota_caps_the_pool() {
    let cloud = FakeCloud::start().await;
    cloud.world().quota_total = 3; // the primary and two ENIs
    let mut cfg = config(&cloud);
    cfg.pool.pre_allocate = 5;
    cfg.pool.max_above_watermark = 0;
    let pool = pod_pool(&cfg).await;
    let s = wait_for(&pool, "quota reached", |s| s.available == 2).await;
    assert_eq!(s.remaining_interfaces, 0);
    tokio::time::sleep(Duration::from_millis(150)).await;
    pool.shutdown().await;
    let w = cloud.world();
    assert_eq!(w.ours().len(), 2);
    // The pool stopped at the limit instead of failing against it.
    assert!(
        w.log.iter().all(|l| l.status < 400),
        "{:?}",
        w.log.iter().filter(|l| l.status >= 400).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn a_restarted_agent_finds_its_enis_again() {
    let cloud = FakeCloud::start().await;
    let cfg = config(&cloud);
    let first = pod_pool(&cfg).await;
    wait_for(&first, "fill", |s| s.available == 2).await;
    let held = first.allocate_next(&owner(1)).await.unwrap();
    wait_for(&first, "refill", |s| s.available == 2 && s.used == 1).await;
    first.shutdown().await;
    drop(first);
    let (created_before, orphan) = {
        let mut w = cloud.world();
        // A crash between create and attach left one of ours unattached.
        let orphan = w.add_eni(&format!("enim-{INSTANCE}-crashedxxxx"), VPC, None);
        (w.count("POST", "/v1/eni"), orphan)
    };

    let second = pod_pool(&cfg).await;
    // All three attached ENIs are back, before the loop did anything.
    let listed = second.list().await.unwrap();
    assert_eq!(listed.len(), 3, "{listed:?}");
    assert!(listed.iter().any(|e| e.id == held.id && e.mac == held.mac));
    // The checkpoint says who holds what; the rest is free.
    second
        .restore(&[(held.id.clone(), owner(1))])
        .await
        .unwrap();
    assert_eq!(second.allocate_next(&owner(1)).await.unwrap().id, held.id);
    let s = wait_for(&second, "steady", |s| s.used == 1 && s.available == 2).await;
    assert_eq!(s.needed, 0);
    tokio::time::sleep(Duration::from_millis(150)).await;
    second.shutdown().await;
    let w = cloud.world();
    assert_eq!(
        w.count("POST", "/v1/eni"),
        created_before,
        "no new ENI was needed"
    );
    assert!(
        !w.enis.contains_key(&orphan),
        "the unattached leftover is deleted"
    );
    assert_eq!(w.ours().len(), 3);
}

#[tokio::test]
async fn build_returns_a_started_provider() {
    let cloud = FakeCloud::start().await;
    let provider: Arc<dyn EniProvider> =
        enim_provider_bce::build(&config(&cloud), PoolRole::PodEnis)
            .await
            .unwrap();
    assert_eq!(provider.name(), "bce");
    // The pool fills in the background; an allocation succeeds once it has.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let eni = loop {
        match provider.allocate_next(&owner(7)).await {
            Ok(e) => break e,
            Err(ProviderError::Exhausted { .. }) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(10)).await
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(cloud.world().enis[&eni.id].status, "inuse");
}

/// The API is down when the pool starts: it starts, degraded, and serves
/// the ENIs metadata shows attached under the ids the id cache kept from
/// an earlier start; without the cache it knows no ids and serves none.
/// When the API answers again the degraded state clears.
#[tokio::test]
async fn a_start_without_the_api_serves_the_enis_the_id_cache_knows() {
    let cloud = FakeCloud::start().await;
    let cache = std::env::temp_dir().join(format!(
        "enim-bce-ids-{}-{}.json",
        std::process::id(),
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    let mut cfg = config(&cloud);
    cfg.eni_id_cache = Some(cache.clone());
    let first = enim_provider_bce::start_pool(&cfg, PoolRole::PodEnis)
        .await
        .unwrap();
    wait_for(&first, "the first fill", |s| s.available == 2).await;
    let ids = listed_ids(&*first).await;
    first.shutdown().await;

    cloud.set_down(true);
    let mut uncached = cfg.clone();
    uncached.eni_id_cache = None;
    let blind = enim_provider_bce::start_pool(&uncached, PoolRole::PodEnis)
        .await
        .unwrap();
    assert!(blind.degraded().is_some());
    assert_eq!(blind.stats().available, 0, "no ids without the cache");
    blind.shutdown().await;

    let pool = enim_provider_bce::start_pool(&cfg, PoolRole::PodEnis)
        .await
        .unwrap();
    let why = pool.degraded().expect("degraded");
    assert!(why.contains("cloud unreachable since"), "{why}");
    assert_eq!(listed_ids(&*pool).await, ids);
    let eni = pool.allocate_next(&owner(1)).await.unwrap();
    assert!(ids.contains(&eni.id), "{eni:?}");

    cloud.set_down(false);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while pool.degraded().is_some() {
        assert!(std::time::Instant::now() < deadline, "still degraded");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    wait_for(&pool, "growth", |s| s.used == 1 && s.available >= 2).await;
    pool.shutdown().await;
    let _ = std::fs::remove_file(&cache);
}
