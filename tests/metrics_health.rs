//! Metrics, health and readiness scraped over HTTP from a real enimd, and
//! checked against the actions performed; what it serves checked against
//! docs/operations.md (both ways) and the alerts' and dashboard's
//! expressions; the listener serves nothing but three GETs.

mod common;

use common::*;

#[test]
fn metrics_match_the_actions_performed() {
    require_kernel!();
    let addr: std::net::SocketAddr = "127.0.0.1:9464".parse().unwrap();
    let (sb, pods, _dir, agent) = agent_rig_with_pods(
        3,
        &format!("metrics_address = \"{addr}\"\ngc_grace = \"0s\""),
    );
    let host = sb.host.path();
    assert_eq!(http_get_in(&host, addr, "/healthz").0, 200);
    assert_eq!(http_get_in(&host, addr, "/readyz").0, 200);

    let conf = agent.net_conf("1.1.0");
    add_each(&pods, &conf);
    enim("DEL", "c0", Some(&pods[0].path()), "eth0", &conf).ok();
    let mut check = conf.clone();
    check["prevResult"] = enim("ADD", "c1", Some(&pods[1].path()), "eth0", &conf).ok();
    enim("CHECK", "c1", Some(&pods[1].path()), "eth0", &check).ok();
    // A failing CHECK (unknown container) counts as an error.
    enim("CHECK", "nope", Some(&pods[1].path()), "eth0", &check).err(3);
    // c2's pod dies without DEL; GC moves nothing back (veth died) and drops the record.
    let _ = &pods[2];
    let (status, text) = http_get_in(&host, addr, "/metrics");
    assert_eq!(status, 200, "{text}");
    assert_metrics(
        &text,
        &[
            ("enim_enis{state=\"in_use\"}", 2.0),
            ("enim_enis{state=\"free\"}", 1.0),
            ("enim_attachments", 2.0),
            ("enim_requests_total{verb=\"ADD\",result=\"ok\"}", 4.0),
            ("enim_requests_total{verb=\"DEL\",result=\"ok\"}", 1.0),
            ("enim_requests_total{verb=\"CHECK\",result=\"ok\"}", 1.0),
            ("enim_requests_total{verb=\"CHECK\",result=\"error\"}", 1.0),
            ("enim_request_duration_seconds_count{verb=\"ADD\"}", 4.0),
        ],
    );
    assert!(
        metric(&text, "enim_checkpoint_write_duration_seconds_count") >= 7.0,
        "{text}"
    );
    assert!(
        metric(
            &text,
            "enim_provider_call_duration_seconds_count{operation=\"allocate\"}"
        ) >= 3.0,
        "{text}"
    );

    // GC of a pod that died without DEL: its veth died too, so the record is dropped.
    drop(pods);
    let report = agent.ctl(&["gc"]);
    assert_eq!(report["collected"].as_array().unwrap().len(), 2, "{report}");
    let (_, text) = http_get_in(&host, addr, "/metrics");
    assert_metrics(
        &text,
        &[
            ("enim_gc_actions_total{kind=\"record_dropped\"}", 2.0),
            ("enim_enis{state=\"in_use\"}", 0.0),
            ("enim_requests_total{verb=\"GC\",result=\"ok\"}", 1.0),
        ],
    );
}

