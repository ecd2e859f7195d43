//! What the provider knows, apart from any I/O: the last spec, who holds
//! which ENI (primary mode) or address (secondary mode), and the status
//! document that follows from them. Every method is a plain state change
//! or a pure function of the state, so tests feed it specs and owners.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use enim_core::reserved::{EXCLUDED_NETWORK, MISSING_NETWORK};
use enim_core::{Eni, EniOwner, MacAddr, ProviderError, StoredAddresses};
use enim_crd::{EniSpec, EniUse, Mode, NetResourceSetSpec, NetResourceSetStatus, Quarantined};
use enim_crd::{Summary, CONDITION_READY, CONDITION_SERVES_CLAIMS};
use ipnet::{Ipv4Net, Ipv6Net};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use serde::{Deserialize, Serialize};

/// An owner's identity (network, container id, ifname).
type OwnerKey = (String, String, String);

fn key_of(owner: &EniOwner) -> OwnerKey {
    (
        owner.network.clone(),
        owner.container_id.clone(),
        owner.ifname.clone(),
    )
}

/// Whether `owner` is the agent itself (an excluded or quarantined ENI),
/// not a pod.
fn reserved(owner: &EniOwner) -> bool {
    owner.network == EXCLUDED_NETWORK || owner.network == MISSING_NETWORK
}

/// A spec as seen: the object's generation with it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SeenSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    pub spec: NetResourceSetSpec,
}

/// One ENI of the spec, as the agent uses it.
#[derive(Debug, Clone, PartialEq)]
struct Slot {
    eni: Eni,
    /// Listed in `spec.draining` (or gone from the spec while a pod holds
    /// it): never handed out again.
    draining: bool,
    /// Still in the spec; `false`: kept only for the pod that holds it.
    in_spec: bool,
}

/// [`parse_eni`], with the placement the node's spec gives: the zone, and
/// the node's security groups unless the ENI has its own.
pub fn parse_eni_in(e: &EniSpec, spec: &NetResourceSetSpec) -> Result<Eni, String> {
    let mut eni = parse_eni(e)?;
    let groups = match e.security_groups.is_empty() {
        true => &spec.security_groups,
        false => &e.security_groups,
    };
    eni.placement = enim_core::Placement {
        subnet: (!e.subnet.is_empty()).then(|| e.subnet.clone()),
        zone: (!spec.instance.zone.is_empty()).then(|| spec.instance.zone.clone()),
        security_groups: groups.clone(),
        network_card: None,
    };
    Ok(eni)
}

/// Turns one ENI of the spec into the provider's [`Eni`]; `Err` says why
/// the agent cannot use it.
pub fn parse_eni(e: &EniSpec) -> Result<Eni, String> {
    let mac: MacAddr = e.mac.parse().map_err(|err| format!("{err}"))?;
    let ipv4: Ipv4Net = e
        .ipv4
        .parse()
        .map_err(|_| format!("ipv4 {:?} is not an IPv4 address with a prefix", e.ipv4))?;
    let gateway4: Ipv4Addr = match e.gateway4 {
        IpAddr::V4(v4) => v4,
        IpAddr::V6(v6) => return Err(format!("gateway4 {v6} is not IPv4")),
    };
    if !ipv4.contains(&gateway4) || gateway4 == ipv4.addr() {
        return Err(format!(
            "gateway4 {gateway4} must be another address inside {ipv4}"
        ));
    }
    let ipv6: Option<Ipv6Net> = match &e.ipv6 {
        Some(s) => Some(
            s.parse()
                .map_err(|_| format!("ipv6 {s:?} is not an IPv6 address with a prefix"))?,
        ),
        None => None,
    };
    let gateway6: Option<Ipv6Addr> = match e.gateway6 {
        Some(IpAddr::V6(v6)) => Some(v6),
        Some(IpAddr::V4(v4)) => return Err(format!("gateway6 {v4} is not IPv6")),
        None => None,
    };
    if ipv6.is_some() != gateway6.is_some() {
        return Err("ipv6 and gateway6 come together".into());
    }
    if let Some(mtu) = e.mtu.filter(|m| !(68..=65535).contains(m)) {
        return Err(format!("mtu {mtu} is outside 68..=65535"));
    }
    Ok(Eni {
        id: e.id.clone(),
        mac,
        ipv4,
        gateway4,
        ipv6,
        gateway6,
        mtu: e.mtu,
        owner: None,
        device_index: e.device_index,
        secondary_ips: e.secondary_ips.clone(),
        placement: Default::default(),
    })
}

