//! What the end-to-end tests on "BCE" share: enimd over the loopback BCE
//! fake (ENI OpenAPI with signatures checked, and instance metadata), and a
//! sandbox node whose ENIs appear as veths when metadata first lists them.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{bins, enim, Agent, NamedNetns};
use enim_testkit::bce::{self as rig, FakeCloud};
use enim_testkit::fixtures::AgentPaths;

/// Runs blocking test steps (plugin execs, `ip`, enimctl) in place: the
/// runtime's other worker keeps serving the fake.
pub fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// The top of enimd's config in `dir`: socket, checkpoint, ENIs kept in
/// `host`, no periodic GC.
pub fn agent_section(dir: &Path, host: &NamedNetns) -> String {
    format!(
        "socket = {sock:?}\ncheckpoint = {ckpt:?}\nhost_netns = {netns:?}\ngc_interval = \"0s\"\n",
        sock = dir.join("enimd.sock").display().to_string(),
        ckpt = dir.join("state/checkpoint.json").display().to_string(),
        netns = host.path().display().to_string(),
    )
}

/// The `[provider]` table over the fake, with short timings.
pub fn provider_section(cloud: &FakeCloud) -> String {
    format!(
        "[provider]\ntype = \"bce\"\nendpoint = {api:?}\nmetadata_endpoint = {meta:?}\n\
         security_group_ids = [\"g-enim\"]\naccess_key_id = {ak:?}\nsecret_access_key = {sk:?}\n\
         poll_interval = \"20ms\"\noperation_timeout = \"10s\"\nretry_base = \"10ms\"\nretry_cap = \"100ms\"\n",
        api = cloud.api_url,
        meta = cloud.meta_url,
        ak = rig::AK,
        sk = rig::SK,
    )
}

/// enimd with `config` in `dir`, in this namespace (it must reach the
/// loopback fake); not started yet.
pub fn enimd(dir: &Path, config: &str) -> Agent {
    let paths = AgentPaths::in_dir(dir);
    std::fs::write(&paths.config, config).unwrap();
    let mut agent = Agent::new(bins(), paths);
    agent.ready_timeout = Duration::from_secs(30);
    agent.ready_poll = Duration::from_millis(50);
    agent
}

/// The sandbox node: ENIs appear in the returned host namespace as
/// metadata first lists them; their far ends sit on a bridge with the
/// subnet's router address in the gateway namespace.
pub fn sandbox(cloud: &FakeCloud) -> (Arc<NamedNetns>, Arc<NamedNetns>) {
    let host = Arc::new(NamedNetns::new("bcehost"));
    let gw = Arc::new(NamedNetns::new("bcegw"));
    gw.ip(&["link", "add", "br0", "type", "bridge"]);
    gw.ip(&["addr", "add", "10.0.1.1/24", "dev", "br0"]);
    gw.ip(&["link", "set", "br0", "up"]);
    let (h, g) = (host.clone(), gw.clone());
    cloud.on_new_interface(Arc::new(move |mac: &str, n: u32| {
        let (name, peer) = (format!("bce{n}"), format!("bgw{n}"));
        h.ip(&[
            "link", "add", &name, "address", mac, "type", "veth", "peer", "name", &peer, "netns",
            &g.name,
        ]);
        g.ip(&["link", "set", &peer, "master", "br0", "up"]);
    }));
    (host, gw)
}

/// Waits (up to `limit`) for `ok`.
pub async fn eventually(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// ADD of `cid` on eth0 in `pod`, retried while the agent answers "try
/// again later" (its pool still filling), up to a minute.
pub fn add_retrying(cid: &str, pod: &NamedNetns, conf: &serde_json::Value) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = enim("ADD", cid, Some(&pod.path()), "eth0", conf);
        if out.status == 0 || Instant::now() > deadline {
            return out.ok();
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
