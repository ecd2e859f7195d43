//! The AWS backend against moto (EC2 and IAM, signatures checked), a fake
//! IMDSv2 and a fault-injecting proxy, all on loopback.

use enim_testkit::moto as rig;

use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use aws_credential_types::Credentials;
use enim_provider::cloud::{CloudBackend, TaggedEni};
use enim_provider::ProviderError;
use enim_provider_aws::{AwsBackend, AwsConfig};
use rig::{CardKey, Env, INSTANCE_ENI_LIMIT, REGION};

async fn backend(env: &Env, config: &AwsConfig) -> AwsBackend {
    AwsBackend::discover_with(config, Some(env.node.clone()))
        .await
        .expect("discover")
}

/// The rig and a backend on its default config; `None` (the test is
/// skipped) where moto is not installed.
async fn rig() -> Option<(Env, AwsBackend)> {
    let env = Env::start().await?;
    let b = backend(&env, &env.config()).await;
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
    let Some(env) = Env::start().await else {
        return;
    };
    let config = AwsConfig {
        assign_ipv6: true,
        mtu: Some(9001),
        ..env.config()
    };
    let b = backend(&env, &config).await;

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
    let moto_first = env
        .all_enis()
        .await
        .into_iter()
        .find(|e| e.network_interface_id == first.id)
        .expect("ENI in moto");
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
    delete_and_check_none_left(&env, &b, &left.network_interface_id).await;
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
    let config = AwsConfig {
        api_attempts: 0,
        ..AwsConfig::default()
    };
    assert_config_error(&config, "api_attempts").await;
    let config = AwsConfig {
        ec2_endpoint: Some("not a url".into()),
        ..AwsConfig::default()
    };
    assert_config_error(&config, "ec2_endpoint").await;
}
