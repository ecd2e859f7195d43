//! The static provider: the ENIs a node may use are declared in the agent's
//! config (bare metal, labs and tests). Ownership lives in memory and is
//! rebuilt from the agent's checkpoint through [`EniProvider::restore`].

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Mutex;

use async_trait::async_trait;
use enim_core::{Eni, EniOwner, MacAddr, Placement, ProviderError};
use enim_provider::EniProvider;
use ipnet::{Ipv4Net, Ipv6Net};
use serde::{Deserialize, Serialize};

pub mod fleet;
pub use fleet::{StaticFleet, StaticFleetConfig};

/// One ENI as declared in config.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct StaticEniConfig {
    /// The ENI's id.
    pub id: String,
    /// Its MAC: how enim finds its device, under any name.
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub mac: MacAddr,
    /// Its primary address with the subnet's prefix, `"10.0.1.10/24"`.
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub ipv4: Ipv4Net,
    /// The subnet's gateway.
    pub gateway4: Ipv4Addr,
    /// An IPv6 address with its prefix, with `gateway6`.
    #[serde(default)]
    #[cfg_attr(feature = "schema", schemars(with = "Option<String>"))]
    pub ipv6: Option<Ipv6Net>,
    /// The IPv6 subnet's gateway.
    #[serde(default)]
    pub gateway6: Option<Ipv6Addr>,
    /// The pod's MTU.
    ///
    /// Default: the device's.
    #[serde(default)]
    pub mtu: Option<u32>,
    /// Secondary mode: the ENI's device index, which numbers its route
    /// table.
    ///
    /// Default: its 1-based position in the list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_index: Option<u32>,
    /// Secondary mode: the IPv4 addresses pods get, one each, inside
    /// `ipv4`'s subnet.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secondary_ipv4: Vec<Ipv4Addr>,
    /// Secondary mode: the IPv6 addresses pods get, inside `ipv6`'s subnet.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secondary_ipv6: Vec<Ipv6Addr>,
    /// What the DRA driver publishes about the ENI: `{ subnet, zone,
    /// security_groups, network_card }`, all optional.
    #[serde(default, skip_serializing_if = "Placement::is_empty")]
    pub placement: Placement,
}

impl StaticEniConfig {
    /// An ENI with only the fields a config must give; every optional one
    /// unset, as when the config leaves it out.
    pub fn new(id: String, mac: MacAddr, ipv4: Ipv4Net, gateway4: Ipv4Addr) -> Self {
        StaticEniConfig {
            id,
            mac,
            ipv4,
            gateway4,
            ipv6: None,
            gateway6: None,
            mtu: None,
            device_index: None,
            secondary_ipv4: vec![],
            secondary_ipv6: vec![],
            placement: Placement::default(),
        }
    }
}

pub struct StaticProvider {
    // One lock over all slots makes "find free + assign" atomic, which is all
    // the concurrency guarantee the API asks for.
    slots: Mutex<Slots>,
}

/// An owner's identity (network, container id, ifname): pod metadata aside.
type OwnerKey = (String, String, String);

fn owner_key(owner: &EniOwner) -> OwnerKey {
    (
        owner.network.clone(),
        owner.container_id.clone(),
        owner.ifname.clone(),
    )
}

/// The declared ENIs in config order, with indexes so that restoring or
/// releasing one of 10,000 entries is not a scan of all of them (a start-up
/// restore was O(n²)). Only `assign` and `clear` change ownership, so the
/// indexes cannot drift from `enis`.
struct Slots {
    enis: Vec<Eni>,
    /// ENI id -> position; fixed after construction.
    by_id: HashMap<String, usize>,
    /// Owner -> the positions it holds: one, unless a restore gave the same
    /// attachment a second ENI.
    by_owner: HashMap<OwnerKey, Vec<usize>>,
    /// Free positions; allocation takes the lowest, i.e. config order.
    free: BTreeSet<usize>,
}

