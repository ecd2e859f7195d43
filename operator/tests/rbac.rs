//! deploy/'s RBAC and admission policies on a real API server: an agent
//! writes only its own node's NetResourceSet status, its node's
//! ResourceSlice (by name, nodeName and pool), Events (create and patch,
//! nothing more) and, in the status of claims
//! already allocated its node's devices, those devices' entries; and the
//! operator's and the agent's service accounts are refused everything they
//! were not given.
//!
//! Tokens are made as the kubelet's are: bound to a pod on a node, so the
//! API server puts the node's name in the token's
//! `authentication.kubernetes.io/node-name` extra.

use std::path::{Path, PathBuf};

use enim_testkit::apiserver::ControlPlane;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Patch, PatchParams};
use kube::config::Kubeconfig;
use serde::Deserialize;

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

/// A control plane with deploy/'s `files` applied; `None` where it cannot
/// start (the test skips).
fn control_plane_with(files: &[&str]) -> Option<ControlPlane> {
    let cp = ControlPlane::start()?;
    for file in files {
        cp.apply(&deploy(file));
    }
    Some(cp)
}

/// Nodes node-a and node-b, each with its agent's pod `enimd-<node>`.
fn nodes_with_agents(cp: &ControlPlane) {
    for n in ["node-a", "node-b"] {
        cp.apply(&node(n));
        cp.apply(&agent_pod(&format!("enimd-{n}"), n));
    }
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

#[test]
fn an_agent_writes_only_its_own_nodes_status_and_each_account_only_what_it_was_given() {
    let Some(cp) = control_plane_with(&[
        "00-namespace.yaml",
        "05-crd-netresourceset.yaml",
        "10-serviceaccount.yaml",
        "11-rbac-agent.yaml",
        "06-deviceclass.yaml",
        "50-operator.yaml",
    ]) else {
        return;
    };
    cp.kubectl(&[
        "wait",
        "--for=condition=Established",
        "crd/netresourcesets.enim.io",
        "--timeout=60s",
    ]);
    nodes_with_agents(&cp);
    for n in ["node-a", "node-b"] {
        cp.apply(&set(n));
    }
    let agent_a = token(&cp, "enimd", Some("enimd-node-a"));

    // Wait until the policy refuses node-b's write for node-a's agent (and
    // fail if it never does), then check every case once.
    let refused = refused_eventually(&cp, &agent_a, &strs(&status_patch("node-b", 1)));
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
    // Events: create and patch (a pod's refusal in its namespace, the
    // Node's in "default"); no read, no delete, not the core group's.
    let agent_can = |verb: &str, what: &str, ns: &str| {
        as_user(&cp, &agent_a, &["auth", "can-i", verb, what, "-n", ns]).is_ok()
    };
    for (verb, ns) in [("create", "apps"), ("patch", "default")] {
        assert!(
            agent_can(verb, "events.events.k8s.io", ns),
            "agent cannot {verb} events in {ns}"
        );
    }
    for (verb, what) in [
        ("list", "events.events.k8s.io"),
        ("delete", "events.events.k8s.io"),
        ("create", "events"),
    ] {
        assert!(!agent_can(verb, what, "default"), "agent may {verb} {what}");
    }

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
        ("watch", "resourceclaims.resource.k8s.io", None),
        // Events on sets and Nodes ("default") and on claims (theirs).
        ("create", "events.events.k8s.io", Some("default")),
        ("patch", "events.events.k8s.io", Some("apps")),
    ] {
        assert!(can(verb, what, ns), "operator cannot {verb} {what}");
    }
    for (verb, what, ns) in [
        ("delete", "events.events.k8s.io", Some("default")),
        ("list", "events.events.k8s.io", None),
        ("create", "events", Some("default")),
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

// DRA: the agent's ResourceSlice and its claims' status.

/// Every case is tried, and the test fails at the end with each one that
/// went wrong: a run shows all of the policy's holes at once.
struct Findings<'a> {
    cp: &'a ControlPlane,
    wrong: Vec<String>,
}

impl Findings<'_> {
    /// `args` as `kubeconfig` must be refused with a message holding `want`.
    fn refused(&mut self, case: &str, kubeconfig: &Path, args: &[&str], want: &str) {
        let outcome = as_user(self.cp, kubeconfig, args);
        self.refusal(case, outcome, want);
    }

    /// `outcome` must be a refusal with a message holding `want`.
    fn refusal(&mut self, case: &str, outcome: Result<String, String>, want: &str) {
        match outcome {
            Ok(out) => self.wrong.push(format!("{case}: allowed ({})", out.trim())),
            Err(e) if !e.contains(want) => self.wrong.push(format!(
                "{case}: refused, but not with {want:?}: {}",
                e.trim()
            )),
            Err(_) => {}
        }
    }

    /// `args` as `kubeconfig` must succeed.
    fn allowed(&mut self, case: &str, kubeconfig: &Path, args: &[&str]) {
        if let Err(e) = as_user(self.cp, kubeconfig, args) {
            self.wrong.push(format!("{case}: refused: {}", e.trim()));
        }
    }

    /// The admin's `kubectl get ... -o jsonpath` must print `want`.
    fn holds(&mut self, case: &str, get: &[&str], want: &str) {
        let out = self.cp.kubectl_output(get);
        let got = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            let e = String::from_utf8_lossy(&out.stderr);
            self.wrong.push(format!("{case}: {get:?}: {}", e.trim()));
        } else if got.trim() != want {
            self.wrong
                .push(format!("{case}: {get:?} is {:?}, not {want:?}", got.trim()));
        }
    }
}

