//! Secondary mode on "AWS": a real `enimd` configured as
//! `deploy/20-configmap.yaml` ships it but with `mode = "secondary"` (and
//! the sandbox's paths and endpoints) over moto (EC2 and IAM, signatures checked) and the fake
//! IMDSv2, and the real `enim` plugin. Pods get secondary addresses the
//! warm address pool assigns (AssignPrivateIpAddresses); when the attached
//! ENIs are full, the pool attaches another; surplus addresses are given
//! back after their cooldown; a restart keeps every live pod's address.
//!
//! The sandbox is the one of `aws_e2e.rs`: each ENI moto attaches shows up
//! as a veth with its MAC in a host namespace, its far end on a bridge
//! holding the subnet's router address in a gateway namespace.
//!
//! Scale it with `ENIM_AWS_SECONDARY_PODS` (pods per wave, default 6),
//! `ENIM_AWS_SECONDARY_WAVES` (default 1) and `ENIM_AWS_SECONDARY_PER_ENI`
//! (addresses per ENI at most, default 4; `0`: the instance type's limit).
//! It prints the cloud calls by action.

#[path = "aws/mod.rs"]
mod aws;
mod common;

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use aws::{blocking, sandbox, start_enimd};
use common::cloud_node::{
    add_retrying, add_secondary_pods, as_host_routes, del_pods, pings_router, restart_keeps_pods,
    MAX_ABOVE_WATERMARK, PRE_ALLOCATE,
};
use common::{enim, NamedNetns};
use enim_testkit::agent::net_conf;
use enim_testkit::moto as aws_rig;

const NETWORK: &str = "enim-aws-secondary";

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn secondary_config(
    dir: &Path,
    host: &NamedNetns,
    env: &aws_rig::Env,
    per_eni: usize,
    cooldown: &str,
) -> String {
    let mut config = shipped_config();
    let set = |table: &mut toml::Table, key: &str, value: toml::Value| {
        table.insert(key.into(), value);
    };
    let s = |v: &str| toml::Value::String(v.into());
    // Node paths and endpoints of the sandbox; no kubelet, no fixed port.
    set(&mut config, "mode", s("secondary"));
    set(
        &mut config,
        "socket",
        s(&dir.join("enimd.sock").display().to_string()),
    );
    set(
        &mut config,
        "checkpoint",
        s(&dir.join("state/checkpoint.json").display().to_string()),
    );
    set(
        &mut config,
        "host_netns",
        s(&host.path().display().to_string()),
    );
    set(&mut config, "gc_interval", s("0s"));
    set(&mut config, "log_format", s("text"));
    config.remove("metrics_address");
    config.remove("device_plugin");
    // Events need the cluster's API server, which this node has none of.
    config.remove("events");
    let table = |config: &mut toml::Table, key: &str| -> toml::Table {
        config
            .get(key)
            .and_then(|v| v.as_table().cloned())
            .unwrap_or_default()
    };
    // The ConfigMap's [provider] and [provider.pool], pointed at moto.
    let mut provider = table(&mut config, "provider");
    let sandbox: toml::Table = aws::provider_table(env).parse().unwrap();
    for (key, value) in sandbox["provider"].as_table().unwrap() {
        set(&mut provider, key, value.clone());
    }
    set(&mut config, "provider", toml::Value::Table(provider));
    // The test's watermarks and timings.
    let mut secondary = table(&mut config, "secondary");
    set(&mut secondary, "cooldown", s(cooldown));
    let mut pool = toml::Table::new();
    let n = |v: usize| toml::Value::Integer(i64::try_from(v).unwrap());
    set(&mut pool, "pre_allocate", n(PRE_ALLOCATE));
    set(&mut pool, "max_above_watermark", n(MAX_ABOVE_WATERMARK));
    if per_eni > 0 {
        set(&mut pool, "max_per_eni", n(per_eni));
    }
    set(&mut pool, "resync_interval", s("500ms"));
    set(&mut pool, "initial_retry", s("100ms"));
    set(&mut pool, "max_backoff", s("1s"));
    set(&mut secondary, "pool", toml::Value::Table(pool));
    set(&mut config, "secondary", toml::Value::Table(secondary));
    toml::to_string(&config).unwrap()
}

/// `enimd.toml` as `deploy/20-configmap.yaml` ships it (aws provider,
/// host path on, enimd's own device plugin off): the test node runs that config with
/// `mode = "secondary"` and only the sandbox's paths and endpoints changed.
fn shipped_config() -> toml::Table {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/20-configmap.yaml");
    let yaml: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let text = yaml["data"]["enimd.toml"]
        .as_str()
        .expect("enimd.toml in the ConfigMap");
    let config: toml::Table = text.parse().unwrap();
    assert_eq!(config["provider"]["type"].as_str(), Some("aws"), "{text}");
    config
}