/// Secondary mode: what one pod holds.
#[derive(Debug, Clone, PartialEq)]
struct Held {
    eni: String,
    ips: Vec<IpAddr>,
    owner: EniOwner,
}

/// The provider's state.
#[derive(Debug)]
pub struct State {
    /// The agent's mode: which ENIs it may use, and what `used` counts.
    mode: Mode,
    seen: Option<SeenSpec>,
    /// By ENI id, in spec order (then ENIs kept for their pods).
    slots: Vec<Slot>,
    /// Spec ENIs the agent cannot use, and why.
    invalid: Vec<(String, String)>,
    /// Primary mode: who holds which ENI (pods and the agent's own
    /// reservations), by ENI id.
    owners: BTreeMap<String, EniOwner>,
    /// Secondary mode: what each pod holds.
    held: BTreeMap<OwnerKey, Held>,
    /// Secondary mode: the agent's address store, once it has said.
    stored: Option<StoredAddresses>,
    /// The Ready condition last written, kept so its transition time
    /// moves only when its status does.
    ready: Option<Condition>,
    /// The agent's DRA driver is on: the status says so, for the operator
    /// to make ENIs for claims here. Fixed for the agent's life.
    serves_claims: bool,
    /// When this agent first wrote its `ServesClaims` condition: it never
    /// changes while the agent runs.
    claims_since: Option<Time>,
}

impl State {
    pub fn new(mode: Mode) -> State {
        State {
            mode,
            seen: None,
            slots: Vec::new(),
            invalid: Vec::new(),
            owners: BTreeMap::new(),
            held: BTreeMap::new(),
            stored: None,
            ready: None,
            serves_claims: false,
            claims_since: None,
        }
    }

    /// This state, saying in its status whether the agent serves DRA
    /// claims (its `[dra]` is on).
    pub fn serving_claims(mut self, on: bool) -> State {
        self.serves_claims = on;
        self
    }

    pub fn seen(&self) -> Option<&SeenSpec> {
        self.seen.as_ref()
    }

    /// Why nothing can be handed out now, if so.
    pub fn unavailable(&self, node: &str) -> Option<String> {
        let Some(seen) = &self.seen else {
            return Some(format!("no NetResourceSet for node {node:?} seen yet"));
        };
        (seen.spec.mode != self.mode).then(|| {
            format!(
                "NetResourceSet {node:?} is for {} mode; this agent runs in {} mode",
                seen.spec.mode.as_str(),
                self.mode.as_str()
            )
        })
    }

    /// Takes a new spec. Owners of ENIs still in it are kept; an ENI gone
    /// from it stays (never handed out) while a pod holds it.
    pub fn apply(&mut self, seen: SeenSpec) {
        let draining: HashSet<&str> = seen.spec.draining.iter().map(String::as_str).collect();
        let draining_ips: HashSet<IpAddr> = seen
            .spec
            .draining
            .iter()
            .filter_map(|d| d.parse().ok())
            .collect();
        let mut slots = Vec::with_capacity(seen.spec.enis.len());
        let mut invalid = Vec::new();
        let mut ids = HashSet::new();
        // One MAC is one device: a second ENI with it would be handed to a
        // second pod, whose ADD finds the device gone.
        let mut macs = HashSet::new();
        for e in &seen.spec.enis {
            if !ids.insert(e.id.clone()) {
                invalid.push((e.id.clone(), "listed twice in the spec".to_string()));
                continue;
            }
            match parse_eni_in(e, &seen.spec) {
                Ok(eni) if !macs.insert(eni.mac) => invalid.push((
                    e.id.clone(),
                    format!("MAC {} is listed twice in the spec", eni.mac),
                )),
                Ok(mut eni) => {
                    // A draining address is never offered (secondary mode).
                    eni.secondary_ips.retain(|ip| !draining_ips.contains(ip));
                    slots.push(Slot {
                        draining: draining.contains(eni.id.as_str()),
                        in_spec: true,
                        eni,
                    });
                }
                Err(why) => invalid.push((e.id.clone(), format!("invalid in the spec: {why}"))),
            }
        }
        // ENIs gone from the spec: kept while a pod holds them.
        for old in std::mem::take(&mut self.slots) {
            let held = self.owners.get(&old.eni.id).is_some_and(|o| !reserved(o));
            if held && !ids.contains(&old.eni.id) {
                slots.push(Slot {
                    draining: true,
                    in_spec: false,
                    ..old
                });
            }
        }
        // Reservations of ENIs gone from the spec go with them; pods'
        // assignments stay (a restored one may name an ENI not seen yet).
        let present: HashSet<&str> = slots.iter().map(|s| s.eni.id.as_str()).collect();
        self.owners
            .retain(|id, o| present.contains(id.as_str()) || !reserved(o));
        self.slots = slots;
        self.invalid = invalid;
        self.seen = Some(seen);
    }

