//! The OpenAPI's request and answer bodies (only the fields enim reads or
//! sends), read leniently: BCE sends `null` for absent values.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr};

use serde::{Deserialize, Serialize};

/// ENI states as BCE reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EniStatus {
    Available,
    Attaching,
    InUse,
    Detaching,
    Other(String),
}

impl EniStatus {
    fn parse(s: &str) -> Self {
        match s.to_ascii_lowercase().as_str() {
            "available" => EniStatus::Available,
            "attaching" => EniStatus::Attaching,
            "inuse" => EniStatus::InUse,
            "detaching" => EniStatus::Detaching,
            _ => EniStatus::Other(s.to_string()),
        }
    }
}

impl fmt::Display for EniStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EniStatus::Available => f.write_str("available"),
            EniStatus::Attaching => f.write_str("attaching"),
            EniStatus::InUse => f.write_str("inuse"),
            EniStatus::Detaching => f.write_str("detaching"),
            EniStatus::Other(s) => f.write_str(s),
        }
    }
}

/// BCE may send `null` where a value is absent; read it as the default.
fn nullable<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Option::unwrap_or_default)
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PrivateIp {
    #[serde(default, deserialize_with = "nullable")]
    pub primary: bool,
    #[serde(default, deserialize_with = "nullable")]
    pub private_ip_address: String,
}

/// An ENI as the OpenAPI describes it (only the fields enim reads).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApiEni {
    pub eni_id: String,
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
    #[serde(default, deserialize_with = "nullable")]
    pub description: String,
    #[serde(default, deserialize_with = "nullable")]
    pub instance_id: String,
    #[serde(default, deserialize_with = "nullable")]
    pub mac_address: String,
    #[serde(default, deserialize_with = "nullable")]
    pub status: String,
    #[serde(default, deserialize_with = "nullable")]
    pub subnet_id: String,
    #[serde(default, deserialize_with = "nullable")]
    pub private_ip_set: Vec<PrivateIp>,
    /// IPv6 addresses (BCE marks none of them primary).
    #[serde(default, deserialize_with = "nullable")]
    pub ipv6_private_ip_set: Vec<PrivateIp>,
}

impl ApiEni {
    /// The ENI's primary IPv4 address, if BCE reports one.
    pub fn primary_ipv4(&self) -> Option<Ipv4Addr> {
        self.private_ip_set
            .iter()
            .find(|p| p.primary)
            .and_then(|p| p.private_ip_address.parse().ok())
    }

    /// Every address of the ENI but its primary IPv4: secondary IPv4 and
    /// all IPv6. Unreadable entries are left out.
    pub fn non_primary_ips(&self) -> Vec<IpAddr> {
        self.private_ip_set
            .iter()
            .filter(|p| !p.primary)
            .chain(&self.ipv6_private_ip_set)
            .filter_map(|p| p.private_ip_address.parse().ok())
            .collect()
    }

    /// IPv4 addresses the ENI carries, its primary included.
    pub fn ipv4_count(&self) -> usize {
        self.private_ip_set.len()
    }

    pub fn status(&self) -> EniStatus {
        EniStatus::parse(&self.status)
    }

    pub fn attached_to(&self) -> Option<&str> {
        (!self.instance_id.is_empty()).then_some(self.instance_id.as_str())
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ListPage {
    #[serde(default, deserialize_with = "nullable")]
    pub(super) enis: Vec<ApiEni>,
    #[serde(default, deserialize_with = "nullable")]
    pub(super) is_truncated: bool,
    #[serde(default, deserialize_with = "nullable")]
    pub(super) next_marker: Option<String>,
}

/// A security group as the BCC API describes it (only its id).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ApiSecurityGroup {
    pub id: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct SecurityGroupPage {
    #[serde(default, deserialize_with = "nullable")]
    pub(super) security_groups: Vec<ApiSecurityGroup>,
    #[serde(default, deserialize_with = "nullable")]
    pub(super) is_truncated: bool,
    #[serde(default, deserialize_with = "nullable")]
    pub(super) next_marker: Option<String>,
}

/// One page of a marker-paged listing, whatever it lists.
pub(super) trait Page: for<'de> Deserialize<'de> {
    type Item;
    /// The page's items, whether more follow, and the marker of the next
    /// page.
    fn into_parts(self) -> (Vec<Self::Item>, bool, Option<String>);
}

impl Page for ListPage {
    type Item = ApiEni;
    fn into_parts(self) -> (Vec<ApiEni>, bool, Option<String>) {
        (self.enis, self.is_truncated, self.next_marker)
    }
}

impl Page for SecurityGroupPage {
    type Item = ApiSecurityGroup;
    fn into_parts(self) -> (Vec<ApiSecurityGroup>, bool, Option<String>) {
        (self.security_groups, self.is_truncated, self.next_marker)
    }
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateEni<'a> {
    pub name: &'a str,
    pub subnet_id: &'a str,
    pub security_group_ids: &'a [String],
    pub private_ip_set: Vec<PrivateIp>,
    pub description: &'a str,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Created {
    pub(super) eni_id: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EniQuota {
    pub total_quantity: u32,
    #[serde(default, deserialize_with = "nullable")]
    pub available_quantity: u32,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct AddedIps {
    #[serde(default, deserialize_with = "nullable")]
    pub(super) private_ip_addresses: Vec<String>,
}

/// A subnet as the VPC API describes it (only its blocks).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApiSubnet {
    pub subnet_id: String,
    pub cidr: String,
    #[serde(default, deserialize_with = "nullable")]
    pub ipv6_cidr: String,
}

#[derive(Deserialize)]
pub(super) struct SubnetAnswer {
    pub(super) subnet: ApiSubnet,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(super) struct ErrorBody {
    #[serde(default, deserialize_with = "nullable")]
    pub(super) code: String,
    #[serde(default, deserialize_with = "nullable")]
    pub(super) message: String,
    #[serde(default, deserialize_with = "nullable")]
    pub(super) request_id: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_with_nulls_and_extra_fields_decode() {
        let e: ApiEni = serde_json::from_str(
            r#"{"eniId": "eni-1", "name": null, "instanceId": null, "status": "Available",
                "privateIpSet": null, "zoneName": "cn-bj-a", "macAddress": "fa:f6:00:00:00:02"}"#,
        )
        .unwrap();
        assert_eq!(e.attached_to(), None);
        assert_eq!(e.status(), EniStatus::Available);
        assert!(e.private_ip_set.is_empty() && e.name.is_empty());
        let p: ListPage =
            serde_json::from_str(r#"{"enis": [], "isTruncated": false, "nextMarker": null}"#)
                .unwrap();
        assert!(p.enis.is_empty() && p.next_marker.is_none());
        assert!(serde_json::from_str::<ApiEni>(r#"{"name": "x"}"#).is_err());
        let g: SecurityGroupPage = serde_json::from_str(
            r#"{"marker": "", "isTruncated": false, "maxKeys": 1000, "securityGroups":
                [{"id": "g-1", "name": "default", "vpcId": "vpc-1", "desc": null, "rules": []}]}"#,
        )
        .unwrap();
        assert_eq!(g.security_groups[0].id, "g-1");
        assert!(g.next_marker.is_none());
        assert!(serde_json::from_str::<ApiSecurityGroup>(r#"{"name": "x"}"#).is_err());
    }
}
