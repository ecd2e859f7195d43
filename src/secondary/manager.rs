//! The secondary-mode engine behind [`crate::manager::EniManager`]: ADD,
//! DEL, CHECK, GC and recovery of pods that hold a secondary address of a
//! host ENI.
//!
//! Same rules as primary mode: the checkpoint records intent before the
//! kernel is touched and the outcome after; a failed ADD undoes every step
//! (teardown is idempotent, so "every step" is simply all of it); a record
//! left in an intent phase by a crash is finished or undone at recovery.
//! GC collects dead pods and sweeps whatever in the host has enim's shape
//! (veth name, rule priorities, table range) but no record.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use enim_provider::{EniOwner, EniProvider, MacAddr, ProviderError};
use tokio::sync::RwLock as AsyncRwLock;

use super::datastore::{DataStore, DataStoreStats};
use super::plumbing::{HostEniSpec, PodSpec, RtnlSecondary, SecondaryPlumbing};
use super::record::SecondaryAttachment;
use super::{SecondaryConfig, MAX_DEVICE_INDEX};
use crate::api::{GcReport, GcRequest, MtuExpectation};
use crate::attachment::{now_ms, AttachmentResult, Phase};
use crate::checkpoint::Checkpoint;
use crate::exclusion::Exclusions;
use crate::fault::crash_point;
use crate::keylock::KeyLocks;
use crate::manager::{key_of, ready_in, validate_owner, Liveness, ManagerError, RecoveryReport};
use crate::netlink::{validate_ifname, PlumbingError};

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

pub struct SecondaryManager {
    config: SecondaryConfig,
    provider: Arc<dyn EniProvider>,
    plumbing: Arc<dyn SecondaryPlumbing>,
    checkpoint: Arc<Checkpoint>,
    store: std::sync::Mutex<DataStore>,
    enis: std::sync::RwLock<BTreeMap<String, HostEni>>,
    locks: KeyLocks,
    // ADD, DEL and GC's teardowns hold it shared for their whole run; the
    // orphan sweep holds it exclusively, so it never takes a pod that is
    // half made or half removed for an orphan.
    sweep_fence: AsyncRwLock<()>,
    // ENIs and addresses never used; the primary interface joins them at
    // recovery.
    exclusions: Exclusions,
}

fn plumbing_err(step: &'static str) -> impl FnOnce(PlumbingError) -> ManagerError {
    move |source| ManagerError::Plumbing { step, source }
}

fn validate(owner: &EniOwner) -> Result<(), ManagerError> {
    validate_owner(owner)?;
    validate_ifname(&owner.ifname).map_err(ManagerError::InvalidRequest)
}

impl SecondaryManager {
    pub fn new(
        config: SecondaryConfig,
        provider: Arc<dyn EniProvider>,
        plumbing: Arc<dyn SecondaryPlumbing>,
        checkpoint: Arc<Checkpoint>,
    ) -> Result<Self, ManagerError> {
        config
            .validate()
            .map_err(|e| ManagerError::InvalidRequest(e.to_string()))?;
        Ok(SecondaryManager {
            store: std::sync::Mutex::new(DataStore::new(config.cooldown)),
            config,
            provider,
            plumbing,
            checkpoint,
            enis: Default::default(),
            locks: KeyLocks::default(),
            sweep_fence: Default::default(),
            exclusions: Exclusions::default(),
        })
    }

    /// ENIs and addresses never to use (the node's primary interface is
    /// added at recovery whatever this says).
    pub fn with_exclusions(mut self, exclusions: Exclusions) -> Self {
        self.exclusions = exclusions;
        self
    }

