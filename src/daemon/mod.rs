//! `enimd`: the node agent. It builds the engine over the configured mode's driver, restores and reconciles
//! state before serving ADDs, serves the API on a unix socket, runs the GC
//! loop, and shuts down cleanly on SIGTERM.

pub mod config;
pub mod devices;
pub mod events;
pub mod heap;
pub mod install;
pub mod leave;
pub mod metrics;
pub mod note;
pub mod server;

use std::fs::File;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use enim_api::GcRequest;
use enim_core::ProviderError;
use enim_provider::EniProvider;
use enim_provider_pool::PoolRole;
use enim_provider_static::StaticProvider;
use nix::fcntl::{Flock, FlockArg};
use tokio::net::UnixListener;
use tokio::sync::watch;

use crate::engine::{Driver, Engine, EngineError};
use crate::netlink::rtnl::RtnlPlumbing;
use crate::netlink::PlumbingError;
use crate::primary::masquerade::{self, MasqueradeError};
use crate::primary::servicecidrs::{self, ServiceCidrs};
use crate::primary::PrimaryDriver;
use crate::secondary::SecondaryDriver;
use crate::store::checkpoint::{Checkpoint, CheckpointError};
use crate::support::exclusion::Exclusions;
use config::{Config, ProviderConfig};
use enim_core::atomic_file::FileError;
use server::{AppState, PeerCred};

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("provider: {0}")]
    Provider(#[from] ProviderError),
    #[error("{0}")]
    Checkpoint(#[from] CheckpointError),
    #[error("netlink: {0}")]
    Plumbing(#[from] PlumbingError),
    #[error("startup recovery failed, refusing to serve rather than lose state: {0}")]
    Recovery(#[from] EngineError),
    #[error("another enimd holds {path}")]
    AlreadyRunning { path: PathBuf },
    #[error("{0}")]
    Io(#[from] FileError),
    #[error("{0}")]
    Masquerade(#[from] MasqueradeError),
    #[error("DRA driver: {0}")]
    Dra(#[from] crate::dra::DraError),
    #[error("{0}")]
    Events(#[from] events::EventsError),
    #[error("[host_path] service_cidrs_from_api: {0}")]
    ServiceCidrsClient(#[source] enim_provider_cluster::ClusterError),
}

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> DaemonError + 'a {
    move |source| FileError::at(what, path)(source).into()
}

/// The provider `config` names, for `mode`: in secondary mode a cloud's
/// warm pool holds the node's host ENIs instead of ENIs for pods.
pub async fn build_provider(
    config: &ProviderConfig,
    mode: config::Mode,
) -> Result<Arc<dyn EniProvider>, ProviderError> {
    let role = PoolRole::from(mode);
    match config {
        ProviderConfig::Static { enis } => Ok(Arc::new(StaticProvider::new(enis.clone())?)),
        ProviderConfig::Bce(bce) => enim_provider_bce::build(bce, role).await,
        ProviderConfig::Aws(aws) => enim_provider_aws::build(aws, role).await,
        ProviderConfig::Cluster(cluster) => enim_provider_cluster::build(cluster, mode).await,
    }
}

/// The provider's config with what enimd fills in: BCE's ENI id cache
/// and the cluster provider's spec cache beside the checkpoint unless set,
/// and whether the cluster provider's status says this node serves DRA
/// claims (`[dra] enabled`: the operator makes claims' ENIs only there).
fn provider_config(config: &Config) -> ProviderConfig {
    let mut provider = config.provider.clone();
    let dir = state_dir(config);
    match &mut provider {
        ProviderConfig::Bce(bce) if bce.eni_id_cache.is_none() => {
            bce.eni_id_cache = Some(dir.join("bce-eni-ids.json"));
        }
        ProviderConfig::Cluster(cluster) => {
            cluster.serves_claims = config.dra.enabled;
            if cluster.cache.is_none() {
                cluster.cache = Some(dir.join(enim_provider_cluster::CACHE_FILE));
            }
        }
        _ => {}
    }
    provider
}

/// One agent per checkpoint: an exclusive lock on `<checkpoint>.lock`, held
/// for the life of the process.
fn lock_state(checkpoint: &Path) -> Result<Flock<File>, DaemonError> {
    let path = lock_path(checkpoint);
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io_err("creating state dir", dir))?;
    }
    let file = File::create(&path).map_err(io_err("creating lock file", &path))?;
    Flock::lock(file, FlockArg::LockExclusiveNonblock)
        .map_err(|_| DaemonError::AlreadyRunning { path })
}

/// Binds the API socket with mode 0600 (0660 with a socket group) from the
/// first instant: the umask is tightened around bind, not fixed up after.
fn bind_socket(config: &Config) -> Result<UnixListener, DaemonError> {
    let path = &config.socket;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io_err("creating socket dir", dir))?;
    }
    if path.exists() {
        // A live agent answers; a stale file from a crash does not.
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(DaemonError::AlreadyRunning { path: path.clone() });
        }
        std::fs::remove_file(path).map_err(io_err("removing stale socket", path))?;
    }
    let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o177));
    let bound = UnixListener::bind(path);
    nix::sys::stat::umask(old);
    let listener = bound.map_err(io_err("binding socket", path))?;
    if let Some(gid) = config.socket_group {
        nix::unistd::chown(path, None, Some(nix::unistd::Gid::from_raw(gid)))
            .map_err(|e| io_err("chown socket", path)(e.into()))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
            .map_err(io_err("chmod socket", path))?;
    }
    Ok(listener)
}

