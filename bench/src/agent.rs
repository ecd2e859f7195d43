//! A real `enimd` under test: its config and checkpoint (written by the
//! bench, so scale tests can start from thousands of records), the process,
//! readiness, and its resident memory.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use enim::store::checkpoint::CHECKPOINT_VERSION;
use enim_api::model::Record;
use enim_api::Client;
use enim_api::{Status, ROUTE_STATUS};
use enim_testkit::fixtures::{self, AgentPaths};
use enim_testkit::{Agent, Bins};
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

/// Writes `dir/enimd.toml` (the testkit's static-provider config): the
/// ENIs kept in `host_netns`, the GC loop off (the bench triggers GC
/// itself), everything else at its default unless `extra` (top-level keys)
/// says otherwise.
pub fn write_config(dir: &Path, host_netns: &Path, enis: &[Eni], extra: &str) -> R<()> {
    let enis: Vec<_> = enis
        .iter()
        .map(|e| fixtures::plain_eni(e.id.clone(), e.mac, e.ipv4, e.gateway4))
        .collect();
    fixtures::write_config(dir, Some(host_netns), &enis, extra);
    Ok(())
}

/// A ready attachment record of `eni` for container `cid` in `netns`, as
/// enimd would have written it. Built from JSON so that fields the format
/// gains with serde defaults need no change here; deserialising it checks
/// it against enimd's own type.
pub fn record(eni: &Eni, cid: &str, netns: &Path, created_ms: u64) -> R<Record> {
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

/// Writes the checkpoint enimd will restore, in its own format (pretty JSON as enimd writes it).
pub fn write_checkpoint(dir: &Path, records: &[Record]) -> R<()> {
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

/// The testkit's agent rig, run in the bench's own namespace (the config
/// points it at the sandbox through `host_netns`).
pub struct Enimd {
    agent: Agent,
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
        let bins = Bins {
            enimd: enimd.to_path_buf(),
            enim: enimd.with_file_name("enim"),
            enimctl: enimd.with_file_name("enimctl"),
        };
        let mut agent = Agent::new(bins, AgentPaths::in_dir(dir));
        agent.pids_file = Some(pids_file.to_path_buf());
        agent.ready_timeout = timeout;
        // Fine-grained: exec_to_ready is a result.
        agent.ready_poll = Duration::from_millis(1);
        agent.try_spawn()?;
        agent.try_wait_ready()?;
        Ok(Enimd {
            dir: dir.to_path_buf(),
            socket: agent.socket().to_path_buf(),
            exec_to_ready: agent.exec_to_ready,
            agent,
        })
    }

    pub fn client(&self, timeout: Duration) -> Client {
        Client::new(&self.socket, timeout)
    }

    pub fn status(&self) -> R<Status> {
        Ok(self.client(Duration::from_secs(30)).get(ROUTE_STATUS)?)
    }

    pub fn pid(&self) -> u32 {
        if self.agent.is_running() {
            self.agent.pid()
        } else {
            0
        }
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
        Ok(self.agent.try_stop()?)
    }
}