    fn slot(&self, id: &str) -> Option<&Slot> {
        self.slots.iter().find(|s| s.eni.id == id)
    }

    /// Every ENI the agent may use, with its owner where assigned
    /// (`EniProvider::list`). Primary mode: a draining ENI only while
    /// someone holds it. Secondary mode: no draining ENI, and no draining
    /// address.
    pub fn list(&self) -> Vec<Eni> {
        if self.unavailable("").is_some() {
            return Vec::new();
        }
        self.slots
            .iter()
            .filter_map(|s| {
                let owner = self.owners.get(&s.eni.id).cloned();
                let show = match self.mode {
                    Mode::Primary => !s.draining || owner.is_some(),
                    Mode::Secondary => !s.draining,
                };
                show.then(|| Eni {
                    owner,
                    ..s.eni.clone()
                })
            })
            .collect()
    }

    /// Primary mode: the ENI `owner` holds, or the first free one in spec
    /// order.
    pub fn allocate(&mut self, node: &str, owner: &EniOwner) -> Result<Eni, ProviderError> {
        if let Some(why) = self.unavailable(node) {
            return Err(ProviderError::Unavailable(why));
        }
        if self.mode == Mode::Secondary {
            return Err(ProviderError::Config(
                "secondary mode: the agent's address store hands out addresses, not the provider"
                    .into(),
            ));
        }
        let mut total = 0;
        let mut free = None;
        for s in self.slots.iter().filter(|s| s.in_spec) {
            match self.owners.get(&s.eni.id) {
                Some(o) if o.same_attachment(owner) => {
                    return Ok(Eni {
                        owner: Some(o.clone()),
                        ..s.eni.clone()
                    })
                }
                Some(_) => total += 1,
                None if s.draining => {}
                None => {
                    total += 1;
                    free = free.or(Some(s.eni.clone()));
                }
            }
        }
        let mut eni = free.ok_or(ProviderError::Exhausted { total })?;
        self.owners.insert(eni.id.clone(), owner.clone());
        eni.owner = Some(owner.clone());
        Ok(eni)
    }

    /// Hands `owner` exactly `eni_id` (a DRA claim named it), in primary
    /// mode; see [`EniProvider::allocate_named`].
    pub fn allocate_named(
        &mut self,
        node: &str,
        eni_id: &str,
        owner: &EniOwner,
    ) -> Result<Eni, ProviderError> {
        if let Some(why) = self.unavailable(node) {
            return Err(ProviderError::Unavailable(why));
        }
        let slot = self
            .slots
            .iter()
            .find(|s| s.in_spec && s.eni.id == eni_id)
            .ok_or_else(|| ProviderError::UnknownEni(eni_id.into()))?;
        match self.owners.get(eni_id) {
            Some(o) if o.same_attachment(owner) => {}
            Some(o) => {
                return Err(ProviderError::OwnedByOther {
                    eni_id: eni_id.into(),
                    holder: o.to_string(),
                    requester: owner.to_string(),
                })
            }
            // Draining: the operator takes it back; a claim may not have it.
            None if slot.draining => return Err(ProviderError::UnknownEni(eni_id.into())),
            None => {}
        }
        let mut eni = slot.eni.clone();
        self.owners.insert(eni.id.clone(), owner.clone());
        eni.owner = Some(owner.clone());
        Ok(eni)
    }

    /// Frees whatever `owner` holds, in either mode.
    pub fn release(&mut self, owner: &EniOwner) {
        self.owners.retain(|_, o| !o.same_attachment(owner));
        self.held.remove(&key_of(owner));
        // A kept ENI gone from the spec whose pod went goes with it.
        let owners = &self.owners;
        self.slots
            .retain(|s| s.in_spec || owners.contains_key(&s.eni.id));
    }

