//! The burst and fleet phases: enim's real warm pool (`provider/pool`)
//! over a simulated EC2 ([`cloud::SimCloud`]) on a paused tokio clock, so
//! simulated hours cost seconds of wall time and a run repeats from its
//! seed. Neither needs root, namespaces or an agent.

pub mod bucket;
pub mod burst;
pub mod cloud;
pub mod fleet;
pub mod operator;
pub mod pods;
pub mod rng;

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use enim_core::Watermarks;
use enim_provider_pool::PoolConfig;
use serde_json::{json, Value};

use crate::stats::{float, Summary};
use crate::{Opts, R};
use bucket::{Action, ACTIONS, SOURCE_URL};
use burst::{Burst, BurstCfg};
use cloud::{CloudParams, Counts};
use fleet::{Fleet, FleetCfg, PodStats};
use pods::Retry;

/// A run's free range (the bench's own knobs: `min_free` to `max_free`
/// ENIs free) as the pools' watermarks; a `max_free` below `min_free`
/// keeps none above.
pub fn free_range(min_free: usize, max_free: usize) -> Watermarks {
    let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    Watermarks {
        pre_allocate: count(min_free),
        min_allocate: 0,
        max_above_watermark: count(max_free.saturating_sub(min_free)),
    }
}

/// The agents' warm pool config of a run's free range.
pub fn pool_config(min_free: usize, max_free: usize) -> PoolConfig {
    let w = free_range(min_free, max_free);
    PoolConfig {
        pre_allocate: w.pre_allocate,
        max_above_watermark: w.max_above_watermark,
        ..PoolConfig::default()
    }
}

/// The phases of this module, as `--only` names them.
pub const PHASES: [&str; 3] = ["burst", "fleet", "operator"];

/// Latencies are simulated at their real size: the clock is paused.
pub const SCALE: u32 = 1;
/// Burst target: the slowest pod within this factor of the cloud's bound.
pub const BURST_TARGET: f64 = 1.3;
/// Fleet target: steady describe traffic below this share of the refill.
pub const DESCRIBE_TARGET_PCT: f64 = 10.0;

pub struct Report {
    pub smoke: bool,
    pub seed: u64,
    /// Under the kubelet's retry, and the fixed 1 s what-if.
    pub burst: Option<(Burst, Burst)>,
    pub fleet: Option<Fleet>,
    pub operator: Option<operator::OperatorRun>,
    /// Wall time of each phase.
    pub wall: Vec<(&'static str, Duration)>,
}

pub fn run(o: &Opts) -> R<Report> {
    let mut wall = Vec::new();
    let burst = if o.runs("burst") {
        let m = if o.smoke { 2 } else { 3 };
        eprintln!(
            "enim-bench: burst: {} pods at once on a pool of {m} (simulated cloud)",
            3 * m
        );
        let t = Instant::now();
        let kubelet = burst::run(&BurstCfg::new(m, Retry::Kubelet, o.seed))?;
        let fixed = burst::run(&BurstCfg::new(
            m,
            Retry::Fixed(Duration::from_secs(1)),
            o.seed,
        ))?;
        wall.push(("burst", t.elapsed()));
        Some((kubelet, fixed))
    } else {
        None
    };
    let fleet = if o.runs("fleet") {
        let cfg = if o.smoke {
            FleetCfg::smoke(o.seed)
        } else {
            FleetCfg::full(o.seed)
        };
        eprintln!(
            "enim-bench: fleet: {} nodes, then {} starting at once (simulated cloud)",
            cfg.nodes, cfg.start_nodes
        );
        let t = Instant::now();
        let f = fleet::run(&cfg)?;
        wall.push(("fleet", t.elapsed()));
        Some(f)
    } else {
        None
    };
    let operator = if o.runs("operator") {
        let (cfg, measure) = if o.smoke {
            (FleetCfg::smoke(o.seed), 50)
        } else {
            (FleetCfg::full(o.seed), 1000)
        };
        eprintln!(
            "enim-bench: operator: {} nodes, then {} starting at once, one operator (simulated cloud); its CPU and heap at {measure} nodes",
            cfg.nodes, cfg.start_nodes
        );
        let t = Instant::now();
        let r = operator::run(&cfg, measure)?;
        wall.push(("operator", t.elapsed()));
        Some(r)
    } else {
        None
    };
    Ok(Report {
        smoke: o.smoke,
        seed: o.seed,
        burst,
        fleet,
        operator,
        wall,
    })
}

fn secs(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64())
}

