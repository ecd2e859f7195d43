//! EC2's XML replies as typed values.

use serde::de::DeserializeOwned;
use serde::Deserialize;

use super::error::Ec2Error;

pub(super) fn decode<T: DeserializeOwned>(action: &str, xml: &str) -> Result<T, Ec2Error> {
    quick_xml::de::from_str(xml).map_err(|e| Ec2Error::Decode {
        action: action.into(),
        detail: e.to_string(),
    })
}

/// A list as EC2 serialises it: `<fooSet><item>…</item>…</fooSet>`.
#[derive(Debug, Clone, Deserialize)]
pub struct Items<T> {
    #[serde(rename = "item", default = "Vec::new")]
    pub item: Vec<T>,
}

impl<T> Default for Items<T> {
    fn default() -> Self {
        Items { item: Vec::new() }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Tag {
    pub key: String,
    #[serde(default)]
    pub value: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Attachment {
    #[serde(default)]
    pub attachment_id: Option<String>,
    #[serde(default)]
    pub instance_id: Option<String>,
    #[serde(default)]
    pub device_index: Option<u32>,
    #[serde(default)]
    pub network_card_index: Option<u32>,
    /// attaching | attached | detaching | detached
    #[serde(default)]
    pub status: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Ipv6Item {
    pub ipv6_address: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkInterface {
    pub network_interface_id: String,
    #[serde(default)]
    pub mac_address: String,
    /// available | attaching | in-use | detaching
    #[serde(default)]
    pub status: String,
    #[serde(default)]
    pub private_ip_address: Option<String>,
    #[serde(default)]
    pub subnet_id: String,
    #[serde(default)]
    pub attachment: Option<Attachment>,
    #[serde(default)]
    pub tag_set: Items<Tag>,
    #[serde(default)]
    pub ipv6_addresses_set: Items<Ipv6Item>,
    /// Every private IPv4 address, the primary flagged.
    #[serde(default)]
    pub private_ip_addresses_set: Items<PrivateIpItem>,
    #[serde(default)]
    pub group_set: Items<GroupItem>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupItem {
    pub group_id: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PrivateIpItem {
    pub private_ip_address: String,
    #[serde(default)]
    pub primary: bool,
}

impl NetworkInterface {
    pub fn tag(&self, key: &str) -> Option<&str> {
        self.tag_set
            .item
            .iter()
            .find(|t| t.key == key)
            .map(|t| t.value.as_str())
    }

    /// Its addresses but the primary IPv4 (so its own IPv6 address too),
    /// as EC2 lists them; unparsable entries are skipped. For telling new
    /// addresses from old ones.
    pub fn secondary_ips(&self) -> Vec<std::net::IpAddr> {
        let v4 = self
            .private_ip_addresses_set
            .item
            .iter()
            .filter(|i| {
                !i.primary && Some(&i.private_ip_address) != self.private_ip_address.as_ref()
            })
            .map(|i| i.private_ip_address.as_str());
        let v6 = self
            .ipv6_addresses_set
            .item
            .iter()
            .map(|i| i.ipv6_address.as_str());
        v4.chain(v6).filter_map(|s| s.parse().ok()).collect()
    }

    /// The ids of its security groups, in the listing's order.
    pub fn group_ids(&self) -> Vec<&str> {
        self.group_set
            .item
            .iter()
            .map(|g| g.group_id.as_str())
            .collect()
    }

    /// The instance it is attached (or attaching) to.
    pub fn attached_instance(&self) -> Option<&str> {
        let a = self.attachment.as_ref()?;
        match a.status.as_str() {
            "attaching" | "attached" | "" => a.instance_id.as_deref(),
            _ => None,
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct DescribeNetworkInterfacesResponse {
    #[serde(default)]
    pub(super) network_interface_set: Items<NetworkInterface>,
    #[serde(default)]
    pub(super) next_token: Option<String>,
}

/// A subnet: its IPv4 block and, where it has one, its IPv6 block.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Subnet {
    pub subnet_id: String,
    pub cidr_block: String,
    #[serde(default)]
    pub ipv6_cidr_block_association_set: Items<Ipv6CidrBlock>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Ipv6CidrBlock {
    pub ipv6_cidr_block: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct DescribeSubnetsResponse {
    #[serde(default)]
    pub(super) subnet_set: Items<Subnet>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct CreateNetworkInterfaceResponse {
    pub(super) network_interface: NetworkInterface,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct AttachNetworkInterfaceResponse {
    pub(super) attachment_id: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct DescribeInstanceTypesResponse {
    #[serde(default)]
    pub(super) instance_type_set: Items<InstanceTypeInfo>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct InstanceTypeInfo {
    pub(super) instance_type: String,
    pub(super) network_info: NetworkInfo,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct NetworkInfo {
    pub(super) maximum_network_interfaces: u32,
    #[serde(default)]
    pub(super) ipv4_addresses_per_interface: u32,
    #[serde(default)]
    pub(super) ipv6_addresses_per_interface: u32,
    #[serde(default)]
    pub(super) network_cards: Items<NetworkCard>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct NetworkCard {
    pub(super) network_card_index: u32,
    pub(super) maximum_network_interfaces: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn network_interface_xml() {
        let xml = r#"<?xml version="1.0" encoding="UTF-8"?>
<DescribeNetworkInterfacesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">
 <requestId>r</requestId>
 <networkInterfaceSet>
  <item>
   <networkInterfaceId>eni-0a</networkInterfaceId>
   <subnetId>subnet-1</subnetId>
   <description/>
   <status>in-use</status>
   <macAddress>02:00:00:aa:bb:cc</macAddress>
   <privateIpAddress>10.0.1.5</privateIpAddress>
   <groupSet><item><groupId>sg-1</groupId><groupName>default</groupName></item></groupSet>
   <attachment>
     <attachmentId>eni-attach-1</attachmentId><instanceId>i-1</instanceId>
     <deviceIndex>2</deviceIndex><networkCardIndex>0</networkCardIndex><status>attached</status>
   </attachment>
   <tagSet><item><key>enim.io/node</key><value>i-1</value></item><item><key>empty</key><value/></item></tagSet>
   <ipv6AddressesSet><item><ipv6Address>2600::5</ipv6Address></item></ipv6AddressesSet>
  </item>
  <item><networkInterfaceId>eni-0b</networkInterfaceId><status>available</status><tagSet/><ipv6AddressesSet/></item>
 </networkInterfaceSet>
 <nextToken>tok</nextToken>
</DescribeNetworkInterfacesResponse>"#;
        let r: DescribeNetworkInterfacesResponse = decode("D", xml).unwrap();
        assert_eq!(r.next_token.as_deref(), Some("tok"));
        let [a, b] = &r.network_interface_set.item[..] else {
            panic!("two items expected");
        };
        assert_eq!(a.network_interface_id, "eni-0a");
        assert_eq!(a.tag("enim.io/node"), Some("i-1"));
        assert_eq!(a.tag("empty"), Some(""));
        assert_eq!(a.attached_instance(), Some("i-1"));
        let att = a.attachment.as_ref().unwrap();
        assert_eq!(att.device_index, Some(2));
        assert_eq!(att.attachment_id.as_deref(), Some("eni-attach-1"));
        assert_eq!(a.ipv6_addresses_set.item[0].ipv6_address, "2600::5");
        assert_eq!(a.group_set.item[0].group_id, "sg-1");
        assert_eq!(b.attachment, None);
        assert_eq!(b.attached_instance(), None);
        assert!(b.tag_set.item.is_empty());
    }

    #[test]
    fn subnets_xml() {
        let xml = "<DescribeSubnetsResponse><subnetSet><item><subnetId>subnet-1</subnetId>\
            <cidrBlock>10.0.1.0/24</cidrBlock><ipv6CidrBlockAssociationSet><item>\
            <ipv6CidrBlock>2600:1f18::/64</ipv6CidrBlock></item></ipv6CidrBlockAssociationSet>\
            </item><item><subnetId>subnet-2</subnetId><cidrBlock>10.0.2.0/24</cidrBlock>\
            </item></subnetSet></DescribeSubnetsResponse>";
        let r: DescribeSubnetsResponse = decode("D", xml).unwrap();
        let [a, b] = &r.subnet_set.item[..] else {
            panic!("two subnets expected");
        };
        assert_eq!(
            (a.subnet_id.as_str(), a.cidr_block.as_str()),
            ("subnet-1", "10.0.1.0/24")
        );
        assert_eq!(
            a.ipv6_cidr_block_association_set.item[0].ipv6_cidr_block,
            "2600:1f18::/64"
        );
        assert!(b.ipv6_cidr_block_association_set.item.is_empty());
    }

    #[test]
    fn instance_type_limit_per_card() {
        let xml = "<DescribeInstanceTypesResponse><instanceTypeSet><item>\
            <instanceType>p5.48xlarge</instanceType><networkInfo>\
            <maximumNetworkInterfaces>64</maximumNetworkInterfaces>\
            <networkCards><item><networkCardIndex>0</networkCardIndex><maximumNetworkInterfaces>2</maximumNetworkInterfaces></item>\
            <item><networkCardIndex>1</networkCardIndex><maximumNetworkInterfaces>2</maximumNetworkInterfaces></item></networkCards>\
            </networkInfo></item></instanceTypeSet></DescribeInstanceTypesResponse>";
        let r: DescribeInstanceTypesResponse = decode("D", xml).unwrap();
        let info = &r.instance_type_set.item[0];
        assert_eq!(info.network_info.maximum_network_interfaces, 64);
        assert_eq!(
            info.network_info.network_cards.item[1].maximum_network_interfaces,
            2
        );
    }
}
