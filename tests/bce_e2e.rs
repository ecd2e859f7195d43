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

use bce::{blocking, eventually, sandbox};
use common::{enim, NamedNetns};
use enim_testkit::agent::net_conf;
use enim_testkit::bce::{FakeCloud, INSTANCE};

const NETWORK: &str = "enim-bce-e2e";

/// A pool of one over the fake, short timings.
fn pool_config(dir: &Path, host: &NamedNetns, cloud: &FakeCloud) -> String {
    format!(
        "{agent}{provider}\
         [provider.pool]\nmin_free = 1\nmax_free = 1\ninitial_retry = \"100ms\"\n\
         max_backoff = \"1s\"\nresync_interval = \"200ms\"\n",
        agent = common::cloud_node::config_head(dir, host),
        provider = bce::provider_section(cloud),
    )
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
    let cloud = FakeCloud::start().await;
    let (host, _gw) = sandbox(&cloud);
    let dir = tempfile::tempdir().unwrap();
    let mut agent = bce::enimd(dir.path(), &pool_config(dir.path(), &host, &cloud));

    // An earlier run of the agent, with the API up, attached one ENI.
    blocking(|| agent.restart());
    eventually("the first fill", Duration::from_secs(20), || {
        attached_macs(&cloud).len() == 1
    })
    .await;
    let earlier = attached_macs(&cloud).remove(0);
    // What it learnt of the ENI, beside its checkpoint: written once the
    // attach has settled, which may be a moment after the fake shows it.
    let cache_path = dir.path().join("state/bce-eni-ids.json");
    eventually("the ENI in the id cache", Duration::from_secs(20), || {
        std::fs::read_to_string(&cache_path).is_ok_and(|c| c.contains(&earlier))
    })
    .await;
    blocking(|| agent.stop());

    cloud.set_down(true);
    let outage = Instant::now();
    blocking(|| agent.restart());
    let status = blocking(|| agent.ctl(&["status"]));
    let why = status["degraded"].as_str().unwrap_or_default().to_string();
    assert!(why.contains("cloud unreachable since"), "{status}");
    assert_eq!(status["enis_free"], 1, "{status}");

    let conf = net_conf("1.1.0", NETWORK, agent.socket());
    let (pod1, pod2) = (NamedNetns::new("bcepod1"), NamedNetns::new("bcepod2"));
    let r1 = blocking(|| enim("ADD", "c1", Some(&pod1.path()), "eth0", &conf).ok());
    assert_eq!(r1["interfaces"][0]["mac"], earlier.as_str(), "{r1}");
    assert!(blocking(
        || pod1.exec_ok(&["ping", "-c", "1", "-W", "2", "10.0.1.1"])
    ));
    blocking(|| enim("ADD", "c2", Some(&pod2.path()), "eth0", &conf).err(11));
    // The runtime DELs the failed sandbox, as CRI runtimes do: the pod no
    // longer counts as waiting for an ENI.
    blocking(|| enim("DEL", "c2", Some(&pod2.path()), "eth0", &conf).ok());
    // DEL and a second ADD of the same ENI need no cloud either.
    blocking(|| enim("DEL", "c1", Some(&pod1.path()), "eth0", &conf).ok());
    blocking(|| enim("ADD", "c1", Some(&pod1.path()), "eth0", &conf).ok());
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
        attached_macs(&cloud).len() == 2
    })
    .await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let status = blocking(|| agent.ctl(&["status"]));
        if status.get("degraded").is_none() && status["enis_free"] == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still degraded or not grown: {status}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let r2 = blocking(|| enim("ADD", "c2", Some(&pod2.path()), "eth0", &conf).ok());
    assert_ne!(r2["interfaces"][0]["mac"], earlier.as_str(), "{r2}");
    assert!(blocking(
        || pod2.exec_ok(&["ping", "-c", "1", "-W", "2", "10.0.1.1"])
    ));
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
