//! One resync of the whole cluster: list the cloud once, build the
//! [`Index`], [`plan`], and run the tasks neediest node first on at most
//! `workers` nodes at once.
//!
//! Invariants:
//! - **one describe per resync at most**: the cluster's ENIs are listed in
//!   one [`FleetCloud::list_cluster_enis`] when the last listing is older
//!   than `resync_interval`; resyncs in between (the runtime's, on watch
//!   events) plan from the last listing amended with this allocator's own
//!   calls, so a node's pods never wait for a listing;
//! - **every cloud call takes a token** from its class's bucket (mutating
//!   or describe), shared by the whole cluster, and is made only while
//!   [`Store::leadership`] holds (the lease manager's flag and the leader
//!   deadline, checked before the wait and after it): the cloud is
//!   reachable only through the `gate` module, which does both; every
//!   write checks leadership too;
//! - **an intent is written before its create**: `spec.intents` gets the
//!   client token, then the ENI is created with that token, attached, and
//!   published with the intent dropped in one apply; a crash anywhere
//!   leaves an intent or a tagged ENI that the next leader finishes;
//! - **a node's tasks run one after another** on one working copy of its
//!   spec, so two writes of one spec never race; nodes run in parallel;
//! - resyncs never overlap: they queue on one lock.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use enim_core::ratelimit::TokenBucket;
use enim_core::{AddressLimits, ProviderError};
use enim_crd::NetResourceSetSpec;
use enim_provider::fleet::{FleetCloud, FleetEni};
use futures::StreamExt;
use tokio::time::Instant;

use crate::config::{ConfigError, OperatorConfig};
use crate::index::{
    instance_of, plan_pass, unservable_claims, ClaimInfo, Index, Input, NodeInfo, Phase, Planned,
    Policy, Serving, SetInfo, Task, WarmPool,
};
use crate::policy::refusals::{Refusal, Refusals, CLAIM_RETRY};
use crate::store::{Store, StoreError, Told};

mod gate;
mod job;
#[cfg(test)]
mod tests;

/// Where a resync stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// This replica no longer leads: nothing more was called or written.
    #[error("not the leader")]
    NotLeader,
    /// Its leader deadline passed (the Lease not renewed in time): nothing
    /// more was called or written.
    #[error("leader deadline passed {0:?} ago")]
    PastDeadline(Duration),
    #[error("listing the cluster's ENIs: {0}")]
    Listing(ProviderError),
}

/// Why one task failed (counted in the report; the next resync retries).
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    #[error("not the leader")]
    NotLeader,
    #[error("leader deadline passed {0:?} ago: no cloud call or write")]
    PastDeadline(Duration),
    #[error("cloud: {0}")]
    Cloud(#[from] ProviderError),
    #[error("store: {0}")]
    Store(StoreError),
    #[error("{0}")]
    Missing(String),
}

impl From<StoreError> for TaskError {
    fn from(e: StoreError) -> TaskError {
        match e {
            StoreError::NotLeader => TaskError::NotLeader,
            StoreError::PastDeadline(late) => TaskError::PastDeadline(late),
            other => TaskError::Store(other),
        }
    }
}

impl TaskError {
    /// Leadership is lost (or its deadline passed): the resync stops.
    pub fn is_deposed(&self) -> bool {
        self.deposed().is_some()
    }

    /// What the resync returns for a lost leadership.
    fn deposed(&self) -> Option<Error> {
        match self {
            TaskError::NotLeader => Some(Error::NotLeader),
            TaskError::PastDeadline(late) => Some(Error::PastDeadline(*late)),
            _ => None,
        }
    }
}

/// What pods ask of the cluster beyond the nodes' watermarks, each
/// `None` while the operator does not know it (its watch has not listed):
/// then nothing is made for it, and nothing made for it is taken back.
#[derive(Debug, Clone, Copy, Default)]
pub struct Demand<'a> {
    /// Every ResourceClaim of the DRA driver's class.
    pub claims: Option<&'a [ClaimInfo]>,
    /// The EniPolicies that keep ENIs warm.
    pub warm: Option<&'a [WarmPool]>,
}

