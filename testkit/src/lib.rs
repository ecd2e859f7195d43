//! Test rigs shared by enim's integration tests (`tests/`, the providers'
//! `tests/`) and the bench, so none of them keeps its own copy:
//!
//! - [`require_kernel!`], [`unique`] names and [`NamedNetns`]: throwaway,
//!   uniquely named network namespaces, removed on drop, pass or fail;
//! - [`Sandbox`]: a host namespace with veth pairs standing in for ENIs,
//!   their far ends in a gateway namespace, and the fixtures that describe
//!   those ENIs to a static provider ([`fixtures`]), and
//!   [`assert_invariant`]: every ENI in one pod or home, as the agent says;
//! - [`Agent`]: a real `enimd` process (start, wait ready, SIGTERM and wait,
//!   `enimctl --json`), and [`cni`]: the real plugin exec'd as a runtime does
//!   ([`plugin`]: built for tests outside its package);
//! - [`apiserver`]: a real etcd and kube-apiserver on loopback, for tests
//!   that need only the Kubernetes API;
//! - [`cluster`]: the real one-node Kubernetes of `scripts/e2e-cluster.sh`,
//!   reached through `nsenter` (kubectl as its admin, commands on its node);
//! - [`metadata_stub`]: an instance metadata stand-in that answers any text,
//!   for the clouds' metadata parsers;
//! - behind features, fakes of the clouds: `moto` (EC2/IAM on moto, a fake
//!   IMDSv2 and a fault proxy) and `bce` (BCE's ENI OpenAPI and metadata),
//!   and with either, [`cloud`]: the checks both clouds' tests share;
//! - behind `vpc`, the VPC simulator (`vpc`, the `enim-vpcsim` binary):
//!   moto's attached ENIs hot-plugged into node namespaces and routed.
//!
//! It drives enimd, enim and enimctl as binaries and speaks their JSON: it
//! does not link the agent, so the agent's internals can change under it.
//! Nothing here touches the machine's own interfaces.

pub mod agent;
pub mod apiserver;
pub mod cluster;
pub mod cni;
pub mod fixtures;
pub mod invariant;
pub mod metadata_stub;
pub mod metrics_doc;
pub mod netns;
pub mod plugin;
pub mod ports;
pub mod sandbox;

#[cfg(feature = "bce")]
pub mod bce;
#[cfg(any(feature = "bce", feature = "moto"))]
pub mod cloud;
#[cfg(feature = "moto")]
pub mod moto;
#[cfg(feature = "vpc")]
pub mod vpc;

pub use agent::{enimctl, sigterm_and_wait, Agent, Bins};
pub use cni::{exec_plugin, CniOutput};
pub use fixtures::{owner, HOST_MTU, POD_MTU};
pub use invariant::assert_invariant;
pub use netns::{ip_batch, netns_path, run_ok, sh, sh_ok, NamedNetns, NetnsSet};
pub use sandbox::Sandbox;

use std::sync::atomic::{AtomicU32, Ordering};

/// Whether a skipped rig should fail instead: under `CI=true` a skip would
/// hide a broken setup.
pub fn ci() -> bool {
    std::env::var("CI").as_deref() == Ok("true")
}

/// True when kernel tests can run. Without root they skip with a message,
/// except under CI=true, where skipping would hide a broken setup.
pub fn kernel_tests_enabled() -> bool {
    let root = nix::unistd::geteuid().is_root();
    if !root {
        if ci() {
            panic!("CI=true but not running as root: netns tests must run in CI");
        }
        eprintln!(
            "SKIPPED: netns tests need root (run as root, or with CI=true to make this an error)"
        );
    }
    root
}

/// Returns from the calling test unless kernel tests can run (see
/// [`kernel_tests_enabled`]): a skip with a message without root, a panic
/// under CI=true.
#[macro_export]
macro_rules! require_kernel {
    () => {
        if !$crate::kernel_tests_enabled() {
            return;
        }
    };
}

/// The enim binaries for an integration test of the enim crate: enimd and
/// enimctl from its `CARGO_BIN_EXE_*` (expanded where the macro is used),
/// the plugin (another package's) built beside them ([`plugin`]).
#[macro_export]
macro_rules! bins {
    () => {
        $crate::Bins {
            enimd: env!("CARGO_BIN_EXE_enimd").into(),
            enim: $crate::plugin::built_beside(::std::path::Path::new(env!("CARGO_BIN_EXE_enimd"))),
            enimctl: env!("CARGO_BIN_EXE_enimctl").into(),
        }
    };
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A name unique to this process and call, ending in `tag`, short enough
/// for a netns (and, with a short tag, for an interface).
pub fn unique(tag: &str) -> String {
    format!(
        "enimt{}-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::SeqCst),
        tag
    )
}
