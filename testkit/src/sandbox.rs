//! The kernel sandbox: a host namespace holding veth pairs that stand in
//! for ENIs, their far ends in a gateway namespace holding the gateway
//! addresses, and pods in namespaces of their own. Every namespace is
//! removed on drop, pass or fail.

use std::time::{Duration, Instant};

use enim_provider_static::StaticEniConfig;

use crate::fixtures::{static_eni, with_secondaries, HOST_MTU, POD_MTU};
use crate::netns::NamedNetns;

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
            "link",
            "add",
            &name,
            "address",
            &mac,
            "mtu",
            &HOST_MTU.to_string(),
            "type",
            "veth",
            "peer",
            "name",
            &peer,
            "netns",
            gw_ns,
            "mtu",
            &POD_MTU.to_string(),
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
