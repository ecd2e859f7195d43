//! The operator's BCE backend ([`BceFleet`]) against the fake: no instance
//! metadata, every ENI named by id and instance.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use enim_core::{AddressCount, LimitsConfig, ProviderError};
use enim_provider::cloud::{parse_created_at, CreatedAt, Reaped};
use enim_provider::fleet::{CreateEni, DeleteCheck, FleetCloud, FleetEni, Slot};
use enim_provider_bce::{BceFleet, BceFleetConfig};
use rig::{FakeCloud, AK, GATEWAY, INSTANCE, SK, SUBNET, VPC};

use super::{fast_api, rig};

const CLUSTER: &str = "prod";
pub(crate) const OTHER_NODE: &str = "i-NodeBBBB";

fn config(cloud: &FakeCloud) -> BceFleetConfig {
    BceFleetConfig {
        vpc_id: VPC.into(),
        cluster: CLUSTER.into(),
        access_key_id: Some(AK.into()),
        secret_access_key: Some(SK.into()),
        limits: BTreeMap::from([(
            "bcc.g4.c2m8".to_string(),
            LimitsConfig {
                enis: 8,
                ipv4_per_eni: 8,
                ipv6_per_eni: 0,
            },
        )]),
        poll_interval: Duration::from_millis(5),
        operation_timeout: Duration::from_secs(5),
        // Small pages: every listing takes several calls.
        list_page_size: 2,
        api: fast_api(cloud),
        ..BceFleetConfig::default()
    }
}

pub(crate) async fn start() -> (FakeCloud, BceFleet) {
    let cloud = FakeCloud::start().await;
    let fleet = BceFleet::connect(&config(&cloud)).unwrap();
    (cloud, fleet)
}

pub(crate) fn request(instance: &str, token: &str, secondary_ipv4: usize) -> CreateEni {
    CreateEni {
        instance: instance.into(),
        subnet: SUBNET.into(),
        security_groups: vec!["g-enim".into()],
        client_token: token.into(),
        secondary_ipv4,
        fresh: false,
    }
}

async fn listed(fleet: &BceFleet) -> Vec<FleetEni> {
    let mut enis = fleet.list_cluster_enis().await.unwrap();
    enis.sort_by(|a, b| a.id.cmp(&b.id));
    enis
}

async fn listed_one(fleet: &BceFleet, id: &str) -> FleetEni {
    let found = listed(fleet).await.into_iter().find(|e| e.id == id);
    found.unwrap_or_else(|| panic!("{id} not listed"))
}

#[tokio::test]
async fn the_listing_is_this_clusters_marked_enis_only() {
    let (cloud, fleet) = start().await;
    assert_eq!(fleet.name(), "bce");
    let at = "2024-05-01T10:00:00Z";
    let (ours, detached) = {
        let mut w = cloud.world();
        let ours = w.add_eni_described(
            &format!("enim-{INSTANCE}-0123456789ab"),
            &format!(
                "enim: ENI of instance {INSTANCE}; enim.io/created-at={at} \
                 enim.io/device-index=2 enim.io/cluster={CLUSTER}"
            ),
            Some(INSTANCE),
        );
        let detached = w.add_eni_described(
            &format!("enim-{OTHER_NODE}-aaaaaaaaaaaa"),
            "enim.io/cluster=prod enim.io/intent=t-1",
            None,
        );
        // Another cluster's, one not named as enim's, and an unmarked one.
        w.add_eni_described("enim-i-x-bbbbbbbbbbbb", "enim.io/cluster=staging", None);
        w.add_eni_described("by-hand", "enim.io/cluster=prod", None);
        w.add_eni("plain", VPC, None);
        (ours, detached)
    };
    let enis = listed(&fleet).await;
    let ids: Vec<&str> = enis.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(ids, [ours.as_str(), detached.as_str()]);

    let e = &enis[0];
    assert_eq!(e.ipv4.prefix_len(), 24, "the subnet's prefix");
    assert_eq!(e.gateway4, GATEWAY);
    assert_eq!(e.subnet, SUBNET);
    assert_eq!(e.node.as_deref(), Some(INSTANCE));
    assert_eq!(e.created_at, CreatedAt::At(parse_created_at(at).unwrap()));
    let att = e.attachment.as_ref().expect("attached");
    assert_eq!(
        (att.instance.as_str(), att.device_index, att.state.as_str()),
        (INSTANCE, 2, "inuse")
    );
    let d = &enis[1];
    assert_eq!(d.node.as_deref(), Some(OTHER_NODE));
    assert_eq!(d.intent.as_deref(), Some("t-1"));
    assert_eq!((&d.attachment, &d.created_at), (&None, &CreatedAt::Missing));

    // The subnet was asked about once, the listing paged.
    listed(&fleet).await;
    let w = cloud.world();
    assert_eq!(w.count("GET", "/v1/subnet/"), 1);
    assert!(w.count("GET", "/v1/eni") > 2, "paged");
}

