//! deploy/'s RBAC and admission policy on a real API server: an agent writes
//! only its own node's NetResourceSet status, and the operator's and the
//! agent's service accounts are refused everything they were not given.
//!
//! Tokens are made as the kubelet's are: bound to a pod on a node, so the
//! API server puts the node's name in the token's
//! `authentication.kubernetes.io/node-name` extra.

use std::path::{Path, PathBuf};

use enim_testkit::apiserver::ControlPlane;

const NS: &str = "enim-system";

fn deploy(file: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn node(name: &str) -> String {
    format!("apiVersion: v1\nkind: Node\nmetadata:\n  name: {name}\n")
}

fn set(name: &str) -> String {
    format!(
        "apiVersion: enim.io/v1alpha1\nkind: NetResourceSet\nmetadata:\n  name: {name}\nspec:\n  instance: {{provider: static, id: {name}}}\n  mode: primary\n  watermarks: {{preAllocate: 1, minAllocate: 1, maxAboveWatermark: 1}}\n  enis: []\n"
    )
}

/// The agent's pod on `node`, so that a token bound to it names the node.
fn agent_pod(name: &str, node: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {NS}\nspec:\n  nodeName: {node}\n  serviceAccountName: enimd\n  containers:\n  - name: enimd\n    image: enim:0.1.0\n"
    )
}

/// A kubeconfig for `sa` with a token bound to pod `pod` (or unbound).
fn token(cp: &ControlPlane, sa: &str, pod: Option<&str>) -> PathBuf {
    let mut args = vec!["create", "token", sa, "-n", NS, "--duration=1h"];
    let uid;
    let bound;
    if let Some(pod) = pod {
        uid = cp.kubectl(&[
            "get",
            "pod",
            pod,
            "-n",
            NS,
            "-o",
            "jsonpath={.metadata.uid}",
        ]);
        bound = format!("--bound-object-name={pod}");
        args.extend(["--bound-object-kind=Pod", &bound, "--bound-object-uid"]);
        args.push(&uid);
    }
    let token = cp.kubectl(&args);
    cp.token_kubeconfig(&format!("{sa}-{}", pod.unwrap_or("unbound")), token.trim())
}

