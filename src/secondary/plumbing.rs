//! The kernel side of secondary mode: host ENIs with their own route tables,
//! pod veth pairs, proxy neighbour entries and policy rules.
//!
//! The manager speaks only through [`SecondaryPlumbing`], so its logic is
//! unit-tested over a fake; [`RtnlSecondary`] does the real work over
//! rtnetlink on one connection to the host namespace, plus a short-lived
//! connection per pod namespace (thread pattern of [`crate::netlink::netns`]).
//! Errors are [`PlumbingError`]s, shared with primary mode.

use std::collections::{BTreeSet, HashMap};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use enim_provider::MacAddr;
use futures::TryStreamExt;
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use rtnetlink::packet_route::address::{AddressAttribute, AddressFlags};
use rtnetlink::packet_route::link::{
    InfoData, InfoKind, InfoVeth, LinkAttribute, LinkInfo as NlLinkInfo, LinkMessage,
};
use rtnetlink::packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage, NeighbourState,
};
use rtnetlink::packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteScope,
};
use rtnetlink::packet_route::rule::{RuleAction, RuleAttribute, RuleMessage};
use rtnetlink::packet_route::AddressFamily;
use rtnetlink::{Handle, IpVersion, LinkMessageBuilder, LinkUnspec, RouteMessageBuilder};

use super::{SecondaryConfig, GATEWAY4, GATEWAY6};
use crate::netlink::rtnl::{
    dump_routes, errno, handle_in, link_info, nl, pod_link_state, primary_mac, route_oif, set_link,
    table_of_route,
};
use crate::netlink::{netns, LinkInfo, Netns, PlumbingError, PodLinkState};

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
}

impl PodSpec {
    pub fn ips(&self) -> Vec<IpAddr> {
        crate::model::record::pod_ips(self.ipv4, self.ipv6)
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

pub use crate::netlink::rtnl::MAIN_TABLE;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RuleSelector {
    /// `to <ip>/32` (or /128).
    To(IpAddr),
    /// `from <ip>/32` (or /128).
    From(IpAddr),
}

/// A policy rule of enim's shape: one host address selector, ToTable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OwnedRule {
    pub priority: u32,
    pub table: u32,
    pub selector: RuleSelector,
}

impl std::fmt::Display for OwnedRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.selector {
            RuleSelector::To(ip) => write!(f, "{}: to {ip} lookup {}", self.priority, self.table),
            RuleSelector::From(ip) => {
                write!(f, "{}: from {ip} lookup {}", self.priority, self.table)
            }
        }
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
    /// Checks that `path` is a network namespace the agent can enter.
    async fn check_netns(&self, path: &Path) -> Result<(), PlumbingError>;

    /// IPv4 forwarding on in the host namespace (and IPv6 when asked).
    async fn enable_forwarding(&self, ipv6: bool) -> Result<(), PlumbingError>;

    /// The MAC of the host's primary interface (the device of the main
    /// table's IPv4 default route), never to be used as a host ENI.
    async fn primary_mac(&self) -> Result<Option<MacAddr>, PlumbingError>;

