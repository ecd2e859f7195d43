//! The warm address pool of secondary mode on a cloud: keeps free
//! secondary addresses ahead of demand, attaches another ENI when the
//! attached ones are full, and gives surplus addresses back.
//!
//! The watermarks are CCE/cilium IPAM's, enim-core's [`Watermarks`]:
//! `pre_allocate` free addresses ahead of demand (PreAllocate), at least
//! `min_allocate` addresses held (MinAllocate), and up to
//! `max_above_watermark` free ones beyond `pre_allocate` before the
//! surplus is released (MaxAboveWatermark).
//! Counts are in pod slots: on a dual-stack node a slot is an IPv4 and an
//! IPv6 address of the same ENI.
//!
//! Safety rules:
//! - an address leaves the [`DataStore`] before it is unassigned, under the
//!   store's lock, so no pod can be given it meanwhile; only free
//!   addresses past their cooldown are taken;
//! - an address the cloud assigned joins the store after the call returns;
//!   a crash in between leaves it assigned in the cloud, where the next
//!   start (or the next check) finds it on its ENI: it is never leaked.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use enim_api::model::AttachmentKey;
use enim_core::retry::{pause, Backoff, Pause};
use enim_core::watermarks::{Level, Watermarks};
use enim_core::AddressCount;
use enim_core::{AddressLimits, ProviderError};
use enim_provider::SecondaryIps;
use serde::{Deserialize, Serialize};
use tokio::sync::{watch, Notify};

use super::datastore::{DataStoreError, EniUsage, MISSING_CHECKS};
use super::host::HostEnis;
use crate::engine::EngineError;
use crate::support::fault::crash_point;

/// How long a pod told "try again later" counts as demand: the kubelet
/// retries a failed sandbox within about 15 s.
pub const WAITING_TTL: Duration = Duration::from_secs(60);

/// Steps in one round at most, so a cloud that answers oddly (assigns
/// nothing, say) cannot keep the loop spinning.
const MAX_STEPS_PER_ROUND: usize = 16;

/// The `[secondary.pool]` table: watermarks and loop timing of the warm
/// address pool. Used only with a provider that assigns addresses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct WarmIpConfig {
    /// Free slots kept ahead of demand (PreAllocate).
    pub pre_allocate: u32,
    /// Slots the node holds at least, used or not (MinAllocate).
    pub min_allocate: u32,
    /// Free slots kept beyond `pre_allocate` before the surplus goes back
    /// to the cloud (MaxAboveWatermark).
    pub max_above_watermark: u32,
    /// Addresses asked for in one call at most: a burst is served by a few
    /// large calls, not many small ones.
    pub max_batch: usize,
    /// Secondary addresses per ENI at most, below the instance type's
    /// limit (keeps ENIs less dense, e.g. for security-group planning).
    ///
    /// Default: the instance type's limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_per_eni: Option<usize>,
    /// The longest pause between checks when nothing happens (jittered);
    /// checks on this timer also compare the addresses with the cloud's
    /// view (drift).
    #[serde(with = "humantime_serde")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub resync_interval: Duration,
    /// The first retry after a failed check, doubling per failure
    /// (jittered).
    #[serde(with = "humantime_serde")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub initial_retry: Duration,
    /// The longest retry step.
    #[serde(with = "humantime_serde")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub max_backoff: Duration,
    /// How long an ADD with no free slot waits for the pool's next check
    /// to assign one, or for an address's `cooldown` to end (also with
    /// the operator's addresses), before answering "try again later" (the
    /// kubelet retries only 10-15 s later). `"0s"` turns the wait off; at
    /// most 25 s.
    #[serde(with = "humantime_serde")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub allocate_wait: Duration,
}

impl Default for WarmIpConfig {
    fn default() -> Self {
        WarmIpConfig {
            pre_allocate: 4,
            min_allocate: 0,
            max_above_watermark: 4,
            max_batch: 10,
            max_per_eni: None,
            resync_interval: Duration::from_secs(30),
            initial_retry: Duration::from_secs(1),
            max_backoff: Duration::from_secs(60),
            allocate_wait: Duration::from_secs(10),
        }
    }
}

