//! Tells whether the host's routes or addresses may have changed since the
//! last look, so that the hand-out rule ([`super::handout`]) can reuse its
//! last route and address dumps at an ADD instead of making them again
//! (two route dumps and an address dump: about half a millisecond of every
//! primary-mode ADD, and the host's RTNL lock held meanwhile).
//!
//! A netlink socket in the host namespace, a member of the kernel's route
//! and address notification groups of both families. The kernel queues a
//! notification to every member before the call that made the change
//! returns, so a non-blocking read at the moment of judging sees every
//! change made before that moment: an empty queue means nothing changed
//! since the last read. An overrun (ENOBUFS: the kernel dropped
//! notifications), a closed socket or any other error counts as a change,
//! so the worst a fault can cost is a dump.

use std::io;

use rtnetlink::constants::{
    RTMGRP_IPV4_IFADDR, RTMGRP_IPV4_ROUTE, RTMGRP_IPV6_IFADDR, RTMGRP_IPV6_ROUTE,
};
use rtnetlink::packet_core::{NetlinkMessage, NetlinkPayload};
use rtnetlink::packet_route::RouteNetlinkMessage;
use rtnetlink::sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

use super::{netns, Netns, PlumbingError};

/// The notification groups whose messages can change the rule's answer:
/// routes (rules 5 and 6) and addresses (rule 5), both families. Links are
/// left out on purpose: every ADD and DEL moves one, and the rule reads
/// the judged device's own link message afresh each time.
const GROUPS: u32 = RTMGRP_IPV4_ROUTE | RTMGRP_IPV6_ROUTE | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR;

/// Bytes read at a time while draining; a notification is well under it,
/// and a longer one is cut short harmlessly (only its arrival counts).
const READ_CHUNK: usize = 8192;

/// The watch: one socket, read only by [`RoutingWatch::changed`].
pub struct RoutingWatch {
    socket: Socket,
    buf: Vec<u8>,
}

impl RoutingWatch {
    /// Joins the groups from inside `netns` (the host namespace).
    pub async fn open(netns: &Netns) -> Result<RoutingWatch, PlumbingError> {
        let socket = netns::run_in(netns, || {
            let mut socket = Socket::new(NETLINK_ROUTE)?;
            socket.bind(&SocketAddr::new(0, GROUPS))?;
            socket.set_non_blocking(true)?;
            Ok(socket)
        })
        .await?;
        Ok(RoutingWatch {
            socket,
            buf: Vec::with_capacity(READ_CHUNK),
        })
    }

    /// Reads every notification queued so far: `true` when one of them
    /// `matters` (something may have changed since the last call), or one
    /// did not parse, or the socket could not say.
    pub fn changed(&mut self, matters: impl Fn(&RouteNetlinkMessage) -> bool) -> bool {
        let mut changed = false;
        loop {
            self.buf.clear();
            match self.socket.recv(&mut self.buf, 0) {
                // A full buffer may have cut a message short: unreadable.
                Ok(n) if n == 0 || n >= READ_CHUNK => return true,
                Ok(_) => changed |= any_matters(&self.buf, &matters),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return changed,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // ENOBUFS (an overrun) and anything else: assume a change.
                Err(_) => return true,
            }
        }
    }
}

/// Whether any message of one datagram `matters` (or does not parse).
fn any_matters(mut bytes: &[u8], matters: &impl Fn(&RouteNetlinkMessage) -> bool) -> bool {
    const HEADER: usize = 16;
    while !bytes.is_empty() {
        let Some(len) = bytes
            .get(..4)
            .and_then(|b| b.try_into().ok())
            .and_then(|b| usize::try_from(u32::from_ne_bytes(b)).ok())
            .filter(|len| (HEADER..=bytes.len()).contains(len))
        else {
            return true;
        };
        match NetlinkMessage::<RouteNetlinkMessage>::deserialize(&bytes[..len]) {
            Ok(NetlinkMessage {
                payload: NetlinkPayload::InnerMessage(msg),
                ..
            }) => {
                if matters(&msg) {
                    return true;
                }
            }
            _ => return true,
        }
        // Messages in one datagram start on 4-byte boundaries.
        bytes = bytes.get(len.next_multiple_of(4)..).unwrap_or_default();
    }
    false
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use rtnetlink::RouteMessageBuilder;

    use super::*;
    use crate::netlink::host::handle_in;

    /// The kernel tells the watch of a route and an address added in its
    /// namespace, each once, and of nothing when nothing happens.
    #[tokio::test]
    async fn changes_in_the_namespace_are_seen_once_and_silence_is_not_a_change() {
        enim_testkit::require_kernel!();
        let held = crate::netlink::netns::HeldNetns::new();
        let netns = &held.netns;
        let mut watch = RoutingWatch::open(netns).await.expect("watch");
        let handle = handle_in(netns).await.expect("netlink in the namespace");
        assert!(!watch.changed(|_| true), "a new watch has heard nothing");
        handle
            .link()
            .set(rtnetlink::LinkUnspec::new_with_index(1).up().build())
            .execute()
            .await
            .expect("lo up");
        // Bringing lo up adds its local routes: a change.
        assert!(watch.changed(|_| true), "lo up is seen");
        assert!(!watch.changed(|_| true), "and read once");
        handle
            .route()
            .add(
                RouteMessageBuilder::<Ipv4Addr>::new()
                    .destination_prefix(Ipv4Addr::new(10, 9, 0, 0), 24)
                    .output_interface(1)
                    .build(),
            )
            .execute()
            .await
            .expect("route add");
        assert!(watch.changed(|_| true), "the route add is seen");
        handle
            .address()
            .add(1, Ipv4Addr::new(10, 8, 0, 1).into(), 32)
            .execute()
            .await
            .expect("address add");
        assert!(watch.changed(|_| true), "the address add is seen");
        assert!(!watch.changed(|_| true), "nothing since");
    }
}
