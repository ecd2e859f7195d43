//! This node's ResourceSlice: one device per ENI it may hand out, kept in
//! step with the engine's ENI list.
//!
//! One slice per node, named `<node>-<driver>`, in the pool named after the
//! node, owned by the Node object (it goes when the node goes), written by
//! server-side apply. The pool's generation goes up with every change, as
//! the API asks. Excluded and quarantined ENIs are not devices: the
//! scheduler must not promise what ADD would refuse. ENIs in use stay
//! listed: their claims hold them, and the scheduler counts claims.
//!
//! The same list, as device name → ENI id, is what prepare resolves a
//! claim's allocation against ([`DeviceIndex`]).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use enim_api::{EniState, EniStatus};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{Device, ResourcePool, ResourceSlice, ResourceSliceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Patch, PatchParams};
use kube::Api;
use tokio::sync::watch;

use super::{devices, topology, FIELD_MANAGER};
use crate::engine::{Driver, Engine};

/// Device name → ENI id, as last listed; `None` before the first list.
#[derive(Clone)]
pub struct DeviceIndex {
    rx: watch::Receiver<Option<BTreeMap<String, String>>>,
}

impl DeviceIndex {
    pub fn new() -> (watch::Sender<Option<BTreeMap<String, String>>>, DeviceIndex) {
        let (tx, rx) = watch::channel(None);
        (tx, DeviceIndex { rx })
    }

    /// The ENI behind `device`, once the list is known (waits up to
    /// `within` for the first one, as after a restart).
    pub async fn eni_of(&self, device: &str, within: Duration) -> Result<Option<String>, String> {
        let mut rx = self.rx.clone();
        let known = tokio::time::timeout(within, rx.wait_for(Option::is_some)).await;
        match known {
            Ok(Ok(map)) => Ok(map.as_ref().and_then(|m| m.get(device).cloned())),
            _ => Err("enimd has not listed this node's ENIs yet".into()),
        }
    }
}

/// The slice's name for `node`.
pub fn slice_name(node: &str, driver: &str) -> String {
    format!("{node}-{driver}")
}

/// Where each ENI's device sat when it was last in the host: an ENI in a
/// pod's netns has no host device to read, and its attributes must not
/// change while a claim holds it.
pub type Topologies = std::collections::HashMap<String, topology::Topology>;

/// The devices for `enis` (those the node may hand out), and their index.
pub fn devices_of(
    enis: &[EniStatus],
    sysfs: &std::path::Path,
    known: &mut Topologies,
) -> (Vec<Device>, BTreeMap<String, String>) {
    let mut list = Vec::new();
    let mut index = BTreeMap::new();
    for e in enis {
        let offered = match e.state {
            EniState::Excluded | EniState::Missing => false,
            EniState::Free => e.host_device.is_some(),
            EniState::InUse => true,
        };
        if !offered {
            continue;
        }
        let topo = match e.host_device.as_deref() {
            Some(dev) => {
                let t = topology::read(sysfs, dev);
                known.insert(e.eni.id.clone(), t.clone());
                t
            }
            None => known.get(&e.eni.id).cloned().unwrap_or_default(),
        };
        let Some(device) = devices::device(&e.eni, &topo) else {
            tracing::warn!(eni = %e.eni.id, "ENI id is not a DNS label: not published as a DRA device");
            continue;
        };
        if index.contains_key(&device.name) {
            tracing::warn!(eni = %e.eni.id, device = %device.name, "two ENIs map to one device name: the second is not published");
            continue;
        }
        index.insert(device.name.clone(), e.eni.id.clone());
        list.push(device);
    }
    list.sort_by(|a, b| a.name.cmp(&b.name));
    (list, index)
}

