//! Issue #29 defect 3 against the real kernel: whatever the provider's
//! list says, a device of the node's own is never handed to a pod
//! (src/netlink/handout.rs has the rule). Each test lists, besides a real
//! (veth) ENI, a device of the sandbox's host namespace by its MAC: the
//! node's uplink (default route only in a policy table, IPv6 only, no
//! default route yet, the device under a macvlan uplink), a bridge, a
//! bridge port, a macvlan, another CNI's pod veth, a veth named as enim's
//! own. The entry arrives in the list after start and no GC pass runs
//! (`gc_interval = 0`), so the ADD alone must judge it: it never moves the
//! device, says why, and the real ENI still works. Listed from the start,
//! start-up's survey reserves it; secondary mode never takes it in.

mod common;

use std::path::Path;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use common::*;
use enim::engine::{Engine, EngineError};
use enim::netlink::rtnl::RtnlPlumbing;
use enim::primary::PrimaryDriver;
use enim::secondary::SecondaryConfig;
use enim::store::checkpoint::Checkpoint;
use enim_core::{Eni, EniOwner, MacAddr, ProviderError};
use enim_provider::EniProvider;
use enim_provider_static::{StaticEniConfig, StaticProvider};
use enim_testkit::fixtures::plain_eni;
use serde_json::Value;

/// The node's address on its uplink, and its router in the gateway
/// namespace.
const NODE_IP: &str = "10.250.0.2";
const ROUTER_IP: &str = "10.250.0.1";
const NODE_IP6: &str = "fd00:250::2";
const ROUTER_IP6: &str = "fd00:250::1";

/// Makes `name` in the sandbox's host namespace: a veth whose peer (named
/// `peer`, up) is in the gateway namespace. Up.
fn veth_to_gateway(sb: &Sandbox, name: &str, peer: &str) {
    let gw = sb.gateway.name.as_str();
    sb.host.ip(&[
        "link", "add", name, "type", "veth", "peer", "name", peer, "netns", gw,
    ]);
    sb.gateway.ip(&["link", "set", peer, "up"]);
    sb.host.ip(&["link", "set", name, "up"]);
}

/// `eth0`, the node's uplink: a veth to the gateway namespace (where `up0`
/// holds the router's addresses) with the node's IPv4 address when `v4`
/// and IPv6 address when `v6`. No default route: each test adds its own.
fn uplink(sb: &Sandbox, v4: bool, v6: bool) {
    veth_to_gateway(sb, "eth0", "up0");
    if v4 {
        sb.gateway
            .ip(&["addr", "add", &format!("{ROUTER_IP}/24"), "dev", "up0"]);
        sb.host
            .ip(&["addr", "add", &format!("{NODE_IP}/24"), "dev", "eth0"]);
    }
    if v6 {
        let router = format!("{ROUTER_IP6}/64");
        sb.gateway
            .ip(&["-6", "addr", "add", &router, "dev", "up0", "nodad"]);
        let node = format!("{NODE_IP6}/64");
        sb.host
            .ip(&["-6", "addr", "add", &node, "dev", "eth0", "nodad"]);
    }
}

/// An IPv4 [`uplink`] whose default route is only in policy table 100,
/// which the node's address looks up.
fn uplink_routed_by_policy(sb: &Sandbox) {
    uplink(sb, true, false);
    sb.host.ip(&[
        "route", "add", "default", "via", ROUTER_IP, "dev", "eth0", "table", "100",
    ]);
    sb.host.ip(&[
        "rule", "add", "from", NODE_IP, "lookup", "100", "priority", "100",
    ]);
}

/// The MAC of host device `name`.
fn mac_of(sb: &Sandbox, name: &str) -> MacAddr {
    let link = sb.host.link(name).unwrap_or_else(|| panic!("no {name}"));
    link["address"].as_str().unwrap().parse().unwrap()
}

/// A provider entry for the host device `name`, by its MAC.
fn entry_for(sb: &Sandbox, name: &str) -> StaticEniConfig {
    plain_eni(
        format!("eni-{name}"),
        mac_of(sb, name),
        "10.99.0.10/24".parse().unwrap(),
        "10.99.0.1".parse().unwrap(),
    )
}

