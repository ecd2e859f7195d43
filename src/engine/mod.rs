//! The engine (CCE's ENIManagerServer): ADD, DEL and CHECK of attachments,
//! GC and start-up recovery, written once and run over one [`Driver`] per
//! mode, chosen at start-up.
//!
//! Ordering rule: the checkpoint records intent before the kernel is
//! touched and the outcome after, and what an attachment holds is released
//! only once its pod side is apart. The one exception: a driver whose
//! kernel state tells how far a DEL got (`Driver::DEL_INTENT_BEHIND`) has
//! DEL's intent written behind, and recovery asks it (`Driver::came_home`). Whatever fails, ADD undoes every step
//! it took; whatever dies, the record says what to finish or undo.
//!
//! Concurrency: one attachment key runs one verb at a time (key locks). ADD,
//! DEL and GC's collection hold the fence shared for their whole run; GC's
//! host pass holds it exclusively, so it never takes a half-made or
//! half-removed attachment's objects for orphans. Locks are taken fence
//! first, then keys in key order, never the other way round.

pub mod driver;
mod gc;
mod recovery;
mod teardown;

#[cfg(test)]
pub(crate) mod conformance;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use enim_api::model::{now_ms, AddressStats, AttachmentKey, AttachmentResult, Phase, Record};
use enim_api::{EniStatus, MtuExpectation};
use enim_core::{EniOwner, ProviderError};
use enim_provider::EniProvider;

pub use driver::{Driver, Unplumbed};
pub use recovery::RecoveryReport;

use crate::netlink::{validate_ifname, PlumbingError};
use crate::store::checkpoint::{Checkpoint, CheckpointError};
use crate::support::fault::crash_point;
use crate::support::keylock::KeyLocks;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("pod network namespace: {0}")]
    Netns(#[source] PlumbingError),
    #[error("{0}")]
    Provider(#[from] ProviderError),
    #[error("ENI {eni_id} (MAC {mac}) was allocated but no such device is in the host namespace")]
    DeviceMissing { eni_id: String, mac: String },
    /// An ADD's ENI was never to be handed out (excluded, or its device
    /// is the node's own: [`crate::netlink::handout`]), it is reserved now,
    /// and the provider had no other.
    #[error("ENI {eni_id} is never handed to a pod: {why}; it is reserved as excluded, and no other ENI could be taken: {then}")]
    DeviceRefused {
        eni_id: String,
        why: String,
        then: Box<ProviderError>,
    },
    #[error(
        "interface {ifname:?} already exists in {netns}; nothing of the attachment was left there"
    )]
    IfnameConflict { ifname: String, netns: PathBuf },
    #[error("{step}: {source}")]
    Plumbing {
        step: &'static str,
        #[source]
        source: PlumbingError,
    },
    #[error("{0}")]
    Checkpoint(#[from] CheckpointError),
    #[error(
        "{original}; undoing it also failed ({undo}); the attachment is kept for GC to finish"
    )]
    RollbackFailed {
        original: Box<EngineError>,
        undo: Box<EngineError>,
    },
    #[error("no attachment {0}")]
    UnknownAttachment(AttachmentKey),
    #[error("attachment {key} is ready in {held_in}, whose pod is alive; an ADD of it into another netns needs a DEL first")]
    AttachmentConflict {
        key: AttachmentKey,
        held_in: PathBuf,
    },
    #[error("attachment {key} does not match the kernel: {why}")]
    CheckFailed { key: AttachmentKey, why: String },
    /// Secondary mode: every address is held or cooling down.
    #[error("{0}")]
    NoFreeAddress(String),
    /// A host path needs the API's service CIDRs, which are not listed yet.
    #[error("{0}")]
    ServiceCidrsUnknown(String),
    /// Secondary mode: the address store refused for another reason.
    #[error("{0}")]
    AddressStore(String),
    /// One failure of a batch step, shared by every record of the batch.
    #[error("{0}")]
    Shared(Arc<EngineError>),
}

impl EngineError {
    /// Maps a plumbing error of `step` (a closure for `map_err`).
    pub fn plumbing(step: &'static str) -> impl FnOnce(PlumbingError) -> EngineError {
        move |source| EngineError::Plumbing { step, source }
    }

    /// A plumbing error of the pod side, with the cases a caller can act on
    /// (name taken, netns gone) told apart.
    pub fn pod_side(step: &'static str) -> impl FnOnce(PlumbingError) -> EngineError {
        move |e| match e {
            PlumbingError::NameTaken { ifname, netns } => {
                EngineError::IfnameConflict { ifname, netns }
            }
            e if e.is_netns_gone() => EngineError::Netns(e),
            source => EngineError::Plumbing { step, source },
        }
    }