#[tokio::test]
async fn create_is_idempotent_by_client_token_and_marks_the_intent() {
    let (cloud, fleet) = start().await;
    let first = fleet
        .create(&request(OTHER_NODE, "intent-1", 2))
        .await
        .unwrap();
    let again = fleet
        .create(&request(OTHER_NODE, "intent-1", 2))
        .await
        .unwrap();
    assert_eq!(again, first, "the same intent, the same ENI");
    {
        let w = cloud.world();
        assert_eq!(w.enis.len(), 1, "one ENI in the cloud");
        let e = &w.enis[&first.id];
        assert!(
            e.name.starts_with(&format!("enim-{OTHER_NODE}-")),
            "{}",
            e.name
        );
        assert!(
            e.description.contains("enim.io/cluster=prod"),
            "{}",
            e.description
        );
        assert!(
            e.description.contains("enim.io/intent=intent-1"),
            "{}",
            e.description
        );
        assert_eq!(e.security_group_ids, ["g-enim"]);
        assert_eq!(e.secondary_ips.len(), 2, "added once");
    }
    assert_eq!(first.node.as_deref(), Some(OTHER_NODE));
    assert_eq!(first.intent.as_deref(), Some("intent-1"));
    assert!(matches!(first.created_at, CreatedAt::At(_)));
    assert_eq!(first.attachment, None);
    assert_eq!(first.secondary_ips.len(), 2);
    assert_eq!(listed_one(&fleet, &first.id).await, first);

    let second = fleet
        .create(&request(OTHER_NODE, "intent-2", 0))
        .await
        .unwrap();
    assert_ne!(second.id, first.id);
    assert_eq!(listed(&fleet).await.len(), 2);

    let e = fleet
        .create(&request(OTHER_NODE, "two words", 0))
        .await
        .unwrap_err();
    assert!(matches!(e, ProviderError::Config(_)), "{e}");
}

/// Calls of `verb` (`attach`, `detach`) the fake has answered.
fn puts(cloud: &FakeCloud, verb: &str) -> usize {
    let w = cloud.world();
    w.log.iter().filter(|l| l.query.starts_with(verb)).count()
}

