//! The operator's only way to write, so that the allocator runs the same
//! over a real API server ([`crate::runtime`]) and over the bench's
//! in-memory fleet simulation; and what it tells the cluster as
//! Kubernetes Events ([`Told`]).

use std::time::Duration;

use async_trait::async_trait;
use enim_crd::{ClaimRef, NetResourceSetSpec};

use crate::index::NodeInfo;

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
    #[error("conflict writing {name}: {source}")]
    Conflict {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("API server: {name}: {source}")]
    Api {
        name: String,
        #[source]
        source: kube::Error,
    },
}

/// A cloud step on a node's ENI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EniStep {
    Create,
    Attach,
    Detach,
    Delete,
}

/// What the allocator tells the cluster: the runtime posts each as Events
/// on the NetResourceSet and on the Node or ResourceClaim it concerns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Told {
    /// A cloud call on node `node`'s ENI failed (the next resync retries).
    EniStepFailed {
        node: String,
        /// The Node's uid; `None` once the Node is gone.
        node_uid: Option<String>,
        step: EniStep,
        /// The ENI, when it exists already.
        eni: Option<String>,
        error: String,
    },
    /// The cloud answered a call for node `node` "throttled" (after the
    /// client's own retries).
    Throttled {
        node: String,
        node_uid: Option<String>,
        error: String,
    },
    /// A deleted node's ENIs are all back to the cloud: its set goes.
    NodeReleased { node: String },
    /// An ENI was made for a DRA claim on node `node`.
    ClaimServed {
        claim: ClaimRef,
        node: String,
        eni: String,
    },
    /// No node can take an ENI for a pending claim (told once while it
    /// lasts), on the claim and on its pod (name, uid) when it has one.
    ClaimNotServable {
        claim: ClaimRef,
        pod: Option<(String, String)>,
        why: String,
    },
    /// Listing the cluster's ENIs was throttled: the resync stopped before
    /// any node's task (told on the operator's own Pod).
    ListingThrottled { error: String },
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

    /// Tells `told` to the cluster, never waiting (the runtime queues it;
    /// a store with nobody to tell drops it).
    fn tell(&self, told: Told) {
        let _ = told;
    }

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
