//! The fleet: many nodes' warm pools in one process over one account's
//! buckets.
//!
//! Timeline (simulated time):
//! 1. warm-up: `nodes` agents start at times spread uniformly over
//!    `warmup_spread`; then every pool reaches `min_free`, and `settle`;
//! 2. idle window (`idle`): no pods come or go; EC2 calls counted;
//! 3. churn: on every node pods arrive as a Poisson process
//!    (`churn_per_hour`), each holding its ENI for an exponentially
//!    distributed time (mean `pod_life`); after `churn_warmup`, the churn
//!    window (`churn`) counts EC2 calls;
//! 4. start-up: `start_nodes` more nodes start at once with empty pools
//!    while the churn goes on; `start_pods` pods land on each new node
//!    within `start_pod_window`. Done when every new pool has reached
//!    `min_free` free (the pods' own waits are reported apart).
//!
//! An agent whose pool fails to start (its discovery calls throttled past
//! the client's retries) is taken to exit and be restarted by the kubelet
//! with CrashLoopBackOff (10 s doubling to 300 s, kubelet
//! `MaxContainerBackOff`); a pod's ADD meanwhile finds the agent
//! unreachable, which the plugin answers as CNI code 11.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use enim_provider::EniProvider;
use enim_provider_pool::{PoolConfig, WarmPool};
use tokio::task::{JoinError, JoinHandle};
use tokio::time::Instant;

use super::bucket::Action;
use super::burst::bucket_time;
use super::cloud::{paused_runtime, Account, CloudParams, Counts};
use super::pods::{self, Ledger, PodResult, Retry};
use super::rng::Rng;
use crate::stats::{summarize, Summary};
use crate::R;

#[derive(Debug, Clone)]
pub struct FleetCfg {
    pub nodes: usize,
    pub warmup_spread: Duration,
    pub settle: Duration,
    pub idle: Duration,
    pub churn_warmup: Duration,
    pub churn: Duration,
    /// Pods started per node per hour in the churn.
    pub churn_per_hour: f64,
    pub pod_life: Duration,
    pub start_nodes: usize,
    pub start_pods: usize,
    pub start_pod_window: Duration,
    pub min_free: usize,
    pub max_free: usize,
    pub seed: u64,
    pub params: CloudParams,
}

impl FleetCfg {
    pub fn full(seed: u64) -> FleetCfg {
        FleetCfg {
            nodes: 1000,
            warmup_spread: Duration::from_secs(600),
            settle: Duration::from_secs(300),
            idle: Duration::from_secs(3600),
            churn_warmup: Duration::from_secs(1200),
            churn: Duration::from_secs(3600),
            churn_per_hour: 6.0,
            pod_life: Duration::from_secs(1200),
            start_nodes: 200,
            start_pods: 2,
            start_pod_window: Duration::from_secs(60),
            min_free: 3,
            max_free: 5,
            seed,
            params: CloudParams::default(),
        }
    }

    pub fn smoke(seed: u64) -> FleetCfg {
        FleetCfg {
            nodes: 10,
            warmup_spread: Duration::from_secs(30),
            settle: Duration::from_secs(60),
            idle: Duration::from_secs(600),
            churn_warmup: Duration::from_secs(300),
            churn: Duration::from_secs(600),
            churn_per_hour: 12.0,
            pod_life: Duration::from_secs(300),
            start_nodes: 3,
            start_pods: 2,
            start_pod_window: Duration::from_secs(60),
            min_free: 2,
            max_free: 3,
            ..FleetCfg::full(seed)
        }
    }
}

/// Pods of one phase.
#[derive(Debug, Clone)]
pub struct PodStats {
    pub started: usize,
    pub ready: Summary,
    pub stuck: usize,
    pub try_again: u64,
    pub other_errors: u64,
}

pub fn pod_stats(results: &[PodResult]) -> PodStats {
    let ready: Vec<Duration> = results.iter().filter_map(|r| r.ready).collect();
    PodStats {
        started: results.len(),
        ready: summarize(&ready),
        stuck: results.len() - ready.len(),
        try_again: results.iter().map(|r| u64::from(r.try_again)).sum(),
        other_errors: results.iter().map(|r| u64::from(r.other_errors)).sum(),
    }
}

