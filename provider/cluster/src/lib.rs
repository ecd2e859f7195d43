//! The `cluster` provider: the node's agent serves the ENIs its
//! NetResourceSet lists (written by `enim-operator`, which holds the cloud
//! credentials) and writes who uses them into the object's status. The
//! agent holds no cloud credentials and makes no cloud call.
//!
//! Invariants:
//! - **Own node only.** The watch has the field selector
//!   `metadata.name=<node>`, and status is written to that name only.
//! - **ADD and DEL never wait on the API server.** Allocation and release
//!   serve from the last spec seen, in memory; ownership lives in the
//!   agent's checkpoint (the engine calls `restore` at start). A status
//!   write is queued, never awaited, so its failure never fails a pod.
//! - **Draining is a handshake.** An ENI (secondary mode: also an address)
//!   in `spec.draining` is never handed out; once nothing holds it, and in
//!   secondary mode once the agent's address store has let it go, it is
//!   listed in `status.released` for the operator to take.
//! - **The last spec survives the API server.** Each new spec is written
//!   atomically to the cache file before it is announced; an agent that
//!   starts while the API server is down serves from it. A cache that
//!   cannot be read is reported and ignored, never trusted in part.
//! - **Until a spec is known, nothing is handed out:** `allocate_next`
//!   answers `Unavailable` (CNI code 11, try again later).
//! - **Status writes are coalesced:** a change marks the status dirty; one
//!   writer waits `status_debounce`, then applies the whole current status
//!   (server-side apply on the status subresource, field manager
//!   [`enim_crd::AGENT_MANAGER`], forced), retrying with backoff until the
//!   API server takes it.

mod cache;
pub mod state;
mod sync;

pub use sync::AFTER_STATUS_WRITE;

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
pub use enim_core::Mode;
use enim_core::{Eni, EniOwner, ProviderError, StoredAddresses};
use enim_provider::{AddressFeed, EniProvider};
use serde::{Deserialize, Serialize};
use tokio::sync::{watch, Notify};

use state::{SeenSpec, State};

/// The cache file's name when the agent picks its place (beside its
/// checkpoint).
pub const CACHE_FILE: &str = "netresourceset.json";
/// The downward API's variable the DaemonSet sets to `spec.nodeName`.
pub const NODE_NAME_ENV: &str = "NODE_NAME";
/// The longest `status_debounce`: the operator waits on `status.released`.
pub const MAX_STATUS_DEBOUNCE: Duration = Duration::from_secs(10);

/// The `[provider]` table of `type = "cluster"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// This node's name, which its NetResourceSet bears.
    ///
    /// Default: env `NODE_NAME` (downward API: `spec.nodeName`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// A kubeconfig file to reach the API server with.
    ///
    /// Default: the pod's in-cluster ServiceAccount.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubeconfig: Option<PathBuf>,
    /// The last spec seen, served after a restart during an API outage.
    ///
    /// Default: `netresourceset.json` beside the checkpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<PathBuf>,
    /// How long changes gather before one status write; at most 10 s.
    #[serde(default = "default_debounce", with = "humantime_serde")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub status_debounce: Duration,
    /// The agent's DRA driver is on: its status says so (condition
    /// [`enim_crd::CONDITION_SERVES_CLAIMS`]). enimd fills it in from
    /// `[dra] enabled`; never read from the file.
    #[serde(skip)]
    pub serves_claims: bool,
}

fn default_debounce() -> Duration {
    Duration::from_millis(200)
}

impl ClusterConfig {
    /// A config for `node` with every default.
    pub fn for_node(node: &str) -> ClusterConfig {
        ClusterConfig {
            node_name: Some(node.to_string()),
            kubeconfig: None,
            cache: None,
            status_debounce: default_debounce(),
            serves_claims: false,
        }
    }

    /// Checks what can be checked before start (the environment aside).
    pub fn validate(&self) -> Result<(), ClusterError> {
        if let Some(node) = &self.node_name {
            check_node_name(node)?;
        }
        if self.status_debounce > MAX_STATUS_DEBOUNCE {
            return Err(ClusterError::Config(format!(
                "status_debounce ({:?}) must be at most {MAX_STATUS_DEBOUNCE:?}: the operator waits on the status",
                self.status_debounce
            )));
        }
        if self.cache.as_ref().is_some_and(|p| p.file_name().is_none()) {
            return Err(ClusterError::Config("cache must name a file".into()));
        }
        Ok(())
    }

