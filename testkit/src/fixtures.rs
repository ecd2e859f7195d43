//! Fixtures: the static ENIs a sandbox stands in for, as the static
//! provider's config declares them (their MTUs at home and in a pod
//! included), an enimd config over them, and pod owners.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use enim_core::{EniOwner, MacAddr, PodRef};
use enim_provider_static::StaticEniConfig;

/// The ENIs' MTU at home, in the host namespace.
pub const HOST_MTU: u32 = 1500;
/// The ENIs' MTU in a pod (their config's `mtu`).
pub const POD_MTU: u32 = 9000;

/// The sandbox's ENI i: MAC 02:e1:00:00:00:<i+1>, 10.77.i.10/24 with
/// gateway .1, fd00:e1:i::10/64 with gateway ::1, pod MTU 9000.
pub fn static_eni(i: usize) -> StaticEniConfig {
    let last = u8::try_from(i + 1).expect("at most 255 ENIs");
    StaticEniConfig {
        ipv6: Some(format!("fd00:e1:{i}::10/64").parse().unwrap()),
        gateway6: Some(format!("fd00:e1:{i}::1").parse().unwrap()),
        mtu: Some(POD_MTU),
        ..StaticEniConfig::new(
            format!("eni-{i:04}"),
            MacAddr([0x02, 0xe1, 0, 0, 0, last]),
            format!("10.77.{i}.10/24").parse().unwrap(),
            format!("10.77.{i}.1").parse().unwrap(),
        )
    }
}

/// An IPv4-only ENI with only what the static provider requires.
pub fn plain_eni(
    id: String,
    mac: MacAddr,
    ipv4: ipnet::Ipv4Net,
    gateway4: std::net::Ipv4Addr,
) -> StaticEniConfig {
    StaticEniConfig::new(id, mac, ipv4, gateway4)
}

/// `enis` (as [`static_eni`] made them) for secondary mode: `counts[i]`
/// secondary IPv4 addresses on ENI i (10.77.i.11 and up), as many IPv6
/// ones (fd00:e1:i::11 and up) when `ipv6`, and device index i + 1.
pub fn with_secondaries(
    enis: &[StaticEniConfig],
    counts: &[usize],
    ipv6: bool,
) -> Vec<StaticEniConfig> {
    counts
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let mut e = enis[i].clone();
            e.device_index = Some(u32::try_from(i + 1).expect("a small index"));
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

/// Where an enimd config made by [`write_config`] keeps things, all under
/// one directory.
#[derive(Debug, Clone)]
pub struct AgentPaths {
    pub config: PathBuf,
    pub socket: PathBuf,
    pub checkpoint: PathBuf,
    pub log: PathBuf,
}

impl AgentPaths {
    pub fn in_dir(dir: &Path) -> AgentPaths {
        AgentPaths {
            config: dir.join("enimd.toml"),
            socket: dir.join("enimd.sock"),
            checkpoint: dir.join("state/checkpoint.json"),
            log: dir.join("enimd.log"),
        }
    }
}

/// Writes `dir/enimd.toml`: socket and checkpoint in `dir`, the GC loop off
/// (tests and the bench trigger GC themselves), ENIs kept in `host_netns`
/// when given (else in enimd's own namespace), `enis` as a static provider,
/// and `extra` appended to the top-level table (e.g. `gc_grace = "0s"`).
pub fn write_config(
    dir: &Path,
    host_netns: Option<&Path>,
    enis: &[StaticEniConfig],
    extra: &str,
) -> AgentPaths {
    #[derive(serde::Serialize)]
    struct Provider<'a> {
        r#type: &'static str,
        enis: &'a [StaticEniConfig],
    }
    #[derive(serde::Serialize)]
    struct Cfg<'a> {
        provider: Provider<'a>,
    }
    let paths = AgentPaths::in_dir(dir);
    let body = toml::to_string(&Cfg {
        provider: Provider {
            r#type: "static",
            enis,
        },
    })
    .unwrap();
    let mut text = String::with_capacity(body.len() + 512);
    writeln!(text, "socket = {:?}", paths.socket.display().to_string()).unwrap();
    writeln!(
        text,
        "checkpoint = {:?}",
        paths.checkpoint.display().to_string()
    )
    .unwrap();
    if let Some(ns) = host_netns {
        writeln!(text, "host_netns = {:?}", ns.display().to_string()).unwrap();
    }
    writeln!(text, "gc_interval = \"0s\"\n{extra}\n{body}").unwrap();
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(&paths.config, text).unwrap();
    paths
}

/// The owner of container `cid`'s `ifname` in pod default/pod-`cid` on the
/// test network.
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

/// A DRA-claimed pod's attachment: container `cid`'s eth0 on network
/// `enim`, in pod default/`pod` with `uid` (the claims are matched by it).
pub fn dra_owner(cid: &str, pod: &str, uid: Option<&str>) -> EniOwner {
    EniOwner {
        network: "enim".into(),
        container_id: cid.into(),
        ifname: "eth0".into(),
        pod: PodRef {
            namespace: "default".into(),
            name: pod.into(),
            uid: uid.map(str::to_string),
        },
    }
}

/// A Kubernetes pod's attachment as the kubelet makes it: pod default/`name`
/// (uid `uid-<name>`), container `cid-<name>`, eth0, on the conflist's
/// network `k8s-pod-network`.
pub fn pod_owner(name: &str) -> EniOwner {
    EniOwner {
        network: "k8s-pod-network".into(),
        container_id: format!("cid-{name}"),
        ifname: "eth0".into(),
        pod: PodRef {
            namespace: "default".into(),
            name: name.into(),
            uid: Some(format!("uid-{name}")),
        },
    }
}
