//! The BCE backend and its warm pool against the loopback fake in
//! `enim_testkit::bce` (signature-checking ENI OpenAPI plus instance metadata).

use enim_testkit::bce as rig;
use enim_testkit::cloud::{
    assert_paced, both_list_then_reap, minutes_ago, two_passes_at_once, Leaks,
};

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use enim_provider::cloud::{parse_created_at, CloudBackend, Reaped};
use enim_provider::ratelimit::RateLimit;
use enim_provider::{EniOwner, EniProvider, PodRef, ProviderError};
use enim_provider_bce::api::ApiClient;
use enim_provider_bce::backend::description_tag;
use enim_provider_bce::{BceBackend, BceConfig, Credentials, MethodLimits, RetryPolicy};
use enim_provider_pool::{reap_pass, PoolConfig, PoolRole, PoolStats, WarmPool};
use rig::{FakeCloud, AK, INSTANCE, PRIMARY_MAC, SK, SUBNET, VPC};

fn config(cloud: &FakeCloud) -> BceConfig {
    BceConfig {
        endpoint: Some(cloud.api_url.clone()),
        metadata_endpoint: Some(cloud.meta_url.clone()),
        security_group_ids: vec!["g-enim".into()],
        access_key_id: Some(AK.into()),
        secret_access_key: Some(SK.into()),
        poll_interval: Duration::from_millis(5),
        operation_timeout: Duration::from_secs(5),
        max_attempts: 4,
        retry_base: Duration::from_millis(2),
        retry_cap: Duration::from_millis(10),
        // Small pages force every listing through several calls.
        list_page_size: 2,
        // Out of the way: the bucket test sets its own.
        api_mutating_rate: FAST,
        api_read_rate: FAST,
        pool: PoolConfig {
            min_free: 2,
            max_free: 3,
            initial_retry: Duration::from_millis(10),
            max_backoff: Duration::from_millis(100),
            resync_interval: Duration::from_millis(50),
            ..PoolConfig::default()
        },
        ..BceConfig::default()
    }
}

/// A client-side rate no test notices.
const FAST: RateLimit = RateLimit::new(Duration::from_micros(10), 1_000_000);

fn owner(n: u32) -> EniOwner {
    EniOwner {
        network: "net".into(),
        container_id: format!("c{n}"),
        ifname: "eth0".into(),
        pod: PodRef::default(),
    }
}

async fn wait_for(pool: &WarmPool, what: &str, pred: impl Fn(&PoolStats) -> bool) -> PoolStats {
    let mut rx = pool.subscribe();
    let found = tokio::time::timeout(Duration::from_secs(10), async {
        rx.wait_for(|s| pred(s)).await.map(|s| *s)
    })
    .await;
    match found {
        Ok(Ok(s)) => s,
        _ => panic!("timed out waiting for {what}; stats {:?}", pool.stats()),
    }
}

/// The pool of pod ENIs over `cfg`, started.
async fn pod_pool(cfg: &BceConfig) -> Arc<WarmPool> {
    enim_provider_bce::start_pool(cfg, PoolRole::PodEnis)
        .await
        .unwrap()
}

/// An API client of `cloud` with the right keys that tries each call once.
fn api_client(cloud: &FakeCloud) -> ApiClient {
    let creds = Credentials {
        access_key_id: AK.into(),
        secret_access_key: SK.into(),
    };
    let retry = RetryPolicy {
        attempts: 1,
        initial: Duration::from_millis(1),
        max: Duration::from_millis(1),
    };
    ApiClient::new(&cloud.api_url, creds, retry).unwrap()
}

