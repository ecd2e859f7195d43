//! The kernel floor: the fewest rtnetlink messages that do what an ADD and
//! a DEL must, in-process, with no agent, no checkpoint and no exec.
//!
//! ADD: find the device, move + rename it into the pod in one message, then
//! in the pod find it again (the ifindex may change), add the address, set
//! it up, add the default route. DEL: in the pod find it, move it home +
//! rename in one message (the move closes it). A socket is opened in each pod's
//! namespace per operation, as any agent must for a namespace it has not
//! seen before.

use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::AsRawFd;
use std::path::Path;

use enim::netlink::rtnl::handle_in;
use enim::netlink::Netns;
use futures::TryStreamExt;
use ipnet::{IpNet, Ipv4Net};
use rtnetlink::packet_route::address::{AddressAttribute, AddressMessage};
use rtnetlink::packet_route::link::{LinkFlags, LinkMessage};
use rtnetlink::{Handle, LinkUnspec, RouteMessageBuilder};

use crate::R;

pub struct Floor {
    host: Netns,
    host_handle: Handle,
}

async fn link_by_name(handle: &Handle, name: &str) -> R<Option<LinkMessage>> {
    let mut req = handle.link().get().match_name(name).execute();
    match req.try_next().await {
        Ok(m) => Ok(m),
        Err(rtnetlink::Error::NetlinkError(e))
            if e.code.map(|c| -c.get()) == Some(libc::ENODEV) =>
        {
            Ok(None)
        }
        Err(e) => Err(format!("link get {name}: {e}").into()),
    }
}

async fn index_of(handle: &Handle, name: &str) -> R<u32> {
    Ok(link_by_name(handle, name)
        .await?
        .ok_or_else(|| format!("no device {name}"))?
        .header
        .index)
}

/// One RTM_SETLINK; `what` names it in the error.
async fn set_link(handle: &Handle, msg: LinkMessage, what: &str) -> R<()> {
    let req = handle.link().set(msg).execute();
    req.await.map_err(|e| format!("{what}: {e}").into())
}

impl Floor {
    /// Opens the host namespace and a netlink socket in it (once, as an
    /// agent keeps its host socket).
    pub async fn new(host: &Path) -> R<Floor> {
        let host = Netns::open(host)?;
        let host_handle = handle_in(&host).await?;
        Ok(Floor { host, host_handle })
    }

    pub fn host_handle(&self) -> &Handle {
        &self.host_handle
    }

    pub async fn add(
        &self,
        host_name: &str,
        pod_path: &Path,
        ifname: &str,
        addr: Ipv4Net,
        gateway: Ipv4Addr,
    ) -> R<()> {
        let pod_ns = Netns::open(pod_path)?;
        let index = index_of(&self.host_handle, host_name).await?;
        let into_pod = LinkUnspec::new_with_index(index)
            .setns_by_fd(pod_ns.file().as_raw_fd())
            .name(ifname)
            .build();
        set_link(
            &self.host_handle,
            into_pod,
            &format!("move {host_name} into pod"),
        )
        .await?;
        let pod = handle_in(&pod_ns).await?;
        let index = index_of(&pod, ifname).await?;
        pod.address()
            .add(index, IpAddr::V4(addr.addr()), addr.prefix_len())
            .execute()
            .await
            .map_err(|e| format!("address add: {e}"))?;
        let up = LinkUnspec::new_with_index(index).up().build();
        set_link(&pod, up, "link up").await?;
        pod.route()
            .add(
                RouteMessageBuilder::<Ipv4Addr>::new()
                    .output_interface(index)
                    .gateway(gateway)
                    .build(),
            )
            .execute()
            .await
            .map_err(|e| format!("route add: {e}"))?;
        Ok(())
    }

    pub async fn del(&self, pod_path: &Path, ifname: &str, host_name: &str) -> R<()> {
        let pod_ns = Netns::open(pod_path)?;
        let pod = handle_in(&pod_ns).await?;
        let index = index_of(&pod, ifname).await?;
        // No `link down` first: the move closes the device itself, and the
        // floor is the least a DEL can send.
        let home = LinkUnspec::new_with_index(index)
            .setns_by_fd(self.host.file().as_raw_fd())
            .name(host_name)
            .build();
        set_link(&pod, home, &format!("move {ifname} home")).await?;
        Ok(())
    }
}

