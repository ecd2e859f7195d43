//! GC and crash recovery with real `enimd` processes: kill the agent at
//! every crash point of ADD and DEL, restart it, run one GC, and check that
//! nothing leaked; lost DELs; ENIs returned by a dying netns.
//! Needs the `fault-injection` feature (the README's test command has it).

mod common;

use common::agent::*;
use common::*;
use enim::fault::CRASH_POINTS;

macro_rules! require_kernel {
    () => {
        if !kernel_tests_enabled() {
            return;
        }
    };
}

/// Every ENI is either (a) in a live pod netns under the pod's ifname,
/// configured and recorded once, or (b) in the host under its host name
/// with its host MTU, free in the provider and in no record. No record
/// points at a missing ENI. ENIs in `destroyed` (veth stand-ins that died
/// with their netns) must be free and unrecorded, wherever they are not.
fn assert_invariant(
    sb: &Sandbox,
    pods: &[&NamedNetns],
    agent: &Agent,
    destroyed: &[usize],
    when: &str,
) {
    let enis = agent.ctl(&["enis"]);
    let attachments = agent.ctl(&["attachments"])["attachments"]
        .as_array()
        .unwrap()
        .clone();
    for (i, eni) in sb.enis.iter().enumerate() {
        let mac = eni.mac.to_string();
        let status = enis["enis"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["id"] == eni.id.as_str())
            .unwrap();
        let records: Vec<_> = attachments
            .iter()
            .filter(|a| a["mac"] == mac.as_str())
            .collect();
        if destroyed.contains(&i) {
            assert_eq!(
                status["state"], "free",
                "{when}: destroyed ENI {i} is still held: {status}"
            );
            assert!(
                records.is_empty(),
                "{when}: destroyed ENI {i} is still recorded: {records:?}"
            );
            continue;
        }
        if let Some(link) = sb.host.link_by_mac(eni.mac) {
            assert_eq!(
                link["ifname"],
                format!("eni{i}"),
                "{when}: ENI {i} home name"
            );
            assert_eq!(link["mtu"], HOST_MTU, "{when}: ENI {i} home MTU");
            assert_eq!(
                status["state"], "free",
                "{when}: ENI {i} is home but the provider holds it: {status}"
            );
            assert!(
                records.is_empty(),
                "{when}: ENI {i} is home but recorded: {records:?}"
            );
            continue;
        }
        let pod = pods
            .iter()
            .find(|p| p.link_by_mac(eni.mac).is_some())
            .unwrap_or_else(|| panic!("{when}: ENI {i} is neither home nor in a pod"));
        let link = pod.link_by_mac(eni.mac).unwrap();
        assert_eq!(link["ifname"], "eth0", "{when}: ENI {i} in pod");
        assert_eq!(link["mtu"], POD_MTU, "{when}: ENI {i} pod MTU");
        assert!(
            pod.addrs("eth0").contains(&format!("10.77.{i}.10/24")),
            "{when}: ENI {i} not configured"
        );
        assert!(
            pod.ip(&["route", "show", "default"])
                .contains(&format!("via 10.77.{i}.1")),
            "{when}: no default route"
        );
        assert_eq!(
            records.len(),
            1,
            "{when}: ENI {i} in a pod must be recorded once: {records:?}"
        );
        assert_eq!(records[0]["phase"], "ready", "{when}");
        assert_eq!(
            records[0]["netns"],
            pod.path().display().to_string(),
            "{when}"
        );
        assert_eq!(status["state"], "in_use", "{when}");
        assert_eq!(
            status["owner"]["container_id"], records[0]["container_id"],
            "{when}: two owners"
        );
    }
    for rec in &attachments {
        let mac: enim_provider::MacAddr = rec["mac"].as_str().unwrap().parse().unwrap();
        let held = pods.iter().any(|p| {
            p.path().display().to_string() == rec["netns"] && p.link_by_mac(mac).is_some()
        });
        assert!(held, "{when}: record points at a missing ENI: {rec}");
    }
}

fn crash_env(point: &str) -> Vec<(String, String)> {
    vec![("ENIMD_CRASH_AT".into(), point.into())]
}

#[test]
fn crash_at_every_add_point_then_restart_and_gc() {
    require_kernel!();
    for point in CRASH_POINTS.iter().filter(|p| p.starts_with("add:")) {
        let sb = Sandbox::new(2);
        let pod = NamedNetns::new("pod");
        let dir = tempfile::tempdir().unwrap();
        let mut agent = Agent::start(&sb, dir.path(), "gc_grace = \"0s\"");
        agent.stop();
        agent.env = crash_env(point);
        agent.restart();
        let conf = agent.net_conf("1.1.0");
        let out = enim("ADD", "c1", Some(&pod.path()), "eth0", &conf);
        out.err(11); // the agent died mid-request: try again later
        agent.wait_crashed();

        agent.env.clear();
        agent.restart();
        agent.ctl(&["gc"]);
        assert_invariant(&sb, &[&pod], &agent, &[], point);

        // The runtime retries the ADD: it succeeds, then DEL brings it home.
        enim("ADD", "c1", Some(&pod.path()), "eth0", &conf).ok();
        assert_invariant(&sb, &[&pod], &agent, &[], &format!("{point}, retried ADD"));
        enim("DEL", "c1", Some(&pod.path()), "eth0", &conf).ok();
        sb.assert_home(0);
        sb.assert_home(1);
        assert!(agent.ctl(&["attachments"])["attachments"]
            .as_array()
            .unwrap()
            .is_empty());
    }
}