    /// The engine over the real plumbing of the host namespace at
    /// `host_netns` (the agent's own when `None`).
    pub async fn over_host(
        config: SecondaryConfig,
        host_netns: Option<&Path>,
        provider: Arc<dyn EniProvider>,
        checkpoint: Arc<Checkpoint>,
        exclusions: Exclusions,
    ) -> Result<Arc<Self>, ManagerError> {
        let plumbing = RtnlSecondary::new(host_netns)
            .await
            .map_err(plumbing_err("open the host namespace"))?;
        Ok(Arc::new(
            Self::new(config, provider, Arc::new(plumbing), checkpoint)?
                .with_exclusions(exclusions),
        ))
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

    pub fn stats(&self) -> DataStoreStats {
        self.store().stats(Instant::now())
    }

    pub async fn pods(&self) -> Vec<SecondaryAttachment> {
        self.checkpoint.pods().await
    }

    fn spec(&self, record: &SecondaryAttachment) -> PodSpec {
        PodSpec {
            netns: record.netns.clone(),
            ifname: record.key.ifname.clone(),
            host_veth: record.host_veth.clone(),
            mtu: record.mtu,
            ipv4: record.ipv4,
            ipv6: record.ipv6,
            eni: self.host_eni(&record.eni_id).map(|e| e.name),
            table: record.table,
            priority_to_pod: record.rule_priority_to_pod,
            priority_from_pod: record.rule_priority_from_pod,
        }
    }

    /// Sets up every ENI the provider lists as a host ENI, builds the
    /// address store from their secondary addresses, restores the
    /// assignments of the checkpoint's records, and finishes or undoes the
    /// records a crash left mid-way. Run before serving any ADD.
    pub async fn recover(&self) -> Result<RecoveryReport, ManagerError> {
        let mut store = DataStore::new(self.config.cooldown);
        let mut enis = BTreeMap::new();
        let mut any_ipv6 = false;
        // Renaming the node's own interface would cut the node off.
        let primary = self
            .plumbing
            .primary_mac()
            .await
            .map_err(plumbing_err("find the primary interface"))?;
        let exclusions = self.exclusions.clone().with_primary(primary);
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
            let spec = HostEniSpec {
                mac: eni.mac,
                name: self.config.eni_name(index),
                mtu: eni.mtu,
                table: self.config.table(index),
                ipv4: eni.ipv4,
                gateway4: eni.gateway4,
                ipv6: eni.ipv6.filter(|_| eni.gateway6.is_some()),
                gateway6: eni.gateway6,
            };
            let link = match self.plumbing.setup_eni(&spec).await {
                Ok(link) => link,
                Err(e @ PlumbingError::LinkNotFound { .. }) => {
                    // Not plugged (yet): its pods cannot be served, others can.
                    tracing::warn!(eni = %eni.id, error = %e, "ENI not in the host; not used");
                    continue;
                }
                Err(e) => return Err(plumbing_err("set up host ENI")(e)),
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
            .map_err(plumbing_err("enable forwarding"))?;

        let records = self.checkpoint.pods().await;
        for record in &records {
            // A live pod's record is never dropped at restart, even when
            // its address is no longer offered: the pod keeps working, and
            // DEL or GC clean it up.
            if let Err(e) = store.restore(&record.key, &record.eni_id, &record.ips()) {
                tracing::warn!(key = %record.key, error = %e, "record's address is not in the store; kept as it is");
            }
        }
        *self.store() = store;
        *self.enis.write().unwrap_or_else(|p| p.into_inner()) = enis;

        let mut report = RecoveryReport::default();
        for record in records {
            let _fence = self.sweep_fence.read().await;
            let _guard = self.locks.lock(&record.key).await;
            match record.phase {
                Phase::Ready => report.ready += 1,
                Phase::Adding if self.configured_as_recorded(&record).await => {
                    // The crash hit after the pod was fully set up: finish.
                    let mut done = record;
                    done.phase = Phase::Ready;
                    done.updated_ms = now_ms();
                    self.checkpoint.put_pod(done).await?;
                    report.finished += 1;
                }
                Phase::Adding | Phase::Deleting => {
                    self.teardown(record).await?;
                    report.rolled_back += 1;
                }
            }
        }
        Ok(report)
    }

    async fn configured_as_recorded(&self, record: &SecondaryAttachment) -> bool {
        record.mac.is_some()
            && self
                .mismatch(record, MtuExpectation::Recorded)
                .await
                .is_none()
    }

    /// Gives `owner` a secondary address over a veth pair into `netns`.
    /// Idempotent: a repeated ADD of a ready attachment returns its result.
    pub async fn add(
        &self,
        owner: &EniOwner,
        netns: &Path,
    ) -> Result<AttachmentResult, ManagerError> {
        validate(owner)?;
        let key = key_of(owner);
        let _fence = self.sweep_fence.read().await;
        let _guard = self.locks.lock(&key).await;

        if let Some(existing) = self.checkpoint.pod(&key).await {
            if existing.phase == Phase::Ready && existing.netns == netns {
                // The runtime retried: it now has the result.
                self.checkpoint.set_expiry(&key, None).await?;
                return Ok(existing.result());
            }
            tracing::info!(%key, phase = ?existing.phase, "undoing previous attempt before ADD");
            self.teardown(existing).await?;
        }
        self.plumbing
            .check_netns(netns)
            .await
            .map_err(ManagerError::Netns)?;

        let (assignment, eni) = {
            let mut store = self.store();
            let dual_stack = store.has_ipv6();
            let assignment = store.assign(&key, dual_stack, Instant::now())?;
            match self.host_eni(&assignment.eni_id) {
                Some(eni) => (assignment, eni),
                None => {
                    // Cannot happen: the store only holds host ENIs.
                    store.unassign(&key, Instant::now());
                    return Err(ManagerError::InvalidRequest(format!(
                        "ENI {} is not a host ENI",
                        assignment.eni_id
                    )));
                }
            }
        };
        crash_point("add:after-allocate");
        let now = now_ms();
        let mut record = SecondaryAttachment {
            key: key.clone(),
            pod: owner.pod.clone(),
            eni_id: eni.id.clone(),
            table: eni.table,
            rule_priority_to_pod: self.config.rule_priority_to_pod,
            rule_priority_from_pod: self.config.rule_priority_from_pod,
            host_veth: self.config.veth_name(&key),
            netns: netns.to_path_buf(),
            mtu: eni.mtu,
            ipv4: assignment.ipv4.and_then(|ip| match ip {
                IpAddr::V4(v4) => Some(v4),
                IpAddr::V6(_) => None,
            }),
            ipv6: assignment.ipv6.and_then(|ip| match ip {
                IpAddr::V6(v6) => Some(v6),
                IpAddr::V4(_) => None,
            }),
            mac: None,
            phase: Phase::Adding,
            created_ms: now,
            updated_ms: now,
            expires_ms: None,
        };
        if let Err(e) = self.checkpoint.put_pod(record.clone()).await {
            self.store().unassign(&key, Instant::now());
            return Err(e.into());
        }
        crash_point("add:after-intent");
        let spec = self.spec(&record);
        let outcome = match self.plumbing.setup_pod(&spec).await {
            Ok(mac) => {
                crash_point("add:after-configure");
                record.mac = Some(mac);
                record.phase = Phase::Ready;
                record.updated_ms = now_ms();
                self.checkpoint
                    .put_pod(record.clone())
                    .await
                    .map_err(ManagerError::from)
            }
            Err(PlumbingError::NameTaken { ifname, netns }) => {
                Err(ManagerError::IfnameConflict { ifname, netns })
            }
            Err(e) if e.is_netns_gone() => Err(ManagerError::Netns(e)),
            Err(e) => Err(plumbing_err("plumb pod")(e)),
        };
        match outcome {
            Ok(()) => {
                crash_point("add:after-outcome");
                tracing::info!(%key, eni = %eni.id, ips = ?record.ips(), pod = %owner.pod, "secondary address attached");
                Ok(record.result())
            }
            Err(err) => {
                tracing::warn!(%key, error = %err, "ADD failed; rolling back");
                match self.undo_add(&record, &spec).await {
                    Ok(()) => Err(err),
                    Err(undo) => Err(ManagerError::RollbackFailed {
                        original: Box::new(err),
                        undo: Box::new(undo),
                    }),
                }
            }
        }
    }

    async fn undo_add(
        &self,
        record: &SecondaryAttachment,
        spec: &PodSpec,
    ) -> Result<(), ManagerError> {
        // On failure the Adding record (and the address) stay: recovery
        // or GC finishes the undo.
        self.plumbing
            .teardown_pod(spec)
            .await
            .map_err(plumbing_err("undo pod plumbing"))?;
        self.store().unassign(&record.key, Instant::now());
        self.checkpoint.remove_pod(&record.key).await?;
        Ok(())
    }

    /// Removes the pod's plumbing and returns its address (with cooldown).
    /// Succeeds when the record, the netns or the veth is already gone.
    pub async fn del(&self, owner: &EniOwner) -> Result<(), ManagerError> {
        validate(owner)?;
        let key = key_of(owner);
        let _fence = self.sweep_fence.read().await;
        let _guard = self.locks.lock(&key).await;
        match self.checkpoint.pod(&key).await {
            Some(record) => self.teardown(record).await,
            None => {
                // Unknown: nothing of this attachment can be in the kernel
                // (intent is written before acting), and the store frees
                // only what this very key holds.
                self.store().unassign(&key, Instant::now());
                Ok(())
            }
        }
    }

    /// Deleting intent, kernel teardown, address back, record dropped.
    /// The caller holds the sweep fence (shared) and the key lock.
    async fn teardown(&self, mut record: SecondaryAttachment) -> Result<(), ManagerError> {
        if record.phase != Phase::Deleting {
            record.phase = Phase::Deleting;
            record.updated_ms = now_ms();
            self.checkpoint.put_pod(record.clone()).await?;
        }
        crash_point("del:after-intent");
        let mut spec = self.spec(&record);
        // Rules and proxy entries are keyed by address alone: never remove
        // those of an address another attachment holds now (a stale record).
        let others: HashSet<IpAddr> = self
            .checkpoint
            .pods()
            .await
            .iter()
            .filter(|p| p.key != record.key)
            .flat_map(|p| p.ips())
            .collect();
        spec.ipv4 = spec.ipv4.filter(|ip| !others.contains(&IpAddr::V4(*ip)));
        spec.ipv6 = spec.ipv6.filter(|ip| !others.contains(&IpAddr::V6(*ip)));
        self.plumbing
            .teardown_pod(&spec)
            .await
            .map_err(plumbing_err("remove pod plumbing"))?;
        crash_point("del:after-unplumb");
        self.store().unassign(&record.key, Instant::now());
        crash_point("del:after-release");
        self.checkpoint.remove_pod(&record.key).await?;
        tracing::info!(key = %record.key, ips = ?record.ips(), "secondary address released");
        Ok(())
    }

    /// What differs between the record and the kernel, if anything.
    async fn mismatch(&self, record: &SecondaryAttachment, mtu: MtuExpectation) -> Option<String> {
        let seen = match self.plumbing.observe_pod(&self.spec(record)).await {
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
        if let Some(why) = pod.mismatch(&record.result(), mtu.want(record.mtu)) {
            return Some(why);
        }
        if record.mac.is_some_and(|m| m != pod.link.mac) {
            return Some(format!("pod interface has MAC {}", pod.link.mac));
        }
        match seen.host_veth_up {
            None => return Some(format!("host veth {} is missing", record.host_veth)),
            Some(false) => return Some(format!("host veth {} is down", record.host_veth)),
            Some(true) => {}
        }
        if !seen.missing.is_empty() {
            return Some(format!("missing in the host: {}", seen.missing.join(", ")));
        }
        None
    }

    pub async fn check(
        &self,
        owner: &EniOwner,
        netns: &Path,
        mtu: MtuExpectation,
    ) -> Result<AttachmentResult, ManagerError> {
        validate(owner)?;
        let key = key_of(owner);
        let _guard = self.locks.lock(&key).await;
        let record = self
            .checkpoint
            .pod(&key)
            .await
            .ok_or_else(|| ManagerError::UnknownAttachment(key.clone()))?;
        let fail = |why: String| ManagerError::CheckFailed {
            key: key.clone(),
            why,
        };
        ready_in(record.phase, &record.netns, netns).map_err(fail)?;
        if let Some(why) = self.mismatch(&record, mtu).await {
            return Err(fail(why));
        }
        // The runtime has shown it knows the pod: claimed, no expiry.
        self.checkpoint.set_expiry(&key, None).await?;
        Ok(record.result())
    }

    /// One GC pass: collects dead pods (netns gone, or omitted by a CNI GC
    /// list; never younger than `grace`), puts the host ENIs right again,
    /// and sweeps enim-shaped kernel objects that no record explains.
    pub async fn gc(&self, request: &GcRequest, grace: Duration) -> GcReport {
        let mut report = GcReport::default();
        let liveness = Liveness::new(request, grace);
        for record in self.checkpoint.pods().await {
            let netns_alive = || self.plumbing.check_netns(&record.netns);
            if !liveness
                .is_dead(
                    &record.key,
                    record.created_ms,
                    record.expires_ms,
                    netns_alive,
                    &mut report,
                )
                .await
            {
                continue;
            }
            let _fence = self.sweep_fence.read().await;
            let _guard = self.locks.lock(&record.key).await;
            // Re-read under the lock: a DEL or a re-ADD may have won.
            let Some(current) = self.checkpoint.pod(&record.key).await else {
                continue;
            };
            if current.created_ms != record.created_ms {
                continue;
            }
            match self.teardown(current).await {
                Ok(()) => report.collected.push(record.key.to_string()),
                Err(e) => report.errors.push(format!("{}: {e}", record.key)),
            }
        }
        self.reconcile_enis(&mut report).await;
        self.sweep(&mut report).await;
        if !report.collected.is_empty() || !report.swept.is_empty() || !report.errors.is_empty() {
            tracing::info!(collected = ?report.collected, swept = ?report.swept, errors = ?report.errors, "secondary GC pass");
        }
        report
    }

    /// Re-applies the host ENI setup (idempotent): a link flap flushes the
    /// routes of an ENI's table, and this puts them back.
    async fn reconcile_enis(&self, report: &mut GcReport) {
        let enis = match self.provider.list().await {
            Ok(e) => e,
            Err(e) => return report.errors.push(format!("provider list: {e}")),
        };
        for host in self.host_enis() {
            let Some(eni) = enis.iter().find(|e| e.id == host.id) else {
                continue;
            };
            let spec = HostEniSpec {
                mac: eni.mac,
                name: host.name.clone(),
                mtu: eni.mtu,
                table: host.table,
                ipv4: eni.ipv4,
                gateway4: eni.gateway4,
                ipv6: eni.ipv6.filter(|_| eni.gateway6.is_some()),
                gateway6: eni.gateway6,
            };
            if let Err(e) = self.plumbing.setup_eni(&spec).await {
                report.errors.push(format!("ENI {}: {e}", host.id));
            }
        }
    }

    /// Removes veths, rules, routes and proxy entries of enim's shape that
    /// no record (in any phase) and no host ENI accounts for.
    async fn sweep(&self, report: &mut GcReport) {
        let _fence = self.sweep_fence.write().await;
        let enis = self.host_enis();
        let eni_names: Vec<String> = enis.iter().map(|e| e.name.clone()).collect();
        let inventory = match self.plumbing.inventory(&self.config, &eni_names).await {
            Ok(i) => i,
            Err(e) => return report.errors.push(format!("host inventory: {e}")),
        };
        // Read after the inventory: anything listed was made after its
        // intent record was written, and no ADD or DEL runs meanwhile.
        let records = self.checkpoint.pods().await;
        let live_veths: HashSet<&str> = records.iter().map(|r| r.host_veth.as_str()).collect();
        let live_rules: BTreeSet<_> = records.iter().flat_map(|r| self.spec(r).rules()).collect();
        let live_tables: HashSet<u32> = enis.iter().map(|e| e.table).collect();
        let eni_of: HashMap<&str, &str> = enis
            .iter()
            .map(|e| (e.id.as_str(), e.name.as_str()))
            .collect();
        let live_proxies: HashSet<(IpAddr, &str)> = records
            .iter()
            .filter_map(|r| Some((r, *eni_of.get(r.eni_id.as_str())?)))
            .flat_map(|(r, eni)| r.ips().into_iter().map(move |ip| (ip, eni)))
            .collect();

        for rule in inventory.rules.iter().filter(|r| !live_rules.contains(r)) {
            match self.plumbing.remove_rule(rule).await {
                Ok(()) => report.swept.push(format!("rule {rule}")),
                Err(e) => report.errors.push(format!("rule {rule}: {e}")),
            }
        }
        for (ip, eni) in &inventory.proxies {
            if live_proxies.contains(&(*ip, eni.as_str())) {
                continue;
            }
            match self.plumbing.remove_proxy(*ip, eni).await {
                Ok(()) => report.swept.push(format!("proxy {ip} on {eni}")),
                Err(e) => report.errors.push(format!("proxy {ip} on {eni}: {e}")),
            }
        }
        for veth in inventory
            .veths
            .iter()
            .filter(|v| !live_veths.contains(v.as_str()))
        {
            match self.plumbing.remove_veth(veth).await {
                Ok(()) => report.swept.push(format!("veth {veth}")),
                Err(e) => report.errors.push(format!("veth {veth}: {e}")),
            }
        }
        for table in inventory.tables.iter().filter(|t| !live_tables.contains(t)) {
            match self.plumbing.flush_table(*table).await {
                Ok(()) => report.swept.push(format!("table {table}")),
                Err(e) => report.errors.push(format!("table {table}: {e}")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secondary::fake::{FakeSecondary, FAULT_STEPS};
    use enim_provider_static::{StaticEniConfig, StaticProvider};
    use std::path::PathBuf;

    struct Rig {
        mgr: SecondaryManager,
        fake: Arc<FakeSecondary>,
        provider: Arc<StaticProvider>,
        checkpoint: Arc<Checkpoint>,
        _dir: tempfile::TempDir,
        netns: PathBuf,
    }

    fn mac(i: u8) -> MacAddr {
        MacAddr([2, 0, 0, 0, 0, i])
    }

    fn enis(n: u8) -> Vec<StaticEniConfig> {
        (1..=n)
            .map(|i| StaticEniConfig {
                id: format!("eni-{i}"),
                mac: mac(i),
                ipv4: format!("10.0.{i}.10/24").parse().unwrap(),
                gateway4: format!("10.0.{i}.1").parse().unwrap(),
                ipv6: Some(format!("fd00:{i}::10/64").parse().unwrap()),
                gateway6: Some(format!("fd00:{i}::1").parse().unwrap()),
                mtu: Some(9001),
                device_index: Some(u32::from(i)),
                secondary_ipv4: vec![
                    format!("10.0.{i}.11").parse().unwrap(),
                    format!("10.0.{i}.12").parse().unwrap(),
                ],
                secondary_ipv6: vec![
                    format!("fd00:{i}::11").parse().unwrap(),
                    format!("fd00:{i}::12").parse().unwrap(),
                ],
            })
            .collect()
    }

    fn config() -> SecondaryConfig {
        SecondaryConfig {
            cooldown: Duration::ZERO,
            ..SecondaryConfig::default()
        }
    }

    async fn rig(n: u8) -> Rig {
        let names: Vec<String> = (1..=n).map(|i| format!("eth{i}")).collect();
        let devs: Vec<(MacAddr, &str)> = (1..=n)
            .map(|i| (mac(i), names[i as usize - 1].as_str()))
            .collect();
        let fake = Arc::new(FakeSecondary::with_enis(&devs));
        let netns = PathBuf::from("/run/netns/pod");
        fake.add_netns(&netns);
        let provider = Arc::new(StaticProvider::new(enis(n)).unwrap());
        let dir = tempfile::tempdir().unwrap();
        let checkpoint = Arc::new(Checkpoint::open(&dir.path().join("cp.json"), false).unwrap());
        let mgr =
            SecondaryManager::new(config(), provider.clone(), fake.clone(), checkpoint.clone())
                .unwrap();
        mgr.recover().await.unwrap();
        Rig {
            mgr,
            fake,
            provider,
            checkpoint,
            _dir: dir,
            netns,
        }
    }

    impl Rig {
        /// The same node after a restart: a new engine over the same kernel
        /// and checkpoint file.
        async fn restarted(&self) -> SecondaryManager {
            let checkpoint = Arc::new(Checkpoint::open(self.checkpoint.path(), false).unwrap());
            let mgr = SecondaryManager::new(
                config(),
                self.provider.clone(),
                self.fake.clone(),
                checkpoint,
            )
            .unwrap();
            mgr.recover().await.unwrap();
            mgr
        }

        async fn assert_untouched(&self, why: &str) {
            assert!(
                self.fake.world().is_clean(),
                "{why}: {:?}",
                self.fake.world()
            );
            assert!(self.mgr.pods().await.is_empty(), "{why}: a record is left");
            assert_eq!(self.mgr.stats().assigned, 0, "{why}: an address is held");
        }
    }

    fn owner(cid: &str) -> EniOwner {
        EniOwner {
            network: "n".into(),
            container_id: cid.into(),
            ifname: "eth0".into(),
            pod: Default::default(),
        }
    }

    #[tokio::test]
    async fn recovery_sets_up_host_enis_and_the_store() {
        let r = rig(2).await;
        let w = r.fake.world().clone();
        assert_eq!(
            w.enis.values().cloned().collect::<Vec<_>>(),
            ["enis1", "enis2"]
        );
        assert_eq!(w.tables.iter().copied().collect::<Vec<_>>(), [1001, 1002]);
        assert_eq!(w.forwarding, Some(true), "IPv6 forwarding too");
        assert_eq!(r.mgr.stats().total, 8);
        let enis = r.mgr.host_enis();
        assert_eq!(
            (enis[1].name.as_str(), enis[1].table, enis[1].mtu),
            ("enis2", 1002, 9001)
        );
    }

    #[tokio::test]
    async fn excluded_enis_addresses_and_the_primary_interface_are_not_used() {
        let fake = Arc::new(FakeSecondary::with_enis(&[
            (mac(1), "eth1"),
            (mac(2), "eth2"),
            (mac(3), "eth3"),
        ]));
        fake.world().primary = Some(mac(3));
        let provider = Arc::new(StaticProvider::new(enis(3)).unwrap());
        let dir = tempfile::tempdir().unwrap();
        let cp = Arc::new(Checkpoint::open(&dir.path().join("cp.json"), false).unwrap());
        let exclusions = Exclusions::from_config(&crate::exclusion::ExclusionConfig {
            enis: vec!["eni-1".into()],
            addresses: vec!["10.0.2.11".parse().unwrap()],
        });
        let mgr = SecondaryManager::new(config(), provider, fake.clone(), cp)
            .unwrap()
            .with_exclusions(exclusions);
        mgr.recover().await.unwrap();
        let ids: Vec<String> = mgr.host_enis().into_iter().map(|e| e.id).collect();
        assert_eq!(ids, ["eni-2"]);
        assert_eq!(mgr.stats().total, 3);
        let names: Vec<String> = fake.world().enis.values().cloned().collect();
        assert_eq!(
            names,
            ["eth1", "enis2", "eth3"],
            "excluded devices were touched"
        );
    }

    #[tokio::test]
    async fn a_missing_eni_device_is_skipped() {
        let fake = Arc::new(FakeSecondary::with_enis(&[(mac(2), "eth2")]));
        let provider = Arc::new(StaticProvider::new(enis(2)).unwrap());
        let dir = tempfile::tempdir().unwrap();
        let cp = Arc::new(Checkpoint::open(&dir.path().join("cp.json"), false).unwrap());
        let mgr = SecondaryManager::new(config(), provider, fake.clone(), cp).unwrap();
        mgr.recover().await.unwrap();
        let ids: Vec<String> = mgr.host_enis().into_iter().map(|e| e.id).collect();
        assert_eq!(ids, ["eni-2"]);
        assert_eq!(mgr.stats().total, 4);
    }

    #[tokio::test]
    async fn add_records_plumbs_and_is_idempotent() {
        let r = rig(1).await;
        let first = r.mgr.add(&owner("a"), &r.netns).await.unwrap();
        assert_eq!(r.mgr.add(&owner("a"), &r.netns).await.unwrap(), first);
        let ips: Vec<String> = first.ips.iter().map(|i| i.address.to_string()).collect();
        assert_eq!(ips, ["10.0.1.11/32", "fd00:1::11/128"]);
        assert_eq!(first.interface.mtu, 9001);
        let recs = r.mgr.pods().await;
        assert_eq!(recs.len(), 1);
        assert_eq!(recs[0].phase, Phase::Ready);
        assert_eq!(recs[0].table, 1001);
        assert_eq!(Some(first.interface.mac), recs[0].mac);
        let w = r.fake.world().clone();
        assert_eq!(w.rules.len(), 4, "{:?}", w.rules);
        assert_eq!(w.proxies.len(), 2);
        r.mgr
            .check(&owner("a"), &r.netns, MtuExpectation::Recorded)
            .await
            .unwrap();
        r.mgr.del(&owner("a")).await.unwrap();
        r.mgr.del(&owner("a")).await.unwrap();
        r.assert_untouched("after DEL").await;
    }

    #[tokio::test]
    async fn every_add_fault_rolls_back_completely() {
        for step in FAULT_STEPS {
            let r = rig(1).await;
            r.fake.fail_once(step);
            let err = r.mgr.add(&owner("c"), &r.netns).await.expect_err(step);
            assert!(
                !matches!(err, ManagerError::RollbackFailed { .. }),
                "{step}: {err}"
            );
            r.assert_untouched(step).await;
            r.mgr
                .add(&owner("c"), &r.netns)
                .await
                .unwrap_or_else(|e| panic!("{step}: retry: {e}"));
        }
    }

    #[tokio::test]
    async fn checkpoint_write_failures_roll_back() {
        // Write 1 is the intent (before the kernel), write 2 the outcome.
        for nth in [1, 2] {
            let r = rig(1).await;
            r.checkpoint.fail_nth_write(nth);
            let err = r.mgr.add(&owner("c"), &r.netns).await.unwrap_err();
            assert!(matches!(err, ManagerError::Checkpoint(_)), "{err}");
            r.assert_untouched(&format!("checkpoint write {nth}")).await;
        }
    }

    #[tokio::test]
    async fn ifname_clash_leaves_the_pods_interface_alone() {
        let r = rig(1).await;
        r.fake
            .world()
            .foreign
            .insert((r.netns.clone(), "eth0".into()));
        let err = r.mgr.add(&owner("c"), &r.netns).await.unwrap_err();
        assert!(matches!(err, ManagerError::IfnameConflict { .. }), "{err}");
        r.assert_untouched("clash").await;
        assert_eq!(r.fake.world().foreign.len(), 1);
    }

    #[tokio::test]
    async fn failed_undo_keeps_record_and_address_and_recovery_finishes_it() {
        let r = rig(1).await;
        r.fake.fail_once("setup_pod:partial");
        r.fake.fail_once("teardown_pod");
        let err = r.mgr.add(&owner("c"), &r.netns).await.unwrap_err();
        assert!(matches!(err, ManagerError::RollbackFailed { .. }), "{err}");
        let recs = r.mgr.pods().await;
        assert_eq!(recs.len(), 1, "the half-done attachment must stay recorded");
        assert_eq!(recs[0].phase, Phase::Adding);
        // Its address is not handed out while the kernel may still use it.
        assert_eq!(r.mgr.stats().assigned, 2);
        let restarted = r.restarted().await;
        assert!(r.fake.world().is_clean(), "{:?}", r.fake.world());
        assert!(restarted.pods().await.is_empty());
        assert_eq!(restarted.stats().assigned, 0);
    }

    #[tokio::test]
    async fn recovery_finishes_or_undoes_intents_and_keeps_ready_pods() {
        let r = rig(2).await;
        let other = PathBuf::from("/run/netns/other");
        r.fake.add_netns(&other);
        r.mgr.add(&owner("ready"), &r.netns).await.unwrap();
        r.mgr.add(&owner("adding"), &other).await.unwrap();
        let mut rec = r.checkpoint.pod(&key_of(&owner("adding"))).await.unwrap();
        // A crash before the outcome write, after everything was set up.
        rec.phase = Phase::Adding;
        r.checkpoint.put_pod(rec).await.unwrap();
        let third = PathBuf::from("/run/netns/third");
        r.fake.add_netns(&third);
        r.mgr.add(&owner("deleting"), &third).await.unwrap();
        let mut rec = r.checkpoint.pod(&key_of(&owner("deleting"))).await.unwrap();
        rec.phase = Phase::Deleting;
        r.checkpoint.put_pod(rec).await.unwrap();
        let taken: BTreeSet<Vec<IpAddr>> = r
            .mgr
            .pods()
            .await
            .iter()
            .filter(|p| p.key.container_id != "deleting")
            .map(|p| p.ips())
            .collect();

        let restarted = r.restarted().await;
        let pods = restarted.pods().await;
        let phases: Vec<(String, Phase)> = pods
            .iter()
            .map(|p| (p.key.container_id.clone(), p.phase))
            .collect();
        assert_eq!(
            phases,
            [
                ("adding".into(), Phase::Ready),
                ("ready".into(), Phase::Ready)
            ]
        );
        assert_eq!(r.fake.world().veths.len(), 2);
        // The store knows what the surviving pods hold.
        assert_eq!(restarted.stats().assigned, 4);
        let fresh = restarted.add(&owner("new"), &third).await.unwrap();
        let fresh_ips: Vec<IpAddr> = fresh.ips.iter().map(|i| i.address.addr()).collect();
        assert!(
            !taken.contains(&fresh_ips),
            "{fresh_ips:?} handed out twice"
        );
    }

    #[tokio::test]
    async fn a_stale_record_never_removes_another_pods_rules() {
        let r = rig(1).await;
        r.mgr.add(&owner("old"), &r.netns).await.unwrap();
        let stale = r.checkpoint.pod(&key_of(&owner("old"))).await.unwrap();
        r.mgr.del(&owner("old")).await.unwrap();
        // Cooldown is zero here: the same address goes to the next pod.
        let other = PathBuf::from("/run/netns/other");
        r.fake.add_netns(&other);
        r.mgr.add(&owner("new"), &other).await.unwrap();
        assert_eq!(
            r.checkpoint
                .pod(&key_of(&owner("new")))
                .await
                .unwrap()
                .ips(),
            stale.ips()
        );
        // A crash left the old record behind.
        r.checkpoint.put_pod(stale).await.unwrap();
        r.mgr.del(&owner("old")).await.unwrap();
        r.mgr
            .check(&owner("new"), &other, MtuExpectation::Recorded)
            .await
            .expect("the new pod keeps its rules and proxy entries");
        assert_eq!(r.mgr.stats().assigned, 2);
    }

    #[tokio::test]
    async fn gc_collects_dead_pods_and_sweeps_orphans_only() {
        let r = rig(2).await;
        let gone = PathBuf::from("/run/netns/gone");
        r.fake.add_netns(&gone);
        r.mgr.add(&owner("live"), &r.netns).await.unwrap();
        r.mgr.add(&owner("dead"), &gone).await.unwrap();
        r.fake.kill_netns(&gone);
        let stranger = super::super::plumbing::OwnedRule {
            priority: 512,
            table: super::super::plumbing::MAIN_TABLE,
            selector: super::super::plumbing::RuleSelector::To("10.0.1.99".parse().unwrap()),
        };
        {
            let mut w = r.fake.world();
            w.rules.insert(stranger);
            w.tables.insert(1042);
            w.veths.insert(
                "enim00000000000".into(),
                crate::secondary::fake::FakeVeth {
                    netns: "/run/netns/x".into(),
                    ifname: "eth0".into(),
                    mac: mac(9),
                    mtu: 1500,
                    ips: vec![],
                },
            );
        }
        let report = r
            .mgr
            .gc(&GcRequest::default(), Duration::from_secs(3600))
            .await;
        assert_eq!(
            (report.too_young, report.collected.len()),
            (2, 0),
            "{report:?}"
        );
        let mut swept = report.swept.clone();
        swept.sort();
        assert_eq!(
            swept,
            [
                "rule 512: to 10.0.1.99 lookup 254",
                "table 1042",
                "veth enim00000000000"
            ],
            "{report:?}"
        );
        let report = r.mgr.gc(&GcRequest::default(), Duration::ZERO).await;
        assert_eq!(report.collected, ["n/dead/eth0"], "{report:?}");
        assert!(
            report.swept.is_empty() && report.errors.is_empty(),
            "{report:?}"
        );
        r.mgr
            .check(&owner("live"), &r.netns, MtuExpectation::Recorded)
            .await
            .unwrap();
        let w = r.fake.world().clone();
        assert_eq!((w.rules.len(), w.proxies.len(), w.veths.len()), (4, 2, 1));
        assert_eq!(w.tables.iter().copied().collect::<Vec<_>>(), [1001, 1002]);
        assert_eq!(r.mgr.stats().assigned, 2);
        // A second pass finds nothing.
        let again = r.mgr.gc(&GcRequest::default(), Duration::ZERO).await;
        assert_eq!(again, GcReport::default());
    }

    #[tokio::test]
    async fn cni_gc_collects_only_omitted_attachments_of_its_network() {
        let r = rig(2).await;
        let mut b = owner("b");
        b.ifname = "net1".into();
        r.mgr.add(&owner("a"), &r.netns).await.unwrap();
        r.mgr.add(&b, &r.netns).await.unwrap();
        let request = GcRequest {
            network: Some("n".into()),
            valid_attachments: Some(vec![crate::api::ValidAttachment {
                container_id: "a".into(),
                ifname: "eth0".into(),
            }]),
        };
        let other = GcRequest {
            network: Some("other".into()),
            valid_attachments: Some(vec![]),
        };
        assert!(r.mgr.gc(&other, Duration::ZERO).await.collected.is_empty());
        let report = r.mgr.gc(&request, Duration::ZERO).await;
        assert_eq!(report.collected, ["n/b/net1"], "{report:?}");
        let left: Vec<String> = r
            .mgr
            .pods()
            .await
            .iter()
            .map(|p| p.key.to_string())
            .collect();
        assert_eq!(left, ["n/a/eth0"]);
        assert_eq!(r.fake.world().veths.len(), 1);
    }

    #[tokio::test]
    async fn the_sweep_waits_for_an_add_in_progress() {
        let r = Arc::new(rig(1).await);
        let (entered, resume) = r.fake.pause_setup();
        let adder = {
            let r = r.clone();
            tokio::spawn(async move { r.mgr.add(&owner("c"), &r.netns).await })
        };
        entered.notified().await;
        // The veth exists, its rules do not yet: a sweep now would see a
        // stranger. It must wait for the ADD instead.
        let sweeper = {
            let r = r.clone();
            tokio::spawn(async move { r.mgr.gc(&GcRequest::default(), Duration::ZERO).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!sweeper.is_finished(), "GC swept while an ADD was half-way");
        resume.notify_one();
        adder.await.unwrap().expect("the ADD completes");
        let report = sweeper.await.unwrap();
        assert!(report.swept.is_empty(), "{report:?}");
        r.mgr
            .check(&owner("c"), &r.netns, MtuExpectation::Recorded)
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn exhaustion_is_transient_and_check_reports_drift() {
        let r = rig(1).await;
        for cid in ["a", "b"] {
            let ns = PathBuf::from(format!("/run/netns/{cid}"));
            r.fake.add_netns(&ns);
            r.mgr.add(&owner(cid), &ns).await.unwrap();
        }
        let err = r.mgr.add(&owner("c"), &r.netns).await.unwrap_err();
        assert!(err.is_transient(), "{err}");
        r.assert_untouched_except(2).await;
        r.fake.world().rules.clear();
        let err = r
            .mgr
            .check(
                &owner("a"),
                Path::new("/run/netns/a"),
                MtuExpectation::Recorded,
            )
            .await
            .unwrap_err();
        assert!(matches!(err, ManagerError::CheckFailed { .. }), "{err}");
        assert!(err.to_string().contains("rule 512: to 10.0.1.11"), "{err}");
        let err = r
            .mgr
            .check(&owner("a"), &r.netns, MtuExpectation::Recorded)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("recorded netns"), "{err}");
        let err = r
            .mgr
            .check(&owner("zz"), &r.netns, MtuExpectation::Recorded)
            .await
            .unwrap_err();
        assert!(matches!(err, ManagerError::UnknownAttachment(_)), "{err}");
    }

    impl Rig {
        async fn assert_untouched_except(&self, pods: usize) {
            assert_eq!(self.mgr.pods().await.len(), pods);
            assert_eq!(self.fake.world().veths.len(), pods);
        }
    }

    #[tokio::test]
    async fn unclaimed_pods_expire_unless_claimed() {
        let r = rig(1).await;
        // What the agent does when an ADD's caller went away (the server
        // calls EniManager::mark_unclaimed, which sets this).
        let mark_unclaimed = |cid: &'static str, ttl: Duration| {
            let checkpoint = r.checkpoint.clone();
            async move {
                let expires = now_ms() + ttl.as_millis() as u64;
                assert!(checkpoint
                    .set_expiry(&key_of(&owner(cid)), Some(expires))
                    .await
                    .unwrap());
            }
        };
        let other = PathBuf::from("/run/netns/other");
        r.fake.add_netns(&other);
        r.mgr.add(&owner("a"), &r.netns).await.unwrap();
        r.mgr.add(&owner("b"), &other).await.unwrap();
        for cid in ["a", "b"] {
            mark_unclaimed(cid, Duration::ZERO).await;
        }
        // "a" is claimed by the runtime's retried ADD; "b" never is.
        r.mgr.add(&owner("a"), &r.netns).await.unwrap();
        let mgr = &r.mgr;
        let expiry = |cid: &'static str| async move {
            mgr.pods()
                .await
                .into_iter()
                .find(|p| p.key.container_id == cid)
                .map(|p| p.expires_ms)
        };
        assert_eq!(expiry("a").await, Some(None));
        // Expiry beats the grace period: the runtime has given up on "b".
        let long = Duration::from_secs(3600);
        let held_by_both = r.mgr.stats().assigned;
        let report = r.mgr.gc(&GcRequest::default(), long).await;
        assert_eq!(report.collected, vec!["n/b/eth0".to_string()], "{report:?}");
        assert_eq!(report.too_young, 1);
        assert_eq!(expiry("b").await, None, "b's record is gone");
        assert_eq!(
            r.mgr.stats().assigned * 2,
            held_by_both,
            "b's addresses are back"
        );
        // A kept-but-unexpired pod stays, and CHECK claims it.
        mark_unclaimed("a", long).await;
        let report = r.mgr.gc(&GcRequest::default(), Duration::ZERO).await;
        assert!(report.collected.is_empty(), "{report:?}");
        r.mgr
            .check(&owner("a"), &r.netns, MtuExpectation::Recorded)
            .await
            .unwrap();
        assert_eq!(expiry("a").await, Some(None));
        // The expiry survives a restart (it is in the checkpoint).
        mark_unclaimed("a", Duration::ZERO).await;
        let again = r.restarted().await;
        let report = again.gc(&GcRequest::default(), long).await;
        assert_eq!(report.collected, vec!["n/a/eth0".to_string()], "{report:?}");
    }
}
