//! The warm pool: an [`EniProvider`] over a [`CloudBackend`] that keeps ENIs
//! attached ahead of demand.
//!
//! Clouds throttle attaching ENIs to about one per 15 s, so a pod ADD must
//! never wait on a cloud call while a free ENI exists. [`WarmPool`] hands out
//! ENIs it already holds, straight from memory, and a background task (the
//! resync loop) creates ENIs while fewer than `pre_allocate` are free and
//! deletes the surplus above `max_above_watermark` more, by enim-core's
//! [`Watermarks`](enim_core::Watermarks) arithmetic. The watermark and
//! statistics names follow CCE/cilium IPAM (PreAllocate /
//! MaxAboveWatermark, `Statistics`); the loop
//! timing follows the Kubernetes node CIDR allocator (`Resync`,
//! `InitialRetry`, `MaxBackoff`).
//!
//! Safety rules the pool keeps:
//! - it never detaches an ENI before [`EniProvider::restore`] has run once,
//!   because until then it cannot tell a free ENI from one a running pod
//!   holds;
//! - it only ever detaches ENIs that carry enim's tag (found by
//!   [`CloudBackend::tagged`] or created by the pool itself), never an
//!   interface someone else attached;
//! - an ENI being detached is marked `leaving` under the same lock that
//!   allocation takes, so it cannot be handed to a pod meanwhile.
//!
//! Rounds on the resync timer (not those an allocation wakes) also compare
//! the pool with what the instance shows attached: an ENI attached from
//! outside becomes a free member (never detached by the pool: it is not
//! known to be enim's); a free member the instance has not shown for
//! [`MISSING_ROUNDS`] rounds in a row (detached from outside) leaves the pool,
//! and one a pod holds is kept and reported, so a live pod's record is
//! never dropped. Two rounds, because metadata may lag an attach.
//!
//! The fleet-wide reaper (when the backend names a cluster) runs on its own
//! jittered timer, apart from the resync loop and from any pod's path: it
//! deletes ENIs of this cluster, any node's, that are attached nowhere and
//! older than `reap_cooldown` by their creation tag (see [`reap_pass`]).
//! Nodes that die leave such ENIs behind; whichever node passes first
//! deletes them, and the others find them gone.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use async_trait::async_trait;
use enim_core::retry::{pause, Pause};
use enim_core::watermarks::Level;
use enim_core::{Eni, EniOwner, ProviderError};
use enim_provider::cloud::{CloudBackend, TaggedEni};
use enim_provider::{EniProvider, SecondaryIps};
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

mod config;
mod host;
mod reaper;
#[cfg(test)]
mod tests;
mod uninstall;
mod waiting;

pub use config::{
    PoolConfig, PoolRole, PoolStats, FREE_RANGE_MOVES, MAX_ALLOCATE_WAIT, MIN_REAP_COOLDOWN,
};
pub use reaper::{reap_pass, ReapReport};
pub use waiting::WAITING_TTL;
use waiting::{waiting_key, Waiting};

/// Timer rounds in a row a free member must be missing from the instance
/// before it leaves the pool.
pub const MISSING_ROUNDS: u8 = 2;

