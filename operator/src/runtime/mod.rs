//! The operator's process: the Kubernetes client, the watches of Nodes and
//! NetResourceSets, the leader lease, the resync loop and the health and
//! metrics endpoint. The only module that talks to the API server.
//!
//! Invariants:
//! - Every replica keeps its caches warm (both watches run always), so a
//!   follower that becomes leader resyncs at once from a full view.
//! - Only the leader resyncs, and its [`Leadership`](crate::leader::Leadership)
//!   (the lease manager's flag and the leader deadline read from the
//!   Lease, see [`crate::leader`]) is checked again before every cloud
//!   call and write ([`crate::store::Store::leadership`]): leadership can
//!   move in the middle of a resync. A pass still running when leadership
//!   is lost (its deadline passed) is abandoned, as at SIGTERM, so no
//!   further call of it is sent; its intents are left for the next leader.
//!   A deposed leader cut off from the API server therefore stops calling
//!   the cloud before a follower can take over, whatever the lease
//!   manager's flag (which it cannot lower without the API server) says.
//! - The operator writes spec and metadata under `enim-operator`; the
//!   agents' status is never part of what it applies.
//! - Nodes are cached without their status and managed fields: at 1,000
//!   nodes a full Node is tens of KiB, most of it images and conditions the
//!   operator never reads.
//!
//! The parts: `lease_loop` (the process's loop, [`run`]), `watch` (the
//! caches and the Lease's deadline), `convert` (API objects into the
//! index's views), `store` ([`KubeStore`]: the writes), `resync` (one
//! pass: the [`Resync`] trait and the allocator behind it), `events` (what
//! the allocator tells, as Kubernetes Events) and `health` (`/healthz`,
//! `/readyz`, `/metrics`).

use std::net::SocketAddr;
use std::time::Duration;

mod convert;
mod events;
mod health;
mod lease_loop;
mod resync;
mod store;
mod watch;

pub use convert::{
    claim_info, node_info, set_info, DEVICE_CLASS, DRA_DRIVER, LABEL_INSTANCE_TYPE, LABEL_ZONE,
};
pub use health::Health;
pub use lease_loop::run;
pub use resync::{Resync, ResyncError};
pub use store::{applied_set, KubeStore};

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("Kubernetes client: {0}")]
    Client(#[source] kube::Error),
    #[error("leader lease {name} in {namespace}: {source}")]
    Lease {
        name: String,
        namespace: String,
        #[source]
        source: kube_lease_manager::LeaseManagerError,
    },
    /// The resync could not be built (the allocator refused its config).
    #[error(transparent)]
    Allocator(#[from] crate::allocator::Error),
    #[error("health endpoint {addr}: {source}")]
    Health {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// How the process runs (command line; the policy is the allocator's).
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// The namespace of the leader Lease (the operator's own).
    pub namespace: String,
    pub lease_name: String,
    /// This replica's name in the Lease (its pod name).
    pub identity: String,
    /// Its pod's uid (the downward API's), for the events told on it.
    pub pod_uid: Option<String>,
    /// A leader that has not renewed for this long loses the lease; a
    /// follower takes over within it (plus one renew period).
    pub lease_duration: Duration,
    /// The leader renews this long before its lease would expire; half of
    /// it is the leader deadline's margin ([`crate::leader::margin`]).
    pub lease_grace: Duration,
    /// A resync runs at least this often while leading.
    pub resync_interval: Duration,
    /// Changes seen by the watches within this window share one resync.
    pub debounce: Duration,
    /// `/healthz`, `/readyz` and `/metrics`.
    pub health_addr: SocketAddr,
    /// The EniPolicy webhook, served by every replica; `None`: off.
    pub webhook: Option<crate::policy::WebhookSettings>,
}
