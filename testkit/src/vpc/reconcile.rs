//! One pass of the simulator: moto's listing (planned by [`super::desired`])
//! against what the VPC namespace holds, with the cloud's latencies.
//! Idempotent: every tick compares desired and actual afresh, and the far
//! ends are found by their alias, so a restarted simulator adopts the
//! devices it finds instead of making them again. A failure of one ENI is
//! logged and retried next tick; it never stops the others.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::os::unix::fs::MetadataExt;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use enim_provider_aws::client::{Ec2Client, NetworkInterface, Subnet};

use super::config::{PrimaryMode, VpcConfig};
use super::desired::{self, parse_alias, Plug, Skip};
use super::kernel::{self, HostRoute, KernelError, Ns, PairSpec, ProxyNeighbour};

/// What one tick did (tests read it; the loop only logs).
#[derive(Debug, Default)]
pub struct Tick {
    /// ENI ids whose device was made.
    pub plugged: Vec<String>,
    /// ENI ids whose device was removed.
    pub unplugged: Vec<String>,
    pub skipped: Vec<Skip>,
    pub errors: Vec<String>,
}

pub struct Reconciler {
    cfg: VpcConfig,
    vpc: Ns,
    /// Node namespaces by node index, opened on first use.
    nodes: HashMap<usize, Ns>,
    /// When each wanted attachment (by alias) was first listed.
    first_wanted: HashMap<String, Instant>,
    /// When each far end (by alias) was first found unwanted.
    first_unwanted: HashMap<String, Instant>,
    /// Last tick's complaints: each is printed once, when it first shows.
    said: HashSet<String>,
}

impl Reconciler {
    /// Opens and prepares the VPC namespace (see [`kernel::prepare_vpc`]).
    pub async fn new(cfg: VpcConfig) -> Result<Reconciler, KernelError> {
        let vpc = Ns::open(&cfg.vpc_netns).await?;
        kernel::prepare_vpc(&vpc).await?;
        Ok(Reconciler {
            cfg,
            vpc,
            nodes: HashMap::new(),
            first_wanted: HashMap::new(),
            first_unwanted: HashMap::new(),
            said: HashSet::new(),
        })
    }

    pub fn vpc(&self) -> &Ns {
        &self.vpc
    }

    /// Lists moto and reconciles. A failed listing changes nothing.
    pub async fn poll(&mut self, ec2: &Ec2Client) -> Tick {
        let listing = ec2.describe_network_interfaces(&[]).await;
        let subnets = ec2.describe_subnets(&[]).await;
        match (listing, subnets) {
            (Ok(listing), Ok(subnets)) => self.tick(&listing, &subnets, Instant::now()).await,
            (Err(e), _) | (_, Err(e)) => {
                let tick = Tick {
                    errors: vec![format!("listing moto: {e}")],
                    ..Tick::default()
                };
                self.log(&tick);
                tick
            }
        }
    }

    /// Reconciles the kernel with one listing, as of `now`.
    pub async fn tick(
        &mut self,
        listing: &[NetworkInterface],
        subnets: &[Subnet],
        now: Instant,
    ) -> Tick {
        let plan = desired::plan(listing, subnets, &self.cfg);
        let mut tick = Tick {
            skipped: plan.skips,
            ..Tick::default()
        };
        let wanted: HashSet<String> = plan.plugs.iter().map(Plug::alias).collect();
        self.first_wanted.retain(|k, _| wanted.contains(k));
        for k in &wanted {
            self.first_wanted.entry(k.clone()).or_insert(now);
        }

        let far_ends = match kernel::links(self.vpc.handle()).await {
            Ok(links) => links,
            Err(e) => {
                tick.errors.push(e.to_string());
                self.log(&tick);
                return tick;
            }
        };
        let mut present: HashMap<String, kernel::Link> = far_ends
            .into_iter()
            .filter_map(|l| {
                let alias = l.alias.clone()?;
                parse_alias(&alias)?;
                Some((alias, l))
            })
            .collect();

        // Unplug what moto no longer attaches, once the detach delay is up.
        let unwanted: Vec<String> = present
            .keys()
            .filter(|a| !wanted.contains(*a))
            .cloned()
            .collect();
        self.first_unwanted.retain(|k, _| unwanted.contains(k));
        for alias in unwanted {
            let since = *self.first_unwanted.entry(alias.clone()).or_insert(now);
            if now.duration_since(since) < self.cfg.detach_delay() {
                continue;
            }
            let Some(link) = present.remove(&alias) else {
                continue;
            };
            let eni = parse_alias(&alias).map_or(alias.clone(), |(e, _)| e.to_string());
            match kernel::delete(self.vpc.handle(), link.index).await {
                Ok(()) => {
                    self.first_unwanted.remove(&alias);
                    tick.unplugged.push(eni);
                }
                Err(e) => tick.errors.push(format!("{eni}: {e}")),
            }
        }

        // Plug what moto attaches, once the attach delay is up; adopt what
        // is there already (whatever its age: a restart must not flap it).
        let mut live: Vec<(&Plug, u32)> = Vec::new();
        for p in &plan.plugs {
            let alias = p.alias();
            if let Some(link) = present.get(&alias) {
                if !link.up || link.mtu != p.mtu {
                    if let Err(e) = kernel::set_up(self.vpc.handle(), link.index, Some(p.mtu)).await
                    {
                        tick.errors.push(format!("{}: {e}", p.eni_id));
                    }
                }
                live.push((p, link.index));
                continue;
            }
            let since = self.first_wanted.get(&alias).copied().unwrap_or(now);
            if now.duration_since(since) < self.cfg.attach_delay() {
                continue;
            }
            match self.plug(p).await {
                Ok(index) => {
                    tick.plugged.push(p.eni_id.clone());
                    live.push((p, index));
                }
                Err(e) => tick.errors.push(format!("{}: {e}", p.eni_id)),
            }
        }

        if let Err(e) = self.sync_gateways(&live).await {
            tick.errors.push(e.to_string());
        }
        if let Err(e) = self.sync_routes(&live).await {
            tick.errors.push(e.to_string());
        }
        if let Err(e) = self.sync_proxy_neighbours(&live).await {
            tick.errors.push(e.to_string());
        }
        self.log(&tick);
        tick
    }

