//! Execs a CNI plugin as a runtime does: a clean environment with the CNI_*
//! variables, the network configuration on stdin, the result on stdout.
//! And writes stand-ins for other plugins ([`fake_portmap`]).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The file names in `dir`, sorted: what an install left in a CNI bin or
/// net.d directory. Panics when it cannot be read.
pub fn dir_names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

/// Everything one plugin invocation needs. `None` leaves a variable unset.
pub struct Call<'a> {
    pub plugin: &'a Path,
    pub command: &'a str,
    pub container_id: Option<&'a str>,
    pub netns: Option<&'a Path>,
    pub ifname: Option<&'a str>,
    /// CNI_ARGS.
    pub args: Option<&'a str>,
    pub cni_path: &'a Path,
    pub conf: &'a [u8],
}

/// What one plugin exec returned.
#[derive(Debug)]
pub struct CniOutput {
    pub status: i32,
    pub stdout: String,
    pub stderr: String,
    /// From just before spawn to the exit status with all output read.
    pub elapsed: Duration,
}

impl CniOutput {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {self:?}"))
    }

    /// Asserts success; the result, or Null when it printed none.
    pub fn ok(&self) -> Value {
        assert_eq!(self.status, 0, "plugin failed: {self:?}");
        if self.stdout.trim().is_empty() {
            Value::Null
        } else {
            self.json()
        }
    }

    /// The parsed result of a successful call, as an error (naming `what`
    /// and the plugin's own message) when it failed.
    pub fn result(&self, what: &str) -> Result<Option<Value>, String> {
        if self.status != 0 {
            return Err(format!(
                "{what} exited {}: {} {}",
                self.status,
                self.stdout.trim(),
                self.stderr.trim()
            ));
        }
        if self.stdout.trim().is_empty() {
            return Ok(None);
        }
        serde_json::from_str(&self.stdout)
            .map(Some)
            .map_err(|e| format!("{what}: stdout is not JSON ({e}): {}", self.stdout))
    }

    /// Asserts a spec error with `code` and returns its message.
    pub fn err(&self, code: u64) -> String {
        assert_ne!(self.status, 0, "plugin succeeded: {self:?}");
        let v = self.json();
        assert_eq!(v["code"], code, "wrong code: {self:?}");
        assert!(v["cniVersion"].is_string(), "{self:?}");
        v["msg"].as_str().unwrap_or_default().to_string()
    }
}

/// Kubernetes-style CNI_ARGS for pod `namespace`/pod-`cid` (uid-`cid`).
pub fn k8s_args(namespace: &str, cid: &str) -> String {
    format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME=pod-{cid};K8S_POD_UID=uid-{cid}")
}

/// Runs the plugin once.
pub fn exec(call: &Call) -> Result<CniOutput, String> {
    exec_with(Command::new(call.plugin), call)
}

/// Runs `cmd` (the plugin itself, or a wrapper that execs it) once as
/// `call` says.
pub fn exec_with(cmd: Command, call: &Call) -> Result<CniOutput, String> {
    let started = Instant::now();
    let child = spawn(cmd, call)?;
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    let elapsed = started.elapsed();
    Ok(CniOutput {
        status: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        elapsed,
    })
}

/// Starts `cmd` (the plugin itself, or a wrapper that execs it) with the
/// environment of `call` and its config written to stdin; stdout and stderr
/// are piped.
pub fn spawn(mut cmd: Command, call: &Call) -> Result<Child, String> {
    cmd.env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("CNI_COMMAND", call.command)
        .env("CNI_PATH", call.cni_path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (var, value) in [
        ("CNI_CONTAINERID", call.container_id),
        ("CNI_IFNAME", call.ifname),
        ("CNI_ARGS", call.args),
    ] {
        if let Some(v) = value {
            cmd.env(var, v);
        }
    }
    if let Some(ns) = call.netns {
        cmd.env("CNI_NETNS", ns);
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("spawn {}: {e}", cmd.get_program().to_string_lossy()))?;
    // A config is far below a pipe's buffer: this write never blocks. A
    // plugin may exit without reading it (VERSION): that pipe is broken.
    match child
        .stdin
        .take()
        .ok_or("plugin has no stdin")?
        .write_all(call.conf)
    {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => return Err(e.to_string()),
        _ => {}
    }
    Ok(child)
}

/// Execs a CNI plugin binary with the CNI environment (CNI_PATH
/// /usr/lib/cni) and `conf` on stdin.
pub fn exec_plugin(
    binary: &Path,
    command: &str,
    container_id: &str,
    netns: Option<&Path>,
    ifname: &str,
    args: &str,
    conf: &Value,
) -> CniOutput {
    let body = serde_json::to_vec(conf).unwrap();
    exec(&Call {
        plugin: binary,
        command,
        container_id: Some(container_id),
        netns,
        ifname: Some(ifname),
        args: Some(args),
        cni_path: Path::new("/usr/lib/cni"),
        conf: &body,
    })
    .expect("exec plugin")
}

/// Writes an executable script at `path` from a child process, so that no
/// thread of the test binary ever holds it open for writing: a fork
/// elsewhere inheriting that fd would make exec fail with ETXTBSY.
pub fn write_script(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mut child = Command::new("/bin/sh")
        .arg("-c")
        .arg("cat > \"$0\" && chmod 0755 \"$0\"")
        .arg(path)
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success());
}

/// A stand-in for the reference portmap, `portmap` in `bin_dir`: it
/// answers install-cni's VERSION probe (CNI_COMMAND=VERSION, the config
/// `{"cniVersion":"1.0.0"}` on stdin, no other CNI_ variable) with
/// `versions`, and fails anything else. Returns its path.
pub fn fake_portmap(bin_dir: &Path, versions: &[&str]) -> PathBuf {
    let path = bin_dir.join("portmap");
    let list: Vec<String> = versions.iter().map(|v| format!("\"{v}\"")).collect();
    write_script(
        &path,
        &format!(
            r#"#!/bin/sh
IFS= read -r conf
if [ "$CNI_COMMAND" != VERSION ] || [ "$conf" != '{{"cniVersion":"1.0.0"}}' ] ||
   [ -n "$CNI_CONTAINERID$CNI_NETNS$CNI_IFNAME$CNI_ARGS$CNI_PATH" ]; then
  printf '{{"code":4,"msg":"not a VERSION probe"}}'
  exit 1
fi
printf '{{"cniVersion":"1.0.0","supportedVersions":[{}]}}'
"#,
            list.join(",")
        ),
    );
    path
}