    /// Renames, tunes and brings up a host ENI and fills its route table.
    /// Idempotent. Fails with [`PlumbingError::LinkNotFound`] when no
    /// device has the MAC.
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

/// Treats the listed errnos as success (already there / already gone).
fn tolerate(
    result: Result<(), rtnetlink::Error>,
    errnos: &[i32],
    op: &'static str,
) -> Result<(), PlumbingError> {
    match result {
        Err(e) if errno(&e).is_some_and(|n| errnos.contains(&n)) => Ok(()),
        other => other.map_err(nl(op)),
    }
}

fn is_veth(msg: &LinkMessage) -> bool {
    msg.attributes.iter().any(|a| match a {
        LinkAttribute::LinkInfo(infos) => infos
            .iter()
            .any(|i| matches!(i, NlLinkInfo::Kind(InfoKind::Veth))),
        _ => false,
    })
}

async fn link_by_name(handle: &Handle, name: &str) -> Result<Option<LinkInfo>, PlumbingError> {
    let mut found = handle.link().get().match_name(name).execute();
    match found.try_next().await {
        Ok(msg) => Ok(msg.as_ref().and_then(link_info)),
        Err(e) if errno(&e) == Some(libc::ENODEV) => Ok(None),
        Err(e) => Err(nl("link get")(e)),
    }
}

async fn add_address(
    handle: &Handle,
    index: u32,
    net: IpNet,
    flags: AddressFlags,
    op: &'static str,
) -> Result<(), PlumbingError> {
    let mut req = handle.address().add(index, net.addr(), net.prefix_len());
    if !flags.is_empty() {
        req.message_mut()
            .attributes
            .push(AddressAttribute::Flags(flags));
    }
    tolerate(req.execute().await, &[libc::EEXIST], op)
}

fn route_dst(r: &RouteMessage) -> Option<IpAddr> {
    r.attributes.iter().find_map(|a| match a {
        RouteAttribute::Destination(RouteAddress::Inet(v4)) => Some(IpAddr::V4(*v4)),
        RouteAttribute::Destination(RouteAddress::Inet6(v6)) => Some(IpAddr::V6(*v6)),
        _ => None,
    })
}

fn host_prefix(ip: IpAddr) -> u8 {
    if ip.is_ipv4() {
        32
    } else {
        128
    }
}

/// A route to `ip` alone through device `index` in `table`.
fn host_route(ip: IpAddr, index: u32, table: u32) -> RouteMessage {
    match ip {
        IpAddr::V4(v4) => RouteMessageBuilder::<Ipv4Addr>::new()
            .destination_prefix(v4, 32)
            .output_interface(index)
            .scope(RouteScope::Link)
            .table_id(table)
            .build(),
        IpAddr::V6(v6) => RouteMessageBuilder::<Ipv6Addr>::new()
            .destination_prefix(v6, 128)
            .output_interface(index)
            .table_id(table)
            .build(),
    }
}

/// The default route via `gw` on device `index` in `table`.
fn default_route(gw: IpAddr, index: u32, table: u32) -> RouteMessage {
    match gw {
        IpAddr::V4(v4) => RouteMessageBuilder::<Ipv4Addr>::new()
            .gateway(v4)
            .output_interface(index)
            .table_id(table)
            .build(),
        IpAddr::V6(v6) => RouteMessageBuilder::<Ipv6Addr>::new()
            .gateway(v6)
            .output_interface(index)
            .table_id(table)
            .build(),
    }
}

fn rule_message(rule: &OwnedRule) -> RuleMessage {
    let mut msg = RuleMessage::default();
    let ip = match rule.selector {
        RuleSelector::To(ip) | RuleSelector::From(ip) => ip,
    };
    msg.header.family = if ip.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    };
    // Without an explicit action the kernel accepts the rule but every
    // lookup that hits it fails with EINVAL.
    msg.header.action = RuleAction::ToTable;
    if rule.table > 255 {
        // Table ids above 255 only fit in FRA_TABLE.
        msg.header.table = RouteHeader::RT_TABLE_UNSPEC;
        msg.attributes.push(RuleAttribute::Table(rule.table));
    } else {
        msg.header.table = rule.table as u8;
    }
    msg.attributes.push(RuleAttribute::Priority(rule.priority));
    match rule.selector {
        RuleSelector::To(ip) => {
            msg.header.dst_len = host_prefix(ip);
            msg.attributes.push(RuleAttribute::Destination(ip));
        }
        RuleSelector::From(ip) => {
            msg.header.src_len = host_prefix(ip);
            msg.attributes.push(RuleAttribute::Source(ip));
        }
    }
    msg
}

