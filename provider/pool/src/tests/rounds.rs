//! Pool tests: The timer rounds: ENIs attached and detached outside, an unreachable cloud, parallel creates, waiting pods, the host ENI role.

use super::*;

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
    assert_eq!(listed_ids(&*pool).await, vec![held.clone()]);
    next_timer_round(&cloud).await;
    assert_eq!(
        listed_ids(&*pool).await,
        vec![held.clone(), outside.clone()]
    );
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
    assert_eq!(
        listed_ids(&*pool).await,
        vec![held.clone(), outside.clone()]
    );
    for _ in 1..MISSING_ROUNDS {
        next_timer_round(&cloud).await;
    }
    assert_eq!(listed_ids(&*pool).await, vec![held.clone()]);
    // Nothing woke the loop since the detach: the timer rounds came at
    // jittered delays of at most `resync`, not in lockstep.
    next_timer_round(&cloud).await;
    let t = cloud.st().attached_times[detached_at..].to_vec();
    let gaps: Vec<Duration> = t.windows(2).map(|w| w[1] - w[0]).collect();
    assert_jittered(&gaps, &[resync.as_secs(); 2]);
    // Without jitter both would be exactly `resync`. (Comparing the two
    // gaps with each other would fail once in a few thousand runs: the
    // paused clock rounds them to whole milliseconds.)
    assert!(
        gaps.iter().any(|g| *g != resync),
        "resync delays not jittered: {gaps:?}"
    );
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
    let pool = restored(&cloud, config(3, 5)).await;
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

/// Before each create the pool tells the backend how full it is (its free
/// ENIs over `min_free` plus the pods waiting), which paces an emptier
/// pool's calls sooner: from empty up, and down again when pods wait.
#[tokio::test(start_paused = true)]
async fn each_create_says_how_full_the_pool_is() {
    let pool_config = PoolConfig {
        max_parallel_creates: 1,
        ..config(4, 6)
    };
    let (cloud, pool) = filled(16, pool_config).await;
    assert_eq!(cloud.st().fills, [0.0, 0.25, 0.5, 0.75]);
    // Four pods take the four, and two more wait: the goal is 4 + 2.
    for who in ["a", "b", "c", "d"] {
        pool.allocate_next(&owner(who)).await.unwrap();
    }
    for who in ["e", "f"] {
        let e = pool.allocate_next(&owner(who)).await;
        assert!(matches!(e, Err(ProviderError::Exhausted { .. })), "{e:?}");
    }
    wait_stats(&pool, |s| s.available == 6).await;
    let fills = cloud.st().fills[4..].to_vec();
    assert_eq!(fills.first(), Some(&0.0), "{fills:?}");
    assert!(
        fills.windows(2).all(|w| w[0] <= w[1]) && fills.iter().all(|f| *f < 1.0),
        "{fills:?}"
    );
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
    let new = ips.assign(&first.id, AddressCount::v4(2)).await.unwrap();
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

/// A round that took an ENI in before a throttled create failed it was
/// served, only not in full: the next round follows after the first retry
/// step, not a doubled one. (Doubling left the fleet simulation's late
/// nodes sitting out steps of up to a minute while the account's buckets
/// refilled unused.) A round that created nothing still doubles the step.
#[tokio::test(start_paused = true)]
async fn a_failed_round_that_created_retries_at_the_first_step() {
    let cloud = FakeCloud::new(16);
    // Every second create is throttled.
    cloud.st().fail_every = 2;
    let cfg = PoolConfig {
        initial_retry: Duration::from_secs(1),
        max_backoff: Duration::from_secs(60),
        ..config(5, 7)
    };
    let pool = start(&cloud, cfg).await;
    wait_stats(&pool, |s| s.available == 5).await;
    // Creates by round (the instant they started), numbered from 1 as the
    // fake counts them: the even ones failed.
    let mut rounds: Vec<(Instant, Vec<usize>)> = Vec::new();
    for (i, t) in cloud.st().create_times.iter().enumerate() {
        match rounds.last_mut() {
            Some((at, n)) if at == t => n.push(i + 1),
            _ => rounds.push((*t, vec![i + 1])),
        }
    }
    let mut after_progress = 0;
    let mut after_none = 0;
    for w in rounds.windows(2) {
        let gap = w[1].0 - w[0].0;
        if w[0].1.iter().any(|n| !n.is_multiple_of(2)) {
            assert!(gap <= Duration::from_secs(1), "{gap:?} after {:?}", w[0].1);
            after_progress += 1;
        } else {
            let doubled = Duration::from_secs(1)..=Duration::from_secs(2);
            assert!(doubled.contains(&gap), "{gap:?} after {:?}", w[0].1);
            after_none += 1;
        }
    }
    assert!(after_progress >= 2 && after_none >= 1, "{rounds:?}");
    assert_eq!(cloud.st().creates, 5);
    pool.shutdown().await;
}
