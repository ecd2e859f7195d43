//! `enimctl cluster` against a real kube-apiserver: the operator's Lease
//! and two nodes' NetResourceSets written as the operator and the agents
//! would, then what it prints (table, JSON, YAML) and how it exits: 2
//! while something is not ready (each reason named), 0 once all is, 1 when
//! the API server cannot be read.

mod common;

use std::path::Path;
use std::process::Output;

use common::control_plane_with_nrs_crd;
use enim_testkit::apiserver::ControlPlane;
use serde_json::{json, Value};

fn enimctl(kubeconfig: &Path, args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_enimctl"))
        .arg("cluster")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .env_remove("KUBECONFIG")
        .output()
        .expect("run enimctl")
}

fn json_of(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// A kubeconfig of the service account `viewer`, bound to deploy/'s
/// `enim:viewer` ClusterRole and Role (the chart's, rendered) and nothing
/// else.
fn viewer_kubeconfig(cp: &ControlPlane) -> std::path::PathBuf {
    let roles = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/12-rbac-viewer.yaml");
    cp.apply(&std::fs::read_to_string(&roles).expect("deploy/12-rbac-viewer.yaml"));
    let account = "--serviceaccount=enim-system:viewer";
    cp.kubectl(&["-n", "enim-system", "create", "serviceaccount", "viewer"]);
    cp.kubectl(&[
        "create",
        "clusterrolebinding",
        "viewer",
        "--clusterrole=enim:viewer",
        account,
    ]);
    cp.kubectl(&[
        "-n",
        "enim-system",
        "create",
        "rolebinding",
        "viewer",
        "--role=enim:viewer",
        account,
    ]);
    let token = cp.kubectl(&[
        "-n",
        "enim-system",
        "create",
        "token",
        "viewer",
        "--duration=1h",
    ]);
    cp.token_kubeconfig("viewer", token.trim())
}

/// A set as the operator writes it (spec), then its agent (status).
fn write_set(cp: &ControlPlane, dir: &Path, node: &str, enis: &[&str], status: Value) {
    let spec_enis: Vec<Value> = enis
        .iter()
        .enumerate()
        .map(|(i, id)| {
            json!({
                "id": id, "mac": format!("02:00:00:00:00:{:02x}", i + 1),
                "ipv4": format!("10.1.0.{}/24", i + 10), "gateway4": "10.1.0.1",
            })
        })
        .collect();
    let set = json!({
        "apiVersion": "enim.io/v1alpha1", "kind": "NetResourceSet",
        "metadata": { "name": node },
        "spec": {
            "instance": { "provider": "aws", "id": format!("i-{node}") },
            "mode": "primary",
            "watermarks": { "preAllocate": 0, "minAllocate": 0, "maxAboveWatermark": 0 },
            "enis": spec_enis,
            "draining": [],
        },
    });
    let file = dir.join(format!("{node}.json"));
    std::fs::write(&file, set.to_string()).unwrap();
    cp.kubectl(&["apply", "-f", &file.display().to_string()]);
    cp.kubectl(&[
        "patch",
        "netresourceset",
        node,
        "--subresource=status",
        "--type=merge",
        "-p",
        &json!({ "status": status }).to_string(),
    ]);
}

fn ready(status: &str, message: &str) -> Value {
    json!([{
        "type": "Ready", "status": status, "reason": "Test", "message": message,
        "lastTransitionTime": "2026-11-28T00:00:00Z",
    }])
}

fn write_lease(cp: &ControlPlane, dir: &Path, renewed_secs_ago: i64) {
    let renew = k8s_openapi::jiff::Timestamp::now()
        - k8s_openapi::jiff::SignedDuration::from_secs(renewed_secs_ago);
    let lease = json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": { "name": "enim-operator", "namespace": "enim-system" },
        "spec": {
            "holderIdentity": "enim-operator-a",
            "leaseDurationSeconds": 10,
            "renewTime": renew.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string(),
        },
    });
    let file = dir.join("lease.json");
    std::fs::write(&file, lease.to_string()).unwrap();
    cp.kubectl(&["apply", "-f", &file.display().to_string()]);
}

