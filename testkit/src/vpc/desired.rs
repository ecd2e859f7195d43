//! What the kernel should hold after one moto listing: a [`Plug`] per ENI
//! attached to a configured instance. Pure (no kernel, no moto), so hostile
//! listings are tested on their own. A listing is written by another party:
//! any entry that does not make sense becomes a [`Skip`] with its reason,
//! never a panic, and never stops the other entries.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use enim_core::MacAddr;
use enim_provider_aws::client::{NetworkInterface, Subnet};
use enim_provider_aws::metadata::{ipv4_gateway, ipv6_gateway};
use ipnet::{Ipv4Net, Ipv6Net};

use super::config::{PrimaryMode, VpcConfig};

/// The far end's alias starts with this; the rest names the attachment,
/// so a restarted simulator knows which ENI each far end is.
pub const ALIAS_PREFIX: &str = "vpcsim";

/// One attached ENI as the kernel should show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plug {
    pub eni_id: String,
    /// A re-attach gets a new one, and so a new device, as in the cloud.
    pub attachment_id: String,
    pub instance_id: String,
    /// The index of its node in [`VpcConfig::nodes`].
    pub node: usize,
    pub mac: MacAddr,
    pub device_index: u32,
    pub mtu: u32,
    pub subnet_v4: Ipv4Net,
    pub subnet_v6: Option<Ipv6Net>,
    /// Every private IPv4 address, the primary first.
    pub ipv4: Vec<Ipv4Addr>,
    pub ipv6: Vec<Ipv6Addr>,
    /// Set for the primary ENI only: how the node wants it.
    pub primary: Option<PrimaryMode>,
}

impl Plug {
    /// The far end's alias: `vpcsim <eni-id> <attachment-id>`.
    pub fn alias(&self) -> String {
        alias(&self.eni_id, &self.attachment_id)
    }

    /// The node end's name: `eth<device index>`, as a Xen-era instance
    /// names its ENIs (short, and the index is all a reader needs).
    pub fn node_ifname(&self) -> String {
        format!("eth{}", self.device_index)
    }

    /// The subnet's gateways, the VPC router's addresses (first host).
    pub fn gateway4(&self) -> Ipv4Addr {
        ipv4_gateway(self.subnet_v4)
    }

    pub fn gateway6(&self) -> Option<Ipv6Addr> {
        self.subnet_v6.map(ipv6_gateway)
    }

    /// Every address the VPC routes to this ENI.
    pub fn addresses(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.ipv4
            .iter()
            .copied()
            .map(IpAddr::V4)
            .chain(self.ipv6.iter().copied().map(IpAddr::V6))
    }
}

pub fn alias(eni_id: &str, attachment_id: &str) -> String {
    format!("{ALIAS_PREFIX} {eni_id} {attachment_id}")
}

/// The ENI id and attachment id of a far end's alias, if it is ours.
pub fn parse_alias(alias: &str) -> Option<(&str, &str)> {
    let mut words = alias.split(' ');
    if words.next()? != ALIAS_PREFIX {
        return None;
    }
    let (eni, att) = (words.next()?, words.next()?);
    words.next().is_none().then_some((eni, att))
}

/// An ENI left out, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skip {
    pub eni_id: String,
    pub why: String,
}

/// The plan for one listing.
#[derive(Debug, Default)]
pub struct Plan {
    pub plugs: Vec<Plug>,
    pub skips: Vec<Skip>,
}

/// What `listing` (every ENI moto holds) and `subnets` ask of the kernel.
pub fn plan(listing: &[NetworkInterface], subnets: &[Subnet], cfg: &VpcConfig) -> Plan {
    let subnets: HashMap<&str, &Subnet> =
        subnets.iter().map(|s| (s.subnet_id.as_str(), s)).collect();
    let mut out = Plan::default();
    // A cloud never repeats these; a hostile listing may. First one wins.
    let mut ids = HashSet::new();
    let mut macs = HashSet::new();
    let mut slots = HashSet::new();
    let mut routed: HashSet<IpAddr> = HashSet::new();
    for eni in listing {
        let plug = match plug_of(eni, &subnets, cfg) {
            Ok(Some(p)) => p,
            Ok(None) => continue,
            Err(why) => {
                out.skips.push(Skip {
                    eni_id: eni.network_interface_id.clone(),
                    why,
                });
                continue;
            }
        };
        let clash = if !ids.insert(plug.eni_id.clone()) {
            Some("its id is listed twice".to_string())
        } else if !macs.insert(plug.mac) {
            Some(format!("MAC {} is another ENI's", plug.mac))
        } else if !slots.insert((plug.node, plug.device_index)) {
            Some(format!(
                "device index {} of {} is another ENI's",
                plug.device_index, plug.instance_id
            ))
        } else {
            plug.addresses()
                .find(|a| routed.contains(a))
                .map(|a| format!("address {a} is another ENI's"))
        };
        if let Some(why) = clash {
            out.skips.push(Skip {
                eni_id: plug.eni_id,
                why,
            });
            continue;
        }
        routed.extend(plug.addresses());
        out.plugs.push(plug);
    }
    out
}

