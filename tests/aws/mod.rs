//! What the end-to-end tests on "AWS" share: enimd over moto and the fake
//! IMDS, and a sandbox node whose ENIs appear as veths when attached.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

pub use crate::common::cloud_node::blocking;
use crate::common::{bins, cloud_node, Agent, NamedNetns};
use enim_provider_aws::client::NetworkInterface;
use enim_testkit::fixtures::AgentPaths;
use enim_testkit::moto as aws_rig;

/// enimd with `config` in `dir`, in this namespace (it must reach the
/// loopback servers), signing with the node's IAM user; ready.
pub fn start_enimd(dir: &Path, config: &str, env: &aws_rig::Env) -> Agent {
    let mut agent = enimd(dir, config, env);
    agent.restart();
    agent
}

/// As [`start_enimd`], not started yet.
pub fn enimd(dir: &Path, config: &str, env: &aws_rig::Env) -> Agent {
    let paths = AgentPaths::in_dir(dir);
    std::fs::write(&paths.config, config).unwrap();
    let mut agent = Agent::new(bins(), paths);
    agent.env = vec![
        ("AWS_ACCESS_KEY_ID".into(), env.node.access_key_id().into()),
        (
            "AWS_SECRET_ACCESS_KEY".into(),
            env.node.secret_access_key().into(),
        ),
    ];
    agent.env_remove = vec!["AWS_SESSION_TOKEN".into()];
    agent.ready_timeout = Duration::from_secs(30);
    agent.ready_poll = Duration::from_millis(50);
    agent
}

/// The sandbox: ENIs appear in the returned host namespace when attached;
/// their far ends sit on a bridge with the subnet's router address in the
/// gateway namespace.
pub fn sandbox(env: &aws_rig::Env) -> (Arc<NamedNetns>, Arc<NamedNetns>) {
    let host = Arc::new(NamedNetns::new("awshost"));
    let gw = cloud_node::gateway("awsgw");
    {
        let (host, gw) = (host.clone(), gw.clone());
        env.imds
            .on_new_interface(Arc::new(move |mac: &str, idx: u32| {
                let (name, peer) = (format!("ens{}", 5 + idx), format!("gw{idx}"));
                // A slot freed by a detach is reused for the next attach:
                // the old NIC's pair goes first, as a hypervisor unplugs it.
                let _ = host.exec_ok(&["ip", "link", "del", &name]);
                let _ = gw.exec_ok(&["ip", "link", "del", &peer]);
                cloud_node::plug(&host, &gw, &name, mac, &peer);
            }));
    }
    (host, gw)
}

/// An ENI tagged for the node as an earlier agent run left it: attached
/// at device index 1.
pub async fn attach_earlier(env: &aws_rig::Env) -> NetworkInterface {
    let earlier = env.create_tagged_eni().await;
    env.admin_ec2
        .attach_network_interface(&earlier.network_interface_id, &env.instance_id, 1, 0)
        .await
        .unwrap();
    earlier
}

/// enimd's `[provider]` table over moto: IMDS and EC2 (through the fault
/// proxy), short timings.
pub fn provider_table(env: &aws_rig::Env) -> String {
    format!(
        "[provider]\ntype = \"aws\"\nimds_endpoint = {:?}\nmetadata_wait = \"10s\"\n\
         [provider.api]\nendpoint = {:?}\nbackoff = \"20ms\"\nmax_backoff = \"200ms\"\n",
        env.imds.url, env.proxy.url,
    )
}
