//! [`BceBackend`]: the [`CloudBackend`] the warm pool drives on Baidu BCE,
//! for one node, and [`build`], the started pool `enimd` uses.
//!
//! ENIs enim creates are named `enim-<instance-id>-<random>` and described
//! as enim's, because BCE's ENI API has no tags to mark them with. The name
//! is what `tagged` looks for, and what `detach_and_delete` insists on before
//! deleting anything.
//!
//! For the fleet-wide reaper, the description carries what AWS keeps in
//! tags, as `key=value` words (see [`crate::tags`]):
//! `enim.io/created-at=<RFC 3339>` and, with a cluster configured,
//! `enim.io/cluster=<name>`.
//!
//! Secondary mode numbers each host ENI's route table from its device
//! index, which must stay the same for as long as the ENI is attached,
//! agent restarts included. BCE has none: its metadata gives no device
//! number, its API no attach order, and the kernel's `ethN` is not seen
//! from here (and is not stable across reboots either). So enim chooses
//! the index itself when it creates the ENI, the lowest of `1..=255` no
//! ENI of this instance uses, and keeps it in the cloud with the ENI, as
//! the description word `enim.io/device-index=<n>`: it survives agent
//! restarts, a lost checkpoint and reboots, and moves with nothing.
//! ENIs attached from outside carry no such word and get no index (see
//! docs/providers.md, "Secondary mode on BCE").
//!
//! BCE's instance metadata names no ENI ids: they come from the OpenAPI,
//! matched by MAC. So that an agent started while that API is down can
//! still serve the ENIs metadata shows attached, the backend keeps what it
//! last learnt (MAC to id and device index, for every ENI attached here) in
//! a small file, [`IdCache`]: an ENI's MAC is its own for its whole life,
//! so a MAC metadata lists and the file knows is that ENI.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use enim_core::fault::crash_point;
use enim_core::retry::Poll;
use enim_core::sync::lock;
use enim_core::{AddressCount, AddressLimits, Eni, MacAddr, ProviderError};
use enim_provider::cloud::{
    format_created_at, CloudBackend, CreatedAt, Reaped, TaggedEni, UnattachedEni, TAG_CLUSTER,
    TAG_CREATED_AT,
};
use enim_provider::EniProvider;
use enim_provider_pool::{PoolRole, WarmPool};

use crate::client::{
    client_token, region_endpoint, ApiClient, ApiEni, CreateEni, EniStatus, PrivateIp,
};
use crate::config::BceConfig;
use crate::error::BceError;
use crate::idcache::IdCache;
use crate::metadata::{MetaInterface, MetadataClient, MetadataError};
use crate::steps::{self, InstanceGroups};
use crate::tags::{
    self, description_tag, device_index_of, eni_name_prefix, DEVICE_INDEXES, TAG_DEVICE_INDEX,
};

/// What the backend needs once discovery is done.
#[derive(Debug, Clone)]
pub struct BackendSettings {
    pub instance_id: String,
    pub vpc_id: String,
    pub subnet_id: String,
    /// Security groups of new ENIs; empty: the instance's own.
    pub security_group_ids: Vec<String>,
    /// Between two status (or metadata) polls.
    pub poll_interval: Duration,
    /// How long one attach, detach or metadata wait may take.
    pub operation_timeout: Duration,
    /// `maxKeys` of list calls.
    pub page_size: u32,
    /// The cluster new ENIs are marked with, and the reaper works for.
    pub cluster: Option<String>,
}

/// Addresses per ENI reported before any ENI is attached: BCE's quota call
/// answers per ENI only, so until one exists the figure is BCE's largest
/// (40, for instances of 64 GiB and more). It only lets the agent's pool
/// attach its first ENI; every assign is cut to the ENI's real quota, which
/// is asked then and kept.
pub const PROVISIONAL_IPS_PER_ENI: usize = 40;

pub struct BceBackend {
    api: ApiClient,
    meta: MetadataClient,
    s: BackendSettings,
    name_prefix: String,
    /// Device indexes of creates in flight, not yet in any description.
    reserved: Mutex<HashSet<u32>>,
    /// Addresses one ENI of this instance may carry (BCE's per-ENI
    /// `totalQuantity`), once asked: it follows the instance's size, which
    /// does not change while the agent runs.
    ips_per_eni: Mutex<Option<usize>>,
    /// The instance's security groups, once listed: new ENIs' when none
    /// are configured.
    groups: InstanceGroups,
    /// Attached ENIs without a device index, already warned about.
    warned_unindexed: Mutex<HashSet<String>>,
    /// What the API last said about the ENIs attached here, kept for a
    /// start without it.
    ids: Option<IdCache>,
}