/// What of host device `name` must not change: name, MAC, master, MTU,
/// and its addresses.
fn fingerprint(sb: &Sandbox, name: &str) -> (Value, Value, Value, Value, Vec<String>) {
    let link = sb
        .host
        .link(name)
        .unwrap_or_else(|| panic!("no {name} in the host: it was moved or renamed"));
    let keep = |k: &str| link.get(k).cloned().unwrap_or(Value::Null);
    (
        keep("ifname"),
        keep("address"),
        keep("master"),
        keep("mtu"),
        sb.host.addrs(name),
    )
}

/// Every route of every table and every rule of the host namespace.
fn host_routing(sb: &Sandbox) -> String {
    let mut all = String::new();
    for family in ["-4", "-6"] {
        all += &sb.host.ip(&[family, "route", "show", "table", "all"]);
        all += &sb.host.ip(&[family, "rule", "list"]);
    }
    all
}

/// The engine over `provider` in primary mode, recovered as enimd starts
/// it; no GC runs (as with `gc_interval = 0`).
async fn primary_over(
    sb: &Sandbox,
    provider: Arc<dyn EniProvider>,
    dir: &Path,
) -> Engine<PrimaryDriver> {
    let plumbing = Arc::new(RtnlPlumbing::new(Some(&sb.host.path())).await.unwrap());
    let checkpoint = Arc::new(Checkpoint::open(&dir.join("cp.json"), false).unwrap());
    let driver = PrimaryDriver::new(provider, plumbing, checkpoint.clone(), Default::default());
    let engine = Engine::new(driver, checkpoint);
    engine.recover().await.expect("recover");
    engine
}

/// The reproduction with `decoy`, a device of the host, listed by
/// MAC after the real ENI. The entry arrives in the list after start (so
/// start-up's survey never saw it, and no GC pass runs: the ADD alone must
/// judge it); two pods are added. The first gets the real ENI; the second
/// is refused with a "try again later" error that names the decoy and
/// `why`, and the decoy never leaves the host (name, MAC, master,
/// addresses, every route and rule as they were). It is reserved as
/// excluded; once the first pod goes, the next pod gets the real ENI.
async fn assert_never_handed_out(sb: &Sandbox, decoy: &str, why: &str) {
    let enis = vec![sb.enis[0].clone(), entry_for(sb, decoy)];
    let provider = Arc::new(ArrivesLater::new(enis, &format!("eni-{decoy}")).await);
    let dir = tempfile::tempdir().unwrap();
    let mgr = primary_over(sb, provider.clone(), dir.path()).await;
    provider.arrive().await;
    let before = (fingerprint(sb, decoy), host_routing(sb));
    let pods = [NamedNetns::new("pod"), NamedNetns::new("pod")];

    let first = mgr.add(&owner("c1", "eth0"), &pods[0].path()).await;
    assert_eq!(first.expect("the real ENI").eni_id, "eni-0000");
    let refused = mgr.add(&owner("c2", "eth0"), &pods[1].path()).await;
    let after = (fingerprint(sb, decoy), host_routing(sb));
    assert_eq!(after, before, "{decoy} was touched");
    assert!(pods[1].link("eth0").is_none(), "{decoy} is in the pod");
    let err = refused.expect_err("the decoy must be refused");
    let text = err.to_string();
    assert!(matches!(err, EngineError::DeviceRefused { .. }), "{text}");
    assert!(err.is_transient(), "not a try-again-later error: {text}");
    let named = [
        format!("eni-{decoy}"),
        format!("device {decoy} "),
        why.to_string(),
    ];
    for needle in &named {
        assert!(text.contains(needle.as_str()), "no {needle:?} in: {text}");
    }

    let listed = mgr.enis().await.unwrap();
    let state = |id: &str| listed.iter().find(|e| e.eni.id == id).unwrap().state;
    assert_eq!(state(&format!("eni-{decoy}")), enim_api::EniState::Excluded);
    mgr.del(&owner("c1", "eth0")).await.unwrap();
    let again = mgr.add(&owner("c3", "eth0"), &pods[1].path()).await;
    assert_eq!(again.expect("the real ENI again").eni_id, "eni-0000");
    assert_eq!(fingerprint(sb, decoy), before.0);
    mgr.del(&owner("c3", "eth0")).await.unwrap();
    sb.assert_home(0);
}

