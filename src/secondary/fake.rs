//! An in-memory [`SecondaryPlumbing`] for unit tests of the secondary
//! driver: host ENIs, pod namespaces, veths, rules, proxy entries and
//! route tables as sets, with one-shot faults and a pause point.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use enim_core::MacAddr;
use ipnet::IpNet;
use tokio::sync::Notify;

use super::plumbing::{
    HostEniSpec, Inventory, OwnedRule, PodObservation, PodSpec, SecondaryPlumbing,
};
use super::{SecondaryConfig, GATEWAY4, GATEWAY6};
use crate::netlink::fake::Faults;
use crate::netlink::{LinkInfo, PlumbingError, PodLinkState, Refusal};

/// Steps a fault can be armed at. `setup_pod:partial` creates the veth and
/// one rule before failing; `setup_pod:after` does everything, then fails.
pub const FAULT_STEPS: &[&str] = &[
    "check_netns",
    "setup_pod",
    "setup_pod:partial",
    "setup_pod:after",
];

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeVeth {
    pub netns: PathBuf,
    pub ifname: String,
    pub mac: MacAddr,
    pub mtu: u32,
    pub ips: Vec<IpAddr>,
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct FakeWorld {
    pub netns: BTreeSet<PathBuf>,
    /// Interfaces the pods had before enim came (a name clash).
    pub foreign: BTreeSet<(PathBuf, String)>,
    /// ENI devices in the host: MAC -> current name.
    pub enis: BTreeMap<MacAddr, String>,
    pub veths: BTreeMap<String, FakeVeth>,
    pub rules: BTreeSet<OwnedRule>,
    pub proxies: BTreeSet<(IpAddr, String)>,
    pub tables: BTreeSet<u32>,
    pub forwarding: Option<bool>,
    /// The host's default-route device.
    pub primary: Option<MacAddr>,
    /// Devices [`crate::netlink::handout`]'s rule refuses: `setup_eni`
    /// leaves them as they are.
    pub refused: BTreeMap<MacAddr, Refusal>,
}

impl FakeWorld {
    /// Nothing of any pod is left.
    pub fn is_clean(&self) -> bool {
        self.veths.is_empty() && self.rules.is_empty() && self.proxies.is_empty()
    }
}

#[derive(Default)]
pub struct FakeSecondary {
    pub world: Mutex<FakeWorld>,
    /// The pause point is in setup_pod, once its veth exists: a test can
    /// act while an ADD is half-way.
    faults: Faults,
    macs: Mutex<u8>,
}

impl FakeSecondary {
    pub fn with_enis(enis: &[(MacAddr, &str)]) -> Self {
        let fake = FakeSecondary::default();
        {
            let mut w = fake.world();
            for (mac, name) in enis {
                w.enis.insert(*mac, name.to_string());
            }
        }
        fake
    }

    pub fn world(&self) -> std::sync::MutexGuard<'_, FakeWorld> {
        self.world.lock().unwrap()
    }

    pub fn add_netns(&self, path: &Path) {
        self.world().netns.insert(path.to_path_buf());
    }

    /// The netns dies: its veths die with it (rules and proxies stay).
    pub fn kill_netns(&self, path: &Path) {
        let mut w = self.world();
        w.netns.remove(path);
        w.veths.retain(|_, v| v.netns != path);
    }

    pub fn fail_once(&self, step: &'static str) {
        self.faults.fail_once(step);
    }

    fn fault(&self, step: &'static str) -> Result<(), PlumbingError> {
        self.faults.check(step)
    }

    pub fn pause_setup(&self) -> (Arc<Notify>, Arc<Notify>) {
        self.faults.pause()
    }
}

#[async_trait]
impl SecondaryPlumbing for FakeSecondary {
    async fn check_netns(&self, path: &Path) -> Result<(), PlumbingError> {
        self.fault("check_netns")?;
        match self.world().netns.contains(path) {
            true => Ok(()),
            false => Err(PlumbingError::NetnsNotFound(path.to_path_buf())),
        }
    }

    async fn enable_forwarding(&self, ipv6: bool) -> Result<(), PlumbingError> {
        self.world().forwarding = Some(ipv6);
        Ok(())
    }

    async fn primary_mac(&self) -> Result<Option<MacAddr>, PlumbingError> {
        Ok(self.world().primary)
    }

    async fn setup_eni(&self, spec: &HostEniSpec) -> Result<LinkInfo, PlumbingError> {
        let mut w = self.world();
        if let (Some(why), Some(name)) = (w.refused.get(&spec.mac), w.enis.get(&spec.mac)) {
            return Err(PlumbingError::Refused {
                mac: spec.mac,
                device: name.clone(),
                why: Box::new(why.clone()),
            });
        }
        let name = w
            .enis
            .get_mut(&spec.mac)
            .ok_or_else(|| PlumbingError::LinkNotFound {
                mac: spec.mac,
                place: "the fake host".into(),
            })?;
        *name = spec.name.clone();
        w.tables.insert(spec.table);
        Ok(LinkInfo {
            index: 1,
            name: spec.name.clone(),
            mac: spec.mac,
            mtu: spec.mtu.unwrap_or(1500),
            up: true,
        })
    }