/// `Ok(None)`: not for the kernel (unattached, or a primary left alone).
fn plug_of(
    eni: &NetworkInterface,
    subnets: &HashMap<&str, &Subnet>,
    cfg: &VpcConfig,
) -> Result<Option<Plug>, String> {
    let Some(instance_id) = eni.attached_instance() else {
        return Ok(None);
    };
    let eni_id = word("ENI id", &eni.network_interface_id)?;
    let node = cfg
        .nodes
        .iter()
        .position(|n| n.instance_id == instance_id)
        .ok_or_else(|| format!("attached to {instance_id:?}, an instance of no node"))?;
    let att = eni.attachment.as_ref().ok_or("no attachment")?;
    let attachment_id = word(
        "attachment id",
        att.attachment_id.as_deref().unwrap_or_default(),
    )?;
    let device_index = att
        .device_index
        .ok_or("attachment without a device index")?;
    let primary = if device_index == 0 {
        match cfg.nodes[node].primary {
            PrimaryMode::Skip => return Ok(None),
            mode => Some(mode),
        }
    } else {
        None
    };
    let mac: MacAddr = eni
        .mac_address
        .parse()
        .map_err(|_| format!("malformed MAC {:?}", eni.mac_address))?;
    // The kernel refuses these for an ethernet device.
    if mac.0 == [0; 6] || mac.0[0] & 1 == 1 {
        return Err(format!("MAC {mac} is not a unicast address"));
    }
    let subnet = subnets
        .get(eni.subnet_id.as_str())
        .ok_or_else(|| format!("unknown subnet {:?}", eni.subnet_id))?;
    let subnet_v4: Ipv4Net = subnet
        .cidr_block
        .parse()
        .map_err(|_| format!("subnet {} has a malformed CIDR", subnet.subnet_id))?;
    let subnet_v6: Option<Ipv6Net> = match subnet.ipv6_cidr_block_association_set.item.first() {
        None => None,
        Some(b) => Some(
            b.ipv6_cidr_block
                .parse()
                .map_err(|_| format!("subnet {} has a malformed IPv6 block", subnet.subnet_id))?,
        ),
    };
    // The primary first, then the rest in the listing's order.
    let primary_v4 = eni.private_ip_address.iter();
    let others = eni
        .private_ip_addresses_set
        .item
        .iter()
        .map(|i| &i.private_ip_address);
    let mut ipv4: Vec<Ipv4Addr> = Vec::new();
    for a in primary_v4.chain(others) {
        let a: Ipv4Addr = a
            .parse()
            .map_err(|_| format!("malformed IPv4 address {a:?}"))?;
        if !ipv4.contains(&a) {
            ipv4.push(a);
        }
    }
    let mut ipv6: Vec<Ipv6Addr> = Vec::new();
    for i in &eni.ipv6_addresses_set.item {
        let a: Ipv6Addr = i
            .ipv6_address
            .parse()
            .map_err(|_| format!("malformed IPv6 address {:?}", i.ipv6_address))?;
        if !ipv6.contains(&a) {
            ipv6.push(a);
        }
    }
    if let Some(a) = ipv4
        .iter()
        .map(|a| IpAddr::V4(*a))
        .chain(ipv6.iter().map(|a| IpAddr::V6(*a)))
        .find(|a| !routable(*a))
    {
        return Err(format!("address {a} is not a private unicast address"));
    }
    Ok(Some(Plug {
        eni_id,
        attachment_id,
        instance_id: instance_id.to_string(),
        node,
        mac,
        device_index,
        mtu: cfg.mtu(&eni.subnet_id),
        subnet_v4: subnet_v4.trunc(),
        subnet_v6: subnet_v6.map(|n| n.trunc()),
        ipv4,
        ipv6,
        primary,
    }))
}

