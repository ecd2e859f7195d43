//! An in-memory [`Plumbing`] for unit tests of the primary driver and the engine: a host
//! namespace and pod namespaces holding devices, and one-shot faults that
//! can be armed at any step.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use async_trait::async_trait;
use enim_core::MacAddr;
use ipnet::IpNet;

use super::{
    HostLinkHome, HostPathSpec, LinkInfo, Own, Plumbing, PlumbingError, PodLinkConfig,
    PodLinkState, Refusal, RefusedDevice,
};

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
    /// Host paths by host end.
    pub host_paths: HashMap<String, FakeHostPath>,
}

/// A host path: where its pod end is, under which name, and its routes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeHostPath {
    pub netns: PathBuf,
    pub ifname: String,
    pub routes: Vec<IpNet>,
}

/// One-shot faults armed by step name, and one pause point: what both
/// fakes (this one and the secondary mode's) inject.
#[derive(Default)]
pub struct Faults {
    armed: Mutex<HashSet<&'static str>>,
    /// When set, the pause point announces itself on `.0` and waits for
    /// `.1`: lets a test act while an ADD is in the middle.
    gate: Mutex<Option<(Arc<Notify>, Arc<Notify>)>>,
}

impl Faults {
    pub fn fail_once(&self, step: &'static str) {
        self.armed.lock().unwrap().insert(step);
    }

    /// Fails, once, where a fault is armed at `step`.
    pub fn check(&self, step: &'static str) -> Result<(), PlumbingError> {
        if self.armed.lock().unwrap().remove(step) {
            Err(PlumbingError::Injected(step))
        } else {
            Ok(())
        }
    }

    /// Pauses at the next pause point; returns (entered, resume).
    pub fn pause(&self) -> (Arc<Notify>, Arc<Notify>) {
        let gate = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        *self.gate.lock().unwrap() = Some(gate.clone());
        gate
    }

    /// The pause point: waits there if a pause is set.
    pub async fn pause_point(&self) {
        let gate = self.gate.lock().unwrap().take();
        if let Some((entered, resume)) = gate {
            entered.notify_one();
            resume.notified().await;
        }
    }
}

#[derive(Default)]
pub struct FakePlumbing {
    pub world: Mutex<FakeWorld>,
    /// The pause point is in configure_pod_link.
    faults: Faults,
    next_index: Mutex<u32>,
    /// Host devices [`handout`](super::handout)'s rule refuses, by MAC:
    /// `eni_link` refuses them and `refused_devices` lists those in the host.
    pub refused: Mutex<HashMap<MacAddr, Refusal>>,
    /// What node_addresses answers.
    pub node_addrs: Mutex<Vec<IpAddr>>,
    /// Calls of the host lookups, by method name: the real ones cost a
    /// netlink round trip each, a link dump for the batch ones.
    calls: Mutex<HashMap<&'static str, usize>>,
}

/// Steps a fault can be armed at. `configure_pod_link:partial` applies the
/// MTU and link state before failing, as a real half-done configure would;
/// `move_to_pod:after` moves the device and then reports failure.
pub const FAULT_STEPS: &[&str] = &ENI_STEPS;

/// [`FAULT_STEPS`] and the host path's: its making fails, or fails once
/// the pair exists.
pub const HOST_PATH_FAULT_STEPS: &[&str] =
    &concat::<6, 2, 8>(ENI_STEPS, ["add_host_path", "add_host_path:partial"]);

const ENI_STEPS: [&str; 6] = [
    "check_netns",
    "host_link",
    "move_to_pod",
    "move_to_pod:after",
    "configure_pod_link",
    "configure_pod_link:partial",
];

