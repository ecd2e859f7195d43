//! The operator's process: the Kubernetes client, the watches of Nodes and
//! NetResourceSets, the leader lease, the resync loop and the health and
//! metrics endpoint. The only module that talks to the API server.
//!
//! Invariants:
//! - Every replica keeps its caches warm (both watches run always), so a
//!   follower that becomes leader resyncs at once from a full view.
//! - Only the leader resyncs, and its [`Leadership`] (the lease manager's
//!   flag and the leader deadline read from the Lease, see
//!   [`crate::leader`]) is checked again before every cloud call and write
//!   ([`crate::store::Store::leadership`]): leadership can move in the
//!   middle of a resync. A pass still running when leadership is lost
//!   (its deadline passed) is abandoned, as at SIGTERM, so no further call
//!   of it is sent; its intents are left for the next leader. A deposed
//!   leader cut off from the API server therefore stops calling the cloud
//!   before a follower can take over, whatever the lease manager's flag
//!   (which it cannot lower without the API server) says.
//! - The operator writes spec and metadata under `enim-operator`; the
//!   agents' status is never part of what it applies.
//! - Nodes are cached without their status and managed fields: at 1,000
//!   nodes a full Node is tens of KiB, most of it images and conditions the
//!   operator never reads.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use async_trait::async_trait;
use enim_crd::{NetResourceSet, NetResourceSetSpec, FINALIZER, OPERATOR_MANAGER};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::{self, reflector, Store as Cache};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, Resource, ResourceExt};
use tokio::sync::{watch, Notify};

use crate::index::{ClaimInfo, NodeInfo, SetInfo};
use crate::leader::{self, Leadership};
use crate::store::{Store, StoreError};

/// The label the kubelet sets from the cloud's instance type.
pub const LABEL_INSTANCE_TYPE: &str = "node.kubernetes.io/instance-type";
/// The label the kubelet (or cloud controller) sets from the zone.
pub const LABEL_ZONE: &str = "topology.kubernetes.io/zone";

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("Kubernetes client: {0}")]
    Client(#[source] kube::Error),
    #[error("leader lease {name} in {namespace}: {source}")]
    Lease {
        name: String,
        namespace: String,
        #[source]
        source: kube_lease_manager::LeaseManagerError,
    },
    #[error("{0}")]
    Setup(String),
    #[error("health endpoint {addr}: {source}")]
    Health {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// How the process runs (command line; the policy is the allocator's).
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// The namespace of the leader Lease (the operator's own).
    pub namespace: String,
    pub lease_name: String,
    /// This replica's name in the Lease (its pod name).
    pub identity: String,
    /// A leader that has not renewed for this long loses the lease; a
    /// follower takes over within it (plus one renew period).
    pub lease_duration: Duration,
    /// The leader renews this long before its lease would expire; half of
    /// it is the leader deadline's margin ([`crate::leader::margin`]).
    pub lease_grace: Duration,
    /// A resync runs at least this often while leading.
    pub resync_interval: Duration,
    /// Changes seen by the watches within this window share one resync.
    pub debounce: Duration,
    /// `/healthz`, `/readyz` and `/metrics`.
    pub health_addr: SocketAddr,
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
        claims: Option<Vec<ClaimInfo>>,
    ) -> Result<String, String>;

    /// This replica stopped leading (perhaps mid-pass): whatever it cached
    /// of the cluster may be stale by the time it leads again.
    fn deposed(&self);
}

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

/// [`Store`] over the API server.
pub struct KubeStore {
    api: Api<NetResourceSet>,
    leadership: Leadership,
}

impl KubeStore {
    pub fn new(client: Client, leadership: Leadership) -> KubeStore {
        KubeStore {
            api: Api::all(client),
            leadership,
        }
    }
}

fn api_error(name: &str, e: kube::Error) -> StoreError {
    match &e {
        kube::Error::Api(s) if s.code == 409 || s.code == 404 => {
            StoreError::Conflict(format!("{name}: {e}"))
        }
        _ => StoreError::Api(format!("{name}: {e}")),
    }
}

