//! Network sysctls that have no netlink form, written as files under a
//! `/proc/sys/net` dir from inside a namespace. The IPv4 per-device values
//! and the neighbour parameters go over netlink ([`super::devconf`]).
//!
//! /proc/sys/net shows the namespace of the thread that opens a file in it
//! (through any mount of it), so the writes run on the namespace thread
//! (see [`super::netns`]); tokio's threads must never switch.
//!
//! `dir` is normally `/proc/sys/net`. A non-privileged container has
//! /proc/sys read-only; enim's DaemonSet mounts the node's /proc/sys/net at
//! another path, read-write, and the config names that path.

use std::io;
use std::path::{Path, PathBuf};

use super::{netns, Netns, PlumbingError};

/// The usual place.
pub const PROC_SYS_NET: &str = "/proc/sys/net";

/// Writes `<key> = <value>` pairs (keys relative to `dir`) inside `netns`,
/// in order, stopping at the first failure.
pub async fn write(
    netns: &Netns,
    dir: &Path,
    entries: Vec<(String, &'static str)>,
) -> Result<(), PlumbingError> {
    let dir: PathBuf = dir.to_path_buf();
    let written = netns::run_in(netns, move || {
        Ok(entries.iter().try_for_each(|(key, value)| {
            let path = dir.join(key);
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

/// IPv6 forwarding on in the namespace (`ipv6/conf/all/forwarding`: the
/// kernel forwards IPv6 only when it is on, whatever the devices say).
pub async fn enable_ipv6_forwarding(netns: &Netns, dir: &Path) -> Result<(), PlumbingError> {
    write(netns, dir, vec![("ipv6/conf/all/forwarding".into(), "1")]).await
}

/// Tunes device `dev` to answer neighbour solicitations for IPv6 addresses
/// it proxies: proxy NDP on, and no DAD, so its link-local address can
/// source NS the moment the link is up.
pub async fn tune_ipv6_proxy_device(
    netns: &Netns,
    dir: &Path,
    dev: &str,
) -> Result<(), PlumbingError> {
    let entries = vec![
        (format!("ipv6/conf/{dev}/accept_dad"), "0"),
        (format!("ipv6/conf/{dev}/proxy_ndp"), "1"),
    ];
    write(netns, dir, entries).await
}
