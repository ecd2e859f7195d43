//! Start-up recovery: the driver brings the host and the provider in line
//! with the checkpoint, then every record a crash left in an intent phase is
//! finished (its pod side is fully made) or undone. A ready record is never
//! dropped while its device is in the pod, whatever else the kernel shows:
//! the pod keeps working, and DEL or GC clean it up. A ready record whose
//! device is home is a DEL that died before its intent (written behind)
//! landed: it is finished.

use enim_api::model::{now_ms, Phase};

use super::teardown::Caller;
use super::{Driver, Engine, EngineError};

#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RecoveryReport {
    pub ready: usize,
    pub finished: usize,
    pub rolled_back: usize,
    /// Ready records whose device was home: a DEL died before its intent
    /// (written behind) landed, and was finished.
    pub finished_dels: usize,
    /// Records of the other mode (the node switched modes): kept untouched.
    pub other_mode: usize,
}

impl<D: Driver> Engine<D> {
    /// Run before serving any ADD.
    pub async fn recover(&self) -> Result<RecoveryReport, EngineError> {
        let all = self.checkpoint.list().await;
        let (records, other): (Vec<_>, Vec<_>) = all.into_iter().partition(|r| r.mode() == D::MODE);
        let mut report = RecoveryReport {
            other_mode: other.len(),
            ..RecoveryReport::default()
        };
        if !other.is_empty() {
            tracing::warn!(count = other.len(), mode = %D::MODE, "the checkpoint holds attachments of the other mode; they are kept untouched until the node runs that mode again");
        }
        self.driver.restore(&records).await?;
        // A DEL whose intent was written behind may have died before the
        // intent landed: its record says Ready, the kernel says how far it
        // got. A device already home means the DEL happened: finish it.
        let home = if D::DEL_INTENT_BEHIND && !records.is_empty() {
            self.driver.came_home(&records).await?
        } else {
            vec![false; records.len()]
        };
        let mut undo = Vec::new();
        let mut guards = Vec::new();
        for (mut record, home) in records.into_iter().zip(home) {
            match record.phase {
                Phase::Ready if home => {
                    tracing::info!(key = %record.key, eni = %record.eni_id, "a DEL was interrupted after the device came home: finishing it");
                    guards.push(self.locks.lock(&record.key).await);
                    undo.push(record);
                    report.finished_dels += 1;
                }
                Phase::Ready => report.ready += 1,
                Phase::Adding => {
                    let guard = self.locks.lock(&record.key).await;
                    let mtu = record.mtu;
                    if self.driver.verify(&mut record, Some(mtu)).await.is_none() {
                        // The crash hit after the pod side was fully made: finish.
                        record.phase = Phase::Ready;
                        record.updated_ms = now_ms();
                        self.checkpoint.put(record).await?;
                        report.finished += 1;
                    } else {
                        guards.push(guard);
                        undo.push(record);
                    }
                }
                Phase::Deleting => {
                    guards.push(self.locks.lock(&record.key).await);
                    undo.push(record);
                }
            }
        }
        for (key, outcome) in self.teardown(undo, Caller::Sweep).await {
            if let Err(e) = outcome {
                tracing::error!(%key, error = %e, "could not undo an interrupted attachment");
                return Err(e);
            }
            report.rolled_back += 1;
        }
        drop(guards);
        Ok(report)
    }
}