/// Reads back a rule of enim's shape, whatever its priority.
fn owned_rule(msg: &RuleMessage) -> Option<OwnedRule> {
    if msg.header.action != RuleAction::ToTable {
        return None;
    }
    let mut priority = 0;
    let mut table = msg.header.table as u32;
    let (mut src, mut dst) = (None, None);
    for attr in &msg.attributes {
        match attr {
            RuleAttribute::Priority(p) => priority = *p,
            RuleAttribute::Table(t) => table = *t,
            RuleAttribute::Source(ip) => src = Some(*ip),
            RuleAttribute::Destination(ip) => dst = Some(*ip),
            // Anything more selective (iif, fwmark...) is someone else's.
            RuleAttribute::Iifname(_)
            | RuleAttribute::Oifname(_)
            | RuleAttribute::FwMark(_)
            | RuleAttribute::UidRange(_)
            | RuleAttribute::IpProtocol(_)
            | RuleAttribute::SourcePortRange(_)
            | RuleAttribute::DestinationPortRange(_) => return None,
            _ => {}
        }
    }
    let selector = match (src, dst) {
        (Some(ip), None) if msg.header.src_len == host_prefix(ip) => RuleSelector::From(ip),
        (None, Some(ip)) if msg.header.dst_len == host_prefix(ip) => RuleSelector::To(ip),
        _ => return None,
    };
    Some(OwnedRule {
        priority,
        table,
        selector,
    })
}

fn proxy_message(ip: IpAddr, index: u32) -> NeighbourMessage {
    let mut msg = NeighbourMessage::default();
    msg.header.family = if ip.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    };
    msg.header.ifindex = index;
    msg.header.flags = NeighbourFlags::Proxy;
    msg.attributes
        .push(NeighbourAttribute::Destination(match ip {
            IpAddr::V4(v4) => NeighbourAddress::Inet(v4),
            IpAddr::V6(v6) => NeighbourAddress::Inet6(v6),
        }));
    msg
}

fn neighbour_ip(msg: &NeighbourMessage) -> Option<IpAddr> {
    msg.attributes.iter().find_map(|a| match a {
        NeighbourAttribute::Destination(NeighbourAddress::Inet(v4)) => Some(IpAddr::V4(*v4)),
        NeighbourAttribute::Destination(NeighbourAddress::Inet6(v6)) => Some(IpAddr::V6(*v6)),
        _ => None,
    })
}

/// The real plumbing, in the host namespace at `host_netns` (the agent's
/// own by default; tests use a throwaway one).
pub struct RtnlSecondary {
    host: Netns,
    handle: Handle,
    // The kernel runs one dump at a time per netlink socket (a second gets
    // EBUSY): dumps on the shared host socket take turns.
    dump: tokio::sync::Mutex<()>,
}

impl RtnlSecondary {
    pub async fn new(host_netns: Option<&Path>) -> Result<Self, PlumbingError> {
        let host = Netns::open(host_netns.unwrap_or(Path::new("/proc/self/ns/net")))?;
        let handle = handle_in(&host).await?;
        Ok(RtnlSecondary {
            host,
            handle,
            dump: Default::default(),
        })
    }

