//! The fleet with the operator: the same timeline, account, buckets and
//! seed as the per-node fleet ([`super::fleet`]), but no node calls the
//! cloud. One `enim-operator` allocator (the real one) serves every node
//! through its NetResourceSet over [`SimFleet`]; agents ([`SimStore`])
//! hand spec ENIs to pods and answer the drain handshake.
//!
//! The runtime's loop is modelled as: a resync after any Node or status
//! change (coalesced over [`DEBOUNCE`]) and at least every
//! `resync_interval`; the allocator lists the cloud at most once per
//! `resync_interval`. A pod's ADD takes a free ENI whose device shows, or
//! waits up to [`ALLOCATE_WAIT`] for one, else answers "try again later"
//! (CNI 11) and the kubelet retries in 10–15 s.

pub mod measure;
pub mod store;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use enim_core::ratelimit::RateLimit;
use enim_operator::allocator::Allocator;
use enim_operator::config::{ApiRates, OperatorConfig};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::cloud::{paused_runtime, Account, SimFleet};
use super::fleet::{
    checked_pods, churn_drivers, churn_results, churn_window, settle_and_idle, started_up,
    warmed_up, ChurnPod, FleetCfg, Timeline,
};
use super::pods::{Ledger, PodResult, Retry};
use super::rng::Rng;
use crate::R;
use measure::Measure;
use store::{node_name, SimStore};

pub mod report;

/// Events within this are served by one resync.
pub const DEBOUNCE: Duration = Duration::from_secs(1);
/// As the agent's pool default (`allocate_wait`).
pub const ALLOCATE_WAIT: Duration = Duration::from_secs(20);
/// Targets.
pub const START_TARGET: f64 = 1.1;
pub const THROTTLED_TARGET_PCT: f64 = 2.0;
pub const DESCRIBE_TARGET_PCT: f64 = 2.0;
pub const HEAP_TARGET_MIB: f64 = 100.0;
pub const CPU_TARGET: Duration = Duration::from_secs(1);

#[derive(Debug, Clone)]
pub struct OperatorRun {
    pub timeline: Timeline,
    pub op: OperatorConfig,
    pub resyncs: u64,
    pub listings: u64,
    pub tasks_failed: u64,
    pub spec_writes: u64,
    pub measure: Measure,
}

/// The operator's config in the simulation: the pool of the per-node run
/// (`min_free`, `max_free`) as watermarks, and a mutating rate sized to
/// EC2's default buckets (5 a second per action; an ENI is a create and an
/// attach: 2 tokens).
pub fn operator_config(cfg: &FleetCfg) -> OperatorConfig {
    OperatorConfig {
        cluster: "sim".into(),
        watermarks: super::free_range(cfg.min_free, cfg.max_free),
        subnets: vec!["subnet-sim".into()],
        security_groups: vec!["sg-sim".into()],
        api: ApiRates {
            mutating_rate: RateLimit::new(Duration::from_millis(100), 80),
            ..ApiRates::default()
        },
        ..OperatorConfig::default()
    }
}

#[derive(Default)]
struct Stats {
    resyncs: AtomicU64,
    listings: AtomicU64,
    tasks_failed: AtomicU64,
}

pub fn run(cfg: &FleetCfg, measure_nodes: usize) -> R<OperatorRun> {
    let rt = paused_runtime(cfg.seed)?;
    let mut r = rt.block_on(simulate(cfg.clone()))?;
    drop(rt);
    r.measure = measure::run(measure_nodes)?;
    Ok(r)
}