#[tokio::test]
async fn discovery_lists_secondaries_from_metadata_and_the_api() {
    let cloud = FakeCloud::start().await;
    let (user_eni, _other) = {
        let mut w = cloud.world();
        w.ipv6 = true;
        let user = w.add_eni("user-eni", VPC, Some(INSTANCE));
        let other = w.add_eni("elsewhere", VPC, Some("i-Other111"));
        for n in 0..5 {
            w.add_eni(&format!("spare-{n}"), VPC, None);
        }
        w.add_eni("other-vpc", "vpc-other", Some(INSTANCE));
        (user, other)
    };
    // No region, VPC or subnet configured: all come from metadata.
    let backend = BceBackend::discover(&config(&cloud)).await.unwrap();
    let s = backend.settings();
    assert_eq!(
        (
            s.instance_id.as_str(),
            s.vpc_id.as_str(),
            s.subnet_id.as_str()
        ),
        (INSTANCE, VPC, SUBNET)
    );

    let attached = backend.attached().await.unwrap();
    assert_eq!(attached.len(), 1, "{attached:?}");
    let e = &attached[0];
    assert_eq!(e.id, user_eni);
    {
        let w = cloud.world();
        let fake = &w.enis[&user_eni];
        assert_eq!(e.mac.to_string(), fake.mac);
        assert_eq!(e.ipv4.to_string(), format!("{}/24", fake.ip));
        assert_eq!(e.gateway4.to_string(), "10.0.1.1");
        assert_eq!(
            e.ipv6.map(|n| n.to_string()),
            fake.ipv6.map(|a| format!("{a}/64"))
        );
        assert_eq!(
            e.gateway6.map(|g| g.to_string()).as_deref(),
            Some("2400:da00::1")
        );
        assert!(e.owner.is_none() && e.mtu.is_none());
        assert!(attached.iter().all(|e| e.mac.to_string() != PRIMARY_MAC));
    }

    // The quota is the instance's interface limit.
    assert_eq!(backend.eni_limit().await.unwrap(), 8);
    // Nothing carries enim's name yet.
    assert!(backend.tagged().await.unwrap().is_empty());
}

#[tokio::test]
async fn listing_follows_every_page() {
    let cloud = FakeCloud::start().await;
    let ids: Vec<String> = {
        let mut w = cloud.world();
        w.server_max_keys = 3; // the server caps pages too
        (0..7)
            .map(|n| w.add_eni(&format!("e{n}"), VPC, None))
            .collect()
    };
    let api = api_client(&cloud);
    let listed = api.list_enis(VPC, None, 2).await.unwrap();
    assert_eq!(
        listed.iter().map(|e| e.eni_id.clone()).collect::<Vec<_>>(),
        ids
    );
    let w = cloud.world();
    let lists: Vec<_> = w.log.iter().filter(|l| l.path == "/v1/eni").collect();
    assert_eq!(lists.len(), 4, "7 ENIs in pages of 2: {lists:?}");
    assert!(!lists[0].query.contains("marker"));
    assert!(lists[1..].iter().all(|l| l.query.contains("marker=eni-")));
    assert!(lists
        .iter()
        .all(|l| l.query.contains("maxKeys=2") && l.status == 200));
}

#[tokio::test]
async fn create_attach_detach_delete_walk_the_status_machine() {
    let cloud = FakeCloud::start().await;
    {
        let mut w = cloud.world();
        w.transition_polls = 3;
        w.metadata_lag = 2;
    }
    let backend = BceBackend::discover(&config(&cloud)).await.unwrap();
    let eni = backend.create_and_attach().await.unwrap();
    {
        let w = cloud.world();
        let fake = &w.enis[&eni.id];
        assert!(
            fake.name.starts_with(&format!("enim-{INSTANCE}-")),
            "{}",
            fake.name
        );
        assert!(fake.description.contains(INSTANCE));
        assert_eq!(fake.security_group_ids, vec!["g-enim".to_string()]);
        assert_eq!(
            (fake.status.as_str(), fake.instance_id.as_str()),
            ("inuse", INSTANCE)
        );
        assert_eq!(eni.mac.to_string(), fake.mac);
        assert_eq!(eni.ipv4.addr(), fake.ip);
        // It went through "attaching" for several reads before "inuse".
        let reads = w.count("GET", &format!("/v1/eni/{}", eni.id));
        assert!(reads > 3, "only {reads} status reads");
        assert_eq!(w.count("POST", "/v1/eni"), 1);
        assert_eq!(w.count("PUT", "/v1/eni/"), 1);
    }
    let tagged = backend.tagged().await.unwrap();
    assert_eq!(tagged.len(), 1);
    assert!(tagged[0].attached && tagged[0].id == eni.id);
    assert_eq!(backend.attached().await.unwrap(), vec![eni.clone()]);

    backend.detach_and_delete(&eni.id).await.unwrap();
    {
        let w = cloud.world();
        assert!(!w.enis.contains_key(&eni.id));
        assert_eq!(w.count("PUT", "/v1/eni/"), 2);
        assert_eq!(w.count("DELETE", "/v1/eni/"), 1);
        // Every mutating call carried a clientToken.
        for l in w.log.iter().filter(|l| l.method != "GET") {
            assert!(l.query.contains("clientToken="), "{l:?}");
        }
        let put_queries: Vec<&str> = w
            .log
            .iter()
            .filter(|l| l.method == "PUT")
            .map(|l| l.query.as_str())
            .collect();
        assert!(
            put_queries[0].starts_with("attach&") && put_queries[1].starts_with("detach&"),
            "{put_queries:?}"
        );
        assert!(w.log.iter().all(|l| l.status != 403));
    }
    // Gone already: deleting again is fine.
    backend.detach_and_delete(&eni.id).await.unwrap();
}