/// The warm pool. Create it with [`WarmPool::start`]; use it through
/// [`EniProvider`].
pub struct WarmPool {
    inner: Arc<Inner>,
    // Dropping the sender (with the pool) also stops the loop: it sees the
    // channel closed at its next step.
    stop: watch::Sender<bool>,
    /// The resync loop and, when on, the reaper's.
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

struct Inner {
    backend: Arc<dyn CloudBackend>,
    config: PoolConfig,
    role: PoolRole,
    state: Mutex<State>,
    /// Wakes the loop early: an allocation or release changed the free count.
    wake: Notify,
    /// Serialises rounds, so `resync_now` and the loop never both create.
    round: tokio::sync::Mutex<()>,
    stats: watch::Sender<PoolStats>,
    /// Wakes the ADDs waiting for a free ENI ([`waiting::wait_for_free`])
    /// on every [`Inner::publish`], first registered first (the receivers
    /// of a `watch` are woken in an order tokio draws at random, with a
    /// generator no seed reaches: the bench's fleet simulation then
    /// differed run to run for one seed).
    changed: Notify,
}

#[derive(Default)]
struct State {
    members: Vec<Member>,
    /// Tagged ENIs that are not attached (a crash between create and
    /// attach); deleted by `start` or, if that failed, by the loop.
    orphans: Vec<String>,
    /// `restore` has run: free ENIs are really free and may be detached.
    restored: bool,
    /// ENIs the instance may have attached, the primary included; `None`
    /// until the cloud has answered (nothing is created before).
    eni_limit: Option<usize>,
    /// The tagged ENIs are known: which members are enim's (only those are
    /// ever detached) and which tagged ENIs are orphans.
    tagged_known: bool,
    /// Since when the cloud API fails, and its last answer; `None` while it
    /// answers. The pool serves what is attached meanwhile.
    cloud_down: Option<(SystemTime, String)>,
    /// Attachments told "try again later" for want of a free ENI, and
    /// when: pods the runtime will retry, so ENIs to create on top of
    /// `pre_allocate` (each forgotten once served, or after [`WAITING_TTL`]).
    waiting: HashMap<(String, String, String), Waiting>,
    /// ENIs of the pool's own created and taken in, ever: a round that
    /// failed after taking one in made progress (see [`run`]).
    created: u64,
}

struct Member {
    eni: Eni,
    /// Carries enim's tag: only these are ever detached.
    ours: bool,
    /// Being detached: never allocated, not counted as available.
    leaving: bool,
    /// Timer rounds in a row the instance did not show it attached.
    missing_rounds: u8,
}

impl Member {
    fn is_free(&self) -> bool {
        self.eni.owner.is_none() && !self.leaving
    }

    /// Whether `owner`'s attachment holds it.
    fn held_by(&self, owner: &EniOwner) -> bool {
        self.eni
            .owner
            .as_ref()
            .is_some_and(|o| o.same_attachment(owner))
    }
}

/// What a round does next, decided under the state lock.
enum Step {
    /// Up to `max_parallel_creates` at once.
    Create,
    Shrink(String),
    DeleteOrphan(String),
    Idle,
}

impl WarmPool {
    /// Validates `config`, discovers what the instance has (attached ENIs
    /// become free pool members; tagged ENIs that are not attached are
    /// deleted) and starts the resync loop. Must run inside a tokio runtime.
    ///
    /// An orphan whose deletion fails does not fail the start: the loop
    /// retries it with backoff, so it is never leaked.
    pub async fn start(
        backend: Arc<dyn CloudBackend>,
        config: PoolConfig,
    ) -> Result<Arc<WarmPool>, ProviderError> {
        Self::start_as(backend, config, PoolRole::PodEnis).await
    }

