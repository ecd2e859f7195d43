//! Teardown, one protocol for DEL, GC, an ADD that replaces an old attempt,
//! and recovery: drop stale records, write the `Deleting` intents, take the
//! pod sides apart, release, drop the records. A batch (GC's) shares one
//! provider listing, one intent write and one look at the host; a record
//! whose step fails stays `Deleting` for the next pass or restart.

use std::sync::Arc;

use enim_api::model::{now_ms, AttachmentKey, Phase, Record};
use enim_api::{GcReport, GcStep};

use crate::support::fault::crash_point;

use super::{Driver, Engine, EngineError, Unplumbed};

/// Who tears down, which says what may be left behind the return.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Caller {
    /// One pod's key: its DEL, or an ADD undoing the key's old attempt.
    /// Returns once the devices are home and released: the `Deleting`
    /// intent (where [`Driver::DEL_INTENT_BEHIND`]) and work the answer
    /// does not need ([`Driver::unplumb_for_pod`]) may follow behind.
    Pod,
    /// GC and recovery: intents on disk before anything is touched, and
    /// everything done before the return.
    Sweep,
}

/// How a teardown records its `Deleting` intents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Intent {
    /// On disk before anything is touched.
    Durable,
    /// In memory at once, on disk behind the caller.
    Behind,
}

/// How one record's teardown ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Teardown {
    /// Taken apart and released.
    Done(Unplumbed),
    /// What it named belonged to another attachment: only the record went.
    StaleRecord,
}

impl<D: Driver> Engine<D> {
    /// One pod's teardown of its record (key lock held): [`Caller::Pod`].
    pub(crate) async fn teardown_one(&self, record: Record) -> Result<(), EngineError> {
        let key = record.key.clone();
        match self.teardown(vec![record], Caller::Pod).await.pop() {
            Some((_, outcome)) => outcome.map(drop),
            None => Err(EngineError::UnknownAttachment(key)),
        }
    }

    /// Tears down `records` (their key locks held), one outcome per record
    /// in order. The outcome is written behind: should the agent die first,
    /// recovery repeats the teardown from the `Deleting` intent, which is
    /// idempotent. With its intent behind (a pod's, where the driver
    /// allows) the intent may not have landed either: recovery then finds
    /// a `Ready` record and asks the kernel ([`Driver::came_home`]).
    pub(crate) async fn teardown(
        &self,
        records: Vec<Record>,
        caller: Caller,
    ) -> Vec<(AttachmentKey, Result<Teardown, EngineError>)> {
        if records.is_empty() {
            return Vec::new();
        }
        // Where the driver's kernel state says how far a DEL got, a pod's
        // teardown does not wait for the disk.
        let intent = match caller {
            Caller::Pod if D::DEL_INTENT_BEHIND => Intent::Behind,
            _ => Intent::Durable,
        };
        let stale = match self.driver.stale(&records).await {
            Ok(stale) => stale,
            Err(e) => return fail_all(records, e),
        };
        let (stale, ours): (Vec<_>, Vec<_>) = records
            .into_iter()
            .zip(stale)
            .partition(|(_, stale)| *stale);
        let stale: Vec<Record> = stale.into_iter().map(|(r, _)| r).collect();
        let ours: Vec<Record> = ours.into_iter().map(|(r, _)| r).collect();
        for r in &stale {
            tracing::warn!(key = %r.key, eni = %r.eni_id, "what the record names belongs to another attachment; dropping only the stale record");
        }
        let now = now_ms();
        let intents: Vec<Record> = ours
            .iter()
            .filter(|r| r.phase != Phase::Deleting)
            .map(|r| Record {
                phase: Phase::Deleting,
                updated_ms: now,
                ..r.clone()
            })
            .collect();
        let stale_keys: Vec<AttachmentKey> = stale.iter().map(|r| r.key.clone()).collect();
        let written = match intent {
            // Staged, not written yet: the outcome's write carries it,
            // after the move (see `Checkpoint::put_staged`).
            Intent::Behind if stale_keys.is_empty() => {
                for r in intents {
                    self.checkpoint.put_staged(r).await;
                }
                Ok(())
            }
            _ => self.checkpoint.update_many(intents, &stale_keys).await,
        };
        if let Err(e) = written {
            return fail_all(stale.into_iter().chain(ours).collect(), e.into());
        }
        let mut outcomes: Vec<(AttachmentKey, Result<Teardown, EngineError>)> = stale
            .into_iter()
            .map(|r| (r.key, Ok(Teardown::StaleRecord)))
            .collect();
        crash_point("del:after-intent");

        let unplumbed = match caller {
            Caller::Pod => self.driver.unplumb_for_pod(&ours).await,
            Caller::Sweep => self.driver.unplumb_many(&ours).await,
        };
        let mut released = Vec::with_capacity(ours.len());
        for (r, result) in ours.into_iter().zip(unplumbed) {
            let result = match result {
                Ok(how) => self.driver.release(&r).await.map(|()| how),
                Err(e) => Err(e),
            };
            match result {
                Ok(how) => released.push((r, how)),
                Err(e) => outcomes.push((r.key, Err(e))),
            }
        }
        crash_point("del:after-release");
        if released.is_empty() && intent == Intent::Behind {
            // Nothing to remove, so no outcome's write carries the staged
            // intents of the failures: write them now.
            self.checkpoint.write_soon();
        }
        for (r, how) in released {
            self.checkpoint.remove_behind(&r.key).await;
            if how == Unplumbed::DeviceGone {
                tracing::warn!(key = %r.key, eni = %r.eni_id, "the attachment's device was nowhere on the node; released its record");
            }
            tracing::info!(key = %r.key, eni = %r.eni_id, "detached");
            outcomes.push((r.key, Ok(Teardown::Done(how))));
        }
        outcomes
    }

    /// GC's teardown of a batch: outcomes go into `report`.
    pub(crate) async fn collect(&self, records: Vec<Record>, report: &mut GcReport) {
        for (key, outcome) in self.teardown(records, Caller::Sweep).await {
            match outcome {
                Ok(Teardown::Done(Unplumbed::DeviceGone)) => {
                    report.records_dropped.push(key.to_string());
                    report.collected.push(key.to_string());
                }
                Ok(_) => report.collected.push(key.to_string()),
                Err(e) => report.error(&key, step_of(&e), e),
            }
        }
    }
}

/// Every record fails with one error (a batch step failed), shared.
fn fail_all(
    records: Vec<Record>,
    e: EngineError,
) -> Vec<(AttachmentKey, Result<Teardown, EngineError>)> {
    let e = Arc::new(e);
    records
        .into_iter()
        .map(|r| (r.key, Err(EngineError::Shared(e.clone()))))
        .collect()
}

fn step_of(e: &EngineError) -> GcStep {
    match e {
        EngineError::Shared(e) => step_of(e),
        EngineError::Checkpoint(_) => GcStep::IntentWrite,
        EngineError::Provider(_) | EngineError::NoFreeAddress(_) | EngineError::AddressStore(_) => {
            GcStep::Release
        }
        _ => GcStep::Unplumb,
    }
}
