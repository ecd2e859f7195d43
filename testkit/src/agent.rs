//! A real `enimd` process: its config, start, readiness, SIGTERM and wait,
//! and `enimctl --json` against it. Killed on drop, pass or fail.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::fixtures::{write_config, AgentPaths};
use crate::sandbox::Sandbox;

/// Where the binaries under test are: `bins!()` in an integration test of
/// the enim crate, the command line in the bench.
#[derive(Debug, Clone)]
pub struct Bins {
    pub enimd: PathBuf,
    pub enim: PathBuf,
    pub enimctl: PathBuf,
}

/// The CNI network name of [`Agent::net_conf`].
pub const NETWORK: &str = "enim-e2e";

/// The agent's status route (enimctl status, the plugin's readiness).
const ROUTE_STATUS: &str = "/v1/status";

pub struct Agent {
    child: Option<Child>,
    pub bins: Bins,
    pub paths: AgentPaths,
    /// Runs enimd through `ip netns exec <netns>` when set; else in the
    /// caller's namespace (its config's `host_netns` can still point at a
    /// sandbox).
    pub netns: Option<String>,
    /// Extra environment for the next (re)start, e.g. ENIMD_CRASH_AT.
    pub env: Vec<(String, String)>,
    /// Variables removed from the inherited environment.
    pub env_remove: Vec<String>,
    /// How long a start may take to become ready, and how often to ask.
    pub ready_timeout: Duration,
    pub ready_poll: Duration,
    /// Each started pid is appended here, so a wrapper script can end it
    /// should this process die without dropping the agent.
    pub pids_file: Option<PathBuf>,
    /// The last start, from just before exec to the first ready status.
    pub exec_to_ready: Duration,
    started: Instant,
}

impl Agent {
    /// An agent for the config at `paths` (not started).
    pub fn new(bins: Bins, paths: AgentPaths) -> Agent {
        Agent {
            child: None,
            bins,
            paths,
            netns: None,
            env: Vec::new(),
            env_remove: Vec::new(),
            ready_timeout: Duration::from_secs(10),
            ready_poll: Duration::from_millis(20),
            pids_file: None,
            exec_to_ready: Duration::ZERO,
            started: Instant::now(),
        }
    }

    /// Writes an enimd config for the sandbox's ENIs in `dir` (`extra` is
    /// appended to its top-level table, e.g. `gc_grace = "0s"`), starts
    /// `enimd --config` inside the sandbox host netns and waits until it is
    /// ready.
    pub fn start(bins: Bins, sb: &Sandbox, dir: &Path, extra: &str) -> Agent {
        let paths = write_config(dir, None, &sb.enis, extra);
        let mut agent = Agent::new(bins, paths);
        agent.netns = Some(sb.host.name.clone());
        agent.restart();
        agent
    }

    pub fn socket(&self) -> &Path {
        &self.paths.socket
    }

    /// Starts the process and waits until it is ready.
    pub fn restart(&mut self) {
        self.spawn();
        self.wait_ready();
    }

    /// Starts the process without waiting for it to be ready.
    pub fn spawn(&mut self) {
        self.try_spawn().unwrap();
    }

