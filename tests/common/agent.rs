//! A real `enimd` process in a sandbox host namespace, and the real `enim`
//! plugin exec'd as a runtime does (environment plus stdin).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{NamedNetns, Sandbox, HOST_MTU, POD_MTU};

pub const NETWORK: &str = "enim-e2e";

pub struct Agent {
    child: Option<Child>,
    /// Extra environment for the next (re)start, e.g. ENIMD_CRASH_AT.
    pub env: Vec<(String, String)>,
    pub socket: PathBuf,
    pub config: PathBuf,
    pub checkpoint: PathBuf,
    host: String,
}

/// Writes an enimd config for the sandbox's ENIs; `extra` is appended to
/// the top-level table (e.g. `gc_grace = "0s"`).
pub fn write_config(sb: &Sandbox, dir: &Path, extra: &str) -> PathBuf {
    #[derive(serde::Serialize)]
    struct Provider<'a> {
        r#type: &'static str,
        enis: &'a [enim_provider_static::StaticEniConfig],
    }
    #[derive(serde::Serialize)]
    struct Cfg<'a> {
        provider: Provider<'a>,
    }
    let socket = dir.join("enimd.sock");
    let checkpoint = dir.join("state/checkpoint.json");
    let body = toml::to_string(&Cfg {
        provider: Provider {
            r#type: "static",
            enis: &sb.enis,
        },
    })
    .unwrap();
    let text = format!(
        "socket = {:?}\ncheckpoint = {:?}\ngc_interval = \"0s\"\n{extra}\n{body}",
        socket.display().to_string(),
        checkpoint.display().to_string()
    );
    let path = dir.join("enimd.toml");
    std::fs::write(&path, text).unwrap();
    path
}

impl Agent {
    /// Starts `enimd --config` inside the sandbox host netns and waits until
    /// it answers on its socket.
    pub fn start(sb: &Sandbox, dir: &Path, extra: &str) -> Agent {
        let config = write_config(sb, dir, extra);
        let mut agent = Agent {
            child: None,
            env: Vec::new(),
            socket: dir.join("enimd.sock"),
            checkpoint: dir.join("state/checkpoint.json"),
            config,
            host: sb.host.name.clone(),
        };
        agent.restart();
        agent
    }

    pub fn restart(&mut self) {
        self.spawn();
        self.wait_ready();
    }

