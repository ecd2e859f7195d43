//! The EC2 API client: a small client of the AWS Query protocol (EC2 API
//! version 2016-11-15), form-encoded POSTs signed with SigV4, XML replies.
//!
//! Throttling and server-side failures are retried with jittered exponential
//! backoff, within a bound; everything else is returned at once as a typed
//! [`Ec2Error`].
//!
//! - `query`: the protocol: SigV4 signing, transport and retries;
//! - `error`: [`Ec2Error`], read from error replies;
//! - `xml`: the typed replies;
//! - here: [`Ec2Client`], the EC2 actions enim calls.

mod error;
mod query;
mod xml;

use std::sync::Arc;

use enim_core::api_config::ApiConfig;
use enim_core::pacing::Pacing;
use enim_core::AddressLimits;
use serde::de::DeserializeOwned;

pub use error::{classify, Ec2Error};
pub use query::{default_endpoint, ActionLimits, QueryClient, RetryPolicy};
use xml::{
    decode, AttachNetworkInterfaceResponse, CreateNetworkInterfaceResponse,
    DescribeInstanceTypesResponse, DescribeNetworkInterfacesResponse, DescribeSubnetsResponse,
};
pub use xml::{
    Attachment, GroupItem, Ipv6CidrBlock, Ipv6Item, Items, NetworkInterface, PrivateIpItem, Subnet,
    Tag,
};

use crate::credentials::CredentialsProvider;

pub const EC2_API_VERSION: &str = "2016-11-15";
/// DescribeNetworkInterfaces page size (the API allows 5 to 1000).
const PAGE_SIZE: &str = "1000";
/// A runaway NextToken chain is a bug on one side; stop rather than spin.
const MAX_PAGES: usize = 1000;

/// The address verbs take one family at a time: EC2 has a pair of actions
/// per family that differ only in their names and parameter names.
pub use enim_provider::cloud::Family;

/// One family's actions and parameter names.
struct AddressVerbs {
    assign: &'static str,
    /// The assign's count parameter.
    count: &'static str,
    unassign: &'static str,
    /// The unassign's list parameter (`<each>.1`, `<each>.2`, ...).
    each: &'static str,
}

fn verbs(family: Family) -> AddressVerbs {
    match family {
        Family::V4 => AddressVerbs {
            assign: "AssignPrivateIpAddresses",
            count: "SecondaryPrivateIpAddressCount",
            unassign: "UnassignPrivateIpAddresses",
            each: "PrivateIpAddress",
        },
        Family::V6 => AddressVerbs {
            assign: "AssignIpv6Addresses",
            count: "Ipv6AddressCount",
            unassign: "UnassignIpv6Addresses",
            each: "Ipv6Addresses",
        },
    }
}

/// What CreateNetworkInterface should make.
#[derive(Debug, Clone, Default)]
pub struct CreateEni<'a> {
    pub subnet_id: &'a str,
    pub security_group_ids: &'a [String],
    pub description: &'a str,
    /// Idempotency: a retried create with the same token returns the same
    /// ENI instead of making a second one.
    pub client_token: &'a str,
    pub tags: &'a [(String, String)],
    pub ipv6_address_count: u32,
    /// Secondary private IPv4 addresses EC2 picks at creation.
    pub secondary_ipv4_count: usize,
}

/// The EC2 operations enim uses.
pub struct Ec2Client {
    query: QueryClient,
}

impl Ec2Client {
    pub fn new(
        endpoint: &str,
        region: &str,
        creds: Arc<CredentialsProvider>,
        retry: RetryPolicy,
    ) -> Result<Ec2Client, Ec2Error> {
        Ok(Ec2Client {
            query: QueryClient::new(endpoint, region, "ec2", EC2_API_VERSION, creds, retry)?,
        })
    }

    /// A client of `api.endpoint` (default: the region's) that retries
    /// and paces its calls as `api` says, with token buckets of its own:
    /// one such client per process (the agent's backend, or the operator's
    /// whole cluster) keeps that process under its rates.
    pub fn configured(
        region: &str,
        creds: Arc<CredentialsProvider>,
        api: &ApiConfig,
    ) -> Result<Ec2Client, Ec2Error> {
        let endpoint = api
            .endpoint
            .clone()
            .unwrap_or_else(|| default_endpoint("ec2", region));
        let limits = ActionLimits::new(api.mutating_rate, api.read_rate);
        tracing::info!(
            %endpoint,
            credentials = creds.describe(),
            mutating_per_s = api.mutating_rate.per_second(),
            describe_per_s = api.read_rate.per_second(),
            "EC2 client",
        );
        Ok(Self::new(&endpoint, region, creds, api.retry_policy())?.with_limits(Arc::new(limits)))
    }

    /// Every call waits for a token of its class in `limits`.
    pub fn with_limits(self, limits: Arc<ActionLimits>) -> Self {
        Ec2Client {
            query: self.query.with_limits(limits),
        }
    }

