//! The node's side of secondary mode, shared by the driver (pods' verbs)
//! and the warm address pool (its own loop): the host ENIs, set up in the
//! kernel, and the [`DataStore`] of their addresses.

use std::collections::{BTreeMap, HashSet};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, MutexGuard, RwLock};

use enim_provider::{Eni, EniProvider, MacAddr, ProviderError, StoredAddresses};
use ipnet::Ipv4Net;

use super::datastore::{DataStore, DataStoreError};
use super::plumbing::{HostEniSpec, SecondaryPlumbing};
use super::{SecondaryConfig, MAX_DEVICE_INDEX};
use crate::engine::EngineError;
use crate::netlink::PlumbingError;
use crate::support::exclusion::Exclusions;

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
}

impl HostEni {
    /// Whether a pod may have `ip` on this ENI: for IPv4, a host address
    /// of its subnet other than its own and the router's (a cloud, or an
    /// emulator of one, could hand out the network or broadcast address).
    pub fn usable(&self, ip: &IpAddr) -> bool {
        match ip {
            IpAddr::V4(v4) => {
                let net = self.ipv4.trunc();
                net.contains(v4)
                    && *v4 != net.network()
                    && *v4 != net.broadcast()
                    && *v4 != self.ipv4.addr()
                    && *v4 != self.gateway4
            }
            IpAddr::V6(_) => self.ipv6,
        }
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
    exclusions: RwLock<Exclusions>,
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
            exclusions: RwLock::new(exclusions),
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
        self.exclusions
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Adds the primary interface to the exclusions (renaming the node's
    /// own interface would cut the node off) and returns them.
    pub(super) fn exclude_primary(&self, primary: Option<MacAddr>) -> Exclusions {
        let mut ex = self.exclusions.write().unwrap_or_else(|p| p.into_inner());
        *ex = std::mem::take(&mut *ex).with_primary(primary);
        ex.clone()
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
                let ok = host.usable(ip) && !self.is_own_address(ip);
                if !ok {
                    tracing::warn!(eni = %eni.id, %ip, "secondary address no pod can use on this ENI (IPv6 without an IPv6 gateway, not a host address of its subnet, or an ENI's own address); not used");
                }
                ok
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
        let addresses = self.store().addresses();
        feed.stored(StoredAddresses { enis, addresses });
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
