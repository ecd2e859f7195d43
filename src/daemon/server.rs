//! The agent's HTTP/JSON API (routes in [`enim_api`]) on its unix socket.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::connect_info::{ConnectInfo, Connected};
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use enim_api::model::{AttachmentKey, AttachmentResult};
use enim_api::{code, ApiError, AttachmentRequest, EniList, GcRequest};
use enim_core::ProviderError;
use tokio::net::UnixListener;
use tokio::sync::watch;

use crate::engine::{Driver, Engine, EngineError};

/// The credentials of the process at the other end of a connection, read
/// by the kernel (SO_PEERCRED) when the connection was accepted.
#[derive(Debug, Clone, Copy)]
pub struct PeerCred {
    pub uid: Option<u32>,
}

impl Connected<axum::serve::IncomingStream<'_, UnixListener>> for PeerCred {
    fn connect_info(stream: axum::serve::IncomingStream<'_, UnixListener>) -> Self {
        PeerCred {
            uid: stream.io().peer_cred().ok().map(|c| c.uid()),
        }
    }
}

pub struct AppState<D: Driver> {
    pub engine: Arc<Engine<D>>,
    /// What the node can hold (`GET /v1/devices`, the device plugin); told
    /// after every verb that may change it.
    pub devices: Arc<crate::daemon::devices::EngineDevices>,
    /// Whether enimd serves the kubelet itself (`[device_plugin] enabled`).
    pub in_process_plugin: bool,
    /// Whether enimd hands its ENIs out through DRA (`[dra] enabled`).
    pub dra: bool,
    pub ready: watch::Receiver<bool>,
    pub allowed_uids: Vec<u32>,
    pub startup_wait: Duration,
    pub gc_grace: Duration,
    pub allocation_expiry: Duration,
    pub metrics: Arc<crate::daemon::metrics::Metrics>,
    /// Operations in flight, for trimming the heap after bursts.
    pub heap: Arc<crate::daemon::heap::Trimmer>,
    pub started: Instant,
    /// A refused ADD is told on its pod (queued, never awaited).
    pub events: Arc<crate::daemon::events::AgentEvents>,
}

/// A handler's error: an HTTP status and the CNI-coded body.
pub struct Failure(StatusCode, ApiError);

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        (self.0, Json(self.1)).into_response()
    }
}

impl From<EngineError> for Failure {
    fn from(e: EngineError) -> Self {
        let (status, code) = classify(&e);
        Failure(status, ApiError::new(code, e.to_string()))
    }
}

fn classify(e: &EngineError) -> (StatusCode, u32) {
    match e {
        EngineError::InvalidRequest(_) | EngineError::Netns(_) => {
            (StatusCode::BAD_REQUEST, code::INVALID_ENV)
        }
        EngineError::Provider(p)
            if p.is_transient() || matches!(p, ProviderError::Exhausted { .. }) =>
        {
            (StatusCode::SERVICE_UNAVAILABLE, code::TRY_AGAIN_LATER)
        }
        EngineError::Provider(_) => (StatusCode::INTERNAL_SERVER_ERROR, code::PROVIDER),
        // Another ENI may be freed, or the device's use may end.
        EngineError::DeviceRefused { .. } if e.is_transient() => {
            (StatusCode::SERVICE_UNAVAILABLE, code::TRY_AGAIN_LATER)
        }
        EngineError::DeviceRefused { .. } => (StatusCode::INTERNAL_SERVER_ERROR, code::PROVIDER),
        EngineError::DeviceMissing { .. } => {
            (StatusCode::INTERNAL_SERVER_ERROR, code::DEVICE_MISSING)
        }
        EngineError::IfnameConflict { .. } => (StatusCode::CONFLICT, code::IFNAME_CONFLICT),
        EngineError::Plumbing { .. } => (StatusCode::INTERNAL_SERVER_ERROR, code::KERNEL),
        EngineError::Checkpoint(_) => (StatusCode::INTERNAL_SERVER_ERROR, code::IO_FAILURE),
        EngineError::RollbackFailed { original, .. } => classify(original),
        EngineError::UnknownAttachment(_) => (StatusCode::NOT_FOUND, code::UNKNOWN_CONTAINER),
        EngineError::AttachmentConflict { .. } => (StatusCode::CONFLICT, code::ATTACHMENT_CONFLICT),
        EngineError::CheckFailed { .. } => (StatusCode::CONFLICT, code::CHECK_MISMATCH),
        EngineError::NoFreeAddress(_) => (StatusCode::SERVICE_UNAVAILABLE, code::TRY_AGAIN_LATER),
        EngineError::ServiceCidrsUnknown(_) => {
            (StatusCode::SERVICE_UNAVAILABLE, code::TRY_AGAIN_LATER)
        }
        EngineError::AddressStore(_) => (StatusCode::INTERNAL_SERVER_ERROR, code::INTERNAL),
        EngineError::Shared(e) => classify(e),
    }
}