impl BceBackend {
    pub fn new(api: ApiClient, meta: MetadataClient, settings: BackendSettings) -> Self {
        let name_prefix = eni_name_prefix(&settings.instance_id);
        let groups = InstanceGroups::new(&settings.vpc_id, settings.page_size);
        BceBackend {
            api,
            meta,
            s: settings,
            name_prefix,
            reserved: Mutex::new(HashSet::new()),
            ips_per_eni: Mutex::new(None),
            groups,
            warned_unindexed: Mutex::new(HashSet::new()),
            ids: None,
        }
    }

    /// Keeps the ids of attached ENIs in `cache` (see the module comment).
    pub fn with_id_cache(mut self, cache: IdCache) -> Self {
        self.ids = Some(cache);
        self
    }

    /// The ENIs attached here: the API's listing, matched by MAC with
    /// instance metadata (which must show them too).
    async fn attached_online(&self) -> Result<Vec<Eni>, BceError> {
        let listed = self.instance_enis().await?;
        let mut by_mac: HashMap<MacAddr, ApiEni> = HashMap::new();
        for e in listed {
            // The instanceId filter is trusted only as far as it is checked.
            if e.status() != EniStatus::InUse || e.attached_to() != Some(&self.s.instance_id) {
                continue;
            }
            match e.mac_address.parse() {
                Ok(mac) => {
                    by_mac.insert(mac, e);
                }
                Err(err) => {
                    tracing::warn!(eni = %e.eni_id, %err, "ENI with an unreadable MAC skipped")
                }
            }
        }
        let local = self.meta.local_ipv4().await?;
        let mut out = Vec::new();
        for raw in self.meta.macs().await? {
            let Ok(mac) = raw.parse::<MacAddr>() else {
                tracing::warn!(mac = %raw, "metadata lists an unreadable MAC; skipped");
                continue;
            };
            // The primary interface is normally not an ENI of the listing;
            // the local-ipv4 check below keeps it out if it is.
            let Some(api) = by_mac.get(&mac) else {
                continue;
            };
            let iface = self.meta.interface(&raw).await?;
            if iface.all_ips.contains(&std::net::IpAddr::V4(local)) {
                continue;
            }
            let mut eni = iface.to_eni(&api.eni_id);
            eni.device_index = self.indexed(api);
            out.push(eni);
        }
        Ok(out)
    }

    /// The ENIs metadata shows attached whose ids the cache knows: what a
    /// start without the API can serve.
    async fn attached_offline(&self, cache: &IdCache) -> Result<Vec<Eni>, BceError> {
        let local = self.meta.local_ipv4().await?;
        let mut out = Vec::new();
        for raw in self.meta.macs().await? {
            let Some(known) = raw.parse::<MacAddr>().ok().and_then(|m| cache.get(&m)) else {
                continue;
            };
            let iface = self.meta.interface(&raw).await?;
            if iface.all_ips.contains(&IpAddr::V4(local)) {
                continue;
            }
            let mut eni = iface.to_eni(&known.id);
            eni.device_index = known.device_index;
            out.push(eni);
        }
        Ok(out)
    }

    pub fn settings(&self) -> &BackendSettings {
        &self.s
    }

    /// Every ENI of the VPC, this instance's or not: detached ENIs have no
    /// instance to filter by.
    async fn vpc_enis(&self) -> Result<Vec<ApiEni>, BceError> {
        let listed = self
            .api
            .list_enis(&self.s.vpc_id, None, self.s.page_size)
            .await?;
        Ok(listed)
    }

    /// The ENIs the API lists for this instance (a filter the callers
    /// still check).
    async fn instance_enis(&self) -> Result<Vec<ApiEni>, BceError> {
        let listed = self
            .api
            .list_enis(&self.s.vpc_id, Some(&self.s.instance_id), self.s.page_size)
            .await?;
        Ok(listed)
    }

    async fn get_known(&self, eni_id: &str) -> Result<ApiEni, BceError> {
        steps::get_known(&self.api, eni_id).await
    }

    fn is_ours(&self, eni: &ApiEni) -> bool {
        eni.name.starts_with(&self.name_prefix)
    }

    /// enim's (any node's) and marked for this cluster.
    fn in_cluster(&self, eni: &ApiEni) -> bool {
        let cluster = self.s.cluster.as_deref();
        cluster.is_some_and(|c| tags::in_cluster(eni, c))
    }