#[tokio::test]
async fn foreign_enis_are_never_deleted_or_adopted() {
    let cloud = FakeCloud::start().await;
    let user = cloud.world().add_eni("user-eni", VPC, Some(INSTANCE));
    let backend = BceBackend::discover(&config(&cloud)).await.unwrap();
    let err = backend.detach_and_delete(&user).await.unwrap_err();
    assert!(
        matches!(&err, ProviderError::Config(m) if m.contains("refusing")),
        "{err}"
    );
    let err = backend.attach_existing(&user).await.unwrap_err();
    assert!(matches!(err, ProviderError::Config(_)), "{err}");
    let w = cloud.world();
    assert_eq!(w.enis[&user].status, "inuse");
    assert_eq!(
        w.count("PUT", "/v1/eni/") + w.count("DELETE", "/v1/eni/"),
        0
    );
}

#[tokio::test]
async fn wrong_secret_is_a_clear_auth_error() {
    let cloud = FakeCloud::start().await;
    let mut cfg = config(&cloud);
    cfg.secret_access_key = Some("not-the-secret".into());
    let err = match BceBackend::discover(&cfg).await {
        Ok(_) => panic!("a wrong secret was accepted"),
        Err(e) => e,
    };
    assert!(!err.is_transient(), "{err}");
    let ProviderError::Config(msg) = &err else {
        panic!("expected a configuration error, got {err:?}");
    };
    assert!(
        msg.contains("authentication") && msg.contains("SignatureDoesNotMatch"),
        "{msg}"
    );
    assert!(!msg.contains("not-the-secret"), "the secret leaked: {msg}");
    let w = cloud.world();
    // Refused once, not retried.
    assert_eq!(w.log.len(), 1, "{:?}", w.log);
    assert_eq!(w.log[0].status, 403);
}

#[tokio::test]
async fn an_unknown_key_is_refused_too() {
    let cloud = FakeCloud::start().await;
    let mut cfg = config(&cloud);
    cfg.access_key_id = Some("ak-nobody".into());
    let err = BceBackend::discover(&cfg).await.err().expect("accepted");
    assert!(
        matches!(&err, ProviderError::Config(m) if m.contains("InvalidAccessKeyId")),
        "{err}"
    );
}

#[tokio::test]
async fn throttling_and_server_errors_are_retried_within_bounds() {
    let cloud = FakeCloud::start().await;
    let backend = BceBackend::discover(&config(&cloud)).await.unwrap();
    let before = cloud.world().log.len();
    cloud
        .world()
        .inject
        .extend([(429, "RequestLimitExceeded"), (503, "ServiceUnavailable")]);
    assert_eq!(backend.eni_limit().await.unwrap(), 8);
    assert_eq!(cloud.world().log.len() - before, 3);

    // Throttled on every try: gives up after max_attempts, as Throttled.
    cloud
        .world()
        .inject
        .extend([(429, "RequestLimitExceeded"); 10]);
    let before = cloud.world().log.len();
    let err = backend.eni_limit().await.unwrap_err();
    assert!(
        matches!(err, ProviderError::Throttled(_)) && err.is_transient(),
        "{err}"
    );
    assert_eq!(cloud.world().log.len() - before, 4);
    cloud.world().inject.clear();

    cloud.world().inject.extend([(500, "InternalError"); 10]);
    let err = backend.tagged().await.unwrap_err();
    assert!(matches!(err, ProviderError::Unavailable(_)), "{err}");
    cloud.world().inject.clear();

    // A client error is not retried.
    cloud.world().inject.push_back((400, "BadRequest"));
    let before = cloud.world().log.len();
    let err = backend.eni_limit().await.unwrap_err();
    assert!(!err.is_transient(), "{err}");
    assert_eq!(cloud.world().log.len() - before, 1);
}

