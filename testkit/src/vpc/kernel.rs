//! The simulator's kernel work, over rtnetlink: sockets opened inside the
//! VPC and node namespaces, the far ends (veths in the VPC namespace whose
//! alias names their attachment; their peers are the ENIs), the gateway
//! addresses on them, the /32 and /128 routes (marked [`ROUTE_PROTO`], so
//! they are told from any other route), the proxy neighbour entries by which
//! a far end answers IPv6 neighbour solicitations for the subnet's other
//! addresses, and the VPC namespace's sysctls and metadata listener.
//!
//! `setns` switches only the calling thread, and a socket stays in the
//! namespace it was made in: so sockets (and sysctl writes) for another
//! namespace are made on a short-lived thread of their own, never on one of
//! tokio's pooled threads.

use std::fs::File;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use futures::TryStreamExt;
use nix::sched::{setns, CloneFlags};
use rtnetlink::packet_route::address::{AddressAttribute, AddressFlags};
use rtnetlink::packet_route::link::{
    InfoData, InfoKind, InfoVeth, LinkAttribute, LinkFlags, LinkMessage,
};
use rtnetlink::packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage,
};
use rtnetlink::packet_route::route::{
    RouteAddress, RouteAttribute, RouteMessage, RouteProtocol, RouteScope,
};
use rtnetlink::packet_route::AddressFamily;
use rtnetlink::{Handle, LinkMessageBuilder, LinkUnspec, RouteMessageBuilder};

/// The routing protocol number on the simulator's routes: unused by any
/// routing daemon (see /etc/iproute2/rt_protos), so a dump tells ours.
pub const ROUTE_PROTO: u8 = 99;
/// Where instance metadata answers, in the VPC namespace.
pub const METADATA_ADDR: Ipv4Addr = Ipv4Addr::new(169, 254, 169, 254);

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("namespace {path}: {source}")]
    Netns {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{op}: {source}")]
    Netlink {
        op: String,
        #[source]
        source: rtnetlink::Error,
    },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Conflict(String),
}

impl KernelError {
    /// The kernel's errno, for a netlink refusal.
    pub fn errno(&self) -> Option<i32> {
        match self {
            KernelError::Netlink {
                source: rtnetlink::Error::NetlinkError(m),
                ..
            } => m.code.map(|c| -c.get()),
            _ => None,
        }
    }
}

fn nl(op: impl Into<String>) -> impl FnOnce(rtnetlink::Error) -> KernelError {
    let op = op.into();
    move |source| KernelError::Netlink { op, source }
}

/// `r` as `op`'s result, with the kernel's `errno` counted as `done`
/// (what is asked is already so: gone already, present already).
fn unless_errno<T>(
    r: Result<T, rtnetlink::Error>,
    op: impl Into<String>,
    errno: i32,
    done: T,
) -> Result<T, KernelError> {
    match r.map_err(nl(op)) {
        Err(e) if e.errno() == Some(errno) => Ok(done),
        other => other,
    }
}

/// An open network namespace and an rtnetlink socket inside it.
pub struct Ns {
    path: PathBuf,
    file: File,
    handle: Handle,
}

impl Ns {
    pub async fn open(path: &Path) -> Result<Ns, KernelError> {
        let netns_err = |source| KernelError::Netns {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(netns_err)?;
        let runtime = tokio::runtime::Handle::current();
        let made = run_in(&file, path, move || {
            // The socket registers with the runtime's reactor when made.
            let _guard = runtime.enter();
            rtnetlink::new_connection()
        })
        .await?;
        let (connection, handle, _) = made.map_err(netns_err)?;
        tokio::spawn(connection);
        Ok(Ns {
            path: path.to_path_buf(),
            file,
            handle,
        })
    }

    pub fn handle(&self) -> &Handle {
        &self.handle
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The held namespace's identity (device and inode of its nsfs file).
    pub fn held_id(&self) -> Option<(u64, u64)> {
        let m = self.file.metadata().ok()?;
        Some((m.dev(), m.ino()))
    }

    fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// Runs `f` on a new thread inside this namespace.
    pub async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, KernelError> {
        run_in(&self.file, &self.path, f).await
    }
}

/// Runs `f` on a new thread that first enters the namespace of `file`; the
/// thread ends with `f`, so no other work ever runs in that namespace.
async fn run_in<T: Send + 'static>(
    file: &File,
    path: &Path,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, KernelError> {
    let netns_err = |source| KernelError::Netns {
        path: path.to_path_buf(),
        source,
    };
    let file = file.try_clone().map_err(netns_err)?;
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let entered = setns(&file, CloneFlags::CLONE_NEWNET)
            .map(|()| f())
            .map_err(std::io::Error::from);
        let _ = tx.send(entered);
    });
    rx.await
        .map_err(|_| netns_err(std::io::Error::other("the namespace thread died")))?
        .map_err(netns_err)
}

