//! The kubelet plugin: `pluginregistration/v1` on a socket in the kubelet's
//! `plugins_registry/` (the kubelet finds it there by itself, at its own
//! start and whenever the socket appears), and `DRAPlugin` v1 on
//! `plugins/<driver>/dra.sock`, which the registration names.
//!
//! Prepare resolves the claim's allocation (this driver's results in this
//! node's pool) to ENIs, records them ([`Claims`]) and only then answers.
//! A claim recorded already is answered from the record without asking the
//! API server, so a repeated prepare (after a restart of the kubelet or of
//! enimd) is cheap and gives the same answer. Unprepare drops the record;
//! the ENI itself is released by the pod's DEL, which comes first.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use tokio::net::UnixListener;
use tokio::sync::{oneshot, watch};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

use super::authority;
use super::claims::{Claims, PreparedClaim, PreparedDevice};
use super::registration::registration_server::{Registration, RegistrationServer};
use super::registration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use super::slices::DeviceIndex;
use super::v1::dra_plugin_server::{DraPlugin, DraPluginServer};
use super::v1::{
    Claim, Device, NodePrepareResourceResponse, NodePrepareResourcesRequest,
    NodePrepareResourcesResponse, NodeUnprepareResourceResponse, NodeUnprepareResourcesRequest,
    NodeUnprepareResourcesResponse,
};
use super::{DraConfig, DraError, DRA_SERVICE_V1, PLUGIN_TYPE};

/// How long prepare waits for enimd's first ENI list after a start.
const LIST_WAIT: Duration = Duration::from_secs(10);
/// How often the sockets are checked (someone may remove them).
const WATCH_EVERY: Duration = Duration::from_secs(2);

/// Told of every claim prepared or unprepared: the verb, when it started,
/// whether it succeeded (enimd's request metrics).
pub type Observer = Arc<dyn Fn(&str, std::time::Instant, bool) + Send + Sync>;

/// Claim → ENI, for the DRA service.
pub struct Preparer {
    pub client: kube::Client,
    pub driver: String,
    pub node: String,
    pub claims: Arc<Claims>,
    pub index: DeviceIndex,
    pub observe: Option<Observer>,
}

impl Preparer {
    /// The devices of `claim`, recorded before they are returned.
    pub async fn prepare(&self, claim: &Claim) -> Result<Vec<Device>, DraError> {
        if let Some(done) = self.claims.get(&claim.uid) {
            return Ok(wire_devices(&self.node, &done));
        }
        let bad = |reason: String| DraError::Claim {
            claim: format!("{}/{}", claim.namespace, claim.name),
            reason,
        };
        // Timed for the log: the claim pods' apply->Ready is split by it.
        let started = std::time::Instant::now();
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &claim.namespace);
        let rc = api.get(&claim.name).await?;
        let read_ms = started.elapsed().as_millis();
        if rc.metadata.uid.as_deref() != Some(claim.uid.as_str()) {
            return Err(bad(format!(
                "its uid is {:?}, the kubelet asked for {}: the claim was replaced",
                rc.metadata.uid, claim.uid
            )));
        }
        // As reserved now; pods reserved later are found at their ADD
        // (super::bound).
        let pods = super::bound::reserved_pod_uids(&rc);
        let status = rc.status.unwrap_or_default();
        let allocation = status
            .allocation
            .ok_or_else(|| bad("not allocated".into()))?;
        let results: Vec<_> = allocation
            .devices
            .map(|d| d.results.unwrap_or_default())
            .unwrap_or_default()
            .into_iter()
            .filter(|r| r.driver == self.driver && r.pool == self.node)
            .collect();
        if results.is_empty() {
            return Err(bad(format!(
                "its allocation has no device of driver {} in this node's pool {}",
                self.driver, self.node
            )));
        }
        let mut devices = Vec::new();
        for r in results {
            let eni_id = self
                .index
                .eni_of(&r.device, LIST_WAIT)
                .await
                .map_err(&bad)?
                .ok_or_else(|| {
                    bad(format!(
                        "device {} is not an ENI this node can hand out (gone, excluded or quarantined)",
                        r.device
                    ))
                })?;
            devices.push(PreparedDevice {
                request: r.request,
                device: r.device,
                eni_id,
            });
        }
        let prepared = PreparedClaim {
            uid: claim.uid.clone(),
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            devices,
            pods,
        };
        self.claims.record(prepared.clone())?;
        tracing::info!(
            claim = %format!("{}/{}", claim.namespace, claim.name),
            enis = ?prepared.devices.iter().map(|d| &d.eni_id).collect::<Vec<_>>(),
            pods = ?prepared.pods,
            read_ms,
            took_ms = started.elapsed().as_millis(),
            "prepared claim"
        );
        Ok(wire_devices(&self.node, &prepared))
    }

    /// Drops the records of claims the API server no longer has (or has
    /// under another uid): a kubelet that lost its own record never
    /// unprepares them. A claim is kept while allocated (the API's delete
    /// protection), so its pods are gone when it is. An unreachable API
    /// server drops nothing.
    pub async fn sweep(&self) -> Result<usize, DraError> {
        let mut dropped = 0;
        for c in self.claims.all() {
            let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &c.namespace);
            let live = api.get_opt(&c.name).await?;
            if live.is_some_and(|rc| rc.metadata.uid.as_deref() == Some(c.uid.as_str())) {
                continue;
            }
            if self.claims.forget(&c.uid)?.is_some() {
                tracing::info!(claim = %format!("{}/{}", c.namespace, c.name), "claim gone from the API: its record dropped");
                dropped += 1;
            }
        }
        Ok(dropped)
    }

    pub fn unprepare(&self, claim: &Claim) -> Result<(), DraError> {
        if let Some(gone) = self.claims.forget(&claim.uid)? {
            tracing::info!(claim = %format!("{}/{}", gone.namespace, gone.name), "unprepared claim");
        }
        Ok(())
    }
}

