//! The kernel sandbox: a host namespace holding veth pairs that stand in
//! for ENIs, their far ends in a gateway namespace holding the gateway
//! addresses, and pods in namespaces of their own. Every namespace is
//! removed on drop, pass or fail.

use std::time::{Duration, Instant};

use enim_core::MacAddr;
use enim_provider_static::StaticEniConfig;
use serde_json::Value;

use crate::agent::Agent;
use crate::fixtures::{static_eni, with_secondaries};
use crate::netns::{find_mac, NamedNetns};

/// The ENIs' MTU at home, in the host namespace.
pub const HOST_MTU: u32 = 1500;
/// The ENIs' MTU in a pod (their config's `mtu`).
pub const POD_MTU: u32 = 9000;

/// A host namespace holding `n` veth "ENIs" (`eni0`..), each the near end of
/// a pair whose far end (`gw<i>`) sits in the gateway namespace with the
/// gateway addresses; see [`static_eni`] for ENI i's addresses.
pub struct Sandbox {
    pub host: NamedNetns,
    pub gateway: NamedNetns,
    pub enis: Vec<StaticEniConfig>,
}

impl Sandbox {
    pub fn new(n: usize) -> Self {
        let mut sb = Sandbox {
            host: NamedNetns::new("host"),
            gateway: NamedNetns::new("gw"),
            enis: Vec::new(),
        };
        for i in 0..n {
            sb.enis.push(static_eni(i));
            sb.plug_eni(i);
        }
        sb
    }

