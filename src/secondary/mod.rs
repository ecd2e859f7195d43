//! Secondary mode: ENIs stay in the host, pods get their secondary IPs over
//! veth pairs, and per-ENI policy routing sends each pod's traffic out of
//! its own ENI.
//!
//! - [`datastore`]: which secondary address of which ENI each pod holds.
//! - [`plumbing`]: the host and pod side in the kernel, over rtnetlink.
//! - [`driver`]: the [`crate::engine::Driver`] of this mode.
//! - [`host`]: the host ENIs and the store, shared by the driver and the
//!   pool.
//! - [`warm`]: the warm address pool on a cloud (assign, attach, release).
//! - [`feed`]: addresses decided outside the agent (the cluster provider),
//!   followed as they change.
//!
//! Kernel layout for a pod holding `P` on an ENI with device index `d`:
//! - ENI renamed to `<eni_name_prefix><d>`, up, its MTU, rp_filter loose;
//!   its route table `table_offset + d` holds a link route to the gateway
//!   and the default route via the gateway on the ENI.
//! - veth pair: the pod end (`ifname`) has `P/32` (`P/128`) and default
//!   routes via [`GATEWAY4`] / [`GATEWAY6`]; the host end
//!   (`<veth_prefix><hash of key>`) carries the host route to `P`.
//! - the ENI answers ARP / NS for `P` (proxy neighbour entries).
//! - rules `to P lookup main` at `rule_priority_to_pod` and `from P lookup
//!   <ENI table>` at `rule_priority_from_pod`.

pub mod config;
pub mod datastore;
pub mod driver;
#[cfg(test)]
pub mod fake;
pub mod feed;
pub mod host;
pub mod plumbing;
pub mod warm;

pub use config::{SecondaryConfig, SecondaryConfigError};
pub use driver::SecondaryDriver;
pub use enim_api::model::{GATEWAY4, GATEWAY6};
pub use host::HostEni;
pub use warm::WarmIpConfig;

/// Device indexes above this are refused: the table range GC treats as
/// enim's is `table_offset ..= table_offset + MAX_DEVICE_INDEX`.
pub const MAX_DEVICE_INDEX: u32 = 255;

#[cfg(test)]
pub(crate) mod tests;
