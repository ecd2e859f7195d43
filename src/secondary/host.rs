//! The node's side of secondary mode, shared by the driver (pods' verbs)
//! and the warm address pool (its own loop): the host ENIs, set up in the
//! kernel, and the [`DataStore`] of their addresses.

use std::collections::{BTreeMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, MutexGuard, RwLock};

use enim_core::{Eni, MacAddr, ProviderError, StoredAddresses};
use enim_provider::EniProvider;
use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use super::datastore::{DataStore, DataStoreError};
use super::plumbing::{HostEniSpec, SecondaryPlumbing};
use super::{SecondaryConfig, MAX_DEVICE_INDEX};
use crate::engine::EngineError;
use crate::netlink::{PlumbingError, Refusal};
use crate::support::exclusion::{Exclusions, LiveExclusions};

/// A host ENI in use by this node.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct HostEni {
    pub id: String,
    pub mac: MacAddr,
    pub device_index: u32,
    pub name: String,
    pub table: u32,
    pub mtu: u32,
    /// It has an IPv6 address and gateway: it can serve IPv6 pods.
    pub ipv6: bool,
    /// Its own IPv4 address in its subnet, and the subnet's router: pods'
    /// IPv4 addresses must be other host addresses of that subnet.
    pub ipv4: Ipv4Net,
    pub gateway4: Ipv4Addr,
    /// The same for IPv6, when it serves IPv6 pods.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ipv6_subnet: Option<Ipv6Net>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gateway6: Option<Ipv6Addr>,
}

/// Why a pod may not have an address on a host ENI. The address becomes a
/// /32 or /128 route towards the pod in the host, so one that is not a
/// plain host address of the ENI's subnet would capture the traffic of
/// whatever really has it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnusableAddress {
    #[error(
        "{0} is not a unicast address a pod can hold (unspecified, loopback, link-local, \
         multicast, broadcast or IPv4-mapped)"
    )]
    NotUnicast(IpAddr),
    #[error("{0} is a cloud service address (instance metadata, DNS, time)")]
    CloudService(IpAddr),
    #[error("{0} is IPv6 and the ENI has no IPv6 subnet and gateway")]
    NoIpv6(IpAddr),
    #[error("{ip} is outside the ENI's subnet {subnet}")]
    OutsideSubnet { ip: IpAddr, subnet: IpNet },
    #[error("{ip} is the subnet {subnet}'s own network or broadcast address")]
    SubnetAddress { ip: IpAddr, subnet: IpNet },
    #[error("{0} is the ENI's own address")]
    EniOwn(IpAddr),
    #[error("{0} is the subnet's gateway")]
    Gateway(IpAddr),
}

/// Whether `ip` is in fd00:ec2::/32, the range AWS keeps for the instance
/// metadata service, its DNS resolver and its time service over IPv6
/// (fd00:ec2::254, ::253, ::123). Over IPv4 they are link-local, refused
/// as such.
fn is_cloud_service(ip: &Ipv6Addr) -> bool {
    ip.segments()[..2] == [0xfd00, 0x0ec2]
}

impl HostEni {
    /// Whether a pod may have `ip` on this ENI (see [`HostEni::check_address`]).
    pub fn usable(&self, ip: &IpAddr) -> bool {
        self.check_address(ip).is_ok()
    }

