//! GC and crash recovery with real `enimd` processes: kill the agent at
//! every crash point of ADD and DEL, restart it, run one GC, and check that
//! nothing leaked; lost DELs; ENIs returned by a dying netns.
//! Needs the `fault-injection` feature (the README's test command has it).

mod common;

use common::*;
use enim::support::fault::{CRASH_POINTS, SECONDARY_CRASH_POINTS};

fn assert_all_home_and_unrecorded(sb: &Sandbox, agent: &Agent) {
    sb.assert_all_home();
    assert_eq!(agent.attachments(), Vec::<serde_json::Value>::new());
}

/// Two ENIs and an agent that collects at once, crashed at `point` in c1's
/// ADD or DEL and recovered; the no-leak invariant holds after it.
fn crashed_and_recovered_at(point: &str) -> ConfRig {
    let (sb, pod, dir, mut agent) = agent_rig(2, "gc_grace = \"0s\"");
    let conf = agent.net_conf("1.1.0");
    crash_c1_at(&mut agent, &pod, &conf, point);
    assert_invariant(&sb, &[&pod], &agent, &[], point);
    (sb, pod, dir, agent, conf)
}

/// For each crash point of the verb (`prefix` "add:" or "del:"): a rig
/// crashed there and recovered, then the runtime's retry (`retry`, which
/// for a DEL is the DEL below), then DEL brings both ENIs home, free.
fn after_each_crash_point(prefix: &str, retry: impl Fn(&str, &ConfRig)) {
    for point in CRASH_POINTS.iter().filter(|p| p.starts_with(prefix)) {
        let rig = crashed_and_recovered_at(point);
        retry(point, &rig);
        let (sb, pod, _dir, agent, conf) = &rig;
        enim("DEL", "c1", Some(&pod.path()), "eth0", conf).ok();
        assert_all_home_and_unrecorded(sb, agent);
        assert_eq!(agent.ctl(&["status"])["enis_free"], 2, "{point}");
    }
}

#[test]
fn crash_at_every_add_point_then_restart_and_gc() {
    require_kernel!();
    // The runtime retries the ADD: it succeeds.
    after_each_crash_point("add:", |point, (sb, pod, _dir, agent, conf)| {
        enim("ADD", "c1", Some(&pod.path()), "eth0", conf).ok();
        assert_invariant(sb, &[pod], agent, &[], &format!("{point}, retried ADD"));
    });
}

#[test]
fn crash_at_every_del_point_then_restart_and_gc() {
    require_kernel!();
    // The runtime retries the DEL: the helper's own.
    after_each_crash_point("del:", |_, _| {});
}