impl Slots {
    fn new(enis: Vec<Eni>) -> Slots {
        let by_id = enis
            .iter()
            .enumerate()
            .map(|(i, e)| (e.id.clone(), i))
            .collect();
        let free = (0..enis.len()).collect();
        Slots {
            enis,
            by_id,
            by_owner: HashMap::new(),
            free,
        }
    }

    /// The lowest position `owner` holds.
    fn held_by(&self, owner: &EniOwner) -> Option<usize> {
        self.by_owner
            .get(&owner_key(owner))
            .and_then(|at| at.iter().min().copied())
    }

    fn assign(&mut self, at: usize, owner: EniOwner) {
        self.clear(at);
        self.free.remove(&at);
        self.by_owner.entry(owner_key(&owner)).or_default().push(at);
        self.enis[at].owner = Some(owner);
    }

    fn clear(&mut self, at: usize) {
        let Some(old) = self.enis[at].owner.take() else {
            return;
        };
        let key = owner_key(&old);
        if let Some(held) = self.by_owner.get_mut(&key) {
            held.retain(|i| *i != at);
            if held.is_empty() {
                self.by_owner.remove(&key);
            }
        }
        self.free.insert(at);
    }

    /// Panics unless the indexes say exactly what the slots say.
    #[cfg(test)]
    fn assert_consistent(&self) {
        let mut owners: HashMap<OwnerKey, Vec<usize>> = HashMap::new();
        let mut free = BTreeSet::new();
        for (i, e) in self.enis.iter().enumerate() {
            assert_eq!(self.by_id[&e.id], i);
            match &e.owner {
                Some(o) => owners.entry(owner_key(o)).or_default().push(i),
                None => {
                    free.insert(i);
                }
            }
        }
        let mut indexed = self.by_owner.clone();
        indexed.values_mut().for_each(|v| v.sort_unstable());
        assert_eq!(indexed, owners, "owner index");
        assert_eq!(self.free, free, "free set");
        assert_eq!(self.by_id.len(), self.enis.len());
    }
}

