//! Which host devices may be handed to a pod as an ENI. A provider's list
//! (static config, NetResourceSet spec, cloud listing) names ENIs by MAC;
//! whatever it says, the device under that MAC is judged against the
//! kernel at the moment it would be taken: in primary mode at every ADD,
//! before the move; in secondary mode before a host ENI is set up (renamed,
//! given a table). A device the rule refuses is never touched.
//!
//! The rule. A device is refused when any of these holds:
//! 1. It is the loopback device.
//! 2. It has a kind no ENI has. An ENI is a physical NIC, whose link has
//!    no kind (no IFLA_INFO_KIND); veth is let through too (see 7). Every
//!    other kind is refused: bridge, bond, team, vlan, macvlan, ipvlan,
//!    vxlan, tun, dummy...
//! 3. It is enslaved to a master (IFLA_MASTER: a bridge port, a bond or
//!    team member, a VRF member).
//! 4. Another device in the host has the same MAC (known when the lookup
//!    dumped every device).
//! 5. It is the node's uplink: in any routing table of either family (the
//!    dump covers every table), a default route (prefix length 0) or a
//!    route via a gateway goes out through it, or it holds an address of
//!    global scope (the node's own address, there before any default
//!    route is). A device the uplink is built on (the uplink's IFLA_LINK,
//!    followed down: the parent of a VLAN, macvlan or ipvlan that carries
//!    the node's address) counts as the uplink too: moving it would cut
//!    the uplink off.
//! 6. The host routes anything else through it: any route in any table
//!    but `local` (the kernel's entries for its addresses) and the
//!    kernel's own IPv6 link-local and multicast routes. A pod's host-side
//!    veth, enim's or another CNI's, carries its pod's host route.
//! 7. Veths, further: its peer is in the host namespace too (IFLA_LINK
//!    without IFLA_LINK_NETNSID: a pair inside the host), or its name is
//!    that of one of enim's own host-side veths (a configured
//!    `veth_prefix`). So a veth is handed out only when its MAC is in the
//!    provider's list, its peer lives in another namespace, and nothing of
//!    the host uses it: the stand-in the kernel tests and the cluster e2e
//!    give for an ENI, never a pod's veth.
//!
//! What enim itself put on a device it has taken (secondary mode's host
//! ENI: its listed addresses, the routes of enim's table range) does not
//! count under 5 and 6.
//!
//! Cost: an ADD's lookup is a get of the device by its cached index (as
//! before; a cache miss dumps every device, as before) and, when the link
//! message does not settle it, one route dump per family and one address
//! dump, plus a get of each uplink device to follow its IFLA_LINK: no
//! extra dump of every device.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use enim_api::model::naming;
use enim_core::MacAddr;
use futures::TryStreamExt;
use rtnetlink::packet_route::address::{AddressAttribute, AddressMessage, AddressScope};
use rtnetlink::packet_route::link::{
    InfoKind, LinkAttribute, LinkFlags, LinkInfo as NlLinkInfo, LinkMessage,
};
use rtnetlink::packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteType, RouteVia,
};
use rtnetlink::packet_route::{AddressFamily, RouteNetlinkMessage};
use rtnetlink::Handle;

use super::routewatch::RoutingWatch;
use super::{collect, errno, nl, Host, LinkInfo, PlumbingError};

/// The `local` routing table's id.
const LOCAL_TABLE: u32 = 255;
/// How deep devices stack (the kernel's MAX_NEST_DEV).
const MAX_STACK: usize = 8;

/// What enim itself made in the host, told apart from the node's own.
#[derive(Debug, Clone, Copy, Default)]
pub struct Own<'a> {
    /// Prefixes of enim's host-side veth names (host path, secondary
    /// mode's pod veths).
    pub veth_prefixes: &'a [&'a str],
    /// Secondary mode: enim's range of route tables (first, last), one per
    /// host ENI; what is left in one without an ENI is GC's to sweep.
    pub tables: Option<(u32, u32)>,
    /// Secondary mode: the ENI's own listed addresses, which enim puts on it.
    pub addresses: &'a [IpAddr],
}

/// Why the uplink is the uplink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UplinkMark {
    /// A default route of table `table` goes out through it.
    DefaultRoute { table: u32, v6: bool },
    /// The route to `dst` via `gateway` in `table` goes out through it.
    GatewayRoute {
        dst: String,
        gateway: IpAddr,
        table: u32,
    },
    /// It holds the node's address `0` (global scope).
    Address(IpAddr),
}

