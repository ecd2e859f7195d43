//! The address datastore of secondary mode (after AWS ipamd's DataStore):
//! the secondary IPs of each host ENI, which attachment holds which, and a
//! cooldown before a released address is handed out again (so a late packet
//! or a stale DEL for the old pod never reaches the new one).
//!
//! Pure bookkeeping: no I/O. Time is passed in, so tests control it.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use enim_api::model::{AddressStats, AttachmentKey};
use serde::Serialize;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DataStoreError {
    #[error("datastore: duplicate ENI {0}")]
    DuplicateEni(String),
    #[error("datastore: address {0} is already in the store")]
    AddressAlreadyInStore(IpAddr),
    #[error("datastore: unknown address {0}")]
    UnknownAddress(IpAddr),
    #[error("datastore: address {0} is assigned and cannot be removed")]
    AddressInUse(IpAddr),
    #[error("datastore: ENI {0} has assigned addresses and cannot be removed")]
    EniInUse(String),
    #[error("datastore: unknown ENI {0}")]
    UnknownEni(String),
    #[error("datastore: no free address (IPv6 needed: {ipv6}); {cooling} cooling down")]
    NoFreeAddress { ipv6: bool, cooling: usize },
}

#[derive(Debug, Clone, Default)]
struct AddressState {
    assigned_to: Option<AttachmentKey>,
    released_at: Option<Instant>,
    /// Checks in a row the provider did not show it on its ENI.
    missing: u8,
    /// Gone from the cloud while a pod held it: kept for the pod, dropped
    /// (not freed) when released.
    lost: bool,
}

/// Checks in a row an address must be missing from the provider's view
/// before the store acts on it: metadata may lag an assign.
pub const MISSING_CHECKS: u8 = 2;

/// One ENI's addresses by family, and how many of each are free now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EniUsage {
    pub eni_id: String,
    pub ipv4: usize,
    pub ipv6: usize,
    pub free4: usize,
    pub free6: usize,
}

/// What [`DataStore::sync_eni`] changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncOutcome {
    /// Shown by the provider, new to the store: now free.
    pub added: Vec<IpAddr>,
    /// Free and gone from the provider's view: left the store.
    pub removed: Vec<IpAddr>,
    /// Held by a pod and gone from the provider's view: kept, reported.
    pub lost: Vec<IpAddr>,
}

#[derive(Debug, Clone)]
struct EniAddresses {
    device_index: u32,
    addresses: BTreeMap<IpAddr, AddressState>,
}

/// What an attachment holds: one IPv4 and, in dual stack, one IPv6, both
/// on the same ENI so one route table serves both.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Assignment {
    pub eni_id: String,
    pub ipv4: Option<IpAddr>,
    pub ipv6: Option<IpAddr>,
}

#[derive(Debug)]
pub struct DataStore {
    enis: BTreeMap<String, EniAddresses>,
    cooldown: Duration,
}

impl DataStore {
    pub fn new(cooldown: Duration) -> Self {
        DataStore {
            enis: BTreeMap::new(),
            cooldown,
        }
    }

    pub fn add_eni(&mut self, eni_id: &str, device_index: u32) -> Result<(), DataStoreError> {
        if self.enis.contains_key(eni_id) {
            return Err(DataStoreError::DuplicateEni(eni_id.into()));
        }
        self.enis.insert(
            eni_id.into(),
            EniAddresses {
                device_index,
                addresses: BTreeMap::new(),
            },
        );
        Ok(())
    }

    /// Removes an ENI and its addresses. Refused while any is assigned,
    /// unless `force`.
    pub fn remove_eni(&mut self, eni_id: &str, force: bool) -> Result<(), DataStoreError> {
        let eni = self
            .enis
            .get(eni_id)
            .ok_or_else(|| DataStoreError::UnknownEni(eni_id.into()))?;
        if !force && eni.addresses.values().any(|a| a.assigned_to.is_some()) {
            return Err(DataStoreError::EniInUse(eni_id.into()));
        }
        self.enis.remove(eni_id);
        Ok(())
    }

