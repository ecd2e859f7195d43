//! Per-device settings that the kernel also shows under `/proc/sys/net`,
//! set over netlink instead, so they need no writable `/proc/sys`: a
//! non-privileged container (enimd's DaemonSet pod) gets it read-only.
//!
//! - IPv4 devconf values (`net.ipv4.conf.<dev>.*`): RTM_SETLINK with
//!   IFLA_AF_SPEC → AF_INET → IFLA_INET_CONF, a nest of (IPV4_DEVCONF_*,
//!   u32) pairs. The kernel stores each value as a sysctl write would, but
//!   without a sysctl's side effects (no route cache flush, no netconf
//!   notification), which devices enim has just set up do not need.
//! - Neighbour parameters of one device (`net.ipv4.neigh.<dev>.*`,
//!   `net.ipv6.neigh.<dev>.*`): RTM_SETNEIGHTBL naming the table (`arp_cache`,
//!   `ndisc_cache`) with NDTA_PARMS → NDTPA_IFINDEX and the parameter.
//!
//! IPv6 devconf has no such form (over IFLA_AF_SPEC → AF_INET6 the kernel
//! takes only the interface token and the address generation mode), nor do
//! the namespace-wide `all` values: those stay in [`super::sysctl`].

use std::time::Duration;

use futures::StreamExt;
use rtnetlink::packet_core::{
    DefaultNla, Emitable, NetlinkMessage, NetlinkPayload, NLA_F_NESTED, NLM_F_ACK, NLM_F_REQUEST,
};
use rtnetlink::packet_route::link::{AfSpecInet, AfSpecUnspec, LinkAttribute};
use rtnetlink::packet_route::neighbour_table::{
    NeighbourTableAttribute, NeighbourTableMessage, NeighbourTableParameter,
};
use rtnetlink::packet_route::{AddressFamily, RouteNetlinkMessage};
use rtnetlink::{Handle, LinkUnspec};

use super::{nl, PlumbingError};

/// IFLA_INET_CONF, the one attribute of IFLA_AF_SPEC → AF_INET.
const IFLA_INET_CONF: u16 = 1;

/// The IPv4 devconf values enim sets (`IPV4_DEVCONF_*` of linux/ip.h; the
/// netlink attribute type is the value's index, 1-based).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ipv4Conf {
    /// `forwarding`: the device routes packets it receives that are not for
    /// the host. Per device, unlike `net.ipv4.ip_forward`, which sets it on
    /// every device at once.
    Forwarding,
    /// `rp_filter`: 0 off, 1 strict, 2 loose reverse-path filtering.
    RpFilter,
}

impl Ipv4Conf {
    fn attribute(self) -> u16 {
        match self {
            Ipv4Conf::Forwarding => 1,
            Ipv4Conf::RpFilter => 8,
        }
    }

    /// Its name under `/proc/sys/net/ipv4/conf/<dev>/`.
    pub fn sysctl_name(self) -> &'static str {
        match self {
            Ipv4Conf::Forwarding => "forwarding",
            Ipv4Conf::RpFilter => "rp_filter",
        }
    }
}

/// The IFLA_INET_CONF nest for `values`. Built here rather than with
/// netlink-packet-route's `InetDevConf` request, which leaves out every
/// field that is 0 and so cannot set a value to 0.
fn inet_conf_nest(values: &[(Ipv4Conf, u32)]) -> DefaultNla {
    let nlas: Vec<DefaultNla> = values
        .iter()
        .map(|(conf, value)| DefaultNla::new(conf.attribute(), value.to_ne_bytes().to_vec()))
        .collect();
    let mut nested = vec![0; nlas.as_slice().buffer_len()];
    nlas.as_slice().emit(&mut nested);
    DefaultNla::new(IFLA_INET_CONF | NLA_F_NESTED, nested)
}

/// Sets IPv4 devconf `values` on device `index`, in one message.
pub async fn set_ipv4(
    handle: &Handle,
    index: u32,
    values: &[(Ipv4Conf, u32)],
    op: &'static str,
) -> Result<(), PlumbingError> {
    let mut msg = LinkUnspec::new_with_index(index).build();
    msg.attributes
        .push(LinkAttribute::AfSpecUnspec(vec![AfSpecUnspec::Inet(vec![
            AfSpecInet::Other(inet_conf_nest(values)),
        ])]));
    handle.link().set(msg).execute().await.map_err(nl(op))
}

