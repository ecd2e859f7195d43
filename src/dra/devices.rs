//! One ENI as a DRA device: its name in the ResourceSlice and the
//! attributes a claim's CEL selectors and constraints see.
//!
//! Attributes without a domain are in the driver's (`enim.io`):
//! `eniId`, `mac`, `mtu`, `subnet`, `zone`, `networkCard`, `deviceIndex`,
//! `securityGroupCount` and `numaNode`; plus the standard
//! `resource.kubernetes.io/pcieRoot`.
//!
//! Security groups are one bool attribute per group, in the domain
//! `sg.enim.io` (`sg-0abc` → `sg.enim.io/sg_0abc: true`), not one joined
//! string: a string attribute holds at most 64 characters (three AWS group
//! ids), and a bool per group lets a claim ask for any subset in any order
//! (`device.attributes["sg.enim.io"].?sg_0abc.orValue(false)`); with
//! `securityGroupCount` it can ask for exactly a set.

use std::collections::BTreeMap;

use enim_core::Eni;
use k8s_openapi::api::resource::v1::{Device, DeviceAttribute};

use super::topology::Topology;

pub use enim_crd::dra::{group_attribute, SG_COUNT, SG_DOMAIN, SUBNET};
/// The standard PCIe root attribute (k8s.io/dynamic-resource-allocation's
/// `StandardDeviceAttributePCIeRoot`).
pub const PCIE_ROOT: &str = "resource.kubernetes.io/pcieRoot";
/// The API's limit on attributes and capacities of one device.
pub const MAX_ATTRIBUTES: usize = 32;
/// The API's limit on a string attribute's length.
pub const MAX_STRING: usize = 64;

/// The device name of an ENI: its id in lower case, when that is a DNS
/// label (EC2's `eni-0abc…`, BCE's `eni-abc…`); `None` otherwise, and the
/// ENI is not published.
pub fn device_name(eni_id: &str) -> Option<String> {
    let name = eni_id.to_ascii_lowercase();
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    ok.then_some(name)
}

/// The device for `eni`, or `None` when its id cannot name a device.
/// Attributes that would break the API's limits are left out with a
/// warning, never the device.
pub fn device(eni: &Eni, topology: &Topology) -> Option<Device> {
    let name = device_name(&eni.id)?;
    let mut attrs = BTreeMap::new();
    let mut put = |k: &str, v: DeviceAttribute| {
        attrs.insert(k.to_string(), v);
    };
    put("eniId", string(&eni.id));
    put("mac", string(&eni.mac.to_string()));
    if let Some(mtu) = eni.mtu {
        put("mtu", int(i64::from(mtu)));
    }
    if let Some(i) = eni.device_index {
        put("deviceIndex", int(i64::from(i)));
    }
    let p = &eni.placement;
    for (key, value) in [(SUBNET, &p.subnet), ("zone", &p.zone)] {
        match value {
            Some(v) if v.len() <= MAX_STRING => put(key, string(v)),
            Some(v) => {
                tracing::warn!(eni = %eni.id, key, value = %v, "longer than a DRA string attribute may be: not published")
            }
            None => {}
        }
    }
    if let Some(card) = p.network_card {
        put("networkCard", int(i64::from(card)));
    }
    if let Some(n) = topology.numa_node {
        put("numaNode", int(n));
    }
    if let Some(root) = &topology.pcie_root {
        put(PCIE_ROOT, string(root));
    }
    if !p.security_groups.is_empty() {
        put(
            SG_COUNT,
            int(i64::try_from(p.security_groups.len()).unwrap_or(i64::MAX)),
        );
    }
    for group in &p.security_groups {
        match group_attribute(group) {
            Some(id) if attrs.len() < MAX_ATTRIBUTES => {
                attrs.insert(format!("{SG_DOMAIN}/{id}"), boolean(true));
            }
            _ => {
                tracing::warn!(eni = %eni.id, group, "security group not published: its id is too long for an attribute name, or the device has 32 attributes")
            }
        }
    }
    Some(Device {
        name,
        attributes: Some(attrs),
        ..Device::default()
    })
}

fn string(s: &str) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(s.to_string()),
        ..DeviceAttribute::default()
    }
}

fn int(i: i64) -> DeviceAttribute {
    DeviceAttribute {
        int: Some(i),
        ..DeviceAttribute::default()
    }
}