type Shared<D> = Arc<AppState<D>>;

pub fn router<D: Driver>(state: Shared<D>) -> Router {
    Router::new()
        .route(enim_api::ROUTE_ADD, post(add::<D>))
        .route(enim_api::ROUTE_DEL, post(del::<D>))
        .route(enim_api::ROUTE_CHECK, post(check::<D>))
        .route(enim_api::ROUTE_GC, post(gc::<D>))
        .route(enim_api::ROUTE_ENIS, get(enis::<D>))
        .route(enim_api::ROUTE_ATTACHMENTS, get(attachments::<D>))
        .route(enim_api::ROUTE_STATUS, get(status::<D>))
        .route(enim_api::ROUTE_DEVICES, get(devices::<D>))
        .layer(middleware::from_fn_with_state(state.clone(), measure::<D>))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            authorize::<D>,
        ))
        .with_state(state)
}

/// Counts and times the attachment verbs by result, and tells the heap
/// trimmer when they run.
async fn measure<D: Driver>(
    State(state): State<Shared<D>>,
    request: Request,
    next: Next,
) -> Response {
    let verb = match request.uri().path() {
        enim_api::ROUTE_ADD => Some("ADD"),
        enim_api::ROUTE_DEL => Some("DEL"),
        enim_api::ROUTE_CHECK => Some("CHECK"),
        enim_api::ROUTE_GC => Some("GC"),
        _ => None,
    };
    let started = Instant::now();
    let _busy = verb.map(|_| state.heap.busy());
    let response = next.run(request).await;
    if let Some(verb) = verb {
        let ok = response.status().is_success();
        state.metrics.observe_request(verb, started, ok);
        // What the device list shows changes with GC and with a refused
        // ADD (an ENI set aside), not with an ADD, DEL or CHECK that did
        // its work: those leave every device as healthy as it was. The
        // refresher's own tick (every second) catches the rest, so the
        // common verbs do not pay for a host link dump after each reply.
        if verb == "GC" || !ok {
            state.devices.poke();
        }
    }
    response
}

/// Only root, or a uid the config allows, may use the API.
async fn authorize<D: Driver>(
    State(state): State<Shared<D>>,
    ConnectInfo(peer): ConnectInfo<PeerCred>,
    request: Request,
    next: Next,
) -> Response {
    match peer.uid {
        Some(0) => next.run(request).await,
        Some(uid) if state.allowed_uids.contains(&uid) => next.run(request).await,
        uid => {
            tracing::warn!(?uid, path = %request.uri().path(), "refused a caller not allowed by config");
            Failure(
                StatusCode::FORBIDDEN,
                ApiError::new(
                    code::FORBIDDEN,
                    format!(
                        "uid {} may not use enimd (root or allowed_uids only)",
                        uid.map_or("unknown".into(), |u| u.to_string())
                    ),
                ),
            )
            .into_response()
        }
    }
}

/// Requests that change state wait (bounded) for startup recovery.
async fn wait_ready<D: Driver>(state: &AppState<D>) -> Result<(), Failure> {
    let mut ready = state.ready.clone();
    if *ready.borrow() {
        return Ok(());
    }
    let became_ready = matches!(
        tokio::time::timeout(state.startup_wait, ready.wait_for(|r| *r)).await,
        Ok(Ok(_))
    );
    match became_ready {
        true => Ok(()),
        false => Err(Failure(
            StatusCode::SERVICE_UNAVAILABLE,
            ApiError::new(
                code::TRY_AGAIN_LATER,
                "enimd is still restoring its state; try again later",
            )
            .with_details(enim_api::STARTING),
        )),
    }
}

async fn add<D: Driver>(
    State(s): State<Shared<D>>,
    Json(req): Json<AttachmentRequest>,
) -> Result<Json<AttachmentResult>, Failure> {
    wait_ready(&s).await?;
    let owner = req.owner();
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    // The ADD runs in its own task, so a plugin that dies or hangs up
    // mid-request cannot cancel it half-way: a finished attachment nobody
    // claims expires cleanly, a half-built one would not.
    let task = {
        let engine = s.engine.clone();
        let owner = owner.clone();
        tokio::spawn(async move {
            let result = engine.add(&owner, &req.netns).await;
            let _ = done_tx.send(result.is_ok());
            result
        })
    };
    let mut unclaimed = UnclaimedGuard {
        state: s.clone(),
        key: AttachmentKey::of(&owner),
        done: Some(done_rx),
    };
    let result = task.await.map_err(|e| {
        Failure(
            StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::new(code::INTERNAL, format!("ADD task failed: {e}")),
        )
    })?;
    unclaimed.done = None; // answered: the caller gets the result
    if let Err(e) = &result {
        s.events.add_refused(&owner.pod, e, s.dra);
    }
    Ok(Json(result?))
}