    /// A pod may have `ip` on this ENI when it is a host address of the
    /// ENI's subnet (IPv4, or IPv6 when the ENI serves it) other than the
    /// subnet's own, the ENI's own and the router's, and no special-purpose
    /// or cloud service address (a cloud, an emulator of one, or a spec
    /// written by hand could name any of them).
    pub fn check_address(&self, ip: &IpAddr) -> Result<(), UnusableAddress> {
        match ip {
            IpAddr::V4(v4) => {
                if v4.is_unspecified()
                    || v4.is_loopback()
                    || v4.is_link_local()
                    || v4.is_multicast()
                    || v4.is_broadcast()
                {
                    return Err(UnusableAddress::NotUnicast(*ip));
                }
                let net = self.ipv4.trunc();
                let subnet = IpNet::V4(net);
                if !net.contains(v4) {
                    return Err(UnusableAddress::OutsideSubnet { ip: *ip, subnet });
                }
                if *v4 == net.network() || *v4 == net.broadcast() {
                    return Err(UnusableAddress::SubnetAddress { ip: *ip, subnet });
                }
                if *v4 == self.ipv4.addr() {
                    return Err(UnusableAddress::EniOwn(*ip));
                }
                if *v4 == self.gateway4 {
                    return Err(UnusableAddress::Gateway(*ip));
                }
            }
            IpAddr::V6(v6) => {
                if v6.is_unspecified()
                    || v6.is_loopback()
                    || v6.is_unicast_link_local()
                    || v6.is_multicast()
                    || v6.to_ipv4_mapped().is_some()
                {
                    return Err(UnusableAddress::NotUnicast(*ip));
                }
                if is_cloud_service(v6) {
                    return Err(UnusableAddress::CloudService(*ip));
                }
                let (Some(own), Some(gateway), true) = (self.ipv6_subnet, self.gateway6, self.ipv6)
                else {
                    return Err(UnusableAddress::NoIpv6(*ip));
                };
                let net = own.trunc();
                let subnet = IpNet::V6(net);
                if !net.contains(v6) {
                    return Err(UnusableAddress::OutsideSubnet { ip: *ip, subnet });
                }
                // The subnet-router anycast address (RFC 4291, 2.6.1).
                if *v6 == net.network() {
                    return Err(UnusableAddress::SubnetAddress { ip: *ip, subnet });
                }
                if *v6 == own.addr() {
                    return Err(UnusableAddress::EniOwn(*ip));
                }
                if *v6 == gateway {
                    return Err(UnusableAddress::Gateway(*ip));
                }
            }
        }
        Ok(())
    }
}

pub struct HostEnis {
    pub(super) config: SecondaryConfig,
    pub(super) provider: Arc<dyn EniProvider>,
    pub(super) plumbing: Arc<dyn SecondaryPlumbing>,
    store: std::sync::Mutex<DataStore>,
    enis: RwLock<BTreeMap<String, HostEni>>,
    // ENIs and addresses never used; the primary interface joins them at
    // restore.
    exclusions: LiveExclusions,
    /// The own addresses of every ENI the provider listed last: never a
    /// pod's, whichever ENI shows them as secondary (EC2 never does so;
    /// an emulator may).
    own_addresses: RwLock<HashSet<IpAddr>>,
}

/// Why a listed ENI is not taken in as a host ENI, when that is not an
/// error of the whole node (it is logged and the others are served).
pub(super) enum Skipped {
    Excluded,
    NotPlugged(PlumbingError),
}

impl HostEnis {
    pub(super) fn new(
        config: SecondaryConfig,
        provider: Arc<dyn EniProvider>,
        plumbing: Arc<dyn SecondaryPlumbing>,
        exclusions: Exclusions,
    ) -> Self {
        HostEnis {
            store: std::sync::Mutex::new(DataStore::new(config.cooldown)),
            config,
            provider,
            plumbing,
            enis: Default::default(),
            exclusions: LiveExclusions::new(exclusions),
            own_addresses: Default::default(),
        }
    }

