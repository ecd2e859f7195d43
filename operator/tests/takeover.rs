//! Two operator replicas, the leader killed in the middle of a create (the
//! ENI exists in moto, neither attached nor published): the follower takes
//! the lease over and finishes the intents with their client tokens, so no
//! ENI is made twice and none is left behind. Needs the `fault-injection`
//! build (ENIMD_CRASH_AT).

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::*;
use enim_provider::fleet::TAG_INTENT;

const NODE: &str = "node-a";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_follower_finishes_what_the_leader_died_creating_without_a_duplicate() {
    let Some((_one, rig)) = slotted_rig(false).await else {
        return;
    };
    let instance = rig.env.instance_id.clone();
    let config = rig.config("op", TWO, "5m");
    // The deployment's lease: the takeover measured is the one production
    // gets.
    let mut a = rig
        .operator_leading(OperatorOpts {
            crash_at: Some("operator-after-create"),
            ..OperatorOpts::deployed("op-a", &config)
        })
        .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut b = rig.operator(OperatorOpts::deployed("op-b", &config));
    // Its caches fill while it follows.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(b.exited().is_none(), "op-b exited\n{}", b.tail());
    assert_eq!(rig.leader(), "op-a");

    rig.node(NODE, &instance);
    a.assert_crashed_at("operator-after-create", Duration::from_secs(30))
        .await;
    let (_, a_died) = a.exit.unwrap();
    assert!(b.exited().is_none(), "op-b died too\n{}", b.tail());

    // What a left: two intents, no ENI published, one ENI in moto made
    // for the first intent and attached nowhere.
    let set = rig
        .set(NODE)
        .await
        .expect("a wrote the set before its intents");
    let left_rv = set.metadata.resource_version.clone();
    let tokens: BTreeSet<String> = set
        .spec
        .intents
        .iter()
        .map(|i| i.client_token.clone())
        .collect();
    assert_eq!(tokens.len(), 2, "{:?}", set.spec.intents);
    assert!(set.spec.enis.is_empty(), "{:?}", set.spec.enis);
    let made = rig.cluster_enis().await;
    assert_eq!(made.len(), 1, "one ENI made before the crash");
    let orphan = made[0].network_interface_id.clone();
    assert_eq!(made[0].attachment, None, "not attached yet");
    assert!(tokens.contains(made[0].tag(TAG_INTENT).unwrap()));

    // b's first write of the set after a's death: the takeover.
    let takeover = wait_for("op-b writes the set", Duration::from_secs(30), || async {
        let rv = rig.set(NODE).await.unwrap().metadata.resource_version;
        (rv != left_rv)
            .then(|| a_died.elapsed())
            .ok_or_else(|| "unchanged".to_string())
    })
    .await;
    let takeover = a_died.elapsed().min(takeover);
    eprintln!("takeover: op-a's abort → op-b's first spec write: {takeover:?}");
    assert_eq!(rig.leader(), "op-b");
    let enis = wait_for(
        "op-b finishes both intents",
        Duration::from_secs(30),
        || rig.converged(NODE, &instance, Some(2)),
    )
    .await;
    eprintln!("op-a's abort → converged: {:?}", a_died.elapsed());
    assert!(
        takeover < Duration::from_secs(15),
        "takeover took {takeover:?}\n{}",
        b.tail()
    );

    // Exactly one ENI per intent, the orphan among them; nothing else.
    assert!(enis.contains(&orphan), "{orphan} not adopted: {enis:?}");
    let all = rig.cluster_enis().await;
    assert_eq!(all.len(), 2, "leaked or duplicated ENIs in moto");
    let by_token: BTreeSet<String> = all
        .iter()
        .map(|e| e.tag(TAG_INTENT).unwrap_or_default().to_string())
        .collect();
    assert_eq!(by_token, tokens, "one ENI per intent");
    // b never created the orphan's ENI again: one create of its own.
    assert_eq!(rig.env.proxy.calls("CreateNetworkInterface"), 2);
    b.stop().await;
}