    /// Every call waits for its action's slot in `pacing`.
    pub fn with_pacing(self, pacing: Arc<Pacing>) -> Self {
        Ec2Client {
            query: self.query.with_pacing(pacing),
        }
    }

    pub fn query(&self) -> &QueryClient {
        &self.query
    }

    /// One call whose reply is decoded as `T`.
    async fn call<T: DeserializeOwned>(
        &self,
        action: &str,
        params: &[(String, String)],
    ) -> Result<T, Ec2Error> {
        decode(action, &self.query.call(action, params).await?)
    }

    /// DescribeNetworkInterfaces with `Filter.N` filters, every page.
    pub async fn describe_network_interfaces(
        &self,
        filters: &[(&str, &[&str])],
    ) -> Result<Vec<NetworkInterface>, Ec2Error> {
        const ACTION: &str = "DescribeNetworkInterfaces";
        let mut params = filter_params(filters);
        params.push(("MaxResults".into(), PAGE_SIZE.into()));
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        for _ in 0..MAX_PAGES {
            let mut p = params.clone();
            if let Some(t) = &token {
                p.push(("NextToken".into(), t.clone()));
            }
            let page: DescribeNetworkInterfacesResponse = self.call(ACTION, &p).await?;
            out.extend(page.network_interface_set.item);
            match page.next_token.filter(|t| !t.is_empty()) {
                Some(next) if token.as_ref() == Some(&next) => {
                    return Err(Ec2Error::Decode {
                        action: ACTION.into(),
                        detail: "the same NextToken came back twice".into(),
                    })
                }
                Some(next) => token = Some(next),
                None => return Ok(out),
            }
        }
        Err(Ec2Error::Decode {
            action: ACTION.into(),
            detail: format!("more than {MAX_PAGES} pages"),
        })
    }

