//! The note enimd leaves beside its socket for the plugin's STATUS, so that
//! STATUS can speak for the node's network while enimd itself is away
//! (killed, crash-looping, restarting): a pod's ENI keeps working without
//! enimd, and a node whose agent restarts must not turn NotReady.
//!
//! enimd writes it (atomically) when it starts, once its recovery is done,
//! and every [`HEARTBEAT`] while it runs. The plugin reads it only when
//! enimd does not answer, or answers that it is still starting. The note
//! speaks for one boot ([`boot_id`]) and for `away_bound_secs` after
//! enimd's last sign of life ([`boot_clock_ms`]): long enough to cover the
//! kubelet's longest crash back-off, so a crash loop never outlives it, and
//! short enough that a node whose agent is gone for good says so.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How often a running enimd renews its note.
pub const HEARTBEAT: Duration = Duration::from_secs(10);

/// What the node's network can do, as enimd judges it: STATUS's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Serving {
    /// ADDs can be served. A full node is available: its ADDs wait for an
    /// ENI on its way or answer "try again later", and the scheduler is
    /// kept away by the device plugin.
    Available,
    /// No ADD can be served, and none will be until something changes on
    /// the node (an ENI comes back, the provider offers one).
    Unavailable { reason: String },
}

/// The file enimd leaves for the plugin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusNote {
    /// The kernel's boot id when written: after a reboot every pod needs an
    /// ADD again, so an older boot's note speaks for nothing.
    pub boot_id: String,
    /// [`boot_clock_ms`] at enimd's last sign of life: a start, or a
    /// heartbeat while it ran.
    pub alive_ms: u64,
    /// How long after `alive_ms` the note still stands for an enimd that
    /// does not answer.
    pub away_bound_secs: u64,
    /// The network as enimd last judged it.
    pub serving: Serving,
    /// The writer's pid, for a human reading the file.
    pub pid: u32,
}

/// What a note says about an enimd that does not answer, at `now_ms`
/// ([`boot_clock_ms`]) in boot `boot_id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reading {
    /// The network serves: enimd was alive recently and judged it so.
    Available { away_ms: u64 },
    /// It does not: why, for STATUS's message.
    Unavailable(String),
}

impl StatusNote {
    /// What this note says at `now_ms` in boot `boot_id`.
    pub fn read_at(&self, boot_id: &str, now_ms: u64) -> Reading {
        if self.boot_id != boot_id {
            return Reading::Unavailable(
                "enimd has not started since the node booted (its note is from an earlier boot)"
                    .into(),
            );
        }
        let away_ms = now_ms.saturating_sub(self.alive_ms);
        let bound_ms = self.away_bound_secs.saturating_mul(1000);
        if away_ms > bound_ms {
            return Reading::Unavailable(format!(
                "enimd has been away for {} s, longer than its bound of {} s",
                away_ms / 1000,
                self.away_bound_secs
            ));
        }
        match &self.serving {
            Serving::Available => Reading::Available { away_ms },
            Serving::Unavailable { reason } => Reading::Unavailable(format!(
                "{reason} (as enimd judged it {} s ago)",
                away_ms / 1000
            )),
        }
    }
}

/// Where the note of the agent at `socket` lives: beside it, named after
/// it (`enimd.sock` → `enimd.status.json`).
pub fn note_path(socket: &Path) -> PathBuf {
    socket.with_extension("status.json")
}

/// Reads the note at `path`: `Ok(None)` when there is none.
pub fn read_note(path: &Path) -> Result<Option<StatusNote>, NoteError> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(NoteError::Read {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|source| NoteError::Decode {
            path: path.to_path_buf(),
            source,
        })
}

/// What can go wrong with a note or the clocks it is read with.
#[derive(Debug, thiserror::Error)]
pub enum NoteError {
    #[error("reading {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{} is not a status note: {source}", path.display())]
    Decode {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("reading the kernel's boot id: {0}")]
    BootId(#[source] io::Error),
    #[error("reading CLOCK_BOOTTIME: {0}")]
    Clock(#[source] io::Error),
}

/// The kernel's id of this boot (the same in every container of the node).
pub fn boot_id() -> Result<String, NoteError> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .map_err(NoteError::BootId)
}

/// Milliseconds since boot, suspend included (CLOCK_BOOTTIME): one clock
/// for every process of the node, unlike `Instant`, and unmoved by wall
/// clock steps.
pub fn boot_clock_ms() -> Result<u64, NoteError> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call's duration;
    // clock_gettime writes only into it.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    if rc != 0 {
        return Err(NoteError::Clock(io::Error::last_os_error()));
    }
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let millis = u64::try_from(ts.tv_nsec).unwrap_or(0) / 1_000_000;
    Ok(secs.saturating_mul(1000).saturating_add(millis))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(serving: Serving) -> StatusNote {
        StatusNote {
            boot_id: "b1".into(),
            alive_ms: 100_000,
            away_bound_secs: 600,
            serving,
            pid: 7,
        }
    }

    #[test]
    fn a_note_stands_for_its_bound_in_its_boot() {
        let n = note(Serving::Available);
        assert_eq!(
            n.read_at("b1", 100_000 + 600_000),
            Reading::Available { away_ms: 600_000 }
        );
        // A clock behind the note (read in a race with its write) is "now".
        assert_eq!(n.read_at("b1", 0), Reading::Available { away_ms: 0 });
        let Reading::Unavailable(why) = n.read_at("b1", 100_000 + 600_001) else {
            panic!("a note past its bound still stands");
        };
        assert!(
            why.contains("away for 600 s") && why.contains("bound of 600 s"),
            "{why}"
        );
        let Reading::Unavailable(why) = n.read_at("b2", 100_001) else {
            panic!("another boot's note stands");
        };
        assert!(why.contains("earlier boot"), "{why}");
    }

    #[test]
    fn an_unavailable_network_stays_unavailable_while_enimd_is_away() {
        let n = note(Serving::Unavailable {
            reason: "every ENI is quarantined".into(),
        });
        let Reading::Unavailable(why) = n.read_at("b1", 105_000) else {
            panic!("enimd's last word was 'unavailable'");
        };
        assert!(
            why.starts_with("every ENI is quarantined") && why.contains("5 s ago"),
            "{why}"
        );
    }

    #[test]
    fn the_note_sits_beside_the_socket() {
        assert_eq!(
            note_path(Path::new("/run/enim/enimd.sock")),
            PathBuf::from("/run/enim/enimd.status.json")
        );
        assert_eq!(
            note_path(Path::new("/tmp/agent")),
            PathBuf::from("/tmp/agent.status.json")
        );
    }

    #[test]
    fn reading_missing_and_broken_notes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("enimd.status.json");
        assert!(read_note(&path).unwrap().is_none());
        std::fs::write(&path, b"{\"boot_id\":").unwrap();
        let e = read_note(&path).unwrap_err();
        assert!(matches!(e, NoteError::Decode { .. }), "{e:?}");
        let n = note(Serving::Available);
        std::fs::write(&path, serde_json::to_vec(&n).unwrap()).unwrap();
        assert_eq!(read_note(&path).unwrap(), Some(n));
    }

    #[test]
    fn the_clocks_read() {
        assert!(!boot_id().unwrap().is_empty());
        let a = boot_clock_ms().unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let b = boot_clock_ms().unwrap();
        assert!(b >= a + 15, "{a} {b}");
    }
}