    /// The description of a new ENI: what it is for people, and the
    /// reaper's marks as `key=value` words (BCE ENIs have no tags).
    fn description(&self, now: SystemTime, device_index: u32) -> String {
        // Kept short: BCE allows 200 characters, and a cluster name takes
        // up to 63 of them.
        let mut d = format!(
            "enim: ENI of instance {}; {TAG_CREATED_AT}={} {TAG_DEVICE_INDEX}={device_index}",
            self.s.instance_id,
            format_created_at(now)
        );
        if let Some(c) = &self.s.cluster {
            d.push_str(&format!(" {TAG_CLUSTER}={c}"));
        }
        d
    }

    /// Polls of one attach or detach.
    fn poll(&self) -> Poll {
        steps::operation_poll(self.s.poll_interval, self.s.operation_timeout)
    }

    fn timeout(&self, eni_id: &str, what: &'static str, last: &str) -> BceError {
        steps::timed_out(eni_id, what, last, self.s.operation_timeout)
    }

    /// Attaches `eni_id` to this instance if it is not, waits for `inuse`,
    /// then for metadata to show it.
    async fn attach_and_wait(&self, eni_id: &str) -> Result<Eni, BceError> {
        let mut poll = self.poll();
        let attached = steps::attach_polled(
            &self.api,
            eni_id,
            &self.s.instance_id,
            None,
            &mut poll,
            self.s.operation_timeout,
        )
        .await?;
        let mac = &attached.mac_address;
        let mac: MacAddr = mac.parse().map_err(|e| BceError::BadReport {
            eni_id: eni_id.into(),
            what: format!("MAC {mac:?}: {e}"),
        })?;
        let mut eni = self.wait_for_metadata(eni_id, mac, &mut poll).await?;
        eni.device_index = self.indexed(&attached);
        Ok(eni)
    }

    /// The ENI's device index, warning once about an attached ENI without
    /// one (secondary mode cannot use it).
    fn indexed(&self, eni: &ApiEni) -> Option<u32> {
        let index = device_index_of(eni);
        if index.is_none() && lock(&self.warned_unindexed).insert(eni.eni_id.clone()) {
            tracing::warn!(eni = %eni.eni_id, name = %eni.name, "ENI without an {TAG_DEVICE_INDEX} mark (attached from outside, or made by an older enim): secondary mode cannot number its route table; exclude it ([exclude] enis) or detach it");
        }
        index
    }

    /// The lowest device index no ENI of this instance has (attached here,
    /// or enim's for it and detached) and no create in flight holds;
    /// reserved until [`Self::unreserve`].
    async fn reserve_device_index(&self) -> Result<u32, BceError> {
        let all = self.vpc_enis().await?;
        let used: HashSet<u32> = all
            .iter()
            .filter(|e| self.is_ours(e) || e.attached_to() == Some(self.s.instance_id.as_str()))
            .filter_map(device_index_of)
            .collect();
        let mut reserved = lock(&self.reserved);
        let index = DEVICE_INDEXES
            .clone()
            .find(|i| !used.contains(i) && !reserved.contains(i))
            .ok_or_else(|| BceError::NoDeviceIndex {
                total: used.len() + reserved.len(),
            })?;
        reserved.insert(index);
        Ok(index)
    }

    fn unreserve(&self, index: u32) {
        lock(&self.reserved).remove(&index);
    }

    /// `eni_id` as the API sees it, checked to be a secondary ENI attached
    /// to this instance: addresses are only ever changed on those.
    async fn attached_here(&self, eni_id: &str) -> Result<ApiEni, BceError> {
        let eni = self.get_known(eni_id).await?;
        if eni.status() != EniStatus::InUse || eni.attached_to() != Some(&self.s.instance_id) {
            return Err(BceError::OwnedByOther {
                eni_id: eni_id.to_string(),
                holder: match eni.attached_to() {
                    Some(other) => format!("instance {other} ({})", eni.status()),
                    None => format!("no instance ({})", eni.status()),
                },
                requester: format!("instance {}", self.s.instance_id),
            });
        }
        let local = self.meta.local_ipv4().await?;
        if eni.primary_ipv4() == Some(local) {
            return Err(BceError::Primary(eni_id.into()));
        }
        Ok(eni)
    }

