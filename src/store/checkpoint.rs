//! The checkpoint: every attachment this node holds, in one versioned JSON
//! file that survives agent restarts.
//!
//! A file is written as a temp file in the same directory, fsync, rename
//! over the old file. A reader therefore sees the old file or the new one,
//! never a mix. A file that cannot be read or has an unknown version is an
//! error naming the file; it is never silently replaced.
//!
//! Two kinds of change:
//! - **Written through** (`put`, `remove`, `update_many`, ...): on disk before
//!   the call returns. Intents use these, so a crash after acting always
//!   leaves a record of what was begun.
//! - **Written behind** (`put_behind`, `remove_behind`): in memory at once,
//!   on disk a moment later from a background task (or with the next write,
//!   or at `flush`). Only for outcomes whose intent is already on disk: if
//!   the agent dies first, recovery finds the intent and finishes it from
//!   what the kernel shows. This keeps one fsync, not two, on the path of
//!   every ADD and DEL.
//!
//! The directory is not fsynced after the rename. That fsync only makes the
//! rename survive a power cut; the file is whole either way, and a power cut
//! reboots the node, which ends every pod netns the newer file could have
//! named: GC collects the older file's records just the same.
//!
//! Format versions (the `version` field):
//! - `enim/1`: `attachments` only.
//! - `enim/2`: adds `homes` (free ENIs' host name and MTU) and, per
//!   attachment, `expires_ms` (an ADD whose result was never delivered).
//!   Secondary mode adds `pods` (its pod attachments), written only when
//!   there are some, so primary-mode files are unaffected.
//!
//! In memory there is one [`Record`] type and one map for both modes; on
//! disk a primary record goes to `attachments` and a secondary one to
//! `pods`, with the same fields as before, so the format is still `enim/2`
//! and an older agent reads what this one writes (a rollback needs no step).
//!
//! This agent writes `enim/2` and reads both: an `enim/1` file is migrated in
//! memory (the new fields start empty) and rewritten as `enim/2` on the next
//! change. A version newer than it knows is refused with an error saying to
//! upgrade, never guessed at.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use enim_api::model::{AttachmentKey, Mode, Phase, Record};
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

use enim_core::atomic_file::{self, Durability};
use enim_core::MacAddr;

/// The format this agent writes.
pub const CHECKPOINT_VERSION: &str = "enim/2";
/// The newest format number this agent reads (it reads every older one).
pub const NEWEST_READABLE: u32 = 2;

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("reading checkpoint {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("checkpoint {path} is corrupt: {source}; it was left as it is, fix or remove it")]
    Corrupt {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error(
        "checkpoint {path} has version {found:?}, newer or other than this agent reads (enim/1 to enim/{NEWEST_READABLE}); it was left as it is: run a newer enimd"
    )]
    UnsupportedVersion { path: PathBuf, found: String },
    #[error("checkpoint {path} records attachment {key} twice")]
    DuplicateKey { path: PathBuf, key: AttachmentKey },
    #[error("checkpoint {path}: attachment {key} is a {found}-mode record in the {section:?} list; it was left as it is, fix or remove it")]
    WrongSection {
        path: PathBuf,
        key: AttachmentKey,
        found: Mode,
        section: &'static str,
    },
    #[error("writing checkpoint {path}: {source}")]
    Write { path: PathBuf, source: io::Error },
}

/// Where a free ENI lives in the host: the name and MTU it had when enim
/// first saw it, so GC can put a renamed or retuned free ENI right.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostHome {
    pub name: String,
    pub mtu: u32,
}

#[derive(Default)]
struct State {
    records: BTreeMap<AttachmentKey, Record>,
    homes: BTreeMap<MacAddr, HostHome>,
    /// Memory holds changes the file lacks (written behind, or their write
    /// failed); the next write of any kind carries them.
    unwritten: bool,
}

#[derive(Serialize)]
struct FileOut<'a> {
    version: &'static str,
    /// Primary-mode records.
    attachments: Vec<&'a Record>,
    homes: &'a BTreeMap<MacAddr, HostHome>,
    /// Secondary-mode records.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pods: Vec<&'a Record>,
}

