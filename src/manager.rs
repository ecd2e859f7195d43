//! The ENI manager (the seed's ENIManagerServer): ADD, DEL and CHECK of
//! primary-ENI attachments, and recovery of interrupted ones.
//!
//! Ordering rule: the checkpoint records intent before the kernel is
//! touched and the outcome after, and the provider's assignment is released
//! only once the device is home. Whatever fails, ADD undoes every step it
//! took; whatever dies, the record says what to finish or undo.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use enim_provider::{Eni, EniOwner, EniProvider, ProviderError};

use crate::api::{GcReport, GcRequest, MtuExpectation};
use crate::attachment::{now_ms, Attachment, AttachmentKey, AttachmentResult, Phase};
use crate::checkpoint::{Checkpoint, CheckpointError, HostHome};
use crate::exclusion::{excluded_owner, is_excluded_owner, Exclusions};
use crate::fault::crash_point;
use crate::keylock::KeyLocks;
use crate::netlink::{
    validate_ifname, HostLinkHome, LinkInfo, Plumbing, PlumbingError, PodLinkConfig,
};
use crate::secondary::datastore::DataStoreError;
use crate::secondary::manager::SecondaryManager;

#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("pod network namespace: {0}")]
    Netns(#[source] PlumbingError),
    #[error("{0}")]
    Provider(#[from] ProviderError),
    #[error("ENI {eni_id} (MAC {mac}) was allocated but no such device is in the host namespace")]
    DeviceMissing { eni_id: String, mac: String },
    #[error("interface {ifname:?} already exists in {netns}; the ENI was returned to the host")]
    IfnameConflict { ifname: String, netns: PathBuf },
    #[error("{step}: {source}")]
    Plumbing {
        step: &'static str,
        #[source]
        source: PlumbingError,
    },
    #[error("{0}")]
    Checkpoint(#[from] CheckpointError),
    #[error(
        "{original}; undoing it also failed ({undo}); the attachment is kept for GC to finish"
    )]
    RollbackFailed {
        original: Box<ManagerError>,
        undo: Box<ManagerError>,
    },
    #[error("no attachment {0}")]
    UnknownAttachment(AttachmentKey),
    #[error("attachment {key} does not match the kernel: {why}")]
    CheckFailed { key: AttachmentKey, why: String },
    /// Secondary mode: the address store refused.
    #[error("{0}")]
    Addresses(#[from] DataStoreError),
}

impl ManagerError {
    fn plumbing(step: &'static str) -> impl FnOnce(PlumbingError) -> ManagerError {
        move |source| ManagerError::Plumbing { step, source }
    }

    /// Whether the caller may succeed by retrying later.
    pub fn is_transient(&self) -> bool {
        match self {
            ManagerError::Provider(e) => {
                e.is_transient() || matches!(e, ProviderError::Exhausted { .. })
            }
            ManagerError::RollbackFailed { original, .. } => original.is_transient(),
            // Cooling addresses come back, and DELs free others.
            ManagerError::Addresses(DataStoreError::NoFreeAddress { .. }) => true,
            _ => false,
        }
    }
}

pub struct EniManager {
    provider: Arc<dyn EniProvider>,
    plumbing: Arc<dyn Plumbing>,
    checkpoint: Arc<Checkpoint>,
    locks: KeyLocks,
    // ADD holds this shared from allocation until its intent is recorded;
    // GC holds it exclusively while it renames free ENIs, so it never
    // touches an ENI an ADD has just taken but not yet recorded.
    allocation_fence: tokio::sync::RwLock<()>,
    // Secondary mode: every verb goes to this engine instead.
    secondary: Option<Arc<SecondaryManager>>,
    // Configured exclusions; the primary interface joins them at recovery.
    exclusions: std::sync::RwLock<Exclusions>,
}

/// How far an ADD got, so a failure undoes exactly that.
struct AddProgress {
    host: Option<LinkInfo>,
    recorded: bool,
    moved: bool,
}

pub fn key_of(owner: &EniOwner) -> AttachmentKey {
    AttachmentKey {
        network: owner.network.clone(),
        container_id: owner.container_id.clone(),
        ifname: owner.ifname.clone(),
    }
}

impl EniManager {
    pub fn new(
        provider: Arc<dyn EniProvider>,
        plumbing: Arc<dyn Plumbing>,
        checkpoint: Arc<Checkpoint>,
    ) -> Self {
        EniManager {
            provider,
            plumbing,
            checkpoint,
            locks: KeyLocks::default(),
            allocation_fence: Default::default(),
            secondary: None,
            exclusions: Default::default(),
        }
    }

    /// ENIs and addresses never to hand out (the primary interface is added
    /// at recovery whatever this says).
    pub fn with_exclusions(self, exclusions: Exclusions) -> Self {
        *self.exclusions.write().unwrap_or_else(|p| p.into_inner()) = exclusions;
        self
    }

    fn exclusions(&self) -> Exclusions {
        self.exclusions
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Reserves every excluded ENI that is free (and not held by one of
    /// `held`, an attachment made before the exclusion: it is left alone
    /// until released), so the provider can never hand it out.
    async fn reserve_excluded(&self, held: &HashSet<String>) -> Result<Vec<String>, ManagerError> {
        let exclusions = self.exclusions();
        let reservations: Vec<(String, EniOwner)> = self
            .provider
            .list()
            .await?
            .into_iter()
            .filter(|e| e.owner.is_none() && !held.contains(&e.id) && exclusions.is_excluded(e))
            .map(|e| (e.id.clone(), excluded_owner(&e.id)))
            .collect();
        if !reservations.is_empty() {
            self.provider.restore(&reservations).await?;
        }
        Ok(reservations.into_iter().map(|(id, _)| id).collect())
    }

    pub fn provider(&self) -> &Arc<dyn EniProvider> {
        &self.provider
    }

    pub fn plumbing(&self) -> &Arc<dyn Plumbing> {
        &self.plumbing
    }

    pub fn checkpoint(&self) -> &Arc<Checkpoint> {
        &self.checkpoint
    }

    /// Switches the node to secondary mode: ADD, DEL, CHECK, GC and
    /// recovery are served by `engine`.
    pub fn with_secondary(mut self, engine: Arc<SecondaryManager>) -> Self {
        self.secondary = Some(engine);
        self
    }

    pub fn secondary(&self) -> Option<&Arc<SecondaryManager>> {
        self.secondary.as_ref()
    }

    /// Gives `owner` an ENI of its own in the netns at `netns`. Idempotent:
    /// a repeated ADD of a ready attachment returns the recorded result.
    pub async fn add(
        &self,
        owner: &EniOwner,
        netns: &Path,
    ) -> Result<AttachmentResult, ManagerError> {
        if let Some(engine) = &self.secondary {
            return engine.add(owner, netns).await;
        }
        validate_owner(owner)?;
        validate_ifname(&owner.ifname).map_err(ManagerError::InvalidRequest)?;
        let key = key_of(owner);
        let _guard = self.locks.lock(&key).await;

        if let Some(existing) = self.checkpoint.get(&key).await {
            if existing.phase == Phase::Ready && existing.netns == netns {
                // The runtime retried: it now has the result, so the
                // attachment is claimed and no longer expires.
                self.checkpoint.set_expiry(&key, None).await?;
                return Ok(existing.result());
            }
            // An interrupted attempt, or the same attachment aimed at another
            // netns: undo the old one fully before starting over.
            tracing::info!(%key, phase = ?existing.phase, "undoing previous attempt before ADD");
            self.teardown(existing).await?;
        }

        self.plumbing
            .check_netns(netns)
            .await
            .map_err(ManagerError::Netns)?;
        let fence = self.allocation_fence.read().await;
        let eni = self.provider.allocate_next(owner).await?;
        crash_point("add:after-allocate");
        let mut progress = AddProgress {
            host: None,
            recorded: false,
            moved: false,
        };
        match self
            .attach(owner, &key, netns, &eni, &mut progress, fence)
            .await
        {
            Ok(result) => Ok(result),
            Err(err) => {
                tracing::warn!(%key, eni = %eni.id, error = %err, "ADD failed; rolling back");
                match self.undo_add(owner, &key, netns, &eni, &progress).await {
                    Ok(()) => Err(err),
                    Err(undo) => Err(ManagerError::RollbackFailed {
                        original: Box::new(err),
                        undo: Box::new(undo),
                    }),
                }
            }
        }
    }

    async fn attach(
        &self,
        owner: &EniOwner,
        key: &AttachmentKey,
        netns: &Path,
        eni: &Eni,
        progress: &mut AddProgress,
        fence: tokio::sync::RwLockReadGuard<'_, ()>,
    ) -> Result<AttachmentResult, ManagerError> {
        let host = self
            .plumbing
            .host_link(eni.mac)
            .await
            .map_err(ManagerError::plumbing("find ENI in host"))?
            .ok_or_else(|| ManagerError::DeviceMissing {
                eni_id: eni.id.clone(),
                mac: eni.mac.to_string(),
            })?;
        progress.host = Some(host.clone());
        // First sight of this ENI in the host: remember its home.
        self.checkpoint
            .learn_homes([(
                eni.mac,
                HostHome {
                    name: host.name.clone(),
                    mtu: host.mtu,
                },
            )])
            .await?;
        let now = now_ms();
        let mut record = Attachment {
            key: key.clone(),
            pod: owner.pod.clone(),
            eni_id: eni.id.clone(),
            mac: eni.mac,
            host_name: host.name.clone(),
            host_mtu: host.mtu,
            netns: netns.to_path_buf(),
            mtu: eni.mtu.unwrap_or(host.mtu),
            ipv4: eni.ipv4,
            gateway4: eni.gateway4,
            ipv6: eni.ipv6,
            gateway6: eni.gateway6,
            phase: Phase::Adding,
            created_ms: now,
            updated_ms: now,
            expires_ms: None,
        };
        self.checkpoint.put(record.clone()).await?;
        progress.recorded = true;
        drop(fence);
        crash_point("add:after-intent");

        progress.moved = true; // a failed move may still have moved: undo checks
        self.plumbing
            .move_to_pod(&host, netns, &owner.ifname)
            .await
            .map_err(|e| match e {
                PlumbingError::NameTaken { ifname, netns } => {
                    ManagerError::IfnameConflict { ifname, netns }
                }
                e if e.is_netns_gone() => ManagerError::Netns(e),
                e => ManagerError::Plumbing {
                    step: "move ENI into pod",
                    source: e,
                },
            })?;
        crash_point("add:after-move");
        let config = PodLinkConfig {
            ifname: owner.ifname.clone(),
            mtu: record.mtu,
            ipv4: eni.ipv4,
            gateway4: eni.gateway4,
            ipv6: eni.ipv6,
            gateway6: eni.gateway6,
        };
        self.plumbing
            .configure_pod_link(netns, eni.mac, &config)
            .await
            .map_err(ManagerError::plumbing("configure ENI in pod"))?;
        crash_point("add:after-configure");

        record.phase = Phase::Ready;
        record.updated_ms = now_ms();
        // Written behind: should the agent die before it lands, recovery
        // finds the intent with the device fully configured and finishes it.
        self.checkpoint.put_behind(record.clone()).await;
        crash_point("add:after-outcome");
        tracing::info!(%key, eni = %eni.id, pod = %owner.pod, "ENI attached");
        Ok(record.result())
    }

    async fn undo_add(
        &self,
        owner: &EniOwner,
        key: &AttachmentKey,
        netns: &Path,
        eni: &Eni,
        progress: &AddProgress,
    ) -> Result<(), ManagerError> {
        if let Some(host) = &progress.host {
            let moved = if progress.moved {
                match self
                    .plumbing
                    .move_to_host(netns, eni.mac, &host.name, host.mtu)
                    .await
                {
                    Ok(moved) => moved,
                    // The netns vanished: the kernel handles the device.
                    Err(e) if e.is_netns_gone() => None,
                    Err(e) => return Err(ManagerError::plumbing("return ENI to host")(e)),
                }
            } else {
                None
            };
            // Unless the move already set the host name and MTU.
            if !moved.is_some_and(|l| l.is_home(&host.name, host.mtu)) {
                self.plumbing
                    .restore_host_link(eni.mac, &host.name, host.mtu)
                    .await
                    .map_err(ManagerError::plumbing("restore host name and MTU"))?;
            }
        }
        self.provider.release(owner).await?;
        if progress.recorded {
            self.checkpoint.remove(key).await?;
        }
        Ok(())
    }

    /// Takes the ENI back from the attachment. Succeeds when the record,
    /// the netns or the device is already gone, and never touches an ENI
    /// that now belongs to another container.
    pub async fn del(&self, owner: &EniOwner) -> Result<(), ManagerError> {
        if let Some(engine) = &self.secondary {
            return engine.del(owner).await;
        }
        validate_owner(owner)?;
        let key = key_of(owner);
        let _guard = self.locks.lock(&key).await;
        match self.checkpoint.get(&key).await {
            Some(record) => self.teardown(record).await.map(drop),
            None => {
                // No record: at most a crash between allocation and the
                // intent write left an assignment. Releasing by owner frees
                // only what this very attachment holds.
                self.provider.release(owner).await?;
                Ok(())
            }
        }
    }

    /// Moves the ENI home, restores its host name and MTU, releases it and
    /// drops the record, in that order. Used by DEL, GC and recovery.
    pub(crate) async fn teardown(&self, mut record: Attachment) -> Result<Teardown, ManagerError> {
        let owner = record.owner();
        let holder = self
            .provider
            .list()
            .await?
            .into_iter()
            .find(|e| e.id == record.eni_id)
            .and_then(|e| e.owner);
        if let Some(holder) = holder.filter(|h| !h.same_attachment(&owner)) {
            // Our record is stale: the ENI was handed to someone else since.
            tracing::warn!(key = %record.key, eni = %record.eni_id, %holder, "ENI belongs to another attachment; dropping only the stale record");
            self.checkpoint.remove(&record.key).await?;
            return Ok(Teardown::StaleRecord);
        }
        if record.phase != Phase::Deleting {
            record.phase = Phase::Deleting;
            record.updated_ms = now_ms();
            self.checkpoint.put(record.clone()).await?;
        }
        crash_point("del:after-intent");
        let moved = match self
            .plumbing
            .move_to_host(
                &record.netns,
                record.mac,
                &record.host_name,
                record.host_mtu,
            )
            .await
        {
            Ok(moved) => moved,
            Err(e) if e.is_netns_gone() => {
                tracing::info!(key = %record.key, netns = %record.netns.display(), "netns already gone");
                None
            }
            Err(e) => return Err(ManagerError::plumbing("return ENI to host")(e)),
        };
        crash_point("del:after-move");
        // The move itself sets the host name and MTU. Otherwise (not in the
        // pod, or home under a fallback name) find the device and put it right.
        let found = moved.is_some_and(|l| l.is_home(&record.host_name, record.host_mtu))
            || self
                .plumbing
                .restore_host_link(record.mac, &record.host_name, record.host_mtu)
                .await
                .map_err(ManagerError::plumbing("restore host name and MTU"))?;
        if !found {
            tracing::warn!(key = %record.key, eni = %record.eni_id, mac = %record.mac, "ENI device is nowhere in the host; releasing the record");
        }
        crash_point("del:after-restore");
        self.provider.release(&owner).await?;
        crash_point("del:after-release");
        // Written behind: should the agent die before it lands, recovery
        // repeats this teardown from the intent, which is idempotent.
        self.checkpoint.remove_behind(&record.key).await;
        tracing::info!(key = %record.key, eni = %record.eni_id, "ENI released");
        Ok(if found {
            Teardown::Home
        } else {
            Teardown::DeviceGone
        })
    }

    /// Verifies that the recorded attachment is what the kernel has: the
    /// device in the netns under the ifname, with the MTU, addresses and
    /// default routes of the result.
    pub async fn check(
        &self,
        owner: &EniOwner,
        netns: &Path,
        mtu: MtuExpectation,
    ) -> Result<AttachmentResult, ManagerError> {
        if let Some(engine) = &self.secondary {
            return engine.check(owner, netns, mtu).await;
        }
        validate_owner(owner)?;
        let key = key_of(owner);
        let _guard = self.locks.lock(&key).await;
        let record = self
            .checkpoint
            .get(&key)
            .await
            .ok_or_else(|| ManagerError::UnknownAttachment(key.clone()))?;
        let fail = |why: String| ManagerError::CheckFailed {
            key: key.clone(),
            why,
        };
        ready_in(record.phase, &record.netns, netns).map_err(fail)?;
        let state = self
            .plumbing
            .pod_link(netns, record.mac)
            .await
            .map_err(|e| fail(e.to_string()))?
            .ok_or_else(|| fail(format!("no device with MAC {} in the netns", record.mac)))?;
        let result = record.result();
        if let Some(why) = state.mismatch(&result, mtu.want(record.mtu)) {
            return Err(fail(why));
        }
        self.checkpoint.set_expiry(&record.key, None).await?;
        Ok(result)
    }

    /// Marks a ready attachment (either mode) whose ADD result may never
    /// have reached the runtime: it is kept for `ttl`, waiting for a retried
    /// ADD, a CHECK or a DEL, and collected by GC after that.
    pub async fn mark_unclaimed(
        &self,
        key: &AttachmentKey,
        ttl: Duration,
    ) -> Result<(), ManagerError> {
        let expires = now_ms() + ttl.as_millis() as u64;
        if self.checkpoint.set_expiry(key, Some(expires)).await? {
            tracing::warn!(%key, ttl = ?ttl, "the ADD's caller went away before its result; keeping the attachment for a retry or DEL");
        }
        Ok(())
    }

    pub async fn attachments(&self) -> Vec<Attachment> {
        self.checkpoint.list().await
    }

    /// Re-establishes provider ownership from the checkpoint and finishes
    /// or undoes attachments a crash left in an intent phase. Run before
    /// serving any ADD.
    pub async fn recover(&self) -> Result<RecoveryReport, ManagerError> {
        if let Some(engine) = &self.secondary {
            return engine.recover().await;
        }
        let records = self.checkpoint.list().await;
        let assignments: Vec<(String, EniOwner)> = records
            .iter()
            .map(|r| (r.eni_id.clone(), r.owner()))
            .collect();
        self.provider.restore(&assignments).await?;
        // The node's own interface is never a pod's, whatever the config says.
        let primary = self.plumbing.primary_mac().await.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "could not find the primary interface");
            None
        });
        {
            let mut ex = self.exclusions.write().unwrap_or_else(|p| p.into_inner());
            *ex = std::mem::take(&mut *ex).with_primary(primary);
        }
        let held: HashSet<String> = records.iter().map(|r| r.eni_id.clone()).collect();
        let reserved = self.reserve_excluded(&held).await?;
        if !reserved.is_empty() {
            tracing::info!(?reserved, ?primary, "excluded ENIs reserved");
        }
        let mut report = RecoveryReport::default();
        for record in records {
            let _guard = self.locks.lock(&record.key).await;
            match record.phase {
                Phase::Ready => report.ready += 1,
                Phase::Adding if self.configured_as_recorded(&record).await => {
                    // The crash hit after the device was fully set up: finish.
                    let mut done = record.clone();
                    done.phase = Phase::Ready;
                    done.updated_ms = now_ms();
                    self.checkpoint.put(done).await?;
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

    async fn configured_as_recorded(&self, record: &Attachment) -> bool {
        let Ok(Some(state)) = self.plumbing.pod_link(&record.netns, record.mac).await else {
            return false;
        };
        state.mismatch(&record.result(), Some(record.mtu)).is_none()
    }
}

impl EniManager {
    /// One GC pass (periodic loop, `enimctl gc` and CNI GC share it).
    ///
    /// An attachment is dead when its netns is gone or is not a network
    /// namespace, or when a CNI GC list for its network omits it.
    /// Attachments younger than `grace` are never collected: the view of
    /// what is alive may lag behind a pod that is just starting.
    pub async fn gc(&self, request: &GcRequest, grace: Duration) -> GcReport {
        if let Some(engine) = &self.secondary {
            return engine.gc(request, grace).await;
        }
        let mut report = GcReport::default();
        let liveness = Liveness::new(request, grace);
        let mut dead = Vec::new();
        for record in self.checkpoint.list().await {
            let netns_alive = || self.plumbing.check_netns(&record.netns);
            let (key, created, expires) = (&record.key, record.created_ms, record.expires_ms);
            if liveness
                .is_dead(key, created, expires, netns_alive, &mut report)
                .await
            {
                dead.push(record);
            }
        }
        self.collect_dead(dead, &mut report).await;

        // ENIs the provider assigns with no record: a crash between
        // allocation and the intent write. The key lock orders this after
        // any ADD still between those two steps.
        match self.provider.list().await {
            Ok(enis) => {
                for eni in enis {
                    let Some(owner) = eni.owner else { continue };
                    if is_excluded_owner(&owner) {
                        continue;
                    }
                    if request
                        .network
                        .as_ref()
                        .is_some_and(|n| *n != owner.network)
                    {
                        continue;
                    }
                    let key = key_of(&owner);
                    // Recorded: not an orphan. Checked before taking the key
                    // lock, so GC never waits behind an ADD in progress.
                    if self.checkpoint.get(&key).await.is_some() {
                        continue;
                    }
                    let _guard = self.locks.lock(&key).await;
                    if self.checkpoint.get(&key).await.is_some() {
                        continue;
                    }
                    let still_held = self
                        .provider
                        .list()
                        .await
                        .ok()
                        .and_then(|l| l.into_iter().find(|e| e.id == eni.id))
                        .and_then(|e| e.owner)
                        .is_some_and(|o| o.same_attachment(&owner));
                    if !still_held {
                        continue;
                    }
                    match self.provider.release(&owner).await {
                        Ok(()) => report.orphans_released.push(eni.id.clone()),
                        Err(e) => report
                            .errors
                            .push(format!("release orphan {}: {e}", eni.id)),
                    }
                }
            }
            Err(e) => report.errors.push(format!("provider list: {e}")),
        }
        self.normalise_free_enis(&mut report).await;
        // An excluded ENI whose last attachment just went is reserved again.
        let held: HashSet<String> = self
            .checkpoint
            .list()
            .await
            .into_iter()
            .map(|a| a.eni_id)
            .collect();
        if let Err(e) = self.reserve_excluded(&held).await {
            report.errors.push(format!("reserve excluded ENIs: {e}"));
        }
        if !report.collected.is_empty()
            || !report.orphans_released.is_empty()
            || !report.normalised.is_empty()
            || !report.errors.is_empty()
        {
            tracing::info!(collected = ?report.collected, orphans = ?report.orphans_released, errors = ?report.errors, "GC pass");
        }
        report
    }
}

/// The question a GC pass asks of every attachment, in either mode: is it
/// dead? Only attachments of the pass's network (all without one) that are
/// older than the grace period are considered; such an attachment is dead
/// when a CNI GC list omits it, its unclaimed allocation expired, or its
/// netns is gone or no network namespace.
pub(crate) struct Liveness<'r> {
    network: Option<&'r str>,
    valid: Option<HashSet<(&'r str, &'r str)>>,
    now_ms: u64,
    grace_ms: u64,
}

impl<'r> Liveness<'r> {
    pub(crate) fn new(request: &'r GcRequest, grace: Duration) -> Self {
        Liveness {
            network: request.network.as_deref(),
            valid: request.valid_attachments.as_ref().map(|v| {
                v.iter()
                    .map(|a| (a.container_id.as_str(), a.ifname.as_str()))
                    .collect()
            }),
            now_ms: now_ms(),
            grace_ms: grace.as_millis() as u64,
        }
    }

    /// `netns_alive` checks the netns, and runs only when the cheaper tests
    /// did not decide. Young attachments are counted in the report, and a
    /// netns that cannot be checked is an error there (the attachment is
    /// kept, so a passing fault never collects a live pod).
    pub(crate) async fn is_dead<F>(
        &self,
        key: &AttachmentKey,
        created_ms: u64,
        expires_ms: Option<u64>,
        netns_alive: impl FnOnce() -> F,
        report: &mut GcReport,
    ) -> bool
    where
        F: std::future::Future<Output = Result<(), PlumbingError>>,
    {
        if self.network.is_some_and(|n| n != key.network) {
            return false;
        }
        // An ADD whose result nobody claimed in time is dead whatever its
        // age: the runtime has given up on it.
        let expired = expires_ms.is_some_and(|t| self.now_ms >= t);
        if !expired && self.now_ms.saturating_sub(created_ms) < self.grace_ms {
            report.too_young += 1;
            return false;
        }
        let omitted = self
            .valid
            .as_ref()
            .is_some_and(|v| !v.contains(&(key.container_id.as_str(), key.ifname.as_str())));
        if omitted || expired {
            return true;
        }
        match netns_alive().await {
            Ok(()) => false,
            Err(e) if e.is_netns_gone() => true,
            Err(e) => {
                report.errors.push(format!("{key}: {e}"));
                false
            }
        }
    }
}

impl EniManager {
    /// Tears down dead attachments as one batch: the same steps and crash
    /// points as DEL's teardown, but one provider listing, one intent write
    /// and one outcome write for the whole batch instead of two fsyncs and a
    /// listing per record.
    async fn collect_dead(&self, mut dead: Vec<Attachment>, report: &mut GcReport) {
        if dead.is_empty() {
            return;
        }
        // Key order, so concurrent passes take the locks in the same order.
        dead.sort_by(|a, b| a.key.cmp(&b.key));
        let mut guards = Vec::with_capacity(dead.len());
        for record in &dead {
            guards.push(self.locks.lock(&record.key).await);
        }
        // Re-read under the locks: a DEL or re-ADD may have won the race.
        let mut current = Vec::with_capacity(dead.len());
        for record in dead {
            if let Some(now) = self.checkpoint.get(&record.key).await {
                if now.created_ms == record.created_ms {
                    current.push(now);
                }
            }
        }
        let holders: HashMap<String, Option<EniOwner>> = match self.provider.list().await {
            Ok(enis) => enis.into_iter().map(|e| (e.id, e.owner)).collect(),
            Err(e) => return report.errors.push(format!("provider list: {e}")),
        };
        let (stale, ours): (Vec<Attachment>, Vec<Attachment>) =
            current.into_iter().partition(|r| {
                holders
                    .get(&r.eni_id)
                    .and_then(|h| h.as_ref())
                    .is_some_and(|h| !h.same_attachment(&r.owner()))
            });
        for r in &stale {
            tracing::warn!(key = %r.key, eni = %r.eni_id, "ENI belongs to another attachment; dropping only the stale record");
        }
        let now = now_ms();
        let intents: Vec<Attachment> = ours
            .iter()
            .filter(|r| r.phase != Phase::Deleting)
            .map(|r| Attachment {
                phase: Phase::Deleting,
                updated_ms: now,
                ..r.clone()
            })
            .collect();
        let stale_keys: Vec<AttachmentKey> = stale.iter().map(|r| r.key.clone()).collect();
        if let Err(e) = self.checkpoint.update_many(intents, &stale_keys).await {
            return report.errors.push(format!("GC intent write: {e}"));
        }
        report
            .collected
            .extend(stale.iter().map(|r| r.key.to_string()));
        crash_point("del:after-intent");

        let mut moved = Vec::with_capacity(ours.len());
        for r in ours {
            match self
                .plumbing
                .move_to_host(&r.netns, r.mac, &r.host_name, r.host_mtu)
                .await
            {
                Ok(_) => moved.push(r),
                Err(e) if e.is_netns_gone() => moved.push(r),
                Err(e) => report
                    .errors
                    .push(format!("{}: return ENI to host: {e}", r.key)),
            }
        }
        // Every device is as home as a move can make it: one look at the
        // host for the whole batch (was a link dump per device not found).
        let homes: Vec<HostLinkHome<'_>> = moved
            .iter()
            .map(|r| HostLinkHome {
                mac: r.mac,
                name: &r.host_name,
                mtu: r.host_mtu,
            })
            .collect();
        let restored = match self.plumbing.restore_host_links(&homes).await {
            Ok(restored) => restored,
            Err(e) => {
                report.errors.push(format!("host links: {e}"));
                return;
            }
        };
        drop(homes);
        let mut home = Vec::with_capacity(moved.len());
        for (r, restored) in moved.into_iter().zip(restored) {
            match restored {
                Ok(found) => home.push((r, found)),
                Err(e) => report
                    .errors
                    .push(format!("{}: restore host name and MTU: {e}", r.key)),
            }
        }
        crash_point("del:after-restore");
        let mut released = Vec::with_capacity(home.len());
        for (r, found) in home {
            match self.provider.release(&r.owner()).await {
                Ok(()) => released.push((r, found)),
                Err(e) => report.errors.push(format!("{}: release: {e}", r.key)),
            }
        }
        crash_point("del:after-release");
        let keys: Vec<AttachmentKey> = released.iter().map(|(r, _)| r.key.clone()).collect();
        if let Err(e) = self.checkpoint.update_many(Vec::new(), &keys).await {
            // The records stay in phase Deleting; the next pass finishes them.
            return report.errors.push(format!("GC outcome write: {e}"));
        }
        for (r, found) in released {
            if !found {
                report.records_dropped.push(r.key.to_string());
            }
            tracing::info!(key = %r.key, eni = %r.eni_id, "collected");
            report.collected.push(r.key.to_string());
        }
        drop(guards);
    }

    /// Learns the host home of every free ENI seen for the first time, and
    /// puts back the name and MTU of a free ENI that has drifted from its
    /// home (renamed to `dev<N>` by a dying netns, or by hand).
    async fn normalise_free_enis(&self, report: &mut GcReport) {
        let _fence = self.allocation_fence.write().await;
        let (enis, links) = match (self.provider.list().await, self.plumbing.host_links().await) {
            (Ok(e), Ok(l)) => (e, l),
            (Err(e), _) => return report.errors.push(format!("provider list: {e}")),
            (_, Err(e)) => return report.errors.push(format!("host links: {e}")),
        };
        let recorded: HashSet<_> = self
            .checkpoint
            .list()
            .await
            .into_iter()
            .map(|a| a.mac)
            .collect();
        // By MAC: thousands of free ENIs must not each scan every link.
        let links: HashMap<_, _> = links.iter().map(|l| (l.mac, l)).collect();
        let free_in_host = || {
            enis.iter()
                .filter(|e| e.owner.is_none() && !recorded.contains(&e.mac))
                .filter_map(|e| links.get(&e.mac).map(|l| (e, *l)))
        };
        let seen = free_in_host().map(|(e, l)| {
            (
                e.mac,
                HostHome {
                    name: l.name.clone(),
                    mtu: l.mtu,
                },
            )
        });
        if let Err(e) = self.checkpoint.learn_homes(seen.collect::<Vec<_>>()).await {
            report.errors.push(e.to_string());
        }
        let homes = self.checkpoint.homes().await;
        for (eni, link) in free_in_host() {
            let Some(home) = homes.get(&eni.mac) else {
                continue;
            };
            if link.is_home(&home.name, home.mtu) {
                continue;
            }
            match self
                .plumbing
                .restore_host_link(eni.mac, &home.name, home.mtu)
                .await
            {
                Ok(_) => {
                    tracing::info!(eni = %eni.id, from = %link.name, to = %home.name, mtu = home.mtu, "normalised free ENI");
                    report.normalised.push(eni.id.clone());
                }
                Err(e) => report.errors.push(format!("normalise {}: {e}", eni.id)),
            }
        }
    }
}

/// How a teardown ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Teardown {
    /// The ENI is home under its host name and MTU, and released.
    Home,
    /// The device was nowhere (a veth died with its netns): released anyway.
    DeviceGone,
    /// The ENI belonged to another attachment: only our record was dropped.
    StaleRecord,
}

#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RecoveryReport {
    pub ready: usize,
    pub finished: usize,
    pub rolled_back: usize,
}

/// CHECK's first questions, the same in both modes: is the attachment
/// ready, and in the netns the runtime names? `Err` says why not.
pub(crate) fn ready_in(phase: Phase, recorded: &Path, netns: &Path) -> Result<(), String> {
    if phase != Phase::Ready {
        return Err(format!("attachment is in phase {phase:?}"));
    }
    if recorded != netns {
        return Err(format!(
            "recorded netns is {}, not {}",
            recorded.display(),
            netns.display()
        ));
    }
    Ok(())
}

pub(crate) fn validate_owner(owner: &EniOwner) -> Result<(), ManagerError> {
    if owner.network.is_empty() {
        return Err(ManagerError::InvalidRequest("network name is empty".into()));
    }
    if owner.container_id.is_empty() {
        return Err(ManagerError::InvalidRequest("container id is empty".into()));
    }
    if owner.ifname.is_empty() {
        return Err(ManagerError::InvalidRequest(
            "interface name is empty".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::fake::{FakePlumbing, FAULT_STEPS};
    use enim_provider::MacAddr;
    use enim_provider_static::{StaticEniConfig, StaticProvider};

    const HOST_MTU: u32 = 1500;

    struct Rig {
        mgr: EniManager,
        fake: Arc<FakePlumbing>,
        provider: Arc<StaticProvider>,
        _dir: tempfile::TempDir,
        netns: PathBuf,
    }

    fn mac(i: u8) -> MacAddr {
        MacAddr([2, 0, 0, 0, 0, i])
    }

    fn rig(n: u8) -> Rig {
        let enis = (1..=n)
            .map(|i| StaticEniConfig {
                id: format!("eni-{i}"),
                mac: mac(i),
                ipv4: format!("10.0.{i}.10/24").parse().unwrap(),
                gateway4: format!("10.0.{i}.1").parse().unwrap(),
                ipv6: Some(format!("fd00:{i}::10/64").parse().unwrap()),
                gateway6: Some(format!("fd00:{i}::1").parse().unwrap()),
                mtu: Some(9000),
                device_index: None,
                secondary_ipv4: vec![],
                secondary_ipv6: vec![],
            })
            .collect();
        let names: Vec<String> = (1..=n).map(|i| format!("eni{i}")).collect();
        let devs: Vec<(MacAddr, &str, u32)> = (1..=n)
            .map(|i| (mac(i), names[i as usize - 1].as_str(), HOST_MTU))
            .collect();
        let fake = Arc::new(FakePlumbing::with_host_devices(&devs));
        let netns = PathBuf::from("/run/netns/pod");
        fake.add_netns(&netns);
        let provider = Arc::new(StaticProvider::new(enis).unwrap());
        let dir = tempfile::tempdir().unwrap();
        let cp = Arc::new(Checkpoint::open(&dir.path().join("cp.json"), false).unwrap());
        let mgr = EniManager::new(provider.clone(), fake.clone(), cp);
        Rig {
            mgr,
            fake,
            provider,
            _dir: dir,
            netns,
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

    impl Rig {
        /// The invariant after a failed ADD: everything as before it.
        async fn assert_untouched(&self, why: &str) {
            let dev = self
                .fake
                .host_dev(mac(1))
                .unwrap_or_else(|| panic!("{why}: ENI not in host"));
            assert_eq!(
                (dev.link.name.as_str(), dev.link.mtu),
                ("eni1", HOST_MTU),
                "{why}"
            );
            assert_eq!(
                self.fake.pod_devs(),
                0,
                "{why}: a device is left in the pod"
            );
            assert!(
                self.mgr.attachments().await.is_empty(),
                "{why}: checkpoint holds an entry"
            );
            let enis = self.provider.list().await.unwrap();
            assert!(
                enis.iter().all(|e| e.owner.is_none()),
                "{why}: provider still assigns an ENI"
            );
        }
    }

    #[tokio::test]
    async fn every_add_fault_rolls_back_completely() {
        for step in FAULT_STEPS {
            let r = rig(1);
            r.fake.fail_once(step);
            let err = r.mgr.add(&owner("c"), &r.netns).await.expect_err(step);
            assert!(
                !matches!(err, ManagerError::RollbackFailed { .. }),
                "{step}: {err}"
            );
            r.assert_untouched(step).await;
            // The state is clean enough that the retried ADD succeeds.
            r.mgr
                .add(&owner("c"), &r.netns)
                .await
                .unwrap_or_else(|e| panic!("{step}: retry: {e}"));
        }
    }

    #[tokio::test]
    async fn checkpoint_write_failures_roll_back() {
        // Write 1 records the ENI's host home (first sight), write 2 the
        // intent (before the move): a failure of either undoes the ADD.
        for nth in [1, 2] {
            let r = rig(1);
            r.mgr.checkpoint().fail_nth_write(nth);
            let err = r
                .mgr
                .add(&owner("c"), &r.netns)
                .await
                .expect_err("must fail");
            assert!(matches!(err, ManagerError::Checkpoint(_)), "{err}");
            r.assert_untouched(&format!("checkpoint write {nth}")).await;
        }
    }

    #[tokio::test]
    async fn outcomes_are_written_behind_and_a_failed_one_is_retried() {
        let r = rig(1);
        let cp = r.mgr.checkpoint().clone();
        let on_disk = || {
            let path = cp.path().to_path_buf();
            async move {
                Checkpoint::open(&path, false)
                    .unwrap()
                    .list()
                    .await
                    .into_iter()
                    .map(|a| a.phase)
                    .collect::<Vec<_>>()
            }
        };
        // Write 3 is ADD's outcome, written behind: its failure does not
        // fail the ADD, and memory keeps the outcome for the next write.
        cp.fail_nth_write(3);
        r.mgr.add(&owner("c"), &r.netns).await.unwrap();
        assert_eq!(r.mgr.attachments().await[0].phase, Phase::Ready);
        cp.settle().await;
        assert!(
            cp.has_unwritten().await,
            "the failed write-behind left nothing pending"
        );
        assert_eq!(
            on_disk().await,
            vec![Phase::Adding],
            "disk keeps the intent"
        );
        cp.flush().await.unwrap();
        assert!(!cp.has_unwritten().await);
        assert_eq!(on_disk().await, vec![Phase::Ready]);

        // DEL's outcome (the record's removal) lands behind it too.
        r.mgr.del(&owner("c")).await.unwrap();
        assert!(r.mgr.attachments().await.is_empty());
        cp.settle().await;
        assert!(!cp.has_unwritten().await);
        assert_eq!(
            on_disk().await,
            Vec::<Phase>::new(),
            "the removal never landed"
        );
    }

    #[tokio::test]
    async fn provider_exhaustion_touches_nothing() {
        let r = rig(1);
        r.mgr.add(&owner("a"), &r.netns).await.unwrap();
        let other = PathBuf::from("/run/netns/other");
        r.fake.add_netns(&other);
        let err = r.mgr.add(&owner("b"), &other).await.unwrap_err();
        assert!(
            matches!(
                err,
                ManagerError::Provider(ProviderError::Exhausted { total: 1 })
            ),
            "{err}"
        );
        assert!(err.is_transient());
        assert_eq!(r.mgr.attachments().await.len(), 1);
    }

    #[tokio::test]
    async fn failed_undo_keeps_record_and_recovery_finishes_it() {
        let r = rig(1);
        r.fake.fail_once("configure_pod_link");
        r.fake.fail_once("move_to_host");
        let err = r.mgr.add(&owner("c"), &r.netns).await.unwrap_err();
        assert!(matches!(err, ManagerError::RollbackFailed { .. }), "{err}");
        let recs = r.mgr.attachments().await;
        assert_eq!(recs.len(), 1, "the half-done attachment must stay recorded");
        assert_eq!(recs[0].phase, Phase::Adding);
        let report = r.mgr.recover().await.unwrap();
        assert_eq!(report.rolled_back, 1);
        r.assert_untouched("after recovery").await;
    }

    #[tokio::test]
    async fn recovery_finishes_a_fully_configured_adding_record() {
        let r = rig(1);
        r.mgr.add(&owner("c"), &r.netns).await.unwrap();
        // Simulate a crash before the outcome write.
        let mut rec = r.mgr.attachments().await.remove(0);
        rec.phase = Phase::Adding;
        r.mgr.checkpoint().put(rec).await.unwrap();
        let report = r.mgr.recover().await.unwrap();
        assert_eq!(report.finished, 1);
        assert_eq!(r.mgr.attachments().await[0].phase, Phase::Ready);
        r.mgr
            .check(&owner("c"), &r.netns, MtuExpectation::Recorded)
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn del_after_netns_vanished_releases_everything() {
        let r = rig(1);
        r.mgr.add(&owner("c"), &r.netns).await.unwrap();
        // A physical ENI returns to the host as dev<N> when its netns dies.
        let mut devs = r.fake.remove_netns(&r.netns);
        let mut dev = devs.remove(0);
        dev.link.name = "dev7".into();
        r.fake.world.lock().unwrap().host.push(dev);
        r.mgr.del(&owner("c")).await.unwrap();
        let back = r.fake.host_dev(mac(1)).unwrap();
        assert_eq!((back.link.name.as_str(), back.link.mtu), ("eni1", HOST_MTU));
        assert!(r.mgr.attachments().await.is_empty());
        assert!(r.provider.list().await.unwrap()[0].owner.is_none());
    }

    /// The move home sets the host name and MTU itself, so DEL looks for
    /// the device in the host only when the move could not bring it.
    #[tokio::test]
    async fn del_looks_for_the_device_only_when_the_move_did_not_bring_it_home() {
        let r = rig(1);
        r.mgr.add(&owner("c"), &r.netns).await.unwrap();
        r.mgr.del(&owner("c")).await.unwrap();
        assert_eq!(r.fake.calls("restore_host_link"), 0);
        let back = r.fake.host_dev(mac(1)).unwrap();
        assert_eq!((back.link.name.as_str(), back.link.mtu), ("eni1", HOST_MTU));

        r.mgr.add(&owner("d"), &r.netns).await.unwrap();
        let mut dev = r.fake.remove_netns(&r.netns).remove(0);
        dev.link.name = "dev7".into();
        r.fake.world.lock().unwrap().host.push(dev);
        r.mgr.del(&owner("d")).await.unwrap();
        assert_eq!(r.fake.calls("restore_host_link"), 1);
    }

    #[tokio::test]
    async fn stale_record_never_touches_another_owners_eni() {
        let r = rig(1);
        r.mgr.add(&owner("old"), &r.netns).await.unwrap();
        let stale = r.mgr.attachments().await.remove(0);
        // The old attachment was released, and the ENI given to a new pod,
        // but a crash left the old record behind.
        r.mgr.del(&owner("old")).await.unwrap();
        r.mgr.add(&owner("new"), &r.netns).await.unwrap();
        r.mgr.checkpoint().put(stale).await.unwrap();
        r.mgr.del(&owner("old")).await.unwrap();
        assert_eq!(r.fake.pod_devs(), 1, "the new owner's ENI was moved");
        r.mgr
            .check(&owner("new"), &r.netns, MtuExpectation::Recorded)
            .await
            .unwrap();
        assert_eq!(r.mgr.attachments().await.len(), 1);
    }

    #[tokio::test]
    async fn check_reports_drift() {
        let r = rig(1);
        r.mgr.add(&owner("c"), &r.netns).await.unwrap();
        r.mgr
            .check(&owner("c"), &r.netns, MtuExpectation::Recorded)
            .await
            .unwrap();
        r.fake
            .world
            .lock()
            .unwrap()
            .netns
            .get_mut(&r.netns)
            .unwrap()[0]
            .link
            .mtu = 1400;
        let err = r
            .mgr
            .check(&owner("c"), &r.netns, MtuExpectation::Recorded)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("MTU is 1400"), "{err}");
        // A later chained plugin may own the MTU: the runtime's result rules.
        r.mgr
            .check(&owner("c"), &r.netns, MtuExpectation::Exactly(1400))
            .await
            .unwrap();
        r.mgr
            .check(&owner("c"), &r.netns, MtuExpectation::Skip)
            .await
            .unwrap();
        let err = r
            .mgr
            .check(&owner("nobody"), &r.netns, MtuExpectation::Recorded)
            .await
            .unwrap_err();
        assert!(matches!(err, ManagerError::UnknownAttachment(_)), "{err}");
    }

    #[tokio::test]
    async fn gc_collects_dead_and_orphans_and_normalises_free_enis() {
        let r = rig(3);
        let gone = PathBuf::from("/run/netns/gone");
        r.fake.add_netns(&gone);
        r.mgr.add(&owner("live"), &r.netns).await.unwrap();
        r.mgr.add(&owner("dead"), &gone).await.unwrap();
        // The pod died without DEL: its netns went away, the ENI came back
        // to the host as dev<N>.
        let mut dev = r.fake.remove_netns(&gone).remove(0);
        dev.link.name = "dev42".into();
        r.fake.world.lock().unwrap().host.push(dev);
        // A crash between allocation and the intent write.
        r.provider.allocate_next(&owner("orphan")).await.unwrap();

        // Young attachments are left alone.
        let report = r
            .mgr
            .gc(&GcRequest::default(), Duration::from_secs(3600))
            .await;
        assert_eq!(report.too_young, 2);
        assert!(report.collected.is_empty());
        assert_eq!(report.orphans_released, vec!["eni-3".to_string()]);

        let report = r.mgr.gc(&GcRequest::default(), Duration::ZERO).await;
        assert_eq!(
            report.collected,
            vec!["n/dead/eth0".to_string()],
            "{report:?}"
        );
        assert!(report.errors.is_empty(), "{report:?}");
        let back = r.fake.host_dev(mac(2)).unwrap();
        assert_eq!((back.link.name.as_str(), back.link.mtu), ("eni2", HOST_MTU));
        r.mgr
            .check(&owner("live"), &r.netns, MtuExpectation::Recorded)
            .await
            .unwrap();

        // A free ENI renamed and retuned by someone else is put right.
        {
            let mut w = r.fake.world.lock().unwrap();
            let d = w.host.iter_mut().find(|d| d.link.mac == mac(3)).unwrap();
            d.link.name = "dev7".into();
            d.link.mtu = 1400;
        }
        let report = r.mgr.gc(&GcRequest::default(), Duration::ZERO).await;
        assert_eq!(report.normalised, vec!["eni-3".to_string()], "{report:?}");
        let d = r.fake.host_dev(mac(3)).unwrap();
        assert_eq!((d.link.name.as_str(), d.link.mtu), ("eni3", HOST_MTU));
        // Nothing left to do: a second pass is a no-op.
        let report = r.mgr.gc(&GcRequest::default(), Duration::ZERO).await;
        assert_eq!(report, GcReport::default());
    }

    #[tokio::test]
    async fn gc_of_records_without_devices_looks_at_the_host_once() {
        let r = rig(5);
        for i in 1..=5 {
            let ns = PathBuf::from(format!("/run/netns/p{i}"));
            r.fake.add_netns(&ns);
            r.mgr.add(&owner(&format!("c{i}")), &ns).await.unwrap();
        }
        // Four pods died with their devices (veths go with the netns); the
        // fifth's ENI came back to the host as dev9 with another MTU.
        for i in 1..=4 {
            r.fake
                .remove_netns(&PathBuf::from(format!("/run/netns/p{i}")));
        }
        let mut dev = r.fake.remove_netns(&PathBuf::from("/run/netns/p5"))[0].clone();
        dev.link.name = "dev9".into();
        dev.link.mtu = 1400;
        r.fake.world.lock().unwrap().host.push(dev);
        let lookups = r.fake.calls("host_link");

        let report = r.mgr.gc(&GcRequest::default(), Duration::ZERO).await;
        assert_eq!(report.collected.len(), 5, "{report:?}");
        assert!(report.errors.is_empty(), "{report:?}");
        assert_eq!(report.records_dropped.len(), 4, "{report:?}");
        assert_eq!(r.fake.calls("restore_host_links"), 1);
        assert_eq!(r.fake.calls("restore_host_link"), 0);
        assert_eq!(r.fake.calls("host_link"), lookups);
        let back = r.fake.host_dev(mac(5)).unwrap();
        assert_eq!((back.link.name.as_str(), back.link.mtu), ("eni5", HOST_MTU));
        assert!(r.mgr.attachments().await.is_empty());
        assert!(r
            .provider
            .list()
            .await
            .unwrap()
            .iter()
            .all(|e| e.owner.is_none()));
    }

    #[tokio::test]
    async fn gc_keeps_a_record_whose_device_could_not_be_put_home() {
        let r = rig(1);
        let gone = PathBuf::from("/run/netns/gone");
        r.fake.add_netns(&gone);
        r.mgr.add(&owner("c"), &gone).await.unwrap();
        let mut dev = r.fake.remove_netns(&gone).remove(0);
        dev.link.name = "dev3".into();
        r.fake.world.lock().unwrap().host.push(dev);
        r.fake.fail_once("restore_host_link");
        let report = r.mgr.gc(&GcRequest::default(), Duration::ZERO).await;
        assert!(report.collected.is_empty(), "{report:?}");
        assert_eq!(report.errors.len(), 1, "{report:?}");
        // Still recorded (as being deleted) and assigned: the next pass
        // finishes it.
        assert_eq!(r.mgr.attachments().await[0].phase, Phase::Deleting);
        assert!(r.provider.list().await.unwrap()[0].owner.is_some());
        let report = r.mgr.gc(&GcRequest::default(), Duration::ZERO).await;
        assert_eq!(report.collected, vec!["n/c/eth0".to_string()]);
        let back = r.fake.host_dev(mac(1)).unwrap();
        assert_eq!(back.link.name, "eni1");
    }

    #[tokio::test]
    async fn gc_valid_list_collects_only_omitted_attachments_of_its_network() {
        let r = rig(2);
        r.mgr.add(&owner("a"), &r.netns).await.unwrap();
        let mut b = owner("b");
        b.ifname = "net1".into();
        r.mgr.add(&b, &r.netns).await.unwrap();
        let request = GcRequest {
            network: Some("n".into()),
            valid_attachments: Some(vec![crate::api::ValidAttachment {
                container_id: "a".into(),
                ifname: "eth0".into(),
            }]),
        };
        let report = r.mgr.gc(&request, Duration::ZERO).await;
        assert_eq!(report.collected, vec!["n/b/net1".to_string()]);
        // Another network's GC list never touches this network.
        let other = GcRequest {
            network: Some("other".into()),
            valid_attachments: Some(vec![]),
        };
        assert!(r.mgr.gc(&other, Duration::ZERO).await.collected.is_empty());
        assert_eq!(r.mgr.attachments().await.len(), 1);
    }

    #[tokio::test]
    async fn gc_never_collects_an_attachment_mid_add() {
        let r = Arc::new(rig(1));
        let (entered, resume) = r.fake.pause_configure();
        let adder = {
            let r = r.clone();
            tokio::spawn(async move { r.mgr.add(&owner("c"), &r.netns).await })
        };
        entered.notified().await;
        assert_eq!(r.mgr.attachments().await[0].phase, Phase::Adding);
        // The runtime's view lags: its GC list does not have the new pod yet.
        let lagging = GcRequest {
            network: None,
            valid_attachments: Some(vec![]),
        };
        let report = r.mgr.gc(&lagging, Duration::from_secs(30)).await;
        assert_eq!(
            (report.too_young, report.collected.len()),
            (1, 0),
            "{report:?}"
        );
        resume.notify_one();
        adder.await.unwrap().expect("the ADD completes untouched");
        r.mgr
            .check(&owner("c"), &r.netns, MtuExpectation::Recorded)
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn unclaimed_attachments_expire_unless_claimed() {
        let r = rig(2);
        let other = PathBuf::from("/run/netns/other");
        r.fake.add_netns(&other);
        r.mgr.add(&owner("a"), &r.netns).await.unwrap();
        r.mgr.add(&owner("b"), &other).await.unwrap();
        let long = Duration::from_secs(3600);
        for cid in ["a", "b"] {
            r.mgr
                .mark_unclaimed(&key_of(&owner(cid)), Duration::ZERO)
                .await
                .unwrap();
        }
        // "a" is claimed by the runtime's retried ADD; "b" is never claimed.
        r.mgr.add(&owner("a"), &r.netns).await.unwrap();
        assert!(r
            .mgr
            .attachments()
            .await
            .iter()
            .find(|a| a.key.container_id == "a")
            .unwrap()
            .expires_ms
            .is_none());
        // Expiry beats the grace period: the runtime has given up on "b".
        let report = r.mgr.gc(&GcRequest::default(), long).await;
        assert_eq!(report.collected, vec!["n/b/eth0".to_string()], "{report:?}");
        assert_eq!(report.too_young, 1);
        r.mgr
            .check(&owner("a"), &r.netns, MtuExpectation::Recorded)
            .await
            .unwrap();
        // A kept-but-unexpired one stays, and CHECK claims it too.
        r.mgr
            .mark_unclaimed(&key_of(&owner("a")), long)
            .await
            .unwrap();
        assert!(r
            .mgr
            .gc(&GcRequest::default(), Duration::ZERO)
            .await
            .collected
            .is_empty());
        r.mgr
            .check(&owner("a"), &r.netns, MtuExpectation::Recorded)
            .await
            .unwrap();
        assert!(r.mgr.attachments().await[0].expires_ms.is_none());
    }

    #[tokio::test]
    async fn excluded_and_primary_enis_are_never_handed_out() {
        use crate::exclusion::ExclusionConfig;
        let r = rig(4);
        r.fake.add_netns(&PathBuf::from("/run/netns/p2"));
        // eni-1 is in use from before it was excluded; eni-2 excluded by MAC;
        // eni-3 is the node's primary interface.
        r.mgr.add(&owner("old"), &r.netns).await.unwrap();
        *r.fake.primary.lock().unwrap() = Some(mac(3));
        let mgr = EniManager::new(
            r.provider.clone(),
            r.fake.clone(),
            r.mgr.checkpoint().clone(),
        )
        .with_exclusions(Exclusions::from_config(&ExclusionConfig {
            enis: vec!["eni-1".into(), mac(2).to_string()],
            addresses: vec![],
        }));
        mgr.recover().await.unwrap();
        let listed = r.provider.list().await.unwrap();
        let holder = |id: &str| listed.iter().find(|e| e.id == id).unwrap().owner.clone();
        assert_eq!(
            holder("eni-1").unwrap().container_id,
            "old",
            "a live attachment keeps its ENI"
        );
        assert!(is_excluded_owner(&holder("eni-2").unwrap()));
        assert!(is_excluded_owner(&holder("eni-3").unwrap()));
        // Only eni-4 can be handed out.
        let p2 = PathBuf::from("/run/netns/p2");
        assert_eq!(mgr.add(&owner("new"), &p2).await.unwrap().eni_id, "eni-4");
        r.fake.add_netns(&PathBuf::from("/run/netns/p3"));
        let err = mgr
            .add(&owner("third"), &PathBuf::from("/run/netns/p3"))
            .await
            .unwrap_err();
        assert!(
            matches!(err, ManagerError::Provider(ProviderError::Exhausted { .. })),
            "{err}"
        );
        // GC neither releases reservations as orphans nor renames them.
        let report = mgr.gc(&GcRequest::default(), Duration::ZERO).await;
        assert!(
            report.orphans_released.is_empty() && report.normalised.is_empty(),
            "{report:?}"
        );
        // Once the old attachment goes, eni-1 becomes reserved, not free.
        mgr.del(&owner("old")).await.unwrap();
        mgr.gc(&GcRequest::default(), Duration::ZERO).await;
        let listed = r.provider.list().await.unwrap();
        assert!(
            is_excluded_owner(listed[0].owner.as_ref().unwrap()),
            "{:?}",
            listed[0]
        );
    }
}