/// The rule's route and address dumps are reused from one ADD to the next
/// while the host's routes and addresses stay as they were (issue #35: they
/// cost every ADD half a millisecond), and dumped again at the first ADD
/// after a change: an ENI's device that took the node's address after an
/// earlier ADD judged it fit is refused at the next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_routing_dumps_are_reused_until_a_change_and_a_change_is_judged() {
    require_kernel!();
    let sb = Sandbox::new(1);
    uplink(&sb, true, false);
    sb.host
        .ip(&["route", "add", "default", "via", ROUTER_IP, "dev", "eth0"]);
    let provider = Arc::new(StaticProvider::new(vec![sb.enis[0].clone()]).unwrap());
    let plumbing = Arc::new(RtnlPlumbing::new(Some(&sb.host.path())).await.unwrap());
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = Arc::new(Checkpoint::open(&dir.path().join("cp.json"), false).unwrap());
    let driver = PrimaryDriver::new(
        provider,
        plumbing.clone(),
        checkpoint.clone(),
        Default::default(),
    );
    let mgr = Engine::new(driver, checkpoint);
    mgr.recover().await.expect("recover");
    let pod = NamedNetns::new("pod");

    for (i, cid) in ["c1", "c2", "c3"].into_iter().enumerate() {
        let added = mgr.add(&owner(cid, "eth0"), &pod.path()).await;
        assert_eq!(added.expect("the ENI").eni_id, "eni-0000");
        mgr.del(&owner(cid, "eth0")).await.unwrap();
        assert_eq!(
            plumbing.routing_dumps(),
            1,
            "ADD {} dumped the host's routes again with nothing changed",
            i + 1
        );
    }

    // Devices coming and going in the host (another pod's veth, up: the
    // kernel gives it IPv6 link-local and multicast routes and a
    // link-local address) change nothing the rule reads.
    sb.host.ip(&[
        "link", "add", "other0", "type", "veth", "peer", "name", "other1",
    ]);
    sb.host.ip(&["link", "set", "other0", "up"]);
    sb.host.ip(&["link", "set", "other1", "up"]);
    let added = mgr.add(&owner("c3b", "eth0"), &pod.path()).await;
    assert_eq!(added.expect("the ENI").eni_id, "eni-0000");
    mgr.del(&owner("c3b", "eth0")).await.unwrap();
    assert_eq!(plumbing.routing_dumps(), 1, "a veth coming up dumped again");

    // The ENI's device, home and free, takes the node's address.
    let device = sb
        .host
        .link_by_mac(sb.enis[0].mac)
        .expect("the ENI's device");
    let name = device["ifname"].as_str().unwrap().to_string();
    sb.host.ip(&["addr", "add", "10.251.0.2/24", "dev", &name]);
    let refused = mgr.add(&owner("c4", "eth0"), &pod.path()).await;
    let text = refused
        .expect_err("the device is now the node's")
        .to_string();
    assert!(
        text.contains("holds the node's address 10.251.0.2"),
        "{text}"
    );
    assert_eq!(
        plumbing.routing_dumps(),
        2,
        "the change was not dumped again"
    );
    assert!(sb.host.link(&name).is_some(), "{name} left the host");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uplink_whose_default_route_is_only_in_a_policy_table() {
    require_kernel!();
    let sb = Sandbox::new(1);
    uplink_routed_by_policy(&sb);
    assert_never_handed_out(&sb, "eth0", "IPv4 default route in table 100").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ipv6_only_uplink() {
    require_kernel!();
    let sb = Sandbox::new(1);
    uplink(&sb, false, true);
    sb.host.ip(&[
        "-6", "route", "add", "default", "via", ROUTER_IP6, "dev", "eth0",
    ]);
    assert_never_handed_out(&sb, "eth0", "IPv6 default route in table main").await;
}

/// DHCP gave the address; the default route is not there yet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uplink_before_its_default_route() {
    require_kernel!();
    let sb = Sandbox::new(1);
    uplink(&sb, true, false);
    assert_never_handed_out(&sb, "eth0", &format!("holds the node's address {NODE_IP}")).await;
}

