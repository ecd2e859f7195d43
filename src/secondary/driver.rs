//! The secondary-mode driver: pods get a secondary address of a host ENI
//! over a veth pair, with per-ENI policy routing. Addresses come from the
//! [`DataStore`]; the host ENIs are set up at restore and kept right by GC,
//! whose host pass also sweeps whatever in the host has enim's shape (veth
//! name, rule priorities, table range) but no record.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use enim_provider::{EniOwner, EniProvider, MacAddr, ProviderError};

use super::datastore::{DataStore, DataStoreError};
use super::plumbing::{HostEniSpec, PodSpec, RtnlSecondary, SecondaryPlumbing};
use super::{SecondaryConfig, MAX_DEVICE_INDEX};
use crate::api::{EniState, EniStatus, GcReport, GcRequest, GcStep};
use crate::engine::{Driver, EngineError, Unplumbed};
use crate::model::{
    now_ms, AddressStats, AttachmentKey, Mode, Payload, Phase, Record, SecondaryPayload,
};
use crate::netlink::PlumbingError;
use crate::store::checkpoint::Checkpoint;
use crate::support::exclusion::Exclusions;
use crate::support::fault::crash_point;

/// A host ENI in use by this node.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct HostEni {
    pub id: String,
    pub mac: MacAddr,
    pub device_index: u32,
    pub name: String,
    pub table: u32,
    pub mtu: u32,
}

pub struct SecondaryDriver {
    config: SecondaryConfig,
    provider: Arc<dyn EniProvider>,
    plumbing: Arc<dyn SecondaryPlumbing>,
    // Read only: other records' addresses, so a stale record never removes
    // the rules of an address another pod holds now.
    checkpoint: Arc<Checkpoint>,
    store: std::sync::Mutex<DataStore>,
    enis: std::sync::RwLock<BTreeMap<String, HostEni>>,
    // ENIs and addresses never used; the primary interface joins them at
    // restore.
    exclusions: std::sync::RwLock<Exclusions>,
}

fn payload(record: &Record) -> Result<&SecondaryPayload, EngineError> {
    record.secondary().ok_or_else(|| {
        EngineError::InvalidRequest(format!("{} is not a secondary-mode record", record.key))
    })
}

impl From<DataStoreError> for EngineError {
    fn from(e: DataStoreError) -> Self {
        match e {
            DataStoreError::NoFreeAddress { .. } => EngineError::NoFreeAddress(e.to_string()),
            e => EngineError::AddressStore(e.to_string()),
        }
    }
}

impl SecondaryDriver {
    pub fn new(
        config: SecondaryConfig,
        provider: Arc<dyn EniProvider>,
        plumbing: Arc<dyn SecondaryPlumbing>,
        checkpoint: Arc<Checkpoint>,
        exclusions: Exclusions,
    ) -> Result<Self, EngineError> {
        config
            .validate()
            .map_err(|e| EngineError::InvalidRequest(e.to_string()))?;
        Ok(SecondaryDriver {
            store: std::sync::Mutex::new(DataStore::new(config.cooldown)),
            config,
            provider,
            plumbing,
            checkpoint,
            enis: Default::default(),
            exclusions: std::sync::RwLock::new(exclusions),
        })
    }

    /// The driver over the real plumbing of the host namespace at
    /// `host_netns` (the agent's own when `None`).
    pub async fn over_host(
        config: SecondaryConfig,
        host_netns: Option<&Path>,
        provider: Arc<dyn EniProvider>,
        checkpoint: Arc<Checkpoint>,
        exclusions: Exclusions,
    ) -> Result<Self, EngineError> {
        let plumbing = RtnlSecondary::new(host_netns, &config.proc_sys_net)
            .await
            .map_err(EngineError::plumbing("open the host namespace"))?;
        Self::new(config, provider, Arc::new(plumbing), checkpoint, exclusions)
    }

    pub fn config(&self) -> &SecondaryConfig {
        &self.config
    }

    fn store(&self) -> std::sync::MutexGuard<'_, DataStore> {
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

    fn host_eni(&self, id: &str) -> Option<HostEni> {
        self.enis
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
    }