/// What a fleet run measures of the timeline, phase by phase: the same
/// figures for the per-node agents ([`Fleet`]) and for the operator
/// ([`super::operator::OperatorRun`]), so that they compare one to one.
#[derive(Debug, Clone)]
pub struct Timeline {
    pub cfg: FleetCfg,
    /// First node's start → every pool at `min_free`.
    pub warmup: Duration,
    pub warmup_counts: Counts,
    pub idle: Counts,
    pub churn: Counts,
    pub churn_pods: PodStats,
    /// New nodes' start → every new pool has reached `min_free`.
    pub start_done: Duration,
    /// Each new node's start → its pool first at `min_free`.
    pub start_per_node: Summary,
    /// New nodes' start → every pod on them running.
    pub pods_ready: Duration,
    /// The start-up's calls (the whole account's, churn included).
    pub start_counts: Counts,
    pub start_pods: PodStats,
    /// The buckets' floor on the start-up ([`bucket_floor`] of
    /// `start_counts`).
    pub start_bucket_bound: Duration,
    /// One node's `min_free` creates, the pool's parallelism at a time, at
    /// the mean attach time.
    pub start_latency_bound: Duration,
}

impl Timeline {
    /// The phases' figures, with the start-up's bounds ([`start_bounds`]).
    pub fn new(
        cfg: FleetCfg,
        (warmup, warmup_counts): (Duration, Counts),
        idle: Counts,
        churn: Counts,
        start: StartUp,
        (churn_pods, start_pods): (PodStats, PodStats),
    ) -> Timeline {
        let (start_bucket_bound, start_latency_bound) = start_bounds(&cfg, &start.counts);
        Timeline {
            warmup,
            warmup_counts,
            idle,
            churn,
            churn_pods,
            start_done: start.done,
            start_per_node: start.per_node,
            pods_ready: start.pods_ready,
            start_counts: start.counts,
            start_pods,
            start_bucket_bound,
            start_latency_bound,
            cfg,
        }
    }

    /// The start-up's bound: the longer of the buckets' and the latency
    /// bound.
    pub fn bound(&self) -> Duration {
        self.start_bucket_bound.max(self.start_latency_bound)
    }

    /// The start-up over its [`Self::bound`].
    pub fn start_ratio(&self) -> f64 {
        self.start_done.as_secs_f64() / self.bound().as_secs_f64()
    }

    /// AttachNetworkInterface calls carried out in the start-up window
    /// (the new pools', their pods' and the churn's).
    pub fn start_attaches(&self) -> u64 {
        self.start_counts.get(Action::AttachNetworkInterface).ok
    }
}

#[derive(Debug, Clone)]
pub struct Fleet {
    pub timeline: Timeline,
    /// Agents restarted because their pool failed to start.
    pub agent_restarts: u64,
}

/// How long a run waits for a phase to end, and how often it looks.
pub const LIMIT: Duration = Duration::from_secs(6 * 3600);
pub const TICK: Duration = Duration::from_secs(1);

/// The start-up's end, as [`started_up`] measures it.
pub struct StartUp {
    /// New nodes' start → every new pool has reached `min_free`.
    pub done: Duration,
    pub per_node: Summary,
    /// The account's calls meanwhile.
    pub counts: Counts,
    /// New nodes' start → every pod on them has its result.
    pub pods_ready: Duration,
    /// The new nodes' pods'.
    pub results: Vec<PodResult>,
}

struct Node {
    pool: OnceLock<Arc<WarmPool>>,
}

/// A churn pod: its arrival and its task.
pub type ChurnPod = (Instant, JoinHandle<PodResult>);

struct Sim {
    account: Arc<Account>,
    config: PoolConfig,
    ledger: Arc<Ledger>,
    restarts: Arc<AtomicU64>,
}