    /// Addresses one ENI may carry (BCE's private-IP quota of `eni_id`,
    /// asked once: every ENI of the instance has the same).
    async fn ips_per_eni(&self, eni_id: &str) -> Result<usize, BceError> {
        if let Some(n) = *lock(&self.ips_per_eni) {
            return Ok(n);
        }
        let q = self.api.ip_quota(eni_id).await?;
        let n = q.total_quantity as usize;
        tracing::info!(
            eni = eni_id,
            ips_per_eni = n,
            "BCE private-IP quota per ENI"
        );
        *lock(&self.ips_per_eni) = Some(n);
        Ok(n)
    }

    /// A secondary ENI attached to this instance, to ask the per-ENI quota
    /// of.
    async fn any_attached(&self) -> Result<Option<String>, BceError> {
        let local = self.meta.local_ipv4().await?;
        let listed = self.instance_enis().await?;
        Ok(listed
            .into_iter()
            .find(|e| {
                e.status() == EniStatus::InUse
                    && e.attached_to() == Some(self.s.instance_id.as_str())
                    && e.primary_ipv4() != Some(local)
            })
            .map(|e| e.eni_id))
    }

    /// Polls metadata until it lists `mac` with its addresses.
    async fn wait_for_metadata(
        &self,
        eni_id: &str,
        mac: MacAddr,
        poll: &mut Poll,
    ) -> Result<Eni, BceError> {
        loop {
            let last = match self.metadata_interface(mac).await {
                Ok(Some(iface)) => return Ok(iface.to_eni(eni_id)),
                Ok(None) => "absent from instance metadata".to_string(),
                Err(e) if e.is_transient() => e.to_string(),
                Err(e) => return Err(e.into()),
            };
            if !poll.wait().await {
                return Err(self.timeout(eni_id, "appear in instance metadata", &last));
            }
        }
    }

    async fn metadata_interface(
        &self,
        mac: MacAddr,
    ) -> Result<Option<MetaInterface>, MetadataError> {
        for raw in self.meta.macs().await? {
            if raw.parse::<MacAddr>().ok() == Some(mac) {
                return self.meta.interface(&raw).await.map(Some);
            }
        }
        Ok(None)
    }
}

#[async_trait]
impl CloudBackend for BceBackend {
    fn name(&self) -> &str {
        "bce"
    }

    async fn attached(&self) -> Result<Vec<Eni>, ProviderError> {
        let Some(cache) = &self.ids else {
            return Ok(self.attached_online().await?);
        };
        match self.attached_online().await.map_err(ProviderError::from) {
            Ok(enis) => {
                cache.record(&enis, true);
                Ok(enis)
            }
            Err(e) if e.is_transient() => {
                let enis = self.attached_offline(cache).await?;
                tracing::warn!(error = %e, enis = enis.len(), "ENI API unreachable: the ENIs attached here as instance metadata shows them, ids as last known");
                Ok(enis)
            }
            Err(e) => Err(e),
        }
    }

    async fn tagged(&self) -> Result<Vec<TaggedEni>, ProviderError> {
        // Detached ENIs have no instance, so the whole VPC is listed and
        // filtered by name.
        let all = self.vpc_enis().await?;
        Ok(all
            .into_iter()
            .filter(|e| self.is_ours(e))
            .map(|e| TaggedEni {
                attached: e.status() == EniStatus::InUse
                    && e.attached_to() == Some(self.s.instance_id.as_str()),
                id: e.eni_id,
            })
            .collect())
    }

    async fn eni_limit(&self) -> Result<usize, ProviderError> {
        let q = self.api.quota(&self.s.instance_id).await?;
        // Read as "interfaces this instance may have", primary included: if
        // BCE's totalQuantity excludes the primary, enim uses one ENI fewer
        // than it could, rather than failing attaches past the quota.
        Ok(q.total_quantity as usize)
    }

