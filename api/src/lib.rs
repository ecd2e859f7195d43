//! `enim-api`: the node agent's HTTP/JSON API on its unix socket (routes,
//! request and response bodies, error codes), the records and results it
//! speaks of ([`model`]), the note it leaves for STATUS ([`note`]) and its
//! one [`Client`]. Shared by `enimd` (server), the `enim` CNI plugin
//! (`enim-cni`) and `enimctl` (clients), so the two sides cannot drift.
//! Nothing here serves, nor touches the kernel beyond the client's socket.
//!
//! Every error body is an [`ApiError`] whose `code` is already a CNI error
//! code, so the plugin can pass it through unchanged.

pub mod client;
pub mod model;
pub mod note;

use std::path::PathBuf;

use enim_core::{Eni, EniOwner, PodRef};
use serde::{Deserialize, Serialize};

use crate::model::Record;

pub use client::{Client, ClientError};
pub use note::Serving;

pub const DEFAULT_SOCKET: &str = "/run/enim/enimd.sock";

pub const ROUTE_ADD: &str = "/v1/attachments/add";
pub const ROUTE_DEL: &str = "/v1/attachments/del";
pub const ROUTE_CHECK: &str = "/v1/attachments/check";
pub const ROUTE_GC: &str = "/v1/gc";
pub const ROUTE_ENIS: &str = "/v1/enis";
pub const ROUTE_ATTACHMENTS: &str = "/v1/attachments";
pub const ROUTE_STATUS: &str = "/v1/status";
/// What the node can hold, as the kubelet device plugin advertises it.
pub const ROUTE_DEVICES: &str = "/v1/devices";

/// The `details` of the "try again later" a request gets when it waited
/// `startup_wait` for enimd's startup recovery in vain: the plugin keeps
/// waiting for such an enimd (bounded), as for one that is not up yet.
pub const STARTING: &str = "enimd is starting: startup recovery is under way";

/// CNI error codes (spec 1.1.0) and enim's own (100 and up).
pub mod code {
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    pub const UNSUPPORTED_FIELD: u32 = 2;
    pub const UNKNOWN_CONTAINER: u32 = 3;
    pub const INVALID_ENV: u32 = 4;
    pub const IO_FAILURE: u32 = 5;
    pub const DECODE_FAILURE: u32 = 6;
    pub const INVALID_CONFIG: u32 = 7;
    pub const TRY_AGAIN_LATER: u32 = 11;
    pub const NOT_AVAILABLE: u32 = 50;
    pub const LIMITED_CONNECTIVITY: u32 = 51;
    /// The pod netns already has an interface with the requested name.
    pub const IFNAME_CONFLICT: u32 = 100;
    /// The provider handed out an ENI whose device is not on this node.
    pub const DEVICE_MISSING: u32 = 101;
    /// A kernel (netlink) operation failed.
    pub const KERNEL: u32 = 102;
    /// CHECK found the pod interface differs from the recorded result.
    pub const CHECK_MISMATCH: u32 = 103;
    /// The caller is not allowed to use the agent.
    pub const FORBIDDEN: u32 = 104;
    /// The provider refused for a permanent reason.
    pub const PROVIDER: u32 = 105;
    /// ADD for a key whose attachment is ready in another, live netns.
    pub const ATTACHMENT_CONFLICT: u32 = 106;
    /// Anything else inside the agent.
    pub const INTERNAL: u32 = 199;
}

/// Body of ADD, DEL and CHECK: the attachment key, the netns and the pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttachmentRequest {
    pub network: String,
    pub container_id: String,
    pub ifname: String,
    /// May be empty on DEL (the runtime may no longer know it).
    #[serde(default)]
    pub netns: PathBuf,
    #[serde(default)]
    pub pod: PodRef,
    /// CHECK only: which MTU the pod interface must have.
    #[serde(default, skip_serializing_if = "is_recorded")]
    pub expected_mtu: MtuExpectation,
}

/// What CHECK compares the interface MTU with. In a chain, a later plugin
/// (e.g. `tuning`) may own the MTU; the runtime's final result then says
/// what it should be, or says nothing (results before 1.1.0 carry no MTU).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MtuExpectation {
    /// The MTU enim set and recorded.
    #[default]
    Recorded,
    /// This exact MTU (from the chain's final result).
    Exactly(u32),
    /// Not checked: the chain's result does not say.
    Skip,
}

impl MtuExpectation {
    /// The MTU to require, given the one enim recorded; `None`: any.
    pub fn want(self, recorded: u32) -> Option<u32> {
        match self {
            MtuExpectation::Recorded => Some(recorded),
            MtuExpectation::Exactly(m) => Some(m),
            MtuExpectation::Skip => None,
        }
    }
}

fn is_recorded(m: &MtuExpectation) -> bool {
    *m == MtuExpectation::Recorded
}

impl AttachmentRequest {
    pub fn owner(&self) -> EniOwner {
        EniOwner {
            network: self.network.clone(),
            container_id: self.container_id.clone(),
            ifname: self.ifname.clone(),
            pod: self.pod.clone(),
        }
    }
}

