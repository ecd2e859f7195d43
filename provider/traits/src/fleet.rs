//! What a cloud must offer the operator (`enim-operator`), which calls it
//! for the whole cluster from one place, so that nodes hold no cloud
//! credentials.
//!
//! Unlike [`crate::cloud::CloudBackend`], which is bound to the one
//! instance its agent runs on and learns attachments from instance
//! metadata, a [`FleetCloud`] names the instance in every call and learns
//! everything from one batched listing of the cluster's ENIs by tag: one
//! describe per resync for the whole cluster, not one per node.
//!
//! Crash safety: the operator records an intent (with a client token) in
//! the node's NetResourceSet before it creates; [`FleetCloud::create`]
//! carries the token as the cloud's idempotency token where the cloud has
//! one, and as the ENI's [`TAG_INTENT`] tag everywhere, so the listing
//! shows which intent made which ENI and a successor finishes the intent
//! instead of creating a second ENI.
//!
//! Lookups: the operator hands each verb what it already knows (the ENI as
//! its listing or its create showed it, whether a token was ever sent,
//! whether it detached the ENI itself), so a cloud spends a by-id describe
//! only where the cloud's own refusal cannot stand in for it: see
//! [`CreateEni::fresh`], [`FleetCloud::attach`] and [`DeleteCheck`].

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use async_trait::async_trait;
use ipnet::{Ipv4Net, Ipv6Net};

use crate::cloud::{CreatedAt, Reaped};
use enim_core::{AddressCount, AddressLimits, Eni, MacAddr, ProviderError};

/// The client token of the operator's intent that created an ENI.
pub const TAG_INTENT: &str = "enim.io/intent";

/// [`FleetAttachment::state`] of an attachment being taken down.
pub const DETACHING: &str = "detaching";

/// A subnet's blocks, as ENIs in it are addressed: what instance metadata
/// tells a node, a fleet asks the cloud's subnet API (and keeps: a subnet
/// does not change its blocks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubnetBlocks {
    pub v4: Ipv4Net,
    pub v6: Option<Ipv6Net>,
}

impl SubnetBlocks {
    /// The blocks written `v4` and `v6`; `Err` is the text that is not a
    /// block.
    pub fn parse<'a>(v4: &'a str, v6: Option<&'a str>) -> Result<SubnetBlocks, &'a str> {
        Ok(SubnetBlocks {
            v4: v4.parse().map_err(|_| v4)?,
            v6: match v6 {
                None => None,
                Some(b) => Some(b.parse().map_err(|_| b)?),
            },
        })
    }
}

/// Where [`FleetCloud::attach`] puts an ENI: an instance and the device
/// index the ENI takes there, one value so the two travel together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot<'a> {
    pub instance: &'a str,
    pub device_index: u32,
}

impl<'a> Slot<'a> {
    pub fn new(instance: &'a str, device_index: u32) -> Slot<'a> {
        Slot {
            instance,
            device_index,
        }
    }
}

impl fmt::Display for Slot<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at device index {}", self.instance, self.device_index)
    }
}

/// Where an ENI is attached, as the listing shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetAttachment {
    pub instance: String,
    pub device_index: u32,
    /// The cloud's attachment id, where it has one (EC2 `eni-attach-…`).
    pub attachment_id: String,
    /// "attaching", "attached", "detaching" (the cloud's word).
    pub state: String,
}

impl FleetAttachment {
    /// The instance and device index it holds.
    pub fn slot(&self) -> Slot<'_> {
        Slot::new(&self.instance, self.device_index)
    }

    /// Being detached: done at a later listing, nothing to ask again.
    pub fn detaching(&self) -> bool {
        self.state == DETACHING
    }
}

