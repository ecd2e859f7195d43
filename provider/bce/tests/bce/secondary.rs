//! Secondary mode: private IPs, address limits, device indexes.

use std::collections::HashSet;
use std::time::Duration;

use enim_core::{AddressCount, ProviderError};
use enim_provider::cloud::CloudBackend;
use enim_provider::EniProvider;
use enim_provider_bce::tags::description_tag;
use enim_provider_bce::BceBackend;
use enim_provider_pool::PoolRole;
use enim_testkit::bce::{self as rig, FakeCloud, INSTANCE, VPC};

use crate::config;

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
        (enim_provider_bce::node::PROVISIONAL_IPS_PER_ENI, 8)
    );

    let eni = backend.create_and_attach().await.unwrap();
    let limits = backend.address_limits().await.unwrap();
    assert_eq!(
        (limits.ipv4_per_eni, limits.ipv6_per_eni, limits.enis),
        (16, 16, 8)
    );

    // 12 asked: two batch adds (BCE takes 10 at most).
    let first = backend.assign(&eni.id, AddressCount::v4(12)).await.unwrap();
    assert_eq!(first.len(), 12, "{first:?}");
    assert_usable(&first, eni.ipv4.addr());
    assert_eq!(
        cloud
            .world()
            .count("POST", &format!("/v1/eni/{}/privateIp/batchAdd", eni.id)),
        2
    );
    // 5 more asked, 3 fit (16 with the primary): cut, not refused.
    let second = backend.assign(&eni.id, AddressCount::v4(5)).await.unwrap();
    assert_eq!(second.len(), 3, "{second:?}");
    assert!(second.iter().all(|ip| !first.contains(ip)));
    // Full: nothing asked of BCE, nothing new.
    assert!(backend
        .assign(&eni.id, AddressCount::v4(1))
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
    backend.unassign(&eni.id, gone).await.unwrap();
    let dels = |cloud: &FakeCloud| {
        cloud
            .world()
            .count("POST", &format!("/v1/eni/{}/privateIp/batchDel", eni.id))
    };
    assert_eq!(dels(&cloud), 1);
    backend.unassign(&eni.id, gone).await.unwrap();
    assert_eq!(dels(&cloud), 1, "a second unassign deletes nothing");
    let left = cloud.world().secondaries(&eni.id);
    assert_eq!(left.len(), 12);
    assert!(gone.iter().all(|ip| !left.contains(ip)));
    // 12 in one call: two batches of at most 10.
    backend.unassign(&eni.id, &left).await.unwrap();
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
        let err = backend
            .assign(other, AddressCount::v4(2))
            .await
            .unwrap_err();
        assert!(matches!(err, ProviderError::OwnedByOther { .. }), "{err}");
    }
    let err = backend
        .assign(&primary, AddressCount::v4(2))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ProviderError::Config(m) if m.contains("primary")),
        "{err}"
    );
    let err = backend
        .assign("eni-missing", AddressCount::v4(1))
        .await
        .unwrap_err();
    assert!(matches!(err, ProviderError::UnknownEni(_)), "{err}");
    // Unassigning on an ENI that is not (or no longer) here is done:
    // its addresses are not this node's.
    let ip: std::net::IpAddr = "10.0.1.200".parse().unwrap();
    backend.unassign(&elsewhere, &[ip]).await.unwrap();
    backend.unassign("eni-missing", &[ip]).await.unwrap();
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
    let new = backend
        .assign(&eni.id, AddressCount { ipv4: 2, ipv6: 2 })
        .await
        .unwrap();
    let (v4, v6): (Vec<std::net::IpAddr>, Vec<_>) = new.iter().partition(|ip| ip.is_ipv4());
    assert_eq!((v4.len(), v6.len()), (2, 2), "{new:?}");
    let shown = backend.attached().await.unwrap();
    let shown: HashSet<_> = shown[0].secondary_ips.iter().copied().collect();
    assert_eq!(shown, new.iter().copied().collect());
    backend.unassign(&eni.id, &new).await.unwrap();
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
            description_tag(d, enim_provider_bce::tags::TAG_DEVICE_INDEX),
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
    // pre_allocate 2: in primary mode the pool would create two ENIs now.
    assert_eq!(cfg.pool.pre_allocate, 2);
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
    let new = ips.assign(&eni.id, AddressCount::v4(4)).await.unwrap();
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
