//! Crash points for tests, shared by the agent and the providers: with the
//! `fault-injection` feature, `ENIMD_CRASH_AT=<point>` makes the process
//! abort (as if SIGKILLed) when it reaches that point, and
//! `ENIMD_DELAY_AT=<point>=<ms>` makes it stall there. Without the feature
//! every point compiles to nothing.
//!
//! The agent's own points are listed in `enim::support::fault`; the cloud
//! steps of the providers are [`CLOUD_CRASH_POINTS`].

/// The cloud steps of an ENI's life, where a crash must neither leak nor
/// duplicate an ENI: before a create is sent, after it returned (the ENI
/// exists, tagged, not attached), after the attach (not yet in metadata or
/// the pool), before a detach, after it (the ENI is available, not
/// deleted), and after the delete (the pool still lists the ENI).
pub const CLOUD_CRASH_POINTS: &[&str] = &[
    "cloud:before-create",
    "cloud:after-create",
    "cloud:after-attach",
    "cloud:before-detach",
    "cloud:after-detach",
    "cloud:after-delete",
];

#[cfg(feature = "fault-injection")]
pub fn crash_point(point: &'static str) {
    use std::sync::OnceLock;
    static TARGET: OnceLock<Option<String>> = OnceLock::new();
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
