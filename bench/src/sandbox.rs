//! The bench's own sandbox: uniquely named network namespaces (a "host"
//! holding veth pairs that stand in for ENIs, a gateway at their far ends,
//! pod namespaces) made with `ip` and deleted on drop. It never touches the
//! machine's own interfaces; scripts/bench.sh also deletes every namespace
//! with the run's tag if this process dies without dropping.

use std::io::Write;
use std::net::Ipv4Addr;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use enim::netlink::Netns;
use enim_provider::MacAddr;
use ipnet::Ipv4Net;
use nix::sched::{setns, CloneFlags};

use crate::R;

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
    /// Every namespace made, deleted in reverse order on drop.
    made: Vec<String>,
}

/// Feeds `lines` to `ip [-n ns] -batch -`: one process for many commands.
fn ip_batch(netns: Option<&str>, lines: &[String]) -> R<()> {
    if lines.is_empty() {
        return Ok(());
    }
    let mut cmd = Command::new("ip");
    if let Some(ns) = netns {
        cmd.args(["-n", ns]);
    }
    let mut child = cmd
        .args(["-batch", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    child
        .stdin
        .take()
        .ok_or("ip -batch: no stdin")?
        .write_all(lines.join("\n").as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        return Err(format!("ip -batch: {}", String::from_utf8_lossy(&out.stderr).trim()).into());
    }
    Ok(())
}

pub fn netns_path(name: &str) -> PathBuf {
    PathBuf::from(format!("/run/netns/{name}"))
}

impl Sandbox {
    pub fn new(tag: &str) -> R<Sandbox> {
        let mut sb = Sandbox {
            tag: tag.to_string(),
            host: format!("{tag}-host"),
            gateway: format!("{tag}-gw"),
            made: Vec::new(),
        };
        let (host, gw) = (sb.host.clone(), sb.gateway.clone());
        sb.add_netns(&[host, gw])?;
        Ok(sb)
    }

    /// Creates namespaces `names` (full names, which start with the tag).
    pub fn add_netns(&mut self, names: &[String]) -> R<()> {
        for n in names {
            debug_assert!(n.starts_with(&self.tag));
        }
        let lines: Vec<String> = names.iter().map(|n| format!("netns add {n}")).collect();
        // Record first: a half-done batch is still cleaned up.
        self.made.extend(names.iter().cloned());
        ip_batch(None, &lines)
    }

    /// Pod namespaces `<tag>-<prefix><i>` for i in 0..n.
    pub fn add_pods(&mut self, prefix: &str, n: usize) -> R<Vec<String>> {
        let names: Vec<String> = (0..n)
            .map(|i| format!("{}-{prefix}{i}", self.tag))
            .collect();
        self.add_netns(&names)?;
        Ok(names)
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
        ip_batch(Some(&self.gateway), &gw_lines)
    }

    pub fn host_path(&self) -> PathBuf {
        netns_path(&self.host)
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        // Pods first, then host (its veths die with it), then the gateway.
        for n in self.made.iter().rev() {
            let _ = Command::new("ip")
                .args(["netns", "del", n])
                .stderr(Stdio::null())
                .status();
        }
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
