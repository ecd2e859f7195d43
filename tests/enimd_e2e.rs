//! End to end: a real `enimd` in a sandbox host namespace and the real
//! `enim` plugin exec'd as a runtime does, for every verb; chaining with the
//! reference `tuning` plugin; restart; caller credentials.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;

#[test]
fn add_check_del_del() {
    require_kernel!();
    let (sb, pod, _dir, agent) = agent_rig(1, "");
    let (conf, result) = plugin_add_c1(&agent, &pod);
    assert_eq!(result["cniVersion"], "1.1.0");
    let iface = &result["interfaces"][0];
    assert_eq!(iface["name"], "eth0");
    assert_eq!(iface["mac"], sb.enis[0].mac.to_string());
    assert_eq!(iface["mtu"], POD_MTU);
    assert_eq!(iface["sandbox"], pod.path().display().to_string());
    assert_eq!(result["ips"][0]["address"], "10.77.0.10/24");
    assert_eq!(result["ips"][0]["gateway"], "10.77.0.1");
    assert_eq!(result["ips"][0]["interface"], 0);
    assert!(result["routes"]
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["dst"] == "0.0.0.0/0" && r["gw"] == "10.77.0.1"));
    assert!(pod.exec_ok(&["ping", "-c", "1", "-W", "2", "10.77.0.1"]));

    let mut check_conf = conf.clone();
    check_conf["prevResult"] = result.clone();
    enim("CHECK", "c1", Some(&pod.path()), "eth0", &check_conf).ok();

    // CHECK notices drift in the kernel.
    pod.ip(&["addr", "del", "10.77.0.10/24", "dev", "eth0"]);
    let msg = enim("CHECK", "c1", Some(&pod.path()), "eth0", &check_conf).err(103);
    assert!(msg.contains("10.77.0.10"), "{msg}");

    enim("DEL", "c1", Some(&pod.path()), "eth0", &check_conf).ok();
    sb.assert_home(0);
    enim("DEL", "c1", Some(&pod.path()), "eth0", &check_conf).ok();
    // DEL without a netns (runtime lost it) also succeeds.
    enim("DEL", "c1", None, "eth0", &conf).ok();
    sb.assert_home(0);
}

#[test]
fn results_follow_the_requested_version() {
    require_kernel!();
    let (_sb, pod, _dir, agent) = agent_rig(1, "");
    for version in ["0.4.0", "1.0.0", "1.1.0"] {
        let conf = agent.net_conf(version);
        let r = enim("ADD", "c1", Some(&pod.path()), "eth0", &conf).ok();
        assert_eq!(r["cniVersion"], version);
        assert_eq!(
            r["interfaces"][0]["mtu"].is_null(),
            version != "1.1.0",
            "{version}: {r}"
        );
        if version == "0.4.0" {
            assert_eq!(r["ips"][0]["version"], "4", "{r}");
        }
        enim("DEL", "c1", Some(&pod.path()), "eth0", &conf).ok();
    }
}

#[test]
fn gc_with_valid_list_releases_exactly_the_omitted_pod() {
    require_kernel!();
    let (sb, pods, _dir, agent) = agent_rig_with_pods(3, "gc_grace = \"0s\"");
    let conf = agent.net_conf("1.1.0");
    let eni_of: Vec<String> = add_each(&pods, &conf)
        .iter()
        .map(|r| r["interfaces"][0]["mac"].as_str().unwrap().to_string())
        .collect();
    let mut gc_conf = conf.clone();
    gc_conf["cni.dev/valid-attachments"] = serde_json::json!([
        {"containerID": "c0", "ifname": "eth0"},
        {"containerID": "c2", "ifname": "eth0"},
    ]);
    enim("GC", "", None, "", &gc_conf).ok();
    assert!(pods[0].link("eth0").is_some(), "c0 must keep its ENI");
    assert!(pods[2].link("eth0").is_some(), "c2 must keep its ENI");
    assert!(pods[1].link("eth0").is_none(), "c1's ENI must be collected");
    let home = sb
        .enis
        .iter()
        .position(|e| e.mac.to_string() == eni_of[1])
        .unwrap();
    sb.assert_home(home);
    // The collected ENI is free again.
    let extra = NamedNetns::new("pod");
    let r = enim("ADD", "c9", Some(&extra.path()), "eth0", &conf).ok();
    assert_eq!(r["interfaces"][0]["mac"], eni_of[1]);
}