/// One ENI of this cluster, as one listing shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetEni {
    pub id: String,
    pub mac: MacAddr,
    /// Primary IPv4 address with the subnet's prefix length.
    pub ipv4: Ipv4Net,
    pub gateway4: Ipv4Addr,
    pub ipv6: Option<Ipv6Net>,
    pub gateway6: Option<Ipv6Addr>,
    pub subnet: String,
    pub security_groups: Vec<String>,
    /// Its secondary addresses (never its primary).
    pub secondary_ips: Vec<IpAddr>,
    pub attachment: Option<FleetAttachment>,
    /// The instance it was made for (the `enim.io/node` tag).
    pub node: Option<String>,
    /// The [`TAG_INTENT`] tag: the client token of the create that made it.
    pub intent: Option<String>,
    /// The cluster it is marked for ([`crate::cloud::TAG_CLUSTER`]), as the
    /// listing or the create saw it: [`FleetCloud::attach`] refuses an ENI
    /// not marked for its cluster without asking the cloud again.
    pub cluster: Option<String>,
    pub created_at: CreatedAt,
}

impl FleetEni {
    /// The listed attachment a detach can name directly: one with the
    /// cloud's attachment id, never the instance's primary (index 0).
    /// `None`: the ENI must be looked at before any detach.
    pub fn detachable_attachment(&self) -> Option<&FleetAttachment> {
        self.attachment
            .as_ref()
            .filter(|a| a.device_index != 0 && !a.attachment_id.is_empty())
    }

    /// An ENI of `subnet` addressed as `eni` says (its MTU, owner and
    /// device index aside), neither attached nor marked: each cloud fills
    /// in the rest from its listing, so the addressing is read one way.
    pub fn addressed(eni: Eni, subnet: String, security_groups: Vec<String>) -> FleetEni {
        FleetEni {
            id: eni.id,
            mac: eni.mac,
            ipv4: eni.ipv4,
            gateway4: eni.gateway4,
            ipv6: eni.ipv6,
            gateway6: eni.gateway6,
            subnet,
            security_groups,
            secondary_ips: eni.secondary_ips,
            attachment: None,
            node: None,
            intent: None,
            cluster: None,
            created_at: CreatedAt::Missing,
        }
    }
}

/// A create the operator asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateEni {
    /// The instance the ENI is for (tagged; not attached by `create`).
    pub instance: String,
    pub subnet: String,
    pub security_groups: Vec<String>,
    /// Idempotency token and [`TAG_INTENT`] tag.
    pub client_token: String,
    /// Secondary IPv4 addresses to create it with (secondary mode).
    pub secondary_ipv4: usize,
    /// This process generated `client_token` and has never sent it (a
    /// new intent, created right after it was written): no ENI can carry
    /// it yet, so a cloud need not look for one first. `false` for an
    /// intent found in a spec (after a restart or a change of leader) and
    /// for every retry (after an error or a timeout, the first send may
    /// have made one): the cloud looks for the intent's ENI before it
    /// creates. The idempotency token is sent either way.
    pub fresh: bool,
}

/// How [`FleetCloud::delete`] makes sure it deletes only what it should.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteCheck {
    /// The operator's own leaving ENI (drained by it, released by the
    /// agent, detached by it: the operator's `Reclaim` and `ReleaseNode`
    /// tasks) that the latest listing showed this cluster's and attached
    /// nowhere. Deleted without another look: nobody else had a reason to
    /// touch it since, and the one change that matters, an attach
    /// meanwhile, the cloud refuses to delete over (EC2
    /// `InvalidNetworkInterface.InUse`, BCE a conflict), which is
    /// [`Reaped::Spared`]; gone is [`Reaped::Gone`].
    Listed,
    /// A leak (an ENI of this cluster claimed by no node) or an ENI the
    /// latest listing no longer shows: another party may have retagged or
    /// reused it, and the cloud's delete checks no tags. Looked at again
    /// first ("the second look"): deleted only if still this cluster's and
    /// attached nowhere.
    SecondLook,
}

#[async_trait]
pub trait FleetCloud: Send + Sync {
    /// The provider of the instances this cloud serves, as a node's
    /// providerID names it: "aws", "bce", "static". The operator serves
    /// only nodes whose providerID names that provider.
    fn name(&self) -> &str;