/// Installs the SIGTERM/SIGINT handlers now and resolves on the first,
/// logging it with what stopping does (`action`).
pub fn stop_signal(action: &'static str) -> io::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: {action}"),
            _ = int.recv() => tracing::info!("SIGINT: {action}"),
        }
    })
}

/// Runs the agent until SIGTERM or SIGINT.
pub async fn run(config: Config) -> Result<(), DaemonError> {
    let started = Instant::now();
    // The handlers before the socket exists: a stop sent right after start
    // is never fatal.
    let stop = stop_signal("finishing requests in flight")
        .map_err(io_err("installing signal handler", Path::new("-")))?;
    // Lock first: a cloud provider's warm pool starts creating ENIs as soon
    // as it is built, which a second agent on the node must never do.
    let _state_lock = lock_state(&config.checkpoint)?;
    leave::clear_stale(run_dir(&config));
    // Before anything else can fail: a crash loop keeps STATUS answering
    // for the node (docs/architecture.md, "Restarts").
    let note = match note::NoteWriter::new(&config.socket, config.away_bound) {
        Ok(writer) => {
            if let Err(e) = writer.renew() {
                tracing::warn!(note = %writer.path().display(), error = %e, "could not renew the status note");
            }
            Some(writer)
        }
        Err(e) => {
            tracing::warn!(error = %e, "no status note: STATUS cannot answer for enimd while it is away");
            None
        }
    };
    let events = Arc::new(events::AgentEvents::start(&config.events).await?);
    let metrics = Arc::new(metrics::Metrics::with_events(events.sink()));
    // Before the provider: a DRA node that cannot reach the API server or
    // read its claims record must not start handing out ENIs.
    let dra = match config.dra.enabled {
        true => Some(crate::dra::DraNode::start(&config.dra, &claims_file(&config)).await?),
        false => None,
    };
    let mut provider = build_provider(&provider_config(&config), config.mode).await?;
    if let Some(dra) = &dra {
        provider = dra.bind(provider);
    }
    let provider: Arc<dyn EniProvider> =
        Arc::new(metrics::MeteredProvider::new(provider, metrics.clone()));
    let checkpoint = Arc::new(Checkpoint::open(
        &config.checkpoint,
        config.checkpoint_fsync,
    )?);
    {
        let metrics = metrics.clone();
        checkpoint.set_write_observer(Box::new(move |took| metrics.observe_checkpoint_write(took)));
    }
    // The mode is chosen here, once: nothing after this asks which it is.
    let exclusions = Exclusions::from_config(&config.exclude);
    let host_netns = config.host_netns.clone();
    let secondary = config.secondary.clone();
    let host_path = config.host_path.clone();
    let pod_metadata = config.pod_metadata.clone();
    let mode = config.mode;
    let node = Node {
        config,
        checkpoint: checkpoint.clone(),
        metrics,
        started,
        dra,
        note,
        events,
        service_cidrs: None,
        service_cidrs_follower: None,
        masquerade: None,
    };
    match mode {
        config::Mode::Primary => {
            let plumbing = Arc::new(RtnlPlumbing::new(host_netns.as_deref()).await?);
            // Before anything is served: Service traffic of the first pod
            // already needs it. Start-up state, made whole by every start,
            // so no ADD step and no crash point (see primary::masquerade).
            masquerade::apply(&host_path, plumbing.host_netns()).await?;
            let mut node = node;
            node.masquerade = match plumbing.host_netns().try_clone() {
                Ok(netns) => Some((host_path.nft.clone(), netns)),
                Err(e) => {
                    tracing::warn!(error = %e, "no handle on the host netns: an uninstall would leave the masquerade table");
                    None
                }
            };
            let mut driver = PrimaryDriver::new(provider, plumbing, checkpoint, exclusions)
                .with_pod_metadata(pod_metadata);
            if host_path.service_cidrs_from_api {
                let client = enim_provider_cluster::kube_client(host_path.kubeconfig.as_deref())
                    .await
                    .map_err(DaemonError::ServiceCidrsClient)?;
                let (listing, follower) =
                    servicecidrs::follow(client, service_cidrs_cache(&node.config));
                node.service_cidrs = Some(listing.clone());
                node.service_cidrs_follower = Some(follower);
                driver = driver
                    .with_host_path(host_path)
                    .with_service_cidrs(ServiceCidrs::FromApi(listing));
            } else {
                driver = driver.with_host_path(host_path);
            }
            node.serve(driver, stop).await
        }
        config::Mode::Secondary => {
            // Nor a masquerade table: a secondary-mode pod's only interface
            // is a veth to the host, so its replies pass the node's
            // conntrack anyway (a table left by an earlier primary-mode
            // run matches only host path veths, which this mode never makes).
            if host_path.enabled() {
                tracing::warn!("[host_path] is for primary mode and ignored in secondary mode: its pods reach Services and the node over their veth already");
            }
            let host_netns = host_netns.as_deref();
            let driver =
                SecondaryDriver::over_host(secondary, host_netns, provider, checkpoint, exclusions)
                    .await?
                    .with_pod_metadata(pod_metadata);
            node.serve(driver, stop).await
        }
    }
}

