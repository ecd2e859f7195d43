//! End to end on "AWS": a real `enimd` with `type = "aws"` over moto (EC2
//! and IAM, signatures checked), the fake IMDSv2 and the fault proxy from
//! the AWS provider's test rig, and the real `enim` plugin. Each ENI moto
//! attaches shows up as a veth with moto's MAC in a sandbox host namespace
//! (the fake IMDS plugs it the first time it shows the interface, as a
//! hypervisor would), its far end on a bridge holding the subnet's router
//! address in a gateway namespace.
//!
//! enimd runs in the test's own namespace (it must reach the loopback
//! servers) and keeps ENIs in the sandbox through `host_netns`.

#[path = "aws/mod.rs"]
mod aws;
mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use aws::{blocking, sandbox, start_enimd};
use common::cloud_node::{
    assert_degraded_with_one_free, pings_router, primary_config, serve_through_outage,
    wait_recovered,
};
use common::{enim, NamedNetns};
use enim_testkit::agent::net_conf;
use enim_testkit::moto as aws_rig;

const NETWORK: &str = "enim-aws-e2e";

/// enimd's config in `dir`: ENIs kept in `host`, a pool of `free` over
/// EC2 through the fault proxy, short timings.
fn pool_config(dir: &Path, host: &NamedNetns, env: &aws_rig::Env, free: usize) -> String {
    primary_config(dir, host, &aws::provider_table(env), free, "200ms")
}

/// The sandbox, one ENI left attached by an earlier agent run (the pool
/// adopts it), and enimd's config over them in a temp dir.
struct Rig {
    host: Arc<NamedNetns>,
    _gw: Arc<NamedNetns>,
    earlier: enim_provider_aws::client::NetworkInterface,
    dir: tempfile::TempDir,
    config: String,
}

/// The moto rig, for a test that needs the kernel too; `None` (the test is
/// skipped) without root or without moto.
async fn kernel_env() -> Option<aws_rig::Env> {
    if !common::kernel_tests_enabled() {
        return None;
    }
    aws_rig::Env::start().await
}

