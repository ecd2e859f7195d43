//! What ADD and CHECK hand back: the pod's interface with its addresses and
//! routes (and primary mode's host path beside it). The CNI plugin turns this into a versioned CNI
//! result.

use std::net::IpAddr;
use std::path::PathBuf;

use enim_core::MacAddr;
use ipnet::IpNet;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttachmentResult {
    pub interface: InterfaceConfig,
    /// Primary mode's host path: the pod end of the veth to the host, a
    /// second interface in the pod without addresses of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<InterfaceConfig>,
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

impl RouteConfig {
    /// The default route of `gw`'s family via `gw`.
    pub fn default_via(gw: IpAddr) -> Self {
        let dst = match gw {
            IpAddr::V4(_) => IpNet::V4(ipnet::Ipv4Net::default()),
            IpAddr::V6(_) => IpNet::V6(ipnet::Ipv6Net::default()),
        };
        RouteConfig { dst, gw: Some(gw) }
    }
}
