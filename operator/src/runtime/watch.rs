//! The watches every replica keeps running, leader or not: Nodes,
//! NetResourceSets, the DRA driver's ResourceClaims and EniPolicies into caches
//! ([`Caches`]; any event wakes the loop), and the leader Lease into the
//! leader deadline ([`follow_lease`]). A failed watch retries with its
//! own short back-off and keeps what it had: a cache stays as last seen,
//! the deadline runs out.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use enim_crd::{EniPolicy, NetResourceSet};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::runtime::reflector::{self, reflector, Store as Cache};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client};
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use super::RuntimeConfig;
use crate::leader;

/// The watches' retry delays: 500 ms doubling to 5 s, jittered. kube's
/// default grows to 30 s, so after an API server outage the caches (and
/// with them new nodes' ENIs) stayed stale for ~25 s after it was back.
struct WatchBackoff(enim_core::retry::Delays);

impl WatchBackoff {
    fn new() -> WatchBackoff {
        let policy =
            enim_core::retry::Backoff::new(Duration::from_millis(500), Duration::from_secs(5));
        WatchBackoff(policy.delays())
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;
    fn next(&mut self) -> Option<Duration> {
        Some(self.0.next_delay())
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.0.reset();
    }
}

/// Drops what the operator never reads from a Node before it is cached.
fn slim_node(node: &mut Node) {
    node.status = None;
    node.metadata.managed_fields = None;
    node.metadata.annotations = None;
}

/// The watches, kept running on every replica; `changed` fires on every
/// event.
pub(super) struct Caches {
    pub(super) nodes: Cache<Node>,
    pub(super) sets: Cache<NetResourceSet>,
    /// ResourceClaims (DRA): known once listed; a cluster without
    /// resource.k8s.io/v1, or an operator not allowed to list them, runs
    /// without claims.
    pub(super) claims: Cache<ResourceClaim>,
    /// EniPolicies, for the ENIs they keep warm, known once listed; watched
    /// only with the webhook on (`None`: no policy applies to pods, so none
    /// keeps ENIs warm, and the chart grants the watch with the webhook).
    pub(super) policies: Option<Cache<EniPolicy>>,
}

pub(super) fn start_watches(client: &Client, changed: Arc<Notify>, with_policies: bool) -> Caches {
    let (nodes, node_writer) = reflector::store();
    let (sets, set_writer) = reflector::store();
    let (claims, claim_writer) = reflector::store();
    let (policies, policy_writer) = reflector::store();
    let policy_stream = reflector(
        policy_writer,
        watcher(
            Api::<EniPolicy>::all(client.clone()),
            watcher::Config::default(),
        )
        .backoff(WatchBackoff::new())
        .modify(|p: &mut EniPolicy| p.metadata.managed_fields = None),
    );
    let policy_stream = match with_policies {
        true => policy_stream.map_ok(|_| ()).boxed(),
        false => futures::stream::empty().boxed(),
    };
    let claim_stream = reflector(
        claim_writer,
        watcher(
            Api::<ResourceClaim>::all(client.clone()),
            watcher::Config::default(),
        )
        .backoff(WatchBackoff::new())
        .modify(|c: &mut ResourceClaim| c.metadata.managed_fields = None),
    );
    let node_stream = reflector(
        node_writer,
        watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
            .backoff(WatchBackoff::new())
            .modify(slim_node),
    );
    let set_stream = reflector(
        set_writer,
        watcher(
            Api::<NetResourceSet>::all(client.clone()),
            watcher::Config::default(),
        )
        .backoff(WatchBackoff::new()),
    );
    for (what, stream) in [
        ("nodes", node_stream.map_ok(|_| ()).boxed()),
        ("netresourcesets", set_stream.map_ok(|_| ()).boxed()),
        ("resourceclaims", claim_stream.map_ok(|_| ()).boxed()),
        ("enipolicies", policy_stream),
    ] {
        let changed = changed.clone();
        tokio::spawn(async move {
            let mut stream = stream;
            while let Some(event) = stream.next().await {
                match event {
                    Ok(()) => changed.notify_one(),
                    Err(e) => tracing::warn!(watch = what, error = %e, "watch failed; retrying"),
                }
            }
        });
    }
    Caches {
        nodes,
        sets,
        claims,
        policies: with_policies.then_some(policies),
    }
}

/// Follows the leader Lease (a watch of that one object) and publishes
/// the deadline it gives `identity` ([`leader::deadline_of`]): `None`
/// while another replica or nobody holds it. A failed watch keeps the last
/// deadline, which then runs out: a replica cut off from the API server
/// stops leading by itself.
pub(super) fn follow_lease(
    client: &Client,
    config: &RuntimeConfig,
    margin: Duration,
) -> watch::Receiver<Option<Instant>> {
    let (deadline, rx) = watch::channel(None);
    let api: Api<Lease> = Api::namespaced(client.clone(), &config.namespace);
    // A consistent read on (re)list: a cache's older renewal would only
    // give an earlier deadline, but for nothing.
    let watch = watcher::Config::default()
        .fields(&format!("metadata.name={}", config.lease_name))
        .list_semantic(watcher::ListSemantic::MostRecent);
    let stream = watcher(api, watch).backoff(WatchBackoff::new());
    let identity = config.identity.clone();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        // A relist that shows no Lease: it is gone.
        let mut listed = false;
        while let Some(event) = stream.next().await {
            let seen = match event {
                Ok(watcher::Event::Apply(lease) | watcher::Event::InitApply(lease)) => {
                    listed = true;
                    leader::deadline_of(
                        &lease,
                        &identity,
                        margin,
                        SystemTime::now(),
                        Instant::now(),
                    )
                }
                Ok(watcher::Event::Delete(_)) => None,
                Ok(watcher::Event::Init) => {
                    listed = false;
                    continue;
                }
                Ok(watcher::Event::InitDone) if !listed => None,
                Ok(watcher::Event::InitDone) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "lease watch failed; retrying (the leader deadline runs on)");
                    continue;
                }
            };
            deadline.send_replace(seen);
        }
    });
    rx
}