fn wire_devices(pool: &str, claim: &PreparedClaim) -> Vec<Device> {
    claim
        .devices
        .iter()
        .map(|d| Device {
            request_names: vec![d.request.clone()],
            pool_name: pool.to_string(),
            device_name: d.device.clone(),
            // Nothing for the container runtime: the ENI moves at CNI ADD.
            cdi_device_ids: vec![],
        })
        .collect()
}

struct DraService {
    preparer: Arc<Preparer>,
}

#[tonic::async_trait]
impl DraPlugin for DraService {
    async fn node_prepare_resources(
        &self,
        request: Request<NodePrepareResourcesRequest>,
    ) -> Result<Response<NodePrepareResourcesResponse>, Status> {
        let mut out = NodePrepareResourcesResponse::default();
        for claim in request.into_inner().claims {
            let started = std::time::Instant::now();
            let result = self.preparer.prepare(&claim).await;
            if let Some(observe) = &self.preparer.observe {
                observe("dra_prepare", started, result.is_ok());
            }
            let answer = match result {
                Ok(devices) => NodePrepareResourceResponse {
                    devices,
                    error: String::new(),
                },
                Err(e) => {
                    tracing::warn!(claim = %format!("{}/{}", claim.namespace, claim.name), error = %e, "prepare failed");
                    NodePrepareResourceResponse {
                        devices: vec![],
                        error: e.to_string(),
                    }
                }
            };
            out.claims.insert(claim.uid, answer);
        }
        Ok(Response::new(out))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<NodeUnprepareResourcesRequest>,
    ) -> Result<Response<NodeUnprepareResourcesResponse>, Status> {
        let mut out = NodeUnprepareResourcesResponse::default();
        for claim in request.into_inner().claims {
            let started = std::time::Instant::now();
            let result = self.preparer.unprepare(&claim);
            if let Some(observe) = &self.preparer.observe {
                observe("dra_unprepare", started, result.is_ok());
            }
            let error = match result {
                Ok(()) => String::new(),
                Err(e) => e.to_string(),
            };
            out.claims
                .insert(claim.uid, NodeUnprepareResourceResponse { error });
        }
        Ok(Response::new(out))
    }
}

struct RegistrationService {
    driver: String,
    endpoint: PathBuf,
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: PLUGIN_TYPE.into(),
            name: self.driver.clone(),
            endpoint: self.endpoint.to_string_lossy().into_owned(),
            supported_versions: vec![DRA_SERVICE_V1.into()],
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        if status.plugin_registered {
            tracing::info!(driver = %self.driver, "registered with the kubelet as a DRA plugin");
        } else {
            tracing::error!(driver = %self.driver, error = %status.error, "the kubelet refused the DRA plugin's registration");
        }
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

/// One served socket and the way to stop it.
struct Served {
    path: PathBuf,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
    /// The registration socket's acceptor, in front of the server.
    acceptor: Option<tokio::task::JoinHandle<()>>,
}

/// How long a stopping server may take to finish its connections.
const STOP_WITHIN: std::time::Duration = std::time::Duration::from_secs(2);

impl Served {
    /// The socket first (the kubelet sees the plugin go at once, and no
    /// one dials a server that is stopping), then the server, bounded: a
    /// kubelet holding its connection open must not hold enimd's exit.
    async fn stop(self) {
        let _ = std::fs::remove_file(&self.path);
        if let Some(a) = self.acceptor {
            a.abort();
        }
        let _ = self.stop.send(());
        let mut task = self.task;
        if tokio::time::timeout(STOP_WITHIN, &mut task).await.is_err() {
            task.abort();
        }
    }
}

fn bind(path: &Path) -> Result<UnixListener, DraError> {
    let err = |source| DraError::Socket {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    // A socket left by a crash answers nobody; the kubelet would keep
    // dialling it.
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(e)),
    }
    UnixListener::bind(path).map_err(err)
}