/// The node's address and default route are on a macvlan over `lower0`:
/// moving `lower0` would cut the uplink off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_device_under_a_macvlan_uplink() {
    require_kernel!();
    let sb = Sandbox::new(1);
    veth_to_gateway(&sb, "lower0", "up0");
    sb.gateway
        .ip(&["addr", "add", &format!("{ROUTER_IP}/24"), "dev", "up0"]);
    sb.host.ip(&[
        "link", "add", "link", "lower0", "name", "mv0", "type", "macvlan", "mode", "bridge",
    ]);
    sb.host
        .ip(&["addr", "add", &format!("{NODE_IP}/24"), "dev", "mv0"]);
    sb.host.ip(&["link", "set", "mv0", "up"]);
    sb.host
        .ip(&["route", "add", "default", "via", ROUTER_IP, "dev", "mv0"]);
    assert_never_handed_out(&sb, "lower0", "the device mv0 is built on").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bridge() {
    require_kernel!();
    let sb = Sandbox::new(1);
    sb.host.ip(&["link", "add", "br0", "type", "bridge"]);
    assert_never_handed_out(&sb, "br0", "is a bridge device").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bridge_port() {
    require_kernel!();
    let sb = Sandbox::new(1);
    // A MAC of its own: otherwise the bridge takes its port's, and the
    // lookup by that MAC finds the bridge (refused too, as a bridge).
    let br_mac = "02:b0:00:00:00:01";
    sb.host
        .ip(&["link", "add", "br0", "address", br_mac, "type", "bridge"]);
    veth_to_gateway(&sb, "port0", "gwport0");
    sb.host.ip(&["link", "set", "port0", "master", "br0"]);
    assert_never_handed_out(&sb, "port0", "is enslaved to br0").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_macvlan() {
    require_kernel!();
    let sb = Sandbox::new(1);
    veth_to_gateway(&sb, "lower0", "up0");
    sb.host.ip(&[
        "link", "add", "link", "lower0", "name", "mv0", "type", "macvlan",
    ]);
    assert_never_handed_out(&sb, "mv0", "is a macvlan device").await;
}

/// Another CNI's pod veth: its peer in the pod, the pod's host route on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_cnis_pod_veth() {
    require_kernel!();
    let sb = Sandbox::new(1);
    let their_pod = NamedNetns::new("theirs");
    let pod_ns = their_pod.name.as_str();
    sb.host.ip(&[
        "link",
        "add",
        "cali0a1b2c",
        "type",
        "veth",
        "peer",
        "name",
        "eth0",
        "netns",
        pod_ns,
    ]);
    sb.host.ip(&["link", "set", "cali0a1b2c", "up"]);
    sb.host
        .ip(&["route", "add", "10.9.9.9/32", "dev", "cali0a1b2c"]);
    assert_never_handed_out(&sb, "cali0a1b2c", "host's route to 10.9.9.9/32").await;
}

/// A veth named as a host path's host end, before its routes exist.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_veth_named_as_enims_own() {
    require_kernel!();
    let sb = Sandbox::new(1);
    veth_to_gateway(&sb, "enih0123456789a", "gwenih");
    assert_never_handed_out(&sb, "enih0123456789a", "one of enim's own host-side veths").await;
}

/// A static provider whose list gains an entry after start (as a
/// NetResourceSet spec or a cloud listing does): until it arrives, the
/// entry is hidden from the list and held, so nothing allocates it.
struct ArrivesLater {
    inner: StaticProvider,
    hidden: Mutex<Option<String>>,
}

fn hiding_owner() -> EniOwner {
    owner("not-yet-listed", "eth0")
}

impl ArrivesLater {
    async fn new(enis: Vec<StaticEniConfig>, late: &str) -> Self {
        let inner = StaticProvider::new(enis).unwrap();
        inner
            .restore(&[(late.into(), hiding_owner())])
            .await
            .unwrap();
        ArrivesLater {
            inner,
            hidden: Mutex::new(Some(late.into())),
        }
    }

    async fn arrive(&self) {
        self.hidden.lock().unwrap().take();
        self.inner.release(&hiding_owner()).await.unwrap();
    }
}