/// What one resync did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResyncReport {
    /// This resync listed the cloud (else it planned from the last listing).
    pub listed: bool,
    /// ENIs in the listing it planned from.
    pub enis: usize,
    pub nodes: usize,
    pub tasks: usize,
    pub tasks_failed: usize,
    /// Tasks by [`Task::kind`].
    pub by_kind: BTreeMap<&'static str, usize>,
    /// Cloud calls made (the listing and limits included).
    pub cloud_calls: usize,
    /// Cloud calls answered "throttled" (after the client's own retries).
    pub throttled: usize,
    /// Spec writes and set releases.
    pub writes: usize,
    /// Task errors, the first few.
    pub errors: Vec<String>,
}

const REPORTED_ERRORS: usize = 10;

/// The wall clock the index plans with (the bench's simulation supplies
/// one that follows its paused clock).
pub type Clock = Arc<dyn Fn() -> SystemTime + Send + Sync>;

/// The last listing, amended with this allocator's own calls since.
struct Listing {
    at: Instant,
    enis: Vec<FleetEni>,
}

#[derive(Default)]
struct Cache {
    listing: Option<Listing>,
    limits: HashMap<String, AddressLimits>,
    /// The spec last written per node: the base of its next plan (the
    /// runtime's watch may lag the write) and what need not be written
    /// again.
    written: HashMap<String, NetResourceSetSpec>,
    /// Sets seen without their Node, since when.
    gone_since: HashMap<String, SystemTime>,
    /// Nodes above their watermarks at every pass since when
    /// (`drain_delay`).
    surplus_since: HashMap<String, SystemTime>,
    last_reap: Option<Instant>,
    /// Refusals for want of configuration (a node with no inventory in a
    /// static cloud) reported by the last resync: told once, not again at
    /// every resync while they last.
    told: HashSet<String>,
    /// Nodes held back (frozen, see `crate::index`'s pools, or waiting for
    /// an instance of the cloud), and why, as last told: each told once,
    /// and again only when the reason changes.
    held_back: HashMap<String, String>,
    /// The uids of pending claims told not servable, and why: told once
    /// while they last, and again when the reason changes.
    unservable: HashMap<String, String>,
    /// Claims (by uid) whose ENI the cloud refused, since when and what it
    /// said: none is made for them for [`CLAIM_RETRY`].
    refused_claims: HashMap<String, (Instant, String)>,
}

/// What every resync of this allocator did, summed (the operator's
/// `/metrics`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    pub cloud_calls: u64,
    /// Calls answered "throttled" after the client's own retries.
    pub throttled: u64,
    /// Leaked ENIs the reaper found (each pass that plans their delete).
    pub leaked_found: u64,
    pub tasks_failed: u64,
}

#[derive(Default)]
struct TotalCounters {
    cloud_calls: AtomicU64,
    throttled: AtomicU64,
    leaked_found: AtomicU64,
    tasks_failed: AtomicU64,
}

/// What one job's tasks came to, in order.
type JobOutcome = Vec<Result<(), TaskError>>;

/// Counters shared by the jobs of one resync.
#[derive(Default)]
struct Counters {
    calls: AtomicUsize,
    throttled: AtomicUsize,
    writes: AtomicUsize,
}

#[derive(Debug, Clone, Copy)]
enum Class {
    Mutating,
    Describe,
}

pub struct Allocator {
    /// The cloud, behind the leadership checks and the buckets.
    gate: gate::CloudGate,
    store: Arc<dyn Store>,
    config: OperatorConfig,
    policy: Policy,
    clock: Clock,
    cache: Mutex<Cache>,
    one_at_a_time: tokio::sync::Mutex<()>,
    /// Makes client tokens unique: a per-process salt and a counter.
    salt: u64,
    tokens: AtomicU64,
    totals: TotalCounters,
    /// Where a policy's refused claims are noted for its status.
    refusals: Arc<Refusals>,
}