    /// The node name: the config's, else `NODE_NAME`'s.
    pub fn node(&self) -> Result<String, ClusterError> {
        let node = match &self.node_name {
            Some(n) => n.clone(),
            None => std::env::var(NODE_NAME_ENV)
                .ok()
                .filter(|n| !n.is_empty())
                .ok_or(ClusterError::NoNodeName)?,
        };
        check_node_name(&node)?;
        Ok(node)
    }
}

/// A Node's name is a DNS subdomain (RFC 1123).
fn check_node_name(name: &str) -> Result<(), ClusterError> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        });
    if ok {
        Ok(())
    } else {
        Err(ClusterError::BadNodeName(name.to_string()))
    }
}

/// Everything that can go wrong in this provider.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("cluster provider: no node name: set [provider] node_name, or {NODE_NAME_ENV} (the DaemonSet sets it from spec.nodeName)")]
    NoNodeName,
    #[error("cluster provider: node name {0:?} is not a valid Node name (lower-case letters, digits, '-' and '.')")]
    BadNodeName(String),
    #[error("cluster provider: {0}")]
    Config(String),
    #[error("cluster provider: kubeconfig {path}: {source}")]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("cluster provider: in-cluster config: {0} (outside a pod, set [provider] kubeconfig)")]
    InCluster(#[source] kube::config::InClusterError),
    #[error("cluster provider: API client: {0}")]
    Client(#[source] kube::Error),
    #[error("cluster provider: cache {path}: {why}")]
    Cache { path: PathBuf, why: String },
}

impl From<ClusterError> for ProviderError {
    fn from(e: ClusterError) -> Self {
        ProviderError::Config(e.to_string())
    }
}

/// Where the served spec came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    None,
    Cache,
    Api,
}

/// What the provider knows of its link to the API server.
#[derive(Debug)]
struct Link {
    /// The last failure to reach it (or to have a write taken); `None`
    /// once it answered again.
    api_error: Option<String>,
    source: Source,
    /// Why the cache file was not used, if it was not.
    cache_error: Option<String>,
    /// The object was seen in the API (since start), or is gone from it.
    present: Option<bool>,
}

/// What the provider's tasks share with it.
struct Shared {
    node: String,
    cache: PathBuf,
    debounce: Duration,
    state: Mutex<State>,
    link: Mutex<Link>,
    /// Moves when what `list` shows may have changed.
    changes: watch::Sender<u64>,
    /// The status is out of date.
    dirty: Notify,
    /// The API server answered after a failure: retry a write now.
    api_back: Notify,
    writes: AtomicU64,
    /// The agent said once that the cluster's CRD lacks a status field.
    told_old_crd: std::sync::atomic::AtomicBool,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        // Every State method leaves it whole, so a panic elsewhere while
        // it was held does not make it unsound.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn link(&self) -> MutexGuard<'_, Link> {
        self.link.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A change for the status (and, with `listing`, for `list`).
    fn changed(&self, listing: bool) {
        if listing {
            self.changes.send_modify(|n| *n = n.wrapping_add(1));
        }
        self.dirty.notify_one();
    }

    fn reachable(&self) {
        let was_down = self.link().api_error.take().is_some();
        if was_down {
            tracing::info!(node = %self.node, "API server reachable again");
            self.api_back.notify_one();
        }
    }

    fn unreachable(&self, why: String) {
        let mut link = self.link();
        if link.api_error.is_none() {
            tracing::warn!(node = %self.node, error = %why, "API server unreachable: serving the last NetResourceSet seen");
        }
        link.api_error = Some(why);
    }
}

/// The cluster provider. Dropping it stops its watch and status writer.
pub struct ClusterProvider {
    shared: Arc<Shared>,
    mode: Mode,
    tasks: Vec<tokio::task::AbortHandle>,
}

