//! The ENI OpenAPI client and the backend's ENI lifecycle: discovery,
//! paging, the status machine, auth errors, retries, idempotent creates
//! and the client-side rate limits.

use std::sync::Arc;
use std::time::Duration;

use enim_core::ratelimit::RateLimit;
use enim_core::ProviderError;
use enim_provider::cloud::CloudBackend;
use enim_provider_bce::{BceBackend, MethodLimits};
use enim_testkit::bce::{FakeCloud, INSTANCE, PRIMARY_MAC, SUBNET, VPC};
use enim_testkit::cloud::assert_paced;

use crate::{api_client, config};

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
    let req = enim_provider_bce::client::CreateEni {
        name: "enim-x",
        subnet_id: SUBNET,
        security_group_ids: &[],
        private_ip_set: vec![enim_provider_bce::client::PrivateIp {
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
    let deletes = cloud.arrivals("DELETE", t0);
    assert_eq!(deletes.len(), 8);
    let reads = cloud.arrivals("GET", t0);
    assert_eq!(reads.len(), 3);
    assert_paced(&deletes, mutating, &reads);
}