#[test]
fn crash_at_every_del_point_then_restart_and_gc() {
    require_kernel!();
    for point in CRASH_POINTS.iter().filter(|p| p.starts_with("del:")) {
        let sb = Sandbox::new(2);
        let pod = NamedNetns::new("pod");
        let dir = tempfile::tempdir().unwrap();
        let mut agent = Agent::start(&sb, dir.path(), "gc_grace = \"0s\"");
        let conf = agent.net_conf("1.1.0");
        enim("ADD", "c1", Some(&pod.path()), "eth0", &conf).ok();
        agent.stop();
        agent.env = crash_env(point);
        agent.restart();
        enim("DEL", "c1", Some(&pod.path()), "eth0", &conf).err(11);
        agent.wait_crashed();

        agent.env.clear();
        agent.restart();
        agent.ctl(&["gc"]);
        assert_invariant(&sb, &[&pod], &agent, &[], point);
        // The runtime retries the DEL.
        enim("DEL", "c1", Some(&pod.path()), "eth0", &conf).ok();
        sb.assert_home(0);
        sb.assert_home(1);
        assert!(agent.ctl(&["attachments"])["attachments"]
            .as_array()
            .unwrap()
            .is_empty());
        assert_eq!(agent.ctl(&["status"])["enis_free"], 2, "{point}");
    }
}

#[test]
fn lost_del_pod_netns_deleted() {
    require_kernel!();
    let sb = Sandbox::new(2);
    let pod = NamedNetns::new("pod");
    let keep = NamedNetns::new("pod");
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(&sb, dir.path(), "gc_grace = \"0s\"");
    let conf = agent.net_conf("1.1.0");
    enim("ADD", "c1", Some(&pod.path()), "eth0", &conf).ok();
    enim("ADD", "c2", Some(&keep.path()), "eth0", &conf).ok();
    drop(pod); // the pod dies without DEL; its veth ENI dies with it
    let report = agent.ctl(&["gc"]);
    assert_eq!(
        report["collected"],
        serde_json::json!(["enim-e2e/c1/eth0"]),
        "{report}"
    );
    let attachments = agent.ctl(&["attachments"])["attachments"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(attachments.len(), 1);
    assert_eq!(attachments[0]["container_id"], "c2");
    assert_eq!(agent.ctl(&["status"])["enis_free"], 1);
    assert_invariant(&sb, &[&keep], &agent, &[0], "after lost DEL");
}

#[test]
fn physical_eni_returned_as_dev_n_is_brought_home() {
    require_kernel!();
    let sb = Sandbox::new(1);
    let pod = NamedNetns::new("pod");
    let dir = tempfile::tempdir().unwrap();
    let mut agent = Agent::start(&sb, dir.path(), "gc_grace = \"0s\"");
    let conf = agent.net_conf("1.1.0");
    enim("ADD", "c1", Some(&pod.path()), "eth0", &conf).ok();
    agent.stop();
    // What the kernel does with a physical ENI when its netns dies: it comes
    // back to the initial namespace as dev<N> (veths would be destroyed, so
    // the test moves it by hand), with the pod's MTU.
    pod.ip(&[
        "link",
        "set",
        "eth0",
        "netns",
        &sb.host.name,
        "name",
        "dev77",
    ]);
    drop(pod);
    agent.restart(); // startup reconcile runs GC before serving
    sb.assert_home(0);
    assert!(agent.ctl(&["attachments"])["attachments"]
        .as_array()
        .unwrap()
        .is_empty());
    assert_eq!(agent.ctl(&["status"])["enis_free"], 1);
}

#[test]
fn free_eni_with_wrong_name_or_mtu_is_normalised() {
    require_kernel!();
    let sb = Sandbox::new(1);
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(&sb, dir.path(), "gc_grace = \"0s\"");
    // First sight recorded eni0 / 1500 as home; now someone renames it.
    sb.host
        .ip(&["link", "set", "eni0", "name", "dev5", "mtu", "1400"]);
    let report = agent.ctl(&["gc"]);
    assert_eq!(
        report["normalised"],
        serde_json::json!(["eni-0000"]),
        "{report}"
    );
    sb.assert_home(0);
}

#[test]
fn young_attachments_survive_gc_grace() {
    require_kernel!();
    let sb = Sandbox::new(1);
    let pod = NamedNetns::new("pod");
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(&sb, dir.path(), "gc_grace = \"1h\"");
    let conf = agent.net_conf("1.1.0");
    enim("ADD", "c1", Some(&pod.path()), "eth0", &conf).ok();
    let mut gc = conf.clone();
    gc["cni.dev/valid-attachments"] = serde_json::json!([]);
    enim("GC", "", None, "", &gc).ok();
    assert!(
        pod.link("eth0").is_some(),
        "a young attachment was collected"
    );
    assert_eq!(agent.ctl(&["gc"])["too_young"], 1);
}
