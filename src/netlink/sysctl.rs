//! Network sysctls, written under `/proc/sys/net` from inside a namespace.
//!
//! /proc/sys/net shows the namespace of the thread that opens it, so the
//! writes run on the namespace thread (see [`super::netns`]); tokio's
//! threads must never switch.

use std::io;
use std::path::Path;

use super::{netns, Netns, PlumbingError};

/// Writes `<key> = <value>` pairs (keys relative to /proc/sys/net) inside
/// `netns`, in order, stopping at the first failure.
pub async fn write(
    netns: &Netns,
    entries: Vec<(String, &'static str)>,
) -> Result<(), PlumbingError> {
    let written = netns::run_in(netns, move || {
        Ok(entries.iter().try_for_each(|(key, value)| {
            let path = Path::new("/proc/sys/net").join(key);
            std::fs::write(&path, value).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("writing {value} to {}: {e}", path.display()),
                )
            })
        }))
    })
    .await?;
    written.map_err(PlumbingError::io("sysctl"))
}

/// IPv4 forwarding on (and IPv6 when asked).
pub async fn enable_forwarding(netns: &Netns, ipv6: bool) -> Result<(), PlumbingError> {
    let mut entries = vec![("ipv4/ip_forward".to_string(), "1")];
    if ipv6 {
        entries.push(("ipv6/conf/all/forwarding".to_string(), "1"));
    }
    write(netns, entries).await
}

/// Tunes device `dev` to carry traffic for addresses it proxies: loose
/// reverse-path filtering (replies arrive on it for addresses the main
/// table routes elsewhere) and no proxy delay (a neighbour's ARP / NS is
/// answered at once). With `ipv6`, also proxy NDP on, and no DAD, so its
/// link-local address can source NS the moment the link is up.
pub async fn tune_proxy_device(netns: &Netns, dev: &str, ipv6: bool) -> Result<(), PlumbingError> {
    let mut entries = vec![
        (format!("ipv4/conf/{dev}/rp_filter"), "2"),
        (format!("ipv4/neigh/{dev}/proxy_delay"), "0"),
    ];
    if ipv6 {
        entries.extend([
            (format!("ipv6/conf/{dev}/accept_dad"), "0"),
            (format!("ipv6/conf/{dev}/proxy_ndp"), "1"),
            (format!("ipv6/neigh/{dev}/proxy_delay"), "0"),
        ]);
    }
    write(netns, entries).await
}
