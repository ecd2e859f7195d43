//! What a cloud must offer for enim's warm pool (`provider/pool`) to keep
//! ENIs attached ahead of demand. Each cloud crate (`provider/aws`,
//! `provider/bce`) implements [`CloudBackend`]; the pool implements
//! [`crate::EniProvider`] on top of it, so pods never wait on a cloud call
//! while the pool has a free ENI.

use async_trait::async_trait;

use std::net::IpAddr;

use crate::{AddressLimits, Eni, ProviderError};

/// An ENI enim created for this node, found by its tags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaggedEni {
    pub id: String,
    /// Attached to this instance right now.
    pub attached: bool,
}

#[async_trait]
pub trait CloudBackend: Send + Sync {
    /// "aws", "bce".
    fn name(&self) -> &str;

    /// The secondary ENIs attached to this instance and visible in instance
    /// metadata, with their addresses (owner always `None`). The
    /// instance's primary interface is never listed.
    async fn attached(&self) -> Result<Vec<Eni>, ProviderError>;

    /// ENIs enim created for this node (by tag), attached or not, so a
    /// restarted agent finds what it made and never leaks it.
    async fn tagged(&self) -> Result<Vec<TaggedEni>, ProviderError>;

    /// How many ENIs this instance may have attached, the primary included.
    async fn eni_limit(&self) -> Result<usize, ProviderError>;

    /// Creates an ENI tagged for this node, attaches it, and returns it once
    /// instance metadata shows it (retrying while metadata lags).
    async fn create_and_attach(&self) -> Result<Eni, ProviderError>;

    /// Attaches an ENI enim created earlier that is not attached (found by
    /// `tagged` after a crash) and returns it once metadata shows it.
    async fn attach_existing(&self, eni_id: &str) -> Result<Eni, ProviderError>;

    /// Detaches (waiting until detached) and deletes an ENI enim created.
    async fn detach_and_delete(&self, eni_id: &str) -> Result<(), ProviderError>;

    // Secondary mode: addresses on the attached ENIs (see
    // [`crate::SecondaryIps`], which the pool serves with these).

    /// The instance type's per-ENI address limits and ENI limit.
    async fn address_limits(&self) -> Result<AddressLimits, ProviderError>;

    /// Assigns new secondary addresses to an attached ENI; returns them.
    async fn assign_addresses(
        &self,
        eni_id: &str,
        ipv4: usize,
        ipv6: usize,
    ) -> Result<Vec<IpAddr>, ProviderError>;

    /// Unassigns addresses; those already unassigned count as done.
    async fn unassign_addresses(&self, eni_id: &str, ips: &[IpAddr]) -> Result<(), ProviderError>;
}
