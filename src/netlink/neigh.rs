//! Neighbour entries: proxy entries (a device answers ARP / NS for one
//! address) and permanent entries (a neighbour known without asking).

use std::net::IpAddr;

use enim_core::MacAddr;
use rtnetlink::packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage, NeighbourState,
};
use rtnetlink::packet_route::AddressFamily;
use rtnetlink::Handle;

use super::{collect, nl, tolerate, PlumbingError};

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

fn ip_of(msg: &NeighbourMessage) -> Option<IpAddr> {
    msg.attributes.iter().find_map(|a| match a {
        NeighbourAttribute::Destination(NeighbourAddress::Inet(v4)) => Some(IpAddr::V4(*v4)),
        NeighbourAttribute::Destination(NeighbourAddress::Inet6(v6)) => Some(IpAddr::V6(*v6)),
        _ => None,
    })
}

/// Every proxy entry, as (ifindex, address) (a dump).
pub async fn dump_proxies(handle: &Handle) -> Result<Vec<(u32, IpAddr)>, PlumbingError> {
    let get = handle.neighbours().get().proxies();
    let msgs = collect(get.execute(), "proxy neighbour dump").await?;
    Ok(msgs
        .iter()
        .filter_map(|m| Some((m.header.ifindex, ip_of(m)?)))
        .collect())
}

/// Device `index` answers ARP / NS for `ip`, and for nothing else (unlike
/// proxy_arp, which claims every address routed through another device).
pub async fn add_proxy(handle: &Handle, index: u32, ip: IpAddr) -> Result<(), PlumbingError> {
    handle
        .neighbours()
        .add(index, ip)
        .flags(NeighbourFlags::Proxy)
        .replace()
        .execute()
        .await
        .map_err(nl("add proxy neighbour on ENI"))
}

/// Deletes the proxy entry for `ip` on device `index`; done already when
/// it is gone.
pub async fn delete_proxy(handle: &Handle, index: u32, ip: IpAddr) -> Result<(), PlumbingError> {
    tolerate(
        handle
            .neighbours()
            .del(proxy_message(ip, index))
            .execute()
            .await,
        &[libc::ENOENT],
        "delete proxy neighbour",
    )
}

/// A permanent entry: `ip` is at `mac` on device `index`, no ARP / NS
/// round needed.
pub async fn set_permanent(
    handle: &Handle,
    index: u32,
    ip: IpAddr,
    mac: MacAddr,
    op: &'static str,
) -> Result<(), PlumbingError> {
    handle
        .neighbours()
        .add(index, ip)
        .link_layer_address(&mac.octets())
        .state(NeighbourState::Permanent)
        .replace()
        .execute()
        .await
        .map_err(nl(op))
}