    async fn setup_pod(&self, spec: &PodSpec) -> Result<MacAddr, PlumbingError> {
        self.fault("setup_pod")?;
        let mac = {
            let mut w = self.world();
            if !w.netns.contains(&spec.netns) {
                return Err(PlumbingError::NetnsNotFound(spec.netns.clone()));
            }
            w.veths.remove(&spec.host_veth);
            let taken = w
                .foreign
                .contains(&(spec.netns.clone(), spec.ifname.clone()))
                || w.veths
                    .values()
                    .any(|v| v.netns == spec.netns && v.ifname == spec.ifname);
            if taken {
                return Err(PlumbingError::NameTaken {
                    ifname: spec.ifname.clone(),
                    netns: spec.netns.clone(),
                });
            }
            let mut n = self.macs.lock().unwrap();
            *n += 1;
            let mac = MacAddr([0x0a, 0, 0, 0, 0, *n]);
            w.veths.insert(
                spec.host_veth.clone(),
                FakeVeth {
                    netns: spec.netns.clone(),
                    ifname: spec.ifname.clone(),
                    mac,
                    mtu: spec.mtu,
                    ips: spec.ips(),
                },
            );
            mac
        };
        self.faults.pause_point().await;
        let mut w = self.world();
        let rules = spec.rules();
        if self.fault("setup_pod:partial").is_err() {
            w.rules.extend(rules.into_iter().take(1));
            return Err(PlumbingError::Injected("setup_pod:partial"));
        }
        if let Some(eni) = &spec.eni {
            for ip in spec.ips() {
                w.proxies.insert((ip, eni.clone()));
            }
        }
        w.rules.extend(rules);
        drop(w);
        self.fault("setup_pod:after")?;
        Ok(mac)
    }

    async fn teardown_pod(&self, spec: &PodSpec) -> Result<(), PlumbingError> {
        self.fault("teardown_pod")?;
        let mut w = self.world();
        for rule in spec.rules() {
            w.rules.remove(&rule);
        }
        if let Some(eni) = &spec.eni {
            for ip in spec.ips() {
                w.proxies.remove(&(ip, eni.clone()));
            }
        }
        w.veths.remove(&spec.host_veth);
        Ok(())
    }

    async fn observe_pod(&self, spec: &PodSpec) -> Result<PodObservation, PlumbingError> {
        let w = self.world();
        if !w.netns.contains(&spec.netns) {
            return Err(PlumbingError::NetnsNotFound(spec.netns.clone()));
        }
        let veth = w
            .veths
            .get(&spec.host_veth)
            .filter(|v| v.netns == spec.netns);
        let pod = veth.map(|v| PodLinkState {
            link: LinkInfo {
                index: 2,
                name: v.ifname.clone(),
                mac: v.mac,
                mtu: v.mtu,
                up: true,
            },
            addrs: v
                .ips
                .iter()
                .map(|ip| IpNet::new(*ip, if ip.is_ipv4() { 32 } else { 128 }).unwrap())
                .collect(),
            default_gateways: v
                .ips
                .iter()
                .map(|ip| match ip {
                    IpAddr::V4(_) => IpAddr::V4(GATEWAY4),
                    IpAddr::V6(_) => IpAddr::V6(GATEWAY6),
                })
                .collect(),
        });
        let mut missing: Vec<String> = spec
            .rules()
            .iter()
            .filter(|r| !w.rules.contains(r))
            .map(|r| format!("rule {r}"))
            .collect();
        if let Some(eni) = &spec.eni {
            for ip in spec.ips() {
                if !w.proxies.contains(&(ip, eni.clone())) {
                    missing.push(format!("proxy entry for {ip} on {eni}"));
                }
            }
        }
        Ok(PodObservation {
            pod,
            host_veth_up: veth.map(|_| true),
            missing,
        })
    }

    async fn inventory(
        &self,
        config: &SecondaryConfig,
        enis: &[String],
    ) -> Result<Inventory, PlumbingError> {
        let w = self.world();
        let tables = config.tables();
        Ok(Inventory {
            veths: w
                .veths
                .keys()
                .filter(|v| config.is_veth_name(v))
                .cloned()
                .collect(),
            rules: w
                .rules
                .iter()
                .filter(|r| {
                    r.priority == config.rule_priority_to_pod
                        || (r.priority == config.rule_priority_from_pod
                            && tables.contains(&r.table))
                })
                .copied()
                .collect(),
            tables: w
                .tables
                .iter()
                .filter(|t| tables.contains(t))
                .copied()
                .collect(),
            proxies: w
                .proxies
                .iter()
                .filter(|(_, eni)| enis.contains(eni))
                .cloned()
                .collect(),
        })
    }

    async fn remove_rule(&self, rule: &OwnedRule) -> Result<(), PlumbingError> {
        self.world().rules.remove(rule);
        Ok(())
    }

    async fn flush_table(&self, table: u32) -> Result<(), PlumbingError> {
        self.world().tables.remove(&table);
        Ok(())
    }

    async fn remove_veth(&self, name: &str) -> Result<(), PlumbingError> {
        self.world().veths.remove(name);
        Ok(())
    }

    async fn remove_proxy(&self, ip: IpAddr, eni: &str) -> Result<(), PlumbingError> {
        self.world().proxies.remove(&(ip, eni.to_string()));
        Ok(())
    }
}
