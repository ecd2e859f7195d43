//! The API server goes away while the operator leads: the operator keeps
//! running (no exit, so no crash loop under a Deployment), and once the API
//! server is back it resumes: a Node created then gets its set and ENIs.

mod common;

use std::time::{Duration, Instant};

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_outlives_an_api_server_outage_and_resumes() {
    let Some((_one, mut rig)) = slotted_rig(false).await else {
        return;
    };
    let instance = rig.env.instance_id.clone();
    let config = rig.config("op", TWO, "5m");
    let mut op = rig.operator(OperatorOpts::new("op-1", &config));
    rig.node("node-a", &instance);
    wait_for("node-a's ENIs", Duration::from_secs(30), || {
        rig.converged("node-a", &instance, Some(2))
    })
    .await;

    // Down for well over the lease (3 s): renewals, watches and writes
    // all fail meanwhile.
    blocking(|| rig.cp.stop_apiserver());
    let down = Instant::now();
    while down.elapsed() < Duration::from_secs(10) {
        assert!(
            op.exited().is_none(),
            "the operator exited with the API server down\n{}",
            op.tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    blocking(|| rig.cp.start_apiserver());
    let back = Instant::now();
    eprintln!("API server down for {:?}", back - down);

    let other = rig.run_instance().await;
    rig.node("node-b", &other);
    wait_for("node-b's set and ENIs", Duration::from_secs(15), || {
        rig.converged("node-b", &other, Some(2))
    })
    .await;
    eprintln!(
        "API server back → a new node's ENIs published: {:?}",
        back.elapsed()
    );
    // Nothing node-a had was lost or doubled meanwhile.
    rig.converged("node-a", &instance, Some(2)).await.unwrap();
    assert_eq!(rig.cluster_enis().await.len(), 4);
    assert_eq!(rig.leader(), "op-1");
    assert!(op.exited().is_none(), "{}", op.tail());
    // It saw the outage (and said so), and was not restarted: one process.
    let out = op.stdout();
    assert!(
        out.contains("resync failed") || out.contains("watch failed"),
        "no sign of the outage in the log\n{}",
        op.tail()
    );
    op.stop().await;
}