    pub fn add_address(&mut self, eni_id: &str, ip: IpAddr) -> Result<(), DataStoreError> {
        if self.enis.values().any(|e| e.addresses.contains_key(&ip)) {
            return Err(DataStoreError::AddressAlreadyInStore(ip));
        }
        let eni = self
            .enis
            .get_mut(eni_id)
            .ok_or_else(|| DataStoreError::UnknownEni(eni_id.into()))?;
        eni.addresses.insert(ip, AddressState::default());
        Ok(())
    }

    /// Removes an address. Refused while assigned, unless `force`.
    pub fn del_address(
        &mut self,
        eni_id: &str,
        ip: IpAddr,
        force: bool,
    ) -> Result<(), DataStoreError> {
        let eni = self
            .enis
            .get_mut(eni_id)
            .ok_or_else(|| DataStoreError::UnknownEni(eni_id.into()))?;
        let state = eni
            .addresses
            .get(&ip)
            .ok_or(DataStoreError::UnknownAddress(ip))?;
        if !force && state.assigned_to.is_some() {
            return Err(DataStoreError::AddressInUse(ip));
        }
        eni.addresses.remove(&ip);
        Ok(())
    }

    fn is_free(&self, state: &AddressState, now: Instant) -> bool {
        state.assigned_to.is_none()
            && state
                .released_at
                .is_none_or(|at| now.saturating_duration_since(at) >= self.cooldown)
    }

    /// The current assignment of `key`, if any.
    pub fn assignment(&self, key: &AttachmentKey) -> Option<Assignment> {
        for (eni_id, eni) in &self.enis {
            let held: Vec<IpAddr> = eni
                .addresses
                .iter()
                .filter(|(_, s)| s.assigned_to.as_ref() == Some(key))
                .map(|(ip, _)| *ip)
                .collect();
            if !held.is_empty() {
                return Some(Assignment {
                    eni_id: eni_id.clone(),
                    ipv4: held.iter().copied().find(IpAddr::is_ipv4),
                    ipv6: held.iter().copied().find(IpAddr::is_ipv6),
                });
            }
        }
        None
    }

    /// Whether [`assign`](Self::assign) would give `key` addresses now.
    pub fn can_assign(&self, key: &AttachmentKey, ipv6: bool, now: Instant) -> bool {
        self.assignment(key).is_some() || self.choose(ipv6, now).is_some()
    }

    /// When an assign with nothing free now could next succeed: the
    /// soonest an unassigned address (with `ipv6`, an IPv4 and an IPv6 one
    /// of one ENI) is past its cooldown; `None` when every address is held.
    pub fn next_free_at(&self, ipv6: bool, now: Instant) -> Option<Instant> {
        let free_at = |eni: &EniAddresses, v6: bool| {
            eni.addresses
                .iter()
                .filter(|(ip, s)| ip.is_ipv6() == v6 && s.assigned_to.is_none())
                .map(|(_, s)| {
                    s.released_at
                        .map_or(now, |at| (at + self.cooldown).max(now))
                })
                .min()
        };
        self.enis
            .values()
            .filter_map(|eni| {
                let v4 = free_at(eni, false)?;
                match ipv6 {
                    true => Some(v4.max(free_at(eni, true)?)),
                    false => Some(v4),
                }
            })
            .min()
    }

    /// The free addresses an assign takes: an IPv4 one and, with `ipv6`,
    /// an IPv6 one on the same ENI.
    fn choose(&self, ipv6: bool, now: Instant) -> Option<(String, IpAddr, Option<IpAddr>)> {
        let pick = |eni: &EniAddresses, v6: bool| {
            eni.addresses
                .iter()
                .find(|(ip, s)| ip.is_ipv6() == v6 && self.is_free(s, now))
                .map(|(ip, _)| *ip)
        };
        self.enis.iter().find_map(|(id, eni)| {
            let v4 = pick(eni, false)?;
            let v6 = if ipv6 { Some(pick(eni, true)?) } else { None };
            Some((id.clone(), v4, v6))
        })
    }

