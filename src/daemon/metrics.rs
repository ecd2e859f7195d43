//! Prometheus metrics, health and readiness, served on an optional TCP
//! listener (`metrics_address`; off by default, loopback when set so).

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use enim_api::EniState;
use enim_api::GcReport;
use enim_core::AddressCount;
use enim_core::{AddressLimits, Eni, EniOwner, ProviderError};
use enim_provider::{EniProvider, SecondaryIps};
use prometheus_client::encoding::{text::encode, EncodeLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use crate::engine::{Driver, Engine};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VerbResult {
    pub verb: String,
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Verb {
    pub verb: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Kind {
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Operation {
    pub operation: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Statistic {
    pub statistic: String,
}

/// Every operation [`MeteredProvider`] records: their error and throttle
/// counters are served from the start, at 0.
const PROVIDER_OPERATIONS: [&str; 8] = [
    "list",
    "allocate",
    "release",
    "restore",
    "address_limits",
    "assign",
    "unassign",
    "attach_eni",
];

fn latency_histogram() -> Histogram {
    // 100 µs .. ~26 s: netlink steps to slow cloud calls.
    Histogram::new(exponential_buckets(0.0001, 2.0, 18))
}

pub struct Metrics {
    registry: Registry,
    requests: Family<VerbResult, Counter>,
    request_seconds: Family<Verb, Histogram, fn() -> Histogram>,
    gc_actions: Family<Kind, Counter>,
    provider_seconds: Family<Operation, Histogram, fn() -> Histogram>,
    provider_errors: Family<Operation, Counter>,
    provider_throttled: Family<Operation, Counter>,
    checkpoint_write_seconds: Histogram,
    enis: Family<StateLabel, Gauge>,
    attachments: Gauge,
    pool: Family<Statistic, Gauge>,
    secondary_addresses: Family<StateLabel, Gauge>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("enim");
        let m = Metrics {
            requests: Family::default(),
            request_seconds: Family::new_with_constructor(latency_histogram),
            gc_actions: Family::default(),
            provider_seconds: Family::new_with_constructor(latency_histogram),
            provider_errors: Family::default(),
            provider_throttled: Family::default(),
            checkpoint_write_seconds: latency_histogram(),
            enis: Family::default(),
            attachments: Gauge::default(),
            pool: Family::default(),
            secondary_addresses: Family::default(),
            registry: Registry::default(),
        };
        // One row a metric: its name, the field that holds it, its help.
        macro_rules! register {
            ($($name:literal => $field:ident, $help:literal;)*) => {
                $(registry.register($name, $help, m.$field.clone());)*
            };
        }
        register! {
            "requests" => requests, "ADD/DEL/CHECK/GC requests by result";
            "request_duration_seconds" => request_seconds, "Request latency by verb";
            "gc_actions" => gc_actions, "GC actions by kind";
            "provider_call_duration_seconds" => provider_seconds, "Provider call latency by operation";
            "provider_errors" => provider_errors, "Provider call errors by operation";
            "provider_throttled" => provider_throttled, "Provider calls the cloud answered throttled (after the client's retries), by operation";
            "checkpoint_write_duration_seconds" => checkpoint_write_seconds, "Checkpoint write latency";
            "enis" => enis, "ENIs by state";
            "attachments" => attachments, "Attachments recorded";
            "pool" => pool, "Warm-pool statistics";
            "secondary_addresses" => secondary_addresses, "Secondary mode: ENI secondary addresses by state";
        }
        for op in PROVIDER_OPERATIONS {
            let label = Operation {
                operation: op.into(),
            };
            let _ = m.provider_errors.get_or_create(&label);
            let _ = m.provider_throttled.get_or_create(&label);
        }
        Metrics { registry, ..m }
    }

    /// [`Metrics::new`] with `events`' counters (`enim_events_total`).
    pub fn with_events(events: &enim_events::EventSink) -> Self {
        let mut m = Metrics::new();
        events.register(&mut m.registry);
        m
    }

    pub fn observe_request(&self, verb: &str, started: Instant, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.requests
            .get_or_create(&VerbResult {
                verb: verb.into(),
                result: result.into(),
            })
            .inc();
        self.request_seconds
            .get_or_create(&Verb { verb: verb.into() })
            .observe(started.elapsed().as_secs_f64());
    }

    pub fn observe_gc(&self, report: &GcReport) {
        let moved_back = report
            .collected
            .len()
            .saturating_sub(report.records_dropped.len());
        for (kind, n) in [
            ("moved_back", moved_back),
            ("renamed", report.normalised.len()),
            ("released", report.orphans_released.len()),
            ("record_dropped", report.records_dropped.len()),
        ] {
            self.gc_actions
                .get_or_create(&Kind { kind: kind.into() })
                .inc_by(n as u64);
        }
    }

    pub fn observe_checkpoint_write(&self, took: Duration) {
        self.checkpoint_write_seconds.observe(took.as_secs_f64());
    }

    /// Refreshes the gauges from the engine, then encodes everything.
    pub async fn render<D: Driver>(&self, engine: &Engine<D>) -> Result<String, std::fmt::Error> {
        if let Ok(enis) = engine.enis().await {
            let mut counts = [0i64; 4];
            for e in &enis {
                let i = match e.state {
                    EniState::Free => 0,
                    EniState::InUse => 1,
                    EniState::Excluded => 2,
                    EniState::Missing => 3,
                };
                counts[i] += 1;
            }
            let states = ["free", "in_use", "excluded", "missing"];
            for (state, n) in states.iter().zip(counts) {
                self.enis
                    .get_or_create(&StateLabel {
                        state: state.to_string(),
                    })
                    .set(n);
            }
        }
        self.attachments.set(gauge(engine.checkpoint().len().await));
        if let Some(stats) = engine.provider().statistics() {
            for (name, v) in [
                ("used", stats.used),
                ("available", stats.available),
                ("needed", stats.needed),
                ("excess", stats.excess),
            ] {
                self.pool
                    .get_or_create(&Statistic {
                        statistic: name.into(),
                    })
                    .set(gauge(v));
            }
        }
        if let Some(stats) = engine.address_stats() {
            let free = stats.total - stats.assigned - stats.cooling;
            for (state, n) in [
                ("assigned", stats.assigned),
                ("cooling", stats.cooling),
                ("lost", stats.lost),
                ("free", free),
            ] {
                self.secondary_addresses
                    .get_or_create(&StateLabel {
                        state: state.to_string(),
                    })
                    .set(gauge(n));
            }
        }
        let mut out = String::new();
        encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

/// Times every provider call and counts its errors.
pub struct MeteredProvider {
    inner: Arc<dyn EniProvider>,
    metrics: Arc<Metrics>,
}

impl MeteredProvider {
    pub fn new(inner: Arc<dyn EniProvider>, metrics: Arc<Metrics>) -> Self {
        MeteredProvider { inner, metrics }
    }

    /// The wrapped provider's secondary-mode verbs; only reached through
    /// [`EniProvider::secondary_ips`], which answers `None` without them.
    fn inner_ips(&self) -> Result<&dyn SecondaryIps, ProviderError> {
        self.inner.secondary_ips().ok_or_else(|| {
            ProviderError::Config(format!(
                "provider {} cannot assign addresses",
                self.inner.name()
            ))
        })
    }

    fn record<T>(&self, op: &str, started: Instant, result: &Result<T, ProviderError>) {
        debug_assert!(PROVIDER_OPERATIONS.contains(&op), "{op} is not listed");
        let label = Operation {
            operation: op.into(),
        };
        self.metrics
            .provider_seconds
            .get_or_create(&label)
            .observe(started.elapsed().as_secs_f64());
        if result.is_err() {
            self.metrics.provider_errors.get_or_create(&label).inc();
        }
        if matches!(result, Err(ProviderError::Throttled(_))) {
            self.metrics.provider_throttled.get_or_create(&label).inc();
        }
    }
}

/// Secondary mode's cloud verbs, timed and counted like the others.
#[async_trait]
impl SecondaryIps for MeteredProvider {
    async fn address_limits(&self) -> Result<AddressLimits, ProviderError> {
        let t = Instant::now();
        let r = self.inner_ips()?.address_limits().await;
        self.record("address_limits", t, &r);
        r
    }

    async fn assign(
        &self,
        eni_id: &str,
        n: AddressCount,
    ) -> Result<Vec<std::net::IpAddr>, ProviderError> {
        let t = Instant::now();
        let r = self.inner_ips()?.assign(eni_id, n).await;
        self.record("assign", t, &r);
        r
    }

    async fn unassign(&self, eni_id: &str, ips: &[std::net::IpAddr]) -> Result<(), ProviderError> {
        let t = Instant::now();
        let r = self.inner_ips()?.unassign(eni_id, ips).await;
        self.record("unassign", t, &r);
        r
    }

    async fn attach_eni(&self) -> Result<Eni, ProviderError> {
        let t = Instant::now();
        let r = self.inner_ips()?.attach_eni().await;
        self.record("attach_eni", t, &r);
        r
    }
}

#[async_trait]
impl EniProvider for MeteredProvider {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn list(&self) -> Result<Vec<Eni>, ProviderError> {
        let t = Instant::now();
        let r = self.inner.list().await;
        self.record("list", t, &r);
        r
    }

    async fn allocate_next(&self, owner: &EniOwner) -> Result<Eni, ProviderError> {
        let t = Instant::now();
        let r = self.inner.allocate_next(owner).await;
        self.record("allocate", t, &r);
        r
    }

    async fn allocate_named(&self, eni_id: &str, owner: &EniOwner) -> Result<Eni, ProviderError> {
        let t = Instant::now();
        let r = self.inner.allocate_named(eni_id, owner).await;
        self.record("allocate", t, &r);
        r
    }

    async fn wait_for_free(&self, owner: &EniOwner) {
        self.inner.wait_for_free(owner).await
    }

    async fn release(&self, owner: &EniOwner) -> Result<(), ProviderError> {
        let t = Instant::now();
        let r = self.inner.release(owner).await;
        self.record("release", t, &r);
        r
    }

    async fn restore(&self, assignments: &[(String, EniOwner)]) -> Result<(), ProviderError> {
        let t = Instant::now();
        let r = self.inner.restore(assignments).await;
        self.record("restore", t, &r);
        r
    }

    fn secondary_ips(&self) -> Option<&dyn SecondaryIps> {
        self.inner.secondary_ips()?;
        Some(self)
    }

    fn address_feed(&self) -> Option<&dyn enim_provider::AddressFeed> {
        self.inner.address_feed()
    }

    fn statistics(&self) -> Option<enim_core::PoolStatistics> {
        self.inner.statistics()
    }

    fn degraded(&self) -> Option<String> {
        self.inner.degraded()
    }

    async fn release_unused(&self) -> enim_provider::Released {
        self.inner.release_unused().await
    }
}

struct HealthState<D: Driver> {
    metrics: Arc<Metrics>,
    engine: Arc<Engine<D>>,
    ready: watch::Receiver<bool>,
}

// By hand: a derive would ask `D: Clone`, which drivers need not be.
impl<D: Driver> Clone for HealthState<D> {
    fn clone(&self) -> Self {
        HealthState {
            metrics: self.metrics.clone(),
            engine: self.engine.clone(),
            ready: self.ready.clone(),
        }
    }
}

/// `/metrics`, `/healthz` (alive) and `/readyz` (startup reconcile done
/// and the provider answering).
pub fn router<D: Driver>(
    metrics: Arc<Metrics>,
    engine: Arc<Engine<D>>,
    ready: watch::Receiver<bool>,
) -> Router {
    Router::new()
        .route("/metrics", get(scrape::<D>))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz::<D>))
        .with_state(HealthState {
            metrics,
            engine,
            ready,
        })
}

async fn scrape<D: Driver>(State(s): State<HealthState<D>>) -> impl IntoResponse {
    match s.metrics.render(&*s.engine).await {
        Ok(body) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

async fn readyz<D: Driver>(State(s): State<HealthState<D>>) -> impl IntoResponse {
    if !*s.ready.borrow() {
        return (StatusCode::SERVICE_UNAVAILABLE, "restoring state\n").into_response();
    }
    let provider = s.engine.provider();
    match provider.list().await {
        // Degraded still serves: ready, and saying why it is degraded.
        Ok(_) => match provider.degraded() {
            Some(why) => (StatusCode::OK, format!("ready, degraded: {why}\n")).into_response(),
            None => (StatusCode::OK, "ready\n").into_response(),
        },
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("provider: {e}\n")).into_response(),
    }
}

/// A count as a gauge value (counts never reach `i64::MAX`; saturate if so).
fn gauge(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}
