//! Secondary mode against the real kernel: veth "ENIs" stay in a sandbox
//! host namespace and carry secondary addresses, pods in their own
//! namespaces reach the gateway namespace through their own ENI.

mod common;
/// The real enimd and plugin in secondary mode.
#[path = "secondary_netns/enimd.rs"]
mod enimd;

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use enim::engine::EngineError;
use enim::secondary::SecondaryConfig;
use enim_api::model::{Mode, Phase, Record, RouteConfig, SecondaryPayload};
use enim_api::{GcRequest, MtuExpectation};
use enim_provider_static::StaticEniConfig;

fn test_config() -> SecondaryConfig {
    SecondaryConfig {
        cooldown: Duration::ZERO,
        ..SecondaryConfig::default()
    }
}

/// A manager in secondary mode over the sandbox, started as enimd starts
/// it: recovery, then one GC pass.
async fn start(sb: &Sandbox, enis: &[StaticEniConfig], checkpoint: &Path) -> Arc<SecondaryEngine> {
    let mgr = secondary_manager(sb, enis, checkpoint, test_config()).await;
    mgr.recover().await.expect("recover");
    let report = mgr.gc(&GcRequest::default(), Duration::from_secs(30)).await;
    assert!(report.errors.is_empty(), "startup GC: {report:?}");
    mgr
}

/// A sandbox of one ENI per count, each with that many secondary
/// addresses (and IPv6 ones when `ipv6`), their configs, and a temp dir.
fn sandbox(counts: &[usize], ipv6: bool) -> (Sandbox, Vec<StaticEniConfig>, tempfile::TempDir) {
    let sb = Sandbox::new(counts.len());
    let enis = sb.enis_with_secondaries(counts, ipv6);
    (sb, enis, tempfile::tempdir().unwrap())
}

/// [`sandbox`] and a manager [`start`]ed over it, its checkpoint in the dir.
async fn rig(
    counts: &[usize],
    ipv6: bool,
) -> (
    Sandbox,
    Vec<StaticEniConfig>,
    tempfile::TempDir,
    Arc<SecondaryEngine>,
) {
    let (sb, enis, dir) = sandbox(counts, ipv6);
    let mgr = start(&sb, &enis, &dir.path().join("cp.json")).await;
    (sb, enis, dir, mgr)
}

fn pods(mgr: &SecondaryEngine) -> impl std::future::Future<Output = Vec<Record>> + '_ {
    mgr.checkpoint().list_mode(Mode::Secondary)
}

/// A secondary-mode record's payload.
fn sec(record: &Record) -> &SecondaryPayload {
    record.secondary().expect("a secondary-mode record")
}

async fn pod_record(mgr: &SecondaryEngine, cid: &str) -> Record {
    pods(mgr)
        .await
        .into_iter()
        .find(|p| p.key.container_id == cid)
        .unwrap_or_else(|| panic!("no record for {cid}"))
}

fn rules(sb: &Sandbox) -> String {
    sb.host.ip(&["-4", "rule", "list"]) + &sb.host.ip(&["-6", "rule", "list"])
}

fn ping(pod: &NamedNetns, target: &str) -> bool {
    let v6 = if target.contains(':') { "-6" } else { "-4" };
    pod.exec_ok(&["ping", v6, "-c", "1", "-W", "2", target])
}

