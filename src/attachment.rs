//! Attachments: one pod interface holding one ENI, keyed as CNI keys state
//! (network name, container id, ifname).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use enim_provider::{EniOwner, MacAddr, PodRef};
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct AttachmentKey {
    pub network: String,
    pub container_id: String,
    pub ifname: String,
}

impl fmt::Display for AttachmentKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.network, self.container_id, self.ifname)
    }
}

/// Where an attachment stands. Intent phases are written before the kernel
/// is touched, so a crash leaves a record saying what was under way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// ENI allocated, device about to move into the pod (or moving).
    Adding,
    /// Device configured in the pod; the result has been returned.
    Ready,
    /// Teardown under way.
    Deleting,
}

/// One attachment as recorded in the checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attachment {
    #[serde(flatten)]
    pub key: AttachmentKey,
    #[serde(default)]
    pub pod: PodRef,
    pub eni_id: String,
    pub mac: MacAddr,
    /// The device's name and MTU in the host, restored on DEL.
    pub host_name: String,
    pub host_mtu: u32,
    pub netns: PathBuf,
    /// MTU the pod interface was given.
    pub mtu: u32,
    pub ipv4: Ipv4Net,
    pub gateway4: Ipv4Addr,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<Ipv6Net>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway6: Option<Ipv6Addr>,
    pub phase: Phase,
    /// Unix time in milliseconds.
    pub created_ms: u64,
    pub updated_ms: u64,
    /// Set when the ADD's result may never have reached the runtime (the
    /// plugin went away mid-request): unless a retried ADD, a CHECK or a DEL
    /// claims the attachment before this time (Unix ms), GC collects it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_ms: Option<u64>,
}

impl Attachment {
    pub fn owner(&self) -> EniOwner {
        EniOwner {
            network: self.key.network.clone(),
            container_id: self.key.container_id.clone(),
            ifname: self.key.ifname.clone(),
            pod: self.pod.clone(),
        }
    }

    /// The CNI-shaped result of this attachment.
    pub fn result(&self) -> AttachmentResult {
        let mut ips = vec![IpConfig {
            address: IpNet::V4(self.ipv4),
            gateway: Some(IpAddr::V4(self.gateway4)),
        }];
        let mut routes = vec![RouteConfig {
            dst: "0.0.0.0/0".parse().expect("literal"),
            gw: Some(IpAddr::V4(self.gateway4)),
        }];
        if let Some(v6) = self.ipv6 {
            ips.push(IpConfig {
                address: IpNet::V6(v6),
                gateway: self.gateway6.map(IpAddr::V6),
            });
            if let Some(gw6) = self.gateway6 {
                routes.push(RouteConfig {
                    dst: "::/0".parse().expect("literal"),
                    gw: Some(IpAddr::V6(gw6)),
                });
            }
        }
        AttachmentResult {
            interface: InterfaceConfig {
                name: self.key.ifname.clone(),
                mac: self.mac,
                mtu: self.mtu,
                sandbox: self.netns.clone(),
            },
            ips,
            routes,
            eni_id: self.eni_id.clone(),
        }
    }
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// What ADD hands back: one interface in the pod with its addresses and
/// routes. The CNI plugin turns this into a versioned CNI result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttachmentResult {
    pub interface: InterfaceConfig,
    pub ips: Vec<IpConfig>,
    pub routes: Vec<RouteConfig>,
    pub eni_id: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InterfaceConfig {
    pub name: String,
    pub mac: MacAddr,
    pub mtu: u32,
    pub sandbox: PathBuf,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpConfig {
    pub address: IpNet,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<IpAddr>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteConfig {
    pub dst: IpNet,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw: Option<IpAddr>,
}
