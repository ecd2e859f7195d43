//! The VPC simulator against the real kernel and a real moto: two nodes in
//! two subnets, a VPC namespace and a pod namespace, all removed on drop.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use enim_provider_aws::client::{CreateEni, Ec2Client, Family, NetworkInterface};
use enim_testkit::moto::{Env, REGION};
use enim_testkit::netns::NamedNetns;
use enim_testkit::vpc::{
    Ec2Access, NodeConfig, PrimaryMode, Reconciler, VpcConfig, VpcSim, ROUTE_PROTO,
};
use ipnet::Ipv6Net;
use serde_json::Value;

/// "Within about a second", with room for a loaded machine.
const FOLLOW: Duration = Duration::from_millis(1500);
const SUBNET2_MTU: u32 = 1500;

/// Two instances in two subnets, their node namespaces, the VPC and a pod
/// namespace. Field order is drop order: the simulator before the
/// namespaces, moto last.
struct Rig {
    sim: Option<VpcSim>,
    pod: NamedNetns,
    node_a: NamedNetns,
    node_b: NamedNetns,
    vpc: NamedNetns,
    instance_a: String,
    instance_b: String,
    subnet2: String,
    env: Env,
}

impl Rig {
    async fn new() -> Option<Rig> {
        if !enim_testkit::kernel_tests_enabled() {
            return None;
        }
        let env = Env::start().await?;
        let v6: Ipv6Net = env.vpc_v6.subnets(64).unwrap().nth(2).unwrap();
        let subnet2 = env.create_subnet("10.0.2.0/24", v6).await.subnet_id;
        let (instance_a, _) = env.run_instance(&env.subnet_id).await;
        let (instance_b, _) = env.run_instance(&subnet2).await;
        Some(Rig {
            sim: None,
            pod: NamedNetns::new("pod"),
            node_a: NamedNetns::new("na"),
            node_b: NamedNetns::new("nb"),
            vpc: NamedNetns::new("vpc"),
            instance_a,
            instance_b,
            subnet2,
            env,
        })
    }

    fn config(&self) -> VpcConfig {
        let mut cfg = VpcConfig::new(self.vpc.path());
        cfg.nodes = vec![
            NodeConfig {
                instance_id: self.instance_a.clone(),
                netns: self.node_a.path(),
                primary: PrimaryMode::Address,
            },
            NodeConfig {
                instance_id: self.instance_b.clone(),
                netns: self.node_b.path(),
                primary: PrimaryMode::Skip,
            },
        ];
        cfg.subnet_mtu.insert(self.subnet2.clone(), SUBNET2_MTU);
        cfg.poll_ms = 100;
        cfg
    }

    fn access(&self) -> Ec2Access {
        Ec2Access::new(&self.env.moto.url, REGION, &self.env.admin)
    }

    async fn start(&mut self, cfg: VpcConfig) {
        self.sim = Some(VpcSim::start(cfg, &self.access()).await.unwrap());
    }

    async fn stop(&mut self) {
        if let Some(sim) = self.sim.take() {
            sim.stop().await;
        }
    }

    fn ec2(&self) -> &Ec2Client {
        &self.env.admin_ec2
    }

    async fn create_eni(&self, subnet_id: &str) -> NetworkInterface {
        let token = format!("vpcsim-{}", fastrand_token());
        self.ec2()
            .create_network_interface(&CreateEni {
                subnet_id,
                security_group_ids: &[],
                description: "vpcsim test",
                client_token: &token,
                tags: &[],
                ipv6_address_count: 0,
                secondary_ipv4_count: 0,
            })
            .await
            .unwrap()
    }

    /// Attaches; returns the attachment id.
    async fn attach(&self, eni: &str, instance: &str, index: u32) -> String {
        self.ec2()
            .attach_network_interface(eni, instance, index, 0)
            .await
            .unwrap()
    }

    async fn eni(&self, id: &str) -> NetworkInterface {
        self.env.eni(id).await
    }

