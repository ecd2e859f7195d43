//! [`Plumbing`] over rtnetlink, against the real kernel.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::AsRawFd;
use std::path::Path;

use async_trait::async_trait;
use enim_provider::MacAddr;
use futures::TryStreamExt;
use ipnet::IpNet;
use rtnetlink::packet_route::address::{
    AddressAttribute, AddressFlags, AddressHeaderFlags, AddressMessage,
};
use rtnetlink::packet_route::link::{LinkAttribute, LinkFlags, LinkMessage};
use rtnetlink::packet_route::route::{RouteAddress, RouteAttribute, RouteHeader, RouteMessage};
use rtnetlink::{Handle, LinkUnspec, RouteMessageBuilder};

use super::{HostLinkHome, LinkInfo, Netns, Plumbing, PlumbingError, PodLinkConfig, PodLinkState};

const EEXIST: i32 = libc::EEXIST;

pub(crate) fn nl(op: &'static str) -> impl FnOnce(rtnetlink::Error) -> PlumbingError {
    move |source| PlumbingError::Netlink { op, source }
}

/// The errno of a netlink error reply; `None` for other errors.
pub(crate) fn errno(e: &rtnetlink::Error) -> Option<i32> {
    match e {
        rtnetlink::Error::NetlinkError(m) => m.code.map(|c| -c.get()),
        _ => None,
    }
}

/// Opens an rtnetlink connection inside `netns` (thread pattern, see
/// [`super::netns`]) and drives it on the current runtime. The socket closes
/// when the returned handle and its clones are dropped.
pub async fn handle_in(netns: &Netns) -> Result<Handle, PlumbingError> {
    let runtime = tokio::runtime::Handle::current();
    let (connection, handle) = super::netns::run_in(netns, move || {
        // The socket registers with the runtime's reactor, so enter it here.
        let _guard = runtime.enter();
        let (connection, handle, _) = rtnetlink::new_connection()?;
        Ok((connection, handle))
    })
    .await?;
    tokio::spawn(connection);
    Ok(handle)
}

/// A link dump entry as [`LinkInfo`]; `None` for links without a name or MAC.
pub(crate) fn link_info(msg: &LinkMessage) -> Option<LinkInfo> {
    let mut name = None;
    let mut mac = None;
    let mut mtu = 0;
    for attr in &msg.attributes {
        match attr {
            LinkAttribute::IfName(n) => name = Some(n.clone()),
            LinkAttribute::Address(a) if a.len() == 6 => {
                mac = Some(MacAddr(a.as_slice().try_into().ok()?))
            }
            LinkAttribute::Mtu(m) => mtu = *m,
            _ => {}
        }
    }
    Some(LinkInfo {
        index: msg.header.index,
        name: name?,
        mac: mac?,
        mtu,
        up: msg.header.flags.contains(LinkFlags::Up),
    })
}

pub async fn links(handle: &Handle) -> Result<Vec<LinkInfo>, PlumbingError> {
    let msgs: Vec<LinkMessage> = handle
        .link()
        .get()
        .execute()
        .try_collect()
        .await
        .map_err(nl("link dump"))?;
    Ok(msgs.iter().filter_map(link_info).collect())
}

pub async fn link_by_mac(handle: &Handle, mac: MacAddr) -> Result<Option<LinkInfo>, PlumbingError> {
    Ok(links(handle).await?.into_iter().find(|l| l.mac == mac))
}

/// The device with ifindex `index`, if there is one.
pub(crate) async fn link_by_index(
    handle: &Handle,
    index: u32,
) -> Result<Option<LinkInfo>, PlumbingError> {
    let mut found = handle.link().get().match_index(index).execute();
    match found.try_next().await {
        Ok(msg) => Ok(msg.as_ref().and_then(link_info)),
        Err(e) if errno(&e) == Some(libc::ENODEV) => Ok(None),
        Err(e) => Err(nl("link get")(e)),
    }
}

pub(crate) async fn set_link(
    handle: &Handle,
    msg: LinkMessage,
    op: &'static str,
) -> Result<(), PlumbingError> {
    handle.link().set(msg).execute().await.map_err(nl(op))
}

async fn addresses(handle: &Handle, index: u32) -> Result<Vec<AddressMessage>, PlumbingError> {
    handle
        .address()
        .get()
        .set_link_index_filter(index)
        .execute()
        .try_collect()
        .await
        .map_err(nl("address dump"))
}

fn address_net(msg: &AddressMessage) -> Option<IpNet> {
    msg.attributes.iter().find_map(|a| match a {
        AddressAttribute::Address(ip) => IpNet::new(*ip, msg.header.prefix_len).ok(),
        _ => None,
    })
}

