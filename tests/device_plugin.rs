//! The device plugin against a kubelet stand-in built from the same proto
//! (no kubelet runs here): a `Registration` server on a `kubelet.sock` in a
//! temporary directory, and a `DevicePlugin` client on the plugin's socket,
//! as the kubelet's device manager uses them.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use enim::deviceplugin::v1beta1::device_plugin_client::DevicePluginClient;
use enim::deviceplugin::v1beta1::registration_server::{Registration, RegistrationServer};
use enim::deviceplugin::v1beta1::{
    AllocateRequest, ContainerAllocateRequest, Empty, ListAndWatchResponse, RegisterRequest,
};
use enim::deviceplugin::{serve, Device, DevicePluginConfig, DeviceSource};
use tokio::net::UnixListener;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

/// A device list the test changes.
struct FakeSource {
    devices: Mutex<Vec<Device>>,
    version: watch::Sender<u64>,
}

impl FakeSource {
    fn set(&self, devices: &[(&str, bool)]) {
        *self.devices.lock().unwrap() = devices
            .iter()
            .map(|(id, healthy)| Device {
                id: id.to_string(),
                healthy: *healthy,
            })
            .collect();
        self.version.send_modify(|v| *v += 1);
    }
}

impl DeviceSource for FakeSource {
    fn resource_name(&self) -> String {
        "enim.io/eni".into()
    }
    fn devices(&self) -> Vec<Device> {
        self.devices.lock().unwrap().clone()
    }
    fn subscribe(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }
}

/// The kubelet's registration service: passes each request to the test.
struct Kubelet {
    seen: mpsc::UnboundedSender<RegisterRequest>,
}

#[tonic::async_trait]
impl Registration for Kubelet {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let _ = self.seen.send(request.into_inner());
        Ok(Response::new(Empty {}))
    }
}

/// A kubelet on `dir/kubelet.sock` until the sender is used or dropped.
fn start_kubelet(
    dir: &std::path::Path,
    seen: mpsc::UnboundedSender<RegisterRequest>,
) -> oneshot::Sender<()> {
    let path = dir.join("kubelet.sock");
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(Kubelet { seen }))
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
    });
    stop
}

async fn plugin_client(path: std::path::PathBuf) -> DevicePluginClient<Channel> {
    DevicePluginClient::new(enim::deviceplugin::unix_channel(path).await.unwrap())
}

async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), f)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

/// The next list on a ListAndWatch stream, waited for as `what`.
async fn next_list(
    stream: &mut tonic::Streaming<ListAndWatchResponse>,
    what: &str,
) -> ListAndWatchResponse {
    let next = within(what, stream.message()).await;
    next.unwrap().expect("the stream ended")
}