fn s_of_ms(ms: f64) -> String {
    format!("{:.1}", ms / 1e3)
}

pub fn met(smoke: bool, ok: bool) -> &'static str {
    match (smoke, ok) {
        (true, _) => "(smoke: not judged)",
        (false, true) => "yes",
        (false, false) => "**no**",
    }
}

/// Calls per node per hour.
fn per_node_hour(n: u64, nodes: usize, window: Duration) -> f64 {
    float(n) / float(nodes) / (window.as_secs_f64() / 3600.0)
}

/// A describe bucket's use over `window`: calls per second and % of refill.
fn describe_use(c: &Counts, a: Action, window: Duration) -> (f64, f64) {
    let rate = float(c.get(a).calls()) / window.as_secs_f64();
    (rate, 100.0 * rate / a.limit().refill)
}

/// The highest use of any describe bucket, in % of its refill.
pub fn describe_peak_pct(c: &Counts, window: Duration) -> f64 {
    ACTIONS
        .iter()
        .filter(|a| !a.mutating())
        .map(|a| describe_use(c, *a, window).1)
        .fold(0.0, f64::max)
}

pub fn markdown(r: &Report) -> String {
    let mut s = String::new();
    if r.burst.is_none() && r.fleet.is_none() && r.operator.is_none() {
        return s;
    }
    let p = CloudParams::default();
    let _ = writeln!(s, "\n### The simulated cloud (burst and fleet)\n");
    let _ = writeln!(
        s,
        "EC2 throttling defaults from \"Request throttling for the Amazon EC2 API\", {SOURCE_URL} \
         (read 2026-11-23 from a stored copy): one bucket per API action and account; a call \
         takes a token, a bucket refills every second up to its capacity, an empty one answers \
         `RequestLimitExceeded`.\n"
    );
    let _ = writeln!(
        s,
        "| call | mutating | page's row | capacity | refill / s |"
    );
    let _ = writeln!(s, "|---|---|---|---:|---:|");
    for a in ACTIONS {
        let l = a.limit();
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} |",
            a.key(),
            if a.mutating() { "yes" } else { "no" },
            l.row,
            l.capacity,
            l.refill
        );
    }
    let _ = writeln!(
        s,
        "\nAttach → in metadata: uniform {}–{} s; detach → available: uniform {}–{} s; \
         EC2 round trip {} ms; instance limit {} interfaces; EC2 client retry of a throttled call: \
         {} attempts, {} ms doubling to {} s, jittered (the AWS backend's defaults); latency \
         scale factor {SCALE} (paused clock); seed {}.\n",
        p.attach.0.as_secs(),
        p.attach.1.as_secs(),
        p.detach.0.as_secs(),
        p.detach.1.as_secs(),
        p.api_rtt.as_millis(),
        p.eni_limit,
        p.retry.attempts,
        p.retry.initial.as_millis(),
        p.retry.max.as_secs(),
        r.seed
    );
    let _ = writeln!(s, "{MODEL}\n");

    if let Some((k, f)) = &r.burst {
        let c = &k.cfg;
        let _ = writeln!(s, "### Burst (simulated cloud)\n");
        let _ = writeln!(
            s,
            "One node, pool `min_free` = {}, `max_free` = {}, filled ({} s from start); then {} \
             pods at once. ADD-to-ready = arrival → successful allocation, simulated seconds.\n",
            c.min_free,
            c.max_free,
            secs(k.fill),
            c.pods
        );
        let _ = writeln!(
            s,
            "| retry after \"try again later\" | p50 s | p95 s | max s | bound s | max / bound | p95 / bound | ADD tries | errors other than 11 |"
        );
        let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|---:|");
        for b in [k, f] {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {:.2} | {:.2} | {} | {} |",
                b.cfg.retry.describe(),
                s_of_ms(b.summary.p50),
                s_of_ms(b.summary.p95),
                s_of_ms(b.summary.max),
                secs(b.bound),
                b.ratio_max(),
                b.ratio_p95(),
                b.tries,
                b.other_errors
            );
        }
        let _ = writeln!(
            s,
            "\nBound: {} attaches beyond the pool ÷ parallelism {} (the pool's \
             `max_parallel_creates`) × mean attach {} s = {} s; the buckets alone would allow them in {} s; \
             bound = the larger. The pool was back at `min_free` {} s after the arrival; EC2 calls \
             meanwhile: {} mutating, {} describes, {} throttled.\n",
            k.attaches_needed,
            burst::pool_parallelism(),
            secs(p.mean_attach()),
            secs(k.latency_bound),
            secs(k.bucket_bound),
            secs(k.refilled),
            k.counts.calls(true),
            k.counts.calls(false),
            k.counts.throttled()
        );
        let _ = writeln!(
            s,
            "| target | value | limit | met |\n|---|---:|---:|---|\n\
             | burst max ADD-to-ready / bound (kubelet retry) | {:.2} × | ≤ {BURST_TARGET} × | {} |\n\
             | burst p95 ADD-to-ready / bound (kubelet retry) | {:.2} × | ≤ {BURST_TARGET} × | {} |\n",
            k.ratio_max(),
            met(r.smoke, k.ratio_max() <= BURST_TARGET),
            k.ratio_p95(),
            met(r.smoke, k.ratio_p95() <= BURST_TARGET),
        );
    }

    if let Some(run) = &r.fleet {
        let f = &run.timeline;
        let c = &f.cfg;
        let _ = writeln!(s, "### Fleet (simulated cloud)\n");
        let _ = writeln!(
            s,
            "{} nodes over one account, pool `min_free` = {}, `max_free` = {}, agents started \
             over {} s: every pool at `min_free` after {} s ({} throttled replies, {} calls given \
             up by the client).\n",
            c.nodes,
            c.min_free,
            c.max_free,
            c.warmup_spread.as_secs(),
            secs(f.warmup),
            f.warmup_counts.throttled(),
            f.warmup_counts.gave_up()
        );
        let _ = writeln!(
            s,
            "Steady state, EC2 calls per node per hour: idle ({} s, no pods come or go) and light \
             churn ({} s; {} pod starts per node per hour, each holding its ENI for an exponential \
             time of mean {} s; {} pods, ADD-to-ready p50 {} s, max {} s, {} \"try again later\", \
             {} other errors).\n",
            c.idle.as_secs(),
            c.churn.as_secs(),
            c.churn_per_hour,
            c.pod_life.as_secs(),
            f.churn_pods.started,
            s_of_ms(f.churn_pods.ready.p50),
            s_of_ms(f.churn_pods.ready.max),
            f.churn_pods.try_again,
            f.churn_pods.other_errors
        );
        let _ = writeln!(s, "| call | idle | churn | churn throttled |");
        let _ = writeln!(s, "|---|---:|---:|---:|");
        let ph = |cnt: u64, w: Duration| format!("{:.2}", per_node_hour(cnt, c.nodes, w));
        for a in ACTIONS {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} |",
                a.key(),
                ph(f.idle.get(a).calls(), c.idle),
                ph(f.churn.get(a).calls(), c.churn),
                f.churn.get(a).throttled
            );
        }
        for (name, m) in [("all mutating", true), ("all describes", false)] {
            let _ = writeln!(
                s,
                "| **{name}** | {} | {} | |",
                ph(f.idle.calls(m), c.idle),
                ph(f.churn.calls(m), c.churn)
            );
        }
        let _ = writeln!(
            s,
            "| instance metadata reads (not EC2) | {} | {} | |\n",
            ph(f.idle.imds_reads, c.idle),
            ph(f.churn.imds_reads, c.churn)
        );
        let _ = writeln!(
            s,
            "Describe traffic of the whole fleet against each describe bucket's refill:\n"
        );
        let _ = writeln!(
            s,
            "| bucket | idle calls/s | idle % of refill | churn calls/s | churn % of refill |"
        );
        let _ = writeln!(s, "|---|---:|---:|---:|---:|");
        for a in ACTIONS.iter().filter(|a| !a.mutating()) {
            let (ri, pi) = describe_use(&f.idle, *a, c.idle);
            let (rc, pc) = describe_use(&f.churn, *a, c.churn);
            let _ = writeln!(
                s,
                "| {} ({}/s) | {ri:.3} | {pi:.1} % | {rc:.3} | {pc:.1} % |",
                a.key(),
                a.limit().refill
            );
        }
        let st = &f.start_pods;
        let _ = writeln!(
            s,
            "\n{} nodes start at once with empty pools while the churn goes on; {} pods land on \
             each within {} s. Every new pool had reached `min_free` after {} s (per node p50 {} \
             s, max {} s); every pod on them was running after {} s. Bound: one node's {} creates, \
             {} at a time, × {} s = {} s; the buckets' floor for the {} ENIs the window attached \
             (the new pools', their pods' and the churn's) {} s; ratio {:.2} ×. Meanwhile the \
             account answered {} `RequestLimitExceeded` ({} calls given up after the client's \
             retries, surfacing to the pool as a failed round it retries with backoff), {} agent \
             restarts (pool start failed). New nodes' pods: ADD-to-ready p50 {} s, max {} s; {} \
             \"try again later\" (11) answers; {} errors other than 11.\n",
            c.start_nodes,
            c.start_pods,
            c.start_pod_window.as_secs(),
            secs(f.start_done),
            s_of_ms(f.start_per_node.p50),
            s_of_ms(f.start_per_node.max),
            secs(f.pods_ready),
            c.min_free,
            burst::pool_parallelism(),
            secs(p.mean_attach()),
            secs(f.start_latency_bound),
            f.start_attaches(),
            secs(f.start_bucket_bound),
            f.start_ratio(),
            f.start_counts.throttled(),
            f.start_counts.gave_up(),
            run.agent_restarts,
            s_of_ms(st.ready.p50),
            s_of_ms(st.ready.max),
            st.try_again,
            st.other_errors
        );
        let _ = writeln!(
            s,
            "| call during the start-up | calls | throttled replies | given up |"
        );
        let _ = writeln!(s, "|---|---:|---:|---:|");
        for a in ACTIONS {
            let x = f.start_counts.get(a);
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} |",
                a.key(),
                x.calls(),
                x.throttled,
                x.gave_up
            );
        }
        let peak = describe_peak_pct(&f.churn, c.churn).max(describe_peak_pct(&f.idle, c.idle));
        let errors = f.start_pods.other_errors + f.churn_pods.other_errors;
        let _ = writeln!(
            s,
            "\n| target | value | limit | met |\n|---|---:|---:|---|\n\
             | steady describe traffic, busiest describe bucket | {peak:.1} % of refill | < {DESCRIBE_TARGET_PCT} % | {} |\n\
             | pod-visible errors other than 11 (churn and start-up) | {errors} | 0 | {} |\n",
            met(r.smoke, peak < DESCRIBE_TARGET_PCT),
            met(r.smoke, errors == 0),
        );
    }
    if let Some(o) = &r.operator {
        s.push_str(&operator::report::markdown(o, r.fleet.as_ref(), r.smoke));
    }
    let walls: Vec<String> = r
        .wall
        .iter()
        .map(|(n, d)| format!("{n} {:.2} s", d.as_secs_f64()))
        .collect();
    let _ = writeln!(s, "Wall time of the simulation: {}.", walls.join(", "));
    s
}

