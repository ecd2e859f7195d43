//! The kernel side of secondary mode: host ENIs with their own route tables,
//! pod veth pairs, proxy neighbour entries and policy rules.
//!
//! The secondary driver speaks only through [`SecondaryPlumbing`], so its logic is
//! unit-tested over a fake; [`RtnlSecondary`] does the real work: this file
//! says which kernel objects a pod or an ENI needs, and the verbs of
//! [`crate::netlink`] make them, on the [`Host`] socket it shares with
//! primary mode, plus a short-lived connection per pod namespace.
//! Errors are [`PlumbingError`]s, shared with primary mode.

use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use enim_core::MacAddr;
use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use super::{SecondaryConfig, GATEWAY4, GATEWAY6};
use crate::netlink::addr::{self, AddrOptions};
use crate::netlink::devconf::{self, Ipv4Conf, NeighTable};
use crate::netlink::handout::{self, Own};
use crate::netlink::host::handle_in;
use crate::netlink::{link, neigh, route, rule, sysctl};
use crate::netlink::{Host, LinkInfo, Netns, PlumbingError, PodLinkState};

pub use crate::netlink::rule::{OwnedRule, RuleSelector, MAIN_TABLE};

/// A host ENI as secondary mode sets it up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostEniSpec {
    pub mac: MacAddr,
    /// Its deterministic host name.
    pub name: String,
    /// `None` keeps the device's MTU.
    pub mtu: Option<u32>,
    pub table: u32,
    /// Primary addresses, put on the ENI without a prefix route (the ENI's
    /// table does the routing); they give ARP and NA a proper source.
    pub ipv4: Ipv4Net,
    pub gateway4: Ipv4Addr,
    pub ipv6: Option<Ipv6Net>,
    pub gateway6: Option<Ipv6Addr>,
}

/// Everything the kernel holds for one pod, and all teardown needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodSpec {
    pub netns: PathBuf,
    pub ifname: String,
    pub host_veth: String,
    pub mtu: u32,
    pub ipv4: Option<Ipv4Addr>,
    pub ipv6: Option<Ipv6Addr>,
    /// The ENI's host name; `None` when the ENI is gone (teardown then
    /// skips its proxy entries, which went with it).
    pub eni: Option<String>,
    pub table: u32,
    pub priority_to_pod: u32,
    pub priority_from_pod: u32,
    /// Destinations refused in the pod (the metadata service,
    /// [`crate::support::metadata`]).
    pub blocked: Vec<IpNet>,
}

impl PodSpec {
    pub fn ips(&self) -> Vec<IpAddr> {
        enim_api::model::record::pod_ips(self.ipv4, self.ipv6)
    }

    /// The two rules of each pod address.
    pub fn rules(&self) -> Vec<OwnedRule> {
        self.ips()
            .into_iter()
            .flat_map(|ip| {
                [
                    OwnedRule {
                        priority: self.priority_to_pod,
                        table: MAIN_TABLE,
                        selector: RuleSelector::To(ip),
                    },
                    OwnedRule {
                        priority: self.priority_from_pod,
                        table: self.table,
                        selector: RuleSelector::From(ip),
                    },
                ]
            })
            .collect()
    }
}

/// What the host holds that looks like enim's (GC's input).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inventory {
    /// veths named like a pod veth's host end.
    pub veths: Vec<String>,
    /// Rules at enim's priorities: `to` rules into main, `from` rules into
    /// a table of enim's range.
    pub rules: Vec<OwnedRule>,
    /// Tables of enim's range that hold routes.
    pub tables: BTreeSet<u32>,
    /// Proxy neighbour entries on the given ENIs: (address, ENI name).
    pub proxies: Vec<(IpAddr, String)>,
}

/// What the kernel has of one pod (CHECK and recovery compare it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodObservation {
    /// The pod end, found by name in the pod netns.
    pub pod: Option<PodLinkState>,
    /// The host end: `Some(up)` when it exists.
    pub host_veth_up: Option<bool>,
    /// Host-side pieces that are missing (rules, routes, proxy entries).
    pub missing: Vec<String>,
}

#[async_trait]
pub trait SecondaryPlumbing: Send + Sync {
    /// Checks that `path` is a network namespace a pod can be in: one the
    /// agent can enter, and not the node's own (enimd's, or `host_netns`:
    /// [`PlumbingError::NodeNetns`]).
    async fn check_netns(&self, path: &Path) -> Result<(), PlumbingError>;

