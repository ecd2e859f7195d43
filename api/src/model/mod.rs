//! Pure data shared by every part of the agent: the attachment key and
//! phase, the one record type both modes keep in the checkpoint, and the
//! CNI-shaped result of an attachment. Nothing here talks to the kernel,
//! the provider or the disk.

pub mod device;
pub mod naming;
pub mod record;
pub mod result;

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

pub use device::Device;
pub use record::{
    HostPath, Mode, Payload, PrimaryPayload, Record, SecondaryPayload, GATEWAY4, GATEWAY6,
};
pub use result::{AttachmentResult, InterfaceConfig, IpConfig, RouteConfig};

/// What CNI keys state by: (network name, container id, ifname).
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

impl AttachmentKey {
    pub fn of(owner: &enim_core::EniOwner) -> Self {
        AttachmentKey {
            network: owner.network.clone(),
            container_id: owner.container_id.clone(),
            ifname: owner.ifname.clone(),
        }
    }

    /// The owner with this identity (no pod metadata).
    pub fn owner(&self) -> enim_core::EniOwner {
        enim_core::EniOwner {
            network: self.network.clone(),
            container_id: self.container_id.clone(),
            ifname: self.ifname.clone(),
            pod: enim_core::PodRef::default(),
        }
    }
}

/// Where an attachment stands. Intent phases are written before the kernel
/// is touched, so a crash leaves a record saying what was under way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Resources allocated, the pod side about to be made (or being made).
    Adding,
    /// The pod side is made; the result has been returned.
    Ready,
    /// Teardown under way.
    Deleting,
}

/// Unix time in milliseconds (0 if the clock is before 1970).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Secondary mode's address counts (the metrics' `enim_secondary_addresses`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddressStats {
    pub total: usize,
    pub assigned: usize,
    pub cooling: usize,
    /// How many pods the addresses serve in all: each takes an IPv4
    /// address, and on a dual-stack node an IPv6 one of the same ENI.
    pub pods: usize,
    /// Assigned addresses the cloud no longer shows on their ENI
    /// (unassigned from outside): kept for their pods, dropped on release.
    #[serde(default)]
    pub lost: usize,
}