/// The object the operator applies for `node`: its spec, owned by the
/// Node (the garbage collector marks it deleted when the Node goes) and
/// held by the finalizer until its ENIs are released.
pub fn applied_set(node: &NodeInfo, spec: &NetResourceSetSpec) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "enim.io/v1alpha1",
        "kind": "NetResourceSet",
        "metadata": {
            "name": node.name,
            "finalizers": [FINALIZER],
            "ownerReferences": [{
                "apiVersion": "v1",
                "kind": "Node",
                "name": node.name,
                "uid": node.uid,
            }],
        },
        "spec": spec,
    })
}

#[async_trait]
impl Store for KubeStore {
    async fn apply_spec(
        &self,
        node: &NodeInfo,
        spec: &NetResourceSetSpec,
    ) -> Result<(), StoreError> {
        self.leadership()?;
        let params = PatchParams::apply(OPERATOR_MANAGER).force();
        self.api
            .patch(&node.name, &params, &Patch::Apply(applied_set(node, spec)))
            .await
            .map_err(|e| api_error(&node.name, e))?;
        Ok(())
    }

    async fn release_set(&self, name: &str) -> Result<(), StoreError> {
        self.leadership()?;
        let set = match self.api.get_opt(name).await {
            Ok(Some(set)) => set,
            Ok(None) => return Ok(()),
            Err(e) => return Err(api_error(name, e)),
        };
        let finalizers = set.finalizers();
        if !finalizers.iter().any(|f| f == FINALIZER) {
            return Ok(());
        }
        let kept: Vec<&String> = finalizers.iter().filter(|f| *f != FINALIZER).collect();
        // "test" first: a finalizer added since the read is never dropped.
        let patch: json_patch::Patch = serde_json::from_value(serde_json::json!([
            { "op": "test", "path": "/metadata/finalizers", "value": finalizers },
            { "op": "replace", "path": "/metadata/finalizers", "value": kept },
        ]))
        .expect("a well-formed JSON patch");
        self.api
            .patch(name, &PatchParams::default(), &Patch::<()>::Json(patch))
            .await
            .map_err(|e| api_error(name, e))?;
        Ok(())
    }

    fn is_leader(&self) -> bool {
        self.leadership.check().is_ok()
    }

    fn leadership(&self) -> Result<(), StoreError> {
        self.leadership.check().map(|_deadline| ())
    }
}

/// A Node as the operator reads it.
pub fn node_info(node: &Node) -> NodeInfo {
    let label = |key: &str| node.labels().get(key).cloned().unwrap_or_default();
    NodeInfo {
        name: node.name_any(),
        uid: node.uid().unwrap_or_default(),
        provider_id: node
            .spec
            .as_ref()
            .and_then(|s| s.provider_id.clone())
            .unwrap_or_default(),
        instance_type: label(LABEL_INSTANCE_TYPE),
        zone: label(LABEL_ZONE),
    }
}

/// A NetResourceSet as the operator reads it.
pub fn set_info(set: &NetResourceSet) -> SetInfo {
    SetInfo {
        name: set.name_any(),
        spec: set.spec.clone(),
        status: set.status.clone(),
        deleting_since: set
            .meta()
            .deletion_timestamp
            .as_ref()
            .map(|t| SystemTime::from(t.0)),
    }
}

/// The watches' retry delays: 500 ms doubling to 5 s, jittered. kube's
/// default grows to 30 s, so after an API server outage the caches (and
/// with them new nodes' ENIs) stayed stale for ~25 s after it was back.
struct WatchBackoff(enim_provider::retry::Delays);

