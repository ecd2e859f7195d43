//! The one record both modes keep per attachment: what every attachment
//! has (key, pod, netns, MTU, phase, times, expiry, the ENI it uses) and a
//! mode payload (what the driver of that mode needs to undo it).
//!
//! Serialised flat, the payload's fields beside the common ones, and with
//! no mode tag: a primary record has exactly the fields of the `enim/2`
//! checkpoint's `attachments`, a secondary one those of its `pods`, so the
//! format is unchanged and an older agent still reads what this one writes.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;

use enim_core::{EniOwner, MacAddr, PodRef};
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use serde::{Deserialize, Serialize};

use super::{AttachmentKey, AttachmentResult, InterfaceConfig, IpConfig, Phase, RouteConfig};

/// The pod's IPv4 gateway over a veth to the host (secondary mode's pod
/// veth, primary mode's host path): link-local, resolved by a permanent
/// neighbour entry to the host end.
pub const GATEWAY4: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);
/// The pod's IPv6 gateway over a veth to the host (secondary mode gives the
/// host end this address; both modes resolve it with a permanent entry).
pub const GATEWAY6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);

/// Which driver serves the node (chosen once, at start-up).
pub use enim_core::Mode;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    #[serde(flatten)]
    pub key: AttachmentKey,
    #[serde(default)]
    pub pod: PodRef,
    /// The ENI the attachment uses (primary: holds; secondary: an address of).
    pub eni_id: String,
    pub netns: PathBuf,
    /// MTU the pod interface was given.
    pub mtu: u32,
    pub phase: Phase,
    /// Unix time in milliseconds.
    pub created_ms: u64,
    pub updated_ms: u64,
    /// Set when the ADD's result may never have reached the runtime (the
    /// plugin went away mid-request): unless a retried ADD, a CHECK or a DEL
    /// claims the attachment before this time (Unix ms), GC collects it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_ms: Option<u64>,
    #[serde(flatten)]
    pub payload: Payload,
}

/// What each mode keeps of an attachment. Told apart by their required
/// fields (`host_name` against `host_veth`), not by a tag: see the module
/// comment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Payload {
    Primary(PrimaryPayload),
    Secondary(SecondaryPayload),
}

/// Primary mode: the whole ENI is in the pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrimaryPayload {
    pub mac: MacAddr,
    /// The device's name and MTU in the host, restored on DEL.
    pub host_name: String,
    pub host_mtu: u32,
    pub ipv4: Ipv4Net,
    pub gateway4: Ipv4Addr,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<Ipv6Net>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway6: Option<Ipv6Addr>,
    /// The veth pair to the host (docs/architecture.md, "The host path"), when the node
    /// routes service traffic through the host. Recorded, name and routes,
    /// before it is made, so teardown removes exactly what was made even if
    /// the config changed since.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<HostPath>,
}

/// A primary-mode pod's second interface: a veth pair to the host, over
/// which the pod reaches the node itself and what only the node's netns
/// holds (Services, node-local DNS), while everything else takes the ENI.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostPath {
    /// The host end, named from the attachment key (GC sweeps by the name).
    pub host_veth: String,
    /// The pod end's name in the pod.
    pub ifname: String,
    /// What the pod routes via the host: the service and host-stack CIDRs
    /// and the node's own addresses.
    pub routes: Vec<IpNet>,
    /// The pod end's MAC, known once it exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<MacAddr>,
}

impl HostPath {
    /// The pod's gateway on the host path for `dst`'s family.
    pub fn gateway_for(dst: &IpNet) -> IpAddr {
        match dst {
            IpNet::V4(_) => IpAddr::V4(GATEWAY4),
            IpNet::V6(_) => IpAddr::V6(GATEWAY6),
        }
    }
}

/// Secondary mode: the pod holds a secondary address of a host ENI over a
/// veth pair.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecondaryPayload {
    /// The ENI's route table and the rule priorities used, as when the pod
    /// was plumbed: teardown removes exactly these even if the config
    /// changed since.
    pub table: u32,
    pub rule_priority_to_pod: u32,
    pub rule_priority_from_pod: u32,
    /// The host end of the veth pair.
    pub host_veth: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv4: Option<Ipv4Addr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<Ipv6Addr>,
    /// The pod interface's MAC, known once it exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<MacAddr>,
}