#[test]
fn status_calls_a_full_node_and_an_agent_away_available() {
    require_kernel!();
    let (_sb, pod, _dir, mut agent) = agent_rig(1, "");
    let conf = agent.net_conf("1.1.0");
    enim("STATUS", "", None, "", &conf).ok();
    enim("ADD", "c1", Some(&pod.path()), "eth0", &conf).ok();
    // Full, not broken: STATUS stays available (a failed STATUS would make
    // the kubelet call the node NotReady).
    enim("STATUS", "", None, "", &conf).ok();
    // An ADD while exhausted is "try again later".
    let other = NamedNetns::new("pod");
    enim("ADD", "c2", Some(&other.path()), "eth0", &conf).err(11);
    // enimd away (stopped, killed): the network it judged is still there,
    // from the note it left; its ADDs wait for it, bounded.
    agent.stop();
    enim("STATUS", "", None, "", &conf).ok();
    agent.restart();
    agent.kill9();
    enim("STATUS", "", None, "", &conf).ok();
    let mut short = conf.clone();
    short["agentWaitSeconds"] = 1.into();
    let start = std::time::Instant::now();
    let msg = enim("ADD", "c2", Some(&other.path()), "eth0", &short).err(11);
    assert!(msg.contains("waited 1s"), "{msg}");
    assert!(start.elapsed() >= Duration::from_secs(1));
}

/// An ADD sent while enimd restarts waits for the new enimd and gets its
/// ENI from it: the restart costs the pod the restart, not a failed
/// sandbox and the runtime's retry 10 s later.
#[test]
fn add_waits_for_a_restarting_agent() {
    require_kernel!();
    let (sb, pod, _dir, mut agent) = agent_rig(1, "");
    let conf = agent.net_conf("1.1.0");
    agent.kill9();
    let away = Duration::from_millis(1500);
    let start = std::time::Instant::now();
    let result = std::thread::scope(|s| {
        let add = s.spawn(|| enim("ADD", "c1", Some(&pod.path()), "eth0", &conf).ok());
        std::thread::sleep(away);
        agent.restart();
        add.join().unwrap()
    });
    assert!(start.elapsed() >= away, "{:?}", start.elapsed());
    assert_eq!(result["interfaces"][0]["mac"], sb.enis[0].mac.to_string());
    enim("DEL", "c1", Some(&pod.path()), "eth0", &conf).ok();
    sb.assert_home(0);
}

/// A node that really cannot serve says so: every ENI quarantined (its
/// device gone) is "not available" (50), from enimd and, while enimd is
/// away, from its note; the device back, it is available again.
#[test]
fn every_eni_quarantined_is_not_available_even_while_the_agent_is_away() {
    require_kernel!();
    let (sb, pod, _dir, mut agent) = agent_rig(1, "");
    let conf = agent.net_conf("1.1.0");
    enim("STATUS", "", None, "", &conf).ok();
    sb.host.ip(&["link", "del", "eni0"]);
    // The ADD that finds the device gone quarantines it.
    enim("ADD", "c1", Some(&pod.path()), "eth0", &conf).err(11);
    let msg = enim("STATUS", "", None, "", &conf).err(50);
    assert!(msg.contains("quarantined"), "{msg}");
    // enimd's note follows its judgement within a second.
    let note = enim_api::note::note_path(agent.socket());
    let unavailable = || {
        enim_api::note::read_note(&note)
            .ok()
            .flatten()
            .is_some_and(|n| n.serving != enim_api::Serving::Available)
    };
    let start = std::time::Instant::now();
    while !unavailable() {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the note never said so"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    agent.kill9();
    let msg = enim("STATUS", "", None, "", &conf).err(50);
    assert!(
        msg.contains("quarantined") && msg.contains("as enimd judged it"),
        "{msg}"
    );
    sb.plug_eni(0);
    agent.restart();
    agent.ctl(&["gc"]);
    enim("STATUS", "", None, "", &conf).ok();
}

/// An enimd that cannot even read its config (a crash loop on a bad
/// ConfigMap) still renews the note of this boot at every start, so the
/// kubelet's restarts keep STATUS answering for the node.
#[test]
fn a_crash_loop_on_a_broken_config_renews_the_note() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("enimd.sock");
    let path = enim_api::note::note_path(&socket);
    let old = enim_api::note::StatusNote {
        boot_id: enim_api::note::boot_id().unwrap(),
        alive_ms: 0,
        away_bound_secs: 600,
        serving: enim_api::Serving::Available,
        pid: 1,
    };
    std::fs::write(&path, serde_json::to_vec(&old).unwrap()).unwrap();
    let out = std::process::Command::new(&bins().enimd)
        .arg("--config")
        .arg(dir.path().join("missing.toml"))
        .arg("--socket")
        .arg(&socket)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let renewed = enim_api::note::read_note(&path).unwrap().unwrap();
    let now = enim_api::note::boot_clock_ms().unwrap();
    assert!(now - renewed.alive_ms < 5_000, "{renewed:?} at {now}");
    assert_eq!(
        (renewed.serving, renewed.away_bound_secs),
        (enim_api::Serving::Available, 600)
    );
}

