//! Devices: lookups by MAC, name and index, and the changes enim makes to
//! them (rename, MTU, up, moves between namespaces, veth pairs).

use std::os::fd::AsRawFd;
use std::path::Path;

use enim_core::MacAddr;
use futures::TryStreamExt;
use rtnetlink::packet_route::link::{
    InfoData, InfoKind, InfoVeth, LinkAttribute, LinkFlags, LinkInfo as NlLinkInfo, LinkMessage,
};
use rtnetlink::{Handle, LinkMessageBuilder, LinkUnspec};

use super::{
    addr, collect, errno, nl, route, tolerate, LinkInfo, Netns, PlumbingError, PodLinkState,
};

/// A link dump entry as [`LinkInfo`]; `None` for links without a name or MAC.
fn info(msg: &LinkMessage) -> Option<LinkInfo> {
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

fn is_veth(msg: &LinkMessage) -> bool {
    msg.attributes.iter().any(|a| match a {
        LinkAttribute::LinkInfo(infos) => infos
            .iter()
            .any(|i| matches!(i, NlLinkInfo::Kind(InfoKind::Veth))),
        _ => false,
    })
}

async fn dump_messages(handle: &Handle) -> Result<Vec<LinkMessage>, PlumbingError> {
    collect(handle.link().get().execute(), "link dump").await
}

/// Every device (a dump).
pub async fn dump(handle: &Handle) -> Result<Vec<LinkInfo>, PlumbingError> {
    Ok(dump_messages(handle)
        .await?
        .iter()
        .filter_map(info)
        .collect())
}

/// Every device, each with whether it is a veth (a dump).
pub async fn dump_marking_veths(handle: &Handle) -> Result<Vec<(LinkInfo, bool)>, PlumbingError> {
    Ok(dump_messages(handle)
        .await?
        .iter()
        .filter_map(|m| Some((info(m)?, is_veth(m))))
        .collect())
}

/// The device with `mac`, under any name (a dump).
pub async fn by_mac(handle: &Handle, mac: MacAddr) -> Result<Option<LinkInfo>, PlumbingError> {
    Ok(dump(handle).await?.into_iter().find(|l| l.mac == mac))
}

/// Reads the first answer of a get that names one device; ENODEV is `None`.
async fn get_one(
    mut found: impl futures::Stream<Item = Result<LinkMessage, rtnetlink::Error>> + Unpin,
) -> Result<Option<LinkInfo>, PlumbingError> {
    match found.try_next().await {
        Ok(msg) => Ok(msg.as_ref().and_then(info)),
        Err(e) if errno(&e) == Some(libc::ENODEV) => Ok(None),
        Err(e) => Err(nl("link get")(e)),
    }
}

/// A device that must be there (just made, or named by a record), or an
/// error that says what it was for.
pub fn must_exist(
    found: Option<LinkInfo>,
    what: &'static str,
    missing: String,
) -> Result<LinkInfo, PlumbingError> {
    found.ok_or_else(|| PlumbingError::Io {
        what,
        source: std::io::Error::other(missing),
    })
}

/// The device with ifindex `index`, if there is one (not a dump).
pub async fn by_index(handle: &Handle, index: u32) -> Result<Option<LinkInfo>, PlumbingError> {
    get_one(handle.link().get().match_index(index).execute()).await
}

/// The device named `name`, if there is one (not a dump).
pub async fn by_name(handle: &Handle, name: &str) -> Result<Option<LinkInfo>, PlumbingError> {
    get_one(handle.link().get().match_name(name.to_string()).execute()).await
}

async fn set(handle: &Handle, msg: LinkMessage, op: &'static str) -> Result<(), PlumbingError> {
    handle.link().set(msg).execute().await.map_err(nl(op))
}

/// Brings device `index` up, setting its MTU in the same message if given.
pub async fn set_up(
    handle: &Handle,
    index: u32,
    mtu: Option<u32>,
    op: &'static str,
) -> Result<(), PlumbingError> {
    let mut msg = LinkUnspec::new_with_index(index).up();
    if let Some(mtu) = mtu {
        msg = msg.mtu(mtu);
    }
    set(handle, msg.build(), op).await
}

pub async fn set_mtu(
    handle: &Handle,
    index: u32,
    mtu: u32,
    op: &'static str,
) -> Result<(), PlumbingError> {
    set(
        handle,
        LinkUnspec::new_with_index(index).mtu(mtu).build(),
        op,
    )
    .await
}

/// Renames device `index` (setting its MTU too, if given), taking it down
/// first: kernels before 6.2 refuse to rename an UP device (EBUSY). Fails
/// with [`PlumbingError::NameTaken`] when `name` exists in `netns`, the
/// namespace `handle` is in.
pub async fn rename(
    handle: &Handle,
    index: u32,
    name: &str,
    mtu: Option<u32>,
    netns: &Path,
    op: &'static str,
) -> Result<(), PlumbingError> {
    let mut msg = LinkUnspec::new_with_index(index)
        .down()
        .name(name.to_string());
    if let Some(mtu) = mtu {
        msg = msg.mtu(mtu);
    }
    match set(handle, msg.build(), op).await {
        Err(e) if e.errno() == Some(libc::EEXIST) => Err(PlumbingError::NameTaken {
            ifname: name.to_string(),
            netns: netns.to_path_buf(),
        }),
        other => other,
    }
}

/// Moves device `index` into `target`, renamed to `name` (and set to `mtu`,
/// if given) in the same message: no window in which the target sees a
/// half-configured device under its old name. The move takes the device
/// down and flushes its addresses and routes. A name taken in `target` is
/// EEXIST, the device staying where it was.
pub async fn move_to(
    handle: &Handle,
    index: u32,
    target: &Netns,
    name: &str,
    mtu: Option<u32>,
    op: &'static str,
) -> Result<(), PlumbingError> {
    let mut msg = LinkUnspec::new_with_index(index)
        .setns_by_fd(target.file().as_raw_fd())
        .name(name.to_string());
    if let Some(mtu) = mtu {
        msg = msg.mtu(mtu);
    }
    set(handle, msg.build(), op).await
}

/// Creates a veth pair: `name` here and `peer` born inside `peer_netns`
/// under its final name, so the host never sees the pod end. Fails with
/// [`PlumbingError::NameTaken`] on a name clash.
pub async fn add_veth_pair(
    handle: &Handle,
    name: &str,
    peer: &str,
    peer_netns: &Netns,
    mtu: u32,
) -> Result<(), PlumbingError> {
    let peer_msg = LinkMessageBuilder::<LinkUnspec>::new()
        .name(peer.to_string())
        .mtu(mtu)
        .setns_by_fd(peer_netns.file().as_raw_fd())
        .build();
    let pair = LinkMessageBuilder::<LinkUnspec>::new_with_info_kind(InfoKind::Veth)
        .name(name.to_string())
        .mtu(mtu)
        .set_info_data(InfoData::Veth(InfoVeth::Peer(peer_msg)))
        .build();
    match handle.link().add(pair).execute().await {
        Err(e) if errno(&e) == Some(libc::EEXIST) => Err(PlumbingError::NameTaken {
            ifname: peer.to_string(),
            netns: peer_netns.path().to_path_buf(),
        }),
        other => other.map_err(nl("create veth pair")),
    }
}

/// Deletes the device named `name`; done already when there is none.
pub async fn delete(handle: &Handle, name: &str, op: &'static str) -> Result<(), PlumbingError> {
    tolerate(
        handle
            .link()
            .del_with_message(LinkUnspec::new_with_name(name).build())
            .execute()
            .await,
        &[libc::ENODEV],
        op,
    )
}

/// What the pod interface `link` has now: its addresses (link-local ones
/// left out) and the gateways of the default routes through it, in any
/// table (a later plugin of a chain, sbr, moves them out of main). Both modes' CHECK and recovery compare this with the result.
pub async fn pod_state(handle: &Handle, link: LinkInfo) -> Result<PodLinkState, PlumbingError> {
    let addrs = addr::dump(handle, link.index)
        .await?
        .into_iter()
        .filter(|n| !addr::is_link_local(n))
        .collect();
    let default_gateways = route::dump(handle)
        .await?
        .iter()
        .filter(|r| r.is_default() && r.oif == Some(link.index))
        .filter_map(|r| r.gateway)
        .collect();
    Ok(PodLinkState {
        link,
        addrs,
        default_gateways,
    })
}
