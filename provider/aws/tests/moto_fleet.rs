//! The operator's AWS backend ([`AwsFleet`]) against moto (signatures and
//! IAM checked) behind the fault proxy, with no instance metadata at all.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use enim_core::{AddressCount, ProviderError};
use enim_provider::cloud::{CreatedAt, Reaped, TAG_CLUSTER, TAG_CREATED_AT};
use enim_provider::fleet::{
    CreateEni, DeleteCheck, FleetAttachment, FleetCloud, FleetEni, Slot, TAG_INTENT,
};
use enim_provider_aws::{
    fleet_iam_actions, AwsCredentialsConfig, AwsFleet, AwsFleetConfig, TAG_MANAGED, TAG_NODE,
};
use enim_testkit::moto::{self as rig, Env, INSTANCE_ENI_LIMIT, INSTANCE_TYPE, REGION};

const CLUSTER: &str = "prod";

fn config(env: &Env) -> AwsFleetConfig {
    AwsFleetConfig {
        region: REGION.into(),
        cluster: CLUSTER.into(),
        detach_timeout: Duration::from_secs(10),
        api: env.api(),
        ..AwsFleetConfig::default()
    }
}

/// The rig and a fleet backend whose credentials (static, in its config)
/// allow exactly [`fleet_iam_actions`]; `None` (skipped) without moto, a
/// failure under CI=true.
async fn rig_with(change: impl FnOnce(&mut AwsFleetConfig)) -> Option<(Env, AwsFleet)> {
    let env = Env::start().await?;
    let creds = env.iam_user("enim-operator", &fleet_iam_actions()).await;
    let mut c = config(&env);
    c.credentials = AwsCredentialsConfig::Static {
        access_key_id: creds.access_key_id().into(),
        secret_access_key: creds.secret_access_key().into(),
        session_token: None,
    };
    change(&mut c);
    let fleet = AwsFleet::connect(&c).await.expect("connect");
    Some((env, fleet))
}

async fn rig() -> Option<(Env, AwsFleet)> {
    rig_with(|_| {}).await
}

/// A create whose token may have been sent before (looked up first).
fn request(env: &Env, token: &str, secondary_ipv4: usize) -> CreateEni {
    CreateEni {
        instance: env.instance_id.clone(),
        subnet: env.subnet_id.clone(),
        security_groups: vec![],
        client_token: token.into(),
        secondary_ipv4,
        fresh: false,
    }
}

/// A create whose token was never sent.
fn fresh(env: &Env, token: &str, secondary_ipv4: usize) -> CreateEni {
    CreateEni {
        fresh: true,
        ..request(env, token, secondary_ipv4)
    }
}

const DESCRIBE: &str = "DescribeNetworkInterfaces";

async fn listed(fleet: &AwsFleet) -> Vec<FleetEni> {
    let mut enis = fleet.list_cluster_enis().await.expect("list");
    enis.sort_by(|a, b| a.id.cmp(&b.id));
    enis
}

async fn listed_one(fleet: &AwsFleet, id: &str) -> FleetEni {
    listed(fleet)
        .await
        .into_iter()
        .find(|e| e.id == id)
        .unwrap_or_else(|| panic!("{id} not listed"))
}