/// Serves `router` on a fresh socket at `path`.
fn serve_on(path: &Path, router: tonic::transport::server::Router) -> Result<Served, DraError> {
    let incoming = UnixListenerStream::new(bind(path)?);
    let (stop, stopped) = oneshot::channel();
    let task = tokio::spawn(router.serve_with_incoming_shutdown(incoming, async {
        let _ = stopped.await;
    }));
    Ok(Served {
        path: path.to_path_buf(),
        stop,
        task,
        acceptor: None,
    })
}

fn serve_dra(path: &Path, preparer: Arc<Preparer>) -> Result<Served, DraError> {
    let service = DraPluginServer::new(DraService { preparer });
    serve_on(
        path,
        tonic::transport::Server::builder().add_service(service),
    )
}

/// The registration service, each connection relayed through
/// [`super::authority`] (the kubelet's `:authority` is a path, which the
/// gRPC server would refuse), a bounded number at once.
fn serve_registration(path: &Path, driver: &str, endpoint: &Path) -> Result<Served, DraError> {
    let listener = bind(path)?;
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<tokio::io::DuplexStream>>(16);
    let acceptor = tokio::spawn(authority::accept(
        listener,
        tx,
        authority::Limits::default(),
    ));
    let service = RegistrationServer::new(RegistrationService {
        driver: driver.to_string(),
        endpoint: endpoint.to_path_buf(),
    });
    let (stop, stopped) = oneshot::channel();
    let task = tokio::spawn(
        tonic::transport::Server::builder()
            // What the relay enforces, announced in the server's SETTINGS
            // (which reach the kubelet as they are).
            .max_frame_size(u32::try_from(authority::MAX_FRAME).expect("16 KiB"))
            .http2_max_header_list_size(u32::try_from(authority::MAX_HEADER_LIST).expect("64 KiB"))
            .max_concurrent_streams(authority::MAX_STREAMS)
            .add_service(service)
            .serve_with_incoming_shutdown(tokio_stream::wrappers::ReceiverStream::new(rx), async {
                let _ = stopped.await;
            }),
    );
    Ok(Served {
        path: path.to_path_buf(),
        stop,
        task,
        acceptor: Some(acceptor),
    })
}

/// Serves both sockets until `stop` turns true; serves them again when one
/// disappears. The DRA socket is up before the registration socket, so the
/// kubelet never dials an endpoint that is not there yet. On stop both are
/// removed: the kubelet then unregisters the plugin and, 30 s later unless
/// a new enimd registers, deletes this driver's ResourceSlices.
pub async fn serve(
    config: &DraConfig,
    preparer: Arc<Preparer>,
    mut stop: watch::Receiver<bool>,
) -> Result<(), DraError> {
    let dra_path = config.dra_socket();
    let reg_path = config.registration_socket();
    while !*stop.borrow() {
        let dra = serve_dra(&dra_path, preparer.clone())?;
        let reg = serve_registration(&reg_path, &config.driver, &dra_path)?;
        tracing::info!(registration = %reg_path.display(), endpoint = %dra_path.display(), "DRA plugin serving");
        let mut ticker = tokio::time::interval(WATCH_EVERY);
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = stop.changed() => break,
            }
            if !dra_path.exists() || !reg_path.exists() {
                tracing::warn!("a DRA plugin socket was removed; serving both again");
                break;
            }
        }
        reg.stop().await;
        dra.stop().await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dra::registration::registration_client::RegistrationClient;

    async fn get_info(path: PathBuf) -> Result<PluginInfo, String> {
        let channel = crate::deviceplugin::unix_channel(path)
            .await
            .map_err(|e| e.to_string())?;
        RegistrationClient::new(channel)
            .get_info(InfoRequest {})
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| s.to_string())
    }

    #[tokio::test]
    async fn registration_connections_beyond_the_limit_wait_for_one_to_end() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("enim.io-reg.sock");
        let served = serve_registration(&path, "enim.io", Path::new("/x/dra.sock")).unwrap();
        // Connections that say nothing hold every place.
        let mut held = Vec::new();
        for _ in 0..authority::MAX_CONNECTIONS {
            held.push(tokio::net::UnixStream::connect(&path).await.unwrap());
        }
        let waiting = tokio::spawn(get_info(path.clone()));
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(
            !waiting.is_finished(),
            "a connection beyond the limit was served: {:?}",
            waiting.await
        );
        // One ends: the waiting one is relayed and answered as usual.
        drop(held.pop());
        let info = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("served once a place was free")
            .unwrap()
            .unwrap();
        assert_eq!(
            (info.name.as_str(), info.r#type.as_str()),
            ("enim.io", PLUGIN_TYPE)
        );
        drop(held);
        served.stop().await;
    }
}
