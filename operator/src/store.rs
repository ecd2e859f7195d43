//! The operator's only way to write, so that the allocator runs the same
//! over a real API server ([`crate::runtime`]) and over the bench's
//! in-memory fleet simulation.

use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use enim_crd::NetResourceSetSpec;

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
}

/// A NetResourceSet as the operator needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct SetInfo {
    pub name: String,
    pub spec: NetResourceSetSpec,
    pub status: Option<enim_crd::NetResourceSetStatus>,
    /// `metadata.deletionTimestamp`: its Node is gone (the garbage
    /// collector follows the owner reference) and the operator's finalizer
    /// holds it until the node's ENIs are released.
    pub deleting_since: Option<SystemTime>,
}

/// A ResourceClaim of the DRA driver's DeviceClass, as the operator needs
/// it: whether it waits for a device, and what it asks of a new ENI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimInfo {
    pub claim: enim_crd::ClaimRef,
    /// Not allocated yet: the scheduler found no device for it (or has not
    /// tried yet).
    pub pending: bool,
    /// Its opaque `enim.io` parameters; `None`: it asks for nothing the
    /// operator could make.
    pub want: Option<enim_crd::EniParameters>,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// This replica is no longer the leader: it must not write.
    #[error("not the leader")]
    NotLeader,
    /// The lease manager still says leader, but the Lease was not renewed
    /// in time (the leader deadline, `crate::leader`): a follower may hold
    /// it by now, so this replica must neither write nor call the cloud.
    #[error("leader deadline passed {0:?} ago: the lease may be another replica's")]
    PastDeadline(Duration),
    /// The object changed under the write (a conflict) or is gone.
    #[error("conflict writing {0}")]
    Conflict(String),
    #[error("API server: {0}")]
    Api(String),
}

#[async_trait]
pub trait Store: Send + Sync {
    /// Creates or updates node `node`'s NetResourceSet spec (server-side
    /// apply under `enim_crd::OPERATOR_MANAGER`, owned by the Node, with
    /// the finalizer `enim_crd::FINALIZER`).
    async fn apply_spec(
        &self,
        node: &NodeInfo,
        spec: &NetResourceSetSpec,
    ) -> Result<(), StoreError>;

    /// Lets a deleted node's NetResourceSet go (removes the finalizer),
    /// once its ENIs are released.
    async fn release_set(&self, name: &str) -> Result<(), StoreError>;

    /// Whether this replica still leads.
    fn is_leader(&self) -> bool;

    /// `Ok` while this replica may call the cloud and write, else why not
    /// ([`StoreError::NotLeader`] or [`StoreError::PastDeadline`]). The
    /// allocator asks it before every cloud call and every write, since
    /// leadership can move during a resync.
    fn leadership(&self) -> Result<(), StoreError> {
        if self.is_leader() {
            Ok(())
        } else {
            Err(StoreError::NotLeader)
        }
    }
}
