//! Secondary mode over a provider whose addresses are decided outside the
//! agent (the cluster provider, whose operator writes them
//! into the node's NetResourceSet): [`enim_provider::AddressFeed`]. No cloud verb is called: the loop
//! applies what the provider lists whenever it changes.
//!
//! Rules:
//! - the listing is authoritative: a free address it no longer shows leaves
//!   the store on the first look (the operator wants it back); a held one
//!   stays with its pod and is dropped when the pod goes;
//! - the provider hears what the store holds after every change, so it
//!   never reports an address as let go while the store may still hand
//!   it out;
//! - an ENI listed before its device is in the host is looked for again
//!   every `initial_retry` until it is there.

use std::sync::Arc;

use tokio::sync::watch;

use super::host::HostEnis;
use crate::engine::EngineError;

/// The running loop. Dropping it stops the loop.
pub struct FollowFeed {
    stop: watch::Sender<bool>,
}

impl Drop for FollowFeed {
    fn drop(&mut self) {
        self.stop.send_replace(true);
    }
}

impl FollowFeed {
    /// Starts following `host`'s provider, when it has a feed. Must run
    /// inside a tokio runtime.
    pub fn start(host: Arc<HostEnis>) -> Option<FollowFeed> {
        let changes = host.provider.address_feed()?.changes();
        let (stop, stop_rx) = watch::channel(false);
        tokio::spawn(run(host, changes, stop_rx));
        Some(FollowFeed { stop })
    }
}

async fn run(
    host: Arc<HostEnis>,
    mut changes: watch::Receiver<u64>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        // The first pass too: the listing may have moved since restore.
        let pending = match apply(&host).await {
            Ok(pending) => pending,
            Err(e) => {
                tracing::warn!(error = %e, "applying the provider's addresses failed; retrying");
                true
            }
        };
        let wait = if pending {
            host.config.pool.initial_retry
        } else {
            host.config.pool.resync_interval
        };
        tokio::select! {
            changed = changes.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(wait) => {}
            _ = stop.changed() => return,
        }
        if *stop.borrow() {
            return;
        }
    }
}

/// One pass: new ENIs taken in, the store synced to the listing, the
/// provider told. `Ok(true)`: some listed ENI is not in the host yet.
pub(super) async fn apply(host: &HostEnis) -> Result<bool, EngineError> {
    let listed = host.provider.list().await?;
    host.note_listed(&listed);
    let had_ipv6 = host.store().has_ipv6();
    let pending = host.take_in_listed(&listed).await?;
    host.sync_listed(&listed, 1)?;
    if !had_ipv6 && host.store().has_ipv6() {
        // IPv6 forwarding is namespace-wide and was off at restore.
        host.plumbing
            .enable_forwarding(true)
            .await
            .map_err(EngineError::plumbing("enable forwarding"))?;
    }
    host.report_stored();
    Ok(pending > 0)
}

#[cfg(test)]
#[path = "feed_tests.rs"]
mod tests;
