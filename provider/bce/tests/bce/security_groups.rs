//! Issue #32: a new ENI with no security groups configured takes its
//! instance's groups (BCC's listing by instance), on the node and in the
//! operator's fleet alike; an instance without any, or a listing that
//! fails or cannot be read, creates nothing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use enim_core::ratelimit::RateLimit;
use enim_core::ProviderError;
use enim_provider::cloud::CloudBackend;
use enim_provider::fleet::FleetCloud;
use enim_provider_bce::client::ApiClient;
use enim_provider_bce::{BceBackend, Credentials, MethodLimits, RetryPolicy};
use enim_testkit::bce::{FakeCloud, Logged, AK, INSTANCE, INSTANCE_GROUP, VPC};
use enim_testkit::cloud::assert_paced;

use crate::fleet::{self, OTHER_NODE};
use crate::{api_client, config};

const LISTING: &str = "/v2/securityGroup";

fn groups(ids: &[&str]) -> Vec<String> {
    ids.iter().map(|g| g.to_string()).collect()
}

/// The security group listings the fake has answered.
fn listings(cloud: &FakeCloud) -> Vec<Logged> {
    let w = cloud.world();
    w.log
        .iter()
        .filter(|l| l.path == LISTING)
        .cloned()
        .collect()
}

/// ENI creates the fake has seen, answered or not.
fn creates(cloud: &FakeCloud) -> usize {
    cloud.world().count("POST", "/v1/eni")
}

#[tokio::test]
async fn the_listing_follows_every_page_and_is_signed_and_scoped_like_bces() {
    let cloud = FakeCloud::start().await;
    let bound = groups(&["g-1", "g-2", "g-3", "g-4", "g-5"]);
    cloud
        .world()
        .instance_groups
        .insert(INSTANCE.into(), bound.clone());
    let api = api_client(&cloud);
    assert_eq!(
        api.instance_security_groups(INSTANCE, VPC, 2)
            .await
            .unwrap(),
        bound
    );
    let pages = listings(&cloud);
    assert_eq!(pages.len(), 3, "5 groups in pages of 2: {pages:?}");
    assert!(!pages[0].query.contains("marker"), "{pages:?}");
    assert!(pages[1].query.contains("marker=g-3"), "{pages:?}");
    assert!(pages[2].query.contains("marker=g-5"), "{pages:?}");
    assert!(pages.iter().all(|l| l.status == 200
        && l.query.contains("maxKeys=2")
        && l.query.contains(&format!("instanceId={INSTANCE}"))
        && l.query.contains(&format!("vpcId={VPC}"))));

    // One page when it holds them all; another VPC's listing has none.
    assert_eq!(
        api.instance_security_groups(INSTANCE, VPC, 1000)
            .await
            .unwrap(),
        bound
    );
    assert!(api
        .instance_security_groups(INSTANCE, "vpc-other", 2)
        .await
        .unwrap()
        .is_empty());

    // The stand-in refuses what BCE refuses: no vpcId with an instanceId,
    // maxKeys past 1000, an unknown instance, a bad signature.
    let refused = |e: enim_provider_bce::client::ApiError| e.to_string();
    let e = refused(
        api.instance_security_groups(INSTANCE, "", 2)
            .await
            .unwrap_err(),
    );
    assert!(e.contains("HTTP 400 MissingParameter"), "{e}");
    let e = refused(
        api.instance_security_groups(INSTANCE, VPC, 1001)
            .await
            .unwrap_err(),
    );
    assert!(e.contains("HTTP 400 InvalidParameter"), "{e}");
    let e = api
        .instance_security_groups("i-Nobody", VPC, 2)
        .await
        .unwrap_err();
    assert!(e.is_not_found(), "{e}");
    let forged = ApiClient::new(
        &cloud.api_url,
        Credentials {
            access_key_id: AK.into(),
            secret_access_key: "not-the-secret".into(),
        },
        RetryPolicy {
            attempts: 1,
            initial: Duration::from_millis(1),
            max: Duration::from_millis(1),
        },
    )
    .unwrap();
    let e = forged
        .instance_security_groups(INSTANCE, VPC, 2)
        .await
        .unwrap_err();
    assert!(e.is_auth(), "{e}");
}

