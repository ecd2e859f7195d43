//! One device of the kubelet's device plugin API (an ENI in primary mode,
//! an assignable address in secondary mode): plain data, shared by the
//! agent's API (`GET /v1/devices`) and the device plugin that serves it.

use serde::{Deserialize, Serialize};

/// One device as the kubelet sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Device {
    pub id: String,
    pub healthy: bool,
}

impl Device {
    /// A device the kubelet may hand out.
    pub fn healthy(id: impl Into<String>) -> Device {
        Device {
            id: id.into(),
            healthy: true,
        }
    }
}
