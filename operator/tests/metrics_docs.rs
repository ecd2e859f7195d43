//! What the operator serves on `/metrics`, scraped from the real binary
//! (on a real API server and moto, see common/mod.rs, with a node served
//! so that every family has a sample), is what docs/operations.md lists
//! for it, both ways and with the same types; and every operator metric
//! the alerts and the dashboard use is served (enimd's:
//! tests/metrics_health.rs).

mod common;

use std::time::Duration;

use common::*;
use enim_testkit::metrics_doc::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_serves_exactly_the_documented_metrics() {
    let Some((_one, rig)) = slotted_rig(false).await else {
        return;
    };
    let instance = rig.env.instance_id.clone();
    let config = rig.config("op", TWO, "5m");
    let op = rig.operator(OperatorOpts::new("op-1", &config));
    rig.node(NODE_NAME, &instance);
    wait_for("the node's 2 ENIs", Duration::from_secs(30), || {
        rig.converged(NODE_NAME, &instance, Some(2))
    })
    .await;
    let addr = health_addr(&op).expect("the operator logs its health address");
    // The per-node gauges follow the set cache: wait for the node's.
    let text = wait_for("the node's gauges", Duration::from_secs(20), || async {
        let (_, text) = http_get(&addr, "/metrics").await?;
        text.contains(&format!("node=\"{NODE_NAME}\""))
            .then_some(text.clone())
            .ok_or(text)
    })
    .await;
    let served = served(&text);
    let docs = repo_file("docs/operations.md");
    let documented = documented(&docs, "enim-operator");
    assert!(documented.len() >= 10, "{documented:?}");
    let wrong = differences(&documented, &served);
    assert!(
        wrong.is_empty(),
        "docs/operations.md vs /metrics: {wrong:#?}"
    );
    for name in served.keys() {
        assert!(
            name.starts_with("enim_operator_"),
            "{name}: not the operator's prefix"
        );
    }

    let exprs = rule_exprs(&repo_file("charts/enim/files/prometheus-rules.yaml"))
        .into_iter()
        .chain(dashboard_exprs(&repo_file(
            "charts/enim/files/grafana-dashboard.json",
        )));
    for expr in exprs {
        for name in metrics_named(&expr)
            .into_iter()
            .filter(|n| n.starts_with("enim_operator_"))
        {
            assert!(served.contains_key(&name), "{expr}: {name} is not served");
        }
    }
    drop(op);
}

const NODE_NAME: &str = "node-a";
