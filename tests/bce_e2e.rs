//! End to end on "BCE" in primary mode: a real `enimd` with `type = "bce"`
//! over the loopback BCE fake (signatures checked) and the real `enim`
//! plugin, ENIs appearing as veths in a sandbox host namespace when
//! metadata first lists them.

// Shared by the BCE test binaries; each uses its own part.
#[allow(dead_code)]
#[path = "bce/mod.rs"]
mod bce;
mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use bce::{blocking, eventually};
use common::cloud_node::{
    assert_degraded_with_one_free, pings_router, primary_config, serve_through_outage,
    wait_recovered,
};
use common::{enim, NamedNetns};
use enim_testkit::agent::net_conf;
use enim_testkit::bce::{FakeCloud, INSTANCE};

const NETWORK: &str = "enim-bce-e2e";

/// A pool of one over the fake, short timings.
fn pool_config(dir: &Path, host: &NamedNetns, cloud: &FakeCloud) -> String {
    primary_config(dir, host, &bce::provider_section(cloud), 1, "200ms")
}

/// The node's ENIs in the fake (named for it) attached here, by MAC.
fn attached_macs(cloud: &FakeCloud) -> Vec<String> {
    let w = cloud.world();
    w.ours()
        .iter()
        .filter(|e| e.status == "inuse" && e.instance_id == INSTANCE)
        .map(|e| e.mac.clone())
        .collect()
}

/// The ENI OpenAPI is down when enimd (re)starts: it starts anyway, says it
/// is degraded, hands out the ENI metadata shows attached (its id as the
/// agent last learnt it), answers "try again later" beyond it, and DEL
/// works. When the API is back, the pool finishes its discovery and grows,
/// and the degraded state clears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enimd_serves_through_a_bce_api_outage_and_grows_after_it() {
    common::require_kernel!();
    let mut node = bce::node(pool_config).await;
    let (agent, cloud) = (&mut node.agent, &node.cloud);

    // An earlier run of the agent, with the API up, attached one ENI.
    blocking(|| agent.restart());
    eventually("the first fill", Duration::from_secs(20), || {
        attached_macs(cloud).len() == 1
    })
    .await;
    let earlier = attached_macs(cloud).remove(0);
    // What it learnt of the ENI, beside its checkpoint: written once the
    // attach has settled, which may be a moment after the fake shows it.
    let cache_path = node.dir.path().join("state/bce-eni-ids.json");
    eventually("the ENI in the id cache", Duration::from_secs(20), || {
        std::fs::read_to_string(&cache_path).is_ok_and(|c| c.contains(&earlier))
    })
    .await;
    blocking(|| agent.stop());

    cloud.set_down(true);
    let outage = Instant::now();
    blocking(|| agent.restart());
    blocking(|| assert_degraded_with_one_free(agent));

    let conf = net_conf("1.1.0", NETWORK, agent.socket());
    let (pod1, pod2) = (NamedNetns::new("bcepod1"), NamedNetns::new("bcepod2"));
    blocking(|| serve_through_outage(&conf, &pod1, &pod2, &earlier));
    {
        let w = cloud.world();
        assert_eq!(w.ours().len(), 1, "nothing created during the outage");
        let served = w
            .log
            .iter()
            .filter(|l| l.at >= outage && l.status != 503)
            .count();
        assert_eq!(served, 0, "the API answered during the outage");
    }

    cloud.set_down(false);
    eventually("the pool to grow", Duration::from_secs(30), || {
        attached_macs(cloud).len() == 2
    })
    .await;
    wait_recovered(agent).await;
    let r2 = blocking(|| enim("ADD", "c2", Some(&pod2.path()), "eth0", &conf).ok());
    assert_ne!(r2["interfaces"][0]["mac"], earlier.as_str(), "{r2}");
    assert!(blocking(|| pings_router(&pod2)));
    for (cid, pod) in [("c1", &pod1), ("c2", &pod2)] {
        blocking(|| enim("DEL", cid, Some(&pod.path()), "eth0", &conf).ok());
    }
    blocking(|| agent.stop());
    let w = cloud.world();
    assert!(
        w.log.iter().all(|l| l.status != 403),
        "every call signed right"
    );
}
