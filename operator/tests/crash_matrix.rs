//! The allocator's crash matrix on a real API server and moto: for each
//! crash point (operator/src/allocator/job.rs), one operator runs until it
//! aborts there (checked: SIGABRT, its stderr names the point, and the
//! state it left is the one that point leaves), then a clean operator
//! takes over, and the node converges: moto's ENIs for the cluster are the
//! spec's, all attached to the node's instance, none made twice, none
//! leaked, no intent left. Needs the `fault-injection` build.
//!
//! The create points are reached by a new node's first ENIs, and again by
//! an ENI made for a DRA claim (`claim_*`); the detach
//! points by a drain: the node first gets three ENIs, then an operator
//! whose watermarks want one drains two, the agent releases them, and the
//! reclaim detaches and deletes them.

mod common;

use std::time::Duration;

use common::*;

const NODE: &str = "node-a";
const CRASH: Duration = Duration::from_secs(40);
const CONVERGE: Duration = Duration::from_secs(40);

/// What the crashed operator left, as the point says it must be.
#[derive(Debug)]
struct Left {
    intents: usize,
    published: usize,
    in_moto: usize,
    attached: usize,
}

async fn left(rig: &Rig) -> Left {
    let spec = rig.set(NODE).await.expect("the set").spec;
    let attached = rig.env.attached().await;
    let in_moto = rig.cluster_enis().await;
    Left {
        intents: spec.intents.len(),
        published: spec.enis.len(),
        in_moto: in_moto.len(),
        attached: in_moto
            .iter()
            .filter(|e| attached.contains_key(&e.network_interface_id))
            .count(),
    }
}

/// A new node's first ENIs, with a crash at `point`.
async fn create_point(point: &str) {
    let Some((_one, rig)) = slotted_rig(false).await else {
        return;
    };
    let instance = rig.env.instance_id.clone();
    let config = rig.config("op", TWO, "5m");
    let mut crashing = rig.operator(OperatorOpts {
        crash_at: Some(point),
        ..OperatorOpts::new("op-crash", &config)
    });
    rig.node(NODE, &instance);
    crashing.assert_crashed_at(point, CRASH).await;

    let l = left(&rig).await;
    let want = match point {
        // Both intents written, nothing called.
        "operator-after-intent" => (2, 0, 0, 0),
        // The first ENI made, not attached.
        "operator-after-create" => (2, 0, 1, 0),
        // The first ENI attached, not published.
        "operator-after-attach" => (2, 0, 1, 1),
        // Both published, the intents dropped in the same write.
        "operator-after-publish" => (0, 2, 2, 2),
        other => panic!("not a create point: {other}"),
    };
    assert_eq!(
        (l.intents, l.published, l.in_moto, l.attached),
        want,
        "left at {point}: {l:?}"
    );

    let mut clean = rig.operator(OperatorOpts::new("op-clean", &config));
    wait_for(&format!("convergence after {point}"), CONVERGE, || {
        rig.converged(NODE, &instance, Some(2))
    })
    .await;
    assert_eq!(
        rig.cluster_enis().await.len(),
        2,
        "leaked ENIs after {point}"
    );
    // One create and one attach per ENI, whoever made them.
    assert_eq!(rig.env.proxy.calls("CreateNetworkInterface"), 2, "{point}");
    assert_eq!(rig.env.proxy.calls("AttachNetworkInterface"), 2, "{point}");
    assert_eq!(rig.env.proxy.calls("DeleteNetworkInterface"), 0, "{point}");
    clean.stop().await;
}

/// An ENI made for a DRA claim (no pool: watermarks all zero), with a
/// crash at `point`: the clean operator finishes the claim's intent with
/// the same group, and the claim has exactly one ENI.
async fn claim_point(point: &str) {
    let Some((_one, rig)) = slotted_rig(false).await else {
        return;
    };
    let instance = rig.env.instance_id.clone();
    let group = rig.env.create_security_group("crash-claim").await;
    let none = Marks {
        pre: 0,
        min: 0,
        above: 0,
    };
    let config = rig.config("op", none, "5m");
    let mut crashing = rig.operator(OperatorOpts {
        crash_at: Some(point),
        ..OperatorOpts::new("op-crash", &config)
    });
    rig.node(NODE, &instance);
    // Claims' ENIs go only to a node whose agent serves claims.
    let _agent = rig.dra_agent(NODE).await;
    let uid = apply_claim(&rig, "db", &group);
    crashing.assert_crashed_at(point, CRASH).await;

    let l = left(&rig).await;
    let want = match point {
        "operator-after-intent" => (1, 0, 0, 0),
        "operator-after-create" => (1, 0, 1, 0),
        "operator-after-attach" => (1, 0, 1, 1),
        "operator-after-publish" => (0, 1, 1, 1),
        other => panic!("not a create point: {other}"),
    };
    assert_eq!(
        (l.intents, l.published, l.in_moto, l.attached),
        want,
        "left at {point}: {l:?}"
    );
    if l.intents == 1 {
        let spec = rig.set(NODE).await.unwrap().spec;
        let intent = &spec.intents[0];
        assert_eq!(
            intent.claim.as_ref().map(|c| c.uid.as_str()),
            Some(uid.as_str())
        );
        assert_eq!(intent.security_groups, std::slice::from_ref(&group));
    }

    let mut clean = rig.operator(OperatorOpts::new("op-clean", &config));
    wait_for(&format!("convergence after {point}"), CONVERGE, || {
        rig.converged(NODE, &instance, Some(1))
    })
    .await;
    let spec = rig.set(NODE).await.unwrap().spec;
    let eni = &spec.enis[0];
    assert_eq!(
        eni.claim.as_ref().map(|c| c.uid.as_str()),
        Some(uid.as_str()),
        "{point}"
    );
    assert_eq!(eni.security_groups, std::slice::from_ref(&group), "{point}");
    let in_moto = rig.env.eni(&eni.id).await;
    let groups = in_moto.group_ids();
    assert_eq!(
        groups,
        [group.as_str()],
        "{point}: the finished create kept the claim's group"
    );
    assert_eq!(
        rig.cluster_enis().await.len(),
        1,
        "leaked ENIs after {point}"
    );
    assert_eq!(rig.env.proxy.calls("CreateNetworkInterface"), 1, "{point}");
    assert_eq!(rig.env.proxy.calls("AttachNetworkInterface"), 1, "{point}");
    clean.stop().await;
}

