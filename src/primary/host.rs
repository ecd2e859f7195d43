//! The primary driver's view of the host as a whole: GC's host pass (stray
//! host paths, orphaned assignments, drifted free ENIs, quarantines) and
//! the ENI listing.

use std::collections::{HashMap, HashSet};

use enim_api::model::{AttachmentKey, Record};
use enim_api::{EniState, EniStatus, GcReport, GcRequest, GcStep};

use crate::engine::EngineError;
use crate::netlink::HostLinkHome;
use crate::store::checkpoint::HostHome;
use crate::support::exclusion::Reservation;
use enim_core::{Eni, EniOwner, MacAddr};

use super::PrimaryDriver;

impl PrimaryDriver {
    /// ENIs the provider assigns with no record: a crash between allocation
    /// and the intent write. Runs with no ADD in flight (the engine's fence),
    /// so no allocation is between those two steps now.
    pub(super) async fn release_orphans(
        &self,
        records: &[Record],
        request: &GcRequest,
        report: &mut GcReport,
    ) {
        let enis = match self.provider.list().await {
            Ok(enis) => enis,
            Err(e) => return report.error("node", GcStep::ProviderList, e),
        };
        let recorded: HashSet<&AttachmentKey> = records.iter().map(|r| &r.key).collect();
        for eni in enis {
            let Some(owner) = eni.owner else { continue };
            if Reservation::of(&owner).is_some()
                || request
                    .network
                    .as_ref()
                    .is_some_and(|n| *n != owner.network)
                || recorded.contains(&AttachmentKey::of(&owner))
            {
                continue;
            }
            match self.provider.release(&owner).await {
                Ok(()) => report.orphans_released.push(eni.id.clone()),
                Err(e) => report.error(&eni.id, GcStep::ReleaseOrphan, e),
            }
        }
    }

    /// Removes host path veths (by enim's naming) that no record explains:
    /// left by a crash between making one and recording its undo, or by a
    /// record lost with its checkpoint. Runs with no ADD or DEL in flight.
    pub(super) async fn sweep_host_paths(&self, records: &[Record], report: &mut GcReport) {
        let veths = match self.plumbing.host_veths().await {
            Ok(v) => v,
            Err(e) => return report.error("node", GcStep::Inventory, e),
        };
        let explained: HashSet<&str> = records
            .iter()
            .filter_map(|r| r.primary()?.host_path.as_ref())
            .map(|hp| hp.host_veth.as_str())
            .collect();
        for veth in veths {
            if !self.host_path.is_veth_name(&veth) || explained.contains(veth.as_str()) {
                continue;
            }
            match self.plumbing.remove_host_path(&veth).await {
                Ok(()) => {
                    tracing::info!(veth, "removed a stray host path");
                    report.swept.push(format!("veth {veth}"));
                }
                Err(e) => report.error(format!("veth {veth}"), GcStep::Sweep, e),
            }
        }
    }

    /// Learns the host home of every free ENI seen for the first time, and
    /// puts back the name and MTU of a free ENI that has drifted from its
    /// home (renamed to `dev<N>` by a dying netns, or by hand).
    pub(super) async fn normalise_free_enis(&self, records: &[Record], report: &mut GcReport) {
        let (enis, links) = match (self.provider.list().await, self.plumbing.host_links().await) {
            (Ok(e), Ok(l)) => (e, l),
            (Err(e), _) => return report.error("node", GcStep::ProviderList, e),
            (_, Err(e)) => return report.error("node", GcStep::HostLinks, e),
        };
        let recorded: HashSet<_> = records.iter().filter_map(Record::mac).collect();
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
            report.error("node", GcStep::LearnHomes, e);
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
                .restore_host_link(HostLinkHome {
                    mac: eni.mac,
                    name: &home.name,
                    mtu: home.mtu,
                })
                .await
            {
                Ok(_) => {
                    tracing::info!(eni = %eni.id, from = %link.name, to = %home.name, mtu = home.mtu, "normalised free ENI");
                    report.normalised.push(eni.id.clone());
                }
                Err(e) => report.error(&eni.id, GcStep::Normalise, e),
            }
        }
    }

    /// Quarantines every ENI in `enis` that is free but whose device is not
    /// in the host (`in_host`: the MACs there), so no ADD allocates it.
    pub(super) async fn quarantine_missing(
        &self,
        enis: &[Eni],
        in_host: &HashSet<MacAddr>,
    ) -> Result<Vec<String>, EngineError> {
        let missing: Vec<(String, EniOwner)> = enis
            .iter()
            .filter(|e| e.owner.is_none() && !in_host.contains(&e.mac))
            .map(|e| (e.id.clone(), Reservation::Missing.owner(&e.id)))
            .collect();
        if !missing.is_empty() {
            self.provider.restore(&missing).await?;
            tracing::warn!(enis = ?missing.iter().map(|(id, _)| id).collect::<Vec<_>>(), "ENI devices missing from the host: quarantined until they are back");
        }
        Ok(missing.into_iter().map(|(id, _)| id).collect())
    }

    /// GC: frees quarantined ENIs whose device is back (by MAC, under any
    /// name: normalising then puts its host name right).
    pub(super) async fn return_found_enis(&self, report: &mut GcReport) {
        let (enis, links) = match (self.provider.list().await, self.plumbing.host_links().await) {
            (Ok(e), Ok(l)) => (e, l),
            (Err(e), _) => return report.error("node", GcStep::ProviderList, e),
            (_, Err(e)) => return report.error("node", GcStep::HostLinks, e),
        };
        let in_host: HashSet<MacAddr> = links.iter().map(|l| l.mac).collect();
        for eni in enis {
            let Some(owner) = eni
                .owner
                .filter(|o| Reservation::of(o) == Some(Reservation::Missing))
            else {
                continue;
            };
            if !in_host.contains(&eni.mac) {
                continue;
            }
            match self.provider.release(&owner).await {
                Ok(()) => {
                    tracing::info!(eni = %eni.id, mac = %eni.mac, "quarantined ENI's device is back: free again");
                    report.back_in_service.push(eni.id);
                }
                Err(e) => report.error(&eni.id, GcStep::ReleaseOrphan, e),
            }
        }
    }

    /// Every ENI the provider knows, its state and its host device.
    pub(super) async fn eni_statuses(&self) -> Result<Vec<EniStatus>, EngineError> {
        let listed = self.provider.list().await?;
        let host = self.plumbing.host_links().await.unwrap_or_default();
        let by_mac: HashMap<_, _> = host.iter().map(|l| (l.mac, l.name.clone())).collect();
        Ok(listed
            .into_iter()
            .map(|eni| EniStatus {
                state: match eni.owner.as_ref().map(|o| (o, Reservation::of(o))) {
                    Some((_, Some(Reservation::Excluded))) => EniState::Excluded,
                    Some((_, Some(Reservation::Missing))) => EniState::Missing,
                    Some((_, None)) => EniState::InUse,
                    None => EniState::Free,
                },
                host_device: by_mac.get(&eni.mac).cloned(),
                eni,
            })
            .collect())
    }
}