/// `yaml` in a file of the control plane's directory, for `kubectl -f`.
fn manifest_file(cp: &ControlPlane, tag: &str, yaml: &str) -> String {
    let path = cp.dir().join(format!("{tag}.yaml"));
    std::fs::write(&path, yaml).unwrap();
    path.display().to_string()
}

/// A ResourceSlice named `name` of `driver` for `node_name` in `pool`.
#[derive(Clone, Copy)]
struct Slice<'a> {
    name: &'a str,
    driver: &'a str,
    node_name: &'a str,
    pool: &'a str,
    generation: u32,
}

impl Slice<'_> {
    /// The manifest, owned by the Node of uid `owner_uid` if given.
    fn yaml(&self, owner_uid: Option<&str>) -> String {
        let owner = owner_uid.map_or(String::new(), |uid| {
            format!(
                "  ownerReferences:\n  - {{apiVersion: v1, kind: Node, name: {}, uid: {uid}}}\n",
                self.node_name
            )
        });
        format!(
            "apiVersion: resource.k8s.io/v1\nkind: ResourceSlice\nmetadata:\n  name: {name}\n{owner}spec:\n  driver: {driver}\n  nodeName: {node}\n  pool: {{name: {pool}, generation: {generation}, resourceSliceCount: 1}}\n  devices:\n  - name: eni-e2e-0\n    attributes:\n      subnet: {{string: subnet-a}}\n",
            name = self.name,
            driver = self.driver,
            node = self.node_name,
            pool = self.pool,
            generation = self.generation,
        )
    }

    /// `kubectl create -f` of it.
    fn create(&self, cp: &ControlPlane) -> Vec<String> {
        let tag = format!("create-{}-{}-{}", self.name, self.node_name, self.pool);
        let file = manifest_file(cp, &tag, &self.yaml(None));
        vec!["create".into(), "-f".into(), file]
    }

    /// enimd's write: server-side apply under its field manager, forced,
    /// owned by the Node.
    fn apply(&self, cp: &ControlPlane, owner_uid: &str) -> Vec<String> {
        let tag = format!("apply-{}-{}", self.name, self.generation);
        let file = manifest_file(cp, &tag, &self.yaml(Some(owner_uid)));
        [
            "apply",
            "--server-side",
            "--field-manager=enimd",
            "--force-conflicts",
            "-f",
            &file,
        ]
        .map(String::from)
        .to_vec()
    }
}

