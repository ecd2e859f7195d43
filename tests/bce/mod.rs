//! What the end-to-end tests on "BCE" share: enimd over the loopback BCE
//! fake (ENI OpenAPI with signatures checked, and instance metadata), and a
//! sandbox node whose ENIs appear as veths when metadata first lists them.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

pub use crate::common::cloud_node::blocking;
use crate::common::{bins, cloud_node, Agent, NamedNetns};
use enim_testkit::bce::{self as rig, FakeCloud};
use enim_testkit::fixtures::AgentPaths;

/// The `[provider]` table over the fake, with short timings.
pub fn provider_section(cloud: &FakeCloud) -> String {
    format!(
        "[provider]\ntype = \"bce\"\nmetadata_endpoint = {meta:?}\n\
         security_group_ids = [\"g-enim\"]\naccess_key_id = {ak:?}\nsecret_access_key = {sk:?}\n\
         poll_interval = \"20ms\"\noperation_timeout = \"10s\"\n\
         [provider.api]\nendpoint = {api:?}\nbackoff = \"10ms\"\nmax_backoff = \"100ms\"\n",
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
    let gw = cloud_node::gateway("bcegw");
    let (h, g) = (host.clone(), gw.clone());
    cloud.on_new_interface(Arc::new(move |mac: &str, n: u32| {
        cloud_node::plug(&h, &g, &format!("bce{n}"), mac, &format!("bgw{n}"));
    }));
    (host, gw)
}

/// A node on a fresh fake: the sandbox, and enimd (not started yet) with
/// the config `config` makes for them, in a temp dir. Fields drop in
/// order: the agent before its files, namespaces and cloud.
pub struct Node {
    pub agent: Agent,
    pub dir: tempfile::TempDir,
    pub host: Arc<NamedNetns>,
    pub gw: Arc<NamedNetns>,
    pub cloud: FakeCloud,
}

pub async fn node(config: impl FnOnce(&Path, &NamedNetns, &FakeCloud) -> String) -> Node {
    let cloud = FakeCloud::start().await;
    let (host, gw) = sandbox(&cloud);
    let dir = tempfile::tempdir().unwrap();
    let agent = enimd(dir.path(), &config(dir.path(), &host, &cloud));
    Node {
        agent,
        dir,
        host,
        gw,
        cloud,
    }
}

/// Waits (up to `limit`) for `ok`.
pub async fn eventually(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) {
    cloud_node::poll_until(limit, Duration::from_millis(100), || {
        let done = ok();
        async move {
            if done {
                Ok(())
            } else {
                Err(format!("timed out waiting for {what}"))
            }
        }
    })
    .await
}
