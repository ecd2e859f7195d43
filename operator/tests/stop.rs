//! SIGTERM while the leader's resync waits on a cloud call that hangs: the
//! operator stops at once with its lease released, instead of waiting out
//! the call (30 s, retried) past the pod's grace period. The next leader
//! finishes the intent with its client token: no duplicate, no leak.

mod common;

use std::time::{Duration, Instant};

use common::*;

const NODE: &str = "node-a";
const CREATE: &str = "CreateNetworkInterface";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_does_not_wait_for_a_hung_cloud_call() {
    let Some((_one, rig)) = slotted_rig(false).await else {
        return;
    };
    let instance = rig.env.instance_id.clone();
    let config = rig.config("op", TWO, "5m");
    let mut a = rig
        .operator_leading(OperatorOpts::deployed("op-a", &config))
        .await;

    rig.env.proxy.hold(CREATE, true);
    rig.node(NODE, &instance);
    wait_for("op-a's create hangs", Duration::from_secs(30), || async {
        let n = rig.env.proxy.calls(CREATE);
        (n >= 1).then_some(()).ok_or(format!("{n} creates"))
    })
    .await;
    assert!(a.exited().is_none(), "op-a exited\n{}", a.tail());
    let asked = Instant::now();
    a.stop().await;
    let took = asked.elapsed();
    eprintln!("SIGTERM mid-create → exit 0: {took:?}");
    assert!(
        took < Duration::from_secs(8),
        "the stop took {took:?}\n{}",
        a.tail()
    );
    assert!(
        a.stdout().contains("stopping mid-pass"),
        "op-a did not stop mid-pass\n{}",
        a.tail()
    );
    let holder = rig.leader();
    assert_ne!(holder, "op-a", "op-a's lease was not released");

    // What op-a left: its intents, nothing published.
    let set = rig.set(NODE).await.expect("op-a wrote the set");
    assert!(!set.spec.intents.is_empty(), "no intent before the create");
    assert!(set.spec.enis.is_empty(), "{:?}", set.spec.enis);

    rig.env.proxy.hold(CREATE, false);
    let mut b = rig.operator(OperatorOpts::deployed("op-b", &config));
    wait_for("op-b finishes the intents", Duration::from_secs(30), || {
        rig.converged(NODE, &instance, Some(2))
    })
    .await;
    assert_eq!(
        rig.cluster_enis().await.len(),
        2,
        "leaked or duplicated ENIs in moto"
    );
    b.stop().await;
}