    /// Writes `/proc/sys/net/<key>` values from a thread inside the host
    /// namespace: /proc/sys/net shows the namespace of the thread that
    /// opens it, and tokio's threads must never switch.
    async fn write_sysctls(
        &self,
        entries: Vec<(String, &'static str)>,
    ) -> Result<(), PlumbingError> {
        let written = netns::run_in(&self.host, move || {
            Ok(entries.iter().try_for_each(|(key, value)| {
                let path = Path::new("/proc/sys/net").join(key);
                std::fs::write(&path, value).map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!("writing {value} to {}: {e}", path.display()),
                    )
                })
            }))
        })
        .await?;
        written.map_err(PlumbingError::io("sysctl"))
    }

    async fn host_links(&self) -> Result<Vec<LinkMessage>, PlumbingError> {
        let _turn = self.dump.lock().await;
        self.handle
            .link()
            .get()
            .execute()
            .try_collect()
            .await
            .map_err(nl("link dump"))
    }

    async fn rules(&self) -> Result<Vec<RuleMessage>, PlumbingError> {
        let _turn = self.dump.lock().await;
        let mut all = Vec::new();
        for version in [IpVersion::V4, IpVersion::V6] {
            let part: Vec<RuleMessage> = self
                .handle
                .rule()
                .get(version)
                .execute()
                .try_collect()
                .await
                .map_err(nl("rule dump"))?;
            all.extend(part);
        }
        Ok(all)
    }

    async fn routes(&self) -> Result<Vec<RouteMessage>, PlumbingError> {
        let _turn = self.dump.lock().await;
        dump_routes(&self.handle).await
    }

    async fn proxies(&self) -> Result<Vec<NeighbourMessage>, PlumbingError> {
        let _turn = self.dump.lock().await;
        self.handle
            .neighbours()
            .get()
            .proxies()
            .execute()
            .try_collect()
            .await
            .map_err(nl("proxy neighbour dump"))
    }

    async fn add_rule(&self, rule: &OwnedRule) -> Result<(), PlumbingError> {
        let mut req = self.handle.rule().add();
        *req.message_mut() = rule_message(rule);
        tolerate(req.execute().await, &[libc::EEXIST], "add rule")
    }

    async fn configure_pod_end(
        &self,
        ns: &Netns,
        spec: &PodSpec,
        host_mac: MacAddr,
    ) -> Result<MacAddr, PlumbingError> {
        let pod = handle_in(ns).await?;
        let link = link_by_name(&pod, &spec.ifname)
            .await?
            .ok_or_else(|| PlumbingError::Io {
                what: "pod end of the veth",
                source: io::Error::other(format!(
                    "{} vanished from {}",
                    spec.ifname,
                    spec.netns.display()
                )),
            })?;
        set_link(
            &pod,
            LinkUnspec::new_with_index(link.index).up().build(),
            "set pod interface up",
        )
        .await?;
        if let Some(v4) = spec.ipv4 {
            let net = IpNet::V4(Ipv4Net::new(v4, 32).expect("valid prefix"));
            add_address(&pod, link.index, net, AddressFlags::empty(), "add pod IPv4").await?;
        }
        if let Some(v6) = spec.ipv6 {
            let net = IpNet::V6(Ipv6Net::new(v6, 128).expect("valid prefix"));
            // Without NODAD the address stays tentative for a second and the
            // pod's first packets fail.
            add_address(&pod, link.index, net, AddressFlags::Nodad, "add pod IPv6").await?;
        }
        let gateways: Vec<IpAddr> = [
            spec.ipv4.map(|_| IpAddr::V4(GATEWAY4)),
            spec.ipv6.map(|_| IpAddr::V6(GATEWAY6)),
        ]
        .into_iter()
        .flatten()
        .collect();
        for gw in gateways {
            // The gateway is the host end itself: a permanent entry spares
            // the pod an ARP/NS round before its first packet.
            tolerate(
                pod.neighbours()
                    .add(link.index, gw)
                    .link_layer_address(&host_mac.octets())
                    .state(NeighbourState::Permanent)
                    .replace()
                    .execute()
                    .await,
                &[],
                "add pod gateway neighbour",
            )?;
            if gw.is_ipv4() {
                // An IPv4 gateway must be reachable on-link first.
                tolerate(
                    pod.route()
                        .add(host_route(gw, link.index, MAIN_TABLE))
                        .replace()
                        .execute()
                        .await,
                    &[],
                    "add pod gateway route",
                )?;
            }
            tolerate(
                pod.route()
                    .add(default_route(gw, link.index, MAIN_TABLE))
                    .replace()
                    .execute()
                    .await,
                &[],
                "add pod default route",
            )?;
        }
        Ok(link.mac)
    }
}

#[async_trait]
impl SecondaryPlumbing for RtnlSecondary {
    async fn check_netns(&self, path: &Path) -> Result<(), PlumbingError> {
        Netns::open(path).map(drop)
    }