    /// Forwarding in the host namespace for the families pods use. IPv4
    /// forwarding is per device (each ENI and pod veth gets it as it is set
    /// up), so this turns on IPv6's, which is namespace-wide, when `ipv6`.
    async fn enable_forwarding(&self, ipv6: bool) -> Result<(), PlumbingError>;

    /// The MAC of the host's primary interface (the device of the main
    /// table's IPv4 default route), never to be used as a host ENI.
    async fn primary_mac(&self) -> Result<Option<MacAddr>, PlumbingError>;

    /// Renames, tunes and brings up a host ENI and fills its route table.
    /// Idempotent. Fails with [`PlumbingError::LinkNotFound`] when no
    /// device has the MAC, and with [`PlumbingError::Refused`], touching
    /// nothing, when the device is the node's own
    /// ([`crate::netlink::handout`]'s rule).
    async fn setup_eni(&self, spec: &HostEniSpec) -> Result<LinkInfo, PlumbingError>;

    /// Creates the pod's veth pair and everything around it; returns the
    /// pod interface's MAC. Fails with [`PlumbingError::NameTaken`] when
    /// the pod already has an interface named `ifname`. On failure, part
    /// may exist: [`SecondaryPlumbing::teardown_pod`] removes it.
    async fn setup_pod(&self, spec: &PodSpec) -> Result<MacAddr, PlumbingError>;

    /// Removes the pod's rules, proxy entries and veth pair (its routes go
    /// with the veth). Succeeds when some or all are already gone, and never
    /// touches the pod netns's own interfaces.
    async fn teardown_pod(&self, spec: &PodSpec) -> Result<(), PlumbingError>;

    async fn observe_pod(&self, spec: &PodSpec) -> Result<PodObservation, PlumbingError>;

    /// Everything in the host that has enim's shape under `config`; proxy
    /// entries are listed for the ENIs named in `enis` only.
    async fn inventory(
        &self,
        config: &SecondaryConfig,
        enis: &[String],
    ) -> Result<Inventory, PlumbingError>;

    async fn remove_rule(&self, rule: &OwnedRule) -> Result<(), PlumbingError>;
    /// Deletes every route of `table`.
    async fn flush_table(&self, table: u32) -> Result<(), PlumbingError>;
    async fn remove_veth(&self, name: &str) -> Result<(), PlumbingError>;
    async fn remove_proxy(&self, ip: IpAddr, eni: &str) -> Result<(), PlumbingError>;
}

/// The real plumbing, over the [`Host`] it shares with primary mode.
pub struct RtnlSecondary {
    host: Host,
    /// Where the IPv6 sysctls are written ([`SecondaryConfig::proc_sys_net`]).
    proc_sys_net: PathBuf,
    /// The prefix of the pod veths' host ends: such a veth is never taken
    /// as an ENI ([`handout`]).
    veth_prefix: String,
    /// enim's route tables (first, last): routes there are enim's.
    tables: (u32, u32),
}

impl RtnlSecondary {
    /// In the host namespace at `host_netns` (the agent's own by default;
    /// tests use a throwaway one), under `config` (IPv6 sysctls written
    /// under its `proc_sys_net`). Opens a [`Host`] of its own;
    /// [`RtnlSecondary::from_host`] shares one.
    pub async fn new(
        host_netns: Option<&Path>,
        config: &SecondaryConfig,
    ) -> Result<Self, PlumbingError> {
        Ok(Self::from_host(Host::open(host_netns).await?, config))
    }

    pub fn from_host(host: Host, config: &SecondaryConfig) -> Self {
        RtnlSecondary {
            host,
            proc_sys_net: config.proc_sys_net.clone(),
            veth_prefix: config.veth_prefix.clone(),
            tables: (*config.tables().start(), *config.tables().end()),
        }
    }

