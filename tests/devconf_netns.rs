//! Per-device settings over netlink (`enim::netlink::devconf`) and the
//! sysctls without a netlink form (`enim::netlink::sysctl`), against the real
//! kernel in a throwaway namespace: each value is read back through
//! /proc/sys/net inside that namespace, a path this code does not use for
//! it.

mod common;

use std::time::Duration;

use common::*;
use enim::netlink::devconf::{self, Ipv4Conf, NeighTable};
use enim::netlink::{sysctl, Host, Netns};

/// `cat /proc/sys/net/<key>` inside `ns`.
fn read(ns: &NamedNetns, key: &str) -> String {
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", &ns.name, "cat"])
        .arg(format!("/proc/sys/net/{key}"))
        .output()
        .unwrap();
    assert!(out.status.success(), "reading {key} in {}", ns.name);
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// The same key outside every test namespace: this process's own.
fn read_here(key: &str) -> String {
    std::fs::read_to_string(format!("/proc/sys/net/{key}"))
        .unwrap()
        .trim()
        .to_string()
}

fn index_of(ns: &NamedNetns, dev: &str) -> u32 {
    let index = ns.link(dev).unwrap()["ifindex"].as_u64().unwrap();
    u32::try_from(index).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv4_devconf_and_proxy_delay_are_set_over_netlink() {
    require_kernel!();
    let ns = NamedNetns::new("devconf");
    ns.ip(&["link", "add", "dc0", "type", "veth", "peer", "name", "dc1"]);
    let host = Host::open(Some(&ns.path())).await.unwrap();
    let h = host.handle();
    let dc0 = index_of(&ns, "dc0");
    let all = [Ipv4Conf::Forwarding, Ipv4Conf::RpFilter];
    let here = (
        read_here("ipv4/conf/all/forwarding"),
        read_here("ipv4/conf/all/rp_filter"),
    );

    // A new namespace's devices neither forward nor filter, and delay
    // proxy answers (the kernel's default).
    assert_eq!(read(&ns, "ipv4/conf/dc0/forwarding"), "0");
    assert_ne!(read(&ns, "ipv4/neigh/dc0/proxy_delay"), "0");

    devconf::set_ipv4(
        h,
        dc0,
        &[(Ipv4Conf::Forwarding, 1), (Ipv4Conf::RpFilter, 2)],
        "t",
    )
    .await
    .unwrap();
    assert_eq!(read(&ns, "ipv4/conf/dc0/forwarding"), "1");
    assert_eq!(read(&ns, "ipv4/conf/dc0/rp_filter"), "2");
    assert_eq!(
        devconf::get_ipv4(h, dc0, &all).await.unwrap(),
        Some(vec![1, 2])
    );
    // Only that device: its peer, the namespace-wide values and this
    // process's own namespace are untouched.
    assert_eq!(read(&ns, "ipv4/conf/dc1/forwarding"), "0");
    assert_eq!(read(&ns, "ipv4/conf/all/forwarding"), "0");
    assert_eq!(read(&ns, "ipv4/ip_forward"), "0");
    assert_eq!(
        here,
        (
            read_here("ipv4/conf/all/forwarding"),
            read_here("ipv4/conf/all/rp_filter")
        )
    );

    // Zero is a value too (netlink-packet-route's own request type drops
    // zero fields; ours must not).
    devconf::set_ipv4(h, dc0, &[(Ipv4Conf::RpFilter, 0)], "t")
        .await
        .unwrap();
    assert_eq!(read(&ns, "ipv4/conf/dc0/rp_filter"), "0");
    assert_eq!(read(&ns, "ipv4/conf/dc0/forwarding"), "1");

    for table in [NeighTable::Arp, NeighTable::Ndisc] {
        let key = format!("{}/dc0/proxy_delay", table.sysctl_dir());
        devconf::set_proxy_delay(h, table, dc0, Duration::ZERO, "t")
            .await
            .unwrap();
        assert_eq!(read(&ns, &key), "0", "{table:?}");
        assert_ne!(
            read(&ns, &format!("{}/dc1/proxy_delay", table.sysctl_dir())),
            "0",
            "{table:?}: the peer keeps its delay"
        );
    }

    // A device that is not there is an error naming the operation.
    let err = devconf::set_ipv4(h, 999_999, &[(Ipv4Conf::Forwarding, 1)], "tune ghost")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("tune ghost"), "{err}");
    let err = devconf::set_proxy_delay(h, NeighTable::Arp, 999_999, Duration::ZERO, "delay ghost")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("delay ghost"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv6_sysctls_go_through_the_given_dir_into_the_namespace() {
    require_kernel!();
    let ns = NamedNetns::new("sysctl");
    ns.ip(&["link", "add", "sc0", "type", "veth", "peer", "name", "sc1"]);
    let netns = Netns::open(&ns.path()).unwrap();
    let here = read_here("ipv6/conf/all/forwarding");

    // Another path to /proc/sys/net, as a pod's mount of the node's is:
    // what it shows is still the namespace of the thread that writes.
    let dir = tempfile::tempdir().unwrap();
    let other = dir.path().join("net");
    std::os::unix::fs::symlink("/proc/sys/net", &other).unwrap();

    sysctl::tune_ipv6_proxy_device(&netns, &other, "sc0")
        .await
        .unwrap();
    assert_eq!(read(&ns, "ipv6/conf/sc0/proxy_ndp"), "1");
    assert_eq!(read(&ns, "ipv6/conf/sc0/accept_dad"), "0");
    assert_eq!(read(&ns, "ipv6/conf/sc1/proxy_ndp"), "0");
    sysctl::enable_ipv6_forwarding(&netns, &other)
        .await
        .unwrap();
    assert_eq!(read(&ns, "ipv6/conf/all/forwarding"), "1");
    assert_eq!(read_here("ipv6/conf/all/forwarding"), here);

    // A dir that is not there: the error names the file.
    let err = sysctl::enable_ipv6_forwarding(&netns, &dir.path().join("nope"))
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("nope/ipv6/conf/all/forwarding"),
        "{err}"
    );
}
