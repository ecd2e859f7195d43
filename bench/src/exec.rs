//! Execs a CNI plugin as a runtime does: a clean environment with the CNI_*
//! variables, the network configuration on stdin, the result on stdout.

use std::path::{Path, PathBuf};

use enim_testkit::cni;

use crate::R;

/// Everything one plugin invocation needs.
pub struct Call<'a> {
    pub plugin: &'a Path,
    pub command: &'a str,
    pub container_id: &'a str,
    pub netns: Option<&'a Path>,
    pub ifname: &'a str,
    pub cni_path: &'a Path,
    pub conf: &'a [u8],
}

/// What a call returned, its time included.
pub use enim_testkit::cni::CniOutput as Output;

/// Kubernetes-style CNI_ARGS, as kubelet's runtimes send them.
pub fn k8s_args(container_id: &str) -> String {
    format!(
        "IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME=pod-{container_id};\
         K8S_POD_INFRA_CONTAINER_ID={container_id};K8S_POD_UID=uid-{container_id}"
    )
}

/// Runs the plugin once (the testkit's exec): without a container id (VERSION,
/// GC) it sets no CNI_CONTAINERID, CNI_IFNAME or CNI_ARGS.
pub fn exec(call: &Call) -> R<Output> {
    let id = (!call.container_id.is_empty()).then_some(call.container_id);
    let args = id.map(k8s_args);
    Ok(cni::exec(&cni::Call {
        plugin: call.plugin,
        command: call.command,
        container_id: id,
        netns: call.netns,
        ifname: id.map(|_| call.ifname),
        args: args.as_deref(),
        cni_path: call.cni_path,
        conf: call.conf,
    })?)
}

/// Where the binaries under test are.
#[derive(Debug, Clone)]
pub struct Bins {
    pub enim: PathBuf,
    pub enimd: PathBuf,
    pub host_device: PathBuf,
    pub cni_path: PathBuf,
}