/// One pod on node `node` arriving now (see the module's ADD).
fn pod(
    store: Arc<SimStore>,
    ledger: Arc<Ledger>,
    node: String,
    name: String,
    life: Option<Duration>,
    mut rng: Rng,
) -> JoinHandle<PodResult> {
    tokio::spawn(async move {
        let arrival = Instant::now();
        let mut r = PodResult::default();
        while r.eni.is_none() {
            r.tries += 1;
            let deadline = Instant::now() + ALLOCATE_WAIT;
            loop {
                if let Some(eni) = store.take(&node, &name) {
                    ledger.take(&eni, &name);
                    r.ready = Some(arrival.elapsed());
                    r.eni = Some(eni);
                    break;
                }
                if Instant::now() >= deadline {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            if r.eni.is_none() {
                r.try_again += 1;
                if arrival.elapsed() >= Duration::from_secs(3600) {
                    return r;
                }
                tokio::time::sleep(Retry::Kubelet.delay(&mut rng)).await;
            }
        }
        if let (Some(life), Some(eni)) = (life, r.eni.clone()) {
            tokio::time::sleep(life).await;
            ledger.give_back(&eni);
            if !store.give_back(&node, &name, &eni) {
                r.other_errors += 1;
            }
        }
        r
    })
}

fn all_at(store: &SimStore, nodes: &[usize], min_free: usize) -> bool {
    nodes.iter().all(|i| store.free(&node_name(*i)) >= min_free)
}

async fn simulate(cfg: FleetCfg) -> R<OperatorRun> {
    let mut rng = Rng::new(cfg.seed);
    let account = Account::new(cfg.params.clone(), rng.next_u64());
    let store = Arc::new(SimStore::new(account.clone()));
    let op = operator_config(&cfg);
    let wall = account.clone();
    let alloc = Arc::new(
        Allocator::new(
            Arc::new(SimFleet::new(account.clone())),
            store.clone(),
            op.clone(),
        )?
        .with_clock(Arc::new(move || wall.wall(Instant::now()))),
    );
    let stats = Arc::new(Stats::default());
    let stop = Arc::new(AtomicBool::new(false));
    let runtime = {
        let (alloc, store, stats, stop) =
            (alloc.clone(), store.clone(), stats.clone(), stop.clone());
        let interval = op.resync_interval;
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                tokio::select! {
                    _ = store.changed.notified() => {}
                    _ = tokio::time::sleep(interval) => {}
                }
                tokio::time::sleep(DEBOUNCE).await;
                let (nodes, sets) = store.snapshot();
                stats.resyncs.fetch_add(1, Ordering::Relaxed);
                match alloc.resync(&nodes, &sets).await {
                    Ok(r) => {
                        stats
                            .listings
                            .fetch_add(u64::from(r.listed), Ordering::Relaxed);
                        let failed = u64::try_from(r.tasks_failed).unwrap_or(u64::MAX);
                        stats.tasks_failed.fetch_add(failed, Ordering::Relaxed);
                    }
                    Err(_) => {
                        stats.tasks_failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        })
    };
    let ledger = Arc::new(Ledger::default());

    // 1. Warm-up: nodes register over the spread.
    let t0 = Instant::now();
    let first: Vec<usize> = (0..cfg.nodes).collect();
    for &i in &first {
        let delay = rng.between(Duration::ZERO, cfg.warmup_spread);
        let _ = rng.fork(i as u64); // as the per-node run draws its agents' streams
        let store = store.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            store.add_node(i);
        });
    }
    let ready = || all_at(&store, &first, cfg.min_free);
    let warmup = warmed_up("operator", ready, t0, &account).await?;

    // 2. Idle.
    let idle = settle_and_idle(&cfg, &account).await;

    // 3. Churn, running on until the start-up is done.
    let churn_stop = Arc::new(AtomicBool::new(false));
    let churn_pods: Arc<Mutex<Vec<ChurnPod>>> = Arc::default();
    let drivers = {
        let (store, ledger) = (store.clone(), ledger.clone());
        churn_drivers(
            &cfg,
            &mut rng,
            &churn_stop,
            &churn_pods,
            move |i, name, hold, rng| {
                pod(
                    store.clone(),
                    ledger.clone(),
                    node_name(i),
                    name,
                    Some(hold),
                    rng,
                )
            },
        )
    };
    let (churn, churn_start, churn_end) = churn_window(&cfg, &account).await;

    // 4. New nodes, all at once, with their pods.
    let c2 = account.counts();
    let s0 = Instant::now();
    let new: Vec<usize> = (cfg.nodes..cfg.nodes + cfg.start_nodes).collect();
    let mut new_pods = Vec::new();
    for (j, &i) in new.iter().enumerate() {
        store.add_node(i);
        for k in 0..cfg.start_pods {
            let at = rng.between(Duration::ZERO, cfg.start_pod_window);
            let prng = rng.fork((i * 100 + k) as u64);
            let (store, ledger) = (store.clone(), ledger.clone());
            new_pods.push(tokio::spawn(async move {
                tokio::time::sleep(at).await;
                pod(
                    store,
                    ledger,
                    node_name(i),
                    format!("new{j}-p{k}"),
                    None,
                    prng,
                )
                .await
            }));
        }
    }
    let free = |j: usize| store.free(&node_name(new[j])) >= cfg.min_free;
    let start = started_up("operator", new.len(), free, (s0, &c2), &account, new_pods).await?;

    // Wind down and check.
    let window = (churn_start, churn_end);
    let churn_results =
        churn_results("operator", &churn_stop, drivers, &churn_pods, window).await?;
    stop.store(true, Ordering::Relaxed);
    store.changed.notify_one();
    runtime.await?;
    let pods = checked_pods("operator", &churn_results, &start.results, &ledger)?;
    Ok(OperatorRun {
        timeline: Timeline::new(cfg, warmup, idle, churn, start, pods),
        op,
        resyncs: stats.resyncs.load(Ordering::Relaxed),
        listings: stats.listings.load(Ordering::Relaxed),
        tasks_failed: stats.tasks_failed.load(Ordering::Relaxed),
        spec_writes: store.spec_writes.load(Ordering::Relaxed),
        measure: Measure::default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::bucket::Action;

    /// A small fleet through every phase: `simulate` itself fails on a
    /// pool that never reaches min_free, a stuck pod or an ENI two pods
    /// hold; what it returns is checked here too.
    #[test]
    fn a_small_operator_fleet_reaches_min_free_and_never_shares_an_eni() {
        let cfg = FleetCfg {
            nodes: 6,
            start_nodes: 3,
            ..FleetCfg::smoke(5)
        };
        let rt = paused_runtime(cfg.seed).unwrap();
        let run = rt.block_on(simulate(cfg.clone())).unwrap();
        let r = &run.timeline;
        assert_eq!(r.start_per_node.n, 3, "every new pool at min_free");
        assert!(r.start_done > Duration::ZERO);
        assert_eq!(r.start_pods.started, 6);
        assert_eq!((r.start_pods.stuck, r.churn_pods.stuck), (0, 0));
        assert_eq!(r.start_pods.other_errors + r.churn_pods.other_errors, 0);
        assert!(r.churn_pods.started > 0);
        // Idle: no mutating call, and no describe but the listing, at
        // most one a resync interval.
        let idle = |a: Action| r.idle.get(a).calls();
        assert_eq!(r.idle.calls(true), 0, "{:?}", r.idle);
        let listings = r.idle.calls(false);
        assert_eq!(idle(Action::DescribeNetworkInterfacesFiltered), listings);
        let most = cfg.idle.as_secs() / run.op.resync_interval.as_secs() + 1;
        assert!(listings <= most, "{listings} listings: {:?}", r.idle);
        // The churn drains ENIs: each is detached once and deleted once,
        // and a detach is never polled (at most the backend's one look,
        // when the listing has no attachment id for it).
        let n = |a: Action| r.churn.get(a).calls();
        let detaches = n(Action::DetachNetworkInterface);
        assert!(detaches > 0, "{:?}", r.churn);
        assert!(n(Action::DeleteNetworkInterface) > 0, "{:?}", r.churn);
        assert!(
            n(Action::DescribeNetworkInterfacesById) <= detaches,
            "{:?}",
            r.churn
        );
        assert!(r.start_attaches() >= 3 * u64::try_from(cfg.min_free).unwrap());
        assert!(r.start_ratio() > 0.0);
    }
}