    async fn create_and_attach(&self) -> Result<Eni, ProviderError> {
        let name = format!(
            "{}{}",
            self.name_prefix,
            &client_token().replace('-', "")[..12]
        );
        // Before the index is reserved: nothing to undo if it fails.
        let security_groups = self
            .groups
            .for_new_eni(&self.api, &self.s.instance_id, &self.s.security_group_ids)
            .await?;
        let device_index = self.reserve_device_index().await?;
        let description = self.description(SystemTime::now(), device_index);
        crash_point("cloud:before-create");
        let created = self
            .api
            .create_eni(
                &CreateEni {
                    name: &name,
                    subnet_id: &self.s.subnet_id,
                    security_group_ids: &security_groups,
                    private_ip_set: vec![PrivateIp {
                        primary: true,
                        private_ip_address: String::new(),
                    }],
                    description: &description,
                },
                &client_token(),
            )
            .await;
        // Created or not, the listing now tells the index apart.
        self.unreserve(device_index);
        let eni_id = created?;
        tracing::info!(eni = %eni_id, %name, device_index, "ENI created");
        crash_point("cloud:after-create");
        match self.attach_and_wait(&eni_id).await {
            Ok(eni) => {
                crash_point("cloud:after-attach");
                if let Some(cache) = &self.ids {
                    cache.record(std::slice::from_ref(&eni), false);
                }
                Ok(eni)
            }
            Err(e) => {
                // Best effort: a leftover is found again by `tagged`.
                if let Err(cleanup) = self.detach_and_delete(&eni_id).await {
                    tracing::warn!(eni = %eni_id, error = %cleanup, "could not clean up after a failed attach");
                }
                Err(e.into())
            }
        }
    }

    async fn attach_existing(&self, eni_id: &str) -> Result<Eni, ProviderError> {
        let eni = self.get_known(eni_id).await?;
        if !self.is_ours(&eni) {
            return Err(BceError::NotOursToAttach {
                eni_id: eni_id.into(),
                name: eni.name,
                instance: self.s.instance_id.clone(),
            }
            .into());
        }
        let eni = self.attach_and_wait(eni_id).await?;
        if let Some(cache) = &self.ids {
            cache.record(std::slice::from_ref(&eni), false);
        }
        Ok(eni)
    }