async fn rig(env: &aws_rig::Env) -> Rig {
    let (host, gw) = sandbox(env);
    let earlier = aws::attach_earlier(env).await;
    let dir = tempfile::tempdir().unwrap();
    let config = pool_config(dir.path(), &host, env, 1);
    Rig {
        host,
        _gw: gw,
        earlier,
        dir,
        config,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enimd_serves_pods_from_the_aws_warm_pool() {
    let Some(env) = kernel_env().await else {
        return;
    };
    // Held whole: the namespaces live until the test ends.
    let rig = rig(&env).await;
    let mut agent = blocking(|| start_enimd(rig.dir.path(), &rig.config, &env));

    // Pod 1 takes the adopted ENI; the pool makes another for pod 2.
    let pod1 = NamedNetns::new("awspod1");
    let pod2 = NamedNetns::new("awspod2");
    let conf = net_conf("1.1.0", NETWORK, agent.socket());
    let r1 = blocking(|| enim("ADD", "c1", Some(&pod1.path()), "eth0", &conf).ok());
    assert_eq!(r1["interfaces"][0]["mac"], rig.earlier.mac_address);
    assert_eq!(
        r1["ips"][0]["address"],
        format!("{}/24", rig.earlier.private_ip_address.clone().unwrap())
    );
    assert_eq!(r1["ips"][0]["gateway"], "10.0.1.1");

    // No ENI is free now: pod 2's ADD, right away and not retried, waits
    // for the one the pool is creating (`allocate_wait`) and gets it.
    let r2 = blocking(|| enim("ADD", "c2", Some(&pod2.path()), "eth0", &conf).ok());
    // The waiting pod counted as demand on top of min_free 1: two creates,
    // one for it and one kept free.
    aws_rig::eventually(Duration::from_secs(20), "the pool to refill", || async {
        env.tagged_ids().await.len() == 3 && env.attached().await.len() == 4
    })
    .await;
    let mac2 = r2["interfaces"][0]["mac"].as_str().unwrap().to_string();
    assert_ne!(mac2, rig.earlier.mac_address);
    assert_eq!(r2["ips"][0]["gateway"], "10.0.1.1");

    // Both pods reach the router through their own ENI.
    for pod in [&pod1, &pod2] {
        assert!(blocking(|| pings_router(pod)), "ping from {}", pod.name);
    }

    // DEL both: the ENIs go home; two free ENIs are above max_free 1, so
    // the pool detaches and deletes them.
    for (cid, pod) in [("c1", &pod1), ("c2", &pod2)] {
        blocking(|| enim("DEL", cid, Some(&pod.path()), "eth0", &conf).ok());
    }
    blocking(|| {
        for mac in [&rig.earlier.mac_address, &mac2] {
            assert!(
                rig.host.link_by_mac(mac.parse().unwrap()).is_some(),
                "{mac} home"
            );
        }
    });
    aws_rig::eventually(Duration::from_secs(20), "the pool to shrink", || async {
        env.tagged_ids().await.len() == 1
    })
    .await;
    let left = env.tagged_ids().await;
    let enis = blocking(|| agent.ctl(&["enis"]));
    let listed: Vec<&str> = enis["enis"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap())
        .collect();
    assert_eq!(listed.len(), 1, "{enis}");
    assert!(left.contains(listed[0]));
    blocking(|| agent.stop());
    // Nothing enim made is lost or leaked: the one kept ENI is attached.
    assert_eq!(env.tagged_ids().await, left);
    assert_eq!(env.attached().await.len(), 2, "primary + the kept ENI");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enimd_stops_at_start_on_a_wrong_secret() {
    let Some(env) = aws_rig::Env::start().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "socket = {sock:?}\ncheckpoint = {ckpt:?}\ngc_interval = \"0s\"\n\
         [provider]\ntype = \"aws\"\nimds_endpoint = {imds:?}\n[provider.api]\nendpoint = {ec2:?}\n",
        sock = dir.path().join("enimd.sock").display().to_string(),
        ckpt = dir
            .path()
            .join("state/checkpoint.json")
            .display()
            .to_string(),
        imds = env.imds.url,
        ec2 = env.proxy.url,
    );
    let path = dir.path().join("enimd.toml");
    std::fs::write(&path, config).unwrap();
    let out = blocking(|| {
        Command::new(env!("CARGO_BIN_EXE_enimd"))
            .arg("--config")
            .arg(&path)
            .env("AWS_ACCESS_KEY_ID", env.node.access_key_id())
            .env("AWS_SECRET_ACCESS_KEY", "not-the-secret")
            .env_remove("AWS_SESSION_TOKEN")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    });
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "enimd started: {stderr}");
    assert!(stderr.contains("AuthFailure"), "{stderr}");
    assert!(stderr.contains("secret access key"), "{stderr}");
    assert!(!dir.path().join("enimd.sock").exists());
    assert!(env.tagged_ids().await.is_empty());
}

/// The EC2 API is down when enimd starts: it starts anyway, says it is
/// degraded, hands out the ENI instance metadata shows attached, answers
/// "try again later" beyond it, and DEL works. When the API is back, the
/// pool finishes its discovery and grows, and the degraded state clears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enimd_serves_through_an_ec2_outage_and_grows_after_it() {
    let Some(env) = kernel_env().await else {
        return;
    };
    let rig = rig(&env).await;

    env.proxy.set_down(true);
    let agent = blocking(|| start_enimd(rig.dir.path(), &rig.config, &env));
    blocking(|| assert_degraded_with_one_free(&agent));

    let conf = net_conf("1.1.0", NETWORK, agent.socket());
    let (pod1, pod2) = (NamedNetns::new("awspod1"), NamedNetns::new("awspod2"));
    let mac = &rig.earlier.mac_address;
    blocking(|| serve_through_outage(&conf, &pod1, &pod2, mac));
    assert_eq!(
        env.tagged_ids().await.len(),
        1,
        "nothing created during the outage"
    );

    env.proxy.set_down(false);
    aws_rig::eventually(Duration::from_secs(30), "the pool to grow", || async {
        env.tagged_ids().await.len() == 2 && env.attached().await.len() == 3
    })
    .await;
    wait_recovered(&agent).await;
    blocking(|| enim("ADD", "c2", Some(&pod2.path()), "eth0", &conf).ok());
    // Every attached ENI has a device index of its own.
    let attached = env.attached().await;
    let mut indexes: Vec<u32> = attached.values().copied().collect();
    indexes.sort_unstable();
    indexes.dedup();
    assert_eq!(indexes.len(), attached.len(), "{attached:?}");
    for (cid, pod) in [("c1", &pod1), ("c2", &pod2)] {
        blocking(|| enim("DEL", cid, Some(&pod.path()), "eth0", &conf).ok());
    }
}