/// What the bench checks in a pod after ADD: the interface, whether it is
/// up, and its global addresses.
pub struct PodIface {
    pub up: bool,
    pub addrs: Vec<IpNet>,
}

pub async fn pod_iface(pod_path: &Path, ifname: &str) -> R<Option<PodIface>> {
    let pod_ns = Netns::open(pod_path)?;
    let pod = handle_in(&pod_ns).await?;
    let Some(link) = link_by_name(&pod, ifname).await? else {
        return Ok(None);
    };
    let msgs: Vec<AddressMessage> = pod
        .address()
        .get()
        .set_link_index_filter(link.header.index)
        .execute()
        .try_collect()
        .await
        .map_err(|e| format!("address dump: {e}"))?;
    let addrs = msgs
        .iter()
        .filter_map(|m| {
            m.attributes.iter().find_map(|a| match a {
                AddressAttribute::Address(ip) => IpNet::new(*ip, m.header.prefix_len).ok(),
                _ => None,
            })
        })
        .filter(|n| matches!(n, IpNet::V4(_)))
        .collect();
    Ok(Some(PodIface {
        up: link.header.flags.contains(LinkFlags::Up),
        addrs,
    }))
}

/// Whether `name` exists in the namespace of `handle`.
pub async fn has_link(handle: &Handle, name: &str) -> R<bool> {
    Ok(link_by_name(handle, name).await?.is_some())
}

/// The floor's host path for pod slot `slot`: the veth enim's host path
/// makes, by the fewest messages.
pub struct HostPathFloor {
    host_veth: String,
}

impl HostPathFloor {
    pub fn of(slot: usize) -> HostPathFloor {
        HostPathFloor {
            host_veth: format!("hpfloor{slot}"),
        }
    }
}

impl Floor {
    /// After [`Floor::add`]: a veth pair with its pod end born in the pod,
    /// both ends up, the gateway's neighbour entry and on-link route, the
    /// service route in the pod; the route and neighbour entry of the pod's
    /// address in the host.
    pub async fn add_host_path(
        &self,
        pod_path: &Path,
        hp: &HostPathFloor,
        pod_ip: Ipv4Addr,
    ) -> R<()> {
        use enim::netlink::{link, neigh, route};
        use enim_api::model::GATEWAY4;
        let pod_ns = Netns::open(pod_path)?;
        let host = &self.host_handle;
        link::add_veth_pair(host, &hp.host_veth, "eth0-host", &pod_ns, 1500).await?;
        let host_end = link::by_name(host, &hp.host_veth)
            .await?
            .ok_or("host end vanished")?;
        link::set_up(host, host_end.index, None, "up").await?;
        let pod = handle_in(&pod_ns).await?;
        let pod_end = link::by_name(&pod, "eth0-host")
            .await?
            .ok_or("pod end vanished")?;
        link::set_up(&pod, pod_end.index, None, "up").await?;
        let gw = IpAddr::V4(GATEWAY4);
        neigh::set_permanent(&pod, pod_end.index, gw, host_end.mac, "neigh").await?;
        route::add(
            &pod,
            route::to_host(gw, pod_end.index, route::MAIN_TABLE),
            "gw",
        )
        .await?;
        let svc: IpNet = crate::sandbox::SERVICE_CIDR.parse()?;
        let via = route::via(
            svc,
            gw,
            pod_end.index,
            route::MAIN_TABLE,
            Some(IpAddr::V4(pod_ip)),
        );
        route::add(&pod, via, "service route").await?;
        let ip = IpAddr::V4(pod_ip);
        route::add(
            host,
            route::to_host(ip, host_end.index, route::MAIN_TABLE),
            "host route",
        )
        .await?;
        neigh::set_permanent(host, host_end.index, ip, pod_end.mac, "host neigh").await?;
        Ok(())
    }

    /// After [`Floor::del`], outside its timing (enim deletes it behind its
    /// answer): one message deletes the pair and all through it.
    pub async fn del_host_path(&self, hp: &HostPathFloor) -> R<()> {
        enim::netlink::link::delete(&self.host_handle, &hp.host_veth, "delete veth").await?;
        Ok(())
    }
}