impl Sim {
    /// Starts node `i`'s agent after `delay`, restarting it while its pool
    /// fails to start.
    fn agent(&self, i: usize, delay: Duration, mut rng: Rng) -> (Arc<Node>, JoinHandle<()>) {
        let node = Arc::new(Node {
            pool: OnceLock::new(),
        });
        let (n, account, config, restarts) = (
            node.clone(),
            self.account.clone(),
            self.config.clone(),
            self.restarts.clone(),
        );
        let task = tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let mut backoff = Duration::from_secs(10);
            loop {
                match WarmPool::start(account.node(i), config.clone()).await {
                    Ok(pool) => {
                        // As the agent does at start-up: a new node's
                        // checkpoint is empty. Never fails on a pool.
                        let _ = pool.restore(&[]).await;
                        let _ = n.pool.set(pool);
                        return;
                    }
                    Err(_) => {
                        restarts.fetch_add(1, Ordering::Relaxed);
                        // CrashLoopBackOff has no jitter; the draw only
                        // keeps the restart off the exact tick.
                        tokio::time::sleep(
                            backoff + rng.between(Duration::ZERO, Duration::from_millis(100)),
                        )
                        .await;
                        backoff = (backoff * 2).min(Duration::from_secs(300));
                    }
                }
            }
        });
        (node, task)
    }

    /// One pod on `node` arriving now: ADD (the agent unreachable counts as
    /// CNI 11), hold for `life`, DEL.
    fn pod(
        &self,
        node: Arc<Node>,
        name: String,
        life: Option<Duration>,
        mut rng: Rng,
    ) -> JoinHandle<PodResult> {
        let ledger = self.ledger.clone();
        tokio::spawn(async move {
            let arrival = Instant::now();
            let retry = Retry::Kubelet;
            let give_up = Duration::from_secs(3600);
            let mut unreachable = 0;
            let pool = loop {
                if let Some(p) = node.pool.get() {
                    break p.clone();
                }
                unreachable += 1;
                if arrival.elapsed() >= give_up {
                    return PodResult {
                        tries: unreachable,
                        try_again: unreachable,
                        ..PodResult::default()
                    };
                }
                tokio::time::sleep(retry.delay(&mut rng)).await;
            };
            let mut r = pods::add(&pool, &ledger, &name, retry, &mut rng, give_up).await;
            r.ready = r.ready.map(|_| arrival.elapsed());
            r.tries += unreachable;
            r.try_again += unreachable;
            if let (Some(life), Some(eni)) = (life, r.eni.clone()) {
                tokio::time::sleep(life).await;
                r.other_errors += pods::del(&pool, &ledger, &name, &eni).await;
            }
            r
        })
    }
}

/// The start-up's bounds: the buckets' floor for the window's calls
/// ([`bucket_floor`] of `counts`), and one node's `min_free` creates, the
/// pool's parallelism at a time, at the mean attach time.
pub fn start_bounds(cfg: &FleetCfg, counts: &Counts) -> (Duration, Duration) {
    let latency = cfg.params.mean_attach()
        * u32::try_from(cfg.min_free.div_ceil(super::burst::pool_parallelism()))
            .unwrap_or(u32::MAX);
    (bucket_floor(counts), latency)
}

/// The time the account's buckets need, at the least, to grant the calls
/// a window that made `counts` could not do without: one
/// AttachNetworkInterface per ENI attached, and for each such ENI at most
/// one CreateNetworkInterface and one ModifyNetworkInterfaceAttribute
/// (DeleteOnTermination) of those the window made; the longest of them.
///
/// Why no allocator could beat it: a bucket full at the window's start
/// (the best case) grants its capacity and then its refill each second,
/// whoever calls and in whatever order, so `n` calls of one action take
/// at least [`bucket_time`]. Only the calls the ENIs need count: a
/// throttled call took no token, and a refused one, or a create whose ENI
/// was deleted again, is waste an allocator could avoid. Describes are
/// left out (how often to look is the allocator's choice), and so are the
/// churn's detaches and deletes (they could wait for the start-up to end).
/// The create and modify buckets refill as fast as the attach bucket and
/// hold more, so the attaches set the floor.
pub fn bucket_floor(counts: &Counts) -> Duration {
    let attached = counts.get(Action::AttachNetworkInterface).ok;
    [
        Action::AttachNetworkInterface,
        Action::CreateNetworkInterface,
        Action::ModifyNetworkInterfaceAttribute,
    ]
    .iter()
    .map(|a| {
        let needed = counts.get(*a).ok.min(attached);
        bucket_time(*a, usize::try_from(needed).unwrap_or(usize::MAX))
    })
    .max()
    .unwrap_or_default()
}

/// After the warm-up: `settle`, then the idle window; its calls.
pub async fn settle_and_idle(cfg: &FleetCfg, account: &Account) -> Counts {
    tokio::time::sleep(cfg.settle).await;
    let c0 = account.counts();
    tokio::time::sleep(cfg.idle).await;
    account.counts().since(&c0)
}

