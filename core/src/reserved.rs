//! The network names of the owners under which the agent holds ENIs for
//! itself rather than for a pod (src/support/exclusion.rs: reservations).

/// Excluded by config, or the node's primary interface.
pub const EXCLUDED_NETWORK: &str = "enim.io/excluded";
/// Quarantined: the ENI's device is not in the host.
pub const MISSING_NETWORK: &str = "enim.io/missing";