/// `a` then `b`, at compile time.
const fn concat<const A: usize, const B: usize, const C: usize>(
    a: [&'static str; A],
    b: [&'static str; B],
) -> [&'static str; C] {
    assert!(A + B == C);
    let mut out = [""; C];
    let mut i = 0;
    while i < C {
        out[i] = if i < A { a[i] } else { b[i - A] };
        i += 1;
    }
    out
}

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

    /// The netns dies: its veths (host paths) with it, both ends.
    pub fn remove_netns(&self, path: &Path) -> Vec<FakeDev> {
        let mut w = self.world.lock().unwrap();
        w.host_paths.retain(|_, hp| hp.netns != path);
        w.netns.remove(path).unwrap_or_default()
    }

    /// The host ends of the host paths that exist.
    pub fn host_path_veths(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .world
            .lock()
            .unwrap()
            .host_paths
            .keys()
            .cloned()
            .collect();
        v.sort();
        v
    }

    /// Pauses the next configure step; returns (entered, resume).
    pub fn pause_configure(&self) -> (Arc<Notify>, Arc<Notify>) {
        self.faults.pause()
    }

    pub fn fail_once(&self, step: &'static str) {
        self.faults.fail_once(step);
    }

    fn fault(&self, step: &'static str) -> Result<(), PlumbingError> {
        self.faults.check(step)
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
        let found = self.host_devs(|d| (d.link.mac == mac).then(|| d.clone()));
        found.into_iter().next()
    }

    /// What `pick` takes from each device in the host, in order.
    fn host_devs<T>(&self, pick: impl FnMut(&FakeDev) -> Option<T>) -> Vec<T> {
        self.world
            .lock()
            .unwrap()
            .host
            .iter()
            .filter_map(pick)
            .collect()
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

    async fn eni_link(
        &self,
        mac: MacAddr,
        _own: Own<'_>,
    ) -> Result<Option<LinkInfo>, PlumbingError> {
        self.count("host_link");
        self.fault("host_link")?;
        let Some(dev) = self.host_dev(mac) else {
            return Ok(None);
        };
        match self.refused.lock().unwrap().get(&mac) {
            Some(why) => Err(PlumbingError::Refused {
                mac,
                device: dev.link.name,
                why: Box::new(why.clone()),
            }),
            None => Ok(Some(dev.link)),
        }
    }

    async fn host_links(&self) -> Result<Vec<LinkInfo>, PlumbingError> {
        self.count("host_links");
        Ok(self.host_devs(|d| Some(d.link.clone())))
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
        self.faults.pause_point().await;
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
        self.fault("configure_pod_link:partial")?;
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

    async fn refused_devices(&self, _own: Own<'_>) -> Result<Vec<RefusedDevice>, PlumbingError> {
        let refused = self.refused.lock().unwrap().clone();
        Ok(self.host_devs(|d| {
            Some(RefusedDevice {
                mac: d.link.mac,
                name: d.link.name.clone(),
                why: refused.get(&d.link.mac)?.clone(),
            })
        }))
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

    async fn add_host_path(&self, spec: &HostPathSpec<'_>) -> Result<MacAddr, PlumbingError> {
        self.fault("add_host_path")?;
        self.remove_host_path_now(spec.host_veth);
        let dev = self.pod_end(spec.ifname, spec.mtu);
        let mac = dev.link.mac;
        {
            let mut w = self.world.lock().unwrap();
            let pod = w
                .netns
                .get_mut(spec.netns)
                .ok_or_else(|| gone(spec.netns))?;
            if pod.iter().any(|d| d.link.name == spec.ifname) {
                return Err(PlumbingError::NameTaken {
                    ifname: spec.ifname.into(),
                    netns: spec.netns.into(),
                });
            }
            pod.push(dev);
            let hp = FakeHostPath {
                netns: spec.netns.to_path_buf(),
                ifname: spec.ifname.to_string(),
                routes: spec.routes.to_vec(),
            };
            w.host_paths.insert(spec.host_veth.to_string(), hp);
        }
        self.fault("add_host_path:partial")?;
        Ok(mac)
    }

    async fn remove_host_path(&self, host_veth: &str) -> Result<(), PlumbingError> {
        self.fault("remove_host_path")?;
        self.remove_host_path_now(host_veth);
        Ok(())
    }

    async fn reroute_host_path(
        &self,
        spec: &HostPathSpec<'_>,
        add: &[IpNet],
        remove: &[IpNet],
    ) -> Result<(), PlumbingError> {
        self.fault("reroute_host_path")?;
        let mut w = self.world.lock().unwrap();
        let hp = w
            .host_paths
            .get_mut(spec.host_veth)
            .ok_or_else(|| PlumbingError::Io {
                what: "host path",
                source: std::io::Error::other(format!("{} is missing", spec.host_veth)),
            })?;
        hp.routes.retain(|r| !remove.contains(r));
        for r in add {
            if !hp.routes.contains(r) {
                hp.routes.push(*r);
            }
        }
        hp.routes.sort();
        Ok(())
    }

    async fn check_host_path(
        &self,
        spec: &HostPathSpec<'_>,
        mac: Option<MacAddr>,
    ) -> Result<Result<MacAddr, String>, PlumbingError> {
        let w = self.world.lock().unwrap();
        let Some(hp) = w.host_paths.get(spec.host_veth) else {
            return Ok(Err(format!("host path veth {} is missing", spec.host_veth)));
        };
        if hp.netns != spec.netns || hp.routes != spec.routes {
            return Ok(Err(format!("host path {} differs", spec.host_veth)));
        }
        let pod = w.netns.get(&hp.netns).ok_or_else(|| gone(&hp.netns))?;
        let end = pod.iter().find(|d| d.link.name == spec.ifname);
        Ok(match end {
            None => Err(format!("host path interface {} is missing", spec.ifname)),
            Some(d) if mac.is_some_and(|m| m != d.link.mac) => Err("other MAC".into()),
            Some(d) => Ok(d.link.mac),
        })
    }

    async fn host_veths(&self) -> Result<Vec<String>, PlumbingError> {
        Ok(self.host_path_veths())
    }

    async fn node_addresses(&self) -> Result<Vec<IpAddr>, PlumbingError> {
        Ok(self.node_addrs.lock().unwrap().clone())
    }
}

impl FakePlumbing {
    /// Deletes a host path's pair: the pod end goes with the host end.
    fn remove_host_path_now(&self, host_veth: &str) {
        let mut w = self.world.lock().unwrap();
        let Some(hp) = w.host_paths.remove(host_veth) else {
            return;
        };
        if let Some(pod) = w.netns.get_mut(&hp.netns) {
            pod.retain(|d| d.link.name != hp.ifname);
        }
    }

    /// A veth pair's pod end: a device with a MAC derived from the name.
    fn pod_end(&self, ifname: &str, mtu: u32) -> FakeDev {
        let b = ifname.as_bytes();
        let byte = |i: usize| b.get(i).copied().unwrap_or(0);
        FakeDev {
            link: LinkInfo {
                index: self.index(),
                name: ifname.into(),
                mac: MacAddr([0x0a, byte(0), byte(1), byte(2), byte(3), byte(4)]),
                mtu,
                up: true,
            },
            addrs: vec![],
            gateways: vec![],
        }
    }

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