    /// As [`start`](Self::start), for the given role.
    pub async fn start_as(
        backend: Arc<dyn CloudBackend>,
        config: PoolConfig,
        role: PoolRole,
    ) -> Result<Arc<WarmPool>, ProviderError> {
        config.validate()?;
        let mut state = State::default();
        match discover(backend.as_ref()).await {
            Ok((eni_limit, attached, tagged)) => {
                state.eni_limit = Some(eni_limit);
                state.adopt_attached(attached);
                state.adopt_tagged(&tagged);
            }
            // The cloud API is down: serve the ENIs instance metadata shows
            // attached now; the loop finishes discovery (with backoff) and
            // growth resumes once the cloud answers.
            Err(e) if e.is_transient() => {
                tracing::warn!(error = %e, "cloud API unreachable at start: serving the ENIs attached now; the pool grows once it answers");
                match backend.attached().await {
                    Ok(attached) => state.adopt_attached(attached),
                    Err(e) => {
                        tracing::warn!(error = %e, "instance metadata unreachable too: starting with an empty pool")
                    }
                }
                state.cloud_down = Some((SystemTime::now(), e.to_string()));
            }
            Err(e) => return Err(e),
        }
        let mut orphans = Vec::new();
        for id in std::mem::take(&mut state.orphans) {
            match backend.detach_and_delete(&id).await {
                Ok(()) => tracing::info!(eni = %id, "deleted a tagged ENI that was never attached"),
                Err(e) => {
                    tracing::warn!(eni = %id, error = %e, "deleting an unattached tagged ENI failed; the resync loop retries");
                    orphans.push(id);
                }
            }
        }
        state.orphans = orphans;
        tracing::info!(
            backend = backend.name(),
            eni_limit = ?state.eni_limit,
            attached = state.members.len(),
            "warm pool discovered",
        );

        let stats = stats_of(&state, &config);
        let inner = Arc::new(Inner {
            backend,
            config,
            role,
            state: Mutex::new(state),
            wake: Notify::new(),
            round: tokio::sync::Mutex::new(()),
            stats: watch::Sender::new(stats),
            changed: Notify::new(),
        });
        let (stop, stop_rx) = watch::channel(false);
        let mut tasks = vec![tokio::spawn(run(inner.clone(), stop_rx.clone()))];
        match inner.backend.reap_cluster() {
            Some(cluster) => {
                tracing::info!(
                    cluster,
                    interval = ?inner.config.reap_interval,
                    cooldown = ?inner.config.reap_cooldown,
                    "fleet-wide reaper on: deletes this cluster's unattached ENIs past the cooldown",
                );
                tasks.push(tokio::spawn(reaper::reap_loop(inner.clone(), stop_rx)));
            }
            None => tracing::info!(
                backend = inner.backend.name(),
                "fleet-wide reaper off: no cluster configured"
            ),
        }
        Ok(Arc::new(WarmPool {
            inner,
            stop,
            tasks: Mutex::new(tasks),
        }))
    }

    /// The current statistics.
    pub fn stats(&self) -> PoolStats {
        self.inner.stats_now()
    }

    /// Statistics as they change: every change of the pool publishes a new
    /// value. `wait_for` on the receiver waits for a state without polling.
    pub fn subscribe(&self) -> watch::Receiver<PoolStats> {
        self.inner.stats.subscribe()
    }

    /// Runs one round now (fill, shrink, orphan clean-up) and returns its
    /// outcome, after any round already in progress. For tests and
    /// operator-triggered resyncs; the loop keeps running.
    pub async fn resync_now(&self) -> Result<(), ProviderError> {
        self.inner.round(&self.stop.subscribe(), true).await
    }

    /// Runs one pass of the fleet-wide reaper now (off the timer) and
    /// returns what it did. For tests and operators; `Ok` with nothing
    /// done when the reaper is off.
    pub async fn reap_now(&self) -> Result<ReapReport, ProviderError> {
        let stop = self.stop.subscribe();
        reap_pass(
            self.inner.backend.as_ref(),
            self.inner.config.reap_cooldown,
            || stopped(&stop),
        )
        .await
    }

    /// Stops the resync loop (and the reaper's) and waits for them to end.
    /// A cloud call in progress is allowed to finish, so no ENI is left
    /// half-created or half-deleted by the pool itself. Idempotent.
    pub async fn shutdown(&self) {
        self.stop.send_replace(true);
        let tasks = std::mem::take(&mut *lock(&self.tasks));
        for task in tasks {
            if let Err(e) = task.await {
                tracing::error!(error = %e, "warm pool loop ended abnormally");
            }
        }
    }
}

impl Inner {
    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    fn stats_now(&self) -> PoolStats {
        stats_of(&self.state(), &self.config)
    }

