//! The ENI provider API (CCE's `ENIProvider`): the source of the ENIs a
//! node may hand to pods, and the arbiter of who holds which.
//!
//! A provider must be safe under concurrent calls: two `allocate_next` calls
//! for different owners never return the same ENI, and `allocate_next` for an
//! owner that already holds an ENI returns that ENI again.

pub mod api_config;
pub mod atomic_file;
pub mod cloud;
pub mod config_keys;
pub mod fault;
pub mod fleet;
pub mod ratelimit;
pub mod retry;
pub mod sync;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use async_trait::async_trait;
use ipnet::{Ipv4Net, Ipv6Net};
use serde::{Deserialize, Serialize};

/// A MAC address, kept in canonical lower-case `aa:bb:cc:dd:ee:ff` form.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    pub fn octets(&self) -> [u8; 6] {
        self.0
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid MAC address {0:?}: expected six hex octets separated by ':' or '-'")]
pub struct MacParseError(pub String);

impl std::str::FromStr for MacAddr {
    type Err = MacParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || MacParseError(s.to_string());
        let mut out = [0u8; 6];
        let mut parts = s.split([':', '-']);
        for octet in out.iter_mut() {
            let part = parts.next().ok_or_else(err)?;
            // Two hex digits: from_str_radix alone would take "+a".
            if part.len() != 2 || !part.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(err());
            }
            *octet = u8::from_str_radix(part, 16).map_err(|_| err())?;
        }
        if parts.next().is_some() {
            return Err(err());
        }
        Ok(MacAddr(out))
    }
}

impl Serialize for MacAddr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for MacAddr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A secret (an API key): (de)serialized as the plain string, shown by
/// `Debug` as `"<redacted>"`, so a logged config never shows it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl From<String> for Secret {
    fn from(s: String) -> Self {
        Secret(s)
    }
}

impl From<&str> for Secret {
    fn from(s: &str) -> Self {
        Secret(s.to_string())
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt("<redacted>", f)
    }
}

/// The Kubernetes pod an attachment belongs to, as the runtime told us in
/// CNI_ARGS. Informational: identity is the [`EniOwner::key`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PodRef {
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

impl fmt::Display for PodRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() && self.name.is_empty() {
            f.write_str("-")
        } else {
            write!(f, "{}/{}", self.namespace, self.name)
        }
    }
}

/// Who holds an ENI: a pod plus the CNI attachment (network name, container
/// id, interface name) it was allocated for.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct EniOwner {
    pub network: String,
    pub container_id: String,
    pub ifname: String,
    #[serde(default)]
    pub pod: PodRef,
}

impl EniOwner {
    /// The identity of an owner: two owners with the same key are the same
    /// attachment, whatever pod metadata came along.
    pub fn key(&self) -> (&str, &str, &str) {
        (&self.network, &self.container_id, &self.ifname)
    }

    pub fn same_attachment(&self, other: &EniOwner) -> bool {
        self.key() == other.key()
    }
}

impl fmt::Display for EniOwner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({}:{}:{})",
            self.pod, self.network, self.container_id, self.ifname
        )
    }
}

/// One ENI this node may use, as the provider sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Eni {
    pub id: String,
    pub mac: MacAddr,
    /// Primary IPv4 address with the subnet prefix length.
    pub ipv4: Ipv4Net,
    pub gateway4: Ipv4Addr,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<Ipv6Net>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway6: Option<Ipv6Addr>,
    /// MTU the pod interface gets; `None` keeps the device's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<EniOwner>,
    /// The ENI's device index on the instance (secondary mode numbers its
    /// route table from it); `None` when the provider does not know it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_index: Option<u32>,
    /// Secondary mode: the ENI's secondary private addresses (IPv4 and
    /// IPv6), handed to pods one each. Never the ENI's own addresses.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secondary_ips: Vec<IpAddr>,
    /// Where the ENI lives and which groups guard it, as far as the
    /// provider knows; the DRA driver publishes it as device attributes.
    #[serde(default, skip_serializing_if = "Placement::is_empty")]
    pub placement: Placement,
}

/// An ENI's subnet, zone, security groups and network card. Every field is
/// optional: a static inventory may say nothing, a cloud listing says all.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Placement {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subnet: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub security_groups: Vec<String>,
    /// The network card the ENI is attached through (EC2's NetworkCardIndex).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_card: Option<u32>,
}

impl Placement {
    pub fn is_empty(&self) -> bool {
        *self == Placement::default()
    }
}

/// Provider failures. `is_transient` tells the caller whether a retry may
/// succeed (CNI code 11) or not.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    #[error("no free ENI: all {total} ENIs of this node are in use")]
    Exhausted { total: usize },
    #[error("ENI {eni_id} is held by {holder}, not by {requester}")]
    OwnedByOther {
        eni_id: String,
        holder: String,
        requester: String,
    },
    #[error("unknown ENI {0}")]
    UnknownEni(String),
    #[error("provider configuration: {0}")]
    Config(String),
    #[error("provider temporarily unavailable: {0}")]
    Unavailable(String),
    #[error("provider request throttled: {0}")]
    Throttled(String),
}

impl ProviderError {
    /// A transient error is worth retrying later; a permanent one is not.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            ProviderError::Unavailable(_) | ProviderError::Throttled(_)
        )
    }
}

