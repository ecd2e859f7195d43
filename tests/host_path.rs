//! The host path against the real kernel, with real `enimd` and the real
//! plugin: a primary-mode pod reaches a ClusterIP (kube-proxy emulated by
//! an iptables DNAT in the sandbox host netns), the node reaches the pod,
//! hostPort works through Debian's reference `portmap`, the pod's other
//! traffic stays on its ENI, CHECK passes after `tuning` and `sbr`, and a
//! crash at any step leaves nothing behind. All inside sandbox namespaces,
//! with strict reverse-path filtering on.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use enim::support::fault::{CRASH_POINTS, HOST_PATH_CRASH_POINTS};
use serde_json::{json, Value};

/// The node's own address (on the sandbox host's loopback), where the
/// emulated Service's backend listens.
const NODE4: &str = "192.168.250.1";
const NODE6: &str = "fd00:250::1";
const CLUSTER_IP4: &str = "10.96.0.10";
const CLUSTER_IP6: &str = "fd00:96::a";
const HOST_PATH: &str = "[host_path]\nservice_cidrs = [\"10.96.0.0/12\", \"fd00:96::/112\"]";
const BACKEND_PORT: u16 = 8053;
/// The node's uplink address (see [`uplink`]) and a backend on another
/// node, behind the gateway.
const UPLINK4: &str = "10.78.0.2";
const UPLINK6: &str = "fd00:78::2";
const REMOTE4: &str = "10.79.0.5";
const REMOTE6: &str = "fd00:79::5";
/// Services whose backend is another whole-ENI pod on the node (pod B on
/// ENI 1), and a remote one.
const TO_POD_B4: &str = "10.96.0.20";
const TO_POD_B6: &str = "fd00:96::14";
const TO_REMOTE4: &str = "10.96.0.21";
const TO_REMOTE6: &str = "fd00:96::15";
const POD_B4: &str = "10.77.1.10";
const POD_B6: &str = "fd00:e1:1::10";
const SERVICE_PORT: u16 = 80;
const APP_PORT: u16 = 8080;
const POD_PORT: u16 = 8081;
/// The sandbox ENI 0's addresses in a pod.
const POD4: &str = "10.77.0.10";
const POD6: &str = "fd00:e1:0::10";

/// A one-line TCP server in a namespace: answers each connection with
/// `reply`, until dropped.
struct Server(Child);

impl Server {
    fn start(ns: &NamedNetns, addr: &str, port: u16, reply: &str) -> Server {
        Server::spawn(ns, addr, port, reply, false)
    }

    /// Answers `<reply> from <the connection's source address>`: what the
    /// backend sees.
    fn telling_source(ns: &NamedNetns, addr: &str, port: u16, reply: &str) -> Server {
        Server::spawn(ns, addr, port, reply, true)
    }

