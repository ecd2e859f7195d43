//! The crash matrix of the cloud steps (primary mode on "BCE"): a real
//! `enimd` over the loopback BCE fake is aborted (as by SIGKILL) before and
//! after each OpenAPI call of an ENI's create, attach, detach and delete,
//! then restarted. The fake must end with exactly the ENIs the node should
//! have: none created and left unattached, none created twice, and never
//! one a pod holds detached or deleted.
//!
//! What makes this hold on BCE is the ENI's name: `enim-<instance>-...`
//! goes with the create call itself, so the cloud records whose it is
//! before anything can be lost; at start the pool adopts such ENIs that are
//! attached (and in instance metadata) and deletes those that are not,
//! judged by the API's status, not by metadata.

// Shared by the BCE test binaries; each uses its own part.
#[allow(dead_code)]
#[path = "bce/mod.rs"]
mod bce;
mod common;

use std::path::Path;
use std::time::Duration;

use bce::blocking;
use common::cloud_node::{self, add_retrying, crash_at, primary_config};
use common::{enim, Agent, NamedNetns};
use enim_core::fault::CLOUD_CRASH_POINTS;
use enim_testkit::agent::net_conf;
use enim_testkit::bce::{FakeCloud, INSTANCE};
use enim_testkit::fixtures::AgentPaths;
use enim_testkit::netns::find_mac;

const NETWORK: &str = "enim-bce-crash";

fn config(dir: &Path, host: &NamedNetns, cloud: &FakeCloud, free: usize) -> String {
    primary_config(dir, host, &bce::provider_section(cloud), free, "300ms")
}

fn set_free(dir: &Path, host: &NamedNetns, cloud: &FakeCloud, free: usize) {
    let path = AgentPaths::in_dir(dir).config;
    std::fs::write(path, config(dir, host, cloud, free)).unwrap();
}

/// The node's ENIs in the fake (named for it), as (id, MAC, attached here).
fn ours(cloud: &FakeCloud) -> Vec<(String, String, bool)> {
    let w = cloud.world();
    w.ours()
        .iter()
        .map(|e| {
            let here = e.status == "inuse" && e.instance_id == INSTANCE;
            (e.id.clone(), e.mac.clone(), here)
        })
        .collect()
}

/// Waits until the fake holds exactly `want` ENIs named for the node,
/// every one attached to it, and the agent's pool counts the same.
async fn settled(cloud: &FakeCloud, agent: &Agent, want: usize, point: &str) {
    cloud_node::settled(agent, want, point, || async {
        let enis = ours(cloud);
        (enis.len(), enis.iter().all(|e| e.2), format!("{enis:?}"))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloud_steps_survive_a_crash_before_and_after_each_call() {
    common::require_kernel!();
    for &point in CLOUD_CRASH_POINTS {
        let mut node = bce::node(|dir, host, cloud| config(dir, host, cloud, 1)).await;
        let (agent, cloud, dir, host) = (&mut node.agent, &node.cloud, &node.dir, &node.host);
        let pod = NamedNetns::new("bcecrash");
        let conf = net_conf("1.1.0", NETWORK, agent.socket());
        let creating = point.contains("create") || point.contains("attach");
        // After recovery: the pod's ENI (if any) and one free.
        let (want, pod_eni) = if creating {
            // A first start from nothing: its first fill crashes.
            (1, None)
        } else {
            // Three ENIs, a pod on one; the armed start keeps one free, so
            // it detaches and deletes one and crashes on the way.
            set_free(dir.path(), host, cloud, 2);
            blocking(|| agent.restart());
            let r = blocking(|| add_retrying("c1", &pod, &conf, Duration::from_secs(60)));
            let mac = r["interfaces"][0]["mac"].as_str().unwrap().to_string();
            settled(cloud, agent, 3, point).await;
            let id = ours(cloud)
                .into_iter()
                .find(|e| e.1 == mac)
                .unwrap_or_else(|| panic!("{point}: the pod's MAC {mac} is no ENI of the node"))
                .0;
            blocking(|| agent.stop());
            set_free(dir.path(), host, cloud, 1);
            (2, Some((id, mac)))
        };
        blocking(|| crash_at(agent, point));
        // What the crash left in the cloud: (ENIs of the node, of them
        // attached here).
        let left = ours(cloud);
        let attached_left = left.iter().filter(|e| e.2).count();
        let expected = match point {
            "cloud:before-create" => (0, 0),
            // Created, never attached: the restart must delete it.
            "cloud:after-create" => (1, 0),
            // Attached and in metadata: the restart must adopt it.
            "cloud:after-attach" => (1, 1),
            "cloud:before-detach" => (3, 3),
            // Detached, not deleted: the restart must delete it.
            "cloud:after-detach" => (3, 2),
            "cloud:after-delete" => (2, 2),
            other => panic!("a crash point this test does not know: {other}"),
        };
        assert_eq!(
            (left.len(), attached_left),
            expected,
            "{point}: the crash left {left:?}"
        );
        blocking(|| agent.restart());
        blocking(|| agent.ctl(&["gc"]));
        settled(cloud, agent, want, point).await;
        // Whatever was attached is adopted, not replaced; whatever was not
        // is gone. (Before the detach, the restart's own shrink takes one
        // of the three: not checked here.)
        let now = ours(cloud);
        for (id, _, attached) in left.iter().filter(|_| point != "cloud:before-detach") {
            let kept = now.iter().any(|e| &e.0 == id);
            assert_eq!(
                kept, *attached,
                "{point}: {id} (attached: {attached}) kept: {kept}; left {left:?}, now {now:?}"
            );
        }
        let w = cloud.world();
        assert!(
            w.log.iter().all(|l| l.status != 403),
            "{point}: every call signed right"
        );
        drop(w);
        if let Some((id, mac)) = pod_eni {
            // The pod's ENI was never touched: still attached, still in the
            // pod; DEL brings it home to the host namespace.
            assert!(
                ours(cloud).iter().any(|e| e.0 == id && e.2),
                "{point}: the pod's ENI {id} left the node: {:?}",
                ours(cloud)
            );
            let in_pod = blocking(|| pod.link("eth0"));
            assert_eq!(
                in_pod.as_ref().and_then(|l| l["address"].as_str()),
                Some(mac.as_str()),
                "{point}: the pod lost its ENI: {in_pod:?}"
            );
            blocking(|| enim("DEL", "c1", Some(&pod.path()), "eth0", &conf).ok());
            assert!(
                blocking(|| find_mac(&host.links(), &mac)).is_some(),
                "{point}: the pod's ENI is not back in the host: {}",
                host.ip(&["link"])
            );
        }
        blocking(|| agent.stop());
        eprintln!("crash at {point}: recovered with {want} ENIs, none orphaned or doubled");
    }
}