/// Config validation: `Err("{upper} (..) must be >= {lower} (..)")`, with
/// both values, when the value named `upper` is below the one named `lower`.
pub fn check_at_least<T: PartialOrd + fmt::Debug>(
    (upper, upper_value): (&str, T),
    (lower, lower_value): (&str, T),
) -> Result<(), String> {
    if upper_value < lower_value {
        return Err(format!(
            "{upper} ({upper_value:?}) must be >= {lower} ({lower_value:?})"
        ));
    }
    Ok(())
}

/// The longest an ADD may wait for an ENI or address on its way (the
/// pools' `allocate_wait`): the rest of the ADD must fit in the plugin's
/// default 30 s timeout (`timeoutSeconds`).
pub const MAX_ALLOCATE_WAIT: std::time::Duration = std::time::Duration::from_secs(25);

/// Checks a pool's `allocate_wait` against [`MAX_ALLOCATE_WAIT`].
pub fn check_allocate_wait(wait: std::time::Duration) -> Result<(), String> {
    if wait > MAX_ALLOCATE_WAIT {
        return Err(format!(
            "allocate_wait ({wait:?}) must be at most {MAX_ALLOCATE_WAIT:?}: the rest of an ADD must fit in the plugin's 30 s timeout"
        ));
    }
    Ok(())
}

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
}

/// How many addresses one ENI may carry on this instance, its own primary
/// address included (EC2 `DescribeInstanceTypes`:
/// `Ipv4AddressesPerInterface`, `Ipv6AddressesPerInterface`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddressLimits {
    pub ipv4_per_eni: usize,
    pub ipv6_per_eni: usize,
    /// ENIs the instance may have attached, its primary interface included.
    pub enis: usize,
}

/// [`AddressLimits`] as an operator's config states them: unknown keys
/// are refused here (the type itself is read leniently where it is data).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// ENIs the instance may have attached, its primary interface included.
    pub enis: usize,
    /// Addresses per ENI, its own included.
    pub ipv4_per_eni: usize,
    #[serde(default)]
    pub ipv6_per_eni: usize,
}

impl From<LimitsConfig> for AddressLimits {
    fn from(c: LimitsConfig) -> Self {
        AddressLimits {
            ipv4_per_eni: c.ipv4_per_eni,
            ipv6_per_eni: c.ipv6_per_eni,
            enis: c.enis,
        }
    }
}

impl AddressLimits {
    /// Secondary IPv4 addresses one ENI may carry (its primary excluded).
    pub fn secondary_ipv4_per_eni(&self) -> usize {
        self.ipv4_per_eni.saturating_sub(1)
    }
}

/// Secondary mode's cloud verbs (AWS `AssignPrivateIpAddresses` and
/// friends, BCE's private-IP batch add and delete). The agent's address
/// pool calls them from its own loop, never from a pod's ADD or DEL.
#[async_trait]
pub trait SecondaryIps: Send + Sync {
    /// The instance's per-ENI address limits (cached by the provider).
    async fn address_limits(&self) -> Result<AddressLimits, ProviderError>;

    /// Assigns `ipv4` new secondary IPv4 and `ipv6` new IPv6 addresses to
    /// `eni_id` and returns them. Afterwards [`EniProvider::list`] shows
    /// them in the ENI's `secondary_ips`.
    async fn assign(
        &self,
        eni_id: &str,
        ipv4: usize,
        ipv6: usize,
    ) -> Result<Vec<IpAddr>, ProviderError>;

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

/// What the agent's secondary-mode address store holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredAddresses {
    /// The host ENIs it serves from (set up in the kernel).
    pub enis: Vec<String>,
    /// Every address it may hand out or has handed out.
    pub addresses: Vec<IpAddr>,
}

/// The network names of the owners under which the agent holds ENIs for
/// itself rather than for a pod (src/support/exclusion.rs: reservations).
pub mod reserved {
    /// Excluded by config, or the node's primary interface.
    pub const EXCLUDED_NETWORK: &str = "enim.io/excluded";
    /// Quarantined: the ENI's device is not in the host.
    pub const MISSING_NETWORK: &str = "enim.io/missing";
}

/// A warm pool's state in cilium's and CCE's IPAM terms: ENIs in use, free, still to
/// pre-allocate, and above the high watermark.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolStatistics {
    pub used: usize,
    pub available: usize,
    pub needed: usize,
    pub excess: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mac_round_trip_and_rejects() {
        let m: MacAddr = "02:AB:cd:00:11:ff".parse().unwrap();
        assert_eq!(m.to_string(), "02:ab:cd:00:11:ff");
        assert_eq!("02-ab-cd-00-11-ff".parse::<MacAddr>().unwrap(), m);
        for bad in [
            "",
            "02:ab:cd:00:11",
            "02:ab:cd:00:11:ff:00",
            "0g:ab:cd:00:11:ff",
            "2:ab:cd:00:11:ff0",
        ] {
            assert!(bad.parse::<MacAddr>().is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn transient_errors_are_told_apart() {
        assert!(ProviderError::Throttled("x".into()).is_transient());
        assert!(ProviderError::Unavailable("x".into()).is_transient());
        assert!(!ProviderError::Exhausted { total: 3 }.is_transient());
        assert!(!ProviderError::UnknownEni("e".into()).is_transient());
    }
}