/// Every node's churn driver (nodes `0..nodes`): pods arrive as a Poisson
/// process (`churn_per_hour`), each to hold its ENI for an exponential
/// time (mean `pod_life`), until `stop`. `pod(i, name, hold, rng)` starts
/// one on node `i`; each goes into `out` with its arrival.
pub fn churn_drivers<P>(
    cfg: &FleetCfg,
    rng: &mut Rng,
    stop: &Arc<AtomicBool>,
    out: &Arc<Mutex<Vec<ChurnPod>>>,
    pod: P,
) -> Vec<JoinHandle<()>>
where
    P: Fn(usize, String, Duration, Rng) -> JoinHandle<PodResult> + Send + Sync + 'static,
{
    let pod = Arc::new(pod);
    let mut drivers = Vec::new();
    for i in 0..cfg.nodes {
        let (pod, stop, out) = (pod.clone(), stop.clone(), out.clone());
        let mut rng = rng.fork(1_000_000 + i as u64);
        let gap = Duration::from_secs_f64(3600.0 / cfg.churn_per_hour);
        let life = cfg.pod_life;
        drivers.push(tokio::spawn(async move {
            let mut k = 0;
            loop {
                tokio::time::sleep(rng.exp(gap)).await;
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                let hold = rng.exp(life);
                let task = pod(i, format!("n{i}-p{k}"), hold, rng.fork(k));
                out.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((Instant::now(), task));
                k += 1;
            }
        }));
    }
    drivers
}

/// The churn's counted window, after `churn_warmup`: its calls, its start
/// and its end.
pub async fn churn_window(cfg: &FleetCfg, account: &Account) -> (Counts, Instant, Instant) {
    tokio::time::sleep(cfg.churn_warmup).await;
    let c1 = account.counts();
    let start = Instant::now();
    tokio::time::sleep(cfg.churn).await;
    let end = Instant::now();
    (account.counts().since(&c1), start, end)
}

/// Waits a [`TICK`] at a time until `done(j)` has held for each of the
/// `n` new nodes: when each first did, after `s0`; `None` past [`LIMIT`].
async fn each_done(n: usize, done: impl Fn(usize) -> bool, s0: Instant) -> Option<Vec<Duration>> {
    let mut done_at: Vec<Option<Duration>> = vec![None; n];
    loop {
        for (j, at) in done_at.iter_mut().enumerate() {
            if at.is_none() && done(j) {
                *at = Some(s0.elapsed());
            }
        }
        if done_at.iter().all(Option::is_some) {
            return Some(done_at.into_iter().flatten().collect());
        }
        if s0.elapsed() > LIMIT {
            return None;
        }
        tokio::time::sleep(TICK).await;
    }
}

/// The new nodes' pods' results, each once it has one.
async fn results(pods: Vec<JoinHandle<Result<PodResult, JoinError>>>) -> R<Vec<PodResult>> {
    let mut results = Vec::new();
    for p in pods {
        results.push(p.await??);
    }
    Ok(results)
}

/// The warm-up's end: once `ready()` (every pool at `min_free`), its time
/// since `t0` and the account's calls; `who`'s error past [`LIMIT`].
pub async fn warmed_up(
    who: &str,
    ready: impl Fn() -> bool,
    t0: Instant,
    account: &Account,
) -> R<(Duration, Counts)> {
    while !ready() {
        if t0.elapsed() > LIMIT {
            return Err(format!("{who}: warm-up not done after {LIMIT:?}").into());
        }
        tokio::time::sleep(TICK).await;
    }
    Ok((t0.elapsed(), account.counts()))
}

/// The start-up's end: once each of the `n` new nodes is `free(j)` (its
/// pool at `min_free`), then once their `pods` all have a result; times
/// from `s0`, calls since `c0`. `who`'s error past [`LIMIT`].
pub async fn started_up(
    who: &str,
    n: usize,
    free: impl Fn(usize) -> bool,
    (s0, c0): (Instant, &Counts),
    account: &Account,
    pods: Vec<JoinHandle<Result<PodResult, JoinError>>>,
) -> R<StartUp> {
    let Some(per_node) = each_done(n, free, s0).await else {
        return Err(format!("{who}: start-up of {n} nodes not done after {LIMIT:?}").into());
    };
    let done = s0.elapsed();
    let counts = account.counts().since(c0);
    let results = results(pods).await?;
    Ok(StartUp {
        done,
        per_node: summarize(&per_node),
        counts,
        pods_ready: s0.elapsed(),
        results,
    })
}