/// What the simulation does and does not model.
pub const MODEL: &str =
    "Modelled: the real warm pool (unchanged) on a paused clock; per node, the \
EC2 calls enim's AWS backend makes, in its order (DescribeInstanceTypes once; metadata read \
before CreateNetworkInterface, a filtered DescribeNetworkInterfaces before AttachNetworkInterface; \
an ENI whose attach was throttled past the client's retries kept for the node's next create; \
ModifyNetworkInterfaceAttribute for DeleteOnTermination; metadata polled until the ENI shows; \
for a delete, DescribeNetworkInterfaces by id, DetachNetworkInterface, by-id describes polled \
until available, DeleteNetworkInterface); the EC2 client's retry of throttled calls, and the \
agent's pacing of each action by its throttle replies (the operator's calls are not paced); one \
account's buckets shared by every node; the kubelet's retry of a failed ADD (10–15 s). \
Not modelled: network failures and 5xx answers; metadata lag (an attached ENI shows in \
metadata at once and whole); eventual consistency of Describe (it sees every change at once); \
AttachmentLimitExceeded races and other callers in the account; the kernel's plumbing of an \
ENI into a pod (milliseconds) and the CNI exec; the account's other buckets (a throttled \
action never slows another); whether an id list counts as a filter for the describe bucket \
(taken as not). Repeatability: the cloud, the pods and the pool's jitter draw from the seed, \
and the pool settles what falls due at one instant in a fixed order, so a run repeats \
exactly from its seed (tested on small runs; three full runs of each of seeds 1–10 gave the \
same figures).";