#[tokio::test]
async fn attach_records_the_device_index_then_detach_and_delete() {
    let (cloud, fleet) = start().await;
    let eni = fleet
        .create(&request(INSTANCE, "intent-rt", 0))
        .await
        .unwrap();

    // One look (for the name and description the index goes into, and the
    // first poll), then the reads the attach takes to finish.
    let reads = |c: &FakeCloud| c.world().count("GET", &format!("/v1/eni/{}", eni.id));
    let polls = cloud.world().transition_polls as usize;
    let before = reads(&cloud);
    fleet.attach(&eni, Slot::new(INSTANCE, 3)).await.unwrap();
    assert_eq!(reads(&cloud) - before, 1 + polls + 1);
    {
        let w = cloud.world();
        let e = &w.enis[&eni.id];
        assert_eq!(
            (e.status.as_str(), e.instance_id.as_str()),
            ("inuse", INSTANCE)
        );
        assert!(
            e.description.contains("enim.io/device-index=3"),
            "{}",
            e.description
        );
        assert!(e.description.contains("enim.io/intent=intent-rt"), "kept");
    }
    let att = listed_one(&fleet, &eni.id).await.attachment.unwrap();
    assert_eq!((att.instance.as_str(), att.device_index), (INSTANCE, 3));
    // Already attached there: no second attach.
    let attaches = |c: &FakeCloud| puts(c, "attach");
    let before = attaches(&cloud);
    fleet.attach(&eni, Slot::new(INSTANCE, 3)).await.unwrap();
    assert_eq!(attaches(&cloud), before);
    let e = fleet
        .attach(&eni, Slot::new(OTHER_NODE, 3))
        .await
        .unwrap_err();
    assert!(matches!(e, ProviderError::OwnedByOther { .. }), "{e}");

    // Attached, so spared: by the second look, or by BCE's refusal.
    let deletes = |c: &FakeCloud| c.world().count("DELETE", "/v1/eni/");
    let r = fleet.delete(&eni.id, DeleteCheck::SecondLook).await;
    assert!(matches!(r.unwrap(), Reaped::Spared(_)));
    assert_eq!(deletes(&cloud), 0, "the look spared it");
    let before = reads(&cloud);
    let r = fleet.delete(&eni.id, DeleteCheck::Listed).await;
    assert!(matches!(r.unwrap(), Reaped::Spared(_)));
    assert_eq!((deletes(&cloud), reads(&cloud)), (1, before), "no look");
    assert_eq!(cloud.world().enis[&eni.id].status, "inuse");
    // The detach is only asked for: one detach call, then no polling.
    let detaches = |c: &FakeCloud| puts(c, "detach");
    let attached = listed_one(&fleet, &eni.id).await;
    fleet.start_detach(&attached).await.unwrap();
    assert_eq!(detaches(&cloud), 1);
    assert_eq!(cloud.world().enis[&eni.id].status, "detaching");
    // Later listings show it detaching, then attached nowhere (the fake
    // finishes a detach after reads of the ENI: each look of a detach
    // asked again is one, and asks nothing more).
    let mut states = Vec::new();
    for _ in 0..10 {
        let now = listed_one(&fleet, &eni.id).await.attachment;
        states.push(now.as_ref().map(|a| a.state.clone()));
        if now.is_none() {
            break;
        }
        fleet.start_detach(&attached).await.unwrap();
    }
    assert_eq!(detaches(&cloud), 1, "asked once");
    assert_eq!(
        states.first(),
        Some(&Some("detaching".to_string())),
        "{states:?}"
    );
    assert_eq!(states.last(), Some(&None), "{states:?}");
    assert_eq!(cloud.world().enis[&eni.id].status, "available");
    fleet.start_detach(&attached).await.unwrap();
    assert_eq!(detaches(&cloud), 1, "attached nowhere: no call");
    let before = reads(&cloud);
    let r = fleet.delete(&eni.id, DeleteCheck::Listed).await;
    assert_eq!(r.unwrap(), Reaped::Deleted);
    assert_eq!(reads(&cloud), before, "deleted with no look");
    let r = fleet.delete(&eni.id, DeleteCheck::Listed).await;
    assert_eq!(r.unwrap(), Reaped::Gone);
    let r = fleet.delete(&eni.id, DeleteCheck::SecondLook).await;
    assert_eq!(r.unwrap(), Reaped::Gone);
    fleet.start_detach(&attached).await.unwrap();
    assert!(listed(&fleet).await.is_empty());
}

