//! The DRA driver `enim.io` (Dynamic Resource Allocation, resource.k8s.io/v1,
//! GA in Kubernetes 1.34): a pod claims the ENI it needs by its attributes,
//! and the scheduler picks one from what this node publishes.
//!
//! The parts, in the order a claim meets them:
//! - [`slices`]: one ResourceSlice per node, one device per ENI the node may
//!   hand out ([`devices`] builds them, with [`topology`] from sysfs). It
//!   follows the engine's ENI list; the kubelet deletes it 30 s after this
//!   plugin's socket is gone (uninstall).
//! - [`plugin`]: the kubelet plugin, registered over `pluginregistration/v1`
//!   (through [`authority`], which mends the kubelet's `:authority`) and
//!   serving `DRAPlugin` v1. `NodePrepareResources` reads the claim's
//!   allocation and records claim → ENI in [`claims`] before it answers;
//!   `NodeUnprepareResources` drops the record.
//! - [`bound`]: the provider enimd's engine sees on a DRA node. CNI ADD for
//!   a pod (by `K8S_POD_UID`) gets exactly the ENI its prepared claim names,
//!   or is refused; and the claim's `status.devices[].networkData` is
//!   written for it ([`status`]).
//!
//! Invariants:
//! - The device plugin and this driver never both run in one enimd (a
//!   start-up error, [`DraConfig::check`]); `enimd device-plugin` refuses to
//!   relay for an enimd that has DRA on. The scheduler is then the only one
//!   that chooses which pod gets which ENI.
//! - A claim is answered as prepared only once its record is on disk, so a
//!   restart between prepare and ADD finds it; prepare is idempotent (the
//!   kubelet repeats it after a restart of either side).
//! - Prepare touches neither the kernel nor the cloud: the ENI moves at ADD,
//!   through the engine, with its usual intent and outcome records.

pub mod authority;
pub mod bound;
pub mod claims;
pub mod devices;
pub mod plugin;
pub mod slices;
pub mod status;
pub mod topology;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use enim_provider::EniProvider;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::engine::{Driver, Engine};

/// The generated DRA kubelet plugin API (proto/dra/v1/api.proto).
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod v1 {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
}

/// The generated plugin registration API (proto/pluginregistration/v1).
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod registration {
    tonic::include_proto!("pluginregistration");
}

/// The driver's name: the ResourceSlices' driver, the attribute domain of
/// every unqualified attribute, the kubelet plugin's registered name.
pub use enim_crd::dra::DRIVER;
/// The gRPC services this plugin offers, as the kubelet names them
/// (`<package>.<service>`, k8s.io/kubelet's `DRAPluginService`).
pub const DRA_SERVICE_V1: &str = "v1.DRAPlugin";
/// The plugin type in `pluginregistration.PluginInfo`.
pub const PLUGIN_TYPE: &str = "DRAPlugin";
/// The field manager of everything enimd writes on the API server.
pub const FIELD_MANAGER: &str = "enimd";

/// The `[dra]` table of enimd's config.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct DraConfig {
    /// Be the kubelet's DRA plugin.
    pub enabled: bool,
    /// The driver name (the DeviceClass selects by it).
    pub driver: String,
    /// The kubelet's plugin registration directory.
    pub registry_dir: PathBuf,
    /// The kubelet's plugin directory: the DRA socket is
    /// `<plugin_dir>/<driver>/dra.sock`.
    pub plugin_dir: PathBuf,
    /// This node's name.
    ///
    /// Default: env `NODE_NAME`.
    pub node_name: Option<String>,
    /// A kubeconfig file.
    ///
    /// Default: the pod's in-cluster ServiceAccount.
    pub kubeconfig: Option<PathBuf>,
    /// The record of prepared claims.
    ///
    /// Default: `dra-claims.json` beside the checkpoint.
    pub claims: Option<PathBuf>,
    /// How often records of claims gone from the API are dropped.
    #[serde(with = "humantime_serde")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub sweep_interval: std::time::Duration,
}