#[tokio::test]
async fn a_repeated_create_after_a_lost_answer_makes_one_eni() {
    // The first create is served but its answer "lost" (a 503 injected after
    // it would not model that), so replay the same clientToken by hand.
    let cloud = FakeCloud::start().await;
    let api = api_client(&cloud);
    let req = enim_provider_bce::api::CreateEni {
        name: "enim-x",
        subnet_id: SUBNET,
        security_group_ids: &[],
        private_ip_set: vec![enim_provider_bce::api::PrivateIp {
            primary: true,
            private_ip_address: String::new(),
        }],
        description: "",
    };
    let a = api.create_eni(&req, "token-1").await.unwrap();
    let b = api.create_eni(&req, "token-1").await.unwrap();
    let c = api.create_eni(&req, "token-2").await.unwrap();
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert_eq!(cloud.world().enis.len(), 2);
}

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
    cfg.pool.min_free = 5;
    cfg.pool.max_free = 5;
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

// ---- the fleet-wide reaper ----

const CLUSTER: &str = "c1";
const COOLDOWN: Duration = Duration::from_secs(600);

fn in_cluster(cloud: &FakeCloud) -> BceConfig {
    BceConfig {
        cluster: Some(CLUSTER.into()),
        ..config(cloud)
    }
}

/// What another node of `cluster` writes into a new ENI's description.
fn marks(cluster: &str, created_at: Option<&str>) -> String {
    let mut d = "enim: exclusive ENI of instance i-Other111, do not attach elsewhere;".to_string();
    if let Some(t) = created_at {
        d.push_str(&format!(" enim.io/created-at={t}"));
    }
    d.push_str(&format!(" enim.io/cluster={cluster}"));
    d
}

/// An unattached ENI as another node of `cluster` leaves it.
fn leaked(cloud: &FakeCloud, cluster: &str, created_at: Option<&str>) -> String {
    cloud.world().add_eni_described(
        "enim-i-Other111-0123456789ab",
        &marks(cluster, created_at),
        None,
    )
}

#[tokio::test]
async fn new_enis_are_marked_with_the_cluster_and_creation_time() {
    let cloud = FakeCloud::start().await;
    let b = BceBackend::discover(&in_cluster(&cloud)).await.unwrap();
    assert_eq!(b.reap_cluster(), Some(CLUSTER));
    let before = SystemTime::now() - Duration::from_secs(1);
    let eni = b.create_and_attach().await.unwrap();
    let description = cloud.world().enis[&eni.id].description.clone();
    assert_eq!(
        description_tag(&description, "enim.io/cluster"),
        Some(CLUSTER)
    );
    let created =
        parse_created_at(description_tag(&description, "enim.io/created-at").unwrap()).unwrap();
    assert!(created >= before && created <= SystemTime::now());
    // Attached: never a candidate.
    assert!(b.unattached_in_cluster().await.unwrap().is_empty());
    b.detach_and_delete(&eni.id).await.unwrap();

    // The longest cluster name still fits BCE's 200-character description.
    let long = "x".repeat(63);
    let b = BceBackend::discover(&BceConfig {
        cluster: Some(long.clone()),
        ..config(&cloud)
    })
    .await
    .unwrap();
    let eni = b.create_and_attach().await.unwrap();
    let description = cloud.world().enis[&eni.id].description.clone();
    assert_eq!(
        description_tag(&description, "enim.io/cluster"),
        Some(long.as_str())
    );
    b.detach_and_delete(&eni.id).await.unwrap();

    // No cluster: reaper off, nothing listed, no cluster mark.
    let b = BceBackend::discover(&config(&cloud)).await.unwrap();
    assert_eq!(b.reap_cluster(), None);
    leaked(&cloud, CLUSTER, Some(&minutes_ago(60)));
    assert!(b.unattached_in_cluster().await.unwrap().is_empty());
    let eni = b.create_and_attach().await.unwrap();
    let description = cloud.world().enis[&eni.id].description.clone();
    assert_eq!(description_tag(&description, "enim.io/cluster"), None);
    b.detach_and_delete(&eni.id).await.unwrap();
}

