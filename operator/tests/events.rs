//! The operator's Events and metrics on a real API server and moto (see
//! common/mod.rs), the operator authenticated with deploy/'s RBAC: a
//! throttled ENI create is told on the node's NetResourceSet and on its
//! Node (both as Warnings, the Node's with its uid), the throttling is
//! counted in `/metrics`, a pending claim no node can serve is told on
//! the claim, and a throttled listing (no node's) on the operator's Pod.

mod common;

use std::time::Duration;

use common::*;

const NODE: &str = "node-a";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttled_create_is_told_on_the_set_and_its_node_an_unservable_claim_on_the_claim() {
    let Some((_one, rig)) = slotted_rig(false).await else {
        return;
    };
    let instance = rig.env.instance_id.clone();
    // Every attempt of the first two creates (4 each, see the rig's
    // config) is throttled: the first pass's creates fail, a later one's
    // succeed.
    rig.env
        .proxy
        .inject("CreateNetworkInterface", 8, 503, "RequestLimitExceeded");
    let config = rig.config("op", TWO, "5m");
    let op = rig.operator(OperatorOpts::new("op-1", &config));
    let node_uid = rig.node(NODE, &instance);

    let on_set = wait_told(&rig, "default", "NetResourceSet", NODE, "EniCreateFailed").await;
    assert_eq!(on_set.type_.as_deref(), Some("Warning"));
    assert_eq!(
        on_set.reporting_controller.as_deref(),
        Some("enim-operator")
    );
    assert_eq!(on_set.reporting_instance.as_deref(), Some("op-1"));
    assert_eq!(on_set.action.as_deref(), Some("CreateEni"));
    let note = on_set.note.clone().unwrap_or_default();
    assert!(
        note.contains("RequestLimitExceeded") || note.contains("throttled"),
        "{note}"
    );
    let set_uid = rig.set(NODE).await.unwrap().metadata.uid;
    let regarding = on_set.regarding.as_ref().unwrap();
    assert_eq!(
        regarding.uid, set_uid,
        "the set's uid, for kubectl describe"
    );
    assert_eq!(
        on_set.related.as_ref().and_then(|r| r.kind.as_deref()),
        Some("Node")
    );
    let on_node = wait_told(&rig, "default", "Node", NODE, "EniCreateFailed").await;
    assert_eq!(
        on_node.regarding.as_ref().and_then(|r| r.uid.as_deref()),
        Some(node_uid.as_str())
    );
    wait_told(&rig, "default", "NetResourceSet", NODE, "CloudThrottled").await;
    wait_told(&rig, "default", "Node", NODE, "CloudThrottled").await;

    // The next passes make the ENIs.
    wait_for("the node's 2 ENIs", Duration::from_secs(30), || {
        rig.converged(NODE, &instance, Some(2))
    })
    .await;

    // Counted: the throttled calls, and the events posted.
    let addr = health_addr(&op).expect("the operator logs its health address");
    let (status, body) = http_get(&addr, "/metrics").await.unwrap();
    assert!(status.contains("200"), "{status}");
    let throttled = metric(&body, "enim_operator_cloud_throttled_total").unwrap_or_default();
    assert!(throttled >= 2.0, "throttled {throttled}:\n{body}");
    let posted = body
        .lines()
        .find_map(|l| l.strip_prefix("enim_operator_events_total{outcome=\"posted\"} "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or_default();
    assert!(posted >= 4.0, "posted {posted}:\n{body}");
    assert!(body.contains("# TYPE enim_operator_leader gauge"), "{body}");

    // A claim asking for an ENI while no node's agent serves claims: told
    // on the claim, in its namespace.
    let group = rig.env.create_security_group("enim-events-db").await;
    let claim_uid = apply_claim(&rig, "lonely", &group);
    let (ns, kind, reason) = ("default", "ResourceClaim", "ClaimNotServable");
    let e = wait_told(&rig, ns, kind, "lonely", reason).await;
    assert_eq!(e.type_.as_deref(), Some("Warning"));
    assert_eq!(
        e.regarding.as_ref().and_then(|r| r.uid.as_deref()),
        Some(claim_uid.as_str())
    );
    assert!(
        e.note
            .as_deref()
            .unwrap_or_default()
            .contains("serving DRA claims"),
        "{e:?}"
    );
    // Told once while it lasts, not at every resync (one a second here).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let again = told(&rig, ns, kind, "lonely", reason).await;
    assert_eq!(again.len(), 1);
    assert!(
        again[0].series.is_none(),
        "told again: {:?}",
        again[0].series
    );

    // A throttled listing concerns no node: told on the operator's Pod.
    rig.env
        .proxy
        .inject("DescribeNetworkInterfaces", 8, 503, "RequestLimitExceeded");
    let on_pod = wait_told(&rig, NS, "Pod", "op-1", "CloudThrottled").await;
    assert_eq!(on_pod.action.as_deref(), Some("ListEnis"));
    assert_eq!(on_pod.type_.as_deref(), Some("Warning"));
    drop(op);
}
