//! An agent killed between two status writes (provider level): the
//! `cluster` provider runs in a child process (this test binary again)
//! that is aborted at the crash point `cluster:after-status-write`, after
//! its first write and after it went on changing who holds what (its
//! checkpoint, which the agent's engine keeps, says so; the status in the
//! API does not). A new provider restored from that checkpoint writes a
//! status that converges to it, and no pod's record is lost. Needs the
//! `fault-injection` build.
//!
//! Provider level rather than through enimd: the root crate's rig needs
//! network namespaces and a build of the whole agent; the status written
//! here is the same code's.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use enim_core::EniOwner;
use enim_crd::{EniSpec, Instance, Mode, NetResourceSet, NetResourceSetSpec, OPERATOR_MANAGER};
use enim_provider::EniProvider;
use enim_provider_cluster::{ClusterConfig, ClusterProvider, AFTER_STATUS_WRITE};
use enim_testkit::apiserver::ControlPlane;
use kube::api::{Patch, PatchParams};
use kube::Api;

const NODE: &str = "node-crash";
/// The child's role, and where its files are.
const CHILD_ENV: &str = "ENIM_STATUS_CRASH_CHILD";

fn eni(i: u8) -> EniSpec {
    EniSpec {
        id: format!("eni-{i}"),
        mac: format!("02:00:00:00:02:{i:02x}"),
        ipv4: format!("10.2.{i}.10/24"),
        gateway4: format!("10.2.{i}.1").parse().unwrap(),
        ipv6: None,
        gateway6: None,
        mtu: None,
        device_index: Some(u32::from(i)),
        subnet: "subnet-1".into(),
        secondary_ips: Vec::new(),
        security_groups: Vec::new(),
        claim: None,
        policy: None,
    }
}

use enim_testkit::fixtures::pod_owner as pod;

/// The agent's checkpoint as the engine keeps it: ENI id and owner,
/// written whole (temp file, rename) after every change.
fn save_checkpoint(path: &Path, held: &[(String, EniOwner)]) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec(held).unwrap()).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn load_checkpoint(path: &Path) -> Vec<(String, EniOwner)> {
    match std::fs::read(path) {
        Ok(b) => serde_json::from_slice(&b).unwrap(),
        Err(_) => Vec::new(),
    }
}