    /// Assigns `key` an IPv4 address (and an IPv6 one from the same ENI when
    /// `ipv6`). Idempotent: a key that holds addresses gets them again.
    pub fn assign(
        &mut self,
        key: &AttachmentKey,
        ipv6: bool,
        now: Instant,
    ) -> Result<Assignment, DataStoreError> {
        if let Some(held) = self.assignment(key) {
            return Ok(held);
        }
        let Some((eni_id, v4, v6)) = self.choose(ipv6, now) else {
            return Err(DataStoreError::NoFreeAddress {
                ipv6,
                cooling: self.stats(now).cooling,
            });
        };
        let eni = self.enis.get_mut(&eni_id).expect("chosen above");
        for ip in std::iter::once(v4).chain(v6) {
            let state = eni.addresses.get_mut(&ip).expect("chosen above");
            state.assigned_to = Some(key.clone());
            state.released_at = None;
        }
        Ok(Assignment {
            eni_id,
            ipv4: Some(v4),
            ipv6: v6,
        })
    }

    /// Re-establishes an assignment known from the checkpoint (startup).
    pub fn restore(
        &mut self,
        key: &AttachmentKey,
        eni_id: &str,
        ips: &[IpAddr],
    ) -> Result<(), DataStoreError> {
        let eni = self
            .enis
            .get_mut(eni_id)
            .ok_or_else(|| DataStoreError::UnknownEni(eni_id.into()))?;
        for ip in ips {
            let state = eni
                .addresses
                .get(ip)
                .ok_or(DataStoreError::UnknownAddress(*ip))?;
            if state.assigned_to.as_ref().is_some_and(|k| k != key) {
                return Err(DataStoreError::AddressInUse(*ip));
            }
        }
        for ip in ips {
            eni.addresses.get_mut(ip).expect("checked").assigned_to = Some(key.clone());
        }
        Ok(())
    }

    /// Frees what `key` holds; the addresses cool down from `now`. An
    /// address the cloud no longer shows leaves the store instead.
    pub fn unassign(&mut self, key: &AttachmentKey, now: Instant) -> Option<Assignment> {
        let held = self.assignment(key)?;
        let eni = self.enis.get_mut(&held.eni_id).expect("found above");
        for state in eni
            .addresses
            .values_mut()
            .filter(|s| s.assigned_to.as_ref() == Some(key))
        {
            state.assigned_to = None;
            state.released_at = Some(now);
        }
        eni.addresses
            .retain(|_, s| !(s.lost && s.assigned_to.is_none()));
        Some(held)
    }

    /// Compares an ENI's addresses with what the provider shows now
    /// (`shown`): new ones join free; one missing for [`MISSING_CHECKS`]
    /// checks in a row leaves if free, and is kept and reported if a pod
    /// holds it. An address the store has on another ENI is left alone.
    pub fn sync_eni(
        &mut self,
        eni_id: &str,
        shown: &[IpAddr],
    ) -> Result<SyncOutcome, DataStoreError> {
        self.sync_eni_after(eni_id, shown, MISSING_CHECKS)
    }