/// Every secondary address moto has on this instance's ENIs but the
/// primary interface, by ENI.
async fn cloud_addresses(env: &aws_rig::Env) -> BTreeMap<String, Vec<IpAddr>> {
    // The rig's moto hands out unique addresses EC2 does not reserve, so
    // every one listed is one a pod could have.
    env.all_enis()
        .await
        .into_iter()
        .filter(|e| {
            e.attachment.as_ref().is_some_and(|a| {
                a.instance_id.as_deref() == Some(env.instance_id.as_str())
                    && a.device_index != Some(0)
            }) && e.attached_instance().is_some()
        })
        .map(|e| (e.network_interface_id.clone(), e.secondary_ips()))
        .collect()
}

fn total(addresses: &BTreeMap<String, Vec<IpAddr>>) -> usize {
    addresses.values().map(Vec::len).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secondary_mode_serves_pods_from_a_warm_ip_pool_on_moto() {
    common::require_kernel!();
    let Some(env) = aws_rig::Env::start().await else {
        return;
    };
    let pods_per_wave = env_usize("ENIM_AWS_SECONDARY_PODS", 6);
    let waves = env_usize("ENIM_AWS_SECONDARY_WAVES", 1);
    let per_eni = env_usize("ENIM_AWS_SECONDARY_PER_ENI", 4);

    let (host, _gw) = sandbox(&env);
    // One ENI an earlier run left attached, with no secondary address yet.
    let earlier = aws::attach_earlier(&env).await;
    let dir = tempfile::tempdir().unwrap();
    let config = secondary_config(dir.path(), &host, &env, per_eni, "1s");
    let mut agent = blocking(|| start_enimd(dir.path(), &config, &env));

    // The pool fills on the adopted ENI: pre_allocate, and as it is
    // allocating anyway, max_above_watermark more in the same call.
    aws_rig::eventually(Duration::from_secs(20), "the first fill", || async {
        total(&cloud_addresses(&env).await) == PRE_ALLOCATE + MAX_ABOVE_WATERMARK
    })
    .await;
    assert_eq!(
        cloud_addresses(&env).await.keys().collect::<Vec<_>>(),
        [&earlier.network_interface_id]
    );

    let conf = net_conf("1.1.0", NETWORK, agent.socket());
    let mut max_enis = 0;
    for wave in 0..waves {
        let pods: Vec<NamedNetns> = (0..pods_per_wave)
            .map(|i| NamedNetns::new(&format!("awss{i}")))
            .collect();
        let prefix = format!("w{wave}p");
        let seen = blocking(|| add_secondary_pods(&pods, &prefix, &conf));
        // Every pod reaches the router, out of its ENI.
        for pod in &pods {
            if !blocking(|| pings_router(pod)) {
                for (ns, args) in [
                    (&host.name, &["ip", "-d", "link"][..]),
                    (&host.name, &["ip", "rule"][..]),
                    (&host.name, &["ip", "route", "show", "table", "all"][..]),
                    (&host.name, &["ip", "neigh", "show", "proxy"][..]),
                    (&host.name, &["ip", "neigh"][..]),
                    (&_gw.name, &["ip", "neigh"][..]),
                    (&_gw.name, &["bridge", "link"][..]),
                    (&pod.name, &["ip", "addr"][..]),
                    (&pod.name, &["ip", "neigh"][..]),
                ] {
                    let out = std::process::Command::new("ip")
                        .args(["netns", "exec", ns.as_str()])
                        .args(args)
                        .output()
                        .unwrap();
                    eprintln!("== {ns} {args:?}\n{}", String::from_utf8_lossy(&out.stdout));
                }
                let again = blocking(|| pings_router(pod));
                panic!("ping from {} failed; again: {again}", pod.name);
            }
        }
        let cloud = cloud_addresses(&env).await;
        max_enis = max_enis.max(cloud.len());
        if per_eni > 0 {
            // Grown by ENIs once the first was full.
            let needed = pods_per_wave.div_ceil(per_eni);
            assert!(cloud.len() >= needed, "{cloud:?}");
            assert!(cloud.values().all(|ips| ips.len() <= per_eni), "{cloud:?}");
        }
        // Every pod's address is assigned in the cloud, on one ENI.
        let in_cloud = as_host_routes(cloud.values().flatten());
        assert!(seen.is_subset(&in_cloud), "{seen:?} vs {cloud:?}");

        if wave == 0 {
            // A restart keeps every live pod's address, and the pool picks
            // up where it was.
            blocking(|| restart_keeps_pods(&mut agent, &pods, &seen));
        }
        blocking(|| del_pods(&pods, &prefix, &conf));
        // Surplus goes back after the cooldown: pre_allocate +
        // max_above_watermark free addresses stay.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let cloud = cloud_addresses(&env).await;
            if total(&cloud) == PRE_ALLOCATE + MAX_ABOVE_WATERMARK {
                break;
            }
            if Instant::now() > deadline {
                let status = blocking(|| agent.ctl(&["status"]));
                panic!("surplus not released: cloud {cloud:?}, agent {status}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let status = blocking(|| agent.ctl(&["status"]));
    blocking(|| agent.stop());

    let calls: Vec<String> = [
        "AssignPrivateIpAddresses",
        "UnassignPrivateIpAddresses",
        "CreateNetworkInterface",
        "AttachNetworkInterface",
        "ModifyNetworkInterfaceAttribute",
        "DescribeNetworkInterfaces",
        "DescribeInstanceTypes",
    ]
    .iter()
    .map(|a| format!("{a} {}", env.proxy.calls(a)))
    .collect();
    eprintln!(
        "secondary mode on moto: {} ADDs and {0} DELs in {waves} wave(s), up to {max_enis} ENIs; cloud calls: {}; final status {status}",
        pods_per_wave * waves,
        calls.join(", ")
    );
    assert!(env.proxy.calls("AssignPrivateIpAddresses") >= 1);
    assert!(env.proxy.calls("UnassignPrivateIpAddresses") >= 1);
}

/// The agent's address counts (`enimctl status`).
fn addresses(agent: &common::Agent) -> serde_json::Value {
    blocking(|| agent.ctl(&["status"]))["addresses"].clone()
}

/// Waits until the agent's store and the cloud agree: every secondary
/// address moto has on this node's ENIs is in the store (none leaked) and
/// the pool has settled within its watermarks.
async fn settled(env: &aws_rig::Env, agent: &common::Agent, pods: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let cloud = total(&cloud_addresses(env).await);
        let a = addresses(agent);
        let store = usize::try_from(a["total"].as_u64().unwrap_or(0)).unwrap_or(usize::MAX);
        let free = store.saturating_sub(pods);
        if cloud == store
            && a["assigned"] == pods
            && (PRE_ALLOCATE..=PRE_ALLOCATE + MAX_ABOVE_WATERMARK).contains(&free)
        {
            return;
        }
        if Instant::now() > deadline {
            panic!(
                "cloud ({cloud} addresses: {:?}) and agent ({a}) never agreed with {pods} pods",
                cloud_addresses(env).await
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The crash matrix of the pool's cloud steps: enimd killed (abort, as
/// SIGKILL) right after an assign returned, right after an ENI was
/// attached, and right after free addresses left the store but before
/// they were unassigned. After a restart and a GC, the cloud and the store
/// agree (no address leaked), no address is held twice, every pod keeps
/// its address, and no ENI was attached twice.
#[cfg_attr(
    not(feature = "fault-injection"),
    ignore = "needs the crash points: --features fault-injection (CI runs --all-features)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_cloud_steps_survive_a_crash_at_each_point() {
    common::require_kernel!();
    for point in enim::support::fault::POOL_CRASH_POINTS {
        let Some(env) = aws_rig::Env::start().await else {
            return;
        };
        let (host, _gw) = sandbox(&env);
        // One ENI an earlier run left attached, as in the test above.
        aws::attach_earlier(&env).await;
        let dir = tempfile::tempdir().unwrap();
        // One address per ENI where the crash is at an attach (the first
        // fill then needs a second ENI), two elsewhere. A long cooldown, so
        // DEL'd addresses stay until the restart.
        let per_eni = if *point == "pool:after-attach" { 1 } else { 2 };
        let config = secondary_config(dir.path(), &host, &env, per_eni, "1m");
        let conf = |agent: &common::Agent| net_conf("1.1.0", NETWORK, agent.socket());
        let mut agent = aws::enimd(dir.path(), &config, &env);
        let creds = agent.env.clone();
        let pods: Vec<NamedNetns> = (0..3)
            .map(|i| NamedNetns::new(&format!("awsc{i}")))
            .collect();
        let mut live: Vec<&NamedNetns> = Vec::new();
        // The most ENIs the scenario needs.
        let max_enis = match *point {
            // The first fill crashes after its assign, or after attaching
            // the second ENI it needs.
            "pool:after-assign" => 1,
            "pool:after-attach" => 2,
            // Three pods on ENIs of two addresses, then two DEL'd: a
            // restart finds their addresses free (cooldowns do not survive
            // it), one more than the watermarks keep, and releases it.
            "pool:before-unassign" => {
                blocking(|| agent.restart());
                for (i, pod) in pods.iter().enumerate() {
                    let cid = format!("c{i}");
                    blocking(|| add_retrying(&cid, pod, &conf(&agent), Duration::from_secs(60)));
                }
                // Pre-allocated ahead of the three: five on three ENIs.
                settled(&env, &agent, 3).await;
                for (i, pod) in pods.iter().enumerate().skip(1) {
                    blocking(|| {
                        enim(
                            "DEL",
                            &format!("c{i}"),
                            Some(&pod.path()),
                            "eth0",
                            &conf(&agent),
                        )
                        .ok()
                    });
                }
                live.push(&pods[0]);
                3
            }
            other => panic!("no scenario for crash point {other}"),
        };
        blocking(|| agent.stop());
        agent.env = creds.clone();
        agent.env.push(("ENIMD_CRASH_AT".into(), point.to_string()));
        blocking(|| agent.spawn());
        blocking(|| agent.wait_crashed());
        let log = blocking(|| agent.log());
        assert!(log.contains(point), "crashed elsewhere than {point}: {log}");
        agent.env = creds.clone();
        blocking(|| agent.restart());
        blocking(|| agent.ctl(&["gc"]));
        settled(&env, &agent, live.len()).await;
        // Every live pod kept its address, held once, and still reaches
        // the router; a new pod gets an address of its own.
        let records = blocking(|| agent.ctl(&["attachments"]));
        let held: Vec<String> = records["attachments"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|a| a["ipv4"].as_str().map(String::from))
            .collect();
        assert_eq!(held.len(), live.len(), "{records}");
        let distinct: HashSet<&String> = held.iter().collect();
        assert_eq!(
            distinct.len(),
            held.len(),
            "an address held twice: {records}"
        );
        for pod in &live {
            assert!(blocking(|| pings_router(pod)));
        }
        // Never more ENIs than the addresses need: an ENI attached before
        // the crash was taken in, not attached again.
        let enis = cloud_addresses(&env).await.len();
        assert!(
            enis <= max_enis,
            "{point}: {enis} ENIs: {:?}",
            cloud_addresses(&env).await
        );
        assert_eq!(
            env.tagged_ids().await.len(),
            enis,
            "{point}: an ENI left unattached"
        );
        let newcomer = NamedNetns::new("awscn");
        let r = blocking(|| add_retrying("cn", &newcomer, &conf(&agent), Duration::from_secs(60)));
        let ip = r["ips"][0]["address"]
            .as_str()
            .unwrap()
            .trim_end_matches("/32")
            .to_string();
        assert!(!held.contains(&ip), "{ip} given twice");
        blocking(|| agent.stop());
        eprintln!(
            "crash at {point}: recovered, {} pods kept, {enis} ENIs",
            live.len()
        );
    }
}

/// With no address kept free (pre_allocate and max_above_watermark 0), each
/// ADD finds none: it waits for the one the pool assigns for it
/// (`allocate_wait`) and is served by that single ADD, not by the
/// kubelet's retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_add_waits_for_the_address_the_pool_assigns() {
    common::require_kernel!();
    let Some(env) = aws_rig::Env::start().await else {
        return;
    };
    let (host, _gw) = sandbox(&env);
    aws::attach_earlier(&env).await;
    let dir = tempfile::tempdir().unwrap();
    let mut config: toml::Table = secondary_config(dir.path(), &host, &env, 0, "1s")
        .parse()
        .unwrap();
    let mut pool = config["secondary"]["pool"].as_table().cloned().unwrap();
    pool.insert("pre_allocate".into(), toml::Value::Integer(0));
    pool.insert("max_above_watermark".into(), toml::Value::Integer(0));
    config["secondary"]
        .as_table_mut()
        .unwrap()
        .insert("pool".into(), toml::Value::Table(pool));
    let config = toml::to_string(&config).unwrap();
    let mut agent = blocking(|| start_enimd(dir.path(), &config, &env));
    assert_eq!(total(&cloud_addresses(&env).await), 0, "nothing kept free");

    let conf = net_conf("1.1.0", NETWORK, agent.socket());
    let pods: Vec<NamedNetns> = (0..2)
        .map(|i| NamedNetns::new(&format!("awsw{i}")))
        .collect();
    for (i, pod) in pods.iter().enumerate() {
        // One ADD each, not retried.
        let out = blocking(|| enim("ADD", &format!("w{i}"), Some(&pod.path()), "eth0", &conf));
        assert_eq!(out.status, 0, "{out:?}\n{}", blocking(|| agent.log()));
        let r = out.ok();
        let ip: IpAddr = r["ips"][0]["address"]
            .as_str()
            .unwrap()
            .trim_end_matches("/32")
            .parse()
            .unwrap();
        let cloud = cloud_addresses(&env).await;
        assert!(
            cloud.values().flatten().any(|a| *a == ip),
            "{ip} not in {cloud:?}"
        );
        assert!(blocking(|| pings_router(pod)), "ping from {}", pod.name);
    }
    assert!(env.proxy.calls("AssignPrivateIpAddresses") >= 2);
    blocking(|| agent.stop());
}