#[tokio::test]
async fn reaper_deletes_only_old_unattached_enis_of_this_cluster() {
    let cloud = FakeCloud::start().await;
    let leaks = Leaks::make(CLUSTER, |cluster, created_at| {
        std::future::ready(leaked(&cloud, &cluster, created_at.as_deref()))
    })
    .await;
    let old = &leaks.old;
    let (not_enims, unmarked, attached) = {
        let mut w = cloud.world();
        (
            // This cluster's marks, but not an enim name: someone else's.
            w.add_eni_described("user-eni", &marks(CLUSTER, Some(old)), None),
            w.add_eni_described("enim-i-Other111-unmarked0000", "made by hand", None),
            w.add_eni_described(
                "enim-i-NodeAAAA-attached0000",
                &marks(CLUSTER, Some(old)),
                Some(INSTANCE),
            ),
        )
    };
    let b = BceBackend::discover(&in_cluster(&cloud)).await.unwrap();
    let r = reap_pass(&b, COOLDOWN, || false).await.unwrap();
    leaks.assert_pass(r);
    {
        let w = cloud.world();
        for kept in leaks
            .kept()
            .into_iter()
            .chain([&not_enims, &unmarked, &attached])
        {
            assert!(w.enis.contains_key(kept), "{kept} was deleted");
        }
        assert!(!w.enis.contains_key(&leaks.old_a) && !w.enis.contains_key(&leaks.old_b));
        assert_eq!(w.count("DELETE", "/v1/eni/"), 2);
    }
    // Asked directly, the backend refuses what the pass skipped.
    leaks
        .assert_refused(&b, &not_enims, &attached, ["no longer marked", "now inuse"])
        .await;
    assert_eq!(cloud.world().count("DELETE", "/v1/eni/"), 2);
}

#[tokio::test]
async fn two_reapers_racing_on_the_same_enis_both_succeed() {
    let cloud = FakeCloud::start().await;
    let old = minutes_ago(30);
    for _ in 0..3 {
        leaked(&cloud, CLUSTER, Some(&old));
    }
    let a = BceBackend::discover(&in_cluster(&cloud)).await.unwrap();
    let b = BceBackend::discover(&in_cluster(&cloud)).await.unwrap();
    // Both list before either deletes.
    both_list_then_reap(&a, &b, 3).await;
    // The delete itself losing the race (404) counts as success too.
    let last = leaked(&cloud, CLUSTER, Some(&old));
    cloud
        .world()
        .inject_method
        .push(("DELETE", 404, "EniNotFound"));
    assert_eq!(b.reap(&last).await.unwrap(), Reaped::Gone);
    // (The fake kept it: a real cloud's 404 means someone else deleted it.)

    // Two whole passes at once: both succeed, each ENI deleted once.
    let mut ids = HashSet::from([last]);
    for _ in 0..3 {
        ids.insert(leaked(&cloud, CLUSTER, Some(&old)));
    }
    two_passes_at_once(&a, &b, COOLDOWN, &ids).await;
    assert!(cloud.world().enis.keys().all(|id| !ids.contains(id)));
}