impl fmt::Display for UplinkMark {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UplinkMark::DefaultRoute { table, v6 } => {
                let family = if *v6 { "IPv6" } else { "IPv4" };
                write!(
                    f,
                    "an {family} default route in table {} goes out through it",
                    TableName(*table)
                )
            }
            UplinkMark::GatewayRoute {
                dst,
                gateway,
                table,
            } => write!(
                f,
                "the route to {dst} via {gateway} in table {} goes out through it",
                TableName(*table)
            ),
            UplinkMark::Address(ip) => write!(f, "it holds the node's address {ip}"),
        }
    }
}

/// Why a device may never be handed to a pod (see the module's rule).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    Loopback,
    /// A kind no ENI has.
    Kind(String),
    /// Enslaved to the device named (or numbered) here.
    Enslaved(String),
    /// Another device has the same MAC.
    SharedMac(String),
    /// It is the node's uplink.
    Uplink(UplinkMark),
    /// `upper`, built on it, is the node's uplink.
    UnderUplink {
        upper: String,
        mark: UplinkMark,
    },
    /// The host routes `dst` through it (in `table`).
    Routed {
        dst: String,
        table: u32,
    },
    /// A veth whose peer is in the host namespace too.
    PeerInHost,
    /// One of enim's own host-side veths.
    OwnVeth,
}

impl fmt::Display for Refusal {
    /// A predicate of the device: "device eth0 {refusal}".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Loopback => write!(f, "is the loopback device"),
            Refusal::Kind(kind) => write!(
                f,
                "is a {kind} device; an ENI is a physical NIC (or a veth standing in for one)"
            ),
            Refusal::Enslaved(master) => write!(
                f,
                "is enslaved to {master} (a bridge port, or a bond, team or VRF member)"
            ),
            Refusal::SharedMac(other) => write!(f, "shares its MAC with {other}"),
            Refusal::Uplink(mark) => write!(f, "is the node's uplink: {mark}"),
            Refusal::UnderUplink { upper, mark } => write!(
                f,
                "is the device {upper} is built on, and {upper} is the node's uplink: {mark}"
            ),
            Refusal::Routed { dst, table } => write!(
                f,
                "carries the host's route to {dst} (table {})",
                TableName(*table)
            ),
            Refusal::PeerInHost => write!(f, "is a veth whose peer is in the host namespace too"),
            Refusal::OwnVeth => write!(f, "is one of enim's own host-side veths"),
        }
    }
}

/// A host device the rule refuses, as a survey lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedDevice {
    pub mac: MacAddr,
    pub name: String,
    pub why: Refusal,
}

/// A table id as `ip route` names the well-known ones.
struct TableName(u32);

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            254 => write!(f, "main"),
            253 => write!(f, "default"),
            LOCAL_TABLE => write!(f, "local"),
            n => write!(f, "{n}"),
        }
    }
}

/// What the rule reads of one device's link message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    pub index: u32,
    pub name: String,
    /// `None` for devices without an Ethernet address (tunnels, lo has one).
    pub mac: Option<MacAddr>,
    pub mtu: u32,
    pub up: bool,
    loopback: bool,
    /// IFLA_INFO_KIND; `None` for a physical NIC.
    kind: Option<InfoKind>,
    master: Option<u32>,
    /// IFLA_LINK: the device it is built on, or a veth's peer.
    lower: Option<u32>,
    /// IFLA_LINK_NETNSID is set: `lower` is in another namespace.
    lower_elsewhere: bool,
}

impl Device {
    pub fn parse(msg: &LinkMessage) -> Option<Device> {
        let mut dev = Device {
            index: msg.header.index,
            name: String::new(),
            mac: None,
            mtu: 0,
            up: msg.header.flags.contains(LinkFlags::Up),
            loopback: msg.header.flags.contains(LinkFlags::Loopback),
            kind: None,
            master: None,
            lower: None,
            lower_elsewhere: false,
        };
        for attr in &msg.attributes {
            match attr {
                LinkAttribute::IfName(n) => dev.name = n.clone(),
                LinkAttribute::Address(a) => dev.mac = a.as_slice().try_into().ok().map(MacAddr),
                LinkAttribute::Mtu(m) => dev.mtu = *m,
                LinkAttribute::Controller(m) => dev.master = Some(*m),
                LinkAttribute::Link(l) => dev.lower = Some(*l),
                LinkAttribute::LinkNetNsId(_) => dev.lower_elsewhere = true,
                LinkAttribute::LinkInfo(infos) => {
                    dev.kind = infos.iter().find_map(|i| match i {
                        NlLinkInfo::Kind(k) => Some(k.clone()),
                        _ => None,
                    })
                }
                _ => {}
            }
        }
        (!dev.name.is_empty()).then_some(dev)
    }