async fn eventually<F, Fut>(what: &str, limit: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let deadline = Instant::now() + limit;
    loop {
        match check().await {
            Ok(()) => return,
            Err(e) if Instant::now() >= deadline => panic!("not within {limit:?}: {what}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

async fn provider(kubeconfig: &Path, cache: &Path) -> ClusterProvider {
    let config = ClusterConfig {
        kubeconfig: Some(kubeconfig.to_path_buf()),
        cache: Some(cache.to_path_buf()),
        ..ClusterConfig::for_node(NODE)
    };
    ClusterProvider::start(&config, Mode::Primary)
        .await
        .unwrap()
}

/// The child: an agent that allocates for pods a and b, and once its
/// first status write is in (the writer then stalls at the crash point),
/// releases a and allocates for c: its checkpoint is then {b, c}, the
/// API's status still the first write's. It never returns: the crash
/// point aborts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the child of an_agent_killed_between_status_writes_..., run by it"]
async fn child_agent() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return;
    };
    let dir = PathBuf::from(dir);
    let checkpoint = dir.join("checkpoint.json");
    let p = provider(&dir.join("admin.kubeconfig"), &dir.join("cache.json")).await;
    p.restore(&load_checkpoint(&checkpoint)).await.unwrap();
    eventually("the spec", Duration::from_secs(20), || async {
        p.spec().map(|_| ()).ok_or("none".into())
    })
    .await;
    let mut held = Vec::new();
    for name in ["a", "b"] {
        let owner = pod(name);
        let e = p.allocate_next(&owner).await.unwrap();
        held.push((e.id, owner));
        save_checkpoint(&checkpoint, &held);
    }
    eventually(
        "the first status write",
        Duration::from_secs(20),
        || async { (p.status_writes() >= 1).then_some(()).ok_or("none".into()) },
    )
    .await;
    let a = pod("a");
    p.release(&a).await.unwrap();
    held.retain(|(_, o)| !o.same_attachment(&a));
    save_checkpoint(&checkpoint, &held);
    let c = pod("c");
    let e = p.allocate_next(&c).await.unwrap();
    held.push((e.id, c));
    save_checkpoint(&checkpoint, &held);
    std::fs::write(dir.join("child-done"), b"").unwrap();
    tokio::time::sleep(Duration::from_secs(60)).await;
    panic!("the crash point was never reached");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_killed_between_status_writes_restarts_to_its_checkpoints_truth() {
    let Some(cp) = tokio::task::block_in_place(ControlPlane::start) else {
        return;
    };
    tokio::task::block_in_place(|| {
        cp.apply_crd(&enim_crd::crd_yaml(), "crd/netresourcesets.enim.io");
    });
    let config = ClusterConfig {
        kubeconfig: Some(cp.admin_kubeconfig()),
        ..ClusterConfig::for_node("unused")
    };
    let api: Api<NetResourceSet> = Api::all(enim_provider_cluster::client(&config).await.unwrap());
    let spec = NetResourceSetSpec {
        instance: Instance {
            provider: "static".into(),
            id: "i-crash".into(),
            ..Default::default()
        },
        mode: Mode::Primary,
        enis: (1..=3).map(eni).collect(),
        ..Default::default()
    };
    api.patch(
        NODE,
        &PatchParams::apply(OPERATOR_MANAGER).force(),
        &Patch::Apply(&NetResourceSet::new(NODE, spec)),
    )
    .await
    .unwrap();

    let dir = cp.dir().join("status-crash");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(cp.admin_kubeconfig(), dir.join("admin.kubeconfig")).unwrap();
    let started = Instant::now();
    // The writer stalls 2 s after its first write, then aborts there: the
    // child's changes in those 2 s never reach the API.
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_agent", "--ignored", "--nocapture"])
        .env(CHILD_ENV, &dir)
        .env("ENIMD_CRASH_AT", AFTER_STATUS_WRITE)
        .env("ENIMD_DELAY_AT", format!("{AFTER_STATUS_WRITE}=2000"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        out.status.signal(),
        Some(6),
        "the child did not abort: {stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "crash point {AFTER_STATUS_WRITE} reached: aborting"
        )),
        "{stderr}"
    );
    assert!(
        dir.join("child-done").exists(),
        "the child aborted before its changes after the first write: {stderr}"
    );
    eprintln!("child ran and aborted in {:?}", started.elapsed());

    // The truth (the checkpoint) and what the API shows differ.
    let truth = load_checkpoint(&dir.join("checkpoint.json"));
    let want: BTreeMap<String, String> = truth
        .iter()
        .map(|(id, o)| (id.clone(), o.pod.name.clone()))
        .collect();
    assert_eq!(
        want.values().cloned().collect::<Vec<_>>().len(),
        2,
        "{want:?}"
    );
    assert!(want.values().any(|p| p == "b") && want.values().any(|p| p == "c"));
    let used = |st: Option<enim_crd::NetResourceSetStatus>| -> BTreeMap<String, String> {
        st.unwrap_or_default()
            .used
            .into_iter()
            .map(|u| (u.eni, u.pod_name))
            .collect()
    };
    let stale = used(api.get_status(NODE).await.unwrap().status);
    assert_ne!(stale, want, "the status caught up before the crash");
    assert!(!stale.values().any(|p| p == "c"), "{stale:?}");

    // The restart: the engine restores the checkpoint into a new provider.
    let restarted = Instant::now();
    let p = provider(&dir.join("admin.kubeconfig"), &dir.join("cache.json")).await;
    p.restore(&truth).await.unwrap();
    eventually(
        "the status shows the checkpoint's holders",
        Duration::from_secs(20),
        || async {
            let got = used(api.get_status(NODE).await.unwrap().status);
            (got == want).then_some(()).ok_or(format!("{got:?}"))
        },
    )
    .await;
    eprintln!("restart → status converged: {:?}", restarted.elapsed());
    // No pod's record lost: b and c keep theirs, a's is free again.
    for (id, owner) in &truth {
        assert_eq!(&p.allocate_next(owner).await.unwrap().id, id);
    }
    let listed: BTreeMap<String, String> = p
        .list()
        .await
        .unwrap()
        .into_iter()
        .filter_map(|e| e.owner.map(|o| (e.id, o.pod.name)))
        .collect();
    assert_eq!(listed, want);
    let d = p.allocate_next(&pod("d")).await.unwrap().id;
    assert!(!want.contains_key(&d), "{d} handed out twice");
    let st = api.get_status(NODE).await.unwrap().status.unwrap();
    assert_eq!(st.summary.enis, 3);
}