#[async_trait]
impl EniProvider for ArrivesLater {
    fn name(&self) -> &str {
        "arrives-later"
    }
    async fn list(&self) -> Result<Vec<Eni>, ProviderError> {
        let hidden = self.hidden.lock().unwrap().clone();
        let mut all = self.inner.list().await?;
        all.retain(|e| Some(&e.id) != hidden.as_ref());
        Ok(all)
    }
    async fn allocate_next(&self, owner: &EniOwner) -> Result<Eni, ProviderError> {
        self.inner.allocate_next(owner).await
    }
    async fn release(&self, owner: &EniOwner) -> Result<(), ProviderError> {
        self.inner.release(owner).await
    }
    async fn restore(&self, assignments: &[(String, EniOwner)]) -> Result<(), ProviderError> {
        self.inner.restore(assignments).await
    }
}

/// Listed from the start, an uplink whose default route is only in a
/// policy table is found by start-up's survey: reserved as excluded before
/// any ADD, so the two pods' ADDs take the real ENI and then find none
/// free; the uplink never moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uplink_listed_from_the_start_is_reserved_at_start() {
    require_kernel!();
    let sb = Sandbox::new(1);
    uplink_routed_by_policy(&sb);
    let enis = vec![entry_for(&sb, "eth0"), sb.enis[0].clone()];
    let provider = Arc::new(StaticProvider::new(enis).unwrap());
    let dir = tempfile::tempdir().unwrap();
    let mgr = primary_over(&sb, provider, dir.path()).await;
    let listed = mgr.enis().await.unwrap();
    assert_eq!(listed[0].state, enim_api::EniState::Excluded, "{listed:?}");
    let before = (fingerprint(&sb, "eth0"), host_routing(&sb));

    let pods = [NamedNetns::new("pod"), NamedNetns::new("pod")];
    let first = mgr.add(&owner("c1", "eth0"), &pods[0].path()).await;
    assert_eq!(first.expect("the real ENI").eni_id, "eni-0000");
    let second = mgr.add(&owner("c2", "eth0"), &pods[1].path()).await;
    assert_eq!((fingerprint(&sb, "eth0"), host_routing(&sb)), before);
    let err = second.expect_err("nothing else is free");
    assert!(err.is_transient(), "{err}");
}

/// Secondary mode takes a listed ENI as a host ENI at start (renamed,
/// given a table): the uplink, listed with secondary addresses, is left
/// as it is and shown excluded; the real ENI serves a pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secondary_mode_never_takes_the_uplink_as_a_host_eni() {
    require_kernel!();
    let sb = Sandbox::new(1);
    uplink_routed_by_policy(&sb);
    let mut enis = sb.enis_with_secondaries(&[2], false);
    enis.push(StaticEniConfig {
        device_index: Some(2),
        secondary_ipv4: vec!["10.99.0.11".parse().unwrap()],
        ..entry_for(&sb, "eth0")
    });
    let dir = tempfile::tempdir().unwrap();
    let before = (fingerprint(&sb, "eth0"), host_routing(&sb));
    let config = SecondaryConfig {
        cooldown: std::time::Duration::ZERO,
        ..SecondaryConfig::default()
    };
    let mgr = secondary_manager(&sb, &enis, &dir.path().join("cp.json"), config).await;
    mgr.recover().await.expect("recover");
    let report = mgr
        .gc(&enim_api::GcRequest::default(), std::time::Duration::ZERO)
        .await;
    assert!(report.errors.is_empty(), "{report:?}");
    assert_eq!(fingerprint(&sb, "eth0"), before.0, "eth0 was touched");
    let routing = host_routing(&sb);
    assert!(!routing.contains("table 1002"), "{routing}");
    let listed = mgr.enis().await.unwrap();
    let state = |id: &str| listed.iter().find(|e| e.eni.id == id).unwrap().state;
    assert_eq!(state("eni-eth0"), enim_api::EniState::Excluded);
    assert_eq!(state("eni-0000"), enim_api::EniState::InUse);
    let pod = NamedNetns::new("pod");
    let r = mgr.add(&owner("c1", "eth0"), &pod.path()).await.unwrap();
    assert_eq!(r.eni_id, "eni-0000");
    mgr.del(&owner("c1", "eth0")).await.unwrap();
}
