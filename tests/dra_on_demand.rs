//! A DRA claim no node can serve, end to end: a real kube-apiserver and
//! kube-scheduler, the real `enim-operator` against moto, and the real
//! `enimd` (cluster provider, DRA driver) with its ENIs in a namespace made
//! here. The pod's claim asks for a security group no ENI has; the
//! operator creates an ENI with it in moto and attaches it; this test
//! plugs a veth with the ENI's MAC into the node (what the cloud's hot-plug
//! does on a real instance); enimd publishes it in its ResourceSlice; the
//! real scheduler allocates it to the claim and binds the pod; then, as the
//! kubelet would, the test prepares the claim over the DRA socket and runs
//! CNI ADD with the pod's uid: the pod's netns gets exactly that ENI.
//!
//! Needs the workspace's `enim-operator` binary beside this test's (a
//! workspace `cargo test` builds it); skipped with a message without it,
//! failed under CI=true.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use enim::dra::v1::dra_plugin_client::DraPluginClient;
use enim::dra::v1::{Claim, NodePrepareResourcesRequest};
use enim_testkit::apiserver::ControlPlane;
use enim_testkit::fixtures::AgentPaths;
use enim_testkit::moto::{Env, INSTANCE_TYPE, REGION};
use enim_testkit::netns::NamedNetns;
use serde_json::{json, Value};

const NODE: &str = "node-od";
const ZONE: &str = "us-east-1a";

fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// The operator binary cargo built beside this test (target/<profile>/).
fn operator_bin() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let bin = exe.parent()?.parent()?.join("enim-operator");
    bin.is_file().then_some(bin)
}

fn get(cp: &ControlPlane, args: &[&str]) -> Value {
    let mut all = vec!["get"];
    all.extend(args);
    all.extend(["-o", "json"]);
    let out = cp.kubectl_output(&all);
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}

