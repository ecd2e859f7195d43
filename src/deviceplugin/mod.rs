//! A kubelet device plugin (the `deviceplugin/v1beta1` gRPC API): enimd
//! advertises what a node can hold as an extended resource, `enim.io/eni`
//! (one device per ENI it may hand out) or `enim.io/ip` (one per assignable
//! address), so the scheduler keeps pods off full nodes. It needs no
//! API-server credentials: it registers with the kubelet over the kubelet's
//! socket and streams its device list.
//!
//! The kubelet only counts devices: which ENI or address a pod gets is
//! still enim's choice at ADD, so `Allocate` asks nothing of the container.
//! A restarting kubelet removes the plugins' sockets and re-creates its
//! own; [`serve`] notices either and registers again.
//!
//! [`serve`] runs inside enimd (`[device_plugin] enabled = true`) or in a
//! process of its own, `enimd device-plugin` ([`relay`]), which asks enimd
//! for the list and outlives its restarts.

mod plugin;
pub mod relay;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::net::UnixStream;
use tokio::sync::watch;

/// The generated API (proto/deviceplugin/v1beta1/api.proto).
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod v1beta1 {
    tonic::include_proto!("v1beta1");
}

/// The API version this plugin speaks, as the kubelet expects it.
pub const API_VERSION: &str = "v1beta1";
pub const HEALTHY: &str = "Healthy";
pub const UNHEALTHY: &str = "Unhealthy";

/// One device as the kubelet sees it (plain data in `enim_api::model`,
/// which the agent's API shares without depending on this module).
pub use enim_api::model::Device;

/// What the plugin advertises; enimd's engine in the agent, a fake in tests.
pub trait DeviceSource: Send + Sync + 'static {
    /// e.g. `enim.io/eni` or `enim.io/ip`.
    fn resource_name(&self) -> String;
    /// The current devices.
    fn devices(&self) -> Vec<Device>;
    /// Bumped whenever `devices()` may have changed.
    fn subscribe(&self) -> watch::Receiver<u64>;
}

/// The `[device_plugin]` table of enimd's config.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct DevicePluginConfig {
    /// Serve the device plugin from enimd; never with `[dra] enabled`. Off
    /// unless set: bare-metal and test setups need no kubelet.
    pub enabled: bool,
    /// The kubelet's device plugin directory.
    pub dir: PathBuf,
    /// The kubelet's registration socket, in `dir`.
    pub kubelet_socket: String,
    /// enimd's own socket, in `dir`.
    pub endpoint: String,
}

/// The kubelet's device plugin directory.
pub const DEFAULT_DIR: &str = "/var/lib/kubelet/device-plugins";
/// The kubelet's registration socket in it.
pub const DEFAULT_KUBELET_SOCKET: &str = "kubelet.sock";
/// enim's own socket in it.
pub const DEFAULT_ENDPOINT: &str = "enim.sock";

impl Default for DevicePluginConfig {
    fn default() -> Self {
        DevicePluginConfig {
            enabled: false,
            dir: PathBuf::from(DEFAULT_DIR),
            kubelet_socket: DEFAULT_KUBELET_SOCKET.into(),
            endpoint: DEFAULT_ENDPOINT.into(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DevicePluginError {
    #[error("device plugin socket {path}: {source}")]
    Socket {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("registering with the kubelet at {path}: {why}")]
    Register { path: PathBuf, why: String },
}

/// How often the plugin looks whether the kubelet restarted: a stat of
/// two paths. Short, because a restarted kubelet that admits a pod
/// before the plugin registers again refuses it (UnexpectedAdmissionError:
/// no healthy devices), and that window is this long at least.
const WATCH_EVERY: Duration = Duration::from_millis(100);
/// The longest wait between registration attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// Serves the plugin and keeps it registered until `stop` turns true.
pub async fn serve(
    config: DevicePluginConfig,
    source: Arc<dyn DeviceSource>,
    mut stop: watch::Receiver<bool>,
) -> Result<(), DevicePluginError> {
    let ours = config.dir.join(&config.endpoint);
    let kubelet = config.dir.join(&config.kubelet_socket);
    let backoff = enim_core::retry::Backoff::new(Duration::from_millis(200), MAX_BACKOFF);
    let mut delays = backoff.delays();
    while !*stop.borrow() {
        // A round: our socket, served, registered, watched until the kubelet
        // goes away or restarts.
        let server = plugin::Server::start(&ours, source.clone())?;
        let registered = match register(&kubelet, &config.endpoint, &source.resource_name()).await {
            Ok(()) => {
                delays.reset();
                tracing::info!(resource = %source.resource_name(), socket = %ours.display(), "registered with the kubelet");
                Some(inode(&kubelet))
            }
            Err(e) => {
                tracing::warn!(error = %e, "kubelet not reachable yet; retrying");
                None
            }
        };
        match registered {
            Some(kubelet_inode) => watch_kubelet(&ours, &kubelet, kubelet_inode, &mut stop).await,
            None => {
                let delay = delays.next().unwrap_or(MAX_BACKOFF);
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    _ = stop.changed() => {}
                }
            }
        };
        server.stop().await;
    }
    let _ = std::fs::remove_file(&ours);
    Ok(())
}

fn inode(path: &std::path::Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| m.ino())
}

/// Returns when the kubelet restarted (its socket re-created, or ours
/// removed, as a starting kubelet does) or `stop` turned true.
async fn watch_kubelet(
    ours: &std::path::Path,
    kubelet: &std::path::Path,
    kubelet_inode: Option<u64>,
    stop: &mut watch::Receiver<bool>,
) {
    let mut ticker = tokio::time::interval(WATCH_EVERY);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = stop.changed() => return,
        }
        if !ours.exists() || inode(kubelet) != kubelet_inode {
            tracing::info!("the kubelet restarted; registering again");
            return;
        }
    }
}

/// A gRPC channel over the unix socket at `path` (the kubelet's, or a
/// plugin's when the kubelet or a test dials it).
pub async fn unix_channel(
    path: PathBuf,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    // The URI is required by tonic and ignored: the connector dials the socket.
    tonic::transport::Endpoint::from_static("http://[::]:50051")
        .connect_timeout(Duration::from_secs(5))
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move {
                let stream = UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await
}

/// Registration.Register over the kubelet's unix socket.
async fn register(
    kubelet: &std::path::Path,
    endpoint: &str,
    resource_name: &str,
) -> Result<(), DevicePluginError> {
    let fail = |why: String| DevicePluginError::Register {
        path: kubelet.to_path_buf(),
        why,
    };
    let channel = unix_channel(kubelet.to_path_buf())
        .await
        .map_err(|e| fail(e.to_string()))?;
    let mut client = v1beta1::registration_client::RegistrationClient::new(channel);
    let request = client.register(v1beta1::RegisterRequest {
        version: API_VERSION.into(),
        endpoint: endpoint.into(),
        resource_name: resource_name.into(),
        options: Some(v1beta1::DevicePluginOptions::default()),
    });
    // A kubelet that accepts but never answers is retried like a dead one.
    match tokio::time::timeout(Duration::from_secs(10), request).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(status)) => Err(fail(status.message().to_string())),
        Err(_) => Err(fail("no answer within 10 s".into())),
    }
}