#[tokio::test]
async fn the_listing_is_this_clusters_enis_only_addressed_in_their_subnet() {
    let Some((env, fleet)) = rig().await else {
        return;
    };
    assert_eq!(fleet.name(), "aws");
    assert!(listed(&fleet).await.is_empty());

    let at = "2024-05-01T10:00:00Z";
    let ours = env
        .create_eni_with_tags(&[
            (TAG_MANAGED, "true"),
            (TAG_CLUSTER, CLUSTER),
            (TAG_NODE, &env.instance_id),
            (TAG_CREATED_AT, at),
            (TAG_INTENT, "intent-a"),
        ])
        .await;
    let untagged_age = env
        .create_eni_with_tags(&[(TAG_MANAGED, "true"), (TAG_CLUSTER, CLUSTER)])
        .await;
    // Another cluster's, a hand-made one with the cluster tag only, and an
    // untagged one: none of them is this cluster's.
    env.create_eni_with_tags(&[(TAG_MANAGED, "true"), (TAG_CLUSTER, "staging")])
        .await;
    env.create_eni_with_tags(&[(TAG_CLUSTER, CLUSTER)]).await;
    env.create_eni_with_tags(&[]).await;

    let enis = listed(&fleet).await;
    let ids: Vec<&str> = enis.iter().map(|e| e.id.as_str()).collect();
    let mut want = vec![
        ours.network_interface_id.as_str(),
        untagged_age.network_interface_id.as_str(),
    ];
    want.sort_unstable();
    assert_eq!(ids, want);

    let e = listed_one(&fleet, &ours.network_interface_id).await;
    assert_eq!(e.mac.to_string(), ours.mac_address);
    assert_eq!(
        Some(e.ipv4.addr().to_string()),
        ours.private_ip_address.clone()
    );
    assert_eq!(e.ipv4.prefix_len(), 24, "the subnet's prefix");
    assert_eq!(
        e.gateway4,
        Ipv4Addr::new(10, 0, 1, 1),
        "the subnet's first host"
    );
    assert_eq!(e.subnet, env.subnet_id);
    assert_eq!(e.node.as_deref(), Some(env.instance_id.as_str()));
    assert_eq!(e.intent.as_deref(), Some("intent-a"));
    assert_eq!(
        e.created_at,
        CreatedAt::At(humantime::parse_rfc3339(at).unwrap())
    );
    assert_eq!(e.attachment, None);
    assert!(e.secondary_ips.is_empty());
    let other = listed_one(&fleet, &untagged_age.network_interface_id).await;
    assert_eq!((other.node, other.created_at), (None, CreatedAt::Missing));

    // Attached by someone else: the listing shows where.
    env.attach_as_admin(&ours.network_interface_id, 2).await;
    let att = listed_one(&fleet, &ours.network_interface_id)
        .await
        .attachment
        .expect("attached");
    assert_eq!(
        (att.instance.as_str(), att.device_index, att.state.as_str()),
        (env.instance_id.as_str(), 2, "attached")
    );
    assert!(att.attachment_id.starts_with("eni-attach-"), "{att:?}");

    // The subnet was asked about once, however often the listing ran.
    assert_eq!(env.proxy.calls("DescribeSubnets"), 1);
}