impl SecondaryPayload {
    /// The pod's addresses, IPv4 first.
    pub fn ips(&self) -> Vec<IpAddr> {
        pod_ips(self.ipv4, self.ipv6)
    }
}

/// A pod's addresses in order, IPv4 first, from its optional halves.
pub fn pod_ips(ipv4: Option<Ipv4Addr>, ipv6: Option<Ipv6Addr>) -> Vec<IpAddr> {
    ipv4.map(IpAddr::V4)
        .into_iter()
        .chain(ipv6.map(IpAddr::V6))
        .collect()
}

impl Record {
    pub fn mode(&self) -> Mode {
        match self.payload {
            Payload::Primary(_) => Mode::Primary,
            Payload::Secondary(_) => Mode::Secondary,
        }
    }

    pub fn owner(&self) -> EniOwner {
        EniOwner {
            network: self.key.network.clone(),
            container_id: self.key.container_id.clone(),
            ifname: self.key.ifname.clone(),
            pod: self.pod.clone(),
        }
    }

    pub fn primary(&self) -> Option<&PrimaryPayload> {
        match &self.payload {
            Payload::Primary(p) => Some(p),
            Payload::Secondary(_) => None,
        }
    }

    pub fn secondary(&self) -> Option<&SecondaryPayload> {
        match &self.payload {
            Payload::Secondary(s) => Some(s),
            Payload::Primary(_) => None,
        }
    }

    /// The pod interface's MAC, when known.
    pub fn mac(&self) -> Option<MacAddr> {
        match &self.payload {
            Payload::Primary(p) => Some(p.mac),
            Payload::Secondary(s) => s.mac,
        }
    }

    /// The pod's addresses (without prefix), IPv4 first.
    pub fn ips(&self) -> Vec<IpAddr> {
        match &self.payload {
            Payload::Primary(p) => pod_ips(Some(p.ipv4.addr()), p.ipv6.map(|n| n.addr())),
            Payload::Secondary(s) => s.ips(),
        }
    }

    /// The CNI-shaped result of this attachment.
    pub fn result(&self) -> AttachmentResult {
        // (address, gateway) per family, IPv4 first; every gateway also
        // carries the family's default route.
        let families: Vec<(IpNet, IpAddr)> = match &self.payload {
            Payload::Primary(p) => {
                let mut f = vec![(IpNet::V4(p.ipv4), IpAddr::V4(p.gateway4))];
                if let (Some(v6), Some(gw6)) = (p.ipv6, p.gateway6) {
                    f.push((IpNet::V6(v6), IpAddr::V6(gw6)));
                }
                f
            }
            Payload::Secondary(s) => s
                .ips()
                .into_iter()
                .map(|ip| match ip {
                    IpAddr::V4(_) => (IpNet::from(ip), IpAddr::V4(GATEWAY4)),
                    IpAddr::V6(_) => (IpNet::from(ip), IpAddr::V6(GATEWAY6)),
                })
                .collect(),
        };
        let mut ips: Vec<IpConfig> = families
            .iter()
            .map(|(address, gw)| IpConfig {
                address: *address,
                gateway: Some(*gw),
            })
            .collect();
        // An IPv6 address without a gateway is still the pod's.
        if let Payload::Primary(PrimaryPayload {
            ipv6: Some(v6),
            gateway6: None,
            ..
        }) = &self.payload
        {
            ips.push(IpConfig {
                address: IpNet::V6(*v6),
                gateway: None,
            });
        }
        let mut routes: Vec<RouteConfig> = families
            .iter()
            .map(|(_, gw)| RouteConfig::default_via(*gw))
            .collect();
        let host_path = self.primary().and_then(|p| p.host_path.as_ref());
        if let Some(hp) = host_path {
            routes.extend(hp.routes.iter().map(|dst| RouteConfig {
                dst: *dst,
                gw: Some(HostPath::gateway_for(dst)),
            }));
        }
        AttachmentResult {
            interface: InterfaceConfig {
                name: self.key.ifname.clone(),
                mac: self.mac().unwrap_or(MacAddr([0; 6])),
                mtu: self.mtu,
                sandbox: self.netns.clone(),
            },
            host_path: host_path.map(|hp| InterfaceConfig {
                name: hp.ifname.clone(),
                mac: hp.mac.unwrap_or(MacAddr([0; 6])),
                mtu: self.mtu,
                sandbox: self.netns.clone(),
            }),
            ips,
            routes,
            eni_id: self.eni_id.clone(),
        }
    }
}