    /// [`sync_eni`](Self::sync_eni) acting after `checks` checks in a row:
    /// 1 for a provider whose listing is authoritative, not a lagging view
    /// of the cloud (the cluster provider's spec).
    pub fn sync_eni_after(
        &mut self,
        eni_id: &str,
        shown: &[IpAddr],
        checks: u8,
    ) -> Result<SyncOutcome, DataStoreError> {
        let elsewhere: Vec<IpAddr> = self
            .enis
            .iter()
            .filter(|(id, _)| id.as_str() != eni_id)
            .flat_map(|(_, e)| e.addresses.keys().copied())
            .filter(|ip| shown.contains(ip))
            .collect();
        let eni = self
            .enis
            .get_mut(eni_id)
            .ok_or_else(|| DataStoreError::UnknownEni(eni_id.into()))?;
        let mut out = SyncOutcome::default();
        for ip in shown.iter().filter(|ip| !elsewhere.contains(ip)) {
            match eni.addresses.get_mut(ip) {
                Some(state) => {
                    state.missing = 0;
                    state.lost = false;
                }
                None => {
                    eni.addresses.insert(*ip, AddressState::default());
                    out.added.push(*ip);
                }
            }
        }
        for (ip, state) in eni.addresses.iter_mut() {
            if shown.contains(ip) || state.lost {
                continue;
            }
            state.missing = state.missing.saturating_add(1);
            if state.missing < checks {
                continue;
            }
            if state.assigned_to.is_some() {
                state.lost = true;
                out.lost.push(*ip);
            } else {
                out.removed.push(*ip);
            }
        }
        for ip in &out.removed {
            eni.addresses.remove(ip);
        }
        Ok(out)
    }

    /// Each ENI's addresses and free ones, for the warm pool.
    pub fn usage(&self, now: Instant) -> Vec<EniUsage> {
        self.enis
            .iter()
            .map(|(id, eni)| {
                let mut u = EniUsage {
                    eni_id: id.clone(),
                    ..EniUsage::default()
                };
                for (ip, state) in &eni.addresses {
                    let free = self.is_free(state, now);
                    if ip.is_ipv4() {
                        u.ipv4 += 1;
                        u.free4 += usize::from(free);
                    } else {
                        u.ipv6 += 1;
                        u.free6 += usize::from(free);
                    }
                }
                u
            })
            .collect()
    }

    /// Takes up to `ipv4` and `ipv6` free addresses (not cooling down) of
    /// `eni_id` out of the store, so no pod can get them while they are
    /// given back to the cloud; returns them.
    pub fn take_free(
        &mut self,
        eni_id: &str,
        ipv4: usize,
        ipv6: usize,
        now: Instant,
    ) -> Result<Vec<IpAddr>, DataStoreError> {
        let free = self.freeable(eni_id, now)?;
        let taken: Vec<IpAddr> = free
            .iter()
            .filter(|ip| ip.is_ipv4())
            .take(ipv4)
            .chain(free.iter().filter(|ip| ip.is_ipv6()).take(ipv6))
            .copied()
            .collect();
        let eni = self.enis.get_mut(eni_id).expect("freeable checked it");
        for ip in &taken {
            eni.addresses.remove(ip);
        }
        Ok(taken)
    }

    /// Addresses of an ENI that could be given back to the cloud: neither
    /// assigned nor cooling down.
    pub fn freeable(&self, eni_id: &str, now: Instant) -> Result<Vec<IpAddr>, DataStoreError> {
        let eni = self
            .enis
            .get(eni_id)
            .ok_or_else(|| DataStoreError::UnknownEni(eni_id.into()))?;
        Ok(eni
            .addresses
            .iter()
            .filter(|(_, s)| self.is_free(s, now))
            .map(|(ip, _)| *ip)
            .collect())
    }

    pub fn stats(&self, now: Instant) -> AddressStats {
        let mut stats = AddressStats::default();
        for state in self.enis.values().flat_map(|e| e.addresses.values()) {
            stats.total += 1;
            stats.lost += usize::from(state.lost);
            if state.assigned_to.is_some() {
                stats.assigned += 1;
            } else if !self.is_free(state, now) {
                stats.cooling += 1;
            }
        }
        let dual_stack = self.has_ipv6();
        stats.pods = self
            .enis
            .values()
            .map(|e| {
                let v4 = e.addresses.keys().filter(|ip| ip.is_ipv4()).count();
                let v6 = e.addresses.len() - v4;
                if dual_stack {
                    v4.min(v6)
                } else {
                    v4
                }
            })
            .sum();
        stats
    }

