//! The operator's CPU and heap at scale, over an instant in-memory cloud
//! (`enim_operator::testing`): what a resync costs the operator itself,
//! with no cloud latency or token wait in it.

use std::sync::Arc;
use std::time::Duration;

use enim_core::ratelimit::RateLimit;
use enim_core::AddressLimits;
use enim_core::Watermarks;
use enim_operator::allocator::Allocator;
use enim_operator::config::{ApiRates, OperatorConfig};
use enim_operator::index::NodeInfo;
use enim_operator::testing::{MemCloud, MemStore};

use crate::heap;
use crate::R;

#[derive(Debug, Clone, Default)]
pub struct Measure {
    pub nodes: usize,
    /// ENIs in the cloud (and the listing) when measured.
    pub enis: usize,
    /// First resync of an empty cluster: every set and ENI made.
    pub cpu_cold: Duration,
    /// A resync that lists the cloud and rewrites every spec (a policy
    /// change): the heaviest steady-state resync.
    pub cpu_rewrite: Duration,
    /// A resync that lists the cloud and finds nothing to do.
    pub cpu_listed: Duration,
    /// A resync from the cached listing (a watch event's).
    pub cpu_cached: Duration,
    /// Heap the operator holds between resyncs: its inputs (the watch
    /// caches' nodes and sets) and the allocator's caches (listing, limits,
    /// last spec per node).
    pub heap_retained: usize,
    /// The most heap it held during the rewriting resync, same baseline.
    pub heap_peak: usize,
}

/// This thread's CPU time (user + system), in nanoseconds: finer than
/// `getrusage`, whose thread times move in scheduler ticks.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the pointer given.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return Duration::ZERO;
    }
    Duration::from_secs(u64::try_from(ts.tv_sec).unwrap_or(0))
        + Duration::from_nanos(u64::try_from(ts.tv_nsec).unwrap_or(0))
}

/// The operator's config; `above` is the high watermark's margin: a change
/// of it rewrites every spec and leaves every node as it is (a change of
/// security groups would also replace every free ENI).
fn config(above: u32) -> OperatorConfig {
    // No token waits: the figures are the operator's own work.
    let unbounded = RateLimit::new(Duration::from_nanos(1), u32::MAX);
    OperatorConfig {
        cluster: "measure".into(),
        watermarks: Watermarks {
            pre_allocate: 3,
            min_allocate: 0,
            max_above_watermark: above,
        },
        subnets: vec!["subnet-m".into()],
        security_groups: vec!["sg-0".into()],
        api: ApiRates {
            mutating_rate: unbounded,
            read_rate: unbounded,
        },
        resync_interval: Duration::from_secs(3600),
        ..OperatorConfig::default()
    }
}

async fn timed<T>(f: impl std::future::Future<Output = T>) -> (T, Duration) {
    let t = thread_cpu();
    let r = f.await;
    (r, thread_cpu().saturating_sub(t))
}

pub fn run(nodes: usize) -> R<Measure> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()?;
    rt.block_on(measure(nodes))
}

async fn measure(n: usize) -> R<Measure> {
    let cloud = Arc::new(MemCloud::new(AddressLimits {
        ipv4_per_eni: 15,
        ipv6_per_eni: 15,
        enis: 15,
    }));
    let store = Arc::new(MemStore::default());
    let nodes: Vec<NodeInfo> = (0..n)
        .map(|i| NodeInfo {
            name: format!("node{i:05}"),
            uid: format!("uid-{i}"),
            provider_id: format!("aws:///us-east-1a/i-{i:017x}"),
            instance_type: "m5.large".into(),
            zone: "us-east-1a".into(),
            labels: Default::default(),
        })
        .collect();
    let mut m = Measure {
        nodes: n,
        ..Default::default()
    };
    {
        let a1 = Allocator::new(cloud.clone(), store.clone(), config(2))?;
        let (r, cpu) = timed(a1.resync(&nodes, &store.sets())).await;
        r?;
        m.cpu_cold = cpu;
        // Two pods on every node hold an ENI: two more are made each.
        for s in store.sets() {
            let held: Vec<String> = s.spec.enis.iter().take(2).map(|e| e.id.clone()).collect();
            store.edit(&s.name, |s| {
                let st = s.status.get_or_insert_with(Default::default);
                st.used = held
                    .iter()
                    .map(|eni| enim_crd::EniUse {
                        eni: eni.clone(),
                        container_id: format!("c-{eni}"),
                        ifname: "eth0".into(),
                        ..Default::default()
                    })
                    .collect();
            });
        }
        a1.resync(&nodes, &store.sets()).await?;
    }
    m.enis = cloud.enis().len();

    // A fresh operator: its caches are what it would hold.
    let base = heap::live();
    let inputs = (nodes.clone(), store.sets());
    let a2 = Allocator::new(cloud.clone(), store.clone(), config(3))?;
    heap::reset_peak();
    let (r, cpu) = timed(a2.resync(&inputs.0, &inputs.1)).await;
    let r = r?;
    if r.writes < n {
        return Err(format!(
            "measure: the policy change rewrote {} of {n} specs",
            r.writes
        )
        .into());
    }
    m.cpu_rewrite = cpu;
    m.heap_peak = heap::peak().saturating_sub(base);
    let inputs = (inputs.0, store.sets());
    a2.invalidate_listing();
    let (r, cpu) = timed(a2.resync(&inputs.0, &inputs.1)).await;
    let r = r?;
    if !r.listed || r.tasks > 0 {
        return Err(format!("measure: a steady resync did work: {r:?}").into());
    }
    m.cpu_listed = cpu;
    let (r, cpu) = timed(a2.resync(&inputs.0, &inputs.1)).await;
    r?;
    m.cpu_cached = cpu;
    m.heap_retained = heap::live().saturating_sub(base);
    drop((a2, inputs));
    Ok(m)
}
