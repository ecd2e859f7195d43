//! What the device plugin advertises, from the engine: in primary mode one
//! device per ENI (`enim.io/eni`; one whose device is not in the host,
//! quarantined or not yet, is unhealthy, and so is an excluded one); in
//! secondary mode one per pod the node's addresses can serve (`enim.io/ip`:
//! an IPv4 address, with an IPv6 one of the same ENI on a dual-stack node).
//! The kubelet only counts them:
//! which ENI or address a pod gets is still enim's choice at ADD.
//!
//! The list is kept current by a refresher: after GC and after a refused
//! ADD (the server pokes it; an ADD, DEL or CHECK that succeeds leaves
//! every device as healthy as it was, and must not pay for a host link
//! dump), and every second (a warm pool grows and shrinks on its own, and
//! an ADD can set an ENI aside before it takes the next); subscribers are
//! told only when it changed.
//! enimd keeps it whether or not its own plugin is on: `GET /v1/devices`
//! serves it to `enimd device-plugin`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use enim_api::model::Mode;
use enim_api::EniState;
use tokio::sync::{watch, Notify};

use crate::deviceplugin::{Device, DeviceSource};
use crate::engine::{Driver, Engine};

pub struct EngineDevices {
    resource: String,
    /// `None` until the first refresh that succeeded.
    current: Mutex<Option<Vec<Device>>>,
    version: watch::Sender<u64>,
    poke: Notify,
}

impl EngineDevices {
    pub fn new(mode: Mode) -> Arc<Self> {
        let resource = match mode {
            Mode::Primary => "enim.io/eni",
            Mode::Secondary => "enim.io/ip",
        };
        Arc::new(EngineDevices {
            resource: resource.into(),
            current: Mutex::new(None),
            version: watch::channel(0).0,
            poke: Notify::new(),
        })
    }

    /// The list, once one is known (the refresher starts after startup
    /// recovery, and a provider error keeps it unknown until one succeeds).
    pub fn known(&self) -> Option<Vec<Device>> {
        self.current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Something may have changed: refresh now.
    pub fn poke(&self) {
        self.poke.notify_one();
    }

    /// Refreshes the list until `stop` turns true.
    pub async fn run<D: Driver>(
        self: Arc<Self>,
        engine: Arc<Engine<D>>,
        mut stop: watch::Receiver<bool>,
    ) {
        let mut ticker = tokio::time::interval(Duration::from_secs(1));
        loop {
            self.refresh(&engine).await;
            tokio::select! {
                _ = ticker.tick() => {}
                () = self.poke.notified() => {}
                _ = stop.changed() => return,
            }
        }
    }

    async fn refresh<D: Driver>(&self, engine: &Engine<D>) {
        let devices = match D::MODE {
            Mode::Primary => match engine.enis().await {
                Ok(enis) => enis
                    .into_iter()
                    .map(|e| Device {
                        // A free ENI must be in the host to be handed out;
                        // an excluded or quarantined one never is.
                        healthy: match e.state {
                            EniState::Missing | EniState::Excluded => false,
                            EniState::Free => e.host_device.is_some(),
                            EniState::InUse => true,
                        },
                        id: e.eni.id,
                    })
                    .collect(),
                // Keep what was last known: a passing provider error must
                // not make the node look empty.
                Err(e) => return tracing::warn!(error = %e, "device list: provider"),
            },
            Mode::Secondary => (0..engine.address_stats().map_or(0, |s| s.pods))
                .map(|i| Device::healthy(format!("ip-{i}")))
                .collect(),
        };
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if current.as_ref() != Some(&devices) {
            *current = Some(devices);
            self.version.send_modify(|v| *v += 1);
        }
    }
}

impl DeviceSource for EngineDevices {
    fn resource_name(&self) -> String {
        self.resource.clone()
    }

    fn devices(&self) -> Vec<Device> {
        self.known().unwrap_or_default()
    }

    fn subscribe(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::conformance::{owner, Harness, POD};
    use crate::primary::tests::PrimaryHarness;
    use crate::secondary::tests::SecondaryHarness;

    #[tokio::test]
    async fn primary_mode_lists_enis_with_their_health() {
        let h = PrimaryHarness::new(3).await;
        let devices = EngineDevices::new(Mode::Primary);
        let mut changes = devices.subscribe();
        assert_eq!(devices.known(), None, "no list before the first refresh");
        devices.refresh(h.engine()).await;
        assert_eq!(devices.resource_name(), "enim.io/eni");
        let healthy: Vec<(String, bool)> = devices
            .devices()
            .into_iter()
            .map(|d| (d.id, d.healthy))
            .collect();
        assert_eq!(
            healthy,
            [
                ("eni-1".into(), true),
                ("eni-2".into(), true),
                ("eni-3".into(), true)
            ]
        );
        assert!(changes.has_changed().unwrap(), "subscribers are told");
        changes.borrow_and_update();
        // A pod holds one: still a device, still healthy; nothing changed.
        h.engine()
            .add(&owner("a"), std::path::Path::new(POD))
            .await
            .unwrap();
        devices.refresh(h.engine()).await;
        assert_eq!(devices.devices().len(), 3);
        assert!(
            !changes.has_changed().unwrap(),
            "told of a change that was none"
        );
    }

    #[tokio::test]
    async fn secondary_mode_lists_one_device_per_address() {
        let h = SecondaryHarness::new(2).await;
        let devices = EngineDevices::new(Mode::Secondary);
        devices.refresh(h.engine()).await;
        assert_eq!(devices.resource_name(), "enim.io/ip");
        // Two ENIs of two IPv4 and two IPv6 secondary addresses each: a
        // dual-stack pod takes one of each, so four pods fit, not eight.
        let ids: Vec<String> = devices.devices().into_iter().map(|d| d.id).collect();
        assert_eq!(ids, ["ip-0", "ip-1", "ip-2", "ip-3"]);
        assert!(devices.devices().iter().all(|d| d.healthy));
    }
}