/// A burst of calls through one API client goes out at the configured
/// rate per class; reads are not held behind the mutating calls.
#[tokio::test]
async fn a_burst_of_calls_is_spread_at_the_configured_rate() {
    let cloud = FakeCloud::start().await;
    let mutating = RateLimit::new(Duration::from_millis(200), 2);
    let limits = Arc::new(MethodLimits::new(
        mutating,
        RateLimit::new(Duration::from_millis(20), 5),
    ));
    let api = Arc::new(api_client(&cloud).with_limits(limits));
    let t0 = std::time::Instant::now();
    let mut calls = Vec::new();
    for n in 0..8 {
        let api = api.clone();
        // Deleting ENIs that do not exist: one request each, answered 404.
        calls.push(tokio::spawn(async move {
            let _ = api
                .delete_eni(&format!("eni-none{n}"), &format!("t{n}"))
                .await;
        }));
    }
    for _ in 0..3 {
        let api = api.clone();
        calls.push(tokio::spawn(async move {
            api.quota(INSTANCE).await.unwrap();
        }));
    }
    for c in calls {
        c.await.unwrap();
    }
    let w = cloud.world();
    let arrivals = |method: &str| {
        let mut at: Vec<Duration> = w
            .log
            .iter()
            .filter(|l| l.method == method)
            .map(|l| l.at - t0)
            .collect();
        at.sort();
        at
    };
    let deletes = arrivals("DELETE");
    assert_eq!(deletes.len(), 8);
    let reads = arrivals("GET");
    assert_eq!(reads.len(), 3);
    assert_paced(&deletes, mutating, &reads);
}

// ---- secondary mode: private IPs, address limits, device indexes ----

/// The subnet host addresses a pod may have: never the network,
/// broadcast or gateway address, nor the ENI's own.
fn assert_usable(ips: &[std::net::IpAddr], own: std::net::Ipv4Addr) {
    let net: ipnet::Ipv4Net = "10.0.1.0/24".parse().unwrap();
    let mut seen = HashSet::new();
    for ip in ips {
        let std::net::IpAddr::V4(a) = ip else {
            panic!("{ip} is not IPv4")
        };
        assert!(net.contains(a), "{a} outside the subnet");
        assert!(
            ![net.network(), net.broadcast(), rig::GATEWAY, own].contains(a),
            "{a} is not a host address a pod may have"
        );
        assert!(seen.insert(*a), "{a} handed out twice");
    }
}

#[tokio::test]
async fn private_ips_are_added_in_batches_cut_to_the_quota_and_deleted_idempotently() {
    let cloud = FakeCloud::start().await;
    cloud.world().ips_per_eni = 16;
    let backend = BceBackend::discover(&config(&cloud)).await.unwrap();
    // No ENI yet: BCE answers the per-ENI quota only for an ENI.
    let limits = backend.address_limits().await.unwrap();
    assert_eq!(
        (limits.ipv4_per_eni, limits.enis),
        (enim_provider_bce::backend::PROVISIONAL_IPS_PER_ENI, 8)
    );

    let eni = backend.create_and_attach().await.unwrap();
    let limits = backend.address_limits().await.unwrap();
    assert_eq!(
        (limits.ipv4_per_eni, limits.ipv6_per_eni, limits.enis),
        (16, 16, 8)
    );

    // 12 asked: two batch adds (BCE takes 10 at most).
    let first = backend.assign_addresses(&eni.id, 12, 0).await.unwrap();
    assert_eq!(first.len(), 12, "{first:?}");
    assert_usable(&first, eni.ipv4.addr());
    assert_eq!(
        cloud
            .world()
            .count("POST", &format!("/v1/eni/{}/privateIp/batchAdd", eni.id)),
        2
    );
    // 5 more asked, 3 fit (16 with the primary): cut, not refused.
    let second = backend.assign_addresses(&eni.id, 5, 0).await.unwrap();
    assert_eq!(second.len(), 3, "{second:?}");
    assert!(second.iter().all(|ip| !first.contains(ip)));
    // Full: nothing asked of BCE, nothing new.
    assert!(backend
        .assign_addresses(&eni.id, 1, 0)
        .await
        .unwrap()
        .is_empty());
    // (The create is `POST /v1/eni`; the batches are under `/v1/eni/`.)
    assert_eq!(cloud.world().count("POST", "/v1/eni/"), 2 + 1);

    // Metadata shows them: the backend's view of the attached ENI.
    let all: HashSet<_> = first.iter().chain(&second).copied().collect();
    let shown = backend.attached().await.unwrap();
    assert_eq!(shown.len(), 1);
    assert_eq!(
        shown[0]
            .secondary_ips
            .iter()
            .copied()
            .collect::<HashSet<_>>(),
        all
    );
    assert_eq!(shown[0].device_index, Some(1));

    // Deleted in one batch; asked again, nothing is left to delete.
    let gone = &first[..3];
    backend.unassign_addresses(&eni.id, gone).await.unwrap();
    let dels = |cloud: &FakeCloud| {
        cloud
            .world()
            .count("POST", &format!("/v1/eni/{}/privateIp/batchDel", eni.id))
    };
    assert_eq!(dels(&cloud), 1);
    backend.unassign_addresses(&eni.id, gone).await.unwrap();
    assert_eq!(dels(&cloud), 1, "a second unassign deletes nothing");
    let left = cloud.world().secondaries(&eni.id);
    assert_eq!(left.len(), 12);
    assert!(gone.iter().all(|ip| !left.contains(ip)));
    // 12 in one call: two batches of at most 10.
    backend.unassign_addresses(&eni.id, &left).await.unwrap();
    assert_eq!(dels(&cloud), 3);
    assert!(cloud.world().secondaries(&eni.id).is_empty());
    let w = cloud.world();
    for l in w.log.iter().filter(|l| l.method == "POST") {
        assert!(l.query.starts_with("clientToken="), "{l:?}");
    }
    assert!(w.log.iter().all(|l| l.status < 400), "every call answered");
}

