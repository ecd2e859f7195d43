//! The crash matrix of the cloud steps (primary mode on "AWS"): a real
//! `enimd` over moto and the fake IMDS is aborted (as by SIGKILL) before
//! and after each EC2 call of an ENI's create, attach, detach and delete,
//! then restarted. The cloud must end with exactly the ENIs the node should
//! have: none orphaned (tagged for the node but unattached), none created
//! twice, and never one a pod holds deleted.
//!
//! What makes this hold is that an ENI is born tagged for its node (the
//! tags go with CreateNetworkInterface itself), so the cloud records the
//! intent before anything can be lost: at start the pool adopts tagged
//! attached ENIs and deletes tagged unattached ones, judged by EC2's
//! attachment state, not by metadata that may be stale.

// Shared by the AWS test binaries; this one starts its agents armed.
#[allow(dead_code)]
#[path = "aws/mod.rs"]
mod aws;
mod common;

use std::path::Path;
use std::time::Duration;

use aws::{blocking, sandbox};
use common::cloud_node::{self, add_retrying, crash_at, primary_config};
use common::{enim, NamedNetns};
use enim_core::fault::CLOUD_CRASH_POINTS;
use enim_testkit::agent::net_conf;
use enim_testkit::moto as aws_rig;

const NETWORK: &str = "enim-aws-crash";

fn config(dir: &Path, host: &NamedNetns, env: &aws_rig::Env, free: usize) -> String {
    primary_config(dir, host, &aws::provider_table(env), free, "300ms")
}

/// Waits until the cloud holds exactly `want` ENIs tagged for the node,
/// every one attached to it, and the agent's pool lists the same number.
async fn settled(env: &aws_rig::Env, agent: &common::Agent, want: usize, point: &str) {
    cloud_node::settled(agent, want, point, || async {
        let tagged = env.tagged_ids().await;
        let attached = env.attached().await;
        let all_attached = tagged.iter().all(|id| attached.contains_key(id));
        let shown = format!("{tagged:?}, attached {attached:?}");
        (tagged.len(), all_attached, shown)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloud_steps_survive_a_crash_before_and_after_each_call() {
    common::require_kernel!();
    for point in CLOUD_CRASH_POINTS {
        let Some(env) = aws_rig::Env::start().await else {
            return;
        };
        let (host, _gw) = sandbox(&env);
        let dir = tempfile::tempdir().unwrap();
        let mut agent = aws::enimd(dir.path(), &config(dir.path(), &host, &env, 1), &env);
        let pod = NamedNetns::new("awscrash");
        let conf = net_conf("1.1.0", NETWORK, agent.socket());
        let creating = point.contains("create") || point.contains("attach");
        // After recovery: the pod's ENI (if any) and one free.
        let want = if creating {
            // A first start from nothing: its first fill crashes.
            1
        } else {
            // Three ENIs, a pod on one; the armed start keeps one free, so
            // it detaches and deletes one and crashes on the way.
            std::fs::write(agent_config(dir.path()), config(dir.path(), &host, &env, 2)).unwrap();
            blocking(|| agent.restart());
            blocking(|| add_retrying("c1", &pod, &conf, Duration::from_secs(30)));
            settled(&env, &agent, 3, point).await;
            blocking(|| agent.stop());
            std::fs::write(agent_config(dir.path()), config(dir.path(), &host, &env, 1)).unwrap();
            2
        };
        blocking(|| crash_at(&mut agent, point));
        blocking(|| agent.restart());
        blocking(|| agent.ctl(&["gc"]));
        settled(&env, &agent, want, point).await;
        if !creating {
            // The pod's ENI was never touched: still in the pod, and DEL
            // brings it home.
            assert!(
                blocking(|| pod.exec_ok(&["ip", "link", "show", "eth0"])),
                "{point}: the pod lost its ENI"
            );
            blocking(|| enim("DEL", "c1", Some(&pod.path()), "eth0", &conf).ok());
        }
        blocking(|| agent.stop());
        eprintln!("crash at {point}: recovered with {want} ENIs, none orphaned or doubled");
    }
}

fn agent_config(dir: &Path) -> std::path::PathBuf {
    enim_testkit::fixtures::AgentPaths::in_dir(dir).config
}