impl WarmIpConfig {
    /// The pool's watermarks, in pod slots.
    pub fn watermarks(&self) -> Watermarks {
        Watermarks {
            pre_allocate: self.pre_allocate,
            min_allocate: self.min_allocate,
            max_above_watermark: self.max_above_watermark,
        }
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.max_batch == 0 {
            return Err("[secondary.pool] max_batch must be at least 1".into());
        }
        if self.max_per_eni == Some(0) {
            return Err("[secondary.pool] max_per_eni must be at least 1".into());
        }
        for (name, d) in [
            ("resync_interval", self.resync_interval),
            ("initial_retry", self.initial_retry),
        ] {
            if d.is_zero() {
                return Err(format!("[secondary.pool] {name} must be above zero"));
            }
        }
        enim_core::check_allocate_wait(self.allocate_wait)
            .map_err(|e| format!("[secondary.pool] {e}"))?;
        enim_core::check_at_least(
            ("max_backoff", self.max_backoff),
            ("initial_retry", self.initial_retry),
        )
        .map_err(|e| format!("[secondary.pool] {e}"))
    }
}

/// What the pool does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolStep {
    /// Assign this many new addresses of each family to the ENI.
    Assign {
        eni_id: String,
        ipv4: usize,
        ipv6: usize,
    },
    /// Every ENI is full and the instance has room: attach another.
    AttachEni,
    /// Give this many free addresses of each family of the ENI back.
    Release {
        eni_id: String,
        ipv4: usize,
        ipv6: usize,
    },
    /// Nothing to do (or nothing possible: the node is full).
    Idle,
}

/// What the planner knows of the node besides the store.
#[derive(Debug, Clone, Copy)]
pub struct NodeView {
    pub limits: AddressLimits,
    /// Slots are an IPv4 and an IPv6 address each.
    pub dual_stack: bool,
    /// ENIs attached to the instance, its primary interface included.
    pub attached_enis: usize,
    /// Pods told "try again later" for want of an address, not yet served.
    pub waiting: usize,
}

fn slots(u: &EniUsage, dual: bool) -> (usize, usize) {
    if dual {
        (u.ipv4.min(u.ipv6), u.free4.min(u.free6))
    } else {
        (u.ipv4, u.free4)
    }
}

/// The next step toward the watermarks, from the store's usage. Pure, so
/// the policy is tested without a cloud.
pub fn plan(config: &WarmIpConfig, usage: &[EniUsage], node: &NodeView) -> PoolStep {
    let dual = node.dual_stack;
    let (total, free) = usage.iter().fold((0, 0), |(t, f), u| {
        let (ut, uf) = slots(u, dual);
        (t + ut, f + uf)
    });
    let watermarks = config.watermarks();
    let level = Level {
        free,
        total,
        waiting: node.waiting,
    };
    let deficit = watermarks.deficit(level);
    if deficit > 0 {
        // Room per ENI, in slots: the ENI's own addresses count toward the
        // instance type's per-interface limits.
        let cap = config.max_per_eni.unwrap_or(usize::MAX);
        let room = |u: &EniUsage| {
            let v4 = node
                .limits
                .secondary_ipv4_per_eni()
                .min(cap)
                .saturating_sub(u.ipv4);
            if dual {
                let v6 = node.limits.ipv6_per_eni.saturating_sub(1).min(cap);
                v4.min(v6.saturating_sub(u.ipv6))
            } else {
                v4
            }
        };
        // Fill the fullest ENI that still has room: fewer ENIs in use
        // means fewer attachments to make.
        let target = usage
            .iter()
            .filter(|u| room(u) > 0)
            .max_by_key(|u| (u.ipv4, std::cmp::Reverse(u.eni_id.clone())));
        return match target {
            Some(u) => {
                // As cilium's IPAM does: when allocating at all, allocate
                // up to max_above_watermark beyond the need, so pods
                // arriving one by one cost a call per few, not one each.
                let n = (deficit + watermarks.headroom())
                    .min(room(u))
                    .min(config.max_batch);
                let (have, _) = slots(u, dual);
                PoolStep::Assign {
                    eni_id: u.eni_id.clone(),
                    ipv4: (have + n).saturating_sub(u.ipv4),
                    ipv6: if dual {
                        (have + n).saturating_sub(u.ipv6)
                    } else {
                        0
                    },
                }
            }
            None if node.attached_enis < node.limits.enis => PoolStep::AttachEni,
            None => PoolStep::Idle,
        };
    }
    // Pods waiting for an address are about to take one: never surplus.
    let surplus = watermarks.surplus(level);
    if surplus > 0 {
        // From the ENI with the most free slots.
        if let Some(u) = usage
            .iter()
            .filter(|u| slots(u, dual).1 > 0)
            .max_by_key(|u| slots(u, dual).1)
        {
            let n = surplus.min(slots(u, dual).1).min(config.max_batch);
            return PoolStep::Release {
                eni_id: u.eni_id.clone(),
                ipv4: n,
                ipv6: if dual { n } else { 0 },
            };
        }
    }
    PoolStep::Idle
}

