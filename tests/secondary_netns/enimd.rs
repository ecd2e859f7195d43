//! Secondary mode through the real enimd and the real plugin.

use crate::common::{
    assert_metrics, enim, http_get_in, plugin_add_c1, require_kernel, start_agent, NamedNetns,
    Sandbox,
};
use crate::{ping, rules};

/// The real enimd, configured for secondary mode, and the real plugin.
#[test]
fn enimd_and_plugin_in_secondary_mode_across_a_restart() {
    require_kernel!();
    let mut sb = Sandbox::new(1);
    sb.enis = sb.enis_with_secondaries(&[2], true);
    let pod = NamedNetns::new("pod");
    let dir = tempfile::tempdir().unwrap();
    let mut agent = start_agent(
        &sb,
        dir.path(),
        "mode = \"secondary\"\n[secondary]\ncooldown = \"0s\"\nrule_priority_to_pod = 600\n",
    );
    let (conf, result) = plugin_add_c1(&agent, &pod);
    let ips: Vec<(String, String)> = result["ips"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            (
                i["address"].as_str().unwrap().to_string(),
                i["gateway"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        ips,
        [
            ("10.77.0.11/32".to_string(), "169.254.1.1".to_string()),
            ("fd00:e1::11/128".to_string(), "fe80::1".to_string())
        ]
    );
    let iface = &result["interfaces"][0];
    assert_eq!(iface["name"], "eth0");
    assert_eq!(iface["mac"], pod.link("eth0").unwrap()["address"]);
    assert_eq!(iface["sandbox"], pod.path().display().to_string());
    assert!(ping(&pod, "10.77.0.1") && ping(&pod, "fd00:e1::1"));
    // The configured priority is the one used.
    assert!(rules(&sb).contains("600:\tfrom all to 10.77.0.11 lookup main"));
    let listed = agent.ctl(&["attachments"]);
    assert_eq!(
        listed["attachments"].as_array().map(Vec::len),
        Some(1),
        "{listed}"
    );
    assert_eq!(
        listed["attachments"][0]["host_veth"]
            .as_str()
            .unwrap()
            .len(),
        15
    );

    let mut check_conf = conf.clone();
    check_conf["prevResult"] = result.clone();
    enim("CHECK", "c1", Some(&pod.path()), "eth0", &check_conf).ok();

    agent.stop();
    let plumbed = sb.host_state();
    agent.restart();
    assert_eq!(sb.host_state(), plumbed, "restart changed the host");
    assert!(ping(&pod, "10.77.0.1") && ping(&pod, "fd00:e1::1"));
    enim("CHECK", "c1", Some(&pod.path()), "eth0", &check_conf).ok();
    // The restarted agent knows the first address is taken.
    let other = NamedNetns::new("pod");
    let second = enim("ADD", "c2", Some(&other.path()), "eth0", &conf).ok();
    assert_eq!(second["ips"][0]["address"], "10.77.0.12/32");

    enim("DEL", "c1", Some(&pod.path()), "eth0", &check_conf).ok();
    enim("DEL", "c1", Some(&pod.path()), "eth0", &check_conf).ok();
    enim("DEL", "c2", None, "eth0", &conf).ok();
    assert!(pod.link("eth0").is_none() && other.link("eth0").is_none());
    assert!(!rules(&sb).contains("10.77."), "{}", rules(&sb));
    agent.stop();
}

/// Secondary mode end to end: the real enimd (`mode = "secondary"`) and
/// the real plugin; enimctl and the metrics show the pod while it lives.
#[test]
fn secondary_mode_through_enimd_plugin_enimctl_and_metrics() {
    require_kernel!();
    let mut sb = Sandbox::new(2);
    sb.enis = sb.enis_with_secondaries(&[2, 1], false);
    let dir = tempfile::tempdir().unwrap();
    let addr: std::net::SocketAddr = "127.0.0.1:9465".parse().unwrap();
    let agent = start_agent(
        &sb,
        dir.path(),
        &format!(
            "mode = \"secondary\"\nmetrics_address = \"{addr}\"\ngc_grace = \"0s\"\n\
             [secondary]\ncooldown = \"0s\""
        ),
    );
    let host = sb.host.path();
    let scrape = || {
        let (status, text) = http_get_in(&host, addr, "/metrics");
        assert_eq!(status, 200, "{text}");
        text
    };
    let text = scrape();
    assert_metrics(&text, &[("enim_secondary_addresses{state=\"free\"}", 3.0)]);

    let pod = NamedNetns::new("pod");
    let conf = agent.net_conf("1.1.0");
    let result = enim("ADD", "c0", Some(&pod.path()), "eth0", &conf).ok();
    let address = result["ips"][0]["address"].as_str().unwrap().to_string();
    assert!(address.starts_with("10.77.0.1"), "{result}");
    assert!(
        ping(&pod, "10.77.0.1"),
        "the pod cannot reach its ENI's gateway"
    );

    let listed = agent.ctl(&["attachments"]);
    // One list for both modes; a secondary-mode record has a host veth.
    let pods = listed["attachments"]
        .as_array()
        .expect("attachments listed");
    assert_eq!(pods.len(), 1, "{listed}");
    assert_eq!(pods[0]["container_id"], "c0");
    assert_eq!(pods[0]["eni_id"], sb.enis[0].id.as_str());
    assert!(pods[0]["host_veth"].is_string(), "{listed}");
    assert_eq!(agent.ctl(&["status"])["attachments"], 1);
    let text = scrape();
    assert_metrics(
        &text,
        &[
            ("enim_secondary_addresses{state=\"assigned\"}", 1.0),
            ("enim_secondary_addresses{state=\"free\"}", 2.0),
            ("enim_attachments", 1.0),
        ],
    );

    enim("DEL", "c0", Some(&pod.path()), "eth0", &conf).ok();
    assert_eq!(
        agent.ctl(&["attachments"])["attachments"],
        serde_json::json!([])
    );
    let text = scrape();
    assert_metrics(
        &text,
        &[
            ("enim_secondary_addresses{state=\"assigned\"}", 0.0),
            ("enim_attachments", 0.0),
        ],
    );
}