    /// Re-establishes assignments from the agent's checkpoint (and the
    /// agent's reservations). All or nothing: an ENI held by another
    /// attachment refuses the lot. An ENI not in the spec (or no spec yet)
    /// keeps its pod's assignment for when it shows up; a reservation of
    /// one is dropped (there is nothing to reserve).
    pub fn restore(&mut self, assignments: &[(String, EniOwner)]) -> Result<(), ProviderError> {
        for (id, owner) in assignments {
            if let Some(holder) = self.owners.get(id) {
                if !holder.same_attachment(owner) {
                    return Err(ProviderError::OwnedByOther {
                        eni_id: id.clone(),
                        holder: holder.to_string(),
                        requester: owner.to_string(),
                    });
                }
            }
        }
        for (id, owner) in assignments {
            if reserved(owner) && self.slot(id).is_none() {
                continue;
            }
            self.owners.insert(id.clone(), owner.clone());
        }
        Ok(())
    }

    /// Secondary mode: `owner` holds `ips` of `eni`.
    pub fn held(&mut self, eni: &str, ips: &[IpAddr], owner: &EniOwner) {
        self.held.insert(
            key_of(owner),
            Held {
                eni: eni.to_string(),
                ips: ips.to_vec(),
                owner: owner.clone(),
            },
        );
    }

    /// Secondary mode: what the agent's store holds now.
    pub fn stored(&mut self, stored: StoredAddresses) {
        self.stored = Some(stored);
    }

    /// `status.used`.
    fn used(&self) -> Vec<EniUse> {
        let pod = |eni: &str, ip: Option<IpAddr>, o: &EniOwner| EniUse {
            eni: eni.to_string(),
            ip,
            pod_namespace: o.pod.namespace.clone(),
            pod_name: o.pod.name.clone(),
            pod_uid: o.pod.uid.clone().unwrap_or_default(),
            container_id: o.container_id.clone(),
            ifname: o.ifname.clone(),
        };
        match self.mode {
            Mode::Primary => self
                .owners
                .iter()
                .filter(|(_, o)| !reserved(o))
                .map(|(id, o)| pod(id, None, o))
                .collect(),
            Mode::Secondary => self
                .held
                .values()
                .flat_map(|h| h.ips.iter().map(|ip| pod(&h.eni, Some(*ip), &h.owner)))
                .collect(),
        }
    }

    /// `status.quarantined`: ENIs of the spec the agent will not hand out.
    fn quarantined(&self) -> Vec<Quarantined> {
        let mut out: Vec<Quarantined> = self
            .invalid
            .iter()
            .map(|(eni, reason)| Quarantined {
                eni: eni.clone(),
                reason: reason.clone(),
            })
            .collect();
        match self.mode {
            Mode::Primary => {
                for (id, o) in &self.owners {
                    let reason = match o.network.as_str() {
                        MISSING_NETWORK => {
                            "its device is not in the node's host namespace; used again once it is"
                        }
                        EXCLUDED_NETWORK => {
                            "excluded by the agent's config (or the node's primary interface)"
                        }
                        _ => continue,
                    };
                    out.push(Quarantined {
                        eni: id.clone(),
                        reason: reason.into(),
                    });
                }
            }
            Mode::Secondary => {
                let Some(stored) = &self.stored else {
                    return out;
                };
                let serving: HashSet<&str> = stored.enis.iter().map(String::as_str).collect();
                for s in self.slots.iter().filter(|s| !s.draining) {
                    if !serving.contains(s.eni.id.as_str()) {
                        out.push(Quarantined {
                            eni: s.eni.id.clone(),
                            reason: "not serving: its device is not in the node's host namespace yet, or the agent's config excludes it".into(),
                        });
                    }
                }
            }
        }
        out
    }

    /// `status.released`: entries of `spec.draining` nothing holds and the
    /// agent will not hand out again.
    pub fn released(&self) -> Vec<String> {
        let Some(seen) = &self.seen else {
            return Vec::new();
        };
        match self.mode {
            Mode::Primary => seen
                .spec
                .draining
                .iter()
                .filter(|id| self.owners.get(*id).is_none_or(reserved))
                .cloned()
                .collect(),
            Mode::Secondary => {
                // Until the store has said what it holds, nothing is let go.
                let Some(stored) = &self.stored else {
                    return Vec::new();
                };
                let in_store: HashSet<IpAddr> = stored.addresses.iter().copied().collect();
                let held = self.held_ips();
                let eni_busy = |id: &str| {
                    stored.enis.iter().any(|e| e == id)
                        || self.held.values().any(|h| h.eni == id)
                        || self.slot(id).is_some_and(|s| {
                            seen.spec
                                .enis
                                .iter()
                                .filter(|e| e.id == s.eni.id)
                                .flat_map(|e| &e.secondary_ips)
                                .any(|ip| in_store.contains(ip))
                        })
                };
                seen.spec
                    .draining
                    .iter()
                    .filter(|entry| match entry.parse::<IpAddr>() {
                        Ok(ip) => !in_store.contains(&ip) && !held.contains(&ip),
                        Err(_) => !eni_busy(entry),
                    })
                    .cloned()
                    .collect()
            }
        }
    }

