//! The primary-mode driver: allocation from the provider, the device's
//! move into the pod and back (over [`Plumbing`]), release.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use enim_api::model::{now_ms, Mode, Payload, Phase, PrimaryPayload, Record};
use enim_api::{EniStatus, GcReport, GcRequest};
use enim_core::{Eni, EniOwner, MacAddr};
use enim_provider::EniProvider;
use ipnet::IpNet;

use crate::engine::{Driver, EngineError, Unplumbed};
use crate::netlink::{
    HostLinkHome, HostPathSpec, LinkInfo, Own, Plumbing, PlumbingError, PodLinkConfig,
};
use crate::store::checkpoint::{Checkpoint, HostHome};
use crate::support::exclusion::{excluded_owner, Exclusions, LiveExclusions, Reservation};
use crate::support::fault::crash_point;
use crate::support::metadata::MetadataConfig;

use super::hostpath::HostPathConfig;
use super::servicecidrs::ServiceCidrs;

/// How long an ADD waits for the first listing of the API's service CIDRs
/// (an agent just started) before "try again later".
const SERVICE_CIDRS_WAIT: Duration = Duration::from_secs(10);

pub struct PrimaryDriver {
    pub(super) provider: Arc<dyn EniProvider>,
    pub(super) plumbing: Arc<dyn Plumbing>,
    pub(super) checkpoint: Arc<Checkpoint>,
    // Configured exclusions; the node's own devices the provider lists
    // join them as they are found (netlink::handout).
    pub(super) exclusions: LiveExclusions,
    pub(super) host_path: HostPathConfig,
    /// The service CIDRs host paths route: `host_path`'s, or the API's.
    pub(super) service_cidrs: ServiceCidrs,
    pub(super) pod_metadata: MetadataConfig,
    /// Host path veths a DEL deletes behind its answer.
    deletions_behind: DeletionsBehind,
}

/// Host path veths being deleted behind the answer of the DEL that took
/// their pod's ENI home. Deleting a device waits out an `rcu_barrier()` in
/// the kernel (about 15 ms here, as long as the ENI's own move), and the
/// answer does not need it: the pod's processes are gone, and the runtime
/// ends its netns next, which takes the veth with it anyway. Counted while
/// in flight, so that an ADD's host path waits for them: the ENI may go
/// straight to the next pod, with the same address, whose host route the
/// old veth still holds. One lost to a crash is GC's stray-veth sweep's.
struct DeletionsBehind(Arc<tokio::sync::watch::Sender<usize>>);

/// Counts one deletion down when its task ends, however it ends.
struct InFlight(Arc<tokio::sync::watch::Sender<usize>>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl DeletionsBehind {
    fn new() -> Self {
        DeletionsBehind(Arc::new(tokio::sync::watch::channel(0).0))
    }

    fn start(&self, plumbing: &Arc<dyn Plumbing>, veths: Vec<String>) {
        for veth in veths {
            self.0.send_modify(|n| *n += 1);
            let in_flight = InFlight(self.0.clone());
            let plumbing = plumbing.clone();
            tokio::spawn(async move {
                let _in_flight = in_flight;
                if let Err(e) = plumbing.remove_host_path(&veth).await {
                    tracing::warn!(veth, error = %e, "could not delete a host path behind its DEL; GC's sweep will");
                }
            });
        }
    }

    /// Returns once none is in flight.
    async fn settled(&self) {
        let mut count = self.0.subscribe();
        // The sender lives in `self`: the wait cannot fail.
        let _ = count.wait_for(|n| *n == 0).await;
    }
}

/// The kernel's view of `record`'s host path, if it has one.
fn host_path_spec(record: &Record) -> Option<HostPathSpec<'_>> {
    let p = record.primary()?;
    let hp = p.host_path.as_ref()?;
    Some(HostPathSpec {
        netns: &record.netns,
        host_veth: &hp.host_veth,
        ifname: &hp.ifname,
        mtu: record.mtu,
        pod_ips: record.ips(),
        routes: &hp.routes,
    })
}