/// Keeps the status note: enimd's judgement of the network, looked at
/// every second and written when it changes (so a note read after enimd's
/// death is at most a second behind it), and renewed every heartbeat
/// regardless, from recovery's end until enimd stops. A failed write is
/// logged once per run of failures.
async fn keep_note<D: Driver>(
    writer: note::NoteWriter,
    engine: Arc<Engine<D>>,
    mut stop: watch::Receiver<bool>,
) {
    let mut ticker = tokio::time::interval(std::time::Duration::from_secs(1));
    let mut written: Option<(enim_api::Serving, Instant)> = None;
    let mut failing = false;
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = stop.changed() => return,
        }
        let serving = note::judge_engine(&engine).await;
        let due = written
            .as_ref()
            .is_none_or(|(last, at)| *last != serving || at.elapsed() >= enim_api::note::HEARTBEAT);
        if !due {
            continue;
        }
        let w = writer.clone();
        let s = serving.clone();
        match tokio::task::spawn_blocking(move || w.write(s)).await {
            Ok(Ok(())) => {
                failing = false;
                written = Some((serving, Instant::now()));
            }
            Ok(Err(e)) if !failing => {
                failing = true;
                tracing::warn!(note = %writer.path().display(), error = %e, "could not write the status note; retrying");
            }
            Err(e) if !failing => {
                failing = true;
                tracing::warn!(error = %e, "status note task failed; retrying");
            }
            _ => {}
        }
    }
}