/// `kubectl ARGS` with `kubeconfig`: Ok(stdout) or Err(stderr).
fn as_user(cp: &ControlPlane, kubeconfig: &Path, args: &[&str]) -> Result<String, String> {
    let kc = format!("--kubeconfig={}", kubeconfig.display());
    let mut all = vec![kc.as_str()];
    all.extend_from_slice(args);
    // The admin kubeconfig flag comes first; kubectl takes the last one.
    let out = cp.kubectl_output(&all);
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

fn status_patch(name: &str, used: u32) -> Vec<String> {
    vec![
        "patch".into(),
        "netresourceset".into(),
        name.into(),
        "--subresource=status".into(),
        "--type=merge".into(),
        "-p".into(),
        format!(r#"{{"status":{{"summary":{{"enis":0,"used":{used},"available":0}}}}}}"#),
    ]
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn an_agent_writes_only_its_own_nodes_status_and_each_account_only_what_it_was_given() {
    let Some(cp) = ControlPlane::start() else {
        return;
    };
    for file in [
        "00-namespace.yaml",
        "05-crd-netresourceset.yaml",
        "10-serviceaccount.yaml",
        "11-rbac-agent.yaml",
        "50-operator.yaml",
    ] {
        cp.apply(&deploy(file));
    }
    cp.kubectl(&[
        "wait",
        "--for=condition=Established",
        "crd/netresourcesets.enim.io",
        "--timeout=60s",
    ]);
    for n in ["node-a", "node-b"] {
        cp.apply(&node(n));
        cp.apply(&set(n));
        cp.apply(&agent_pod(&format!("enimd-{n}"), n));
    }
    let agent_a = token(&cp, "enimd", Some("enimd-node-a"));

    // The policy is loaded asynchronously after it is created: wait until
    // it refuses node-b's write for node-a's agent (and fail if it never
    // does), then check every case once.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let refused = loop {
        match as_user(&cp, &agent_a, &strs(&status_patch("node-b", 1))) {
            Err(e) => break e,
            Ok(_) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(250))
            }
            Ok(out) => panic!("node-a's agent wrote node-b's status: {out}"),
        }
    };
    assert!(
        refused.contains("enimd on node node-a may not write the NetResourceSet of node-b"),
        "{refused}"
    );
    let b_used = cp.kubectl(&[
        "get",
        "nrs",
        "node-b",
        "-o",
        "jsonpath={.status.summary.used}",
    ]);
    assert_ne!(b_used.trim(), "1", "the refused write landed");

    // Its own node's status: allowed, and it lands.
    as_user(&cp, &agent_a, &strs(&status_patch("node-a", 2))).expect("own status");
    let a_used = cp.kubectl(&[
        "get",
        "nrs",
        "node-a",
        "-o",
        "jsonpath={.status.summary.used}",
    ]);
    assert_eq!(a_used.trim(), "2");

    // RBAC: no spec writes, no create, no delete, even of its own object.
    let spec = r#"{"spec":{"draining":["eni-x"]}}"#;
    for args in [
        vec!["patch", "nrs", "node-a", "--type=merge", "-p", spec],
        vec!["delete", "nrs", "node-a"],
        vec!["get", "secrets", "-n", NS],
        vec!["get", "pods", "-A"],
    ] {
        let e = as_user(&cp, &agent_a, &args).expect_err(&args.join(" "));
        assert!(
            e.contains("Forbidden") || e.contains("forbidden"),
            "{args:?}: {e}"
        );
    }
    // Reads of NetResourceSets are allowed (see 11-rbac-agent.yaml).
    as_user(&cp, &agent_a, &["get", "nrs", "node-b"]).expect("read another node's set");

    // A token bound to no pod carries no node: it writes nothing.
    let unbound = token(&cp, "enimd", None);
    let e = as_user(&cp, &unbound, &strs(&status_patch("node-a", 3))).expect_err("unbound");
    assert!(
        e.contains("only with a token bound to a pod on a node"),
        "{e}"
    );

    // The operator: Nodes to read, NetResourceSets to create and patch,
    // its Lease; nothing else.
    let operator = token(&cp, "enim-operator", None);
    let can = |verb: &str, what: &str, ns: Option<&str>| {
        let mut args = vec!["auth", "can-i", verb, what];
        if let Some(ns) = ns {
            args.extend(["-n", ns]);
        }
        as_user(&cp, &operator, &args).is_ok()
    };
    for (verb, what, ns) in [
        ("list", "nodes", None),
        ("watch", "netresourcesets.enim.io", None),
        ("create", "netresourcesets.enim.io", None),
        ("patch", "netresourcesets.enim.io", None),
        ("patch", "leases.coordination.k8s.io", Some(NS)),
    ] {
        assert!(can(verb, what, ns), "operator cannot {verb} {what}");
    }
    for (verb, what, ns) in [
        ("delete", "netresourcesets.enim.io", None),
        ("patch", "nodes", None),
        ("get", "secrets", Some(NS)),
        ("list", "pods", None),
        ("patch", "leases.coordination.k8s.io", Some("kube-system")),
    ] {
        assert!(!can(verb, what, ns), "operator may {verb} {what} in {ns:?}");
    }
    // And real refused requests, not only can-i: the agents' status is
    // not the operator's to write.
    let e = as_user(&cp, &operator, &["delete", "nrs", "node-a"]).expect_err("delete");
    assert!(e.contains("forbidden"), "{e}");
    let e = as_user(&cp, &operator, &strs(&status_patch("node-a", 4))).expect_err("status");
    assert!(e.contains("forbidden"), "{e}");
}