    /// Whether the caller may succeed by retrying later.
    pub fn is_transient(&self) -> bool {
        match self {
            EngineError::Provider(e) => {
                e.is_transient() || matches!(e, ProviderError::Exhausted { .. })
            }
            EngineError::DeviceRefused { then, .. } => {
                then.is_transient() || matches!(**then, ProviderError::Exhausted { .. })
            }
            EngineError::RollbackFailed { original, .. } => original.is_transient(),
            EngineError::Shared(e) => e.is_transient(),
            // Cooling addresses come back, and DELs free others.
            EngineError::NoFreeAddress(_) => true,
            EngineError::ServiceCidrsUnknown(_) => true,
            _ => false,
        }
    }
}

pub struct Engine<D: Driver> {
    driver: D,
    checkpoint: Arc<Checkpoint>,
    locks: KeyLocks,
    fence: tokio::sync::RwLock<()>,
}

impl<D: Driver> Engine<D> {
    pub fn new(driver: D, checkpoint: Arc<Checkpoint>) -> Self {
        Engine {
            driver,
            checkpoint,
            locks: KeyLocks::default(),
            fence: Default::default(),
        }
    }

    pub fn driver(&self) -> &D {
        &self.driver
    }

    pub fn provider(&self) -> &Arc<dyn EniProvider> {
        self.driver.provider()
    }

    pub fn checkpoint(&self) -> &Arc<Checkpoint> {
        &self.checkpoint
    }

    /// This mode's record of `key`.
    async fn record(&self, key: &AttachmentKey) -> Option<Record> {
        self.checkpoint
            .get(key)
            .await
            .filter(|r| r.mode() == D::MODE)
    }

    /// Gives `owner` its attachment in the netns at `netns`. Idempotent: a
    /// repeated ADD of a ready attachment returns the recorded result.
    pub async fn add(
        &self,
        owner: &EniOwner,
        netns: &Path,
    ) -> Result<AttachmentResult, EngineError> {
        validate(owner)?;
        let key = AttachmentKey::of(owner);
        // With nothing free but something on its way, wait for it here,
        // holding no lock: neither GC nor other pods wait on this one.
        self.driver.wait_for_capacity(owner).await;
        let _fence = self.fence.read().await;
        let _guard = self.locks.lock(&key).await;

        if let Some(existing) = self.record(&key).await {
            if existing.phase == Phase::Ready && existing.netns == netns {
                // The runtime retried: it now has the result, so the
                // attachment is claimed and no longer expires.
                self.checkpoint.set_expiry(&key, None).await?;
                return Ok(existing.result());
            }
            if existing.phase == Phase::Ready {
                self.refuse_if_alive(&existing).await?;
            }
            // An interrupted attempt, or a ready one whose pod is gone:
            // undo the old one fully before starting over.
            tracing::info!(%key, phase = ?existing.phase, "undoing previous attempt before ADD");
            self.teardown_one(existing).await?;
        }

        self.driver
            .check_netns(netns)
            .await
            .map_err(EngineError::Netns)?;
        let (mut record, allocation) = self.driver.allocate(owner, netns).await?;
        crash_point("add:after-allocate");
        if let Err(e) = self.checkpoint.put(record.clone()).await {
            return Err(self.rolled_back(e.into(), self.driver.release(&record).await));
        }
        crash_point("add:after-intent");
        if let Err(err) = self.driver.plumb(&mut record, allocation).await {
            tracing::warn!(%key, eni = %record.eni_id, error = %err, "ADD failed; rolling back");
            return Err(self.rolled_back(err, self.undo_add(&record).await));
        }
        crash_point("add:after-configure");
        record.phase = Phase::Ready;
        record.updated_ms = now_ms();
        // Written behind: should the agent die before it lands, recovery
        // finds the intent with the pod side fully made and finishes it.
        self.checkpoint.put_behind(record.clone()).await;
        crash_point("add:after-outcome");
        tracing::info!(%key, eni = %record.eni_id, ips = ?record.ips(), pod = %owner.pod, "attached");
        Ok(record.result())
    }

    /// A second ADD for a key whose attachment is ready in another netns
    /// (the spec forbids it without a DEL first): refused while that netns
    /// lives, so a confused runtime can never take a live pod's network. A
    /// netns that cannot be checked counts as alive.
    async fn refuse_if_alive(&self, existing: &Record) -> Result<(), EngineError> {
        match self.driver.check_netns(&existing.netns).await {
            Err(e) if e.is_netns_gone() => Ok(()),
            _ => Err(EngineError::AttachmentConflict {
                key: existing.key.clone(),
                held_in: existing.netns.clone(),
            }),
        }
    }

    fn rolled_back(&self, original: EngineError, undo: Result<(), EngineError>) -> EngineError {
        match undo {
            Ok(()) => original,
            Err(undo) => EngineError::RollbackFailed {
                original: Box::new(original),
                undo: Box::new(undo),
            },
        }
    }

    /// Undoes a failed ADD whose intent is recorded. On failure the record
    /// (still `Adding`) and what it holds stay: recovery or GC finish it.
    async fn undo_add(&self, record: &Record) -> Result<(), EngineError> {
        self.driver.unplumb(record).await?;
        self.driver.release(record).await?;
        self.checkpoint.remove(&record.key).await?;
        Ok(())
    }