/// The listing takes the read bucket's tokens, not the mutating one's, and
/// is retried like every call.
#[tokio::test]
async fn the_listing_is_paced_by_the_read_bucket_and_retried() {
    let cloud = FakeCloud::start().await;
    cloud.world().instance_groups.insert(
        INSTANCE.into(),
        groups(&["g-1", "g-2", "g-3", "g-4", "g-5", "g-6", "g-7"]),
    );
    let read = RateLimit::new(Duration::from_millis(60), 1);
    let unhurried = RateLimit::new(Duration::from_micros(10), 1_000_000);
    let limits = Arc::new(MethodLimits::new(unhurried, read));
    let api = Arc::new(api_client(&cloud).with_limits(limits));
    let t0 = Instant::now();
    let deletes: Vec<_> = (0..3)
        .map(|n| {
            let api = api.clone();
            tokio::spawn(async move {
                let _ = api
                    .delete_eni(&format!("eni-none{n}"), &format!("t{n}"))
                    .await;
            })
        })
        .collect();
    let listed = api.instance_security_groups(INSTANCE, VPC, 2).await;
    for d in deletes {
        d.await.unwrap();
    }
    assert_eq!(listed.unwrap().len(), 7);
    let (reads, deletes) = (cloud.arrivals("GET", t0), cloud.arrivals("DELETE", t0));
    assert_eq!(reads.len(), 4, "7 groups in pages of 2");
    assert_paced(&reads, read, &deletes);

    // Throttling and server errors are retried as on every call.
    let retrying = ApiClient::new(
        &cloud.api_url,
        Credentials {
            access_key_id: AK.into(),
            secret_access_key: enim_testkit::bce::SK.into(),
        },
        RetryPolicy {
            attempts: 3,
            initial: Duration::from_millis(1),
            max: Duration::from_millis(2),
        },
    )
    .unwrap();
    cloud
        .world()
        .inject
        .extend([(503, "ServiceUnavailable"), (429, "RequestLimitExceeded")]);
    let before = listings(&cloud).len();
    assert_eq!(
        retrying
            .instance_security_groups(INSTANCE, VPC, 1000)
            .await
            .unwrap()
            .len(),
        7
    );
    assert_eq!(
        listings(&cloud).len() - before,
        3,
        "two refused, then served"
    );
}

#[tokio::test]
async fn a_node_without_configured_groups_gives_new_enis_the_instances() {
    let cloud = FakeCloud::start().await;
    let bound = groups(&["g-web", "g-db", "g-ops"]);
    cloud
        .world()
        .instance_groups
        .insert(INSTANCE.into(), bound.clone());
    let mut cfg = config(&cloud);
    cfg.security_group_ids.clear();
    let backend = BceBackend::discover(&cfg).await.unwrap();
    assert!(
        listings(&cloud).is_empty(),
        "listed at the first create only"
    );

    let first = backend.create_and_attach().await.unwrap();
    let second = backend.create_and_attach().await.unwrap();
    let w = cloud.world();
    assert_eq!(w.enis[&first.id].security_group_ids, bound);
    assert_eq!(w.enis[&second.id].security_group_ids, bound);
    drop(w);
    // Listed once, in pages of list_page_size (2), for both creates.
    let pages = listings(&cloud);
    assert_eq!(pages.len(), 2, "{pages:?}");
    assert!(pages[0].query.contains(&format!("instanceId={INSTANCE}")));
}

#[tokio::test]
async fn configured_groups_win_and_nothing_is_listed() {
    let cloud = FakeCloud::start().await;
    // config() names g-enim; the instance has its own group too.
    let backend = BceBackend::discover(&config(&cloud)).await.unwrap();
    let eni = backend.create_and_attach().await.unwrap();
    assert_eq!(cloud.world().enis[&eni.id].security_group_ids, ["g-enim"]);

    let (cloud, fleet) = fleet::start().await;
    let created = fleet
        .create(&fleet::request(INSTANCE, "intent-1", 0))
        .await
        .unwrap();
    assert_eq!(
        cloud.world().enis[&created.id].security_group_ids,
        ["g-enim"]
    );
    assert!(listings(&cloud).is_empty());
}

/// What a node's create fails with while `fault` holds: an error naming
/// the instance and `why`, and no ENI.
async fn node_create_fails(fault: impl FnOnce(&FakeCloud), why: &str, transient: bool) {
    let cloud = FakeCloud::start().await;
    let mut cfg = config(&cloud);
    cfg.security_group_ids.clear();
    let backend = BceBackend::discover(&cfg).await.unwrap();
    fault(&cloud);
    let err = backend.create_and_attach().await.unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains(INSTANCE) && msg.contains(why), "{msg}");
    assert_eq!(err.is_transient(), transient, "{err:?}");
    assert_eq!(creates(&cloud), 0, "nothing created: {msg}");
    assert!(cloud.world().enis.is_empty());
}

#[tokio::test]
async fn a_node_creates_nothing_without_the_instances_groups() {
    node_create_fails(
        |c| {
            c.world().instance_groups.insert(INSTANCE.into(), vec![]);
        },
        "BCE lists none bound to the instance",
        false,
    )
    .await;
    node_create_fails(
        |c| c.world().inject_method.push(("GET", 403, "AccessDenied")),
        "HTTP 403 AccessDenied",
        false,
    )
    .await;
    node_create_fails(|c| c.set_down(true), "ServiceUnavailable", true).await;
    for (garbled, why) in [
        ("not json", "unexpected answer"),
        (
            r#"{"securityGroups": [{"name": "no id"}], "isTruncated": false}"#,
            "missing field `id`",
        ),
        (
            r#"{"securityGroups": [{"id": ""}], "isTruncated": false}"#,
            "a security group without an id",
        ),
        (
            r#"{"securityGroups": [{"id": "g-1"}], "isTruncated": true}"#,
            "isTruncated without a new nextMarker",
        ),
    ] {
        node_create_fails(
            |c| c.world().security_groups_answer = Some(garbled.into()),
            why,
            false,
        )
        .await;
    }
}