/// Completes `record`'s host path with its pod end's MAC.
fn learn_host_path_mac(record: &mut Record, mac: MacAddr) {
    if let Payload::Primary(PrimaryPayload {
        host_path: Some(hp),
        ..
    }) = &mut record.payload
    {
        hp.mac = Some(mac);
    }
}

/// The host path's pod end MAC, once known.
fn spec_mac(record: &Record) -> Option<MacAddr> {
    record.primary()?.host_path.as_ref()?.mac
}

/// Where the record's device belongs in the host.
fn home_of(p: &PrimaryPayload) -> HostLinkHome<'_> {
    HostLinkHome {
        mac: p.mac,
        name: &p.host_name,
        mtu: p.host_mtu,
    }
}

fn payload(record: &Record) -> Result<&PrimaryPayload, EngineError> {
    record.primary().ok_or_else(|| {
        EngineError::InvalidRequest(format!("{} is not a primary-mode record", record.key))
    })
}

impl PrimaryDriver {
    /// `checkpoint` is read for free ENIs' host homes (learned at first
    /// sight); records are the engine's to write.
    pub fn new(
        provider: Arc<dyn EniProvider>,
        plumbing: Arc<dyn Plumbing>,
        checkpoint: Arc<Checkpoint>,
        exclusions: Exclusions,
    ) -> Self {
        PrimaryDriver {
            provider,
            plumbing,
            checkpoint,
            exclusions: LiveExclusions::new(exclusions),
            host_path: HostPathConfig::default(),
            service_cidrs: ServiceCidrs::Configured(Arc::from([])),
            pod_metadata: MetadataConfig::default(),
            deletions_behind: DeletionsBehind::new(),
        }
    }

    /// Refuses pods the metadata service as `config` says
    /// (docs/security.md, "The instance metadata service").
    pub fn with_pod_metadata(self, config: MetadataConfig) -> Self {
        PrimaryDriver {
            pod_metadata: config,
            ..self
        }
    }

    /// Gives pods a host path (docs/architecture.md, "The host path") under
    /// `config`, routing its service CIDRs.
    pub fn with_host_path(self, config: HostPathConfig) -> Self {
        PrimaryDriver {
            service_cidrs: ServiceCidrs::Configured(config.service_cidrs.as_slice().into()),
            host_path: config,
            ..self
        }
    }

    /// Routes the service CIDRs `source` says (the API's, followed)
    /// instead of the configured ones.
    pub fn with_service_cidrs(self, source: ServiceCidrs) -> Self {
        PrimaryDriver {
            service_cidrs: source,
            ..self
        }
    }

    /// The service CIDRs a host path routes now, less any prefix refused to
    /// pods ([pod_metadata] blocked): its prohibit route would clash.
    async fn service_cidrs(&self, wait: Duration) -> Result<Vec<IpNet>, EngineError> {
        let cidrs = self
            .service_cidrs
            .current(wait)
            .await
            .map_err(|e| EngineError::ServiceCidrsUnknown(e.to_string()))?;
        let blocked = &self.pod_metadata.blocked;
        Ok(cidrs
            .iter()
            .filter(|c| !blocked.contains(c))
            .copied()
            .collect())
    }

    pub fn plumbing(&self) -> &Arc<dyn Plumbing> {
        &self.plumbing
    }

    pub(super) fn exclusions(&self) -> Exclusions {
        self.exclusions.snapshot()
    }

    /// Whether `eni` is excluded now.
    fn is_excluded(&self, eni: &Eni) -> bool {
        self.exclusions.is_excluded(eni)
    }

    /// Excludes `eni` from now on, its device being the node's own; logs
    /// the first time.
    fn refuse(&self, eni: &Eni, device: &str, why: &dyn std::fmt::Display) {
        let outcome = "never handed to a pod; reserved as excluded";
        self.exclusions.refuse(eni, device, why, outcome);
    }