#[tokio::test]
async fn other_clusters_enis_are_never_touched() {
    let (cloud, fleet) = start().await;
    let staging =
        cloud
            .world()
            .add_eni_described("enim-i-x-bbbbbbbbbbbb", "enim.io/cluster=staging", None);
    // As a listing would show it: looked at first.
    let ours = fleet
        .create(&request(INSTANCE, "intent-own", 0))
        .await
        .unwrap();
    let seen = FleetEni {
        id: staging.clone(),
        ..ours.clone()
    };
    // Attach goes by what the listing saw: marked for staging, or not
    // marked, is refused with no call.
    let seen_as = |cluster: Option<&str>| FleetEni {
        cluster: cluster.map(String::from),
        ..seen.clone()
    };
    let calls_before = cloud.world().log.len();
    for cluster in [Some("staging"), None] {
        let e = fleet
            .attach(&seen_as(cluster), Slot::new(INSTANCE, 1))
            .await;
        let e = e.unwrap_err();
        assert!(
            matches!(&e, ProviderError::Config(m) if m.contains("not this cluster's")),
            "{e}"
        );
    }
    assert_eq!(cloud.world().log.len(), calls_before, "no call");
    for e in [
        fleet.start_detach(&seen).await.unwrap_err(),
        fleet
            .assign(&staging, AddressCount::v4(1))
            .await
            .map(drop)
            .unwrap_err(),
    ] {
        assert!(
            matches!(&e, ProviderError::Config(m) if m.contains("not this cluster's")),
            "{e}"
        );
    }
    // A leak candidate's delete looks again: not this cluster's, spared.
    let r = fleet.delete(&staging, DeleteCheck::SecondLook).await;
    assert!(matches!(r.unwrap(), Reaped::Spared(_)));
    assert_eq!(cloud.world().enis[&staging].status, "available");
}

#[tokio::test]
async fn secondary_addresses_assign_and_unassign() {
    let (cloud, fleet) = start().await;
    let eni = fleet
        .create(&request(INSTANCE, "intent-ips", 0))
        .await
        .unwrap();
    fleet.attach(&eni, Slot::new(INSTANCE, 1)).await.unwrap();
    let got = fleet.assign(&eni.id, AddressCount::v4(3)).await.unwrap();
    assert_eq!(got.len(), 3);
    assert!(got
        .iter()
        .all(|ip| matches!(ip, IpAddr::V4(a) if *a != GATEWAY && a.octets()[..3] == [10, 0, 1])));
    let mut have = listed_one(&fleet, &eni.id).await.secondary_ips;
    have.sort();
    let mut want = got.clone();
    want.sort();
    assert_eq!(have, want);
    fleet.unassign(&eni.id, &got[..2]).await.unwrap();
    assert_eq!(cloud.world().secondaries(&eni.id), got[2..]);
    // Given back already: done.
    fleet.unassign(&eni.id, &got[..1]).await.unwrap();
    // Cut to the ENI's quota (8 addresses, its primary and one left).
    let more = fleet.assign(&eni.id, AddressCount::v4(20)).await.unwrap();
    assert_eq!(more.len(), 6);
}

#[tokio::test]
async fn throttling_is_retried_then_reported_and_limits_come_from_config() {
    let (cloud, fleet) = start().await;
    fleet
        .create(&request(INSTANCE, "intent-t", 0))
        .await
        .unwrap();
    cloud.world().inject.extend([(429, "TooManyRequests"); 3]);
    assert_eq!(
        listed(&fleet).await.len(),
        1,
        "three throttles, four attempts"
    );
    cloud.world().inject.extend([(429, "TooManyRequests"); 4]);
    let e = fleet.list_cluster_enis().await.unwrap_err();
    assert!(matches!(e, ProviderError::Throttled(_)), "{e}");
    assert!(e.is_transient());

    let l = fleet.limits("bcc.g4.c2m8").await.unwrap();
    assert_eq!((l.enis, l.ipv4_per_eni), (8, 8));
    let e = fleet.limits("bcc.unknown").await.unwrap_err();
    assert!(e.to_string().contains("add them to [limits]"), "{e}");
}
