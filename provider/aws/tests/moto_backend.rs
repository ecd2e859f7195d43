//! The AWS backend against moto (EC2 and IAM, signatures checked), a fake
//! IMDSv2 and a fault-injecting proxy, all on loopback.

use enim_testkit::cloud::{both_list_then_reap, minutes_ago, two_passes_at_once, Leaks};
use enim_testkit::moto as rig;

use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant, SystemTime};

use aws_credential_types::Credentials;
use enim_core::{AddressCount, ProviderError};
use enim_provider::cloud::{
    parse_created_at, CloudBackend, Reaped, TaggedEni, TAG_CLUSTER, TAG_CREATED_AT,
};
use enim_provider_aws::{AwsBackend, AwsConfig, TAG_MANAGED, TAG_NODE};
use enim_provider_pool::reap_pass;
use rig::{CardKey, Env, INSTANCE_ENI_LIMIT, REGION};

async fn backend(env: &Env, config: &AwsConfig) -> AwsBackend {
    AwsBackend::discover_with(config, Some(env.node.clone()))
        .await
        .expect("discover")
}

/// The rig and a backend on its default config; `None` (the test is
/// skipped) where moto is not installed.
async fn rig() -> Option<(Env, AwsBackend)> {
    rig_with(|c| c).await
}

/// As [`rig`], with the backend's config changed by `change`.
async fn rig_with(change: impl FnOnce(AwsConfig) -> AwsConfig) -> Option<(Env, AwsBackend)> {
    let env = Env::start().await?;
    let b = backend(&env, &change(env.config())).await;
    Some((env, b))
}

/// The ids of the ENIs the backend sees attached, sorted.
async fn attached_ids(b: &AwsBackend) -> Vec<String> {
    let attached = b.attached().await.unwrap();
    let mut ids: Vec<String> = attached.into_iter().map(|e| e.id).collect();
    ids.sort();
    ids
}

/// Detaches and deletes `eni_id`, then checks no ENI tagged for the node is
/// left.
async fn delete_and_check_none_left(env: &Env, b: &AwsBackend, eni_id: &str) {
    b.detach_and_delete(eni_id).await.unwrap();
    assert!(env.tagged_ids().await.is_empty());
}