/// The IPv4 devconf values of device `index` as the kernel reports them
/// (a link get), in the order of `which`; `None` when the device has no
/// IPv4 config (or is not there).
pub async fn get_ipv4(
    handle: &Handle,
    index: u32,
    which: &[Ipv4Conf],
) -> Result<Option<Vec<u32>>, PlumbingError> {
    let mut answers = handle.link().get().match_index(index).execute();
    let Some(msg) = answers.next().await else {
        return Ok(None);
    };
    let msg = msg.map_err(nl("link get (IPv4 devconf)"))?;
    for attr in &msg.attributes {
        let LinkAttribute::AfSpecUnspec(specs) = attr else {
            continue;
        };
        for spec in specs {
            let AfSpecUnspec::Inet(inet) = spec else {
                continue;
            };
            for entry in inet {
                if let AfSpecInet::DevConf(conf) = entry {
                    let value = |c: Ipv4Conf| match c {
                        Ipv4Conf::Forwarding => conf.forwarding,
                        Ipv4Conf::RpFilter => conf.rp_filter,
                    };
                    return Ok(Some(
                        which
                            .iter()
                            .map(|c| u32::try_from(value(*c)).unwrap_or_default())
                            .collect(),
                    ));
                }
            }
        }
    }
    Ok(None)
}

/// Which neighbour table: ARP (IPv4) or NDISC (IPv6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NeighTable {
    Arp,
    Ndisc,
}

impl NeighTable {
    fn family(self) -> AddressFamily {
        match self {
            NeighTable::Arp => AddressFamily::Inet,
            NeighTable::Ndisc => AddressFamily::Inet6,
        }
    }

    /// The table's name, which the kernel matches (NDTA_NAME).
    fn name(self) -> &'static str {
        match self {
            NeighTable::Arp => "arp_cache",
            NeighTable::Ndisc => "ndisc_cache",
        }
    }

    /// Its dir under `/proc/sys/net`.
    pub fn sysctl_dir(self) -> &'static str {
        match self {
            NeighTable::Arp => "ipv4/neigh",
            NeighTable::Ndisc => "ipv6/neigh",
        }
    }
}

/// Sets device `index`'s `proxy_delay` in `table`: how long the kernel
/// waits before answering an ARP / NS for an address it proxies (the
/// kernel's default is up to 0.8 s, random; zero answers at once).
pub async fn set_proxy_delay(
    handle: &Handle,
    table: NeighTable,
    index: u32,
    delay: Duration,
    op: &'static str,
) -> Result<(), PlumbingError> {
    let mut msg = NeighbourTableMessage::default();
    msg.header.family = table.family();
    let millis = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
    msg.attributes = vec![
        NeighbourTableAttribute::Name(table.name().to_string()),
        NeighbourTableAttribute::Parms(vec![
            NeighbourTableParameter::Ifindex(index),
            NeighbourTableParameter::ProxyDelay(millis),
        ]),
    ];
    let mut req = NetlinkMessage::from(RouteNetlinkMessage::SetNeighbourTable(msg));
    req.header.flags = NLM_F_REQUEST | NLM_F_ACK;
    let mut handle = handle.clone();
    let mut answers = handle
        .request(req)
        .map_err(|e| PlumbingError::Netlink { op, source: e })?;
    while let Some(answer) = answers.next().await {
        if let NetlinkPayload::Error(e) = answer.payload {
            // An ACK is an error message with no code.
            if e.code.is_some() {
                return Err(PlumbingError::Netlink {
                    op,
                    source: rtnetlink::Error::NetlinkError(e),
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rtnetlink::packet_core::Nla;

    #[test]
    fn the_inet_conf_nest_carries_zero_values_too() {
        let nla = inet_conf_nest(&[(Ipv4Conf::Forwarding, 1), (Ipv4Conf::RpFilter, 0)]);
        assert_eq!(nla.kind(), IFLA_INET_CONF | NLA_F_NESTED);
        let mut bytes = vec![0; nla.value_len()];
        nla.emit_value(&mut bytes);
        // Two 8-byte attributes: (len 8, type 1, 1) and (len 8, type 8, 0).
        let mut want = Vec::new();
        for (kind, value) in [(1u16, 1u32), (8, 0)] {
            want.extend_from_slice(&8u16.to_ne_bytes());
            want.extend_from_slice(&kind.to_ne_bytes());
            want.extend_from_slice(&value.to_ne_bytes());
        }
        assert_eq!(bytes, want);
    }
}
