//! The real `enimd` with `[provider] type = "cluster"` against a real
//! kube-apiserver: the ENIs come from the node's NetResourceSet (written
//! here as the operator would), an ADD through the plugin gets one, the
//! status names the pod, and an ENI whose device shows up after the spec
//! listed it becomes usable.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use enim_testkit::apiserver::ControlPlane;
use enim_testkit::fixtures::AgentPaths;
use serde_json::{json, Value};

const NODE: &str = "node-e2e";

/// The sandbox's ENIs as the operator lists them in the spec.
fn spec_enis(sb: &Sandbox) -> Value {
    sb.enis
        .iter()
        .map(|e| {
            json!({
                "id": e.id,
                "mac": e.mac.to_string(),
                "ipv4": e.ipv4.to_string(),
                "gateway4": e.gateway4.to_string(),
                "ipv6": e.ipv6.map(|n| n.to_string()),
                "gateway6": e.gateway6.map(|g| g.to_string()),
                "mtu": e.mtu,
            })
        })
        .collect()
}

/// Writes the node's NetResourceSet under the operator's field manager.
fn operator_writes(cp: &ControlPlane, dir: &Path, enis: Value) {
    let nrs = json!({
        "apiVersion": "enim.io/v1alpha1",
        "kind": "NetResourceSet",
        "metadata": { "name": NODE },
        "spec": {
            "instance": { "provider": "static", "id": "i-e2e" },
            "mode": "primary",
            "watermarks": { "preAllocate": 0, "minAllocate": 0, "maxAboveWatermark": 0 },
            "enis": enis,
        },
    });
    let file = dir.join("nrs.json");
    std::fs::write(&file, nrs.to_string()).unwrap();
    let path = file.display().to_string();
    cp.kubectl(&[
        "apply",
        "--server-side",
        "--force-conflicts",
        "--field-manager=enim-operator",
        "-f",
        &path,
    ]);
}

fn status(cp: &ControlPlane) -> Value {
    let text = cp.kubectl(&["get", "netresourceset", NODE, "-o", "json"]);
    serde_json::from_str::<Value>(&text).unwrap()["status"].clone()
}

fn eventually(what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !check() {
        assert!(Instant::now() < deadline, "not within {limit:?}: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `ns/name@eni` of each entry of `status.used`.
fn used(status: &Value) -> Vec<String> {
    let mut out: Vec<String> = status["used"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|u| {
            format!(
                "{}/{}@{}",
                u["podNamespace"].as_str().unwrap_or(""),
                u["podName"].as_str().unwrap_or(""),
                u["eni"].as_str().unwrap_or("")
            )
        })
        .collect();
    out.sort();
    out
}

#[test]
fn enimd_serves_the_enis_of_its_netresourceset_and_reports_its_pods() {
    require_kernel!();
    let Some(cp) = ControlPlane::start() else {
        return;
    };
    let crd = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/05-crd-netresourceset.yaml");
    cp.apply(&std::fs::read_to_string(crd).unwrap());
    cp.kubectl(&[
        "wait",
        "--for=condition=established",
        "--timeout=60s",
        "crd/netresourcesets.enim.io",
    ]);

    let sb = Sandbox::new(2);
    // ENI 1 is attached (in the spec) but its device is not on the node
    // yet, as right after the operator attached it.
    sb.host.ip(&["link", "del", "eni1"]);
    let pods = [NamedNetns::new("pod"), NamedNetns::new("pod")];
    let dir = tempfile::tempdir().unwrap();
    operator_writes(&cp, dir.path(), spec_enis(&sb));

    let paths = AgentPaths::in_dir(dir.path());
    let config = format!(
        "socket = {socket:?}\ncheckpoint = {checkpoint:?}\nhost_netns = {netns:?}\n\
         gc_interval = \"1s\"\ngc_grace = \"0s\"\n\
         [provider]\ntype = \"cluster\"\nnode_name = {NODE:?}\nkubeconfig = {kc:?}\n",
        socket = paths.socket.display().to_string(),
        checkpoint = paths.checkpoint.display().to_string(),
        netns = sb.host.path().display().to_string(),
        kc = cp.admin_kubeconfig().display().to_string(),
    );
    std::fs::write(&paths.config, config).unwrap();
    let mut agent = Agent::new(bins(), paths);
    agent.ready_timeout = Duration::from_secs(30);
    agent.restart();
    let conf = agent.net_conf("1.1.0");

    // The spec arrives over the watch; until then ADD says "try again".
    let mut first = None;
    eventually(
        "an ADD gets an ENI of the spec",
        Duration::from_secs(20),
        || {
            let out = enim("ADD", "c1", Some(&pods[0].path()), "eth0", &conf);
            first = out.result("ADD").ok().flatten();
            first.is_some()
        },
    );
    let first = first.unwrap();
    assert_eq!(first["interfaces"][0]["mac"], sb.enis[0].mac.to_string());
    assert_eq!(first["ips"][0]["address"], "10.77.0.10/24");
    assert!(pods[0].exec_ok(&["ping", "-c", "1", "-W", "2", "10.77.0.1"]));
    eventually("status.used names the pod", Duration::from_secs(10), || {
        used(&status(&cp)) == ["default/pod-c1@eni-0000"]
    });
    let st = status(&cp);
    assert_eq!(st["used"][0]["podUid"], "uid-c1");
    assert_eq!(st["used"][0]["containerId"], "c1");
    assert_eq!(st["conditions"][0]["status"], "True");

    // The second ENI's device is missing: quarantined, reported, and the
    // ADD is told to try again later.
    let msg = enim("ADD", "c2", Some(&pods[1].path()), "eth0", &conf).err(11);
    assert!(msg.contains("no free ENI"), "{msg}");
    eventually(
        "status.quarantined names eni-0001",
        Duration::from_secs(10),
        || status(&cp)["quarantined"][0]["eni"] == "eni-0001",
    );

    // Its device shows up: GC frees it and the next ADD gets it.
    sb.plug_eni(1);
    let mut second = None;
    eventually(
        "the late ENI is handed out",
        Duration::from_secs(15),
        || {
            second = enim("ADD", "c2", Some(&pods[1].path()), "eth0", &conf)
                .result("ADD")
                .ok()
                .flatten();
            second.is_some()
        },
    );
    assert_eq!(
        second.unwrap()["interfaces"][0]["mac"],
        sb.enis[1].mac.to_string()
    );
    eventually(
        "both pods in status, nothing quarantined",
        Duration::from_secs(10),
        || {
            let st = status(&cp);
            used(&st) == ["default/pod-c1@eni-0000", "default/pod-c2@eni-0001"]
                && st["quarantined"].is_null()
        },
    );

    enim("DEL", "c1", Some(&pods[0].path()), "eth0", &conf).ok();
    enim("DEL", "c2", Some(&pods[1].path()), "eth0", &conf).ok();
    eventually("no pod in status", Duration::from_secs(10), || {
        used(&status(&cp)).is_empty()
    });
    sb.assert_all_home();
    agent.stop();
}