impl Drop for ClusterProvider {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// A kube client from `config`'s kubeconfig, else in-cluster.
pub async fn client(config: &ClusterConfig) -> Result<kube::Client, ClusterError> {
    kube_client(config.kubeconfig.as_deref()).await
}

/// A kube client from `kubeconfig`, else in-cluster (the pod's
/// ServiceAccount token); enimd's DRA driver builds its client here too.
pub async fn kube_client(kubeconfig: Option<&Path>) -> Result<kube::Client, ClusterError> {
    let kube_config = match kubeconfig {
        Some(path) => {
            let bad = |source| ClusterError::Kubeconfig {
                path: path.to_path_buf(),
                source,
            };
            let kc = kube::config::Kubeconfig::read_from(path).map_err(bad)?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .map_err(bad)?
        }
        None => kube::Config::incluster().map_err(ClusterError::InCluster)?,
    };
    kube::Client::try_from(kube_config).map_err(ClusterError::Client)
}

impl ClusterProvider {
    /// An allocation's outcome: the status is told of a taken ENI, and an
    /// unavailable state says since when.
    fn allocated(&self, got: Result<Eni, ProviderError>) -> Result<Eni, ProviderError> {
        match got {
            Ok(eni) => {
                self.shared.changed(true);
                Ok(eni)
            }
            Err(ProviderError::Unavailable(why)) => Err(self.unavailable(why)),
            Err(e) => Err(e),
        }
    }

    /// Validates `config`, builds the client, loads the cache and starts
    /// the watch and the status writer. `mode` is the agent's.
    pub async fn start(
        config: &ClusterConfig,
        mode: Mode,
    ) -> Result<ClusterProvider, ClusterError> {
        config.validate()?;
        let node = config.node()?;
        let client = client(config).await?;
        let cache = config
            .cache
            .clone()
            .unwrap_or_else(|| Path::new("/var/lib/enim").join(CACHE_FILE));
        Ok(Self::with_client(
            client,
            node,
            cache,
            mode,
            config.status_debounce,
            config.serves_claims,
        ))
    }

    /// The provider over `client`, for `node`; `serves_claims`: the
    /// agent's DRA driver is on. Must run in a tokio runtime.
    pub fn with_client(
        client: kube::Client,
        node: String,
        cache: PathBuf,
        mode: Mode,
        debounce: Duration,
        serves_claims: bool,
    ) -> ClusterProvider {
        let mut state = State::new(mode).serving_claims(serves_claims);
        let mut link = Link {
            api_error: None,
            source: Source::None,
            cache_error: None,
            present: None,
        };
        match cache::load(&cache, &node) {
            Ok(Some(seen)) => {
                tracing::info!(node = %node, cache = %cache.display(), generation = ?seen.generation, "serving the cached NetResourceSet until the API server answers");
                state.apply(seen);
                link.source = Source::Cache;
            }
            Ok(None) => {}
            Err(e) => {
                tracing::error!(error = %e, "cache not used; the watch writes it again");
                link.cache_error = Some(e.to_string());
            }
        }
        let shared = Arc::new(Shared {
            node,
            cache,
            debounce,
            state: Mutex::new(state),
            link: Mutex::new(link),
            changes: watch::channel(0).0,
            dirty: Notify::new(),
            api_back: Notify::new(),
            writes: AtomicU64::new(0),
            told_old_crd: std::sync::atomic::AtomicBool::new(false),
        });
        let api: kube::Api<enim_crd::NetResourceSet> = kube::Api::all(client);
        let tasks = vec![
            tokio::spawn(sync::watch(shared.clone(), api.clone())).abort_handle(),
            tokio::spawn(sync::write_status(shared.clone(), api)).abort_handle(),
        ];
        ClusterProvider {
            shared,
            mode,
            tasks,
        }
    }

    pub fn node(&self) -> &str {
        &self.shared.node
    }

    /// Status writes the API server has taken since start.
    pub fn status_writes(&self) -> u64 {
        self.shared.writes.load(Ordering::Relaxed)
    }

    /// The spec served now, if any.
    pub fn spec(&self) -> Option<SeenSpec> {
        self.shared.state().seen().cloned()
    }

    /// Why the cache file was not used at start, if it was not.
    pub fn cache_error(&self) -> Option<String> {
        self.shared.link().cache_error.clone()
    }

