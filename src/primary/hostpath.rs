//! The host path (the `[host_path]` table of enimd's config): besides its
//! ENI, a primary-mode pod gets a veth pair to the host, and routes the
//! service CIDRs, the host-stack CIDRs and the node's own addresses over
//! it. ClusterIPs exist only in kube-proxy's rules in the host netns, and
//! the kubelet's probes and hostPort traffic start there, so that traffic
//! must stay on the node; everything else keeps taking the ENI.

use std::net::IpAddr;
use std::path::PathBuf;

use enim_api::model::{naming, AttachmentKey, HostPath};
use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::netlink::validate_ifname;

/// The masquerade table's conntrack mark bit by default: bit 21. kube-proxy
/// marks packets (0x4000, 0x8000), not connections; the AWS VPC CNI's
/// connmark is 0x80; Calico's packet marks sit in the upper 16 bits. A ct
/// mark is only seen by whatever matches or restores ct marks, and the
/// table only ever ORs this bit in.
pub const DEFAULT_CT_MARK: u32 = 0x0020_0000;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("[host_path] config: {0}")]
pub struct HostPathConfigError(pub String);

/// The `[host_path]` table of enimd's config. Off (no veth, results as
/// without it) while `service_cidrs` is empty and `service_cidrs_from_api`
/// is false.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct HostPathConfig {
    /// The cluster's service CIDRs (kube-apiserver's
    /// `--service-cluster-ip-range`), IPv4 and/or IPv6; without host bits.
    /// Given, they are used as they are and the API is not read.
    #[cfg_attr(feature = "schema", schemars(with = "Vec<String>"))]
    pub service_cidrs: Vec<IpNet>,
    /// Read the service CIDRs from the cluster's `ServiceCIDR` objects
    /// (networking.k8s.io/v1, Kubernetes 1.33+) and follow them: a range
    /// added or removed reaches running pods' routes and records too. Not
    /// with `service_cidrs`. Needs `list` and `watch` on `servicecidrs`.
    pub service_cidrs_from_api: bool,
    /// The kubeconfig `service_cidrs_from_api` reads with.
    ///
    /// Default: the pod's in-cluster ServiceAccount.
    pub kubeconfig: Option<PathBuf>,
    /// More prefixes the pod reaches through the node, e.g. node-local-dns's
    /// `169.254.20.10/32`; needs `service_cidrs` or
    /// `service_cidrs_from_api`.
    #[cfg_attr(feature = "schema", schemars(with = "Vec<String>"))]
    pub host_stack_cidrs: Vec<IpNet>,
    /// The `CNI_IFNAME`s that get a host path: not extra networks'
    /// interfaces, whose service routes would clash with the cluster
    /// network's.
    pub interfaces: Vec<String>,
    /// Host ends are named this plus a hash of the attachment key (15 bytes
    /// in all), `[a-z0-9-]`; GC takes such veths that no record explains
    /// for enim's leftovers. Must not be a prefix of `[secondary]
    /// veth_prefix` nor have it as one.
    pub veth_prefix: String,
    /// enimd's nftables table `inet enim`, which masquerades the Service
    /// and hostPort connections that enter from or leave to a host path,
    /// so that replies come back through the node's conntrack; `false`
    /// leaves that to kube-proxy's `clusterCIDR` or `masqueradeAll`.
    pub masquerade: bool,
    /// The `nft` binary: a name looked up in `PATH` or an absolute path.
    pub nft: PathBuf,
    /// The one conntrack mark bit the masquerade table sets on connections
    /// that arrive from a host path (exactly one bit; the others are left
    /// alone).
    pub ct_mark: u32,
}

impl Default for HostPathConfig {
    fn default() -> Self {
        HostPathConfig {
            service_cidrs: Vec::new(),
            service_cidrs_from_api: false,
            kubeconfig: None,
            host_stack_cidrs: Vec::new(),
            interfaces: vec!["eth0".into()],
            veth_prefix: "enih".into(),
            masquerade: true,
            nft: PathBuf::from("nft"),
            ct_mark: DEFAULT_CT_MARK,
        }
    }
}

impl HostPathConfig {
    pub fn enabled(&self) -> bool {
        !self.service_cidrs.is_empty() || self.service_cidrs_from_api
    }

