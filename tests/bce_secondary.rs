//! Secondary mode on "BCE": a real `enimd` with `mode = "secondary"` and
//! `type = "bce"` over the loopback BCE fake (ENI OpenAPI with signatures
//! checked, and instance metadata), and the real `enim` plugin. Pods get
//! secondary addresses the warm address pool adds with private-IP batch
//! add; when the attached ENIs are full the pool attaches another; surplus
//! addresses go back by batch delete after their cooldown; a restart keeps
//! every live pod's address.
//!
//! Each ENI shows up, when metadata first lists it, as a veth with its MAC
//! in a host namespace; the far end sits on a bridge holding the subnet's
//! router address (10.0.1.1) in a gateway namespace.

// Shared by the BCE test binaries; this one uses a part of it.
#[allow(dead_code)]
#[path = "bce/mod.rs"]
mod bce;
mod common;

use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use bce::{blocking, eventually};
use common::cloud_node::{
    self, add_secondary_pods, as_host_routes, del_pods, pings_router, poll_until,
    restart_keeps_pods, MAX_ABOVE_WATERMARK, PRE_ALLOCATE,
};
use common::NamedNetns;
use enim_testkit::agent::net_conf;
use enim_testkit::bce::FakeCloud;

const NETWORK: &str = "enim-bce-secondary";
/// Addresses per ENI the agent uses (below the fake's quota of 8).
const PER_ENI: usize = 4;
const PODS: usize = 6;

fn config(dir: &Path, host: &NamedNetns, cloud: &FakeCloud) -> String {
    cloud_node::secondary_config(dir, host, "1s", PER_ENI, &bce::provider_section(cloud))
}

/// Secondary addresses the fake has on ENIs attached to the instance.
fn cloud_addresses(cloud: &FakeCloud) -> Vec<(String, Vec<IpAddr>)> {
    let w = cloud.world();
    w.attached_to_us()
        .iter()
        .map(|e| (e.id.clone(), e.secondary_ips.clone()))
        .collect()
}

fn total(cloud: &FakeCloud) -> usize {
    cloud_addresses(cloud)
        .iter()
        .map(|(_, ips)| ips.len())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secondary_mode_serves_pods_from_a_warm_ip_pool_on_the_bce_fake() {
    common::require_kernel!();
    let mut node = bce::node(config).await;
    let (agent, cloud, host) = (&mut node.agent, &node.cloud, &node.host);
    blocking(|| agent.restart());

    // No ENI at start: the pool attaches one and fills it, past
    // pre_allocate by max_above_watermark (one call).
    eventually("the first fill", Duration::from_secs(20), || {
        total(cloud) == PRE_ALLOCATE + MAX_ABOVE_WATERMARK
    })
    .await;
    assert_eq!(cloud_addresses(cloud).len(), 1);

    let conf = net_conf("1.1.0", NETWORK, agent.socket());
    let pods: Vec<NamedNetns> = (0..PODS)
        .map(|i| NamedNetns::new(&format!("bces{i}")))
        .collect();
    let seen = blocking(|| add_secondary_pods(&pods, "p", &conf));
    for pod in &pods {
        assert!(
            blocking(|| pings_router(pod)),
            "{} cannot reach the router; host links {}",
            pod.name,
            host.ip(&["-d", "link"])
        );
    }
    // Grown by ENIs once the first was full; every pod's address is on one
    // of them in the cloud; each ENI keeps its own device index.
    let cloud_now = cloud_addresses(cloud);
    assert!(cloud_now.len() >= PODS.div_ceil(PER_ENI), "{cloud_now:?}");
    assert!(
        cloud_now.iter().all(|(_, ips)| ips.len() <= PER_ENI),
        "{cloud_now:?}"
    );
    let in_cloud = as_host_routes(cloud_now.iter().flat_map(|(_, ips)| ips));
    assert!(seen.is_subset(&in_cloud), "{seen:?} vs {cloud_now:?}");
    let names = host.link_names();
    for n in 1..=cloud_now.len() {
        assert!(names.contains(&format!("enis{n}")), "{names:?}");
    }

    // A restart keeps every live pod's address and reachability.
    blocking(|| restart_keeps_pods(agent, &pods, &seen));

    blocking(|| del_pods(&pods, "p", &conf));
    // Surplus goes back after the cooldown.
    poll_until(
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            if total(cloud) == PRE_ALLOCATE + MAX_ABOVE_WATERMARK {
                return Ok(());
            }
            let status = blocking(|| agent.ctl(&["status"]));
            Err(format!(
                "surplus not released: cloud {:?}, agent {status}",
                cloud_addresses(cloud)
            ))
        },
    )
    .await;
    blocking(|| agent.stop());
    let w = cloud.world();
    assert!(w.count("POST", "/v1/eni/") >= 2, "batch adds and deletes");
    assert!(
        w.log.iter().all(|l| l.status != 403),
        "every call signed right"
    );
    assert_eq!(w.count("DELETE", "/v1/eni/"), 0, "host ENIs are kept");
}