fn counts_json(c: &Counts) -> Value {
    let by: serde_json::Map<String, Value> = ACTIONS
        .iter()
        .map(|a| {
            let x = c.get(*a);
            (
                a.key().to_string(),
                json!({"calls": x.calls(), "ok": x.ok, "throttled": x.throttled, "failed": x.failed, "gave_up": x.gave_up}),
            )
        })
        .collect();
    json!({"by_action": by, "mutating": c.calls(true), "non_mutating": c.calls(false), "throttled": c.throttled(), "gave_up": c.gave_up(), "imds_reads": c.imds_reads})
}

fn summary_s(x: &Summary) -> Value {
    json!({"n": x.n, "p50_s": x.p50 / 1e3, "p95_s": x.p95 / 1e3, "max_s": x.max / 1e3, "mean_s": x.mean / 1e3})
}

fn pods_json(p: &PodStats) -> Value {
    json!({"started": p.started, "ready": summary_s(&p.ready), "stuck": p.stuck, "try_again_11": p.try_again, "other_errors": p.other_errors})
}

fn burst_json(b: &Burst) -> Value {
    json!({
        "retry": b.cfg.retry.describe(),
        "min_free": b.cfg.min_free,
        "max_free": b.cfg.max_free,
        "pods": b.cfg.pods,
        "fill_s": b.fill.as_secs_f64(),
        "add_to_ready": summary_s(&b.summary),
        "add_to_ready_samples_s": b.ready.iter().map(Duration::as_secs_f64).collect::<Vec<_>>(),
        "attaches_needed": b.attaches_needed,
        "parallelism": burst::pool_parallelism(),
        "latency_bound_s": b.latency_bound.as_secs_f64(),
        "bucket_bound_s": b.bucket_bound.as_secs_f64(),
        "bound_s": b.bound.as_secs_f64(),
        "max_over_bound": b.ratio_max(),
        "p95_over_bound": b.ratio_p95(),
        "add_tries": b.tries,
        "other_errors": b.other_errors,
        "refilled_s": b.refilled.as_secs_f64(),
        "calls": counts_json(&b.counts),
    })
}

