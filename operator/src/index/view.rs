//! The cluster's objects as the operator plans over them: a Node, a
//! NetResourceSet and a DRA ResourceClaim, each cut down to the fields
//! [`plan`](super::plan) and the allocator read. Plain data: the runtime
//! converts the API server's objects into them (`crate::runtime`), the
//! tests and the bench build them by hand.

use std::collections::BTreeMap;
use std::time::SystemTime;

use enim_crd::{ClaimRef, EniParameters, NetResourceSetSpec, NetResourceSetStatus};

/// A Node as the operator needs it: read from the Node object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    pub name: String,
    /// The Node object's uid: the NetResourceSet's owner reference.
    pub uid: String,
    /// `spec.providerID`, e.g. `aws:///us-east-1a/i-0123456789abcdef0`.
    pub provider_id: String,
    /// The `node.kubernetes.io/instance-type` label.
    pub instance_type: String,
    /// The `topology.kubernetes.io/zone` label.
    pub zone: String,
    /// Every label: what the pools' selectors match.
    pub labels: BTreeMap<String, String>,
}

/// A NetResourceSet as the operator needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct SetInfo {
    pub name: String,
    pub spec: NetResourceSetSpec,
    pub status: Option<NetResourceSetStatus>,
    /// `metadata.deletionTimestamp`: its Node is gone (the garbage
    /// collector follows the owner reference) and the operator's finalizer
    /// holds it until the node's ENIs are released.
    pub deleting_since: Option<SystemTime>,
    /// Where the uninstall hook is in releasing it
    /// ([`enim_crd::UNINSTALL_ANNOTATION`]).
    pub uninstall: Uninstall,
}

/// A set under the uninstall hook's annotation, or not.
pub use enim_crd::Uninstall;

/// A ResourceClaim of the DRA driver's DeviceClass, as the operator needs
/// it: whether it waits for a device, and what it asks of a new ENI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimInfo {
    pub claim: ClaimRef,
    /// Not allocated yet: the scheduler found no device for it (or has not
    /// tried yet).
    pub pending: bool,
    /// Its opaque `enim.io` parameters; `None`: it asks for nothing the
    /// operator could make.
    pub want: Option<EniParameters>,
    /// The pod it was made for (its controlling owner, as a claim from a
    /// template has), by name and uid: told too when it cannot be served,
    /// since that is where a user looks.
    pub pod: Option<(String, String)>,
    /// The EniPolicy whose template it was made from (its `enim.io/policy`
    /// label), if any.
    pub policy: Option<String>,
}

/// An EniPolicy that keeps ENIs warm (its `warmEnis`): what its claims ask
/// of an ENI (its groups, and subnet per zone), and how many free ones to
/// keep in each zone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WarmPool {
    pub policy: String,
    pub want: EniParameters,
    pub count: usize,
}