    async fn enable_forwarding(&self, ipv6: bool) -> Result<(), PlumbingError> {
        let mut entries = vec![("ipv4/ip_forward".to_string(), "1")];
        if ipv6 {
            entries.push(("ipv6/conf/all/forwarding".to_string(), "1"));
        }
        self.write_sysctls(entries).await
    }

    async fn primary_mac(&self) -> Result<Option<MacAddr>, PlumbingError> {
        let _turn = self.dump.lock().await;
        primary_mac(&self.handle).await
    }

    async fn setup_eni(&self, spec: &HostEniSpec) -> Result<LinkInfo, PlumbingError> {
        let mut link = self
            .host_links()
            .await?
            .iter()
            .filter_map(link_info)
            .find(|l| l.mac == spec.mac)
            .ok_or_else(|| PlumbingError::LinkNotFound {
                mac: spec.mac,
                place: "the host namespace".into(),
            })?;
        if link.name != spec.name {
            // Kernels before 6.2 refuse to rename an UP device (EBUSY).
            let msg = LinkUnspec::new_with_index(link.index)
                .down()
                .name(spec.name.clone())
                .build();
            match set_link(&self.handle, msg, "rename ENI").await {
                Err(e) if e.errno() == Some(libc::EEXIST) => {
                    return Err(PlumbingError::NameTaken {
                        ifname: spec.name.clone(),
                        netns: self.host.path().to_path_buf(),
                    })
                }
                other => other?,
            }
            link.name = spec.name.clone();
        }
        let dev = &spec.name;
        // Loose reverse-path filtering: replies to pods arrive on the ENI
        // for addresses the main table routes elsewhere. No proxy delay: the
        // gateway's ARP/NS for a pod address is answered at once.
        let mut sysctls = vec![
            (format!("ipv4/conf/{dev}/rp_filter"), "2"),
            (format!("ipv4/neigh/{dev}/proxy_delay"), "0"),
        ];
        if spec.ipv6.is_some() {
            // No DAD: the link-local address is usable (as the source of NS
            // for the gateway) the moment the link is up.
            sysctls.extend([
                (format!("ipv6/conf/{dev}/accept_dad"), "0"),
                (format!("ipv6/conf/{dev}/proxy_ndp"), "1"),
                (format!("ipv6/neigh/{dev}/proxy_delay"), "0"),
            ]);
        }
        self.write_sysctls(sysctls).await?;
        let mut msg = LinkUnspec::new_with_index(link.index).up();
        if let Some(mtu) = spec.mtu {
            msg = msg.mtu(mtu);
            link.mtu = mtu;
        }
        set_link(&self.handle, msg.build(), "set ENI MTU and up").await?;
        link.up = true;

        add_address(
            &self.handle,
            link.index,
            IpNet::V4(spec.ipv4),
            AddressFlags::Noprefixroute,
            "add ENI IPv4 address",
        )
        .await?;
        let mut gateways = vec![IpAddr::V4(spec.gateway4)];
        if let (Some(net), Some(gw)) = (spec.ipv6, spec.gateway6) {
            add_address(
                &self.handle,
                link.index,
                IpNet::V6(net),
                AddressFlags::Nodad | AddressFlags::Noprefixroute,
                "add ENI IPv6 address",
            )
            .await?;
            gateways.push(IpAddr::V6(gw));
        }
        for gw in gateways {
            // The link route first: the kernel checks the default route's
            // gateway is reachable in the same table.
            for (route, op) in [
                (
                    host_route(gw, link.index, spec.table),
                    "add ENI table gateway route",
                ),
                (
                    default_route(gw, link.index, spec.table),
                    "add ENI table default route",
                ),
            ] {
                tolerate(
                    self.handle.route().add(route).replace().execute().await,
                    &[],
                    op,
                )?;
            }
        }
        Ok(link)
    }

