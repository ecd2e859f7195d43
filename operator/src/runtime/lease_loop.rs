//! [`run`]: the process's loop under the leader lease. Every replica binds
//! the health endpoint, follows the Lease and keeps its caches warm; the
//! one whose [`Leadership`] holds resyncs on every change (debounced) and
//! at least every resync interval. A stop (SIGTERM, ctrl-c) or a lost
//! leadership drops the pass in flight: what it leaves half done is what
//! a crash leaves, and its intents let the next leader finish it.

use std::sync::Arc;
use std::time::Duration;

use enim_crd::OPERATOR_MANAGER;
use enim_events::{EventSink, SinkLimits};
use kube::Client;
use tokio::sync::Notify;

use super::events::Teller;
use super::health::{serve_health, Health};
use super::resync::{resync_once, Resync};
use super::store::KubeStore;
use super::watch::{follow_lease, start_watches};
use super::{RuntimeConfig, RuntimeError};
use crate::allocator;
use crate::leader::{self, Leadership};
use crate::store::{Store, StoreError};

/// Runs the operator until SIGTERM (or ctrl-c): watches, lease, resyncs.
/// `make` builds the resync over the store the runtime writes through.
pub async fn run<F>(config: RuntimeConfig, client: Client, make: F) -> Result<(), RuntimeError>
where
    F: FnOnce(Arc<dyn Store>) -> Result<Arc<dyn Resync>, allocator::Error>,
{
    // First, so that a SIGTERM during start-up is a clean stop, not the
    // default action's death.
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    // Events are queued and posted by a task of their own: a resync never
    // waits on them.
    let reporter = kube::runtime::events::Reporter {
        controller: OPERATOR_MANAGER.into(),
        instance: Some(config.identity.clone()),
    };
    let sink = EventSink::start(client.clone(), reporter, SinkLimits::default());
    let health = Arc::new(Health::new(&sink));
    let listener = tokio::net::TcpListener::bind(config.health_addr)
        .await
        .map_err(|source| RuntimeError::Health {
            addr: config.health_addr,
            source,
        })?;
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "serving /healthz, /readyz and /metrics");
    }

    let secs = |d: Duration| d.as_secs().max(1);
    let grace = Duration::from_secs(secs(config.lease_grace));
    let deadline = follow_lease(&client, &config, leader::margin(grace));
    // The health endpoint reads the deadline only: a clone of the lease
    // manager's flag held there would keep the lease from being released
    // at the stop.
    tokio::spawn(serve_health(listener, health.clone(), deadline.clone()));

    let changed = Arc::new(Notify::new());
    let caches = start_watches(&client, changed.clone(), config.webhook.is_some());

    let lease_err = |source| RuntimeError::Lease {
        name: config.lease_name.clone(),
        namespace: config.namespace.clone(),
        source,
    };
    let manager = kube_lease_manager::LeaseManagerBuilder::new(client.clone(), &config.lease_name)
        .with_namespace(&config.namespace)
        .with_identity(&config.identity)
        .with_duration(secs(config.lease_duration))
        .with_grace(grace.as_secs())
        .with_field_manager(format!("{OPERATOR_MANAGER}-lease"))
        .build()
        .await
        .map_err(lease_err)?;
    let (flag, lease_task) = manager.watch().await;
    let leadership = Leadership::new(flag, deadline);
    let me = enim_events::object_ref(
        "v1",
        "Pod",
        Some(&config.namespace),
        &config.identity,
        config.pod_uid.as_deref(),
    );
    let teller = Teller::new(sink, caches.sets.clone(), me);
    let store: Arc<dyn Store> =
        Arc::new(KubeStore::new(client.clone(), leadership.clone(), teller));
    let resync = make(store.clone())?;

    // The webhook runs on every replica; what only the leader does in it
    // follows this flag.
    let (webhook_leader, leading) = tokio::sync::watch::channel(false);
    let (stop_webhook, webhook_stop) = tokio::sync::watch::channel(false);
    health
        .webhook
        .set(if config.webhook.is_some() { 0 } else { -1 });
    let webhook = config.webhook.clone().map(|settings| {
        let client = client.clone();
        let serving = health.webhook.clone();
        let webhook_metrics = health.webhook_metrics.clone();
        tokio::spawn(async move {
            let metrics = (serving, webhook_metrics);
            if let Err(e) =
                crate::policy::run(client, settings, leading, webhook_stop, metrics).await
            {
                tracing::error!(error = %e, "the EniPolicy webhook stopped");
            }
        })
    });

    let mut was_leader = false;
    loop {
        let lead = leadership.check();
        let is_leader = lead.is_ok();
        webhook_leader.send_replace(is_leader);
        health.leader.set(i64::from(is_leader));
        if is_leader != was_leader {
            match &lead {
                Ok(_) => {
                    tracing::info!(identity = %config.identity, leader = true, "leadership changed")
                }
                Err(e) => {
                    tracing::warn!(identity = %config.identity, leader = false, reason = %e, "leadership changed");
                    if matches!(e, StoreError::PastDeadline(_)) {
                        health.deadline_misses.inc();
                    }
                    resync.deposed();
                }
            }
            was_leader = is_leader;
        }
        let pass = async {
            let synced = caches.nodes.wait_until_ready().await.is_ok()
                && caches.sets.wait_until_ready().await.is_ok();
            health.synced.set(i64::from(synced));
            health.observe_sets(&caches.sets.state());
            if is_leader && synced {
                resync_once(&*resync, &caches, &health).await;
            }
        };
        // A stop does not wait for the caches (the API server may be down)
        // or for a resync (its cloud calls may wait on the buckets): what a
        // resync leaves half done is what a crash leaves, and its intents
        // let the next leader finish it. Nor does a lost leadership: past
        // the deadline a follower may lead, and the pass's next call (a
        // retry or the second step of a create or delete included) must
        // not be sent. Biased: at the deadline, no further poll of the pass.
        tokio::select! {
            biased;
            () = &mut shutdown => {
                tracing::info!("stopping mid-pass: the next leader finishes from the intents");
                break;
            }
            () = leadership.lost(), if is_leader => {
                tracing::warn!("leadership lost mid-pass: the pass is abandoned, its intents left for the next leader");
                continue;
            }
            () = pass => {}
        }
        tokio::select! {
            biased;
            () = &mut shutdown => break,
            r = leadership.flipped(is_leader) => if r.is_err() { break },
            _ = changed.notified() => tokio::time::sleep(config.debounce).await,
            _ = tokio::time::sleep(config.resync_interval) => {}
        }
    }
    // Dropping the receivers makes the lease manager release the lease, so
    // the follower takes over at once instead of after its expiry.
    stop_webhook.send_replace(true);
    if let Some(webhook) = webhook {
        let _ = tokio::time::timeout(Duration::from_secs(5), webhook).await;
    }
    drop(resync);
    drop(store);
    drop(leadership);
    let _ = tokio::time::timeout(Duration::from_secs(5), lease_task).await;
    tracing::info!("stopped");
    Ok(())
}

/// Resolves at SIGTERM or ctrl-c. The handlers are installed when this is
/// called, not when it is first polled.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let term = signal(SignalKind::terminate());
    let interrupt = signal(SignalKind::interrupt());
    async move {
        match (term, interrupt) {
            (Ok(mut term), Ok(mut interrupt)) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = interrupt.recv() => {}
                }
            }
            (Err(e), _) | (_, Err(e)) => {
                tracing::error!(error = %e, "no signal handler: the operator stops only when killed");
                std::future::pending::<()>().await;
            }
        }
    }
}