impl Allocator {
    /// Validates `config`. Must be called within a tokio runtime's context
    /// only when used: construction does no I/O.
    pub fn new(
        cloud: Arc<dyn FleetCloud>,
        store: Arc<dyn Store>,
        config: OperatorConfig,
    ) -> Result<Allocator, Error> {
        config.validate()?;
        use std::hash::{BuildHasher, Hasher};
        let salt = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        Ok(Allocator {
            gate: gate::CloudGate::new(
                cloud,
                store.clone(),
                TokenBucket::new(config.api.mutating_rate),
                TokenBucket::new(config.api.read_rate),
            ),
            store,
            policy: config.policy(),
            config,
            clock: Arc::new(SystemTime::now),
            cache: Mutex::default(),
            one_at_a_time: tokio::sync::Mutex::new(()),
            salt,
            tokens: AtomicU64::new(0),
            totals: TotalCounters::default(),
            refusals: Arc::default(),
        })
    }

    /// Notes the cloud's refusals of policies' claims in `refusals` (the
    /// policy status writer's).
    pub fn with_refusals(mut self, refusals: Arc<Refusals>) -> Self {
        self.refusals = refusals;
        self
    }

    /// The cloud refused to make the ENI of claim `uid`: none is made for
    /// it for [`CLAIM_RETRY`], and its claim, pod and policy are told.
    pub(crate) fn claim_refused(&self, uid: &str, error: String) {
        self.cache()
            .refused_claims
            .insert(uid.to_string(), (Instant::now(), error));
    }

    /// The cloud refused to make one of `policy`'s warm ENIs: none is made
    /// for it for [`CLAIM_RETRY`] (its claims may still try theirs), and
    /// its status says so.
    pub(crate) fn warm_refused(&self, policy: &str, error: String) {
        self.refusals.note(
            policy,
            Refusal {
                made_for: "its warm ENIs".into(),
                error: error.clone(),
            },
        );
        self.claim_refused(&crate::index::warm_refused_key(policy), error);
    }

    /// Every resync's counts, summed.
    pub fn totals(&self) -> Totals {
        let t = &self.totals;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Totals {
            cloud_calls: get(&t.cloud_calls),
            throttled: get(&t.throttled),
            leaked_found: get(&t.leaked_found),
            tasks_failed: get(&t.tasks_failed),
        }
    }

    /// Adds one resync's calls (made even when it stopped early) and, when
    /// it ran to its end, its report's leaks and failures.
    fn add_to_totals(&self, counters: &Counters, report: Option<&ResyncReport>) {
        let t = &self.totals;
        let add = |a: &AtomicU64, n: usize| {
            a.fetch_add(u64::try_from(n).unwrap_or(u64::MAX), Ordering::Relaxed);
        };
        add(&t.cloud_calls, counters.calls.load(Ordering::Relaxed));
        add(&t.throttled, counters.throttled.load(Ordering::Relaxed));
        if let Some(r) = report {
            add(
                &t.leaked_found,
                r.by_kind.get("delete-leaked").copied().unwrap_or(0),
            );
            add(&t.tasks_failed, r.tasks_failed);
        }
    }

    /// Plans with `clock` instead of the system's wall clock.
    pub fn with_clock(mut self, clock: Clock) -> Allocator {
        self.clock = clock;
        self
    }

    pub fn config(&self) -> &OperatorConfig {
        &self.config
    }

    /// The next resync lists the cloud, whatever the last listing's age.
    pub fn invalidate_listing(&self) {
        self.cache().listing = None;
    }

    /// Forgets everything cached of the cluster: leadership was lost, and a
    /// successor may have called and written since.
    pub fn forget(&self) {
        *self.cache() = Cache::default();
    }

    fn cache(&self) -> MutexGuard<'_, Cache> {
        // Plain maps behind the lock: always consistent.
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One resync: `nodes` and `sets` are the runtime's caches of the
    /// Node and NetResourceSet objects.
    pub async fn resync(
        &self,
        nodes: &[NodeInfo],
        sets: &[SetInfo],
    ) -> Result<ResyncReport, Error> {
        self.resync_with(nodes, sets, Demand::default()).await
    }

    /// [`Allocator::resync`], also serving what `demand` asks.
    pub async fn resync_with(
        &self,
        nodes: &[NodeInfo],
        sets: &[SetInfo],
        demand: Demand<'_>,
    ) -> Result<ResyncReport, Error> {
        let _one = self.one_at_a_time.lock().await;
        let counters = Counters::default();
        let result = self.resync_locked(nodes, sets, demand, &counters).await;
        self.add_to_totals(&counters, result.as_ref().ok());
        if matches!(result, Err(Error::NotLeader | Error::PastDeadline(_))) {
            self.forget();
        }
        result
    }