/// Refreshes every attachment (their host paths' routes) at the first
/// listing of the API's service CIDRs and at each change after it, so a
/// range added to the cluster reaches running pods too; failures are
/// retried every [`REFRESH_RETRY`].
async fn follow_service_cidrs<D: Driver>(
    engine: Arc<Engine<D>>,
    mut listing: watch::Receiver<servicecidrs::ApiState>,
    mut stop: watch::Receiver<bool>,
) {
    tokio::select! {
        listed = listing.wait_for(|s| s.cidrs.is_some()) => if listed.is_err() { return },
        _ = stop.changed() => return,
    }
    loop {
        listing.mark_unchanged();
        let (changed, failed) = engine.refresh().await;
        if changed > 0 || failed > 0 {
            tracing::info!(
                changed,
                failed,
                "attachments refreshed for the service CIDRs"
            );
        }
        let retry = async {
            match failed {
                0 => std::future::pending().await,
                _ => tokio::time::sleep(REFRESH_RETRY).await,
            }
        };
        tokio::select! {
            changed = listing.changed() => if changed.is_err() { return },
            _ = retry => {}
            _ = stop.changed() => return,
        }
    }
}

/// How soon a refresh that failed for some attachment is tried again.
const REFRESH_RETRY: std::time::Duration = std::time::Duration::from_secs(10);

/// What serving needs besides the driver.
struct Node {
    config: Config,
    checkpoint: Arc<Checkpoint>,
    metrics: Arc<metrics::Metrics>,
    started: Instant,
    dra: Option<crate::dra::DraNode>,
    note: Option<note::NoteWriter>,
    events: Arc<events::AgentEvents>,
    /// The API's service CIDRs, when host paths follow them: each change
    /// refreshes the attachments.
    service_cidrs: Option<watch::Receiver<servicecidrs::ApiState>>,
    /// Its task, stopped at shutdown before enimd may remove its files.
    service_cidrs_follower: Option<servicecidrs::Follower>,
    /// Primary mode: where the masquerade table is (`nft`, the netns),
    /// removed if enim is uninstalled.
    masquerade: Option<(PathBuf, crate::netlink::netns::Netns)>,
}