    /// The device of `spec`'s ENI, once [`handout`]'s rule lets it be
    /// taken (what enim itself put on it, its addresses and the routes of
    /// its table range, does not count): [`PlumbingError::Refused`] when it is the node's own,
    /// [`PlumbingError::LinkNotFound`] when no device has the MAC. One
    /// dump of every device, which the rule reads too.
    async fn eni_device(&self, spec: &HostEniSpec) -> Result<LinkInfo, PlumbingError> {
        let all = self.host.dump(handout::dump_devices).await?;
        let not_found = || PlumbingError::LinkNotFound {
            mac: spec.mac,
            place: "the host namespace".into(),
        };
        let device = all
            .iter()
            .find(|d| d.mac == Some(spec.mac))
            .ok_or_else(not_found)?;
        let own_addresses: Vec<IpAddr> = std::iter::once(IpAddr::V4(spec.ipv4.addr()))
            .chain(spec.ipv6.map(|n| IpAddr::V6(n.addr())))
            .collect();
        let prefixes = [self.veth_prefix.as_str()];
        let own = Own {
            veth_prefixes: &prefixes,
            tables: Some(self.tables),
            addresses: &own_addresses,
        };
        if let Some(why) =
            handout::judge(&self.host, handout::Routing::Fresh, device, Some(&all), own).await?
        {
            return Err(PlumbingError::Refused {
                mac: spec.mac,
                device: device.name.clone(),
                why: Box::new(why),
            });
        }
        device.info().ok_or_else(not_found)
    }

    async fn configure_pod_end(
        &self,
        ns: &Netns,
        spec: &PodSpec,
        host_mac: MacAddr,
    ) -> Result<MacAddr, PlumbingError> {
        let pod = handle_in(ns).await?;
        let link = link::must_exist(
            link::by_name(&pod, &spec.ifname).await?,
            "pod end of the veth",
            format!("{} vanished from {}", spec.ifname, spec.netns.display()),
        )?;
        link::set_up(&pod, link.index, None, "set pod interface up").await?;
        if let Some(v4) = spec.ipv4 {
            let net = IpNet::V4(Ipv4Net::new(v4, 32).expect("valid prefix"));
            let options = AddrOptions::default().or_existing();
            addr::add(&pod, link.index, net, options, "add pod IPv4").await?;
        }
        if let Some(v6) = spec.ipv6 {
            let net = IpNet::V6(Ipv6Net::new(v6, 128).expect("valid prefix"));
            let options = AddrOptions::NODAD.or_existing();
            addr::add(&pod, link.index, net, options, "add pod IPv6").await?;
        }
        let gateways: Vec<IpAddr> = [
            spec.ipv4.map(|_| IpAddr::V4(GATEWAY4)),
            spec.ipv6.map(|_| IpAddr::V6(GATEWAY6)),
        ]
        .into_iter()
        .flatten()
        .collect();
        for gw in gateways {
            route::veth_gateway(&pod, link.index, gw, host_mac).await?;
            let op = "add pod default route";
            route::replace(&pod, route::default_via(gw, link.index, MAIN_TABLE), op).await?;
        }
        route::prohibit_all(&pod, &spec.blocked).await?;
        Ok(link.mac)
    }
}

#[async_trait]
impl SecondaryPlumbing for RtnlSecondary {
    async fn check_netns(&self, path: &Path) -> Result<(), PlumbingError> {
        self.host.check_pod_netns(path)
    }

    async fn enable_forwarding(&self, ipv6: bool) -> Result<(), PlumbingError> {
        if !ipv6 {
            return Ok(());
        }
        sysctl::enable_ipv6_forwarding(self.host.netns(), &self.proc_sys_net).await
    }

    async fn primary_mac(&self) -> Result<Option<MacAddr>, PlumbingError> {
        self.host.primary_mac().await
    }

