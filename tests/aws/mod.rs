//! What the end-to-end tests on "AWS" share: enimd over moto and the fake
//! IMDS, and a sandbox node whose ENIs appear as veths when attached.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::common::{bins, Agent, NamedNetns};
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

/// Runs blocking test steps (plugin execs, `ip`, enimctl) in place: the
/// runtime's other worker keeps serving the fake IMDS and the proxy.
pub fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// The sandbox: ENIs appear in the returned host namespace when attached;
/// their far ends sit on a bridge with the subnet's router address in the
/// gateway namespace.
pub fn sandbox(env: &aws_rig::Env) -> (Arc<NamedNetns>, Arc<NamedNetns>) {
    let host = Arc::new(NamedNetns::new("awshost"));
    let gw = Arc::new(NamedNetns::new("awsgw"));
    gw.ip(&["link", "add", "br0", "type", "bridge"]);
    gw.ip(&["addr", "add", "10.0.1.1/24", "dev", "br0"]);
    gw.ip(&["link", "set", "br0", "up"]);
    {
        let (host, gw) = (host.clone(), gw.clone());
        env.imds
            .on_new_interface(Arc::new(move |mac: &str, idx: u32| {
                let (name, peer) = (format!("ens{}", 5 + idx), format!("gw{idx}"));
                // A slot freed by a detach is reused for the next attach:
                // the old NIC's pair goes first, as a hypervisor unplugs it.
                let _ = host.exec_ok(&["ip", "link", "del", &name]);
                let _ = gw.exec_ok(&["ip", "link", "del", &peer]);
                host.ip(&[
                    "link", "add", &name, "address", mac, "type", "veth", "peer", "name", &peer,
                    "netns", &gw.name,
                ]);
                gw.ip(&["link", "set", &peer, "master", "br0", "up"]);
            }));
    }
    (host, gw)
}