impl Node {
    /// Serves the API over `driver` until `stop` resolves.
    async fn serve<D: Driver>(
        self,
        driver: D,
        stop: impl std::future::Future<Output = ()>,
    ) -> Result<(), DaemonError> {
        let Node {
            config,
            checkpoint,
            metrics,
            started,
            dra,
            note,
            events,
            service_cidrs,
            service_cidrs_follower,
            masquerade,
        } = self;
        let engine = Arc::new(Engine::new(driver, checkpoint));

        // Listen first so early requests queue (bounded) instead of failing to
        // connect, then restore before anything is served.
        let listener = bind_socket(&config)?;
        let (ready_tx, ready_rx) = watch::channel(false);
        let heap = Arc::new(heap::Trimmer::default());
        tokio::spawn(heap.clone().run());
        // Start-up is a burst like any other: recovery (thousands of
        // records at once), then the first device refresh, the plugins'
        // registration and the watches allocate once, and the heap is
        // trimmed once they have all gone quiet.
        let startup = heap.busy();
        let ready_rx_for_health = ready_rx.clone();
        // The device plugin's view of the node: served to the kubelet by
        // the plugin in this process when it is on, and on the API socket
        // (`GET /v1/devices`) to `enimd device-plugin` either way.
        let devices = devices::EngineDevices::new(D::MODE);
        let state = Arc::new(AppState {
            engine: engine.clone(),
            devices: devices.clone(),
            in_process_plugin: config.device_plugin.enabled,
            dra: config.dra.enabled,
            ready: ready_rx,
            allowed_uids: config.allowed_uids.clone(),
            startup_wait: config.startup_wait,
            allocation_expiry: config.allocation_expiry,
            gc_grace: config.gc_grace,
            metrics: metrics.clone(),
            heap: heap.clone(),
            started,
            events: events.clone(),
        });
        let (stop_tx, stop_rx) = watch::channel(false);
        let app = server::router(state).into_make_service_with_connect_info::<PeerCred>();
        let mut server_stop = stop_rx.clone();
        let mut gc_stop = stop_rx.clone();
        let server = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = server_stop.changed().await;
                })
                .await
        });
        tracing::info!(socket = %config.socket.display(), "listening");
        if let Some(address) = config.metrics_address {
            let listener = tokio::net::TcpListener::bind(address)
                .await
                .map_err(|source| FileError {
                    what: "binding metrics listener",
                    path: PathBuf::from(address.to_string()),
                    source,
                })?;
            let app = metrics::router(metrics.clone(), engine.clone(), ready_rx_for_health.clone());
            let mut stop = stop_rx.clone();
            tokio::spawn(async move {
                let serve = axum::serve(listener, app).with_graceful_shutdown(async move {
                    let _ = stop.changed().await;
                });
                if let Err(e) = serve.await {
                    tracing::error!(error = %e, "metrics listener failed");
                }
            });
            tracing::info!(%address, "serving /metrics, /healthz, /readyz");
        }

        crate::support::fault::crash_point("startup:before-recover");
        let report = engine.recover().await?;
        let gc = engine.gc(&GcRequest::default(), config.gc_grace).await;
        metrics.observe_gc(&gc);
        tracing::info!(
            ?report,
            collected = gc.collected.len(),
            orphans = gc.orphans_released.len(),
            ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            "state restored; serving"
        );
        let _ = ready_tx.send(true);
        if let Some(writer) = note {
            tokio::spawn(keep_note(writer, engine.clone(), stop_rx.clone()));
        }
        if config.events.enabled {
            tokio::spawn(events::watch_quarantines(
                events,
                engine.provider().clone(),
                config.events.quarantine_check,
                stop_rx.clone(),
            ));
        }

        if let Some(listing) = service_cidrs {
            tokio::spawn(follow_service_cidrs(
                engine.clone(),
                listing,
                stop_rx.clone(),
            ));
        }

        // Listed, and advertised, only once recovery is done: before, the
        // list is not known.
        tokio::spawn(devices.clone().run(engine.clone(), stop_rx.clone()));
        let mut dra_plugin = None;
        if let Some(dra) = dra {
            use crate::deviceplugin::DeviceSource;
            let m = metrics.clone();
            let observe: crate::dra::plugin::Observer =
                Arc::new(move |verb, started, ok| m.observe_request(verb, started, ok));
            dra_plugin = Some(dra.spawn(
                engine.clone(),
                devices.subscribe(),
                Some(observe),
                stop_rx.clone(),
            ));
        }
        if config.device_plugin.enabled {
            let plugin =
                crate::deviceplugin::serve(config.device_plugin.clone(), devices, stop_rx.clone());
            tokio::spawn(async move {
                if let Err(e) = plugin.await {
                    tracing::error!(error = %e, "device plugin stopped");
                }
            });
        }

        drop(startup);

        if !config.gc_interval.is_zero() {
            let engine = engine.clone();
            let metrics = metrics.clone();
            let (interval, grace) = (config.gc_interval, config.gc_grace);
            tokio::spawn(async move {
                let mut ticker = tokio::time::interval(interval);
                ticker.tick().await;
                loop {
                    tokio::select! {
                        _ = ticker.tick() => {
                            metrics.observe_gc(&engine.gc(&GcRequest::default(), grace).await);
                            // Retries a write-behind that failed (a full disk).
                            if let Err(e) = engine.checkpoint().flush().await {
                                tracing::error!(error = %e, "checkpoint write failed; retrying next tick");
                            }
                            heap::release_free_heap();
                        }
                        _ = gc_stop.changed() => break,
                    }
                }
            });
        }

        stop.await;
        let _ = stop_tx.send(true);
        match server.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!(error = %e, "server error"),
            Err(e) => tracing::error!(error = %e, "server task failed"),
        }
        // The DRA plugin's sockets go before enimd does: the kubelet sees
        // the plugin leave, and a stale socket never answers it.
        if let Some(plugin) = dra_plugin {
            let _ = tokio::time::timeout(std::time::Duration::from_secs(5), plugin).await;
        }
        // Requests are finished: land the outcomes still written behind.
        if let Err(e) = engine.checkpoint().flush().await {
            tracing::error!(error = %e, "final checkpoint write failed; recovery will finish the recorded intents");
        }
        let _ = std::fs::remove_file(&config.socket);
        if let Some(follower) = service_cidrs_follower {
            follower.stop().await;
        }
        if leave::requested(run_dir(&config)) {
            let leftovers = leave::Leftovers {
                files: state_files(&config),
                masquerade,
            };
            leave::leave(&engine, leftovers).await;
        }
        tracing::info!("stopped");
        Ok(())
    }
}

