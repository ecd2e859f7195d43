//! `enimctl uninstall`, the chart's pre-delete hook, on a real API server,
//! with the hook's ServiceAccount and exactly the RBAC the chart renders
//! for it. The test plays the controllers and the operator (this control
//! plane runs neither): it writes the DaemonSet's and the Deployment's
//! status and removes the operator's finalizer, as they would.
//!
//! - A set whose pod still holds an ENI fails the hook within its time,
//!   naming the pod; nothing is scaled or deleted.
//! - Once every set is let go: the operator is scaled to 0, and once its
//!   pods are gone the sets are deleted.
//! - The hook's account is refused what it was not given.
//!
//! Without the Kubernetes binaries or helm the test skips with a message;
//! under CI=true it fails.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use enim_crd::{FINALIZER, UNINSTALL_ANNOTATION};
use enim_testkit::apiserver::ControlPlane;

const NS: &str = "enim-system";

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The hook's objects as the chart renders them for an operator cluster.
fn hook_manifests(bin: &Path) -> Option<String> {
    let helm = bin.join("helm");
    if !helm.is_file() {
        let msg = "helm is not built (scripts/cluster/build.sh)";
        assert!(!enim_testkit::ci(), "CI=true: {msg}");
        eprintln!("SKIPPED: {msg}");
        return None;
    }
    let out = Command::new(helm)
        .args(["template", "enim"])
        .arg(repo().join("charts/enim"))
        .args([
            "--namespace",
            NS,
            "--show-only",
            "templates/90-uninstall.yaml",
        ])
        .args([
            "--set",
            "operator.config.operator.cluster=c1,operator.config.operator.subnets={subnet-1},\
             operator.config.operator.security_groups={sg-1},operator.config.cloud.type=aws,\
             operator.config.cloud.region=us-east-1",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "helm template: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(String::from_utf8(out.stdout).unwrap())
}

fn set(name: &str) -> String {
    format!(
        "apiVersion: enim.io/v1alpha1\nkind: NetResourceSet\nmetadata:\n  name: {name}\n  finalizers: [{FINALIZER}]\n\
         spec:\n  instance: {{provider: aws, id: i-{name}}}\n  mode: primary\n  \
         watermarks: {{preAllocate: 1, minAllocate: 1, maxAboveWatermark: 1}}\n  enis: []\n"
    )
}

fn deployment(name: &str) -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {name}\n  namespace: {NS}\nspec:\n  replicas: 2\n  \
         selector: {{matchLabels: {{app: {name}}}}}\n  template:\n    metadata: {{labels: {{app: {name}}}}}\n    \
         spec: {{containers: [{{name: c, image: enim:0.1.0}}]}}\n"
    )
}

/// As a controller: the status subresource of `kind/name` merged with
/// `status` (JSON).
fn write_status(cp: &ControlPlane, kind: &str, name: &str, status: &str) {
    cp.kubectl(&[
        "-n",
        NS,
        "patch",
        kind,
        name,
        "--subresource=status",
        "--type=merge",
        "-p",
        &format!("{{\"status\":{status}}}"),
    ]);
}

/// As the operator: its finalizer off `name`.
fn let_go(cp: &ControlPlane, name: &str) {
    cp.kubectl(&[
        "patch",
        "nrs",
        name,
        "--type=json",
        "-p",
        r#"[{"op":"replace","path":"/metadata/finalizers","value":[]}]"#,
    ]);
}

fn annotated(cp: &ControlPlane, name: &str) -> bool {
    let key = UNINSTALL_ANNOTATION.replace('.', "\\.");
    cp.kubectl(&[
        "get",
        "nrs",
        name,
        "-o",
        &format!("jsonpath={{.metadata.annotations.{key}}}"),
    ]) == "true"
}

fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn enimctl_uninstall(kubeconfig: &Path, within: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_enimctl"))
        .args(["uninstall", "--kubeconfig"])
        .arg(kubeconfig)
        .args(["--namespace", NS, "--node-cleanup", "enim-uninstall-cni"])
        .args(["--operator", "enim-operator", "--within", within])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A kubeconfig of the hook's ServiceAccount.
fn hook_account(cp: &ControlPlane) -> PathBuf {
    let token = cp.kubectl(&[
        "create",
        "token",
        "enim-uninstall",
        "-n",
        NS,
        "--duration=1h",
    ]);
    cp.token_kubeconfig("enim-uninstall", token.trim())
}

#[test]
fn the_hook_waits_for_pods_then_stops_the_operator_and_deletes_the_sets() {
    let Some(bin) = enim_testkit::apiserver::bin_dir() else {
        let msg = "the Kubernetes binaries are not built (scripts/cluster/build.sh)";
        assert!(!enim_testkit::ci(), "CI=true: {msg}");
        eprintln!("SKIPPED: {msg}");
        return;
    };
    let Some(hook) = hook_manifests(&bin) else {
        return;
    };
    let Some(cp) = ControlPlane::start() else {
        return;
    };
    let crd = std::fs::read_to_string(repo().join(enim_crd::CRD_PATH)).unwrap();
    cp.apply_crd(&crd, "crd/netresourcesets.enim.io");
    cp.kubectl(&["create", "namespace", NS]);
    cp.apply(&hook);
    cp.apply(&deployment("enim-operator"));
    cp.apply(&deployment("other"));
    cp.apply(&format!("{}---\n{}", set("n1"), set("n2")));
    // The leader's Lease, held and renewed now.
    cp.apply(&format!(
        "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: enim-operator\n  namespace: {NS}\n\
         spec:\n  holderIdentity: op-a\n  leaseDurationSeconds: 3600\n  renewTime: \"{}\"\n",
        k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S%.6fZ")
    ));
    write_status(&cp, "deployment", "enim-operator", r#"{"replicas":2}"#);
    let generation = cp.kubectl(&[
        "-n",
        NS,
        "get",
        "daemonset",
        "enim-uninstall-cni",
        "-o",
        "jsonpath={.metadata.generation}",
    ]);
    let ds_status = |ready: u32| {
        format!(
            r#"{{"observedGeneration":{generation},"desiredNumberScheduled":2,"currentNumberScheduled":2,"updatedNumberScheduled":2,"numberReady":{ready},"numberMisscheduled":0}}"#
        )
    };
    write_status(&cp, "daemonset", "enim-uninstall-cni", &ds_status(1));
    // A pod on n2 holds an ENI.
    cp.kubectl(&[
        "patch",
        "nrs",
        "n2",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"used":[{"eni":"eni-2","podNamespace":"web","podName":"a","containerId":"c2","ifname":"eth0"}]}}"#,
    ]);
    let account = hook_account(&cp);

    // 1. One node not clean yet: nothing is annotated until it is.
    let run = enimctl_uninstall(&account, "6s");
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        !annotated(&cp, "n1"),
        "annotated before every node was clean"
    );
    write_status(&cp, "daemonset", "enim-uninstall-cni", &ds_status(2));
    until("the sets annotated", || {
        annotated(&cp, "n1") && annotated(&cp, "n2")
    });
    let_go(&cp, "n1");
    // n2's pod holds on: the hook fails in its time, naming the pod.
    let out = run.wait_with_output().unwrap();
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("nodes: enim's conflist and plugin removed on 2 node(s)"),
        "{said}"
    );
    assert!(
        said.contains("n2 (eni-2 held by pod web/a: delete those pods)"),
        "{said}"
    );
    assert!(!said.contains("n1 ("), "n1 was let go: {said}");
    let replicas = |name: &str| {
        cp.kubectl(&[
            "-n",
            NS,
            "get",
            "deployment",
            name,
            "-o",
            "jsonpath={.spec.replicas}",
        ])
    };
    assert_eq!(
        replicas("enim-operator"),
        "2",
        "scaled though the hook failed"
    );
    assert_eq!(cp.kubectl(&["get", "nrs", "-o", "name"]).lines().count(), 2);

    // 2. The pod deleted, the operator lets n2 go: the operator is scaled
    // to 0, and once its pods are gone the sets are deleted.
    let run = enimctl_uninstall(&account, "30s");
    std::thread::sleep(Duration::from_secs(1));
    let_go(&cp, "n2");
    until("the operator scaled to 0", || {
        replicas("enim-operator") == "0"
    });
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        cp.kubectl(&["get", "nrs", "-o", "name"]).lines().count(),
        2,
        "sets deleted while the operator's pods ran"
    );
    write_status(&cp, "deployment", "enim-operator", r#"{"replicas":0}"#);
    // Its pods no longer counted, a replica still leads (shutting down):
    // the sets stay until it lets the Lease go.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        cp.kubectl(&["get", "nrs", "-o", "name"]).lines().count(),
        2,
        "sets deleted while a replica still held the Lease"
    );
    cp.kubectl(&[
        "-n",
        NS,
        "patch",
        "lease",
        "enim-operator",
        "--type=merge",
        "-p",
        r#"{"spec":{"holderIdentity":null}}"#,
    ]);
    let out = run.wait_with_output().unwrap();
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("cloud: the operator released the ENIs of 2 NetResourceSet(s)"),
        "{said}"
    );
    assert!(said.contains("NetResourceSets: 2 deleted"), "{said}");
    assert_eq!(cp.kubectl(&["get", "nrs", "-o", "name"]), "");
    assert_eq!(replicas("other"), "2");

    // 3. The hook's account is refused what it was not given.
    let n3 = cp.dir().join("n3.yaml");
    std::fs::write(&n3, set("n3")).unwrap();
    let n3 = n3.to_str().unwrap().to_string();
    let as_hook = |args: &[&str]| {
        Command::new(bin.join("kubectl"))
            .arg(format!("--kubeconfig={}", account.display()))
            .args(args)
            .output()
            .unwrap()
    };
    for args in [
        &["-n", NS, "delete", "deployment", "enim-operator"][..],
        &[
            "-n",
            NS,
            "patch",
            "deployment",
            "other",
            "--subresource=scale",
            "--type=merge",
            "-p",
            r#"{"spec":{"replicas":0}}"#,
        ],
        &["-n", NS, "get", "deployment", "other"],
        &["-n", NS, "get", "daemonset", "other"],
        &["-n", NS, "get", "secrets"],
        &["-n", NS, "get", "lease", "other"],
        &["-n", NS, "get", "pods"],
        &["get", "nodes"],
        &["create", "-f", &n3],
    ] {
        let out = as_hook(args);
        assert!(!out.status.success(), "{args:?} allowed: {}", text(&out));
        assert!(
            text(&out).to_lowercase().contains("forbidden"),
            "{args:?}: {}",
            text(&out)
        );
    }
}