/// Wind-down: `stop` the drivers, then every churn pod ends (or gives
/// up). The results of those that arrived in the window (`start..end`);
/// any other must have succeeded (`who`'s error otherwise).
pub async fn churn_results(
    who: &str,
    stop: &AtomicBool,
    drivers: Vec<JoinHandle<()>>,
    churn_pods: &Mutex<Vec<ChurnPod>>,
    (start, end): (Instant, Instant),
) -> R<Vec<PodResult>> {
    stop.store(true, Ordering::Relaxed);
    for d in drivers {
        d.await?;
    }
    let tasks = std::mem::take(&mut *churn_pods.lock().unwrap_or_else(|p| p.into_inner()));
    let mut churn_results = Vec::new();
    for (at, t) in tasks {
        let r = t.await?;
        if at >= start && at < end {
            churn_results.push(r);
        } else if r.ready.is_none() || r.other_errors > 0 {
            // Outside the window, still checked.
            return Err(format!("{who}: a churn pod failed: {r:?}").into());
        }
    }
    Ok(churn_results)
}

/// The churn's and the new nodes' pod stats; `who`'s error if a pod
/// never got an ENI or an ENI went to two pods.
pub fn checked_pods(
    who: &str,
    churn: &[PodResult],
    start: &[PodResult],
    ledger: &Ledger,
) -> R<(PodStats, PodStats)> {
    let churn_pods = pod_stats(churn);
    let start_pods = pod_stats(start);
    if churn_pods.stuck > 0 || start_pods.stuck > 0 {
        return Err(format!(
            "{who}: pods never got an ENI: {} in the churn, {} on new nodes",
            churn_pods.stuck, start_pods.stuck
        )
        .into());
    }
    let doubles = ledger.doubles();
    if !doubles.is_empty() {
        return Err(format!("{who}: ENIs given to two pods: {doubles:?}").into());
    }
    Ok((churn_pods, start_pods))
}

pub fn run(cfg: &FleetCfg) -> R<Fleet> {
    let rt = paused_runtime(cfg.seed)?;
    rt.block_on(fleet(cfg.clone()))
}

fn all_at_min_free(nodes: &[Arc<Node>], min_free: usize) -> bool {
    nodes.iter().all(|n| {
        n.pool
            .get()
            .is_some_and(|p| p.stats().available >= min_free)
    })
}

