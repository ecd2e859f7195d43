//! The burst: one node's warm pool, filled to `min_free`, then 3 ×
//! `min_free` pods at once. Every pod beyond the pool waits for a
//! create+attach; the pool makes them one at a time (`round` in
//! `provider/pool`), so the cloud's bound for the last pod is
//! (pods − min_free) ÷ 1 × the mean attach time, unless the account's
//! buckets are tighter.

use std::sync::Arc;
use std::time::Duration;

use enim_provider::EniProvider;
use enim_provider_pool::{PoolConfig, WarmPool};
use tokio::time::Instant;

use super::bucket::Action;
use super::cloud::{paused_runtime, Account, CloudParams, Counts};
use super::pods::{self, Ledger, Retry};
use super::rng::Rng;
use crate::stats::{float, summarize, Summary};
use crate::R;

/// Creates the pool makes at once (its default `max_parallel_creates`).
pub fn pool_parallelism() -> usize {
    PoolConfig::default().max_parallel_creates
}

#[derive(Debug, Clone)]
pub struct BurstCfg {
    pub min_free: usize,
    pub max_free: usize,
    /// Pods arriving at once.
    pub pods: usize,
    pub retry: Retry,
    pub seed: u64,
    pub params: CloudParams,
}

impl BurstCfg {
    pub fn new(min_free: usize, retry: Retry, seed: u64) -> BurstCfg {
        BurstCfg {
            min_free,
            max_free: min_free + 2,
            pods: 3 * min_free,
            retry,
            seed,
            params: CloudParams::default(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Burst {
    pub cfg: BurstCfg,
    /// Start → `min_free` free, before the pods came.
    pub fill: Duration,
    /// Each pod's arrival → ready, in arrival order.
    pub ready: Vec<Duration>,
    pub summary: Summary,
    pub tries: u32,
    pub other_errors: u32,
    /// ENIs the pods need beyond the warm pool.
    pub attaches_needed: usize,
    pub latency_bound: Duration,
    pub bucket_bound: Duration,
    /// Arrival → the last pod's ENI visible to the pool, at best.
    pub bound: Duration,
    /// The pods' arrival → the pool back at `min_free`.
    pub refilled: Duration,
    /// EC2 calls from the pods' arrival to the refill.
    pub counts: Counts,
}

impl Burst {
    pub fn ratio_max(&self) -> f64 {
        self.summary.max / (self.bound.as_secs_f64() * 1e3)
    }
    pub fn ratio_p95(&self) -> f64 {
        self.summary.p95 / (self.bound.as_secs_f64() * 1e3)
    }
}

/// Seconds a full bucket needs to hand out `n` tokens.
pub fn bucket_time(a: Action, n: usize) -> Duration {
    let l = a.limit();
    let short = (float(n) - l.capacity).max(0.0);
    Duration::from_secs_f64((short / l.refill).ceil())
}

/// The cloud's bound on the last pod: the attaches one after another at
/// the mean latency, or the buckets' refill for the calls they take, the
/// longer of the two.
fn bounds(cfg: &BurstCfg, needed: usize) -> (Duration, Duration) {
    let latency = cfg.params.mean_attach()
        * u32::try_from(needed.div_ceil(pool_parallelism())).unwrap_or(u32::MAX);
    // Per create: two filtered describes, a create, an attach, a modify.
    let bucket = [
        (Action::DescribeNetworkInterfacesFiltered, 2),
        (Action::CreateNetworkInterface, 1),
        (Action::AttachNetworkInterface, 1),
        (Action::ModifyNetworkInterfaceAttribute, 1),
    ]
    .iter()
    .map(|(a, k)| bucket_time(*a, k * needed))
    .max()
    .unwrap_or_default();
    (latency, bucket)
}

pub fn run(cfg: &BurstCfg) -> R<Burst> {
    let rt = paused_runtime(cfg.seed)?;
    rt.block_on(burst(cfg.clone()))
}

async fn burst(cfg: BurstCfg) -> R<Burst> {
    let mut rng = Rng::new(cfg.seed);
    let account = Account::new(cfg.params.clone(), rng.next_u64());
    let node = account.node(0);
    let config = super::pool_config(cfg.min_free, cfg.max_free);
    if cfg.pods + cfg.min_free + 1 > cfg.params.eni_limit {
        return Err(format!(
            "burst: {} pods and {} free need more than the {} interfaces an instance takes",
            cfg.pods, cfg.min_free, cfg.params.eni_limit
        )
        .into());
    }
    let t0 = Instant::now();
    let pool = WarmPool::start(node.clone(), config).await?;
    // As the agent does at start-up, with an empty checkpoint.
    pool.restore(&[]).await?;
    let min_free = cfg.min_free;
    wait_free(&pool, min_free, Duration::from_secs(600)).await?;
    let fill = t0.elapsed();

    let before = account.counts();
    let ledger = Arc::new(Ledger::default());
    let arrival = Instant::now();
    let tasks: Vec<_> = (0..cfg.pods)
        .map(|i| {
            let (pool, ledger) = (pool.clone(), ledger.clone());
            let mut rng = rng.fork(u64::try_from(i).unwrap_or(u64::MAX));
            let retry = cfg.retry;
            tokio::spawn(async move {
                pods::add(
                    &pool,
                    &ledger,
                    &format!("burst-{i}"),
                    retry,
                    &mut rng,
                    Duration::from_secs(3600),
                )
                .await
            })
        })
        .collect();
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await?);
    }
    // Invariants: every pod got an ENI, no ENI went to two pods, each is
    // attached to the node, and the pool refills to min_free.
    let stuck = results.iter().filter(|r| r.ready.is_none()).count();
    if stuck > 0 {
        return Err(format!("burst: {stuck} pods never got an ENI").into());
    }
    let doubles = ledger.doubles();
    if !doubles.is_empty() {
        return Err(format!("burst: ENI given to two pods: {doubles:?}").into());
    }
    let mut ids: Vec<&String> = results.iter().filter_map(|r| r.eni.as_ref()).collect();
    ids.sort();
    ids.dedup();
    if ids.len() != cfg.pods {
        return Err("burst: two pods got the same ENI".into());
    }
    let shown = account.attached_ids(0);
    if let Some(missing) = ids.iter().find(|id| !shown.contains(id)) {
        return Err(format!("burst: {missing} was handed out but is not attached").into());
    }
    wait_free(&pool, min_free, Duration::from_secs(600)).await?;
    let refilled = arrival.elapsed();
    let counts = account.counts().since(&before);
    pool.shutdown().await;

    let ready: Vec<Duration> = results.iter().filter_map(|r| r.ready).collect();
    let needed = cfg.pods.saturating_sub(cfg.min_free);
    let (latency_bound, bucket_bound) = bounds(&cfg, needed);
    Ok(Burst {
        summary: summarize(&ready),
        ready,
        fill,
        tries: results.iter().map(|r| r.tries).sum(),
        other_errors: results.iter().map(|r| r.other_errors).sum(),
        attaches_needed: needed,
        latency_bound,
        bucket_bound,
        bound: latency_bound.max(bucket_bound),
        refilled,
        counts,
        cfg,
    })
}

/// Waits (simulated time) until the pool has `n` free ENIs.
pub async fn wait_free(pool: &WarmPool, n: usize, limit: Duration) -> R<()> {
    let mut rx = pool.subscribe();
    let reached = tokio::time::timeout(limit, async {
        rx.wait_for(|s| s.available >= n).await.map(|_| ())
    })
    .await;
    match reached {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(format!("pool statistics closed: {e}").into()),
        Err(_) => Err(format!(
            "pool did not reach {n} free within {limit:?}: {:?}",
            pool.stats()
        )
        .into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_burst_is_served_within_its_bound_and_repeats_from_its_seed() {
        let cfg = BurstCfg::new(2, Retry::Fixed(Duration::from_secs(1)), 5);
        let a = run(&cfg).unwrap();
        assert_eq!(a.ready.len(), 6);
        assert_eq!(a.attaches_needed, 4);
        // Two at a time: 4 / 2 × 10 s.
        assert_eq!(a.latency_bound, Duration::from_secs(20));
        assert_eq!(a.bucket_bound, Duration::ZERO);
        // Two pods find the pool's ENIs at once.
        assert!(a.summary.p50 < 20_000.0, "{:?}", a.summary);
        // The bound takes the mean attach time; each batch of two waits
        // for its slower one (draws of 8-12 s), so a small burst ends a
        // little above it.
        assert!(
            a.ratio_max() > 0.8 && a.ratio_max() < 1.4,
            "{}",
            a.ratio_max()
        );
        assert_eq!(a.other_errors, 0);
        assert_eq!(a.counts.throttled(), 0);
        let b = run(&cfg).unwrap();
        assert_eq!(a.ready, b.ready);
    }

    #[test]
    fn bucket_time_counts_only_beyond_the_burst() {
        assert_eq!(
            bucket_time(Action::AttachNetworkInterface, 50),
            Duration::ZERO
        );
        assert_eq!(
            bucket_time(Action::AttachNetworkInterface, 60),
            Duration::from_secs(2)
        );
        assert_eq!(
            bucket_time(Action::CreateNetworkInterface, 1100),
            Duration::from_secs(200)
        );
    }
}