    async fn resync_locked(
        &self,
        nodes: &[NodeInfo],
        sets: &[SetInfo],
        Demand { claims, warm }: Demand<'_>,
        counters: &Counters,
    ) -> Result<ResyncReport, Error> {
        if let Err(e) = self.lead() {
            return Err(e.deposed().unwrap_or(Error::NotLeader));
        }
        let mut report = ResyncReport {
            nodes: nodes.len(),
            ..Default::default()
        };
        let stale = self
            .cache()
            .listing
            .as_ref()
            .is_none_or(|l| l.at.elapsed() >= self.config.resync_interval);
        if stale {
            let enis = self
                .gate
                .call(Class::Describe, counters, |c| c.list_cluster_enis())
                .await
                .map_err(|e| match e.deposed() {
                    Some(deposed) => deposed,
                    None => match e {
                        TaskError::Cloud(e) => {
                            if let ProviderError::Throttled(why) = &e {
                                self.store
                                    .tell(Told::ListingThrottled { error: why.clone() });
                            }
                            Error::Listing(e)
                        }
                        other => Error::Listing(ProviderError::Unavailable(other.to_string())),
                    },
                })?;
            self.cache().listing = Some(Listing {
                at: Instant::now(),
                enis,
            });
            report.listed = true;
        }
        self.fetch_limits(nodes, sets, counters, &mut report)
            .await?;

        let now = (self.clock)();
        let (tasks, base) = {
            let mut cache = self.cache();
            let cache = &mut *cache;
            track_gone(&mut cache.gone_since, nodes, sets, now);
            let reap = report.listed
                && cache
                    .last_reap
                    .is_none_or(|t| t.elapsed() >= self.config.reap_interval);
            if reap {
                cache.last_reap = Some(Instant::now());
            }
            // Our own last writes are newer than what the watch shows.
            let mut sets: Vec<SetInfo> = sets
                .iter()
                .map(|s| match cache.written.get(&s.name) {
                    Some(w) if *w != s.spec => SetInfo {
                        spec: w.clone(),
                        ..s.clone()
                    },
                    _ => s.clone(),
                })
                .collect();
            // A set we wrote that the watch has not shown yet.
            let seen: HashSet<String> = sets.iter().map(|s| s.name.clone()).collect();
            for (name, spec) in &cache.written {
                if !seen.contains(name) {
                    sets.push(SetInfo {
                        name: name.clone(),
                        spec: spec.clone(),
                        status: None,
                        deleting_since: None,
                        uninstall: Default::default(),
                    });
                }
            }
            cache
                .refused_claims
                .retain(|_, (at, _)| at.elapsed() < CLAIM_RETRY);
            let refused: HashMap<String, String> = cache
                .refused_claims
                .iter()
                .map(|(uid, (_, error))| (uid.clone(), error.clone()))
                .collect();
            let listing: &[FleetEni] = cache.listing.as_ref().map_or(&[], |l| &l.enis);
            let mut surplus_since = std::mem::take(&mut cache.surplus_since);
            report.enis = listing.len();
            let index = Index::build(Input {
                policy: &self.policy,
                nodes,
                sets: &sets,
                enis: listing,
                limits: &cache.limits,
                gone_since: &cache.gone_since,
                surplus_since: &surplus_since,
                reap_leaks: reap,
                now,
                claims,
                refused: &refused,
                warm,
                cloud: self.gate.cloud_name(),
            });
            tell_held_back(&mut cache.held_back, &index);
            let Planned { tasks, surplus } = plan_pass(&index);
            let unservable = unservable_claims(&index, &tasks);
            self.note_refusals(&unservable, &refused);
            self.tell_unservable(&mut cache.unservable, unservable);
            drop(index);
            // Since when each node has been in surplus (drain_delay).
            track_since(&mut surplus_since, surplus, now);
            cache.surplus_since = surplus_since;
            let base: HashMap<String, NetResourceSetSpec> =
                sets.into_iter().map(|s| (s.name, s.spec)).collect();
            (tasks, base)
        };
        report.tasks = tasks.len();
        for t in &tasks {
            *report.by_kind.entry(t.kind()).or_default() += 1;
        }

        let node_info: HashMap<&str, &NodeInfo> =
            nodes.iter().map(|n| (n.name.as_str(), n)).collect();
        let jobs = group(tasks);
        let outcomes: Vec<(Option<String>, JobOutcome)> = futures::stream::iter(jobs)
            .map(|tasks| {
                let node = tasks.first().and_then(Task::node).map(str::to_string);
                let info = node.as_deref().and_then(|n| node_info.get(n).copied());
                let spec = node.as_deref().and_then(|n| base.get(n)).cloned();
                let job = job::Job {
                    alloc: self,
                    counters,
                    node: node.clone(),
                    info,
                    spec,
                };
                async move { (node, job.run(tasks).await) }
            })
            .buffer_unordered(self.config.workers)
            .collect()
            .await;
        let mut deposed = None;
        let mut refusals = HashSet::new();
        for (node, results) in outcomes {
            for e in results.into_iter().filter_map(Result::err) {
                report.tasks_failed += 1;
                if deposed.is_none() {
                    deposed = e.deposed();
                }
                let text = match &node {
                    Some(n) => format!("node {n}: {e}"),
                    None => e.to_string(),
                };
                // Nothing but a config change ends it: said once.
                if matches!(e, TaskError::Cloud(ProviderError::Config(_))) {
                    refusals.insert(text.clone());
                    if self.cache().told.contains(&text) {
                        continue;
                    }
                }
                if report.errors.len() < REPORTED_ERRORS {
                    report.errors.push(text);
                }
            }
        }
        // A refusal that stopped is forgotten: should it come back, it is
        // told again.
        self.cache().told = refusals;
        report.cloud_calls = counters.calls.load(Ordering::Relaxed);
        report.throttled = counters.throttled.load(Ordering::Relaxed);
        report.writes = counters.writes.load(Ordering::Relaxed);
        if let Some(e) = deposed {
            return Err(e);
        }
        Ok(report)
    }

