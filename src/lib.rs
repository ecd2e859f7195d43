//! enim: an exclusive-ENI manager for Kubernetes; this crate is its node
//! agent (`enimd`) and CLI (`enimctl`).
//!
//! One engine, one driver per mode:
//! - [`engine`]: ADD / DEL / CHECK, GC and crash recovery, written once
//!   over the [`engine::Driver`] trait.
//! - [`primary`] and [`secondary`]: the two drivers (a whole ENI in the
//!   pod; a secondary address over a veth).
//! - [`netlink`]: the only place that builds kernel messages.
//! - [`store`]: the checkpoint and its atomic writer.
//! - [`daemon`] (`enimd`), [`deviceplugin`] (what the node can hold, told
//!   to the kubelet), [`dra`] (the same through DRA).
//! - [`support`]: key locks, exclusions, crash points.
//!
//! Elsewhere: the agent's API types, the one attachment record and its
//! client in `enim-api` (`api/`); the CNI plugin `enim` in `enim-cni`
//! (`cni/`); providers (where ENIs come from) in the `provider/` crates.

pub mod clusterview;
pub mod daemon;
pub mod deviceplugin;
pub mod dra;
pub mod engine;
pub mod netlink;
pub mod primary;
pub mod secondary;
pub mod store;
pub mod support;
pub mod uninstall;

pub use enim_provider as provider;
