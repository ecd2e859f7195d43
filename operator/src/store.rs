//! The operator's only way to write, so that the allocator runs the same
//! over a real API server ([`crate::runtime`]) and over the bench's
//! in-memory fleet simulation.

use std::time::Duration;

use async_trait::async_trait;
use enim_crd::NetResourceSetSpec;

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