/// An id fit for the alias: printable, no spaces, not absurdly long.
fn word(what: &str, s: &str) -> Result<String, String> {
    let ok = !s.is_empty() && s.len() <= 64 && s.bytes().all(|b| b.is_ascii_graphic());
    ok.then(|| s.to_string())
        .ok_or_else(|| format!("malformed {what} {s:?}"))
}

/// Whether the VPC may route `a` to an ENI: not one of the addresses the
/// namespace itself needs (loopback, multicast, link-local, unspecified).
fn routable(a: IpAddr) -> bool {
    match a {
        IpAddr::V4(a) => {
            !(a.is_unspecified()
                || a.is_loopback()
                || a.is_multicast()
                || a.is_link_local()
                || a.is_broadcast())
        }
        IpAddr::V6(a) => {
            !(a.is_unspecified()
                || a.is_loopback()
                || a.is_multicast()
                || a.is_unicast_link_local())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vpc::config::NodeConfig;
    use enim_provider_aws::client::{Attachment, Ipv6Item, Items, PrivateIpItem};

    fn cfg() -> VpcConfig {
        let mut c = VpcConfig::new("/run/netns/vpc".into());
        for (id, primary) in [("i-a", PrimaryMode::Skip), ("i-b", PrimaryMode::Address)] {
            c.nodes.push(NodeConfig {
                instance_id: id.into(),
                netns: format!("/run/netns/{id}").into(),
                primary,
            });
        }
        c.subnet_mtu.insert("subnet-2".into(), 1500);
        c
    }

    fn subnets() -> Vec<Subnet> {
        let xml = "<r><item><subnetId>subnet-1</subnetId><cidrBlock>10.0.1.0/24</cidrBlock>\
            <ipv6CidrBlockAssociationSet><item><ipv6CidrBlock>2600:1f18::/64</ipv6CidrBlock>\
            </item></ipv6CidrBlockAssociationSet></item><item><subnetId>subnet-2</subnetId>\
            <cidrBlock>10.0.2.0/24</cidrBlock></item></r>";
        #[derive(serde::Deserialize)]
        struct R {
            item: Vec<Subnet>,
        }
        quick_xml::de::from_str::<R>(xml).unwrap().item
    }

    fn eni(id: &str, instance: &str, index: u32, mac: &str, ip: &str) -> NetworkInterface {
        NetworkInterface {
            network_interface_id: id.into(),
            mac_address: mac.into(),
            status: "in-use".into(),
            private_ip_address: Some(ip.into()),
            subnet_id: "subnet-1".into(),
            attachment: Some(Attachment {
                attachment_id: Some(format!("eni-attach-{id}")),
                instance_id: Some(instance.into()),
                device_index: Some(index),
                network_card_index: Some(0),
                status: "attached".into(),
            }),
            tag_set: Items::default(),
            ipv6_addresses_set: Items::default(),
            private_ip_addresses_set: Items {
                item: vec![PrivateIpItem {
                    private_ip_address: ip.into(),
                    primary: true,
                }],
            },
            group_set: Items::default(),
        }
    }

    #[test]
    fn plugs_attached_enis_of_known_instances() {
        let mut a = eni("eni-1", "i-a", 1, "02:00:00:00:00:01", "10.0.1.10");
        a.private_ip_addresses_set.item.push(PrivateIpItem {
            private_ip_address: "10.0.1.11".into(),
            primary: false,
        });
        a.ipv6_addresses_set.item.push(Ipv6Item {
            ipv6_address: "2600:1f18::5".into(),
        });
        let mut b = eni("eni-2", "i-b", 0, "02:00:00:00:00:02", "10.0.2.10");
        b.subnet_id = "subnet-2".into();
        let mut free = eni("eni-3", "i-a", 2, "02:00:00:00:00:03", "10.0.1.12");
        free.attachment = None;
        // i-a's primary: left alone (its node says skip).
        let skipped_primary = eni("eni-4", "i-a", 0, "02:00:00:00:00:04", "10.0.1.13");
        let plan = plan(&[a, b, free, skipped_primary], &subnets(), &cfg());
        assert!(plan.skips.is_empty(), "{:?}", plan.skips);
        let [a, b] = &plan.plugs[..] else {
            panic!("two plugs expected: {:?}", plan.plugs);
        };
        assert_eq!((a.node, a.node_ifname().as_str(), a.mtu), (0, "eth1", 9001));
        assert_eq!(
            a.ipv4,
            [
                "10.0.1.10".parse::<Ipv4Addr>().unwrap(),
                "10.0.1.11".parse().unwrap()
            ]
        );
        assert_eq!(a.ipv6, ["2600:1f18::5".parse::<Ipv6Addr>().unwrap()]);
        assert_eq!(a.gateway4(), Ipv4Addr::new(10, 0, 1, 1));
        assert_eq!(a.gateway6(), Some("2600:1f18::1".parse().unwrap()));
        assert_eq!(parse_alias(&a.alias()), Some(("eni-1", "eni-attach-eni-1")));
        assert_eq!((b.node, b.device_index, b.mtu), (1, 0, 1500));
        assert_eq!(b.primary, Some(PrimaryMode::Address));
        assert_eq!(b.gateway6(), None);
    }

    #[test]
    fn hostile_entries_are_skipped_and_the_rest_plugged() {
        let good = eni("eni-good", "i-a", 1, "02:00:00:00:00:01", "10.0.1.10");
        let no_mac = eni("eni-nomac", "i-a", 2, "", "10.0.1.11");
        let bad_mac = eni("eni-badmac", "i-a", 3, "02:00:00:00:00", "10.0.1.12");
        let multicast = eni("eni-mcast", "i-a", 4, "03:00:00:00:00:01", "10.0.1.13");
        let stranger = eni("eni-stranger", "i-zzz", 1, "02:00:00:00:00:05", "10.0.1.14");
        let mut lost = eni("eni-lost", "i-b", 1, "02:00:00:00:00:06", "10.0.1.15");
        lost.subnet_id = "subnet-nope".into();
        let mut no_index = eni("eni-noidx", "i-b", 2, "02:00:00:00:00:07", "10.0.1.16");
        no_index.attachment.as_mut().unwrap().device_index = None;
        let bad_ip = eni("eni-badip", "i-b", 3, "02:00:00:00:00:08", "10.0.1.999");
        let loopback = eni("eni-lo", "i-b", 4, "02:00:00:00:00:09", "127.0.0.1");
        let spaced = eni("eni-1 2", "i-b", 5, "02:00:00:00:00:0a", "10.0.1.17");
        let twin_mac = eni("eni-twin", "i-b", 6, "02:00:00:00:00:01", "10.0.1.18");
        let twin_ip = eni("eni-twinip", "i-b", 7, "02:00:00:00:00:0b", "10.0.1.10");
        let twin_slot = eni("eni-twinslot", "i-a", 1, "02:00:00:00:00:0c", "10.0.1.19");
        let twin_id = eni("eni-good", "i-b", 8, "02:00:00:00:00:0d", "10.0.1.20");
        let late_good = eni("eni-late", "i-b", 9, "02:00:00:00:00:0e", "10.0.1.21");
        let listing = [
            no_mac, good, bad_mac, multicast, stranger, lost, no_index, bad_ip, loopback, spaced,
            twin_mac, twin_ip, twin_slot, twin_id, late_good,
        ];
        let plan = plan(&listing, &subnets(), &cfg());
        let plugged: Vec<&str> = plan.plugs.iter().map(|p| p.eni_id.as_str()).collect();
        assert_eq!(plugged, ["eni-good", "eni-late"]);
        let skipped: Vec<&str> = plan.skips.iter().map(|s| s.eni_id.as_str()).collect();
        assert_eq!(
            skipped,
            [
                "eni-nomac",
                "eni-badmac",
                "eni-mcast",
                "eni-stranger",
                "eni-lost",
                "eni-noidx",
                "eni-badip",
                "eni-lo",
                "eni-1 2",
                "eni-twin",
                "eni-twinip",
                "eni-twinslot",
                "eni-good"
            ]
        );
        for s in &plan.skips {
            assert!(!s.why.is_empty());
        }
    }

    #[test]
    fn aliases_round_trip_and_others_are_not_ours() {
        assert_eq!(parse_alias("vpcsim eni-1 att-1"), Some(("eni-1", "att-1")));
        assert_eq!(parse_alias("vpcsim eni-1"), None);
        assert_eq!(parse_alias("vpcsim eni-1 att-1 x"), None);
        assert_eq!(parse_alias("someone else's"), None);
    }
}