fn lock_path(checkpoint: &Path) -> PathBuf {
    PathBuf::from(format!("{}.lock", checkpoint.display()))
}

/// The agent's state dir: the checkpoint's, where its caches go too.
fn state_dir(config: &Config) -> &Path {
    config.checkpoint.parent().unwrap_or(Path::new("."))
}

/// The DRA driver's claims record: `[dra] claims`, else in the state dir.
fn claims_file(config: &Config) -> PathBuf {
    config
        .dra
        .claims
        .clone()
        .unwrap_or_else(|| state_dir(config).join(crate::dra::CLAIMS_FILE))
}

/// The last listing of the API's service CIDRs, in the state dir.
fn service_cidrs_cache(config: &Config) -> PathBuf {
    state_dir(config).join(servicecidrs::CACHE_FILE)
}

/// The agent's run dir: its socket's, where the uninstall marker goes.
fn run_dir(config: &Config) -> &Path {
    config.socket.parent().unwrap_or(Path::new("."))
}

/// Every file the agent keeps on the node, for an uninstall to remove: the
/// checkpoint and its lock, the caches beside it, the status note and the
/// uninstall marker.
fn state_files(config: &Config) -> Vec<PathBuf> {
    let mut files = vec![
        config.checkpoint.clone(),
        lock_path(&config.checkpoint),
        claims_file(config),
        service_cidrs_cache(config),
        enim_api::note::note_path(&config.socket),
        leave::marker_path(run_dir(config)),
    ];
    match provider_config(config) {
        ProviderConfig::Bce(bce) => files.extend(bce.eni_id_cache),
        ProviderConfig::Cluster(cluster) => files.extend(cluster.cache),
        ProviderConfig::Static { .. } | ProviderConfig::Aws(_) => {}
    }
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cluster provider's status says the node serves DRA claims
    /// exactly when `[dra]` is on: the operator makes claims' ENIs only
    /// on such nodes.
    #[test]
    fn the_cluster_provider_serves_claims_exactly_when_dra_is_on() {
        let cluster = "[provider]\ntype = \"cluster\"\nnode_name = \"n1\"\n";
        let serves = |text: &str| match provider_config(&Config::parse(text).unwrap()) {
            ProviderConfig::Cluster(c) => c.serves_claims,
            other => panic!("{other:?}"),
        };
        assert!(!serves(cluster));
        assert!(!serves(&format!("[dra]\nenabled = false\n{cluster}")));
        assert!(serves(&format!(
            "[dra]\nenabled = true\nnode_name = \"n1\"\n{cluster}"
        )));
        // Not something a config file can say.
        let forged = format!("{cluster}serves_claims = true\n");
        assert!(Config::parse(&forged).is_err());
    }
}