impl WatchBackoff {
    fn new() -> WatchBackoff {
        let policy =
            enim_provider::retry::Backoff::new(Duration::from_millis(500), Duration::from_secs(5));
        WatchBackoff(policy.delays())
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;
    fn next(&mut self) -> Option<Duration> {
        Some(self.0.next_delay())
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.0.reset();
    }
}

/// Drops what the operator never reads from a Node before it is cached.
fn slim_node(node: &mut Node) {
    node.status = None;
    node.metadata.managed_fields = None;
    node.metadata.annotations = None;
}

/// The DeviceClass of the DRA driver's ENIs (deploy/06-deviceclass.yaml).
pub const DEVICE_CLASS: &str = "eni.enim.io";
/// The DRA driver, whose opaque config carries [`enim_crd::EniParameters`].
pub const DRA_DRIVER: &str = "enim.io";

/// A ResourceClaim as the operator sees it: `None` unless one of its
/// requests is for [`DEVICE_CLASS`]. Parameters that do not parse ask for
/// nothing (and say why in the log): a stranger's object never stops a
/// resync.
pub fn claim_info(rc: &ResourceClaim) -> Option<ClaimInfo> {
    let devices = rc.spec.devices.as_ref()?;
    let ours = devices.requests.iter().flatten().any(|r| {
        let exact = r
            .exactly
            .as_ref()
            .is_some_and(|e| e.device_class_name == DEVICE_CLASS);
        let any_of = r
            .first_available
            .iter()
            .flatten()
            .any(|s| s.device_class_name == DEVICE_CLASS);
        exact || any_of
    });
    if !ours {
        return None;
    }
    let name = || format!("{}/{}", rc.namespace().unwrap_or_default(), rc.name_any());
    let want = devices
        .config
        .iter()
        .flatten()
        .filter_map(|c| c.opaque.as_ref())
        .find(|o| o.driver == DRA_DRIVER)
        .and_then(|o| {
            match serde_json::from_value::<enim_crd::EniParameters>(o.parameters.0.clone()) {
                Ok(p) => Some(p),
                Err(e) => {
                    tracing::warn!(claim = %name(), error = %e, "claim's enim.io parameters ignored");
                    None
                }
            }
        });
    Some(ClaimInfo {
        claim: enim_crd::ClaimRef {
            namespace: rc.namespace().unwrap_or_default(),
            name: rc.name_any(),
            uid: rc.uid().unwrap_or_default(),
        },
        pending: rc
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .is_none(),
        want,
    })
}

/// The watches, kept running on every replica; `changed` fires on every
/// event.
struct Caches {
    nodes: Cache<Node>,
    sets: Cache<NetResourceSet>,
    /// ResourceClaims (DRA): known once listed; a cluster without
    /// resource.k8s.io/v1, or an operator not allowed to list them, runs
    /// without claims.
    claims: Cache<ResourceClaim>,
}

fn start_watches(client: &Client, changed: Arc<Notify>) -> Caches {
    let (nodes, node_writer) = reflector::store();
    let (sets, set_writer) = reflector::store();
    let (claims, claim_writer) = reflector::store();
    let claim_stream = reflector(
        claim_writer,
        watcher(
            Api::<ResourceClaim>::all(client.clone()),
            watcher::Config::default(),
        )
        .backoff(WatchBackoff::new())
        .modify(|c: &mut ResourceClaim| c.metadata.managed_fields = None),
    );
    let node_stream = reflector(
        node_writer,
        watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
            .backoff(WatchBackoff::new())
            .modify(slim_node),
    );
    let set_stream = reflector(
        set_writer,
        watcher(
            Api::<NetResourceSet>::all(client.clone()),
            watcher::Config::default(),
        )
        .backoff(WatchBackoff::new()),
    );
    for (what, stream) in [
        ("nodes", node_stream.map_ok(|_| ()).boxed()),
        ("netresourcesets", set_stream.map_ok(|_| ()).boxed()),
        ("resourceclaims", claim_stream.map_ok(|_| ()).boxed()),
    ] {
        let changed = changed.clone();
        tokio::spawn(async move {
            let mut stream = stream;
            while let Some(event) = stream.next().await {
                match event {
                    Ok(()) => changed.notify_one(),
                    Err(e) => tracing::warn!(watch = what, error = %e, "watch failed; retrying"),
                }
            }
        });
    }
    Caches {
        nodes,
        sets,
        claims,
    }
}

/// Follows the leader Lease (a watch of that one object) and publishes
/// the deadline it gives `identity` ([`leader::deadline_of`]): `None`
/// while another replica or nobody holds it. A failed watch keeps the last
/// deadline, which then runs out: a replica cut off from the API server
/// stops leading by itself.
fn follow_lease(
    client: &Client,
    config: &RuntimeConfig,
    margin: Duration,
) -> watch::Receiver<Option<Instant>> {
    let (deadline, rx) = watch::channel(None);
    let api: Api<Lease> = Api::namespaced(client.clone(), &config.namespace);
    // A consistent read on (re)list: a cache's older renewal would only
    // give an earlier deadline, but for nothing.
    let watch = watcher::Config::default()
        .fields(&format!("metadata.name={}", config.lease_name))
        .list_semantic(watcher::ListSemantic::MostRecent);
    let stream = watcher(api, watch).backoff(WatchBackoff::new());
    let identity = config.identity.clone();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        // A relist that shows no Lease: it is gone.
        let mut listed = false;
        while let Some(event) = stream.next().await {
            let seen = match event {
                Ok(watcher::Event::Apply(lease) | watcher::Event::InitApply(lease)) => {
                    listed = true;
                    leader::deadline_of(
                        &lease,
                        &identity,
                        margin,
                        SystemTime::now(),
                        Instant::now(),
                    )
                }
                Ok(watcher::Event::Delete(_)) => None,
                Ok(watcher::Event::Init) => {
                    listed = false;
                    continue;
                }
                Ok(watcher::Event::InitDone) if !listed => None,
                Ok(watcher::Event::InitDone) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "lease watch failed; retrying (the leader deadline runs on)");
                    continue;
                }
            };
            deadline.send_replace(seen);
        }
    });
    rx
}