    pub fn try_spawn(&mut self) -> Result<(), String> {
        assert!(self.child.is_none(), "agent already running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.paths.log)
            .map_err(|e| format!("{}: {e}", self.paths.log.display()))?;
        let mut cmd = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&self.bins.enimd);
                c
            }
            None => Command::new(&self.bins.enimd),
        };
        cmd.arg("--config")
            .arg(&self.paths.config)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log);
        for k in &self.env_remove {
            cmd.env_remove(k);
        }
        let started = Instant::now();
        let child = cmd
            .spawn()
            .map_err(|e| format!("spawn {}: {e}", self.bins.enimd.display()))?;
        if let Some(pids) = &self.pids_file {
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(pids)
                .map_err(|e| format!("{}: {e}", pids.display()))?;
            writeln!(f, "{}", child.id()).map_err(|e| e.to_string())?;
        }
        self.child = Some(child);
        self.started = started;
        Ok(())
    }

    /// Waits until the agent says it is ready (startup recovery and
    /// reconcile done); panics if it exits or takes too long.
    pub fn wait_ready(&mut self) {
        if let Err(e) = self.try_wait_ready() {
            panic!("{e}");
        }
    }

    pub fn try_wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + self.ready_timeout;
        loop {
            // Before the socket exists this fails at connect, at once.
            if status(&self.paths.socket).is_some_and(|s| s["ready"] == true) {
                self.exec_to_ready = self.started.elapsed();
                return Ok(());
            }
            let child = self.child.as_mut().expect("running");
            if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
                self.child = None;
                return Err(format!("enimd exited early ({status}): {}", self.log()));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "enimd not ready after {:?}: {}",
                    self.ready_timeout,
                    self.log()
                ));
            }
            std::thread::sleep(self.ready_poll);
        }
    }

    /// Everything enimd logged (all its runs).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.paths.log).unwrap_or_default()
    }

    /// The last `n` lines of the log.
    pub fn log_tail(&self, n: usize) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// SIGTERM and wait; asserts a clean exit 0.
    pub fn stop(&mut self) {
        if let Err(e) = self.try_stop() {
            panic!("{e}");
        }
    }

    /// SIGTERM and wait (nothing to do when not running): enimd must exit 0.
    pub fn try_stop(&mut self) -> Result<(), String> {
        let Some(child) = self.child.take() else {
            return Ok(());
        };
        let status = sigterm_and_wait(child);
        if !status.success() {
            return Err(format!("enimd exit {status}: {}", self.log()));
        }
        Ok(())
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

    /// Restarts the agent set to die at the crash point `point`
    /// (ENIMD_CRASH_AT, the fault-injection build).
    pub fn arm_crash(&mut self, point: &str) {
        self.stop();
        self.env = crash_env(point);
        self.restart();
    }

    /// Waits for the armed agent to die, restarts it unarmed and runs one
    /// GC: what a node does after a crash.
    pub fn recover_crash(&mut self) {
        self.wait_crashed();
        self.env.clear();
        self.restart();
        self.ctl(&["gc"]);
    }

    /// SIGKILL: a crash.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// `enimctl --json <args>` against this agent; it must succeed.
    pub fn ctl(&self, args: &[&str]) -> Value {
        enimctl(&self.bins.enimctl, &self.paths.socket, args)
    }

    /// The agent's attachment records (`enimctl attachments`).
    pub fn attachments(&self) -> Vec<Value> {
        self.ctl(&["attachments"])["attachments"]
            .as_array()
            .unwrap()
            .clone()
    }

    /// A CNI network config for the `enim` plugin against this agent.
    pub fn net_conf(&self, version: &str) -> Value {
        net_conf(version, NETWORK, &self.paths.socket)
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A CNI network config of type `enim` talking to the agent at `socket`.
pub fn net_conf(version: &str, network: &str, socket: &Path) -> Value {
    serde_json::json!({
        "cniVersion": version,
        "name": network,
        "type": "enim",
        "socket": socket,
    })
}

/// Stops an agent process as its supervisor would: SIGTERM, then wait.
pub fn sigterm_and_wait(mut child: Child) -> ExitStatus {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pids fit in pid_t")),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    child.wait().unwrap()
}

/// `enimctl --json <args>` against the agent at `socket`; it must succeed.
pub fn enimctl(enimctl: &Path, socket: &Path, args: &[&str]) -> Value {
    let mut cmd = Command::new(enimctl);
    cmd.arg("--socket").arg(socket).arg("--json").args(args);
    serde_json::from_slice(&crate::netns::run_ok(&mut cmd)).unwrap()
}

/// The agent's status document, straight from its socket (one HTTP/1.1
/// GET, as the plugin and enimctl send it), or None while it does not
/// answer with one.
pub fn status(socket: &Path) -> Option<Value> {
    let mut stream = std::os::unix::net::UnixStream::connect(socket).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "GET {ROUTE_STATUS} HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\n\
         Connection: close\r\nContent-Length: 0\r\n\r\n"
    )
    .ok()?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).ok()?;
    let raw = String::from_utf8_lossy(&raw);
    let (head, body) = raw.split_once("\r\n\r\n")?;
    if head.split(' ').nth(1) != Some("200") {
        return None;
    }
    serde_json::from_str(body).ok()
}

/// A plain HTTP/1.1 GET to `addr` from inside the network namespace at
/// `netns` (the agent's loopback is the sandbox's, not ours). Returns the
/// status code and body.
pub fn http_get_in(netns: &Path, addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    http_method_in(netns, addr, "GET", path)
}

/// [`http_get_in`] with another method (no body).
pub fn http_method_in(
    netns: &Path,
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
) -> (u16, String) {
    let netns = std::fs::File::open(netns).unwrap();
    let path = path.to_string();
    let method = method.to_string();
    std::thread::spawn(move || {
        nix::sched::setns(&netns, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        let mut stream =
            std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
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

/// The environment that arms enimd's crash point `point`.
pub fn crash_env(point: &str) -> Vec<(String, String)> {
    vec![("ENIMD_CRASH_AT".into(), point.into())]
}

/// Asserts that each series has its value in `text`, a Prometheus scrape.
pub fn assert_metrics(text: &str, expected: &[(&str, f64)]) {
    for (series, value) in expected {
        assert_eq!(metric(text, series), *value, "{series} in {text}");
    }
}
