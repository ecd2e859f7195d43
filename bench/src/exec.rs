//! Execs a CNI plugin as a runtime does: a clean environment with the CNI_*
//! variables, the network configuration on stdin, the result on stdout.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

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

pub struct Output {
    pub status: i32,
    pub stdout: String,
    pub stderr: String,
    /// From just before spawn to the exit status with all output read.
    pub elapsed: Duration,
}

impl Output {
    /// The parsed result of a successful call; an error names the plugin's
    /// own error message.
    pub fn ok(&self, what: &str) -> R<Option<Value>> {
        if self.status != 0 {
            return Err(format!(
                "{what} exited {}: {} {}",
                self.status,
                self.stdout.trim(),
                self.stderr.trim()
            )
            .into());
        }
        if self.stdout.trim().is_empty() {
            return Ok(None);
        }
        let v = serde_json::from_str(&self.stdout)
            .map_err(|e| format!("{what}: stdout is not JSON ({e}): {}", self.stdout))?;
        Ok(Some(v))
    }
}

/// Kubernetes-style CNI_ARGS, as kubelet's runtimes send them.
pub fn k8s_args(container_id: &str) -> String {
    format!(
        "IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME=pod-{container_id};\
         K8S_POD_INFRA_CONTAINER_ID={container_id};K8S_POD_UID=uid-{container_id}"
    )
}

pub fn exec(call: &Call) -> R<Output> {
    let mut cmd = Command::new(call.plugin);
    cmd.env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("CNI_COMMAND", call.command)
        .env("CNI_PATH", call.cni_path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if !call.container_id.is_empty() {
        cmd.env("CNI_CONTAINERID", call.container_id)
            .env("CNI_IFNAME", call.ifname)
            .env("CNI_ARGS", k8s_args(call.container_id));
    }
    if let Some(ns) = call.netns {
        cmd.env("CNI_NETNS", ns);
    }
    let started = Instant::now();
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("spawn {}: {e}", call.plugin.display()))?;
    // A config is far below a pipe's buffer: this write never blocks. A
    // plugin may exit without reading it (VERSION): that pipe is broken.
    match child
        .stdin
        .take()
        .ok_or("plugin has no stdin")?
        .write_all(call.conf)
    {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => return Err(e.into()),
        _ => {}
    }
    let out = child.wait_with_output()?;
    let elapsed = started.elapsed();
    Ok(Output {
        status: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        elapsed,
    })
}

/// Where the binaries under test are.
#[derive(Debug, Clone)]
pub struct Bins {
    pub enim: PathBuf,
    pub enimd: PathBuf,
    pub host_device: PathBuf,
    pub cni_path: PathBuf,
}