/// The whole slice.
pub fn slice(
    driver: &str,
    node: &str,
    node_uid: &str,
    generation: i64,
    devices: Vec<Device>,
) -> ResourceSlice {
    ResourceSlice {
        metadata: ObjectMeta {
            name: Some(slice_name(node, driver)),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: node.into(),
                uid: node_uid.into(),
                ..OwnerReference::default()
            }]),
            ..ObjectMeta::default()
        },
        spec: ResourceSliceSpec {
            driver: driver.into(),
            node_name: Some(node.into()),
            pool: ResourcePool {
                name: node.into(),
                generation,
                resource_slice_count: 1,
            },
            devices: Some(devices),
            ..ResourceSliceSpec::default()
        },
    }
}

pub struct SlicePublisher {
    pub client: kube::Client,
    pub driver: String,
    pub node: String,
    pub sysfs: PathBuf,
}

/// A failed write is tried again this often.
const RETRY: Duration = Duration::from_secs(2);

impl SlicePublisher {
    /// Publishes until `stop`; `changes` ticks whenever the ENI list may
    /// have changed (the device list's version).
    pub async fn run<D: Driver>(
        self,
        engine: Arc<Engine<D>>,
        index: watch::Sender<Option<BTreeMap<String, String>>>,
        mut changes: watch::Receiver<u64>,
        mut stop: watch::Receiver<bool>,
    ) {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let slices: Api<ResourceSlice> = Api::all(self.client.clone());
        let name = slice_name(&self.node, &self.driver);
        let mut node_uid: Option<String> = None;
        let mut generation: Option<i64> = None;
        let mut written: Option<Vec<Device>> = None;
        let mut topologies = Topologies::new();
        loop {
            let mut ok = true;
            match engine.enis().await {
                Ok(enis) => {
                    let (list, map) = devices_of(&enis, &self.sysfs, &mut topologies);
                    index.send_replace(Some(map));
                    if written.as_ref() != Some(&list) {
                        match self
                            .write(
                                &nodes,
                                &slices,
                                &name,
                                &mut node_uid,
                                &mut generation,
                                &list,
                            )
                            .await
                        {
                            Ok(()) => {
                                tracing::info!(slice = %name, devices = list.len(), generation = ?generation, "ResourceSlice published");
                                written = Some(list);
                            }
                            Err(e) => {
                                tracing::warn!(slice = %name, error = %e, "ResourceSlice not written; retrying");
                                ok = false;
                            }
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "ENI list for the ResourceSlice");
                    ok = false;
                }
            }
            let wait = if ok { Duration::from_secs(30) } else { RETRY };
            tokio::select! {
                _ = changes.changed() => {}
                _ = tokio::time::sleep(wait) => {}
                _ = stop.changed() => return,
            }
        }
    }

    async fn write(
        &self,
        nodes: &Api<Node>,
        slices: &Api<ResourceSlice>,
        name: &str,
        node_uid: &mut Option<String>,
        generation: &mut Option<i64>,
        list: &[Device],
    ) -> Result<(), kube::Error> {
        if node_uid.is_none() {
            let node = nodes.get(&self.node).await?;
            *node_uid = node.metadata.uid;
        }
        // Past whatever an earlier enimd wrote: the scheduler takes a
        // pool's highest generation as the truth.
        let next = match *generation {
            Some(g) => g + 1,
            None => {
                slices
                    .get_opt(name)
                    .await?
                    .map_or(0, |s| s.spec.pool.generation)
                    + 1
            }
        };
        let body = slice(
            &self.driver,
            &self.node,
            node_uid.as_deref().unwrap_or_default(),
            next,
            list.to_vec(),
        );
        slices
            .patch(
                name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&body),
            )
            .await?;
        *generation = Some(next);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use enim_core::{Eni, MacAddr, Placement};

    fn status(id: &str, state: EniState, host: Option<&str>) -> EniStatus {
        EniStatus {
            eni: Eni {
                id: id.into(),
                mac: MacAddr([2, 0, 0, 0, 0, 1]),
                ipv4: "10.0.0.5/24".parse().unwrap(),
                gateway4: "10.0.0.1".parse().unwrap(),
                ipv6: None,
                gateway6: None,
                mtu: None,
                owner: None,
                device_index: None,
                secondary_ips: vec![],
                placement: Placement::default(),
            },
            state,
            host_device: host.map(str::to_string),
        }
    }

    #[test]
    fn only_enis_the_node_can_hand_out_are_devices() {
        let enis = [
            status("eni-b", EniState::Free, Some("ens6")),
            status("eni-a", EniState::InUse, None),
            status("eni-c", EniState::Free, None),
            status("eni-d", EniState::Excluded, Some("ens7")),
            status("eni-e", EniState::Missing, None),
            status("ENI_bad", EniState::Free, Some("ens8")),
        ];
        let (list, index) = devices_of(
            &enis,
            std::path::Path::new("/nonexistent"),
            &mut Topologies::new(),
        );
        let names: Vec<&str> = list.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["eni-a", "eni-b"]);
        assert_eq!(index.get("eni-b").map(String::as_str), Some("eni-b"));
        assert_eq!(index.len(), 2);
    }

