//! The operator phase's report, beside the per-node fleet's when both ran.

use std::fmt::Write as _;
use std::time::Duration;

use serde_json::{json, Value};

use super::{
    OperatorRun, CPU_TARGET, DESCRIBE_TARGET_PCT, HEAP_TARGET_MIB, START_TARGET,
    THROTTLED_TARGET_PCT,
};
use crate::sim::cloud::Counts;
use crate::sim::fleet::Fleet;
use crate::sim::{counts_json, describe_peak_pct, met, per_node_hour};
use crate::stats::float;

fn mib(bytes: usize) -> f64 {
    float(u64::try_from(bytes).unwrap_or(u64::MAX)) / (1024.0 * 1024.0)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn throttled_pct(c: &Counts) -> f64 {
    let calls = c.calls(true) + c.calls(false);
    100.0 * float(c.throttled()) / float(calls.max(1))
}

/// The steady describe figure of the operator: the churn window.
pub fn describe_pct(o: &OperatorRun) -> f64 {
    let t = &o.timeline;
    describe_peak_pct(&t.churn, t.cfg.churn)
}

fn cpu_max(o: &OperatorRun) -> Duration {
    let m = &o.measure;
    m.cpu_listed.max(m.cpu_rewrite).max(m.cpu_cached)
}

pub fn markdown(o: &OperatorRun, fleet: Option<&Fleet>, smoke: bool) -> String {
    let mut s = String::new();
    let t = &o.timeline;
    let fleet = fleet.map(|f| &f.timeline);
    let c = &t.cfg;
    let m = &o.measure;
    let _ = writeln!(s, "### Fleet with the operator (simulated cloud)\n");
    let _ = writeln!(
        s,
        "The fleet's timeline, account, buckets and seed, but no node calls the cloud: one \
         `enim-operator` allocator (the real one) serves all {} + {} nodes through their \
         NetResourceSets (watermarks `preAllocate` = {}, `maxAboveWatermark` = {}; {} workers; \
         mutating bucket one per {} ms, {} at once; describe bucket one per {} ms, {} at once; \
         the cloud listed at most every {} s). A resync follows any Node or status change \
         (coalesced over 1 s) and runs at least every {} s: {} resyncs, {} listings, {} spec \
         writes, {} failed tasks. Agents hand out spec ENIs whose device shows and answer the \
         drain handshake at once.\n",
        c.nodes,
        c.start_nodes,
        o.op.watermarks.pre_allocate,
        o.op.watermarks.max_above_watermark,
        o.op.workers,
        o.op.api.mutating_rate.every.as_millis(),
        o.op.api.mutating_rate.burst,
        o.op.api.read_rate.every.as_millis(),
        o.op.api.read_rate.burst,
        o.op.resync_interval.as_secs(),
        o.op.resync_interval.as_secs(),
        o.resyncs,
        o.listings,
        o.spec_writes,
        o.tasks_failed,
    );
    let na = || "not run".to_string();
    let f_start = fleet.map_or_else(na, |f| format!("{:.1}", f.start_done.as_secs_f64()));
    let f_thr = fleet.map_or_else(na, |f| format!("{:.2} %", throttled_pct(&f.start_counts)));
    let f_err = fleet.map_or_else(na, |f| {
        (f.start_pods.other_errors + f.churn_pods.other_errors).to_string()
    });
    let f_desc = fleet.map_or_else(na, |f| {
        format!("{:.2} %", describe_peak_pct(&f.churn, f.cfg.churn))
    });
    let f_ph = |mutating: bool| {
        fleet.map_or_else(na, |f| {
            format!(
                "{:.2}",
                per_node_hour(f.churn.calls(mutating), f.cfg.nodes, f.cfg.churn)
            )
        })
    };
    let f_ready = fleet.map_or_else(na, |f| format!("{:.1}", f.start_pods.ready.max / 1e3));
    let errors = t.start_pods.other_errors + t.churn_pods.other_errors;
    let _ = writeln!(s, "| figure | per-node agents | operator | goal | met |");
    let _ = writeln!(s, "|---|---:|---:|---:|---|");
    let _ = writeln!(
        s,
        "| {} new nodes at once: every pool at min_free (s) | {f_start} | {:.1} | | |",
        c.start_nodes,
        t.start_done.as_secs_f64()
    );
    let f_bound = fleet.map_or_else(na, |f| {
        format!(
            "{:.2} × ({:.0} s, {} attaches)",
            f.start_ratio(),
            f.bound().as_secs_f64(),
            f.start_attaches()
        )
    });
    let _ = writeln!(
        s,
        "| … ÷ bound (the buckets' floor for the ENIs the window attached, the new nodes' pods' and the churn's included: {:.0} s for {} attaches) | {f_bound} | {:.2} × | ≤ {START_TARGET} × | {} |",
        t.bound().as_secs_f64(),
        t.start_attaches(),
        t.start_ratio(),
        met(smoke, t.start_ratio() <= START_TARGET)
    );
    let _ = writeln!(
        s,
        "| throttled replies during the start-up, % of calls | {f_thr} | {:.2} % | ≤ {THROTTLED_TARGET_PCT} % | {} |",
        throttled_pct(&t.start_counts),
        met(smoke, throttled_pct(&t.start_counts) <= THROTTLED_TARGET_PCT)
    );
    let _ = writeln!(
        s,
        "| new nodes' pods: slowest ADD-to-ready (s) | {f_ready} | {:.1} | | |",
        t.start_pods.ready.max / 1e3
    );
    let _ = writeln!(
        s,
        "| pod errors other than 11 (churn and start-up) | {f_err} | {errors} | 0 | {} |",
        met(smoke, errors == 0)
    );
    let _ = writeln!(
        s,
        "| steady churn ({} nodes): describes, % of the busiest describe bucket's refill | {f_desc} | {:.2} % | ≤ {DESCRIBE_TARGET_PCT} % | {} |",
        c.nodes,
        describe_pct(o),
        met(smoke, describe_pct(o) <= DESCRIBE_TARGET_PCT)
    );
    for (name, mutating) in [("mutating", true), ("describe", false)] {
        let _ = writeln!(
            s,
            "| steady churn: {name} EC2 calls per node per hour | {} | {:.2} | | |",
            f_ph(mutating),
            per_node_hour(t.churn.calls(mutating), c.nodes, c.churn)
        );
    }
    let _ = writeln!(
        s,
        "| operator heap at {} nodes ({} ENIs): held between resyncs / peak in a resync (MiB) | — | {:.1} / {:.1} | ≤ {HEAP_TARGET_MIB} | {} |",
        m.nodes,
        m.enis,
        mib(m.heap_retained),
        mib(m.heap_peak),
        met(smoke, mib(m.heap_retained.max(m.heap_peak)) <= HEAP_TARGET_MIB)
    );
    let _ = writeln!(
        s,
        "| CPU of one resync of {} nodes, instant cloud (ms): listed, nothing to do / listed, every spec rewritten / from the cached listing | — | {:.1} / {:.1} / {:.1} | ≤ {} | {} |",
        m.nodes,
        ms(m.cpu_listed),
        ms(m.cpu_rewrite),
        ms(m.cpu_cached),
        ms(CPU_TARGET),
        met(smoke, cpu_max(o) <= CPU_TARGET)
    );
    let _ = writeln!(
        s,
        "\nThe cold resync of {} empty nodes (every set and {} ENIs made against the instant \
         cloud) took {:.1} ms of CPU. The operator's heap is counted by the bench's counting \
         allocator from a fresh allocator: its inputs (the Nodes and sets a watch cache would \
         hold) and its caches (the listing, limits, the last spec of every node).\n",
        m.nodes,
        m.enis,
        ms(m.cpu_cold)
    );
    s
}

pub fn json(o: &OperatorRun) -> Value {
    let t = &o.timeline;
    let m = &o.measure;
    let errors = t.start_pods.other_errors + t.churn_pods.other_errors;
    json!({
        "nodes": t.cfg.nodes,
        "start_nodes": t.cfg.start_nodes,
        "workers": o.op.workers,
        "mutating_rate": {"every_ms": ms(o.op.api.mutating_rate.every), "burst": o.op.api.mutating_rate.burst},
        "describe_rate": {"every_ms": ms(o.op.api.read_rate.every), "burst": o.op.api.read_rate.burst},
        "resync_interval_s": o.op.resync_interval.as_secs_f64(),
        "resyncs": o.resyncs,
        "listings": o.listings,
        "spec_writes": o.spec_writes,
        "tasks_failed": o.tasks_failed,
        "warmup_s": t.warmup.as_secs_f64(),
        "warmup_calls": t.warmup_counts.calls(true) + t.warmup_counts.calls(false),
        "start": {
            "all_at_min_free_s": t.start_done.as_secs_f64(),
            "bound_s": t.bound().as_secs_f64(),
            "bucket_bound_s": t.start_bucket_bound.as_secs_f64(),
            "latency_bound_s": t.start_latency_bound.as_secs_f64(),
            "over_bound": t.start_ratio(),
            "attaches": t.start_attaches(),
            "per_node_p50_s": t.start_per_node.p50 / 1e3,
            "per_node_max_s": t.start_per_node.max / 1e3,
            "all_pods_ready_s": t.pods_ready.as_secs_f64(),
            "throttled_pct_of_calls": throttled_pct(&t.start_counts),
            "throttled": t.start_counts.throttled(),
            "calls": t.start_counts.calls(true) + t.start_counts.calls(false),
            "pods_try_again_11": t.start_pods.try_again,
            "pods_ready_max_s": t.start_pods.ready.max / 1e3,
            "counts": counts_json(&t.start_counts),
        },
        "churn": {
            "describe_peak_pct_of_refill": describe_pct(o),
            "mutating_per_node_per_hour": per_node_hour(t.churn.calls(true), t.cfg.nodes, t.cfg.churn),
            "describe_per_node_per_hour": per_node_hour(t.churn.calls(false), t.cfg.nodes, t.cfg.churn),
            "pods": t.churn_pods.started,
            "pods_try_again_11": t.churn_pods.try_again,
        },
        "idle_calls": t.idle.calls(true) + t.idle.calls(false),
        "pod_errors_other_than_11": errors,
        "measure": {
            "nodes": m.nodes,
            "enis": m.enis,
            "heap_retained_mib": mib(m.heap_retained),
            "heap_peak_mib": mib(m.heap_peak),
            "cpu_cold_ms": ms(m.cpu_cold),
            "cpu_listed_ms": ms(m.cpu_listed),
            "cpu_rewrite_ms": ms(m.cpu_rewrite),
            "cpu_cached_ms": ms(m.cpu_cached),
        },
        "targets": {
            "start_over_bound": START_TARGET,
            "start_met": t.start_ratio() <= START_TARGET,
            "throttled_pct": THROTTLED_TARGET_PCT,
            "throttled_met": throttled_pct(&t.start_counts) <= THROTTLED_TARGET_PCT,
            "describe_pct": DESCRIBE_TARGET_PCT,
            "describe_met": describe_pct(o) <= DESCRIBE_TARGET_PCT,
            "errors_met": errors == 0,
            "heap_mib": HEAP_TARGET_MIB,
            "heap_met": mib(m.heap_retained.max(m.heap_peak)) <= HEAP_TARGET_MIB,
            "cpu_ms": ms(CPU_TARGET),
            "cpu_met": cpu_max(o) <= CPU_TARGET,
        },
    })
}
