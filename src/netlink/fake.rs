//! An in-memory [`Plumbing`] for unit tests of the primary driver and the engine: a host
//! namespace and pod namespaces holding devices, and one-shot faults that
//! can be armed at any step.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use async_trait::async_trait;
use enim_provider::MacAddr;
use ipnet::IpNet;

use super::{HostLinkHome, LinkInfo, Plumbing, PlumbingError, PodLinkConfig, PodLinkState};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeDev {
    pub link: LinkInfo,
    pub addrs: Vec<IpNet>,
    pub gateways: Vec<IpAddr>,
}

#[derive(Default)]
pub struct FakeWorld {
    pub host: Vec<FakeDev>,
    pub netns: HashMap<PathBuf, Vec<FakeDev>>,
}

#[derive(Default)]
pub struct FakePlumbing {
    pub world: Mutex<FakeWorld>,
    faults: Mutex<HashSet<&'static str>>,
    next_index: Mutex<u32>,
    /// When set, configure_pod_link announces itself on `.0` and waits for
    /// `.1`: lets a test act while an ADD is in the middle.
    configure_gate: Mutex<Option<(Arc<Notify>, Arc<Notify>)>>,
    /// What primary_mac answers.
    pub primary: Mutex<Option<MacAddr>>,
    /// Calls of the host lookups, by method name: the real ones cost a
    /// netlink round trip each, a link dump for the batch ones.
    calls: Mutex<HashMap<&'static str, usize>>,
}

/// Steps a fault can be armed at. `configure_pod_link:partial` applies the
/// MTU and link state before failing, as a real half-done configure would;
/// `move_to_pod:after` moves the device and then reports failure.
pub const FAULT_STEPS: &[&str] = &[
    "check_netns",
    "host_link",
    "move_to_pod",
    "move_to_pod:after",
    "configure_pod_link",
    "configure_pod_link:partial",
];

impl FakePlumbing {
    pub fn with_host_devices(devs: &[(MacAddr, &str, u32)]) -> Self {
        let fake = FakePlumbing::default();
        {
            let mut w = fake.world.lock().unwrap();
            for (mac, name, mtu) in devs {
                let index = fake.index();
                w.host.push(FakeDev {
                    link: LinkInfo {
                        index,
                        name: name.to_string(),
                        mac: *mac,
                        mtu: *mtu,
                        up: false,
                    },
                    addrs: vec![],
                    gateways: vec![],
                });
            }
        }
        fake
    }

    pub fn add_netns(&self, path: &Path) {
        self.world
            .lock()
            .unwrap()
            .netns
            .insert(path.to_path_buf(), Vec::new());
    }

    pub fn remove_netns(&self, path: &Path) -> Vec<FakeDev> {
        self.world
            .lock()
            .unwrap()
            .netns
            .remove(path)
            .unwrap_or_default()
    }

    /// Pauses the next configure step; returns (entered, resume).
    pub fn pause_configure(&self) -> (Arc<Notify>, Arc<Notify>) {
        let gate = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        *self.configure_gate.lock().unwrap() = Some(gate.clone());
        gate
    }

    pub fn fail_once(&self, step: &'static str) {
        self.faults.lock().unwrap().insert(step);
    }

    fn fault(&self, step: &'static str) -> Result<(), PlumbingError> {
        if self.faults.lock().unwrap().remove(step) {
            Err(PlumbingError::Injected(step))
        } else {
            Ok(())
        }
    }

    fn count(&self, method: &'static str) {
        *self.calls.lock().unwrap().entry(method).or_default() += 1;
    }

    /// How often `method` was called.
    pub fn calls(&self, method: &str) -> usize {
        self.calls.lock().unwrap().get(method).copied().unwrap_or(0)
    }

    fn index(&self) -> u32 {
        let mut i = self.next_index.lock().unwrap();
        *i += 1;
        *i
    }

    pub fn host_dev(&self, mac: MacAddr) -> Option<FakeDev> {
        self.world
            .lock()
            .unwrap()
            .host
            .iter()
            .find(|d| d.link.mac == mac)
            .cloned()
    }

    pub fn pod_devs(&self) -> usize {
        self.world
            .lock()
            .unwrap()
            .netns
            .values()
            .map(Vec::len)
            .sum()
    }
}

fn gone(path: &Path) -> PlumbingError {
    PlumbingError::NetnsNotFound(path.to_path_buf())
}

#[async_trait]
impl Plumbing for FakePlumbing {
    async fn check_netns(&self, path: &Path) -> Result<(), PlumbingError> {
        self.fault("check_netns")?;
        if self.world.lock().unwrap().netns.contains_key(path) {
            Ok(())
        } else {
            Err(gone(path))
        }
    }

    async fn host_link(&self, mac: MacAddr) -> Result<Option<LinkInfo>, PlumbingError> {
        self.count("host_link");
        self.fault("host_link")?;
        Ok(self.host_dev(mac).map(|d| d.link))
    }

    async fn host_links(&self) -> Result<Vec<LinkInfo>, PlumbingError> {
        self.count("host_links");
        Ok(self
            .world
            .lock()
            .unwrap()
            .host
            .iter()
            .map(|d| d.link.clone())
            .collect())
    }

