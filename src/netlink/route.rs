//! Routes: default routes and host routes, in the main table or a table
//! of their own (ids above 255 travel in RTA_TABLE).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use enim_core::MacAddr;
use ipnet::IpNet;
use rtnetlink::packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteScope, RouteType,
};
use rtnetlink::{Handle, RouteMessageBuilder};

use super::{collect, host_prefix_len, link, nl, tolerate, PlumbingError};

/// The main routing table's id.
pub const MAIN_TABLE: u32 = RouteHeader::RT_TABLE_MAIN as u32;

/// A route as a dump shows it.
#[derive(Debug, Clone)]
pub struct Route {
    pub table: u32,
    pub dst: Option<IpAddr>,
    pub dst_len: u8,
    /// The output device's ifindex.
    pub oif: Option<u32>,
    pub gateway: Option<IpAddr>,
    // What the kernel sent, to delete the route by.
    msg: RouteMessage,
}

impl Route {
    fn parse(msg: RouteMessage) -> Route {
        let mut route = Route {
            // Ids above 255 are only in RTA_TABLE; the header says 252 then.
            table: u32::from(msg.header.table),
            dst: None,
            dst_len: msg.header.destination_prefix_length,
            oif: None,
            gateway: None,
            msg: RouteMessage::default(),
        };
        for attr in &msg.attributes {
            match attr {
                RouteAttribute::Table(t) => route.table = *t,
                RouteAttribute::Oif(i) => route.oif = Some(*i),
                RouteAttribute::Destination(a) => route.dst = ip_of(a),
                RouteAttribute::Gateway(a) => route.gateway = ip_of(a),
                _ => {}
            }
        }
        route.msg = msg;
        route
    }

    pub fn is_default(&self) -> bool {
        self.dst_len == 0
    }

    /// A route to `dst` via `gw` through device `index`, in any table: a
    /// later plugin of a chain (sbr) may have moved it out of main.
    pub fn is_via(&self, dst: IpNet, gw: IpAddr, index: u32) -> bool {
        self.dst_len == dst.prefix_len()
            && self.dst.unwrap_or(unspecified(dst)) == dst.addr()
            && self.gateway == Some(gw)
            && self.oif == Some(index)
    }

    /// A route to `ip` alone through device `index` in `table`.
    pub fn is_host_route(&self, ip: IpAddr, index: u32, table: u32) -> bool {
        self.table == table
            && self.dst_len == host_prefix_len(ip)
            && self.dst == Some(ip)
            && self.oif == Some(index)
    }
}

/// The all-zero address of `net`'s family (a default route's missing dst).
fn unspecified(net: IpNet) -> IpAddr {
    match net {
        IpNet::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpNet::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    }
}