    /// The addresses pods hold (secondary mode).
    fn held_ips(&self) -> HashSet<IpAddr> {
        self.held
            .values()
            .flat_map(|h| h.ips.iter().copied())
            .collect()
    }

    /// `status.cooling`: the store's addresses resting their cooldown that
    /// no pod holds (secondary mode).
    fn cooling(&self) -> Vec<IpAddr> {
        let held = self.held_ips();
        match (self.mode, &self.stored) {
            (Mode::Secondary, Some(stored)) => stored
                .cooling
                .iter()
                .filter(|ip| !held.contains(ip))
                .copied()
                .collect(),
            _ => Vec::new(),
        }
    }

    /// `status.summary`.
    pub fn summary(&self) -> Summary {
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        let enis = self.seen.as_ref().map_or(0, |s| s.spec.enis.len());
        let used = self.used().len();
        let available = match self.mode {
            Mode::Primary => self
                .slots
                .iter()
                .filter(|s| s.in_spec && !s.draining && !self.owners.contains_key(&s.eni.id))
                .count(),
            Mode::Secondary => {
                let held = self.held_ips();
                let listed: BTreeSet<IpAddr> = self
                    .list()
                    .iter()
                    .flat_map(|e| e.secondary_ips.iter().copied())
                    .collect();
                let servable = |ip: &IpAddr| {
                    self.stored
                        .as_ref()
                        .is_none_or(|s| s.addresses.contains(ip) && !s.cooling.contains(ip))
                };
                listed
                    .iter()
                    .filter(|ip| !held.contains(ip) && servable(ip))
                    .count()
            }
        };
        Summary {
            enis: count(enis),
            used: count(used),
            available: count(available),
        }
    }

    /// The whole status the agent writes, as of `now`.
    pub fn status(&mut self, node: &str, now: Time) -> NetResourceSetStatus {
        let (ready, reason, message) = match self.unavailable(node) {
            Some(why) => ("False", "NotServing", why),
            None => (
                "True",
                "Serving",
                format!(
                    "serving {} ENIs of generation {}",
                    self.list().len(),
                    self.seen
                        .as_ref()
                        .and_then(|s| s.generation)
                        .map_or("?".into(), |g| g.to_string())
                ),
            ),
        };
        let since = match &self.ready {
            Some(c) if c.status == ready => c.last_transition_time.clone(),
            _ => now.clone(),
        };
        let generation = self.seen.as_ref().and_then(|s| s.generation);
        let condition = Condition {
            type_: CONDITION_READY.into(),
            status: ready.into(),
            reason: reason.into(),
            message,
            last_transition_time: since,
            observed_generation: generation,
        };
        self.ready = Some(condition.clone());
        let claims = self.claims_condition(&now);
        NetResourceSetStatus {
            used: self.used(),
            quarantined: self.quarantined(),
            released: self.released(),
            cooling: self.cooling(),
            summary: self.summary(),
            last_sync: Some(now),
            observed_generation: generation,
            conditions: vec![condition, claims],
        }
    }

    /// The `ServesClaims` condition: True exactly when the agent's DRA
    /// driver is on. Written either way, so that False (DRA off) reads
    /// apart from an agent too old to say.
    fn claims_condition(&mut self, now: &Time) -> Condition {
        let since = self.claims_since.get_or_insert_with(|| now.clone()).clone();
        let (status, reason, message) = match self.serves_claims {
            true => (
                "True",
                "DraDriverOn",
                "the DRA driver publishes this node's ENIs for ResourceClaims",
            ),
            false => (
                "False",
                "DraDriverOff",
                "no DRA driver on this node: the operator makes no ENI for a claim here",
            ),
        };
        Condition {
            type_: CONDITION_SERVES_CLAIMS.into(),
            status: status.into(),
            reason: reason.into(),
            message: message.into(),
            last_transition_time: since,
            observed_generation: None,
        }
    }
}

#[cfg(test)]
#[path = "state_tests.rs"]
mod tests;