/// One `{containerID, ifname}` of CNI GC's `cni.dev/valid-attachments`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ValidAttachment {
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub ifname: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GcRequest {
    /// Limit the pass to one network; `None` covers all.
    #[serde(default)]
    pub network: Option<String>,
    /// CNI GC: attachments of `network` not in this list are dead.
    /// `None` (periodic GC, enimctl) judges liveness by the netns alone.
    #[serde(default)]
    pub valid_attachments: Option<Vec<ValidAttachment>>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GcReport {
    /// Attachments collected (ENI back home and released).
    pub collected: Vec<String>,
    /// Attachments left alone because they are younger than the grace period.
    pub too_young: usize,
    /// ENIs the provider held with no record, released.
    pub orphans_released: Vec<String>,
    /// Collected attachments whose device was nowhere on the node: only the
    /// record was dropped (a subset of `collected`).
    #[serde(default)]
    pub records_dropped: Vec<String>,
    /// Free ENIs whose host name or MTU was put right.
    pub normalised: Vec<String>,
    /// Quarantined ENIs whose device is back in the host: free again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub back_in_service: Vec<String>,
    /// Kernel objects of enim's shape that no attachment explained, removed
    /// (veths; secondary mode also rules, route tables, proxy entries).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub swept: Vec<String>,
    /// What could not be done this pass (retried next pass).
    pub errors: Vec<GcError>,
}

impl GcReport {
    pub fn error(&mut self, subject: impl ToString, step: GcStep, e: impl std::fmt::Display) {
        self.errors.push(GcError {
            subject: subject.to_string(),
            step,
            message: e.to_string(),
        });
    }
}

/// One thing a GC pass could not do; the pass went on with the rest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{subject}: {step}: {message}")]
pub struct GcError {
    /// An attachment key, an ENI id, a kernel object or `node`.
    pub subject: String,
    pub step: GcStep,
    pub message: String,
}

/// The step of a GC pass that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GcStep {
    /// Checking whether an attachment's netns is alive.
    Netns,
    ProviderList,
    IntentWrite,
    OutcomeWrite,
    /// Taking a dead attachment's pod side apart.
    Unplumb,
    Release,
    HostLinks,
    LearnHomes,
    /// Putting a free ENI's host name and MTU right.
    Normalise,
    ReleaseOrphan,
    ReserveExcluded,
    /// Re-applying a host ENI's setup (secondary mode).
    ReconcileEni,
    /// Listing enim-shaped kernel objects.
    Inventory,
    /// Removing one enim-shaped kernel object no record explains.
    Sweep,
}

impl std::fmt::Display for GcStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The serde name, so logs and JSON say the same.
        let name = serde_json::to_value(self).ok();
        f.write_str(name.as_ref().and_then(|v| v.as_str()).unwrap_or("?"))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EniState {
    Free,
    InUse,
    Excluded,
    /// Quarantined: its device is not in the host; GC frees it when it is
    /// back.
    Missing,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EniStatus {
    #[serde(flatten)]
    pub eni: Eni,
    pub state: EniState,
    /// The device's current name in the host, when it is there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_device: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttachmentList {
    /// Every attachment, of the mode the node runs (and any kept from the
    /// other mode, untouched, should the node have switched).
    pub attachments: Vec<Record>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EniList {
    pub enis: Vec<EniStatus>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    pub version: String,
    /// True once startup recovery finished; ADDs wait until then.
    pub ready: bool,
    pub provider: String,
    pub enis_total: usize,
    pub enis_free: usize,
    pub attachments: usize,
    pub uptime_secs: u64,
    /// Why the node serves in a degraded way (its cloud API unreachable:
    /// only attached ENIs are handed out); absent when it serves normally.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub degraded: Option<String>,
    /// Secondary mode: the address pool in numbers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addresses: Option<crate::model::AddressStats>,
    /// Whether the node's network can serve ADDs, as enimd judges it
    /// (what STATUS answers); absent from an enimd older than the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serving: Option<Serving>,
}

/// `GET /v1/devices`: the device plugin's list (docs/architecture.md, "Scheduling"), for
/// `enimd device-plugin`. Answered 503 ([`code::TRY_AGAIN_LATER`]) until
/// enimd has its first list, after startup recovery.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceList {
    /// `enim.io/eni` (primary mode) or `enim.io/ip` (secondary mode).
    pub resource_name: String,
    /// True when enimd serves the kubelet itself (`[device_plugin]
    /// enabled = true`): `enimd device-plugin` then refuses to run, as the
    /// two would replace each other's registration.
    pub in_process_plugin: bool,
    /// True when enimd hands its ENIs out through DRA (`[dra] enabled =
    /// true`): `enimd device-plugin` then refuses to run, or the scheduler
    /// would count every ENI twice.
    #[serde(default)]
    pub dra: bool,
    /// Each with its health as enimd judges it.
    pub devices: Vec<crate::model::Device>,
}

/// Error body of every non-2xx answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{msg}")]
pub struct ApiError {
    pub code: u32,
    pub msg: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub details: String,
}

impl ApiError {
    pub fn new(code: u32, msg: impl Into<String>) -> Self {
        ApiError {
            code,
            msg: msg.into(),
            details: String::new(),
        }
    }

    pub fn with_details(mut self, details: impl Into<String>) -> Self {
        self.details = details.into();
        self
    }
}
