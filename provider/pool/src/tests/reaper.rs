//! Pool tests: The fleet-wide reaper.

use super::*;

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