#[tokio::test]
async fn discovery_create_attach_detach_delete() {
    let Some((env, b)) = rig_with(|c| AwsConfig {
        assign_ipv6: true,
        mtu: Some(9001),
        ..c
    })
    .await
    else {
        return;
    };

    // Discovery through IMDS.
    assert_eq!(b.instance_id(), env.instance_id);
    assert_eq!(b.region(), REGION);
    assert_eq!(b.instance_type(), rig::INSTANCE_TYPE);
    assert_eq!(
        b.subnet_id(),
        env.subnet_id,
        "default subnet: the primary's"
    );
    assert_eq!(b.name(), "aws");
    assert_eq!(b.eni_limit().await.unwrap(), INSTANCE_ENI_LIMIT);
    // Only the primary is attached, and it is never listed.
    assert_eq!(b.attached().await.unwrap(), vec![]);
    assert_eq!(b.tagged().await.unwrap(), vec![]);

    let first = b.create_and_attach().await.expect("create_and_attach");
    let moto_first = env.eni(&first.id).await;
    assert_eq!(first.mac.to_string(), moto_first.mac_address);
    assert_eq!(
        first.ipv4.addr().to_string(),
        moto_first.private_ip_address.clone().unwrap()
    );
    assert_eq!(first.ipv4.prefix_len(), 24);
    assert!(env.subnet_v4.contains(&first.ipv4.addr()));
    assert_eq!(first.gateway4, Ipv4Addr::new(10, 0, 1, 1));
    let v6 = first.ipv6.expect("assign_ipv6 gives an IPv6 address");
    assert_eq!(v6.prefix_len(), 64);
    assert!(env.subnet_v6.contains(&v6.addr()));
    assert_eq!(
        first.gateway6,
        Some(std::net::Ipv6Addr::from(
            u128::from(env.subnet_v6.network()) + 1
        ))
    );
    assert_eq!(first.mtu, Some(9001));
    assert_eq!(first.owner, None);
    // Tagged as enim's, for this node, at the lowest free device index.
    assert_eq!(moto_first.tag("enim.io/managed"), Some("true"));
    assert_eq!(
        moto_first.tag("enim.io/node"),
        Some(env.instance_id.as_str())
    );
    assert_eq!(env.attached().await.get(&first.id), Some(&1));

    let second = b.create_and_attach().await.unwrap();
    assert_eq!(env.attached().await.get(&second.id), Some(&2));
    assert_ne!(first.mac, second.mac);

    let mut both = vec![first.id.clone(), second.id.clone()];
    both.sort();
    assert_eq!(attached_ids(&b).await, both);
    let mut tagged = b.tagged().await.unwrap();
    tagged.sort_by(|a, b| a.id.cmp(&b.id));
    let mut want = vec![
        TaggedEni {
            id: first.id.clone(),
            attached: true,
        },
        TaggedEni {
            id: second.id.clone(),
            attached: true,
        },
    ];
    want.sort_by(|a, b| a.id.cmp(&b.id));
    assert_eq!(tagged, want);

    // Detach and delete the first: gone from EC2 and from metadata.
    b.detach_and_delete(&first.id).await.unwrap();
    assert_eq!(env.tagged_ids().await, HashSet::from([second.id.clone()]));
    assert_eq!(attached_ids(&b).await, vec![second.id.clone()]);
    // Idempotent: a gone ENI is fine.
    b.detach_and_delete(&first.id).await.unwrap();

    // The freed device index 1 is reused.
    let third = b.create_and_attach().await.unwrap();
    assert_eq!(env.attached().await.get(&third.id), Some(&1));

    // Never the primary, nor anything enim did not create.
    let e = b.detach_and_delete(&env.primary_eni).await.unwrap_err();
    assert!(matches!(e, ProviderError::Config(_)), "{e:?}");
    assert!(e.to_string().contains("did not create"), "{e}");
    assert!(env.attached().await.contains_key(&env.primary_eni));

    // The limit (4 with the primary) is respected before creating.
    let fourth = b.create_and_attach().await.unwrap();
    assert_eq!(env.attached().await.get(&fourth.id), Some(&3));
    let creates = env.proxy.calls("CreateNetworkInterface");
    let e = b.create_and_attach().await.unwrap_err();
    assert!(e.to_string().contains("limit is 4"), "{e}");
    assert!(e.is_transient());
    assert_eq!(
        env.proxy.calls("CreateNetworkInterface"),
        creates,
        "no ENI made"
    );

    // Clean up, and nothing enim made is left.
    for id in [&second.id, &third.id, &fourth.id] {
        b.detach_and_delete(id).await.unwrap();
    }
    assert_eq!(env.tagged_ids().await, HashSet::new());
    assert_eq!(env.attached().await.len(), 1, "only the primary");
}

#[tokio::test]
async fn crash_leftover_is_found_and_attached() {
    let Some((env, b)) = rig().await else {
        return;
    };
    let left = env.create_tagged_eni().await;
    assert_eq!(
        b.tagged().await.unwrap(),
        vec![TaggedEni {
            id: left.network_interface_id.clone(),
            attached: false
        }]
    );
    let eni = b.attach_existing(&left.network_interface_id).await.unwrap();
    assert_eq!(eni.id, left.network_interface_id);
    assert_eq!(eni.mac.to_string(), left.mac_address);
    assert_eq!(eni.ipv6, None, "no IPv6 asked for");
    assert!(b.tagged().await.unwrap()[0].attached);
    // Attaching again is a no-op that still returns it.
    assert_eq!(
        b.attach_existing(&left.network_interface_id).await.unwrap(),
        eni
    );

    let e = b.attach_existing("eni-doesnotexist").await.unwrap_err();
    assert_eq!(e, ProviderError::UnknownEni("eni-doesnotexist".into()));
    delete_and_check_none_left(&env, &b, &left.network_interface_id).await;
}