    async fn setup_pod(&self, spec: &PodSpec) -> Result<MacAddr, PlumbingError> {
        let ns = Netns::open(&spec.netns)?;
        // The host name derives from this attachment's key: a veth under it
        // is a leftover of this very attachment.
        self.remove_veth(&spec.host_veth).await?;
        // The pod end is born inside the pod netns under its final name: no
        // window in which the host sees it, and a clash is a plain EEXIST.
        let peer = LinkMessageBuilder::<LinkUnspec>::new()
            .name(spec.ifname.clone())
            .mtu(spec.mtu)
            .setns_by_fd(ns.file().as_raw_fd())
            .build();
        let pair = LinkMessageBuilder::<LinkUnspec>::new_with_info_kind(InfoKind::Veth)
            .name(spec.host_veth.clone())
            .mtu(spec.mtu)
            .set_info_data(InfoData::Veth(InfoVeth::Peer(peer)))
            .build();
        match self.handle.link().add(pair).execute().await {
            Err(e) if errno(&e) == Some(libc::EEXIST) => {
                return Err(PlumbingError::NameTaken {
                    ifname: spec.ifname.clone(),
                    netns: spec.netns.clone(),
                })
            }
            other => other.map_err(nl("create veth pair"))?,
        }
        let host = link_by_name(&self.handle, &spec.host_veth)
            .await?
            .ok_or_else(|| PlumbingError::Io {
                what: "host end of the veth",
                source: io::Error::other(format!("{} vanished after creation", spec.host_veth)),
            })?;
        set_link(
            &self.handle,
            LinkUnspec::new_with_index(host.index).up().build(),
            "set host veth up",
        )
        .await?;
        if spec.ipv6.is_some() {
            // The pod's IPv6 gateway, valid at once (NODAD); it is also the
            // source of the host's NS towards the pod.
            let gw = IpNet::V6(Ipv6Net::new(GATEWAY6, 64).expect("valid prefix"));
            add_address(
                &self.handle,
                host.index,
                gw,
                AddressFlags::Nodad,
                "add fe80::1 to host veth",
            )
            .await?;
        }
        let pod_mac = self.configure_pod_end(&ns, spec, host.mac).await?;
        drop(ns);

        for ip in spec.ips() {
            tolerate(
                self.handle
                    .route()
                    .add(host_route(ip, host.index, MAIN_TABLE))
                    .replace()
                    .execute()
                    .await,
                &[],
                "add host route to pod",
            )?;
        }
        if let Some(eni_name) = &spec.eni {
            let eni =
                link_by_name(&self.handle, eni_name)
                    .await?
                    .ok_or_else(|| PlumbingError::Io {
                        what: "ENI of the pod",
                        source: io::Error::other(format!("no device {eni_name} in the host")),
                    })?;
            for ip in spec.ips() {
                // The ENI answers the gateway's ARP/NS for the pod address,
                // and for nothing else (unlike proxy_arp, which would claim
                // every address routed through another device).
                tolerate(
                    self.handle
                        .neighbours()
                        .add(eni.index, ip)
                        .flags(NeighbourFlags::Proxy)
                        .replace()
                        .execute()
                        .await,
                    &[],
                    "add proxy neighbour on ENI",
                )?;
            }
        }
        for rule in spec.rules() {
            self.add_rule(&rule).await?;
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
        let ns = Netns::open(&spec.netns)?;
        let pod_handle = handle_in(&ns).await?;
        let pod = match link_by_name(&pod_handle, &spec.ifname).await? {
            None => None,
            Some(link) => Some(pod_link_state(&pod_handle, link).await?),
        };
        drop((pod_handle, ns));

        let mut missing = Vec::new();
        let host = link_by_name(&self.handle, &spec.host_veth).await?;
        if let Some(host) = &host {
            let routes = self.routes().await?;
            for ip in spec.ips() {
                let present = routes.iter().any(|r| {
                    table_of_route(r) == MAIN_TABLE
                        && r.header.destination_prefix_length == host_prefix(ip)
                        && route_dst(r) == Some(ip)
                        && route_oif(r) == Some(host.index)
                });
                if !present {
                    missing.push(format!("host route to {ip} via {}", spec.host_veth));
                }
            }
        }
        let rules: BTreeSet<OwnedRule> =
            self.rules().await?.iter().filter_map(owned_rule).collect();
        for rule in spec.rules() {
            if !rules.contains(&rule) {
                missing.push(format!("rule {rule}"));
            }
        }
        if let Some(eni_name) = &spec.eni {
            match link_by_name(&self.handle, eni_name).await? {
                None => missing.push(format!("ENI {eni_name}")),
                Some(eni) => {
                    let proxies: BTreeSet<IpAddr> = self
                        .proxies()
                        .await?
                        .iter()
                        .filter(|m| m.header.ifindex == eni.index)
                        .filter_map(neighbour_ip)
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
        let links = self.host_links().await?;
        let mut inventory = Inventory::default();
        let mut eni_index: HashMap<u32, String> = HashMap::new();
        for msg in &links {
            let Some(link) = link_info(msg) else { continue };
            if config.is_veth_name(&link.name) && is_veth(msg) {
                inventory.veths.push(link.name);
            } else if enis.contains(&link.name) {
                eni_index.insert(link.index, link.name);
            }
        }
        let tables = config.tables();
        inventory.rules = self
            .rules()
            .await?
            .iter()
            .filter_map(owned_rule)
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
            .routes()
            .await?
            .iter()
            .map(table_of_route)
            .filter(|t| tables.contains(t))
            .collect();
        inventory.proxies = self
            .proxies()
            .await?
            .iter()
            .filter_map(|m| {
                let eni = eni_index.get(&m.header.ifindex)?;
                Some((neighbour_ip(m)?, eni.clone()))
            })
            .collect();
        Ok(inventory)
    }

    async fn remove_rule(&self, rule: &OwnedRule) -> Result<(), PlumbingError> {
        tolerate(
            self.handle.rule().del(rule_message(rule)).execute().await,
            &[libc::ENOENT],
            "delete rule",
        )
    }

    async fn flush_table(&self, table: u32) -> Result<(), PlumbingError> {
        for route in self
            .routes()
            .await?
            .into_iter()
            .filter(|r| table_of_route(r) == table)
        {
            tolerate(
                self.handle.route().del(route).execute().await,
                &[libc::ESRCH, libc::ENOENT],
                "delete route",
            )?;
        }
        Ok(())
    }

    async fn remove_veth(&self, name: &str) -> Result<(), PlumbingError> {
        tolerate(
            self.handle
                .link()
                .del_with_message(LinkUnspec::new_with_name(name).build())
                .execute()
                .await,
            &[libc::ENODEV],
            "delete veth",
        )
    }

    async fn remove_proxy(&self, ip: IpAddr, eni: &str) -> Result<(), PlumbingError> {
        let Some(link) = link_by_name(&self.handle, eni).await? else {
            // The entries went with the device.
            return Ok(());
        };
        tolerate(
            self.handle
                .neighbours()
                .del(proxy_message(ip, link.index))
                .execute()
                .await,
            &[libc::ENOENT],
            "delete proxy neighbour",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_round_trip_through_messages() {
        for rule in [
            OwnedRule {
                priority: 512,
                table: MAIN_TABLE,
                selector: RuleSelector::To("10.0.0.5".parse().unwrap()),
            },
            OwnedRule {
                priority: 1536,
                table: 1002,
                selector: RuleSelector::From("fd00::5".parse().unwrap()),
            },
        ] {
            let msg = rule_message(&rule);
            assert_eq!(msg.header.action, RuleAction::ToTable);
            assert_eq!(owned_rule(&msg), Some(rule));
        }
        let big = rule_message(&OwnedRule {
            priority: 1536,
            table: 1002,
            selector: RuleSelector::From("10.0.0.5".parse().unwrap()),
        });
        assert!(big.attributes.contains(&RuleAttribute::Table(1002)));
        // A subnet selector is not enim's shape.
        let mut subnet = big.clone();
        subnet.header.src_len = 24;
        assert_eq!(owned_rule(&subnet), None);
    }
}