/// The main routing table's id.
pub const MAIN_TABLE: u32 = RouteHeader::RT_TABLE_MAIN as u32;

/// Every route of both families. Without strict checking the kernel dumps
/// every table, so callers filter by [`table_of_route`].
pub(crate) async fn dump_routes(handle: &Handle) -> Result<Vec<RouteMessage>, PlumbingError> {
    let mut all = Vec::new();
    for family in [
        RouteMessageBuilder::<Ipv4Addr>::new().build(),
        RouteMessageBuilder::<Ipv6Addr>::new().build(),
    ] {
        let part: Vec<RouteMessage> = handle
            .route()
            .get(family)
            .execute()
            .try_collect()
            .await
            .map_err(nl("route dump"))?;
        all.extend(part);
    }
    Ok(all)
}

pub(crate) fn table_of_route(r: &RouteMessage) -> u32 {
    r.attributes
        .iter()
        .find_map(|a| match a {
            RouteAttribute::Table(t) => Some(*t),
            _ => None,
        })
        .unwrap_or(r.header.table as u32)
}

pub(crate) fn route_oif(r: &RouteMessage) -> Option<u32> {
    r.attributes.iter().find_map(|a| match a {
        RouteAttribute::Oif(i) => Some(*i),
        _ => None,
    })
}

pub(crate) fn route_gateway(r: &RouteMessage) -> Option<IpAddr> {
    r.attributes.iter().find_map(|a| match a {
        RouteAttribute::Gateway(RouteAddress::Inet(v4)) => Some(IpAddr::V4(*v4)),
        RouteAttribute::Gateway(RouteAddress::Inet6(v6)) => Some(IpAddr::V6(*v6)),
        _ => None,
    })
}

/// What the pod interface `link` has now: its addresses (link-local ones
/// left out) and the gateways of the main table's default routes through
/// it. Both modes' CHECK and recovery compare this with the result.
pub(crate) async fn pod_link_state(
    handle: &Handle,
    link: LinkInfo,
) -> Result<PodLinkState, PlumbingError> {
    let addrs = addresses(handle, link.index)
        .await?
        .iter()
        .filter_map(address_net)
        .filter(|n| !is_link_local(n))
        .collect();
    let default_gateways = dump_routes(handle)
        .await?
        .iter()
        .filter(|r| {
            r.header.destination_prefix_length == 0
                && table_of_route(r) == MAIN_TABLE
                && route_oif(r) == Some(link.index)
        })
        .filter_map(route_gateway)
        .collect();
    Ok(PodLinkState {
        link,
        addrs,
        default_gateways,
    })
}

/// The MAC of the node's primary interface: the device of the main
/// table's IPv4 default route, if there is one. It dumps routes, so the
/// caller keeps other dumps off `handle` meanwhile (EBUSY).
pub(crate) async fn primary_mac(handle: &Handle) -> Result<Option<MacAddr>, PlumbingError> {
    let oif = handle
        .route()
        .get(RouteMessageBuilder::<Ipv4Addr>::new().build())
        .execute()
        .try_collect::<Vec<RouteMessage>>()
        .await
        .map_err(nl("route dump"))?
        .iter()
        .filter(|r| r.header.destination_prefix_length == 0 && table_of_route(r) == MAIN_TABLE)
        .find_map(route_oif);
    match oif {
        Some(index) => Ok(link_by_index(handle, index).await?.map(|l| l.mac)),
        None => Ok(None),
    }
}

/// The real plumbing. The "host" is the namespace ENIs live in when no pod
/// holds them: the agent's own, or one named in config (tests use a
/// throwaway namespace, so they never touch the machine's interfaces).
pub struct RtnlPlumbing {
    host: Netns,
    host_handle: Handle,
    // The kernel runs one dump at a time per netlink socket (a second gets
    // EBUSY), and a dump of every link is the slow way to find a MAC. So
    // MAC -> ifindex is cached and confirmed with a cheap get-by-index; only
    // a miss dumps, one at a time.
    host_index: std::sync::Mutex<HashMap<MacAddr, u32>>,
    host_dump: tokio::sync::Mutex<()>,
}

impl RtnlPlumbing {
    /// `host_netns`: the host namespace's path; `None` is the agent's own.
    pub async fn new(host_netns: Option<&Path>) -> Result<Self, PlumbingError> {
        let host = Netns::open(host_netns.unwrap_or(Path::new("/proc/self/ns/net")))?;
        let host_handle = handle_in(&host).await?;
        Ok(RtnlPlumbing {
            host,
            host_handle,
            host_index: Default::default(),
            host_dump: Default::default(),
        })
    }

    async fn host_link_by_index(&self, index: u32) -> Result<Option<LinkInfo>, PlumbingError> {
        link_by_index(&self.host_handle, index).await
    }

