//! ENIs made on demand for DRA claims, on a real API server and moto (see
//! common/mod.rs): a pending claim of DeviceClass eni.enim.io asking for
//! security groups no node's ENIs have gets an ENI created in moto with
//! exactly those groups, attached to a node whose agent serves claims and
//! published marked with the claim; never a second one; the agent sees its groups (what its DRA
//! driver publishes); it is told on the claim as an Event; and once the claim is deleted the ENI is drained,
//! released by the agent, detached and deleted.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::*;
use enim_provider::EniProvider;

const NODE: &str = "node-a";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_no_node_can_serve_gets_an_eni_made_with_its_groups() {
    let Some((_one, rig)) = slotted_rig(false).await else {
        return;
    };
    let instance = rig.env.instance_id.clone();
    let group = rig.env.create_security_group("enim-claim-db").await;
    let config = rig.config("op", TWO, "5m");
    let _op = rig.operator(OperatorOpts::new("op-1", &config));
    rig.node(NODE, &instance);
    let pool: BTreeSet<String> =
        wait_for("the node's 2 pool ENIs", Duration::from_secs(30), || {
            rig.converged(NODE, &instance, Some(2))
        })
        .await
        .into_iter()
        .collect();
    let creates = rig.env.proxy.calls("CreateNetworkInterface");
    // The node's agent, its DRA driver on: the operator makes claims'
    // ENIs only where the status says so.
    let agent = rig.dra_agent(NODE).await;

    let claim_uid = apply_claim(&rig, "db", &group);
    let asked = Instant::now();
    let made = wait_for(
        "an ENI published for the claim",
        Duration::from_secs(30),
        || async {
            let set = rig.set(NODE).await.ok_or_else(|| "no set".to_string())?;
            set.spec
                .enis
                .iter()
                .find(|e| e.claim.as_ref().is_some_and(|c| c.uid == claim_uid))
                .cloned()
                .ok_or(format!("{:?}", set.spec.enis))
        },
    )
    .await;
    eprintln!(
        "claim applied → its ENI created, attached and published: {:?}",
        asked.elapsed()
    );
    assert!(!pool.contains(&made.id));
    assert_eq!(made.security_groups, std::slice::from_ref(&group));
    let claim = made.claim.as_ref().unwrap();
    assert_eq!(
        (claim.namespace.as_str(), claim.name.as_str()),
        ("default", "db")
    );
    // Told on the claim (and on the node's set).
    let served = wait_told(&rig, "default", "ResourceClaim", "db", "ClaimServed").await;
    assert_eq!(served.type_.as_deref(), Some("Normal"));
    assert!(
        served
            .note
            .as_deref()
            .unwrap_or_default()
            .contains(&made.id),
        "{served:?}"
    );
    wait_told(&rig, "default", "NetResourceSet", NODE, "ClaimServed").await;
    // In moto: exactly the claim's group, attached to the node's instance.
    let in_moto = rig.env.eni(&made.id).await;
    let groups = in_moto.group_ids();
    assert_eq!(groups, [group.as_str()]);
    assert_eq!(in_moto.attached_instance(), Some(instance.as_str()));

    // Later resyncs make no second one, and the pool is untouched.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(rig.env.proxy.calls("CreateNetworkInterface"), creates + 1);
    let set = rig.set(NODE).await.unwrap();
    assert_eq!(set.spec.enis.len(), 3, "{:?}", set.spec.enis);
    assert!(set.spec.draining.is_empty(), "{:?}", set.spec.draining);

    // The agent serves it with its own groups: what its DRA driver
    // publishes as sg.enim.io attributes.
    wait_for(
        "the agent lists the claim's ENI",
        Duration::from_secs(20),
        || async {
            let enis = agent.list().await.map_err(|e| e.to_string())?;
            let e = enis
                .iter()
                .find(|e| e.id == made.id)
                .ok_or_else(|| "not yet".to_string())?;
            (e.placement.security_groups == [group.clone()])
                .then_some(())
                .ok_or(format!("{:?}", e.placement))
        },
    )
    .await;

    // The claim goes: its ENI is drained, released, detached, deleted.
    blocking(|| {
        rig.cp
            .kubectl(&["delete", "resourceclaim", "db", "-n", "default"])
    });
    let gone = Instant::now();
    wait_for(
        "the claim's ENI deleted in moto",
        Duration::from_secs(40),
        || async {
            let left = rig.env.all_enis().await;
            (!left.iter().any(|e| e.network_interface_id == made.id))
                .then_some(())
                .ok_or_else(|| "still there".to_string())
        },
    )
    .await;
    eprintln!(
        "claim deleted → its ENI deleted in moto: {:?}",
        gone.elapsed()
    );
    // moto's delete comes before the spec write that drops the ENI: wait
    // for that write, then hold the spec to the pool.
    let ids = wait_for(
        "the set's spec back to the pool's ENIs",
        Duration::from_secs(20),
        || async {
            let set = rig.set(NODE).await.ok_or("no NetResourceSet")?;
            let ids: BTreeSet<String> = set.spec.enis.iter().map(|e| e.id.clone()).collect();
            (!ids.contains(&made.id))
                .then_some(ids.clone())
                .ok_or(format!("still lists {}: {ids:?}", made.id))
        },
    )
    .await;
    assert_eq!(ids, pool, "the pool's ENIs stay");
    drop(agent);
}
