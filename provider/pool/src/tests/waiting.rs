//! ADD's wait for an ENI on its way ([`EniProvider::wait_for_free`]).

use super::*;

fn waiting_config(allocate_wait: Duration) -> PoolConfig {
    PoolConfig {
        max_parallel_creates: 1,
        allocate_wait,
        ..config(0, 3)
    }
}

/// As enimd's ADD does: wait, then allocate.
async fn add(pool: Arc<WarmPool>, name: &'static str) -> Result<Eni, ProviderError> {
    pool.wait_for_free(&owner(name)).await;
    pool.allocate_next(&owner(name)).await
}

/// Two pods find no free ENI while the pool creates them: each waits and
/// is served by the next ENI that lands, in the order they came; the one
/// behind is not woken to race for the first ENI.
#[tokio::test]
async fn pods_wait_in_line_for_the_enis_on_their_way() {
    let cloud = FakeCloud::new(8);
    cloud.st().hold_creates = true;
    let pool = restored(&cloud, waiting_config(Duration::from_secs(10))).await;

    let a = tokio::spawn(add(pool.clone(), "a"));
    // `a` is in line (and a create started for it) before `b` comes.
    cloud.until(|st| st.creates_started == 1).await;
    let b = tokio::spawn(add(pool.clone(), "b"));
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!a.is_finished() && !b.is_finished());

    cloud.create_gate.add_permits(1);
    let first = tokio::time::timeout(WAIT_LIMIT, a).await.unwrap().unwrap();
    let first = first.expect("the first pod is served by the first ENI");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!b.is_finished(), "the second pod did not wait its turn");

    cloud.create_gate.add_permits(1);
    let second = tokio::time::timeout(WAIT_LIMIT, b).await.unwrap().unwrap();
    let second = second.expect("the second pod is served by the second ENI");
    assert_ne!(first.id, second.id);
    assert_eq!(cloud.st().creates, 2);
    pool.shutdown().await;
}

/// No ENI can come (the instance is full, or the cloud is down): the
/// answer is at once, not after the wait.
#[tokio::test(start_paused = true)]
async fn no_wait_when_no_eni_can_come() {
    // Room for the primary interface and one ENI, which `a` holds.
    let cloud = FakeCloud::new(2);
    cloud.add(true, true);
    let pool = restored(&cloud, waiting_config(Duration::from_secs(10))).await;
    add(pool.clone(), "a").await.unwrap();
    let t = Instant::now();
    let err = add(pool.clone(), "b").await.unwrap_err();
    assert!(matches!(err, ProviderError::Exhausted { .. }), "{err}");
    assert_eq!(t.elapsed(), Duration::ZERO, "waited on a full instance");
    pool.shutdown().await;

    let cloud = FakeCloud::new(8);
    cloud.st().api_down = true;
    let pool = restored(&cloud, waiting_config(Duration::from_secs(10))).await;
    assert!(pool.degraded().is_some());
    let t = Instant::now();
    let err = add(pool.clone(), "a").await.unwrap_err();
    assert!(matches!(err, ProviderError::Exhausted { .. }), "{err}");
    assert_eq!(t.elapsed(), Duration::ZERO, "waited with the cloud down");
    pool.shutdown().await;
}

/// An ENI that does not land within `allocate_wait`: the pod is told to
/// try again then, and the create goes on for its retry. Zero turns the
/// wait off.
#[tokio::test(start_paused = true)]
async fn the_wait_ends_after_allocate_wait() {
    let cloud = FakeCloud::new(8);
    cloud.st().hold_creates = true;
    let pool = restored(&cloud, waiting_config(Duration::from_secs(3))).await;
    let t = Instant::now();
    let err = add(pool.clone(), "a").await.unwrap_err();
    assert!(matches!(err, ProviderError::Exhausted { .. }), "{err}");
    assert_eq!(t.elapsed(), Duration::from_secs(3));
    assert_eq!(
        cloud.st().creates_started,
        1,
        "no create for the waiting pod"
    );
    // The pod's retry finds the ENI once it lands.
    cloud.create_gate.add_permits(1);
    add(pool.clone(), "a").await.unwrap();
    pool.shutdown().await;

    let cloud = FakeCloud::new(8);
    cloud.st().hold_creates = true;
    let pool = restored(&cloud, waiting_config(Duration::ZERO)).await;
    let t = Instant::now();
    add(pool.clone(), "a").await.unwrap_err();
    assert_eq!(t.elapsed(), Duration::ZERO);
    cloud.create_gate.add_permits(1);
    pool.shutdown().await;
}

#[test]
fn allocate_wait_is_bounded_by_the_plugin_timeout() {
    let c = waiting_config(MAX_ALLOCATE_WAIT);
    c.validate().unwrap();
    let c = waiting_config(MAX_ALLOCATE_WAIT + Duration::from_secs(1));
    let err = c.validate().unwrap_err().to_string();
    assert!(err.contains("allocate_wait"), "{err}");
    let c: PoolConfig = serde_json::from_str(r#"{"allocate_wait": "0s"}"#).unwrap();
    assert_eq!(c.allocate_wait, Duration::ZERO);
    assert_eq!(PoolConfig::default().allocate_wait, Duration::from_secs(20));
}

/// A pod told to try again earlier keeps its place in line but, while it
/// is away (its retry not yet here), does not hold up a pod waiting now.
#[tokio::test]
async fn a_pod_away_does_not_hold_up_one_waiting() {
    let cloud = FakeCloud::new(8);
    cloud.st().hold_creates = true;
    let pool = restored(&cloud, waiting_config(Duration::from_secs(10))).await;
    let err = pool.allocate_next(&owner("away")).await.unwrap_err();
    assert!(matches!(err, ProviderError::Exhausted { .. }), "{err}");
    let b = tokio::spawn(add(pool.clone(), "b"));
    cloud.until(|st| st.creates_started >= 1).await;
    cloud.create_gate.add_permits(1);
    // At once, not at the end of its 10 s wait.
    let got = tokio::time::timeout(Duration::from_secs(2), b).await;
    let got = got.expect("held up by a pod that was away").unwrap();
    got.expect("served while the pod ahead was away");
    cloud.create_gate.add_permits(8);
    pool.shutdown().await;
}