    /// `Unavailable`, with what the provider knows of why.
    fn unavailable(&self, why: String) -> ProviderError {
        let link = self.shared.link();
        let mut msg = why;
        if let Some(e) = &link.cache_error {
            msg.push_str(&format!("; {e}"));
        }
        if let Some(e) = &link.api_error {
            msg.push_str(&format!("; API server: {e}"));
        }
        ProviderError::Unavailable(msg)
    }
}

#[async_trait]
impl EniProvider for ClusterProvider {
    fn name(&self) -> &str {
        "cluster"
    }

    async fn list(&self) -> Result<Vec<Eni>, ProviderError> {
        Ok(self.shared.state().list())
    }

    async fn allocate_next(&self, owner: &EniOwner) -> Result<Eni, ProviderError> {
        let got = self.shared.state().allocate(&self.shared.node, owner);
        self.allocated(got)
    }

    async fn allocate_named(&self, eni_id: &str, owner: &EniOwner) -> Result<Eni, ProviderError> {
        let got = self
            .shared
            .state()
            .allocate_named(&self.shared.node, eni_id, owner);
        self.allocated(got)
    }

    async fn release(&self, owner: &EniOwner) -> Result<(), ProviderError> {
        self.shared.state().release(owner);
        self.shared.changed(true);
        Ok(())
    }

    async fn restore(&self, assignments: &[(String, EniOwner)]) -> Result<(), ProviderError> {
        self.shared.state().restore(assignments)?;
        self.shared.changed(true);
        Ok(())
    }

    fn address_feed(&self) -> Option<&dyn AddressFeed> {
        (self.mode == Mode::Secondary).then_some(self as &dyn AddressFeed)
    }

    fn degraded(&self) -> Option<String> {
        let state = self.shared.state();
        let link = self.shared.link();
        if let Some(why) = state.unavailable(&self.shared.node) {
            let api = link.api_error.as_deref().unwrap_or("reachable");
            return Some(format!("{why}: nothing is handed out (API server: {api})"));
        }
        let api_error = link.api_error.as_ref()?;
        let generation = state
            .seen()
            .and_then(|s| s.generation)
            .map_or("?".into(), |g| g.to_string());
        let from = match link.source {
            Source::Cache => format!(", read from {}", self.shared.cache.display()),
            _ => String::new(),
        };
        Some(format!(
            "API server unreachable ({api_error}): serving the last NetResourceSet seen (generation {generation}{from}); status is written when it is back"
        ))
    }
}

impl AddressFeed for ClusterProvider {
    fn changes(&self) -> watch::Receiver<u64> {
        self.shared.changes.subscribe()
    }

    fn held(&self, eni_id: &str, ips: &[IpAddr], owner: &EniOwner) {
        self.shared.state().held(eni_id, ips, owner);
        self.shared.changed(false);
    }

    fn freed(&self, owner: &EniOwner) {
        self.shared.state().release(owner);
        self.shared.changed(false);
    }

    fn stored(&self, store: StoredAddresses) {
        self.shared.state().stored(store);
        self.shared.changed(false);
    }
}

/// The provider enimd builds for `config`, in the agent's `mode`.
pub async fn build(
    config: &ClusterConfig,
    mode: Mode,
) -> Result<Arc<dyn EniProvider>, ProviderError> {
    Ok(Arc::new(ClusterProvider::start(config, mode).await?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_defaults_and_validation() {
        let c: ClusterConfig = serde_json::from_str("{}").unwrap();
        assert_eq!(c.status_debounce, Duration::from_millis(200));
        assert!(c.node_name.is_none() && c.kubeconfig.is_none() && c.cache.is_none());
        c.validate().unwrap();
        for bad in ["", "Node-1", "-a", "a..b", "a_b"] {
            let c = ClusterConfig::for_node(bad);
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains("not a valid Node name"), "{bad}: {e}");
        }
        ClusterConfig::for_node("ip-10-0-0-1.ec2.internal")
            .validate()
            .unwrap();
        let slow = ClusterConfig {
            status_debounce: Duration::from_secs(11),
            ..ClusterConfig::for_node("n")
        };
        assert!(slow
            .validate()
            .unwrap_err()
            .to_string()
            .contains("status_debounce"));
    }
}