    /// The node's namespace, (re)opened when its path names another
    /// namespace than the one held (a node made again).
    async fn open_node(&mut self, node: usize) -> Result<(), KernelError> {
        let path = self.cfg.nodes[node].netns.clone();
        let stale = match self.nodes.get(&node) {
            None => true,
            Some(ns) => !same_file(ns, &path),
        };
        if stale {
            self.nodes.insert(node, Ns::open(&path).await?);
        }
        Ok(())
    }

    /// Makes `p`'s device pair; returns the far end's index.
    async fn plug(&mut self, p: &Plug) -> Result<u32, KernelError> {
        let far_name = far_name(&p.eni_id);
        let (alias, node_name) = (p.alias(), p.node_ifname());
        let spec = PairSpec {
            far_name: &far_name,
            alias: &alias,
            node_name: &node_name,
            mac: p.mac.octets(),
            mtu: p.mtu,
        };
        self.open_node(p.node).await?;
        let node = &self.nodes[&p.node];
        let index = kernel::add_pair(&self.vpc, node, &spec).await?;
        if p.primary == Some(PrimaryMode::Address) {
            address_primary(node, p).await?;
        }
        Ok(index)
    }

    /// Every live far end holds its subnet's gateways (the same address on
    /// every far end of a subnet: each answers for its own ENI).
    async fn sync_gateways(&self, live: &[(&Plug, u32)]) -> Result<(), KernelError> {
        let h = self.vpc.handle();
        let have: HashSet<(u32, IpAddr)> = kernel::addresses(h).await?.into_iter().collect();
        for (p, index) in live {
            let mut gateways = vec![(IpAddr::V4(p.gateway4()), 32)];
            if let Some(gw6) = p.gateway6() {
                gateways.push((IpAddr::V6(gw6), 128));
            }
            for (gw, prefix) in gateways {
                if !have.contains(&(*index, gw)) {
                    kernel::add_address(h, *index, gw, prefix).await?;
                }
            }
        }
        Ok(())
    }

    /// One host route per address moto assigned, to its ENI's far end; the
    /// simulator's other routes go.
    async fn sync_routes(&self, live: &[(&Plug, u32)]) -> Result<(), KernelError> {
        let h = self.vpc.handle();
        let want: HashSet<HostRoute> = live
            .iter()
            .flat_map(|(p, index)| {
                p.addresses().map(|addr| HostRoute {
                    addr,
                    index: *index,
                })
            })
            .collect();
        let (stale, missing) = changes(&want, kernel::routes(h).await?);
        for msg in stale {
            kernel::del_route(h, msg).await?;
        }
        for route in missing {
            kernel::add_route(h, route).await?;
        }
        Ok(())
    }

