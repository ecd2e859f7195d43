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
//! [`HOST_PATH_CRASH_POINTS`]. Secondary mode has its own list ([`SECONDARY_CRASH_POINTS`]): the ADD
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
/// host path: its veth made but not configured, and removed on DEL before
/// the ENI moves home.
pub const HOST_PATH_CRASH_POINTS: &[&str] = &["add:after-host-veth", "del:after-host-path"];

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

#[cfg(feature = "fault-injection")]
pub fn crash_point(point: &'static str) {
    use std::sync::OnceLock;
    static TARGET: OnceLock<Option<String>> = OnceLock::new();
    debug_assert!(
        [
            CRASH_POINTS,
            HOST_PATH_CRASH_POINTS,
            SECONDARY_CRASH_POINTS,
            POOL_CRASH_POINTS
        ]
        .iter()
        .any(|list| list.contains(&point)),
        "undeclared crash point {point}"
    );
    static DELAY: OnceLock<Option<(String, u64)>> = OnceLock::new();
    let delay = DELAY.get_or_init(|| {
        let spec = std::env::var("ENIMD_DELAY_AT").ok()?;
        let (at, ms) = spec.rsplit_once('=')?;
        Some((at.to_string(), ms.parse().ok()?))
    });
    if let Some((at, ms)) = delay {
        if at == point {
            let stall = || std::thread::sleep(std::time::Duration::from_millis(*ms));
            // On enimd's multi-thread runtime the worker hands its other
            // duties (the I/O driver among them) to another thread first:
            // a stall must not also stop the agent noticing that the client
            // hung up, which is what the tests that stall are about.
            match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
                Ok(tokio::runtime::RuntimeFlavor::MultiThread) => {
                    tokio::task::block_in_place(stall)
                }
                _ => stall(),
            }
        }
    }
    let target = TARGET.get_or_init(|| std::env::var("ENIMD_CRASH_AT").ok());
    if target.as_deref() == Some(point) {
        eprintln!("enimd: crash point {point} reached: aborting");
        std::process::abort();
    }
}

#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub fn crash_point(_point: &'static str) {}
