//! enim under the real Kubernetes of `scripts/e2e-cluster.sh`: what the
//! kubelet and containerd's CRI really send enim, checked from Rust.
//!
//! Runs only against a running cluster (`ENIM_E2E_CLUSTER`, which the
//! script sets for its "Rust tests" scenario); a plain `cargo test` says it
//! skipped. The script's bash scenarios check behaviour; this one checks the
//! CNI_ARGS enim records for each pod against the API server's Pod objects,
//! and enim's ENI list against the node's allocatable.

use enim_testkit::cluster::Cluster;
use serde_json::Value;

fn cluster() -> Option<Cluster> {
    let c = Cluster::from_env();
    if c.is_none() {
        eprintln!(
            "SKIPPED: no cluster ({} unset; scripts/e2e-cluster.sh runs this test)",
            enim_testkit::cluster::ENV
        );
    }
    c
}

/// enimctl in the enimd pod, as a user runs it.
fn enimctl(c: &Cluster, what: &str) -> Value {
    let out = c.kubectl(&[
        "-n",
        "enim-system",
        "exec",
        "ds/enimd",
        "-c",
        "enimd",
        "--",
        "/usr/local/bin/enimctl",
        "--json",
        what,
    ]);
    serde_json::from_str(&out).expect("enimctl --json")
}

fn pod_manifest(name: &str, resource: &str, image: &str) -> String {
    format!(
        r#"{{"apiVersion": "v1", "kind": "Pod",
  "metadata": {{"name": "{name}", "labels": {{"e2e": "1", "app": "{name}"}}}},
  "spec": {{"terminationGracePeriodSeconds": 1,
    "containers": [{{"name": "c", "image": "{image}", "imagePullPolicy": "Never",
      "args": ["exec sleep 100000"],
      "resources": {{"limits": {{"{resource}": 1}}}}}}]}}}}"#
    )
}

#[test]
fn the_kubelet_sends_the_pods_identity_and_enim_records_it() {
    let Some(c) = cluster() else { return };
    let mode = std::env::var("ENIM_E2E_MODE").unwrap_or_else(|_| "primary".into());
    let resource = if mode == "primary" {
        "enim.io/eni"
    } else {
        "enim.io/ip"
    };
    let image = std::env::var("ENIM_E2E_BUSYBOX").expect("ENIM_E2E_BUSYBOX");
    let names = ["rust-a", "rust-b"];
    for name in names {
        let path = std::env::temp_dir().join(format!("enim-k8s-{name}.json"));
        std::fs::write(&path, pod_manifest(name, resource, &image)).unwrap();
        c.kubectl(&["apply", "-f", path.to_str().unwrap()]);
        std::fs::remove_file(&path).ok();
    }
    for name in names {
        c.kubectl(&[
            "wait",
            "--for=condition=Ready",
            &format!("pod/{name}"),
            "--timeout=120s",
        ]);
    }

    let records = enimctl(&c, "attachments");
    let records = records["attachments"].as_array().expect("attachments");
    for name in names {
        let pod = c.kubectl_json(&["get", "pod", name]);
        let uid = pod["metadata"]["uid"].as_str().unwrap();
        let ip = pod["status"]["podIP"].as_str().unwrap();
        let mine: Vec<&Value> = records
            .iter()
            .filter(|r| r["pod"]["name"] == name)
            .collect();
        assert_eq!(mine.len(), 1, "one record for {name}: {records:?}");
        let r = mine[0];
        // K8S_POD_NAMESPACE, K8S_POD_NAME and K8S_POD_UID from CNI_ARGS.
        assert_eq!(r["pod"]["namespace"], "default", "{r}");
        assert_eq!(
            r["pod"]["uid"], uid,
            "K8S_POD_UID as the API server has it: {r}"
        );
        // The runtime's network name and interface: the conflist's, eth0.
        assert_eq!(r["network"], "enim", "{r}");
        assert_eq!(r["ifname"], "eth0", "{r}");
        // containerd names the netns it made for the sandbox.
        let netns = r["netns"].as_str().unwrap();
        assert!(netns.starts_with("/var/run/netns/cni-"), "{netns}");
        // The address the kubelet reported is the one enim gave: the ENI's
        // own with its prefix (primary), a secondary address (secondary).
        let recorded = r.to_string();
        assert!(
            recorded.contains(&format!("\"{ip}/")) || recorded.contains(&format!("\"{ip}\"")),
            "{ip} not in {recorded}"
        );
    }

    // The ENIs enim can hand out (all but those whose device is missing)
    // are what the kubelet may schedule.
    let node = c.kubectl_json(&["get", "node", "enim-e2e-node"]);
    let allocatable: usize = node["status"]["allocatable"][resource]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let enis = enimctl(&c, "enis");
    let enis = enis["enis"].as_array().expect("enis");
    let usable = enis.iter().filter(|e| e["state"] != "missing").count();
    if mode == "primary" {
        assert_eq!(usable, allocatable, "{enis:?}");
    } else {
        assert!(!enis.is_empty() && allocatable > enis.len(), "{enis:?}");
    }

    for name in names {
        c.kubectl(&["delete", "pod", name, "--wait=true"]);
    }
}