/// `ip route get <dst> from <pod ip> iif <host veth>` in the host: the
/// path the kernel picks for the pod's packets.
fn route_of(sb: &Sandbox, pod: &Record, ip: IpAddr, dst: &str) -> String {
    sb.host.ip(&[
        "route",
        "get",
        dst,
        "from",
        &ip.to_string(),
        "iif",
        &sec(pod).host_veth,
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_pod_leaves_through_its_own_eni() {
    require_kernel!();
    let (sb, enis, _dir, mgr) = rig(&[2, 1], false).await;

    // The ENIs were renamed, tuned and given their tables.
    for (i, name) in ["enis1", "enis2"].iter().enumerate() {
        let link = sb
            .host
            .link(name)
            .unwrap_or_else(|| panic!("{name} missing"));
        assert_eq!(link["address"], enis[i].mac.to_string());
        assert_eq!(link["mtu"], POD_MTU);
        let table = sb
            .host
            .ip(&["route", "show", "table", &format!("100{}", i + 1)]);
        assert_holds_all(
            &table,
            &[
                format!("default via 10.77.{i}.1 dev {name}"),
                format!("10.77.{i}.1 dev {name}"),
            ],
        );
        // Tuned over netlink: loose rp_filter, forwarding, no proxy delay.
        for (key, want) in [
            (format!("ipv4/conf/{name}/rp_filter"), 2),
            (format!("ipv4/conf/{name}/forwarding"), 1),
            (format!("ipv4/neigh/{name}/proxy_delay"), 0),
        ] {
            assert!(
                sb.host.exec_ok(&[
                    "sh",
                    "-c",
                    &format!("test $(cat /proc/sys/net/{key}) = {want}")
                ]),
                "{key} is not {want}"
            );
        }
    }
    // IPv4 forwarding is per device: the namespace-wide switch stays off.
    assert!(sb
        .host
        .exec_ok(&["sh", "-c", "test $(cat /proc/sys/net/ipv4/ip_forward) = 0"]));

    let netns: Vec<NamedNetns> = (0..3).map(|_| NamedNetns::new("pod")).collect();
    let cids = ["a", "b", "c"];
    for (cid, ns) in cids.iter().zip(&netns) {
        let result = mgr.add(&owner(cid, "eth0"), &ns.path()).await.expect("ADD");
        assert_eq!(result.interface.name, "eth0");
        assert_eq!(result.interface.mtu, POD_MTU);
        assert_eq!(result.ips.len(), 1, "IPv4 only: {result:?}");
        assert_eq!(result.ips[0].gateway, Some("169.254.1.1".parse().unwrap()));
        assert_eq!(result.routes[0].dst.to_string(), "0.0.0.0/0");
        let link = ns.link("eth0").expect("eth0 in pod");
        assert_eq!(link["address"], result.interface.mac.to_string());
        assert_eq!(link["mtu"], POD_MTU);
        assert_eq!(
            ns.addrs("eth0"),
            vec![result.ips[0].address.to_string()],
            "the pod address as /32"
        );
    }
    let (a, b, c) = (
        pod_record(&mgr, "a").await,
        pod_record(&mgr, "b").await,
        pod_record(&mgr, "c").await,
    );
    // Two pods share the first ENI, the third has the second.
    assert_eq!(
        (a.eni_id.as_str(), b.eni_id.as_str(), c.eni_id.as_str()),
        ("eni-0000", "eni-0000", "eni-0001")
    );
    for p in [&a, &b, &c] {
        let key = format!("ipv4/conf/{}/forwarding", sec(p).host_veth);
        assert!(
            sb.host
                .exec_ok(&["sh", "-c", &format!("test $(cat /proc/sys/net/{key}) = 1")]),
            "{key} is not 1: the pod's packets would not be routed"
        );
    }
    let ip = |p: &Record| IpAddr::V4(sec(p).ipv4.unwrap());
    assert_eq!(ip(&a).to_string(), "10.77.0.11");
    assert_eq!(ip(&b).to_string(), "10.77.0.12");
    assert_eq!(ip(&c).to_string(), "10.77.1.11");

    let listed = rules(&sb);
    for (p, table) in [(&a, 1001), (&b, 1001), (&c, 1002)] {
        let ip = ip(p);
        assert_holds_all(
            &listed,
            &[
                format!("512:\tfrom all to {ip} lookup main"),
                format!("1536:\tfrom {ip} lookup {table}"),
            ],
        );
    }

    // Each pod's packets, to its gateway, to the other ENI's gateway and to
    // anywhere, leave through its own ENI by its own table, from its own
    // address.
    for (p, eni, table) in [
        (&a, "enis1", 1001),
        (&b, "enis1", 1001),
        (&c, "enis2", 1002),
    ] {
        for dst in ["10.77.0.1", "10.77.1.1", "192.0.2.1"] {
            let route = route_of(&sb, p, ip(p), dst);
            assert!(
                route.contains(&format!("from {} ", ip(p)))
                    && route.contains(&format!("dev {eni} table {table}")),
                "{} to {dst}: {route}",
                p.key.container_id
            );
        }
    }
    for (ns, p, gw) in [
        (&netns[0], &a, "10.77.0.1"),
        (&netns[1], &b, "10.77.0.1"),
        (&netns[2], &c, "10.77.1.1"),
    ] {
        assert!(ping(ns, gw), "{} cannot ping {gw}", p.key.container_id);
    }
    // The gateway saw each pod's address on the link of the pod's ENI.
    for (p, link) in [(&a, "gw0"), (&b, "gw0"), (&c, "gw1")] {
        let neigh = sb.gateway.ip(&["neigh", "show", &ip(p).to_string()]);
        assert!(neigh.contains(&format!("dev {link}")), "{neigh}");
    }
    // Pods on the node reach each other directly.
    assert!(
        ping(&netns[0], &ip(&c).to_string()),
        "pod a cannot reach pod c"
    );

    for cid in cids {
        mgr.check(
            &owner(cid, "eth0"),
            &pod_record(&mgr, cid).await.netns,
            MtuExpectation::Recorded,
        )
        .await
        .unwrap_or_else(|e| panic!("CHECK {cid}: {e}"));
    }
    // CHECK notices a missing rule.
    sb.host
        .ip(&["rule", "del", "priority", "1536", "from", "10.77.0.12"]);
    let err = mgr
        .check(
            &owner("b", "eth0"),
            &netns[1].path(),
            MtuExpectation::Recorded,
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("from 10.77.0.12"), "{err}");

    // Exhausted: all three addresses are in use.
    let extra = NamedNetns::new("pod");
    let err = add_err(&mgr, &owner("d", "eth0"), &extra.path()).await;
    assert!(
        matches!(err, EngineError::NoFreeAddress(_)) && err.is_transient(),
        "{err}"
    );

    for cid in cids {
        mgr.del(&owner(cid, "eth0")).await.expect("DEL");
        mgr.del(&owner(cid, "eth0")).await.expect("second DEL");
    }
    assert!(pods(&mgr).await.is_empty());
    let listed = rules(&sb);
    assert!(!listed.contains("10.77."), "rules left: {listed}");
    assert!(netns.iter().all(|ns| ns.link("eth0").is_none()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_pods_added_and_deleted_leave_the_host_as_found() {
    require_kernel!();
    let (sb, _enis, _dir, mgr) = rig(&[10, 10], true).await;
    let before = sb.host_state();

    let netns: Vec<NamedNetns> = (0..20).map(|_| NamedNetns::new("pod")).collect();
    for (i, ns) in netns.iter().enumerate() {
        let result = mgr
            .add(&owner(&format!("p{i}"), "eth0"), &ns.path())
            .await
            .unwrap_or_else(|e| panic!("ADD p{i}: {e}"));
        assert_eq!(result.ips.len(), 2, "dual stack: {result:?}");
    }
    let during = sb.host_state();
    assert_ne!(before, during);
    let listed = rules(&sb);
    assert_eq!(listed.matches("lookup main").count(), 40 + 2, "{listed}");
    // Spot checks at both ends of the range, both families.
    for (i, gw4, gw6) in [
        (0, "10.77.0.1", "fd00:e1::1"),
        (19, "10.77.1.1", "fd00:e1:1::1"),
    ] {
        assert!(ping(&netns[i], gw4), "p{i} IPv4");
        assert!(ping(&netns[i], gw6), "p{i} IPv6");
    }

    for i in 0..20 {
        mgr.del(&owner(&format!("p{i}"), "eth0"))
            .await
            .unwrap_or_else(|e| panic!("DEL p{i}: {e}"));
    }
    let after = sb.host_state();
    for (b, a) in before.iter().zip(&after) {
        assert_eq!(b, a, "the host differs after the cycle");
    }
    assert!(pods(&mgr).await.is_empty());
    let stats = mgr.address_stats().unwrap();
    assert_eq!((stats.total, stats.assigned), (40, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dual_stack_pod_reaches_the_gateway_on_both() {
    require_kernel!();
    let (sb, _enis, _dir, mgr) = rig(&[2], true).await;
    let pod = NamedNetns::new("pod");
    let result = mgr.add(&owner("v6", "eth0"), &pod.path()).await.unwrap();
    let ips: Vec<String> = result.ips.iter().map(|i| i.address.to_string()).collect();
    assert_eq!(ips, ["10.77.0.11/32", "fd00:e1::11/128"]);
    let gws: Vec<String> = result
        .ips
        .iter()
        .map(|i| i.gateway.unwrap().to_string())
        .collect();
    assert_eq!(gws, ["169.254.1.1", "fe80::1"]);
    // 0.0.0.0/0 via 169.254.1.1 and ::/0 via fe80::1.
    let defaults =
        ["169.254.1.1", "fe80::1"].map(|gw| RouteConfig::default_via(gw.parse().unwrap()));
    assert_eq!(result.routes, defaults);

    let global = pod.addr("eth0", "fd00:e1::11").expect("pod IPv6 address");
    assert_eq!(global["prefixlen"], 128);
    assert!(global.get("tentative").is_none(), "{global}");
    let default6 = pod.ip(&["-6", "route", "show", "default"]);
    assert!(default6.contains("via fe80::1 dev eth0"), "{default6}");

    assert!(ping(&pod, "10.77.0.1"), "IPv4");
    assert!(ping(&pod, "fd00:e1::1"), "IPv6");
    let record = pod_record(&mgr, "v6").await;
    let route = route_of(&sb, &record, "fd00:e1::11".parse().unwrap(), "2001:db8::1");
    assert!(route.contains("dev enis1 table 1001"), "{route}");
    let proxies = sb.host.ip(&["-6", "neigh", "show", "proxy"]);
    assert!(proxies.contains("fd00:e1::11 dev enis1"), "{proxies}");
    mgr.check(&owner("v6", "eth0"), &pod.path(), MtuExpectation::Recorded)
        .await
        .unwrap();
    mgr.del(&owner("v6", "eth0")).await.unwrap();
    assert!(sb
        .host
        .ip(&["-6", "neigh", "show", "proxy"])
        .trim()
        .is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_removes_a_dead_pod_and_orphans_and_leaves_live_pods_alone() {
    require_kernel!();
    let (sb, _enis, _dir, mgr) = rig(&[3], true).await;
    let live = NamedNetns::new("pod");
    let dying = NamedNetns::new("pod");
    mgr.add(&owner("live", "eth0"), &live.path()).await.unwrap();
    mgr.add(&owner("dead", "eth0"), &dying.path())
        .await
        .unwrap();
    let live_rec = pod_record(&mgr, "live").await;
    let dead_rec = pod_record(&mgr, "dead").await;
    let live_rules = rules(&sb);

    // The pod dies without DEL: its netns goes, and its veth pair with it.
    // The rules, proxy entries and record remain.
    drop(dying);
    let dead_ip = sec(&dead_rec).ipv4.unwrap().to_string();
    assert!(rules(&sb).contains(&dead_ip));

    // Strangers of enim's shape with no record (a crash before a record
    // was written, a lost checkpoint) and lookalikes that are not enim's.
    for cmd in [
        "link add enim0123456789a type veth peer name enimtmp0",
        "link add enim-keep type veth peer name enim-keep-p",
        "rule add priority 512 to 10.77.0.99 lookup main",
        "rule add priority 1536 from 10.77.0.99 lookup 1007",
        "rule add priority 600 to 10.77.0.98 lookup main",
        "rule add priority 1536 from 10.77.0.0/24 lookup 1001",
        "route add 10.77.0.77 dev enis1 table 1007",
        "neigh add proxy 10.77.0.99 dev enis1",
    ] {
        sb.host.ip(&cmd.split(' ').collect::<Vec<_>>());
    }

    // Young records are spared; the sweep runs regardless.
    let report = mgr
        .gc(&GcRequest::default(), Duration::from_secs(3600))
        .await;
    assert_eq!(report.too_young, 2, "{report:?}");
    assert!(report.collected.is_empty(), "{report:?}");
    let mut swept = report.swept.clone();
    swept.sort();
    assert_eq!(
        swept,
        [
            "proxy 10.77.0.99 on enis1",
            "rule 1536: from 10.77.0.99 lookup 1007",
            "rule 512: to 10.77.0.99 lookup 254",
            "table 1007",
            "veth enim0123456789a",
        ],
        "{report:?}"
    );
    assert!(report.errors.is_empty(), "{report:?}");

    let report = mgr.gc(&GcRequest::default(), Duration::ZERO).await;
    assert_eq!(
        report.collected,
        vec!["enim-test/dead/eth0".to_string()],
        "{report:?}"
    );
    assert!(report.swept.is_empty(), "{report:?}");
    let now = rules(&sb);
    assert!(!now.contains(&format!("{dead_ip} ")), "{now}");
    assert!(!now.contains("10.77.0.99"), "{now}");
    assert!(
        now.contains("600:\tfrom all to 10.77.0.98 lookup main"),
        "{now}"
    );
    assert!(now.contains("from 10.77.0.0/24 lookup 1001"), "{now}");
    assert!(sb.host.link("enim-keep").is_some());
    assert!(sb.host.link(&sec(&dead_rec).host_veth).is_none());
    // The live pod is untouched and works.
    for line in live_rules
        .lines()
        .filter(|l| l.contains(&sec(&live_rec).ipv4.unwrap().to_string()))
    {
        assert!(now.contains(line), "live rule {line:?} lost: {now}");
    }
    assert!(sb.host.link(&sec(&live_rec).host_veth).is_some());
    assert!(ping(&live, "10.77.0.1") && ping(&live, "fd00:e1::1"));
    mgr.check(
        &owner("live", "eth0"),
        &live.path(),
        MtuExpectation::Recorded,
    )
    .await
    .unwrap();
    // The dead pod's address is free again.
    let stats = mgr.address_stats().unwrap();
    assert_eq!(stats.assigned, 2, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_keeps_live_pods_and_a_lost_checkpoint_is_swept() {
    require_kernel!();
    let (sb, enis, dir) = sandbox(&[2, 2], true);
    let cp = dir.path().join("cp.json");
    let netns: Vec<NamedNetns> = (0..3).map(|_| NamedNetns::new("pod")).collect();
    let before = sb.host_state();
    let first = start(&sb, &enis, &cp).await;
    let started = sb.host_state();
    for (i, ns) in netns.iter().take(2).enumerate() {
        first
            .add(&owner(&format!("p{i}"), "eth0"), &ns.path())
            .await
            .unwrap();
    }
    let records = pods(&first).await;
    let plumbed = sb.host_state();
    drop(first);

    // A new agent over the same checkpoint: nothing of the live pods is
    // touched, and it knows which addresses they hold.
    let second = start(&sb, &enis, &cp).await;
    assert_eq!(pods(&second).await, records);
    assert_eq!(sb.host_state(), plumbed, "restart changed the host");
    for ns in netns.iter().take(2) {
        assert!(ping(ns, "10.77.0.1") && ping(ns, "fd00:e1::1"));
    }
    let third_pod = second
        .add(&owner("p2", "eth0"), &netns[2].path())
        .await
        .unwrap();
    let taken: BTreeSet<String> = records
        .iter()
        .map(|r| sec(r).ipv4.unwrap().to_string())
        .collect();
    let fresh = third_pod.ips[0].address.addr().to_string();
    assert!(!taken.contains(&fresh), "{fresh} handed out twice");
    assert!(ping(&netns[2], "10.77.1.1"));
    for (i, ns) in netns.iter().take(2).enumerate() {
        second
            .check(
                &owner(&format!("p{i}"), "eth0"),
                &ns.path(),
                MtuExpectation::Recorded,
            )
            .await
            .unwrap();
    }
    drop(second);

    // The checkpoint is lost: startup reconcile removes every pod's rules,
    // routes, proxy entries and veth, since no attachment explains them.
    let third = start(&sb, &enis, &dir.path().join("fresh.json")).await;
    assert!(pods(&third).await.is_empty());
    assert_eq!(
        sb.host_state(),
        started,
        "leftovers after a lost checkpoint"
    );
    assert_ne!(started, before, "ENI setup changed nothing?");
    assert!(netns.iter().all(|ns| ns.link("eth0").is_none()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_adds_roll_back_completely() {
    require_kernel!();
    let (sb, _enis, dir, mgr) = rig(&[1], true).await;
    let before = sb.host_state();

    // The pod already has an eth0: nothing may be left, and its own eth0
    // must survive.
    let pod = NamedNetns::new("pod");
    pod.ip(&[
        "link", "add", "eth0", "type", "veth", "peer", "name", "peer0",
    ]);
    let err = add_err(&mgr, &owner("c", "eth0"), &pod.path()).await;
    assert!(matches!(err, EngineError::IfnameConflict { .. }), "{err}");
    assert_eq!(sb.host_state(), before);
    assert!(pod.link("eth0").is_some(), "the pod's own eth0 was removed");
    assert!(pods(&mgr).await.is_empty());

    // A netns that is not one.
    let bogus = dir.path().join("not-a-netns");
    std::fs::write(&bogus, "").unwrap();
    let err = add_err(&mgr, &owner("c", "eth0"), &bogus).await;
    assert!(matches!(err, EngineError::Netns(_)), "{err}");
    // The node's own namespace, where the ENIs live, is no pod's.
    let err = add_err(&mgr, &owner("c", "eth0"), &sb.host.path()).await;
    assert!(matches!(err, EngineError::Netns(_)), "{err}");
    assert!(
        err.to_string().contains("the node's network namespace"),
        "{err}"
    );
    assert_eq!(sb.host_state(), before);

    // The single address is free again: the next ADD gets it.
    let result = mgr.add(&owner("c", "net1"), &pod.path()).await.unwrap();
    assert_eq!(result.ips[0].address.to_string(), "10.77.0.11/32");
    assert!(ping(&pod, "10.77.0.1"));
    // A repeated ADD returns the same result; an ADD of the same key into
    // another netns is refused while the first pod lives, and moves it once
    // that pod is gone.
    assert_eq!(
        mgr.add(&owner("c", "net1"), &pod.path()).await.unwrap(),
        result
    );
    let other = NamedNetns::new("pod");
    let err = add_err(&mgr, &owner("c", "net1"), &other.path()).await;
    assert!(
        matches!(err, EngineError::AttachmentConflict { .. }),
        "{err}"
    );
    assert!(pod.link("net1").is_some() && other.link("net1").is_none());
    assert!(ping_from(&pod, "net1"), "the live pod was cut off");
    drop(pod);
    mgr.add(&owner("c", "net1"), &other.path()).await.unwrap();
    assert!(other.link("net1").is_some());
    assert!(ping_from(&other, "net1"));
    mgr.del(&owner("c", "net1")).await.unwrap();
    assert_eq!(sb.host_state(), before);
}

fn ping_from(ns: &NamedNetns, dev: &str) -> bool {
    ns.exec_ok(&["ping", "-I", dev, "-c", "1", "-W", "2", "10.77.0.1"])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_nodes_primary_interface_is_never_a_host_eni() {
    require_kernel!();
    let sb = Sandbox::new(2);
    // ENI 1 carries the host's default route: it is the node's own NIC.
    sb.host.ip(&["addr", "add", "192.0.2.10/24", "dev", "eni1"]);
    sb.host.ip(&["link", "set", "eni1", "up"]);
    sb.host
        .ip(&["route", "add", "default", "via", "192.0.2.1", "dev", "eni1"]);
    let enis = sb.enis_with_secondaries(&[2, 2], false);
    let dir = tempfile::tempdir().unwrap();
    let mgr = start(&sb, &enis, &dir.path().join("cp.json")).await;
    let used: Vec<String> = mgr.driver().host_enis().into_iter().map(|e| e.id).collect();
    assert_eq!(used, ["eni-0000"]);
    assert!(
        sb.host.link("eni1").is_some(),
        "the primary NIC was renamed"
    );
    assert!(sb.host.link("enis1").is_some());
    let all = sb.host.ip(&["route", "show", "table", "all"]);
    assert!(!all.contains("table 1002"), "{all}");
}

/// The error of an ADD that must fail.
async fn add_err(mgr: &SecondaryEngine, o: &enim_core::EniOwner, netns: &Path) -> EngineError {
    mgr.add(o, netns).await.unwrap_err()
}

/// The checkpoint's record of container `cid`.
async fn record_of(checkpoint: &enim::store::checkpoint::Checkpoint, cid: &str) -> Record {
    let all = checkpoint.list().await;
    all.into_iter().find(|p| p.key.container_id == cid).unwrap()
}

/// What a crash leaves, made by hand from a real ADD: an ADD whose outcome
/// was never written is finished at restart when its pod side is whole; a
/// DEL that had removed part of the plumbing is finished.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_finishes_a_whole_add_and_an_unfinished_del() {
    require_kernel!();
    let (sb, enis, dir) = sandbox(&[2], true);
    let cp = dir.path().join("cp.json");
    let first = start(&sb, &enis, &cp).await;
    let clean = sb.host_state();
    let (adding, deleting) = (NamedNetns::new("pod"), NamedNetns::new("pod"));
    first
        .add(&owner("adding", "eth0"), &adding.path())
        .await
        .unwrap();
    first
        .add(&owner("deleting", "eth0"), &deleting.path())
        .await
        .unwrap();
    let checkpoint = first.checkpoint().clone();
    drop(first);

    // Crash after plumbing, before the outcome: Adding, no MAC known.
    let mut rec = record_of(&checkpoint, "adding").await;
    rec.phase = Phase::Adding;
    if let enim_api::model::Payload::Secondary(p) = &mut rec.payload {
        p.mac = None;
    }
    checkpoint.put(rec).await.unwrap();
    // Crash mid-DEL: Deleting, rules gone, veth still there.
    let mut rec = record_of(&checkpoint, "deleting").await;
    rec.phase = Phase::Deleting;
    let ip4 = sec(&rec).ipv4.unwrap().to_string();
    let ip6 = sec(&rec).ipv6.unwrap().to_string();
    checkpoint.put(rec).await.unwrap();
    drop(checkpoint);
    sb.host.ip(&["rule", "del", "priority", "512", "to", &ip4]);
    sb.host
        .ip(&["-6", "rule", "del", "priority", "1536", "from", &ip6]);

    let second = start(&sb, &enis, &cp).await;
    // The ADD's pod side was whole: finished, its MAC learned from the
    // kernel (the outcome is written behind, so the runtime may already
    // hold the result). The DEL is finished.
    let left = pods(&second).await;
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(
        (left[0].key.container_id.as_str(), left[0].phase),
        ("adding", Phase::Ready)
    );
    let mac = adding.link("eth0").expect("the finished pod keeps eth0")["address"].clone();
    assert_eq!(
        sec(&left[0]).mac.map(|m| m.to_string()),
        mac.as_str().map(String::from)
    );
    assert!(deleting.link("eth0").is_none());
    assert_eq!(second.address_stats().unwrap().assigned, 2);
    second.del(&owner("adding", "eth0")).await.unwrap();
    assert_eq!(sb.host_state(), clean);
    assert_eq!(second.address_stats().unwrap().assigned, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_adds_and_dels_share_nothing() {
    require_kernel!();
    let (sb, _enis, _dir, mgr) = rig(&[6, 6], true).await;
    let before = sb.host_state();
    let netns: Vec<Arc<NamedNetns>> = (0..12).map(|_| Arc::new(NamedNetns::new("pod"))).collect();
    let adds: Vec<_> = netns
        .iter()
        .enumerate()
        .map(|(i, ns)| {
            let (mgr, path) = (mgr.clone(), ns.path());
            tokio::spawn(async move { mgr.add(&owner(&format!("p{i}"), "eth0"), &path).await })
        })
        .collect();
    let mut seen = BTreeSet::new();
    for (i, add) in adds.into_iter().enumerate() {
        let result = add
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("ADD p{i}: {e}"));
        for ip in result.ips {
            assert!(seen.insert(ip.address), "{} handed out twice", ip.address);
        }
    }
    assert_eq!(seen.len(), 24);
    for (i, ns) in netns.iter().enumerate().step_by(5) {
        let record = pod_record(&mgr, &format!("p{i}")).await;
        let gw = if record.eni_id == "eni-0000" {
            "10.77.0.1"
        } else {
            "10.77.1.1"
        };
        assert!(ping(ns, gw), "p{i} cannot reach {gw}");
    }
    let dels: Vec<_> = (0..12)
        .map(|i| {
            let mgr = mgr.clone();
            tokio::spawn(async move { mgr.del(&owner(&format!("p{i}"), "eth0")).await })
        })
        .collect();
    for del in dels {
        del.await.unwrap().expect("DEL");
    }
    assert_eq!(sb.host_state(), before);
}

/// The sandbox's static ENIs as listed, plus secondary addresses no pod
/// may have, as a spec written by hand or a cloud emulator may list them
/// (the static provider's own config check would refuse them).
struct ListsMore {
    inner: enim_provider_static::StaticProvider,
    extra: Vec<IpAddr>,
}

#[async_trait::async_trait]
impl enim_provider::EniProvider for ListsMore {
    fn name(&self) -> &str {
        "lists-more"
    }
    async fn list(&self) -> Result<Vec<enim_core::Eni>, enim_core::ProviderError> {
        let mut enis = self.inner.list().await?;
        enis[0].secondary_ips.extend(&self.extra);
        Ok(enis)
    }
    async fn allocate_next(
        &self,
        owner: &enim_core::EniOwner,
    ) -> Result<enim_core::Eni, enim_core::ProviderError> {
        self.inner.allocate_next(owner).await
    }
    async fn release(&self, owner: &enim_core::EniOwner) -> Result<(), enim_core::ProviderError> {
        self.inner.release(owner).await
    }
    async fn restore(
        &self,
        assignments: &[(String, enim_core::EniOwner)],
    ) -> Result<(), enim_core::ProviderError> {
        self.inner.restore(assignments).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv6_addresses_no_pod_may_have_never_reach_the_kernel() {
    require_kernel!();
    let (sb, mut enis, dir) = sandbox(&[2], true);
    // One IPv6 address a pod may have: fd00:e1::11 (the ENI is
    // fd00:e1::10/64 via fd00:e1::1).
    enis[0].secondary_ipv6.truncate(1);
    let refused = [
        "fe80::1234",
        "fd00:ec2::254",
        "fd00:e1::1",
        "fd00:e2::11",
        "ff02::1",
    ];
    let provider = Arc::new(ListsMore {
        inner: enim_provider_static::StaticProvider::new(enis.clone()).unwrap(),
        extra: refused.iter().map(|a| a.parse().unwrap()).collect(),
    });
    let mgr =
        secondary_manager_over(&sb, provider, &dir.path().join("cp.json"), test_config()).await;
    mgr.recover().await.unwrap();

    let pods = [NamedNetns::new("pod"), NamedNetns::new("pod")];
    let first = mgr.add(&owner("a", "eth0"), &pods[0].path()).await.unwrap();
    let ips: Vec<String> = first.ips.iter().map(|i| i.address.to_string()).collect();
    assert_eq!(ips, ["10.77.0.11/32", "fd00:e1::11/128"]);
    // An IPv4 address is left, no IPv6 one a pod may have: try again later.
    let e = add_err(&mgr, &owner("b", "eth0"), &pods[1].path()).await;
    assert!(e.is_transient(), "{e}");
    // No host route towards a pod (the main table's) and no proxy entry
    // for any of them.
    let routes = sb.host.ip(&["-6", "route", "show"]);
    let proxies = sb.host.ip(&["-6", "neigh", "show", "proxy"]);
    for addr in refused {
        for line in routes.lines().chain(proxies.lines()) {
            assert_ne!(line.split_whitespace().next(), Some(addr), "{line}");
        }
    }
    assert_eq!(mgr.address_stats().unwrap().total, 3, "2 IPv4 and 1 IPv6");
    mgr.del(&owner("a", "eth0")).await.unwrap();
}