    /// The ENI with the fewest addresses below `max_per_eni`, if any needs
    /// more (AWS ipamd's datastore: GetENINeedsIP).
    pub fn eni_needing_addresses(&self, max_per_eni: usize) -> Option<String> {
        self.enis
            .iter()
            .filter(|(_, e)| e.addresses.len() < max_per_eni)
            .min_by_key(|(_, e)| e.addresses.len())
            .map(|(id, _)| id.clone())
    }

    /// Whether any ENI has `ip`.
    /// Every address in the store, held or free.
    pub fn addresses(&self) -> Vec<IpAddr> {
        self.enis
            .values()
            .flat_map(|e| e.addresses.keys().copied())
            .collect()
    }

    /// The addresses no pod holds that rest their cooldown at `now`.
    pub fn cooling(&self, now: Instant) -> Vec<IpAddr> {
        self.enis
            .values()
            .flat_map(|e| e.addresses.iter())
            .filter(|(_, s)| s.assigned_to.is_none() && !self.is_free(s, now))
            .map(|(ip, _)| *ip)
            .collect()
    }

    /// How long an address released now rests.
    pub fn cooldown(&self) -> Duration {
        self.cooldown
    }

    pub fn contains(&self, ip: &IpAddr) -> bool {
        self.enis.values().any(|e| e.addresses.contains_key(ip))
    }

    /// Whether any ENI offers IPv6 addresses: pods are then dual-stack.
    pub fn has_ipv6(&self) -> bool {
        self.enis
            .values()
            .any(|e| e.addresses.keys().any(IpAddr::is_ipv6))
    }

    pub fn device_index(&self, eni_id: &str) -> Option<u32> {
        self.enis.get(eni_id).map(|e| e.device_index)
    }