#[tokio::test]
async fn imds_tokens_and_network_card_keys() {
    let Some(env) = Env::start().await else {
        return;
    };
    // The fake demands a token like IMDSv2 does.
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let r = http
        .get(format!("{}/latest/meta-data/instance-id", env.imds.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);

    let b = backend(&env, &env.config()).await;
    let eni = b.create_and_attach().await.unwrap();
    for key in [CardKey::NetworkCard, CardKey::LegacyIndex, CardKey::Missing] {
        env.imds.set_card_key(key);
        let listed = b.attached().await.unwrap();
        assert_eq!(listed.len(), 1, "{key:?}: the primary stays out");
        assert_eq!(listed[0].id, eni.id);
    }
    // An expired token is replaced once, transparently.
    let before = env.imds.unauthorized();
    env.imds.expire_tokens();
    assert_eq!(b.attached().await.unwrap().len(), 1);
    assert_eq!(env.imds.unauthorized(), before + 1);
    b.detach_and_delete(&eni.id).await.unwrap();
}

#[tokio::test]
async fn wrong_secret_is_a_clear_auth_error() {
    let Some(env) = Env::start().await else {
        return;
    };
    let bad_secret = Credentials::new(
        env.node.access_key_id(),
        "not-the-secret",
        None,
        None,
        "test",
    );
    let b = AwsBackend::discover_with(&env.config(), Some(bad_secret))
        .await
        .unwrap();
    let e = b.eni_limit().await.unwrap_err();
    assert!(matches!(e, ProviderError::Config(_)), "{e:?}");
    assert!(!e.is_transient());
    let msg = e.to_string();
    assert!(msg.contains("authentication failed (AuthFailure)"), "{msg}");
    assert!(msg.contains("secret access key"), "{msg}");
    // Permanent: asked once, not retried.
    assert_eq!(env.proxy.calls("DescribeInstanceTypes"), 1);

    let unknown = Credentials::new("AKIANOSUCHKEY0000000", "x", None, None, "test");
    let b = AwsBackend::discover_with(&env.config(), Some(unknown))
        .await
        .unwrap();
    let e = b.tagged().await.unwrap_err();
    assert!(e.to_string().contains("AuthFailure"), "{e}");
    assert!(env.tagged_ids().await.is_empty());
}

#[tokio::test]
async fn missing_permission_names_the_action() {
    let Some(env) = Env::start().await else {
        return;
    };
    // The documented actions suffice for the whole life cycle.
    let b = backend(&env, &env.config()).await;
    let eni = b
        .create_and_attach()
        .await
        .expect("documented actions suffice");
    b.detach_and_delete(&eni.id)
        .await
        .expect("documented actions suffice");

    // Without ec2:AttachNetworkInterface the error names it.
    let actions: Vec<&str> = enim_provider_aws::REQUIRED_IAM_ACTIONS
        .iter()
        .copied()
        .filter(|a| *a != "ec2:AttachNetworkInterface")
        .collect();
    let limited = env.iam_user("enim-limited", &actions).await;
    let b = AwsBackend::discover_with(&env.config(), Some(limited))
        .await
        .unwrap();
    let e = b.create_and_attach().await.unwrap_err();
    assert!(matches!(e, ProviderError::Config(_)), "{e:?}");
    assert!(e.to_string().contains("ec2:AttachNetworkInterface"), "{e}");
    assert!(
        env.tagged_ids().await.is_empty(),
        "the unattachable ENI was deleted"
    );
}

#[tokio::test]
async fn throttling_and_server_errors_are_retried_then_bounded() {
    let Some((env, b)) = rig().await else {
        return;
    };
    let left = env.create_tagged_eni().await;

    // A burst shorter than the attempt budget (4): invisible to the caller.
    env.proxy
        .inject("DescribeNetworkInterfaces", 2, 503, "RequestLimitExceeded");
    env.proxy.inject("DescribeNetworkInterfaces", 1, 503, "");
    let t = b.tagged().await.expect("retried through the burst");
    assert_eq!(t.len(), 1);
    assert_eq!(env.proxy.faulted("DescribeNetworkInterfaces"), 3);
    assert_eq!(env.proxy.calls("DescribeNetworkInterfaces"), 4);

    // A longer one: a transient, typed error after exactly 4 attempts.
    env.proxy
        .inject("DescribeNetworkInterfaces", 4, 400, "RequestLimitExceeded");
    let before = env.proxy.calls("DescribeNetworkInterfaces");
    let start = Instant::now();
    let e = b.tagged().await.unwrap_err();
    assert!(matches!(e, ProviderError::Throttled(_)), "{e:?}");
    assert!(e.is_transient());
    assert!(e.to_string().contains("after 4 attempts"), "{e}");
    assert_eq!(env.proxy.calls("DescribeNetworkInterfaces") - before, 4);
    // Three waits of at least half of 20, 40 and 80 ms.
    assert!(
        start.elapsed() >= Duration::from_millis(70),
        "{:?}",
        start.elapsed()
    );

    // 500 InternalError on a mutation: retried too.
    let created = env.proxy.calls("CreateNetworkInterface");
    env.proxy
        .inject("CreateNetworkInterface", 1, 500, "InternalError");
    let eni = b.create_and_attach().await.unwrap();
    assert_eq!(env.proxy.calls("CreateNetworkInterface") - created, 2);
    b.detach_and_delete(&eni.id).await.unwrap();

    // A create throttled past the attempts: the "try again later" kind,
    // and no ENI made.
    env.proxy
        .inject("CreateNetworkInterface", 4, 503, "RequestLimitExceeded");
    let e = b.create_and_attach().await.unwrap_err();
    assert!(matches!(e, ProviderError::Throttled(_)), "{e:?}");
    assert!(e.is_transient());
    delete_and_check_none_left(&env, &b, &left.network_interface_id).await;
}

#[tokio::test]
async fn a_throttled_attach_keeps_the_eni_for_the_next_create() {
    let Some((env, b)) = rig().await else {
        return;
    };
    // Throttled past the attempts (4): the "try again later" kind.
    env.proxy
        .inject("AttachNetworkInterface", 4, 503, "RequestLimitExceeded");
    let e = b.create_and_attach().await.unwrap_err();
    assert!(matches!(e, ProviderError::Throttled(_)), "{e:?}");
    // Kept, not deleted: tagged for this node, attached nowhere, so an
    // agent restarted now would find it (an orphan it deletes).
    assert_eq!(env.proxy.calls("DeleteNetworkInterface"), 0);
    let restarted = backend(&env, &env.config()).await;
    let kept = restarted.tagged().await.unwrap();
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert!(!kept[0].attached);
    // The next create attaches that one and creates none.
    let eni = b.create_and_attach().await.unwrap();
    assert_eq!(eni.id, kept[0].id);
    assert_eq!(env.proxy.calls("CreateNetworkInterface"), 1);
    assert_eq!(attached_ids(&b).await, vec![eni.id.clone()]);
    delete_and_check_none_left(&env, &b, &eni.id).await;
}

#[tokio::test]
async fn a_create_looks_at_ec2_once_and_refuses_early_by_metadata() {
    let Some((env, b)) = rig().await else {
        return;
    };
    b.eni_limit().await.unwrap();
    // Only the look before the attach (the free device index) asks EC2;
    // the check before the create reads instance metadata.
    let described = env.proxy.calls("DescribeNetworkInterfaces");
    let eni = b.create_and_attach().await.unwrap();
    assert_eq!(env.proxy.calls("DescribeNetworkInterfaces") - described, 1);
    // A full instance (by metadata) is refused before any create.
    let mut made = vec![eni.id];
    while attached_ids(&b).await.len() + 1 < INSTANCE_ENI_LIMIT {
        made.push(b.create_and_attach().await.unwrap().id);
    }
    let creates = env.proxy.calls("CreateNetworkInterface");
    let e = b.create_and_attach().await.unwrap_err();
    assert!(e.to_string().contains("its limit is"), "{e}");
    assert_eq!(env.proxy.calls("CreateNetworkInterface"), creates);
    for id in made {
        b.detach_and_delete(&id).await.unwrap();
    }
    assert!(env.tagged_ids().await.is_empty());
}

#[tokio::test]
async fn throttle_replies_pace_the_agents_calls_of_that_action() {
    let Some((env, b)) = rig().await else {
        return;
    };
    b.tagged().await.unwrap();
    // Two throttles: paced from then on (a first gap of 0.5 s, then 1 s),
    // though the retries (20 ms, 40 ms) alone would take under 0.1 s.
    env.proxy
        .inject("DescribeNetworkInterfaces", 2, 503, "RequestLimitExceeded");
    let t = Instant::now();
    b.tagged().await.unwrap();
    let first = t.elapsed();
    assert!(first >= Duration::from_millis(250), "{first:?}");
    // The next call waits for its slot too, half a gap at least.
    let t = Instant::now();
    b.tagged().await.unwrap();
    let second = t.elapsed();
    assert!(second >= Duration::from_millis(300), "{second:?}");
    assert_eq!(env.proxy.faulted("DescribeNetworkInterfaces"), 2);
}

#[tokio::test]
async fn attachment_limit_exceeded_is_typed_and_leaks_nothing() {
    let Some((env, b)) = rig().await else {
        return;
    };
    env.proxy
        .inject("AttachNetworkInterface", 1, 400, "AttachmentLimitExceeded");
    let e = b.create_and_attach().await.unwrap_err();
    assert!(e.to_string().contains("AttachmentLimitExceeded"), "{e}");
    assert!(matches!(e, ProviderError::Unavailable(_)), "{e:?}");
    // Not retried: the ENI it made was deleted again.
    assert_eq!(env.proxy.calls("AttachNetworkInterface"), 1);
    assert_eq!(env.proxy.calls("CreateNetworkInterface"), 1);
    assert_eq!(env.proxy.calls("DeleteNetworkInterface"), 1);
    assert!(env.tagged_ids().await.is_empty());
    // And the next try works.
    let eni = b.create_and_attach().await.unwrap();
    b.detach_and_delete(&eni.id).await.unwrap();
}

#[tokio::test]
async fn metadata_lag_is_waited_out_within_a_bound() {
    let Some((env, b)) = rig().await else {
        return;
    };
    env.imds.hide_new_interfaces_for(5);
    let eni = b.create_and_attach().await.expect("waits for metadata");
    assert!(env.imds.hidden_hits() >= 5, "{}", env.imds.hidden_hits());
    assert_eq!(b.attached().await.unwrap()[0].id, eni.id);
    b.detach_and_delete(&eni.id).await.unwrap();

    // Metadata that never catches up: bounded, and the ENI is taken back.
    env.imds.hide_new_interfaces_for(usize::MAX);
    let config = AwsConfig {
        metadata_wait: Duration::from_millis(600),
        ..env.config()
    };
    let b = backend(&env, &config).await;
    let start = Instant::now();
    let e = b.create_and_attach().await.unwrap_err();
    assert!(e.is_transient(), "{e:?}");
    assert!(e.to_string().contains("not visible after"), "{e}");
    assert!(start.elapsed() < Duration::from_secs(5));
    assert!(env.tagged_ids().await.is_empty(), "no ENI left behind");
    assert_eq!(env.attached().await.len(), 1);
}

#[tokio::test]
async fn instance_role_credentials_from_imds() {
    let Some(env) = Env::start().await else {
        return;
    };
    if std::env::var_os("AWS_ACCESS_KEY_ID").is_some() {
        eprintln!("SKIPPED: AWS_ACCESS_KEY_ID is set, the environment would win over the role");
        return;
    }
    // No role yet: a clear error at discovery.
    let e = AwsBackend::discover(&env.config()).await.err().unwrap();
    assert!(e.to_string().contains("no AWS credentials"), "{e}");

    env.imds.set_role("enim-node-role", env.node.clone());
    let b = AwsBackend::discover(&env.config()).await.unwrap();
    assert_eq!(b.eni_limit().await.unwrap(), INSTANCE_ENI_LIMIT);
}

/// Discovery with `config` fails before any call, naming `setting`.
async fn assert_config_error(config: &AwsConfig, setting: &str) {
    let e = AwsBackend::discover_with(config, None).await.err().unwrap();
    assert!(e.to_string().contains(setting), "{e}");
}

#[tokio::test]
async fn config_errors_are_reported_before_any_call() {
    let mut config = AwsConfig::default();
    config.api.max_attempts = 0;
    assert_config_error(&config, "api.max_attempts").await;
    let mut config = AwsConfig::default();
    config.api.endpoint = Some("not a url".into());
    assert_config_error(&config, "api.endpoint").await;
}

// ---- the fleet-wide reaper ----

const CLUSTER: &str = "c1";

fn in_cluster(env: &Env) -> AwsConfig {
    AwsConfig {
        cluster: Some(CLUSTER.into()),
        ..env.config()
    }
}

/// An unattached ENI tagged as any node of `cluster` would tag it.
async fn leaked(env: &Env, cluster: &str, created_at: Option<&str>) -> String {
    let mut tags = vec![
        (TAG_MANAGED, "true"),
        (TAG_NODE, "i-0someothernode"),
        (TAG_CLUSTER, cluster),
    ];
    if let Some(t) = created_at {
        tags.push((TAG_CREATED_AT, t));
    }
    env.create_eni_with_tags(&tags).await.network_interface_id
}

#[tokio::test]
async fn new_enis_carry_the_cluster_and_creation_tags() {
    let Some(env) = Env::start().await else {
        return;
    };
    let b = backend(&env, &in_cluster(&env)).await;
    assert_eq!(b.reap_cluster(), Some(CLUSTER));
    let before = SystemTime::now() - Duration::from_secs(1);
    let eni = b.create_and_attach().await.unwrap();
    let moto = env.eni(&eni.id).await;
    assert_eq!(moto.tag(TAG_CLUSTER), Some(CLUSTER));
    assert_eq!(moto.tag("enim.io/managed"), Some("true"));
    assert_eq!(moto.tag("enim.io/node"), Some(env.instance_id.as_str()));
    let created = parse_created_at(moto.tag(TAG_CREATED_AT).unwrap()).unwrap();
    assert!(
        created >= before && created <= SystemTime::now(),
        "{created:?}"
    );
    // Attached: never a reaper's candidate.
    assert!(b.unattached_in_cluster().await.unwrap().is_empty());
    b.detach_and_delete(&eni.id).await.unwrap();

    // Without a cluster: no cluster tag, reaper off, nothing listed.
    let b = backend(&env, &env.config()).await;
    assert_eq!(b.reap_cluster(), None);
    let eni = b.create_and_attach().await.unwrap();
    let moto = env.eni(&eni.id).await;
    assert_eq!(moto.tag(TAG_CLUSTER), None);
    assert!(moto.tag(TAG_CREATED_AT).is_some());
    leaked(&env, CLUSTER, Some(&minutes_ago(60))).await;
    assert!(b.unattached_in_cluster().await.unwrap().is_empty());
    b.detach_and_delete(&eni.id).await.unwrap();
}

#[tokio::test]
async fn reaper_deletes_only_old_unattached_enis_of_this_cluster() {
    let Some(env) = Env::start().await else {
        return;
    };
    let leaks = {
        let env = &env;
        Leaks::make(CLUSTER, move |cluster, created_at| async move {
            leaked(env, &cluster, created_at.as_deref()).await
        })
        .await
    };
    let untagged = env.create_eni_with_tags(&[]).await.network_interface_id;
    // The cluster's tag but not enim's: someone else's.
    let not_enims = env
        .create_eni_with_tags(&[(TAG_CLUSTER, CLUSTER), (TAG_CREATED_AT, &leaks.old)])
        .await
        .network_interface_id;
    let attached = leaked(&env, CLUSTER, Some(&leaks.old)).await;
    env.attach_as_admin(&attached, 2).await;

    let b = backend(&env, &in_cluster(&env)).await;
    let r = reap_pass(&b, Duration::from_secs(600), || false)
        .await
        .unwrap();
    leaks.assert_pass(r);

    let left: HashSet<String> = env
        .all_enis()
        .await
        .into_iter()
        .map(|e| e.network_interface_id)
        .collect();
    for kept in leaks
        .kept()
        .into_iter()
        .chain([&untagged, &not_enims, &attached, &env.primary_eni])
    {
        assert!(left.contains(kept), "{kept} was deleted");
    }
    assert!(!left.contains(&leaks.old_a) && !left.contains(&leaks.old_b));
    assert_eq!(env.proxy.calls("DeleteNetworkInterface"), 2);

    // Asked directly, the backend still refuses what the pass skipped.
    leaks
        .assert_refused(
            &b,
            &not_enims,
            &attached,
            ["no longer tagged", "now in-use"],
        )
        .await;
    assert_eq!(env.proxy.calls("DeleteNetworkInterface"), 2);
}

#[tokio::test]
async fn two_reapers_racing_on_the_same_enis_both_succeed() {
    let Some(env) = Env::start().await else {
        return;
    };
    let old = minutes_ago(30);
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(leaked(&env, CLUSTER, Some(&old)).await);
    }
    let a = backend(&env, &in_cluster(&env)).await;
    let b = backend(&env, &in_cluster(&env)).await;
    // Both list before either deletes.
    both_list_then_reap(&a, &b, 3).await;
    // The delete itself losing the race (NotFound) counts as success too.
    let last = leaked(&env, CLUSTER, Some(&old)).await;
    env.proxy.inject(
        "DeleteNetworkInterface",
        1,
        400,
        "InvalidNetworkInterfaceID.NotFound",
    );
    assert_eq!(b.reap(&last).await.unwrap(), Reaped::Gone);

    // Two whole passes at once: both succeed, each ENI deleted once.
    let mut ids = HashSet::from([last]);
    for _ in 0..3 {
        ids.insert(leaked(&env, CLUSTER, Some(&old)).await);
    }
    let deletes = env.proxy.calls("DeleteNetworkInterface");
    two_passes_at_once(&a, &b, Duration::from_secs(600), &ids).await;
    assert!(env.proxy.calls("DeleteNetworkInterface") - deletes >= ids.len());
    assert!(env
        .all_enis()
        .await
        .iter()
        .all(|e| !ids.contains(&e.network_interface_id)));
}

