//! Node pools end to end, on a real API server and moto (see
//! common/mod.rs): a primary pool and a secondary pool with watermarks of
//! their own, each node's set and ENIs as its pool says; a Node in no pool
//! gets no NetResourceSet and no ENI; and a Node registered before its
//! instance-type label gets its ENIs once the label arrives.

mod common;

use std::time::Duration;

use common::*;
use enim_crd::Mode;
use enim_testkit::moto::INSTANCE_TYPE;

const POOL: &str = "enim.io/pool";
const TYPE: &str = "node.kubernetes.io/instance-type";

/// Two pools, after the rest of the file (TOML lets a table of
/// `[operator]` follow `[cloud]`); the top level (mode primary, [`TWO`])
/// fills in what they leave out. The secondary pool's watermarks count
/// addresses.
const POOLS: &str = r#"
[[operator.pools]]
name = "prim"
node_selector = { "enim.io/pool" = "prim" }
mode = "primary"

[[operator.pools]]
name = "sec"
node_selector = { "enim.io/pool" = "sec" }
mode = "secondary"
[operator.pools.watermarks]
pre_allocate = 4
min_allocate = 6
max_above_watermark = 2
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_pool_sets_its_nodes_a_node_in_none_is_left_alone_and_a_late_type_fills_up() {
    let Some((_one, rig)) = slotted_rig(false).await else {
        return;
    };
    let prim = rig.env.instance_id.clone();
    let sec = rig.run_instance().await;
    let none = rig.run_instance().await;
    let late = rig.run_instance().await;
    let config = rig.config_with_tables("op", TWO, "5m", POOLS);
    let op = rig.operator(OperatorOpts::new("op-1", &config));

    rig.node_labelled("n-prim", &prim, &[(TYPE, INSTANCE_TYPE), (POOL, "prim")]);
    rig.node_labelled("n-sec", &sec, &[(TYPE, INSTANCE_TYPE), (POOL, "sec")]);
    rig.node_labelled(
        "n-none",
        &none,
        &[(TYPE, INSTANCE_TYPE), (POOL, "per-node")],
    );

    // The primary pool: the top level's watermarks, two whole ENIs.
    wait_for("n-prim's 2 ENIs", Duration::from_secs(30), || {
        rig.converged("n-prim", &prim, Some(2))
    })
    .await;
    let spec = rig.set("n-prim").await.unwrap().spec;
    assert_eq!(spec.mode, Mode::Primary);
    assert_eq!(
        (spec.watermarks.pre_allocate, spec.watermarks.min_allocate),
        (1, 2)
    );

    // The secondary pool: its own watermarks, in addresses: one ENI with
    // the six it wants at least.
    wait_for(
        "n-sec's ENI with 6 addresses",
        Duration::from_secs(30),
        || async {
            rig.converged("n-sec", &sec, Some(1)).await?;
            let spec = rig.set("n-sec").await.unwrap().spec;
            let ips: usize = spec.enis.iter().map(|e| e.secondary_ips.len()).sum();
            (ips == 6).then_some(()).ok_or(format!("{ips} addresses"))
        },
    )
    .await;
    let spec = rig.set("n-sec").await.unwrap().spec;
    assert_eq!(spec.mode, Mode::Secondary);
    let w = spec.watermarks;
    assert_eq!(
        (w.pre_allocate, w.min_allocate, w.max_above_watermark),
        (4, 6, 2)
    );
    let in_moto = rig.env.eni(&spec.enis[0].id).await;
    assert_eq!(in_moto.secondary_ips().len(), 6, "in moto");

    // A node in no pool: no set and no ENI, resync after resync.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        rig.set("n-none").await.is_none(),
        "a set for a node in no pool"
    );
    let touched: Vec<String> = rig
        .cluster_enis()
        .await
        .into_iter()
        .filter(|e| {
            e.tag(enim_provider_aws::TAG_NODE) == Some(none.as_str())
                || e.attached_instance() == Some(none.as_str())
        })
        .map(|e| e.network_interface_id)
        .collect();
    assert!(
        touched.is_empty(),
        "ENIs for a node in no pool: {touched:?}"
    );

    // A node registered before the cloud controller labelled its type: its
    // set, but no ENI (no limits without a type)...
    rig.node_labelled("n-late", &late, &[(POOL, "prim")]);
    wait_for("n-late's set", Duration::from_secs(30), || async {
        rig.set("n-late")
            .await
            .map(|_| ())
            .ok_or("no set".to_string())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let spec = rig.set("n-late").await.unwrap().spec;
    assert_eq!(
        (spec.instance.instance_type.as_str(), spec.enis.len()),
        ("", 0),
        "{}",
        op.tail()
    );
    // ...until the label arrives: the type is filled in, the ENIs follow.
    blocking(|| {
        rig.cp.kubectl(&[
            "label",
            "node",
            "n-late",
            &format!("{TYPE}={INSTANCE_TYPE}"),
        ])
    });
    wait_for("n-late's 2 ENIs", Duration::from_secs(30), || {
        rig.converged("n-late", &late, Some(2))
    })
    .await;
    let spec = rig.set("n-late").await.unwrap().spec;
    assert_eq!(spec.instance.instance_type, INSTANCE_TYPE);
    assert_eq!(spec.instance.id, late);
    assert!(rig.set("n-none").await.is_none());
}