    fn exclusions(&self) -> Exclusions {
        self.exclusions
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn spec(&self, record: &Record, p: &SecondaryPayload) -> PodSpec {
        PodSpec {
            netns: record.netns.clone(),
            ifname: record.key.ifname.clone(),
            host_veth: p.host_veth.clone(),
            mtu: record.mtu,
            ipv4: p.ipv4,
            ipv6: p.ipv6,
            eni: self.host_eni(&record.eni_id).map(|e| e.name),
            table: p.table,
            priority_to_pod: p.rule_priority_to_pod,
            priority_from_pod: p.rule_priority_from_pod,
        }
    }

    /// What the host side of `eni` should be.
    fn eni_spec(&self, eni: &enim_provider::Eni, name: String, table: u32) -> HostEniSpec {
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

    /// Re-applies the host ENI setup (idempotent): a link flap flushes the
    /// routes of an ENI's table, and this puts them back.
    async fn reconcile_enis(&self, report: &mut GcReport) {
        let enis = match self.provider.list().await {
            Ok(e) => e,
            Err(e) => return report.error("node", GcStep::ProviderList, e),
        };
        for host in self.host_enis() {
            let Some(eni) = enis.iter().find(|e| e.id == host.id) else {
                continue;
            };
            let spec = self.eni_spec(eni, host.name.clone(), host.table);
            if let Err(e) = self.plumbing.setup_eni(&spec).await {
                report.error(&host.id, GcStep::ReconcileEni, e);
            }
        }
    }

    /// Removes veths, rules, routes and proxy entries of enim's shape that
    /// no record (in any phase) and no host ENI accounts for. The engine
    /// runs it with no ADD or DEL in flight.
    async fn sweep(&self, records: &[Record], report: &mut GcReport) {
        let enis = self.host_enis();
        let eni_names: Vec<String> = enis.iter().map(|e| e.name.clone()).collect();
        let inventory = match self.plumbing.inventory(&self.config, &eni_names).await {
            Ok(i) => i,
            Err(e) => return report.error("node", GcStep::Inventory, e),
        };
        let pods: Vec<(&Record, &SecondaryPayload)> = records
            .iter()
            .filter_map(|r| Some((r, r.secondary()?)))
            .collect();
        let live_veths: HashSet<&str> = pods.iter().map(|(_, p)| p.host_veth.as_str()).collect();
        let live_rules: BTreeSet<_> = pods
            .iter()
            .flat_map(|(r, p)| self.spec(r, p).rules())
            .collect();
        let live_tables: HashSet<u32> = enis.iter().map(|e| e.table).collect();
        let eni_of: HashMap<&str, &str> = enis
            .iter()
            .map(|e| (e.id.as_str(), e.name.as_str()))
            .collect();
        let live_proxies: HashSet<(IpAddr, &str)> = pods
            .iter()
            .filter_map(|(r, p)| Some((p, *eni_of.get(r.eni_id.as_str())?)))
            .flat_map(|(p, eni)| p.ips().into_iter().map(move |ip| (ip, eni)))
            .collect();

        for rule in inventory.rules.iter().filter(|r| !live_rules.contains(r)) {
            let what = format!("rule {rule}");
            match self.plumbing.remove_rule(rule).await {
                Ok(()) => report.swept.push(what),
                Err(e) => report.error(what, GcStep::Sweep, e),
            }
        }
        for (ip, eni) in &inventory.proxies {
            if live_proxies.contains(&(*ip, eni.as_str())) {
                continue;
            }
            let what = format!("proxy {ip} on {eni}");
            match self.plumbing.remove_proxy(*ip, eni).await {
                Ok(()) => report.swept.push(what),
                Err(e) => report.error(what, GcStep::Sweep, e),
            }
        }
        for veth in inventory
            .veths
            .iter()
            .filter(|v| !live_veths.contains(v.as_str()))
        {
            let what = format!("veth {veth}");
            match self.plumbing.remove_veth(veth).await {
                Ok(()) => report.swept.push(what),
                Err(e) => report.error(what, GcStep::Sweep, e),
            }
        }
        for table in inventory.tables.iter().filter(|t| !live_tables.contains(t)) {
            let what = format!("table {table}");
            match self.plumbing.flush_table(*table).await {
                Ok(()) => report.swept.push(what),
                Err(e) => report.error(what, GcStep::Sweep, e),
            }
        }
    }
}

#[async_trait]
impl Driver for SecondaryDriver {
    const MODE: Mode = Mode::Secondary;
    /// The pod side needs nothing the allocation learned.
    type Allocation = ();

    fn provider(&self) -> &Arc<dyn EniProvider> {
        &self.provider
    }

    async fn check_netns(&self, netns: &Path) -> Result<(), PlumbingError> {
        self.plumbing.check_netns(netns).await
    }

    /// Sets up every ENI the provider lists as a host ENI, builds the
    /// address store from their secondary addresses, and restores the
    /// assignments of `records`.
    async fn restore(&self, records: &[Record]) -> Result<(), EngineError> {
        let mut store = DataStore::new(self.config.cooldown);
        let mut enis = BTreeMap::new();
        let mut any_ipv6 = false;
        // Renaming the node's own interface would cut the node off.
        let primary = self
            .plumbing
            .primary_mac()
            .await
            .map_err(EngineError::plumbing("find the primary interface"))?;
        let exclusions = {
            let mut ex = self.exclusions.write().unwrap_or_else(|p| p.into_inner());
            *ex = std::mem::take(&mut *ex).with_primary(primary);
            ex.clone()
        };
        for eni in self.provider.list().await? {
            if exclusions.is_excluded(&eni) {
                tracing::info!(eni = %eni.id, mac = %eni.mac, "excluded; not used as a host ENI");
                continue;
            }
            let index = self.provider.device_index(&eni).await?.ok_or_else(|| {
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
            let addresses = self.provider.secondary_addresses(&eni).await?;
            let spec = self.eni_spec(&eni, self.config.eni_name(index), self.config.table(index));
            let link = match self.plumbing.setup_eni(&spec).await {
                Ok(link) => link,
                Err(e @ PlumbingError::LinkNotFound { .. }) => {
                    // Not plugged (yet): its pods cannot be served, others can.
                    tracing::warn!(eni = %eni.id, error = %e, "ENI not in the host; not used");
                    continue;
                }
                Err(e) => return Err(EngineError::plumbing("set up host ENI")(e)),
            };
            store
                .add_eni(&eni.id, index)
                .map_err(|e| ProviderError::Config(e.to_string()))?;
            for ip in addresses {
                if exclusions.is_excluded_address(&ip) {
                    continue;
                }
                if ip.is_ipv6() && spec.ipv6.is_none() {
                    tracing::warn!(eni = %eni.id, %ip, "IPv6 secondary address on an ENI without IPv6 gateway; not used");
                    continue;
                }
                any_ipv6 |= ip.is_ipv6();
                store
                    .add_address(&eni.id, ip)
                    .map_err(|e| ProviderError::Config(format!("ENI {}: {e}", eni.id)))?;
            }
            tracing::info!(eni = %eni.id, name = %spec.name, table = spec.table, "host ENI ready");
            enis.insert(
                eni.id.clone(),
                HostEni {
                    id: eni.id.clone(),
                    mac: eni.mac,
                    device_index: index,
                    name: spec.name,
                    table: spec.table,
                    mtu: link.mtu,
                },
            );
        }
        self.plumbing
            .enable_forwarding(any_ipv6)
            .await
            .map_err(EngineError::plumbing("enable forwarding"))?;
        for record in records {
            // A live pod's record is never dropped at restart, even when
            // its address is no longer offered: the pod keeps working, and
            // DEL or GC clean it up.
            if let Err(e) = store.restore(&record.key, &record.eni_id, &record.ips()) {
                tracing::warn!(key = %record.key, error = %e, "record's address is not in the store; kept as it is");
            }
        }
        *self.store() = store;
        *self.enis.write().unwrap_or_else(|p| p.into_inner()) = enis;
        Ok(())
    }

    async fn allocate(&self, owner: &EniOwner, netns: &Path) -> Result<(Record, ()), EngineError> {
        let key = AttachmentKey::of(owner);
        let mut store = self.store();
        let dual_stack = store.has_ipv6();
        let assignment = store.assign(&key, dual_stack, Instant::now())?;
        let Some(eni) = self.host_eni(&assignment.eni_id) else {
            // Cannot happen: the store only holds host ENIs.
            store.unassign(&key, Instant::now());
            return Err(EngineError::AddressStore(format!(
                "ENI {} is not a host ENI",
                assignment.eni_id
            )));
        };
        let now = now_ms();
        let record = Record {
            key: key.clone(),
            pod: owner.pod.clone(),
            eni_id: eni.id.clone(),
            netns: netns.to_path_buf(),
            mtu: eni.mtu,
            phase: Phase::Adding,
            created_ms: now,
            updated_ms: now,
            expires_ms: None,
            payload: Payload::Secondary(SecondaryPayload {
                table: eni.table,
                rule_priority_to_pod: self.config.rule_priority_to_pod,
                rule_priority_from_pod: self.config.rule_priority_from_pod,
                host_veth: self.config.veth_name(&key),
                ipv4: assignment.ipv4.and_then(|ip| match ip {
                    IpAddr::V4(v4) => Some(v4),
                    IpAddr::V6(_) => None,
                }),
                ipv6: assignment.ipv6.and_then(|ip| match ip {
                    IpAddr::V6(v6) => Some(v6),
                    IpAddr::V4(_) => None,
                }),
                mac: None,
            }),
        };
        Ok((record, ()))
    }

    async fn plumb(&self, record: &mut Record, (): ()) -> Result<(), EngineError> {
        let spec = self.spec(record, payload(record)?);
        let mac = self
            .plumbing
            .setup_pod(&spec)
            .await
            .map_err(EngineError::pod_side("plumb pod"))?;
        if let Payload::Secondary(p) = &mut record.payload {
            p.mac = Some(mac);
        }
        Ok(())
    }

    async fn verify(&self, record: &mut Record, want_mtu: Option<u32>) -> Option<String> {
        let p = match payload(record) {
            Ok(p) => p,
            Err(e) => return Some(e.to_string()),
        };
        let seen = match self.plumbing.observe_pod(&self.spec(record, p)).await {
            Ok(seen) => seen,
            Err(e) => return Some(e.to_string()),
        };
        let Some(pod) = seen.pod else {
            return Some(format!(
                "no interface {:?} in {}",
                record.key.ifname,
                record.netns.display()
            ));
        };
        if let Some(why) = pod.mismatch(&record.result(), want_mtu) {
            return Some(why);
        }
        if p.mac.is_some_and(|m| m != pod.link.mac) {
            return Some(format!("pod interface has MAC {}", pod.link.mac));
        }
        match seen.host_veth_up {
            None => return Some(format!("host veth {} is missing", p.host_veth)),
            Some(false) => return Some(format!("host veth {} is down", p.host_veth)),
            Some(true) => {}
        }
        if !seen.missing.is_empty() {
            return Some(format!("missing in the host: {}", seen.missing.join(", ")));
        }
        // Learned when the outcome that carried it was never written.
        if let Payload::Secondary(p) = &mut record.payload {
            p.mac.get_or_insert(pod.link.mac);
        }
        None
    }

    async fn unplumb(&self, record: &Record) -> Result<Unplumbed, EngineError> {
        let mut spec = self.spec(record, payload(record)?);
        // Rules and proxy entries are keyed by address alone: never remove
        // those of an address another attachment holds now (a stale record).
        let others: HashSet<IpAddr> = self
            .checkpoint
            .list_mode(Mode::Secondary)
            .await
            .iter()
            .filter(|r| r.key != record.key)
            .flat_map(Record::ips)
            .collect();
        spec.ipv4 = spec.ipv4.filter(|ip| !others.contains(&IpAddr::V4(*ip)));
        spec.ipv6 = spec.ipv6.filter(|ip| !others.contains(&IpAddr::V6(*ip)));
        self.plumbing
            .teardown_pod(&spec)
            .await
            .map_err(EngineError::plumbing("remove pod plumbing"))?;
        crash_point("del:after-unplumb");
        Ok(Unplumbed::Home)
    }

    async fn release(&self, record: &Record) -> Result<(), EngineError> {
        self.store().unassign(&record.key, Instant::now());
        Ok(())
    }

    async fn release_unrecorded(&self, owner: &EniOwner) -> Result<(), EngineError> {
        // Nothing of an unrecorded attachment is in the kernel (intent is
        // written before acting), and the store frees only this key's.
        self.store()
            .unassign(&AttachmentKey::of(owner), Instant::now());
        Ok(())
    }

    async fn gc_host(&self, records: &[Record], _request: &GcRequest, report: &mut GcReport) {
        self.reconcile_enis(report).await;
        self.sweep(records, report).await;
    }

    async fn enis(&self) -> Result<Vec<EniStatus>, EngineError> {
        let exclusions = self.exclusions();
        let host: HashMap<String, HostEni> = self
            .host_enis()
            .into_iter()
            .map(|e| (e.id.clone(), e))
            .collect();
        Ok(self
            .provider
            .list()
            .await?
            .into_iter()
            .map(|eni| {
                let serving = host.get(&eni.id);
                EniStatus {
                    state: if exclusions.is_excluded(&eni) {
                        EniState::Excluded
                    } else if serving.is_some() {
                        EniState::InUse
                    } else {
                        EniState::Free
                    },
                    host_device: serving.map(|h| h.name.clone()),
                    eni,
                }
            })
            .collect())
    }

    fn address_stats(&self) -> Option<AddressStats> {
        Some(self.store().stats(Instant::now()))
    }
}