#[tokio::test]
async fn addresses_change_only_on_secondary_enis_attached_here() {
    let cloud = FakeCloud::start().await;
    let (elsewhere, spare, primary) = {
        let mut w = cloud.world();
        let elsewhere = w.add_eni("elsewhere", VPC, Some("i-Other111"));
        let spare = w.add_eni("spare", VPC, None);
        // The instance's own interface, as the API may list it.
        let primary = w.add_eni("eth0", VPC, Some(INSTANCE));
        w.enis.get_mut(&primary).unwrap().ip = rig::PRIMARY_IP;
        (elsewhere, spare, primary)
    };
    let backend = BceBackend::discover(&config(&cloud)).await.unwrap();
    for other in [&elsewhere, &spare] {
        let err = backend.assign_addresses(other, 2, 0).await.unwrap_err();
        assert!(matches!(err, ProviderError::OwnedByOther { .. }), "{err}");
    }
    let err = backend.assign_addresses(&primary, 2, 0).await.unwrap_err();
    assert!(
        matches!(&err, ProviderError::Config(m) if m.contains("primary")),
        "{err}"
    );
    let err = backend
        .assign_addresses("eni-missing", 1, 0)
        .await
        .unwrap_err();
    assert!(matches!(err, ProviderError::UnknownEni(_)), "{err}");
    // Unassigning on an ENI that is not (or no longer) here is done:
    // its addresses are not this node's.
    let ip: std::net::IpAddr = "10.0.1.200".parse().unwrap();
    backend.unassign_addresses(&elsewhere, &[ip]).await.unwrap();
    backend
        .unassign_addresses("eni-missing", &[ip])
        .await
        .unwrap();
    let w = cloud.world();
    assert_eq!(
        w.count("POST", "/v1/eni/"),
        0,
        "nothing was added or deleted"
    );
    assert!(w.secondaries(&elsewhere).is_empty());
}

#[tokio::test]
async fn ipv6_addresses_come_from_the_ipv6_batch() {
    let cloud = FakeCloud::start().await;
    cloud.world().ipv6 = true;
    let backend = BceBackend::discover(&config(&cloud)).await.unwrap();
    let eni = backend.create_and_attach().await.unwrap();
    assert!(eni.ipv6.is_some());
    let new = backend.assign_addresses(&eni.id, 2, 2).await.unwrap();
    let (v4, v6): (Vec<std::net::IpAddr>, Vec<_>) = new.iter().partition(|ip| ip.is_ipv4());
    assert_eq!((v4.len(), v6.len()), (2, 2), "{new:?}");
    let shown = backend.attached().await.unwrap();
    let shown: HashSet<_> = shown[0].secondary_ips.iter().copied().collect();
    assert_eq!(shown, new.iter().copied().collect());
    backend.unassign_addresses(&eni.id, &new).await.unwrap();
    assert!(cloud.world().secondaries(&eni.id).is_empty());
    // One call per family.
    assert_eq!(
        cloud
            .world()
            .count("POST", &format!("/v1/eni/{}/privateIp/batchDel", eni.id)),
        2
    );
}