/// Secondary mode's verbs on moto: the instance type's address limits,
/// IPv4 and IPv6 addresses assigned and shown by metadata, unassigned
/// (twice: the second is no error), and refused on an ENI that is not a
/// secondary interface of this instance.
#[tokio::test]
async fn secondary_addresses_assign_unassign_and_limits() {
    let Some((env, b)) = rig_with(|c| AwsConfig {
        assign_ipv6: true,
        ..c
    })
    .await
    else {
        return;
    };
    let limits = b.address_limits().await.unwrap();
    // m5.xlarge: 4 interfaces of 15 IPv4 and 15 IPv6 addresses each.
    assert_eq!(limits.enis, INSTANCE_ENI_LIMIT);
    assert_eq!((limits.ipv4_per_eni, limits.ipv6_per_eni), (15, 15));

    let eni = b.create_and_attach().await.unwrap();
    assert_eq!(eni.device_index, Some(1));
    assert!(eni.secondary_ips.is_empty(), "{:?}", eni.secondary_ips);
    let new = b
        .assign(&eni.id, AddressCount { ipv4: 3, ipv6: 2 })
        .await
        .unwrap();
    let (v4, v6): (Vec<_>, Vec<_>) = new.iter().partition(|ip| ip.is_ipv4());
    assert_eq!((v4.len(), v6.len()), (3, 2), "{new:?}");
    for ip in &v4 {
        assert!(
            ipnet::Ipv4Net::new(eni.ipv4.network(), eni.ipv4.prefix_len())
                .unwrap()
                .contains(&match ip {
                    std::net::IpAddr::V4(a) => *a,
                    _ => unreachable!(),
                }),
            "{ip} outside {}",
            eni.ipv4
        );
        assert_ne!(*ip, std::net::IpAddr::V4(eni.ipv4.addr()));
    }
    // Metadata shows them too: what a restarted agent rebuilds from.
    let shown = b.attached().await.unwrap();
    let mut seen = shown[0].secondary_ips.clone();
    seen.sort();
    let mut want = new.clone();
    want.sort();
    assert_eq!(seen, want);

    b.unassign(&eni.id, &new[..2]).await.unwrap();
    b.unassign(&eni.id, &new[..2]).await.unwrap();
    let moto = env.eni(&eni.id).await;
    // EC2 lists the ENI's own IPv6 address among them; metadata's view
    // (what the pool serves) does not.
    let own6 = eni.ipv6.map(|n| std::net::IpAddr::V6(n.addr()));
    let mut left: Vec<_> = moto
        .secondary_ips()
        .into_iter()
        .filter(|ip| Some(*ip) != own6)
        .collect();
    left.sort();
    let mut want: Vec<_> = new[2..].to_vec();
    want.sort();
    assert_eq!(left, want);

    // Never on the primary interface or someone else's ENI.
    let primary = env
        .all_enis()
        .await
        .into_iter()
        .find(|e| {
            e.attachment
                .as_ref()
                .is_some_and(|a| a.device_index == Some(0))
        })
        .unwrap();
    let e = b
        .assign(&primary.network_interface_id, AddressCount::v4(1))
        .await
        .unwrap_err();
    assert!(matches!(e, ProviderError::Config(_)), "{e:?}");
    let loose = env.create_eni_with_tags(&[]).await;
    let e = b
        .assign(&loose.network_interface_id, AddressCount::v4(1))
        .await
        .unwrap_err();
    assert!(matches!(e, ProviderError::Config(_)), "{e:?}");
    assert_eq!(
        b.assign("eni-0000000000000dead", AddressCount::v4(1)).await,
        Err(ProviderError::UnknownEni("eni-0000000000000dead".into()))
    );
    delete_and_check_none_left(&env, &b, &eni.id).await;
}

/// With no `security_group_ids`, a node's ENIs take its primary
/// interface's groups (read from instance metadata at discovery); with
/// them, exactly those.
#[tokio::test]
async fn an_eni_without_configured_groups_takes_the_primary_interfaces() {
    let Some(env) = Env::start().await else {
        return;
    };
    let node_sg = env.create_security_group("enim-node-sg").await;
    let pods_sg = env.create_security_group("enim-pods-sg").await;
    env.set_primary_groups(&[&node_sg]).await;

    let b = backend(&env, &env.config()).await;
    let eni = b.create_and_attach().await.expect("create_and_attach");
    assert_eq!(env.eni(&eni.id).await.group_ids(), [node_sg.as_str()]);
    delete_and_check_none_left(&env, &b, &eni.id).await;

    let configured = AwsConfig {
        security_group_ids: vec![pods_sg.clone()],
        ..env.config()
    };
    let b = backend(&env, &configured).await;
    let eni = b.create_and_attach().await.expect("create_and_attach");
    assert_eq!(env.eni(&eni.id).await.group_ids(), [pods_sg.as_str()]);
    delete_and_check_none_left(&env, &b, &eni.id).await;
}