fn health(r: &ListAndWatchResponse) -> Vec<(String, String)> {
    let mut v: Vec<_> = r
        .devices
        .iter()
        .map(|d| (d.id.clone(), d.health.clone()))
        .collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registers_streams_allocates_and_registers_again_after_a_kubelet_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (seen_tx, mut seen) = mpsc::unbounded_channel();
    let kubelet = start_kubelet(dir.path(), seen_tx.clone());
    let source = Arc::new(FakeSource {
        devices: Mutex::new(Vec::new()),
        version: watch::channel(0).0,
    });
    source.set(&[("eni-1", true), ("eni-2", true)]);
    let config = DevicePluginConfig {
        enabled: true,
        dir: dir.path().to_path_buf(),
        ..DevicePluginConfig::default()
    };
    let (stop_tx, stop) = watch::channel(false);
    let plugin = tokio::spawn(serve(config, source.clone(), stop));

    // Registration: the resource, the API version and our socket's name.
    let req = within("registration", seen.recv()).await.unwrap();
    assert_eq!(req.resource_name, "enim.io/eni");
    assert_eq!(req.version, "v1beta1");
    assert_eq!(req.endpoint, "enim.sock");
    let mut client = plugin_client(dir.path().join(&req.endpoint)).await;

    let options = client
        .get_device_plugin_options(Empty {})
        .await
        .unwrap()
        .into_inner();
    assert!(!options.pre_start_required);

    // ListAndWatch: the list at once, and again as ENIs come, go into use
    // (still devices) and go missing (unhealthy).
    let mut stream = client.list_and_watch(Empty {}).await.unwrap().into_inner();
    let first = next_list(&mut stream, "the first list").await;
    let healthy = |id: &str| (id.to_string(), "Healthy".to_string());
    assert_eq!(health(&first), [healthy("eni-1"), healthy("eni-2")]);
    source.set(&[("eni-1", true), ("eni-2", false), ("eni-3", true)]);
    let next = next_list(&mut stream, "the changed list").await;
    assert_eq!(
        health(&next),
        [
            healthy("eni-1"),
            ("eni-2".into(), "Unhealthy".into()),
            healthy("eni-3")
        ]
    );
    source.set(&[("eni-1", true), ("eni-2", true), ("eni-3", true)]);
    let back = next_list(&mut stream, "the list after the device came back").await;
    assert_eq!(health(&back).len(), 3);
    assert!(back.devices.iter().all(|d| d.health == "Healthy"));

    // Allocate: fine for known devices, refused for unknown ones.
    let ask = |ids: &[&str]| AllocateRequest {
        container_requests: vec![ContainerAllocateRequest {
            devices_i_ds: ids.iter().map(|s| s.to_string()).collect(),
        }],
    };
    let ok = client.allocate(ask(&["eni-3"])).await.unwrap().into_inner();
    assert_eq!(ok.container_responses.len(), 1);
    let err = client.allocate(ask(&["eni-9"])).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");

    // The kubelet restarts: it removes the plugins' sockets and makes its
    // own anew. The plugin registers again.
    drop(stream);
    let _ = kubelet.send(());
    std::fs::remove_file(dir.path().join("enim.sock")).unwrap();
    let _kubelet = start_kubelet(dir.path(), seen_tx);
    let again = within("registration after the restart", seen.recv())
        .await
        .unwrap();
    assert_eq!(again.resource_name, "enim.io/eni");
    let mut client = plugin_client(dir.path().join("enim.sock")).await;
    let mut stream = client.list_and_watch(Empty {}).await.unwrap().into_inner();
    let listed = next_list(&mut stream, "the list after the restart").await;
    assert_eq!(listed.devices.len(), 3);

    // Stop: serve returns and removes its socket.
    stop_tx.send(true).unwrap();
    within("serve to stop", plugin).await.unwrap().unwrap();
    assert!(!dir.path().join("enim.sock").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_kubelet_yet_is_retried_not_fatal() {
    let dir = tempfile::tempdir().unwrap();
    let source = Arc::new(FakeSource {
        devices: Mutex::new(Vec::new()),
        version: watch::channel(0).0,
    });
    let config = DevicePluginConfig {
        enabled: true,
        dir: dir.path().to_path_buf(),
        ..DevicePluginConfig::default()
    };
    let (stop_tx, stop) = watch::channel(false);
    let plugin = tokio::spawn(serve(config, source, stop));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !plugin.is_finished(),
        "a missing kubelet stopped the plugin"
    );
    // The kubelet comes up: the plugin finds it.
    let (seen_tx, mut seen) = mpsc::unbounded_channel();
    let _kubelet = start_kubelet(dir.path(), seen_tx);
    within("registration once the kubelet is up", seen.recv())
        .await
        .unwrap();
    stop_tx.send(true).unwrap();
    within("serve to stop", plugin).await.unwrap().unwrap();
}

mod common;

/// enimd itself, with `[device_plugin]` on, against the stand-in: its ENIs
/// as devices, their health following the kernel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enimd_advertises_its_enis_and_their_health() {
    enim_testkit::require_kernel!();
    let sb = common::Sandbox::new(3);
    let pod = common::NamedNetns::new("pod");
    let dir = tempfile::tempdir().unwrap();
    let plugins = dir.path().join("device-plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let (seen_tx, mut seen) = mpsc::unbounded_channel();
    let _kubelet = start_kubelet(&plugins, seen_tx);
    let extra = format!(
        "[device_plugin]\nenabled = true\ndir = \"{}\"",
        plugins.display()
    );
    // The rig blocks while enimd starts; the stand-in runs meanwhile.
    let agent = tokio::task::block_in_place(|| common::start_agent(&sb, dir.path(), &extra));
    let conf = agent.net_conf("1.1.0");
    let req = within("enimd's registration", seen.recv()).await.unwrap();
    assert_eq!(req.resource_name, "enim.io/eni");
    let mut client = plugin_client(plugins.join(&req.endpoint)).await;
    let mut stream = client.list_and_watch(Empty {}).await.unwrap().into_inner();
    let first = next_list(&mut stream, "the first list").await;
    assert_eq!(first.devices.len(), 3, "{first:?}");
    assert!(
        first.devices.iter().all(|d| d.health == "Healthy"),
        "{first:?}"
    );

    // A free ENI's device goes away: unhealthy at the next refresh.
    sb.host.ip(&["link", "del", "eni2"]);
    let gone = next_list(&mut stream, "the list after a device went").await;
    let eni2 = gone.devices.iter().find(|d| d.id == sb.enis[2].id).unwrap();
    assert_eq!(eni2.health, "Unhealthy", "{gone:?}");

    // It comes back: healthy again.
    sb.plug_eni(2);
    let back = next_list(&mut stream, "the list after the device came back").await;
    assert!(
        back.devices.iter().all(|d| d.health == "Healthy"),
        "{back:?}"
    );

    // A pod takes an ENI: still a device (the kubelet counts it as used).
    tokio::task::block_in_place(|| {
        common::enim("ADD", "c1", Some(&pod.path()), "eth0", &conf).ok();
    });
    let mut fresh = client.list_and_watch(Empty {}).await.unwrap().into_inner();
    let now = next_list(&mut fresh, "the list after an ADD").await;
    assert_eq!(now.devices.len(), 3, "{now:?}");
    tokio::task::block_in_place(|| {
        common::enim("DEL", "c1", Some(&pod.path()), "eth0", &conf).ok();
        drop(agent);
    });
}