    /// The device as the plumbing passes it on; `None` without a MAC.
    pub fn info(&self) -> Option<LinkInfo> {
        Some(LinkInfo {
            index: self.index,
            name: self.name.clone(),
            mac: self.mac?,
            mtu: self.mtu,
            up: self.up,
        })
    }

    fn is_veth(&self) -> bool {
        self.kind == Some(InfoKind::Veth)
    }

    /// The device it is built on, in this namespace.
    fn lower_here(&self) -> Option<u32> {
        self.lower.filter(|_| !self.lower_elsewhere)
    }
}

/// One route as the rule reads it: where it goes and through which
/// devices (a multipath route has several).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteFacts {
    table: u32,
    v6: bool,
    kind: RouteType,
    dst: Option<IpAddr>,
    dst_len: u8,
    /// (output device, gateway) of each next hop.
    hops: Vec<(u32, Option<IpAddr>)>,
}

fn ip_of(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

fn via_of(v: &RouteVia) -> Option<IpAddr> {
    match v {
        RouteVia::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteVia::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

/// The gateway among a route's (or a next hop's) attributes.
fn gateway_in(attrs: &[RouteAttribute]) -> Option<IpAddr> {
    attrs.iter().find_map(|a| match a {
        RouteAttribute::Gateway(g) => ip_of(g),
        RouteAttribute::Via(v) => via_of(v),
        _ => None,
    })
}

impl RouteFacts {
    pub fn parse(msg: &RouteMessage) -> Option<RouteFacts> {
        let v6 = match msg.header.address_family {
            AddressFamily::Inet => false,
            AddressFamily::Inet6 => true,
            _ => return None,
        };
        let mut route = RouteFacts {
            // Ids above 255 are only in RTA_TABLE.
            table: u32::from(msg.header.table),
            v6,
            kind: msg.header.kind,
            dst: None,
            dst_len: msg.header.destination_prefix_length,
            hops: Vec::new(),
        };
        let mut oif = None;
        for attr in &msg.attributes {
            match attr {
                RouteAttribute::Table(t) => route.table = *t,
                RouteAttribute::Destination(a) => route.dst = ip_of(a),
                RouteAttribute::Oif(i) => oif = Some(*i),
                RouteAttribute::MultiPath(hops) => route.hops.extend(
                    hops.iter()
                        .map(|h| (h.interface_index, gateway_in(&h.attributes))),
                ),
                _ => {}
            }
        }
        if let Some(oif) = oif {
            route.hops.push((oif, gateway_in(&msg.attributes)));
        }
        Some(route)
    }

    fn dst_text(&self) -> String {
        let unspecified = match self.v6 {
            false => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            true => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        };
        format!("{}/{}", self.dst.unwrap_or(unspecified), self.dst_len)
    }

    /// What a next hop through a device with `gateway` says of the device.
    fn hop_mark(&self, gateway: Option<IpAddr>) -> HopMark {
        match gateway {
            _ if self.dst_len == 0 => HopMark::Uplink(UplinkMark::DefaultRoute {
                table: self.table,
                v6: self.v6,
            }),
            Some(gw) => HopMark::Uplink(UplinkMark::GatewayRoute {
                dst: self.dst_text(),
                gateway: gw,
                table: self.table,
            }),
            None if self.is_kernel_link_local() => HopMark::Nothing,
            None => HopMark::Routed,
        }
    }

    /// Whether [`Marks::read`] can mark any device for this route, whatever
    /// enim owns: a route of the `local` table, without next hops, or whose
    /// every hop is the kernel's own link-local or multicast route marks
    /// nothing, and a change to it cannot change a judgement.
    fn may_mark(&self) -> bool {
        self.table != LOCAL_TABLE
            && self
                .hops
                .iter()
                .any(|(_, gw)| !matches!(self.hop_mark(*gw), HopMark::Nothing))
    }

    /// The kernel's own routes that every IPv6 device gets: link-local
    /// (fe80::/64) and multicast.
    fn is_kernel_link_local(&self) -> bool {
        let Some(IpAddr::V6(dst)) = self.dst else {
            return false;
        };
        let link_local = (dst.segments()[0] & 0xffc0) == 0xfe80;
        self.kind == RouteType::Multicast || dst.is_multicast() || link_local
    }
}

/// A global-scope address and the device holding it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeAddress {
    index: u32,
    ip: IpAddr,
}

impl NodeAddress {
    pub fn parse(msg: &AddressMessage) -> Option<NodeAddress> {
        if msg.header.scope != AddressScope::Universe {
            return None;
        }
        // IFA_LOCAL is the address itself (IFA_ADDRESS is the peer's on a
        // point-to-point link).
        let local = msg.attributes.iter().find_map(|a| match a {
            AddressAttribute::Local(ip) => Some(*ip),
            _ => None,
        });
        let ip = local.or_else(|| {
            msg.attributes.iter().find_map(|a| match a {
                AddressAttribute::Address(ip) => Some(*ip),
                _ => None,
            })
        })?;
        Some(NodeAddress {
            index: msg.header.index,
            ip,
        })
    }
}

/// What one next hop of a route says of its device.
enum HopMark {
    Uplink(UplinkMark),
    Routed,
    Nothing,
}

/// Whether a route or address notification can change what the rule says
/// of any device: what [`dump_routes`] and [`dump_node_addresses`] would
/// leave out, or [`Marks::read`] pass over, cannot (an IPv6 device coming
/// up or going away in the host, another pod's moves, the `local` table).
/// Anything else, or anything that does not parse, can.
fn may_change_marks(msg: &RouteNetlinkMessage) -> bool {
    match msg {
        RouteNetlinkMessage::NewRoute(r) | RouteNetlinkMessage::DelRoute(r) => {
            RouteFacts::parse(r).is_some_and(|f| f.may_mark())
        }
        RouteNetlinkMessage::NewAddress(a) | RouteNetlinkMessage::DelAddress(a) => {
            NodeAddress::parse(a).is_some()
        }
        _ => true,
    }
}

/// What the host's routes and addresses say of each device.
#[derive(Debug, Default)]
pub struct Marks {
    /// Devices that are the node's uplink, with the first reason seen.
    uplinks: HashMap<u32, UplinkMark>,
    /// Devices the host routes something else through.
    routed: HashMap<u32, (String, u32)>,
}

impl Marks {
    /// Reads `routes` and `addresses`, leaving out what `own` says enim
    /// put on device `taken` (the one being judged; `None` in a survey).
    pub fn read(
        routes: &[RouteFacts],
        addresses: &[NodeAddress],
        own: Own<'_>,
        taken: Option<u32>,
    ) -> Marks {
        let mut marks = Marks::default();
        for r in routes {
            let enims = own
                .tables
                .is_some_and(|(first, last)| (first..=last).contains(&r.table));
            if r.table == LOCAL_TABLE || enims {
                continue;
            }
            for (oif, gateway) in &r.hops {
                match r.hop_mark(*gateway) {
                    HopMark::Uplink(mark) => {
                        marks.uplinks.entry(*oif).or_insert(mark);
                    }
                    HopMark::Routed => {
                        marks.routed.entry(*oif).or_insert((r.dst_text(), r.table));
                    }
                    HopMark::Nothing => {}
                }
            }
        }
        for a in addresses {
            if Some(a.index) == taken && own.addresses.contains(&a.ip) {
                continue;
            }
            marks
                .uplinks
                .entry(a.index)
                .or_insert(UplinkMark::Address(a.ip));
        }
        marks
    }

    /// Every device some uplink is built on: (lower, (uplink name, why)).
    /// `device` looks a device up by index.
    async fn under_uplinks<F, Fut>(
        &self,
        mut device: F,
    ) -> Result<HashMap<u32, (String, UplinkMark)>, PlumbingError>
    where
        F: FnMut(u32) -> Fut,
        Fut: std::future::Future<Output = Result<Option<Device>, PlumbingError>>,
    {
        let mut under = HashMap::new();
        for (&uplink, mark) in &self.uplinks {
            let Some(top) = device(uplink).await? else {
                continue;
            };
            let mut seen = HashSet::from([top.index]);
            let mut at = top.lower_here();
            while let Some(lower) = at.filter(|l| seen.insert(*l) && seen.len() <= MAX_STACK) {
                under
                    .entry(lower)
                    .or_insert_with(|| (top.name.clone(), mark.clone()));
                at = match device(lower).await? {
                    Some(d) => d.lower_here(),
                    None => None,
                };
            }
        }
        Ok(under)
    }
}

/// Why `dev` may never be handed out, if it may not: the checks its link
/// message alone answers (1-3 and 7 of the rule). `name_of` names a
/// master by index when it is known.
fn refuse_by_link(
    dev: &Device,
    own: Own<'_>,
    name_of: impl Fn(u32) -> Option<String>,
) -> Option<Refusal> {
    if dev.loopback {
        return Some(Refusal::Loopback);
    }
    match &dev.kind {
        None | Some(InfoKind::Veth) => {}
        Some(kind) => return Some(Refusal::Kind(kind.to_string())),
    }
    if let Some(master) = dev.master {
        let named = name_of(master).unwrap_or_else(|| format!("the device of index {master}"));
        return Some(Refusal::Enslaved(named));
    }
    if dev.is_veth() {
        if own
            .veth_prefixes
            .iter()
            .any(|p| naming::is_veth_name(p, &dev.name))
        {
            return Some(Refusal::OwnVeth);
        }
        if dev.lower.is_some() && !dev.lower_elsewhere {
            return Some(Refusal::PeerInHost);
        }
    }
    None
}

/// Why `dev` may never be handed out, from the host's routes and
/// addresses (5 and 6 of the rule).
fn refuse_by_use(
    dev: &Device,
    marks: &Marks,
    under: &HashMap<u32, (String, UplinkMark)>,
) -> Option<Refusal> {
    if let Some(mark) = marks.uplinks.get(&dev.index) {
        return Some(Refusal::Uplink(mark.clone()));
    }
    if let Some((upper, mark)) = under.get(&dev.index) {
        return Some(Refusal::UnderUplink {
            upper: upper.clone(),
            mark: mark.clone(),
        });
    }
    marks
        .routed
        .get(&dev.index)
        .map(|(dst, table)| Refusal::Routed {
            dst: dst.clone(),
            table: *table,
        })
}

/// Every device of the host namespace, as the rule reads them (a dump).
pub async fn dump_devices(handle: &Handle) -> Result<Vec<Device>, PlumbingError> {
    let msgs = collect(handle.link().get().execute(), "link dump").await?;
    Ok(msgs.iter().filter_map(Device::parse).collect())
}

/// The device of index `index`, if there is one (a get, not a dump).
pub async fn device_by_index(handle: &Handle, index: u32) -> Result<Option<Device>, PlumbingError> {
    let mut found = handle.link().get().match_index(index).execute();
    match found.try_next().await {
        Ok(msg) => Ok(msg.as_ref().and_then(Device::parse)),
        Err(e) if errno(&e) == Some(libc::ENODEV) => Ok(None),
        Err(e) => Err(nl("link get")(e)),
    }
}

/// Every route of every table, both families (two dumps: without strict
/// checking the kernel ignores the header's table and dumps them all).
pub async fn dump_routes(handle: &Handle) -> Result<Vec<RouteFacts>, PlumbingError> {
    let mut all = Vec::new();
    for family in [AddressFamily::Inet, AddressFamily::Inet6] {
        let mut msg = RouteMessage::default();
        msg.header.address_family = family;
        msg.header.table = RouteHeader::RT_TABLE_UNSPEC;
        let part = collect(handle.route().get(msg).execute(), "route dump").await?;
        all.extend(part.iter().filter_map(RouteFacts::parse));
    }
    Ok(all)
}

/// Every global-scope address of every device (a dump).
pub async fn dump_node_addresses(handle: &Handle) -> Result<Vec<NodeAddress>, PlumbingError> {
    let msgs = collect(handle.address().get().execute(), "address dump").await?;
    Ok(msgs.iter().filter_map(NodeAddress::parse).collect())
}

/// The host's routes and addresses, as the rule reads them.
#[derive(Debug, Default)]
pub struct RoutingView {
    routes: Vec<RouteFacts>,
    addresses: Vec<NodeAddress>,
}

impl RoutingView {
    /// Dumps them now (two route dumps and an address dump).
    pub async fn dump(host: &Host) -> Result<RoutingView, PlumbingError> {
        let routes = host.dump(dump_routes).await?;
        let addresses = host.dump(dump_node_addresses).await?;
        Ok(RoutingView { routes, addresses })
    }

    /// Read as [`Marks`] for judging `taken`.
    fn marks(&self, own: Own<'_>, taken: Option<u32>) -> Marks {
        Marks::read(&self.routes, &self.addresses, own, taken)
    }
}

/// The last [`RoutingView`], reused while a [`RoutingWatch`] on the host
/// says no route or address has changed since it was dumped; dumped again
/// otherwise, and whenever the watch cannot be opened or read.
#[derive(Default)]
pub struct RoutingCache {
    state: std::sync::Mutex<CacheState>,
    /// Views dumped so far (tests tell a reuse from a dump by it).
    dumps: AtomicU64,
}

#[derive(Default)]
struct CacheState {
    watch: WatchState,
    /// Bumped by each look that finds a change: a dump started before a
    /// bump may have missed it, so it is used but not kept.
    epoch: u64,
    view: Option<Arc<RoutingView>>,
}

#[derive(Default)]
enum WatchState {
    #[default]
    Unopened,
    Open(RoutingWatch),
    /// Could not be opened: every look dumps.
    Failed,
}

impl RoutingCache {
    /// The host's routes and addresses as of now.
    pub async fn view(&self, host: &Host) -> Result<Arc<RoutingView>, PlumbingError> {
        // Opened before the first dump that may be kept, so no change
        // after that dump goes unheard.
        if matches!(self.lock().watch, WatchState::Unopened) {
            let opened = RoutingWatch::open(host.netns()).await;
            let mut state = self.lock();
            if matches!(state.watch, WatchState::Unopened) {
                state.watch = match opened {
                    Ok(watch) => WatchState::Open(watch),
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot watch the host's routes; each ADD dumps them");
                        WatchState::Failed
                    }
                };
            }
        }
        let epoch = {
            let mut state = self.lock();
            let changed = match &mut state.watch {
                WatchState::Open(watch) => watch.changed(may_change_marks),
                WatchState::Unopened | WatchState::Failed => true,
            };
            if changed {
                state.epoch += 1;
                state.view = None;
            }
            if let Some(view) = &state.view {
                return Ok(view.clone());
            }
            state.epoch
        };
        self.dumps.fetch_add(1, Ordering::Relaxed);
        let view = Arc::new(RoutingView::dump(host).await?);
        let mut state = self.lock();
        if state.epoch == epoch && matches!(state.watch, WatchState::Open(_)) {
            state.view = Some(view.clone());
        }
        Ok(view)
    }

    /// Views dumped so far.
    pub fn dumps(&self) -> u64 {
        self.dumps.load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CacheState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Where [`judge`] reads the host's routes and addresses.
#[derive(Clone, Copy)]
pub enum Routing<'a> {
    /// A primary-mode ADD: the cache, dumped again only after a change.
    Cached(&'a RoutingCache),
    /// Dumped for this judgement alone (secondary mode's rare host ENI
    /// set-up).
    Fresh,
}

impl Routing<'_> {
    async fn view(self, host: &Host) -> Result<Arc<RoutingView>, PlumbingError> {
        match self {
            Routing::Cached(cache) => cache.view(host).await,
            Routing::Fresh => Ok(Arc::new(RoutingView::dump(host).await?)),
        }
    }
}

/// Judges `candidate`, the device an ENI's MAC found: `Some` when it may
/// never be handed out. `all`: every device of the host when the lookup
/// dumped them (shared MACs are then known); otherwise what is needed is
/// asked of the kernel device by device.
pub async fn judge(
    host: &Host,
    routing: Routing<'_>,
    candidate: &Device,
    all: Option<&[Device]>,
    own: Own<'_>,
) -> Result<Option<Refusal>, PlumbingError> {
    let by_index: HashMap<u32, &Device> = all
        .unwrap_or_default()
        .iter()
        .map(|d| (d.index, d))
        .collect();
    // Its master named (a get only for an enslaved device, refused anyway).
    let master_name = match candidate.master {
        Some(m) => match by_index.get(&m) {
            Some(d) => Some(d.name.clone()),
            None => device_by_index(host.handle(), m).await?.map(|d| d.name),
        },
        None => None,
    };
    let name_of = |i: u32| master_name.clone().filter(|_| candidate.master == Some(i));
    if let Some(refusal) = refuse_by_link(candidate, own, name_of) {
        return Ok(Some(refusal));
    }
    if let Some(other) = all
        .unwrap_or_default()
        .iter()
        .find(|d| d.index != candidate.index && d.mac.is_some() && d.mac == candidate.mac)
    {
        return Ok(Some(Refusal::SharedMac(other.name.clone())));
    }
    let marks = routing.view(host).await?.marks(own, Some(candidate.index));
    let known = &by_index;
    let under = marks
        .under_uplinks(|i| async move {
            match known.get(&i) {
                Some(d) => Ok(Some((*d).clone())),
                None => device_by_index(host.handle(), i).await,
            }
        })
        .await?;
    Ok(refuse_by_use(candidate, &marks, &under))
}

/// Every device of the host that may never be handed out, with why: a
/// survey for start-up and GC (one dump of each kind). Devices without a
/// MAC are left out: no ENI can name them.
pub async fn survey(host: &Host, own: Own<'_>) -> Result<Vec<RefusedDevice>, PlumbingError> {
    let all = host.dump(dump_devices).await?;
    let by_index: HashMap<u32, &Device> = all.iter().map(|d| (d.index, d)).collect();
    let marks = RoutingView::dump(host).await?.marks(own, None);
    let under = marks
        .under_uplinks(|i| {
            let found = by_index.get(&i).map(|d| (*d).clone());
            async move { Ok(found) }
        })
        .await?;
    let mut macs: HashMap<MacAddr, Vec<&Device>> = HashMap::new();
    for d in &all {
        if let Some(mac) = d.mac {
            macs.entry(mac).or_default().push(d);
        }
    }
    let name_of = |i: u32| by_index.get(&i).map(|d| d.name.clone());
    let mut refused = Vec::new();
    for dev in &all {
        let shared = dev
            .mac
            .and_then(|m| macs.get(&m))
            .and_then(|same| same.iter().find(|d| d.index != dev.index))
            .map(|other| Refusal::SharedMac(other.name.clone()));
        let refusal = refuse_by_link(dev, own, name_of)
            .or(shared)
            .or_else(|| refuse_by_use(dev, &marks, &under));
        if let (Some(why), Some(mac)) = (refusal, dev.mac) {
            refused.push(RefusedDevice {
                mac,
                name: dev.name.clone(),
                why,
            });
        }
    }
    Ok(refused)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rtnetlink::packet_route::route::RouteNextHop;

    fn dev(index: u32, name: &str, kind: Option<InfoKind>) -> Device {
        Device {
            index,
            name: name.into(),
            mac: Some(MacAddr([2, 0, 0, 0, 0, u8::try_from(index).unwrap()])),
            mtu: 1500,
            up: true,
            loopback: false,
            kind,
            master: None,
            lower: None,
            lower_elsewhere: false,
        }
    }

    fn route(table: u32, dst: &str, len: u8, hops: Vec<(u32, Option<&str>)>) -> RouteFacts {
        let dst: IpAddr = dst.parse().unwrap();
        RouteFacts {
            table,
            v6: dst.is_ipv6(),
            kind: RouteType::Unicast,
            dst: (len > 0).then_some(dst),
            dst_len: len,
            hops: hops
                .into_iter()
                .map(|(i, g)| (i, g.map(|g| g.parse().unwrap())))
                .collect(),
        }
    }

    fn none(_: u32) -> Option<String> {
        None
    }

    #[test]
    fn kinds_masters_loopback_and_veths_by_link_alone() {
        let own = Own {
            veth_prefixes: &["enih"],
            ..Own::default()
        };
        for kind in [
            InfoKind::Bridge,
            InfoKind::Bond,
            InfoKind::Team,
            InfoKind::Vlan,
            InfoKind::MacVlan,
            InfoKind::IpVlan,
            InfoKind::Vxlan,
        ] {
            let d = dev(3, "x", Some(kind.clone()));
            assert_eq!(
                refuse_by_link(&d, own, none),
                Some(Refusal::Kind(kind.to_string())),
                "{kind}"
            );
        }
        let physical = dev(3, "ens5", None);
        assert_eq!(refuse_by_link(&physical, own, none), None);
        let mut lo = dev(1, "lo", None);
        lo.loopback = true;
        assert_eq!(refuse_by_link(&lo, own, none), Some(Refusal::Loopback));
        let mut port = dev(4, "eth1", None);
        port.master = Some(7);
        let named = |i: u32| (i == 7).then(|| "br0".to_string());
        assert_eq!(
            refuse_by_link(&port, own, named),
            Some(Refusal::Enslaved("br0".into()))
        );
        // A veth whose peer is elsewhere passes; one whose peer is here,
        // or that carries enim's own name, does not.
        let mut stand_in = dev(5, "eni0", Some(InfoKind::Veth));
        stand_in.lower = Some(2);
        stand_in.lower_elsewhere = true;
        assert_eq!(refuse_by_link(&stand_in, own, none), None);
        let mut inside = stand_in.clone();
        inside.lower_elsewhere = false;
        assert_eq!(
            refuse_by_link(&inside, own, none),
            Some(Refusal::PeerInHost)
        );
        let mut ours = stand_in.clone();
        ours.name = "enih0123456789a".into();
        assert_eq!(refuse_by_link(&ours, own, none), Some(Refusal::OwnVeth));
    }

    #[test]
    fn uplinks_by_default_or_gateway_route_in_any_table_or_node_address() {
        let routes = vec![
            // Policy routing: the default route only in table 100.
            route(100, "0.0.0.0", 0, vec![(2, Some("10.0.0.1"))]),
            // IPv6 default via a link-local router.
            route(254, "::", 0, vec![(3, Some("fe80::1"))]),
            // A multipath route through two devices.
            route(
                254,
                "10.96.0.0",
                12,
                vec![(4, Some("10.1.0.1")), (5, Some("10.2.0.1"))],
            ),
            // A pod's host route: routed, not an uplink.
            route(254, "10.9.9.9", 32, vec![(6, None)]),
            // Kernel entries that never count.
            route(LOCAL_TABLE, "10.0.0.5", 32, vec![(7, None)]),
            route(254, "fe80::", 64, vec![(8, None)]),
            // enim's own table of a secondary-mode ENI.
            route(1001, "0.0.0.0", 0, vec![(9, Some("10.5.0.1"))]),
        ];
        let addresses = vec![
            NodeAddress {
                index: 10,
                ip: "10.250.0.2".parse().unwrap(),
            },
            NodeAddress {
                index: 9,
                ip: "10.5.0.10".parse().unwrap(),
            },
        ];
        let own_ip = ["10.5.0.10".parse().unwrap()];
        let own = Own {
            tables: Some((1000, 1255)),
            addresses: &own_ip,
            ..Own::default()
        };
        let marks = Marks::read(&routes, &addresses, own, Some(9));
        let judge = |i: u32| refuse_by_use(&dev(i, "d", None), &marks, &HashMap::new());
        assert!(matches!(
            judge(2),
            Some(Refusal::Uplink(UplinkMark::DefaultRoute {
                table: 100,
                v6: false
            }))
        ));
        assert!(matches!(
            judge(3),
            Some(Refusal::Uplink(UplinkMark::DefaultRoute {
                table: 254,
                v6: true
            }))
        ));
        assert!(matches!(
            judge(4),
            Some(Refusal::Uplink(UplinkMark::GatewayRoute { .. }))
        ));
        assert!(matches!(
            judge(5),
            Some(Refusal::Uplink(UplinkMark::GatewayRoute { .. }))
        ));
        assert!(matches!(judge(6), Some(Refusal::Routed { table: 254, .. })));
        assert_eq!(judge(7), None);
        assert_eq!(judge(8), None);
        assert_eq!(judge(9), None, "enim's own table and address");
        assert!(matches!(
            judge(10),
            Some(Refusal::Uplink(UplinkMark::Address(_)))
        ));
        // Judged as another device than the one taken, the address counts.
        let survey = Marks::read(&routes, &addresses, Own::default(), None);
        assert!(survey.uplinks.contains_key(&9));
        let text = judge(2).unwrap().to_string();
        assert!(text.contains("default route in table 100"), "{text}");
    }

    #[tokio::test]
    async fn a_device_under_the_uplink_is_the_uplink() {
        // eth0.100 (index 3) on eth0 (2) carries the node's address.
        let addresses = vec![NodeAddress {
            index: 3,
            ip: "10.250.0.2".parse().unwrap(),
        }];
        let marks = Marks::read(&[], &addresses, Own::default(), None);
        let mut vlan = dev(3, "eth0.100", Some(InfoKind::Vlan));
        vlan.lower = Some(2);
        let devices = HashMap::from([(3, vlan), (2, dev(2, "eth0", None))]);
        let under = marks
            .under_uplinks(|i| {
                let d = devices.get(&i).cloned();
                async move { Ok(d) }
            })
            .await
            .unwrap();
        let refusal = refuse_by_use(&devices[&2], &marks, &under).unwrap();
        assert!(
            matches!(&refusal, Refusal::UnderUplink { upper, .. } if upper == "eth0.100"),
            "{refusal}"
        );
    }

    #[test]
    fn multipath_hops_and_tables_above_255_are_read() {
        let mut msg = RouteMessage::default();
        msg.header.address_family = AddressFamily::Inet;
        msg.header.table = 252;
        msg.attributes.push(RouteAttribute::Table(1000));
        let hop = |i: u32, gw: Ipv4Addr| {
            let mut h = RouteNextHop::default();
            h.interface_index = i;
            h.attributes
                .push(RouteAttribute::Gateway(RouteAddress::Inet(gw)));
            h
        };
        msg.attributes.push(RouteAttribute::MultiPath(vec![
            hop(4, Ipv4Addr::new(10, 1, 0, 1)),
            hop(5, Ipv4Addr::new(10, 2, 0, 1)),
        ]));
        let r = RouteFacts::parse(&msg).unwrap();
        assert_eq!(r.table, 1000);
        assert_eq!(r.dst_len, 0);
        assert_eq!(
            r.hops,
            vec![
                (4, Some("10.1.0.1".parse().unwrap())),
                (5, Some("10.2.0.1".parse().unwrap()))
            ]
        );
    }
}