    /// Publishes the statistics of `state`; called with the lock held so
    /// published values follow the order of changes.
    fn publish(&self, state: &State) {
        self.stats.send_replace(stats_of(state, &self.config));
        self.changed.notify_waiters();
    }

    /// One round: with `reconcile`, first compares the pool with the
    /// instance; then steps until there is nothing to do, or the first error.
    async fn round(
        &self,
        stop: &watch::Receiver<bool>,
        reconcile: bool,
    ) -> Result<(), ProviderError> {
        let _round = self.round.lock().await;
        if self.undiscovered() {
            self.finish_discovery().await?;
        }
        if reconcile {
            self.reconcile().await?;
        }
        loop {
            if stopped(stop) {
                return Ok(());
            }
            match self.next_step() {
                Step::Idle => return Ok(()),
                Step::Create => self.create_pipelined().await?,
                Step::Shrink(id) => {
                    let result = self.backend.detach_and_delete(&id).await;
                    let mut st = self.state();
                    match result {
                        Ok(()) => {
                            st.members.retain(|m| m.eni.id != id);
                            self.publish(&st);
                            tracing::info!(eni = %id, "surplus ENI detached and deleted");
                        }
                        Err(e) => {
                            // Still attached as far as we know: free again.
                            if let Some(m) = st.members.iter_mut().find(|m| m.eni.id == id) {
                                m.leaving = false;
                            }
                            self.publish(&st);
                            return Err(context(e, &format!("detach and delete surplus ENI {id}")));
                        }
                    }
                }
                Step::DeleteOrphan(id) => {
                    self.backend
                        .detach_and_delete(&id)
                        .await
                        .map_err(|e| context(e, &format!("delete unattached ENI {id}")))?;
                    self.state().orphans.retain(|o| *o != id);
                    tracing::info!(eni = %id, "deleted a tagged ENI that was never attached");
                }
            }
        }
    }