    pub(super) fn store(&self) -> MutexGuard<'_, DataStore> {
        // The store's methods leave it consistent at every return, so a
        // panic elsewhere while it was held does not make it unsound.
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The host ENIs in use.
    pub fn host_enis(&self) -> Vec<HostEni> {
        self.enis
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    pub(super) fn host_eni(&self, id: &str) -> Option<HostEni> {
        self.enis
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
    }

    pub(super) fn exclusions(&self) -> Exclusions {
        self.exclusions.snapshot()
    }

    /// Excludes `eni` from now on: its device is the node's own
    /// ([`crate::netlink::handout`]'s rule refused it). Logs the first time.
    pub(super) fn refuse(&self, eni: &Eni, device: &str, why: &Refusal) {
        let outcome = "never used as a host ENI; excluded";
        self.exclusions.refuse(eni, device, why, outcome);
    }

    /// Adds the primary interface to the exclusions (renaming the node's
    /// own interface would cut the node off) and returns them.
    pub(super) fn exclude_primary(&self, primary: Option<MacAddr>) -> Exclusions {
        self.exclusions.with_primary(primary)
    }

    /// Notes the own addresses of the ENIs the provider lists now.
    pub(super) fn note_listed(&self, listed: &[Eni]) {
        let own = listed
            .iter()
            .flat_map(|e| {
                std::iter::once(IpAddr::V4(e.ipv4.addr()))
                    .chain(e.ipv6.map(|n| IpAddr::V6(n.addr())))
            })
            .collect();
        *self
            .own_addresses
            .write()
            .unwrap_or_else(|p| p.into_inner()) = own;
    }

    /// Whether `ip` is some listed ENI's own address.
    pub(super) fn is_own_address(&self, ip: &IpAddr) -> bool {
        self.own_addresses
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .contains(ip)
    }

    /// Replaces the store and the host ENIs at once (restore).
    pub(super) fn replace(&self, store: DataStore, enis: BTreeMap<String, HostEni>) {
        *self.store() = store;
        *self.enis.write().unwrap_or_else(|p| p.into_inner()) = enis;
    }

    /// What the host side of `eni` should be.
    pub(super) fn eni_spec(&self, eni: &Eni, name: String, table: u32) -> HostEniSpec {
        HostEniSpec {
            mac: eni.mac,
            name,
            mtu: eni.mtu,
            table,
            ipv4: eni.ipv4,
            gateway4: eni.gateway4,
            ipv6: eni.ipv6.filter(|_| eni.gateway6.is_some()),
            gateway6: eni.gateway6,
        }
    }

    /// Sets `eni` up as a host ENI in the kernel and returns it with the
    /// addresses it offers pods. `Ok(Err(_))`: not used, for a reason that
    /// concerns this ENI only.
    pub(super) async fn prepare(
        &self,
        eni: &Eni,
        exclusions: &Exclusions,
    ) -> Result<Result<(HostEni, Vec<IpAddr>), Skipped>, EngineError> {
        if exclusions.is_excluded(eni) {
            return Ok(Err(Skipped::Excluded));
        }
        let index = eni.device_index.ok_or_else(|| {
            ProviderError::Config(format!(
                "secondary mode needs the device index of ENI {}; the provider does not know it",
                eni.id
            ))
        })?;
        if index > MAX_DEVICE_INDEX {
            return Err(ProviderError::Config(format!(
                "ENI {} has device index {index}; secondary mode allows 0..={MAX_DEVICE_INDEX}",
                eni.id
            ))
            .into());
        }
        let spec = self.eni_spec(eni, self.config.eni_name(index), self.config.table(index));
        let link = match self.plumbing.setup_eni(&spec).await {
            Ok(link) => link,
            Err(e @ PlumbingError::LinkNotFound { .. }) => return Ok(Err(Skipped::NotPlugged(e))),
            // The node's own device, whatever the list says: left as it
            // is, and excluded from now on.
            Err(PlumbingError::Refused { device, why, .. }) => {
                self.refuse(eni, &device, &why);
                return Ok(Err(Skipped::Excluded));
            }
            Err(e) => return Err(EngineError::plumbing("set up host ENI")(e)),
        };
        tracing::info!(eni = %eni.id, name = %spec.name, table = spec.table, "host ENI ready");
        let host = HostEni {
            id: eni.id.clone(),
            mac: eni.mac,
            device_index: index,
            name: spec.name,
            table: spec.table,
            mtu: link.mtu,
            ipv6: spec.ipv6.is_some(),
            ipv4: eni.ipv4,
            gateway4: eni.gateway4,
            ipv6_subnet: spec.ipv6,
            gateway6: spec.gateway6.filter(|_| spec.ipv6.is_some()),
        };
        let addresses = self.offered(eni, &host, exclusions);
        Ok(Ok((host, addresses)))
    }

    /// The secondary addresses of `eni` a pod may have: not excluded, and
    /// usable on it (see [`HostEni::usable`]).
    pub(super) fn offered(
        &self,
        eni: &Eni,
        host: &HostEni,
        exclusions: &Exclusions,
    ) -> Vec<IpAddr> {
        eni.secondary_ips
            .iter()
            .filter(|ip| !exclusions.is_excluded_address(ip))
            .filter(|ip| {
                let refused = match host.check_address(ip) {
                    Err(why) => Some(why),
                    // Another listed ENI's own address.
                    Ok(()) if self.is_own_address(ip) => Some(UnusableAddress::EniOwn(**ip)),
                    Ok(()) => None,
                };
                if let Some(why) = &refused {
                    tracing::warn!(eni = %eni.id, %ip, reason = %why, "secondary address no pod can use on this ENI; not handed out");
                }
                refused.is_none()
            })
            .copied()
            .collect()
    }

    /// Puts a prepared ENI and its addresses into `store` and `enis`.
    pub(super) fn take_in(
        store: &mut DataStore,
        enis: &mut BTreeMap<String, HostEni>,
        host: HostEni,
        addresses: &[IpAddr],
    ) -> Result<(), DataStoreError> {
        store.add_eni(&host.id, host.device_index)?;
        for ip in addresses {
            match store.add_address(&host.id, *ip) {
                Ok(()) => {}
                // The cloud shows it on two ENIs (no real cloud does; an
                // emulator may): served on the first only, not fatal.
                Err(DataStoreError::AddressAlreadyInStore(_)) => {
                    tracing::error!(eni = %host.id, %ip, "address shown on two ENIs; served on the first only");
                }
                Err(e) => return Err(e),
            }
        }
        enis.insert(host.id.clone(), host);
        Ok(())
    }

    /// Takes in one more ENI while serving (the warm pool attached it, or
    /// a check found it): prepared in the kernel, then joined to the store.
    pub(super) async fn add(&self, eni: &Eni) -> Result<bool, EngineError> {
        if self.host_eni(&eni.id).is_some() {
            return Ok(false);
        }
        let (host, addresses) = match self.prepare(eni, &self.exclusions()).await? {
            Ok(ready) => ready,
            Err(Skipped::Excluded) => return Ok(false),
            Err(Skipped::NotPlugged(e)) => {
                tracing::warn!(eni = %eni.id, error = %e, "ENI not in the host yet; taken in at a later check");
                return Ok(false);
            }
        };
        let mut store = self.store();
        let mut enis = self.enis.write().unwrap_or_else(|p| p.into_inner());
        Self::take_in(&mut store, &mut enis, host, &addresses)?;
        tracing::info!(eni = %eni.id, addresses = addresses.len(), "host ENI joined the address pool");
        Ok(true)
    }

    /// Takes in every listed ENI not serving yet. Returns how many could
    /// not be, excluded ones aside: their devices are not in the host yet.
    pub(super) async fn take_in_listed(&self, listed: &[Eni]) -> Result<usize, EngineError> {
        let mut pending = 0;
        for eni in listed {
            if self.host_eni(&eni.id).is_none() && !self.add(eni).await? {
                pending += usize::from(!self.exclusions().is_excluded(eni));
            }
        }
        Ok(pending)
    }

    /// Brings the store in line with the provider's listing: addresses
    /// assigned or unassigned from outside, ENIs gone (see
    /// [`DataStore::sync_eni_after`]; `checks`: misses in a row before a
    /// listing's silence counts).
    pub(super) fn sync_listed(&self, listed: &[Eni], checks: u8) -> Result<(), EngineError> {
        let exclusions = self.exclusions();
        for host in self.host_enis() {
            let shown = listed
                .iter()
                .find(|e| e.id == host.id)
                .map(|e| self.offered(e, &host, &exclusions))
                .unwrap_or_default();
            let out = self.store().sync_eni_after(&host.id, &shown, checks)?;
            if !out.added.is_empty() {
                tracing::info!(eni = %host.id, added = ?out.added, "addresses assigned from outside joined the pool");
            }
            if !out.removed.is_empty() {
                tracing::warn!(eni = %host.id, removed = ?out.removed, "free addresses unassigned from outside left the pool");
            }
            if !out.lost.is_empty() {
                tracing::error!(eni = %host.id, lost = ?out.lost, "addresses pods hold were unassigned from outside; kept for the pods, dropped when they go");
            }
            if !listed.iter().any(|e| e.id == host.id) && self.remove_if_unused(&host.id) {
                tracing::warn!(eni = %host.id, "host ENI gone from the provider; no longer used");
            }
        }
        Ok(())
    }

    /// Tells the provider's address feed, if it has one, what the store
    /// holds now.
    pub(super) fn report_stored(&self) {
        let Some(feed) = self.provider.address_feed() else {
            return;
        };
        let enis = self.host_enis().into_iter().map(|e| e.id).collect();
        let (addresses, cooling) = {
            let store = self.store();
            (store.addresses(), store.cooling(std::time::Instant::now()))
        };
        feed.stored(StoredAddresses {
            enis,
            addresses,
            cooling,
        });
    }

    /// Drops a host ENI the provider no longer lists once none of its
    /// addresses is held; `false` while a pod holds one.
    pub(super) fn remove_if_unused(&self, eni_id: &str) -> bool {
        let mut store = self.store();
        match store.remove_eni(eni_id, false) {
            Ok(()) | Err(DataStoreError::UnknownEni(_)) => {
                self.enis
                    .write()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(eni_id);
                true
            }
            Err(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::conformance::{mac, static_eni};
    use crate::secondary::fake::FakeSecondary;
    use enim_provider_static::StaticProvider;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// Static ENI 1 of the fixtures as a provider lists it: 10.0.1.10/24
    /// via 10.0.1.1, fd00:1::10/64 via fd00:1::1.
    fn listed_eni() -> Eni {
        let p = StaticProvider::new(vec![static_eni(1)]).unwrap();
        futures::executor::block_on(p.list()).unwrap().remove(0)
    }

    fn host_enis() -> HostEnis {
        let provider = Arc::new(StaticProvider::new(vec![static_eni(1)]).unwrap());
        let plumbing = Arc::new(FakeSecondary::with_enis(&[(mac(1), "eth1")]));
        HostEnis::new(
            SecondaryConfig::default(),
            provider,
            plumbing,
            Exclusions::default(),
        )
    }

    /// What a provider (the cluster provider's spec, a cloud, an emulator)
    /// may list as secondary addresses that no pod can have.
    const REFUSED_V6: [&str; 11] = [
        "fe80::1234",       // link-local
        "fd00:ec2::254",    // instance metadata
        "fd00:ec2::253",    // the cloud's DNS
        "fd00:1::1",        // the gateway
        "fd00:1::10",       // the ENI's own
        "fd00:1::",         // the subnet-router anycast
        "fd00:2::11",       // another subnet
        "ff02::1",          // multicast
        "::",               // unspecified
        "::1",              // loopback
        "::ffff:10.0.1.13", // IPv4-mapped
    ];

    #[tokio::test]
    async fn ipv6_addresses_no_pod_may_have_are_not_handed_out() {
        let mut eni = listed_eni();
        let good: Vec<IpAddr> = eni.secondary_ips.clone();
        eni.secondary_ips.extend(REFUSED_V6.iter().map(|s| ip(s)));
        eni.secondary_ips
            .extend(["169.254.169.254", "10.0.1.1", "10.0.1.255", "10.0.2.11"].map(ip));
        let hosts = host_enis();
        let (_host, offered) = match hosts.prepare(&eni, &Exclusions::default()).await {
            Ok(Ok(ready)) => ready,
            _ => panic!("the ENI was not prepared"),
        };
        assert_eq!(offered, good, "only the fixtures' own secondaries");
    }

    #[tokio::test]
    async fn each_refusal_says_why() {
        let hosts = host_enis();
        let (host, _) = match hosts.prepare(&listed_eni(), &Exclusions::default()).await {
            Ok(Ok(ready)) => ready,
            _ => panic!("the ENI was not prepared"),
        };
        let subnet4: IpNet = "10.0.1.0/24".parse().unwrap();
        let subnet6: IpNet = "fd00:1::/64".parse().unwrap();
        let cases = [
            ("fe80::1234", UnusableAddress::NotUnicast(ip("fe80::1234"))),
            ("ff02::1", UnusableAddress::NotUnicast(ip("ff02::1"))),
            (
                "::ffff:10.0.1.13",
                UnusableAddress::NotUnicast(ip("::ffff:10.0.1.13")),
            ),
            (
                "fd00:ec2::254",
                UnusableAddress::CloudService(ip("fd00:ec2::254")),
            ),
            ("fd00:1::1", UnusableAddress::Gateway(ip("fd00:1::1"))),
            ("fd00:1::10", UnusableAddress::EniOwn(ip("fd00:1::10"))),
            (
                "fd00:1::",
                UnusableAddress::SubnetAddress {
                    ip: ip("fd00:1::"),
                    subnet: subnet6,
                },
            ),
            (
                "fd00:2::11",
                UnusableAddress::OutsideSubnet {
                    ip: ip("fd00:2::11"),
                    subnet: subnet6,
                },
            ),
            (
                "169.254.169.254",
                UnusableAddress::NotUnicast(ip("169.254.169.254")),
            ),
            ("10.0.1.1", UnusableAddress::Gateway(ip("10.0.1.1"))),
            (
                "10.0.1.255",
                UnusableAddress::SubnetAddress {
                    ip: ip("10.0.1.255"),
                    subnet: subnet4,
                },
            ),
            (
                "10.0.2.11",
                UnusableAddress::OutsideSubnet {
                    ip: ip("10.0.2.11"),
                    subnet: subnet4,
                },
            ),
        ];
        for (addr, why) in cases {
            assert_eq!(host.check_address(&ip(addr)), Err(why), "{addr}");
        }
        for addr in ["fd00:1::11", "fd00:1::ffff", "10.0.1.11"] {
            assert_eq!(host.check_address(&ip(addr)), Ok(()), "{addr}");
        }
        // An ENI without IPv6 takes none.
        let v4_only = HostEni {
            ipv6: false,
            ipv6_subnet: None,
            gateway6: None,
            ..host
        };
        assert_eq!(
            v4_only.check_address(&ip("fd00:1::11")),
            Err(UnusableAddress::NoIpv6(ip("fd00:1::11")))
        );
        assert!(UnusableAddress::CloudService(ip("fd00:ec2::254"))
            .to_string()
            .contains("instance metadata"));
    }
}