    /// Every ENI tagged for this cluster, attached or not, in one batched
    /// listing (paged as the cloud pages).
    async fn list_cluster_enis(&self) -> Result<Vec<FleetEni>, ProviderError>;

    /// Per-ENI address limits and the ENI limit of an instance type
    /// (cached: instance types do not change).
    async fn limits(&self, instance_type: &str) -> Result<AddressLimits, ProviderError>;

    /// Creates an ENI tagged for the cluster, `req.instance` and the
    /// intent. Idempotent by `req.client_token`: a second call with the
    /// same token returns the ENI the first made.
    async fn create(&self, req: &CreateEni) -> Result<FleetEni, ProviderError>;

    /// Attaches `eni` at `at` (an instance's device index). Succeeds when
    /// it is already attached there.
    ///
    /// `eni` is the ENI as this cloud's [`Self::create`] returned it or its
    /// [`Self::list_cluster_enis`] showed it. One not marked for this
    /// cluster ([`FleetEni::cluster`]) is refused without a call. One shown
    /// attached nowhere is attached at once, with no look first: the cloud
    /// refuses to attach an ENI in use, and only on a refusal is it looked
    /// at (once) to tell "attached there already" (a retry whose first try
    /// went through: success) from a real error.
    async fn attach(&self, eni: &FleetEni, at: Slot<'_>) -> Result<(), ProviderError>;

    /// Asks the cloud to detach `eni` and returns without waiting for the
    /// detach to finish: the operator learns that from a later listing
    /// (the ENI "detaching", then attached nowhere) and deletes it only
    /// then, so no by-id describe is spent polling. Succeeds when it is
    /// attached nowhere, already detaching, or gone.
    ///
    /// `eni` is the ENI as this cloud's [`Self::list_cluster_enis`] showed
    /// it (so it carries this cluster's tag); a cloud may detach by the
    /// listed attachment (EC2: its attachment id, refused by EC2 once that
    /// attachment is over) instead of looking the ENI up again. An
    /// instance's primary interface is never detached.
    async fn start_detach(&self, eni: &FleetEni) -> Result<(), ProviderError>;

    /// Deletes `eni_id` if it is attached nowhere and, with
    /// [`DeleteCheck::SecondLook`], still carries this cluster's tag;
    /// [`Reaped::Gone`] when it is already gone, [`Reaped::Spared`] when it
    /// is in use (or, looked at, not this cluster's). After
    /// [`Self::start_detach`], call it once a listing shows the ENI
    /// attached nowhere.
    ///
    /// The caller says which check: the operator knows which ENIs it
    /// detached itself ([`DeleteCheck::Listed`], the churn's every delete,
    /// no describe) and which it only found ([`DeleteCheck::SecondLook`]).
    async fn delete(&self, eni_id: &str, check: DeleteCheck) -> Result<Reaped, ProviderError>;

    /// Assigns `n` new secondary addresses to `eni_id`, an ENI of this
    /// cluster wherever it is attached; returns them.
    async fn assign(&self, eni_id: &str, n: AddressCount) -> Result<Vec<IpAddr>, ProviderError>;

    /// Unassigns `ips` of `eni_id`, an ENI of this cluster; those already
    /// unassigned count as done.
    async fn unassign(&self, eni_id: &str, ips: &[IpAddr]) -> Result<(), ProviderError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subnet_blocks_parse_or_name_the_bad_text() {
        let b = SubnetBlocks::parse("10.0.1.0/24", Some("2001:db8::/64")).unwrap();
        assert_eq!(b.v4, "10.0.1.0/24".parse::<Ipv4Net>().unwrap());
        assert_eq!(b.v6, Some("2001:db8::/64".parse().unwrap()));
        assert_eq!(SubnetBlocks::parse("10.0.1.0/24", None).unwrap().v6, None);
        assert_eq!(SubnetBlocks::parse("10.0.1/24", None), Err("10.0.1/24"));
        assert_eq!(SubnetBlocks::parse("10.0.1.0/24", Some("x")), Err("x"));
    }
}