/// Refuses a start the pool could never serve: an instance type whose
/// ENIs carry no secondary address. A cloud that does not answer yet is
/// not refused (the node serves what it has; the pool retries).
pub async fn check_limits(ips: &dyn SecondaryIps, provider: &str) -> Result<(), EngineError> {
    match ips.address_limits().await {
        Ok(l) if l.secondary_ipv4_per_eni() == 0 => Err(ProviderError::Config(format!(
            "secondary mode: provider {provider:?} reports instances of this type take no secondary address per ENI ({l:?})"
        ))
        .into()),
        Ok(_) => Ok(()),
        Err(e) if e.is_transient() => {
            tracing::warn!(error = %e, "address limits unknown yet (cloud unreachable); the pool starts once it answers");
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// The running pool. Dropping it stops its loop.
pub struct WarmIps {
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
}

struct Shared {
    host: Arc<HostEnis>,
    wake: Notify,
    /// The loop's progress, for ADDs waiting on it.
    rounds: watch::Sender<Rounds>,
    /// Attachments told "try again later" for want of an address, and when.
    waiting: Mutex<HashMap<AttachmentKey, tokio::time::Instant>>,
}

impl Drop for WarmIps {
    fn drop(&mut self) {
        self.stop.send_replace(true);
    }
}

impl WarmIps {
    /// Starts the loop over `host`, whose provider can assign addresses.
    /// Must run inside a tokio runtime.
    pub fn start(host: Arc<HostEnis>) -> WarmIps {
        let shared = Arc::new(Shared {
            host,
            wake: Notify::new(),
            rounds: watch::channel(Rounds::default()).0,
            waiting: Mutex::new(HashMap::new()),
        });
        let (stop, stop_rx) = watch::channel(false);
        tokio::spawn(run(shared.clone(), stop_rx));
        WarmIps { shared, stop }
    }

    /// `key` was refused for want of an address: it counts as demand.
    pub fn waiting(&self, key: &AttachmentKey) {
        self.shared
            .waiting()
            .insert(key.clone(), tokio::time::Instant::now());
        self.shared.wake.notify_one();
    }

    /// `key` got its address (or went): it waits no more.
    pub fn served(&self, key: &AttachmentKey) {
        self.shared.waiting().remove(key);
        self.shared.wake.notify_one();
    }

    /// Called by ADD before it takes any lock: with no free address for
    /// `key` now, counts it as demand, wakes the pool and waits (up to
    /// `allocate_wait`) until a free address is there, or until a round
    /// that began after this call has ended without one (the node is full)
    /// or the pool's rounds fail (the cloud): the ADD then answers "try
    /// again later" at once, as without the wait.
    pub async fn wait_for_address(&self, key: &AttachmentKey, dual_stack: bool) {
        let wait = self.shared.host.config.pool.allocate_wait;
        if wait.is_zero() {
            return;
        }
        let deadline = tokio::time::Instant::now() + wait;
        let mut rounds = self.shared.rounds.subscribe();
        let mut began = None;
        loop {
            if self
                .shared
                .host
                .store()
                .can_assign(key, dual_stack, Instant::now())
            {
                return;
            }
            let now = *rounds.borrow_and_update();
            if now.failing || began.is_some_and(|b| now.ended > b) {
                return;
            }
            if began.is_none() {
                // Once: from now on the loop counts this pod as demand, and
                // every round it begins and ends comes back here.
                began = Some(now.started);
                self.waiting(key);
            }
            if tokio::time::timeout_at(deadline, rounds.changed())
                .await
                .map_or(true, |r| r.is_err())
            {
                return;
            }
        }
    }
}

/// The loop's progress: rounds begun and ended, and whether the last one
/// failed.
#[derive(Debug, Clone, Copy, Default)]
struct Rounds {
    started: u64,
    ended: u64,
    failing: bool,
}

impl Shared {
    fn waiting(&self) -> std::sync::MutexGuard<'_, HashMap<AttachmentKey, tokio::time::Instant>> {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn ips(&self) -> Result<&dyn SecondaryIps, EngineError> {
        self.host.provider.secondary_ips().ok_or_else(|| {
            EngineError::from(ProviderError::Config(
                "the provider cannot assign addresses".into(),
            ))
        })
    }

    /// One round: on the timer, first the drift check; then steps toward
    /// the watermarks until there is nothing to do, or the first error.
    async fn round(&self, drift: bool) -> Result<(), EngineError> {
        let ips = self.ips()?;
        let listed = self.host.provider.list().await?;
        self.host.note_listed(&listed);
        // ENIs listed but not serving yet (attached by the pool, or from
        // outside): taken in first, so they are never attached twice.
        let pending = self.host.take_in_listed(&listed).await?;
        if drift {
            // Metadata may lag an assign: act on a miss seen twice.
            self.host.sync_listed(&listed, MISSING_CHECKS)?;
        }
        let limits = ips.address_limits().await?;
        for _ in 0..MAX_STEPS_PER_ROUND {
            let hosts = self.host.host_enis();
            let waiting = {
                let mut w = self.waiting();
                let now = tokio::time::Instant::now();
                w.retain(|_, since| now.duration_since(*since) < WAITING_TTL);
                w.len()
            };
            let node = NodeView {
                limits,
                dual_stack: !hosts.is_empty()
                    && hosts.iter().all(|h| h.ipv6)
                    && limits.ipv6_per_eni > 1,
                // The primary interface and those not taken in count too.
                attached_enis: 1 + hosts.len() + pending,
                waiting,
            };
            let usage = self.host.store().usage(Instant::now());
            match plan(&self.host.config.pool, &usage, &node) {
                PoolStep::Idle => return Ok(()),
                PoolStep::AttachEni if pending > 0 => return Ok(()),
                PoolStep::AttachEni => {
                    let eni = ips.attach_eni().await?;
                    crash_point("pool:after-attach");
                    self.host.note_listed(&self.host.provider.list().await?);
                    if !self.host.add(&eni).await? {
                        // Taken in by a later round once the kernel shows it.
                        return Ok(());
                    }
                }
                PoolStep::Assign { eni_id, ipv4, ipv6 } => {
                    let mut new = ips.assign(&eni_id, AddressCount { ipv4, ipv6 }).await?;
                    crash_point("pool:after-assign");
                    let unusable = self.unusable(&eni_id, &mut new);
                    self.join(&eni_id, &new);
                    if !unusable.is_empty() {
                        tracing::warn!(eni = %eni_id, ?unusable, "the cloud assigned addresses no pod can use; giving them back");
                        ips.unassign(&eni_id, &unusable).await?;
                    }
                    if new.is_empty() {
                        return Err(EngineError::AddressStore(format!(
                            "the cloud assigned no address to {eni_id} ({ipv4} IPv4, {ipv6} IPv6 asked)"
                        )));
                    }
                }
                PoolStep::Release { eni_id, ipv4, ipv6 } => {
                    let taken = self
                        .host
                        .store()
                        .take_free(&eni_id, ipv4, ipv6, Instant::now())?;
                    if taken.is_empty() {
                        return Ok(());
                    }
                    crash_point("pool:before-unassign");
                    if let Err(e) = ips.unassign(&eni_id, &taken).await {
                        // Still assigned as far as we know: free again.
                        self.join(&eni_id, &taken);
                        return Err(e.into());
                    }
                    tracing::info!(eni = %eni_id, released = ?taken, "surplus addresses given back");
                }
            }
        }
        Ok(())
    }

    /// Takes out of `new` the addresses no pod can use on `eni_id` (see
    /// [`HostEni::usable`](super::host::HostEni::usable)) and returns them.
    fn unusable(&self, eni_id: &str, new: &mut Vec<IpAddr>) -> Vec<IpAddr> {
        let Some(host) = self.host.host_eni(eni_id) else {
            return Vec::new();
        };
        // Also one the store has already, on another ENI: an address is
        // assigned once in a VPC (an emulator may not keep to that).
        let store = self.host.store();
        let (ok, bad) = new.iter().partition(|ip| {
            host.usable(ip) && !self.host.is_own_address(ip) && !store.contains(ip)
        });
        *new = ok;
        bad
    }

    /// New addresses of `eni_id` join the store, free.
    fn join(&self, eni_id: &str, ips: &[IpAddr]) {
        let mut store = self.host.store();
        for ip in ips {
            match store.add_address(eni_id, *ip) {
                Ok(()) | Err(DataStoreError::AddressAlreadyInStore(_)) => {}
                Err(e) => {
                    tracing::warn!(eni = %eni_id, %ip, error = %e, "address not added to the store")
                }
            }
        }
        tracing::info!(eni = %eni_id, added = ?ips, "addresses joined the pool");
    }
}

/// The loop: a round, then wait. After a failure it waits the jittered
/// backoff and ignores wake-ups, so pods hitting an empty pool cannot
/// hammer a throttling cloud; after success it waits up to the jittered
/// resync interval or until woken.
async fn run(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let config = shared.host.config.pool.clone();
    let mut backoff = Backoff::new(config.initial_retry, config.max_backoff).delays();
    // The first round checks drift too: the start built the store from a
    // view that may lag.
    let mut drift = true;
    loop {
        shared.rounds.send_modify(|r| r.started += 1);
        let outcome = shared.round(drift).await;
        shared.rounds.send_modify(|r| {
            r.ended += 1;
            r.failing = outcome.is_err();
        });
        let failed = match outcome {
            Ok(()) => {
                backoff.reset();
                drift = false;
                None
            }
            Err(e) => {
                let delay = backoff.next_delay();
                tracing::warn!(error = %e, retry_in = ?delay, "address pool round failed");
                Some(delay)
            }
        };
        if *stop.borrow() {
            return;
        }
        match pause(failed, config.resync_interval, &shared.wake, &mut stop).await {
            Pause::Stopped => return,
            Pause::Resync => drift = true,
            Pause::Go => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use enim_core::MAX_ALLOCATE_WAIT;

    use super::*;

    fn limits() -> AddressLimits {
        AddressLimits {
            ipv4_per_eni: 10,
            ipv6_per_eni: 10,
            enis: 3,
        }
    }

    fn node(attached_enis: usize, waiting: usize) -> NodeView {
        NodeView {
            limits: limits(),
            dual_stack: false,
            attached_enis,
            waiting,
        }
    }

    fn eni(id: &str, ipv4: usize, free4: usize) -> EniUsage {
        EniUsage {
            eni_id: id.into(),
            ipv4,
            free4,
            ..EniUsage::default()
        }
    }

    /// IPv4-only steps, as most plans are.
    fn assign4(eni_id: &str, ipv4: usize) -> PoolStep {
        PoolStep::Assign {
            eni_id: eni_id.into(),
            ipv4,
            ipv6: 0,
        }
    }

    fn release4(eni_id: &str, ipv4: usize) -> PoolStep {
        PoolStep::Release {
            eni_id: eni_id.into(),
            ipv4,
            ipv6: 0,
        }
    }

    fn config() -> WarmIpConfig {
        WarmIpConfig {
            pre_allocate: 4,
            min_allocate: 0,
            max_above_watermark: 2,
            ..WarmIpConfig::default()
        }
    }

    #[test]
    fn fills_past_pre_allocate_on_the_fullest_eni_with_room() {
        let usage = [eni("eni-a", 9, 0), eni("eni-b", 3, 1)];
        // eni-a has 9 of 9 secondaries: full. eni-b takes the 3 missing
        // and max_above_watermark (2) more, in one call.
        assert_eq!(plan(&config(), &usage, &node(3, 0)), assign4("eni-b", 5));
    }

    #[test]
    fn waiting_pods_and_min_allocate_add_demand() {
        let usage = [eni("eni-a", 4, 4)];
        assert_eq!(plan(&config(), &usage, &node(2, 0)), PoolStep::Idle);
        assert_eq!(plan(&config(), &usage, &node(2, 3)), assign4("eni-a", 5));
        let min = WarmIpConfig {
            min_allocate: 8,
            ..config()
        };
        // 4 missing and 2 above, bounded by the ENI's room of 5.
        assert_eq!(plan(&min, &usage, &node(2, 0)), assign4("eni-a", 5));
    }

    #[test]
    fn full_enis_attach_another_until_the_instance_is_full() {
        let usage = [eni("eni-a", 9, 0), eni("eni-b", 9, 1)];
        assert_eq!(plan(&config(), &usage, &node(3, 0)), PoolStep::Idle);
        assert_eq!(
            plan(&config(), &usage[..1], &node(2, 0)),
            PoolStep::AttachEni
        );
        // No ENI at all yet: attach one.
        assert_eq!(plan(&config(), &[], &node(1, 0)), PoolStep::AttachEni);
    }

    #[test]
    fn surplus_above_the_watermark_is_released_but_not_below_min_allocate() {
        let usage = [eni("eni-a", 9, 9), eni("eni-b", 2, 1)];
        // 10 free, keep 4 + 2: release 4 from eni-a (most free).
        assert_eq!(plan(&config(), &usage, &node(3, 0)), release4("eni-a", 4));
        let min = WarmIpConfig {
            min_allocate: 9,
            ..config()
        };
        assert_eq!(plan(&min, &usage, &node(3, 0)), release4("eni-a", 2));
        // Within the watermark: nothing.
        assert_eq!(
            plan(&config(), &[eni("eni-a", 6, 6)], &node(2, 0)),
            PoolStep::Idle
        );
        // Free addresses waiting pods are about to take are no surplus,
        // even with nothing kept free otherwise.
        let none_kept = WarmIpConfig {
            pre_allocate: 0,
            max_above_watermark: 0,
            ..config()
        };
        let one_free = [eni("eni-a", 1, 1)];
        assert_eq!(plan(&none_kept, &one_free, &node(2, 1)), PoolStep::Idle);
        assert_eq!(
            plan(&none_kept, &one_free, &node(2, 0)),
            release4("eni-a", 1)
        );
    }

    #[test]
    fn allocate_wait_is_bounded_by_the_plugin_timeout() {
        let mut c = config();
        assert_eq!(c.allocate_wait, Duration::from_secs(10));
        c.allocate_wait = MAX_ALLOCATE_WAIT;
        c.validate().unwrap();
        c.allocate_wait = MAX_ALLOCATE_WAIT + Duration::from_secs(1);
        assert!(c.validate().unwrap_err().contains("allocate_wait"));
    }

    #[test]
    fn dual_stack_counts_pairs_and_assigns_both_families() {
        let dual = NodeView {
            dual_stack: true,
            ..node(2, 0)
        };
        let usage = [EniUsage {
            eni_id: "eni-a".into(),
            ipv4: 3,
            ipv6: 1,
            free4: 3,
            free6: 1,
        }];
        // One free pair; three more wanted and two above: six pairs.
        assert_eq!(
            plan(&config(), &usage, &dual),
            PoolStep::Assign {
                eni_id: "eni-a".into(),
                ipv4: 3,
                ipv6: 5
            }
        );
    }

    #[test]
    fn max_per_eni_caps_each_eni_below_the_instance_limit() {
        let c = WarmIpConfig {
            max_per_eni: Some(4),
            ..config()
        };
        assert_eq!(
            plan(&c, &[eni("eni-a", 4, 1)], &node(2, 0)),
            PoolStep::AttachEni
        );
        assert_eq!(
            plan(&c, &[eni("eni-a", 2, 1)], &node(2, 0)),
            assign4("eni-a", 2)
        );
    }

    #[test]
    fn batches_are_bounded() {
        let c = WarmIpConfig {
            pre_allocate: 30,
            max_batch: 5,
            ..config()
        };
        assert_eq!(
            plan(&c, &[eni("eni-a", 0, 0)], &node(2, 0)),
            assign4("eni-a", 5)
        );
    }

    #[test]
    fn validation() {
        assert!(WarmIpConfig::default().validate().is_ok());
        for bad in [
            WarmIpConfig {
                max_batch: 0,
                ..WarmIpConfig::default()
            },
            WarmIpConfig {
                max_per_eni: Some(0),
                ..WarmIpConfig::default()
            },
            WarmIpConfig {
                initial_retry: Duration::ZERO,
                ..WarmIpConfig::default()
            },
            WarmIpConfig {
                max_backoff: Duration::from_millis(1),
                ..WarmIpConfig::default()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }
}