/// A burst: with two ENIs missing, the pool creates them at once; the
/// backend still gives each attach a device index of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_creates_never_share_a_device_index() {
    let Some(env) = kernel_env().await else {
        return;
    };
    let (host, _gw) = sandbox(&env);
    let dir = tempfile::tempdir().unwrap();
    let config = pool_config(dir.path(), &host, &env, 3);
    let agent = blocking(|| start_enimd(dir.path(), &config, &env));
    aws_rig::eventually(Duration::from_secs(30), "the pool to fill", || async {
        env.attached().await.len() == 4
    })
    .await;
    let attached = env.attached().await;
    let mut indexes: Vec<u32> = attached.values().copied().collect();
    indexes.sort_unstable();
    assert_eq!(indexes, [0, 1, 2, 3], "{attached:?}");
    let creates = env.proxy.calls("CreateNetworkInterface");
    assert_eq!(creates, 3, "no more than min_free");
    blocking(|| agent.ctl(&["status"]));
}

/// `enimd uninstall-cni --mark-run-dir` as helm's uninstall hook runs it,
/// in the agent's run dir: the SIGTERM that follows is an uninstall.
fn mark_uninstall(dir: &Path) -> String {
    let cni = tempfile::tempdir().unwrap();
    let out = Command::new(&common::bins().enimd)
        .args(["uninstall-cni", "--cni-bin-dir"])
        .arg(cni.path())
        .arg("--net-d-dir")
        .arg(cni.path())
        .arg("--mark-run-dir")
        .arg(dir)
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()
}

/// Uninstall on a node whose agent made its own ENIs (`type = "aws"`): a
/// stop with the hook's marker and a pod still attached gives nothing
/// back; a start clears the marker, so a later stop is a restart; once
/// the pod is gone, a stop with the marker detaches and deletes every ENI
/// the agent made and removes its state files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uninstall_gives_the_nodes_enis_back_once_no_pod_holds_one() {
    let Some(env) = kernel_env().await else {
        return;
    };
    let rig = rig(&env).await;
    let dir = rig.dir.path();
    let mut agent = blocking(|| start_enimd(dir, &rig.config, &env));
    let pod = NamedNetns::new("awsleave");
    let conf = net_conf("1.1.0", NETWORK, agent.socket());
    blocking(|| enim("ADD", "c1", Some(&pod.path()), "eth0", &conf).ok());
    aws_rig::eventually(Duration::from_secs(20), "the pool to refill", || async {
        env.tagged_ids().await.len() == 2
    })
    .await;
    let made = env.tagged_ids().await;

    let marker = dir.join("uninstall-requested");
    assert!(mark_uninstall(dir).contains("written"));
    assert!(marker.exists());
    blocking(|| agent.stop());
    assert_eq!(
        env.tagged_ids().await,
        made,
        "a pod is attached: nothing given back"
    );
    assert!(dir.join("state/checkpoint.json").exists());

    blocking(|| agent.restart());
    assert!(!marker.exists(), "a start clears an unfinished uninstall");
    blocking(|| enim("DEL", "c1", Some(&pod.path()), "eth0", &conf).ok());
    blocking(|| agent.stop());
    assert_eq!(
        env.tagged_ids().await,
        made,
        "a stop without the marker is a restart"
    );

    blocking(|| agent.restart());
    mark_uninstall(dir);
    blocking(|| agent.stop());
    assert!(
        env.tagged_ids().await.is_empty(),
        "every ENI the agent made is deleted"
    );
    assert_eq!(
        env.attached().await.len(),
        1,
        "only the primary is attached"
    );
    let state: Vec<_> = std::fs::read_dir(dir.join("state"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(state.is_empty(), "state files left: {state:?}");
    assert!(!marker.exists());
    assert!(!agent.socket().exists());
    // A run dir without an agent's socket gets no marker.
    assert!(mark_uninstall(dir).contains("no agent's socket"));
    assert!(!marker.exists());
}
