//! `enimd`: the node agent. It owns the manager, restores and reconciles
//! state before serving ADDs, serves the API on a unix socket, runs the GC
//! loop, and shuts down cleanly on SIGTERM.

pub mod config;
pub mod heap;
pub mod install;
pub mod metrics;
pub mod server;

use std::fs::File;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use enim_provider::{EniProvider, ProviderError};
use enim_provider_static::StaticProvider;
use nix::fcntl::{Flock, FlockArg};
use tokio::net::UnixListener;
use tokio::sync::watch;

use crate::api::GcRequest;
use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::manager::{EniManager, ManagerError};
use crate::netlink::rtnl::RtnlPlumbing;
use crate::netlink::{Host, PlumbingError};
use crate::secondary::plumbing::RtnlSecondary;
use config::{Config, ProviderConfig};
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
    Recovery(#[from] ManagerError),
    #[error("another enimd holds {path}")]
    AlreadyRunning { path: PathBuf },
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: io::Error,
    },
}

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> DaemonError + 'a {
    move |source| DaemonError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

pub async fn build_provider(
    config: &ProviderConfig,
) -> Result<Arc<dyn EniProvider>, ProviderError> {
    match config {
        ProviderConfig::Static { enis } => Ok(Arc::new(StaticProvider::new(enis.clone())?)),
        ProviderConfig::Bce(bce) => enim_provider_bce::build(bce).await,
        ProviderConfig::Aws(aws) => enim_provider_aws::build(aws).await,
    }
}

/// One agent per checkpoint: an exclusive lock on `<checkpoint>.lock`, held
/// for the life of the process.
fn lock_state(checkpoint: &Path) -> Result<Flock<File>, DaemonError> {
    let path = PathBuf::from(format!("{}.lock", checkpoint.display()));
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

/// Installs the SIGTERM/SIGINT handlers now (before the socket exists, so a
/// stop sent right after start is never fatal) and resolves on the first.
fn stop_signal() -> Result<impl std::future::Future<Output = ()>, DaemonError> {
    use tokio::signal::unix::{signal, SignalKind};
    let handler = |kind| signal(kind).map_err(io_err("installing signal handler", Path::new("-")));
    let mut term = handler(SignalKind::terminate())?;
    let mut int = handler(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: finishing requests in flight"),
        _ = int.recv() => tracing::info!("SIGINT: finishing requests in flight"),
        }
    })
}

/// Runs the agent until SIGTERM or SIGINT.
pub async fn run(config: Config) -> Result<(), DaemonError> {
    let started = Instant::now();
    let stop = stop_signal()?;
    // Lock first: a cloud provider's warm pool starts creating ENIs as soon
    // as it is built, which a second agent on the node must never do.
    let _state_lock = lock_state(&config.checkpoint)?;
    let metrics = Arc::new(metrics::Metrics::new());
    let provider: Arc<dyn EniProvider> = Arc::new(metrics::MeteredProvider::new(
        build_provider(&config.provider).await?,
        metrics.clone(),
    ));
    let checkpoint = Arc::new(Checkpoint::open(
        &config.checkpoint,
        config.checkpoint_fsync,
    )?);
    {
        let metrics = metrics.clone();
        checkpoint.set_write_observer(Box::new(move |took| metrics.observe_checkpoint_write(took)));
    }
    // One host socket and dump lock for both modes' plumbing.
    let host = Host::open(config.host_netns.as_deref()).await?;
    let plumbing = Arc::new(RtnlPlumbing::from_host(host.clone()));
    let manager = EniManager::new(provider.clone(), plumbing, checkpoint.clone())
        .with_exclusions(crate::exclusion::Exclusions::from_config(&config.exclude));
    let manager = Arc::new(match config.mode {
        config::Mode::Primary => manager,
        config::Mode::Secondary => manager.with_secondary(Arc::new(
            crate::secondary::manager::SecondaryManager::new(
                config.secondary.clone(),
                provider,
                Arc::new(RtnlSecondary::from_host(host)),
                checkpoint,
            )?
            .with_exclusions(crate::exclusion::Exclusions::from_config(&config.exclude)),
        )),
    });

    // Listen first so early requests queue (bounded) instead of failing to
    // connect, then restore before anything is served.
    let listener = bind_socket(&config)?;
    let (ready_tx, ready_rx) = watch::channel(false);
    let heap = Arc::new(heap::Trimmer::default());
    tokio::spawn(heap.clone().run());
    let ready_rx_for_health = ready_rx.clone();
    let state = Arc::new(AppState {
        manager: manager.clone(),
        ready: ready_rx,
        allowed_uids: config.allowed_uids.clone(),
        startup_wait: config.startup_wait,
        allocation_expiry: config.allocation_expiry,
        gc_grace: config.gc_grace,
        metrics: metrics.clone(),
        heap: heap.clone(),
        started,
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
            .map_err(|source| DaemonError::Io {
                what: "binding metrics listener",
                path: PathBuf::from(address.to_string()),
                source,
            })?;
        let app = metrics::router(
            metrics.clone(),
            manager.clone(),
            ready_rx_for_health.clone(),
        );
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

    crate::fault::crash_point("startup:before-recover");
    let report = manager.recover().await?;
    let gc = manager.gc(&GcRequest::default(), config.gc_grace).await;
    metrics.observe_gc(&gc);
    tracing::info!(
        ?report,
        collected = gc.collected.len(),
        orphans = gc.orphans_released.len(),
        ms = started.elapsed().as_millis() as u64,
        "state restored; serving"
    );
    heap::release_free_heap();
    let _ = ready_tx.send(true);

    if !config.gc_interval.is_zero() {
        let manager = manager.clone();
        let metrics = metrics.clone();
        let (interval, grace) = (config.gc_interval, config.gc_grace);
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(interval);
            ticker.tick().await;
            loop {
                tokio::select! {
                    _ = ticker.tick() => {
                        metrics.observe_gc(&manager.gc(&GcRequest::default(), grace).await);
                        // Retries a write-behind that failed (a full disk).
                        if let Err(e) = manager.checkpoint().flush().await {
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
    // Requests are finished: land the outcomes still written behind.
    if let Err(e) = manager.checkpoint().flush().await {
        tracing::error!(error = %e, "final checkpoint write failed; recovery will finish the recorded intents");
    }
    let _ = std::fs::remove_file(&config.socket);
    tracing::info!("stopped");
    Ok(())
}
