//! The real `enimd` as a DRA driver against a real kube-apiserver: its
//! ResourceSlice, its kubelet plugin sockets (dialled here over gRPC as the
//! kubelet dials them), a claim allocated as the scheduler allocates it,
//! prepare recorded before the answer (enimd killed right after the
//! record), ADD through the CNI plugin bound to exactly the claimed ENI,
//! and networkData written on the claim.
//!
//! The kubelet and the scheduler themselves drive the same driver in
//! scripts/e2e-cluster.sh's `dra` run.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use enim::dra::registration::registration_client::RegistrationClient;
use enim::dra::registration::InfoRequest;
use enim::dra::v1::dra_plugin_client::DraPluginClient;
use enim::dra::v1::{Claim, NodePrepareResourcesRequest, NodeUnprepareResourcesRequest};
use enim_core::Placement;
use enim_testkit::apiserver::ControlPlane;
use enim_testkit::fixtures::write_config;
use serde_json::{json, Value};

const NODE: &str = "node-dra";

fn eventually(what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !check() {
        assert!(Instant::now() < deadline, "not within {limit:?}: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn get(cp: &ControlPlane, args: &[&str]) -> Value {
    let mut all = vec!["get"];
    all.extend(args);
    all.extend(["-o", "json"]);
    serde_json::from_str(&cp.kubectl(&all)).unwrap()
}

/// A claim for one ENI device, allocated to `device` in this node's pool
/// and reserved for pod uid `pod_uid`, as the scheduler leaves it.
fn allocated_claim(cp: &ControlPlane, name: &str, device: &str, pod_uid: &str) -> String {
    cp.apply(
        &json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": { "name": name, "namespace": "default" },
            "spec": { "devices": { "requests": [
                { "name": "eni", "exactly": { "deviceClassName": "eni.enim.io" } }
            ] } },
        })
        .to_string(),
    );
    let status = json!({ "status": {
        "allocation": { "devices": { "results": [
            { "request": "eni", "driver": "enim.io", "pool": NODE, "device": device }
        ] } },
        "reservedFor": [ { "resource": "pods", "name": format!("pod-{pod_uid}"), "uid": pod_uid } ],
    } });
    cp.kubectl(&[
        "patch",
        "resourceclaim",
        name,
        "--subresource=status",
        "--type=merge",
        "-p",
        &status.to_string(),
    ]);
    get(cp, &["resourceclaim", name])["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string()
}

fn claim(name: &str, uid: &str) -> Claim {
    Claim {
        namespace: "default".into(),
        uid: uid.into(),
        name: name.into(),
    }
}

/// GET `path` on enimd's metrics listener.
fn http_get(port: u16, path: &str) -> String {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(c, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut out = String::new();
    c.read_to_string(&mut out).unwrap();
    out
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn a_claim_prepared_before_a_crash_gets_exactly_its_eni_at_add() {
    require_kernel!();
    let Some(cp) = ControlPlane::start() else {
        return;
    };
    let class = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/06-deviceclass.yaml");
    cp.apply(&std::fs::read_to_string(class).unwrap());
    cp.apply(&json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}).to_string());

    let sb = Sandbox::new(3);
    let mut enis = sb.enis.clone();
    for (i, e) in enis.iter_mut().enumerate() {
        e.placement = Placement {
            subnet: Some(if i == 2 { "subnet-b" } else { "subnet-a" }.into()),
            zone: Some("zone-1".into()),
            security_groups: vec!["sg-web".into()],
            network_card: Some(0),
        };
    }
    let dir = tempfile::tempdir().unwrap();
    let plugins = dir.path().join("plugins");
    let registry = dir.path().join("plugins_registry");
    let metrics_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let extra = format!(
        "metrics_address = \"127.0.0.1:{metrics_port}\"\n[dra]\nenabled = true\nnode_name = {NODE:?}\nkubeconfig = {kc:?}\nregistry_dir = {reg:?}\nplugin_dir = {plug:?}\nsweep_interval = \"1s\"\n",
        kc = cp.admin_kubeconfig().display().to_string(),
        reg = registry.display().to_string(),
        plug = plugins.display().to_string(),
    );
    // The [dra] table last: write_config puts `extra` before [provider].
    let paths = write_config(dir.path(), Some(&sb.host.path()), &enis, &extra);
    let mut agent = Agent::new(bins(), paths);
    agent.ready_timeout = Duration::from_secs(30);
    agent.restart();
    let conf = agent.net_conf("1.1.0");

    // The slice: every ENI, with its placement.
    let slice_name = format!("{NODE}-enim.io");
    let mut slice = Value::Null;
    eventually(
        "the ResourceSlice lists 3 devices",
        Duration::from_secs(20),
        || {
            let out = cp.kubectl_output(&["get", "resourceslice", &slice_name, "-o", "json"]);
            slice = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
            slice["spec"]["devices"]
                .as_array()
                .is_some_and(|d| d.len() == 3)
        },
    );
    assert_eq!(slice["spec"]["driver"], "enim.io");
    assert_eq!(slice["spec"]["nodeName"], NODE);
    assert_eq!(slice["spec"]["pool"]["name"], NODE);
    assert_eq!(slice["metadata"]["ownerReferences"][0]["kind"], "Node");
    let third = &slice["spec"]["devices"][2];
    let device = sb.enis[2].id.to_ascii_lowercase();
    assert_eq!(third["name"], device.as_str());
    assert_eq!(third["attributes"]["subnet"]["string"], "subnet-b");
    assert_eq!(third["attributes"]["sg.enim.io/sg_web"]["bool"], true);
    assert_eq!(
        third["attributes"]["mac"]["string"],
        sb.enis[2].mac.to_string()
    );

    // Registration, as the kubelet's plugin watcher asks for it.
    let reg_socket = registry.join("enim.io-reg.sock");
    let dra_socket = plugins.join("enim.io/dra.sock");
    let info = rt().block_on(async {
        let ch = enim::deviceplugin::unix_channel(reg_socket.clone())
            .await
            .unwrap();
        RegistrationClient::new(ch)
            .get_info(InfoRequest {})
            .await
            .unwrap()
            .into_inner()
    });
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, "enim.io");
    assert_eq!(info.endpoint, dra_socket.display().to_string());
    assert_eq!(info.supported_versions, ["v1.DRAPlugin"]);

    // The scheduler gives pod uid-c1 the third ENI (not the first free).
    let uid = allocated_claim(&cp, "c1", &device, "uid-c1");
    let prepare = |socket: &Path| {
        let socket = socket.to_path_buf();
        let uid = uid.clone();
        rt().block_on(async move {
            let ch = enim::deviceplugin::unix_channel(socket).await?;
            let answer = DraPluginClient::new(ch)
                .node_prepare_resources(NodePrepareResourcesRequest {
                    claims: vec![claim("c1", &uid)],
                })
                .await
                .map_err(|s| format!("{s}"))?;
            Ok::<_, Box<dyn std::error::Error>>(answer.into_inner())
        })
    };

    // enimd dies right after the record, before it answers: the kubelet
    // sees a failed prepare and asks again of the next enimd.
    agent.arm_crash("dra:after-claim-write");
    // The plugin serves once recovery is done, a moment after "ready". A
    // socket file can outlive its agent (a crash leaves it): wait for one
    // that accepts a connection, not for the file.
    let served = || std::os::unix::net::UnixStream::connect(&dra_socket).is_ok();
    eventually("the DRA socket is served", Duration::from_secs(10), served);
    assert!(
        prepare(&dra_socket).is_err(),
        "prepare answered though enimd died"
    );
    agent.wait_crashed();
    agent.env.clear();
    agent.restart();
    eventually("the DRA socket is back", Duration::from_secs(10), served);
    let answer = prepare(&dra_socket).unwrap();
    let got = &answer.claims[&uid];
    assert_eq!(got.error, "");
    assert_eq!(got.devices.len(), 1);
    assert_eq!(got.devices[0].device_name, device);
    assert_eq!(got.devices[0].pool_name, NODE);
    assert_eq!(got.devices[0].request_names, ["eni"]);

    // Counted with enimd's requests: one failed (the crash), one served.
    let metrics = http_get(metrics_port, "/metrics");
    let served = enim_testkit::agent::metric(
        &metrics,
        "enim_requests_total{verb=\"dra_prepare\",result=\"ok\"}",
    );
    assert_eq!(served, 1.0, "{metrics}");

    // ADD for the claimed pod: exactly that ENI.
    let pod = NamedNetns::new("pod");
    let result = enim("ADD", "c1", Some(&pod.path()), "eth0", &conf).ok();
    assert_eq!(result["interfaces"][0]["mac"], sb.enis[2].mac.to_string());
    // A pod with no claim is refused, for good.
    let other = NamedNetns::new("pod");
    let out = enim("ADD", "c2", Some(&other.path()), "eth0", &conf);
    let msg = out.err(out.json()["code"].as_u64().unwrap());
    assert_ne!(out.json()["code"], 11, "{msg}");
    assert!(msg.contains("no ResourceClaim of driver enim.io"), "{msg}");

    // networkData on the claim.
    eventually("the claim's networkData", Duration::from_secs(10), || {
        let c = get(&cp, &["resourceclaim", "c1"]);
        let d = &c["status"]["devices"][0];
        d["device"] == device.as_str()
            && d["networkData"]["interfaceName"] == "eth0"
            && d["networkData"]["hardwareAddress"] == sb.enis[2].mac.to_string()
            && d["networkData"]["ips"][0] == sb.enis[2].ipv4.to_string()
    });

    // A second pod joins the claim (shared) after its prepare: the kubelet
    // prepares a claim once per node and tells the driver nothing of it.
    // While the first pod holds the ENI, its ADD is "try again later".
    let shared = json!({ "status": { "reservedFor": [
        { "resource": "pods", "name": "pod-uid-c1", "uid": "uid-c1" },
        { "resource": "pods", "name": "pod-c4", "uid": "uid-c4" },
    ] } });
    cp.kubectl(&[
        "patch",
        "resourceclaim",
        "c1",
        "--subresource=status",
        "--type=merge",
        "-p",
        &shared.to_string(),
    ]);
    let pod4 = NamedNetns::new("pod");
    let out = enim("ADD", "c4", Some(&pod4.path()), "eth0", &conf);
    let msg = out.err(out.json()["code"].as_u64().unwrap());
    assert_eq!(out.json()["code"], 11, "{msg}");
    assert!(msg.contains("held by another attachment"), "{msg}");

    // DEL, then unprepare: the ENI is home and its networkData gone.
    enim("DEL", "c1", Some(&pod.path()), "eth0", &conf).ok();
    eventually(
        "networkData removed after DEL",
        Duration::from_secs(10),
        || get(&cp, &["resourceclaim", "c1"])["status"]["devices"].is_null(),
    );
    // Now the second pod of the shared claim gets the same ENI.
    let result = enim("ADD", "c4", Some(&pod4.path()), "eth0", &conf).ok();
    assert_eq!(result["interfaces"][0]["mac"], sb.enis[2].mac.to_string());
    assert!(
        std::fs::read_to_string(dir.path().join("state/dra-claims.json"))
            .unwrap()
            .contains("uid-c4"),
        "the pod joined the claim's record"
    );
    enim("DEL", "c4", Some(&pod4.path()), "eth0", &conf).ok();
    eventually(
        "networkData removed after the second DEL",
        Duration::from_secs(10),
        || get(&cp, &["resourceclaim", "c1"])["status"]["devices"].is_null(),
    );
    let unprepared = rt().block_on(async {
        let ch = enim::deviceplugin::unix_channel(dra_socket.clone())
            .await
            .unwrap();
        DraPluginClient::new(ch)
            .node_unprepare_resources(NodeUnprepareResourcesRequest {
                claims: vec![claim("c1", &uid)],
            })
            .await
            .unwrap()
            .into_inner()
    });
    assert_eq!(unprepared.claims[&uid].error, "");
    assert!(
        !std::fs::read_to_string(dir.path().join("state/dra-claims.json"))
            .unwrap()
            .contains(&uid),
        "unprepare dropped the record"
    );

    // A claim prepared, then deleted from the API without an unprepare (a
    // kubelet that lost its own record): the sweep drops its record.
    let uid2 = allocated_claim(&cp, "c3", &sb.enis[0].id.to_ascii_lowercase(), "uid-c3");
    let claims_of = |name: &str, uid: &str| {
        rt().block_on(async {
            let ch = enim::deviceplugin::unix_channel(dra_socket.clone())
                .await
                .unwrap();
            DraPluginClient::new(ch)
                .node_prepare_resources(NodePrepareResourcesRequest {
                    claims: vec![claim(name, uid)],
                })
                .await
                .unwrap()
                .into_inner()
        })
    };
    assert_eq!(claims_of("c3", &uid2).claims[&uid2].error, "");
    let record = dir.path().join("state/dra-claims.json");
    assert!(std::fs::read_to_string(&record).unwrap().contains(&uid2));
    cp.kubectl(&["delete", "resourceclaim", "c3"]);
    eventually(
        "the sweep drops the gone claim's record",
        Duration::from_secs(10),
        || !std::fs::read_to_string(&record).unwrap().contains(&uid2),
    );
    sb.assert_all_home();
    agent.stop();
    assert!(
        !dra_socket.exists() && !reg_socket.exists(),
        "sockets left behind"
    );
}
