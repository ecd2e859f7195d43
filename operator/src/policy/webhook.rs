//! The mutating admission webhook's server: HTTPS on every replica (not
//! only the leader), `POST /mutate-pods`, AdmissionReview v1 in and out.
//! Each replica decides from its own watches of EniPolicies and
//! Namespaces ([`ClusterView`]), so that any replica can answer.

use std::collections::BTreeMap;
use std::sync::Arc;

use enim_crd::EniPolicy;
use futures::StreamExt;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, ResourceExt};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use super::admit::{admit, Cluster};
use super::DefaultPolicy;
use crate::index::PoolPolicy;

/// The path the MutatingWebhookConfiguration calls.
pub const PATH: &str = "/mutate-pods";
/// The largest AdmissionReview read: a pod is far smaller.
const MAX_BODY: usize = 4 << 20;

#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("webhook: the watch of {0} never listed")]
    NotReady(&'static str),
    #[error("webhook: {0}")]
    Io(#[from] std::io::Error),
}

/// What a replica knows to decide: the cluster's EniPolicies and
/// Namespaces as its watches last saw them, and the cluster default.
#[derive(Clone)]
pub struct ClusterView {
    policies: Store<EniPolicy>,
    namespaces: Store<Namespace>,
    pub default: DefaultPolicy,
    /// The operator's node pools (its config's, fixed for the process).
    pub pools: Arc<[PoolPolicy]>,
}

impl ClusterView {
    /// Starts the watches and waits for their first listing; they run
    /// until the returned task is aborted.
    pub async fn watch(
        client: Client,
        default: DefaultPolicy,
        pools: Arc<[PoolPolicy]>,
    ) -> Result<(ClusterView, tokio::task::JoinHandle<()>), WebhookError> {
        let (policies, policy_writer) = reflector::store();
        let (namespaces, namespace_writer) = reflector::store();
        let policy_stream = reflector::reflector(
            policy_writer,
            watcher(
                Api::<EniPolicy>::all(client.clone()),
                watcher::Config::default(),
            ),
        )
        .default_backoff()
        .applied_objects();
        let namespace_stream = reflector::reflector(
            namespace_writer,
            watcher(Api::<Namespace>::all(client), watcher::Config::default()),
        )
        .default_backoff()
        .applied_objects();
        let task = tokio::spawn(async move {
            // Errors are retried by the backoff; the stores are what matter.
            let policies = policy_stream.for_each(|_| async {});
            let namespaces = namespace_stream.for_each(|_| async {});
            tokio::join!(policies, namespaces);
        });
        policies
            .wait_until_ready()
            .await
            .map_err(|_| WebhookError::NotReady("EniPolicies"))?;
        namespaces
            .wait_until_ready()
            .await
            .map_err(|_| WebhookError::NotReady("Namespaces"))?;
        Ok((
            ClusterView {
                policies,
                namespaces,
                default,
                pools,
            },
            task,
        ))
    }

    /// The policies as last seen (the leader's status writer reads them
    /// too).
    pub fn policies(&self) -> Vec<EniPolicy> {
        self.policies
            .state()
            .iter()
            .map(|p| (**p).clone())
            .collect()
    }

    /// The namespaces as last seen, with their labels (the leader keeps
    /// claim templates in those a policy selects).
    pub fn namespaces(&self) -> Vec<(String, BTreeMap<String, String>)> {
        self.namespaces
            .state()
            .iter()
            .filter(|n| n.metadata.deletion_timestamp.is_none())
            .map(|n| (n.name_any(), n.labels().clone()))
            .collect()
    }

    /// The response to one request body.
    pub fn review(&self, body: &[u8]) -> AdmissionReview<kube::core::DynamicObject> {
        let request: Result<AdmissionRequest<Pod>, String> =
            serde_json::from_slice::<AdmissionReview<Pod>>(body)
                .map_err(|e| e.to_string())
                .and_then(|r| r.try_into().map_err(|e| format!("{e}")));
        let response = match request {
            Err(why) => {
                AdmissionResponse::invalid(format!("not an AdmissionReview of a pod: {why}"))
            }
            Ok(req) => {
                let empty = BTreeMap::new();
                let namespace = req
                    .namespace
                    .as_deref()
                    .and_then(|ns| self.namespaces.get(&ObjectRef::new(ns)));
                let labels = namespace
                    .as_ref()
                    .and_then(|ns| ns.metadata.labels.as_ref())
                    .unwrap_or(&empty);
                let policies = self.policies.state();
                admit(
                    &req,
                    Cluster {
                        policies: &policies,
                        namespace_labels: labels,
                        default: self.default,
                        pools: &self.pools,
                    },
                )
            }
        };
        response.into_review()
    }
}

/// What the webhook server counts (the operator's `/metrics`).
#[derive(Clone, Debug)]
pub struct WebhookMetrics {
    /// Each review's time, from its request head to its answer (the body
    /// read, decoded, judged, the answer encoded).
    pub reviews: Histogram,
    /// Connections whose TLS handshake succeeded: an API server that keeps
    /// its connections makes few, so each review pays no handshake.
    pub connections: Counter,
}

impl WebhookMetrics {
    pub fn new() -> Self {
        WebhookMetrics {
            // 50 µs to ~0.4 s, doubling: a review takes well under a
            // millisecond; the tail is what the buckets must show.
            reviews: Histogram::new(exponential_buckets(0.000_05, 2.0, 14)),
            connections: Counter::default(),
        }
    }
}

impl Default for WebhookMetrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Serves the webhook on `listener` until `stop` turns true; each
/// handshake takes the resolver's current certificate. What it serves is
/// counted in `metrics`.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    view: ClusterView,
    metrics: WebhookMetrics,
    mut stop: watch::Receiver<bool>,
) -> Result<(), WebhookError> {
    let acceptor = TlsAcceptor::from(tls);
    let view = Arc::new(view);
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => accepted?,
            () = stopped(&mut stop) => return Ok(()),
        };
        let acceptor = acceptor.clone();
        let view = view.clone();
        let metrics = metrics.clone();
        let mut stop = stop.clone();
        tokio::spawn(async move {
            let tls = match acceptor.accept(tcp).await {
                Ok(tls) => tls,
                Err(e) => {
                    tracing::debug!(%peer, error = %e, "webhook: TLS handshake failed");
                    return;
                }
            };
            metrics.connections.inc();
            let reviews = metrics.reviews;
            let service = hyper::service::service_fn(move |req| {
                let view = view.clone();
                let reviews = reviews.clone();
                async move {
                    let began = std::time::Instant::now();
                    let answer = handle(&view, req).await;
                    reviews.observe(began.elapsed().as_secs_f64());
                    Ok::<_, std::convert::Infallible>(answer)
                }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tls), service);
            tokio::pin!(conn);
            // A stopped server keeps no kept-alive connection open: the API
            // server must not be answered by a server that was stopped.
            let ended = tokio::select! {
                ended = conn.as_mut() => ended,
                () = stopped(&mut stop) => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(e) = ended {
                tracing::debug!(%peer, error = %e, "webhook: connection ended");
            }
        });
    }
}

/// Returns once `stop` is true (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

async fn handle(view: &ClusterView, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, body: Vec<u8>| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = status;
        r.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("application/json"),
        );
        r
    };
    if req.method() != Method::POST || req.uri().path() != PATH {
        return reply(StatusCode::NOT_FOUND, b"{}".to_vec());
    }
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return reply(StatusCode::BAD_REQUEST, format!("{e}").into_bytes()),
    };
    let review = view.review(&body);
    match serde_json::to_vec(&review) {
        Ok(json) => reply(StatusCode::OK, json),
        Err(e) => reply(
            StatusCode::INTERNAL_SERVER_ERROR,
            e.to_string().into_bytes(),
        ),
    }
}
