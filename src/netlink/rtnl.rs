//! [`Plumbing`] over rtnetlink, against the real kernel: primary mode's
//! policy, in the verbs of [`super::link`], [`super::addr`] and
//! [`super::route`].

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::Path;

use async_trait::async_trait;
use enim_core::MacAddr;
use ipnet::IpNet;

use super::addr::{self, AddrOptions};
use super::{handout, hostpath, link, route};
use super::{
    Host, HostLinkHome, HostPathSpec, LinkInfo, Netns, Own, Plumbing, PlumbingError, PodLinkConfig,
    PodLinkState, RefusedDevice,
};

// Paths the bench and older callers use.
pub use super::host::handle_in;
pub use super::link::dump as links;

const EEXIST: i32 = libc::EEXIST;

/// The real plumbing, over the [`Host`] it shares with secondary mode.
pub struct RtnlPlumbing {
    host: Host,
    // A dump of every link is the slow way to find a MAC (and dumps take
    // turns on the host socket). So MAC -> ifindex is cached and confirmed
    // with a cheap get-by-index; only a miss dumps.
    host_index: std::sync::Mutex<HashMap<MacAddr, u32>>,
    /// The host's routes and addresses for the hand-out rule, dumped again
    /// only after they change.
    routing: handout::RoutingCache,
}

/// Entries of the MAC -> ifindex cache past which a dump replaces it: a
/// node has tens of ENIs, so this bounds only churn (pod veths).
const INDEX_CACHE_MAX: usize = 4096;

impl RtnlPlumbing {
    /// `host_netns`: the host namespace's path; `None` is the agent's own.
    /// Opens a [`Host`] of its own; [`RtnlPlumbing::from_host`] shares one.
    pub async fn new(host_netns: Option<&Path>) -> Result<Self, PlumbingError> {
        Ok(Self::from_host(Host::open(host_netns).await?))
    }

    pub fn from_host(host: Host) -> Self {
        RtnlPlumbing {
            host,
            host_index: Default::default(),
            routing: Default::default(),
        }
    }

    async fn dump_host_links(&self) -> Result<Vec<LinkInfo>, PlumbingError> {
        let all = self.host.dump(link::dump).await?;
        self.reindex(all.iter().map(|l| (l.mac, l.index)));
        Ok(all)
    }

    /// Every host device as [`handout`] reads it (a dump), the cache
    /// refreshed.
    async fn dump_host_devices(&self) -> Result<Vec<handout::Device>, PlumbingError> {
        let all = self.host.dump(handout::dump_devices).await?;
        self.reindex(all.iter().filter_map(|d| Some((d.mac?, d.index))));
        Ok(all)
    }

    /// Updates the MAC -> ifindex cache from a dump. A MAC two devices
    /// share is left out: its lookups dump, and so see both. A MAC the dump
    /// did not see stays: its device is most likely in a pod and comes home
    /// under the same index, and every use confirms the MAC with a get
    /// anyway (forgetting it made the next DEL or ADD of that ENI dump
    /// every device). Past [`INDEX_CACHE_MAX`] entries only what the dump
    /// saw is kept, so churning veths cannot grow it without bound.
    fn reindex(&self, dumped: impl Iterator<Item = (MacAddr, u32)>) {
        let mut seen: HashMap<MacAddr, Option<u32>> = HashMap::new();
        for (mac, i) in dumped {
            seen.entry(mac)
                .and_modify(|shared| *shared = None)
                .or_insert(Some(i));
        }
        let mut index = self.host_index.lock().unwrap_or_else(|p| p.into_inner());
        if index.len() + seen.len() > INDEX_CACHE_MAX {
            index.clear();
        }
        for (mac, i) in seen {
            match i {
                Some(i) => index.insert(mac, i),
                None => index.remove(&mac),
            };
        }
    }

    /// Remembers where `mac` was just found by a get.
    fn remember(&self, mac: MacAddr, index: u32) {
        let mut cache = self.host_index.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() < INDEX_CACHE_MAX || cache.contains_key(&mac) {
            cache.insert(mac, index);
        }
    }

    /// The cached ifindex of `mac`, if any.
    fn cached_index(&self, mac: MacAddr) -> Option<u32> {
        self.host_index
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&mac)
            .copied()
    }

    /// The device with `mac` in the host namespace, under any name.
    async fn host_link(&self, mac: MacAddr) -> Result<Option<LinkInfo>, PlumbingError> {
        if let Some(index) = self.cached_index(mac) {
            if let Some(link) = link::by_index(self.host.handle(), index).await? {
                if link.mac == mac {
                    return Ok(Some(link));
                }
            }
        }
        Ok(self
            .dump_host_links()
            .await?
            .into_iter()
            .find(|l| l.mac == mac))
    }

    /// How many times the hand-out rule has dumped the host's routes and
    /// addresses (each ADD reuses the last dump until they change).
    pub fn routing_dumps(&self) -> u64 {
        self.routing.dumps()
    }

    pub fn host(&self) -> &Host {
        &self.host
    }

    pub fn host_netns(&self) -> &Netns {
        self.host.netns()
    }

    pub fn host_handle(&self) -> &rtnetlink::Handle {
        self.host.handle()
    }
}

