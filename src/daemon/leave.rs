//! The node leaves: what enimd undoes on its way out when enim is
//! uninstalled (docs/install.md, "Uninstalling").
//!
//! `helm uninstall`'s hook cannot do it: the node's ENIs of a per-node
//! provider were made with the agent's credentials, and the agent's state
//! and table are in use while it runs. So the hook's node cleanup
//! (`enimd uninstall-cni --mark-run-dir`) leaves a marker in the agent's
//! run dir, and the agent, on the SIGTERM that follows when helm deletes
//! its DaemonSet, sees it and leaves: its provider gives back every ENI
//! no pod holds, then the masquerade table and the state files go.
//!
//! Without the marker a SIGTERM is a restart (a rollout, an upgrade) and
//! nothing is undone. A marker found at start is an uninstall that did
//! not finish before enim was installed again: it is removed, so a later
//! restart is never taken for an uninstall. A node that still has pods
//! attached keeps everything: their records, their ENIs and the table.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use enim_provider::Released;

use crate::engine::{Driver, Engine};
use crate::netlink::netns::Netns;
use crate::primary::masquerade;

/// The marker's name, in the agent's run dir (its socket's).
pub const MARKER: &str = "uninstall-requested";

/// How long the provider may take to give its ENIs back: inside the
/// DaemonSet's 30 s grace, with room for the rest of the exit.
pub const RELEASE_BOUND: Duration = Duration::from_secs(20);

pub fn marker_path(run_dir: &Path) -> PathBuf {
    run_dir.join(MARKER)
}

/// Leaves the marker in `run_dir` (the uninstall hook, on the node) when
/// an agent's socket is there; `None` when it is not: no agent runs on
/// this node, and a marker would only wait for the next install.
pub fn request(run_dir: &Path) -> io::Result<Option<PathBuf>> {
    let socket = Path::new(enim_api::DEFAULT_SOCKET)
        .file_name()
        .unwrap_or_default();
    if !run_dir.join(socket).exists() {
        return Ok(None);
    }
    let path = marker_path(run_dir);
    std::fs::write(
        &path,
        "enim is being uninstalled: enimd gives back its ENIs and removes its state when it stops\n",
    )?;
    Ok(Some(path))
}

/// Whether the marker is in `run_dir`.
pub fn requested(run_dir: &Path) -> bool {
    marker_path(run_dir).exists()
}

/// At start: removes a marker an unfinished uninstall left.
pub fn clear_stale(run_dir: &Path) {
    let path = marker_path(run_dir);
    match std::fs::remove_file(&path) {
        Ok(()) => {
            tracing::warn!(marker = %path.display(), "an uninstall did not finish before this start: its marker is removed, and stopping is a restart again")
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => {
            tracing::warn!(marker = %path.display(), error = %e, "could not remove an unfinished uninstall's marker")
        }
    }
}

/// What the agent leaves on the node besides its pods' records.
pub struct Leftovers {
    /// Its state files: the checkpoint, its lock, caches, the status note,
    /// the marker. Removed only when no pod is attached.
    pub files: Vec<PathBuf>,
    /// Primary mode: the masquerade table's netns and the `nft` to run.
    pub masquerade: Option<(PathBuf, Netns)>,
}

/// What [`leave`] did.
#[derive(Debug, Default)]
pub struct Left {
    /// Pods still attached: nothing was undone.
    pub attached: usize,
    pub released: Released,
    /// The provider did not finish within [`RELEASE_BOUND`].
    pub release_timed_out: bool,
    pub table_removed: bool,
    pub files_removed: Vec<PathBuf>,
    /// Files that could not be removed, with why.
    pub files_failed: Vec<(PathBuf, String)>,
}

/// Undoes what enimd made on this node, in the order that loses nothing:
/// the ENIs first (a failure leaves them tagged, for the fleet's reaper
/// or the user), then the table, then the records. Called after serving
/// has stopped and the checkpoint is flushed.
pub async fn leave<D: Driver>(engine: &Engine<D>, leftovers: Leftovers) -> Left {
    let mut left = Left {
        attached: engine.attachments().await.len(),
        ..Left::default()
    };
    if left.attached > 0 {
        tracing::warn!(
            pods = left.attached,
            "uninstall: pods are still attached on this node; keeping their ENIs, their records and the masquerade table"
        );
        return left;
    }
    match tokio::time::timeout(RELEASE_BOUND, engine.provider().release_unused()).await {
        Ok(released) => left.released = released,
        Err(_) => left.release_timed_out = true,
    }
    if let Some((nft, netns)) = &leftovers.masquerade {
        match masquerade::remove(nft, netns).await {
            Ok(()) => left.table_removed = true,
            Err(e) => {
                tracing::warn!(error = %e, "uninstall: could not remove the masquerade table")
            }
        }
    }
    for path in leftovers.files {
        match std::fs::remove_file(&path) {
            Ok(()) => left.files_removed.push(path),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => left.files_failed.push((path, e.to_string())),
        }
    }
    tracing::info!(
        enis_deleted = ?left.released.deleted,
        enis_kept = ?left.released.kept,
        enis_failed = ?left.released.failed,
        release_timed_out = left.release_timed_out,
        table_removed = left.table_removed,
        files_removed = left.files_removed.len(),
        files_failed = ?left.files_failed,
        "uninstall: this node is left as enim found it"
    );
    left
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marker_is_requested_seen_and_cleared_at_start() {
        let dir = tempfile::tempdir().unwrap();
        // No agent's socket: no marker.
        assert_eq!(request(dir.path()).unwrap(), None);
        assert!(!requested(dir.path()));
        std::fs::write(dir.path().join("enimd.sock"), b"").unwrap();
        let path = request(dir.path()).unwrap();
        assert_eq!(path, Some(dir.path().join(MARKER)));
        assert!(requested(dir.path()));
        clear_stale(dir.path());
        assert!(!requested(dir.path()));
        // Nothing to clear is fine.
        clear_stale(dir.path());
        // A run dir that is not there has no agent's socket either.
        assert_eq!(request(&dir.path().join("absent")).unwrap(), None);
        // A marker that cannot be written is an error to the hook.
        std::fs::create_dir(dir.path().join(MARKER)).unwrap();
        assert!(request(dir.path()).is_err());
    }
}