/// A far end: a veth in the VPC namespace that names its ENI in its alias.
#[derive(Debug, Clone)]
pub struct Link {
    pub index: u32,
    pub name: String,
    pub alias: Option<String>,
    pub mtu: u32,
    pub up: bool,
}

fn link_of(m: &LinkMessage) -> Link {
    let mut link = Link {
        index: m.header.index,
        name: String::new(),
        alias: None,
        mtu: 0,
        up: m.header.flags.contains(LinkFlags::Up),
    };
    for a in &m.attributes {
        match a {
            LinkAttribute::IfName(n) => link.name = n.clone(),
            LinkAttribute::IfAlias(s) => link.alias = Some(s.clone()),
            LinkAttribute::Mtu(mtu) => link.mtu = *mtu,
            _ => {}
        }
    }
    link
}

/// Every answer of a dump.
async fn dump<T>(
    answers: impl futures::Stream<Item = Result<T, rtnetlink::Error>>,
    op: &str,
) -> Result<Vec<T>, KernelError> {
    answers.try_collect().await.map_err(nl(op))
}

/// Every link of the namespace.
pub async fn links(h: &Handle) -> Result<Vec<Link>, KernelError> {
    let msgs = dump(h.link().get().execute(), "dump links").await?;
    Ok(msgs.iter().map(link_of).collect())
}

/// The link named `name`, if any.
pub async fn link_named(h: &Handle, name: &str) -> Result<Option<Link>, KernelError> {
    let got: Result<Vec<LinkMessage>, _> = h
        .link()
        .get()
        .match_name(name.to_string())
        .execute()
        .try_collect()
        .await;
    let msgs = unless_errno(got, format!("get link {name}"), nix::libc::ENODEV, vec![])?;
    Ok(msgs.first().map(link_of))
}

/// What a new ENI's pair looks like.
pub struct PairSpec<'a> {
    /// In the VPC namespace.
    pub far_name: &'a str,
    pub alias: &'a str,
    /// In the node namespace: the ENI.
    pub node_name: &'a str,
    pub mac: [u8; 6],
    pub mtu: u32,
}

/// Makes the pair: the far end here in the VPC namespace, the ENI born in
/// `node` under its final name and MAC (the node never sees it half made).
/// The alias is set after creation (the kernel ignores it on create), then
/// the far end comes up. Returns the far end's index.
pub async fn add_pair(vpc: &Ns, node: &Ns, spec: &PairSpec<'_>) -> Result<u32, KernelError> {
    let h = vpc.handle();
    let peer = LinkMessageBuilder::<LinkUnspec>::new()
        .name(spec.node_name.to_string())
        .mtu(spec.mtu)
        .address(spec.mac.to_vec())
        .setns_by_fd(node.fd())
        .build();
    let pair = LinkMessageBuilder::<LinkUnspec>::new_with_info_kind(InfoKind::Veth)
        .name(spec.far_name.to_string())
        .mtu(spec.mtu)
        .set_info_data(InfoData::Veth(InfoVeth::Peer(peer)))
        .build();
    if let Err(e) = h.link().add(pair).execute().await {
        let e = nl(format!("create {} <-> {}", spec.far_name, spec.node_name))(e);
        if e.errno() != Some(nix::libc::EEXIST) {
            return Err(e);
        }
        // Which name is taken? A far end without alias is ours, left by a
        // run that died between create and alias: remove it, retry later.
        return match link_named(h, spec.far_name).await? {
            Some(l) if l.alias.is_none() => {
                delete(h, l.index).await?;
                Err(KernelError::Conflict(format!(
                    "removed {}, a far end left without its alias; retrying",
                    spec.far_name
                )))
            }
            Some(l) => Err(KernelError::Conflict(format!(
                "far end name {} is taken by {:?}",
                spec.far_name, l.alias
            ))),
            None => Err(KernelError::Conflict(format!(
                "{} already exists in {}",
                spec.node_name,
                node.path().display()
            ))),
        };
    }
    let far = link_named(h, spec.far_name)
        .await?
        .ok_or_else(|| KernelError::Conflict(format!("{} vanished", spec.far_name)))?;
    let msg = LinkUnspec::new_with_index(far.index)
        .alias(spec.alias.to_string())
        .up()
        .build();
    h.link()
        .set(msg)
        .execute()
        .await
        .map_err(nl(format!("alias and up {}", spec.far_name)))?;
    Ok(far.index)
}