/// An instance without groups is asked again at the next create, not
/// remembered as having none.
#[tokio::test]
async fn a_group_bound_after_a_refusal_is_found_at_the_next_create() {
    let cloud = FakeCloud::start().await;
    cloud
        .world()
        .instance_groups
        .insert(INSTANCE.into(), vec![]);
    let mut cfg = config(&cloud);
    cfg.security_group_ids.clear();
    let backend = BceBackend::discover(&cfg).await.unwrap();
    let err = backend.create_and_attach().await.unwrap_err();
    assert!(matches!(err, ProviderError::Config(_)), "{err:?}");
    cloud
        .world()
        .instance_groups
        .insert(INSTANCE.into(), groups(&["g-late"]));
    let eni = backend.create_and_attach().await.unwrap();
    assert_eq!(cloud.world().enis[&eni.id].security_group_ids, ["g-late"]);
}

#[tokio::test]
async fn the_fleet_gives_each_instances_enis_its_own_groups() {
    let (cloud, fleet) = fleet::start().await;
    {
        let mut w = cloud.world();
        w.instance_groups
            .insert(INSTANCE.into(), groups(&["g-a", "g-b", "g-c"]));
        w.instance_groups
            .insert(OTHER_NODE.into(), groups(&["g-x"]));
    }
    let unconfigured = |instance: &str, token: &str| {
        let mut req = fleet::request(instance, token, 0);
        req.security_groups.clear();
        req
    };
    let a1 = fleet.create(&unconfigured(INSTANCE, "t-1")).await.unwrap();
    let a2 = fleet.create(&unconfigured(INSTANCE, "t-2")).await.unwrap();
    let b1 = fleet
        .create(&unconfigured(OTHER_NODE, "t-3"))
        .await
        .unwrap();
    {
        let w = cloud.world();
        assert_eq!(w.enis[&a1.id].security_group_ids, ["g-a", "g-b", "g-c"]);
        assert_eq!(w.enis[&a2.id].security_group_ids, ["g-a", "g-b", "g-c"]);
        assert_eq!(w.enis[&b1.id].security_group_ids, ["g-x"]);
    }
    // Each instance listed once: two pages (list_page_size 2), then one.
    let pages = listings(&cloud);
    let of = |i: &str| {
        let i = format!("instanceId={i}");
        pages.iter().filter(|l| l.query.contains(&i)).count()
    };
    assert_eq!((of(INSTANCE), of(OTHER_NODE)), (2, 1), "{pages:?}");
    assert!(pages
        .iter()
        .all(|l| l.query.contains(&format!("vpcId={VPC}"))));
}

#[tokio::test]
async fn the_fleet_creates_nothing_without_the_instances_groups() {
    let (cloud, fleet) = fleet::start().await;
    cloud
        .world()
        .instance_groups
        .insert(OTHER_NODE.into(), vec![]);
    let unconfigured = |instance: &str, token: &str| {
        let mut req = fleet::request(instance, token, 0);
        req.security_groups.clear();
        req
    };
    let expect_refused = |err: ProviderError, instance: &str, why: &str| {
        let msg = err.to_string();
        assert!(msg.contains(instance) && msg.contains(why), "{msg}");
        assert_eq!(creates(&cloud), 0, "nothing created: {msg}");
    };
    let err = fleet
        .create(&unconfigured(OTHER_NODE, "t-1"))
        .await
        .unwrap_err();
    assert!(matches!(err, ProviderError::Config(_)), "{err:?}");
    expect_refused(err, OTHER_NODE, "BCE lists none bound to the instance");

    let err = fleet
        .create(&unconfigured("i-Unknown1", "t-2"))
        .await
        .unwrap_err();
    expect_refused(err, "i-Unknown1", "NoSuchInstance");

    cloud.world().security_groups_answer = Some("<html>gateway</html>".into());
    let err = fleet
        .create(&unconfigured(INSTANCE, "t-3"))
        .await
        .unwrap_err();
    expect_refused(err, INSTANCE, "unexpected answer");
    cloud.world().security_groups_answer = None;

    // The default group bound at start is what the instance then gets.
    let made = fleet.create(&unconfigured(INSTANCE, "t-4")).await.unwrap();
    assert_eq!(
        cloud.world().enis[&made.id].security_group_ids,
        [INSTANCE_GROUP]
    );
}
