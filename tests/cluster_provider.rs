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
            let secondary: Vec<String> = e
                .secondary_ipv4
                .iter()
                .map(|ip| ip.to_string())
                .chain(e.secondary_ipv6.iter().map(|ip| ip.to_string()))
                .collect();
            json!({
                "id": e.id,
                "mac": e.mac.to_string(),
                "ipv4": e.ipv4.to_string(),
                "gateway4": e.gateway4.to_string(),
                "ipv6": e.ipv6.map(|n| n.to_string()),
                "gateway6": e.gateway6.map(|g| g.to_string()),
                "mtu": e.mtu,
                "deviceIndex": e.device_index,
                "secondaryIps": secondary,
            })
        })
        .collect()
}

/// Writes the node's NetResourceSet under the operator's field manager.
fn operator_writes(cp: &ControlPlane, dir: &Path, mode: &str, enis: Value, draining: &[&str]) {
    let nrs = json!({
        "apiVersion": "enim.io/v1alpha1",
        "kind": "NetResourceSet",
        "metadata": { "name": NODE },
        "spec": {
            "instance": { "provider": "static", "id": "i-e2e" },
            "mode": mode,
            "watermarks": { "preAllocate": 0, "minAllocate": 0, "maxAboveWatermark": 0 },
            "enis": enis,
            "draining": draining,
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

/// A ready enimd with the cluster provider for [`NODE`], in this
/// namespace (it reaches the API server on loopback) with its ENIs in the
/// sandbox's host netns; `extra` goes into the top-level table.
fn start_enimd(cp: &ControlPlane, sb: &Sandbox, dir: &Path, extra: &str) -> Agent {
    let paths = AgentPaths::in_dir(dir);
    let config = format!(
        "socket = {socket:?}\ncheckpoint = {checkpoint:?}\nhost_netns = {netns:?}\n{extra}\n\
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
    agent
}

/// ADDs `cid` into `pod` until it succeeds (the spec comes over the
/// watch, GC frees a quarantined ENI: meanwhile "try again later").
fn add_eventually(pod: &NamedNetns, cid: &str, conf: &Value) -> Value {
    let mut result = None;
    eventually(
        &format!("ADD {cid} succeeds"),
        Duration::from_secs(20),
        || {
            result = enim("ADD", cid, Some(&pod.path()), "eth0", conf)
                .result("ADD")
                .ok()
                .flatten();
            result.is_some()
        },
    );
    result.unwrap()
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

/// Two ENIs in the spec (primary mode), two pods; ENI 1 is attached (in
/// the spec) but its device is not on the node (yet), as right after the
/// operator attached it: enimd quarantines it.
fn second_device_missing(cp: &ControlPlane, dir: &Path) -> (Sandbox, [NamedNetns; 2]) {
    let sb = Sandbox::new(2);
    sb.host.ip(&["link", "del", "eni1"]);
    let pods = [NamedNetns::new("pod"), NamedNetns::new("pod")];
    operator_writes(cp, dir, "primary", spec_enis(&sb), &[]);
    (sb, pods)
}

#[test]
fn enimd_serves_the_enis_of_its_netresourceset_and_reports_its_pods() {
    require_kernel!();
    let Some(cp) = control_plane_with_nrs_crd() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (sb, pods) = second_device_missing(&cp, dir.path());
    let extra = "gc_interval = \"1s\"\ngc_grace = \"0s\"";
    let mut agent = start_enimd(&cp, &sb, dir.path(), extra);
    let conf = agent.net_conf("1.1.0");

    let first = add_eventually(&pods[0], "c1", &conf);
    assert_eq!(first["interfaces"][0]["mac"], sb.enis[0].mac.to_string());
    assert_eq!(first["ips"][0]["address"], "10.77.0.10/24");
    // Up to three echoes: one lost reply on a loaded 2-core runner is not a failure.
    assert!(pods[0].exec_ok(&["ping", "-c", "3", "-i", "0.2", "-W", "2", "10.77.0.1"]));
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
    let second = add_eventually(&pods[1], "c2", &conf);
    assert_eq!(second["interfaces"][0]["mac"], sb.enis[1].mac.to_string());
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

/// Secondary mode: the addresses come from the spec (no cloud verb), the
/// status names the pod's address, and drained addresses are handed back
/// once no pod holds them, and never handed out again.
#[test]
fn enimd_in_secondary_mode_serves_spec_addresses_and_hands_back_drained_ones() {
    require_kernel!();
    let Some(cp) = control_plane_with_nrs_crd() else {
        return;
    };
    let mut sb = Sandbox::new(1);
    sb.enis = sb.enis_with_secondaries(&[2], false);
    let pods = [NamedNetns::new("pod"), NamedNetns::new("pod")];
    let dir = tempfile::tempdir().unwrap();
    operator_writes(&cp, dir.path(), "secondary", spec_enis(&sb), &[]);
    let extra = "mode = \"secondary\"\n[secondary]\ncooldown = \"0s\"";
    let mut agent = start_enimd(&cp, &sb, dir.path(), extra);
    let conf = agent.net_conf("1.1.0");

    let result = add_eventually(&pods[0], "c1", &conf);
    assert_eq!(result["ips"][0]["address"], "10.77.0.11/32");
    // Up to three echoes: one lost reply on a loaded 2-core runner is not a failure.
    assert!(pods[0].exec_ok(&["ping", "-c", "3", "-i", "0.2", "-W", "2", "10.77.0.1"]));
    eventually(
        "status.used names the pod's address",
        Duration::from_secs(10),
        || {
            let st = status(&cp);
            st["used"][0]["ip"] == "10.77.0.11"
                && st["used"][0]["podName"] == "pod-c1"
                && st["summary"]["available"] == 1
        },
    );

    // Both addresses drained: the free one is released at once, the held
    // one once its pod has gone; neither is handed out meanwhile.
    let both = ["10.77.0.11", "10.77.0.12"];
    operator_writes(&cp, dir.path(), "secondary", spec_enis(&sb), &both);
    eventually(
        "the free drained address is released",
        Duration::from_secs(10),
        || status(&cp)["released"] == json!(["10.77.0.12"]),
    );
    let msg = enim("ADD", "c2", Some(&pods[1].path()), "eth0", &conf).err(11);
    assert!(msg.contains("no free address"), "{msg}");
    enim("DEL", "c1", Some(&pods[0].path()), "eth0", &conf).ok();
    eventually(
        "the held one is released once its pod went",
        Duration::from_secs(10),
        || {
            let st = status(&cp);
            st["released"] == json!(both) && used(&st).is_empty()
        },
    );
    enim("ADD", "c2", Some(&pods[1].path()), "eth0", &conf).err(11);
    agent.stop();
}

/// Secondary mode with a cooldown: an address a pod gave back rests in
/// `status.cooling` (the operator counts it as not free) and leaves it
/// once rested; an ADD that finds only cooling addresses waits for the
/// cooldown to end (within `allocate_wait`) and is served, instead of
/// "try again later".
#[test]
fn enimd_reports_cooling_addresses_and_an_add_waits_out_a_short_cooldown() {
    require_kernel!();
    let Some(cp) = control_plane_with_nrs_crd() else {
        return;
    };
    let mut sb = Sandbox::new(1);
    sb.enis = sb.enis_with_secondaries(&[2], false);
    let pods = [
        NamedNetns::new("pod"),
        NamedNetns::new("pod"),
        NamedNetns::new("pod"),
    ];
    let dir = tempfile::tempdir().unwrap();
    operator_writes(&cp, dir.path(), "secondary", spec_enis(&sb), &[]);
    let extra = "mode = \"secondary\"\n[secondary]\ncooldown = \"3s\"";
    let mut agent = start_enimd(&cp, &sb, dir.path(), extra);
    let conf = agent.net_conf("1.1.0");

    let result = add_eventually(&pods[0], "c1", &conf);
    let first = result["ips"][0]["address"].as_str().unwrap().to_string();
    enim("DEL", "c1", Some(&pods[0].path()), "eth0", &conf).ok();
    let cooling = first.trim_end_matches("/32").to_string();
    eventually(
        "the freed address in status.cooling, not available",
        Duration::from_secs(10),
        || {
            let st = status(&cp);
            st["cooling"] == json!([cooling]) && st["summary"]["available"] == 1
        },
    );
    // The other address goes to c2; c3 finds only the cooling one, and is
    // served once it has rested.
    let second = enim("ADD", "c2", Some(&pods[1].path()), "eth0", &conf).ok();
    assert_ne!(second["ips"][0]["address"], first.as_str());
    let asked = std::time::Instant::now();
    let third = enim("ADD", "c3", Some(&pods[2].path()), "eth0", &conf).ok();
    assert_eq!(third["ips"][0]["address"], first.as_str());
    assert!(
        asked.elapsed() < Duration::from_secs(10),
        "{:?}",
        asked.elapsed()
    );
    eventually(
        "nothing cooling once rested and held again",
        Duration::from_secs(10),
        || {
            let st = status(&cp);
            st.get("cooling").is_none_or(|c| c == &json!([])) && used(&st).len() == 2
        },
    );
    agent.stop();
}

/// The events of `kind` `name` with `reason` in "default", as kubectl
/// lists them (events.k8s.io/v1).
fn events_about(cp: &ControlPlane, kind: &str, name: &str, reason: &str) -> Vec<Value> {
    let text = cp.kubectl(&["get", "events.events.k8s.io", "-n", "default", "-o", "json"]);
    let all: Value = serde_json::from_str(&text).unwrap();
    all["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| {
            e["reason"] == reason
                && e["regarding"]["kind"] == kind
                && e["regarding"]["name"] == name
        })
        .cloned()
        .collect()
}

/// `[events]` on: a quarantined ENI is told on the Node, a refused ADD on
/// its Pod with why, a storm of refusals makes one Event whose count stays
/// within the spam filter's burst, and with the API server down a refused
/// ADD is answered as fast as ever.
#[test]
fn enimd_tells_a_quarantine_on_the_node_and_a_refused_add_on_the_pod() {
    require_kernel!();
    let Some(mut cp) = control_plane_with_nrs_crd() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (sb, pods) = second_device_missing(&cp, dir.path());
    // enimd runs in this namespace: a port free here.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap();
    let extra = format!(
        "metrics_address = \"{addr}\"\n[events]\nenabled = true\nnode_name = {NODE:?}\nkubeconfig = {kc:?}\nquarantine_check = \"200ms\"",
        kc = cp.admin_kubeconfig().display().to_string(),
    );
    let mut agent = start_enimd(&cp, &sb, dir.path(), &extra);
    let conf = agent.net_conf("1.1.0");
    add_eventually(&pods[0], "c1", &conf);
    // The next pod is refused: eni-0001 is quarantined by now, either at
    // start-up (when the spec came before recovery) or by this very ADD
    // (when it came after: c1 then took eni-0000 and never tried eni-0001).
    let msg = enim("ADD", "c2", Some(&pods[1].path()), "eth0", &conf).err(11);
    assert!(msg.contains("no free ENI"), "{msg}");
    // The quarantine is told on the Node.
    let mut on_node = Vec::new();
    eventually(
        "an EniQuarantined event on the Node",
        Duration::from_secs(60),
        || {
            on_node = events_about(&cp, "Node", NODE, "EniQuarantined");
            !on_node.is_empty()
        },
    );
    assert_eq!(on_node[0]["type"], "Warning");
    assert_eq!(on_node[0]["reportingController"], "enimd");
    assert!(
        on_node[0]["note"].as_str().unwrap().contains("eni-0001"),
        "{on_node:?}"
    );

    // The refusal on the pod says why. Asked again now: the first refusal
    // may have come before the quarantine check saw eni-0001 (then it was
    // told as NoFreeEni).
    enim("ADD", "c2", Some(&pods[1].path()), "eth0", &conf).err(11);
    let mut on_pod = Vec::new();
    eventually(
        "an EniQuarantined event on the Pod",
        Duration::from_secs(60),
        || {
            on_pod = events_about(&cp, "Pod", "pod-c2", "EniQuarantined");
            !on_pod.is_empty()
        },
    );
    assert_eq!(on_pod[0]["regarding"]["uid"], "uid-c2");
    assert_eq!(on_pod[0]["regarding"]["namespace"], "default");
    assert!(
        on_pod[0]["note"]
            .as_str()
            .unwrap()
            .contains("1 of the node's ENIs are quarantined"),
        "{on_pod:?}"
    );

    // A storm: 40 more refusals of the same pod. One Event, its count
    // within the burst (25); the rest are held back.
    for _ in 0..40 {
        enim("ADD", "c2", Some(&pods[1].path()), "eth0", &conf).err(11);
    }
    let limited = "enim_events_total{outcome=\"rate_limited\"}";
    eventually(
        "refusals past the burst held back",
        Duration::from_secs(60),
        || {
            let (_, text) = http_get_in(Path::new("/proc/self/ns/net"), addr, "/metrics");
            metric(&text, limited) >= 16.0
        },
    );
    let storm = events_about(&cp, "Pod", "pod-c2", "EniQuarantined");
    assert_eq!(storm.len(), 1, "{storm:?}");
    let count = storm[0]["series"]["count"].as_u64().unwrap_or(1);
    assert!((2..=25).contains(&count), "series count {count}");

    // The API server goes: a refused ADD is answered as fast, its event
    // queued (and dropped or failed later), never awaited.
    cp.stop_apiserver();
    for _ in 0..5 {
        let started = Instant::now();
        enim("ADD", "c3", Some(&pods[1].path()), "eth0", &conf).err(11);
        let took = started.elapsed();
        assert!(took < Duration::from_secs(2), "a refused ADD took {took:?}");
    }
    agent.stop();
}