async fn fleet(cfg: FleetCfg) -> R<Fleet> {
    let mut rng = Rng::new(cfg.seed);
    let sim = Sim {
        account: Account::new(cfg.params.clone(), rng.next_u64()),
        config: super::pool_config(cfg.min_free, cfg.max_free),
        ledger: Arc::new(Ledger::default()),
        restarts: Arc::new(AtomicU64::new(0)),
    };

    // 1. Warm-up.
    let t0 = Instant::now();
    let mut nodes = Vec::new();
    let mut agents = Vec::new();
    for i in 0..cfg.nodes {
        let delay = rng.between(Duration::ZERO, cfg.warmup_spread);
        let (node, task) = sim.agent(i, delay, rng.fork(i as u64));
        nodes.push(node);
        agents.push(task);
    }
    let ready = || all_at_min_free(&nodes, cfg.min_free);
    let warmup = warmed_up("fleet", ready, t0, &sim.account).await?;

    // 2. Idle.
    let idle = settle_and_idle(&cfg, &sim.account).await;

    // 3. Churn, running on until the start-up is done.
    let stop = Arc::new(AtomicBool::new(false));
    let churn_pods: Arc<Mutex<Vec<ChurnPod>>> = Arc::default();
    let sim = Arc::new(sim);
    let drivers = {
        let (sim, nodes) = (sim.clone(), nodes.clone());
        churn_drivers(
            &cfg,
            &mut rng,
            &stop,
            &churn_pods,
            move |i, name, hold, rng| sim.pod(nodes[i].clone(), name, Some(hold), rng),
        )
    };
    let (churn, churn_start, churn_end) = churn_window(&cfg, &sim.account).await;

    // 4. Start-up of new nodes, all at once.
    let c2 = sim.account.counts();
    let restarts_before = sim.restarts.load(Ordering::Relaxed);
    let s0 = Instant::now();
    let mut new_nodes = Vec::new();
    let mut new_pods = Vec::new();
    for j in 0..cfg.start_nodes {
        let i = cfg.nodes + j;
        let (node, task) = sim.agent(i, Duration::ZERO, rng.fork(i as u64));
        agents.push(task);
        for k in 0..cfg.start_pods {
            let at = rng.between(Duration::ZERO, cfg.start_pod_window);
            let (sim, node, prng) = (sim.clone(), node.clone(), rng.fork((i * 100 + k) as u64));
            new_pods.push(tokio::spawn(async move {
                tokio::time::sleep(at).await;
                sim.pod(node, format!("new{j}-p{k}"), None, prng).await
            }));
        }
        new_nodes.push(node);
    }
    let free = |j: usize| {
        new_nodes[j]
            .pool
            .get()
            .is_some_and(|p| p.stats().available >= cfg.min_free)
    };
    let start = started_up(
        "fleet",
        cfg.start_nodes,
        free,
        (s0, &c2),
        &sim.account,
        new_pods,
    )
    .await?;
    // Every pool up (each new one at min_free): no agent restarts since.
    let agent_restarts = sim.restarts.load(Ordering::Relaxed) - restarts_before;
    let start_results = &start.results;

    // Wind down: no more arrivals; every churn pod ends (or gives up).
    let window = (churn_start, churn_end);
    let churn_results = churn_results("fleet", &stop, drivers, &churn_pods, window).await?;
    let pods = checked_pods("fleet", &churn_results, start_results, &sim.ledger)?;
    // The churn's pods have all left; the new nodes' pods stay.
    if sim.ledger.held() != start_results.len() {
        return Err(format!(
            "fleet: {} ENIs held at the end, {} expected",
            sim.ledger.held(),
            start_results.len()
        )
        .into());
    }
    // Every agent up, every pool back at min_free once the pods are gone.
    let everyone: Vec<Arc<Node>> = nodes.iter().chain(&new_nodes).cloned().collect();
    let t = Instant::now();
    while !all_at_min_free(&everyone, cfg.min_free) {
        if t.elapsed() > Duration::from_secs(3600) {
            return Err("fleet: pools not back at min_free an hour after the end".into());
        }
        tokio::time::sleep(TICK).await;
    }
    for n in &everyone {
        if let Some(p) = n.pool.get() {
            p.shutdown().await;
        }
    }
    for a in agents {
        a.await?;
    }

    Ok(Fleet {
        timeline: Timeline::new(cfg, warmup, idle, churn, start, pods),
        agent_restarts,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::cloud::Count;

    fn counts(calls: &[(Action, u64, u64)]) -> Counts {
        Counts {
            by_action: calls
                .iter()
                .map(|(a, ok, throttled)| {
                    let c = Count {
                        ok: *ok,
                        throttled: *throttled,
                        ..Count::default()
                    };
                    (*a, c)
                })
                .collect(),
            imds_reads: 0,
        }
    }

    #[test]
    fn the_bucket_floor_counts_the_attached_enis_and_no_waste() {
        use Action::*;
        // 1,096 attached: the attach bucket's 50, then 5 a second.
        let made = counts(&[
            (AttachNetworkInterface, 1096, 0),
            (CreateNetworkInterface, 1318, 6701),
            (ModifyNetworkInterfaceAttribute, 1096, 0),
            (DeleteNetworkInterface, 314, 0),
            (DescribeNetworkInterfacesFiltered, 3710, 10032),
        ]);
        assert_eq!(bucket_floor(&made), Duration::from_secs(210));
        // Creates beyond one per ENI attached, deletes and describes would
        // each bind alone; none is needed.
        let wasteful = counts(&[
            (AttachNetworkInterface, 60, 0),
            (CreateNetworkInterface, 900, 0),
            (DeleteNetworkInterface, 800, 0),
            (DescribeNetworkInterfacesFiltered, 5000, 0),
        ]);
        assert_eq!(bucket_floor(&wasteful), Duration::from_secs(2));
        // Throttled attaches took no token.
        let throttled = counts(&[(AttachNetworkInterface, 50, 400)]);
        assert_eq!(bucket_floor(&throttled), Duration::ZERO);
    }

    #[test]
    fn smoke_fleet_holds_its_invariants_and_repeats() {
        let a = run(&FleetCfg::smoke(11)).unwrap().timeline;
        assert_eq!(a.idle.calls(true) + a.idle.calls(false), 0, "{:?}", a.idle);
        assert!(a.churn_pods.started > 0);
        assert_eq!(a.churn_pods.other_errors + a.start_pods.other_errors, 0);
        assert_eq!(a.start_pods.started, 6);
        assert!(
            a.start_done >= a.start_latency_bound.mul_f64(0.8),
            "{:?}",
            a.start_done
        );
        // The same seed, the same run: every figure.
        let b = run(&FleetCfg::smoke(11)).unwrap().timeline;
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
    }
}