#[derive(Deserialize)]
struct VersionProbe {
    version: String,
}

#[derive(Deserialize)]
struct FileIn {
    attachments: Vec<Record>,
    #[serde(default)]
    homes: BTreeMap<MacAddr, HostHome>,
    /// Secondary mode's pod attachments; absent when there are none, so a
    /// primary-mode file is unchanged.
    #[serde(default)]
    pods: Vec<Record>,
}

pub struct Checkpoint {
    path: PathBuf,
    fsync: bool,
    state: Mutex<State>,
    /// A write-behind task is spawned and has not yet taken the state.
    flush_pending: AtomicBool,
    #[cfg(any(test, feature = "fault-injection"))]
    failing_writes: std::sync::atomic::AtomicU32,
    write_observer: std::sync::OnceLock<WriteObserver>,
}

/// Told how long each successful write took (for metrics).
pub type WriteObserver = Box<dyn Fn(std::time::Duration) + Send + Sync>;

impl Checkpoint {
    /// Loads the checkpoint at `path`; a missing file is an empty checkpoint
    /// (its directory is created). `fsync` off trades power-loss safety for
    /// speed; process crashes are safe either way.
    pub fn open(path: &Path, fsync: bool) -> Result<Checkpoint, CheckpointError> {
        let entries = match fs::read(path) {
            Ok(bytes) => parse(path, &bytes)?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                    fs::create_dir_all(dir).map_err(|source| CheckpointError::Write {
                        path: path.to_path_buf(),
                        source,
                    })?;
                }
                State::default()
            }
            Err(source) => {
                return Err(CheckpointError::Read {
                    path: path.to_path_buf(),
                    source,
                })
            }
        };
        Ok(Checkpoint {
            path: path.to_path_buf(),
            fsync,
            state: Mutex::new(entries),
            flush_pending: AtomicBool::new(false),
            #[cfg(any(test, feature = "fault-injection"))]
            failing_writes: Default::default(),
            write_observer: Default::default(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Sets the observer told of each write's duration (once).
    pub fn set_write_observer(&self, observer: WriteObserver) {
        let _ = self.write_observer.set(observer);
    }

    pub async fn get(&self, key: &AttachmentKey) -> Option<Record> {
        self.state.lock().await.records.get(key).cloned()
    }

    /// Every record, in key order.
    pub async fn list(&self) -> Vec<Record> {
        self.state.lock().await.records.values().cloned().collect()
    }

    /// The records of one mode, in key order.
    pub async fn list_mode(&self, mode: Mode) -> Vec<Record> {
        let state = self.state.lock().await;
        state
            .records
            .values()
            .filter(|r| r.mode() == mode)
            .cloned()
            .collect()
    }

    pub async fn len(&self) -> usize {
        self.state.lock().await.records.len()
    }

    pub async fn is_empty(&self) -> bool {
        self.len().await == 0
    }

    /// Records (or replaces) an attachment and writes the file. On a write
    /// failure memory is rolled back, so it never claims what disk lacks.
    pub async fn put(&self, record: Record) -> Result<(), CheckpointError> {
        self.update_many(vec![record], &[]).await
    }

    /// Records `puts` and drops `removes` in one write (GC's batches: one
    /// fsync for a thousand records, not two each). All or nothing: on a
    /// write failure memory is rolled back.
    pub async fn update_many(
        &self,
        puts: Vec<Record>,
        removes: &[AttachmentKey],
    ) -> Result<(), CheckpointError> {
        if puts.is_empty() && removes.is_empty() {
            return Ok(());
        }
        let mut state = self.state.lock().await;
        let mut previous: Vec<(AttachmentKey, Option<Record>)> = Vec::new();
        for r in puts {
            let key = r.key.clone();
            previous.push((key.clone(), state.records.insert(key, r)));
        }
        for key in removes {
            previous.push((key.clone(), state.records.remove(key)));
        }
        if let Err(e) = self.write(&mut state).await {
            // Undo in reverse, so a key touched twice ends as it began.
            for (key, before) in previous.into_iter().rev() {
                match before {
                    Some(r) => state.records.insert(key, r),
                    None => state.records.remove(&key),
                };
            }
            return Err(e);
        }
        Ok(())
    }

    /// Drops an attachment and writes the file; absent keys are a no-op.
    pub async fn remove(&self, key: &AttachmentKey) -> Result<Option<Record>, CheckpointError> {
        let mut state = self.state.lock().await;
        let Some(previous) = state.records.remove(key) else {
            return Ok(None);
        };
        if let Err(e) = self.write(&mut state).await {
            state.records.insert(key.clone(), previous);
            return Err(e);
        }
        Ok(Some(previous))
    }

    /// The recorded host home of an ENI.
    pub async fn home(&self, mac: MacAddr) -> Option<HostHome> {
        self.state.lock().await.homes.get(&mac).cloned()
    }

    pub async fn homes(&self) -> BTreeMap<MacAddr, HostHome> {
        self.state.lock().await.homes.clone()
    }

    /// Records host homes not yet known (first sight wins: a later name may
    /// be a wrong one GC must undo). Writes only if something is new.
    pub async fn learn_homes(
        &self,
        seen: impl IntoIterator<Item = (MacAddr, HostHome)>,
    ) -> Result<usize, CheckpointError> {
        let mut state = self.state.lock().await;
        let new: Vec<(MacAddr, HostHome)> = seen
            .into_iter()
            .filter(|(mac, _)| !state.homes.contains_key(mac))
            .collect();
        if new.is_empty() {
            return Ok(0);
        }
        for (mac, home) in &new {
            state.homes.insert(*mac, home.clone());
        }
        if let Err(e) = self.write(&mut state).await {
            for (mac, _) in &new {
                state.homes.remove(mac);
            }
            return Err(e);
        }
        Ok(new.len())
    }

    /// Sets (`Some`: ready attachments only) or clears (`None`) the expiry
    /// of an attachment of either mode, in one step under the state lock, so
    /// a DEL racing it finds the record either before or after. Writes only
    /// on a change, and reports whether there was one.
    pub async fn set_expiry(
        &self,
        key: &AttachmentKey,
        expires_ms: Option<u64>,
    ) -> Result<bool, CheckpointError> {
        let mut state = self.state.lock().await;
        let now = enim_api::model::now_ms();
        let Some(r) = state.records.get_mut(key) else {
            return Ok(false);
        };
        if r.expires_ms == expires_ms || (expires_ms.is_some() && r.phase != Phase::Ready) {
            return Ok(false);
        }
        r.updated_ms = now;
        // The field's old value, to roll back to on a failed write.
        let before = std::mem::replace(&mut r.expires_ms, expires_ms);
        if let Err(e) = self.write(&mut state).await {
            if let Some(r) = state.records.get_mut(key) {
                r.expires_ms = before;
            }
            return Err(e);
        }
        Ok(true)
    }

    /// Records (or replaces) an attachment now and writes it behind the
    /// caller. Only for an outcome whose intent is on disk: see the module
    /// comment.
    pub async fn put_behind(self: &Arc<Self>, record: Record) {
        let mut state = self.state.lock().await;
        state.records.insert(record.key.clone(), record);
        state.unwritten = true;
        drop(state);
        self.write_behind();
    }

    /// Records (or replaces) an attachment in memory only: the file gets it
    /// with the next write of any kind ([`Checkpoint::write_soon`], the
    /// outcome's write behind, a GC tick's flush). For a DEL's intent that
    /// recovery can do without (the kernel says how far a DEL got): a write
    /// started now would run on another core beside the netns move that
    /// follows, and the move waits for RCU grace periods that a busy core
    /// stretches (about 4 ms of a 16 ms DEL, measured on 2 cores).
    pub async fn put_staged(&self, record: Record) {
        let mut state = self.state.lock().await;
        state.records.insert(record.key.clone(), record);
        state.unwritten = true;
    }

    /// Writes staged changes behind the caller, as soon as a task can.
    pub fn write_soon(self: &Arc<Self>) {
        self.write_behind();
    }

    /// Drops an attachment now and writes that behind the caller (an
    /// outcome whose intent is on disk).
    pub async fn remove_behind(self: &Arc<Self>, key: &AttachmentKey) -> Option<Record> {
        let mut state = self.state.lock().await;
        let removed = state.records.remove(key);
        if removed.is_some() {
            state.unwritten = true;
        }
        drop(state);
        self.write_behind();
        removed
    }

    /// Writes what memory holds and the file lacks; a no-op when nothing
    /// is. The agent calls it at shutdown and on every GC tick (a failed
    /// write-behind is retried there).
    pub async fn flush(&self) -> Result<(), CheckpointError> {
        let mut state = self.state.lock().await;
        if state.unwritten {
            self.write(&mut state).await?;
        }
        Ok(())
    }

    /// Whether memory holds changes the file lacks.
    pub async fn has_unwritten(&self) -> bool {
        self.state.lock().await.unwritten
    }

    /// Spawns the task that writes pending changes, unless one is already
    /// waiting: it will see these changes too, as it takes the state after
    /// them. Changes that a write through carried first leave it nothing to do.
    fn write_behind(self: &Arc<Self>) {
        if self.flush_pending.swap(true, Ordering::SeqCst) {
            return;
        }
        let checkpoint = Arc::clone(self);
        tokio::spawn(async move {
            let mut state = checkpoint.state.lock().await;
            // Cleared while holding the state: a change made after this
            // point spawns a task of its own.
            checkpoint.flush_pending.store(false, Ordering::SeqCst);
            if !state.unwritten {
                return;
            }
            if let Err(e) = checkpoint.write(&mut state).await {
                tracing::error!(error = %e, "checkpoint write-behind failed; the next write or GC tick retries it");
            }
        });
    }

    /// Waits until no write-behind task is waiting or writing.
    #[cfg(test)]
    pub(crate) async fn settle(&self) {
        while self.flush_pending.load(Ordering::SeqCst) {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        // A task that took the state holds it until its write is done.
        drop(self.state.lock().await);
    }

    /// Makes the `nth` write from now (1 = the next) fail, for rollback
    /// tests.
    #[cfg(any(test, feature = "fault-injection"))]
    pub fn fail_nth_write(&self, nth: u32) {
        self.failing_writes
            .store(nth, std::sync::atomic::Ordering::SeqCst);
    }

    async fn write(&self, state: &mut State) -> Result<(), CheckpointError> {
        #[cfg(any(test, feature = "fault-injection"))]
        {
            let countdown = self.failing_writes.load(Ordering::SeqCst);
            if countdown > 0 {
                self.failing_writes.store(countdown - 1, Ordering::SeqCst);
            }
            if countdown == 1 {
                return Err(CheckpointError::Write {
                    path: self.path.clone(),
                    source: io::Error::other("injected write failure"),
                });
            }
        }
        let (attachments, pods) = state
            .records
            .values()
            .partition(|r| r.mode() == Mode::Primary);
        let bytes = serde_json::to_vec_pretty(&FileOut {
            version: CHECKPOINT_VERSION,
            attachments,
            homes: &state.homes,
            pods,
        })
        .map_err(|e| CheckpointError::Write {
            path: self.path.clone(),
            source: e.into(),
        })?;
        let path = self.path.clone();
        let fsync = self.fsync;
        // File I/O and fsync block; keep them off the async workers.
        let started = std::time::Instant::now();
        // The directory is not fsynced: see the module comment.
        let durability = Durability {
            data: fsync,
            rename: false,
        };
        // Into the directory `open` made: one that vanished since (the state
        // removed under a running agent) is reported, not made again.
        tokio::task::spawn_blocking(move || {
            atomic_file::replace_existing_dir(&path, 0o600, durability, &bytes)
        })
        .await
        .map_err(|e| CheckpointError::Write {
            path: self.path.clone(),
            source: io::Error::other(e),
        })?
        .map_err(|e| CheckpointError::Write {
            path: self.path.clone(),
            source: e.source,
        })?;
        state.unwritten = false;
        if let Some(observe) = self.write_observer.get() {
            observe(started.elapsed());
        }
        Ok(())
    }
}

fn parse(path: &Path, bytes: &[u8]) -> Result<State, CheckpointError> {
    let corrupt = |source| CheckpointError::Corrupt {
        path: path.to_path_buf(),
        source,
    };
    let probe: VersionProbe = serde_json::from_slice(bytes).map_err(corrupt)?;
    let readable = probe
        .version
        .strip_prefix("enim/")
        .and_then(|n| n.parse::<u32>().ok())
        .is_some_and(|n| (1..=NEWEST_READABLE).contains(&n));
    if !readable {
        return Err(CheckpointError::UnsupportedVersion {
            path: path.to_path_buf(),
            found: probe.version,
        });
    }
    // enim/1 -> enim/2 needs no rewriting: the fields enim/2 added are
    // optional and start empty.
    let file: FileIn = serde_json::from_slice(bytes).map_err(corrupt)?;
    let mut records = BTreeMap::new();
    let sections = [
        ("attachments", Mode::Primary, file.attachments),
        ("pods", Mode::Secondary, file.pods),
    ];
    for (section, mode, list) in sections {
        for r in list {
            let key = r.key.clone();
            if r.mode() != mode {
                return Err(CheckpointError::WrongSection {
                    path: path.to_path_buf(),
                    key,
                    found: r.mode(),
                    section,
                });
            }
            if records.insert(key.clone(), r).is_some() {
                return Err(CheckpointError::DuplicateKey {
                    path: path.to_path_buf(),
                    key,
                });
            }
        }
    }
    Ok(State {
        records,
        homes: file.homes,
        unwritten: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use enim_api::model::record::fixtures;

    fn attachment(cid: &str) -> Record {
        fixtures::record(cid, fixtures::primary_v4())
    }

    /// A checkpoint at `name` in a fresh temporary dir (kept alive by the
    /// first element): the dir, its path and the opened checkpoint.
    fn open_in(name: &str, fsync: bool) -> (tempfile::TempDir, PathBuf, Checkpoint) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(name);
        let cp = Checkpoint::open(&path, fsync).unwrap();
        (dir, path, cp)
    }

    #[tokio::test]
    async fn expiry_is_set_on_ready_records_cleared_and_rolled_back() {
        let (_dir, path, cp) = open_in("cp.json", false);
        let ready = attachment("r");
        let adding = Record {
            phase: Phase::Adding,
            ..attachment("a")
        };
        cp.put(ready.clone()).await.unwrap();
        cp.put(adding.clone()).await.unwrap();
        let reread = |key: AttachmentKey| {
            let path = path.clone();
            async move {
                Checkpoint::open(&path, false)
                    .unwrap()
                    .get(&key)
                    .await
                    .unwrap()
                    .expires_ms
            }
        };

        assert!(cp.set_expiry(&ready.key, Some(5)).await.unwrap());
        assert_eq!(reread(ready.key.clone()).await, Some(5), "written");
        assert!(
            !cp.set_expiry(&ready.key, Some(5)).await.unwrap(),
            "no change"
        );
        assert!(
            !cp.set_expiry(&adding.key, Some(5)).await.unwrap(),
            "not ready"
        );
        assert_eq!(cp.get(&adding.key).await.unwrap().expires_ms, None);
        let unknown = attachment("nobody").key;
        assert!(!cp.set_expiry(&unknown, Some(5)).await.unwrap());

        cp.fail_nth_write(1);
        assert!(cp.set_expiry(&ready.key, None).await.is_err());
        assert_eq!(
            cp.get(&ready.key).await.unwrap().expires_ms,
            Some(5),
            "rolled back"
        );
        assert!(cp.set_expiry(&ready.key, None).await.unwrap(), "claimed");
        assert_eq!(reread(ready.key.clone()).await, None);
        assert!(
            !cp.set_expiry(&ready.key, None).await.unwrap(),
            "nothing to claim"
        );
    }

    #[tokio::test]
    async fn round_trip_and_versioned() {
        let (_dir, path, cp) = open_in("sub/checkpoint.json", true);
        cp.put(attachment("a")).await.unwrap();
        cp.put(attachment("b")).await.unwrap();
        cp.remove(&attachment("a").key).await.unwrap();
        let text = fs::read_to_string(&path).unwrap();
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(json["version"], "enim/2");
        let again = Checkpoint::open(&path, true).unwrap();
        assert_eq!(again.list().await, vec![attachment("b")]);
        // No temp file is left behind.
        let names: Vec<_> = fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("checkpoint.json")]);
    }

    #[tokio::test]
    async fn corrupt_and_unknown_version_are_errors_and_file_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("checkpoint.json");
        for (content, want_version) in [
            ("{\"version\":\"enim/2\",\"attach", false),
            ("{\"version\":\"enim/9\",\"attachments\":[]}", true),
        ] {
            fs::write(&path, content).unwrap();
            let err = Checkpoint::open(&path, true).err().expect("must fail");
            let msg = err.to_string();
            assert!(msg.contains(&path.display().to_string()), "{msg}");
            assert_eq!(
                matches!(err, CheckpointError::UnsupportedVersion { .. }),
                want_version,
                "{msg}"
            );
            assert_eq!(fs::read_to_string(&path).unwrap(), content);
        }
    }

    #[tokio::test]
    async fn failed_write_leaves_memory_as_disk() {
        let (_dir, path, cp) = open_in("checkpoint.json", false);
        cp.put(attachment("a")).await.unwrap();
        cp.fail_nth_write(1);
        assert!(cp.put(attachment("b")).await.is_err());
        assert!(cp.get(&attachment("b").key).await.is_none());
        cp.fail_nth_write(1);
        assert!(cp.remove(&attachment("a").key).await.is_err());
        assert!(cp.get(&attachment("a").key).await.is_some());
        assert_eq!(
            Checkpoint::open(&path, false).unwrap().list().await,
            vec![attachment("a")]
        );
    }

    /// Every format version this agent knows has a fixture; each must load
    /// (older ones migrated), and a newer one must be refused clearly.
    #[tokio::test]
    async fn reads_every_known_version_and_refuses_newer() {
        let dir = tempfile::tempdir().unwrap();
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
        for (name, homes, mode, eni, cid) in [
            (
                "checkpoint-enim-1.json",
                0,
                Mode::Primary,
                "eni-0001",
                "abc123",
            ),
            (
                "checkpoint-enim-2.json",
                1,
                Mode::Primary,
                "eni-0001",
                "abc123",
            ),
            (
                "checkpoint-enim-2-secondary.json",
                0,
                Mode::Secondary,
                "eni-0002",
                "def456",
            ),
        ] {
            let path = dir.path().join(name);
            fs::copy(fixtures.join(name), &path).unwrap();
            let cp = Checkpoint::open(&path, false).unwrap_or_else(|e| panic!("{name}: {e}"));
            let list = cp.list().await;
            assert_eq!(list.len(), 1, "{name}");
            assert_eq!(list[0].mode(), mode, "{name}");
            assert_eq!(list[0].eni_id, eni, "{name}");
            assert_eq!(list[0].key.container_id, cid, "{name}");
            assert_eq!(cp.homes().await.len(), homes, "{name}");
            // Written back as it was read: the same section, every field kept.
            cp.put(list[0].clone()).await.unwrap();
            let again = Checkpoint::open(&path, false).unwrap().list().await;
            assert_eq!(again, list, "{name}");
            let json: serde_json::Value =
                serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
            let section = if mode == Mode::Primary {
                "attachments"
            } else {
                "pods"
            };
            assert_eq!(json[section].as_array().map(Vec::len), Some(1), "{name}");
            // The next write upgrades the file to the current format.
            cp.remove(&list[0].key).await.unwrap();
            let json: serde_json::Value =
                serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
            assert_eq!(json["version"], CHECKPOINT_VERSION, "{name}");
        }
        let newer = dir.path().join("checkpoint-enim-3.json");
        fs::copy(fixtures.join("checkpoint-enim-3.json"), &newer).unwrap();
        let before = fs::read(&newer).unwrap();
        let err = Checkpoint::open(&newer, false)
            .err()
            .expect("a newer format must be refused");
        let msg = err.to_string();
        assert!(
            matches!(err, CheckpointError::UnsupportedVersion { .. }),
            "{msg}"
        );
        assert!(msg.contains("enim/3") && msg.contains("newer"), "{msg}");
        assert_eq!(
            fs::read(&newer).unwrap(),
            before,
            "a refused file must be left as it is"
        );
    }
}