    async fn move_to_pod(
        &self,
        host: &LinkInfo,
        netns: &Path,
        ifname: &str,
    ) -> Result<(), PlumbingError> {
        self.fault("move_to_pod")?;
        let mac = host.mac;
        let index = self.index();
        {
            let mut w = self.world.lock().unwrap();
            let w = &mut *w;
            let pod = w.netns.get_mut(netns).ok_or_else(|| gone(netns))?;
            if pod.iter().any(|d| d.link.name == ifname) {
                return Err(PlumbingError::NameTaken {
                    ifname: ifname.into(),
                    netns: netns.into(),
                });
            }
            let at = w
                .host
                .iter()
                .position(|d| d.link.mac == mac)
                .ok_or_else(|| PlumbingError::LinkNotFound {
                    mac,
                    place: "host".into(),
                })?;
            let mut dev = w.host.remove(at);
            dev.link.name = ifname.into();
            dev.link.index = index;
            dev.link.up = false;
            pod.push(dev);
        }
        self.fault("move_to_pod:after")
    }

    async fn configure_pod_link(
        &self,
        netns: &Path,
        mac: MacAddr,
        config: &PodLinkConfig,
    ) -> Result<LinkInfo, PlumbingError> {
        self.fault("configure_pod_link")?;
        let gate = self.configure_gate.lock().unwrap().take();
        if let Some((entered, resume)) = gate {
            entered.notify_one();
            resume.notified().await;
        }
        let mut w = self.world.lock().unwrap();
        let pod = w.netns.get_mut(netns).ok_or_else(|| gone(netns))?;
        let dev = pod.iter_mut().find(|d| d.link.mac == mac).ok_or_else(|| {
            PlumbingError::LinkNotFound {
                mac,
                place: netns.display().to_string(),
            }
        })?;
        dev.link.mtu = config.mtu;
        dev.link.up = true;
        if self
            .faults
            .lock()
            .unwrap()
            .remove("configure_pod_link:partial")
        {
            return Err(PlumbingError::Injected("configure_pod_link:partial"));
        }
        dev.addrs.push(IpNet::V4(config.ipv4));
        dev.gateways.push(IpAddr::V4(config.gateway4));
        if let Some(v6) = config.ipv6 {
            dev.addrs.push(IpNet::V6(v6));
        }
        if let Some(gw6) = config.gateway6 {
            dev.gateways.push(IpAddr::V6(gw6));
        }
        Ok(dev.link.clone())
    }

    async fn pod_link(
        &self,
        netns: &Path,
        mac: MacAddr,
    ) -> Result<Option<PodLinkState>, PlumbingError> {
        let w = self.world.lock().unwrap();
        let pod = w.netns.get(netns).ok_or_else(|| gone(netns))?;
        Ok(pod
            .iter()
            .find(|d| d.link.mac == mac)
            .map(|d| PodLinkState {
                link: d.link.clone(),
                addrs: d.addrs.clone(),
                default_gateways: d.gateways.clone(),
            }))
    }

    async fn move_to_host(
        &self,
        netns: &Path,
        home: HostLinkHome<'_>,
    ) -> Result<Option<LinkInfo>, PlumbingError> {
        self.fault("move_to_host")?;
        let HostLinkHome {
            mac,
            name: host_name,
            mtu: host_mtu,
        } = home;
        let index = self.index();
        let mut w = self.world.lock().unwrap();
        let w = &mut *w;
        let pod = w.netns.get_mut(netns).ok_or_else(|| gone(netns))?;
        let Some(at) = pod.iter().position(|d| d.link.mac == mac) else {
            return Ok(None);
        };
        let mut dev = pod.remove(at);
        dev.link = LinkInfo {
            index,
            name: host_name.into(),
            mac,
            mtu: host_mtu,
            up: false,
        };
        dev.addrs.clear();
        dev.gateways.clear();
        let home = dev.link.clone();
        w.host.push(dev);
        Ok(Some(home))
    }

    async fn primary_mac(&self) -> Result<Option<MacAddr>, PlumbingError> {
        Ok(*self.primary.lock().unwrap())
    }

    async fn restore_host_link(&self, home: HostLinkHome<'_>) -> Result<bool, PlumbingError> {
        self.count("restore_host_link");
        self.fault("restore_host_link")?;
        Ok(self.put_home(home.mac, home.name, home.mtu))
    }

    async fn restore_host_links(
        &self,
        homes: &[HostLinkHome<'_>],
    ) -> Result<Vec<Result<bool, PlumbingError>>, PlumbingError> {
        self.count("restore_host_links");
        self.fault("restore_host_links")?;
        Ok(homes
            .iter()
            .map(|h| {
                // The same per-device fault as the one-at-a-time method.
                self.fault("restore_host_link")?;
                Ok(self.put_home(h.mac, h.name, h.mtu))
            })
            .collect())
    }
}

impl FakePlumbing {
    fn put_home(&self, mac: MacAddr, host_name: &str, host_mtu: u32) -> bool {
        let mut w = self.world.lock().unwrap();
        let Some(dev) = w.host.iter_mut().find(|d| d.link.mac == mac) else {
            return false;
        };
        dev.link.name = host_name.into();
        dev.link.mtu = host_mtu;
        true
    }
}
