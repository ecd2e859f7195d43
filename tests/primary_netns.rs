//! Primary-ENI mode against the real kernel: veth ENIs in a sandbox host
//! namespace, pods in their own namespaces, a gateway namespace to ping.

mod common;

use std::collections::HashSet;

use common::*;
use enim::engine::EngineError;
use enim_api::MtuExpectation;
use enim_core::ProviderError;
use enim_provider::EniProvider;

/// The error of an ADD of c1 on eth0 into `netns` that must fail.
async fn c1_add_err(mgr: &PrimaryEngine, netns: &std::path::Path) -> EngineError {
    mgr.add(&owner("c1", "eth0"), netns).await.unwrap_err()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_configures_pod_and_del_returns_eni_home() {
    require_kernel!();
    let (sb, pod, _dir, mgr, provider) = primary_rig(1).await;
    let o = owner("c1", "eth0");

    let result = mgr.add(&o, &pod.path()).await.expect("ADD");
    assert_eq!(result.interface.name, "eth0");
    assert_eq!(result.interface.mtu, POD_MTU);
    assert_eq!(result.eni_id, "eni-0000");

    // The device is in the pod under ifname, with MTU, addresses, routes.
    let link = pod.link("eth0").expect("eth0 in pod");
    assert_eq!(link["address"], sb.enis[0].mac.to_string());
    assert_eq!(link["mtu"], POD_MTU);
    assert!(link["flags"].as_array().unwrap().iter().any(|f| f == "UP"));
    assert!(
        sb.host.link_by_mac(sb.enis[0].mac).is_none(),
        "ENI still in host"
    );
    let addrs = pod.addrs("eth0");
    assert!(addrs.contains(&"10.77.0.10/24".to_string()), "{addrs:?}");
    assert!(
        addrs.contains(&"fd00:e1:0::10/64".replace("0::", ":")),
        "{addrs:?}"
    );
    let global = pod
        .addr("eth0", "fd00:e1::10")
        .expect("global IPv6 address");
    assert_eq!(
        global["nodad"], true,
        "IPv6 address must be added with NODAD: {global}"
    );
    assert!(
        global.get("tentative").is_none(),
        "IPv6 address is tentative: {global}"
    );
    let routes4 = pod.ip(&["route", "show", "default"]);
    assert!(routes4.contains("via 10.77.0.1 dev eth0"), "{routes4}");
    let routes6 = pod.ip(&["-6", "route", "show", "default"]);
    assert!(
        routes6.contains("via fd00:e1:0::1 dev eth0".replace("0::", ":").as_str()),
        "{routes6}"
    );
    assert!(
        pod.exec_ok(&["ping", "-c", "1", "-W", "2", "10.77.0.1"]),
        "gateway does not answer IPv4 ping"
    );
    assert!(
        pod.exec_ok(&["ping", "-6", "-c", "1", "-W", "2", "fd00:e1::1"]),
        "gateway does not answer IPv6 ping"
    );

    // The checkpoint says Ready, and the provider says it is ours.
    let recs = mgr.attachments().await;
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].phase, enim_api::model::Phase::Ready);
    assert_eq!(recs[0].primary().unwrap().host_name, "eni0");
    assert_eq!(eni0_owner(&provider).await.as_deref(), Some("c1"));

    // CHECK passes against the kernel.
    mgr.check(&o, &pod.path(), MtuExpectation::Recorded)
        .await
        .expect("CHECK");

    mgr.del(&o).await.expect("DEL");
    sb.assert_home(0);
    assert!(pod.link("eth0").is_none());
    assert_unrecorded_and_free(&mgr, &provider).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_add_and_del_are_idempotent() {
    require_kernel!();
    let (sb, pod, _dir, mgr, provider) = primary_rig(2).await;
    let o = owner("c1", "eth0");
    let first = mgr.add(&o, &pod.path()).await.unwrap();
    let second = mgr.add(&o, &pod.path()).await.unwrap();
    assert_eq!(first, second);
    assert_eq!(mgr.attachments().await.len(), 1);
    let held = provider
        .list()
        .await
        .unwrap()
        .iter()
        .filter(|e| e.owner.is_some())
        .count();
    assert_eq!(held, 1, "a repeated ADD must not take a second ENI");
    mgr.del(&o).await.unwrap();
    mgr.del(&o).await.expect("second DEL succeeds");
    sb.assert_home(0);
    sb.assert_home(1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_del_leaves_new_owner_alone() {
    require_kernel!();
    let (sb, pod, _dir, mgr, provider) = primary_rig(1).await;
    let old = owner("old", "eth0");
    let new = owner("new", "eth0");
    mgr.add(&old, &pod.path()).await.unwrap();
    mgr.del(&old).await.unwrap();
    let r = mgr.add(&new, &pod.path()).await.unwrap();
    assert_eq!(r.eni_id, "eni-0000", "the single ENI is reused");
    // The runtime retries the old DEL late.
    mgr.del(&old).await.expect("stale DEL succeeds");
    assert!(
        pod.link("eth0").is_some(),
        "stale DEL moved the new owner's ENI"
    );
    assert_eq!(eni0_owner(&provider).await.as_deref(), Some("new"));
    mgr.check(&new, &pod.path(), MtuExpectation::Recorded)
        .await
        .expect("new owner's attachment intact");
    mgr.del(&new).await.unwrap();
    sb.assert_home(0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_concurrent_pods_then_exhaustion() {
    require_kernel!();
    let sb = Sandbox::new(16);
    let pods: Vec<NamedNetns> = (0..17).map(|_| NamedNetns::new("pod")).collect();
    let dir = tempfile::tempdir().unwrap();
    let (mgr, _provider) = manager(&sb, &dir.path().join("cp.json")).await;
    let mut tasks = Vec::new();
    for (i, pod) in pods.iter().take(16).enumerate() {
        let mgr = mgr.clone();
        let path = pod.path();
        tasks.push(tokio::spawn(async move {
            mgr.add(&owner(&format!("c{i}"), "eth0"), &path).await
        }));
    }
    let mut enis = HashSet::new();
    for t in tasks {
        let r = t.await.unwrap().expect("ADD");
        assert!(
            enis.insert(r.eni_id.clone()),
            "ENI {} handed out twice",
            r.eni_id
        );
    }
    assert_eq!(enis.len(), 16);
    for pod in pods.iter().take(16) {
        assert!(pod.link("eth0").is_some());
    }
    let err = mgr
        .add(&owner("c16", "eth0"), &pods[16].path())
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            EngineError::Provider(ProviderError::Exhausted { total: 16 })
        ),
        "{err}"
    );
    assert_eq!(mgr.attachments().await.len(), 16);
    let mut tasks = Vec::new();
    for i in 0..16 {
        let mgr = mgr.clone();
        tasks.push(tokio::spawn(async move {
            mgr.del(&owner(&format!("c{i}"), "eth0")).await
        }));
    }
    for t in tasks {
        t.await.unwrap().expect("DEL");
    }
    for i in 0..16 {
        sb.assert_home(i);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_netns_paths_are_clear_errors_and_leak_nothing() {
    require_kernel!();
    let sb = Sandbox::new(1);
    let dir = tempfile::tempdir().unwrap();
    let (mgr, provider) = manager(&sb, &dir.path().join("cp.json")).await;
    let file = dir.path().join("not-a-netns");
    std::fs::write(&file, "x").unwrap();
    let missing = dir.path().join("missing");
    for path in [&file, &missing, &dir.path().to_path_buf()] {
        let err = c1_add_err(&mgr, path).await;
        let msg = err.to_string();
        assert!(matches!(err, EngineError::Netns(_)), "{msg}");
        assert!(msg.contains(&path.display().to_string()), "{msg}");
        assert_eni0_free(&sb, &mgr, &provider).await;
    }
    // A mount namespace file is a namespace, but not a network one.
    let err = c1_add_err(&mgr, std::path::Path::new("/proc/self/ns/mnt")).await;
    assert!(err.to_string().contains("another kind"), "{err}");
    // The namespace free ENIs live in (host_netns) is the node's, not a
    // pod's. (The test process's own is refused too, but an ADD into the
    // machine's namespace is not one to try here: the real plugin and a
    // real enimd in a sandbox try it below.)
    let err = c1_add_err(&mgr, &sb.host.path()).await;
    assert!(matches!(err, EngineError::Netns(_)), "{err}");
    assert!(err.to_string().contains("host_netns"), "{err}");
    assert_eni0_free(&sb, &mgr, &provider).await;
}

/// The real plugin and a real enimd: an ADD whose CNI_NETNS is the node's
/// own namespace (enimd's, under any path, or `host_netns`) is refused
/// with CNI error 4 (CNI_NETNS is an invalid environment value, as a path
/// that is no netns is), and nothing is taken: the ENI stays free and
/// home, and no record is left.
#[test]
fn an_add_into_the_nodes_own_netns_is_refused() {
    require_kernel!();
    let refused = |agent: &Agent, sb: &Sandbox, netns: &std::path::Path, whose: &str| {
        let conf = agent.net_conf("1.1.0");
        let msg = enim("ADD", "c1", Some(netns), "eth0", &conf).err(4);
        assert!(msg.contains(&netns.display().to_string()), "{msg}");
        assert!(msg.contains("the node's network namespace"), "{msg}");
        assert!(msg.contains(whose), "{msg}");
        sb.assert_home(0);
        assert!(agent.attachments().is_empty(), "a record is left");
        let enis = agent.ctl(&["enis"]);
        assert_eq!(enis["enis"][0]["state"], "free", "{enis}");
    };

    // As on a node: enimd in the host namespace (the sandbox's), which
    // holds the free ENIs. Refused by its name, and by enimd's /proc path.
    let (sb, pod, _dir, agent) = agent_rig(1, "");
    refused(&agent, &sb, &sb.host.path(), "enimd's own");
    let own = std::path::PathBuf::from(format!("/proc/{}/ns/net", agent.pid()));
    refused(&agent, &sb, &own, "enimd's own");
    // The ENI is still there for a pod.
    let (conf, _) = plugin_add_c1(&agent, &pod);
    enim("DEL", "c1", Some(&pod.path()), "eth0", &conf).ok();
    sb.assert_home(0);
    drop(agent);

    // enimd in a namespace of its own, ENIs in host_netns: both refused.
    let sb = Sandbox::new(1);
    let agent_ns = NamedNetns::new("agent");
    let dir = tempfile::tempdir().unwrap();
    let paths =
        enim_testkit::fixtures::write_config(dir.path(), Some(&sb.host.path()), &sb.enis, "");
    let mut agent = Agent::new(bins(), paths);
    agent.netns = Some(agent_ns.name.clone());
    agent.restart();
    refused(&agent, &sb, &agent_ns.path(), "enimd's own");
    refused(&agent, &sb, &sb.host.path(), "host_netns");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_ifname_is_rejected_before_anything_moves() {
    require_kernel!();
    let (sb, pod, _dir, mgr, provider) = primary_rig(1).await;
    for bad in ["this-name-is-too-long", "a/b", "a b", ".."] {
        let err = mgr.add(&owner("c1", bad), &pod.path()).await.unwrap_err();
        assert!(
            matches!(err, EngineError::InvalidRequest(_)),
            "{bad}: {err}"
        );
        assert!(err.to_string().contains("interface name"), "{err}");
    }
    sb.assert_home(0);
    assert_eq!(eni0_owner(&provider).await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn existing_ifname_in_pod_is_a_conflict_and_eni_goes_home() {
    require_kernel!();
    let (sb, pod, _dir, mgr, provider) = primary_rig(1).await;
    pod.ip(&[
        "link", "add", "eth0", "type", "veth", "peer", "name", "other0",
    ]);
    let err = c1_add_err(&mgr, &pod.path()).await;
    assert!(matches!(err, EngineError::IfnameConflict { .. }), "{err}");
    assert!(err.to_string().contains("eth0"), "{err}");
    assert_eni0_free(&sb, &mgr, &provider).await;
}

/// The bad-input run that found it: ADD for (network, c1, eth0) into p1,
/// then the same key into p2 whose eth0 is taken. The second ADD must fail
/// without touching the live pod p1; once p1 is gone, it proceeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflicting_add_leaves_the_live_pod_alone() {
    require_kernel!();
    let (sb, p1, _dir, mgr, _provider) = primary_rig(2).await;
    let o = add_c1(&mgr, &p1).await;
    let before = (p1.link("eth0"), p1.addrs("eth0"), mgr.attachments().await);
    let p2 = NamedNetns::new("pod");
    p2.ip(&[
        "link", "add", "eth0", "type", "veth", "peer", "name", "other0",
    ]);
    let err = mgr.add(&o, &p2.path()).await.unwrap_err();
    assert!(
        matches!(err, EngineError::AttachmentConflict { .. }),
        "{err}"
    );
    let after = (p1.link("eth0"), p1.addrs("eth0"), mgr.attachments().await);
    assert_eq!(
        after, before,
        "the live pod's interface, addresses or record changed"
    );
    mgr.check(&o, &p1.path(), MtuExpectation::Recorded)
        .await
        .expect("the live pod still checks out");
    // p1 goes (its veth ENI dies with it); p2's own eth0 goes too: now the
    // ADD proceeds, and gets the other ENI.
    drop(p1);
    p2.ip(&["link", "del", "eth0"]);
    let r = mgr.add(&o, &p2.path()).await.unwrap();
    assert_eq!(r.eni_id, "eni-0001");
    assert_eq!(
        p2.link("eth0").unwrap()["address"],
        sb.enis[1].mac.to_string()
    );
    assert_eq!(mgr.attachments().await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn del_succeeds_after_netns_is_gone() {
    require_kernel!();
    let (_sb, pod, _dir, mgr, provider) = primary_rig(1).await;
    let o = add_c1(&mgr, &pod).await;
    drop(pod); // a veth ENI dies with its namespace
    mgr.del(&o).await.expect("DEL after netns is gone");
    assert_unrecorded_and_free(&mgr, &provider).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_restores_ownership_from_checkpoint() {
    require_kernel!();
    let sb = Sandbox::new(2);
    let pod = NamedNetns::new("pod");
    let dir = tempfile::tempdir().unwrap();
    let cp = dir.path().join("cp.json");
    let o = {
        let (mgr, _) = manager(&sb, &cp).await;
        let o = add_c1(&mgr, &pod).await;
        // A clean stop lands the outcome written behind (enimd does this
        // at shutdown; a crash instead is recovery's case, tested apart).
        mgr.checkpoint().flush().await.unwrap();
        o
    };
    let (mgr, provider) = manager(&sb, &cp).await;
    let report = mgr.recover().await.unwrap();
    assert_eq!(report.ready, 1);
    // The restored provider does not hand the held ENI to someone else.
    let other = NamedNetns::new("pod");
    let r = mgr.add(&owner("c2", "eth0"), &other.path()).await.unwrap();
    assert_eq!(r.eni_id, "eni-0001");
    assert_eq!(eni0_owner(&provider).await.as_deref(), Some("c1"));
    mgr.del(&o).await.unwrap();
    mgr.del(&owner("c2", "eth0")).await.unwrap();
    sb.assert_home(0);
    sb.assert_home(1);
}

/// Median in-process ADD and DEL times over 20 cycles, printed for the
/// record (run with --nocapture). Asserts only correctness.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_process_add_del_timing() {
    require_kernel!();
    let (sb, pod, _dir, mgr, _) = primary_rig(1).await;
    // The timed calls block this worker thread; the other drives the engine.
    tokio::task::block_in_place(|| {
        let rt = tokio::runtime::Handle::current();
        print_add_del_medians(
            "in-process",
            20,
            |cid| {
                rt.block_on(mgr.add(&owner(cid, "eth0"), &pod.path()))
                    .unwrap();
            },
            |cid| rt.block_on(mgr.del(&owner(cid, "eth0"))).unwrap(),
        );
    });
    sb.assert_home(0);
}