/// Runs the operator until SIGTERM (or ctrl-c): watches, lease, resyncs.
/// `make` builds the resync over the store the runtime writes through.
pub async fn run<F>(config: RuntimeConfig, client: Client, make: F) -> Result<(), RuntimeError>
where
    F: FnOnce(Arc<dyn Store>) -> Result<Arc<dyn Resync>, String>,
{
    // First, so that a SIGTERM during start-up is a clean stop, not the
    // default action's death.
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    let health = Arc::new(Health::default());
    let listener = tokio::net::TcpListener::bind(config.health_addr)
        .await
        .map_err(|source| RuntimeError::Health {
            addr: config.health_addr,
            source,
        })?;
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "serving /healthz, /readyz and /metrics");
    }

    let secs = |d: Duration| d.as_secs().max(1);
    let grace = Duration::from_secs(secs(config.lease_grace));
    let deadline = follow_lease(&client, &config, leader::margin(grace));
    // The health endpoint reads the deadline only: a clone of the lease
    // manager's flag held there would keep the lease from being released
    // at the stop.
    tokio::spawn(serve_health(listener, health.clone(), deadline.clone()));

    let changed = Arc::new(Notify::new());
    let caches = start_watches(&client, changed.clone());

    let lease_err = |source| RuntimeError::Lease {
        name: config.lease_name.clone(),
        namespace: config.namespace.clone(),
        source,
    };
    let manager = kube_lease_manager::LeaseManagerBuilder::new(client.clone(), &config.lease_name)
        .with_namespace(&config.namespace)
        .with_identity(&config.identity)
        .with_duration(secs(config.lease_duration))
        .with_grace(grace.as_secs())
        .with_field_manager(format!("{OPERATOR_MANAGER}-lease"))
        .build()
        .await
        .map_err(lease_err)?;
    let (flag, lease_task) = manager.watch().await;
    let leadership = Leadership::new(flag, deadline);
    let store: Arc<dyn Store> = Arc::new(KubeStore::new(client.clone(), leadership.clone()));
    let resync = make(store.clone()).map_err(RuntimeError::Setup)?;

    let mut was_leader = false;
    loop {
        let lead = leadership.check();
        let is_leader = lead.is_ok();
        health.leader.store(is_leader, Ordering::Relaxed);
        if is_leader != was_leader {
            match &lead {
                Ok(_) => {
                    tracing::info!(identity = %config.identity, leader = true, "leadership changed")
                }
                Err(e) => {
                    tracing::warn!(identity = %config.identity, leader = false, reason = %e, "leadership changed");
                    if matches!(e, StoreError::PastDeadline(_)) {
                        health.deadline_misses.fetch_add(1, Ordering::Relaxed);
                    }
                    resync.deposed();
                }
            }
            was_leader = is_leader;
        }
        let pass = async {
            let synced = caches.nodes.wait_until_ready().await.is_ok()
                && caches.sets.wait_until_ready().await.is_ok();
            health.synced.store(synced, Ordering::Relaxed);
            if is_leader && synced {
                resync_once(&*resync, &caches, &health).await;
            }
        };
        // A stop does not wait for the caches (the API server may be down)
        // or for a resync (its cloud calls may wait on the buckets): what a
        // resync leaves half done is what a crash leaves, and its intents
        // let the next leader finish it. Nor does a lost leadership: past
        // the deadline a follower may lead, and the pass's next call (a
        // retry or the second step of a create or delete included) must
        // not be sent. Biased: at the deadline, no further poll of the pass.
        tokio::select! {
            biased;
            () = &mut shutdown => {
                tracing::info!("stopping mid-pass: the next leader finishes from the intents");
                break;
            }
            () = leadership.lost(), if is_leader => {
                tracing::warn!("leadership lost mid-pass: the pass is abandoned, its intents left for the next leader");
                continue;
            }
            () = pass => {}
        }
        tokio::select! {
            biased;
            () = &mut shutdown => break,
            r = leadership.flipped(is_leader) => if r.is_err() { break },
            _ = changed.notified() => tokio::time::sleep(config.debounce).await,
            _ = tokio::time::sleep(config.resync_interval) => {}
        }
    }
    // Dropping the receivers makes the lease manager release the lease, so
    // the follower takes over at once instead of after its expiry.
    drop(resync);
    drop(store);
    drop(leadership);
    let _ = tokio::time::timeout(Duration::from_secs(5), lease_task).await;
    tracing::info!("stopped");
    Ok(())
}