pub const DEFAULT_REGISTRY_DIR: &str = "/var/lib/kubelet/plugins_registry";
pub const DEFAULT_PLUGIN_DIR: &str = "/var/lib/kubelet/plugins";
pub const CLAIMS_FILE: &str = "dra-claims.json";
/// How often records of claims gone from the API are dropped, by default.
pub const SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

impl Default for DraConfig {
    fn default() -> Self {
        DraConfig {
            enabled: false,
            driver: DRIVER.into(),
            registry_dir: DEFAULT_REGISTRY_DIR.into(),
            plugin_dir: DEFAULT_PLUGIN_DIR.into(),
            node_name: None,
            kubeconfig: None,
            claims: None,
            sweep_interval: SWEEP_EVERY,
        }
    }
}

impl DraConfig {
    /// The DRA socket the kubelet calls.
    pub fn dra_socket(&self) -> PathBuf {
        self.plugin_dir.join(&self.driver).join("dra.sock")
    }

    /// The registration socket the kubelet watches for.
    pub fn registration_socket(&self) -> PathBuf {
        self.registry_dir.join(format!("{}-reg.sock", self.driver))
    }

    /// Whether this setting can run beside the rest of enimd's config: the
    /// node hands its ENIs out through the device plugin or through DRA,
    /// never both, and DRA's unit is a whole ENI (primary mode).
    pub fn check(&self, device_plugin: bool, secondary: bool) -> Result<(), DraError> {
        if !self.enabled {
            return Ok(());
        }
        if device_plugin {
            return Err(DraError::Config(
                "[dra] enabled = true and [device_plugin] enabled = true: a node hands its ENIs \
                 out through one of them, never both (the scheduler would count each ENI twice); \
                 turn one off"
                    .into(),
            ));
        }
        if secondary {
            return Err(DraError::Config(
                "[dra] enabled = true needs mode = \"primary\": a DRA device is a whole ENI, \
                 and secondary mode shares each ENI between pods"
                    .into(),
            ));
        }
        if self.driver.is_empty() || self.driver.contains('/') {
            return Err(DraError::Config(format!(
                "[dra] driver = {:?} is not a DNS subdomain",
                self.driver
            )));
        }
        Ok(())
    }