#[test]
fn enimd_serves_exactly_the_documented_metrics_and_only_reads() {
    use enim_testkit::metrics_doc::*;
    require_kernel!();
    let addr: std::net::SocketAddr = "127.0.0.1:9464".parse().unwrap();
    let (sb, pods, _dir, agent) = agent_rig_with_pods(1, &format!("metrics_address = \"{addr}\""));
    let host = sb.host.path();
    // One ADD served, one refused (no free ENI left), one GC: each family
    // with labels has a sample.
    let conf = agent.net_conf("1.1.0");
    enim("ADD", "c0", Some(&pods[0].path()), "eth0", &conf).ok();
    enim("ADD", "c1", Some(&pods[0].path()), "eth1", &conf).err(11);
    agent.ctl(&["gc"]);
    let (status, text) = http_get_in(&host, addr, "/metrics");
    assert_eq!(status, 200, "{text}");
    let served = served(&text);
    let docs = repo_file("docs/operations.md");
    let mut documented = documented(&docs, "enimd");
    assert!(documented.len() >= 10, "{documented:?}");
    // Served only where they mean something, which this rig (static
    // provider, primary mode) is not: a cloud warm pool's statistics and
    // secondary mode's addresses. Documented as such, and not served here.
    let elsewhere = [
        ("enim_pool", "warm pool"),
        ("enim_secondary_addresses", "Secondary mode"),
    ];
    for (name, only) in elsewhere {
        let row = docs
            .lines()
            .find(|l| l.contains(&format!("`{name}`")))
            .unwrap();
        assert!(
            row.contains(only),
            "{name}'s row says where it is served: {row}"
        );
        assert!(
            !served.contains_key(name),
            "{name} served by a static primary node"
        );
        documented.remove(name);
    }
    let wrong = differences(&documented, &served);
    assert!(
        wrong.is_empty(),
        "docs/operations.md vs /metrics: {wrong:#?}"
    );

    // Every enimd metric the alerts and the dashboard use is served (the
    // operator's: operator/tests/metrics_docs.rs).
    let exprs = rule_exprs(&repo_file("charts/enim/files/prometheus-rules.yaml"))
        .into_iter()
        .chain(dashboard_exprs(&repo_file(
            "charts/enim/files/grafana-dashboard.json",
        )));
    let known: std::collections::BTreeSet<&str> = served
        .keys()
        .map(String::as_str)
        .chain(elsewhere.map(|(name, _)| name))
        .collect();
    for expr in exprs {
        for name in metrics_named(&expr)
            .into_iter()
            .filter(|n| !n.starts_with("enim_operator_"))
        {
            assert!(
                known.contains(name.as_str()),
                "{expr}: {name} is not served"
            );
        }
    }

    // Read-only: another method, or another path, is refused.
    let (code, _) = http_method_in(&host, addr, "POST", "/metrics");
    assert_eq!(code, 405);
    let (code, _) = http_method_in(&host, addr, "DELETE", "/readyz");
    assert_eq!(code, 405);
    assert_eq!(http_get_in(&host, addr, "/v1/enis").0, 404);
}

#[cfg(feature = "fault-injection")]
#[test]
fn readyz_waits_for_startup_recovery() {
    require_kernel!();
    let sb = Sandbox::new(1);
    let dir = tempfile::tempdir().unwrap();
    let addr: std::net::SocketAddr = "127.0.0.1:9465".parse().unwrap();
    let mut agent = start_agent(&sb, dir.path(), &format!("metrics_address = \"{addr}\""));
    assert_eq!(http_get_in(&sb.host.path(), addr, "/readyz").0, 200);
    agent.stop();
    // Held in startup recovery, the agent is alive but not ready.
    agent.env = vec![(
        "ENIMD_DELAY_AT".into(),
        "startup:before-recover=1500".into(),
    )];
    let host = sb.host.path();
    let probe = std::thread::spawn(move || {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            assert!(
                std::time::Instant::now() < deadline,
                "metrics listener never came up"
            );
            let answer = std::panic::catch_unwind(|| {
                (
                    http_get_in(&host, addr, "/healthz").0,
                    http_get_in(&host, addr, "/readyz").0,
                )
            });
            if let Ok(answer) = answer {
                return answer;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    });
    agent.restart();
    assert_eq!(
        probe.join().unwrap(),
        (200, 503),
        "live but not ready during recovery"
    );
    assert_eq!(http_get_in(&sb.host.path(), addr, "/readyz").0, 200);
}
