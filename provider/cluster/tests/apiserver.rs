//! The cluster provider against a real etcd + kube-apiserver (testkit's
//! ControlPlane): the spec the operator writes is served, the status the
//! agent writes is what the operator reads, and the API server going away
//! costs no ADD or DEL.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use enim_core::{EniOwner, PodRef, ProviderError};
use enim_crd::{
    EniSpec, Instance, Mode, NetResourceSet, NetResourceSetSpec, NetResourceSetStatus, Watermarks,
    AGENT_MANAGER, OPERATOR_MANAGER,
};
use enim_provider::EniProvider;
use enim_provider_cluster::{ClusterConfig, ClusterProvider};
use enim_testkit::apiserver::ControlPlane;
use kube::api::{Patch, PatchParams};
use kube::Api;

/// Blocking control-plane steps, off the runtime's worker.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// A control plane with the CRD established, or `None` (skipped).
fn control_plane() -> Option<ControlPlane> {
    let cp = blocking(ControlPlane::start)?;
    blocking(|| cp.apply_crd(&enim_crd::crd_yaml(), "crd/netresourcesets.enim.io"));
    Some(cp)
}

async fn admin(cp: &ControlPlane) -> Api<NetResourceSet> {
    let config = ClusterConfig {
        kubeconfig: Some(cp.admin_kubeconfig()),
        ..ClusterConfig::for_node("unused")
    };
    Api::all(enim_provider_cluster::client(&config).await.unwrap())
}

fn eni(i: u8) -> EniSpec {
    EniSpec {
        id: format!("eni-{i}"),
        mac: format!("02:00:00:00:01:{i:02x}"),
        ipv4: format!("10.1.{i}.10/24"),
        gateway4: format!("10.1.{i}.1").parse().unwrap(),
        ipv6: None,
        gateway6: None,
        mtu: Some(1500),
        device_index: Some(u32::from(i)),
        subnet: "subnet-1".into(),
        secondary_ips: Vec::new(),
        security_groups: Vec::new(),
        claim: None,
        policy: None,
    }
}

fn spec(enis: &[u8], draining: &[&str]) -> NetResourceSetSpec {
    NetResourceSetSpec {
        instance: Instance {
            provider: "static".into(),
            id: "i-test".into(),
            ..Default::default()
        },
        mode: Mode::Primary,
        watermarks: Watermarks::default(),
        enis: enis.iter().map(|i| eni(*i)).collect(),
        draining: draining.iter().map(|d| d.to_string()).collect(),
        ..Default::default()
    }
}

/// Writes `node`'s spec as the operator does.
async fn operator_writes(api: &Api<NetResourceSet>, node: &str, spec: NetResourceSetSpec) {
    let nrs = NetResourceSet::new(node, spec);
    api.patch(
        node,
        &PatchParams::apply(OPERATOR_MANAGER).force(),
        &Patch::Apply(&nrs),
    )
    .await
    .unwrap_or_else(|e| panic!("operator's apply of {node}: {e}"));
}

async fn status(api: &Api<NetResourceSet>, node: &str) -> Option<NetResourceSetStatus> {
    api.get_status(node).await.ok()?.status
}

