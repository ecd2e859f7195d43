//! Netlink plumbing: everything enim does to devices, addresses and routes.
//!
//! The primary driver speaks to the kernel only through the [`Plumbing`] trait, so
//! its logic can be unit-tested over a fake with injected faults, while
//! [`rtnl::RtnlPlumbing`] does the real work over rtnetlink and is tested
//! against the kernel in throwaway namespaces.
//!
//! Only this module builds and parses rtnetlink messages. Both modes'
//! plumbing (primary's [`rtnl`], and secondary mode's plumbing module)
//! call the verbs of one file per kernel object: [`link`], [`addr`],
//! [`route`], [`rule`], [`neigh`], plus [`devconf`] (per-device settings
//! over netlink) and [`sysctl`] (those without a netlink form). Both share one [`Host`]:
//! one socket in the host namespace, whose dumps take turns.

pub mod addr;
pub mod devconf;
#[cfg(test)]
pub mod fake;
pub mod handout;
pub mod host;
pub mod hostpath;
pub mod link;
pub mod neigh;
pub mod netns;
pub mod route;
pub mod routewatch;
pub mod rtnl;
pub mod rule;
pub mod sysctl;

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use enim_api::model::AttachmentResult;
use enim_core::MacAddr;
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use serde::{Deserialize, Serialize};

pub use handout::{Own, Refusal, RefusedDevice};
pub use host::Host;
pub use hostpath::HostPathSpec;
pub use netns::{Netns, NetnsId};

/// A device as seen in one namespace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkInfo {
    pub index: u32,
    pub name: String,
    pub mac: MacAddr,
    pub mtu: u32,
    pub up: bool,
}

impl LinkInfo {
    /// Under its host name with its host MTU: nothing to put right.
    pub fn is_home(&self, name: &str, mtu: u32) -> bool {
        self.name == name && self.mtu == mtu
    }
}

/// What a pod interface gets on ADD.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodLinkConfig {
    pub ifname: String,
    pub mtu: u32,
    pub ipv4: Ipv4Net,
    pub gateway4: Ipv4Addr,
    pub ipv6: Option<Ipv6Net>,
    pub gateway6: Option<Ipv6Addr>,
    /// Destinations refused in the pod (the metadata service,
    /// [`crate::support::metadata`]).
    pub blocked: Vec<IpNet>,
}

/// What a pod interface has now (for CHECK and reconcile).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodLinkState {
    pub link: LinkInfo,
    pub addrs: Vec<IpNet>,
    /// Gateways of the default routes (IPv4 and IPv6) through this link.
    pub default_gateways: Vec<IpAddr>,
}