/// Records for the unit tests of the model and, behind the `testing`
/// feature, of other crates (the agent's store).
#[cfg(any(test, feature = "testing"))]
pub mod fixtures {
    use super::*;

    /// A Ready record of container `cid` on ENI `eni-<cid>`, holding
    /// `payload`.
    pub fn record(cid: &str, payload: Payload) -> Record {
        Record {
            key: AttachmentKey {
                network: "net".into(),
                container_id: cid.into(),
                ifname: "eth0".into(),
            },
            pod: PodRef::default(),
            eni_id: format!("eni-{cid}"),
            netns: "/run/netns/x".into(),
            mtu: 9001,
            phase: Phase::Ready,
            created_ms: 1_700_000_000_000,
            updated_ms: 1_700_000_000_000,
            expires_ms: None,
            payload,
        }
    }

    /// Primary mode's IPv4-only payload: eth1's ENI, 10.0.1.10/24.
    pub fn primary_v4() -> Payload {
        Payload::Primary(PrimaryPayload {
            mac: "02:00:00:00:00:01".parse().unwrap(),
            host_name: "eth1".into(),
            host_mtu: 1500,
            ipv4: "10.0.1.10/24".parse().unwrap(),
            gateway4: "10.0.1.1".parse().unwrap(),
            ipv6: None,
            gateway6: None,
            host_path: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::{primary_v4, record};
    use super::*;

    #[test]
    fn results_of_both_modes() {
        let mut primary = record("c", primary_v4());
        if let Payload::Primary(p) = &mut primary.payload {
            p.ipv6 = Some("fd00:1::10/64".parse().unwrap());
        }
        let r = primary.result();
        let ips: Vec<String> = r.ips.iter().map(|i| i.address.to_string()).collect();
        assert_eq!(ips, ["10.0.1.10/24", "fd00:1::10/64"]);
        assert_eq!(r.ips[1].gateway, None);
        assert_eq!(r.routes.len(), 1, "no IPv6 default route without gateway");
        assert_eq!(r.routes[0].dst.to_string(), "0.0.0.0/0");
        assert_eq!(r.interface.mac.to_string(), "02:00:00:00:00:01");

        let secondary = record(
            "c",
            Payload::Secondary(SecondaryPayload {
                table: 1001,
                rule_priority_to_pod: 512,
                rule_priority_from_pod: 1536,
                host_veth: "enim0123456789a".into(),
                ipv4: Some("10.0.1.11".parse().unwrap()),
                ipv6: Some("fd00:1::11".parse().unwrap()),
                mac: None,
            }),
        );
        let r = secondary.result();
        let ips: Vec<String> = r.ips.iter().map(|i| i.address.to_string()).collect();
        assert_eq!(ips, ["10.0.1.11/32", "fd00:1::11/128"]);
        // 0.0.0.0/0 via 169.254.1.1 and ::/0 via fe80::1.
        let defaults =
            ["169.254.1.1", "fe80::1"].map(|gw| RouteConfig::default_via(gw.parse().unwrap()));
        assert_eq!(r.routes, defaults);
        assert_eq!(secondary.mode(), Mode::Secondary);
    }

    #[test]
    fn payloads_are_told_apart_by_their_fields() {
        for record in [
            record("c", primary_v4()),
            record(
                "c",
                Payload::Secondary(SecondaryPayload {
                    table: 1001,
                    rule_priority_to_pod: 512,
                    rule_priority_from_pod: 1536,
                    host_veth: "enim0123456789a".into(),
                    ipv4: Some("10.0.1.11".parse().unwrap()),
                    ipv6: None,
                    mac: Some("02:00:00:00:00:09".parse().unwrap()),
                }),
            ),
        ] {
            let json = serde_json::to_value(&record).unwrap();
            assert!(json.get("mode").is_none(), "no tag on disk: {json}");
            let back: Record = serde_json::from_value(json).unwrap();
            assert_eq!(back, record);
        }
    }
}