/// Brings link `index` up, with `mtu` if given.
pub async fn set_up(h: &Handle, index: u32, mtu: Option<u32>) -> Result<(), KernelError> {
    let mut msg = LinkUnspec::new_with_index(index).up();
    if let Some(mtu) = mtu {
        msg = msg.mtu(mtu);
    }
    h.link()
        .set(msg.build())
        .execute()
        .await
        .map_err(nl(format!("set link {index} up ({mtu:?})")))
}

/// Deletes link `index` (a far end: its peer, the ENI, goes with it,
/// wherever it is). Gone already is fine.
pub async fn delete(h: &Handle, index: u32) -> Result<(), KernelError> {
    let r = h.link().del(index).execute().await;
    unless_errno(r, format!("delete link {index}"), nix::libc::ENODEV, ())
}

/// Every address of the namespace, with its link's index.
pub async fn addresses(h: &Handle) -> Result<Vec<(u32, IpAddr)>, KernelError> {
    let msgs = dump(h.address().get().execute(), "dump addresses").await?;
    Ok(msgs
        .iter()
        .flat_map(|m| {
            m.attributes.iter().filter_map(move |a| match a {
                AddressAttribute::Address(ip) => Some((m.header.index, *ip)),
                _ => None,
            })
        })
        .collect())
}

/// Adds `ip/prefix` to link `index`, IPv6 without duplicate detection (a
/// gateway must answer at once). Present already is fine.
pub async fn add_address(
    h: &Handle,
    index: u32,
    ip: IpAddr,
    prefix: u8,
) -> Result<(), KernelError> {
    let mut req = h.address().add(index, ip, prefix);
    if ip.is_ipv6() {
        req.message_mut()
            .attributes
            .push(AddressAttribute::Flags(AddressFlags::Nodad));
    }
    let r = req.execute().await;
    unless_errno(
        r,
        format!("add {ip}/{prefix} to link {index}"),
        nix::libc::EEXIST,
        (),
    )
}

/// One of the simulator's host routes: `addr` (a /32 or /128) via link
/// `index`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HostRoute {
    pub addr: IpAddr,
    pub index: u32,
}

/// The simulator's routes in the main table (marked [`ROUTE_PROTO`]), each
/// with the message that deletes it.
pub async fn routes(h: &Handle) -> Result<Vec<(HostRoute, RouteMessage)>, KernelError> {
    let mut out = Vec::new();
    let families = [
        RouteMessageBuilder::<Ipv4Addr>::new().build(),
        RouteMessageBuilder::<Ipv6Addr>::new().build(),
    ];
    for filter in families {
        let msgs = dump(h.route().get(filter).execute(), "dump routes").await?;
        for m in msgs {
            if u8::from(m.header.protocol) != ROUTE_PROTO {
                continue;
            }
            let mut addr = None;
            let mut index = None;
            for a in &m.attributes {
                match a {
                    RouteAttribute::Destination(RouteAddress::Inet(a)) => {
                        addr = Some(IpAddr::V4(*a))
                    }
                    RouteAttribute::Destination(RouteAddress::Inet6(a)) => {
                        addr = Some(IpAddr::V6(*a))
                    }
                    RouteAttribute::Oif(i) => index = Some(*i),
                    _ => {}
                }
            }
            if let (Some(addr), Some(index)) = (addr, index) {
                out.push((HostRoute { addr, index }, m));
            }
        }
    }
    Ok(out)
}

pub async fn add_route(h: &Handle, r: HostRoute) -> Result<(), KernelError> {
    let proto = RouteProtocol::from(ROUTE_PROTO);
    let msg = match r.addr {
        IpAddr::V4(a) => RouteMessageBuilder::<Ipv4Addr>::new()
            .destination_prefix(a, 32)
            .output_interface(r.index)
            .scope(RouteScope::Link)
            .protocol(proto)
            .build(),
        IpAddr::V6(a) => RouteMessageBuilder::<Ipv6Addr>::new()
            .destination_prefix(a, 128)
            .output_interface(r.index)
            .protocol(proto)
            .build(),
    };
    h.route()
        .add(msg)
        .replace()
        .execute()
        .await
        .map_err(nl(format!("route {} via link {}", r.addr, r.index)))
}

