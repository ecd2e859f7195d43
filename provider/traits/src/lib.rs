//! The ENI provider traits (CCE's `ENIProvider`): the source of the ENIs
//! a node may hand to pods, and the arbiter of who holds which; and what a
//! cloud must offer the node's warm pool ([`cloud`]) and the operator
//! ([`fleet`]). The types they speak are `enim-core`'s.
//!
//! A provider must be safe under concurrent calls: two `allocate_next` calls
//! for different owners never return the same ENI, and `allocate_next` for an
//! owner that already holds an ENI returns that ENI again.

pub mod cloud;
pub mod fleet;
pub mod kept;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

use std::net::IpAddr;

use async_trait::async_trait;

use enim_core::{
    AddressCount, AddressLimits, Eni, EniOwner, PoolStatistics, ProviderError, StoredAddresses,
};

/// The ENI provider (CCE's ENIProvider: List / AllocateNextENI /
/// DeallocateENI).
#[async_trait]
pub trait EniProvider: Send + Sync {
    /// A short name for logs and status ("static", "aws", "bce").
    fn name(&self) -> &str;

    /// Every ENI this node may use, with its owner where assigned.
    async fn list(&self) -> Result<Vec<Eni>, ProviderError>;

    /// Assigns a free ENI to `owner`. Idempotent: an owner that already holds
    /// an ENI gets the same one back.
    async fn allocate_next(&self, owner: &EniOwner) -> Result<Eni, ProviderError>;

    /// Hands `owner` exactly the ENI `eni_id` (the DRA driver's claim named
    /// it): the held ENI again when `owner` holds it already,
    /// `OwnedByOther` when another attachment does, `UnknownEni` when this
    /// node has no such ENI to hand out. Providers that cannot say so
    /// refuse.
    async fn allocate_named(&self, eni_id: &str, owner: &EniOwner) -> Result<Eni, ProviderError> {
        let _ = owner;
        Err(ProviderError::Config(format!(
            "the {} provider cannot hand out a named ENI ({eni_id})",
            self.name()
        )))
    }

    /// Called by ADD before it takes any lock: when no ENI is free now but
    /// one is on its way, waits (a bounded time) until one is, so that
    /// [`allocate_next`] finds it rather than answering "try again later".
    /// Holds nothing; `allocate_next` may still find none. The default
    /// returns at once: what the provider has is all there is.
    ///
    /// [`allocate_next`]: EniProvider::allocate_next
    async fn wait_for_free(&self, _owner: &EniOwner) {}

    /// Frees the ENI `owner` holds. Succeeds when it holds none, and never
    /// frees an ENI held by a different owner.
    async fn release(&self, owner: &EniOwner) -> Result<(), ProviderError>;

    /// Re-establishes assignments known from the agent's checkpoint after a
    /// restart. Providers whose cloud remembers ownership may ignore it.
    async fn restore(&self, assignments: &[(String, EniOwner)]) -> Result<(), ProviderError>;

    /// Secondary mode on a cloud: the provider can assign and unassign
    /// secondary addresses and attach more ENIs, so the agent keeps a warm
    /// pool of addresses. `None` (the default): the addresses [`list`]
    /// shows are all there will be.
    ///
    /// [`list`]: EniProvider::list
    fn secondary_ips(&self) -> Option<&dyn SecondaryIps> {
        None
    }

    /// Secondary mode with addresses decided outside the agent (the
    /// cluster provider's NetResourceSet): the agent follows what [`list`]
    /// shows as it changes and reports what it holds. `None` (the
    /// default): addresses change only through [`secondary_ips`], if at all.
    ///
    /// [`list`]: EniProvider::list
    /// [`secondary_ips`]: EniProvider::secondary_ips
    fn address_feed(&self) -> Option<&dyn AddressFeed> {
        None
    }

    /// Warm-pool statistics, for providers that keep a pool.
    fn statistics(&self) -> Option<PoolStatistics> {
        None
    }

    /// Why the provider serves in a degraded way (e.g. its cloud API is
    /// unreachable and it hands out only what is attached); `None` when it
    /// serves normally.
    fn degraded(&self) -> Option<String> {
        None
    }

    /// The node leaves the cluster (enim is uninstalled, docs/install.md,
    /// "Uninstalling"): stops making ENIs and gives back to the cloud
    /// every ENI this provider made that no pod holds. Called once, with
    /// no pod attached, as the agent exits; the provider serves nothing
    /// after it. The default gives back nothing: a provider that made no
    /// ENI (static) or whose ENIs another party released (the operator's,
    /// through the cluster provider) has none of its own.
    async fn release_unused(&self) -> Released {
        Released::default()
    }
}

/// What [`EniProvider::release_unused`] gave back to the cloud.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Released {
    /// Detached (where attached) and deleted.
    pub deleted: Vec<String>,
    /// Kept: a pod holds it, or it is not enim's to delete.
    pub kept: Vec<String>,
    /// Tried and failed, with why: left for the fleet's reaper (when the
    /// provider names a cluster) or for the user.
    pub failed: Vec<(String, String)>,
}

/// Secondary mode's cloud verbs (AWS `AssignPrivateIpAddresses` and
/// friends, BCE's private-IP batch add and delete). The agent's address
/// pool calls them from its own loop, never from a pod's ADD or DEL.
#[async_trait]
pub trait SecondaryIps: Send + Sync {
    /// The instance's per-ENI address limits (cached by the provider).
    async fn address_limits(&self) -> Result<AddressLimits, ProviderError>;

    /// Assigns `n` new secondary addresses to `eni_id` and returns
    /// them. Afterwards [`EniProvider::list`] shows them in the ENI's
    /// `secondary_ips`.
    async fn assign(&self, eni_id: &str, n: AddressCount) -> Result<Vec<IpAddr>, ProviderError>;

    /// Gives `ips` of `eni_id` back to the cloud. Idempotent: an address
    /// no longer assigned counts as given back.
    async fn unassign(&self, eni_id: &str, ips: &[IpAddr]) -> Result<(), ProviderError>;

    /// Creates and attaches one more ENI for the node's own use (its
    /// addresses are served to pods) and returns it once the instance
    /// shows it, with its device index.
    async fn attach_eni(&self) -> Result<Eni, ProviderError>;
}

/// Secondary mode's addresses from outside the agent. The agent re-reads
/// [`EniProvider::list`] whenever [`changes`](AddressFeed::changes) moves
/// and applies it to its address store: new addresses join free, free ones
/// no longer listed leave at once, held ones stay with their pods. It tells
/// the provider who holds what, so the provider can report it and knows
/// when an address it stopped listing can never be handed out again.
pub trait AddressFeed: Send + Sync {
    /// Moves whenever what `list` shows may have changed.
    fn changes(&self) -> tokio::sync::watch::Receiver<u64>;
    /// `owner` now holds `ips` of ENI `eni_id` (an ADD, or at start a
    /// record of the agent's checkpoint).
    fn held(&self, eni_id: &str, ips: &[IpAddr], owner: &EniOwner);
    /// `owner` holds no address any more.
    fn freed(&self, owner: &EniOwner);
    /// The agent's store after it applied a listing, or freed an address:
    /// an address not in it is handed out only if a later listing shows it
    /// again.
    fn stored(&self, store: StoredAddresses);
}
