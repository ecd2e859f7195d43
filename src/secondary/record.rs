//! The checkpoint record of one secondary-mode attachment: a pod holding a
//! secondary address of a host ENI over a veth pair.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;

use enim_provider::{EniOwner, MacAddr, PodRef};
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use serde::{Deserialize, Serialize};

use super::{GATEWAY4, GATEWAY6};
use crate::attachment::{
    AttachmentKey, AttachmentResult, InterfaceConfig, IpConfig, Phase, RouteConfig,
};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecondaryAttachment {
    #[serde(flatten)]
    pub key: AttachmentKey,
    #[serde(default)]
    pub pod: PodRef,
    /// The ENI whose secondary address the pod holds.
    pub eni_id: String,
    /// Its route table, and the rule priorities used, as when the pod was
    /// plumbed: teardown removes exactly these even if the config changed.
    pub table: u32,
    pub rule_priority_to_pod: u32,
    pub rule_priority_from_pod: u32,
    /// The host end of the veth pair.
    pub host_veth: String,
    pub netns: PathBuf,
    pub mtu: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv4: Option<Ipv4Addr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<Ipv6Addr>,
    /// The pod interface's MAC, known once it exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<MacAddr>,
    pub phase: Phase,
    /// Unix time in milliseconds.
    pub created_ms: u64,
    pub updated_ms: u64,
    /// Set when the ADD's result may never have reached the runtime: GC
    /// collects the pod after this time (Unix ms) unless a retried ADD, a
    /// CHECK or a DEL claims it first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_ms: Option<u64>,
}

impl SecondaryAttachment {
    pub fn owner(&self) -> EniOwner {
        EniOwner {
            network: self.key.network.clone(),
            container_id: self.key.container_id.clone(),
            ifname: self.key.ifname.clone(),
            pod: self.pod.clone(),
        }
    }

    pub fn ips(&self) -> Vec<IpAddr> {
        super::pod_ips(self.ipv4, self.ipv6)
    }

    /// The CNI-shaped result: the pod address as a host prefix, the
    /// link-local gateways, default routes through them.
    pub fn result(&self) -> AttachmentResult {
        let mut ips = Vec::new();
        let mut routes = Vec::new();
        if let Some(v4) = self.ipv4 {
            ips.push(IpConfig {
                address: IpNet::V4(Ipv4Net::new(v4, 32).expect("32 is a valid prefix")),
                gateway: Some(IpAddr::V4(GATEWAY4)),
            });
            routes.push(RouteConfig {
                dst: "0.0.0.0/0".parse().expect("literal"),
                gw: Some(IpAddr::V4(GATEWAY4)),
            });
        }
        if let Some(v6) = self.ipv6 {
            ips.push(IpConfig {
                address: IpNet::V6(Ipv6Net::new(v6, 128).expect("128 is a valid prefix")),
                gateway: Some(IpAddr::V6(GATEWAY6)),
            });
            routes.push(RouteConfig {
                dst: "::/0".parse().expect("literal"),
                gw: Some(IpAddr::V6(GATEWAY6)),
            });
        }
        AttachmentResult {
            interface: InterfaceConfig {
                name: self.key.ifname.clone(),
                mac: self.mac.unwrap_or(MacAddr([0; 6])),
                mtu: self.mtu,
                sandbox: self.netns.clone(),
            },
            ips,
            routes,
            eni_id: self.eni_id.clone(),
        }
    }
}