    /// Each live far end answers neighbour solicitations for every IPv6
    /// address of the other ENIs in its subnet: a pod's on-link /64 then
    /// reaches another node's pod through the VPC, as the cloud's fabric
    /// answers for the whole subnet. The simulator's other entries go.
    async fn sync_proxy_neighbours(&self, live: &[(&Plug, u32)]) -> Result<(), KernelError> {
        let h = self.vpc.handle();
        let mut want: HashSet<ProxyNeighbour> = HashSet::new();
        for (p, index) in live {
            let Some(subnet) = p.subnet_v6 else { continue };
            for (q, _) in live {
                if q.eni_id != p.eni_id && q.subnet_v6 == Some(subnet) {
                    want.extend(q.ipv6.iter().map(|addr| ProxyNeighbour {
                        addr: *addr,
                        index: *index,
                    }));
                }
            }
        }
        let (stale, missing) = changes(&want, kernel::proxy_neighbours(h).await?);
        for msg in stale {
            kernel::del_proxy_neighbour(h, msg).await?;
        }
        for entry in missing {
            kernel::add_proxy_neighbour(h, entry).await?;
        }
        Ok(())
    }

    /// Prints what is new since the last tick: every plug and unplug, and
    /// each skip or error once while it lasts (a tick is 200 ms). Plugs and
    /// unplugs carry the time, for the e2e rig's phase breakdowns.
    fn log(&mut self, tick: &Tick) {
        for eni in &tick.plugged {
            eprintln!("enim-vpcsim: @{} plugged {eni}", epoch_stamp());
        }
        for eni in &tick.unplugged {
            eprintln!("enim-vpcsim: @{} unplugged {eni}", epoch_stamp());
        }
        let now: HashSet<String> = tick
            .skipped
            .iter()
            .map(|s| format!("skipped {:?}: {}", s.eni_id, s.why))
            .chain(tick.errors.iter().cloned())
            .collect();
        for line in now.difference(&self.said) {
            eprintln!("enim-vpcsim: {line}");
        }
        self.said = now;
    }
}

/// What makes the kernel's entries of one kind (`have`, each with the
/// message that deletes it) exactly `want`: the messages of the unwanted
/// ones, to delete first, and the wanted ones missing, to add.
fn changes<K, M>(want: &HashSet<K>, have: Vec<(K, M)>) -> (Vec<M>, Vec<K>)
where
    K: Copy + Eq + std::hash::Hash,
{
    let mut kept = HashSet::new();
    let mut stale = Vec::new();
    for (entry, msg) in have {
        if want.contains(&entry) {
            kept.insert(entry);
        } else {
            stale.push(msg);
        }
    }
    let missing = want.difference(&kept).copied().collect();
    (stale, missing)
}

/// Now, as seconds since the epoch to the microsecond (a clock any log
/// reader can line up with RFC 3339 stamps, with no calendar code here).
fn epoch_stamp() -> String {
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    format!("{}.{:06}", t.as_secs(), t.subsec_micros())
}

/// Whether `path` still names the namespace `ns` holds open.
fn same_file(ns: &Ns, path: &std::path::Path) -> bool {
    let Ok(now) = std::fs::metadata(path) else {
        return false;
    };
    ns.held_id() == Some((now.dev(), now.ino()))
}

/// A far end's name: `vpc` and 12 hex digits of a stable hash of the ENI
/// id (15 characters, the kernel's limit). The alias, not the name, says
/// which ENI it is; the name only has to be stable across restarts.
pub fn far_name(eni_id: &str) -> String {
    // FNV-1a: stable across runs, unlike std's seeded hasher.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in eni_id.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("vpc{:012x}", h & 0xffff_ffff_ffff)
}

/// Configures a primary ENI as DHCP would: up, with moto's primary IPv4
/// (the subnet's prefix) and its IPv6 addresses.
async fn address_primary(node: &Ns, p: &Plug) -> Result<(), KernelError> {
    let h = node.handle();
    let name = p.node_ifname();
    let link = kernel::link_named(h, &name).await?.ok_or_else(|| {
        KernelError::Conflict(format!("{name} vanished from {}", node.path().display()))
    })?;
    if let Some(v4) = p.ipv4.first() {
        kernel::add_address(h, link.index, IpAddr::V4(*v4), p.subnet_v4.prefix_len()).await?;
    }
    for v6 in &p.ipv6 {
        kernel::add_address(h, link.index, IpAddr::V6(*v6), 128).await?;
    }
    kernel::set_up(h, link.index, None).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn far_names_are_stable_and_short() {
        let a = far_name("eni-0123456789abcdef0");
        assert_eq!(a, far_name("eni-0123456789abcdef0"));
        assert_ne!(a, far_name("eni-0123456789abcdef1"));
        assert_eq!(a.len(), 15);
        assert!(a.starts_with("vpc"));
    }
}