#[test]
fn chain_with_reference_tuning_plugin() {
    require_kernel!();
    let tuning = Path::new("/usr/lib/cni/tuning");
    assert!(
        tuning.exists(),
        "{} missing: install containernetworking-plugins",
        tuning.display()
    );
    let (sb, pod, _dir, agent) = agent_rig(1, "");
    // Debian's reference plugins (1.1.1) speak up to CNI 1.0.0.
    let conf = agent.net_conf("1.0.0");
    let args = "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=chained";
    // tuning, after enim in the chain, with enim's (or the chain's) result.
    let tuning_run = |verb: &str, prev: &serde_json::Value| {
        let conf = serde_json::json!({
            "cniVersion": "1.0.0",
            "name": NETWORK,
            "type": "tuning",
            "mtu": 1400,
            "sysctl": {"net.ipv4.conf.eth0.arp_notify": "1"},
            "prevResult": prev,
        });
        exec_plugin(tuning, verb, "c1", Some(&pod.path()), "eth0", args, &conf)
    };
    let first = enim("ADD", "c1", Some(&pod.path()), "eth0", &conf).ok();
    let last = tuning_run("ADD", &first).ok();
    assert_eq!(
        last["interfaces"][0]["name"], "eth0",
        "tuning must accept enim's result: {last}"
    );
    assert_eq!(pod.link("eth0").unwrap()["mtu"], 1400);
    assert!(pod.exec_ok(&[
        "sh",
        "-c",
        "test $(cat /proc/sys/net/ipv4/conf/eth0/arp_notify) = 1"
    ]));

    // CHECK runs over the chain with the final result as prevResult.
    let mut check = conf.clone();
    check["prevResult"] = last.clone();
    enim("CHECK", "c1", Some(&pod.path()), "eth0", &check).ok();
    tuning_run("CHECK", &last).ok();

    // DEL runs in reverse order.
    tuning_run("DEL", &last).ok();
    enim("DEL", "c1", Some(&pod.path()), "eth0", &check).ok();
    sb.assert_home(0);
}

#[test]
fn restart_between_add_and_del_loses_nothing() {
    require_kernel!();
    let (sb, pod, _dir, mut agent) = agent_rig(2, "");
    let conf = agent.net_conf("1.1.0");
    let first = enim("ADD", "c1", Some(&pod.path()), "eth0", &conf).ok();
    agent.stop();
    agent.restart();
    // The restored agent knows the attachment: ADD is idempotent, CHECK passes.
    let again = enim("ADD", "c1", Some(&pod.path()), "eth0", &conf).ok();
    assert_eq!(first, again);
    let mut check = conf.clone();
    check["prevResult"] = first.clone();
    enim("CHECK", "c1", Some(&pod.path()), "eth0", &check).ok();
    // A crash (SIGKILL) loses nothing either.
    agent.kill9();
    agent.restart();
    enim("DEL", "c1", Some(&pod.path()), "eth0", &conf).ok();
    sb.assert_home(0);
    sb.assert_home(1);
}