    pub fn eni_ids(&self) -> Vec<String> {
        self.enis.keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key(c: &str) -> AttachmentKey {
        AttachmentKey {
            network: "n".into(),
            container_id: c.into(),
            ifname: "eth0".into(),
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// [`store`] with pod p assigned (dual-stack when `dual`) now; and now.
    fn store_with_p(dual: bool) -> (DataStore, Instant) {
        let t0 = Instant::now();
        let mut ds = store();
        ds.assign(&key("p"), dual, t0).unwrap();
        (ds, t0)
    }

    fn store() -> DataStore {
        let mut ds = DataStore::new(Duration::from_secs(30));
        ds.add_eni("eni-a", 2).unwrap();
        ds.add_address("eni-a", ip("10.0.0.11")).unwrap();
        ds.add_address("eni-a", ip("fd00::11")).unwrap();
        ds
    }

    #[test]
    fn next_free_at_is_when_the_soonest_cooldown_ends() {
        let (mut ds, t0) = store_with_p(true);
        assert_eq!(ds.next_free_at(true, t0), None, "all held");
        assert!(ds.cooling(t0).is_empty(), "held is not cooling");
        let later = t0 + Duration::from_secs(10);
        ds.unassign(&key("p"), later);
        assert_eq!(ds.cooling(later), [ip("10.0.0.11"), ip("fd00::11")]);
        assert!(ds.cooling(later + ds.cooldown()).is_empty());
        // Released at t0 + 10 s: free at t0 + 40 s, for either stack.
        let at = t0 + Duration::from_secs(40);
        assert_eq!(ds.next_free_at(true, later), Some(at));
        assert_eq!(ds.next_free_at(false, later), Some(at));
        assert!(!ds.can_assign(&key("q"), true, at - Duration::from_millis(1)));
        assert!(ds.can_assign(&key("q"), true, at));
        // Past it: now.
        let past = at + Duration::from_secs(5);
        assert_eq!(ds.next_free_at(true, past), Some(past));
        // Dual stack needs both of one ENI: a lone IPv4 address elsewhere,
        // free now, does not do.
        ds.add_eni("eni-b", 3).unwrap();
        ds.add_address("eni-b", ip("10.0.1.11")).unwrap();
        assert_eq!(ds.next_free_at(true, later), Some(at));
        assert_eq!(ds.next_free_at(false, later), Some(later));
    }

    #[test]
    fn can_assign_answers_as_assign_would() {
        let now = Instant::now();
        let mut ds = store();
        assert!(ds.can_assign(&key("p"), true, now));
        ds.assign(&key("p"), true, now).unwrap();
        // The holder would get its addresses again; nobody else gets any.
        assert!(ds.can_assign(&key("p"), true, now));
        assert!(!ds.can_assign(&key("q"), false, now));
        assert!(ds.assign(&key("q"), false, now).is_err());
    }

    #[test]
    fn every_misuse_has_its_error() {
        let now = Instant::now();
        let mut ds = store();
        assert_eq!(
            ds.add_eni("eni-a", 3),
            Err(DataStoreError::DuplicateEni("eni-a".into()))
        );
        assert_eq!(
            ds.add_address("eni-a", ip("10.0.0.11")),
            Err(DataStoreError::AddressAlreadyInStore(ip("10.0.0.11")))
        );
        ds.add_eni("eni-b", 3).unwrap();
        // Unique across ENIs too.
        assert_eq!(
            ds.add_address("eni-b", ip("10.0.0.11")),
            Err(DataStoreError::AddressAlreadyInStore(ip("10.0.0.11")))
        );
        assert_eq!(
            ds.add_address("eni-x", ip("10.0.0.99")),
            Err(DataStoreError::UnknownEni("eni-x".into()))
        );
        assert_eq!(
            ds.del_address("eni-a", ip("10.0.0.99"), false),
            Err(DataStoreError::UnknownAddress(ip("10.0.0.99")))
        );
        let a = ds.assign(&key("p"), true, now).unwrap();
        assert_eq!(a.eni_id, "eni-a");
        assert_eq!(
            ds.del_address("eni-a", ip("10.0.0.11"), false),
            Err(DataStoreError::AddressInUse(ip("10.0.0.11")))
        );
        assert_eq!(
            ds.remove_eni("eni-a", false),
            Err(DataStoreError::EniInUse("eni-a".into()))
        );
        assert_eq!(
            ds.remove_eni("eni-x", false),
            Err(DataStoreError::UnknownEni("eni-x".into()))
        );
        assert!(matches!(
            ds.assign(&key("q"), false, now),
            Err(DataStoreError::NoFreeAddress { .. })
        ));
        // Forced removal works while assigned.
        ds.del_address("eni-a", ip("fd00::11"), true).unwrap();
        ds.remove_eni("eni-a", true).unwrap();
        assert!(ds.assignment(&key("p")).is_none());
    }

    #[test]
    fn assign_is_idempotent_and_dual_stack_from_one_eni() {
        let now = Instant::now();
        let mut ds = store();
        ds.add_eni("eni-b", 3).unwrap();
        ds.add_address("eni-b", ip("10.0.1.11")).unwrap();
        let a = ds.assign(&key("p"), true, now).unwrap();
        assert_eq!(
            a,
            Assignment {
                eni_id: "eni-a".into(),
                ipv4: Some(ip("10.0.0.11")),
                ipv6: Some(ip("fd00::11"))
            }
        );
        assert_eq!(ds.assign(&key("p"), true, now).unwrap(), a);
        // eni-b has no IPv6: a dual-stack pod cannot go there.
        assert!(ds.assign(&key("q"), true, now).is_err());
        assert_eq!(ds.assign(&key("q"), false, now).unwrap().eni_id, "eni-b");
    }

    #[test]
    fn released_addresses_cool_down() {
        let (mut ds, t0) = store_with_p(false);
        assert_eq!(
            ds.unassign(&key("p"), t0).unwrap().ipv4,
            Some(ip("10.0.0.11"))
        );
        assert!(ds.unassign(&key("p"), t0).is_none());
        assert_eq!(
            ds.stats(t0),
            AddressStats {
                total: 2,
                assigned: 0,
                cooling: 1,
                pods: 1,
                lost: 0,
            }
        );
        assert!(ds
            .assign(&key("q"), false, t0 + Duration::from_secs(29))
            .is_err());
        assert!(!ds.freeable("eni-a", t0).unwrap().contains(&ip("10.0.0.11")));
        let later = t0 + Duration::from_secs(30);
        assert_eq!(
            ds.freeable("eni-a", later).unwrap(),
            vec![ip("10.0.0.11"), ip("fd00::11")]
        );
        assert_eq!(
            ds.assign(&key("q"), false, later).unwrap().ipv4,
            Some(ip("10.0.0.11"))
        );
        assert_eq!(
            ds.stats(later),
            AddressStats {
                total: 2,
                assigned: 1,
                cooling: 0,
                pods: 1,
                lost: 0,
            }
        );
    }

    #[test]
    fn sync_adds_new_and_acts_on_missing_only_after_two_checks() {
        let t0 = Instant::now();
        let mut ds = store();
        ds.add_address("eni-a", ip("10.0.0.12")).unwrap();
        ds.assign(&key("p"), false, t0).unwrap();
        let held = ds.assignment(&key("p")).unwrap().ipv4.unwrap();
        let other = if held == ip("10.0.0.11") {
            ip("10.0.0.12")
        } else {
            ip("10.0.0.11")
        };
        // The cloud now shows a new address and neither of the two IPv4s.
        let shown = [ip("10.0.0.13"), ip("fd00::11")];
        let first = ds.sync_eni("eni-a", &shown).unwrap();
        assert_eq!(first.added, vec![ip("10.0.0.13")]);
        assert!(
            first.removed.is_empty() && first.lost.is_empty(),
            "one miss may be lag"
        );
        let second = ds.sync_eni("eni-a", &shown).unwrap();
        assert_eq!(second.removed, vec![other]);
        assert_eq!(second.lost, vec![held]);
        assert_eq!(ds.stats(t0).lost, 1);
        // The pod keeps its address until it goes; then it is dropped.
        assert_eq!(ds.assignment(&key("p")).unwrap().ipv4, Some(held));
        ds.unassign(&key("p"), t0);
        assert_eq!(ds.stats(t0).total, 2);
        assert_eq!(ds.stats(t0).lost, 0);
        // An address shown again before the second check stays.
        ds.sync_eni("eni-a", &[ip("10.0.0.13")]).unwrap();
        let back = ds.sync_eni("eni-a", &shown).unwrap();
        assert!(back.removed.is_empty());
        assert_eq!(
            ds.sync_eni("eni-z", &shown),
            Err(DataStoreError::UnknownEni("eni-z".into()))
        );
    }

    #[test]
    fn take_free_never_takes_held_or_cooling_addresses() {
        let t0 = Instant::now();
        let mut ds = store();
        for last in 12..=15 {
            ds.add_address("eni-a", ip(&format!("10.0.0.{last}")))
                .unwrap();
        }
        let held = ds.assign(&key("p"), false, t0).unwrap().ipv4.unwrap();
        ds.assign(&key("q"), false, t0).unwrap();
        let cooling = ds.unassign(&key("q"), t0).unwrap().ipv4.unwrap();
        let taken = ds.take_free("eni-a", 10, 1, t0).unwrap();
        assert_eq!(taken.len(), 4, "3 free IPv4 and 1 IPv6: {taken:?}");
        assert!(!taken.contains(&held) && !taken.contains(&cooling));
        assert_eq!(ds.usage(t0)[0].ipv4, 2);
        assert_eq!(
            ds.take_free("eni-b", 1, 0, t0),
            Err(DataStoreError::UnknownEni("eni-b".into()))
        );
    }

    #[test]
    fn usage_counts_by_family() {
        let (ds, t0) = store_with_p(true);
        assert_eq!(
            ds.usage(t0),
            vec![EniUsage {
                eni_id: "eni-a".into(),
                ipv4: 1,
                ipv6: 1,
                free4: 0,
                free6: 0
            }]
        );
    }

    #[test]
    fn restore_and_needing_addresses() {
        let now = Instant::now();
        let mut ds = store();
        ds.add_eni("eni-b", 3).unwrap();
        ds.restore(&key("p"), "eni-a", &[ip("10.0.0.11")]).unwrap();
        assert_eq!(
            ds.restore(&key("q"), "eni-a", &[ip("10.0.0.11")]),
            Err(DataStoreError::AddressInUse(ip("10.0.0.11")))
        );
        assert_eq!(
            ds.assignment(&key("p")).unwrap().ipv4,
            Some(ip("10.0.0.11"))
        );
        assert_eq!(ds.eni_needing_addresses(2), Some("eni-b".into()));
        assert_eq!(ds.eni_needing_addresses(0), None);
        assert_eq!(ds.stats(now).assigned, 1);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Assign(u8, bool),
        Unassign(u8),
        AddAddress(u8, u8),
        DelAddress(u8, u8, bool),
        AddEni(u8),
        RemoveEni(u8, bool),
        Wait(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0..8u8, any::<bool>()).prop_map(|(k, v6)| Op::Assign(k, v6)),
            (0..8u8).prop_map(Op::Unassign),
            (0..3u8, 0..12u8).prop_map(|(e, a)| Op::AddAddress(e, a)),
            (0..3u8, 0..12u8, any::<bool>()).prop_map(|(e, a, f)| Op::DelAddress(e, a, f)),
            (0..3u8).prop_map(Op::AddEni),
            (0..3u8, any::<bool>()).prop_map(|(e, f)| Op::RemoveEni(e, f)),
            (0..40u8).prop_map(Op::Wait),
        ]
    }

    fn addr(a: u8) -> IpAddr {
        if a.is_multiple_of(2) {
            IpAddr::from([10, 0, 0, a])
        } else {
            format!("fd00::{a}").parse().unwrap()
        }
    }

    proptest! {
        #[test]
        fn random_sequences_never_double_assign_and_keep_stats_consistent(ops in proptest::collection::vec(op(), 1..120)) {
            let mut ds = DataStore::new(Duration::from_secs(30));
            let mut now = Instant::now();
            for op in ops {
                match op {
                    Op::Assign(k, v6) => { let _ = ds.assign(&key(&k.to_string()), v6, now); }
                    Op::Unassign(k) => { ds.unassign(&key(&k.to_string()), now); }
                    Op::AddAddress(e, a) => { let _ = ds.add_address(&format!("eni-{e}"), addr(a)); }
                    Op::DelAddress(e, a, f) => { let _ = ds.del_address(&format!("eni-{e}"), addr(a), f); }
                    Op::AddEni(e) => { let _ = ds.add_eni(&format!("eni-{e}"), u32::from(e)); }
                    Op::RemoveEni(e, f) => { let _ = ds.remove_eni(&format!("eni-{e}"), f); }
                    Op::Wait(s) => now += Duration::from_secs(u64::from(s)),
                }
                // No address is in the store twice, and no key holds more
                // than one address of a family or addresses on two ENIs.
                let mut seen = std::collections::HashSet::new();
                let mut holders: BTreeMap<AttachmentKey, (String, usize, usize)> = BTreeMap::new();
                let (mut total, mut assigned, mut cooling) = (0, 0, 0);
                for (id, eni) in &ds.enis {
                    for (ip, s) in &eni.addresses {
                        prop_assert!(seen.insert(*ip), "address {} twice", ip);
                        total += 1;
                        if let Some(k) = &s.assigned_to {
                            assigned += 1;
                            let h = holders.entry(k.clone()).or_insert((id.clone(), 0, 0));
                            prop_assert_eq!(&h.0, id, "key on two ENIs");
                            if ip.is_ipv4() { h.1 += 1 } else { h.2 += 1 }
                            prop_assert!(h.1 <= 1 && h.2 <= 1, "key holds two addresses of a family");
                        } else if !ds.is_free(s, now) {
                            cooling += 1;
                        }
                    }
                }
                let stats = ds.stats(now);
                prop_assert_eq!((stats.total, stats.assigned, stats.cooling), (total, assigned, cooling));
            }
        }
    }
}
