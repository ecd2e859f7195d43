//! Primary mode: a whole ENI moves into the pod, renamed to the pod's
//! interface name, with its MTU, addresses and default routes; DEL brings
//! it home under its host name and MTU.
//!
//! - [`driver`]: the [`crate::engine::Driver`] of this mode.
//! - [`hostpath`]: the `[host_path]` config and what each pod's host path
//!   routes (the kernel side is [`crate::netlink::hostpath`]).
//! - [`servicecidrs`]: the service CIDRs host paths route, configured or
//!   followed from the API's `ServiceCIDR` objects.
//! - [`masquerade`]: the nftables table that masquerades Service and
//!   hostPort connections touching a host path (start-up state).
//! - [`host`]: GC's host pass (orphaned assignments, drifted free ENIs,
//!   excluded ENIs) and `/v1/enis`.

pub mod driver;
mod host;
pub mod hostpath;
pub mod masquerade;
pub mod servicecidrs;

pub use driver::PrimaryDriver;
pub use hostpath::HostPathConfig;

#[cfg(test)]
pub(crate) mod tests;