/// A host name for a device whose recorded name is taken: derived from the
/// MAC so it is stable, and normalised later by GC.
fn fallback_host_name(mac: MacAddr) -> String {
    let m = mac.octets();
    format!("enim{:02x}{:02x}{:02x}", m[3], m[4], m[5])
}

#[async_trait]
impl Plumbing for RtnlPlumbing {
    async fn check_netns(&self, path: &Path) -> Result<(), PlumbingError> {
        self.host.check_pod_netns(path)
    }

    async fn eni_link(
        &self,
        mac: MacAddr,
        own: Own<'_>,
    ) -> Result<Option<LinkInfo>, PlumbingError> {
        // The cached index, confirmed by a get (its message says kind,
        // master and peer); only a miss dumps every device, and then the
        // rule also sees every other device with the MAC.
        let cached = match self.cached_index(mac) {
            Some(index) => handout::device_by_index(self.host.handle(), index)
                .await?
                .filter(|d| d.mac == Some(mac)),
            None => None,
        };
        let (device, all) = match cached {
            Some(device) => (device, None),
            None => {
                let all = self.dump_host_devices().await?;
                let Some(device) = all.iter().find(|d| d.mac == Some(mac)).cloned() else {
                    return Ok(None);
                };
                (device, Some(all))
            }
        };
        if let Some(why) = handout::judge(
            &self.host,
            handout::Routing::Cached(&self.routing),
            &device,
            all.as_deref(),
            own,
        )
        .await?
        {
            return Err(PlumbingError::Refused {
                mac,
                device: device.name,
                why: Box::new(why),
            });
        }
        Ok(device.info())
    }

    async fn host_links(&self) -> Result<Vec<LinkInfo>, PlumbingError> {
        self.dump_host_links().await
    }

    async fn move_to_pod(
        &self,
        link: &LinkInfo,
        netns: &Path,
        ifname: &str,
    ) -> Result<(), PlumbingError> {
        let ns = Netns::open(netns)?;
        // One message moves and renames: no window with a half-configured
        // device under its host name in the pod.
        match link::move_to(
            self.host.handle(),
            link.index,
            &ns,
            ifname,
            None,
            "move to pod",
        )
        .await
        {
            Err(e) if e.errno() == Some(EEXIST) => Err(PlumbingError::NameTaken {
                ifname: ifname.to_string(),
                netns: netns.to_path_buf(),
            }),
            other => other,
        }
    }

    async fn configure_pod_link(
        &self,
        netns: &Path,
        mac: MacAddr,
        config: &PodLinkConfig,
    ) -> Result<LinkInfo, PlumbingError> {
        let ns = Netns::open(netns)?;
        let pod = handle_in(&ns).await?;
        let mut link =
            link::by_mac(&pod, mac)
                .await?
                .ok_or_else(|| PlumbingError::LinkNotFound {
                    mac,
                    place: netns.display().to_string(),
                })?;
        link::set_up(&pod, link.index, Some(config.mtu), "set MTU and up").await?;
        link.mtu = config.mtu;
        link.up = true;
        let v4 = IpNet::V4(config.ipv4);
        let options = AddrOptions::default();
        addr::add(&pod, link.index, v4, options, "add IPv4 address").await?;
        if let Some(v6) = config.ipv6 {
            let v6 = IpNet::V6(v6);
            addr::add(&pod, link.index, v6, AddrOptions::NODAD, "add IPv6 address").await?;
        }
        let default = |gw| route::default_via(gw, link.index, route::MAIN_TABLE);
        let gw4 = default(IpAddr::V4(config.gateway4));
        route::add(&pod, gw4, "add IPv4 default route").await?;
        if let Some(gw6) = config.gateway6 {
            route::add(&pod, default(IpAddr::V6(gw6)), "add IPv6 default route").await?;
        }
        route::prohibit_all(&pod, &config.blocked).await?;
        Ok(link)
    }

    async fn pod_link(
        &self,
        netns: &Path,
        mac: MacAddr,
    ) -> Result<Option<PodLinkState>, PlumbingError> {
        let ns = Netns::open(netns)?;
        let pod = handle_in(&ns).await?;
        match link::by_mac(&pod, mac).await? {
            Some(link) => Ok(Some(link::pod_state(&pod, link).await?)),
            None => Ok(None),
        }
    }