    async fn setup_eni(&self, spec: &HostEniSpec) -> Result<LinkInfo, PlumbingError> {
        let handle = self.host.handle();
        let mut link = self.eni_device(spec).await?;
        if link.name != spec.name {
            let netns = self.host.netns().path();
            link::rename(handle, link.index, &spec.name, None, netns, "rename ENI").await?;
            link.name = spec.name.clone();
        }
        // It forwards (replies to pods arrive on it), filters reverse paths
        // loosely (they arrive for addresses main routes to pod veths) and
        // answers ARP / NS for the pods' addresses at once.
        let tune = [(Ipv4Conf::Forwarding, 1), (Ipv4Conf::RpFilter, 2)];
        devconf::set_ipv4(handle, link.index, &tune, "tune ENI (IPv4)").await?;
        let mut tables = vec![NeighTable::Arp];
        if spec.ipv6.is_some() {
            let netns = self.host.netns();
            sysctl::tune_ipv6_proxy_device(netns, &self.proc_sys_net, &spec.name).await?;
            tables.push(NeighTable::Ndisc);
        }
        for table in tables {
            let op = "set ENI proxy delay";
            devconf::set_proxy_delay(handle, table, link.index, Duration::ZERO, op).await?;
        }
        link::set_up(handle, link.index, spec.mtu, "set ENI MTU and up").await?;
        if let Some(mtu) = spec.mtu {
            link.mtu = mtu;
        }
        link.up = true;

        // The ENI's table does the routing: no prefix routes in main.
        let options = AddrOptions {
            noprefixroute: true,
            ..AddrOptions::default()
        }
        .or_existing();
        let v4 = IpNet::V4(spec.ipv4);
        addr::add(handle, link.index, v4, options, "add ENI IPv4 address").await?;
        let mut gateways = vec![IpAddr::V4(spec.gateway4)];
        if let (Some(net), Some(gw)) = (spec.ipv6, spec.gateway6) {
            let options = AddrOptions {
                nodad: true,
                ..options
            };
            let v6 = IpNet::V6(net);
            addr::add(handle, link.index, v6, options, "add ENI IPv6 address").await?;
            gateways.push(IpAddr::V6(gw));
        }
        for gw in gateways {
            // The link route first: the kernel checks the default route's
            // gateway is reachable in the same table.
            let op = "add ENI table gateway route";
            route::replace(handle, route::to_host(gw, link.index, spec.table), op).await?;
            let op = "add ENI table default route";
            let default = route::default_via(gw, link.index, spec.table);
            route::replace(handle, default, op).await?;
        }
        Ok(link)
    }

    async fn setup_pod(&self, spec: &PodSpec) -> Result<MacAddr, PlumbingError> {
        let handle = self.host.handle();
        let ns = Netns::open(&spec.netns)?;
        // The host name derives from this attachment's key: a veth under it
        // is a leftover of this very attachment.
        self.remove_veth(&spec.host_veth).await?;
        // The pod end is born inside the pod netns under its final name: no
        // window in which the host sees it, and a clash is a plain EEXIST.
        link::add_veth_pair(handle, &spec.host_veth, &spec.ifname, &ns, spec.mtu).await?;
        let host = link::must_exist(
            link::by_name(handle, &spec.host_veth).await?,
            "host end of the veth",
            format!("{} vanished after creation", spec.host_veth),
        )?;
        link::set_up(handle, host.index, None, "set host veth up").await?;
        // The pod's packets arrive here to be routed out of its ENI.
        let forward = [(Ipv4Conf::Forwarding, 1)];
        devconf::set_ipv4(handle, host.index, &forward, "let host veth forward").await?;
        if spec.ipv6.is_some() {
            // The pod's IPv6 gateway, valid at once (NODAD); it is also the
            // source of the host's NS towards the pod.
            let gw = IpNet::V6(Ipv6Net::new(GATEWAY6, 64).expect("valid prefix"));
            let op = "add fe80::1 to host veth";
            let options = AddrOptions::NODAD.or_existing();
            addr::add(handle, host.index, gw, options, op).await?;
        }
        let pod_mac = self.configure_pod_end(&ns, spec, host.mac).await?;
        drop(ns);

        for ip in spec.ips() {
            let op = "add host route to pod";
            route::replace(handle, route::to_host(ip, host.index, MAIN_TABLE), op).await?;
        }
        if let Some(eni_name) = &spec.eni {
            let eni = link::must_exist(
                link::by_name(handle, eni_name).await?,
                "ENI of the pod",
                format!("no device {eni_name} in the host"),
            )?;
            for ip in spec.ips() {
                // The ENI answers the gateway's ARP/NS for the pod address.
                neigh::add_proxy(handle, eni.index, ip).await?;
            }
        }
        for rule in spec.rules() {
            rule::add(handle, &rule).await?;
        }
        Ok(pod_mac)
    }

    async fn teardown_pod(&self, spec: &PodSpec) -> Result<(), PlumbingError> {
        // Rules first, so nothing is steered at a half-removed pod.
        for rule in spec.rules() {
            self.remove_rule(&rule).await?;
        }
        if let Some(eni) = &spec.eni {
            for ip in spec.ips() {
                self.remove_proxy(ip, eni).await?;
            }
        }
        // Deleting one end deletes both, and the host routes through it.
        self.remove_veth(&spec.host_veth).await
    }

