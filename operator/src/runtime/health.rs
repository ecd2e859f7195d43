//! `/healthz`, `/readyz` and `/metrics`: what [`Health`] counts, and the
//! leader deadline as the Lease watch gives it. Readiness is the caches'
//! (a follower is ready too); the endpoint only reads, so a stop or a
//! lost lease never waits on it.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use axum::response::IntoResponse;
use enim_crd::{NetResourceSet, CONDITION_READY};
use enim_events::EventSink;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use crate::policy::webhook::WebhookMetrics;
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::allocator::Totals;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeState {
    pub node: String,
    pub state: &'static str,
}

/// What the health endpoint shows: the operator's metrics (prefix
/// `enim_operator`), registered once in [`Health::new`].
#[derive(Debug)]
pub struct Health {
    registry: Registry,
    /// 1 once the caches of Nodes and NetResourceSets are listed.
    pub synced: Gauge,
    /// The EniPolicy webhook: 1 while this replica serves it (its
    /// certificate in hand, its caches listed, its socket bound), 0 before
    /// and after, -1 when it is off.
    pub webhook: Gauge,
    /// What the webhook server counts: each review's time (the
    /// operator's share of an admission) and the connections it accepted.
    pub webhook_metrics: WebhookMetrics,
    /// 1 while leading: the lease manager's flag and the deadline not
    /// passed.
    pub leader: Gauge,
    /// Seconds before this leader stops calling the cloud unless the
    /// Lease is renewed; 0 when not leading (set at each scrape).
    leader_deadline_seconds: Gauge<f64, AtomicU64>,
    /// Times leadership was lost to the deadline (the Lease not renewed
    /// in time), not to another holder.
    pub deadline_misses: Counter,
    pub resyncs: Counter,
    pub resync_errors: Counter,
    /// Microseconds the last resync took.
    pub last_resync_us: Gauge,
    cloud_calls: Counter,
    cloud_throttled: Counter,
    leaked_enis: Counter,
    tasks_failed: Counter,
    sets: Gauge,
    sets_not_ready: Gauge,
    node_enis: Family<NodeState, Gauge>,
}

impl Health {
    /// The metrics, `events`' counters among them.
    pub fn new(events: &EventSink) -> Health {
        let mut h = Health {
            registry: Registry::with_prefix("enim_operator"),
            synced: Gauge::default(),
            webhook: Gauge::default(),
            webhook_metrics: WebhookMetrics::new(),
            leader: Gauge::default(),
            leader_deadline_seconds: Gauge::default(),
            deadline_misses: Counter::default(),
            resyncs: Counter::default(),
            resync_errors: Counter::default(),
            last_resync_us: Gauge::default(),
            cloud_calls: Counter::default(),
            cloud_throttled: Counter::default(),
            leaked_enis: Counter::default(),
            tasks_failed: Counter::default(),
            sets: Gauge::default(),
            sets_not_ready: Gauge::default(),
            node_enis: Family::default(),
        };
        let r = &mut h.registry;
        // One row a metric: its name (counters get `_total`), the field
        // that holds it, its help.
        macro_rules! register {
            ($($name:literal => $field:ident, $help:literal;)*) => {
                $(r.register($name, $help, h.$field.clone());)*
            };
        }
        register! {
            "leader" => leader, "1 while this replica leads (holds the Lease, its deadline not passed)";
            "leader_deadline_seconds" => leader_deadline_seconds, "Seconds before this leader stops calling the cloud unless the Lease is renewed; 0 when not leading";
            "leader_deadline_misses" => deadline_misses, "Times leadership was lost because the Lease was not renewed in time";
            "caches_synced" => synced, "1 once the Node and NetResourceSet caches are listed";
            "webhook_serving" => webhook, "1 while this replica serves the EniPolicy webhook, 0 before and after, -1 when it is off";
            "resyncs" => resyncs, "Resyncs run";
            "resync_errors" => resync_errors, "Resyncs that failed or had a task fail";
            "last_resync_microseconds" => last_resync_us, "How long the last resync took";
            "cloud_calls" => cloud_calls, "Cloud API calls made";
            "cloud_throttled" => cloud_throttled, "Cloud API calls answered throttled (after the client's retries)";
            "leaked_enis" => leaked_enis, "Leaked ENIs found by the reaper (tagged for the cluster, attached nowhere, past the cooldown), once per pass that plans their delete";
            "tasks_failed" => tasks_failed, "Allocator tasks that failed (the next resync retries)";
            "netresourcesets" => sets, "NetResourceSets in the cache";
            "netresourcesets_not_ready" => sets_not_ready, "NetResourceSets whose agent does not report the Ready condition True";
            "node_enis" => node_enis, "Per node, from its NetResourceSet status: ENIs in the spec (total), held by pods (used), free to hand out (available; secondary mode: addresses), quarantined";
        }
        let w = &h.webhook_metrics;
        r.register(
            "webhook_review_seconds",
            "Time the webhook took to answer an admission review, from the request's head to its answer",
            w.reviews.clone(),
        );
        r.register(
            "webhook_connections",
            "Connections to the webhook whose TLS handshake succeeded",
            w.connections.clone(),
        );
        events.register(&mut h.registry);
        h
    }

    /// Brings the counters up to the allocator's running `totals`.
    pub fn add_totals(&self, totals: Totals) {
        let catch_up = |c: &Counter, total: u64| {
            c.inc_by(total.saturating_sub(c.get()));
        };
        catch_up(&self.cloud_calls, totals.cloud_calls);
        catch_up(&self.cloud_throttled, totals.throttled);
        catch_up(&self.leaked_enis, totals.leaked_found);
        catch_up(&self.tasks_failed, totals.tasks_failed);
    }

