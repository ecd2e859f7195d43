//! `enimd device-plugin`: the kubelet-facing endpoint in a process of its
//! own, so that its lifetime does not follow enimd's. When the process
//! serving ListAndWatch goes away, the kubelet marks every device of the
//! resource unhealthy at once, and a pod admitted in that window is
//! rejected for good; an enimd restart (an upgrade, a crash loop, kill -9)
//! would open that window every time.
//!
//! This process asks enimd for its list (`GET /v1/devices`) every `poll`
//! and serves it with [`super::serve`]. While enimd does not answer it keeps
//! the last list as it was and the stream open: `Allocate` needs nothing
//! from enimd (the ENI is chosen at CNI ADD, which the runtime retries
//! until enimd is back). It registers only once it has had a list, and it
//! refuses to run beside an enimd that serves the kubelet itself.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use enim_api::{Client, ClientError, DeviceList};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{serve, Device, DevicePluginConfig, DevicePluginError, DeviceSource};

/// How long one question to enimd may take.
pub const ANSWER_WITHIN: Duration = Duration::from_secs(5);

/// What `enimd device-plugin` runs with.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// enimd's API socket.
    pub socket: PathBuf,
    /// The kubelet's dir and sockets (`enabled` is not read).
    pub plugin: DevicePluginConfig,
    /// How often enimd is asked for its list.
    pub poll: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error(
        "the enimd at {} serves the kubelet itself ([device_plugin] enabled = true); \
         refusing to run beside it, as each would replace the other's registration: \
         set enabled = false in enimd.toml, or do not run enimd device-plugin",
        socket.display()
    )]
    InProcessPlugin { socket: PathBuf },
    #[error(
        "the enimd at {} hands its ENIs out through DRA ([dra] enabled = true); a node \
         uses DRA or the device plugin, never both (the scheduler would count every ENI \
         twice): do not run enimd device-plugin on this node (remove it from the \
         device plugin DaemonSet's nodes), or set [dra] enabled = false",
        socket.display()
    )]
    DraNode { socket: PathBuf },
    #[error("the poll interval must be more than zero")]
    ZeroPoll,
    #[error("{0}")]
    Plugin(#[from] DevicePluginError),
    /// The plugin's task ended by itself (it panicked, or returned).
    #[error("the device plugin stopped: {0}")]
    Stopped(String),
}

/// Where the list comes from: enimd's API, or a script in tests. Blocking.
pub trait ListDevices: Send + Sync + 'static {
    fn list(&self) -> Result<DeviceList, ClientError>;
}

impl ListDevices for Client {
    fn list(&self) -> Result<DeviceList, ClientError> {
        self.devices()
    }
}

/// The last list enimd gave, as the plugin serves it.
struct Polled {
    resource: String,
    current: Mutex<Vec<Device>>,
    version: watch::Sender<u64>,
}

impl Polled {
    fn new(resource: String, devices: Vec<Device>) -> Arc<Self> {
        Arc::new(Polled {
            resource,
            current: Mutex::new(devices),
            version: watch::channel(0).0,
        })
    }

    /// Takes enimd's new list; subscribers are told only of a change.
    fn set(&self, devices: Vec<Device>) {
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if *current != devices {
            *current = devices;
            self.version.send_modify(|v| *v += 1);
        }
    }
}

impl DeviceSource for Polled {
    fn resource_name(&self) -> String {
        self.resource.clone()
    }

    fn devices(&self) -> Vec<Device> {
        self.current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn subscribe(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }
}

/// The plugin serving one resource.
struct Serving {
    source: Arc<Polled>,
    stop: watch::Sender<bool>,
    task: JoinHandle<Result<(), DevicePluginError>>,
}

impl Serving {
    fn start(config: &DevicePluginConfig, list: DeviceList) -> Serving {
        let source = Polled::new(list.resource_name, list.devices);
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(serve(config.clone(), source.clone(), stopped));
        Serving { source, stop, task }
    }