pub fn json(r: &Report) -> Value {
    let p = CloudParams::default();
    let buckets: serde_json::Map<String, Value> = ACTIONS
        .iter()
        .map(|a| {
            let l = a.limit();
            (
                a.key().to_string(),
                json!({"api": a.api(), "mutating": a.mutating(), "row": l.row, "capacity": l.capacity, "refill_per_s": l.refill}),
            )
        })
        .collect();
    let burst = r.burst.as_ref().map(|(k, f)| {
        json!({
            "kubelet_retry": burst_json(k),
            "fixed_1s_retry_what_if": burst_json(f),
            "target_max_over_bound": BURST_TARGET,
            "met": k.ratio_max() <= BURST_TARGET,
        })
    });
    let fleet = r.fleet.as_ref().map(|run| {
        let f = &run.timeline;
        let c = &f.cfg;
        let per = |x: &Counts, w: Duration| {
            let by: serde_json::Map<String, Value> = ACTIONS
                .iter()
                .map(|a| {
                    (
                        a.key().to_string(),
                        json!(per_node_hour(x.get(*a).calls(), c.nodes, w)),
                    )
                })
                .collect();
            json!({
                "window_s": w.as_secs_f64(),
                "calls_per_node_per_hour": by,
                "mutating_per_node_per_hour": per_node_hour(x.calls(true), c.nodes, w),
                "describe_per_node_per_hour": per_node_hour(x.calls(false), c.nodes, w),
                "describe_peak_pct_of_refill": describe_peak_pct(x, w),
                "calls": counts_json(x),
            })
        };
        let peak = describe_peak_pct(&f.churn, c.churn).max(describe_peak_pct(&f.idle, c.idle));
        let errors = f.start_pods.other_errors + f.churn_pods.other_errors;
        json!({
            "nodes": c.nodes,
            "min_free": c.min_free,
            "max_free": c.max_free,
            "warmup_s": f.warmup.as_secs_f64(),
            "warmup_calls": counts_json(&f.warmup_counts),
            "idle": per(&f.idle, c.idle),
            "churn": per(&f.churn, c.churn),
            "churn_pod_starts_per_node_per_hour": c.churn_per_hour,
            "churn_pod_life_mean_s": c.pod_life.as_secs_f64(),
            "churn_pods": pods_json(&f.churn_pods),
            "start": {
                "nodes": c.start_nodes,
                "pods_per_node": c.start_pods,
                "all_at_min_free_s": f.start_done.as_secs_f64(),
                "all_pods_ready_s": f.pods_ready.as_secs_f64(),
                "per_node": summary_s(&f.start_per_node),
                "latency_bound_s": f.start_latency_bound.as_secs_f64(),
                "bucket_bound_s": f.start_bucket_bound.as_secs_f64(),
                "attaches": f.start_attaches(),
                "over_bound": f.start_ratio(),
                "calls": counts_json(&f.start_counts),
                "agent_restarts": run.agent_restarts,
                "pods": pods_json(&f.start_pods),
            },
            "targets": {
                "describe_peak_pct_of_refill": peak,
                "describe_limit_pct": DESCRIBE_TARGET_PCT,
                "describe_met": peak < DESCRIBE_TARGET_PCT,
                "pod_errors_other_than_11": errors,
                "errors_met": errors == 0,
            },
        })
    });
    json!({
        "seed": r.seed,
        "scale_factor": SCALE,
        "source": SOURCE_URL,
        "buckets": buckets,
        "cloud": {
            "attach_s": [p.attach.0.as_secs_f64(), p.attach.1.as_secs_f64()],
            "detach_s": [p.detach.0.as_secs_f64(), p.detach.1.as_secs_f64()],
            "api_rtt_s": p.api_rtt.as_secs_f64(),
            "eni_limit": p.eni_limit,
            "retry_attempts": p.retry.attempts,
        },
        "model": MODEL,
        "burst": burst,
        "fleet": fleet,
        "operator": r.operator.as_ref().map(operator::report::json),
        "wall_s": r.wall.iter().map(|(n, d)| (n.to_string(), json!(d.as_secs_f64()))).collect::<serde_json::Map<_, _>>(),
    })
}
