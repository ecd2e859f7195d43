//! The seam between the engine and a mode. The engine owns the protocol
//! (validation, locks, the fence, intent → act → outcome, rollback, expiry,
//! recovery, GC liveness); a driver owns what one mode does to the provider
//! and the kernel. A new mode (the host-path veth, trunk ENIs) is a new
//! driver, never a third copy of the protocol.
//!
//! Every method is called with the attachment's key lock held, and the
//! engine hands a driver only records of its own mode.

use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use enim_api::model::{AddressStats, Mode, Record};
use enim_api::{EniStatus, GcReport, GcRequest};
use enim_core::EniOwner;
use enim_provider::EniProvider;

use super::EngineError;
use crate::netlink::PlumbingError;

/// How the pod side came apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unplumbed {
    /// Everything the attachment used is home (or gone with its netns).
    Home,
    /// The device was nowhere on the node (a veth died with its netns):
    /// only the record and the assignment are left to drop.
    DeviceGone,
}

#[async_trait]
pub trait Driver: Send + Sync + 'static {
    /// The mode this driver serves; its records carry this mode's payload.
    const MODE: Mode;

    /// Whether DEL may write its `Deleting` intent behind, because the
    /// kernel tells how far an interrupted DEL got ([`Driver::came_home`]).
    const DEL_INTENT_BEHIND: bool = false;

    /// What ADD's allocation learned that its plumbing needs (so the kernel
    /// is not asked twice), handed from [`Driver::allocate`] to
    /// [`Driver::plumb`].
    type Allocation: Send;

    /// Where ENIs come from (listings, status, metrics).
    fn provider(&self) -> &Arc<dyn EniProvider>;

    /// Whether `netns` is a network namespace a pod can be in: one the
    /// agent can enter, and not the node's own. ADD refuses any other; GC
    /// and a conflicting ADD count an attachment whose netns fails this
    /// only for being the node's as alive (it is not gone).
    async fn check_netns(&self, netns: &Path) -> Result<(), PlumbingError>;

    /// Start-up, before any record is finished or undone: brings the host
    /// and the provider in line with `records` (this mode's, every phase).
    async fn restore(&self, records: &[Record]) -> Result<(), EngineError>;

    /// Called by ADD before it takes any lock: with nothing free for
    /// `owner` now but something on its way, waits (a bounded time) until
    /// it is there, so that [`allocate`](Driver::allocate) finds it rather
    /// than answering "try again later". Holds nothing. By default, the
    /// provider's wait for a free ENI.
    async fn wait_for_capacity(&self, owner: &EniOwner) {
        self.provider().wait_for_free(owner).await
    }

    /// ADD's allocation: takes what the attachment will hold and returns its
    /// intent record (phase `Adding`). On error nothing is held.
    async fn allocate(
        &self,
        owner: &EniOwner,
        netns: &Path,
    ) -> Result<(Record, Self::Allocation), EngineError>;

    /// Makes the pod side of an intent recorded on disk; may complete the
    /// payload (what only the kernel knows, such as a veth's MAC).
    async fn plumb(
        &self,
        record: &mut Record,
        allocation: Self::Allocation,
    ) -> Result<(), EngineError>;

    /// Why the kernel differs from the record (`None`: it matches), with
    /// `want_mtu` as the pod interface's MTU (`None`: any). May complete the
    /// payload from what it sees, for recovery to keep.
    async fn verify(&self, record: &mut Record, want_mtu: Option<u32>) -> Option<String>;

    /// Takes the pod side apart and puts the host side home. Idempotent:
    /// what is already gone is success.
    async fn unplumb(&self, record: &Record) -> Result<Unplumbed, EngineError>;

    /// [`Driver::unplumb`] for a batch (GC), one result per record in order;
    /// a driver overrides it where a batch can share work.
    async fn unplumb_many(&self, records: &[Record]) -> Vec<Result<Unplumbed, EngineError>> {
        let mut out = Vec::with_capacity(records.len());
        for r in records {
            out.push(self.unplumb(r).await);
        }
        out
    }

    /// [`Driver::unplumb_many`] for one pod's teardown (its DEL, or an ADD
    /// undoing its old attempt), which answers the runtime once
    /// the pod's devices are home and released: a driver may leave work
    /// the answer does not need behind it. The default does it all.
    async fn unplumb_for_pod(&self, records: &[Record]) -> Vec<Result<Unplumbed, EngineError>> {
        self.unplumb_many(records).await
    }

    /// For each record at start-up, whether its device is already home
    /// (for a `Ready` one: a DEL died after taking it out of the pod, before
    /// its intent landed). Asked only of drivers with
    /// [`Driver::DEL_INTENT_BEHIND`].
    async fn came_home(&self, records: &[Record]) -> Result<Vec<bool>, EngineError> {
        Ok(vec![false; records.len()])
    }

    /// Gives back what the record holds (an ENI assignment, an address).
    async fn release(&self, record: &Record) -> Result<(), EngineError>;

    /// DEL with no record: whatever this very attachment may hold from a
    /// crash between allocation and the intent write.
    async fn release_unrecorded(&self, owner: &EniOwner) -> Result<(), EngineError>;

    /// For each record, whether what it names now belongs to another
    /// attachment (a stale record: only the record is dropped).
    async fn stale(&self, records: &[Record]) -> Result<Vec<bool>, EngineError> {
        Ok(vec![false; records.len()])
    }

    /// GC's host pass, after dead attachments are collected, with no ADD or
    /// DEL in flight: orphaned assignments, drifted free ENIs, kernel
    /// objects of enim's shape that `records` do not explain.
    async fn gc_host(&self, records: &[Record], request: &GcRequest, report: &mut GcReport);

    /// Brings a ready attachment's kernel state up to what an ADD would
    /// make now, and returns the record to write when it changed it
    /// (primary mode: the host path's routes after the service CIDRs
    /// changed). Called under the attachment's key lock.
    async fn refresh(&self, _record: &Record) -> Result<Option<Record>, EngineError> {
        Ok(None)
    }

    /// Every ENI of the node and its state (`/v1/enis`).
    async fn enis(&self) -> Result<Vec<EniStatus>, EngineError>;

    /// Address counts, for drivers that hand out addresses.
    fn address_stats(&self) -> Option<AddressStats> {
        None
    }
}