    /// Stops serving: the plugin's socket goes, and the kubelet's stream ends.
    async fn stop(self) -> Result<(), RelayError> {
        let _ = self.stop.send(true);
        finished(self.task.await)
    }
}

fn finished(
    joined: Result<Result<(), DevicePluginError>, tokio::task::JoinError>,
) -> Result<(), RelayError> {
    match joined {
        Ok(r) => Ok(r?),
        Err(e) => Err(RelayError::Stopped(e.to_string())),
    }
}

/// Asks enimd on a blocking thread (the client runs its own runtime).
async fn ask(enimd: &Arc<dyn ListDevices>) -> Result<DeviceList, String> {
    let enimd = enimd.clone();
    match tokio::task::spawn_blocking(move || enimd.list()).await {
        Ok(r) => r.map_err(|e| enim_core::with_causes(&e)),
        Err(e) => Err(format!("asking enimd failed: {e}")),
    }
}

/// Serves enimd's list to the kubelet until `stop` turns true (or its
/// sender goes). A [`Client`] owns a runtime of its own, which may not be
/// dropped inside another: the caller keeps a reference to `enimd` and
/// drops it after the runtime that ran this returned.
pub async fn run(
    config: RelayConfig,
    enimd: Arc<dyn ListDevices>,
    mut stop: watch::Receiver<bool>,
) -> Result<(), RelayError> {
    if config.poll.is_zero() {
        return Err(RelayError::ZeroPoll);
    }
    let mut serving: Option<Serving> = None;
    // Since when enimd has not answered, once that was logged.
    let mut outage: Option<Instant> = None;
    let mut ticker = tokio::time::interval(config.poll);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let plugin_ended = async {
            match serving.as_mut() {
                Some(s) => (&mut s.task).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = ticker.tick() => {}
            // It only ever turns true (or its sender goes).
            _ = stop.changed() => break,
            joined = plugin_ended => {
                // serve() returns only on stop or a socket it cannot bind.
                finished(joined)?;
                return Err(RelayError::Stopped("it returned while still wanted".into()));
            }
        }
        // A hung enimd holds an answer up to ANSWER_WITHIN: stop meanwhile.
        let answer = tokio::select! {
            answer = ask(&enimd) => answer,
            _ = stop.changed() => break,
        };
        let list = match answer {
            Ok(list) => list,
            Err(error) => {
                if outage.is_none() {
                    outage = Some(Instant::now());
                    match &serving {
                        None => {
                            tracing::info!(%error, "waiting for enimd's device list; registering with the kubelet once there is one")
                        }
                        Some(s) => {
                            tracing::warn!(%error, devices = s.source.devices().len(), "enimd does not answer; the kubelet keeps the last list, as it was, until it does")
                        }
                    }
                }
                continue;
            }
        };
        if let Some(since) = outage.take() {
            if serving.is_some() {
                tracing::info!(
                    after_ms = u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX),
                    "enimd answers again"
                );
            }
        }
        if list.in_process_plugin || list.dra {
            if let Some(s) = serving.take() {
                s.stop().await?;
            }
            let socket = config.socket.clone();
            return Err(match list.dra {
                true => RelayError::DraNode { socket },
                false => RelayError::InProcessPlugin { socket },
            });
        }
        match serving.take() {
            Some(s) if s.source.resource == list.resource_name => {
                s.source.set(list.devices);
                serving = Some(s);
            }
            Some(s) => {
                // The node changed mode: the kubelet learns the new
                // resource from a new registration.
                tracing::info!(from = %s.source.resource, to = %list.resource_name, "enimd's resource changed; registering again");
                s.stop().await?;
                serving = Some(Serving::start(&config.plugin, list));
            }
            None => {
                tracing::info!(resource = %list.resource_name, devices = list.devices.len(), "enimd's device list; serving it to the kubelet");
                serving = Some(Serving::start(&config.plugin, list));
            }
        }
    }
    match serving {
        Some(s) => s.stop().await,
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    /// Answers from a script, then repeats the last one.
    struct Script(Mutex<VecDeque<Option<DeviceList>>>);

    impl ListDevices for Script {
        fn list(&self) -> Result<DeviceList, ClientError> {
            let mut answers = self.0.lock().unwrap();
            let answer = if answers.len() > 1 {
                answers.pop_front().unwrap()
            } else {
                answers.front().cloned().unwrap()
            };
            answer.ok_or_else(|| ClientError::Unreachable {
                socket: "/nowhere/enimd.sock".into(),
                source: std::io::ErrorKind::ConnectionRefused.into(),
            })
        }
    }

    fn list(ids: &[&str], in_process_plugin: bool) -> DeviceList {
        DeviceList {
            resource_name: "enim.io/eni".into(),
            in_process_plugin,
            dra: false,
            devices: ids.iter().copied().map(Device::healthy).collect(),
        }
    }

    fn config(dir: &std::path::Path) -> RelayConfig {
        RelayConfig {
            socket: "/nowhere/enimd.sock".into(),
            plugin: DevicePluginConfig {
                dir: dir.to_path_buf(),
                ..DevicePluginConfig::default()
            },
            poll: Duration::from_millis(10),
        }
    }

    async fn wait_for(what: &str, cond: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !cond() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[test]
    fn a_new_list_bumps_the_watch_only_when_it_changed() {
        let polled = Polled::new("enim.io/eni".into(), list(&["eni-1"], false).devices);
        let mut changes = polled.subscribe();
        polled.set(list(&["eni-1"], false).devices);
        assert!(
            !changes.has_changed().unwrap(),
            "told of a change that was none"
        );
        polled.set(list(&["eni-1", "eni-2"], false).devices);
        assert!(changes.has_changed().unwrap());
        changes.borrow_and_update();
        assert_eq!(polled.devices().len(), 2);
    }

    /// Before enimd ever answers there is no socket in the kubelet's dir
    /// (serve binds it before registering): nothing registers.
    #[tokio::test]
    async fn never_had_a_list_never_serves() {
        let dir = tempfile::tempdir().unwrap();
        let enimd = Arc::new(Script(Mutex::new(
            [None, None, None, None, None, None].into(),
        )));
        let (stop_tx, stop) = watch::channel(false);
        let relay = tokio::spawn(run(config(dir.path()), enimd.clone(), stop));
        wait_for("the script to be read", || {
            enimd.0.lock().unwrap().len() == 1
        })
        .await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !dir.path().join("enim.sock").exists(),
            "served with no list"
        );
        assert!(!relay.is_finished(), "gave up waiting for enimd");
        // enimd answers: the plugin's socket appears.
        *enimd.0.lock().unwrap() = [Some(list(&["eni-1"], false))].into();
        wait_for("the plugin's socket", || {
            dir.path().join("enim.sock").exists()
        })
        .await;
        stop_tx.send(true).unwrap();
        relay.await.unwrap().unwrap();
        assert!(!dir.path().join("enim.sock").exists(), "socket left behind");
    }

    #[tokio::test]
    async fn refuses_an_enimd_that_serves_the_kubelet_itself() {
        let dir = tempfile::tempdir().unwrap();
        let enimd = Arc::new(Script(Mutex::new([Some(list(&["eni-1"], true))].into())));
        let (_stop_tx, stop) = watch::channel(false);
        let err = run(config(dir.path()), enimd, stop).await.unwrap_err();
        assert!(matches!(err, RelayError::InProcessPlugin { .. }), "{err}");
        assert!(err.to_string().contains("enabled = false"), "{err}");
        assert!(!dir.path().join("enim.sock").exists());
    }

    /// An enimd that hands its ENIs out through DRA: the relay refuses at
    /// once, registers nothing, and says what to change.
    #[tokio::test]
    async fn refuses_to_relay_for_a_dra_node() {
        let dir = tempfile::tempdir().unwrap();
        let dra = DeviceList {
            dra: true,
            ..list(&["eni-1"], false)
        };
        let enimd = Arc::new(Script(Mutex::new([Some(dra)].into())));
        let (_stop_tx, stop) = watch::channel(false);
        let err = run(config(dir.path()), enimd, stop).await.unwrap_err();
        assert!(matches!(err, RelayError::DraNode { .. }), "{err}");
        assert!(err.to_string().contains("[dra] enabled = true"), "{err}");
        assert!(!dir.path().join("enim.sock").exists());
    }

    /// enimd turning its own plugin on later stops this one too.
    #[tokio::test]
    async fn stops_when_enimd_later_serves_the_kubelet_itself() {
        let dir = tempfile::tempdir().unwrap();
        let enimd = Arc::new(Script(Mutex::new([Some(list(&["eni-1"], false))].into())));
        let (_stop_tx, stop) = watch::channel(false);
        let relay = tokio::spawn(run(config(dir.path()), enimd.clone(), stop));
        wait_for("the plugin's socket", || {
            dir.path().join("enim.sock").exists()
        })
        .await;
        *enimd.0.lock().unwrap() = [None, Some(list(&["eni-1"], true))].into();
        let err = relay.await.unwrap().unwrap_err();
        assert!(matches!(err, RelayError::InProcessPlugin { .. }), "{err}");
        assert!(!dir.path().join("enim.sock").exists());
    }

    #[tokio::test]
    async fn a_zero_poll_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = config(dir.path());
        config.poll = Duration::ZERO;
        let enimd = Arc::new(Script(Mutex::new([None].into())));
        let (_stop_tx, stop) = watch::channel(false);
        let err = run(config, enimd, stop).await.unwrap_err();
        assert!(matches!(err, RelayError::ZeroPoll), "{err}");
    }
}