#[tokio::test]
async fn create_is_idempotent_by_client_token_and_tags_the_intent() {
    let Some((env, fleet)) = rig_with(|c| c.assign_ipv6 = true).await else {
        return;
    };
    // Groups given, as an operator pool's are: no look-up of the primary
    // interface's groups either (that default has its own test).
    let sg = env.create_security_group("enim-intent").await;
    let with_group = |r: CreateEni| CreateEni {
        security_groups: vec![sg.clone()],
        ..r
    };
    // A fresh intent: created with no look-up by its tag first.
    let first = fleet
        .create(&with_group(fresh(&env, "intent-1", 2)))
        .await
        .unwrap();
    assert_eq!(
        env.proxy.calls(DESCRIBE),
        0,
        "no look before a fresh create"
    );
    assert_eq!(env.proxy.calls("CreateNetworkInterface"), 1);
    // The same intent again (a retry, a successor): looked up, found.
    let again = fleet
        .create(&with_group(request(&env, "intent-1", 2)))
        .await
        .unwrap();
    assert_eq!(again.id, first.id, "the same intent, the same ENI");
    assert_eq!(again, first);
    assert_eq!(env.proxy.calls(DESCRIBE), 1, "the look-up by intent");
    assert_eq!(env.proxy.calls("CreateNetworkInterface"), 1);

    let in_moto: Vec<_> = env
        .all_enis()
        .await
        .into_iter()
        .filter(|e| e.tag(TAG_INTENT) == Some("intent-1"))
        .collect();
    assert_eq!(in_moto.len(), 1, "one ENI for the intent in moto");
    let m = &in_moto[0];
    assert_eq!(m.network_interface_id, first.id);
    for (k, v) in [
        (TAG_MANAGED, "true"),
        (TAG_CLUSTER, CLUSTER),
        (TAG_NODE, env.instance_id.as_str()),
    ] {
        assert_eq!(m.tag(k), Some(v), "{k}");
    }
    assert!(matches!(
        CreatedAt::from_tag(m.tag(TAG_CREATED_AT)),
        CreatedAt::At(_)
    ));

    // What create returned is what the listing says.
    assert_eq!(listed_one(&fleet, &first.id).await, first);
    assert_eq!(first.node.as_deref(), Some(env.instance_id.as_str()));
    assert_eq!(first.intent.as_deref(), Some("intent-1"));
    assert_eq!(first.cluster.as_deref(), Some(CLUSTER));
    assert_eq!(first.attachment, None);
    let v4: Vec<IpAddr> = first
        .secondary_ips
        .iter()
        .copied()
        .filter(IpAddr::is_ipv4)
        .collect();
    assert_eq!(v4.len(), 2, "{:?}", first.secondary_ips);
    assert!(v4.iter().all(|ip| match ip {
        IpAddr::V4(a) => env.subnet_v4.contains(a) && *a != first.ipv4.addr(),
        IpAddr::V6(_) => false,
    }));
    let v6 = first.ipv6.expect("assign_ipv6 gives an IPv6 address");
    assert!(env.subnet_v6.contains(&v6.addr()));
    assert_eq!(v6.prefix_len(), 64);
    assert_eq!(
        first.gateway6,
        Some(std::net::Ipv6Addr::from(
            u128::from(env.subnet_v6.network()) + 1
        ))
    );

    // Another intent makes another ENI.
    let second = fleet.create(&request(&env, "intent-2", 0)).await.unwrap();
    assert_ne!(second.id, first.id);
    assert_eq!(listed(&fleet).await.len(), 2);

    // A token EC2 would refuse is refused before any call.
    let long = "x".repeat(65);
    let e = fleet.create(&request(&env, &long, 0)).await.unwrap_err();
    assert!(matches!(e, ProviderError::Config(_)), "{e}");
}