#[tokio::test]
async fn device_indexes_are_distinct_kept_in_the_cloud_and_reused_lowest_first() {
    let cloud = FakeCloud::start().await;
    let foreign = cloud.world().add_eni("user-eni", VPC, Some(INSTANCE));
    let backend = BceBackend::discover(&config(&cloud)).await.unwrap();
    let mut made = Vec::new();
    for _ in 0..3 {
        made.push(backend.create_and_attach().await.unwrap());
    }
    let indexes: Vec<_> = made.iter().map(|e| e.device_index).collect();
    assert_eq!(indexes, [Some(1), Some(2), Some(3)]);
    for e in &made {
        let w = cloud.world();
        let d = &w.enis[&e.id].description;
        assert!(d.len() <= 200, "{d}");
        assert_eq!(
            description_tag(d, enim_provider_bce::backend::TAG_DEVICE_INDEX),
            e.device_index.map(|i| i.to_string()).as_deref()
        );
    }
    // A restarted agent reads the same indexes; the ENI attached from
    // outside has none.
    let again = BceBackend::discover(&config(&cloud)).await.unwrap();
    let shown = again.attached().await.unwrap();
    for e in &made {
        let s = shown.iter().find(|s| s.id == e.id).unwrap();
        assert_eq!(s.device_index, e.device_index);
    }
    assert_eq!(
        shown.iter().find(|s| s.id == foreign).unwrap().device_index,
        None
    );
    // The lowest free index is taken again; the others never move.
    again.detach_and_delete(&made[0].id).await.unwrap();
    let next = again.create_and_attach().await.unwrap();
    assert_eq!(next.device_index, Some(1));
    let shown = again.attached().await.unwrap();
    for e in &made[1..] {
        assert_eq!(
            shown.iter().find(|s| s.id == e.id).unwrap().device_index,
            e.device_index
        );
    }
}

#[tokio::test]
async fn the_host_eni_pool_serves_addresses_and_never_grows_by_watermark() {
    let cloud = FakeCloud::start().await;
    let cfg = config(&cloud);
    // min_free 2: in primary mode the pool would create two ENIs now.
    assert_eq!(cfg.pool.min_free, 2);
    let pool = enim_provider_bce::start_pool(&cfg, PoolRole::HostEnis)
        .await
        .unwrap();
    // Several resync rounds pass.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        cloud.world().count("POST", "/v1/eni"),
        0,
        "no ENI by watermark"
    );
    assert!(pool.list().await.unwrap().is_empty());

    let ips = pool.secondary_ips().expect("host ENIs serve addresses");
    let eni = ips.attach_eni().await.unwrap();
    assert_eq!(eni.device_index, Some(1));
    let limits = ips.address_limits().await.unwrap();
    assert_eq!((limits.ipv4_per_eni, limits.enis), (8, 8));
    let new = ips.assign(&eni.id, 4, 0).await.unwrap();
    assert_eq!(new.len(), 4);
    assert_usable(&new, eni.ipv4.addr());
    let listed = pool.list().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].secondary_ips, new);
    ips.unassign(&eni.id, &new[..1]).await.unwrap();
    ips.unassign(&eni.id, &new[..1]).await.unwrap();
    assert_eq!(pool.list().await.unwrap()[0].secondary_ips, new[1..]);

    // Rounds on the timer keep the view (from metadata) and the ENI: an
    // unowned host ENI is not "free" surplus to delete.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let listed = pool.list().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        listed[0].secondary_ips.iter().collect::<HashSet<_>>(),
        new[1..].iter().collect::<HashSet<_>>()
    );
    let w = cloud.world();
    assert_eq!(
        w.count("POST", "/v1/eni"),
        1 + 1 + 1,
        "one create, one add, one delete"
    );
    assert_eq!(w.count("DELETE", "/v1/eni/"), 0);
    assert_eq!(w.attached_to_us().len(), 1);
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
    let ids: HashSet<String> = first
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.id)
        .collect();
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
    let served: HashSet<String> = pool
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(served, ids);
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