    /// Creates ENI i's veth pair: `eni<i>` in the host, its far end with the
    /// gateway addresses in the gateway namespace. Also brings back an ENI
    /// destroyed with a pod netns, as a physical one would return.
    pub fn plug_eni(&self, i: usize) {
        // A deleted netns is torn down asynchronously: wait until the old
        // pair is really gone before making the new one.
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.gateway.link(&format!("gw{i}")).is_some() {
            assert!(
                Instant::now() < deadline,
                "old veth of ENI {i} never went away"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let mac = self.enis[i].mac.to_string();
        let (name, peer) = (format!("eni{i}"), format!("gw{i}"));
        let gw_ns = self.gateway.name.as_str();
        self.host.ip(&[
            "link", "add", &name, "address", &mac, "mtu", "1500", "type", "veth", "peer", "name",
            &peer, "netns", gw_ns, "mtu", "9000",
        ]);
        self.gateway
            .ip(&["addr", "add", &format!("10.77.{i}.1/24"), "dev", &peer]);
        self.gateway.ip(&[
            "addr",
            "add",
            &format!("fd00:e1:{i}::1/64"),
            "dev",
            &peer,
            "nodad",
        ]);
        self.gateway.ip(&["link", "set", &peer, "up"]);
    }

    /// The sandbox's ENIs for secondary mode (see [`with_secondaries`]).
    pub fn enis_with_secondaries(&self, counts: &[usize], ipv6: bool) -> Vec<StaticEniConfig> {
        with_secondaries(&self.enis, counts, ipv6)
    }

    /// Everything of the host namespace a secondary-mode pod could leave
    /// behind: rules, routes of every table, links, proxy neighbour entries.
    pub fn host_state(&self) -> Vec<String> {
        let mut out = Vec::new();
        for family in ["-4", "-6"] {
            out.push(self.host.ip(&[family, "rule", "list"]));
            out.push(self.host.ip(&[family, "route", "show", "table", "all"]));
            out.push(self.host.ip(&[family, "neigh", "show", "proxy"]));
        }
        out.push(self.host.link_names().join(" "));
        out
    }

    /// Asserts ENI i is home: in the host netns under `eni<i>` with the host
    /// MTU, and without the pod's addresses.
    pub fn assert_home(&self, i: usize) {
        let link = self
            .host
            .link_by_mac(self.enis[i].mac)
            .unwrap_or_else(|| panic!("ENI {i} is not in the host namespace"));
        assert_eq!(link["ifname"], format!("eni{i}"), "ENI {i} host name");
        assert_eq!(link["mtu"], HOST_MTU, "ENI {i} host MTU");
        // The pod's addresses must not follow the ENI home.
        assert_eq!(
            self.host.addrs(&format!("eni{i}")),
            Vec::<String>::new(),
            "ENI {i} host addresses"
        );
    }

    /// [`Sandbox::assert_home`] for every ENI.
    pub fn assert_all_home(&self) {
        for i in 0..self.enis.len() {
            self.assert_home(i);
        }
    }
}

/// Every ENI is either (a) in a live pod netns under the pod's ifname,
/// configured and recorded once, or (b) in the host under its host name
/// with its host MTU, free in the provider and in no record. No record
/// points at a missing ENI. ENIs in `destroyed` (veth stand-ins that died
/// with their netns) must be free and unrecorded, wherever they are not.
pub fn assert_invariant(
    sb: &Sandbox,
    pods: &[&NamedNetns],
    agent: &Agent,
    destroyed: &[usize],
    when: &str,
) {
    let enis = agent.ctl(&["enis"]);
    let attachments = agent.attachments();
    // One link dump per namespace, not one per ENI: the soak checks this
    // after every event.
    let host_links = sb.host.links();
    let pod_links: Vec<Vec<Value>> = pods.iter().map(|p| p.links()).collect();
    for (i, eni) in sb.enis.iter().enumerate() {
        let mac = eni.mac.to_string();
        let status = enis["enis"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["id"] == eni.id.as_str())
            .unwrap();
        let records: Vec<_> = attachments
            .iter()
            .filter(|a| a["mac"] == mac.as_str())
            .collect();
        if destroyed.contains(&i) {
            assert_eq!(
                status["state"], "free",
                "{when}: destroyed ENI {i} is still held: {status}"
            );
            assert!(
                records.is_empty(),
                "{when}: destroyed ENI {i} is still recorded: {records:?}"
            );
            continue;
        }
        if let Some(link) = find_mac(&host_links, &mac) {
            assert_eq!(
                link["ifname"],
                format!("eni{i}"),
                "{when}: ENI {i} home name"
            );
            assert_eq!(link["mtu"], HOST_MTU, "{when}: ENI {i} home MTU");
            assert_eq!(
                status["state"], "free",
                "{when}: ENI {i} is home but the provider holds it: {status}"
            );
            assert!(
                records.is_empty(),
                "{when}: ENI {i} is home but recorded: {records:?}"
            );
            continue;
        }
        let (pod, link) = pods
            .iter()
            .zip(&pod_links)
            .find_map(|(p, links)| find_mac(links, &mac).map(|l| (p, l)))
            .unwrap_or_else(|| panic!("{when}: ENI {i} is neither home nor in a pod"));
        assert_eq!(link["ifname"], "eth0", "{when}: ENI {i} in pod");
        assert_eq!(link["mtu"], POD_MTU, "{when}: ENI {i} pod MTU");
        assert!(
            pod.addrs("eth0").contains(&format!("10.77.{i}.10/24")),
            "{when}: ENI {i} not configured"
        );
        assert!(
            pod.ip(&["route", "show", "default"])
                .contains(&format!("via 10.77.{i}.1")),
            "{when}: no default route"
        );
        assert_eq!(
            records.len(),
            1,
            "{when}: ENI {i} in a pod must be recorded once: {records:?}"
        );
        assert_eq!(records[0]["phase"], "ready", "{when}");
        assert_eq!(
            records[0]["netns"],
            pod.path().display().to_string(),
            "{when}"
        );
        assert_eq!(status["state"], "in_use", "{when}");
        assert_eq!(
            status["owner"]["container_id"], records[0]["container_id"],
            "{when}: two owners"
        );
    }
    for rec in &attachments {
        let mac: MacAddr = rec["mac"].as_str().unwrap().parse().unwrap();
        let held = pods.iter().zip(&pod_links).any(|(p, links)| {
            p.path().display().to_string() == rec["netns"]
                && find_mac(links, &mac.to_string()).is_some()
        });
        assert!(held, "{when}: record points at a missing ENI: {rec}");
    }
}