    async fn move_to_host(
        &self,
        netns: &Path,
        home: HostLinkHome<'_>,
    ) -> Result<Option<LinkInfo>, PlumbingError> {
        let HostLinkHome {
            mac,
            name: host_name,
            mtu: host_mtu,
        } = home;
        let ns = Netns::open(netns)?;
        let pod = handle_in(&ns).await?;
        let Some(link) = link::by_mac(&pod, mac).await? else {
            return Ok(None);
        };
        // No separate down or address flush: the move itself closes the
        // device and flushes its addresses and routes. The host MTU rides
        // in the move message, applied once the device is home.
        let home = self.host.netns();
        let mtu = Some(host_mtu);
        match link::move_to(&pod, link.index, home, host_name, mtu, "move to host").await {
            Err(e) if e.errno() == Some(EEXIST) => {
                // Someone took the host name meanwhile; bring the ENI home
                // under a stable fallback rather than strand it in the pod.
                let fallback = fallback_host_name(mac);
                tracing::warn!(%mac, host_name, fallback, "host name taken; moving ENI home under fallback name");
                let op = "move to host (fallback name)";
                link::move_to(&pod, link.index, home, &fallback, mtu, op).await?;
            }
            other => other?,
        }
        // The kernel keeps a moved device's ifindex unless the host has
        // given it to another device meanwhile: a get confirms it, and only
        // then is the MAC looked for.
        if let Some(home) = link::by_index(self.host.handle(), link.index)
            .await?
            .filter(|l| l.mac == mac)
        {
            self.remember(mac, home.index);
            return Ok(Some(home));
        }
        match self.host_link(mac).await? {
            Some(home) => Ok(Some(home)),
            None => Err(PlumbingError::LinkNotFound {
                mac,
                place: "the host namespace after the move".into(),
            }),
        }
    }

    async fn refused_devices(&self, own: Own<'_>) -> Result<Vec<RefusedDevice>, PlumbingError> {
        handout::survey(&self.host, own).await
    }

    async fn add_host_path(&self, spec: &HostPathSpec<'_>) -> Result<MacAddr, PlumbingError> {
        hostpath::add(&self.host, spec).await
    }

    async fn remove_host_path(&self, host_veth: &str) -> Result<(), PlumbingError> {
        hostpath::remove(&self.host, host_veth).await
    }

    async fn reroute_host_path(
        &self,
        spec: &HostPathSpec<'_>,
        add: &[IpNet],
        remove: &[IpNet],
    ) -> Result<(), PlumbingError> {
        hostpath::reroute(&self.host, spec, add, remove).await
    }

    async fn check_host_path(
        &self,
        spec: &HostPathSpec<'_>,
        mac: Option<MacAddr>,
    ) -> Result<Result<MacAddr, String>, PlumbingError> {
        hostpath::check(&self.host, spec, mac).await
    }

    async fn host_veths(&self) -> Result<Vec<String>, PlumbingError> {
        hostpath::host_veths(&self.host).await
    }

    async fn node_addresses(&self) -> Result<Vec<IpAddr>, PlumbingError> {
        self.host.dump(addr::dump_global).await
    }

    async fn restore_host_link(&self, home: HostLinkHome<'_>) -> Result<bool, PlumbingError> {
        let Some(link) = self.host_link(home.mac).await? else {
            return Ok(false);
        };
        self.put_home(&link, home.name, home.mtu).await?;
        Ok(true)
    }

    async fn restore_host_links(
        &self,
        homes: &[HostLinkHome<'_>],
    ) -> Result<Vec<Result<bool, PlumbingError>>, PlumbingError> {
        // One dump for the batch: a cache miss in host_link dumps every
        // link, and a dead pod's veth is a miss every time (1000 dumps for
        // 1000 dead records).
        let by_mac: HashMap<MacAddr, LinkInfo> = self
            .dump_host_links()
            .await?
            .into_iter()
            .map(|l| (l.mac, l))
            .collect();
        let mut out = Vec::with_capacity(homes.len());
        for home in homes {
            let Some(link) = by_mac.get(&home.mac) else {
                out.push(Ok(false));
                continue;
            };
            out.push(match self.put_home(link, home.name, home.mtu).await {
                Ok(()) => Ok(true),
                // Gone or moved since the dump: look it up afresh.
                Err(e) if e.errno() == Some(libc::ENODEV) => self.restore_host_link(*home).await,
                Err(e) => Err(e),
            });
        }
        Ok(out)
    }
}

impl RtnlPlumbing {
    /// Renames and retunes host device `link` to `host_name` and `host_mtu`
    /// where it differs.
    async fn put_home(
        &self,
        link: &LinkInfo,
        host_name: &str,
        host_mtu: u32,
    ) -> Result<(), PlumbingError> {
        let host = self.host.handle();
        if link.name != host_name {
            let op = "rename to host name";
            let netns = self.host.netns().path();
            link::rename(host, link.index, host_name, Some(host_mtu), netns, op).await?;
        } else if link.mtu != host_mtu {
            link::set_mtu(host, link.index, host_mtu, "restore host MTU").await?;
        }
        Ok(())
    }
}