    /// Surveys the host for devices never to be handed out
    /// ([`crate::netlink::handout`]) and excludes the ENIs among them (the
    /// caller's [`Self::reserve_excluded`] reserves them).
    pub(super) async fn exclude_refused(&self) -> Result<(), EngineError> {
        let prefixes = [self.host_path.veth_prefix.as_str()];
        let own = Own {
            veth_prefixes: &prefixes,
            ..Own::default()
        };
        let refused = self
            .plumbing
            .refused_devices(own)
            .await
            .map_err(EngineError::plumbing("survey host devices"))?;
        if refused.is_empty() {
            return Ok(());
        }
        for eni in self.provider.list().await? {
            if let Some(d) = refused.iter().find(|d| d.mac == eni.mac) {
                self.refuse(&eni, &d.name, &d.why);
            }
        }
        Ok(())
    }

    /// Holds `eni`, just released by an ADD that may not have it, under
    /// `reservation`. Another ADD that took it meanwhile keeps it: that
    /// ADD judges it too.
    async fn set_aside(&self, eni: &Eni, reservation: Reservation) -> Result<(), EngineError> {
        let held = [(eni.id.clone(), reservation.owner(&eni.id))];
        match self.provider.restore(&held).await {
            Ok(()) | Err(enim_core::ProviderError::OwnedByOther { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Reserves every excluded ENI that is free (and not held by one of
    /// `held`, an attachment made before the exclusion: it is left alone
    /// until released), so the provider can never hand it out.
    pub(super) async fn reserve_excluded(
        &self,
        held: &HashSet<String>,
    ) -> Result<Vec<String>, EngineError> {
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

    /// The MACs of every device in the host (one dump).
    async fn macs_in_host(&self) -> Result<HashSet<MacAddr>, EngineError> {
        Ok(self
            .plumbing
            .host_links()
            .await
            .map_err(EngineError::plumbing("list host devices"))?
            .into_iter()
            .map(|l| l.mac)
            .collect())
    }

    /// The intent record of `eni`, found in the host as `host`.
    fn intent(owner: &EniOwner, netns: &Path, eni: &Eni, host: &LinkInfo) -> Record {
        let now = now_ms();
        Record {
            key: enim_api::model::AttachmentKey::of(owner),
            pod: owner.pod.clone(),
            eni_id: eni.id.clone(),
            netns: netns.to_path_buf(),
            mtu: eni.mtu.unwrap_or(host.mtu),
            phase: Phase::Adding,
            created_ms: now,
            updated_ms: now,
            expires_ms: None,
            payload: Payload::Primary(PrimaryPayload {
                mac: eni.mac,
                host_name: host.name.clone(),
                host_mtu: host.mtu,
                ipv4: eni.ipv4,
                gateway4: eni.gateway4,
                ipv6: eni.ipv6,
                gateway6: eni.gateway6,
                host_path: None,
            }),
        }
    }

    /// The host path `record` gets, planned into its intent: the node's
    /// addresses are read now, and the record keeps what was planned.
    async fn plan_host_path(&self, record: &mut Record) -> Result<(), EngineError> {
        if !self.host_path.applies_to(&record.key) {
            return Ok(());
        }
        let node = self
            .plumbing
            .node_addresses()
            .await
            .map_err(EngineError::plumbing("list node addresses"))?;
        let services = self.service_cidrs(SERVICE_CIDRS_WAIT).await?;
        let pod_ips = record.ips();
        if let Payload::Primary(p) = &mut record.payload {
            p.host_path = self.host_path.plan(&record.key, &services, &pod_ips, &node);
        }
        Ok(())
    }

    /// The allocated `eni`'s device and intent; `Err` before anything else
    /// holds it.
    async fn find_and_learn(
        &self,
        owner: &EniOwner,
        netns: &Path,
        eni: &Eni,
    ) -> Result<(Record, LinkInfo), EngineError> {
        let prefixes = [self.host_path.veth_prefix.as_str()];
        let own = Own {
            veth_prefixes: &prefixes,
            ..Own::default()
        };
        let host = self
            .plumbing
            .eni_link(eni.mac, own)
            .await
            .map_err(EngineError::plumbing("find ENI in host"))?
            .ok_or_else(|| EngineError::DeviceMissing {
                eni_id: eni.id.clone(),
                mac: eni.mac.to_string(),
            })?;
        // First sight of this ENI in the host: remember its home.
        let home = HostHome {
            name: host.name.clone(),
            mtu: host.mtu,
        };
        self.checkpoint.learn_homes([(eni.mac, home)]).await?;
        let mut record = Self::intent(owner, netns, eni, &host);
        self.plan_host_path(&mut record).await?;
        Ok((record, host))
    }

    /// Returns once no host path is being deleted behind a DEL's answer.
    pub async fn settled_deletions(&self) {
        self.deletions_behind.settled().await;
    }

    /// Moves each device home (the move sets its host name and MTU); those
    /// the move could not bring (not in the pod, or home under a fallback
    /// name) are found and put right with one look at the host. Each host
    /// path is deleted after its ENI moved: at once, or with `behind` (a
    /// DEL) behind the answer.
    async fn unplumb_batch(
        &self,
        records: &[Record],
        behind: bool,
    ) -> Vec<Result<Unplumbed, EngineError>> {
        let mut out: Vec<Option<Result<Unplumbed, EngineError>>> =
            Vec::with_capacity(records.len());
        // Devices not home after their move (not in the pod, or home under
        // a fallback name): found and put right with one look at the host.
        let mut moved_elsewhere = Vec::new();
        // Host paths to delete behind the answer (`behind`).
        let mut veths_behind = Vec::new();
        for r in records {
            let Ok(p) = payload(r) else {
                out.push(Some(payload(r).map(|_| Unplumbed::Home)));
                continue;
            };
            let moved = match self.plumbing.move_to_host(&r.netns, home_of(p)).await {
                Ok(moved) => moved,
                Err(e) if e.is_netns_gone() => None,
                Err(e) => {
                    out.push(Some(Err(EngineError::plumbing("return ENI to host")(e))));
                    continue;
                }
            };
            // The host path after its ENI, so a failed move leaves the pod
            // whole for the retry. It died with the netns if that is gone;
            // removal by name is then a no-op.
            if let Some(hp) = &p.host_path {
                if behind {
                    veths_behind.push(hp.host_veth.clone());
                } else if let Err(e) = self.plumbing.remove_host_path(&hp.host_veth).await {
                    out.push(Some(Err(EngineError::plumbing("remove host path")(e))));
                    continue;
                }
            }
            // The move itself set the host name and MTU: nothing to look up.
            if moved.is_some_and(|l| l.is_home(&p.host_name, p.host_mtu)) {
                out.push(Some(Ok(Unplumbed::Home)));
                continue;
            }
            moved_elsewhere.push((out.len(), p));
            out.push(None);
        }
        crash_point("del:after-move");
        self.deletions_behind.start(&self.plumbing, veths_behind);
        // One look at the host for the whole batch, not a link dump per
        // device, and none at all when every move brought its device home.
        if moved_elsewhere.is_empty() {
            crash_point("del:after-restore");
            return out
                .into_iter()
                .map(|o| o.unwrap_or(Ok(Unplumbed::Home)))
                .collect();
        }
        let homes: Vec<HostLinkHome<'_>> =
            moved_elsewhere.iter().map(|(_, p)| home_of(p)).collect();
        match self.plumbing.restore_host_links(&homes).await {
            Ok(restored) => {
                for ((slot, _), result) in moved_elsewhere.iter().zip(restored) {
                    out[*slot] = Some(
                        result
                            .map(|found| {
                                if found {
                                    Unplumbed::Home
                                } else {
                                    Unplumbed::DeviceGone
                                }
                            })
                            .map_err(EngineError::plumbing("restore host name and MTU")),
                    );
                }
            }
            Err(e) => {
                let shared = Arc::new(EngineError::plumbing("look at host links")(e));
                for (slot, _) in &moved_elsewhere {
                    out[*slot] = Some(Err(EngineError::Shared(shared.clone())));
                }
            }
        }
        crash_point("del:after-restore");
        out.into_iter()
            .map(|o| o.unwrap_or(Ok(Unplumbed::Home)))
            .collect()
    }
}

#[async_trait]
impl Driver for PrimaryDriver {
    const MODE: Mode = Mode::Primary;
    /// The ENI's place says it all: in the pod, the DEL did not happen; in
    /// the host, it did; in neither, the netns died (GC's case).
    const DEL_INTENT_BEHIND: bool = true;
    /// The device as allocation found it in the host.
    type Allocation = LinkInfo;

    fn provider(&self) -> &Arc<dyn EniProvider> {
        &self.provider
    }

    async fn check_netns(&self, netns: &Path) -> Result<(), PlumbingError> {
        self.plumbing.check_netns(netns).await
    }

    async fn restore(&self, records: &[Record]) -> Result<(), EngineError> {
        let assignments: Vec<(String, EniOwner)> = records
            .iter()
            .map(|r| (r.eni_id.clone(), r.owner()))
            .collect();
        self.provider.restore(&assignments).await?;
        // The node's own devices (its uplink first) are never a pod's,
        // whatever the list says: found now, at each GC pass, and by each
        // ADD for the ENI it takes.
        if let Err(e) = self.exclude_refused().await {
            tracing::warn!(error = %e, "could not survey the host's devices; each ADD still judges its own");
        }
        let held: HashSet<String> = records.iter().map(|r| r.eni_id.clone()).collect();
        let reserved = self.reserve_excluded(&held).await?;
        if !reserved.is_empty() {
            tracing::info!(?reserved, "excluded ENIs reserved");
        }
        // Quarantines live in the provider's memory: found again here.
        let in_host = self.macs_in_host().await?;
        self.quarantine_missing(&self.provider.list().await?, &in_host)
            .await?;
        Ok(())
    }

    /// An ENI that may not go to a pod is released, held and skipped, and
    /// the next free ENI is tried in the same ADD: one excluded (by config,
    /// or found the node's own since the last survey) or whose device the
    /// hand-out rule refuses now is reserved as excluded; one whose device
    /// is missing from the host is quarantined. Each holds one more ENI,
    /// so this ends, at worst in "no free ENI" (with the refusal said).
    async fn allocate(
        &self,
        owner: &EniOwner,
        netns: &Path,
    ) -> Result<(Record, LinkInfo), EngineError> {
        // The last ENI refused in this ADD: named in the error if no other
        // can be taken.
        let mut refused: Option<(String, String)> = None;
        loop {
            let eni = match self.provider.allocate_next(owner).await {
                Ok(eni) => eni,
                Err(then) => {
                    return Err(match refused {
                        Some((eni_id, why)) => EngineError::DeviceRefused {
                            eni_id,
                            why,
                            then: Box::new(then),
                        },
                        None => then.into(),
                    })
                }
            };
            // Consulted at each allocation, not only when GC reserves: an
            // entry can arrive in the list between two passes (or with
            // GC off).
            let excluded = self.is_excluded(&eni);
            let err = match excluded {
                true => None,
                false => match self.find_and_learn(owner, netns, &eni).await {
                    Ok(found) => return Ok(found),
                    Err(e) => Some(e),
                },
            };
            if let Err(undo) = self.provider.release(owner).await {
                return Err(match err {
                    Some(original) => EngineError::RollbackFailed {
                        original: Box::new(original),
                        undo: Box::new(undo.into()),
                    },
                    None => undo.into(),
                });
            }
            match err {
                None => {
                    tracing::warn!(eni = %eni.id, mac = %eni.mac, "allocated ENI is excluded: reserved; trying the next");
                    self.set_aside(&eni, Reservation::Excluded).await?;
                    refused = Some((eni.id.clone(), "it is excluded".into()));
                }
                Some(EngineError::DeviceMissing { .. }) => {
                    tracing::warn!(eni = %eni.id, mac = %eni.mac, "allocated ENI has no device in the host: quarantined; trying the next");
                    self.set_aside(&eni, Reservation::Missing).await?;
                }
                Some(EngineError::Plumbing {
                    source: PlumbingError::Refused { device, why, .. },
                    ..
                }) => {
                    self.refuse(&eni, &device, &why);
                    self.set_aside(&eni, Reservation::Excluded).await?;
                    tracing::warn!(eni = %eni.id, "trying the next ENI");
                    refused = Some((eni.id.clone(), format!("device {device} {why}")));
                }
                Some(e) => return Err(e),
            }
        }
    }

    async fn plumb(&self, record: &mut Record, host: LinkInfo) -> Result<(), EngineError> {
        let p = payload(record)?;
        self.plumbing
            .move_to_pod(&host, &record.netns, &record.key.ifname)
            .await
            .map_err(EngineError::pod_side("move ENI into pod"))?;
        crash_point("add:after-move");
        let config = PodLinkConfig {
            ifname: record.key.ifname.clone(),
            mtu: record.mtu,
            ipv4: p.ipv4,
            gateway4: p.gateway4,
            ipv6: p.ipv6,
            gateway6: p.gateway6,
            blocked: self
                .pod_metadata
                .blocked_for(&record.pod, true, p.ipv6.is_some()),
        };
        self.plumbing
            .configure_pod_link(&record.netns, p.mac, &config)
            .await
            .map_err(EngineError::plumbing("configure ENI in pod"))?;
        // After the ENI: the host path's routes prefer the ENI's addresses
        // as source, which must exist in the pod first.
        let Some(spec) = host_path_spec(record) else {
            return Ok(());
        };
        // A host path a DEL still deletes may hold this pod's address.
        self.deletions_behind.settled().await;
        let mac = self
            .plumbing
            .add_host_path(&spec)
            .await
            .map_err(EngineError::pod_side("make host path"))?;
        learn_host_path_mac(record, mac);
        Ok(())
    }

    /// Re-plans the host path with the service CIDRs and node addresses of
    /// now, and routes the difference in the pod.
    async fn refresh(&self, record: &Record) -> Result<Option<Record>, EngineError> {
        let Some(spec) = host_path_spec(record) else {
            return Ok(None);
        };
        let services = self.service_cidrs(Duration::ZERO).await?;
        let node = self
            .plumbing
            .node_addresses()
            .await
            .map_err(EngineError::plumbing("list node addresses"))?;
        let Some(new) = self
            .host_path
            .plan(&record.key, &services, &record.ips(), &node)
        else {
            return Ok(None);
        };
        let old = spec.routes;
        if new.routes == old {
            return Ok(None);
        }
        let add: Vec<IpNet> = new
            .routes
            .iter()
            .filter(|r| !old.contains(r))
            .copied()
            .collect();
        let remove: Vec<IpNet> = old
            .iter()
            .filter(|r| !new.routes.contains(r))
            .copied()
            .collect();
        self.plumbing
            .reroute_host_path(&spec, &add, &remove)
            .await
            .map_err(EngineError::plumbing("reroute host path"))?;
        tracing::info!(key = %record.key, ?add, ?remove, "host path rerouted");
        let mut updated = record.clone();
        if let Payload::Primary(PrimaryPayload {
            host_path: Some(hp),
            ..
        }) = &mut updated.payload
        {
            hp.routes = new.routes;
        }
        updated.updated_ms = now_ms();
        Ok(Some(updated))
    }

    async fn verify(&self, record: &mut Record, want_mtu: Option<u32>) -> Option<String> {
        let mac = record.mac()?;
        match self.plumbing.pod_link(&record.netns, mac).await {
            Ok(Some(state)) => {
                if let Some(why) = state.mismatch(&record.result(), want_mtu) {
                    return Some(why);
                }
            }
            Ok(None) => return Some(format!("no device with MAC {mac} in the netns")),
            Err(e) => return Some(e.to_string()),
        }
        let spec = host_path_spec(record)?;
        let known = spec_mac(record);
        let found = match self.plumbing.check_host_path(&spec, known).await {
            Ok(Ok(found)) => found,
            Ok(Err(why)) => return Some(why),
            Err(e) => return Some(e.to_string()),
        };
        // An intent finished by recovery learns the pod end's MAC here.
        learn_host_path_mac(record, found);
        None
    }

    async fn unplumb(&self, record: &Record) -> Result<Unplumbed, EngineError> {
        self.unplumb_many(std::slice::from_ref(record))
            .await
            .pop()
            .unwrap_or(Ok(Unplumbed::Home))
    }

    async fn unplumb_many(&self, records: &[Record]) -> Vec<Result<Unplumbed, EngineError>> {
        self.unplumb_batch(records, false).await
    }

    /// A pod's teardown (its DEL, or an ADD undoing its old attempt): host
    /// paths are deleted behind the answer ([`DeletionsBehind`]).
    async fn unplumb_for_pod(&self, records: &[Record]) -> Vec<Result<Unplumbed, EngineError>> {
        self.unplumb_batch(records, true).await
    }

    async fn release(&self, record: &Record) -> Result<(), EngineError> {
        self.provider.release(&record.owner()).await?;
        Ok(())
    }

    /// One look at the host for all of them.
    async fn came_home(&self, records: &[Record]) -> Result<Vec<bool>, EngineError> {
        let in_host = self.macs_in_host().await?;
        Ok(records
            .iter()
            .map(|r| r.mac().is_some_and(|m| in_host.contains(&m)))
            .collect())
    }

    async fn release_unrecorded(&self, owner: &EniOwner) -> Result<(), EngineError> {
        // Releasing by owner frees only what this very attachment holds.
        self.provider.release(owner).await?;
        Ok(())
    }

    async fn stale(&self, records: &[Record]) -> Result<Vec<bool>, EngineError> {
        let holders: HashMap<String, Option<EniOwner>> = self
            .provider
            .list()
            .await?
            .into_iter()
            .map(|e| (e.id, e.owner))
            .collect();
        Ok(records
            .iter()
            .map(|r| {
                holders
                    .get(&r.eni_id)
                    .and_then(|h| h.as_ref())
                    .is_some_and(|h| !h.same_attachment(&r.owner()))
            })
            .collect())
    }

    async fn gc_host(&self, records: &[Record], request: &GcRequest, report: &mut GcReport) {
        self.sweep_host_paths(records, report).await;
        self.release_orphans(records, request, report).await;
        self.return_found_enis(report).await;
        // Before normalising: a device of the node's own that arrived in
        // the list is reserved before anything would rename it.
        if let Err(e) = self.exclude_refused().await {
            report.error("node", enim_api::GcStep::ReserveExcluded, e);
        }
        // An excluded ENI whose last attachment just went is reserved again.
        let held: HashSet<String> = records.iter().map(|a| a.eni_id.clone()).collect();
        if let Err(e) = self.reserve_excluded(&held).await {
            report.error("node", enim_api::GcStep::ReserveExcluded, e);
        }
        self.normalise_free_enis(records, report).await;
    }

    async fn enis(&self) -> Result<Vec<EniStatus>, EngineError> {
        self.eni_statuses().await
    }
}