    /// Takes the attachment apart and releases what it holds. Succeeds when
    /// the record, the netns or the device is already gone, and never
    /// touches what now belongs to another attachment.
    pub async fn del(&self, owner: &EniOwner) -> Result<(), EngineError> {
        validate(owner)?;
        let key = AttachmentKey::of(owner);
        let _fence = self.fence.read().await;
        let _guard = self.locks.lock(&key).await;
        match self.record(&key).await {
            Some(record) => self.teardown_one(record).await,
            // No record: at most a crash between allocation and the intent
            // write left something, and only this very attachment's.
            None => self.driver.release_unrecorded(owner).await,
        }
    }

    /// Verifies that the recorded attachment is what the kernel has, and
    /// claims it (an unclaimed ADD no longer expires).
    pub async fn check(
        &self,
        owner: &EniOwner,
        netns: &Path,
        mtu: MtuExpectation,
    ) -> Result<AttachmentResult, EngineError> {
        validate(owner)?;
        let key = AttachmentKey::of(owner);
        let _guard = self.locks.lock(&key).await;
        let mut record = self
            .record(&key)
            .await
            .ok_or_else(|| EngineError::UnknownAttachment(key.clone()))?;
        let fail = |why: String| EngineError::CheckFailed {
            key: key.clone(),
            why,
        };
        ready_in(record.phase, &record.netns, netns).map_err(fail)?;
        let want = mtu.want(record.mtu);
        if let Some(why) = self.driver.verify(&mut record, want).await {
            return Err(fail(why));
        }
        self.checkpoint.set_expiry(&key, None).await?;
        Ok(record.result())
    }

    /// Marks a ready attachment whose ADD result may never have reached
    /// the runtime: it is kept for `ttl`, waiting for a retried ADD, a CHECK
    /// or a DEL, and collected by GC after that.
    pub async fn mark_unclaimed(
        &self,
        key: &AttachmentKey,
        ttl: Duration,
    ) -> Result<(), EngineError> {
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        let expires = now_ms().saturating_add(ttl_ms);
        if self.checkpoint.set_expiry(key, Some(expires)).await? {
            tracing::warn!(%key, ttl = ?ttl, "the ADD's caller went away before its result; keeping the attachment for a retry or DEL");
        }
        Ok(())
    }

    /// Refreshes every ready attachment of this mode ([`Driver::refresh`]),
    /// one at a time under its key lock, writing the record after the
    /// kernel changed. Returns how many changed and how many failed (each
    /// failure logged); the next refresh tries a failed one again.
    pub async fn refresh(&self) -> (usize, usize) {
        let (mut changed, mut failed) = (0, 0);
        for key in self
            .checkpoint
            .list_mode(D::MODE)
            .await
            .into_iter()
            .map(|r| r.key)
        {
            let _fence = self.fence.read().await;
            let _guard = self.locks.lock(&key).await;
            // Read again under the lock: a DEL may have come first.
            let Some(record) = self.record(&key).await.filter(|r| r.phase == Phase::Ready) else {
                continue;
            };
            let result = match self.driver.refresh(&record).await {
                Ok(Some(updated)) => {
                    crash_point("refresh:after-kernel");
                    self.checkpoint
                        .put(updated)
                        .await
                        .map(|()| true)
                        .map_err(EngineError::from)
                }
                Ok(None) => Ok(false),
                Err(e) => Err(e),
            };
            match result {
                Ok(true) => changed += 1,
                Ok(false) => {}
                Err(e) => {
                    failed += 1;
                    tracing::warn!(%key, error = %e, "could not refresh the attachment; the next refresh retries");
                }
            }
        }
        (changed, failed)
    }

    /// Every attachment on record.
    pub async fn attachments(&self) -> Vec<Record> {
        self.checkpoint.list().await
    }

    pub async fn enis(&self) -> Result<Vec<EniStatus>, EngineError> {
        self.driver.enis().await
    }

    pub fn address_stats(&self) -> Option<AddressStats> {
        self.driver.address_stats()
    }
}

/// CHECK's first questions: is the attachment ready, and in the netns the
/// runtime names? `Err` says why not.
fn ready_in(phase: Phase, recorded: &Path, netns: &Path) -> Result<(), String> {
    if phase != Phase::Ready {
        return Err(format!("attachment is in phase {phase:?}"));
    }
    if recorded != netns {
        return Err(format!(
            "recorded netns is {}, not {}",
            recorded.display(),
            netns.display()
        ));
    }
    Ok(())
}

fn validate(owner: &EniOwner) -> Result<(), EngineError> {
    for (what, value) in [
        ("network name", &owner.network),
        ("container id", &owner.container_id),
    ] {
        if value.is_empty() {
            return Err(EngineError::InvalidRequest(format!("{what} is empty")));
        }
    }
    validate_ifname(&owner.ifname).map_err(EngineError::InvalidRequest)
}
