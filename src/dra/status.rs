//! The claim's `status.devices[]`: for each of this driver's devices the
//! pod holds, the interface it became (name, addresses, MAC) as
//! `networkData`, so that `kubectl get resourceclaim -o yaml` and other
//! controllers see what the pod got.
//!
//! Written by server-side apply under the field manager `enimd`, which
//! owns only its own entries (the list is keyed by driver, pool, device).
//! Off the ADD path: ADD hands the wish to a writer task, which keeps the
//! latest wish per claim and retries until the API server takes it. A
//! claim deleted in the meantime needs nothing any more.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::resource::v1::{AllocatedDeviceStatus, NetworkDeviceData, ResourceClaim};
use kube::api::{Patch, PatchParams};
use kube::Api;
use tokio::sync::mpsc;

use super::FIELD_MANAGER;

/// What one device of a claim became in the pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceNetwork {
    pub device: String,
    pub interface: String,
    /// CIDR strings, as the API wants them.
    pub ips: Vec<String>,
    pub mac: String,
}

/// A claim, by namespace and name.
pub type ClaimKey = (String, String);

/// What enimd now says of one device of a claim.
#[derive(Debug)]
enum Wish {
    /// It is this network in its pod.
    Attached(DeviceNetwork),
    /// This device left its pod: nothing to say of it.
    Detached(String),
}

/// The writer's handle: cheap to clone; sends never block.
#[derive(Clone)]
pub struct StatusWriter {
    tx: mpsc::UnboundedSender<(ClaimKey, Wish)>,
}

/// How long a failed write waits before the next try.
const RETRY: Duration = Duration::from_secs(2);

impl StatusWriter {
    /// Starts the writer for `driver`'s devices in `pool` (the node).
    pub fn start(client: kube::Client, driver: String, pool: String) -> StatusWriter {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(client, driver, pool, rx));
        StatusWriter { tx }
    }

    /// `claim`'s device is now `net` in its pod.
    pub fn attached(&self, claim: ClaimKey, net: DeviceNetwork) {
        let _ = self.tx.send((claim, Wish::Attached(net)));
    }

    /// `claim`'s device `device` left its pod.
    pub fn detached(&self, claim: ClaimKey, device: String) {
        let _ = self.tx.send((claim, Wish::Detached(device)));
    }
}

async fn run(
    client: kube::Client,
    driver: String,
    pool: String,
    mut rx: mpsc::UnboundedReceiver<(ClaimKey, Wish)>,
) {
    // Claim → device → its network (the whole of what enimd says).
    let mut wanted = Wanted::new();
    let mut dirty: Vec<ClaimKey> = Vec::new();
    loop {
        // A wish; with writes pending, at most RETRY of waiting for one.
        let msg = if dirty.is_empty() {
            match rx.recv().await {
                Some(m) => Some(m),
                None => return,
            }
        } else {
            match tokio::time::timeout(RETRY, rx.recv()).await {
                Ok(Some(m)) => Some(m),
                Ok(None) => {
                    // Closed with writes pending: retry at RETRY's pace.
                    tokio::time::sleep(RETRY).await;
                    None
                }
                Err(_) => None,
            }
        };
        if let Some(m) = msg {
            take(&mut wanted, &mut dirty, m);
            // Coalesce what is already queued before writing.
            while let Ok(m) = rx.try_recv() {
                take(&mut wanted, &mut dirty, m);
            }
        }
        let mut failed = Vec::new();
        for claim in std::mem::take(&mut dirty) {
            let devices = wanted.get(&claim).cloned().unwrap_or_default();
            match apply(&client, &driver, &pool, &claim, &devices).await {
                Ok(()) => {
                    if devices.is_empty() {
                        wanted.remove(&claim);
                    }
                }
                Err(kube::Error::Api(e)) if e.code == 404 => {
                    tracing::debug!(claim = %format!("{}/{}", claim.0, claim.1), "claim gone: its status needs nothing");
                    wanted.remove(&claim);
                }
                Err(e) => {
                    tracing::warn!(claim = %format!("{}/{}", claim.0, claim.1), error = %e, "claim status not written; retrying");
                    failed.push(claim);
                }
            }
        }
        dirty = failed;
    }
}

type Wanted = BTreeMap<ClaimKey, BTreeMap<String, DeviceNetwork>>;

fn take(wanted: &mut Wanted, dirty: &mut Vec<ClaimKey>, (claim, wish): (ClaimKey, Wish)) {
    let devices = wanted.entry(claim.clone()).or_default();
    match wish {
        Wish::Attached(net) => {
            devices.insert(net.device.clone(), net);
        }
        Wish::Detached(device) => {
            devices.remove(&device);
        }
    }
    if !dirty.contains(&claim) {
        dirty.push(claim);
    }
}

/// The apply body: exactly enimd's entries.
pub fn status_patch(
    driver: &str,
    pool: &str,
    claim: &ClaimKey,
    devices: &BTreeMap<String, DeviceNetwork>,
) -> serde_json::Value {
    let entries: Vec<AllocatedDeviceStatus> = devices
        .values()
        .map(|n| AllocatedDeviceStatus {
            driver: driver.to_string(),
            pool: pool.to_string(),
            device: n.device.clone(),
            network_data: Some(NetworkDeviceData {
                interface_name: Some(n.interface.clone()),
                ips: Some(n.ips.clone()),
                hardware_address: Some(n.mac.clone()),
            }),
            ..AllocatedDeviceStatus::default()
        })
        .collect();
    serde_json::json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": { "name": claim.1, "namespace": claim.0 },
        "status": { "devices": entries },
    })
}

async fn apply(
    client: &kube::Client,
    driver: &str,
    pool: &str,
    claim: &ClaimKey,
    devices: &BTreeMap<String, DeviceNetwork>,
) -> Result<(), kube::Error> {
    let api: Api<ResourceClaim> = Api::namespaced(client.clone(), &claim.0);
    let patch = status_patch(driver, pool, claim, devices);
    api.patch_status(
        &claim.1,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_patch_holds_only_enimds_entries() {
        let mut devices = BTreeMap::new();
        devices.insert(
            "eni-1".to_string(),
            DeviceNetwork {
                device: "eni-1".into(),
                interface: "eth0".into(),
                ips: vec!["10.1.0.7/24".into()],
                mac: "02:00:00:00:00:07".into(),
            },
        );
        let p = status_patch("enim.io", "node-a", &("ns".into(), "c".into()), &devices);
        assert_eq!(p["metadata"]["namespace"], "ns");
        let d = &p["status"]["devices"][0];
        assert_eq!(d["driver"], "enim.io");
        assert_eq!(d["pool"], "node-a");
        assert_eq!(d["device"], "eni-1");
        assert_eq!(d["networkData"]["interfaceName"], "eth0");
        assert_eq!(d["networkData"]["ips"][0], "10.1.0.7/24");
        assert_eq!(d["networkData"]["hardwareAddress"], "02:00:00:00:00:07");
        let empty = status_patch(
            "enim.io",
            "node-a",
            &("ns".into(), "c".into()),
            &BTreeMap::new(),
        );
        assert_eq!(empty["status"]["devices"], serde_json::json!([]));
    }
}
