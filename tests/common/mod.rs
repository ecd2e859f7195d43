//! Sandbox for kernel tests: throwaway network namespaces with veth pairs
//! standing in for ENIs and a gateway namespace at their far ends. Nothing
//! here touches the machine's own interfaces; every namespace is removed on
//! drop, pass or fail.

#![allow(dead_code)]

pub mod agent;

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use enim::checkpoint::Checkpoint;
use enim::manager::EniManager;
use enim::netlink::rtnl::RtnlPlumbing;
use enim_provider::{EniOwner, MacAddr, PodRef};
use enim_provider_static::{StaticEniConfig, StaticProvider};

/// True when kernel tests can run. Without root they skip with a message,
/// except under CI=true, where skipping would hide a broken setup.
pub fn kernel_tests_enabled() -> bool {
    let root = nix::unistd::geteuid().is_root();
    if !root {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("CI=true but not running as root: netns tests must run in CI");
        }
        eprintln!(
            "SKIPPED: netns tests need root (run as root, or with CI=true to make this an error)"
        );
    }
    root
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

pub fn unique(tag: &str) -> String {
    format!(
        "enimt{}-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::SeqCst),
        tag
    )
}

pub fn sh(args: &[&str]) -> String {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .expect("spawn");
    assert!(
        out.status.success(),
        "{:?} failed: {}",
        args,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn sh_ok(args: &[&str]) -> bool {
    Command::new(args[0])
        .args(&args[1..])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// A named network namespace, deleted on drop.
pub struct NamedNetns {
    pub name: String,
}

impl NamedNetns {
    pub fn new(tag: &str) -> Self {
        let name = unique(tag);
        sh(&["ip", "netns", "add", &name]);
        sh(&["ip", "-n", &name, "link", "set", "lo", "up"]);
        NamedNetns { name }
    }

    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/run/netns/{}", self.name))
    }

    pub fn ip(&self, args: &[&str]) -> String {
        let mut full = vec!["ip", "-n", &self.name];
        full.extend_from_slice(args);
        sh(&full)
    }

    pub fn exec_ok(&self, args: &[&str]) -> bool {
        let mut full = vec!["ip", "netns", "exec", &self.name];
        full.extend_from_slice(args);
        sh_ok(&full)
    }

    /// `ip -j link show` of one device, or None.
    pub fn link(&self, name: &str) -> Option<serde_json::Value> {
        let out = Command::new("ip")
            .args(["-n", &self.name, "-j", "link", "show", "dev", name])
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        v.get(0).cloned()
    }

    pub fn link_by_mac(&self, mac: MacAddr) -> Option<serde_json::Value> {
        let v: serde_json::Value = serde_json::from_str(&self.ip(&["-j", "link", "show"])).unwrap();
        v.as_array()?
            .iter()
            .find(|l| l["address"].as_str() == Some(&mac.to_string()))
            .cloned()
    }

    pub fn addrs(&self, dev: &str) -> Vec<String> {
        let v: serde_json::Value =
            serde_json::from_str(&self.ip(&["-j", "addr", "show", "dev", dev])).unwrap();
        v[0]["addr_info"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| a["scope"] != "link" && a["scope"] != "host")
            .map(|a| format!("{}/{}", a["local"].as_str().unwrap(), a["prefixlen"]))
            .collect()
    }

    /// Every link's name, sorted.
    pub fn link_names(&self) -> Vec<String> {
        let links: serde_json::Value =
            serde_json::from_str(&self.ip(&["-j", "link", "show"])).unwrap();
        let mut names: Vec<String> = links
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["ifname"].as_str().unwrap().to_string())
            .collect();
        names.sort();
        names
    }
}

impl Drop for NamedNetns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// A host namespace holding `n` veth "ENIs" (`eni0`..), each the near end of
/// a pair whose far end sits in the gateway namespace with the gateway
/// address. ENI i: 10.(200+run).i.10/24, gateway .1, fd00:e1:i::10/64,
/// gateway fd00:e1:i::1, host MTU 1500, pod MTU 9000.
pub struct Sandbox {
    pub host: NamedNetns,
    pub gateway: NamedNetns,
    pub enis: Vec<StaticEniConfig>,
}

pub const HOST_MTU: u32 = 1500;
pub const POD_MTU: u32 = 9000;

impl Sandbox {
    pub fn new(n: usize) -> Self {
        let mut sb = Sandbox {
            host: NamedNetns::new("host"),
            gateway: NamedNetns::new("gw"),
            enis: Vec::new(),
        };
        for i in 0..n {
            sb.enis.push(StaticEniConfig {
                id: format!("eni-{i:04}"),
                mac: MacAddr([0x02, 0xe1, 0, 0, 0, i as u8 + 1]),
                ipv4: format!("10.77.{i}.10/24").parse().unwrap(),
                gateway4: format!("10.77.{i}.1").parse().unwrap(),
                ipv6: Some(format!("fd00:e1:{i}::10/64").parse().unwrap()),
                gateway6: Some(format!("fd00:e1:{i}::1").parse().unwrap()),
                mtu: Some(POD_MTU),
                device_index: None,
                secondary_ipv4: vec![],
                secondary_ipv6: vec![],
            });
            sb.plug_eni(i);
        }
        sb
    }

    /// Creates ENI i's veth pair: `eni<i>` in the host, its far end with the
    /// gateway addresses in the gateway namespace. Also brings back an ENI
    /// destroyed with a pod netns, as a physical one would return.
    pub fn plug_eni(&self, i: usize) {
        // A deleted netns is torn down asynchronously: wait until the old
        // pair is really gone before making the new one.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while self.gateway.link(&format!("gw{i}")).is_some() {
            assert!(
                std::time::Instant::now() < deadline,
                "old veth of ENI {i} never went away"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let mac = self.enis[i].mac.to_string();
        let (name, peer) = (format!("eni{i}"), format!("gw{i}"));
        let gw_ns = self.gateway.name.as_str();
        self.host.ip(&[
            "link", "add", &name, "address", &mac, "mtu", "1500", "type", "veth", "peer", "name",
            &peer, "netns", gw_ns, "mtu", "9000",
        ]);
        self.gateway
            .ip(&["addr", "add", &format!("10.77.{i}.1/24"), "dev", &peer]);
        self.gateway.ip(&[
            "addr",
            "add",
            &format!("fd00:e1:{i}::1/64"),
            "dev",
            &peer,
            "nodad",
        ]);
        self.gateway.ip(&["link", "set", &peer, "up"]);
    }

    /// A manager over this sandbox with its checkpoint at `checkpoint`.
    pub async fn manager(
        &self,
        checkpoint: &std::path::Path,
    ) -> (Arc<EniManager>, Arc<StaticProvider>) {
        let provider = Arc::new(StaticProvider::new(self.enis.clone()).unwrap());
        let plumbing = Arc::new(RtnlPlumbing::new(Some(&self.host.path())).await.unwrap());
        let checkpoint = Arc::new(Checkpoint::open(checkpoint, true).unwrap());
        let manager = Arc::new(EniManager::new(provider.clone(), plumbing, checkpoint));
        (manager, provider)
    }

    /// The sandbox's ENIs for secondary mode: `counts[i]` secondary IPv4
    /// addresses on ENI i (10.77.i.11 and up), as many IPv6 ones
    /// (fd00:e1:i::11 and up) when `ipv6`, and device index i + 1.
    pub fn enis_with_secondaries(&self, counts: &[usize], ipv6: bool) -> Vec<StaticEniConfig> {
        counts
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let mut e = self.enis[i].clone();
                e.device_index = Some(i as u32 + 1);
                e.secondary_ipv4 = (0..*n)
                    .map(|k| format!("10.77.{i}.{}", 11 + k).parse().unwrap())
                    .collect();
                if ipv6 {
                    e.secondary_ipv6 = (0..*n)
                        .map(|k| format!("fd00:e1:{i}::{:x}", 0x11 + k).parse().unwrap())
                        .collect();
                }
                e
            })
            .collect()
    }

    /// Everything of the host namespace a secondary-mode pod could leave
    /// behind: rules, routes of every table, links, proxy neighbour entries.
    pub fn host_state(&self) -> Vec<String> {
        let mut out = Vec::new();
        for family in ["-4", "-6"] {
            out.push(self.host.ip(&[family, "rule", "list"]));
            out.push(self.host.ip(&[family, "route", "show", "table", "all"]));
            out.push(self.host.ip(&[family, "neigh", "show", "proxy"]));
        }
        out.push(self.host.link_names().join(" "));
        out
    }

    /// Asserts ENI i is home: in the host netns under `eni<i>` with the host MTU.
    pub fn assert_home(&self, i: usize) {
        let link = self
            .host
            .link_by_mac(self.enis[i].mac)
            .unwrap_or_else(|| panic!("ENI {i} is not in the host namespace"));
        assert_eq!(link["ifname"], format!("eni{i}"), "ENI {i} host name");
        assert_eq!(link["mtu"], HOST_MTU, "ENI {i} host MTU");
        // The pod's addresses must not follow the ENI home.
        assert_eq!(
            self.host.addrs(&format!("eni{i}")),
            Vec::<String>::new(),
            "ENI {i} host addresses"
        );
    }
}

pub fn owner(cid: &str, ifname: &str) -> EniOwner {
    EniOwner {
        network: "enim-test".into(),
        container_id: cid.into(),
        ifname: ifname.into(),
        pod: PodRef {
            namespace: "default".into(),
            name: format!("pod-{cid}"),
            uid: None,
        },
    }
}