    fn spawn(ns: &NamedNetns, addr: &str, port: u16, reply: &str, source: bool) -> Server {
        let source = if source { "True" } else { "False" };
        let script = format!(
            "import socket,sys\n\
             s=socket.socket(socket.AF_INET6 if ':' in {addr:?} else socket.AF_INET)\n\
             s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n\
             s.bind(({addr:?},{port}))\n\
             s.listen(8)\n\
             print('ready',flush=True)\n\
             while True:\n\
             \x20c,a=s.accept()\n\
             \x20c.sendall(({reply:?}+(' from '+a[0] if {source} else '')).encode())\n\
             \x20c.close()\n"
        );
        let mut child = Command::new("ip")
            .args(["netns", "exec", &ns.name, "python3", "-c", &script])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3");
        let mut line = String::new();
        let stdout = child.stdout.as_mut().unwrap();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).unwrap();
        assert_eq!(
            line.trim(),
            "ready",
            "server on {addr}:{port} did not start"
        );
        Server(child)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What a TCP connection from `ns` to `addr`:`port` reads (an error string
/// when it fails), within 3 s.
fn fetch(ns: &NamedNetns, addr: &str, port: u16) -> String {
    fetch_within(ns, addr, port, 3)
}

/// [`fetch`] giving up after `secs` (then "error: timed out").
fn fetch_within(ns: &NamedNetns, addr: &str, port: u16, secs: u32) -> String {
    let script = format!(
        "import socket\n\
         try:\n\
         \x20c=socket.create_connection(({addr:?},{port}),timeout={secs})\n\
         \x20print(c.recv(100).decode())\n\
         except Exception as e:\n\
         \x20print('error:',e)\n"
    );
    let out = Command::new("ip")
        .args(["netns", "exec", &ns.name, "python3", "-c", &script])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Strict reverse-path filtering in `ns` (what a hardened node has): the
/// host path must work without loosening it.
fn strict_rp_filter(ns: &NamedNetns) {
    for conf in ["all", "default"] {
        assert!(ns.exec_ok(&[
            "sysctl",
            "-qw",
            &format!("net.ipv4.conf.{conf}.rp_filter=1")
        ]));
    }
}

/// A sandbox host that is a node: its own addresses, strict rp_filter, and
/// kube-proxy's DNAT of the ClusterIPs to a backend on the node.
fn make_node(sb: &Sandbox) {
    let host = &sb.host;
    host.ip(&["addr", "add", &format!("{NODE4}/32"), "dev", "lo"]);
    host.ip(&["addr", "add", &format!("{NODE6}/128"), "dev", "lo"]);
    strict_rp_filter(host);
    service(sb, CLUSTER_IP4, 53, NODE4, BACKEND_PORT);
    service(sb, CLUSTER_IP6, 53, NODE6, BACKEND_PORT);
}

/// kube-proxy's DNAT of `cluster_ip`:`port` to `backend`:`backend_port`
/// in the sandbox host (iptables or ip6tables by the address's family).
fn service(sb: &Sandbox, cluster_ip: &str, port: u16, backend: &str, backend_port: u16) {
    let (tool, to) = if cluster_ip.contains(':') {
        ("ip6tables", format!("[{backend}]:{backend_port}"))
    } else {
        ("iptables", format!("{backend}:{backend_port}"))
    };
    assert!(
        sb.host.exec_ok(&[
            tool,
            "-t",
            "nat",
            "-A",
            "PREROUTING",
            "-d",
            cluster_ip,
            "-p",
            "tcp",
            "--dport",
            &port.to_string(),
            "-j",
            "DNAT",
            "--to-destination",
            &to,
        ]),
        "{tool} DNAT in the sandbox host"
    );
}

/// The node's uplink: `node0` in the sandbox host (UPLINK4/UPLINK6) to
/// the gateway netns, which stands in for the VPC and the other nodes and
/// holds REMOTE4/REMOTE6 (a backend on another node) behind it. Forwarding
/// is on in the node (as on any Kubernetes node) and in the gateway (the
/// VPC routes between ENIs: a reply to a pod's address goes straight to
/// its ENI, never back through the node).
fn uplink(sb: &Sandbox) {
    let (host, gw) = (&sb.host, &sb.gateway);
    host.ip(&[
        "link", "add", "node0", "type", "veth", "peer", "name", "gwn0", "netns", &gw.name,
    ]);
    host.ip(&["addr", "add", &format!("{UPLINK4}/24"), "dev", "node0"]);
    host.ip(&[
        "addr",
        "add",
        &format!("{UPLINK6}/64"),
        "dev",
        "node0",
        "nodad",
    ]);
    host.ip(&["link", "set", "node0", "up"]);
    gw.ip(&["addr", "add", "10.78.0.1/24", "dev", "gwn0"]);
    gw.ip(&["addr", "add", "fd00:78::1/64", "dev", "gwn0", "nodad"]);
    gw.ip(&["link", "set", "gwn0", "up"]);
    gw.ip(&["addr", "add", &format!("{REMOTE4}/32"), "dev", "lo"]);
    gw.ip(&["addr", "add", &format!("{REMOTE6}/128"), "dev", "lo"]);
    host.ip(&["route", "add", "10.79.0.0/24", "via", "10.78.0.1"]);
    host.ip(&["route", "add", "fd00:79::/64", "via", "fd00:78::1"]);
    for ns in [host, gw] {
        for key in ["net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"] {
            assert!(ns.exec_ok(&["sysctl", "-qw", key]), "{key}");
        }
    }
}

/// Deletes enimd's masquerade table from the sandbox host by hand.
fn drop_table(sb: &Sandbox) {
    assert!(sb.host.exec_ok(&["nft", "delete", "table", "inet", "enim"]));
}

/// Asserts that `answer` is `<tag> from <one of the node's addresses>`:
/// the backend saw the node as the source, as with kube-proxy's own
/// masquerade.
fn from_the_node(answer: &str, tag: &str) {
    let source = answer
        .strip_prefix(&format!("{tag} from "))
        .unwrap_or_else(|| panic!("not {tag:?} from someone: {answer:?}"));
    assert!(
        [NODE4, NODE6, UPLINK4, UPLINK6].contains(&source),
        "the backend saw {source}, not the node"
    );
}

/// enimd's masquerade table in the sandbox host as `nft` lists it, if any.
fn masquerade_table(sb: &Sandbox) -> Option<String> {
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            &sb.host.name,
            "nft",
            "list",
            "table",
            "inet",
            "enim",
        ])
        .output()
        .expect("nft");
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Asserts that the masquerade table holds each of its chains and rules
/// exactly once.
fn assert_table_once(sb: &Sandbox, when: &str) {
    let table = masquerade_table(sb).unwrap_or_else(|| panic!("{when}: no table"));
    for needle in [
        "chain host_path_mark {",
        "chain host_path_masquerade {",
        "iifname \"enih*\" ct state new ct mark set ct mark | 0x00200000",
        "ct status dnat ct mark & 0x00200000 == 0x00200000 masquerade fully-random",
        "oifname \"enih*\" ct status dnat masquerade fully-random",
    ] {
        assert_eq!(
            table.matches(needle).count(),
            1,
            "{when}: {needle} in {table}"
        );
    }
    let rules = table.lines().filter(|l| l.contains(" comment ")).count();
    assert_eq!(rules, 3, "{when}: {table}");
}

/// The host ends of host paths in the sandbox host.
fn host_path_veths(sb: &Sandbox) -> Vec<String> {
    sb.host
        .link_names()
        .into_iter()
        .filter(|n| n.starts_with("enih"))
        .collect()
}

/// After a DEL: its host path veth is deleted behind the answer (one RCU
/// barrier in the kernel, some 15 ms), so wait for that, up to 5 s; then
/// the host path veths left, and whether `pod` still holds its end.
fn host_path_after_del(sb: &Sandbox, pod: &NamedNetns) -> (Vec<String>, bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left = host_path_veths(sb);
        let pod_end = pod.link("eth0-host").is_some();
        if (left.is_empty() && !pod_end) || Instant::now() > deadline {
            return (left, pod_end);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Counts the pod's echo requests leaving through each of `devs` (an
/// accounting rule per device and family in the pod's own netfilter; the
/// link counters would also count IPv6's own chatter on the host path).
fn count_pings(pod: &NamedNetns, devs: &[&str]) {
    for dev in devs {
        for (tool, proto, kind) in [
            ("iptables", "icmp", "--icmp-type"),
            ("ip6tables", "ipv6-icmp", "--icmpv6-type"),
        ] {
            let rule = ["-A", "OUTPUT", "-o", dev, "-p", proto, kind, "echo-request"];
            assert!(pod.exec_ok(&[&[tool][..], &rule[..]].concat()));
        }
    }
}

/// Echo requests counted through `dev` so far, both families.
fn pings_through(pod: &NamedNetns, dev: &str) -> u64 {
    let mut total = 0;
    for tool in ["iptables", "ip6tables"] {
        let out = Command::new("ip")
            .args([
                "netns", "exec", &pod.name, tool, "-L", "OUTPUT", "-v", "-n", "-x",
            ])
            .output()
            .unwrap();
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let cols: Vec<&str> = line.split_whitespace().collect();
            // pkts bytes [target] prot opt in out source destination: the
            // rules have no target, so find the device among the columns.
            if cols.len() > 2 && cols[2..].contains(&dev) {
                total += cols[0].parse::<u64>().unwrap_or(0);
            }
        }
    }
    total
}

fn host_rig(n: usize, extra: &str) -> Rig {
    let sb = Sandbox::new(n);
    make_node(&sb);
    let pod = NamedNetns::new("pod");
    strict_rp_filter(&pod);
    let dir = tempfile::tempdir().unwrap();
    let agent = start_agent(&sb, dir.path(), &format!("{extra}\n{HOST_PATH}"));
    (sb, pod, dir, agent)
}

#[test]
fn pod_reaches_services_and_the_node_reaches_the_pod() {
    require_kernel!();
    let (sb, pod, _dir, agent) = host_rig(1, "");
    let (conf, result) = plugin_add_c1(&agent, &pod);

    // The result: the ENI, then the host path's pod end, both in the pod.
    let interfaces = result["interfaces"].as_array().unwrap();
    assert_eq!(interfaces.len(), 2, "{result}");
    assert_eq!(interfaces[1]["name"], "eth0-host");
    assert_eq!(interfaces[1]["sandbox"], pod.path().display().to_string());
    assert!(result["ips"]
        .as_array()
        .unwrap()
        .iter()
        .all(|ip| ip["interface"] == 0));
    let routes: Vec<String> = result["routes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            format!(
                "{} via {}",
                r["dst"].as_str().unwrap(),
                r["gw"].as_str().unwrap()
            )
        })
        .collect();
    for want in [
        "10.96.0.0/12 via 169.254.1.1",
        "fd00:96::/112 via fe80::1",
        "192.168.250.1/32 via 169.254.1.1",
        "fd00:250::1/128 via fe80::1",
    ] {
        assert!(
            routes.contains(&want.to_string()),
            "{want} not in {routes:?}"
        );
    }
    let mac = pod.link("eth0-host").unwrap()["address"].clone();
    assert_eq!(interfaces[1]["mac"], mac);

    // kube-proxy's DNAT on the node answers the pod, both families.
    let _backend4 = Server::start(&sb.host, NODE4, BACKEND_PORT, "dns4");
    let _backend6 = Server::start(&sb.host, NODE6, BACKEND_PORT, "dns6");
    assert_eq!(fetch(&pod, CLUSTER_IP4, 53), "dns4");
    assert_eq!(fetch(&pod, CLUSTER_IP6, 53), "dns6");

    // The node (a kubelet probe) reaches the pod's ENI addresses.
    let _pod4 = Server::start(&pod, POD4, POD_PORT, "pod4");
    let _pod6 = Server::start(&pod, POD6, POD_PORT, "pod6");
    assert_eq!(fetch(&sb.host, POD4, POD_PORT), "pod4");
    assert_eq!(fetch(&sb.host, POD6, POD_PORT), "pod6");

    // CHECK verifies both paths; a missing host path route fails it.
    let mut check = conf.clone();
    check["prevResult"] = result.clone();
    enim("CHECK", "c1", Some(&pod.path()), "eth0", &check).ok();
    pod.ip(&["route", "del", "10.96.0.0/12"]);
    let why = enim("CHECK", "c1", Some(&pod.path()), "eth0", &check).err(103);
    assert!(why.contains("10.96.0.0/12"), "{why}");

    enim("DEL", "c1", Some(&pod.path()), "eth0", &conf).ok();
    sb.assert_home(0);
    assert_eq!(
        host_path_after_del(&sb, &pod),
        (Vec::<String>::new(), false)
    );
    let after = fetch(&sb.host, POD4, POD_PORT);
    assert!(
        after.starts_with("error"),
        "the node still reaches the pod: {after}"
    );
}

#[test]
fn the_pods_own_traffic_stays_on_its_eni() {
    require_kernel!();
    let (sb, pod, _dir, _agent, conf) = with_c1(host_rig(1, ""));
    let default = pod.ip(&["route", "show", "default"]);
    assert!(
        default.contains("dev eth0") && !default.contains("eth0-host"),
        "{default}"
    );

    count_pings(&pod, &["eth0", "eth0-host"]);
    for target in ["10.77.0.1", "fd00:e1:0::1", "10.200.0.1"] {
        // The gateways answer; an address off the VPC goes out of the ENI
        // too (and is lost there), never to the host.
        let _ = pod.exec_ok(&["ping", "-c", "2", "-i", "0.2", "-W", "1", target]);
    }
    assert!(pod.exec_ok(&["ping", "-c", "1", "-W", "2", "10.77.0.1"]));
    assert_eq!(
        pings_through(&pod, "eth0"),
        7,
        "every echo request takes the ENI"
    );
    assert_eq!(
        pings_through(&pod, "eth0-host"),
        0,
        "the pod's own traffic took the host path"
    );
    // The same rules see the host path used for what it is for.
    assert!(pod.exec_ok(&["ping", "-c", "1", "-W", "2", NODE4]));
    assert_eq!(pings_through(&pod, "eth0-host"), 1);
    enim("DEL", "c1", Some(&pod.path()), "eth0", &conf).ok();
    sb.assert_home(0);
}

/// A host-netns plugin (portmap writes iptables rules where it runs) run
/// inside the sandbox host, through a wrapper.
fn in_host_netns(sb: &Sandbox, dir: &Path, plugin: &str) -> PathBuf {
    let wrapper = dir.join(plugin);
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec ip netns exec {} /usr/lib/cni/{plugin}\n",
            sb.host.name
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    wrapper
}

fn chained(plugin: &str, extra: Value, prev: &Value) -> Value {
    let mut conf = json!({
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "type": plugin,
        "prevResult": prev,
    });
    for (k, v) in extra.as_object().unwrap() {
        conf[k] = v.clone();
    }
    conf
}

#[test]
fn host_port_through_the_reference_portmap_plugin() {
    require_kernel!();
    let (sb, pod, dir, agent) = host_rig(1, "");
    uplink(&sb);
    let portmap = in_host_netns(&sb, dir.path(), "portmap");
    // Debian's reference plugins (1.1.1) speak up to CNI 1.0.0.
    let conf = agent.net_conf("1.0.0");
    let args = cni::k8s_args("default", "c1");
    let first = enim("ADD", "c1", Some(&pod.path()), "eth0", &conf).ok();
    let pm = |prev: &Value| {
        chained(
            "portmap",
            json!({
                "capabilities": {"portMappings": true},
                "runtimeConfig": {"portMappings": [
                    {"hostPort": 9090, "containerPort": POD_PORT, "protocol": "tcp"}
                ]},
            }),
            prev,
        )
    };
    let out = exec_plugin(
        &portmap,
        "ADD",
        "c1",
        Some(&pod.path()),
        "eth0",
        &args,
        &pm(&first),
    );
    let last = out.ok();
    let _server = Server::telling_source(&pod, POD4, POD_PORT, "hostport");
    // A connection to the node's host port, from the node, reaches the pod.
    from_the_node(&fetch(&sb.host, NODE4, 9090), "hostport");
    // From another machine (the gateway, to the node's uplink address):
    // the DNATed connection leaves to the pod's host path, so enimd's table
    // masquerades it and the pod answers the node over its host path.
    // Without the table the pod answers the caller over its ENI (its
    // default route), and the caller never hears from the address it
    // called.
    from_the_node(&fetch(&sb.gateway, UPLINK4, 9090), "hostport");
    drop_table(&sb);
    assert_eq!(
        fetch_within(&sb.gateway, UPLINK4, 9090, 2),
        "error: timed out"
    );

    exec_plugin(
        &portmap,
        "DEL",
        "c1",
        Some(&pod.path()),
        "eth0",
        &args,
        &pm(&last),
    )
    .ok();
    let mut del = conf.clone();
    del["prevResult"] = last;
    enim("DEL", "c1", Some(&pod.path()), "eth0", &del).ok();
    sb.assert_home(0);
    assert_eq!(
        host_path_after_del(&sb, &pod),
        (Vec::<String>::new(), false)
    );
}

/// kube-proxy without `clusterCIDR` does not masquerade: a Service's
/// backend (a whole-ENI pod on this node, or one on another node) would
/// answer the client pod's own address over the VPC, past the node's
/// conntrack. Pod A (ENI 0) calls Services
/// whose backend is pod B (ENI 1, on this node) and a backend on another
/// node (behind the gateway), both families: through enimd's table each
/// answers, seeing the node as the source; without it each times out.
#[test]
fn services_with_enim_backends_answer_through_the_masquerade() {
    require_kernel!();
    let (sb, pod_a, _dir, mut agent) = host_rig(2, "");
    uplink(&sb);
    let pod_b = NamedNetns::new("pod");
    strict_rp_filter(&pod_b);
    let conf = agent.net_conf("1.1.0");
    enim("ADD", "a", Some(&pod_a.path()), "eth0", &conf).ok();
    enim("ADD", "b", Some(&pod_b.path()), "eth0", &conf).ok();
    let services = [
        (TO_POD_B4, &pod_b, POD_B4, "b4"),
        (TO_POD_B6, &pod_b, POD_B6, "b6"),
        (TO_REMOTE4, &sb.gateway, REMOTE4, "remote4"),
        (TO_REMOTE6, &sb.gateway, REMOTE6, "remote6"),
    ];
    let _servers: Vec<Server> = services
        .iter()
        .map(|(cluster_ip, ns, backend, tag)| {
            service(&sb, cluster_ip, SERVICE_PORT, backend, APP_PORT);
            Server::telling_source(ns, backend, APP_PORT, tag)
        })
        .collect();
    let all_answer = |when: &str| {
        for (cluster_ip, _, _, tag) in &services {
            let answer = fetch(&pod_a, cluster_ip, SERVICE_PORT);
            assert!(answer.starts_with(tag), "{when}: {cluster_ip}: {answer}");
            from_the_node(&answer, tag);
        }
    };
    assert_table_once(&sb, "at start");
    all_answer("with the table");

    drop_table(&sb);
    for (cluster_ip, _, backend, _) in &services {
        assert_eq!(
            fetch_within(&pod_a, cluster_ip, SERVICE_PORT, 2),
            "error: timed out",
            "without the table, {cluster_ip} -> {backend}"
        );
    }
    // The pod's own path to B, over the ENIs and the VPC, is not the
    // node's business: it works with or without the table.
    let direct = fetch(&pod_a, POD_B4, APP_PORT);
    assert_eq!(direct, format!("b4 from {POD4}"));

    // A restart puts the table back.
    agent.stop();
    agent.restart();
    assert_table_once(&sb, "after a restart");
    all_answer("after a restart");
    assert_eq!(fetch(&pod_a, POD_B4, APP_PORT), format!("b4 from {POD4}"));

    for (cid, pod) in [("a", &pod_a), ("b", &pod_b)] {
        enim("DEL", cid, Some(&pod.path()), "eth0", &conf).ok();
    }
    sb.assert_all_home();
}

/// With the host path off there is no table. With it on, the table is
/// made whole at every start: two restarts leave each rule once. With the
/// masquerade turned off (or the host path), a start removes an earlier
/// run's table and makes none; an `nft` that cannot run is a start-up
/// error naming the command.
#[test]
fn the_masquerade_table_converges_at_every_start() {
    require_kernel!();
    let sb = Sandbox::new(1);
    make_node(&sb);
    let dir = tempfile::tempdir().unwrap();
    let mut agent = start_agent(&sb, dir.path(), "");
    assert_eq!(masquerade_table(&sb), None, "the host path off");
    let reconfigure = |agent: &mut Agent, extra: &str| {
        agent.stop();
        enim_testkit::fixtures::write_config(dir.path(), None, &sb.enis, extra);
    };
    reconfigure(&mut agent, HOST_PATH);
    agent.restart();
    assert_table_once(&sb, "first start with the host path");
    for n in 1..=2 {
        agent.stop();
        agent.restart();
        assert_table_once(&sb, &format!("restart {n}"));
    }
    let nft_tables = || {
        let out = Command::new("ip")
            .args(["netns", "exec", &sb.host.name, "nft", "list", "tables"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(nft_tables().matches("table inet enim").count(), 1);

    reconfigure(&mut agent, &format!("{HOST_PATH}\nmasquerade = false"));
    agent.restart();
    assert_eq!(masquerade_table(&sb), None, "masquerade = false");
    // The host path works without it (the node's own Services).
    let pod = NamedNetns::new("pod");
    let (conf, _) = plugin_add_c1(&agent, &pod);
    let _backend = Server::start(&sb.host, NODE4, BACKEND_PORT, "dns4");
    assert_eq!(fetch(&pod, CLUSTER_IP4, 53), "dns4");
    enim("DEL", "c1", Some(&pod.path()), "eth0", &conf).ok();

    reconfigure(&mut agent, HOST_PATH);
    agent.restart();
    assert_table_once(&sb, "masquerade back on");
    reconfigure(&mut agent, "");
    agent.restart();
    assert_eq!(masquerade_table(&sb), None, "the host path off");

    reconfigure(
        &mut agent,
        &format!("{HOST_PATH}\nnft = \"/nonexistent/nft\""),
    );
    agent.spawn();
    let err = agent.try_wait_ready().unwrap_err();
    assert!(
        err.contains("/nonexistent/nft -f -") && err.contains("host path masquerade"),
        "{err}"
    );
    assert_eq!(masquerade_table(&sb), None);
}

#[test]
fn check_passes_after_tuning_and_sbr() {
    require_kernel!();
    let (sb, pod, _dir, agent) = host_rig(1, "");
    let conf = agent.net_conf("1.0.0");
    let args = cni::k8s_args("default", "c1");
    let tuning = Path::new("/usr/lib/cni/tuning");
    let sbr = Path::new("/usr/lib/cni/sbr");
    let tuning_conf = |prev: &Value| chained("tuning", json!({"mtu": 1400}), prev);
    let sbr_conf = |prev: &Value| chained("sbr", json!({}), prev);

    let first = enim("ADD", "c1", Some(&pod.path()), "eth0", &conf).ok();
    let tuned = exec_plugin(
        tuning,
        "ADD",
        "c1",
        Some(&pod.path()),
        "eth0",
        &args,
        &tuning_conf(&first),
    )
    .ok();
    let last = exec_plugin(
        sbr,
        "ADD",
        "c1",
        Some(&pod.path()),
        "eth0",
        &args,
        &sbr_conf(&tuned),
    )
    .ok();
    // sbr moved the ENI's default route out of main, behind a rule.
    let main = pod.ip(&["route", "show", "default"]);
    assert!(
        !main.contains("dev eth0"),
        "sbr left the default route in main: {main}"
    );
    let rules = pod.ip(&["rule", "list"]);
    assert!(rules.contains(&format!("from {POD4}")), "{rules}");

    // CHECK runs over the chain with the final result as prevResult.
    let mut check = conf.clone();
    check["prevResult"] = last.clone();
    enim("CHECK", "c1", Some(&pod.path()), "eth0", &check).ok();

    exec_plugin(
        sbr,
        "DEL",
        "c1",
        Some(&pod.path()),
        "eth0",
        &args,
        &sbr_conf(&last),
    )
    .ok();
    exec_plugin(
        tuning,
        "DEL",
        "c1",
        Some(&pod.path()),
        "eth0",
        &args,
        &tuning_conf(&last),
    )
    .ok();
    enim("DEL", "c1", Some(&pod.path()), "eth0", &check).ok();
    sb.assert_home(0);
}

/// Every point of ADD and DEL, the host path's own included: kill -9
/// there, restart, GC. The attachment is then either whole (ENI and host
/// path) and recorded, or gone without a trace; the runtime's retry works
/// and its DEL leaves no veth and no route behind.
#[cfg_attr(
    not(feature = "fault-injection"),
    ignore = "needs the crash points: --features fault-injection (CI runs --all-features)"
)]
#[test]
fn crash_at_every_point_with_a_host_path_leaks_nothing() {
    require_kernel!();
    let points: Vec<&str> = CRASH_POINTS
        .iter()
        .chain(HOST_PATH_CRASH_POINTS)
        .copied()
        .filter(|p| p.starts_with("add:") || p.starts_with("del:"))
        .collect();
    for point in points {
        let (sb, pod, _dir, mut agent) = host_rig(1, "gc_grace = \"0s\"");
        let host_routes = || sb.host.ip(&["route", "show", "table", "all"]);
        let clean_routes = host_routes();
        let conf = agent.net_conf("1.1.0");
        let is_add = crash_c1_at(&mut agent, &pod, &conf, point);

        match agent.attachments().as_slice() {
            [] => {
                assert_eq!(
                    host_path_veths(&sb),
                    Vec::<String>::new(),
                    "{point}: undone, yet a veth is left"
                );
                assert_eq!(
                    host_routes(),
                    clean_routes,
                    "{point}: undone, yet a route is left"
                );
                sb.assert_home(0);
            }
            [a] => {
                assert_eq!(a["phase"], "ready", "{point}: {a}");
                assert_eq!(host_path_veths(&sb).len(), 1, "{point}");
                let _backend = Server::start(&sb.host, NODE4, BACKEND_PORT, "dns4");
                assert_eq!(
                    fetch(&pod, CLUSTER_IP4, 53),
                    "dns4",
                    "{point}: kept, but no host path"
                );
            }
            more => panic!("{point}: {more:?}"),
        }

        // The runtime retries; then DEL leaves the node as it was.
        if is_add {
            enim("ADD", "c1", Some(&pod.path()), "eth0", &conf).ok();
        }
        enim("DEL", "c1", Some(&pod.path()), "eth0", &conf).ok();
        assert!(agent.attachments().is_empty(), "{point}");
        assert_eq!(
            host_path_after_del(&sb, &pod),
            (Vec::<String>::new(), false),
            "{point}: DEL left a veth"
        );
        assert_eq!(host_routes(), clean_routes, "{point}: DEL left a route");
        sb.assert_home(0);
    }
}

/// A host path veth of enim's shape that no record explains (a record lost
/// with its checkpoint) is swept by GC; a stranger's veth is not. A pod
/// whose netns died takes its host path with it, and GC collects the rest.
#[test]
fn gc_sweeps_stray_host_paths_and_dead_pods() {
    require_kernel!();
    let (sb, pod, _dir, agent, conf) = with_c1(host_rig(2, "gc_grace = \"0s\""));
    let other = NamedNetns::new("pod");
    enim("ADD", "c2", Some(&other.path()), "eth0", &conf).ok();
    sb.host.ip(&[
        "link",
        "add",
        "enih0123456789a",
        "type",
        "veth",
        "peer",
        "name",
        "strayp",
    ]);
    sb.host.ip(&[
        "link",
        "add",
        "vethstranger",
        "type",
        "veth",
        "peer",
        "name",
        "strangerp",
    ]);
    drop(other);

    // The netns teardown is asynchronous: GC until the dead pod is
    // collected, gathering what each pass swept.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut swept = Vec::new();
    loop {
        let report = agent.ctl(&["gc"]);
        swept.extend(report["swept"].as_array().cloned().unwrap_or_default());
        if report["collected"]
            .as_array()
            .is_some_and(|c| !c.is_empty())
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the dead pod was never collected: {report}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(swept, [json!("veth enih0123456789a")]);
    assert_eq!(
        host_path_veths(&sb).len(),
        1,
        "only the live pod's host path is left"
    );
    assert!(sb.host.link("vethstranger").is_some());
    assert_eq!(agent.attachments().len(), 1);
    enim("DEL", "c1", Some(&pod.path()), "eth0", &conf).ok();
    assert_eq!(host_path_after_del(&sb, &pod).0, Vec::<String>::new());
}

/// A veth left under this attachment's own host-end name (the name derives
/// from its key) is replaced by ADD, not taken for a clash.
#[test]
fn add_replaces_a_leftover_under_its_own_name() {
    require_kernel!();
    let (sb, pod, _dir, agent) = host_rig(1, "");
    let key = enim_api::model::AttachmentKey {
        network: NETWORK.into(),
        container_id: "c1".into(),
        ifname: "eth0".into(),
    };
    let name = enim_api::model::naming::veth_name("enih", &key);
    sb.host.ip(&[
        "link",
        "add",
        &name,
        "type",
        "veth",
        "peer",
        "name",
        "leftoverp",
    ]);
    let conf = agent.net_conf("1.1.0");
    enim("ADD", "c1", Some(&pod.path()), "eth0", &conf).ok();
    assert!(sb.host.link("leftoverp").is_none(), "the old pair is gone");
    assert_eq!(host_path_veths(&sb), [name]);
    let _backend = Server::start(&sb.host, NODE4, BACKEND_PORT, "dns4");
    assert_eq!(fetch(&pod, CLUSTER_IP4, 53), "dns4");
    enim("DEL", "c1", Some(&pod.path()), "eth0", &conf).ok();
    assert_eq!(
        host_path_after_del(&sb, &pod),
        (Vec::<String>::new(), false)
    );
}