    pub fn validate(&self) -> Result<(), HostPathConfigError> {
        let bad = |m: String| Err(HostPathConfigError(m));
        if self.service_cidrs_from_api && !self.service_cidrs.is_empty() {
            return bad(
                "service_cidrs and service_cidrs_from_api are both set: give the CIDRs, or read them from the API, not both".into(),
            );
        }
        if self.kubeconfig.is_some() && !self.service_cidrs_from_api {
            return bad("kubeconfig is read only with service_cidrs_from_api = true".into());
        }
        if !self.enabled() && !self.host_stack_cidrs.is_empty() {
            return bad(
                "host_stack_cidrs needs service_cidrs or service_cidrs_from_api: without them there is no host path".into(),
            );
        }
        if !naming::valid_veth_prefix(&self.veth_prefix) {
            return bad(format!(
                "veth_prefix {:?} must be 1-{} of [a-z0-9-] (the rest of the name is a hash)",
                self.veth_prefix,
                naming::MAX_VETH_PREFIX
            ));
        }
        if self.enabled() && self.interfaces.is_empty() {
            return bad("interfaces is empty: no pod would get the host path".into());
        }
        for ifname in &self.interfaces {
            validate_ifname(ifname).map_err(HostPathConfigError)?;
        }
        if self.ct_mark.count_ones() != 1 {
            return bad(format!(
                "ct_mark {:#x} must be exactly one bit (the table ORs it into the connection's mark)",
                self.ct_mark
            ));
        }
        let nft = self.nft.to_string_lossy();
        if nft.trim().is_empty() || nft.contains('\0') {
            return bad(format!("nft {nft:?} is not a program name or path"));
        }
        if self.nft.components().count() > 1 && !self.nft.is_absolute() {
            return bad(format!(
                "nft {nft:?} must be a bare name (looked up in PATH) or an absolute path"
            ));
        }
        for net in self.service_cidrs.iter().chain(&self.host_stack_cidrs) {
            if net.trunc() != *net {
                return bad(format!(
                    "{net} has host bits set (did you mean {}?)",
                    net.trunc()
                ));
            }
        }
        Ok(())
    }

    /// Whether enimd keeps its masquerade table in the host netns.
    pub fn masquerades(&self) -> bool {
        self.enabled() && self.masquerade
    }

    /// Whether the attachment of `key` gets a host path.
    pub fn applies_to(&self, key: &AttachmentKey) -> bool {
        self.enabled() && self.interfaces.contains(&key.ifname)
    }

    /// The host path `key`'s attachment gets, routing `service_cidrs` (the
    /// configured ones, or the API's), the host-stack CIDRs and
    /// `node_addrs` of the families the pod has (`pod_ips`); `None` when it
    /// gets none.
    pub fn plan(
        &self,
        key: &AttachmentKey,
        service_cidrs: &[IpNet],
        pod_ips: &[IpAddr],
        node_addrs: &[IpAddr],
    ) -> Option<HostPath> {
        if !self.applies_to(key) {
            return None;
        }
        let configured = || service_cidrs.iter().chain(&self.host_stack_cidrs);
        let mut routes: Vec<IpNet> = configured().copied().collect();
        // The node's addresses, unless a configured prefix covers them (an
        // IPVS node holds every ClusterIP on kube-ipvs0) or they are the
        // pod's own.
        routes.extend(
            node_addrs
                .iter()
                .filter(|a| !configured().any(|n| n.contains(*a)) && !pod_ips.contains(a))
                .map(|a| IpNet::from(*a)),
        );
        let has_family = |n: &IpNet| pod_ips.iter().any(|ip| ip.is_ipv4() == n.addr().is_ipv4());
        routes.retain(has_family);
        routes.sort();
        routes.dedup();
        Some(HostPath {
            host_veth: naming::veth_name(&self.veth_prefix, key),
            ifname: pod_ifname(&key.ifname),
            routes,
            mac: None,
        })
    }

    /// Whether `name` has the shape of a host path's host end.
    pub fn is_veth_name(&self, name: &str) -> bool {
        naming::is_veth_name(&self.veth_prefix, name)
    }
}