    /// Limits of instance types not asked before (each once, cached).
    async fn fetch_limits(
        &self,
        nodes: &[NodeInfo],
        sets: &[SetInfo],
        counters: &Counters,
        report: &mut ResyncReport,
    ) -> Result<(), Error> {
        // A node in no pool, or not (yet) an instance of this cloud, gets
        // no ENI: its type is not asked for. Nor is a type not known yet
        // (no label): the cloud refuses "" at every resync.
        let cloud = self.gate.cloud_name();
        let wanted: HashSet<&str> = nodes
            .iter()
            .filter(|n| self.policy.pool_of(&n.labels).is_some())
            .filter(|n| instance_of(n).provider == cloud)
            .map(|n| n.instance_type.as_str())
            .chain(sets.iter().map(|s| s.spec.instance.instance_type.as_str()))
            .filter(|t| !t.is_empty())
            .collect();
        let missing: Vec<&str> = {
            let cache = self.cache();
            wanted
                .into_iter()
                .filter(|t| !cache.limits.contains_key(*t))
                .collect()
        };
        for t in missing {
            match self
                .gate
                .call(Class::Describe, counters, |c| c.limits(t))
                .await
            {
                Ok(l) => {
                    self.cache().limits.insert(t.to_string(), l);
                }
                Err(e) if e.is_deposed() => return Err(e.deposed().unwrap_or(Error::NotLeader)),
                Err(e) => {
                    // Its nodes get no new ENIs until it answers.
                    tracing::warn!(instance_type = t, error = %e, "instance type limits unavailable");
                    report.tasks_failed += 1;
                    report.errors.push(format!("limits of {t:?}: {e}"));
                }
            }
        }
        Ok(())
    }

    /// Tells each claim of `now` not told yet; `told` keeps those still
    /// unservable, so one served since is told again should it return.
    fn tell_unservable(&self, told: &mut HashMap<String, String>, now: Vec<(ClaimInfo, String)>) {
        let mut still = HashMap::new();
        for (info, why) in now {
            let claim = info.claim;
            if told.get(&claim.uid) != Some(&why) {
                tracing::warn!(claim = %claim, why, "claim not servable");
                self.store.tell(Told::ClaimNotServable {
                    claim: claim.clone(),
                    pod: info.pod,
                    why: why.clone(),
                });
            }
            still.insert(claim.uid, why);
        }
        *told = still;
    }

