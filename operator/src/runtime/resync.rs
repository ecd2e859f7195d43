//! One resync, as the runtime runs it: the [`Resync`] trait (the
//! allocator's work, behind it so that the loop neither knows nor is
//! known by the allocator's internals), its implementation by the
//! allocator, and [`resync_once`]: the caches converted into the index's
//! views, one pass, its outcome counted in [`Health`] and logged.

use async_trait::async_trait;
use tokio::time::Instant;

use super::convert::{claim_info, node_info, set_info};
use super::health::Health;
use super::watch::Caches;
use crate::allocator::{Allocator, Demand, Totals};
use crate::index::{ClaimInfo, NodeInfo, SetInfo, WarmPool};
use crate::policy::claims::warm_pool;
use kube::runtime::reflector::Store as Cache;

/// Why a resync failed.
#[derive(Debug, thiserror::Error)]
pub enum ResyncError {
    /// The pass stopped before its end (the listing failed, leadership
    /// was lost, ...).
    #[error(transparent)]
    Pass(#[from] crate::allocator::Error),
    /// The pass ran to its end, but tasks failed: its summary, then each
    /// error (the first few).
    #[error("{summary}; errors: {}", .errors.join("; "))]
    Tasks {
        summary: String,
        errors: Vec<String>,
    },
}

/// One resync of the whole cluster, as the runtime calls it: the
/// allocator's work, behind a trait so that the runtime neither knows nor
/// is known by the allocator's internals.
#[async_trait]
pub trait Resync: Send + Sync {
    /// Runs one resync over the cluster's Nodes and NetResourceSets, and
    /// the DRA driver's claims when they are known. Returns a one-line
    /// summary for the log.
    async fn resync(
        &self,
        nodes: Vec<NodeInfo>,
        sets: Vec<SetInfo>,
        demand: OwnedDemand,
    ) -> Result<String, ResyncError>;

    /// This replica stopped leading (perhaps mid-pass): whatever it cached
    /// of the cluster may be stale by the time it leads again.
    fn deposed(&self);

    /// Every pass's counts, summed (for `/metrics`).
    fn totals(&self) -> Totals {
        Totals::default()
    }
}

#[async_trait]
impl Resync for Allocator {
    async fn resync(
        &self,
        nodes: Vec<NodeInfo>,
        sets: Vec<SetInfo>,
        demand: OwnedDemand,
    ) -> Result<String, ResyncError> {
        let demand = Demand {
            claims: demand.claims.as_deref(),
            warm: demand.warm.as_deref(),
        };
        let r = self.resync_with(&nodes, &sets, demand).await?;
        let summary = format!(
            "{} nodes, {} ENIs{}, {} tasks ({} failed) {:?}, {} cloud calls ({} throttled), {} writes",
            r.nodes,
            r.enis,
            if r.listed { " (listed)" } else { "" },
            r.tasks,
            r.tasks_failed,
            r.by_kind,
            r.cloud_calls,
            r.throttled,
            r.writes,
        );
        if r.errors.is_empty() {
            Ok(summary)
        } else {
            Err(ResyncError::Tasks {
                summary,
                errors: r.errors,
            })
        }
    }

    fn deposed(&self) {
        self.forget();
    }

    fn totals(&self) -> Totals {
        Allocator::totals(self)
    }
}

/// [`Demand`], owned: what the caches held when the pass began.
#[derive(Debug, Default)]
pub struct OwnedDemand {
    pub claims: Option<Vec<ClaimInfo>>,
    pub warm: Option<Vec<WarmPool>>,
}

/// What a cache holds, once it has listed (before, everything would look
/// gone).
fn listed<K, T>(cache: &Cache<K>, f: impl Fn(&K) -> Option<T>) -> Option<Vec<T>>
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    futures::FutureExt::now_or_never(cache.wait_until_ready())
        .is_some_and(|r| r.is_ok())
        .then(|| cache.state().iter().filter_map(|k| f(k)).collect())
}

/// One pass over what the caches hold now; counted and logged, never
/// fatal (the next pass tries again).
pub(super) async fn resync_once(resync: &dyn Resync, caches: &Caches, health: &Health) {
    let nodes: Vec<NodeInfo> = caches.nodes.state().iter().map(|n| node_info(n)).collect();
    let sets: Vec<SetInfo> = caches.sets.state().iter().map(|s| set_info(s)).collect();
    let demand = OwnedDemand {
        claims: listed(&caches.claims, claim_info),
        warm: match &caches.policies {
            Some(policies) => listed(policies, warm_pool),
            None => Some(Vec::new()),
        },
    };
    let started = Instant::now();
    let result = resync.resync(nodes, sets, demand).await;
    let took = started.elapsed();
    health.resyncs.inc();
    health
        .last_resync_us
        .set(i64::try_from(took.as_micros()).unwrap_or(i64::MAX));
    health.add_totals(resync.totals());
    match result {
        Ok(summary) => tracing::info!(took = ?took, "resync: {summary}"),
        Err(e) => {
            health.resync_errors.inc();
            tracing::warn!(took = ?took, error = %e, "resync failed");
        }
    }
}