fn ip_of(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

async fn dump_family(handle: &Handle, family: RouteMessage) -> Result<Vec<Route>, PlumbingError> {
    let msgs = collect(handle.route().get(family).execute(), "route dump").await?;
    Ok(msgs.into_iter().map(Route::parse).collect())
}

/// Every route of both families (two dumps). Without strict checking the
/// kernel dumps every table, so callers filter on [`Route::table`].
pub async fn dump(handle: &Handle) -> Result<Vec<Route>, PlumbingError> {
    let mut all = dump_family(handle, RouteMessageBuilder::<Ipv4Addr>::new().build()).await?;
    all.extend(dump_family(handle, RouteMessageBuilder::<Ipv6Addr>::new().build()).await?);
    Ok(all)
}

/// The MAC of the device of the main table's IPv4 default route, if there
/// is one (the node's primary interface). It dumps routes.
pub async fn primary_mac(handle: &Handle) -> Result<Option<MacAddr>, PlumbingError> {
    let oif = dump_family(handle, RouteMessageBuilder::<Ipv4Addr>::new().build())
        .await?
        .iter()
        .filter(|r| r.is_default() && r.table == MAIN_TABLE)
        .find_map(|r| r.oif);
    match oif {
        Some(index) => Ok(link::by_index(handle, index).await?.map(|l| l.mac)),
        None => Ok(None),
    }
}

/// A route to make; only this module builds them.
#[derive(Debug, Clone)]
pub struct NewRoute(RouteMessage);

/// A route to `ip` alone through device `index` in `table`.
pub fn to_host(ip: IpAddr, index: u32, table: u32) -> NewRoute {
    NewRoute(match ip {
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
    })
}

/// The default route via `gw` on device `index` in `table`.
pub fn default_via(gw: IpAddr, index: u32, table: u32) -> NewRoute {
    NewRoute(match gw {
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
    })
}

/// A route to `dst` via `gw` on device `index` in `table`, preferring the
/// source `src` (of `dst`'s family) for traffic it carries.
pub fn via(dst: IpNet, gw: IpAddr, index: u32, table: u32, src: Option<IpAddr>) -> NewRoute {
    let same_family = |a: &IpAddr| a.is_ipv4() == dst.addr().is_ipv4();
    let build = || {
        let mut b = RouteMessageBuilder::<IpAddr>::new()
            .destination_prefix(dst.addr(), dst.prefix_len())
            .ok()?
            .gateway(gw)
            .ok()?
            .output_interface(index)
            .table_id(table);
        if let Some(s) = src.filter(same_family) {
            b = b.pref_source(s).ok()?;
        }
        Some(b.build())
    };
    NewRoute(match same_family(&gw) {
        // The builder checks each address against `dst`'s family, so the
        // one message serves IPv4 and IPv6 alike.
        true => build().unwrap_or_default(),
        // A caller bug; the kernel refuses the empty message with EINVAL.
        false => RouteMessage::default(),
    })
}

/// A `prohibit` route to `dst` in the main table: a packet to it is
/// refused at once in the sender's own namespace (connect gets EACCES,
/// ICMP "administratively prohibited" for forwarded ones).
pub fn prohibit(dst: IpNet) -> NewRoute {
    let build = || {
        let b = RouteMessageBuilder::<IpAddr>::new()
            .destination_prefix(dst.addr(), dst.prefix_len())
            .ok()?
            .table_id(MAIN_TABLE)
            .kind(RouteType::Prohibit);
        Some(b.build())
    };
    // The builder refuses only a prefix longer than its family allows,
    // which an IpNet cannot be; the kernel refuses the empty message.
    NewRoute(build().unwrap_or_default())
}

/// Adds a `prohibit` route for each of `blocked` (see [`prohibit`]); one
/// already there is left as it is (a retried ADD).
pub async fn prohibit_all(handle: &Handle, blocked: &[IpNet]) -> Result<(), PlumbingError> {
    for dst in blocked {
        let req = handle.route().add(prohibit(*dst).0).replace();
        req.execute()
            .await
            .map_err(nl("add metadata prohibit route"))?;
    }
    Ok(())
}

/// Makes `gw`, the host end of a veth at `mac`, the pod's reachable gateway
/// on device `index` (the pod end): a permanent neighbour entry spares the
/// pod an ARP/NS round before its first packet, and an IPv4 gateway gets
/// the on-link route the kernel checks gateways against. Both modes' pod
/// veths use it (secondary mode's pod interface, primary's host path).
pub async fn veth_gateway(
    handle: &Handle,
    index: u32,
    gw: IpAddr,
    mac: MacAddr,
) -> Result<(), PlumbingError> {
    super::neigh::set_permanent(handle, index, gw, mac, "add veth gateway neighbour").await?;
    if gw.is_ipv4() {
        let op = "add veth gateway route";
        replace(handle, to_host(gw, index, MAIN_TABLE), op).await?;
    }
    Ok(())
}

/// Adds `route`; fails with EEXIST when the table has it.
pub async fn add(handle: &Handle, route: NewRoute, op: &'static str) -> Result<(), PlumbingError> {
    handle.route().add(route.0).execute().await.map_err(nl(op))
}

/// Sets `route`, replacing the table's route to the same destination.
pub async fn replace(
    handle: &Handle,
    route: NewRoute,
    op: &'static str,
) -> Result<(), PlumbingError> {
    let req = handle.route().add(route.0).replace();
    req.execute().await.map_err(nl(op))
}

/// Deletes a route a dump showed; done already when it is gone.
pub async fn delete(handle: &Handle, route: Route, op: &'static str) -> Result<(), PlumbingError> {
    tolerate(
        handle.route().del(route.msg).execute().await,
        &[libc::ESRCH, libc::ENOENT],
        op,
    )
}