/// A slice of enim.io for `node` in its pool, at `generation`; enimd
/// names it `<node>-enim.io` (src/dra/slices.rs), the cases name it.
fn own_slice(node: &str, generation: u32) -> Slice<'_> {
    Slice {
        name: "",
        driver: "enim.io",
        node_name: node,
        pool: node,
        generation,
    }
}

/// Claim `namespace/name`, one request per result, allocated (by the
/// admin, as the scheduler would) `results`: (driver, pool, device).
fn allocated_claim(cp: &ControlPlane, namespace: &str, name: &str, results: &[(&str, &str, &str)]) {
    let requests: String = (0..results.len().max(1))
        .map(|i| format!("    - name: r{i}\n      exactly: {{deviceClassName: eni.enim.io}}\n"))
        .collect();
    cp.apply(&format!(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata:\n  name: {name}\n  namespace: {namespace}\nspec:\n  devices:\n    requests:\n{requests}"
    ));
    if results.is_empty() {
        return;
    }
    let results: Vec<String> = results
        .iter()
        .enumerate()
        .map(|(i, (driver, pool, device))| {
            format!(
                r#"{{"request":"r{i}","driver":"{driver}","pool":"{pool}","device":"{device}"}}"#
            )
        })
        .collect();
    let allocation = format!(
        r#"{{"status":{{"allocation":{{"devices":{{"results":[{}]}}}}}}}}"#,
        results.join(",")
    );
    cp.kubectl(&[
        "patch",
        "resourceclaim",
        name,
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        &allocation,
    ]);
}

/// A merge patch of claim `namespace/claim`'s status with `patch`, as
/// `kubeconfig`'s user: one PATCH, as any client may send it (kubectl
/// patch would first get the status subresource, which the agent may not).
/// Ok, or Err(the API server's refusal).
fn claim_status_merge(
    kubeconfig: &Path,
    namespace: &str,
    claim: &str,
    patch: &str,
) -> Result<String, String> {
    let patch: serde_json::Value = serde_json::from_str(patch).expect("a JSON patch");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let kubeconfig = Kubeconfig::read_from(kubeconfig).expect("the token's kubeconfig");
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .expect("a client config");
        let client = kube::Client::try_from(config).expect("a client");
        let claims: kube::Api<ResourceClaim> = kube::Api::namespaced(client, namespace);
        claims
            .patch_status(claim, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| format!("{namespace}/{claim} patched"))
            .map_err(|e| e.to_string())
    })
}

/// A write of claim `default/claim`'s status as enimd makes it after ADD
/// (src/dra/status.rs), by field manager `manager`: server-side apply,
/// forced, of `entries` (driver, pool, device): each device's networkData
/// with `interface`, and nothing else. No entries: the manager's own
/// entries go (enimd's detach).
fn network_data_apply(
    cp: &ControlPlane,
    manager: &str,
    claim: &str,
    interface: &str,
    entries: &[(&str, &str, &str)],
) -> Vec<String> {
    let devices: String = entries
        .iter()
        .map(|(driver, pool, device)| {
            format!("  - driver: {driver}\n    pool: {pool}\n    device: {device}\n    networkData:\n      interfaceName: {interface}\n      ips: [10.251.0.10/24]\n")
        })
        .collect();
    let devices = if devices.is_empty() {
        " []\n".to_string()
    } else {
        format!("\n{devices}")
    };
    let yaml = format!(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata:\n  name: {claim}\n  namespace: default\nstatus:\n  devices:{devices}"
    );
    let tag = format!("status-{manager}-{claim}-{}", entries.len());
    let file = manifest_file(cp, &tag, &yaml);
    [
        "apply",
        "--server-side",
        &format!("--field-manager={manager}"),
        "--force-conflicts",
        "--subresource=status",
        "-f",
        &file,
    ]
    .map(String::from)
    .to_vec()
}

