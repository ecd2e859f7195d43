//! `/healthz`, `/readyz` and `/metrics`: what [`Health`] counts, and the
//! leader deadline as the Lease watch gives it. Readiness is the caches'
//! (a follower is ready too); the endpoint only reads, so a stop or a
//! lost lease never waits on it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

/// What the health endpoint shows.
#[derive(Debug, Default)]
pub struct Health {
    pub synced: AtomicBool,
    /// Leading: the lease manager's flag and the deadline not passed.
    pub leader: AtomicBool,
    /// Times leadership was lost to the deadline (the Lease not renewed
    /// in time), not to another holder.
    pub deadline_misses: AtomicU64,
    pub resyncs: AtomicU64,
    pub resync_errors: AtomicU64,
    /// Microseconds the last resync took.
    pub last_resync_us: AtomicU64,
}

/// The time left before the leader deadline, while leading.
fn deadline_left(h: &Health, deadline: &watch::Receiver<Option<Instant>>) -> Option<Duration> {
    let d = (*deadline.borrow())?;
    h.leader
        .load(Ordering::Relaxed)
        .then(|| d.saturating_duration_since(Instant::now()))
}

/// One line on leadership for `/readyz`.
fn leadership_line(h: &Health, deadline: &watch::Receiver<Option<Instant>>) -> String {
    let now = Instant::now();
    match (h.leader.load(Ordering::Relaxed), *deadline.borrow()) {
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

pub(super) async fn serve_health(
    listener: tokio::net::TcpListener,
    health: Arc<Health>,
    deadline: watch::Receiver<Option<Instant>>,
) {
    use axum::routing::get;
    let metrics = |h: Arc<Health>, deadline: watch::Receiver<Option<Instant>>| async move {
        let mut m = BTreeMap::new();
        let g = |a: &AtomicBool| u64::from(a.load(Ordering::Relaxed)).to_string();
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed).to_string();
        m.insert("enim_operator_leader", g(&h.leader));
        // Seconds before this leader stops calling the cloud unless the
        // Lease is renewed; 0 when not leading.
        let left = deadline_left(&h, &deadline).unwrap_or_default();
        m.insert(
            "enim_operator_leader_deadline_seconds",
            format!("{:.3}", left.as_secs_f64()),
        );
        m.insert(
            "enim_operator_leader_deadline_misses_total",
            n(&h.deadline_misses),
        );
        m.insert("enim_operator_caches_synced", g(&h.synced));
        m.insert("enim_operator_resyncs_total", n(&h.resyncs));
        m.insert("enim_operator_resync_errors_total", n(&h.resync_errors));
        m.insert(
            "enim_operator_last_resync_microseconds",
            n(&h.last_resync_us),
        );
        m.iter()
            .map(|(k, v)| format!("{k} {v}\n"))
            .collect::<String>()
    };
    // Readiness is the caches' (a follower is ready too); the body also
    // says where leadership stands.
    let ready = |h: Arc<Health>, deadline: watch::Receiver<Option<Instant>>| async move {
        let lead = leadership_line(&h, &deadline);
        if h.synced.load(Ordering::Relaxed) {
            (axum::http::StatusCode::OK, format!("ok\n{lead}\n"))
        } else {
            (
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                format!("caches not synced\n{lead}\n"),
            )
        }
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