/// The pod end's name: the pod interface's name (cut to 10 bytes) and
/// `-host`, so `eth0` gets `eth0-host`.
pub fn pod_ifname(ifname: &str) -> String {
    let mut cut = ifname.len().min(10);
    while !ifname.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}-host", &ifname[..cut])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(ifname: &str) -> AttachmentKey {
        AttachmentKey {
            network: "net".into(),
            container_id: "abc".into(),
            ifname: ifname.into(),
        }
    }

    fn config() -> HostPathConfig {
        HostPathConfig {
            service_cidrs: vec![
                "10.96.0.0/12".parse().unwrap(),
                "fd00:96::/112".parse().unwrap(),
            ],
            host_stack_cidrs: vec!["169.254.20.10/32".parse().unwrap()],
            ..HostPathConfig::default()
        }
    }

    fn ips(list: &[&str]) -> Vec<IpAddr> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    #[test]
    fn off_without_service_cidrs() {
        let c = HostPathConfig::default();
        c.validate().unwrap();
        assert!(c
            .plan(&key("eth0"), &[], &ips(&["10.0.0.5"]), &[])
            .is_none());
    }

    #[test]
    fn plan_routes_the_pods_families_and_the_node() {
        let c = config();
        c.validate().unwrap();
        let node = ips(&["192.168.1.10", "10.96.0.1", "fd00:1::10", "10.0.0.5"]);
        let services = c.service_cidrs.clone();
        let hp = c
            .plan(&key("eth0"), &services, &ips(&["10.0.0.5"]), &node)
            .unwrap();
        let routes: Vec<String> = hp.routes.iter().map(ToString::to_string).collect();
        // IPv4 only: the pod has no IPv6. 10.96.0.1 is inside the service
        // CIDR, 10.0.0.5 is the pod's own.
        assert_eq!(
            routes,
            ["10.96.0.0/12", "169.254.20.10/32", "192.168.1.10/32"]
        );
        assert_eq!(hp.ifname, "eth0-host");
        assert_eq!(hp.host_veth.len(), 15);
        assert!(c.is_veth_name(&hp.host_veth));
        assert!(hp.mac.is_none());

        let dual = c
            .plan(
                &key("eth0"),
                &services,
                &ips(&["10.0.0.5", "fd00:e1::5"]),
                &node,
            )
            .unwrap();
        assert!(dual.routes.contains(&"fd00:96::/112".parse().unwrap()));
        assert!(dual.routes.contains(&"fd00:1::10/128".parse().unwrap()));
        assert_eq!(dual.host_veth, hp.host_veth, "named from the key alone");
    }

    #[test]
    fn only_the_configured_interfaces_get_one() {
        let c = config();
        let services = c.service_cidrs.clone();
        assert!(c
            .plan(&key("net1"), &services, &ips(&["10.0.0.5"]), &[])
            .is_none());
        assert_eq!(pod_ifname("averylongname1"), "averylongn-host");
        assert!(validate_ifname(&pod_ifname("averylongname1")).is_ok());
    }

    #[test]
    fn mistakes_are_refused() {
        let c = config();
        for bad in [
            HostPathConfig {
                service_cidrs: vec![],
                ..c.clone()
            },
            HostPathConfig {
                veth_prefix: "toolong8".into(),
                ..c.clone()
            },
            HostPathConfig {
                interfaces: vec![],
                ..c.clone()
            },
            HostPathConfig {
                interfaces: vec!["a/b".into()],
                ..c.clone()
            },
            HostPathConfig {
                service_cidrs: vec!["10.96.0.1/12".parse().unwrap()],
                ..c.clone()
            },
            HostPathConfig {
                ct_mark: 0,
                ..c.clone()
            },
            HostPathConfig {
                ct_mark: 0x3000,
                ..c.clone()
            },
            HostPathConfig {
                nft: "".into(),
                ..c.clone()
            },
            HostPathConfig {
                nft: "sbin/nft".into(),
                ..c.clone()
            },
            // Both sources: which one wins would be a guess.
            HostPathConfig {
                service_cidrs_from_api: true,
                ..c.clone()
            },
            HostPathConfig {
                kubeconfig: Some("/etc/enim/kubeconfig".into()),
                ..c.clone()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
        for good in [
            HostPathConfig {
                nft: "/usr/sbin/nft".into(),
                ct_mark: 0x8000_0000,
                ..c.clone()
            },
            HostPathConfig {
                masquerade: false,
                ..c.clone()
            },
            HostPathConfig {
                service_cidrs: vec![],
                service_cidrs_from_api: true,
                kubeconfig: Some("/etc/enim/kubeconfig".into()),
                ..c.clone()
            },
        ] {
            good.validate().unwrap();
        }
    }

    #[test]
    fn masquerade_follows_the_host_path() {
        let c = config();
        assert!(c.masquerades());
        assert!(!HostPathConfig::default().masquerades());
        assert!(!HostPathConfig {
            masquerade: false,
            ..c
        }
        .masquerades());
    }
}