/// `cel` with each `variables.NAME` written out as `(its expression)`.
fn expand_variables(cel: &str, variables: &[(String, String)]) -> String {
    const PREFIX: &str = "variables.";
    let mut out = String::new();
    let mut rest = cel;
    while let Some(at) = rest.find(PREFIX) {
        out.push_str(&rest[..at]);
        let after = &rest[at + PREFIX.len()..];
        let end = after
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(after.len());
        let (_, expression) = variables
            .iter()
            .find(|(name, _)| name == &after[..end])
            .unwrap_or_else(|| panic!("no variable {:?} before {cel:?}", &after[..end]));
        out.push_str(&format!("({expression})"));
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// Policy `name` of 11-rbac-agent.yaml as an unbound copy the type checker
/// reads in full: for resource.k8s.io/v1 alone, of the resource rather
/// than its subresource, its variables written out in its validations.
/// Its name, and its manifest.
fn type_checkable_copy(name: &str) -> (String, String) {
    let manifests = deploy("11-rbac-agent.yaml");
    for doc in serde_yaml::Deserializer::from_str(&manifests) {
        let mut v = serde_yaml::Value::deserialize(doc).expect("a YAML document");
        if v["kind"] != "ValidatingAdmissionPolicy" || v["metadata"]["name"] != name {
            continue;
        }
        let copy = format!("{name}-typed");
        v["metadata"]["name"] = copy.clone().into();
        let rules = v["spec"]["matchConstraints"]["resourceRules"]
            .as_sequence_mut()
            .expect("resourceRules");
        for rule in rules {
            rule["apiVersions"] = vec!["v1"].into();
            let resources: Vec<String> = rule["resources"]
                .as_sequence()
                .expect("resources")
                .iter()
                .map(|r| r.as_str().unwrap().split('/').next().unwrap().to_owned())
                .collect();
            rule["resources"] = resources.into();
        }
        let spec = v["spec"].as_mapping_mut().expect("spec");
        let mut variables: Vec<(String, String)> = vec![];
        let declared = spec.remove("variables").unwrap_or_default();
        for var in declared.as_sequence().into_iter().flatten() {
            let expression = expand_variables(var["expression"].as_str().unwrap(), &variables);
            variables.push((var["name"].as_str().unwrap().to_owned(), expression));
        }
        let validations = spec["validations"].as_sequence_mut().expect("validations");
        for validation in validations {
            for key in ["expression", "messageExpression"] {
                if let Some(cel) = validation.get(key).and_then(|e| e.as_str()) {
                    validation[key] = expand_variables(cel, &variables).into();
                }
            }
        }
        return (copy, serde_yaml::to_string(&v).unwrap());
    }
    panic!("11-rbac-agent.yaml has no ValidatingAdmissionPolicy {name}");
}

/// kube-controller-manager running only the controller that type-checks
/// each ValidatingAdmissionPolicy into its status; killed on drop.
struct PolicyTypeChecker(std::process::Child);

impl PolicyTypeChecker {
    fn start(cp: &ControlPlane) -> PolicyTypeChecker {
        let bin = enim_testkit::apiserver::bin_dir().expect("the binaries the control plane runs");
        let kubeconfig = format!("{}", cp.admin_kubeconfig().display());
        let log = std::fs::File::create(cp.dir().join("policy-type-checker.log")).unwrap();
        let child = std::process::Command::new(bin.join("kube-controller-manager"))
            .args(
                [
                    "--kubeconfig",
                    "--authentication-kubeconfig",
                    "--authorization-kubeconfig",
                ]
                .map(|flag| format!("{flag}={kubeconfig}")),
            )
            .args([
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                "--secure-port=0",
                "--controllers=validatingadmissionpolicy-status-controller",
            ])
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start kube-controller-manager");
        PolicyTypeChecker(child)
    }
}

impl Drop for PolicyTypeChecker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const ENI_A: (&str, &str, &str) = ("enim.io", "node-a", "eni-e2e-0");
const ENI_B: (&str, &str, &str) = ("enim.io", "node-b", "eni-e2e-0");
const GPU_A: (&str, &str, &str) = ("gpu.example.com", "node-a", "gpu-0");

#[test]
fn an_agent_writes_only_its_own_nodes_slice_and_the_network_data_of_its_nodes_devices() {
    let Some(cp) = control_plane_with(&[
        "00-namespace.yaml",
        "10-serviceaccount.yaml",
        "11-rbac-agent.yaml",
        "06-deviceclass.yaml",
    ]) else {
        return;
    };
    cp.apply("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: victim\n");
    nodes_with_agents(&cp);
    let agent_a = token(&cp, "enimd", Some("enimd-node-a"));
    let agent_b = token(&cp, "enimd", Some("enimd-node-b"));
    let unbound = token(&cp, "enimd", None);
    let uid = |n: &str| cp.kubectl(&["get", "node", n, "-o", "jsonpath={.metadata.uid}"]);
    let (uid_a, uid_b) = (uid("node-a"), uid("node-b"));
    let mut f = Findings {
        cp: &cp,
        wrong: vec![],
    };

    // Each policy type-checked against the resources' schemas (a misspelt
    // field, `==` of mismatched types, a function on the wrong type): no
    // warning. The server checks no policy of every version (`*`) or of a
    // subresource, as these are, nor variables: it checks an unbound copy
    // for v1, of the claim for the claim's status (the same object), with
    // the variables written out.
    let _checker = PolicyTypeChecker::start(&cp);
    for policy in ["enim-agent-own-slices", "enim-agent-own-claims"] {
        let (copy, yaml) = type_checkable_copy(policy);
        cp.apply(&yaml);
        let status = |path: &str| {
            let path = format!("jsonpath={{.status{path}}}");
            cp.kubectl(&["get", "validatingadmissionpolicy", &copy, "-o", &path])
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while status(".observedGeneration").trim().is_empty() {
            assert!(
                std::time::Instant::now() < deadline,
                "{copy} never type-checked"
            );
            std::thread::sleep(std::time::Duration::from_millis(250));
        }
        let warnings = status(".typeChecking.expressionWarnings");
        assert!(warnings.trim().is_empty(), "{policy}: {warnings}");
    }

    // Slices. Wait until the policy refuses node-a's agent node-b's slice
    // (and fail if it never does), then try each case once.
    let b_slice = Slice {
        name: "node-b-enim.io",
        ..own_slice("node-b", 1)
    };
    let e = refused_eventually(&cp, &agent_a, &strs(&b_slice.create(&cp)));
    assert!(
        e.contains("enimd on node node-a may not write a ResourceSlice of node node-b"),
        "{e}"
    );
    for (case, slice, want) in [
        (
            "node-b's slice name and pool, nodeName node-a",
            Slice {
                name: "node-b-enim.io",
                pool: "node-b",
                ..own_slice("node-a", 1)
            },
            "enimd on node node-a may write only the ResourceSlice named node-a-enim.io, \
             not node-b-enim.io",
        ),
        (
            "node-b's slice name, nodeName and pool node-a",
            Slice {
                name: "node-b-enim.io",
                ..own_slice("node-a", 1)
            },
            "may write only the ResourceSlice named node-a-enim.io, not node-b-enim.io",
        ),
        (
            "its own slice name, in pool node-b",
            Slice {
                name: "node-a-enim.io",
                pool: "node-b",
                ..own_slice("node-a", 1)
            },
            "enimd on node node-a may not write ResourceSlice node-a-enim.io in pool node-b",
        ),
        (
            "a slice of its node under another name",
            Slice {
                name: "spare-enim.io",
                ..own_slice("node-a", 1)
            },
            "may write only the ResourceSlice named node-a-enim.io, not spare-enim.io",
        ),
        (
            "its own slice name, of another driver",
            Slice {
                name: "node-a-enim.io",
                driver: "gpu.example.com",
                ..own_slice("node-a", 1)
            },
            "enimd may write only ResourceSlices of the driver enim.io",
        ),
    ] {
        f.refused(case, &agent_a, &strs(&slice.create(&cp)), want);
    }
    f.refused(
        "a slice with an unbound token",
        &unbound,
        &strs(&b_slice.create(&cp)),
        "enimd may write a ResourceSlice only with a token bound to a pod on a node",
    );

    // Its own slice as enimd writes it: created, then a new generation.
    let a_slice = |generation| Slice {
        name: "node-a-enim.io",
        ..own_slice("node-a", generation)
    };
    f.allowed(
        "node-a's slice, created",
        &agent_a,
        &strs(&a_slice(1).apply(&cp, &uid_a)),
    );
    f.allowed(
        "node-a's slice, patched",
        &agent_a,
        &strs(&a_slice(2).apply(&cp, &uid_a)),
    );
    f.holds(
        "node-a's slice, patched",
        &[
            "get",
            "resourceslice",
            "node-a-enim.io",
            "-o",
            "jsonpath={.spec.pool.generation}",
        ],
        "2",
    );
    // Nothing of node-a's squatting landed: node-b's agent publishes.
    f.allowed(
        "node-b's slice, by node-b's agent",
        &agent_b,
        &strs(&b_slice.apply(&cp, &uid_b)),
    );
    let b_later = Slice {
        generation: 2,
        ..b_slice
    };
    f.refused(
        "node-b's slice, patched by node-a's agent",
        &agent_a,
        &strs(&b_later.apply(&cp, &uid_b)),
        "enimd on node node-a may not write a ResourceSlice of node node-b",
    );
    // And none is deleted by an agent (the kubelet's job once the plugin
    // is gone): RBAC.
    f.refused(
        "its own slice, deleted",
        &agent_a,
        &["delete", "resourceslice", "node-a-enim.io"],
        "forbidden",
    );

    // Claims, each allocated by the admin as the scheduler would, and the
    // GPU driver's entry in the mixed claim's status.
    allocated_claim(&cp, "victim", "pending", &[]);
    allocated_claim(&cp, "default", "claim-a", &[ENI_A]);
    allocated_claim(&cp, "default", "claim-b", &[ENI_B]);
    allocated_claim(&cp, "default", "claim-gpu", &[GPU_A]);
    allocated_claim(&cp, "default", "claim-mixed", &[ENI_A, GPU_A]);
    // enimd's own write of a claim's status: eth0 on `entries`.
    let enimd_writes = |claim: &str, entries: &[(&str, &str, &str)]| {
        network_data_apply(&cp, "enimd", claim, "eth0", entries)
    };
    cp.kubectl(&strs(&network_data_apply(
        &cp,
        "gpu-driver",
        "claim-mixed",
        "ib0",
        &[GPU_A],
    )));

    let e = refused_eventually(&cp, &agent_a, &strs(&enimd_writes("claim-b", &[ENI_B])));
    assert!(
        e.contains(
            "enimd on node node-a may not write the status of ResourceClaim default/claim-b"
        ),
        "{e}"
    );
    // The write reproduced in issue #29: an allocation of node-a's device
    // to a claim the scheduler has not allocated yet.
    let steal = r#"{"status":{"allocation":{"devices":{"results":[{"request":"r0","driver":"enim.io","pool":"node-a","device":"eni-e2e-0"}]},"nodeSelector":{"nodeSelectorTerms":[{"matchFields":[{"key":"metadata.name","operator":"In","values":["node-a"]}]}]}}}}"#;
    f.refusal(
        "an allocation of a pending claim",
        claim_status_merge(&agent_a, "victim", "pending", steal),
        "enimd on node node-a may not write the status of ResourceClaim victim/pending: \
         not allocated an enim.io device",
    );
    let allocation = |ns: &str, claim: &str| {
        ["get", "resourceclaim", claim, "-n", ns, "-o"]
            .into_iter()
            .chain(["jsonpath={.status.allocation.devices.results[*].device}"])
            .map(String::from)
            .collect::<Vec<_>>()
    };
    f.holds(
        "an allocation of a pending claim",
        &strs(&allocation("victim", "pending")),
        "",
    );
    // The API server itself refuses a changed allocation; clearing one is
    // the change it lets through.
    f.refusal(
        "its own claim's allocation, cleared",
        claim_status_merge(
            &agent_a,
            "default",
            "claim-a",
            r#"{"status":{"allocation":null}}"#,
        ),
        "enimd on node node-a may not change the allocation of ResourceClaim default/claim-a",
    );
    f.holds(
        "its own claim's allocation, cleared",
        &strs(&allocation("default", "claim-a")),
        "eni-e2e-0",
    );
    let reserve = r#"{"status":{"reservedFor":[{"resource":"pods","name":"thief","uid":"4f1c2d3e-0000-4000-8000-000000000001"}]}}"#;
    f.refusal(
        "its own claim's reservedFor",
        claim_status_merge(&agent_a, "default", "claim-a", reserve),
        "enimd on node node-a may not change reservedFor of ResourceClaim default/claim-a",
    );
    let other_entries = "enimd on node node-a may write in ResourceClaim default/claim-mixed \
                         only the status of enim.io devices of pool node-a";
    f.refused(
        "networkData of another driver's device, in a claim of its own device",
        &agent_a,
        &strs(&enimd_writes("claim-mixed", &[ENI_A, GPU_A])),
        other_entries,
    );
    f.refusal(
        "another driver's entry, removed",
        claim_status_merge(
            &agent_a,
            "default",
            "claim-mixed",
            r#"{"status":{"devices":[]}}"#,
        ),
        other_entries,
    );
    f.refused(
        "a claim of another driver's device alone",
        &agent_a,
        &strs(&enimd_writes("claim-gpu", &[GPU_A])),
        "enimd on node node-a may not write the status of ResourceClaim default/claim-gpu: \
         not allocated an enim.io device",
    );
    f.refused(
        "node-a's claim, by node-b's agent",
        &agent_b,
        &strs(&enimd_writes("claim-a", &[ENI_A])),
        "enimd on node node-b may not write the status of ResourceClaim default/claim-a: \
         allocated enim.io devices of another node",
    );
    f.refused(
        "a claim's status with an unbound token",
        &unbound,
        &strs(&enimd_writes("claim-a", &[ENI_A])),
        "enimd may write a ResourceClaim status only with a token bound to a pod on a node",
    );

    // What enimd does: its devices' networkData, added and taken back.
    let interface = |claim: &str, driver: &str| {
        let path = format!(
            "jsonpath={{.status.devices[?(@.driver==\"{driver}\")].networkData.interfaceName}}"
        );
        ["get", "resourceclaim", claim, "-n", "default", "-o", &path]
            .map(String::from)
            .to_vec()
    };
    f.allowed(
        "its own claim's networkData",
        &agent_a,
        &strs(&enimd_writes("claim-a", &[ENI_A])),
    );
    f.holds(
        "its own claim's networkData",
        &strs(&interface("claim-a", "enim.io")),
        "eth0",
    );
    f.allowed(
        "its own entry in a claim of a GPU too",
        &agent_a,
        &strs(&enimd_writes("claim-mixed", &[ENI_A])),
    );
    f.holds(
        "its own entry in a claim of a GPU too",
        &strs(&interface("claim-mixed", "enim.io")),
        "eth0",
    );
    f.holds(
        "the GPU's entry, kept",
        &strs(&interface("claim-mixed", "gpu.example.com")),
        "ib0",
    );
    f.allowed(
        "its own claim's networkData, taken back",
        &agent_a,
        &strs(&enimd_writes("claim-a", &[])),
    );
    f.holds(
        "its own claim's networkData, taken back",
        &strs(&interface("claim-a", "enim.io")),
        "",
    );

    assert!(
        f.wrong.is_empty(),
        "{} case(s) went wrong:\n{}",
        f.wrong.len(),
        f.wrong.join("\n")
    );
}
