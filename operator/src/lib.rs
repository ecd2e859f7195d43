//! enim-operator: the control plane. One leader (a `coordination.k8s.io`
//! Lease) allocates ENIs for every node of the cluster through the node's
//! NetResourceSet, so that nodes hold no cloud credentials.
//!
//! The parts, top-down, with no circle:
//! - [`runtime`]: arguments, the Kubernetes client, the watches of Nodes
//!   and NetResourceSets, the lease; the only module that talks to the
//!   API server. It implements [`store::Store`] over kube and converts
//!   the API server's objects into the index's views.
//! - [`allocator`]: one resync: list the cluster's ENIs once, build the
//!   [`index`], [`plan`](index::plan) and run the tasks neediest first on
//!   a bounded number of workers, each cloud call behind its API class's
//!   token bucket; spec writes go through [`store::Store`].
//! - [`index`]: the cluster as the operator sees it (its views of Nodes,
//!   NetResourceSets and claims included), and `plan`, a pure
//!   function from it to tasks, reaping included (leaked ENIs: tagged for
//!   the cluster, attached nowhere, older than the cooldown; the ENIs of
//!   deleted nodes after their grace). No I/O: unit tests feed it objects.
//! - [`leader`]: the leader deadline, from the Lease as the API server
//!   stores it: past it a replica neither writes nor calls the cloud,
//!   whatever the lease manager's flag says.
//! - [`config`] (the policy) and [`setup`] (the config file and the cloud
//!   it names).
//! - [`store`]: the operator's only way to write: the interface the
//!   allocator writes through, implemented by the runtime (kube) and by
//!   the bench's fleet simulation (in memory).
//!
//! The operator imports `enim-crd` and the provider crates' cloud
//! backends (through [`enim_provider::fleet::FleetCloud`]); never the
//! agent.

pub mod allocator;
pub mod config;
pub mod index;
pub mod leader;
pub mod policy;
pub mod runtime;
pub mod setup;
pub mod store;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