fn boolean(b: bool) -> DeviceAttribute {
    DeviceAttribute {
        bool: Some(b),
        ..DeviceAttribute::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use enim_core::{MacAddr, Placement};

    fn eni(id: &str, placement: Placement) -> Eni {
        Eni {
            id: id.into(),
            mac: MacAddr([2, 0, 0, 0, 0, 7]),
            ipv4: "10.1.0.7/24".parse().unwrap(),
            gateway4: "10.1.0.1".parse().unwrap(),
            ipv6: None,
            gateway6: None,
            mtu: Some(9001),
            owner: None,
            device_index: Some(2),
            secondary_ips: vec![],
            placement,
        }
    }

    fn attr<'a>(d: &'a Device, k: &str) -> &'a DeviceAttribute {
        d.attributes
            .as_ref()
            .unwrap()
            .get(k)
            .unwrap_or_else(|| panic!("no {k}"))
    }

    #[test]
    fn every_known_fact_is_an_attribute() {
        let placement = Placement {
            subnet: Some("subnet-0a".into()),
            zone: Some("us-east-1a".into()),
            security_groups: vec!["sg-0123456789abcdef0".into(), "sg-web".into()],
            network_card: Some(1),
        };
        let topo = Topology {
            numa_node: Some(1),
            pcie_root: Some("pci0000:80".into()),
        };
        let d = device(&eni("eni-0ABC", placement), &topo).unwrap();
        assert_eq!(d.name, "eni-0abc");
        assert_eq!(attr(&d, "eniId").string.as_deref(), Some("eni-0ABC"));
        assert_eq!(attr(&d, "mac").string.as_deref(), Some("02:00:00:00:00:07"));
        assert_eq!(attr(&d, "mtu").int, Some(9001));
        assert_eq!(attr(&d, "deviceIndex").int, Some(2));
        assert_eq!(attr(&d, "subnet").string.as_deref(), Some("subnet-0a"));
        assert_eq!(attr(&d, "zone").string.as_deref(), Some("us-east-1a"));
        assert_eq!(attr(&d, "networkCard").int, Some(1));
        assert_eq!(attr(&d, "numaNode").int, Some(1));
        assert_eq!(attr(&d, PCIE_ROOT).string.as_deref(), Some("pci0000:80"));
        assert_eq!(attr(&d, "securityGroupCount").int, Some(2));
        assert_eq!(attr(&d, "sg.enim.io/sg_0123456789abcdef0").bool, Some(true));
        assert_eq!(attr(&d, "sg.enim.io/sg_web").bool, Some(true));
        assert_eq!(d.attributes.as_ref().unwrap().len(), 12);
    }

    #[test]
    fn unknown_facts_are_left_out() {
        let d = device(&eni("eni-1", Placement::default()), &Topology::default()).unwrap();
        let keys: Vec<&str> = d
            .attributes
            .as_ref()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(keys, ["deviceIndex", "eniId", "mac", "mtu"]);
    }

    #[test]
    fn names_and_group_ids_follow_the_api() {
        assert_eq!(device_name("eni-e2e-0").as_deref(), Some("eni-e2e-0"));
        assert_eq!(device_name("ENI-X").as_deref(), Some("eni-x"));
        assert_eq!(device_name("eni_1"), None);
        assert_eq!(device_name("-eni"), None);
        assert_eq!(device_name(&"e".repeat(64)), None);
        assert_eq!(group_attribute("g-abc.d").as_deref(), Some("g_abc_d"));
        assert_eq!(group_attribute("1sg").as_deref(), Some("_1sg"));
        assert_eq!(group_attribute(&"s".repeat(33)), None);
    }

    #[test]
    fn the_attribute_limit_holds_with_many_groups() {
        let placement = Placement {
            subnet: Some("s".repeat(65)),
            security_groups: (0..40).map(|i| format!("sg-{i}")).collect(),
            ..Placement::default()
        };
        let d = device(&eni("eni-2", placement), &Topology::default()).unwrap();
        let attrs = d.attributes.unwrap();
        assert_eq!(attrs.len(), MAX_ATTRIBUTES);
        assert!(
            !attrs.contains_key("subnet"),
            "a 65-character string is left out"
        );
    }
}
