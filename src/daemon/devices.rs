//! What the device plugin advertises, from the engine: in primary mode one
//! device per ENI (`enim.io/eni`; one whose device is not in the host,
//! quarantined or not yet, is unhealthy, and so is an excluded one), in secondary mode one
//! per assignable address (`enim.io/ip`). The kubelet only counts them:
//! which ENI or address a pod gets is still enim's choice at ADD.
//!
//! The list is kept current by a refresher: after every verb that can
//! change it (the server pokes it) and every second (a warm pool grows and
//! shrinks on its own), and subscribers are told only when it changed.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{watch, Notify};

use crate::api::EniState;
use crate::deviceplugin::{Device, DeviceSource};
use crate::engine::{Driver, Engine};
use crate::model::Mode;

pub struct EngineDevices {
    resource: String,
    current: Mutex<Vec<Device>>,
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
            current: Mutex::new(Vec::new()),
            version: watch::channel(0).0,
            poke: Notify::new(),
        })
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
            Mode::Secondary => (0..engine.address_stats().map_or(0, |s| s.total))
                .map(|i| Device {
                    id: format!("ip-{i}"),
                    healthy: true,
                })
                .collect(),
        };
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if *current != devices {
            *current = devices;
            self.version.send_modify(|v| *v += 1);
        }
    }
}

impl DeviceSource for EngineDevices {
    fn resource_name(&self) -> String {
        self.resource.clone()
    }

    fn devices(&self) -> Vec<Device> {
        self.current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn subscribe(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }
}
