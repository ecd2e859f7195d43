//! Interface addresses.

use ipnet::IpNet;
use std::net::IpAddr;

use rtnetlink::packet_route::address::{
    AddressAttribute, AddressFlags, AddressHeaderFlags, AddressMessage, AddressScope,
};
use rtnetlink::Handle;

use super::{collect, tolerate, PlumbingError};

/// How an address is added.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AddrOptions {
    /// Usable at once (IFA_F_NODAD). Without it an IPv6 address stays
    /// tentative for about a second and the first packets fail.
    pub nodad: bool,
    /// No prefix route in the main table (IFA_F_NOPREFIXROUTE), for
    /// addresses whose routing another table does.
    pub noprefixroute: bool,
    /// The address being there already (EEXIST) is success.
    pub exist_ok: bool,
}

impl AddrOptions {
    pub const NODAD: AddrOptions = AddrOptions {
        nodad: true,
        noprefixroute: false,
        exist_ok: false,
    };

    /// These options, with the address being there already a success.
    pub fn or_existing(self) -> AddrOptions {
        AddrOptions {
            exist_ok: true,
            ..self
        }
    }
}

fn net_of(msg: &AddressMessage) -> Option<IpNet> {
    msg.attributes.iter().find_map(|a| match a {
        AddressAttribute::Address(ip) => IpNet::new(*ip, msg.header.prefix_len).ok(),
        _ => None,
    })
}

/// The addresses of device `index` (a dump).
pub async fn dump(handle: &Handle, index: u32) -> Result<Vec<IpNet>, PlumbingError> {
    let get = handle.address().get().set_link_index_filter(index);
    let msgs = collect(get.execute(), "address dump").await?;
    Ok(msgs.iter().filter_map(net_of).collect())
}

/// Every address of global scope on any device (a dump): the node's own
/// addresses, without loopback and link-local ones.
pub async fn dump_global(handle: &Handle) -> Result<Vec<IpAddr>, PlumbingError> {
    let msgs = collect(handle.address().get().execute(), "address dump").await?;
    Ok(msgs
        .iter()
        .filter(|m| m.header.scope == AddressScope::Universe)
        .filter_map(net_of)
        .map(|n| n.addr())
        .collect())
}

/// Adds `net` to device `index`.
pub async fn add(
    handle: &Handle,
    index: u32,
    net: IpNet,
    options: AddrOptions,
    op: &'static str,
) -> Result<(), PlumbingError> {
    let mut req = handle.address().add(index, net.addr(), net.prefix_len());
    let mut flags = AddressFlags::empty();
    if options.nodad {
        flags |= AddressFlags::Nodad;
        // Said in the header's 8 bits too; the kernel reads IFA_FLAGS
        // instead when present.
        req.message_mut().header.flags |= AddressHeaderFlags::Nodad;
    }
    if options.noprefixroute {
        flags |= AddressFlags::Noprefixroute;
    }
    if !flags.is_empty() {
        req.message_mut()
            .attributes
            .push(AddressAttribute::Flags(flags));
    }
    let existing_ok: &[i32] = if options.exist_ok {
        &[libc::EEXIST]
    } else {
        &[]
    };
    tolerate(req.execute().await, existing_ok, op)
}

pub fn is_link_local(net: &IpNet) -> bool {
    match net {
        IpNet::V4(n) => n.addr().is_link_local(),
        IpNet::V6(n) => (n.addr().segments()[0] & 0xffc0) == 0xfe80,
    }
}