    /// The node name: from the config, else `NODE_NAME`.
    pub fn node(&self) -> Result<String, DraError> {
        self.node_name
            .clone()
            .or_else(|| std::env::var("NODE_NAME").ok())
            .filter(|n| !n.is_empty())
            .ok_or_else(|| {
                DraError::Config(
                    "[dra] needs the node's name: set node_name, or NODE_NAME (the DaemonSet \
                     sets it from spec.nodeName)"
                        .into(),
                )
            })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DraError {
    #[error("dra config: {0}")]
    Config(String),
    #[error("{0}")]
    File(#[from] enim_core::atomic_file::FileError),
    #[error("claims record {path}: {reason}")]
    CorruptClaims { path: PathBuf, reason: String },
    #[error("API server: {0}")]
    Kube(#[from] kube::Error),
    #[error("{0}")]
    Client(#[from] enim_provider_cluster::ClusterError),
    #[error("claim {claim}: {reason}")]
    Claim { claim: String, reason: String },
    #[error("kubelet plugin socket {path}: {source}")]
    Socket {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The driver on a node: what enimd builds before its engine ([`start`])
/// and runs once the engine has recovered ([`DraNode::spawn`]).
///
/// [`start`]: DraNode::start
pub struct DraNode {
    config: DraConfig,
    client: kube::Client,
    node: String,
    claims: Arc<claims::Claims>,
    status: status::StatusWriter,
}

impl DraNode {
    /// The client, the node's name and the claims record at `record` (the
    /// config's `claims`, or enimd's default beside the checkpoint): every
    /// error here stops enimd at start.
    pub async fn start(config: &DraConfig, record: &Path) -> Result<DraNode, DraError> {
        let node = config.node()?;
        let client = enim_provider_cluster::kube_client(config.kubeconfig.as_deref()).await?;
        let claims = Arc::new(claims::Claims::open(record)?);
        let status =
            status::StatusWriter::start(client.clone(), config.driver.clone(), node.clone());
        Ok(DraNode {
            config: config.clone(),
            client,
            node,
            claims,
            status,
        })
    }

    /// The provider the engine gets: `inner`, bound to the prepared claims.
    pub fn bind(&self, inner: Arc<dyn EniProvider>) -> Arc<dyn EniProvider> {
        Arc::new(bound::BoundProvider::new(
            inner,
            self.claims.clone(),
            Some(self.status.clone()),
            Some(Arc::new(bound::ApiReservations(self.client.clone()))),
        ))
    }

    /// Publishes the ResourceSlice and serves the kubelet until `stop`.
    /// `changes` ticks when the ENI list may have changed. The handle ends
    /// once the plugin's sockets are gone: enimd waits for it at exit.
    pub fn spawn<D: Driver>(
        self,
        engine: Arc<Engine<D>>,
        changes: watch::Receiver<u64>,
        observe: Option<plugin::Observer>,
        stop: watch::Receiver<bool>,
    ) -> tokio::task::JoinHandle<()> {
        let (index_tx, index) = slices::DeviceIndex::new();
        let publisher = slices::SlicePublisher {
            client: self.client.clone(),
            driver: self.config.driver.clone(),
            node: self.node.clone(),
            sysfs: PathBuf::from("/sys"),
        };
        tokio::spawn(publisher.run(engine, index_tx, changes, stop.clone()));
        let preparer = Arc::new(plugin::Preparer {
            client: self.client,
            driver: self.config.driver.clone(),
            node: self.node,
            claims: self.claims,
            index,
            observe,
        });
        let config = self.config;
        let sweeper = preparer.clone();
        let mut sweep_stop = stop.clone();
        let interval = config.sweep_interval.max(std::time::Duration::from_secs(1));
        tokio::spawn(async move {
            let mut every = tokio::time::interval(interval);
            loop {
                tokio::select! {
                    _ = every.tick() => {}
                    _ = sweep_stop.changed() => return,
                }
                if let Err(e) = sweeper.sweep().await {
                    tracing::warn!(error = %e, "sweeping the claims record; next time");
                }
            }
        });
        tokio::spawn(async move {
            if let Err(e) = plugin::serve(&config, preparer, stop).await {
                tracing::error!(error = %e, "DRA plugin stopped");
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dra_and_the_device_plugin_exclude_each_other() {
        let on = DraConfig {
            enabled: true,
            ..DraConfig::default()
        };
        let e = on.check(true, false).unwrap_err().to_string();
        assert!(
            e.contains("[dra] enabled = true and [device_plugin] enabled = true"),
            "{e}"
        );
        let e = on.check(false, true).unwrap_err().to_string();
        assert!(e.contains("primary"), "{e}");
        on.check(false, false).unwrap();
        // Off: whatever else is set.
        DraConfig::default().check(true, true).unwrap();
    }

    #[test]
    fn sockets_are_where_the_kubelet_looks() {
        let c = DraConfig::default();
        assert_eq!(
            c.dra_socket(),
            PathBuf::from("/var/lib/kubelet/plugins/enim.io/dra.sock")
        );
        assert_eq!(
            c.registration_socket(),
            PathBuf::from("/var/lib/kubelet/plugins_registry/enim.io-reg.sock")
        );
    }

    #[test]
    fn config_rejects_unknown_keys() {
        let e = toml::from_str::<DraConfig>("enabled = true\nsocket = \"x\"\n").unwrap_err();
        assert!(e.to_string().contains("unknown field"), "{e}");
    }
}