    async fn dump_host_links(&self) -> Result<Vec<LinkInfo>, PlumbingError> {
        let _one_dump_at_a_time = self.host_dump.lock().await;
        let all = links(&self.host_handle).await?;
        let mut index = self.host_index.lock().unwrap_or_else(|p| p.into_inner());
        index.clear();
        index.extend(all.iter().map(|l| (l.mac, l.index)));
        Ok(all)
    }

    pub fn host_netns(&self) -> &Netns {
        &self.host
    }

    pub fn host_handle(&self) -> &Handle {
        &self.host_handle
    }
}

/// A host name for a device whose recorded name is taken: derived from the
/// MAC so it is stable, and normalised later by GC.
fn fallback_host_name(mac: MacAddr) -> String {
    let m = mac.octets();
    format!("enim{:02x}{:02x}{:02x}", m[3], m[4], m[5])
}

#[async_trait]
impl Plumbing for RtnlPlumbing {
    async fn check_netns(&self, path: &Path) -> Result<(), PlumbingError> {
        Netns::open(path).map(drop)
    }

    async fn host_link(&self, mac: MacAddr) -> Result<Option<LinkInfo>, PlumbingError> {
        let cached = self
            .host_index
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&mac)
            .copied();
        if let Some(index) = cached {
            if let Some(link) = self.host_link_by_index(index).await? {
                if link.mac == mac {
                    return Ok(Some(link));
                }
            }
        }
        Ok(self
            .dump_host_links()
            .await?
            .into_iter()
            .find(|l| l.mac == mac))
    }

    async fn host_links(&self) -> Result<Vec<LinkInfo>, PlumbingError> {
        self.dump_host_links().await
    }

    async fn move_to_pod(
        &self,
        link: &LinkInfo,
        netns: &Path,
        ifname: &str,
    ) -> Result<(), PlumbingError> {
        let ns = Netns::open(netns)?;
        // One message moves and renames: no window with a half-configured
        // device under its host name in the pod, no EEXIST on a name clash.
        let msg = LinkUnspec::new_with_index(link.index)
            .setns_by_fd(ns.file().as_raw_fd())
            .name(ifname)
            .build();
        match set_link(&self.host_handle, msg, "move to pod").await {
            Err(e) if e.errno() == Some(EEXIST) => Err(PlumbingError::NameTaken {
                ifname: ifname.to_string(),
                netns: netns.to_path_buf(),
            }),
            other => other,
        }
    }

    async fn configure_pod_link(
        &self,
        netns: &Path,
        mac: MacAddr,
        config: &PodLinkConfig,
    ) -> Result<LinkInfo, PlumbingError> {
        let ns = Netns::open(netns)?;
        let pod = handle_in(&ns).await?;
        let mut link =
            link_by_mac(&pod, mac)
                .await?
                .ok_or_else(|| PlumbingError::LinkNotFound {
                    mac,
                    place: netns.display().to_string(),
                })?;
        set_link(
            &pod,
            LinkUnspec::new_with_index(link.index)
                .mtu(config.mtu)
                .up()
                .build(),
            "set MTU and up",
        )
        .await?;
        link.mtu = config.mtu;
        link.up = true;
        pod.address()
            .add(
                link.index,
                IpAddr::V4(config.ipv4.addr()),
                config.ipv4.prefix_len(),
            )
            .execute()
            .await
            .map_err(nl("add IPv4 address"))?;
        if let Some(v6) = config.ipv6 {
            let mut req = pod
                .address()
                .add(link.index, IpAddr::V6(v6.addr()), v6.prefix_len());
            // Without NODAD the address stays tentative for about a second
            // and the pod's first packets fail.
            let msg = req.message_mut();
            msg.header.flags |= AddressHeaderFlags::Nodad;
            msg.attributes
                .push(AddressAttribute::Flags(AddressFlags::Nodad));
            req.execute().await.map_err(nl("add IPv6 address"))?;
        }
        let route4 = RouteMessageBuilder::<Ipv4Addr>::new()
            .output_interface(link.index)
            .gateway(config.gateway4)
            .build();
        pod.route()
            .add(route4)
            .execute()
            .await
            .map_err(nl("add IPv4 default route"))?;
        if let Some(gw6) = config.gateway6 {
            let route6 = RouteMessageBuilder::<Ipv6Addr>::new()
                .output_interface(link.index)
                .gateway(gw6)
                .build();
            pod.route()
                .add(route6)
                .execute()
                .await
                .map_err(nl("add IPv6 default route"))?;
        }
        Ok(link)
    }

    async fn pod_link(
        &self,
        netns: &Path,
        mac: MacAddr,
    ) -> Result<Option<PodLinkState>, PlumbingError> {
        let ns = Netns::open(netns)?;
        let pod = handle_in(&ns).await?;
        match link_by_mac(&pod, mac).await? {
            Some(link) => Ok(Some(pod_link_state(&pod, link).await?)),
            None => Ok(None),
        }
    }

    async fn move_to_host(
        &self,
        netns: &Path,
        mac: MacAddr,
        host_name: &str,
        host_mtu: u32,
    ) -> Result<Option<LinkInfo>, PlumbingError> {
        let ns = Netns::open(netns)?;
        let pod = handle_in(&ns).await?;
        let Some(link) = link_by_mac(&pod, mac).await? else {
            return Ok(None);
        };
        // No separate down or address flush: the move itself closes the
        // device and flushes its addresses and routes. The host MTU rides
        // in the move message, applied once the device is home.
        let move_as = |name: &str| {
            LinkUnspec::new_with_index(link.index)
                .setns_by_fd(self.host.file().as_raw_fd())
                .name(name)
                .mtu(host_mtu)
                .build()
        };
        match set_link(&pod, move_as(host_name), "move to host").await {
            Err(e) if e.errno() == Some(EEXIST) => {
                // Someone took the host name meanwhile; bring the ENI home
                // under a stable fallback rather than strand it in the pod.
                let fallback = fallback_host_name(mac);
                tracing::warn!(%mac, host_name, fallback, "host name taken; moving ENI home under fallback name");
                set_link(&pod, move_as(&fallback), "move to host (fallback name)").await?;
            }
            other => other?,
        }
        // The ifindex may have changed in the move: find it again by MAC.
        match self.host_link(mac).await? {
            Some(home) => Ok(Some(home)),
            None => Err(PlumbingError::LinkNotFound {
                mac,
                place: "the host namespace after the move".into(),
            }),
        }
    }

    async fn primary_mac(&self) -> Result<Option<MacAddr>, PlumbingError> {
        let _one_dump_at_a_time = self.host_dump.lock().await;
        primary_mac(&self.host_handle).await
    }

    async fn restore_host_link(
        &self,
        mac: MacAddr,
        host_name: &str,
        host_mtu: u32,
    ) -> Result<bool, PlumbingError> {
        let Some(link) = self.host_link(mac).await? else {
            return Ok(false);
        };
        self.put_home(&link, host_name, host_mtu).await?;
        Ok(true)
    }

    async fn restore_host_links(
        &self,
        homes: &[HostLinkHome<'_>],
    ) -> Result<Vec<Result<bool, PlumbingError>>, PlumbingError> {
        // One dump for the batch: a cache miss in host_link dumps every
        // link, and a dead pod's veth is a miss every time (1000 dumps for
        // 1000 dead records).
        let by_mac: HashMap<MacAddr, LinkInfo> = self
            .dump_host_links()
            .await?
            .into_iter()
            .map(|l| (l.mac, l))
            .collect();
        let mut out = Vec::with_capacity(homes.len());
        for home in homes {
            let Some(link) = by_mac.get(&home.mac) else {
                out.push(Ok(false));
                continue;
            };
            out.push(match self.put_home(link, home.name, home.mtu).await {
                Ok(()) => Ok(true),
                // Gone or moved since the dump: look it up afresh.
                Err(e) if e.errno() == Some(libc::ENODEV) => {
                    self.restore_host_link(home.mac, home.name, home.mtu).await
                }
                Err(e) => Err(e),
            });
        }
        Ok(out)
    }
}

