//! A real `enimd` under test: its config and checkpoint (written by the
//! bench, so scale tests can start from thousands of records), the process,
//! readiness, and its resident memory.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use enim::api::Client;
use enim::api::{Status, ROUTE_STATUS};
use enim::attachment::Attachment;
use enim::checkpoint::CHECKPOINT_VERSION;
use serde_json::json;

use crate::sandbox::Eni;
use crate::R;

pub const NETWORK: &str = "enim-bench";

/// One memory sample of an enimd.
#[derive(Debug, Clone, Copy)]
pub struct Mem {
    pub rss_kib: u64,
    pub anon_kib: u64,
    pub threads: u64,
}

/// Writes `dir/enimd.toml`: the ENIs as a static provider, the GC loop off
/// (the bench triggers GC itself), everything else at its default unless
/// `extra` (top-level keys) says otherwise.
pub fn write_config(dir: &Path, host_netns: &Path, enis: &[Eni], extra: &str) -> R<()> {
    fs::create_dir_all(dir)?;
    let mut t = String::with_capacity(160 * enis.len() + 512);
    writeln!(
        t,
        "socket = {:?}",
        dir.join("enimd.sock").display().to_string()
    )?;
    writeln!(
        t,
        "checkpoint = {:?}",
        dir.join("state/checkpoint.json").display().to_string()
    )?;
    writeln!(t, "host_netns = {:?}", host_netns.display().to_string())?;
    writeln!(t, "gc_interval = \"0s\"")?;
    writeln!(t, "{extra}")?;
    writeln!(t, "[provider]\ntype = \"static\"")?;
    for e in enis {
        writeln!(
            t,
            "\n[[provider.enis]]\nid = {:?}\nmac = \"{}\"\nipv4 = \"{}\"\ngateway4 = \"{}\"",
            e.id, e.mac, e.ipv4, e.gateway4
        )?;
    }
    fs::write(dir.join("enimd.toml"), t)?;
    Ok(())
}

/// A ready attachment record of `eni` for container `cid` in `netns`, as
/// enimd would have written it. Built from JSON so that fields the format
/// gains with serde defaults need no change here; deserialising it checks
/// it against enimd's own type.
pub fn record(eni: &Eni, cid: &str, netns: &Path, created_ms: u64) -> R<Attachment> {
    let v = json!({
        "network": NETWORK,
        "container_id": cid,
        "ifname": "eth0",
        "pod": {"namespace": "bench", "name": format!("pod-{cid}"), "uid": format!("uid-{cid}")},
        "eni_id": eni.id,
        "mac": eni.mac,
        "host_name": eni.host_name,
        "host_mtu": 1500,
        "netns": netns,
        "mtu": 1500,
        "ipv4": eni.ipv4,
        "gateway4": eni.gateway4,
        "phase": "ready",
        "created_ms": created_ms,
        "updated_ms": created_ms,
    });
    Ok(serde_json::from_value(v).map_err(|e| format!("attachment record format: {e}"))?)
}

/// Writes the checkpoint enimd will restore, in its own format ("enim/1",
/// pretty JSON as enimd writes it).
pub fn write_checkpoint(dir: &Path, records: &[Attachment]) -> R<()> {
    let state = dir.join("state");
    fs::create_dir_all(&state)?;
    let body = json!({
        "version": CHECKPOINT_VERSION,
        "attachments": records,
        "homes": {},
    });
    fs::write(
        state.join("checkpoint.json"),
        serde_json::to_vec_pretty(&body)?,
    )?;
    Ok(())
}

pub struct Enimd {
    child: Option<Child>,
    pub dir: PathBuf,
    pub socket: PathBuf,
    /// From just before exec to the first `ready: true` status.
    pub exec_to_ready: Duration,
}

impl Enimd {
    /// Execs `enimd --config dir/enimd.toml` and waits (up to `timeout`)
    /// until its status says ready. Its pid is appended to `pids_file` so
    /// scripts/bench.sh can end it if the bench itself dies.
    pub fn start(enimd: &Path, dir: &Path, pids_file: &Path, timeout: Duration) -> R<Enimd> {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("enimd.log"))?;
        let started = Instant::now();
        let child = Command::new(enimd)
            .arg("--config")
            .arg(dir.join("enimd.toml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("spawn {}: {e}", enimd.display()))?;
        let mut pids = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(pids_file)?;
        std::io::Write::write_all(&mut pids, format!("{}\n", child.id()).as_bytes())?;
        let mut agent = Enimd {
            child: Some(child),
            dir: dir.to_path_buf(),
            socket: dir.join("enimd.sock"),
            exec_to_ready: Duration::ZERO,
        };
        let client = agent.client(Duration::from_secs(5));
        loop {
            // Before the socket exists this fails at connect, at once.
            if let Ok(s) = client.get::<Status>(ROUTE_STATUS) {
                if s.ready {
                    agent.exec_to_ready = started.elapsed();
                    return Ok(agent);
                }
            }
            if let Some(status) = agent
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                return Err(format!("enimd exited early ({status}): {}", agent.log_tail()).into());
            }
            if started.elapsed() > timeout {
                return Err(
                    format!("enimd not ready after {timeout:?}: {}", agent.log_tail()).into(),
                );
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    pub fn client(&self, timeout: Duration) -> Client {
        Client::new(&self.socket, timeout)
    }

    pub fn status(&self) -> R<Status> {
        Ok(self.client(Duration::from_secs(30)).get(ROUTE_STATUS)?)
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, |c| c.id())
    }

    /// VmRSS, its anonymous part and the thread count, from
    /// /proc/<pid>/status: a step in anonymous memory that comes with new
    /// threads is malloc arenas and stacks, not data piling up.
    pub fn mem(&self) -> R<Mem> {
        let status = fs::read_to_string(format!("/proc/{}/status", self.pid()))?;
        let field = |name: &str| -> R<u64> {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
                .ok_or_else(|| format!("no {name} in /proc/<pid>/status").into())
        };
        Ok(Mem {
            rss_kib: field("VmRSS")?,
            anon_kib: field("RssAnon")?,
            threads: field("Threads")?,
        })
    }

    pub fn log_tail(&self) -> String {
        let log = fs::read_to_string(self.dir.join("enimd.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// enimd's own figure for startup ("state restored; serving ms=N").
    pub fn logged_restore_ms(&self) -> Option<u64> {
        let log = fs::read_to_string(self.dir.join("enimd.log")).ok()?;
        let line = log.lines().rev().find(|l| l.contains("state restored"))?;
        let rest = &line[line.find(" ms=")? + 4..];
        rest.split(|c: char| !c.is_ascii_digit())
            .next()?
            .parse()
            .ok()
    }

    /// SIGTERM and wait: enimd must exit 0.
    pub fn stop(mut self) -> R<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )?;
        let status = child.wait()?;
        if !status.success() {
            return Err(format!("enimd exited {status} on SIGTERM: {}", self.log_tail()).into());
        }
        Ok(())
    }
}

impl Drop for Enimd {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