    /// Creates ENIs, up to `max_parallel_creates` in flight, while the
    /// free ones and those on their way are fewer than `pre_allocate`: each
    /// that lands is free at once, and another starts in its slot, so a
    /// burst is served at the bounded rate and the pool never overshoots.
    /// After a failure no new create starts; those in flight are waited
    /// for and kept.
    async fn create_pipelined(&self) -> Result<(), ProviderError> {
        use futures::stream::{FuturesUnordered, StreamExt};
        let mut in_flight = FuturesUnordered::new();
        let mut first_err = None;
        loop {
            while first_err.is_none()
                && in_flight.len() < self.config.max_parallel_creates
                && self.wants_create(in_flight.len())
            {
                self.backend.pool_fill(self.fill());
                in_flight.push(self.backend.create_and_attach());
            }
            let Some(result) = in_flight.next().await else {
                break;
            };
            match result {
                Ok(eni) => self.take_in_created(eni),
                Err(e) => {
                    first_err.get_or_insert(context(e, "create and attach an ENI"));
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Whether one more create is wanted with `in_flight` already coming:
    /// while free and coming ENIs are fewer than `pre_allocate` plus the
    /// pods waiting for one.
    fn wants_create(&self, in_flight: usize) -> bool {
        if self.role == PoolRole::HostEnis {
            return false;
        }
        let mut st = self.state();
        st.expire_waiting();
        let free = st.free_count();
        // The primary interface counts toward the limit.
        let room = st
            .eni_limit
            .is_some_and(|limit| st.members.len() + in_flight + 1 < limit);
        let level = Level {
            free: free + in_flight,
            total: st.members.len() + in_flight,
            waiting: st.waiting.len(),
        };
        self.config.watermarks().deficit(level) > 0 && room
    }

    /// How full the pool is: its free ENIs over its goal (`pre_allocate`
    /// plus the pods waiting for one), at most 1.
    fn fill(&self) -> f64 {
        let st = self.state();
        let goal = u32::try_from(st.waiting.len())
            .unwrap_or(u32::MAX)
            .saturating_add(self.config.pre_allocate);
        let free = u32::try_from(st.free_count()).unwrap_or(u32::MAX);
        (f64::from(free) / f64::from(goal.max(1))).min(1.0)
    }

    /// A new ENI of the pool's own joins it, free.
    fn take_in_created(&self, eni: Eni) {
        tracing::info!(eni = %eni.id, mac = %eni.mac, "ENI attached to the warm pool");
        let mut st = self.state();
        if st.members.iter().any(|m| m.eni.id == eni.id) {
            tracing::warn!(eni = %eni.id, "cloud returned an ENI the pool already holds");
            return;
        }
        st.created += 1;
        st.members.push(Member {
            eni: Eni { owner: None, ..eni },
            ours: true,
            leaving: false,
            missing_rounds: 0,
        });
        self.publish(&st);
    }

    fn undiscovered(&self) -> bool {
        let st = self.state();
        st.eni_limit.is_none() || !st.tagged_known
    }

    /// What a start without the cloud could not learn: the attachment
    /// limit, and which members are enim's (and which tagged ENIs are
    /// orphans).
    async fn finish_discovery(&self) -> Result<(), ProviderError> {
        let (eni_limit, tagged) = limit_and_tagged(self.backend.as_ref()).await?;
        let mut st = self.state();
        st.eni_limit = Some(eni_limit);
        st.adopt_tagged(&tagged);
        tracing::info!(
            eni_limit,
            members = st.members.len(),
            orphans = st.orphans.len(),
            "warm pool discovery finished: the cloud answers again"
        );
        self.publish(&st);
        Ok(())
    }

    /// Takes in ENIs attached from outside the pool and lets go of free
    /// ones detached from outside (see the module comment). Runs under the
    /// round lock, so no create or shrink of the pool's own is in flight.
    async fn reconcile(&self) -> Result<(), ProviderError> {
        let attached = self
            .backend
            .attached()
            .await
            .map_err(|e| context(e, "list attached ENIs"))?;
        let mut st = self.state();
        let shown: HashMap<&str, &Eni> = attached.iter().map(|e| (e.id.as_str(), e)).collect();
        for m in st.members.iter_mut().filter(|m| !m.leaving) {
            if let Some(now) = shown.get(m.eni.id.as_str()) {
                m.missing_rounds = 0;
                // Secondary mode's view of each ENI's addresses: what the
                // instance shows (the agent tolerates metadata lag).
                m.eni.secondary_ips.clone_from(&now.secondary_ips);
                m.eni.device_index = now.device_index.or(m.eni.device_index);
                continue;
            }
            m.missing_rounds = m.missing_rounds.saturating_add(1);
            if m.eni.owner.is_some() && m.missing_rounds == MISSING_ROUNDS {
                tracing::error!(eni = %m.eni.id, owner = ?m.eni.owner, "an ENI a pod holds is no longer attached to the instance; kept until the pod goes");
            }
        }
        st.members.retain(|m| {
            let lost = m.is_free() && m.missing_rounds >= MISSING_ROUNDS;
            if lost {
                tracing::warn!(eni = %m.eni.id, "a free ENI was detached from outside the pool; no longer handed out");
            }
            !lost
        });
        for eni in attached {
            let (id, mac) = (eni.id.clone(), eni.mac);
            if st.adopt(eni) {
                tracing::info!(eni = %id, mac = %mac, "an ENI attached from outside the pool; now a free member");
            }
        }
        self.publish(&st);
        Ok(())
    }

    fn next_step(&self) -> Step {
        if self.wants_create(0) {
            return Step::Create;
        }
        let mut st = self.state();
        let free = st.free_count();
        let level = Level {
            free,
            total: st.members.len(),
            waiting: 0,
        };
        if self.role == PoolRole::PodEnis
            && st.restored
            && self.config.watermarks().surplus(level) > 0
        {
            let surplus = st.members.iter_mut().rev().find(|m| m.ours && m.is_free());
            if let Some(m) = surplus {
                m.leaving = true;
                let id = m.eni.id.clone();
                self.publish(&st);
                return Step::Shrink(id);
            }
        }
        match st.orphans.first() {
            Some(id) => Step::DeleteOrphan(id.clone()),
            None => Step::Idle,
        }
    }
}

/// The resync loop: a round, then wait. After a failure it waits the
/// backoff delay and ignores wake-ups, so pods hitting an empty pool cannot
/// hammer a throttling cloud; after success it waits up to `resync_interval`
/// or until woken. Both waits are jittered, so the nodes of a fleet that
/// failed (or started) together do not call the cloud together.
async fn run(inner: Arc<Inner>, mut stop: watch::Receiver<bool>) {
    let mut backoff = inner.config.retry_backoff().delays();
    // The first round follows discovery; rounds on the timer reconcile (a
    // failed one is retried with its reconcile), woken ones do not: an
    // allocation must not cost a metadata walk.
    let mut reconcile = false;
    loop {
        let created_before = inner.state().created;
        let delay = match inner.round(&stop, reconcile).await {
            Ok(()) => {
                backoff.reset();
                reconcile = false;
                let mut st = inner.state();
                if let Some((since, _)) = st.cloud_down.take() {
                    tracing::info!(down_for = ?since.elapsed().unwrap_or_default(), "the cloud API answers again");
                }
                None
            }
            Err(e) => {
                if e.is_transient() {
                    let mut st = inner.state();
                    let since = st.cloud_down.as_ref().map_or_else(SystemTime::now, |d| d.0);
                    st.cloud_down = Some((since, e.to_string()));
                    // A round that created an ENI before it failed was
                    // served, only not in full (a throttled call given up):
                    // the cloud is not down, so the step starts over.
                    // Doubling it would leave the node idle for up to
                    // `max_backoff` while the account's buckets refill
                    // unused (the fleet simulation's late nodes).
                    if st.created > created_before {
                        backoff.reset();
                    }
                }
                let delay = backoff.next_delay();
                tracing::warn!(error = %e, transient = e.is_transient(), retry_in = ?delay, "warm pool round failed");
                Some(delay)
            }
        };
        if stopped(&stop) {
            return;
        }
        match pause(delay, inner.config.resync_interval, &inner.wake, &mut stop).await {
            Pause::Stopped => return,
            Pause::Resync => reconcile = true,
            Pause::Go => {}
        }
    }
}

/// Everything the pool asks the cloud at start: the attachment limit, the
/// attached ENIs (instance metadata) and the tagged ones (the cloud API).
async fn discover(
    backend: &dyn CloudBackend,
) -> Result<(usize, Vec<Eni>, Vec<TaggedEni>), ProviderError> {
    let (eni_limit, tagged) = limit_and_tagged(backend).await?;
    let attached = backend
        .attached()
        .await
        .map_err(|e| context(e, "list attached ENIs"))?;
    Ok((eni_limit, attached, tagged))
}

/// What only the cloud API knows: the attachment limit and enim's tagged
/// ENIs.
async fn limit_and_tagged(
    backend: &dyn CloudBackend,
) -> Result<(usize, Vec<TaggedEni>), ProviderError> {
    let eni_limit = backend
        .eni_limit()
        .await
        .map_err(|e| context(e, "eni_limit"))?;
    let tagged = backend
        .tagged()
        .await
        .map_err(|e| context(e, "list tagged ENIs"))?;
    Ok((eni_limit, tagged))
}

impl State {
    /// Members that can be allocated now.
    fn free_count(&self) -> usize {
        self.members.iter().filter(|m| m.is_free()).count()
    }

    /// Attached ENIs become free members (not known to be enim's yet).
    fn adopt_attached(&mut self, attached: Vec<Eni>) {
        for eni in attached {
            self.adopt(eni);
        }
    }

    /// An attached ENI not a member yet becomes a free one (not known to
    /// be enim's yet); whether it was new.
    fn adopt(&mut self, mut eni: Eni) -> bool {
        if self.members.iter().any(|m| m.eni.id == eni.id) {
            return false;
        }
        eni.owner = None;
        self.members.push(Member {
            eni,
            ours: false,
            leaving: false,
            missing_rounds: 0,
        });
        true
    }

    /// Marks the members that carry enim's tag, and takes tagged ENIs that
    /// are not attached for orphans (a crash between create and attach).
    fn adopt_tagged(&mut self, tagged: &[TaggedEni]) {
        let tagged_ids: HashSet<&str> = tagged.iter().map(|t| t.id.as_str()).collect();
        for m in &mut self.members {
            m.ours |= tagged_ids.contains(m.eni.id.as_str());
        }
        for t in tagged {
            let in_pool = self.members.iter().any(|m| m.eni.id == t.id);
            if !t.attached && !in_pool {
                if !self.orphans.contains(&t.id) {
                    self.orphans.push(t.id.clone());
                }
            } else if t.attached && !in_pool {
                // The cloud says attached but metadata does not show it yet:
                // deleting it could hit an ENI being attached right now.
                tracing::warn!(eni = %t.id, "tagged ENI is attached but not in instance metadata; leaving it alone");
            }
        }
        self.tagged_known = true;
    }
}

fn stopped(stop: &watch::Receiver<bool>) -> bool {
    // A closed channel means the pool was dropped.
    *stop.borrow() || stop.has_changed().is_err()
}

fn stats_of(state: &State, config: &PoolConfig) -> PoolStats {
    let eni_limit = state.eni_limit.unwrap_or(0);
    let used = state
        .members
        .iter()
        .filter(|m| m.eni.owner.is_some())
        .count();
    let available = state.free_count();
    let remaining_interfaces = eni_limit.saturating_sub(1 + state.members.len());
    let level = Level {
        free: available,
        total: state.members.len(),
        waiting: 0,
    };
    let watermarks = config.watermarks();
    PoolStats {
        used,
        available,
        needed: watermarks.deficit(level).min(remaining_interfaces),
        excess: watermarks.surplus(level),
        remaining_interfaces,
    }
}

/// Prefixes what the pool was doing to a cloud error, keeping its kind (and
/// so `is_transient`).
fn context(e: ProviderError, what: &str) -> ProviderError {
    match e {
        ProviderError::Config(m) => ProviderError::Config(format!("{what}: {m}")),
        ProviderError::Unavailable(m) => ProviderError::Unavailable(format!("{what}: {m}")),
        ProviderError::Throttled(m) => ProviderError::Throttled(format!("{what}: {m}")),
        other => other,
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section leaves the state consistent between single
    // field stores, so a lock poisoned by a panic is still sound to use.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[async_trait]
impl EniProvider for WarmPool {
    fn name(&self) -> &str {
        self.inner.backend.name()
    }

    fn secondary_ips(&self) -> Option<&dyn SecondaryIps> {
        (self.inner.role == PoolRole::HostEnis).then_some(self as &dyn SecondaryIps)
    }

    fn degraded(&self) -> Option<String> {
        let st = self.inner.state();
        let (since, why) = st.cloud_down.as_ref()?;
        Some(format!(
            "cloud unreachable since {} ({why}); serving the ENIs attached",
            humantime::format_rfc3339_seconds(*since)
        ))
    }

    fn statistics(&self) -> Option<enim_core::PoolStatistics> {
        let s = self.stats();
        Some(enim_core::PoolStatistics {
            used: s.used,
            available: s.available,
            needed: s.needed,
            excess: s.excess,
        })
    }

    async fn list(&self) -> Result<Vec<Eni>, ProviderError> {
        Ok(self
            .inner
            .state()
            .members
            .iter()
            .map(|m| m.eni.clone())
            .collect())
    }

    async fn wait_for_free(&self, owner: &EniOwner) {
        waiting::wait_for_free(&self.inner, owner).await
    }

    async fn allocate_next(&self, owner: &EniOwner) -> Result<Eni, ProviderError> {
        let result = {
            let mut st = self.inner.state();
            let total = st.members.len();
            if let Some(held) = st.members.iter().find(|m| m.held_by(owner)) {
                return Ok(held.eni.clone());
            }
            let key = waiting_key(owner);
            match st.members.iter_mut().find(|m| m.is_free()) {
                Some(m) => {
                    m.eni.owner = Some(owner.clone());
                    let eni = m.eni.clone();
                    st.waiting.remove(&key);
                    self.inner.publish(&st);
                    Ok(eni)
                }
                None => {
                    // A pod waits for an ENI: demand beyond `pre_allocate`.
                    st.note_waiting(owner);
                    Err(ProviderError::Exhausted { total })
                }
            }
        };
        // Either way the free count fell or is too low: let the loop refill.
        self.inner.wake.notify_one();
        result
    }

    async fn allocate_named(&self, eni_id: &str, owner: &EniOwner) -> Result<Eni, ProviderError> {
        let result = {
            let mut st = self.inner.state();
            let m = st
                .members
                .iter_mut()
                .find(|m| m.eni.id == eni_id)
                .ok_or_else(|| ProviderError::UnknownEni(eni_id.into()))?;
            if m.held_by(owner) {
                return Ok(m.eni.clone());
            }
            if !m.is_free() {
                return Err(ProviderError::OwnedByOther {
                    eni_id: eni_id.into(),
                    holder: m
                        .eni
                        .owner
                        .as_ref()
                        .map_or("the pool".into(), |o| o.to_string()),
                    requester: owner.to_string(),
                });
            }
            m.eni.owner = Some(owner.clone());
            let eni = m.eni.clone();
            self.inner.publish(&st);
            Ok(eni)
        };
        // The free count fell: let the loop refill.
        self.inner.wake.notify_one();
        result
    }

    async fn release(&self, owner: &EniOwner) -> Result<(), ProviderError> {
        {
            let mut st = self.inner.state();
            // A DEL of a pod that was waiting: it waits no more.
            st.waiting.remove(&waiting_key(owner));
            let mut changed = false;
            for m in st.members.iter_mut() {
                if m.held_by(owner) {
                    m.eni.owner = None;
                    changed = true;
                }
            }
            if !changed {
                return Ok(());
            }
            self.inner.publish(&st);
        }
        self.inner.wake.notify_one();
        Ok(())
    }

    async fn restore(&self, assignments: &[(String, EniOwner)]) -> Result<(), ProviderError> {
        {
            let mut st = self.inner.state();
            // Check everything first so a bad checkpoint changes nothing.
            for (eni_id, owner) in assignments {
                let Some(m) = st.members.iter().find(|m| &m.eni.id == eni_id) else {
                    continue;
                };
                if let Some(holder) = m.eni.owner.as_ref().filter(|h| !h.same_attachment(owner)) {
                    return Err(ProviderError::OwnedByOther {
                        eni_id: eni_id.clone(),
                        holder: holder.to_string(),
                        requester: owner.to_string(),
                    });
                }
            }
            for (eni_id, owner) in assignments {
                match st
                    .members
                    .iter_mut()
                    .find(|m| &m.eni.id == eni_id && !m.leaving)
                {
                    Some(m) => m.eni.owner = Some(owner.clone()),
                    None => tracing::warn!(
                        eni = %eni_id,
                        %owner,
                        "checkpoint names an ENI the pool no longer holds; skipping it",
                    ),
                }
            }
            st.restored = true;
            self.inner.publish(&st);
        }
        self.inner.wake.notify_one();
        Ok(())
    }

    async fn release_unused(&self) -> enim_provider::Released {
        self.give_back_unused().await
    }
}