    async fn detach_and_delete(&self, eni_id: &str) -> Result<(), ProviderError> {
        let instance = self.s.instance_id.as_str();
        let check = |eni: &ApiEni| match eni.attached_to() {
            _ if !self.is_ours(eni) => Err(BceError::NotOursToDelete {
                eni_id: eni_id.into(),
                name: eni.name.clone(),
                instance: instance.into(),
            }),
            Some(i) if i != instance && eni.status() == EniStatus::InUse => {
                Err(BceError::OwnedByOther {
                    eni_id: eni_id.to_string(),
                    holder: format!("instance {i}"),
                    requester: format!("instance {instance}"),
                })
            }
            _ => Ok(()),
        };
        let mut poll = self.poll();
        let limit = self.s.operation_timeout;
        if steps::detach_polled(&self.api, eni_id, check, &mut poll, limit)
            .await?
            .is_none()
        {
            return Ok(());
        }
        match self.api.delete_eni(eni_id, &client_token()).await {
            Ok(()) => {
                tracing::info!(eni = eni_id, "ENI deleted");
                crash_point("cloud:after-delete");
                Ok(())
            }
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    fn reap_cluster(&self) -> Option<&str> {
        self.s.cluster.as_deref()
    }

    async fn unattached_in_cluster(&self) -> Result<Vec<UnattachedEni>, ProviderError> {
        if self.s.cluster.is_none() {
            return Ok(Vec::new());
        }
        // No server-side filter for the description: the VPC is listed
        // and filtered here, as `tagged` does.
        let all = self.vpc_enis().await?;
        Ok(all
            .into_iter()
            .filter(|e| self.in_cluster(e) && steps::is_unattached(e))
            .map(|e| UnattachedEni {
                created_at: CreatedAt::from_tag(description_tag(&e.description, TAG_CREATED_AT)),
                id: e.eni_id,
            })
            .collect())
    }

    async fn reap(&self, eni_id: &str) -> Result<Reaped, ProviderError> {
        Ok(steps::delete_checked(&self.api, eni_id, |e| self.in_cluster(e)).await?)
    }

    async fn address_limits(&self) -> Result<AddressLimits, ProviderError> {
        // ENIs: the instance's quota, read as `eni_limit` reads it.
        let enis = self.api.quota(&self.s.instance_id).await?.total_quantity as usize;
        let known = *lock(&self.ips_per_eni);
        let per_eni = match known {
            Some(n) => n,
            None => match self.any_attached().await? {
                Some(eni_id) => self.ips_per_eni(&eni_id).await?,
                None => PROVISIONAL_IPS_PER_ENI,
            },
        };
        // BCE's quota counts the primary address and documents no separate
        // IPv6 figure; IPv6 is served only where ENIs have IPv6 at all.
        Ok(AddressLimits {
            ipv4_per_eni: per_eni,
            ipv6_per_eni: per_eni,
            enis,
        })
    }

    async fn assign(&self, eni_id: &str, n: AddressCount) -> Result<Vec<IpAddr>, ProviderError> {
        let before = self.attached_here(eni_id).await?;
        // Cut to the ENI's quota: before the real figure was known the
        // agent may have planned with a provisional one.
        let per_eni = self.ips_per_eni(eni_id).await?;
        let lookup = || self.attached_here(eni_id);
        Ok(steps::assign(&self.api, eni_id, before, n, per_eni, lookup).await?)
    }

    async fn unassign(&self, eni_id: &str, ips: &[IpAddr]) -> Result<(), ProviderError> {
        let lookup = self.attached_here(eni_id).await;
        Ok(steps::unassign(&self.api, eni_id, ips, lookup).await?)
    }
}

impl BceBackend {
    /// Fills what `config` leaves open from instance metadata and checks
    /// the credentials with one cheap signed call (the instance's ENI quota),
    /// so bad keys fail the agent's start with a clear message.
    pub async fn discover(config: &BceConfig) -> Result<BceBackend, ProviderError> {
        config.validate()?;
        let (backend, endpoint) = Self::from_metadata(config).await?;
        match backend.eni_limit().await {
            Ok(_) => {}
            // Bad keys fail the start; an API that does not answer does
            // not: the pool serves what is attached and grows when it is
            // back.
            Err(e) if e.is_transient() => {
                tracing::warn!(error = %e, "bce: the ENI API does not answer; credentials unchecked until it does")
            }
            Err(e) => return Err(e),
        }
        let s = backend.settings();
        tracing::info!(instance = %s.instance_id, vpc = %s.vpc_id, subnet = %s.subnet_id, %endpoint, "bce backend ready");
        Ok(backend)
    }

    /// The backend of a valid `config`, what it leaves open asked of
    /// instance metadata, and the API endpoint it calls; no call yet.
    async fn from_metadata(config: &BceConfig) -> Result<(BceBackend, String), BceError> {
        let creds = config.credentials()?;
        let meta =
            MetadataClient::new(&config.metadata_endpoint).map_err(BceError::MetadataClient)?;
        let instance_id = meta.instance_id().await?;
        let given = |configured: &Option<String>| configured.clone().filter(|s| !s.is_empty());
        let endpoint = match given(&config.api.endpoint) {
            Some(e) => e,
            None => {
                let region = match given(&config.region) {
                    Some(r) => r,
                    None => meta.region().await?,
                };
                region_endpoint(&region)
            }
        };
        let vpc_id = match given(&config.vpc_id) {
            Some(v) => v,
            None => meta.vpc_id().await?,
        };
        let subnet_id = match given(&config.subnet_id) {
            Some(s) => s,
            None => meta.subnet_id().await?,
        };
        if config.security_group_ids.is_empty() {
            tracing::info!(instance = %instance_id, "bce: no security_group_ids configured; new ENIs take the instance's security groups (listed at the first create)");
        }
        // One set of buckets for the agent: the backend is its only client.
        let api =
            ApiClient::configured(&endpoint, creds, &config.api).map_err(BceError::Endpoint)?;
        let backend = BceBackend::new(
            api,
            meta,
            BackendSettings {
                instance_id,
                vpc_id,
                subnet_id,
                security_group_ids: config.security_group_ids.clone(),
                poll_interval: config.poll_interval,
                operation_timeout: config.operation_timeout,
                page_size: config.list_page_size,
                cluster: config.cluster.clone(),
            },
        );
        let backend = match &config.eni_id_cache {
            Some(path) => backend.with_id_cache(IdCache::open(path.clone())),
            None => backend,
        };
        Ok((backend, endpoint))
    }
}

/// The warm pool over a discovered [`BceBackend`], started in `role`
/// (primary mode: ENIs for pods; secondary mode: the node's host ENIs,
/// whose addresses the pool assigns through BCE's private-IP calls).
pub async fn start_pool(
    config: &BceConfig,
    role: PoolRole,
) -> Result<Arc<WarmPool>, ProviderError> {
    let backend: Arc<dyn CloudBackend> = Arc::new(BceBackend::discover(config).await?);
    WarmPool::start_as(backend, config.pool.clone(), role).await
}

/// What `enimd` calls for `type = "bce"`.
pub async fn build(
    config: &BceConfig,
    role: PoolRole,
) -> Result<Arc<dyn EniProvider>, ProviderError> {
    let pool: Arc<dyn EniProvider> = start_pool(config, role).await?;
    Ok(pool)
}
