//! The fleet-wide reaper of leaked ENIs on BCE.

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use enim_provider::cloud::{parse_created_at, CloudBackend, Reaped};
use enim_provider_bce::tags::description_tag;
use enim_provider_bce::{BceBackend, BceConfig};
use enim_provider_pool::reap_pass;
use enim_testkit::bce::{FakeCloud, INSTANCE};
use enim_testkit::cloud::{both_list_then_reap, minutes_ago, two_passes_at_once, Leaks};

use crate::config;

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