#[test]
fn callers_not_allowed_by_config_are_refused() {
    require_kernel!();
    let sb = Sandbox::new(1);
    let pod = NamedNetns::new("pod");
    let dir = tempfile::tempdir().unwrap();
    // nobody's group may connect to the socket; only uid 4242 is allowed.
    let agent = start_agent(
        &sb,
        dir.path(),
        "socket_group = 65534\nallowed_uids = [4242]",
    );
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let conf = agent.net_conf("1.1.0");
    let run_as = |uid: &str| {
        let mut setpriv = std::process::Command::new("setpriv");
        setpriv.args(["--reuid", uid, "--regid", "65534", "--clear-groups"]);
        setpriv.arg(common::bins().enim);
        let out = spawn_add(setpriv, "c1", &pod.path(), &conf)
            .wait_with_output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (status, stdout) = run_as("1234");
    assert_ne!(status, Some(0), "{stdout}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["code"], 104, "{stdout}");
    assert!(v["msg"].as_str().unwrap().contains("1234"), "{stdout}");
    sb.assert_home(0);
    // The allowed uid gets through.
    let (status, stdout) = run_as("4242");
    assert_eq!(status, Some(0), "{stdout}");
    enim("DEL", "c1", Some(&pod.path()), "eth0", &conf).ok();
    sb.assert_home(0);
}

/// Median wall time of an `enim` ADD and DEL exec over 20 cycles, printed
/// for the record (run with --nocapture). Asserts only correctness.
#[test]
fn exec_add_del_timing() {
    require_kernel!();
    let (sb, pod, _dir, agent) = agent_rig(1, "");
    let conf = agent.net_conf("1.1.0");
    print_add_del_medians(
        "enim exec",
        20,
        |cid| {
            enim("ADD", cid, Some(&pod.path()), "eth0", &conf).ok();
        },
        |cid| {
            enim("DEL", cid, Some(&pod.path()), "eth0", &conf).ok();
        },
    );
    sb.assert_home(0);
}

#[test]
fn excluded_enis_and_the_primary_interface_are_never_handed_out() {
    require_kernel!();
    let sb = Sandbox::new(4);
    // eni0 carries the host's default route: it is the primary interface.
    sb.host.ip(&["addr", "add", "10.77.0.99/24", "dev", "eni0"]);
    sb.host.ip(&["link", "set", "eni0", "up"]);
    sb.host.ip(&["route", "add", "default", "via", "10.77.0.1"]);
    let pods: Vec<NamedNetns> = (0..3).map(|_| NamedNetns::new("pod")).collect();
    let dir = tempfile::tempdir().unwrap();
    let mac2 = sb.enis[2].mac.to_string();
    let agent = start_agent(&sb, dir.path(), &format!("[exclude]\nenis = [\"{mac2}\"]"));
    let conf = agent.net_conf("1.1.0");
    let enis = agent.ctl(&["enis"]);
    let state = |id: &str| {
        enis["enis"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["id"] == id)
            .unwrap()["state"]
            .clone()
    };
    assert_eq!(
        state("eni-0000"),
        "excluded",
        "the primary interface: {enis}"
    );
    assert_eq!(state("eni-0002"), "excluded", "excluded by MAC: {enis}");
    assert_eq!(state("eni-0001"), "free");
    let mut got = Vec::new();
    for (i, pod) in pods.iter().take(2).enumerate() {
        let r = enim("ADD", &format!("c{i}"), Some(&pod.path()), "eth0", &conf).ok();
        got.push(r["interfaces"][0]["mac"].as_str().unwrap().to_string());
    }
    got.sort();
    assert_eq!(
        got,
        vec![sb.enis[1].mac.to_string(), sb.enis[3].mac.to_string()]
    );
    enim("ADD", "c2", Some(&pods[2].path()), "eth0", &conf).err(11);
    // The primary interface was not touched.
    let primary = sb
        .host
        .link("eni0")
        .expect("primary still in the host under its name");
    assert!(primary["flags"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f == "UP"));
    let table = std::process::Command::new(env!("CARGO_BIN_EXE_enimctl"))
        .args(["--socket"])
        .arg(agent.socket())
        .arg("enis")
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&table.stdout).into_owned();
    assert_eq!(table.matches("excluded").count(), 2, "{table}");
}

/// One missing ENI device must not block every ADD: the ENI is quarantined
/// and the next one taken; GC frees it when its device is back; a crash in
/// between leaks nothing.
#[test]
fn a_missing_eni_is_quarantined_and_freed_when_it_is_back() {
    require_kernel!();
    let (sb, pod, _dir, mut agent) = agent_rig(3, "");
    let conf = agent.net_conf("1.1.0");
    let state = |agent: &Agent, id: &str| -> String {
        agent.ctl(&["enis"])["enis"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["id"] == id)
            .map(|e| e["state"].as_str().unwrap().to_string())
            .unwrap()
    };
    // The first free ENI's device goes away (its veth, with its peer).
    sb.host.ip(&["link", "del", "eni0"]);
    let other = NamedNetns::new("pod");
    let r1 = enim("ADD", "c1", Some(&pod.path()), "eth0", &conf).ok();
    let r2 = enim("ADD", "c2", Some(&other.path()), "eth0", &conf).ok();
    let macs = [&r1, &r2].map(|r| r["interfaces"][0]["mac"].as_str().unwrap().to_string());
    assert!(!macs.contains(&sb.enis[0].mac.to_string()), "{macs:?}");
    assert_eq!(state(&agent, "eni-0000"), "missing");
    // A third ADD finds the node full, not broken.
    let third = NamedNetns::new("pod");
    enim("ADD", "c3", Some(&third.path()), "eth0", &conf).err(11);
    // A crash while it is missing: the restart finds it missing again.
    agent.kill9();
    agent.restart();
    assert_eq!(state(&agent, "eni-0000"), "missing");
    // Back: GC frees it, and the waiting pod gets it.
    sb.plug_eni(0);
    let report = agent.ctl(&["gc"]);
    assert_eq!(
        report["back_in_service"],
        serde_json::json!(["eni-0000"]),
        "{report}"
    );
    assert_eq!(state(&agent, "eni-0000"), "free");
    let r3 = enim("ADD", "c3", Some(&third.path()), "eth0", &conf).ok();
    assert_eq!(r3["interfaces"][0]["mac"], sb.enis[0].mac.to_string());
    for (cid, ns) in [("c1", &pod), ("c2", &other), ("c3", &third)] {
        enim("DEL", cid, Some(&ns.path()), "eth0", &conf).ok();
    }
    sb.assert_all_home();
    assert_eq!(agent.attachments(), Vec::<serde_json::Value>::new());
}