    /// Each refused claim made from a policy's template is noted for that
    /// policy's status, again at each pass while the refusal lasts.
    fn note_refusals(&self, unservable: &[(ClaimInfo, String)], refused: &HashMap<String, String>) {
        for (info, _) in unservable {
            let (Some(policy), Some(error)) = (&info.policy, refused.get(&info.claim.uid)) else {
                continue;
            };
            self.refusals.note(
                policy,
                Refusal {
                    made_for: format!("claim {}", info.claim),
                    error: error.clone(),
                },
            );
        }
    }

    /// `Ok` while this replica may call the cloud and write.
    fn lead(&self) -> Result<(), TaskError> {
        self.gate.lead()
    }

    /// A client token no other create of this cluster carries.
    fn new_token(&self) -> String {
        let n = self.tokens.fetch_add(1, Ordering::Relaxed);
        let ms = (self.clock)()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        format!(
            "enim-{ms:x}-{:016x}",
            self.salt ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        )
    }

    /// Amends the cached listing after one of our own calls.
    fn amend(&self, f: impl FnOnce(&mut Vec<FleetEni>)) {
        if let Some(l) = self.cache().listing.as_mut() {
            f(&mut l.enis);
        }
    }
}

/// Logs each live node newly held back (frozen, or waiting for an
/// instance of the cloud), or held back for another reason, and each let
/// go since the last resync; `told` keeps what was told.
fn tell_held_back(told: &mut HashMap<String, String>, index: &Index) {
    let now: HashMap<String, String> = index
        .nodes
        .iter()
        .filter(|e| matches!(e.phase, Phase::Live | Phase::New))
        .filter_map(|e| match &e.serving {
            Serving::Frozen(why) => Some((e.name.to_string(), format!("node frozen: {why}"))),
            Serving::NoInstance(why) => Some((
                e.name.to_string(),
                format!("node waits, nothing is made for it: {why}"),
            )),
            Serving::Pool(_) | Serving::Unserved => None,
        })
        .collect();
    for (node, what) in &now {
        if told.get(node) != Some(what) {
            tracing::warn!(node = %node, "{what}");
        }
    }
    for node in told.keys().filter(|n| !now.contains_key(*n)) {
        tracing::info!(node = %node, "node no longer held back (served by its pool, or gone)");
    }
    *told = now;
}

/// Sets whose Node is gone get a first-seen time; others lose theirs.
fn track_gone(
    gone: &mut HashMap<String, SystemTime>,
    nodes: &[NodeInfo],
    sets: &[SetInfo],
    now: SystemTime,
) {
    let live: HashSet<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
    let orphaned = sets
        .iter()
        .map(|s| s.name.as_str())
        .filter(|name| !live.contains(name));
    track_since(gone, orphaned, now);
}

/// Keeps since when each of `current` has been so at every pass: a name
/// new to it starts at `now`, one no longer in it is forgotten (and would
/// start again from zero).
fn track_since<S: AsRef<str>>(
    since: &mut HashMap<String, SystemTime>,
    current: impl IntoIterator<Item = S>,
    now: SystemTime,
) {
    let current: HashSet<String> = current
        .into_iter()
        .map(|s| s.as_ref().to_string())
        .collect();
    since.retain(|name, _| current.contains(name));
    for name in current {
        since.entry(name).or_insert(now);
    }
}

/// Plan order, cut into jobs: a node's tasks (adjacent in a plan) form one
/// job; each leaked ENI is a job of its own.
fn group(tasks: Vec<Task>) -> Vec<Vec<Task>> {
    let mut jobs: Vec<Vec<Task>> = Vec::new();
    for t in tasks {
        match jobs.last_mut() {
            Some(last) if t.node().is_some() && last.first().and_then(Task::node) == t.node() => {
                last.push(t)
            }
            _ => jobs.push(vec![t]),
        }
    }
    jobs
}