    /// The NetResourceSet gauges, from the cache as it is now.
    pub fn observe_sets(&self, sets: &[Arc<NetResourceSet>]) {
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        let not_ready = sets
            .iter()
            .filter(|s| {
                !s.status.as_ref().is_some_and(|st| {
                    st.conditions
                        .iter()
                        .any(|c| c.type_ == CONDITION_READY && c.status == "True")
                })
            })
            .count();
        self.sets.set(count(sets.len()));
        self.sets_not_ready.set(count(not_ready));
        // Gone nodes' series go with them.
        self.node_enis.clear();
        for set in sets {
            let node = set.metadata.name.clone().unwrap_or_default();
            let status = set.status.clone().unwrap_or_default();
            for (state, n) in [
                ("total", set.spec.enis.len()),
                (
                    "used",
                    usize::try_from(status.summary.used).unwrap_or(usize::MAX),
                ),
                (
                    "available",
                    usize::try_from(status.summary.available).unwrap_or(usize::MAX),
                ),
                ("quarantined", status.quarantined.len()),
            ] {
                self.node_enis
                    .get_or_create(&NodeState {
                        node: node.clone(),
                        state,
                    })
                    .set(count(n));
            }
        }
    }

    fn is_leader(&self) -> bool {
        self.leader.get() == 1
    }

    /// Everything, encoded for a scrape.
    fn render(
        &self,
        deadline: &watch::Receiver<Option<Instant>>,
    ) -> Result<String, std::fmt::Error> {
        let left = deadline_left(self, deadline).unwrap_or_default();
        self.leader_deadline_seconds.set(left.as_secs_f64());
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

/// The time left before the leader deadline, while leading.
fn deadline_left(h: &Health, deadline: &watch::Receiver<Option<Instant>>) -> Option<Duration> {
    let d = (*deadline.borrow())?;
    h.is_leader()
        .then(|| d.saturating_duration_since(Instant::now()))
}

/// One line on leadership for `/readyz`.
fn leadership_line(h: &Health, deadline: &watch::Receiver<Option<Instant>>) -> String {
    let now = Instant::now();
    match (h.is_leader(), *deadline.borrow()) {
        (true, Some(d)) => format!(
            "leader: deadline in {:.1}s",
            d.saturating_duration_since(now).as_secs_f64()
        ),
        (false, Some(d)) if d <= now => format!(
            "not leading: leader deadline passed {:.1}s ago (lease not renewed), no cloud calls",
            (now - d).as_secs_f64()
        ),
        _ => "follower".into(),
    }
}

/// `/readyz`: the caches' (a follower is ready too) and, where the
/// EniPolicy webhook is on, the webhook's: a replica behind the webhook's
/// Service that cannot answer it must not get admissions (they fail
/// closed). The body also says where leadership stands.
fn readiness(synced: bool, webhook: i64, lead: &str) -> (axum::http::StatusCode, String) {
    use axum::http::StatusCode;
    let hook = match webhook {
        1 => "webhook: serving\n",
        0 => "webhook: not serving (certificate, caches or socket not ready, or stopped)\n",
        _ => "",
    };
    match (synced, webhook) {
        (true, 0) => (StatusCode::SERVICE_UNAVAILABLE, format!("{hook}{lead}\n")),
        (true, _) => (StatusCode::OK, format!("ok\n{hook}{lead}\n")),
        (false, _) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("caches not synced\n{hook}{lead}\n"),
        ),
    }
}

pub(super) async fn serve_health(
    listener: tokio::net::TcpListener,
    health: Arc<Health>,
    deadline: watch::Receiver<Option<Instant>>,
) {
    use axum::routing::get;
    let metrics = |h: Arc<Health>, deadline: watch::Receiver<Option<Instant>>| async move {
        use axum::http::{header, StatusCode};
        let Ok(body) = h.render(&deadline) else {
            return StatusCode::INTERNAL_SERVER_ERROR.into_response();
        };
        let openmetrics = "application/openmetrics-text; version=1.0.0; charset=utf-8";
        ([(header::CONTENT_TYPE, openmetrics)], body).into_response()
    };
    let ready = |h: Arc<Health>, deadline: watch::Receiver<Option<Instant>>| async move {
        readiness(
            h.synced.get() == 1,
            h.webhook.get(),
            &leadership_line(&h, &deadline),
        )
    };
    let (h1, h2) = (health.clone(), health);
    let d1 = deadline.clone();
    let app = axum::Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(move || ready(h1.clone(), d1.clone())))
        .route(
            "/metrics",
            get(move || metrics(h2.clone(), deadline.clone())),
        );
    if let Err(e) = axum::serve(listener, app).await {
        tracing::error!(error = %e, "health endpoint stopped");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;

    #[test]
    fn ready_needs_the_caches_and_a_webhook_that_is_on_to_serve() {
        let (off, on, not_yet) = (-1, 1, 0);
        assert_eq!(readiness(true, off, "follower").0, StatusCode::OK);
        let (code, body) = readiness(true, on, "follower");
        assert_eq!(code, StatusCode::OK);
        assert!(body.contains("webhook: serving"), "{body}");
        let (code, body) = readiness(true, not_yet, "leader: deadline in 9.0s");
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("webhook: not serving"), "{body}");
        assert!(body.contains("leader"), "{body}");
        for webhook in [off, on, not_yet] {
            let (code, body) = readiness(false, webhook, "follower");
            assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
            assert!(body.starts_with("caches not synced"), "{body}");
        }
    }
}