/// A drain of two of three ENIs, with a crash at `point` in the first
/// reclaim.
async fn drain_point(point: &str) {
    let Some((_one, rig)) = slotted_rig(false).await else {
        return;
    };
    let instance = rig.env.instance_id.clone();
    let three = Marks {
        pre: 3,
        min: 3,
        above: 0,
    };
    let one = Marks {
        pre: 1,
        min: 1,
        above: 0,
    };
    let (config3, config1) = (
        rig.config("three", three, "5m"),
        rig.config("one", one, "5m"),
    );
    let mut setup = rig.operator(OperatorOpts::new("op-setup", &config3));
    rig.node(NODE, &instance);
    let before = wait_for("three ENIs", CONVERGE, || {
        rig.converged(NODE, &instance, Some(3))
    })
    .await;
    setup.stop().await;
    // The agent answers the drain (no pod holds any of them).
    let agent = rig.agent(NODE).await;

    let mut crashing = rig.operator(OperatorOpts {
        crash_at: Some(point),
        ..OperatorOpts::new("op-crash", &config1)
    });
    crashing.assert_crashed_at(point, CRASH).await;
    let spec = rig.set(NODE).await.unwrap().spec;
    let status = rig.set(NODE).await.unwrap().status.unwrap_or_default();
    assert_eq!(spec.draining.len(), 2, "{:?}", spec.draining);
    assert!(
        spec.draining.iter().all(|d| status.released.contains(d)),
        "the crash came before the agent released: {:?}",
        status.released
    );
    let l = left(&rig).await;
    let want = match point {
        "operator-before-detach" => (0, 3, 3, 3),
        // The first one available, still tagged, still in the spec.
        "operator-after-detach" => (0, 3, 3, 2),
        // Both detached (a resync asks for every detach before a later
        // one deletes), the first gone from moto, still in the spec.
        "operator-after-delete" => (0, 3, 2, 1),
        other => panic!("not a detach point: {other}"),
    };
    assert_eq!(
        (l.intents, l.published, l.in_moto, l.attached),
        want,
        "left at {point}: {l:?}"
    );

    let mut clean = rig.operator(OperatorOpts::new("op-clean", &config1));
    let after = wait_for(&format!("convergence after {point}"), CONVERGE, || {
        rig.converged(NODE, &instance, Some(1))
    })
    .await;
    assert!(
        before.contains(&after[0]),
        "a new ENI: {after:?} vs {before:?}"
    );
    assert!(!spec.draining.contains(&after[0]), "a drained ENI kept");
    assert_eq!(
        rig.cluster_enis().await.len(),
        1,
        "leaked ENIs after {point}"
    );
    assert_eq!(rig.env.proxy.calls("CreateNetworkInterface"), 3, "{point}");
    // The agent serves what is left.
    wait_for("the agent serves the last spec", CONVERGE, || async {
        let ids: Vec<String> = agent
            .spec()
            .map(|s| s.spec.enis.iter().map(|e| e.id.clone()).collect())
            .unwrap_or_default();
        (ids == after).then_some(()).ok_or(format!("{ids:?}"))
    })
    .await;
    clean.stop().await;
}

/// The points below; a point added to the allocator fails this until the
/// matrix covers it.
const COVERED: [&str; 7] = [
    "operator-after-intent",
    "operator-after-create",
    "operator-after-attach",
    "operator-after-publish",
    "operator-before-detach",
    "operator-after-detach",
    "operator-after-delete",
];

#[test]
fn the_matrix_covers_every_crash_point_of_the_allocator() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found = std::collections::BTreeSet::new();
    let mut stack = vec![dir];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                for part in text.split("crash_point(\"").skip(1) {
                    found.insert(part[..part.find('"').unwrap()].to_string());
                }
            }
        }
    }
    let covered: std::collections::BTreeSet<String> =
        COVERED.iter().map(|p| p.to_string()).collect();
    assert_eq!(found, covered);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_intent() {
    create_point("operator-after-intent").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_create() {
    create_point("operator-after-create").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_attach() {
    create_point("operator-after-attach").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_publish() {
    create_point("operator-after-publish").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn before_detach() {
    drain_point("operator-before-detach").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_detach() {
    drain_point("operator-after-detach").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_delete() {
    drain_point("operator-after-delete").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_after_intent() {
    claim_point("operator-after-intent").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_after_create() {
    claim_point("operator-after-create").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_after_attach() {
    claim_point("operator-after-attach").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_after_publish() {
    claim_point("operator-after-publish").await;
}
