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

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use async_trait::async_trait;
use ipnet::{Ipv4Net, Ipv6Net};

use crate::cloud::{CreatedAt, Reaped};
use crate::{AddressLimits, Eni, MacAddr, ProviderError};

/// The client token of the operator's intent that created an ENI.
pub const TAG_INTENT: &str = "enim.io/intent";

/// [`FleetAttachment::state`] of an attachment being taken down.
pub const DETACHING: &str = "detaching";

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
    pub created_at: CreatedAt,
}

impl FleetEni {
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
}

#[async_trait]
pub trait FleetCloud: Send + Sync {
    /// "aws", "bce", "static".
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

    /// Attaches `eni_id` to `instance` at `device_index`. Succeeds when it
    /// is already attached there.
    async fn attach(
        &self,
        eni_id: &str,
        instance: &str,
        device_index: u32,
    ) -> Result<(), ProviderError>;

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

    /// Deletes `eni_id` if it still carries this cluster's tag and is
    /// attached nowhere; [`Reaped::Gone`] when it is already gone. After
    /// [`Self::start_detach`], call it once a listing shows the ENI
    /// attached nowhere.
    async fn delete(&self, eni_id: &str) -> Result<Reaped, ProviderError>;

    /// Assigns new secondary addresses to `eni_id` and returns them.
    async fn assign_addresses(
        &self,
        eni_id: &str,
        ipv4: usize,
        ipv6: usize,
    ) -> Result<Vec<IpAddr>, ProviderError>;

    /// Unassigns addresses; those already unassigned count as done.
    async fn unassign_addresses(&self, eni_id: &str, ips: &[IpAddr]) -> Result<(), ProviderError>;
}
