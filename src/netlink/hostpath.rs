//! Primary mode's host path in the kernel: which objects one pod's veth to
//! the host needs, made with the verbs of [`super::link`], [`super::route`]
//! and [`super::neigh`].
//!
//! - Pod side: the pod end (no address of its own), the link-local
//!   gateway ([`enim_api::model::GATEWAY4`] /
//!   [`enim_api::model::GATEWAY6`]) made reachable at the host end's MAC
//!   ([`super::route::veth_gateway`]), and a route per prefix via that
//!   gateway, preferring the ENI's address as source. The default route
//!   stays on the ENI.
//! - Host side: the host end, a route to each pod address through it, and
//!   a permanent neighbour entry for each at the pod end's MAC (the pod's
//!   addresses are on its ENI, and IPv6 answers neighbour solicitations
//!   only on the interface holding the address).
//!
//! Routing is symmetric (the pod routes the node's addresses back through
//! the host path), so strict reverse-path filtering passes on both sides
//! and no sysctl is written.

use std::net::IpAddr;
use std::path::Path;

use enim_api::model::HostPath;
use enim_core::MacAddr;
use ipnet::IpNet;
use rtnetlink::Handle;

use super::host::handle_in;
use super::{link, neigh, route, Host, LinkInfo, Netns, PlumbingError};

/// One pod's host path as the kernel should have it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPathSpec<'a> {
    pub netns: &'a Path,
    pub host_veth: &'a str,
    /// The pod end's name.
    pub ifname: &'a str,
    pub mtu: u32,
    /// The pod's addresses (on its ENI), one per family at most.
    pub pod_ips: Vec<IpAddr>,
    /// Prefixes the pod routes through the host.
    pub routes: &'a [IpNet],
}

impl HostPathSpec<'_> {
    /// The pod address of `family_of`'s family, the routes' source.
    fn pod_ip_like(&self, family_of: IpAddr) -> Option<IpAddr> {
        self.pod_ips
            .iter()
            .copied()
            .find(|ip| ip.is_ipv4() == family_of.is_ipv4())
    }

    /// The gateways the pod uses: one per family it routes.
    fn gateways(&self) -> Vec<IpAddr> {
        let mut gws: Vec<IpAddr> = self.routes.iter().map(HostPath::gateway_for).collect();
        gws.sort();
        gws.dedup();
        gws
    }
}

/// Makes `spec`'s host path; returns the pod end's MAC. A veth left under
/// the host name (by an earlier attempt of this very attachment, as the
/// name derives from its key) is replaced. Fails with
/// [`PlumbingError::NameTaken`] when the pod has an interface of the pod
/// end's name. On failure part may exist: [`remove`] takes it away.
pub async fn add(host: &Host, spec: &HostPathSpec<'_>) -> Result<MacAddr, PlumbingError> {
    let handle = host.handle();
    let ns = Netns::open(spec.netns)?;
    let pair = || link::add_veth_pair(handle, spec.host_veth, spec.ifname, &ns, spec.mtu);
    match pair().await {
        // Either name may be taken. The host name derives from this very
        // attachment's key, so a veth under it is a leftover of an earlier
        // attempt: removed, then one more try. Otherwise the pod's name is
        // taken, which the caller reports.
        Err(PlumbingError::NameTaken { .. })
            if link::by_name(handle, spec.host_veth).await?.is_some() =>
        {
            remove(host, spec.host_veth).await?;
            pair().await?;
        }
        other => other?,
    }
    crate::support::fault::crash_point("add:after-host-veth");
    let host_end = link::must_exist(
        link::by_name(handle, spec.host_veth).await?,
        "host end of the host path",
        format!("{} vanished after creation", spec.host_veth),
    )?;
    link::set_up(handle, host_end.index, None, "set host path up").await?;

    let pod = handle_in(&ns).await?;
    let pod_end = pod_end(&pod, spec).await?;
    link::set_up(&pod, pod_end.index, None, "set pod end of host path up").await?;
    route_via_host(&pod, spec, pod_end.index, host_end.mac).await?;
    drop((pod, ns));

    for ip in &spec.pod_ips {
        let op = "add host route to pod";
        route::replace(
            handle,
            route::to_host(*ip, host_end.index, route::MAIN_TABLE),
            op,
        )
        .await?;
        let op = "add host neighbour of pod";
        neigh::set_permanent(handle, host_end.index, *ip, pod_end.mac, op).await?;
    }
    Ok(pod_end.mac)
}