#[tokio::test]
async fn attach_detach_delete_round_trip_and_an_attached_eni_is_spared() {
    let Some((env, fleet)) = rig().await else {
        return;
    };
    let eni = fleet.create(&fresh(&env, "intent-rt", 0)).await.unwrap();

    // The create's reply shows it attached nowhere: attached with no look.
    let describes = env.proxy.calls(DESCRIBE);
    fleet
        .attach(&eni, Slot::new(&env.instance_id, 1))
        .await
        .unwrap();
    assert_eq!(env.attached().await.get(&eni.id), Some(&1));
    assert_eq!(env.proxy.calls("AttachNetworkInterface"), 1);
    assert_eq!(env.proxy.calls("ModifyNetworkInterfaceAttribute"), 1);
    assert_eq!(env.proxy.calls(DESCRIBE), describes, "no describe");
    // Listed attached there already: one look, nothing to do.
    let shown = listed_one(&fleet, &eni.id).await;
    let describes = env.proxy.calls(DESCRIBE);
    fleet
        .attach(&shown, Slot::new(&env.instance_id, 1))
        .await
        .unwrap();
    assert_eq!(env.proxy.calls("AttachNetworkInterface"), 1);
    assert_eq!(env.proxy.calls(DESCRIBE), describes + 1);
    // A retry with the create's (stale) reply: EC2 refuses an ENI in use
    // (the proxy answers as EC2 does; moto would attach it again), and
    // the one look after the refusal finds it attached there: done.
    for code in ["InvalidNetworkInterface.InUse", "InvalidParameterValue"] {
        env.proxy.inject("AttachNetworkInterface", 1, 400, code);
        let describes = env.proxy.calls(DESCRIBE);
        fleet
            .attach(&eni, Slot::new(&env.instance_id, 1))
            .await
            .unwrap();
        assert_eq!(env.proxy.calls(DESCRIBE), describes + 1, "{code}");
        assert_eq!(env.attached().await.get(&eni.id), Some(&1), "{code}");
    }
    // At another index, the refusal stands.
    env.proxy.inject(
        "AttachNetworkInterface",
        1,
        400,
        "InvalidNetworkInterface.InUse",
    );
    let e = fleet
        .attach(&eni, Slot::new(&env.instance_id, 2))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("InUse"), "{e}");
    // Attached elsewhere: refused, by the listing's look.
    let e = fleet
        .attach(&shown, Slot::new("i-0other", 1))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("attached to"), "{e}");
    // ... and by the look after EC2's refusal.
    env.proxy.inject(
        "AttachNetworkInterface",
        1,
        400,
        "InvalidNetworkInterface.InUse",
    );
    let e = fleet
        .attach(&eni, Slot::new("i-0other", 1))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("attached to"), "{e}");
    assert_eq!(env.attached().await.get(&eni.id), Some(&1));

    // Attached, so the delete's second look spares it.
    assert!(matches!(
        fleet
            .delete(&eni.id, DeleteCheck::SecondLook)
            .await
            .unwrap(),
        Reaped::Spared(_)
    ));
    assert_eq!(env.proxy.calls("DeleteNetworkInterface"), 0);
    // Without the look, EC2's refusal spares it (the proxy answers as EC2
    // does: moto deletes an ENI in use), under either code EC2 uses.
    for code in [
        "InvalidNetworkInterface.InUse",
        "InvalidNetworkInterfaceID.InUse",
    ] {
        env.proxy.inject("DeleteNetworkInterface", 1, 400, code);
        let describes = env.proxy.calls(DESCRIBE);
        let r = fleet.delete(&eni.id, DeleteCheck::Listed).await.unwrap();
        assert!(
            matches!(r, Reaped::Spared(ref why) if why.contains(code)),
            "{r:?}"
        );
        assert_eq!(env.proxy.calls(DESCRIBE), describes, "no look: {code}");
    }
    assert_eq!(env.attached().await.get(&eni.id), Some(&1), "still there");

    // The detach is only asked for, by the listed attachment: one
    // DetachNetworkInterface, no describe (no look, no polling).
    let attached = listed_one(&fleet, &eni.id).await;
    assert!(attached
        .attachment
        .as_ref()
        .is_some_and(|a| !a.attachment_id.is_empty()));
    let describes = env.proxy.calls("DescribeNetworkInterfaces");
    fleet.start_detach(&attached).await.unwrap();
    assert_eq!(env.proxy.calls("DetachNetworkInterface"), 1);
    assert_eq!(env.proxy.calls("DescribeNetworkInterfaces"), describes);
    // The next listing shows it attached nowhere (moto detaches at once).
    assert_eq!(env.eni(&eni.id).await.status, "available");
    let detached = listed_one(&fleet, &eni.id).await;
    assert_eq!(detached.attachment, None);
    // Attached nowhere: done, without a detach call.
    fleet.start_detach(&detached).await.unwrap();
    // A listing from before the detach: its attachment is over, refused
    // by EC2, which counts as done.
    fleet.start_detach(&attached).await.unwrap();
    assert_eq!(env.eni(&eni.id).await.status, "available");

    // Listed attached nowhere: deleted with no look; then gone.
    let describes = env.proxy.calls(DESCRIBE);
    let deleted = fleet.delete(&eni.id, DeleteCheck::Listed).await.unwrap();
    assert_eq!(deleted, Reaped::Deleted);
    assert_eq!(env.proxy.calls(DESCRIBE), describes, "no second look");
    let again = fleet.delete(&eni.id, DeleteCheck::Listed).await.unwrap();
    assert_eq!(again, Reaped::Gone);
    let looked = fleet.delete(&eni.id, DeleteCheck::SecondLook).await;
    assert_eq!(looked.unwrap(), Reaped::Gone);
    fleet.start_detach(&detached).await.unwrap(); // gone: done
    assert!(listed(&fleet).await.is_empty());
    assert!(env
        .all_enis()
        .await
        .iter()
        .all(|e| e.network_interface_id != eni.id));
}

