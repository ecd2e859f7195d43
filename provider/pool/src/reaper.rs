//! The fleet-wide reaper: leaked ENIs of this cluster, any node's, deleted
//! by whichever node's jittered pass sees them first (see the crate docs).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use enim_core::retry::Jitter;
use enim_core::ProviderError;
use enim_provider::cloud::{CloudBackend, CreatedAt, Reaped, TAG_CREATED_AT};
use tokio::sync::watch;

use crate::{context, stopped, Inner};

/// What one reaper pass did, ENI by ENI.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReapReport {
    /// Deleted by this pass.
    pub deleted: Vec<String>,
    /// Gone before this pass's delete landed (another node won the race).
    pub gone: Vec<String>,
    /// Younger than the cooldown.
    pub young: Vec<String>,
    /// Without a readable creation tag (logged; never reaped).
    pub unreadable: Vec<String>,
    /// Changed since listed (attached, or retagged): left alone.
    pub spared: Vec<String>,
    /// Whose delete failed; the next pass tries again.
    pub failed: Vec<String>,
}

/// One pass of the fleet-wide reaper over `backend`: lists this cluster's
/// unattached ENIs and deletes those at least `cooldown` old by their
/// creation tag. A failed delete is logged and counted, and the pass goes
/// on; only a failed listing fails the pass. `stopping` is asked between
/// ENIs, so a shutdown does not wait for a long pass.
pub async fn reap_pass(
    backend: &dyn CloudBackend,
    cooldown: Duration,
    stopping: impl Fn() -> bool,
) -> Result<ReapReport, ProviderError> {
    let mut report = ReapReport::default();
    if backend.reap_cluster().is_none() {
        return Ok(report);
    }
    let listed = backend
        .unattached_in_cluster()
        .await
        .map_err(|e| context(e, "list this cluster's unattached ENIs"))?;
    let now = SystemTime::now();
    for eni in listed {
        if stopping() {
            break;
        }
        let created = match eni.created_at {
            CreatedAt::At(t) => t,
            CreatedAt::Missing | CreatedAt::Unreadable(_) => {
                tracing::warn!(eni = %eni.id, created_at = ?eni.created_at, tag = TAG_CREATED_AT, "an unattached ENI of this cluster has no readable creation tag; the reaper never deletes it: check it and delete it by hand");
                report.unreadable.push(eni.id);
                continue;
            }
        };
        // A creation time ahead of this node's clock counts as new.
        let age = now.duration_since(created).unwrap_or_default();
        if age < cooldown {
            report.young.push(eni.id);
            continue;
        }
        match backend.reap(&eni.id).await {
            Ok(Reaped::Deleted) => {
                tracing::info!(eni = %eni.id, age = ?age, "reaped a leaked ENI of this cluster (unattached past the cooldown)");
                report.deleted.push(eni.id);
            }
            Ok(Reaped::Gone) => {
                tracing::debug!(eni = %eni.id, "leaked ENI already gone: another node reaped it first");
                report.gone.push(eni.id);
            }
            Ok(Reaped::Spared(why)) => {
                tracing::info!(eni = %eni.id, %why, "leaked ENI changed since listed; not reaped");
                report.spared.push(eni.id);
            }
            Err(e) => {
                tracing::warn!(eni = %eni.id, error = %e, "reaping a leaked ENI failed; the next pass tries again");
                report.failed.push(eni.id);
            }
        }
    }
    Ok(report)
}

/// The reaper's own timer: a pass every `reap_interval`, jittered, never
/// in a pod's path nor in the resync loop's. A failed pass is logged and
/// tried again at the next (jittered) time: leaked ENIs cost only money,
/// so there is no hurry to hammer a struggling API.
pub(crate) async fn reap_loop(inner: Arc<Inner>, mut stop: watch::Receiver<bool>) {
    // The first wait is drawn from the whole interval: nodes that start
    // together spread their first passes over it.
    let mut delay = Jitter::Full.apply(inner.config.reap_interval);
    loop {
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = stop.changed() => return,
        }
        if stopped(&stop) {
            return;
        }
        let pass = reap_pass(inner.backend.as_ref(), inner.config.reap_cooldown, || {
            stopped(&stop)
        })
        .await;
        match pass {
            Ok(r) => tracing::info!(
                deleted = r.deleted.len(),
                gone = r.gone.len(),
                young = r.young.len(),
                unreadable = r.unreadable.len(),
                spared = r.spared.len(),
                failed = r.failed.len(),
                "reaper pass done"
            ),
            Err(e) => {
                tracing::warn!(error = %e, transient = e.is_transient(), "reaper pass failed; trying again at the next pass")
            }
        }
        delay = Jitter::Equal.apply(inner.config.reap_interval);
    }
}
