//! `[host_path] service_cidrs_from_api` against a real kube-apiserver and
//! kube-controller-manager, with the real `enimd` and plugin in sandbox
//! namespaces: a pod's host path routes the cluster's ServiceCIDR objects;
//! a range added or removed reaches the running pod, its record and the
//! next pod; a crash between the reroute and its record write is finished
//! by the next start; a start with the API server away serves the cached
//! set.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use enim_testkit::apiserver::ControlPlane;
use enim_testkit::fixtures::write_config;
use serde_json::Value;

/// The test API server's own range (`--service-cluster-ip-range`), which
/// it keeps as the ServiceCIDR `kubernetes`.
const DEFAULT_RANGE: &str = "10.96.0.0/16";
const ADDED: &str = "10.250.0.0/24";
const ADDED_DURING_CRASH: &str = "10.251.0.0/24";

fn eventually(agent: &Agent, what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !check() {
        assert!(
            Instant::now() < deadline,
            "not within {limit:?}: {what}\n{}",
            agent
                .log()
                .lines()
                .filter(|l| !l.starts_with("  "))
                .collect::<Vec<_>>()
                .join("\n")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// enimd in this namespace (it reaches the API server on loopback) with
/// the sandbox's ENIs in the sandbox's host netns, host paths following
/// the API's service CIDRs.
fn start_enimd(cp: &ControlPlane, sb: &Sandbox, dir: &Path) -> Agent {
    let extra = format!(
        "gc_grace = \"0s\"\n[host_path]\nservice_cidrs_from_api = true\nkubeconfig = {:?}\n",
        cp.admin_kubeconfig().display().to_string()
    );
    let paths = write_config(dir, Some(&sb.host.path()), &sb.enis, &extra);
    let mut agent = Agent::new(bins(), paths);
    agent.ready_timeout = Duration::from_secs(30);
    agent.restart();
    agent
}

fn add_range(cp: &ControlPlane, name: &str, cidr: &str) {
    cp.apply(&format!(
        "apiVersion: networking.k8s.io/v1\nkind: ServiceCIDR\nmetadata:\n  name: {name}\n\
         spec:\n  cidrs: [{cidr:?}]\n"
    ));
}

/// Whether `pod` routes `cidr` through its host path.
fn routes_via_host_path(pod: &NamedNetns, cidr: &str) -> bool {
    pod.ip(&["route", "show", cidr])
        .contains("via 169.254.1.1 dev eth0-host")
}

/// The host path routes c1's record holds, as the checkpoint file has it
/// (written through, so what a restart would find).
fn recorded_routes(agent: &Agent) -> Vec<String> {
    let text = std::fs::read_to_string(&agent.paths.checkpoint).unwrap();
    let file: Value = serde_json::from_str(&text).unwrap();
    let records = file["attachments"].as_array().unwrap();
    let record = records.iter().find(|r| r["container_id"] == "c1");
    let record = record.unwrap_or_else(|| panic!("no record of c1: {text}"));
    let routes = record["host_path"]["routes"].as_array();
    let routes = routes.unwrap_or_else(|| panic!("c1 has no host path: {record}"));
    routes
        .iter()
        .map(|r| r.as_str().unwrap().to_string())
        .collect()
}

fn result_routes(result: &Value) -> Vec<String> {
    result["routes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["dst"].as_str().unwrap().to_string())
        .collect()
}

/// An ADD result routes each of `has` and none of `lacks`.
fn assert_routes(result: &Value, has: &[&str], lacks: &[&str]) {
    let routes = result_routes(result);
    for cidr in has {
        assert!(
            routes.contains(&cidr.to_string()),
            "{cidr} not in {routes:?}"
        );
    }
    for cidr in lacks {
        assert!(!routes.contains(&cidr.to_string()), "{cidr} in {routes:?}");
    }
}

#[cfg_attr(
    not(feature = "fault-injection"),
    ignore = "needs the crash points: --features fault-injection (CI runs --all-features)"
)]
#[test]
fn host_paths_follow_the_clusters_service_cidrs() {
    require_kernel!();
    let Some(cp) = ControlPlane::start() else {
        return;
    };
    let mut cp = cp.with_controllers();
    let sb = Sandbox::new(2);
    let pod1 = NamedNetns::new("pod");
    let pod2 = NamedNetns::new("pod");
    let dir = tempfile::tempdir().unwrap();
    let mut agent = start_enimd(&cp, &sb, dir.path());

    // The API server's own range, listed at start.
    let (conf, result) = plugin_add_c1(&agent, &pod1);
    assert!(
        result_routes(&result).contains(&DEFAULT_RANGE.to_string()),
        "{result}"
    );
    assert!(routes_via_host_path(&pod1, DEFAULT_RANGE));
    assert!(!routes_via_host_path(&pod1, ADDED));

    // A range added to the cluster reaches the running pod and its record.
    add_range(&cp, "extra", ADDED);
    eventually(
        &agent,
        "the running pod routes the added range",
        Duration::from_secs(30),
        || routes_via_host_path(&pod1, ADDED),
    );
    eventually(
        &agent,
        "c1's record holds the added range",
        Duration::from_secs(5),
        || recorded_routes(&agent).contains(&ADDED.to_string()),
    );
    let mut check = conf.clone();
    check["prevResult"] = result.clone();
    enim("CHECK", "c1", Some(&pod1.path()), "eth0", &check).ok();

    // A crash after the pod was rerouted, before the record was written:
    // the next start refreshes again and writes it.
    agent.arm_crash("refresh:after-kernel");
    add_range(&cp, "during-crash", ADDED_DURING_CRASH);
    agent.recover_crash();
    assert!(agent
        .log()
        .contains("crash point refresh:after-kernel reached"));
    eventually(
        &agent,
        "the record catches up after the crash",
        Duration::from_secs(30),
        || recorded_routes(&agent).contains(&ADDED_DURING_CRASH.to_string()),
    );
    assert!(routes_via_host_path(&pod1, ADDED_DURING_CRASH));

    // A range deleted (the controller lets it go: no Service holds an
    // address in it) leaves the running pod.
    cp.kubectl(&["delete", "servicecidr", "extra", "--wait=false"]);
    eventually(
        &agent,
        "the deleted range leaves the running pod",
        Duration::from_secs(60),
        || !routes_via_host_path(&pod1, ADDED),
    );
    eventually(&agent, "and its record", Duration::from_secs(5), || {
        !recorded_routes(&agent).contains(&ADDED.to_string())
    });
    assert!(routes_via_host_path(&pod1, DEFAULT_RANGE));

    // The next pod gets the set as it is now.
    let result2 = enim("ADD", "c2", Some(&pod2.path()), "eth0", &conf).ok();
    assert_routes(&result2, &[DEFAULT_RANGE, ADDED_DURING_CRASH], &[ADDED]);

    // The API server away, enimd restarted: the next pod gets the last
    // set listed, from the cache beside the checkpoint.
    for (cid, pod) in [("c1", &pod1), ("c2", &pod2)] {
        enim("DEL", cid, Some(&pod.path()), "eth0", &conf).ok();
    }
    cp.stop_apiserver();
    agent.stop();
    agent.restart();
    let result3 = enim("ADD", "c3", Some(&pod1.path()), "eth0", &conf).ok();
    assert_routes(&result3, &[DEFAULT_RANGE, ADDED_DURING_CRASH], &[ADDED]);
    assert!(agent.log().contains("service CIDRs from the cache"));
    enim("DEL", "c3", Some(&pod1.path()), "eth0", &conf).ok();
    assert!(agent.attachments().is_empty());
    sb.assert_home(0);
    sb.assert_home(1);
}

/// Without the right to list ServiceCIDRs, an ADD is told "try again
/// later" with the API's answer, and nothing of it is left.
#[test]
fn an_add_waits_for_the_listing_and_says_why_it_cannot() {
    require_kernel!();
    let Some(cp) = ControlPlane::start() else {
        return;
    };
    let sb = Sandbox::new(1);
    let pod = NamedNetns::new("pod");
    let dir = tempfile::tempdir().unwrap();
    // An account with no rights at all.
    cp.kubectl(&["-n", "default", "create", "serviceaccount", "nobody"]);
    let token = cp.kubectl(&["-n", "default", "create", "token", "nobody"]);
    let kubeconfig = cp.token_kubeconfig("nobody", token.trim());
    let extra = format!(
        "[host_path]\nservice_cidrs_from_api = true\nkubeconfig = {:?}\n",
        kubeconfig.display().to_string()
    );
    let paths = write_config(dir.path(), Some(&sb.host.path()), &sb.enis, &extra);
    let mut agent = Agent::new(bins(), paths);
    agent.ready_timeout = Duration::from_secs(30);
    agent.restart();

    let conf = agent.net_conf("1.1.0");
    let why = enim("ADD", "c1", Some(&pod.path()), "eth0", &conf).err(11);
    assert!(why.contains("service CIDRs"), "{why}");
    assert!(why.contains("forbidden"), "{why}");
    assert!(agent.attachments().is_empty());
    sb.assert_home(0);
    assert!(pod.link("eth0").is_none());
}