async fn eventually<T>(what: &str, limit: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = blocking(&mut check) {
            return v;
        }
        assert!(Instant::now() < deadline, "not within {limit:?}: {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn operator(bin: &Path, cp: &ControlPlane, env: &Env, dir: &Path) -> Killed {
    let config = dir.join("operator.toml");
    std::fs::write(
        &config,
        format!(
            r#"[operator]
cluster = "odtest"
mode = "primary"
subnets = ["{subnet}"]
resync_interval = "1s"
node_grace = "5m"

[operator.watermarks]
pre_allocate = 0
min_allocate = 0
max_above_watermark = 0

[cloud]
type = "aws"
region = "{REGION}"
credentials = {{ source = "static", access_key_id = "{key}", secret_access_key = "{secret}" }}
[cloud.api]
endpoint = "{endpoint}"
"#,
            subnet = env.subnet_id,
            endpoint = env.proxy.url,
            key = env.admin.access_key_id(),
            secret = env.admin.secret_access_key(),
        ),
    )
    .unwrap();
    let log = std::fs::File::create(dir.join("operator.log")).unwrap();
    let child = Command::new(bin)
        .arg("--config")
        .arg(&config)
        .args(["--namespace", "enim-system", "--health-addr", "127.0.0.1:0"])
        .env("KUBECONFIG", cp.admin_kubeconfig())
        .env("POD_NAME", "op-1")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    Killed(child)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_whose_claim_no_node_can_serve_runs_on_an_eni_made_for_it() {
    require_kernel!();
    let Some(bin) = operator_bin() else {
        let msg = "enim-operator is not built beside this test (run the workspace's tests)";
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true: {msg}"
        );
        eprintln!("SKIPPED: {msg}");
        return;
    };
    let Some(cp) = blocking(ControlPlane::start) else {
        return;
    };
    let cp = blocking(|| cp.with_scheduler());
    let Some(env) = Env::start().await else {
        return;
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    blocking(|| {
        let crd = std::fs::read_to_string(root.join("deploy/05-crd-netresourceset.yaml")).unwrap();
        cp.apply_crd(&crd, "crd/netresourcesets.enim.io");
        cp.apply(&std::fs::read_to_string(root.join("deploy/06-deviceclass.yaml")).unwrap());
        cp.kubectl(&["create", "namespace", "enim-system"]);
        // The ServiceAccount admission wants it (no controller makes it here).
        cp.kubectl(&["create", "serviceaccount", "default", "-n", "default"]);
        cp.apply(&format!(
            "apiVersion: v1\nkind: Node\nmetadata:\n  name: {NODE}\n  labels:\n    node.kubernetes.io/instance-type: {INSTANCE_TYPE}\n    topology.kubernetes.io/zone: {ZONE}\n    kubernetes.io/hostname: {NODE}\nspec:\n  providerID: aws:///{ZONE}/{instance}\n",
            instance = env.instance_id
        ));
        // Ready, with room for pods: what the scheduler looks at.
        let status = json!({"status": {
            "capacity": {"pods": "10", "cpu": "4", "memory": "8Gi"},
            "allocatable": {"pods": "10", "cpu": "4", "memory": "8Gi"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "test", "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                            "lastTransitionTime": "2026-01-01T00:00:00Z"}],
        }});
        cp.kubectl(&[
            "patch",
            "node",
            NODE,
            "--subresource=status",
            "--type=merge",
            "-p",
            &status.to_string(),
        ]);
        // Admission taints a new Node not-ready; no node controller lifts it.
        cp.kubectl(&[
            "taint",
            "node",
            NODE,
            "node.kubernetes.io/not-ready:NoSchedule-",
        ]);
    });
    let group = env.create_security_group("enim-od-db").await;
    let dir = tempfile::tempdir().unwrap();
    let _op = operator(&bin, &cp, &env, dir.path());

    // enimd: the cluster provider and the DRA driver, its ENIs in `host`.
    let host = NamedNetns::new("odhost");
    let paths = AgentPaths::in_dir(dir.path());
    let plugins = dir.path().join("plugins");
    let config = format!(
        "socket = {socket:?}\ncheckpoint = {checkpoint:?}\nhost_netns = {netns:?}\n\
         gc_interval = \"1s\"\ngc_grace = \"0s\"\n\
         [dra]\nenabled = true\nnode_name = {NODE:?}\nkubeconfig = {kc:?}\n\
         registry_dir = {reg:?}\nplugin_dir = {plug:?}\n\
         [provider]\ntype = \"cluster\"\nnode_name = {NODE:?}\nkubeconfig = {kc:?}\n",
        socket = paths.socket.display().to_string(),
        checkpoint = paths.checkpoint.display().to_string(),
        netns = host.path().display().to_string(),
        kc = cp.admin_kubeconfig().display().to_string(),
        reg = dir.path().join("registry").display().to_string(),
        plug = plugins.display().to_string(),
    );
    std::fs::write(&paths.config, config).unwrap();
    let mut agent = Agent::new(bins(), paths);
    agent.ready_timeout = Duration::from_secs(30);
    blocking(|| agent.restart());
    let conf = agent.net_conf("1.1.0");

    // The pod and its claim, which asks for a group no ENI has.
    let selector = format!(
        "device.attributes[\"sg.enim.io\"].?{}.orValue(false)",
        group.replace('-', "_")
    );
    let claim = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "db", "namespace": "default"},
        "spec": {"devices": {
            "requests": [{"name": "eni", "exactly": {"deviceClassName": "eni.enim.io",
                "selectors": [{"cel": {"expression": selector}}]}}],
            "config": [{"requests": ["eni"], "opaque": {"driver": "enim.io",
                "parameters": {"securityGroups": [group]}}}],
        }},
    });
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "db", "namespace": "default"},
        "spec": {
            "containers": [{"name": "c", "image": "busybox",
                "resources": {"claims": [{"name": "eni"}]}}],
            "resourceClaims": [{"name": "eni", "resourceClaimName": "db"}],
        },
    });
    let applied = Instant::now();
    blocking(|| {
        cp.apply(&claim.to_string());
        cp.apply(&pod.to_string());
    });

    // The operator makes the ENI; the "cloud" plugs its device.
    let (eni_id, mac) = eventually(
        "the operator publishes an ENI for the claim",
        Duration::from_secs(60),
        || {
            let nrs = get(&cp, &["netresourceset", NODE]);
            nrs["spec"]["enis"]
                .as_array()?
                .iter()
                .find(|e| e["claim"]["name"] == "db")
                .map(|e| {
                    (
                        e["id"].as_str().unwrap().to_string(),
                        e["mac"].as_str().unwrap().to_string(),
                    )
                })
        },
    )
    .await;
    let made = applied.elapsed();
    let in_moto = env.eni(&eni_id).await;
    let groups = in_moto.group_ids();
    assert_eq!(
        groups,
        [group.as_str()],
        "created in moto with the claim's group"
    );
    assert_eq!(in_moto.attached_instance(), Some(env.instance_id.as_str()));
    // Its far end in the "VPC", as a NIC's is: enim never hands out a veth
    // whose peer is in the host (docs/security.md).
    let vpc = NamedNetns::new("odvpc");
    host.ip(&[
        "link", "add", "od0", "address", &mac, "type", "veth", "peer", "name", "od0p", "netns",
        &vpc.name,
    ]);
    host.ip(&["link", "set", "od0", "up"]);

    // enimd publishes it; the scheduler allocates it and binds the pod.
    let device = eni_id.to_ascii_lowercase();
    let deadline = Instant::now() + Duration::from_secs(60);
    let bound = loop {
        let p = blocking(|| get(&cp, &["pod", "db", "-n", "default"]));
        if p["spec"]["nodeName"] == NODE {
            break p;
        }
        if Instant::now() > deadline {
            let slice = blocking(|| get(&cp, &["resourceslices"]));
            panic!(
                "the scheduler did not bind the pod within 60 s.\npod status: {}\nslices: {}\nscheduler: {}\nenimd: {}",
                p["status"],
                slice,
                cp.log_tail("kube-scheduler"),
                agent.log_tail(30)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let scheduled = applied.elapsed();
    let rc = get(&cp, &["resourceclaim", "db", "-n", "default"]);
    let result = &rc["status"]["allocation"]["devices"]["results"][0];
    assert_eq!(result["driver"], "enim.io");
    assert_eq!(result["pool"], NODE);
    assert_eq!(result["device"], device.as_str());
    let pod_uid = bound["metadata"]["uid"].as_str().unwrap().to_string();
    assert_eq!(rc["status"]["reservedFor"][0]["uid"], pod_uid.as_str());

    // The kubelet's part: prepare, then CNI ADD with the pod's identity.
    let claim_uid = rc["metadata"]["uid"].as_str().unwrap().to_string();
    let socket = plugins.join("enim.io/dra.sock");
    let answer = async {
        let ch = enim::deviceplugin::unix_channel(socket).await.unwrap();
        DraPluginClient::new(ch)
            .node_prepare_resources(NodePrepareResourcesRequest {
                claims: vec![Claim {
                    namespace: "default".into(),
                    uid: claim_uid.clone(),
                    name: "db".into(),
                }],
            })
            .await
            .unwrap()
            .into_inner()
    }
    .await;
    assert_eq!(answer.claims[&claim_uid].error, "");
    assert_eq!(answer.claims[&claim_uid].devices[0].device_name, device);
    let netns = NamedNetns::new("odpod");
    let args =
        format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=db;K8S_POD_UID={pod_uid}");
    let out = blocking(|| {
        enim_testkit::cni::exec_plugin(
            &bins().enim,
            "ADD",
            "od-c1",
            Some(&netns.path()),
            "eth0",
            &args,
            &conf,
        )
    });
    let added = out.ok();
    assert_eq!(added["interfaces"][0]["mac"], mac.as_str());
    let running = applied.elapsed();
    let link = netns.ip_json(&["link", "show", "eth0"]);
    assert_eq!(link[0]["address"], mac.as_str());
    eprintln!(
        "claim applied → ENI made and published {made:?}, pod scheduled {scheduled:?}, ENI in the pod {running:?}"
    );

    blocking(|| {
        exec_ok(enim_testkit::cni::exec_plugin(
            &bins().enim,
            "DEL",
            "od-c1",
            Some(&netns.path()),
            "eth0",
            &args,
            &conf,
        ))
    });
    agent.stop();
}

fn exec_ok(out: enim_testkit::cni::CniOutput) {
    out.ok();
}
