//! enim: an exclusive-ENI manager for Kubernetes.
//!
//! One engine, one driver per mode:
//! - [`engine`]: ADD / DEL / CHECK, GC and crash recovery, written once
//!   over the [`engine::Driver`] trait.
//! - [`primary`] and [`secondary`]: the two drivers (a whole ENI in the
//!   pod; a secondary address over a veth).
//! - [`model`]: the one attachment record and the CNI-shaped result.
//! - [`netlink`]: the only place that builds kernel messages.
//! - [`store`]: the checkpoint and its atomic writer.
//! - [`api`]: the agent's HTTP API types and its one client.
//! - [`daemon`] (`enimd`), [`cni`] (the plugin), [`deviceplugin`] (what
//!   the node can hold, told to the kubelet).
//! - [`support`]: key locks, exclusions, crash points.
//!
//! Providers (where ENIs come from) live in the `provider/` crates.

pub mod api;
pub mod cni;
pub mod daemon;
pub mod deviceplugin;
pub mod dra;
pub mod engine;
pub mod model;
pub mod netlink;
pub mod primary;
pub mod secondary;
pub mod store;
pub mod support;

pub use enim_provider as provider;
