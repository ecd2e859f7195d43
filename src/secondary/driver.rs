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
use enim_api::model::{
    now_ms, AddressStats, AttachmentKey, Mode, Payload, Phase, Record, SecondaryPayload,
};
use enim_api::{EniState, EniStatus, GcReport, GcRequest, GcStep};
use enim_core::{EniOwner, ProviderError};
use enim_provider::EniProvider;

use super::datastore::{DataStore, DataStoreError};
use super::feed::FollowFeed;
use super::host::{HostEni, HostEnis, Skipped};
use super::plumbing::{PodSpec, RtnlSecondary, SecondaryPlumbing};
use super::warm::{self, WarmIps};
use super::SecondaryConfig;
use crate::engine::{Driver, EngineError, Unplumbed};
use crate::netlink::PlumbingError;
use crate::store::checkpoint::Checkpoint;
use crate::support::exclusion::Exclusions;
use crate::support::fault::crash_point;
use crate::support::metadata::MetadataConfig;

/// How often an ADD waiting for an address's cooldown looks again: an
/// address the operator or the pool adds meanwhile is taken at once.
const COOLING_RECHECK: std::time::Duration = std::time::Duration::from_millis(250);

pub struct SecondaryDriver {
    host: Arc<HostEnis>,
    // Read only: other records' addresses, so a stale record never removes
    // the rules of an address another pod holds now.
    checkpoint: Arc<Checkpoint>,
    /// The warm address pool's loop, started at restore when the provider
    /// can assign addresses.
    pool: std::sync::OnceLock<WarmIps>,
    /// The loop following a provider whose addresses are decided outside
    /// the agent, started at restore.
    follow: std::sync::OnceLock<FollowFeed>,
    pod_metadata: MetadataConfig,
}