#[test]
fn enimctl_cluster_shows_the_leader_and_each_nodes_enis_and_exits_by_readiness() {
    let Some(cp) = control_plane_with_nrs_crd() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let kc = cp.admin_kubeconfig();
    cp.kubectl(&["create", "namespace", "enim-system"]);
    write_lease(&cp, dir.path(), 1);
    write_set(
        &cp,
        dir.path(),
        "node-a",
        &["eni-a1", "eni-a2", "eni-a3"],
        json!({
            "used": [{ "eni": "eni-a1", "podNamespace": "default", "podName": "web",
                       "containerId": "c1", "ifname": "eth0" }],
            "quarantined": [{ "eni": "eni-a2", "reason": "device missing on the node" }],
            "summary": { "enis": 3, "used": 1, "available": 1 },
            "observedGeneration": 1,
            "conditions": ready("True", "serving"),
        }),
    );
    write_set(
        &cp,
        dir.path(),
        "node-b",
        &["eni-b1"],
        json!({
            "summary": { "enis": 1, "used": 0, "available": 0 },
            "observedGeneration": 1,
            "conditions": ready("False", "no device for eni-b1 yet"),
        }),
    );

    // node-b is not Ready: exit 2, and the reason names it.
    let out = enimctl(&kc, &["-o", "json"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let v = json_of(&out);
    assert_eq!(v["leader"]["holder"], "enim-operator-a");
    assert_eq!(v["leader"]["current"], true);
    let a = &v["nodes"][0];
    assert_eq!(
        (a["node"].as_str(), a["ready"].as_str()),
        (Some("node-a"), Some("True"))
    );
    assert_eq!(a["enis"][0]["heldBy"], json!(["default/web"]));
    assert_eq!(a["enis"][1]["quarantined"], "device missing on the node");
    assert_eq!(a["enis"][2]["heldBy"], json!([]));
    let not_ready = v["notReady"].as_array().unwrap();
    assert_eq!(not_ready.len(), 1, "{not_ready:?}");
    assert!(
        not_ready[0]
            .as_str()
            .unwrap()
            .contains("node-b: Ready is False (no device for eni-b1 yet)"),
        "{not_ready:?}"
    );

    // The same as YAML and as a table.
    let out = enimctl(&kc, &["-o", "yaml"]);
    let y: Value = serde_yaml::from_slice(&out.stdout).expect("YAML");
    assert_eq!(y, v);
    let out = enimctl(&kc, &[]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("leader: enim-operator-a"), "{table}");
    assert!(table.contains("eni-a1 held by default/web"), "{table}");
    assert!(
        table.contains("eni-a2 quarantined: device missing on the node"),
        "{table}"
    );
    assert!(table.contains("eni-a3 free"), "{table}");
    assert!(table.contains("not ready: node-b"), "{table}");

    // The chart's read-only enim:viewer roles are all it needs: the same
    // answer with a token of an account bound to them, and no write.
    let viewer = viewer_kubeconfig(&cp);
    let mut out = enimctl(&viewer, &["-o", "json"]);
    for _ in 0..50 {
        // RBAC's caches may lag the bindings by a moment.
        if out.status.code() != Some(1) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
        out = enimctl(&viewer, &["-o", "json"]);
    }
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let seen = json_of(&out);
    for key in ["nodes", "notReady"] {
        assert_eq!(seen[key], v[key], "{key}");
    }
    assert_eq!(seen["leader"]["holder"], v["leader"]["holder"]);
    for args in [
        &[
            "patch",
            "netresourceset",
            "node-a",
            "--type=merge",
            "-p",
            r#"{"spec":{"draining":["eni-a1"]}}"#,
        ][..],
        &["delete", "netresourceset", "node-b"][..],
        &["-n", "enim-system", "get", "secrets"][..],
        &["get", "pods", "-A"][..],
        &["-n", "enim-system", "get", "lease", "another"][..],
    ] {
        let kc = format!("--kubeconfig={}", viewer.display());
        let mut all = vec![kc.as_str()];
        all.extend_from_slice(args);
        let refused = cp.kubectl_output(&all);
        assert!(
            !refused.status.success()
                && String::from_utf8_lossy(&refused.stderr).contains("forbidden"),
            "the viewer may {args:?}: {refused:?}"
        );
    }

    // node-b's agent says Ready: all ready, exit 0.
    cp.kubectl(&[
        "patch",
        "netresourceset",
        "node-b",
        "--subresource=status",
        "--type=merge",
        "-p",
        &json!({ "status": { "conditions": ready("True", "serving") } }).to_string(),
    ]);
    let out = enimctl(&kc, &[]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).ends_with("ready\n"));

    // A leader that stopped renewing: not ready.
    write_lease(&cp, dir.path(), 60);
    let out = enimctl(&kc, &["--json"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let v = json_of(&out);
    assert_eq!(v["leader"]["current"], false);
    assert!(v["notReady"][0]
        .as_str()
        .unwrap()
        .contains("has not renewed its Lease"));

    // No Lease at all: no operator leads.
    cp.kubectl(&["-n", "enim-system", "delete", "lease", "enim-operator"]);
    let v = json_of(&enimctl(&kc, &["-o", "json"]));
    assert_eq!(v["leader"], Value::Null);
    assert_eq!(v["notReady"][0], "no operator holds the Lease");

    // An API server that cannot be read: exit 1, with the error.
    let bad = dir.path().join("bad.kubeconfig");
    let text = std::fs::read_to_string(&kc)
        .unwrap()
        .replace(&cp.server(), "https://127.0.0.1:1");
    std::fs::write(&bad, text).unwrap();
    let out = enimctl(&bad, &[]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("reading the operator's Lease"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