/// Armed while an ADD is answered; if the request is dropped first (the
/// caller disconnected), the attachment is marked to expire unless the
/// runtime claims it.
struct UnclaimedGuard<D: Driver> {
    state: Shared<D>,
    key: AttachmentKey,
    done: Option<tokio::sync::oneshot::Receiver<bool>>,
}

impl<D: Driver> Drop for UnclaimedGuard<D> {
    fn drop(&mut self) {
        let Some(done) = self.done.take() else { return };
        let (state, key) = (self.state.clone(), self.key.clone());
        tokio::spawn(async move {
            if done.await == Ok(true) {
                if let Err(e) = state
                    .engine
                    .mark_unclaimed(&key, state.allocation_expiry)
                    .await
                {
                    tracing::error!(%key, error = %e, "could not mark an unclaimed attachment");
                }
            }
        });
    }
}

async fn del<D: Driver>(
    State(s): State<Shared<D>>,
    Json(req): Json<AttachmentRequest>,
) -> Result<Json<serde_json::Value>, Failure> {
    wait_ready(&s).await?;
    s.engine.del(&req.owner()).await?;
    Ok(Json(serde_json::json!({})))
}

async fn check<D: Driver>(
    State(s): State<Shared<D>>,
    Json(req): Json<AttachmentRequest>,
) -> Result<Json<AttachmentResult>, Failure> {
    wait_ready(&s).await?;
    Ok(Json(
        s.engine
            .check(&req.owner(), &req.netns, req.expected_mtu)
            .await?,
    ))
}

async fn gc<D: Driver>(
    State(s): State<Shared<D>>,
    Json(req): Json<GcRequest>,
) -> Result<Json<enim_api::GcReport>, Failure> {
    wait_ready(&s).await?;
    let report = s.engine.gc(&req, s.gc_grace).await;
    s.metrics.observe_gc(&report);
    Ok(Json(report))
}

async fn enis<D: Driver>(State(s): State<Shared<D>>) -> Result<Json<EniList>, Failure> {
    Ok(Json(EniList {
        enis: s.engine.enis().await?,
    }))
}

async fn attachments<D: Driver>(State(s): State<Shared<D>>) -> Json<enim_api::AttachmentList> {
    Json(enim_api::AttachmentList {
        attachments: s.engine.attachments().await,
    })
}

/// The device plugin's list; 503 until enimd has its first one (before
/// startup recovery is done it would be empty, and a kubelet told of no
/// devices rejects the pods it admits meanwhile).
async fn devices<D: Driver>(
    State(s): State<Shared<D>>,
) -> Result<Json<enim_api::DeviceList>, Failure> {
    use crate::deviceplugin::DeviceSource;
    let Some(devices) = s.devices.known() else {
        return Err(Failure(
            StatusCode::SERVICE_UNAVAILABLE,
            ApiError::new(
                code::TRY_AGAIN_LATER,
                "enimd does not know its device list yet (startup recovery); try again later",
            ),
        ));
    };
    Ok(Json(enim_api::DeviceList {
        resource_name: s.devices.resource_name(),
        in_process_plugin: s.in_process_plugin,
        dra: s.dra,
        devices,
    }))
}

async fn status<D: Driver>(State(s): State<Shared<D>>) -> Result<Json<enim_api::Status>, Failure> {
    let listed = s
        .engine
        .provider()
        .list()
        .await
        .map_err(EngineError::from)?;
    let ready = *s.ready.borrow();
    let provider = s.engine.provider();
    let serving = crate::daemon::note::judge(
        D::MODE,
        &listed,
        s.engine.address_stats().as_ref(),
        crate::daemon::note::growing(provider.as_ref(), D::MODE),
    );
    Ok(Json(enim_api::Status {
        version: env!("CARGO_PKG_VERSION").to_string(),
        ready,
        provider: s.engine.provider().name().to_string(),
        enis_total: listed.len(),
        enis_free: listed.iter().filter(|e| e.owner.is_none()).count(),
        attachments: s.engine.checkpoint().len().await,
        uptime_secs: s.started.elapsed().as_secs(),
        degraded: s.engine.provider().degraded(),
        addresses: s.engine.address_stats(),
        serving: Some(serving),
    }))
}