/// The driver's own methods and the pool share the host side.
impl std::ops::Deref for SecondaryDriver {
    type Target = HostEnis;
    fn deref(&self) -> &HostEnis {
        &self.host
    }
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
            host: Arc::new(HostEnis::new(config, provider, plumbing, exclusions)),
            checkpoint,
            pool: std::sync::OnceLock::new(),
            follow: std::sync::OnceLock::new(),
            pod_metadata: MetadataConfig::default(),
        })
    }

    /// Refuses pods the metadata service as `config` says
    /// (docs/security.md, "The instance metadata service").
    pub fn with_pod_metadata(self, config: MetadataConfig) -> Self {
        SecondaryDriver {
            pod_metadata: config,
            ..self
        }
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
        let plumbing = RtnlSecondary::new(host_netns, &config)
            .await
            .map_err(EngineError::plumbing("open the host namespace"))?;
        Self::new(config, provider, Arc::new(plumbing), checkpoint, exclusions)
    }

    pub fn config(&self) -> &SecondaryConfig {
        &self.config
    }

    /// Frees what `key` holds; the pool may then release surplus.
    fn free(&self, key: &AttachmentKey) {
        self.store().unassign(key, Instant::now());
        if let Some(pool) = self.pool.get() {
            pool.served(key);
        }
        if let Some(feed) = self.provider.address_feed() {
            feed.freed(&key.owner());
            // A freed address the listing no longer shows left the store.
            self.report_stored();
            // The freed address cools down: once it is free, say so again
            // (the operator counts a cooling address as not free).
            let cooldown = self.store().cooldown();
            if let (false, Ok(rt)) = (cooldown.is_zero(), tokio::runtime::Handle::try_current()) {
                let host = self.host.clone();
                rt.spawn(async move {
                    tokio::time::sleep(cooldown).await;
                    host.report_stored();
                });
            }
        }
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
            blocked: self
                .pod_metadata
                .blocked_for(&record.pod, p.ipv4.is_some(), p.ipv6.is_some()),
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
        let primary = self
            .plumbing
            .primary_mac()
            .await
            .map_err(EngineError::plumbing("find the primary interface"))?;
        let exclusions = self.exclude_primary(primary);
        let listed = self.provider.list().await?;
        self.note_listed(&listed);
        for eni in listed {
            match self.prepare(&eni, &exclusions).await? {
                Ok((host, addresses)) => HostEnis::take_in(&mut store, &mut enis, host, &addresses)
                    .map_err(|e| ProviderError::Config(format!("ENI {}: {e}", eni.id)))?,
                Err(Skipped::Excluded) => {
                    tracing::info!(eni = %eni.id, mac = %eni.mac, "excluded; not used as a host ENI");
                }
                Err(Skipped::NotPlugged(e)) => {
                    // Not plugged (yet): its pods cannot be served, others can.
                    tracing::warn!(eni = %eni.id, error = %e, "ENI not in the host; not used");
                }
            }
        }
        // Addresses from outside (a feed) may come later: an empty store
        // is not an error then either.
        let can_grow =
            self.provider.secondary_ips().is_some() || self.provider.address_feed().is_some();
        if store.stats(Instant::now()).total == 0 && !can_grow {
            // A secondary-mode node with nothing to hand out is a config
            // error, not an empty pool that fails every pod.
            return Err(ProviderError::Config(format!(
                "secondary mode: no ENI of provider {:?} offers a secondary address, and the provider cannot assign any",
                self.provider.name()
            ))
            .into());
        }
        let any_ipv6 = can_grow && enis.values().any(|e: &HostEni| e.ipv6) || store.has_ipv6();
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
            if let Some(feed) = self.provider.address_feed() {
                feed.held(&record.eni_id, &record.ips(), &record.owner());
            }
        }
        self.replace(store, enis);
        if let Some(ips) = self.provider.secondary_ips() {
            warm::check_limits(ips, self.provider.name()).await?;
            let _ = self.pool.get_or_init(|| WarmIps::start(self.host.clone()));
        }
        if self.follow.get().is_none() {
            self.report_stored();
            if let Some(follow) = FollowFeed::start(self.host.clone()) {
                let _ = self.follow.set(follow);
            }
        }
        Ok(())
    }

    async fn wait_for_capacity(&self, owner: &EniOwner) {
        let key = AttachmentKey::of(owner);
        let deadline = Instant::now() + self.config.pool.allocate_wait;
        let dual_stack = self.store().has_ipv6();
        if let Some(pool) = self.pool.get() {
            pool.wait_for_address(&key, dual_stack).await;
        }
        // Nothing free, but an address ends its cooldown within the wait
        // (pods just went, as in a rollout): wait for it here, rather than
        // answer "try again later" and have the kubelet come back 10 s or
        // more later. Whatever frees one sooner is taken at the re-check.
        let mut told = false;
        loop {
            let wake = {
                let store = self.store();
                if store.can_assign(&key, dual_stack, Instant::now()) {
                    return;
                }
                store.next_free_at(dual_stack, Instant::now())
            };
            match wake {
                Some(at) if at <= deadline => {
                    // A tick at most: an address given to the store meanwhile
                    // is seen at the next look.
                    let nap = at.saturating_duration_since(Instant::now());
                    if !told {
                        told = true;
                        tracing::info!(pod = %owner.pod, wait_ms = nap.as_millis(), "no free address: waiting for one's cooldown to end");
                    }
                    tokio::time::sleep(nap.min(COOLING_RECHECK)).await;
                }
                _ => return,
            }
        }
    }

    async fn allocate(&self, owner: &EniOwner, netns: &Path) -> Result<(Record, ()), EngineError> {
        let key = AttachmentKey::of(owner);
        let mut store = self.store();
        let dual_stack = store.has_ipv6();
        let assigned = store.assign(&key, dual_stack, Instant::now());
        if let Some(pool) = self.pool.get() {
            // Either way the free count changed or is too low: the pool
            // refills, counting a refused pod as demand.
            match &assigned {
                Ok(_) => pool.served(&key),
                Err(_) => pool.waiting(&key),
            }
        }
        let assignment = assigned?;
        if let Some(feed) = self.provider.address_feed() {
            let ips: Vec<IpAddr> = assignment
                .ipv4
                .iter()
                .chain(&assignment.ipv6)
                .copied()
                .collect();
            feed.held(&assignment.eni_id, &ips, owner);
        }
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
        self.free(&record.key);
        Ok(())
    }

    async fn release_unrecorded(&self, owner: &EniOwner) -> Result<(), EngineError> {
        // Nothing of an unrecorded attachment is in the kernel (intent is
        // written before acting), and the store frees only this key's.
        self.free(&AttachmentKey::of(owner));
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
