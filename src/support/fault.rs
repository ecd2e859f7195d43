//! Crash points for tests: with the `fault-injection` feature, setting
//! `ENIMD_CRASH_AT=<point>` makes the process abort (as if SIGKILLed) when it
//! reaches that point, and `ENIMD_DELAY_AT=<point>=<ms>` makes it stall
//! there (to kill a client mid-request). Without the feature every point
//! compiles to nothing.
//!
//! Points: `add:after-allocate`, `add:after-intent`, `add:after-move`,
//! `add:after-configure` (before the outcome write), `add:after-outcome`,
//! `del:after-intent`, `del:after-move`, `del:after-restore`,
//! `del:after-release` (before the record is dropped),
//! `startup:before-recover` (listening, not yet ready).
//!
//! With the host path on, primary mode also passes
//! [`HOST_PATH_CRASH_POINTS`] (`refresh:after-kernel` only when it follows
//! the API's service CIDRs). Secondary mode has its own list ([`SECONDARY_CRASH_POINTS`]): the ADD
//! points without the move, and `del:after-unplumb` (veth, rules and
//! routes removed) in place of DEL's move and restore.

/// The warm address pool's cloud steps in secondary mode: after an assign
/// returned (the addresses are in the cloud, not yet in the store), after
/// an ENI was attached (not yet taken in), and after free addresses left
/// the store (not yet unassigned in the cloud).
pub const POOL_CRASH_POINTS: &[&str] = &[
    "pool:after-assign",
    "pool:after-attach",
    "pool:before-unassign",
];

/// The DRA driver's points: a prepared claim on disk, not yet answered to
/// the kubelet (src/dra/claims.rs).
pub const DRA_CRASH_POINTS: &[&str] = &["dra:after-claim-write"];

/// Every crash point the agent has, for tests that iterate over them.
pub const CRASH_POINTS: &[&str] = &[
    "add:after-allocate",
    "add:after-intent",
    "add:after-move",
    "add:after-configure",
    "add:after-outcome",
    "del:after-intent",
    "del:after-move",
    "del:after-restore",
    "del:after-release",
    "startup:before-recover",
];

/// The points primary mode passes besides [`CRASH_POINTS`] when pods get a
/// host path: its veth made but not configured, and a running pod rerouted
/// for new service CIDRs before its record says so (tests/host_path_api.rs).
/// On DEL the host path is deleted after the ENI's move, behind the answer:
/// `del:after-move` and the later points find it still there.
pub const HOST_PATH_CRASH_POINTS: &[&str] = &["add:after-host-veth", "refresh:after-kernel"];

/// The crash points secondary mode passes, in order.
pub const SECONDARY_CRASH_POINTS: &[&str] = &[
    "add:after-allocate",
    "add:after-intent",
    "add:after-configure",
    "add:after-outcome",
    "del:after-intent",
    "del:after-unplumb",
    "del:after-release",
];

/// Reaches `point`: aborts or stalls there as the environment asks (see
/// [`enim_core::fault`], which the providers' cloud steps use too).
pub fn crash_point(point: &'static str) {
    debug_assert!(
        [
            CRASH_POINTS,
            HOST_PATH_CRASH_POINTS,
            SECONDARY_CRASH_POINTS,
            POOL_CRASH_POINTS,
            DRA_CRASH_POINTS
        ]
        .iter()
        .any(|list| list.contains(&point)),
        "undeclared crash point {point}"
    );
    enim_core::fault::crash_point(point);
}
