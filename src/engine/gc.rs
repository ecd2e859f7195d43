//! One GC pass (the periodic loop, `enimctl gc` and CNI GC share it):
//! collect dead attachments, then the driver's host pass.

use std::collections::HashSet;
use std::time::Duration;

use enim_api::model::{now_ms, AttachmentKey, Record};
use enim_api::{GcReport, GcRequest, GcStep};

use crate::netlink::PlumbingError;

use super::{Driver, Engine};

impl<D: Driver> Engine<D> {
    /// An attachment is dead when its netns is gone or is not a network
    /// namespace, when a CNI GC list for its network omits it, or when its
    /// unclaimed allocation expired. Attachments younger than `grace` are
    /// never collected (unless expired): the view of what is alive may lag
    /// behind a pod that is just starting.
    pub async fn gc(&self, request: &GcRequest, grace: Duration) -> GcReport {
        let mut report = GcReport::default();
        let liveness = Liveness::new(request, grace);
        let mut dead = Vec::new();
        for record in self.checkpoint.list_mode(D::MODE).await {
            let netns_alive = || self.driver.check_netns(&record.netns);
            if liveness.is_dead(&record, netns_alive, &mut report).await {
                dead.push(record);
            }
        }
        if !dead.is_empty() {
            let _fence = self.fence.read().await;
            // Key order, so concurrent passes take the locks in one order.
            dead.sort_by(|a, b| a.key.cmp(&b.key));
            let mut guards = Vec::with_capacity(dead.len());
            for record in &dead {
                guards.push(self.locks.lock(&record.key).await);
            }
            // Re-read under the locks: a DEL or a re-ADD may have won.
            let mut current = Vec::with_capacity(dead.len());
            for record in dead {
                if let Some(now) = self.record(&record.key).await {
                    if now.created_ms == record.created_ms {
                        current.push(now);
                    }
                }
            }
            self.collect(current, &mut report).await;
        }
        {
            let _fence = self.fence.write().await;
            // Read under the fence: no ADD or DEL is half-way now.
            let records = self.checkpoint.list_mode(D::MODE).await;
            self.driver.gc_host(&records, request, &mut report).await;
        }
        if did_work(&report) {
            tracing::info!(collected = ?report.collected, orphans = ?report.orphans_released, swept = ?report.swept, errors = ?report.errors, "GC pass");
        }
        report
    }
}

/// Whether a pass did (or failed to do) anything worth a log line.
fn did_work(report: &GcReport) -> bool {
    !(report.collected.is_empty()
        && report.orphans_released.is_empty()
        && report.normalised.is_empty()
        && report.swept.is_empty()
        && report.errors.is_empty())
}

/// The question a GC pass asks of every attachment: is it dead? Only
/// attachments of the pass's network (all without one) that are older than
/// the grace period are considered; such an attachment is dead when a CNI
/// GC list omits it, its unclaimed allocation expired, or its netns is gone
/// or no network namespace.
pub(crate) struct Liveness<'r> {
    network: Option<&'r str>,
    valid: Option<HashSet<(&'r str, &'r str)>>,
    now_ms: u64,
    grace_ms: u64,
}

impl<'r> Liveness<'r> {
    pub(crate) fn new(request: &'r GcRequest, grace: Duration) -> Self {
        Liveness {
            network: request.network.as_deref(),
            valid: request.valid_attachments.as_ref().map(|v| {
                v.iter()
                    .map(|a| (a.container_id.as_str(), a.ifname.as_str()))
                    .collect()
            }),
            now_ms: now_ms(),
            grace_ms: u64::try_from(grace.as_millis()).unwrap_or(u64::MAX),
        }
    }

    /// `netns_alive` checks the netns, and runs only when the cheaper tests
    /// did not decide. Young attachments are counted in the report, and a
    /// netns that cannot be checked is an error there (the attachment is
    /// kept, so a passing fault never collects a live pod).
    pub(crate) async fn is_dead<F>(
        &self,
        record: &Record,
        netns_alive: impl FnOnce() -> F,
        report: &mut GcReport,
    ) -> bool
    where
        F: std::future::Future<Output = Result<(), PlumbingError>>,
    {
        let key: &AttachmentKey = &record.key;
        if self.network.is_some_and(|n| n != key.network) {
            return false;
        }
        // An ADD whose result nobody claimed in time is dead whatever its
        // age: the runtime has given up on it.
        let expired = record.expires_ms.is_some_and(|t| self.now_ms >= t);
        if !expired && self.now_ms.saturating_sub(record.created_ms) < self.grace_ms {
            report.too_young += 1;
            return false;
        }
        let omitted = self
            .valid
            .as_ref()
            .is_some_and(|v| !v.contains(&(key.container_id.as_str(), key.ifname.as_str())));
        if omitted || expired {
            return true;
        }
        match netns_alive().await {
            Ok(()) => false,
            Err(e) if e.is_netns_gone() => true,
            Err(e) => {
                report.error(key, GcStep::Netns, e);
                false
            }
        }
    }
}