impl StaticProvider {
    /// Validates the declared ENIs (see [`validated`]).
    pub fn new(enis: Vec<StaticEniConfig>) -> Result<Self, ProviderError> {
        Ok(StaticProvider {
            slots: Mutex::new(Slots::new(validated(enis)?)),
        })
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, Slots> {
        // A panic while holding the lock cannot leave a slot half-assigned
        // (assignments are single stores), so a poisoned lock is still sound.
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One node's declared ENIs as [`Eni`]s, validated: unique ids, MACs,
/// device indexes and secondary addresses, gateways and secondary
/// addresses inside their subnets, IPv6 gateway only with an IPv6 address.
pub fn validated(enis: Vec<StaticEniConfig>) -> Result<Vec<Eni>, ProviderError> {
    let mut ids = HashSet::new();
    let mut macs = HashSet::new();
    let mut slots = Vec::with_capacity(enis.len());
    let mut indexes = HashSet::new();
    let mut addresses = HashSet::new();
    for (position, e) in enis.into_iter().enumerate() {
        let bad = |why: String| ProviderError::Config(format!("ENI {:?}: {why}", e.id));
        if e.id.is_empty() {
            return Err(ProviderError::Config("an ENI has an empty id".into()));
        }
        if !ids.insert(e.id.clone()) {
            return Err(bad("duplicate id".into()));
        }
        if !macs.insert(e.mac) {
            return Err(bad(format!("MAC {} is declared twice", e.mac)));
        }
        if !e.ipv4.contains(&e.gateway4) || e.gateway4 == e.ipv4.addr() {
            return Err(bad(format!(
                "gateway4 {} must be another address inside {}",
                e.gateway4, e.ipv4
            )));
        }
        match (e.ipv6, e.gateway6) {
            (None, Some(_)) => return Err(bad("gateway6 given without ipv6".into())),
            (Some(_), None) => return Err(bad("ipv6 given without gateway6".into())),
            _ => {}
        }
        if let Some(mtu) = e.mtu {
            if !(68..=65535).contains(&mtu) {
                return Err(bad(format!("mtu {mtu} is outside 68..=65535")));
            }
        }
        let device_index = match e.device_index {
            Some(i) => i,
            None => {
                u32::try_from(position + 1).map_err(|_| bad("too many ENIs to number".into()))?
            }
        };
        if !indexes.insert(device_index) {
            return Err(bad(format!("device_index {device_index} is used twice")));
        }
        for ip in &e.secondary_ipv4 {
            if !e.ipv4.contains(ip) || *ip == e.ipv4.addr() || *ip == e.gateway4 {
                return Err(bad(format!(
                    "secondary address {ip} must be another address inside {}",
                    e.ipv4
                )));
            }
        }
        if !e.secondary_ipv6.is_empty() {
            let (Some(net), Some(gw)) = (e.ipv6, e.gateway6) else {
                return Err(bad("secondary_ipv6 needs ipv6 and gateway6".into()));
            };
            for ip in &e.secondary_ipv6 {
                if !net.contains(ip) || *ip == net.addr() || *ip == gw {
                    return Err(bad(format!(
                        "secondary address {ip} must be another address inside {net}"
                    )));
                }
            }
        }
        let ips: Vec<IpAddr> = e
            .secondary_ipv4
            .iter()
            .map(|ip| IpAddr::V4(*ip))
            .chain(e.secondary_ipv6.iter().map(|ip| IpAddr::V6(*ip)))
            .collect();
        for ip in &ips {
            if !addresses.insert(*ip) {
                return Err(bad(format!("secondary address {ip} is declared twice")));
            }
        }
        slots.push(Eni {
            id: e.id,
            mac: e.mac,
            ipv4: e.ipv4,
            gateway4: e.gateway4,
            ipv6: e.ipv6,
            gateway6: e.gateway6,
            mtu: e.mtu,
            owner: None,
            device_index: Some(device_index),
            secondary_ips: ips,
            placement: e.placement,
        });
    }
    Ok(slots)
}

#[async_trait]
impl EniProvider for StaticProvider {
    fn name(&self) -> &str {
        "static"
    }

    async fn list(&self) -> Result<Vec<Eni>, ProviderError> {
        Ok(self.slots().enis.clone())
    }

    async fn allocate_next(&self, owner: &EniOwner) -> Result<Eni, ProviderError> {
        let mut slots = self.slots();
        if let Some(held) = slots.held_by(owner) {
            return Ok(slots.enis[held].clone());
        }
        let total = slots.enis.len();
        let free = *slots
            .free
            .first()
            .ok_or(ProviderError::Exhausted { total })?;
        slots.assign(free, owner.clone());
        Ok(slots.enis[free].clone())
    }

    async fn allocate_named(&self, eni_id: &str, owner: &EniOwner) -> Result<Eni, ProviderError> {
        let mut slots = self.slots();
        let at = *slots
            .by_id
            .get(eni_id)
            .ok_or_else(|| ProviderError::UnknownEni(eni_id.into()))?;
        match &slots.enis[at].owner {
            Some(o) if o.same_attachment(owner) => return Ok(slots.enis[at].clone()),
            Some(o) => {
                return Err(ProviderError::OwnedByOther {
                    eni_id: eni_id.into(),
                    holder: o.to_string(),
                    requester: owner.to_string(),
                })
            }
            None => {}
        }
        slots.assign(at, owner.clone());
        Ok(slots.enis[at].clone())
    }

    async fn release(&self, owner: &EniOwner) -> Result<(), ProviderError> {
        let mut slots = self.slots();
        let held = slots
            .by_owner
            .get(&owner_key(owner))
            .cloned()
            .unwrap_or_default();
        for at in held {
            slots.clear(at);
        }
        Ok(())
    }

    async fn restore(&self, assignments: &[(String, EniOwner)]) -> Result<(), ProviderError> {
        let mut slots = self.slots();
        // Check everything first so a bad checkpoint changes nothing.
        let mut positions = Vec::with_capacity(assignments.len());
        for (eni_id, owner) in assignments {
            let at = *slots
                .by_id
                .get(eni_id)
                .ok_or_else(|| ProviderError::UnknownEni(eni_id.clone()))?;
            if let Some(holder) = &slots.enis[at].owner {
                if !holder.same_attachment(owner) {
                    return Err(ProviderError::OwnedByOther {
                        eni_id: eni_id.clone(),
                        holder: holder.to_string(),
                        requester: owner.to_string(),
                    });
                }
            }
            positions.push(at);
        }
        for (at, (_, owner)) in positions.into_iter().zip(assignments) {
            slots.assign(at, owner.clone());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use enim_provider::testing::{allocate_concurrently, owner};
    use std::sync::Arc;

    fn eni(i: u8) -> StaticEniConfig {
        StaticEniConfig::new(
            format!("eni-{i}"),
            MacAddr([2, 0, 0, 0, 0, i]),
            format!("10.0.{i}.10/24").parse().unwrap(),
            format!("10.0.{i}.1").parse().unwrap(),
        )
    }

    #[tokio::test]
    async fn allocate_is_idempotent_and_exhausts() {
        let p = StaticProvider::new(vec![eni(1), eni(2)]).unwrap();
        let a = p.allocate_next(&owner("a")).await.unwrap();
        assert_eq!(p.allocate_next(&owner("a")).await.unwrap().id, a.id);
        let b = p.allocate_next(&owner("b")).await.unwrap();
        assert_ne!(a.id, b.id);
        assert_eq!(
            p.allocate_next(&owner("c")).await.unwrap_err(),
            ProviderError::Exhausted { total: 2 }
        );
        p.release(&owner("a")).await.unwrap();
        p.release(&owner("a")).await.unwrap(); // holds none: still fine
        assert_eq!(p.allocate_next(&owner("c")).await.unwrap().id, a.id);
        // b's ENI was untouched by a's releases.
        let listed = p.list().await.unwrap();
        assert_eq!(listed[1].owner.as_ref().unwrap().container_id, "b");
    }

    #[tokio::test]
    async fn concurrent_allocations_never_share() {
        let p = Arc::new(StaticProvider::new((1..=16).map(eni).collect()).unwrap());
        let (ids, exhausted) = allocate_concurrently(&p, 32).await;
        assert_eq!((ids.len(), exhausted.len()), (16, 16));
    }

    #[tokio::test]
    async fn restore_rebuilds_and_rejects_conflicts() {
        let p = StaticProvider::new(vec![eni(1), eni(2)]).unwrap();
        p.restore(&[("eni-2".into(), owner("x"))]).await.unwrap();
        assert_eq!(p.allocate_next(&owner("x")).await.unwrap().id, "eni-2");
        assert!(matches!(
            p.restore(&[("eni-2".into(), owner("y"))]).await,
            Err(ProviderError::OwnedByOther { .. })
        ));
        assert!(matches!(
            p.restore(&[("eni-9".into(), owner("y"))]).await,
            Err(ProviderError::UnknownEni(_))
        ));
    }

    #[tokio::test]
    async fn indexes_follow_allocate_release_and_restore() {
        let p = StaticProvider::new((1..=6).map(eni).collect()).unwrap();
        let check = || p.slots().assert_consistent();
        p.restore(&[("eni-3".into(), owner("r")), ("eni-1".into(), owner("s"))])
            .await
            .unwrap();
        check();
        // Allocation still takes the first free ENI in config order.
        assert_eq!(p.allocate_next(&owner("a")).await.unwrap().id, "eni-2");
        assert_eq!(p.allocate_next(&owner("b")).await.unwrap().id, "eni-4");
        check();
        // Restoring the same attachment again (new pod metadata) keeps it.
        let mut again = owner("r");
        again.pod.name = "renamed".into();
        p.restore(&[("eni-3".into(), again)]).await.unwrap();
        assert_eq!(p.allocate_next(&owner("r")).await.unwrap().id, "eni-3");
        check();
        // A rejected restore changes nothing.
        assert!(p
            .restore(&[("eni-5".into(), owner("x")), ("eni-2".into(), owner("x"))])
            .await
            .is_err());
        check();
        assert!(p.list().await.unwrap()[4].owner.is_none());
        // A restore that gives an attachment a second ENI: release frees both.
        p.restore(&[("eni-6".into(), owner("s"))]).await.unwrap();
        check();
        p.release(&owner("s")).await.unwrap();
        check();
        let listed = p.list().await.unwrap();
        assert!(listed[0].owner.is_none() && listed[5].owner.is_none());
        p.release(&owner("a")).await.unwrap();
        p.release(&owner("nobody")).await.unwrap();
        check();
        assert_eq!(p.allocate_next(&owner("c")).await.unwrap().id, "eni-1");
        assert_eq!(p.allocate_next(&owner("d")).await.unwrap().id, "eni-2");
        assert_eq!(p.allocate_next(&owner("e")).await.unwrap().id, "eni-5");
        check();
    }

    #[test]
    fn config_validation() {
        let mut dup = eni(1);
        dup.id = "eni-2".into();
        assert!(StaticProvider::new(vec![eni(2), dup]).is_err());
        let mut gw = eni(1);
        gw.gateway4 = "10.9.9.1".parse().unwrap();
        assert!(StaticProvider::new(vec![gw]).is_err());
        let mut v6 = eni(1);
        v6.gateway6 = Some("fd00::1".parse().unwrap());
        assert!(StaticProvider::new(vec![v6]).is_err());
    }

    #[tokio::test]
    async fn secondary_addresses_and_device_indexes() {
        let mut a = eni(1);
        a.secondary_ipv4 = vec!["10.0.1.11".parse().unwrap(), "10.0.1.12".parse().unwrap()];
        a.ipv6 = Some("fd00:1::10/64".parse().unwrap());
        a.gateway6 = Some("fd00:1::1".parse().unwrap());
        a.secondary_ipv6 = vec!["fd00:1::11".parse().unwrap()];
        let mut b = eni(2);
        b.device_index = Some(7);
        let p = StaticProvider::new(vec![a.clone(), b.clone()]).unwrap();
        let listed = p.list().await.unwrap();
        let ips: Vec<String> = listed[0]
            .secondary_ips
            .iter()
            .map(|ip| ip.to_string())
            .collect();
        assert_eq!(ips, ["10.0.1.11", "10.0.1.12", "fd00:1::11"]);
        assert!(listed[1].secondary_ips.is_empty());
        // Default: the 1-based position; explicit indexes win.
        assert_eq!(listed[0].device_index, Some(1));
        assert_eq!(listed[1].device_index, Some(7));

        let bad = |f: fn(&mut StaticEniConfig)| {
            let mut e = a.clone();
            f(&mut e);
            StaticProvider::new(vec![e, b.clone()])
                .err()
                .map(|e| e.to_string())
        };
        for (why, f) in [
            (
                "outside subnet",
                (|e: &mut StaticEniConfig| e.secondary_ipv4.push("10.9.9.9".parse().unwrap()))
                    as fn(&mut StaticEniConfig),
            ),
            ("the primary", |e| {
                e.secondary_ipv4.push("10.0.1.10".parse().unwrap())
            }),
            ("the gateway", |e| {
                e.secondary_ipv4.push("10.0.1.1".parse().unwrap())
            }),
            ("twice", |e| {
                e.secondary_ipv4.push("10.0.1.11".parse().unwrap())
            }),
            ("v6 without ipv6", |e| {
                e.ipv6 = None;
                e.gateway6 = None;
            }),
            ("index clash", |e| e.device_index = Some(7)),
        ] {
            assert!(bad(f).is_some(), "{why} accepted");
        }
    }
}
