//! The `DevicePlugin` service on the plugin's own unix socket.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;

use tokio::net::UnixListener;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_stream::wrappers::{ReceiverStream, UnixListenerStream};
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use super::v1beta1::device_plugin_server::{DevicePlugin, DevicePluginServer};
use super::v1beta1::{
    AllocateRequest, AllocateResponse, ContainerAllocateResponse,
    ContainerPreferredAllocationResponse, DevicePluginOptions, Empty, ListAndWatchResponse,
    PreStartContainerRequest, PreStartContainerResponse, PreferredAllocationRequest,
    PreferredAllocationResponse,
};
use super::{v1beta1, DevicePluginError, DeviceSource, HEALTHY, UNHEALTHY};

struct Plugin {
    source: Arc<dyn DeviceSource>,
    // Turns true when the server stops: open streams end, so the graceful
    // shutdown does not wait on a kubelet that never hangs up.
    closing: watch::Receiver<bool>,
}

fn to_wire(source: &dyn DeviceSource) -> ListAndWatchResponse {
    ListAndWatchResponse {
        devices: source
            .devices()
            .into_iter()
            .map(|d| v1beta1::Device {
                id: d.id,
                health: if d.healthy { HEALTHY } else { UNHEALTHY }.into(),
                topology: None,
            })
            .collect(),
    }
}

type DeviceStream = Pin<Box<dyn Stream<Item = Result<ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for Plugin {
    async fn get_device_plugin_options(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(DevicePluginOptions {
            pre_start_required: false,
            get_preferred_allocation_available: false,
        }))
    }

    type ListAndWatchStream = DeviceStream;

    /// The list now, and again after every change, until the kubelet hangs up.
    async fn list_and_watch(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let (tx, rx) = mpsc::channel(4);
        let source = self.source.clone();
        let mut changes = source.subscribe();
        let mut closing = self.closing.clone();
        tokio::spawn(async move {
            loop {
                changes.borrow_and_update();
                if tx.send(Ok(to_wire(&*source))).await.is_err() {
                    return; // the kubelet went away
                }
                tokio::select! {
                    changed = changes.changed() => if changed.is_err() { return },
                    () = tx.closed() => return,
                    _ = closing.wait_for(|c| *c) => return,
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        // Any device serves as well as another: the first ones offered.
        let container_responses = request
            .into_inner()
            .container_requests
            .into_iter()
            .map(|c| {
                let mut ids = c.must_include_device_i_ds;
                let size = usize::try_from(c.allocation_size).unwrap_or(0);
                for id in c.available_device_i_ds {
                    if ids.len() >= size {
                        break;
                    }
                    if !ids.contains(&id) {
                        ids.push(id);
                    }
                }
                ContainerPreferredAllocationResponse { device_i_ds: ids }
            })
            .collect();
        Ok(Response::new(PreferredAllocationResponse {
            container_responses,
        }))
    }

    /// Nothing to set up in the container (enim's CNI plugin does the
    /// networking); unknown devices are refused.
    async fn allocate(
        &self,
        request: Request<AllocateRequest>,
    ) -> Result<Response<AllocateResponse>, Status> {
        let known: HashSet<String> = self.source.devices().into_iter().map(|d| d.id).collect();
        let requests = request.into_inner().container_requests;
        if let Some(unknown) = requests
            .iter()
            .flat_map(|c| &c.devices_i_ds)
            .find(|id| !known.contains(*id))
        {
            return Err(Status::invalid_argument(format!(
                "unknown device {unknown}"
            )));
        }
        Ok(Response::new(AllocateResponse {
            container_responses: requests
                .iter()
                .map(|_| ContainerAllocateResponse::default())
                .collect(),
        }))
    }

    async fn pre_start_container(
        &self,
        _: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        Ok(Response::new(PreStartContainerResponse {}))
    }
}

/// The service running on its socket.
pub(super) struct Server {
    path: PathBuf,
    closing: watch::Sender<bool>,
    shutdown: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    /// Binds `path` (a stale socket file is replaced) and serves.
    pub(super) fn start(
        path: &Path,
        source: Arc<dyn DeviceSource>,
    ) -> Result<Self, DevicePluginError> {
        let socket_err = |source| DevicePluginError::Socket {
            path: path.to_path_buf(),
            source,
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(socket_err)?;
        }
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(socket_err(e)),
            _ => {}
        }
        let listener = UnixListener::bind(path).map_err(socket_err)?;
        let (shutdown, stopped) = oneshot::channel::<()>();
        let (closing, closing_rx) = watch::channel(false);
        let service = DevicePluginServer::new(Plugin {
            source,
            closing: closing_rx,
        });
        let task = tokio::spawn(async move {
            let served = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                    let _ = stopped.await;
                })
                .await;
            if let Err(e) = served {
                tracing::error!(error = %e, "device plugin server failed");
            }
        });
        Ok(Server {
            path: path.to_path_buf(),
            closing,
            shutdown,
            task,
        })
    }

    pub(super) async fn stop(self) {
        let _ = self.closing.send(true);
        let _ = self.shutdown.send(());
        let _ = self.task.await;
        let _ = std::fs::remove_file(&self.path);
    }
}