pub async fn del_route(h: &Handle, msg: RouteMessage) -> Result<(), KernelError> {
    // ESRCH: gone with its link already.
    let r = h.route().del(msg).execute().await;
    unless_errno(r, "delete route", nix::libc::ESRCH, ())
}

/// One IPv6 proxy neighbour entry: link `index` answers neighbour
/// solicitations for `addr` (with `proxy_ndp` on, as [`prepare_vpc`] sets).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProxyNeighbour {
    pub addr: Ipv6Addr,
    pub index: u32,
}

/// Every IPv6 proxy neighbour entry of the namespace, each with the
/// message that deletes it. The VPC namespace holds the simulator's only.
pub async fn proxy_neighbours(
    h: &Handle,
) -> Result<Vec<(ProxyNeighbour, NeighbourMessage)>, KernelError> {
    let answers = h
        .neighbours()
        .get()
        .proxies()
        .set_address_family(AddressFamily::Inet6)
        .execute();
    let msgs = dump(answers, "dump proxy neighbours").await?;
    Ok(msgs
        .into_iter()
        .filter_map(|m| {
            let addr = m.attributes.iter().find_map(|a| match a {
                NeighbourAttribute::Destination(NeighbourAddress::Inet6(a)) => Some(*a),
                _ => None,
            })?;
            let index = m.header.ifindex;
            Some((ProxyNeighbour { addr, index }, m))
        })
        .collect())
}

pub async fn add_proxy_neighbour(h: &Handle, p: ProxyNeighbour) -> Result<(), KernelError> {
    let r = h
        .neighbours()
        .add(p.index, IpAddr::V6(p.addr))
        .flags(NeighbourFlags::Proxy)
        .execute()
        .await;
    unless_errno(
        r,
        format!("proxy neighbour {} on link {}", p.addr, p.index),
        nix::libc::EEXIST,
        (),
    )
}

pub async fn del_proxy_neighbour(h: &Handle, msg: NeighbourMessage) -> Result<(), KernelError> {
    // ENOENT: gone with its link already.
    let r = h.neighbours().del(msg).execute().await;
    unless_errno(r, "delete proxy neighbour", nix::libc::ENOENT, ())
}

/// Makes the VPC namespace a router between its far ends: forwarding on,
/// no reverse-path filter (a pod's address arrives on an ENI the kernel
/// has no route back through until the route is made), proxy ARP on every
/// new link (an on-link neighbour in another node answers through the
/// VPC, as in a VPC; IPv6 has no such switch for a whole subnet, so proxy
/// NDP is on and answers the addresses [`add_proxy_neighbour`] lists), no
/// DAD (gateways answer at once). Then loopback up with the metadata
/// address on it.
pub async fn prepare_vpc(vpc: &Ns) -> Result<(), KernelError> {
    let written = vpc
        .run(|| {
            let settings = [
                ("ipv4/ip_forward", "1"),
                ("ipv4/conf/all/rp_filter", "0"),
                ("ipv4/conf/default/rp_filter", "0"),
                ("ipv4/conf/default/proxy_arp", "1"),
                ("ipv6/conf/all/forwarding", "1"),
                ("ipv6/conf/default/forwarding", "1"),
                ("ipv6/conf/default/accept_dad", "0"),
                ("ipv6/conf/all/proxy_ndp", "1"),
            ];
            for (key, value) in settings {
                let path = format!("/proc/sys/net/{key}");
                std::fs::write(&path, value).map_err(|source| KernelError::Io {
                    what: format!("write {path}"),
                    source,
                })?;
            }
            Ok(())
        })
        .await?;
    written?;
    let h = vpc.handle();
    let lo = link_named(h, "lo")
        .await?
        .ok_or_else(|| KernelError::Conflict("the VPC namespace has no lo".into()))?;
    set_up(h, lo.index, None).await?;
    add_address(h, lo.index, IpAddr::V4(METADATA_ADDR), 32).await
}

/// A listener on `addr` inside the namespace, for tokio.
pub async fn listen_in(ns: &Ns, addr: SocketAddr) -> Result<tokio::net::TcpListener, KernelError> {
    let io = |what: String| move |source| KernelError::Io { what, source };
    let std = ns
        .run(move || std::net::TcpListener::bind(addr))
        .await?
        .map_err(io(format!("bind {addr} in {}", ns.path().display())))?;
    std.set_nonblocking(true)
        .map_err(io(format!("nonblocking {addr}")))?;
    tokio::net::TcpListener::from_std(std).map_err(io(format!("register {addr}")))
}