/// Polls `check` until it holds, for at most `limit`.
async fn eventually<F, Fut>(what: &str, limit: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while !check().await {
        assert!(Instant::now() < deadline, "not within {limit:?}: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn pod(cid: &str, name: &str) -> EniOwner {
    EniOwner {
        network: "k8s-pod-network".into(),
        container_id: cid.into(),
        ifname: "eth0".into(),
        pod: PodRef {
            namespace: "default".into(),
            name: name.into(),
            uid: Some(format!("uid-{name}")),
        },
    }
}

async fn provider(cp: &ControlPlane, node: &str, cache: &Path) -> ClusterProvider {
    let config = ClusterConfig {
        kubeconfig: Some(cp.admin_kubeconfig()),
        cache: Some(cache.to_path_buf()),
        ..ClusterConfig::for_node(node)
    };
    ClusterProvider::start(&config, Mode::Primary)
        .await
        .unwrap()
}

async fn wait_for_generation(p: &ClusterProvider, api: &Api<NetResourceSet>, node: &str) {
    let want = api.get(node).await.unwrap().metadata.generation;
    eventually(
        "the provider sees the operator's spec",
        Duration::from_secs(20),
        || async { p.spec().is_some_and(|s| s.generation == want) },
    )
    .await;
}

/// The pods `status.used` names, as `ns/name@eni`.
fn used(st: &Option<NetResourceSetStatus>) -> Vec<String> {
    let mut out: Vec<String> = st
        .iter()
        .flat_map(|s| &s.used)
        .map(|u| format!("{}/{}@{}", u.pod_namespace, u.pod_name, u.eni))
        .collect();
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_its_own_spec_writes_used_coalesced_and_hands_back_draining_enis() {
    let Some(cp) = control_plane() else { return };
    let dir = tempfile::tempdir().unwrap();
    let api = admin(&cp).await;
    operator_writes(&api, "node-a", spec(&[1, 2, 3], &[])).await;
    operator_writes(&api, "node-b", spec(&[7], &[])).await;

    let p = provider(&cp, "node-a", &dir.path().join("nrs.json")).await;
    wait_for_generation(&p, &api, "node-a").await;
    assert!(p.degraded().is_none(), "{:?}", p.degraded());
    let listed: Vec<String> = p.list().await.unwrap().into_iter().map(|e| e.id).collect();
    assert_eq!(listed, ["eni-1", "eni-2", "eni-3"], "node-a's ENIs only");

    let got = p.allocate_next(&pod("c1", "web")).await.unwrap();
    assert_eq!(got.id, "eni-1");
    eventually(
        "status.used names the pod",
        Duration::from_secs(10),
        || async { used(&status(&api, "node-a").await) == ["default/web@eni-1"] },
    )
    .await;
    let st = status(&api, "node-a").await.unwrap();
    let u = &st.used[0];
    assert_eq!(
        (
            u.pod_uid.as_str(),
            u.container_id.as_str(),
            u.ifname.as_str()
        ),
        ("uid-web", "c1", "eth0")
    );
    assert_eq!(
        (st.summary.enis, st.summary.used, st.summary.available),
        (3, 1, 2)
    );
    assert_eq!(
        st.observed_generation,
        api.get("node-a").await.unwrap().metadata.generation
    );
    assert!(st.last_sync.is_some());
    assert_eq!(st.conditions[0].type_, "Ready");
    assert_eq!(st.conditions[0].status, "True");

    // The status is the agent's field manager's, the spec the operator's.
    let obj = api.get("node-a").await.unwrap();
    let managers: Vec<(String, Option<String>)> = obj
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .map(|m| (m.manager.clone().unwrap_or_default(), m.subresource.clone()))
        .collect();
    assert!(
        managers.contains(&(AGENT_MANAGER.into(), Some("status".into()))),
        "{managers:?}"
    );
    assert!(
        managers.contains(&(OPERATOR_MANAGER.into(), None)),
        "{managers:?}"
    );

    // A burst of ADDs and DELs is a write or a few, not one each.
    let before = p.status_writes();
    for i in 0..2 {
        p.allocate_next(&pod(&format!("burst{i}"), &format!("b{i}")))
            .await
            .unwrap();
    }
    for i in 0..2 {
        p.release(&pod(&format!("burst{i}"), "")).await.unwrap();
    }
    p.allocate_next(&pod("c2", "db")).await.unwrap();
    eventually(
        "the burst's outcome is written",
        Duration::from_secs(10),
        || async {
            used(&status(&api, "node-a").await) == ["default/db@eni-2", "default/web@eni-1"]
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let writes = p.status_writes() - before;
    assert!((1..=3).contains(&writes), "5 changes made {writes} writes");

    // Another node's object is never read or written by this agent.
    let b = api.get("node-b").await.unwrap();
    assert!(b.status.is_none(), "{:?}", b.status);
    assert!(
        b.metadata
            .managed_fields
            .iter()
            .flatten()
            .all(|m| m.manager.as_deref() != Some(AGENT_MANAGER)),
        "node-b written by an agent"
    );

    // Draining: eni-1 is held (not released), eni-3 is free (released).
    operator_writes(&api, "node-a", spec(&[1, 2, 3], &["eni-1", "eni-3"])).await;
    wait_for_generation(&p, &api, "node-a").await;
    eventually(
        "the free draining ENI is released",
        Duration::from_secs(10),
        || async {
            status(&api, "node-a")
                .await
                .is_some_and(|s| s.released == ["eni-3"])
        },
    )
    .await;
    assert!(
        matches!(
            p.allocate_next(&pod("c3", "late")).await,
            Err(ProviderError::Exhausted { .. })
        ),
        "no draining ENI is handed out"
    );
    p.release(&pod("c1", "")).await.unwrap();
    eventually(
        "eni-1 is released once its pod went",
        Duration::from_secs(10),
        || async {
            status(&api, "node-a")
                .await
                .is_some_and(|s| s.released == ["eni-1", "eni-3"])
        },
    )
    .await;
}

/// What the provider serves while the API server is away, from memory
/// and from the cache after a restart, and what it writes when it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_server_going_away_costs_no_add_or_del_and_the_status_catches_up() {
    let Some(mut cp) = control_plane() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let cache: PathBuf = dir.path().join("nrs.json");
    let api = admin(&cp).await;
    operator_writes(&api, "node-c", spec(&[1, 2, 3], &[])).await;

    let p = provider(&cp, "node-c", &cache).await;
    wait_for_generation(&p, &api, "node-c").await;
    p.allocate_next(&pod("c1", "one")).await.unwrap();
    eventually("pod one in status", Duration::from_secs(10), || async {
        used(&status(&api, "node-c").await) == ["default/one@eni-1"]
    })
    .await;

    blocking(|| cp.stop_apiserver());
    // ADD and DEL are served from memory, at once.
    let t = Instant::now();
    assert_eq!(
        p.allocate_next(&pod("c2", "two")).await.unwrap().id,
        "eni-2"
    );
    p.release(&pod("c1", "")).await.unwrap();
    assert!(
        t.elapsed() < Duration::from_millis(500),
        "{:?}",
        t.elapsed()
    );
    eventually(
        "degraded says the API server is away",
        Duration::from_secs(15),
        || async {
            p.degraded()
                .is_some_and(|d| d.contains("API server unreachable"))
        },
    )
    .await;

    blocking(|| cp.start_apiserver());
    eventually("the status catches up", Duration::from_secs(30), || async {
        used(&status(&api, "node-c").await) == ["default/two@eni-2"]
    })
    .await;
    eventually("no longer degraded", Duration::from_secs(10), || async {
        p.degraded().is_none()
    })
    .await;

    // A restart while the API server is down serves from the cache.
    drop(p);
    blocking(|| cp.stop_apiserver());
    let p = provider(&cp, "node-c", &cache).await;
    assert_eq!(
        p.spec().map(|s| s.spec.enis.len()),
        Some(3),
        "served from the cache"
    );
    // The engine restores the checkpoint's assignments at start.
    p.restore(&[("eni-2".into(), pod("c2", "two"))])
        .await
        .unwrap();
    assert_eq!(
        p.allocate_next(&pod("c3", "three")).await.unwrap().id,
        "eni-1"
    );
    eventually(
        "degraded names the cache",
        Duration::from_secs(15),
        || async { p.degraded().is_some_and(|d| d.contains("nrs.json")) },
    )
    .await;
    blocking(|| cp.start_apiserver());
    eventually(
        "the restarted agent's status catches up",
        Duration::from_secs(30),
        || async {
            used(&status(&api, "node-c").await) == ["default/three@eni-1", "default/two@eni-2"]
        },
    )
    .await;

    // A corrupt cache is reported and ignored; the watch writes it again.
    drop(p);
    blocking(|| cp.stop_apiserver());
    std::fs::write(&cache, b"{ not json").unwrap();
    let p = provider(&cp, "node-c", &cache).await;
    let reported = p.cache_error().unwrap_or_default();
    assert!(
        reported.contains("corrupt") && reported.contains("nrs.json"),
        "{reported}"
    );
    let refused = p.allocate_next(&pod("c4", "four")).await.unwrap_err();
    assert!(refused.is_transient(), "{refused:?}");
    let msg = refused.to_string();
    assert!(
        msg.contains("no NetResourceSet for node \"node-c\"") && msg.contains("corrupt"),
        "{msg}"
    );
    blocking(|| cp.start_apiserver());
    eventually(
        "the watch refills the cache",
        Duration::from_secs(30),
        || async { p.spec().is_some() },
    )
    .await;
    assert_eq!(
        p.allocate_next(&pod("c4", "four")).await.unwrap().id,
        "eni-1"
    );
    let text = std::fs::read_to_string(&cache).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["node"], "node-c");
    assert_eq!(v["spec"]["enis"].as_array().map(Vec::len), Some(3));
}

/// Node `node` in secondary mode: the operator's spec of one ENI with
/// 10.1.1.11 and 10.1.1.12, and the agent's provider started on it (its
/// cache in `dir`) once it has applied it. Returns the provider and the
/// spec, for the test to write again.
async fn secondary_node(
    cp: &ControlPlane,
    api: &Api<NetResourceSet>,
    dir: &Path,
    node: &str,
) -> (ClusterProvider, NetResourceSetSpec) {
    let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
    let mut secondary = spec(&[1], &[]);
    secondary.mode = Mode::Secondary;
    secondary.enis[0].secondary_ips = vec![ip("10.1.1.11"), ip("10.1.1.12")];
    operator_writes(api, node, secondary.clone()).await;
    let config = ClusterConfig {
        kubeconfig: Some(cp.admin_kubeconfig()),
        cache: Some(dir.join("nrs.json")),
        ..ClusterConfig::for_node(node)
    };
    let p = ClusterProvider::start(&config, Mode::Secondary)
        .await
        .unwrap();
    wait_for_generation(&p, api, node).await;
    (p, secondary)
}

/// Secondary mode: the agent's store reports through the address feed (as
/// the secondary driver does); `used` names addresses, and a draining
/// address is released once the store has let it go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secondary_mode_reports_addresses_and_releases_drained_ones() {
    let Some(cp) = control_plane() else { return };
    let dir = tempfile::tempdir().unwrap();
    let api = admin(&cp).await;
    let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
    let (p, mut secondary) = secondary_node(&cp, &api, dir.path(), "node-s").await;
    let feed = p.address_feed().expect("secondary mode has a feed");
    let mut changes = feed.changes();
    let listed = p.list().await.unwrap();
    assert_eq!(listed[0].secondary_ips, [ip("10.1.1.11"), ip("10.1.1.12")]);
    feed.stored(enim_core::StoredAddresses {
        enis: vec!["eni-1".into()],
        addresses: vec![ip("10.1.1.11"), ip("10.1.1.12")],
        cooling: vec![],
    });
    feed.held("eni-1", &[ip("10.1.1.11")], &pod("c1", "web"));
    eventually(
        "status.used names the pod's address",
        Duration::from_secs(10),
        || async {
            status(&api, "node-s").await.is_some_and(|s| {
                s.used.len() == 1
                    && s.used[0].ip == Some(ip("10.1.1.11"))
                    && s.used[0].pod_name == "web"
                    && s.summary.available == 1
            })
        },
    )
    .await;

    // The operator wants 10.1.1.12 back: it is no longer listed (the feed
    // moves), and released once the store has dropped it.
    secondary.draining = vec!["10.1.1.12".into()];
    operator_writes(&api, "node-s", secondary).await;
    tokio::time::timeout(Duration::from_secs(20), changes.changed())
        .await
        .expect("the feed moves on a new spec")
        .unwrap();
    assert_eq!(p.list().await.unwrap()[0].secondary_ips, [ip("10.1.1.11")]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let st = status(&api, "node-s").await.unwrap();
    assert!(
        st.released.is_empty(),
        "still in the store: {:?}",
        st.released
    );
    feed.stored(enim_core::StoredAddresses {
        enis: vec!["eni-1".into()],
        addresses: vec![ip("10.1.1.11")],
        cooling: vec![],
    });
    eventually(
        "the drained address is released",
        Duration::from_secs(10),
        || async {
            status(&api, "node-s")
                .await
                .is_some_and(|s| s.released == ["10.1.1.12"])
        },
    )
    .await;
}

/// The CRD as an older release had it: `status.cooling` unknown.
fn crd_without_cooling() -> String {
    let crd = enim_crd::crd_yaml();
    let lines: Vec<&str> = crd.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.trim_start() == "cooling:")
        .expect("the CRD has status.cooling");
    let indent = |l: &str| l.len() - l.trim_start().len();
    let end = (at + 1..lines.len())
        .find(|&i| indent(lines[i]) <= indent(lines[at]))
        .unwrap_or(lines.len());
    let mut kept: Vec<&str> = lines[..at].to_vec();
    kept.extend(&lines[end..]);
    kept.join("\n")
}

/// An agent newer than the cluster's CRD (upgraded before it): the
/// status field the CRD does not know is dropped, and the rest of the
/// status is still written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_newer_than_the_crd_still_writes_its_status() {
    let Some(cp) = blocking(ControlPlane::start) else {
        return;
    };
    let old = crd_without_cooling();
    assert!(!old.contains("cooling:"));
    blocking(|| cp.apply_crd(&old, "crd/netresourcesets.enim.io"));
    let dir = tempfile::tempdir().unwrap();
    let api = admin(&cp).await;
    let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
    let (p, _) = secondary_node(&cp, &api, dir.path(), "node-o").await;
    let feed = p.address_feed().expect("secondary mode has a feed");
    feed.stored(enim_core::StoredAddresses {
        enis: vec!["eni-1".into()],
        addresses: vec![ip("10.1.1.11"), ip("10.1.1.12")],
        cooling: vec![ip("10.1.1.12")],
    });
    feed.held("eni-1", &[ip("10.1.1.11")], &pod("c1", "web"));
    eventually(
        "status.used written beside a field the CRD drops",
        Duration::from_secs(10),
        || async {
            status(&api, "node-o").await.is_some_and(|s| {
                s.used.len() == 1 && s.cooling.is_empty() && s.summary.available == 0
            })
        },
    )
    .await;
}
