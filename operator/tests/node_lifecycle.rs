//! The operator end to end, on a real API server and moto (see
//! common/mod.rs): a Node appears and gets its NetResourceSet and ENIs;
//! pods use them and the pool is topped back up; the surplus is drained
//! through the agent's handshake and deleted; a Node deleted loses its
//! ENIs after `node_grace`, and its set goes.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::*;
use enim_provider::EniProvider;
use enim_testkit::fixtures::pod_owner as pod;

const NODE: &str = "node-a";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_gets_its_set_and_enis_pods_use_them_and_the_surplus_is_drained() {
    let Some((_one, rig)) = slotted_rig(false).await else {
        return;
    };
    let instance = rig.env.instance_id.clone();
    let config = rig.config("op", TWO, "5m");
    let op = rig.operator(OperatorOpts::new("op-1", &config));

    let started = Instant::now();
    let uid = rig.node(NODE, &instance);
    let first = wait_for(
        "the new node's set with 2 ENIs",
        Duration::from_secs(30),
        || rig.converged(NODE, &instance, Some(2)),
    )
    .await;
    eprintln!(
        "node appeared → 2 ENIs attached and published: {:?}",
        started.elapsed()
    );
    rig.check_ownership(NODE, &uid).await;
    let set = rig.set(NODE).await.unwrap();
    let spec = &set.spec;
    assert_eq!(
        (
            spec.instance.provider.as_str(),
            spec.instance.id.as_str(),
            spec.instance.instance_type.as_str(),
            spec.instance.zone.as_str()
        ),
        ("aws", instance.as_str(), "m5.xlarge", ZONE)
    );
    assert_eq!(
        (spec.watermarks.pre_allocate, spec.watermarks.min_allocate),
        (1, 2)
    );
    assert_eq!(spec.subnets, std::slice::from_ref(&rig.env.subnet_id));
    assert_eq!(rig.env.proxy.calls("CreateNetworkInterface"), 2);

    // Pods use both: the agent hands them out and writes the status.
    let agent = rig.agent(NODE).await;
    wait_for(
        "the agent serves the spec",
        Duration::from_secs(20),
        || async {
            match agent.spec() {
                Some(s) if s.spec.enis.len() == 2 => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    let (p1, p2) = (pod("p1"), pod("p2"));
    let e1 = agent.allocate_next(&p1).await.unwrap().id;
    let e2 = agent.allocate_next(&p2).await.unwrap().id;
    let used: BTreeSet<String> = [e1.clone(), e2.clone()].into();
    assert_eq!(used, first.iter().cloned().collect::<BTreeSet<_>>());
    let t_used = Instant::now();
    wait_for(
        "status.used names both pods",
        Duration::from_secs(20),
        || async {
            let st = rig
                .set(NODE)
                .await
                .and_then(|s| s.status)
                .unwrap_or_default();
            let got: BTreeSet<String> = st.used.iter().map(|u| u.eni.clone()).collect();
            let pods: BTreeSet<&str> = st.used.iter().map(|u| u.pod_name.as_str()).collect();
            (got == used && pods == BTreeSet::from(["p1", "p2"]))
                .then_some(())
                .ok_or(format!("{:?}", st.used))
        },
    )
    .await;

    // No free one left: the operator tops the pool back up to one free.
    let three = wait_for(
        "a third ENI, attached and published",
        Duration::from_secs(30),
        || rig.converged(NODE, &instance, Some(3)),
    )
    .await;
    eprintln!(
        "pods used both → a third ENI published: {:?}",
        t_used.elapsed()
    );
    let e3: Vec<&String> = three.iter().filter(|id| !used.contains(*id)).collect();
    assert_eq!(e3.len(), 1, "{three:?}");
    let e3 = e3[0].clone();
    assert_eq!(rig.env.proxy.calls("CreateNetworkInterface"), 3);
    wait_for(
        "the agent serves the third",
        Duration::from_secs(20),
        || async {
            let n = agent.spec().map_or(0, |s| s.spec.enis.len());
            (n == 3).then_some(()).ok_or(format!("{n} ENIs"))
        },
    )
    .await;

    // The pods go: three free, one is the watermark, two the minimum: one
    // is drained, released by the agent, then detached and deleted.
    agent.release(&p1).await.unwrap();
    agent.release(&p2).await.unwrap();
    let t_release = Instant::now();
    let drained = wait_for(
        "one ENI in spec.draining",
        Duration::from_secs(20),
        || async {
            let spec = rig.set(NODE).await.unwrap().spec;
            match spec.draining.as_slice() {
                [one] => Ok(one.clone()),
                other => Err(format!("draining {other:?}")),
            }
        },
    )
    .await;
    // The last attached goes first: the top-up's.
    assert_eq!(drained, e3);
    let released = wait_for("the agent releases it", Duration::from_secs(20), || async {
        let set = rig.set(NODE).await.unwrap();
        let st = set.status.unwrap_or_default();
        if st.released.contains(&drained) {
            return Ok(true);
        }
        // The operator may already have taken it (and dropped the drain).
        let gone = !set.spec.enis.iter().any(|e| e.id == drained);
        gone.then_some(false)
            .ok_or(format!("released {:?}", st.released))
    })
    .await;
    let left = wait_for(
        "the drained ENI deleted, two left",
        Duration::from_secs(30),
        || rig.converged(NODE, &instance, Some(2)),
    )
    .await;
    eprintln!(
        "pods released → surplus drained and deleted: {:?} (release seen in status: {released})",
        t_release.elapsed()
    );
    assert!(!left.contains(&drained), "{left:?}");
    assert!(
        rig.env
            .all_enis()
            .await
            .iter()
            .all(|e| e.network_interface_id != drained),
        "{drained} still in moto"
    );
    assert_eq!(rig.env.proxy.calls("DeleteNetworkInterface"), 1);
    assert_eq!(rig.env.proxy.calls("CreateNetworkInterface"), 3);
    // It never drained an ENI a pod held.
    assert!(!used.contains(&drained));
    drop(agent);
    drop(op);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_node_loses_its_enis_after_the_grace_and_its_set_goes() {
    let Some((_one, rig)) = slotted_rig(true).await else {
        return;
    };
    let instance = rig.env.instance_id.clone();
    let grace = Duration::from_secs(4);
    let config = rig.config("op", TWO, "4s");
    let _op = rig.operator(OperatorOpts::new("op-1", &config));
    rig.node(NODE, &instance);
    let enis = wait_for("the node's 2 ENIs", Duration::from_secs(30), || {
        rig.converged(NODE, &instance, Some(2))
    })
    .await;

    blocking(|| rig.cp.kubectl(&["delete", "node", NODE, "--wait=false"]));
    let deleted = Instant::now();
    // The garbage collector follows the owner reference; the finalizer
    // holds the set.
    let since = wait_for(
        "the set marked deleted",
        Duration::from_secs(60),
        || async {
            let set = rig.set(NODE).await.ok_or("the set is gone already")?;
            set.metadata
                .deletion_timestamp
                .map(|t| t.0)
                .ok_or_else(|| "no deletionTimestamp yet".to_string())
        },
    )
    .await;
    let marked = Instant::now();
    eprintln!(
        "node deleted → set marked deleted (GC): {:?}",
        deleted.elapsed()
    );
    // Within the grace the ENIs stay (checked only while surely in it:
    // the timestamp has whole seconds).
    let in_grace = marked.elapsed() < grace - Duration::from_secs(2);
    if in_grace {
        let attached = rig.env.attached().await;
        for id in &enis {
            assert!(attached.contains_key(id), "{id} detached within the grace");
        }
    }

    // Poll moto and the API together: when did the ENIs leave moto?
    let enis_gone_at = std::cell::Cell::new(None);
    wait_for(
        "the ENIs deleted and the set gone",
        Duration::from_secs(60),
        || {
            let (rig, enis_gone_at) = (&rig, &enis_gone_at);
            async move {
                if enis_gone_at.get().is_none() && rig.cluster_enis().await.is_empty() {
                    enis_gone_at.set(Some(std::time::SystemTime::now()));
                }
                match rig.set(NODE).await {
                    None if enis_gone_at.get().is_some() => Ok(()),
                    None => Err("the set is gone, the ENIs not".into()),
                    Some(s) => Err(format!(
                        "still there: finalizers {:?}, {} ENIs",
                        s.metadata.finalizers,
                        s.spec.enis.len()
                    )),
                }
            }
        },
    )
    .await;
    eprintln!(
        "set marked deleted → ENIs released and set gone: {:?} (grace {grace:?}, checked attached within it: {in_grace})",
        marked.elapsed()
    );
    // Not before the grace, counted from the deletionTimestamp as the
    // operator counts it.
    let after_mark = enis_gone_at
        .get()
        .unwrap()
        .duration_since(std::time::SystemTime::from(since))
        .unwrap_or_default();
    assert!(
        after_mark >= grace,
        "ENIs deleted {after_mark:?} after the mark"
    );
    let left = rig.cluster_enis().await;
    assert!(
        left.is_empty(),
        "ENIs left in moto: {:?}",
        left.iter()
            .map(|e| &e.network_interface_id)
            .collect::<Vec<_>>()
    );
    assert_eq!(rig.env.proxy.calls("DeleteNetworkInterface"), 2);
    // Told on the set (gone since; its events stay) and on the Node.
    for kind in ["NetResourceSet", "Node"] {
        let e = wait_told(&rig, "default", kind, NODE, "NodeEnisReleased").await;
        assert_eq!(e.type_.as_deref(), Some("Normal"), "{e:?}");
    }
}
