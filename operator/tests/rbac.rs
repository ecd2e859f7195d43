//! deploy/'s RBAC and admission policies on a real API server: an agent
//! writes only its own node's NetResourceSet status, ResourceSlice and
//! claims' status, and the operator's and the agent's service accounts are
//! refused everything they were not given.
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

/// Policies are loaded asynchronously after they are created: `args` as
/// `kubeconfig` until refused (30 s at most; a write that lands meanwhile
/// is a failure only at the end); the refusal's message.
fn refused_eventually(cp: &ControlPlane, kubeconfig: &Path, args: &[&str]) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        match as_user(cp, kubeconfig, args) {
            Err(e) => return e,
            Ok(_) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(250))
            }
            Ok(out) => panic!("{args:?} was never refused: {out}"),
        }
    }
}

/// A ResourceSlice of `driver` for `node`, as enimd publishes one, written
/// to a file for `kubectl create -f`.
fn slice_file(cp: &ControlPlane, node: &str, driver: &str) -> String {
    let yaml = format!(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceSlice\nmetadata:\n  name: {node}-{driver}\nspec:\n  driver: {driver}\n  nodeName: {node}\n  pool: {{name: {node}, generation: 1, resourceSliceCount: 1}}\n  devices:\n  - name: eni-e2e-0\n    attributes:\n      subnet: {{string: subnet-a}}\n"
    );
    let path = cp.dir().join(format!("slice-{node}-{driver}.yaml"));
    std::fs::write(&path, yaml).unwrap();
    path.display().to_string()
}

/// A claim for one ENI, allocated (by the admin, as the scheduler would)
/// `eni-e2e-0` of `pool` by `driver`.
fn allocated_claim(cp: &ControlPlane, name: &str, driver: &str, pool: &str) {
    cp.apply(&format!(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  devices:\n    requests:\n    - name: eni\n      exactly: {{deviceClassName: eni.enim.io}}\n"
    ));
    let allocation = format!(
        r#"{{"status":{{"allocation":{{"devices":{{"results":[{{"request":"eni","driver":"{driver}","pool":"{pool}","device":"eni-e2e-0"}}]}}}}}}}}"#
    );
    cp.kubectl(&[
        "patch",
        "resourceclaim",
        name,
        "-n",
        "default",
        "--subresource=status",
        "--type=merge",
        "-p",
        &allocation,
    ]);
}

/// The agent's write after ADD, as enimd makes it (server-side apply of
/// the status, which needs no read of it first): the device's networkData.
fn network_data_apply(cp: &ControlPlane, claim: &str, driver: &str, pool: &str) -> Vec<String> {
    let yaml = format!(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata:\n  name: {claim}\n  namespace: default\nstatus:\n  devices:\n  - driver: {driver}\n    pool: {pool}\n    device: eni-e2e-0\n    networkData:\n      interfaceName: eth0\n      ips: [10.251.0.10/24]\n"
    );
    let path = cp.dir().join(format!("status-{claim}.yaml"));
    std::fs::write(&path, yaml).unwrap();
    [
        "apply",
        "--server-side",
        "--field-manager=enimd",
        "--subresource=status",
        "-f",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([path.display().to_string()])
    .collect()
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
        "06-deviceclass.yaml",
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

    // DRA: node-a's agent creates and patches its own node's ResourceSlice;
    // one for node-b, one of another driver, and a write to node-b's slice
    // (made here by the admin) are refused, and it deletes none (the
    // kubelet's job once the plugin is gone).
    let b_slice = slice_file(&cp, "node-b", "enim.io");
    let e = refused_eventually(&cp, &agent_a, &["create", "-f", &b_slice]);
    assert!(
        e.contains("enimd on node node-a may not write a ResourceSlice of node node-b"),
        "{e}"
    );
    as_user(
        &cp,
        &agent_a,
        &["create", "-f", &slice_file(&cp, "node-a", "enim.io")],
    )
    .expect("own node's slice");
    let gpu = slice_file(&cp, "node-a", "gpu.example.com");
    let e = as_user(&cp, &agent_a, &["create", "-f", &gpu]).expect_err("another driver");
    assert!(
        e.contains("enimd may write only ResourceSlices of the driver enim.io"),
        "{e}"
    );
    cp.kubectl(&["create", "-f", &b_slice]);
    let bump = r#"{"spec":{"pool":{"generation":2}}}"#;
    let patch = |name: &str| {
        as_user(
            &cp,
            &agent_a,
            &["patch", "resourceslice", name, "--type=merge", "-p", bump],
        )
    };
    let e = patch("node-b-enim.io").expect_err("node-b's slice");
    assert!(
        e.contains("enimd on node node-a may not write a ResourceSlice of node node-b"),
        "{e}"
    );
    patch("node-a-enim.io").expect("own slice");
    let e = as_user(
        &cp,
        &agent_a,
        &["delete", "resourceslice", "node-a-enim.io"],
    )
    .expect_err("delete");
    assert!(e.contains("forbidden"), "{e}");

    // And the status of a claim allocated an ENI of its own node only: not
    // node-b's, nor a claim of another driver's devices alone.
    allocated_claim(&cp, "claim-a", "enim.io", "node-a");
    allocated_claim(&cp, "claim-b", "enim.io", "node-b");
    allocated_claim(&cp, "claim-gpu", "gpu.example.com", "node-a");
    let e = refused_eventually(
        &cp,
        &agent_a,
        &strs(&network_data_apply(&cp, "claim-b", "enim.io", "node-b")),
    );
    assert!(
        e.contains(
            "enimd on node node-a may not write the status of ResourceClaim default/claim-b"
        ),
        "{e}"
    );
    let e = as_user(
        &cp,
        &agent_a,
        &strs(&network_data_apply(
            &cp,
            "claim-gpu",
            "gpu.example.com",
            "node-a",
        )),
    )
    .expect_err("a claim of another driver");
    assert!(
        e.contains("may not write the status of ResourceClaim default/claim-gpu"),
        "{e}"
    );
    as_user(
        &cp,
        &agent_a,
        &strs(&network_data_apply(&cp, "claim-a", "enim.io", "node-a")),
    )
    .expect("own claim's status");
    let ifname = cp.kubectl(&[
        "get",
        "resourceclaim",
        "claim-a",
        "-n",
        "default",
        "-o",
        "jsonpath={.status.devices[0].networkData.interfaceName}",
    ]);
    assert_eq!(ifname.trim(), "eth0");

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
        ("watch", "resourceclaims.resource.k8s.io", None),
    ] {
        assert!(can(verb, what, ns), "operator cannot {verb} {what}");
    }
    for (verb, what, ns) in [
        ("delete", "netresourcesets.enim.io", None),
        ("patch", "nodes", None),
        ("get", "secrets", Some(NS)),
        ("list", "pods", None),
        ("patch", "leases.coordination.k8s.io", Some("kube-system")),
        ("patch", "resourceclaims.resource.k8s.io", None),
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
