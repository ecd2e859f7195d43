//! The bench's sandbox: network namespaces named after the run's tag (a
//! "host" holding veth pairs that stand in for ENIs, a gateway at their far
//! ends, pod namespaces), made in batches by the testkit's `NetnsSet` and
//! deleted on drop. It never touches the
//! machine's own interfaces; scripts/bench.sh also deletes every namespace
//! with the run's tag if this process dies without dropping.

use std::net::Ipv4Addr;
use std::os::fd::AsFd;
use std::path::PathBuf;

use enim::netlink::Netns;
use enim_core::MacAddr;
pub use enim_testkit::netns_path;
use enim_testkit::{ip_batch, NetnsSet};
use ipnet::Ipv4Net;
use nix::sched::{setns, CloneFlags};

use crate::R;

/// The service CIDR of the host path methods (the sandbox host has no
/// addresses of its own, so it is the one route each pod gets).
pub const SERVICE_CIDR: &str = "10.96.0.0/12";

/// One stand-in ENI: the near end of a veth pair in the host namespace.
#[derive(Debug, Clone)]
pub struct Eni {
    pub id: String,
    pub host_name: String,
    pub mac: MacAddr,
    pub ipv4: Ipv4Net,
    pub gateway4: Ipv4Addr,
}

pub struct Sandbox {
    pub tag: String,
    pub host: String,
    pub gateway: String,
    /// Every namespace made, deleted in reverse order on drop: pods, then
    /// the host (its veths die with it), then the gateway.
    made: NetnsSet,
}

impl Sandbox {
    pub fn new(tag: &str) -> R<Sandbox> {
        let mut made = NetnsSet::new(tag);
        let names = made.add(&["host".to_string(), "gw".to_string()])?;
        Ok(Sandbox {
            tag: tag.to_string(),
            host: names[0].clone(),
            gateway: names[1].clone(),
            made,
        })
    }

    /// Pod namespaces `<tag>-<prefix><i>` for i in 0..n.
    pub fn add_pods(&mut self, prefix: &str, n: usize) -> R<Vec<String>> {
        let names: Vec<String> = (0..n).map(|i| format!("{prefix}{i}")).collect();
        Ok(self.made.add(&names)?)
    }

    /// Makes a veth pair per ENI: the ENI end in the host namespace (host
    /// MTU 1500), the far end in the gateway namespace holding the gateway
    /// address, up.
    pub fn add_enis(&self, enis: &[Eni], peer_prefix: &str) -> R<()> {
        let mut host_lines = Vec::new();
        let mut gw_lines = Vec::new();
        for (i, e) in enis.iter().enumerate() {
            let peer = format!("{peer_prefix}{i}");
            host_lines.push(format!(
                "link add {} address {} mtu 1500 type veth peer name {peer} netns {}",
                e.host_name, e.mac, self.gateway
            ));
            gw_lines.push(format!(
                "addr add {}/{} dev {peer}",
                e.gateway4,
                e.ipv4.prefix_len()
            ));
            gw_lines.push(format!("link set {peer} up"));
        }
        ip_batch(Some(&self.host), &host_lines)?;
        Ok(ip_batch(Some(&self.gateway), &gw_lines)?)
    }

    pub fn host_path(&self) -> PathBuf {
        netns_path(&self.host)
    }
}

/// Moves the calling OS thread into `netns`. Only for threads the bench
/// made for this and that run nothing else: children they spawn start
/// there, as if a runtime in that namespace exec'd them.
pub fn enter(netns: &Netns) -> R<()> {
    setns(netns.file().as_fd(), CloneFlags::CLONE_NEWNET)
        .map_err(|e| format!("setns {}: {e}", netns.path().display()))?;
    Ok(())
}