    async fn observe_pod(&self, spec: &PodSpec) -> Result<PodObservation, PlumbingError> {
        let handle = self.host.handle();
        let ns = Netns::open(&spec.netns)?;
        let pod_handle = handle_in(&ns).await?;
        let pod = match link::by_name(&pod_handle, &spec.ifname).await? {
            None => None,
            Some(link) => Some(link::pod_state(&pod_handle, link).await?),
        };
        drop((pod_handle, ns));

        let mut missing = Vec::new();
        let host = link::by_name(handle, &spec.host_veth).await?;
        if let Some(host) = &host {
            let routes = self.host.dump(route::dump).await?;
            for ip in spec.ips() {
                if !routes
                    .iter()
                    .any(|r| r.is_host_route(ip, host.index, MAIN_TABLE))
                {
                    missing.push(format!("host route to {ip} via {}", spec.host_veth));
                }
            }
        }
        let rules: BTreeSet<OwnedRule> = self
            .host
            .dump(rule::dump_owned)
            .await?
            .into_iter()
            .collect();
        for rule in spec.rules() {
            if !rules.contains(&rule) {
                missing.push(format!("rule {rule}"));
            }
        }
        if let Some(eni_name) = &spec.eni {
            match link::by_name(handle, eni_name).await? {
                None => missing.push(format!("ENI {eni_name}")),
                Some(eni) => {
                    let proxies: BTreeSet<IpAddr> = self
                        .host
                        .dump(neigh::dump_proxies)
                        .await?
                        .into_iter()
                        .filter(|(index, _)| *index == eni.index)
                        .map(|(_, ip)| ip)
                        .collect();
                    for ip in spec.ips() {
                        if !proxies.contains(&ip) {
                            missing.push(format!("proxy entry for {ip} on {eni_name}"));
                        }
                    }
                }
            }
        }
        Ok(PodObservation {
            pod,
            host_veth_up: host.map(|h| h.up),
            missing,
        })
    }

    async fn inventory(
        &self,
        config: &SecondaryConfig,
        enis: &[String],
    ) -> Result<Inventory, PlumbingError> {
        let mut inventory = Inventory::default();
        let mut eni_index: HashMap<u32, String> = HashMap::new();
        for (link, veth) in self.host.dump(link::dump_marking_veths).await? {
            if veth && config.is_veth_name(&link.name) {
                inventory.veths.push(link.name);
            } else if enis.contains(&link.name) {
                eni_index.insert(link.index, link.name);
            }
        }
        let tables = config.tables();
        inventory.rules = self
            .host
            .dump(rule::dump_owned)
            .await?
            .into_iter()
            .filter(|r| match r.selector {
                RuleSelector::To(_) => {
                    r.priority == config.rule_priority_to_pod && r.table == MAIN_TABLE
                }
                RuleSelector::From(_) => {
                    r.priority == config.rule_priority_from_pod && tables.contains(&r.table)
                }
            })
            .collect();
        inventory.tables = self
            .host
            .dump(route::dump)
            .await?
            .iter()
            .map(|r| r.table)
            .filter(|t| tables.contains(t))
            .collect();
        inventory.proxies = self
            .host
            .dump(neigh::dump_proxies)
            .await?
            .into_iter()
            .filter_map(|(index, ip)| Some((ip, eni_index.get(&index)?.clone())))
            .collect();
        Ok(inventory)
    }

    async fn remove_rule(&self, rule: &OwnedRule) -> Result<(), PlumbingError> {
        rule::delete(self.host.handle(), rule).await
    }

    async fn flush_table(&self, table: u32) -> Result<(), PlumbingError> {
        let routes = self.host.dump(route::dump).await?;
        for r in routes.into_iter().filter(|r| r.table == table) {
            route::delete(self.host.handle(), r, "delete route").await?;
        }
        Ok(())
    }

    async fn remove_veth(&self, name: &str) -> Result<(), PlumbingError> {
        link::delete(self.host.handle(), name, "delete veth").await
    }

    async fn remove_proxy(&self, ip: IpAddr, eni: &str) -> Result<(), PlumbingError> {
        let Some(link) = link::by_name(self.host.handle(), eni).await? else {
            // The entries went with the device.
            return Ok(());
        };
        neigh::delete_proxy(self.host.handle(), link.index, ip).await
    }
}