    /// The simulator's routes in the VPC namespace, as `addr dev`.
    fn vpc_routes(&self) -> Vec<String> {
        let mut out = Vec::new();
        for family in ["-4", "-6"] {
            let v: Value =
                self.vpc
                    .ip_json(&[family, "route", "show", "proto", &ROUTE_PROTO.to_string()]);
            for r in v.as_array().cloned().unwrap_or_default() {
                out.push(format!(
                    "{} {}",
                    r["dst"].as_str().unwrap(),
                    r["dev"].as_str().unwrap()
                ));
            }
        }
        out.sort();
        out
    }

    fn routed(&self, ip: &str) -> bool {
        self.vpc_routes()
            .iter()
            .any(|r| r.split(' ').next() == Some(ip))
    }
}

fn fastrand_token() -> String {
    enim_testkit::unique("t")
}

/// Polls `check` (sync: it runs `ip`) until true, at most `within`.
async fn until(within: Duration, what: &str, mut check: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    loop {
        if check() {
            return start.elapsed();
        }
        assert!(start.elapsed() < within, "not within {within:?}: {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Asserts `check` (sync: it runs `ip`) stays true until `end`.
async fn holds_until(end: Instant, what: &str, mut check: impl FnMut() -> bool) {
    let start = Instant::now();
    while Instant::now() < end {
        assert!(check(), "not {what}: failed after {:?}", start.elapsed());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The link with `mac` in `ns`, if any.
fn link(ns: &NamedNetns, mac: &str) -> Option<Value> {
    ns.link_by_mac(mac.parse().unwrap())
}

/// `metadata/<leaf>` fetched with IMDSv2 from inside `ns`, from `src`.
fn imds_get(ns: &NamedNetns, src: &str, leaf: &str) -> Option<String> {
    let run = |args: &[&str]| {
        let mut full = vec!["ip", "netns", "exec", &ns.name, "curl", "-sf", "-m", "3"];
        full.extend_from_slice(&["--interface", src]);
        full.extend_from_slice(args);
        let out = std::process::Command::new(full[0])
            .args(&full[1..])
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let token = run(&[
        "-X",
        "PUT",
        "-H",
        "X-aws-ec2-metadata-token-ttl-seconds: 60",
        "http://169.254.169.254/latest/api/token",
    ])?;
    run(&[
        "-H",
        &format!("X-aws-ec2-metadata-token: {token}"),
        &format!("http://169.254.169.254/latest/meta-data/{leaf}"),
    ])
}

fn primary_ip(e: &NetworkInterface) -> String {
    e.private_ip_address.clone().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_plug_routes_metadata_and_unplug_from_a_pod() {
    let Some(mut rig) = Rig::new().await else {
        return;
    };
    rig.start(rig.config()).await;

    let a1 = rig.create_eni(&rig.env.subnet_id).await;
    let b1 = rig.create_eni(&rig.subnet2).await;
    let att_a1 = rig
        .attach(&a1.network_interface_id, &rig.instance_a, 1)
        .await;
    rig.attach(&b1.network_interface_id, &rig.instance_b, 1)
        .await;

    // Each ENI in its own node, with moto's MAC and its subnet's MTU.
    let took = until(FOLLOW, "both ENIs plugged", || {
        link(&rig.node_a, &a1.mac_address).is_some() && link(&rig.node_b, &b1.mac_address).is_some()
    })
    .await;
    eprintln!("hot-plug followed moto in {took:?}");
    let la = link(&rig.node_a, &a1.mac_address).unwrap();
    let lb = link(&rig.node_b, &b1.mac_address).unwrap();
    assert_eq!(
        (la["ifname"].as_str(), la["mtu"].as_u64()),
        (Some("eth1"), Some(9001))
    );
    assert_eq!(
        (lb["ifname"].as_str(), lb["mtu"].as_u64()),
        (Some("eth1"), Some(u64::from(SUBNET2_MTU)))
    );
    assert!(
        link(&rig.node_a, &b1.mac_address).is_none(),
        "b1 leaked into node A"
    );
    assert!(
        link(&rig.node_b, &a1.mac_address).is_none(),
        "a1 leaked into node B"
    );

    // Node A's primary (primary = address): eth0, up, moto's address.
    let primary_a = rig
        .env
        .all_enis()
        .await
        .into_iter()
        .find(|e| {
            e.attached_instance() == Some(rig.instance_a.as_str())
                && e.attachment.as_ref().unwrap().device_index == Some(0)
        })
        .unwrap();
    until(FOLLOW, "node A's primary addressed", || {
        rig.node_a.link("eth0").is_some()
            && rig
                .node_a
                .addrs("eth0")
                .contains(&format!("{}/24", primary_ip(&primary_a)))
    })
    .await;
    // Node B's primary is left alone (primary = skip).
    assert!(rig.node_b.link("eth0").is_none());

    // A pod-like address on each ENI, and a route via the subnet gateway:
    // node A reaches node B across subnets through the VPC namespace.
    let (ip_a, ip_b) = (primary_ip(&a1), primary_ip(&b1));
    rig.node_a
        .ip(&["addr", "add", &format!("{ip_a}/24"), "dev", "eth1"]);
    rig.node_a.ip(&["link", "set", "eth1", "up"]);
    rig.node_a.ip(&[
        "route",
        "add",
        "10.0.2.0/24",
        "via",
        "10.0.1.1",
        "dev",
        "eth1",
        "src",
        &ip_a,
    ]);
    rig.node_a.ip(&[
        "route",
        "add",
        "169.254.169.254/32",
        "dev",
        "eth1",
        "src",
        &ip_a,
    ]);
    rig.node_b
        .ip(&["addr", "add", &format!("{ip_b}/24"), "dev", "eth1"]);
    rig.node_b.ip(&["link", "set", "eth1", "up"]);
    rig.node_b
        .ip(&["route", "add", "default", "via", "10.0.2.1", "dev", "eth1"]);
    assert!(
        rig.node_a
            .exec_ok(&["ping", "-c", "2", "-W", "2", "-I", &ip_a, &ip_b]),
        "ping {ip_a} -> {ip_b} through the VPC"
    );

    // Metadata answers each node as its own instance, by source address.
    assert_eq!(
        imds_get(&rig.node_a, &ip_a, "instance-id").as_deref(),
        Some(rig.instance_a.as_str())
    );
    assert_eq!(
        imds_get(&rig.node_b, &ip_b, "instance-id").as_deref(),
        Some(rig.instance_b.as_str())
    );
    let macs = imds_get(&rig.node_a, &ip_a, "network/interfaces/macs/").unwrap();
    assert!(macs.contains(&a1.mac_address), "{macs}");
    let dev = imds_get(
        &rig.node_a,
        &ip_a,
        &format!("network/interfaces/macs/{}/device-number", a1.mac_address),
    );
    assert_eq!(dev.as_deref(), Some("1"));

    // Address changes follow: a secondary IPv4 and an IPv6 routed, then
    // the IPv4 unassigned and its route gone.
    rig.ec2()
        .assign_addresses(Family::V4, &a1.network_interface_id, 1)
        .await
        .unwrap();
    rig.ec2()
        .assign_addresses(Family::V6, &a1.network_interface_id, 1)
        .await
        .unwrap();
    let now = rig.eni(&a1.network_interface_id).await;
    let secondary: Vec<IpAddr> = now.secondary_ips();
    let v4 = secondary.iter().find(|a| a.is_ipv4()).unwrap().to_string();
    let v6 = secondary.iter().find(|a| a.is_ipv6()).unwrap().to_string();
    until(FOLLOW, "secondary addresses routed", || {
        rig.routed(&v4) && rig.routed(&v6)
    })
    .await;
    rig.ec2()
        .unassign_addresses(
            Family::V4,
            &a1.network_interface_id,
            std::slice::from_ref(&v4),
        )
        .await
        .unwrap();
    until(FOLLOW, "unassigned address unrouted", || !rig.routed(&v4)).await;
    assert!(rig.routed(&v6) && rig.routed(&ip_a));

    // The ENI moves into a pod; detach in moto takes it from there too.
    rig.node_a.ip(&[
        "link",
        "set",
        "eth1",
        "netns",
        &rig.pod.name,
        "name",
        "eth0",
    ]);
    assert!(link(&rig.pod, &a1.mac_address).is_some());
    rig.ec2().detach_network_interface(&att_a1).await.unwrap();
    until(FOLLOW, "detached ENI gone from the pod", || {
        link(&rig.pod, &a1.mac_address).is_none()
    })
    .await;
    until(FOLLOW, "its routes gone", || {
        !rig.routed(&ip_a) && !rig.routed(&v6)
    })
    .await;
    // The other node is untouched.
    assert!(link(&rig.node_b, &b1.mac_address).is_some());
    rig.stop().await;
}

/// Two ENIs of one dual-stack subnet on two nodes, each with its IPv6
/// address on the subnet's on-link /64 (as EC2's router advertisement
/// gives it): they reach each other directly, the VPC answering each
/// neighbour solicitation for the other, as the cloud's fabric does. A
/// detached ENI's address is answered no more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv6_neighbours_of_one_subnet_on_two_nodes_answer_through_the_vpc() {
    let Some(mut rig) = Rig::new().await else {
        return;
    };
    let mut cfg = rig.config();
    cfg.nodes[0].primary = PrimaryMode::Skip;
    rig.start(cfg).await;
    let (a, b) = (
        rig.create_eni(&rig.subnet2).await,
        rig.create_eni(&rig.subnet2).await,
    );
    let mut v6 = Vec::new();
    for e in [&a, &b] {
        rig.ec2()
            .assign_addresses(Family::V6, &e.network_interface_id, 1)
            .await
            .unwrap();
        let now = rig.eni(&e.network_interface_id).await;
        v6.push(
            now.secondary_ips()
                .into_iter()
                .find(IpAddr::is_ipv6)
                .unwrap(),
        );
    }
    rig.attach(&a.network_interface_id, &rig.instance_a, 1)
        .await;
    let att_b = rig
        .attach(&b.network_interface_id, &rig.instance_b, 1)
        .await;
    until(FOLLOW, "both ENIs plugged", || {
        link(&rig.node_a, &a.mac_address).is_some() && link(&rig.node_b, &b.mac_address).is_some()
    })
    .await;
    for (node, addr) in [(&rig.node_a, v6[0]), (&rig.node_b, v6[1])] {
        node.ip(&["addr", "add", &format!("{addr}/64"), "dev", "eth1", "nodad"]);
        node.ip(&["link", "set", "eth1", "up"]);
    }
    let proxied = |addr: IpAddr| {
        let v: Value = rig.vpc.ip_json(&["-6", "neigh", "show", "proxy"]);
        v.as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .any(|n| n["dst"].as_str() == Some(addr.to_string().as_str()))
    };
    until(
        FOLLOW,
        "each address answered for by the other's far end",
        || proxied(v6[0]) && proxied(v6[1]),
    )
    .await;
    let (from, to) = (v6[0].to_string(), v6[1].to_string());
    assert!(
        rig.node_a
            .exec_ok(&["ping", "-6", "-c", "2", "-W", "2", "-I", &from, &to]),
        "ping -6 {from} -> {to}, on-link through the VPC"
    );

    rig.ec2().detach_network_interface(&att_b).await.unwrap();
    until(
        FOLLOW,
        "the detached ENI's address no longer answered",
        || !proxied(v6[1]),
    )
    .await;
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_and_detach_delays_and_a_restart_adopts() {
    let Some(mut rig) = Rig::new().await else {
        return;
    };
    let mut cfg = rig.config();
    cfg.attach_delay_ms = 1500;
    cfg.detach_delay_ms = 1000;
    cfg.nodes[0].primary = PrimaryMode::Skip;
    rig.start(cfg.clone()).await;

    let a1 = rig.create_eni(&rig.env.subnet_id).await;
    let attached_at = Instant::now();
    let att = rig
        .attach(&a1.network_interface_id, &rig.instance_a, 1)
        .await;
    // Not before the delay...
    holds_until(
        attached_at + Duration::from_millis(1300),
        "unplugged during the attach delay",
        || link(&rig.node_a, &a1.mac_address).is_none(),
    )
    .await;
    // ...and within about a second after it.
    until(
        Duration::from_millis(1500 + 1200),
        "plugged after the delay",
        || link(&rig.node_a, &a1.mac_address).is_some(),
    )
    .await;
    eprintln!("plugged {:?} after the attach", attached_at.elapsed());
    let before = link(&rig.node_a, &a1.mac_address).unwrap()["ifindex"].clone();
    let far_before = rig.vpc_routes();

    // A restarted simulator adopts the device: same ifindex, same routes,
    // even with an attach delay that a fresh plug would wait out.
    rig.stop().await;
    rig.start(cfg).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let after = link(&rig.node_a, &a1.mac_address).expect("adopted device gone");
    assert_eq!(
        after["ifindex"], before,
        "the restart made the device again"
    );
    assert_eq!(rig.vpc_routes(), far_before);

    // Detach: the device lingers for the detach delay, then goes.
    let detached_at = Instant::now();
    rig.ec2().detach_network_interface(&att).await.unwrap();
    holds_until(
        detached_at + Duration::from_millis(800),
        "plugged during the detach delay",
        || link(&rig.node_a, &a1.mac_address).is_some(),
    )
    .await;
    until(
        Duration::from_millis(1000 + 1200),
        "unplugged after the delay",
        || link(&rig.node_a, &a1.mac_address).is_none(),
    )
    .await;
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_listing_entries_are_skipped_not_fatal() {
    let Some(rig) = Rig::new().await else {
        return;
    };
    let a1 = rig.create_eni(&rig.env.subnet_id).await;
    rig.attach(&a1.network_interface_id, &rig.instance_a, 1)
        .await;
    let b1 = rig.create_eni(&rig.subnet2).await;
    rig.attach(&b1.network_interface_id, &rig.instance_b, 1)
        .await;
    let mut listing = rig.ec2().describe_network_interfaces(&[]).await.unwrap();
    let subnets = rig.ec2().describe_subnets(&[]).await.unwrap();

    // Doctored entries, placed first so they come before the good ones.
    let orig = listing
        .iter()
        .find(|e| e.network_interface_id == a1.network_interface_id)
        .unwrap()
        .clone();
    let mut bad = Vec::new();
    for (id, mac) in [("eni-nomac", ""), ("eni-badmac", "zz:00:00:00:00:01")] {
        let mut e = orig.clone();
        e.network_interface_id = id.into();
        e.mac_address = mac.into();
        e.attachment.as_mut().unwrap().device_index = Some(3);
        bad.push(e);
    }
    let mut stranger = orig.clone();
    stranger.network_interface_id = "eni-stranger".into();
    stranger.mac_address = "02:aa:00:00:00:01".into();
    stranger.attachment.as_mut().unwrap().instance_id = Some("i-nobody".into());
    bad.push(stranger);
    let mut lost = orig.clone();
    lost.network_interface_id = "eni-lost".into();
    lost.mac_address = "02:aa:00:00:00:02".into();
    lost.subnet_id = "subnet-nowhere".into();
    lost.attachment.as_mut().unwrap().device_index = Some(4);
    bad.push(lost);
    bad.append(&mut listing);

    let mut rec = Reconciler::new(rig.config()).await.unwrap();
    let tick = rec.tick(&bad, &subnets, Instant::now()).await;
    let skipped: Vec<&str> = tick.skipped.iter().map(|s| s.eni_id.as_str()).collect();
    for id in ["eni-nomac", "eni-badmac", "eni-stranger", "eni-lost"] {
        assert!(
            skipped.contains(&id),
            "{id} not skipped: {:?}",
            tick.skipped
        );
    }
    // moto's own instance (no node's) has its primary attached: skipped too.
    assert!(
        tick.skipped.iter().any(|s| s.why.contains("no node")),
        "{:?}",
        tick.skipped
    );
    assert!(tick.errors.is_empty(), "{:?}", tick.errors);
    assert!(link(&rig.node_a, &a1.mac_address).is_some());
    assert!(link(&rig.node_b, &b1.mac_address).is_some());
    assert!(rig.node_a.link("eth3").is_none() && rig.node_a.link("eth4").is_none());
    // A second tick with the same listing changes nothing (idempotent).
    let again = rec.tick(&bad, &subnets, Instant::now()).await;
    assert!(again.plugged.is_empty() && again.unplugged.is_empty() && again.errors.is_empty());
    drop(rec);
}