#[tokio::test]
async fn other_clusters_and_primary_interfaces_are_never_touched() {
    let Some((env, fleet)) = rig().await else {
        return;
    };
    let staging = env
        .create_eni_with_tags(&[(TAG_MANAGED, "true"), (TAG_CLUSTER, "staging")])
        .await;
    let id = staging.network_interface_id.as_str();
    // As a listing would show them (attachment ids aside): looked at first.
    let ours = fleet.create(&request(&env, "intent-own", 0)).await.unwrap();
    let as_listed = |id: &str, attachment| FleetEni {
        id: id.into(),
        attachment,
        ..ours.clone()
    };
    // Seen marked for another cluster (or not at all): refused, no call.
    let staging_seen = |cluster: Option<&str>| FleetEni {
        cluster: cluster.map(String::from),
        ..as_listed(id, None)
    };
    for e in [
        fleet
            .attach(
                &staging_seen(Some("staging")),
                Slot::new(&env.instance_id, 1),
            )
            .await
            .unwrap_err(),
        fleet
            .attach(&staging_seen(None), Slot::new(&env.instance_id, 1))
            .await
            .unwrap_err(),
        fleet.start_detach(&as_listed(id, None)).await.unwrap_err(),
        fleet
            .assign(id, AddressCount::v4(1))
            .await
            .map(drop)
            .unwrap_err(),
    ] {
        assert!(
            matches!(e, ProviderError::Config(ref m) if m.contains("not this cluster's")),
            "{e}"
        );
    }
    assert_eq!(env.proxy.calls("AttachNetworkInterface"), 0);
    // A leak candidate's delete looks again: not this cluster's, spared.
    let r = fleet.delete(id, DeleteCheck::SecondLook).await.unwrap();
    assert!(matches!(r, Reaped::Spared(_)), "{r:?}");
    assert_eq!(env.proxy.calls("DeleteNetworkInterface"), 0);
    // A primary is refused, even listed with an attachment id to go by.
    let primary = env.eni(&env.primary_eni).await;
    let att = primary.attachment.as_ref().unwrap();
    let listed_primary = FleetAttachment {
        instance: env.instance_id.clone(),
        device_index: 0,
        attachment_id: att.attachment_id.clone().unwrap(),
        state: "attached".into(),
    };
    for attachment in [None, Some(listed_primary)] {
        let e = fleet
            .start_detach(&as_listed(&env.primary_eni, attachment))
            .await
            .unwrap_err();
        assert!(matches!(e, ProviderError::Config(_)), "{e}");
    }
    let attached: Vec<String> = env.attached().await.into_keys().collect();
    assert_eq!(
        attached,
        std::slice::from_ref(&env.primary_eni),
        "only the primary"
    );
    assert_eq!(env.proxy.calls("DetachNetworkInterface"), 0);
}

#[tokio::test]
async fn secondary_addresses_assign_and_unassign() {
    // Dual-stack: the ENI's own IPv6 address is told apart from those
    // assigned later (as instance metadata tells them apart on a node).
    let Some((env, fleet)) = rig_with(|c| c.assign_ipv6 = true).await else {
        return;
    };
    let eni = fleet.create(&fresh(&env, "intent-ips", 0)).await.unwrap();
    fleet
        .attach(&eni, Slot::new(&env.instance_id, 1))
        .await
        .unwrap();

    let v4 = fleet.assign(&eni.id, AddressCount::v4(2)).await.unwrap();
    assert_eq!(v4.len(), 2, "{v4:?}");
    let v6 = fleet
        .assign(&eni.id, AddressCount { ipv4: 0, ipv6: 1 })
        .await
        .unwrap();
    assert_eq!(v6.len(), 1, "{v6:?}");
    assert!(matches!(v6[0], IpAddr::V6(a) if env.subnet_v6.contains(&a)));
    let now = listed_one(&fleet, &eni.id).await;
    assert_eq!(now.ipv6, eni.ipv6, "its own IPv6 address stays its own");
    let mut have = now.secondary_ips;
    let mut want: Vec<IpAddr> = v4.iter().chain(&v6).copied().collect();
    have.sort();
    want.sort();
    assert_eq!(have, want);

    fleet.unassign(&eni.id, &[v4[0], v6[0]]).await.unwrap();
    assert_eq!(listed_one(&fleet, &eni.id).await.secondary_ips, [v4[1]]);
    // Already given back: done, and no call for it.
    let before = env.proxy.calls("UnassignPrivateIpAddresses");
    fleet.unassign(&eni.id, &[v4[0]]).await.unwrap();
    assert_eq!(env.proxy.calls("UnassignPrivateIpAddresses"), before);

    fleet
        .start_detach(&listed_one(&fleet, &eni.id).await)
        .await
        .unwrap();
    assert_eq!(listed_one(&fleet, &eni.id).await.attachment, None);
    let deleted = fleet.delete(&eni.id, DeleteCheck::Listed).await.unwrap();
    assert_eq!(deleted, Reaped::Deleted);
    // Gone: nothing to give back.
    fleet.unassign(&eni.id, &[v4[1]]).await.unwrap();
}