/// Resolves at SIGTERM or ctrl-c. The handlers are installed when this is
/// called, not when it is first polled.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let term = signal(SignalKind::terminate());
    let interrupt = signal(SignalKind::interrupt());
    async move {
        match (term, interrupt) {
            (Ok(mut term), Ok(mut interrupt)) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = interrupt.recv() => {}
                }
            }
            (Err(e), _) | (_, Err(e)) => {
                tracing::error!(error = %e, "no signal handler: the operator stops only when killed");
                std::future::pending::<()>().await;
            }
        }
    }
}

async fn resync_once(resync: &dyn Resync, caches: &Caches, health: &Health) {
    let nodes: Vec<NodeInfo> = caches.nodes.state().iter().map(|n| node_info(n)).collect();
    let sets: Vec<SetInfo> = caches.sets.state().iter().map(|s| set_info(s)).collect();
    // Known only once listed: before, every claim would look gone.
    let claims = futures::FutureExt::now_or_never(caches.claims.wait_until_ready())
        .is_some_and(|r| r.is_ok())
        .then(|| {
            caches
                .claims
                .state()
                .iter()
                .filter_map(|c| claim_info(c))
                .collect::<Vec<_>>()
        });
    let started = Instant::now();
    let result = resync.resync(nodes, sets, claims).await;
    let took = started.elapsed();
    health.resyncs.fetch_add(1, Ordering::Relaxed);
    health.last_resync_us.store(
        u64::try_from(took.as_micros()).unwrap_or(u64::MAX),
        Ordering::Relaxed,
    );
    match result {
        Ok(summary) => tracing::info!(took = ?took, "resync: {summary}"),
        Err(e) => {
            health.resync_errors.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(took = ?took, error = %e, "resync failed");
        }
    }
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

async fn serve_health(
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

#[async_trait]
impl Resync for crate::allocator::Allocator {
    async fn resync(
        &self,
        nodes: Vec<NodeInfo>,
        sets: Vec<SetInfo>,
        claims: Option<Vec<ClaimInfo>>,
    ) -> Result<String, String> {
        let r = self
            .resync_with_claims(&nodes, &sets, claims.as_deref())
            .await
            .map_err(|e| e.to_string())?;
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
            Err(format!("{summary}; errors: {}", r.errors.join("; ")))
        }
    }

    fn deposed(&self) {
        self.forget();
    }
}