/// Secondary mode: the agent is killed at each of its ADD and DEL points,
/// restarted, and GC runs. Then the host holds exactly the live pods'
/// plumbing (nothing when the ADD was undone), the runtime's retry
/// succeeds, and after DEL the host is as before the first ADD.
#[test]
fn secondary_crash_at_every_point_then_restart_and_gc() {
    require_kernel!();
    let config = "mode = \"secondary\"\ngc_grace = \"0s\"\n[secondary]\ncooldown = \"0s\"";
    for point in SECONDARY_CRASH_POINTS {
        let mut sb = Sandbox::new(1);
        sb.enis = sb.enis_with_secondaries(&[2], false);
        let pod = NamedNetns::new("pod");
        let dir = tempfile::tempdir().unwrap();
        let mut agent = start_agent(&sb, dir.path(), config);
        let clean = sb.host_state();
        let conf = agent.net_conf("1.1.0");
        let pods = |agent: &Agent| {
            agent.ctl(&["attachments"])["attachments"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        };
        let reaches_gateway = || pod.exec_ok(&["ping", "-4", "-c", "1", "-W", "2", "10.77.0.1"]);
        let is_add = crash_c1_at(&mut agent, &pod, &conf, point);
        match pods(&agent).as_slice() {
            [] => assert_eq!(
                sb.host_state(),
                clean,
                "{point}: undone, yet plumbing is left"
            ),
            [p] => {
                assert_eq!(p["phase"], "ready", "{point}: {p}");
                assert!(reaches_gateway(), "{point}: the kept pod is cut off");
            }
            more => panic!("{point}: {more:?}"),
        }

        // The runtime retries: an ADD works, and the DEL leaves nothing.
        if is_add {
            enim("ADD", "c1", Some(&pod.path()), "eth0", &conf).ok();
            assert!(reaches_gateway(), "{point}: retried ADD");
        }
        enim("DEL", "c1", Some(&pod.path()), "eth0", &conf).ok();
        assert!(pods(&agent).is_empty(), "{point}");
        assert_eq!(sb.host_state(), clean, "{point}: DEL left plumbing");
        // Both addresses are free again: two more pods get one each.
        let others = [NamedNetns::new("pod"), NamedNetns::new("pod")];
        for (i, other) in others.iter().enumerate() {
            enim("ADD", &format!("o{i}"), Some(&other.path()), "eth0", &conf).ok();
        }
        for (i, other) in others.iter().enumerate() {
            enim("DEL", &format!("o{i}"), Some(&other.path()), "eth0", &conf).ok();
        }
    }
}

#[test]
fn lost_del_pod_netns_deleted() {
    require_kernel!();
    let TwoPods {
        sb,
        pods: [pod, keep],
        dir: _dir,
        agent,
        conf: _,
    } = two_pods();
    drop(pod); // the pod dies without DEL; its veth ENI dies with it
    let report = agent.ctl(&["gc"]);
    assert_eq!(
        report["collected"],
        serde_json::json!(["enim-e2e/c1/eth0"]),
        "{report}"
    );
    let attachments = agent.attachments();
    assert_eq!(attachments.len(), 1);
    assert_eq!(attachments[0]["container_id"], "c2");
    assert_eq!(agent.ctl(&["status"])["enis_free"], 1);
    assert_invariant(&sb, &[&keep], &agent, &[0], "after lost DEL");
}

#[test]
fn physical_eni_returned_as_dev_n_is_brought_home() {
    require_kernel!();
    let (sb, pod, _dir, mut agent, _conf) = with_c1(agent_rig(1, "gc_grace = \"0s\""));
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
    assert!(agent.attachments().is_empty());
    assert_eq!(agent.ctl(&["status"])["enis_free"], 1);
}

#[test]
fn free_eni_with_wrong_name_or_mtu_is_normalised() {
    require_kernel!();
    let sb = Sandbox::new(1);
    let dir = tempfile::tempdir().unwrap();
    let agent = start_agent(&sb, dir.path(), "gc_grace = \"0s\"");
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
    let (_sb, pod, _dir, agent, conf) = with_c1(agent_rig(1, "gc_grace = \"1h\""));
    let mut gc = conf.clone();
    gc["cni.dev/valid-attachments"] = serde_json::json!([]);
    enim("GC", "", None, "", &gc).ok();
    assert!(
        pod.link("eth0").is_some(),
        "a young attachment was collected"
    );
    assert_eq!(agent.ctl(&["gc"])["too_young"], 1);
}

#[test]
fn stale_netns_mounts_count_as_gone_and_gc_does_not_loop() {
    require_kernel!();
    let TwoPods {
        sb: _sb,
        pods: [plain, shadowed],
        dir,
        agent,
        conf: _,
    } = two_pods();
    // c1: the netns mount is gone and a plain file is left at the path.
    sh(&["umount", &plain.path().display().to_string()]);
    // c2: an empty file is bind-mounted over the netns path.
    let empty = dir.path().join("empty");
    std::fs::write(&empty, "").unwrap();
    sh(&[
        "mount",
        "--bind",
        &empty.display().to_string(),
        &shadowed.path().display().to_string(),
    ]);

    let report = agent.ctl(&["gc"]);
    let mut collected: Vec<String> = report["collected"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    collected.sort();
    assert_eq!(
        collected,
        vec!["enim-e2e/c1/eth0", "enim-e2e/c2/eth0"],
        "{report}"
    );
    assert_eq!(report["errors"], serde_json::json!([]), "{report}");
    // Nothing is left to retry: the next pass does nothing.
    let again = agent.ctl(&["gc"]);
    assert_eq!(again["collected"], serde_json::json!([]), "{again}");
    assert_eq!(again["errors"], serde_json::json!([]), "{again}");
    assert!(agent.attachments().is_empty());
    assert_eq!(agent.ctl(&["status"])["enis_free"], 2);
    sh(&["umount", &shadowed.path().display().to_string()]);
}

/// Execs the plugin's ADD and kills it 300 ms in, while the agent (held up
/// at a delay point) is still working on it: the result reaches nobody.
fn kill_plugin_mid_add(conf: &serde_json::Value, cid: &str, pod: &NamedNetns) {
    let mut child = spawn_add(
        std::process::Command::new(common::bins().enim),
        cid,
        &pod.path(),
        conf,
    );
    std::thread::sleep(std::time::Duration::from_millis(300));
    child.kill().unwrap();
    child.wait().unwrap();
}

/// Kills the plugin in the middle of an ADD: the agent finishes the ADD
/// (nothing half-built, nothing ripped out), keeps it for the runtime's
/// retry, and collects it once `allocation_expiry` passes unclaimed. In
/// secondary mode the records are `pods` and the stall is after the veth
/// is plumbed; in primary mode after the move.
fn unclaimed_add_is_kept_then_expires(secondary: bool) {
    let mut sb = Sandbox::new(2);
    let (mode, delay_at, records) = if secondary {
        sb.enis = sb.enis_with_secondaries(&[2, 0], false);
        (
            "mode = \"secondary\"\n[secondary]\ncooldown = \"0s\"",
            "add:after-configure=1000",
            "attachments",
        )
    } else {
        ("", "add:after-move=1000", "attachments")
    };
    let (retried, abandoned) = (NamedNetns::new("pod"), NamedNetns::new("pod"));
    let dir = tempfile::tempdir().unwrap();
    let mut agent = start_agent(
        &sb,
        dir.path(),
        &format!("allocation_expiry = \"2s\"\ngc_grace = \"1h\"\n{mode}"),
    );
    agent.stop();
    agent.env = vec![("ENIMD_DELAY_AT".into(), delay_at.into())];
    agent.restart();
    let conf = agent.net_conf("1.1.0");
    let record = |cid: &str| {
        agent.ctl(&["attachments"])[records]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .find(|a| a["container_id"] == cid)
    };
    // Each ADD finishes in the agent and is kept with an expiry (bounded
    // wait). One at a time: the stall holds a runtime worker, and a plugin
    // killed before its request was read has asked for nothing at all.
    for (cid, pod) in [("c1", &retried), ("c2", &abandoned)] {
        kill_plugin_mid_add(&conf, cid, pod);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
        while !record(cid).is_some_and(|a| a["phase"] == "ready" && a["expires_ms"].is_u64()) {
            assert!(
                std::time::Instant::now() < deadline,
                "{cid}: an unclaimed ADD was not kept with an expiry: {}",
                agent.ctl(&["attachments"])
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        assert!(
            pod.link("eth0").is_some(),
            "{cid}: the agent ripped out or never finished the ADD"
        );
    }
    // The runtime retries c1's ADD: same attachment, now claimed.
    let r = enim("ADD", "c1", Some(&retried.path()), "eth0", &conf).ok();
    assert_eq!(r["interfaces"][0]["name"], "eth0", "{r}");
    assert!(
        record("c1").unwrap()["expires_ms"].is_null(),
        "c1 not claimed"
    );
    std::thread::sleep(std::time::Duration::from_millis(2100));
    let report = agent.ctl(&["gc"]);
    assert_eq!(
        report["collected"],
        serde_json::json!(["enim-e2e/c2/eth0"]),
        "{report}"
    );
    assert!(
        retried.link("eth0").is_some(),
        "the claimed attachment was collected"
    );
    assert!(abandoned.link("eth0").is_none());
    assert!(record("c2").is_none());
    if !secondary {
        assert_invariant(&sb, &[&retried, &abandoned], &agent, &[], "after expiry");
    }
}

#[test]
fn plugin_killed_mid_add_is_kept_then_expires() {
    require_kernel!();
    unclaimed_add_is_kept_then_expires(false);
}

#[test]
fn secondary_plugin_killed_mid_add_is_kept_then_expires() {
    require_kernel!();
    unclaimed_add_is_kept_then_expires(true);
}

/// GC tears dead attachments down as one batch with DEL's crash points:
/// a crash at each, mid-batch (here in the startup reconcile), still ends
/// with nothing leaked once the agent is back.
#[test]
fn crash_at_every_point_of_a_batched_gc() {
    require_kernel!();
    for point in CRASH_POINTS
        .iter()
        .filter(|p| p.starts_with("del:") && **p != "del:after-move")
    {
        let (sb, pods, _dir, mut agent) = agent_rig_with_pods(3, "gc_grace = \"0s\"");
        add_each(&pods, &agent.net_conf("1.1.0"));
        agent.stop();
        // Two pods die together; their ENIs come back as physical ones do.
        let mut pods = pods.into_iter();
        drop((pods.next(), pods.next()));
        let keep = pods.next().unwrap();
        sb.plug_eni(0);
        sb.plug_eni(1);
        agent.env = crash_env(point);
        agent.spawn();
        agent.recover_crash();
        assert_invariant(&sb, &[&keep], &agent, &[], point);
        assert_eq!(agent.ctl(&["status"])["enis_free"], 2, "{point}");
    }
}

/// DEL's intent is written behind; should the agent die after the ENI came
/// home but before any write landed, the checkpoint still says Ready. The
/// restarted agent reads the kernel: the ENI is home, so the DEL happened,
/// and it finishes it. An attachment whose ENI is in its pod is kept.
#[test]
fn restart_finishes_a_del_whose_eni_is_home() {
    require_kernel!();
    let (sb, pod, _dir, mut agent) = agent_rig(2, "");
    let other = NamedNetns::new("pod");
    let conf = agent.net_conf("1.1.0");
    enim("ADD", "c1", Some(&pod.path()), "eth0", &conf).ok();
    enim("ADD", "c2", Some(&other.path()), "eth0", &conf).ok();
    agent.stop();
    // What a DEL killed right after its move leaves: the ENI home under its
    // host name and MTU, the record Ready.
    let mac = sb.enis[0].mac.to_string();
    let eth0 = pod.link("eth0").unwrap();
    assert_eq!(eth0["address"], mac.as_str());
    pod.ip(&["link", "set", "eth0", "netns", &sb.host.name]);
    sb.host
        .ip(&["link", "set", "eth0", "name", "eni0", "mtu", "1500"]);
    agent.restart();
    let left = agent.attachments();
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0]["container_id"], "c2");
    sb.assert_home(0);
    assert_eq!(agent.ctl(&["status"])["enis_free"], 1);
    assert!(
        agent.log().contains("finishing it"),
        "{}",
        agent.log_tail(20)
    );
    // The runtime's DEL retry is a no-op success; the live pod is intact.
    enim("DEL", "c1", Some(&pod.path()), "eth0", &conf).ok();
    assert_invariant(&sb, &[&pod, &other], &agent, &[], "after the finished DEL");
}