impl RtnlPlumbing {
    /// Renames and retunes host device `link` to `host_name` and `host_mtu`
    /// where it differs.
    async fn put_home(
        &self,
        link: &LinkInfo,
        host_name: &str,
        host_mtu: u32,
    ) -> Result<(), PlumbingError> {
        if link.name != host_name {
            // Kernels before 6.2 refuse to rename an UP device (EBUSY).
            let msg = LinkUnspec::new_with_index(link.index)
                .down()
                .name(host_name)
                .mtu(host_mtu)
                .build();
            match set_link(&self.host_handle, msg, "rename to host name").await {
                Err(e) if e.errno() == Some(EEXIST) => {
                    return Err(PlumbingError::NameTaken {
                        ifname: host_name.to_string(),
                        netns: self.host.path().to_path_buf(),
                    })
                }
                other => other?,
            }
        } else if link.mtu != host_mtu {
            set_link(
                &self.host_handle,
                LinkUnspec::new_with_index(link.index).mtu(host_mtu).build(),
                "restore host MTU",
            )
            .await?;
        }
        Ok(())
    }
}

fn is_link_local(net: &IpNet) -> bool {
    match net {
        IpNet::V4(n) => n.addr().is_link_local(),
        IpNet::V6(n) => (n.addr().segments()[0] & 0xffc0) == 0xfe80,
    }
}