    #[test]
    fn an_eni_in_a_pod_keeps_the_topology_it_had_in_the_host() {
        // A fake sysfs with ens6 on NUMA node 1.
        let root = tempfile::tempdir().unwrap();
        let function = root.path().join("devices/pci0000:80/0000:80:01.0");
        std::fs::create_dir_all(&function).unwrap();
        std::fs::write(function.join("numa_node"), "1\n").unwrap();
        std::fs::create_dir_all(root.path().join("class/net/ens6")).unwrap();
        std::os::unix::fs::symlink(
            "../../../devices/pci0000:80/0000:80:01.0",
            root.path().join("class/net/ens6/device"),
        )
        .unwrap();
        let mut known = Topologies::new();
        let numa = |list: &[Device]| {
            list[0]
                .attributes
                .as_ref()
                .unwrap()
                .get("numaNode")
                .and_then(|a| a.int)
        };
        let (free, _) = devices_of(
            &[status("eni-b", EniState::Free, Some("ens6"))],
            root.path(),
            &mut known,
        );
        assert_eq!(numa(&free), Some(1));
        // In a pod: no host device, the same attributes.
        let (held, _) = devices_of(
            &[status("eni-b", EniState::InUse, None)],
            root.path(),
            &mut known,
        );
        assert_eq!(held, free);
    }

    #[test]
    fn the_slice_is_the_nodes_pool_owned_by_the_node() {
        let s = slice("enim.io", "node-a", "uid-1", 3, vec![]);
        assert_eq!(s.metadata.name.as_deref(), Some("node-a-enim.io"));
        assert_eq!(s.spec.pool.name, "node-a");
        assert_eq!(s.spec.pool.generation, 3);
        assert_eq!(s.spec.pool.resource_slice_count, 1);
        assert_eq!(s.spec.node_name.as_deref(), Some("node-a"));
        let owner = &s.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!((owner.kind.as_str(), owner.uid.as_str()), ("Node", "uid-1"));
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["apiVersion"], "resource.k8s.io/v1");
        assert_eq!(v["kind"], "ResourceSlice");
    }

    #[tokio::test]
    async fn the_index_waits_for_the_first_list() {
        let (tx, index) = DeviceIndex::new();
        assert!(index
            .eni_of("eni-a", Duration::from_millis(20))
            .await
            .is_err());
        let mut m = BTreeMap::new();
        m.insert("eni-a".to_string(), "eni-A".to_string());
        tx.send_replace(Some(m));
        assert_eq!(
            index
                .eni_of("eni-a", Duration::from_millis(20))
                .await
                .unwrap()
                .as_deref(),
            Some("eni-A")
        );
        assert_eq!(
            index
                .eni_of("eni-z", Duration::from_millis(20))
                .await
                .unwrap(),
            None
        );
    }
}