    /// Starts the process without waiting for it to be ready.
    pub fn spawn(&mut self) {
        assert!(self.child.is_none(), "agent already running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.config.with_file_name("enimd.log"))
            .unwrap();
        let child = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.host,
                env!("CARGO_BIN_EXE_enimd"),
                "--config",
            ])
            .arg(&self.config)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn enimd");
        self.child = Some(child);
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            // Ready means startup recovery and reconcile are done.
            if std::os::unix::net::UnixStream::connect(&self.socket).is_ok()
                && self.ctl(&["status"])["ready"] == true
            {
                return;
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("enimd exited early ({status}): {}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("enimd did not open its socket: {}", self.log());
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.config.with_file_name("enimd.log")).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// SIGTERM and wait; asserts a clean exit 0.
    pub fn stop(&mut self) {
        let status = sigterm_and_wait(self.child.take().expect("running"));
        assert!(status.success(), "enimd exit {status}: {}", self.log());
    }

    /// Waits for an agent that is expected to have died by itself (a crash
    /// point) and asserts it did not exit cleanly.
    pub fn wait_crashed(&mut self) {
        let mut child = self.child.take().expect("running");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                assert!(
                    !status.success(),
                    "enimd exited cleanly instead of crashing: {}",
                    self.log()
                );
                return;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("enimd did not crash: {}", self.log());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// `enimctl --json <args>` against this agent.
    pub fn ctl(&self, args: &[&str]) -> serde_json::Value {
        enimctl(&self.socket, args)
    }

    /// SIGKILL: a crash.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn net_conf(&self, version: &str) -> serde_json::Value {
        serde_json::json!({
            "cniVersion": version,
            "name": NETWORK,
            "type": "enim",
            "socket": self.socket,
        })
    }
}

/// Stops an agent process as its supervisor would: SIGTERM, then wait.
pub fn sigterm_and_wait(mut child: Child) -> std::process::ExitStatus {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    child.wait().unwrap()
}

/// `enimctl --json <args>` against the agent at `socket`; it must succeed.
pub fn enimctl(socket: &Path, args: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_enimctl"))
        .arg("--socket")
        .arg(socket)
        .arg("--json")
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "enimctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// What one plugin exec returned.
#[derive(Debug)]
pub struct CniOutput {
    pub status: i32,
    pub stdout: String,
    pub stderr: String,
}

impl CniOutput {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {self:?}"))
    }

    pub fn ok(&self) -> serde_json::Value {
        assert_eq!(self.status, 0, "plugin failed: {self:?}");
        if self.stdout.trim().is_empty() {
            serde_json::Value::Null
        } else {
            self.json()
        }
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

/// Execs a CNI plugin binary with the CNI environment and `conf` on stdin.
pub fn exec_plugin(
    binary: &str,
    command: &str,
    container_id: &str,
    netns: Option<&Path>,
    ifname: &str,
    args: &str,
    conf: &serde_json::Value,
) -> CniOutput {
    let mut cmd = Command::new(binary);
    cmd.env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", container_id)
        .env("CNI_IFNAME", ifname)
        .env("CNI_PATH", "/usr/lib/cni")
        .env("CNI_ARGS", args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(ns) = netns {
        cmd.env("CNI_NETNS", ns);
    }
    let mut child = cmd.spawn().expect("spawn plugin");
    let body = serde_json::to_vec(conf).unwrap();
    child.stdin.take().unwrap().write_all(&body).unwrap();
    let out = child.wait_with_output().unwrap();
    CniOutput {
        status: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

pub fn enim(
    command: &str,
    cid: &str,
    netns: Option<&Path>,
    ifname: &str,
    conf: &serde_json::Value,
) -> CniOutput {
    exec_plugin(
        env!("CARGO_BIN_EXE_enim"),
        command,
        cid,
        netns,
        ifname,
        &format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=pod-{cid};K8S_POD_UID=uid-{cid}"),
        conf,
    )
}

/// Every ENI is either (a) in a live pod netns under the pod's ifname,
/// configured and recorded once, or (b) in the host under its host name
/// with its host MTU, free in the provider and in no record. No record
/// points at a missing ENI. ENIs in `destroyed` (veth stand-ins that died
/// with their netns) must be free and unrecorded, wherever they are not.
pub fn assert_invariant(
    sb: &Sandbox,
    pods: &[&NamedNetns],
    agent: &Agent,
    destroyed: &[usize],
    when: &str,
) {
    let enis = agent.ctl(&["enis"]);
    let attachments = agent.ctl(&["attachments"])["attachments"]
        .as_array()
        .unwrap()
        .clone();
    // One link dump per namespace, not one per ENI: the soak checks this
    // after every event.
    let dump = |ns: &NamedNetns| -> Vec<serde_json::Value> {
        serde_json::from_str::<serde_json::Value>(&ns.ip(&["-j", "link", "show"]))
            .unwrap()
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    let by_mac = |links: &[serde_json::Value], mac: &str| {
        links
            .iter()
            .find(|l| l["address"].as_str() == Some(mac))
            .cloned()
    };
    let host_links = dump(&sb.host);
    let pod_links: Vec<Vec<serde_json::Value>> = pods.iter().map(|p| dump(p)).collect();
    for (i, eni) in sb.enis.iter().enumerate() {
        let mac = eni.mac.to_string();
        let status = enis["enis"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["id"] == eni.id.as_str())
            .unwrap();
        let records: Vec<_> = attachments
            .iter()
            .filter(|a| a["mac"] == mac.as_str())
            .collect();
        if destroyed.contains(&i) {
            assert_eq!(
                status["state"], "free",
                "{when}: destroyed ENI {i} is still held: {status}"
            );
            assert!(
                records.is_empty(),
                "{when}: destroyed ENI {i} is still recorded: {records:?}"
            );
            continue;
        }
        if let Some(link) = by_mac(&host_links, &mac) {
            assert_eq!(
                link["ifname"],
                format!("eni{i}"),
                "{when}: ENI {i} home name"
            );
            assert_eq!(link["mtu"], HOST_MTU, "{when}: ENI {i} home MTU");
            assert_eq!(
                status["state"], "free",
                "{when}: ENI {i} is home but the provider holds it: {status}"
            );
            assert!(
                records.is_empty(),
                "{when}: ENI {i} is home but recorded: {records:?}"
            );
            continue;
        }
        let (pod, link) = pods
            .iter()
            .zip(&pod_links)
            .find_map(|(p, links)| by_mac(links, &mac).map(|l| (p, l)))
            .unwrap_or_else(|| panic!("{when}: ENI {i} is neither home nor in a pod"));
        assert_eq!(link["ifname"], "eth0", "{when}: ENI {i} in pod");
        assert_eq!(link["mtu"], POD_MTU, "{when}: ENI {i} pod MTU");
        assert!(
            pod.addrs("eth0").contains(&format!("10.77.{i}.10/24")),
            "{when}: ENI {i} not configured"
        );
        assert!(
            pod.ip(&["route", "show", "default"])
                .contains(&format!("via 10.77.{i}.1")),
            "{when}: no default route"
        );
        assert_eq!(
            records.len(),
            1,
            "{when}: ENI {i} in a pod must be recorded once: {records:?}"
        );
        assert_eq!(records[0]["phase"], "ready", "{when}");
        assert_eq!(
            records[0]["netns"],
            pod.path().display().to_string(),
            "{when}"
        );
        assert_eq!(status["state"], "in_use", "{when}");
        assert_eq!(
            status["owner"]["container_id"], records[0]["container_id"],
            "{when}: two owners"
        );
    }
    for rec in &attachments {
        let mac: enim_provider::MacAddr = rec["mac"].as_str().unwrap().parse().unwrap();
        let held = pods.iter().zip(&pod_links).any(|(p, links)| {
            p.path().display().to_string() == rec["netns"]
                && by_mac(links, &mac.to_string()).is_some()
        });
        assert!(held, "{when}: record points at a missing ENI: {rec}");
    }
}

/// A plain HTTP/1.1 GET to `addr` from inside the network namespace at
/// `netns` (the agent's loopback is the sandbox's, not ours). Returns the
/// status code and body.
pub fn http_get_in(netns: &Path, addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    use std::io::Read;
    let netns = std::fs::File::open(netns).unwrap();
    let path = path.to_string();
    std::thread::spawn(move || {
        nix::sched::setns(&netns, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        let mut stream =
            std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut raw = String::new();
        stream.read_to_string(&mut raw).unwrap();
        let status = raw
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = raw
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default();
        (status, body)
    })
    .join()
    .unwrap()
}

/// The value of one sample line `name{labels} value` in a Prometheus text
/// exposition, or 0 when absent.
pub fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(series)
                .and_then(|rest| rest.trim().parse().ok())
        })
        .unwrap_or(0.0)
}
