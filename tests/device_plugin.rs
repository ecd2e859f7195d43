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

/// A temporary dir, and in its `device-plugins` a kubelet stand-in.
struct PluginDir {
    /// Stops the kubelet when dropped, before the dir goes.
    _kubelet: oneshot::Sender<()>,
    /// What the kubelet was asked to register, in order.
    seen: mpsc::UnboundedReceiver<RegisterRequest>,
    /// The kubelet's device plugin dir.
    plugins: std::path::PathBuf,
    dir: tempfile::TempDir,
}

impl PluginDir {
    fn start() -> PluginDir {
        let dir = tempfile::tempdir().unwrap();
        let plugins = dir.path().join("device-plugins");
        std::fs::create_dir_all(&plugins).unwrap();
        let (seen_tx, seen) = mpsc::unbounded_channel();
        PluginDir {
            _kubelet: start_kubelet(&plugins, seen_tx),
            seen,
            plugins,
            dir,
        }
    }

    /// `enimd device-plugin` against the enimd at `socket`, for this
    /// kubelet; it logs to `relay.log` in the dir.
    fn relay(&self, socket: &std::path::Path) -> Relay {
        Relay::start(socket, &self.plugins, &self.dir.path().join("relay.log"))
    }

    /// Waits for a registration of `enim.io/eni` (as `what`), then asks
    /// the plugin for its list: the client, the stream and its first list.
    async fn registered(
        &mut self,
        what: &str,
    ) -> (
        DevicePluginClient<Channel>,
        tonic::Streaming<ListAndWatchResponse>,
        ListAndWatchResponse,
    ) {
        let req = within(what, self.seen.recv()).await.unwrap();
        assert_eq!(req.resource_name, "enim.io/eni");
        let mut client = plugin_client(self.plugins.join(&req.endpoint)).await;
        let mut stream = client.list_and_watch(Empty {}).await.unwrap().into_inner();
        let first = next_list(&mut stream, "the first list").await;
        (client, stream, first)
    }
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
    let mut k = PluginDir::start();
    let extra = format!(
        "[device_plugin]\nenabled = true\ndir = \"{}\"",
        k.plugins.display()
    );
    // The rig blocks while enimd starts; the stand-in runs meanwhile.
    let agent = tokio::task::block_in_place(|| common::start_agent(&sb, k.dir.path(), &extra));
    let conf = agent.net_conf("1.1.0");
    let (mut client, mut stream, first) = k.registered("enimd's registration").await;
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

/// `enimd device-plugin`, the process: killed on drop, pass or fail.
struct Relay {
    child: Option<std::process::Child>,
    log: std::path::PathBuf,
}

impl Relay {
    /// `enimd device-plugin` against the enimd at `socket`, for the kubelet
    /// in `plugins`, asking every 100 ms; it logs to `log`.
    fn start(socket: &std::path::Path, plugins: &std::path::Path, log: &std::path::Path) -> Relay {
        let out = std::fs::File::create(log).unwrap();
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_enimd"))
            .arg("device-plugin")
            .arg("--socket")
            .arg(socket)
            .arg("--dir")
            .arg(plugins)
            .args(["--poll", "100ms"])
            .env("ENIMD_LOG", "info")
            .stdin(std::process::Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap();
        Relay {
            child: Some(child),
            log: log.to_path_buf(),
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn running(&mut self) -> bool {
        self.child.as_mut().unwrap().try_wait().unwrap().is_none()
    }

    /// Waits (a bounded while) for it to exit by itself.
    async fn exited(&mut self) -> std::process::ExitStatus {
        let child = self.child.as_mut().unwrap();
        within("enimd device-plugin to exit", async {
            loop {
                if let Some(status) = child.try_wait().unwrap() {
                    return status;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
    }

    /// SIGTERM, as the kubelet stops a pod: it must exit 0.
    fn stop(&mut self) {
        let status = enim_testkit::sigterm_and_wait(self.child.take().unwrap());
        assert!(status.success(), "exit {status}: {}", self.log());
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// An enimd that answers only `GET /v1/devices`, with what the test sets
/// (`None`: 503, as enimd answers before it knows its list).
fn start_fake_enimd(
    socket: &std::path::Path,
    answer: Arc<Mutex<Option<enim_api::DeviceList>>>,
) -> oneshot::Sender<()> {
    use axum::http::StatusCode;
    let listener = UnixListener::bind(socket).unwrap();
    let app = axum::Router::new().route(
        enim_api::ROUTE_DEVICES,
        axum::routing::get(move || {
            let answer = answer.lock().unwrap().clone();
            async move {
                match answer {
                    Some(list) => Ok(axum::Json(list)),
                    None => Err((
                        StatusCode::SERVICE_UNAVAILABLE,
                        axum::Json(enim_api::ApiError::new(
                            enim_api::code::TRY_AGAIN_LATER,
                            "not yet",
                        )),
                    )),
                }
            }
        }),
    );
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
    });
    stop
}

fn device_list(ids: &[&str], in_process_plugin: bool) -> enim_api::DeviceList {
    enim_api::DeviceList {
        resource_name: "enim.io/eni".into(),
        in_process_plugin,
        dra: false,
        devices: ids.iter().copied().map(Device::healthy).collect(),
    }
}

/// Before enimd ever gave a list (no socket yet, then 503 while it starts)
/// the process does not register: a kubelet told of no devices would
/// reject the pods it admits. It registers once enimd answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_plugin_process_registers_only_once_enimd_has_a_list() {
    let mut k = PluginDir::start();
    let socket = k.dir.path().join("enimd.sock");
    let mut relay = k.relay(&socket);

    // No enimd, then an enimd that does not know its list yet.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let answer = Arc::new(Mutex::new(None));
    let _enimd = start_fake_enimd(&socket, answer.clone());
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(relay.running(), "gave up waiting: {}", relay.log());
    assert!(k.seen.try_recv().is_err(), "registered with no list");
    assert!(!k.plugins.join("enim.sock").exists(), "served with no list");
    let waiting = relay
        .log()
        .matches("waiting for enimd's device list")
        .count();
    assert_eq!(waiting, 1, "not logged once: {}", relay.log());

    // enimd knows its list: registration, and the list on the stream.
    *answer.lock().unwrap() = Some(device_list(&["eni-1", "eni-2"], false));
    let (_client, _stream, first) = k.registered("registration").await;
    let healthy = |id: &str| (id.to_string(), "Healthy".to_string());
    assert_eq!(health(&first), [healthy("eni-1"), healthy("eni-2")]);

    // SIGTERM: it exits 0 and takes its socket with it.
    tokio::task::block_in_place(|| relay.stop());
    assert!(!k.plugins.join("enim.sock").exists());
}

/// Beside an enimd that serves the kubelet itself the two would replace
/// each other's registration: the process says so and exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_plugin_process_refuses_an_enimd_with_its_own_plugin_on() {
    let mut k = PluginDir::start();
    let socket = k.dir.path().join("enimd.sock");
    let answer = Arc::new(Mutex::new(Some(device_list(&["eni-1"], true))));
    let _enimd = start_fake_enimd(&socket, answer);
    let mut relay = k.relay(&socket);
    let status = relay.exited().await;
    assert!(!status.success(), "{status}");
    let log = relay.log();
    assert!(
        log.contains("serves the kubelet itself") && log.contains("enabled = false"),
        "{log}"
    );
    assert!(
        k.seen.try_recv().is_err(),
        "registered beside enimd's plugin"
    );
}

/// The point of the separate process: enimd killed with SIGKILL, and the
/// kubelet's stream stays open with the same healthy devices, Allocate
/// still answers, and nothing is logged past one line; enimd back with an
/// ENI fewer, and the kubelet is told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_plugin_process_outlives_enimd() {
    enim_testkit::require_kernel!();
    let sb = common::Sandbox::new(3);
    let mut k = PluginDir::start();
    // enimd's own plugin is off (the default): the process serves instead.
    let mut agent = tokio::task::block_in_place(|| common::start_agent(&sb, k.dir.path(), ""));
    let mut relay = k.relay(agent.socket());
    let (mut client, mut stream, first) = k.registered("the registration").await;
    let mut ids: Vec<String> = sb.enis.iter().map(|e| e.id.clone()).collect();
    ids.sort();
    let all_healthy = |ids: &[String]| {
        ids.iter()
            .map(|id| (id.clone(), "Healthy".to_string()))
            .collect::<Vec<_>>()
    };
    assert_eq!(health(&first), all_healthy(&ids));

    // enimd dies hard. For three seconds (thirty polls): no new list (the
    // kubelet would mark devices unhealthy from one), and the stream open.
    tokio::task::block_in_place(|| agent.kill9());
    match tokio::time::timeout(Duration::from_secs(3), stream.message()).await {
        Err(_) => {}
        Ok(Ok(Some(list))) => panic!("a new list while enimd is down: {list:?}"),
        Ok(Ok(None)) => panic!("the stream ended while enimd is down"),
        Ok(Err(e)) => panic!("the stream failed while enimd is down: {e}"),
    }
    assert!(relay.running(), "it exited: {}", relay.log());
    // Allocate still answers, and a kubelet listing anew gets the same.
    let ask = AllocateRequest {
        container_requests: vec![ContainerAllocateRequest {
            devices_i_ds: vec![ids[0].clone()],
        }],
    };
    let ok = client.allocate(ask).await.unwrap().into_inner();
    assert_eq!(ok.container_responses.len(), 1);
    let mut again = client.list_and_watch(Empty {}).await.unwrap().into_inner();
    let listed = next_list(&mut again, "a list during the outage").await;
    assert_eq!(health(&listed), all_healthy(&ids));
    drop(again);
    let said = relay.log().matches("enimd does not answer").count();
    assert_eq!(said, 1, "the outage not logged once: {}", relay.log());

    // enimd back, with one ENI fewer: the kubelet is told on the same stream.
    let kept = &sb.enis[..2];
    tokio::task::block_in_place(|| {
        common::fixtures::write_config(k.dir.path(), None, kept, "");
        agent.restart();
    });
    let after = next_list(&mut stream, "the list after enimd came back").await;
    let mut kept: Vec<String> = kept.iter().map(|e| e.id.clone()).collect();
    kept.sort();
    assert_eq!(health(&after), all_healthy(&kept));
    assert!(
        relay.log().contains("enimd answers again"),
        "{}",
        relay.log()
    );
    assert!(
        k.seen.try_recv().is_err(),
        "registered again without a reason"
    );

    tokio::task::block_in_place(|| {
        relay.stop();
        agent.stop();
    });
}