impl PodLinkState {
    /// Why this pod interface differs from what `result` promises (name,
    /// MTU when `want_mtu` is set, link up, addresses, default routes), or
    /// `None` when it matches. Both modes' CHECK and recovery use it.
    pub fn mismatch(&self, result: &AttachmentResult, want_mtu: Option<u32>) -> Option<String> {
        if self.link.name != result.interface.name {
            return Some(format!(
                "device is named {:?}, not {:?}",
                self.link.name, result.interface.name
            ));
        }
        if let Some(want) = want_mtu.filter(|w| *w != self.link.mtu) {
            return Some(format!("MTU is {}, not {want}", self.link.mtu));
        }
        if !self.link.up {
            return Some("interface is down".into());
        }
        if let Some(ip) = result
            .ips
            .iter()
            .find(|ip| !self.addrs.contains(&ip.address))
        {
            return Some(format!("address {} is missing", ip.address));
        }
        // The interface's own routes are the default ones; the others (the
        // host path's) go through another interface, checked on their own.
        let missing_gw = result
            .routes
            .iter()
            .filter(|r| r.dst.prefix_len() == 0)
            .filter_map(|r| r.gw)
            .find(|gw| !self.default_gateways.contains(gw));
        missing_gw.map(|gw| format!("default route via {gw} is missing"))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PlumbingError {
    #[error("network namespace {0} does not exist")]
    NetnsNotFound(PathBuf),
    #[error("{path} is not a network namespace: {why}")]
    NotANetns { path: PathBuf, why: String },
    /// A pod's namespace that is the node's own: attaching there would put
    /// the pod's interface and default route into the node.
    #[error("{path} is the node's network namespace ({whose}), not a pod's")]
    NodeNetns { path: PathBuf, whose: &'static str },
    #[error("entering network namespace {path}: {source}")]
    Setns { path: PathBuf, source: io::Error },
    #[error("an interface named {ifname:?} already exists in {netns}")]
    NameTaken { ifname: String, netns: PathBuf },
    #[error("no device with MAC {mac} in {place}")]
    LinkNotFound { mac: MacAddr, place: String },
    /// The device under an ENI's MAC is the node's own ([`handout`]'s
    /// rule): it was left as it is.
    #[error("device {device} (MAC {mac}) {why}; it is never handed to a pod")]
    Refused {
        mac: MacAddr,
        device: String,
        why: Box<Refusal>,
    },
    #[error("netlink {op} failed: {source}")]
    Netlink {
        op: &'static str,
        #[source]
        source: rtnetlink::Error,
    },
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    /// Only produced by fakes and fault-injection hooks.
    #[error("injected fault at {0}")]
    Injected(&'static str),
}

impl PlumbingError {
    pub(crate) fn io(what: &'static str) -> impl FnOnce(io::Error) -> PlumbingError {
        move |source| PlumbingError::Io { what, source }
    }

    /// The netlink errno, when the kernel refused a request.
    pub fn errno(&self) -> Option<i32> {
        match self {
            PlumbingError::Netlink { source, .. } => errno(source),
            _ => None,
        }
    }

    /// The netns is gone or unusable: DEL and GC treat it as gone.
    pub fn is_netns_gone(&self) -> bool {
        matches!(
            self,
            PlumbingError::NetnsNotFound(_) | PlumbingError::NotANetns { .. }
        )
    }
}

/// Maps a failed request to [`PlumbingError::Netlink`] naming `op`.
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

/// Every answer of a dump, or its failure as `op`.
pub(crate) async fn collect<T>(
    answers: impl futures::Stream<Item = Result<T, rtnetlink::Error>>,
    op: &'static str,
) -> Result<Vec<T>, PlumbingError> {
    futures::TryStreamExt::try_collect(answers)
        .await
        .map_err(nl(op))
}

/// Treats the listed errnos as success (already there / already gone), so
/// verbs that ensure or remove something are idempotent.
pub(crate) fn tolerate(
    result: Result<(), rtnetlink::Error>,
    errnos: &[i32],
    op: &'static str,
) -> Result<(), PlumbingError> {
    match result {
        Err(e) if errno(&e).is_some_and(|n| errnos.contains(&n)) => Ok(()),
        other => other.map_err(nl(op)),
    }
}

/// The prefix length that selects `ip` alone: /32 or /128.
pub(crate) fn host_prefix_len(ip: IpAddr) -> u8 {
    if ip.is_ipv4() {
        32
    } else {
        128
    }
}

/// The kernel operations the primary driver needs. Every device is addressed by
/// MAC and looked up again after each move, because a move may change its
/// ifindex.
#[async_trait]
pub trait Plumbing: Send + Sync {
    /// Checks that `path` is a network namespace a pod can be in: one the
    /// agent can enter, and not the node's own (enimd's, or `host_netns`:
    /// [`PlumbingError::NodeNetns`]).
    async fn check_netns(&self, path: &Path) -> Result<(), PlumbingError>;

    /// The device of ENI `mac` in the host namespace, under any name, once
    /// [`handout`]'s rule lets it go to a pod: [`PlumbingError::Refused`]
    /// when it is the node's own (it is left untouched), `None` when no
    /// device has the MAC. `own`: what enim itself made in the host.
    async fn eni_link(&self, mac: MacAddr, own: Own<'_>)
        -> Result<Option<LinkInfo>, PlumbingError>;

    /// Every device in the host namespace.
    async fn host_links(&self) -> Result<Vec<LinkInfo>, PlumbingError>;

    /// Moves the host device `host` (as [`Plumbing::eni_link`] just found
    /// it, so not looked up again) into the netns at `netns`, renamed to
    /// `ifname` in the same message. Fails with [`PlumbingError::NameTaken`]
    /// (leaving the device in the host) when `ifname` exists there.
    async fn move_to_pod(
        &self,
        host: &LinkInfo,
        netns: &Path,
        ifname: &str,
    ) -> Result<(), PlumbingError>;

    /// Configures the moved device inside the pod: MTU, addresses (IPv6
    /// with NODAD), link up, default routes via the gateways.
    async fn configure_pod_link(
        &self,
        netns: &Path,
        mac: MacAddr,
        config: &PodLinkConfig,
    ) -> Result<LinkInfo, PlumbingError>;

    /// The device `mac` inside the pod netns, with its addresses and default
    /// routes; `None` when it is not there.
    async fn pod_link(
        &self,
        netns: &Path,
        mac: MacAddr,
    ) -> Result<Option<PodLinkState>, PlumbingError>;

    /// The reverse of ADD: the device `home.mac` moves to the host, renamed
    /// to `home.name` and set to `home.mtu`, in one message (the move leaves it
    /// down with no addresses or routes). Returns the device as it now is
    /// in the host (under a fallback name if `host_name` was taken), or
    /// `None` when it is not in that netns.
    async fn move_to_host(
        &self,
        netns: &Path,
        home: HostLinkHome<'_>,
    ) -> Result<Option<LinkInfo>, PlumbingError>;

    /// Every device in the host namespace that may never go to a pod
    /// ([`handout`]'s rule: the node's uplink among them), with why: one
    /// survey for start-up and each GC pass.
    async fn refused_devices(&self, own: Own<'_>) -> Result<Vec<RefusedDevice>, PlumbingError>;

    /// Brings a device that is in the host namespace back to its host name
    /// and MTU, whatever name it has now (`dev<N>` after a netns died).
    /// Returns false when no such device is in the host.
    async fn restore_host_link(&self, home: HostLinkHome<'_>) -> Result<bool, PlumbingError>;

    /// [`Plumbing::restore_host_link`] for many devices at once (GC's
    /// batches): one look at the host's devices for the whole batch, so a
    /// device that is nowhere costs no netlink round trip. The outer error
    /// is that look failing; otherwise one result per entry, in order.
    async fn restore_host_links(
        &self,
        homes: &[HostLinkHome<'_>],
    ) -> Result<Vec<Result<bool, PlumbingError>>, PlumbingError>;

    /// Makes a pod's host path ([`hostpath::add`]); returns the pod end's
    /// MAC. On failure part may exist: [`Plumbing::remove_host_path`]
    /// takes it away.
    async fn add_host_path(&self, spec: &HostPathSpec<'_>) -> Result<MacAddr, PlumbingError>;

    /// Removes the host path whose host end is `host_veth`; done already
    /// when it is gone.
    async fn remove_host_path(&self, host_veth: &str) -> Result<(), PlumbingError>;

    /// Makes `spec`'s pod route `add` through its host path too, and no
    /// longer `remove` ([`hostpath::reroute`]).
    async fn reroute_host_path(
        &self,
        spec: &HostPathSpec<'_>,
        add: &[IpNet],
        remove: &[IpNet],
    ) -> Result<(), PlumbingError>;

    /// The pod end's MAC when the kernel's host path is `spec` (with the
    /// pod end's MAC `mac`, when known), else why not ([`hostpath::check`]).
    async fn check_host_path(
        &self,
        spec: &HostPathSpec<'_>,
        mac: Option<MacAddr>,
    ) -> Result<Result<MacAddr, String>, PlumbingError>;

    /// The names of every veth in the host namespace.
    async fn host_veths(&self) -> Result<Vec<String>, PlumbingError>;

    /// The node's own addresses: global scope, any device of the host
    /// namespace.
    async fn node_addresses(&self) -> Result<Vec<IpAddr>, PlumbingError>;
}

/// Where a device belongs in the host: its MAC, host name and MTU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostLinkHome<'a> {
    pub mac: MacAddr,
    pub name: &'a str,
    pub mtu: u32,
}

/// Checks a CNI interface name as the kernel would: 1 to 15 bytes, not `.`
/// or `..`, and no `/`, `:`, whitespace or NUL.
pub fn validate_ifname(name: &str) -> Result<(), String> {
    const IFNAMSIZ: usize = 16;
    if name.is_empty() {
        return Err("interface name is empty".into());
    }
    if name.len() >= IFNAMSIZ {
        return Err(format!(
            "interface name {name:?} is {} bytes; the kernel allows at most {}",
            name.len(),
            IFNAMSIZ - 1
        ));
    }
    if name == "." || name == ".." {
        return Err(format!("interface name {name:?} is not allowed"));
    }
    if let Some(c) = name
        .chars()
        .find(|c| *c == '/' || *c == ':' || *c == '\0' || c.is_whitespace())
    {
        return Err(format!("interface name {name:?} contains {c:?}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::validate_ifname;

    #[test]
    fn ifname_rules() {
        for ok in ["eth0", "net1", "a", "x234567890abcde"] {
            assert!(validate_ifname(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            ".",
            "..",
            "x234567890abcdef",
            "a/b",
            "a:b",
            "a b",
            "a\tb",
            "a\0",
        ] {
            assert!(validate_ifname(bad).is_err(), "{bad:?}");
        }
    }
}