    /// One interface by id; `None` when it does not exist.
    pub async fn describe_network_interface(
        &self,
        id: &str,
    ) -> Result<Option<NetworkInterface>, Ec2Error> {
        const ACTION: &str = "DescribeNetworkInterfaces";
        let params = vec![("NetworkInterfaceId.1".to_string(), id.to_string())];
        match self
            .call::<DescribeNetworkInterfacesResponse>(ACTION, &params)
            .await
        {
            Ok(r) => Ok(r
                .network_interface_set
                .item
                .into_iter()
                .find(|n| n.network_interface_id == id)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub async fn create_network_interface(
        &self,
        req: &CreateEni<'_>,
    ) -> Result<NetworkInterface, Ec2Error> {
        const ACTION: &str = "CreateNetworkInterface";
        let mut p: Vec<(String, String)> = vec![
            ("SubnetId".into(), req.subnet_id.into()),
            ("Description".into(), req.description.into()),
            ("ClientToken".into(), req.client_token.into()),
        ];
        for (i, sg) in req.security_group_ids.iter().enumerate() {
            p.push((format!("SecurityGroupId.{}", i + 1), sg.clone()));
        }
        if req.ipv6_address_count > 0 {
            p.push((
                "Ipv6AddressCount".into(),
                req.ipv6_address_count.to_string(),
            ));
        }
        if req.secondary_ipv4_count > 0 {
            p.push((
                "SecondaryPrivateIpAddressCount".into(),
                req.secondary_ipv4_count.to_string(),
            ));
        }
        if !req.tags.is_empty() {
            p.push((
                "TagSpecification.1.ResourceType".into(),
                "network-interface".into(),
            ));
            for (i, (k, v)) in req.tags.iter().enumerate() {
                p.push((format!("TagSpecification.1.Tag.{}.Key", i + 1), k.clone()));
                p.push((format!("TagSpecification.1.Tag.{}.Value", i + 1), v.clone()));
            }
        }
        let r: CreateNetworkInterfaceResponse = self.call(ACTION, &p).await?;
        Ok(r.network_interface)
    }

    /// Returns the attachment id.
    pub async fn attach_network_interface(
        &self,
        eni_id: &str,
        instance_id: &str,
        device_index: u32,
        network_card_index: u32,
    ) -> Result<String, Ec2Error> {
        const ACTION: &str = "AttachNetworkInterface";
        let p = vec![
            ("NetworkInterfaceId".into(), eni_id.into()),
            ("InstanceId".into(), instance_id.into()),
            ("DeviceIndex".into(), device_index.to_string()),
            ("NetworkCardIndex".into(), network_card_index.to_string()),
        ];
        let r: AttachNetworkInterfaceResponse = self.call(ACTION, &p).await?;
        Ok(r.attachment_id)
    }

    /// Marks the attachment delete-on-termination, so the ENI goes with the
    /// instance instead of leaking when the node is terminated.
    pub async fn set_delete_on_termination(
        &self,
        eni_id: &str,
        attachment_id: &str,
    ) -> Result<(), Ec2Error> {
        const ACTION: &str = "ModifyNetworkInterfaceAttribute";
        let p = vec![
            ("NetworkInterfaceId".into(), eni_id.into()),
            ("Attachment.AttachmentId".into(), attachment_id.into()),
            ("Attachment.DeleteOnTermination".into(), "true".into()),
        ];
        self.query.call(ACTION, &p).await.map(drop)
    }

    pub async fn detach_network_interface(&self, attachment_id: &str) -> Result<(), Ec2Error> {
        const ACTION: &str = "DetachNetworkInterface";
        let p = vec![("AttachmentId".into(), attachment_id.into())];
        self.query.call(ACTION, &p).await.map(drop)
    }

    pub async fn delete_network_interface(&self, eni_id: &str) -> Result<(), Ec2Error> {
        const ACTION: &str = "DeleteNetworkInterface";
        let p = vec![("NetworkInterfaceId".into(), eni_id.into())];
        self.query.call(ACTION, &p).await.map(drop)
    }

    /// Assign{PrivateIp,Ipv6}Addresses with a count: EC2 picks the
    /// addresses (IPv6: from the subnet's block).
    pub async fn assign_addresses(
        &self,
        family: Family,
        eni_id: &str,
        count: usize,
    ) -> Result<(), Ec2Error> {
        let v = verbs(family);
        let p = vec![
            ("NetworkInterfaceId".into(), eni_id.into()),
            (v.count.into(), count.to_string()),
        ];
        self.query.call(v.assign, &p).await.map(drop)
    }

    /// Unassign{PrivateIp,Ipv6}Addresses of exactly `ips`.
    pub async fn unassign_addresses(
        &self,
        family: Family,
        eni_id: &str,
        ips: &[String],
    ) -> Result<(), Ec2Error> {
        let v = verbs(family);
        let mut p = vec![("NetworkInterfaceId".to_string(), eni_id.to_string())];
        for (i, ip) in ips.iter().enumerate() {
            p.push((format!("{}.{}", v.each, i + 1), ip.clone()));
        }
        self.query.call(v.unassign, &p).await.map(drop)
    }

    /// DescribeSubnets of `ids` (one call): the subnets that exist.
    pub async fn describe_subnets(&self, ids: &[&str]) -> Result<Vec<Subnet>, Ec2Error> {
        let p: Vec<(String, String)> = ids
            .iter()
            .enumerate()
            .map(|(i, id)| (format!("SubnetId.{}", i + 1), id.to_string()))
            .collect();
        let r: DescribeSubnetsResponse = self.call("DescribeSubnets", &p).await?;
        Ok(r.subnet_set.item)
    }

    /// What `instance_type` allows: interfaces on network card 0 (where
    /// enim attaches, the primary included) and addresses per interface.
    pub async fn instance_limits(&self, instance_type: &str) -> Result<AddressLimits, Ec2Error> {
        const ACTION: &str = "DescribeInstanceTypes";
        let p = vec![("InstanceType.1".into(), instance_type.into())];
        let r: DescribeInstanceTypesResponse = self.call(ACTION, &p).await?;
        let info = r
            .instance_type_set
            .item
            .into_iter()
            .find(|t| t.instance_type == instance_type)
            .ok_or_else(|| Ec2Error::Decode {
                action: ACTION.into(),
                detail: format!("no instance type {instance_type} in the reply"),
            })?;
        let net = &info.network_info;
        // Multi-card instances split the total between cards.
        let card0 = net
            .network_cards
            .item
            .iter()
            .find(|c| c.network_card_index == 0)
            .map(|c| c.maximum_network_interfaces);
        Ok(AddressLimits {
            enis: card0.unwrap_or(net.maximum_network_interfaces) as usize,
            ipv4_per_eni: net.ipv4_addresses_per_interface as usize,
            ipv6_per_eni: net.ipv6_addresses_per_interface as usize,
        })
    }
}

fn filter_params(filters: &[(&str, &[&str])]) -> Vec<(String, String)> {
    let mut p = Vec::new();
    for (i, (name, values)) in filters.iter().enumerate() {
        p.push((format!("Filter.{}.Name", i + 1), name.to_string()));
        for (j, v) in values.iter().enumerate() {
            p.push((format!("Filter.{}.Value.{}", i + 1, j + 1), v.to_string()));
        }
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_encode() {
        let p = filter_params(&[("tag:enim.io/node", &["i-1"]), ("status", &["a", "b"])]);
        assert_eq!(
            p,
            vec![
                ("Filter.1.Name".into(), "tag:enim.io/node".into()),
                ("Filter.1.Value.1".into(), "i-1".into()),
                ("Filter.2.Name".into(), "status".into()),
                ("Filter.2.Value.1".into(), "a".into()),
                ("Filter.2.Value.2".into(), "b".into()),
            ]
        );
    }
}
