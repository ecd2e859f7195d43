//! The ENI and address types every part of enim speaks: an [`Eni`] and
//! who holds it ([`EniOwner`]), where it lives ([`Placement`]), how many
//! addresses an instance may carry ([`AddressLimits`]) and one assign asks
//! for ([`AddressCount`]), and what the agent's stores and pools report.
//! Plain data: no type here talks to a cloud or to the kernel.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};
use serde::{Deserialize, Serialize};

use crate::mac::MacAddr;

/// The Kubernetes pod an attachment belongs to, as the runtime told us in
/// CNI_ARGS. Informational: identity is the [`EniOwner::key`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PodRef {
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

impl fmt::Display for PodRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() && self.name.is_empty() {
            f.write_str("-")
        } else {
            write!(f, "{}/{}", self.namespace, self.name)
        }
    }
}

/// Who holds an ENI: a pod plus the CNI attachment (network name, container
/// id, interface name) it was allocated for.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct EniOwner {
    pub network: String,
    pub container_id: String,
    pub ifname: String,
    #[serde(default)]
    pub pod: PodRef,
}

impl EniOwner {
    /// The identity of an owner: two owners with the same key are the same
    /// attachment, whatever pod metadata came along.
    pub fn key(&self) -> (&str, &str, &str) {
        (&self.network, &self.container_id, &self.ifname)
    }

    pub fn same_attachment(&self, other: &EniOwner) -> bool {
        self.key() == other.key()
    }
}

impl fmt::Display for EniOwner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({}:{}:{})",
            self.pod, self.network, self.container_id, self.ifname
        )
    }
}

/// One ENI this node may use, as the provider sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Eni {
    pub id: String,
    pub mac: MacAddr,
    /// Primary IPv4 address with the subnet prefix length.
    pub ipv4: Ipv4Net,
    pub gateway4: Ipv4Addr,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<Ipv6Net>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway6: Option<Ipv6Addr>,
    /// MTU the pod interface gets; `None` keeps the device's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<EniOwner>,
    /// The ENI's device index on the instance (secondary mode numbers its
    /// route table from it); `None` when the provider does not know it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_index: Option<u32>,
    /// Secondary mode: the ENI's secondary private addresses (IPv4 and
    /// IPv6), handed to pods one each. Never the ENI's own addresses.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secondary_ips: Vec<IpAddr>,
    /// Where the ENI lives and which groups guard it, as far as the
    /// provider knows; the DRA driver publishes it as device attributes.
    #[serde(default, skip_serializing_if = "Placement::is_empty")]
    pub placement: Placement,
}

/// An ENI's subnet, zone, security groups and network card. Every field is
/// optional: a static inventory may say nothing, a cloud listing says all.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Placement {
    /// The ENI's subnet id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subnet: Option<String>,
    /// The ENI's availability zone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// The security groups that guard the ENI.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub security_groups: Vec<String>,
    /// The network card the ENI is attached through (EC2's NetworkCardIndex).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_card: Option<u32>,
}

impl Placement {
    pub fn is_empty(&self) -> bool {
        *self == Placement::default()
    }
}

/// How many addresses one ENI may carry on this instance, its own primary
/// address included (EC2 `DescribeInstanceTypes`:
/// `Ipv4AddressesPerInterface`, `Ipv6AddressesPerInterface`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddressLimits {
    pub ipv4_per_eni: usize,
    pub ipv6_per_eni: usize,
    /// ENIs the instance may have attached, its primary interface included.
    pub enis: usize,
}

/// How many new secondary addresses of each family one assign asks for.
/// Named, so the two counts cannot trade places unseen.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AddressCount {
    pub ipv4: usize,
    pub ipv6: usize,
}

impl AddressCount {
    /// `ipv4` new IPv4 addresses and no IPv6.
    pub fn v4(ipv4: usize) -> AddressCount {
        AddressCount { ipv4, ipv6: 0 }
    }
}

/// [`AddressLimits`] as an operator's config states them: unknown keys
/// are refused here (the type itself is read leniently where it is data).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// ENIs the instance may have attached, its primary interface included.
    pub enis: usize,
    /// IPv4 addresses per ENI, its own primary address included.
    pub ipv4_per_eni: usize,
    /// IPv6 addresses per ENI.
    #[serde(default)]
    pub ipv6_per_eni: usize,
}

impl From<LimitsConfig> for AddressLimits {
    fn from(c: LimitsConfig) -> Self {
        AddressLimits {
            ipv4_per_eni: c.ipv4_per_eni,
            ipv6_per_eni: c.ipv6_per_eni,
            enis: c.enis,
        }
    }
}

impl AddressLimits {
    /// Secondary IPv4 addresses one ENI may carry (its primary excluded).
    pub fn secondary_ipv4_per_eni(&self) -> usize {
        self.ipv4_per_eni.saturating_sub(1)
    }
}

/// What the agent's secondary-mode address store holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredAddresses {
    /// The host ENIs it serves from (set up in the kernel).
    pub enis: Vec<String>,
    /// Every address it may hand out or has handed out.
    pub addresses: Vec<IpAddr>,
    /// Of `addresses`, those a pod gave back that rest their cooldown: not
    /// handed out again until it ends, so not free.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cooling: Vec<IpAddr>,
}

/// A warm pool's state in cilium's and CCE's IPAM terms: ENIs in use, free, still to
/// pre-allocate, and above the high watermark.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolStatistics {
    pub used: usize,
    pub available: usize,
    pub needed: usize,
    pub excess: usize,
}
