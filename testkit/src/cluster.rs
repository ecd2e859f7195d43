//! The real cluster of `scripts/e2e-cluster.sh`, reached from Rust tests.
//!
//! The script starts upstream Kubernetes in sandbox namespaces and, for its
//! Rust scenario, runs `cargo test --test k8s_cluster` with
//! `ENIM_E2E_CLUSTER` naming the cluster's work dir. [`Cluster::from_env`]
//! finds it there: the node's network namespace, its mount namespace (where
//! the kubelet's and containerd's paths are), the admin kubeconfig and the
//! components' binaries. Commands run on the node through `nsenter`, as the
//! script's own `on_node` does; nothing here reaches the cluster from this
//! machine's own namespaces, since nothing of it listens there.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The variable that names a running cluster's work dir.
pub const ENV: &str = "ENIM_E2E_CLUSTER";

/// A running e2e cluster.
#[derive(Debug, Clone)]
pub struct Cluster {
    work: PathBuf,
    node_netns: PathBuf,
    bin: PathBuf,
}

impl Cluster {
    /// The cluster `ENIM_E2E_CLUSTER` names, or `None` when it is unset.
    /// Panics when it is set but does not hold a cluster: a test pointed at
    /// a cluster must not pass by skipping.
    pub fn from_env() -> Option<Cluster> {
        let work = PathBuf::from(std::env::var_os(ENV)?);
        let read = |name: &str| {
            std::fs::read_to_string(work.join(name))
                .unwrap_or_else(|e| panic!("{ENV}={}: {name}: {e}", work.display()))
                .trim()
                .to_string()
        };
        let cluster = Cluster {
            node_netns: PathBuf::from(read("node-netns")),
            bin: PathBuf::from(read("bin-dir")),
            work,
        };
        assert!(
            cluster.mount_ns().exists() && cluster.node_netns.exists(),
            "{ENV}={}: no running cluster there",
            cluster.work.display()
        );
        Some(cluster)
    }

    fn mount_ns(&self) -> PathBuf {
        self.work.join("ns/mnt")
    }

    /// A command to run on the node: its network and mount namespaces.
    pub fn on_node(&self, program: impl AsRef<Path>) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--mount={}", self.mount_ns().display()))
            .arg(format!("--net={}", self.node_netns.display()))
            .arg("--")
            .arg(program.as_ref());
        cmd
    }

    /// `kubectl ARGS` as the cluster's admin; panics unless it succeeds.
    pub fn kubectl(&self, args: &[&str]) -> String {
        succeeded(args, self.kubectl_output(args))
    }

    /// `kubectl ARGS`, whatever its outcome.
    pub fn kubectl_output(&self, args: &[&str]) -> Output {
        self.on_node(self.bin.join("kubectl"))
            .arg(format!(
                "--kubeconfig={}",
                self.work.join("pki/admin.kubeconfig").display()
            ))
            .args(args)
            .output()
            .expect("run kubectl through nsenter")
    }

    /// `kubectl ... -o json` parsed.
    pub fn kubectl_json(&self, args: &[&str]) -> serde_json::Value {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        serde_json::from_str(&self.kubectl(&all)).expect("kubectl -o json")
    }
}

/// The stdout of `kubectl ARGS` that ran as `out`; panics with its stderr
/// unless it succeeded.
pub(crate) fn succeeded(args: &[&str], out: Output) -> String {
    assert!(
        out.status.success(),
        "kubectl {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("kubectl printed UTF-8")
}