/// Changes the prefixes `spec`'s pod routes through its host path: routes
/// `add` (with the gateway of a family it routes for the first time) and
/// drops `remove`. Each step is idempotent, so a repeat after a crash
/// finishes the change.
pub async fn reroute(
    host: &Host,
    spec: &HostPathSpec<'_>,
    add: &[IpNet],
    remove: &[IpNet],
) -> Result<(), PlumbingError> {
    let host_end = link::must_exist(
        link::by_name(host.handle(), spec.host_veth).await?,
        "host end of the host path",
        format!("{} is missing", spec.host_veth),
    )?;
    let ns = Netns::open(spec.netns)?;
    let pod = handle_in(&ns).await?;
    let pod_end = pod_end(&pod, spec).await?;
    let adding = HostPathSpec {
        routes: add,
        ..spec.clone()
    };
    route_via_host(&pod, &adding, pod_end.index, host_end.mac).await?;
    if remove.is_empty() {
        return Ok(());
    }
    for r in route::dump(&pod).await? {
        let gone = remove
            .iter()
            .any(|dst| r.is_via(*dst, HostPath::gateway_for(dst), pod_end.index));
        if gone {
            route::delete(&pod, r, "delete host path route in pod").await?;
        }
    }
    Ok(())
}

/// The host path's pod end in the pod.
async fn pod_end(pod: &Handle, spec: &HostPathSpec<'_>) -> Result<LinkInfo, PlumbingError> {
    link::must_exist(
        link::by_name(pod, spec.ifname).await?,
        "pod end of the host path",
        format!("{} is missing from {}", spec.ifname, spec.netns.display()),
    )
}

/// Routes `spec.routes` in the pod through the host path: each family's
/// gateway made reachable at the host end's MAC first, each route
/// preferring the pod's address of its family as source.
async fn route_via_host(
    pod: &Handle,
    spec: &HostPathSpec<'_>,
    pod_end: u32,
    host_mac: MacAddr,
) -> Result<(), PlumbingError> {
    for gw in spec.gateways() {
        route::veth_gateway(pod, pod_end, gw, host_mac).await?;
    }
    for dst in spec.routes {
        let gw = HostPath::gateway_for(dst);
        let r = route::via(*dst, gw, pod_end, route::MAIN_TABLE, spec.pod_ip_like(gw));
        route::replace(pod, r, "add host path route in pod").await?;
    }
    Ok(())
}

/// Removes a host path by its host end: deleting one end deletes both, and
/// the routes and neighbour entries through them. Done already when the
/// veth is gone (it dies with the pod's netns too). Sent on the host's
/// deletion socket ([`Host::deletions`]): a DEL leaves it behind its
/// answer, and its wait in the kernel must not hold a runtime worker.
pub async fn remove(host: &Host, host_veth: &str) -> Result<(), PlumbingError> {
    link::delete(host.deletions(), host_veth, "delete host path veth").await
}

/// The pod end's MAC when the kernel's host path is `spec` (and the pod
/// end has `mac`, when given), else why not. Routes count in any table of
/// the pod: a later plugin of a chain (sbr) may have moved them.
pub async fn check(
    host: &Host,
    spec: &HostPathSpec<'_>,
    mac: Option<MacAddr>,
) -> Result<Result<MacAddr, String>, PlumbingError> {
    let handle = host.handle();
    let Some(host_end) = link::by_name(handle, spec.host_veth).await? else {
        return Ok(Err(format!("host path veth {} is missing", spec.host_veth)));
    };
    if !host_end.up {
        return Ok(Err(format!("host path veth {} is down", spec.host_veth)));
    }
    let host_routes = host.dump(route::dump).await?;
    if let Some(ip) = spec.pod_ips.iter().find(|ip| {
        !host_routes
            .iter()
            .any(|r| r.is_host_route(**ip, host_end.index, route::MAIN_TABLE))
    }) {
        return Ok(Err(format!(
            "host route to {ip} via {} is missing",
            spec.host_veth
        )));
    }

    let ns = Netns::open(spec.netns)?;
    let pod = handle_in(&ns).await?;
    let Some(pod_end) = link::by_name(&pod, spec.ifname).await? else {
        return Ok(Err(format!(
            "host path interface {} is missing",
            spec.ifname
        )));
    };
    if let Some(why) = pod_end_mismatch(&pod_end, mac) {
        return Ok(Err(why));
    }
    let pod_routes = route::dump(&pod).await?;
    let missing = spec.routes.iter().find(|dst| {
        let gw = HostPath::gateway_for(dst);
        !pod_routes
            .iter()
            .any(|r| r.is_via(**dst, gw, pod_end.index))
    });
    Ok(match missing {
        Some(dst) => Err(format!("route to {dst} via {} is missing", spec.ifname)),
        None => Ok(pod_end.mac),
    })
}

fn pod_end_mismatch(link: &LinkInfo, mac: Option<MacAddr>) -> Option<String> {
    if mac.is_some_and(|m| m != link.mac) {
        return Some(format!(
            "host path interface {} has another MAC ({})",
            link.name, link.mac
        ));
    }
    (!link.up).then(|| format!("host path interface {} is down", link.name))
}

/// The names of every veth in the host namespace (a dump): GC keeps those
/// a record explains.
pub async fn host_veths(host: &Host) -> Result<Vec<String>, PlumbingError> {
    Ok(host
        .dump(link::dump_marking_veths)
        .await?
        .into_iter()
        .filter(|(_, veth)| *veth)
        .map(|(l, _)| l.name)
        .collect())
}
