//! enim: an exclusive-ENI manager for Kubernetes.
//!
//! - [`manager`]: ADD / DEL / CHECK of attachments and crash recovery.
//! - [`netlink`]: the kernel side, over rtnetlink, behind a trait.
//! - [`checkpoint`]: the durable record of every attachment.
//! - [`attachment`]: the attachment record and its result.
//!
//! Providers (where ENIs come from) live in the `provider/` crates.

pub mod api;
pub mod attachment;
pub mod checkpoint;
pub mod cni;
pub mod daemon;
pub mod exclusion;
pub mod fault;
mod keylock;
pub mod manager;
pub mod netlink;
pub mod secondary;

pub use enim_provider as provider;