#[tokio::test]
async fn limits_are_asked_once_per_instance_type() {
    let Some((env, fleet)) = rig().await else {
        return;
    };
    let l = fleet.limits(INSTANCE_TYPE).await.unwrap();
    assert_eq!(l.enis, INSTANCE_ENI_LIMIT);
    assert!(l.ipv4_per_eni > 1, "{l:?}");
    assert_eq!(fleet.limits(INSTANCE_TYPE).await.unwrap(), l);
    assert_eq!(env.proxy.calls("DescribeInstanceTypes"), 1);
}

#[tokio::test]
async fn throttling_is_retried_then_reported_as_throttled() {
    let Some((env, fleet)) = rig().await else {
        return;
    };
    fleet.create(&request(&env, "intent-t", 0)).await.unwrap();
    let action = "DescribeNetworkInterfaces";

    // Fewer throttles than attempts: retried through.
    let before = env.proxy.calls(action);
    env.proxy.inject(action, 3, 400, "RequestLimitExceeded");
    assert_eq!(listed(&fleet).await.len(), 1);
    assert_eq!(env.proxy.faulted(action), 3);
    assert_eq!(env.proxy.calls(action), before + 4);

    // As many as the attempts: a transient Throttled the operator backs
    // off from.
    env.proxy.inject(action, 4, 400, "RequestLimitExceeded");
    let e = fleet.list_cluster_enis().await.unwrap_err();
    assert!(matches!(e, ProviderError::Throttled(_)), "{e}");
    assert!(e.is_transient());

    // A create is throttled alike, and a later one still makes one ENI.
    env.proxy
        .inject("CreateNetworkInterface", 4, 503, "RequestLimitExceeded");
    let e = fleet
        .create(&request(&env, "intent-u", 0))
        .await
        .unwrap_err();
    assert!(matches!(e, ProviderError::Throttled(_)), "{e}");
    fleet.create(&request(&env, "intent-u", 0)).await.unwrap();
    assert_eq!(listed(&fleet).await.len(), 2);
    rig::eventually(Duration::from_secs(1), "no stray ENI", || async {
        env.all_enis()
            .await
            .iter()
            .filter(|e| e.tag(TAG_INTENT) == Some("intent-u"))
            .count()
            == 1
    })
    .await;
}

/// With no groups configured, an ENI takes its instance's primary
/// interface's groups (as AWS VPC CNI's do), not the VPC's default group
/// EC2 gives an ENI made without any; configured groups are taken as given.
#[tokio::test]
async fn an_eni_without_configured_groups_takes_the_primary_interfaces() {
    let Some((env, fleet)) = rig().await else {
        return;
    };
    let node_sg = env.create_security_group("enim-node-sg").await;
    let other_sg = env.create_security_group("enim-pods-sg").await;
    env.set_primary_groups(&[&node_sg]).await;

    let made = fleet
        .create(&fresh(&env, "groups-default", 0))
        .await
        .unwrap();
    assert_eq!(env.eni(&made.id).await.group_ids(), [node_sg.as_str()]);

    let given = CreateEni {
        security_groups: vec![other_sg.clone()],
        ..fresh(&env, "groups-given", 0)
    };
    let made = fleet.create(&given).await.unwrap();
    assert_eq!(env.eni(&made.id).await.group_ids(), [other_sg.as_str()]);
}
