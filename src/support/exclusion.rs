//! Exclusions (cilium's and CCE's IPAM blacklist): ENIs and addresses that are never
//! handed to a pod. The node's own devices (its uplink among them: see
//! [`crate::netlink::handout`]) join them as they are found. And
//! the reservations that keep excluded and quarantined ENIs from pods.
//!
//! An excluded ENI is reserved in the provider under a reserved owner, so no
//! provider, static or cloud, can hand it out, and listings show it as such.

use std::collections::HashSet;
use std::fmt::Display;
use std::net::IpAddr;
use std::sync::RwLock;

use enim_core::{Eni, EniOwner, MacAddr, PodRef};
use serde::{Deserialize, Serialize};

/// The network name of the reserved owner that holds excluded ENIs.
pub use enim_core::reserved::EXCLUDED_NETWORK;

/// What the config excludes (`[exclude]`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ExclusionConfig {
    /// ENIs never handed out, by id or MAC (`"eni-0009"`,
    /// `"02:00:00:00:00:09"`).
    #[serde(default)]
    pub enis: Vec<String>,
    /// Addresses never handed out; an ENI whose primary address is listed is
    /// excluded as a whole.
    #[serde(default)]
    pub addresses: Vec<IpAddr>,
}

#[derive(Debug, Clone, Default)]
pub struct Exclusions {
    ids: HashSet<String>,
    macs: HashSet<MacAddr>,
    addresses: HashSet<IpAddr>,
}

impl Exclusions {
    pub fn from_config(config: &ExclusionConfig) -> Self {
        let mut ex = Exclusions::default();
        for entry in &config.enis {
            match entry.parse::<MacAddr>() {
                Ok(mac) => ex.macs.insert(mac),
                Err(_) => ex.ids.insert(entry.clone()),
            };
        }
        ex.addresses.extend(config.addresses.iter().copied());
        ex
    }

    /// Adds the node's primary interface, whatever the config says.
    pub fn with_primary(mut self, mac: Option<MacAddr>) -> Self {
        self.macs.extend(mac);
        self
    }

    /// Excludes the ENI of `mac` from now on: its device is the node's own
    /// ([`crate::netlink::handout`]'s rule refused it). Whether it is new.
    pub fn refuse(&mut self, mac: MacAddr) -> bool {
        self.macs.insert(mac)
    }

    pub fn is_excluded(&self, eni: &Eni) -> bool {
        self.ids.contains(&eni.id)
            || self.macs.contains(&eni.mac)
            || self.addresses.contains(&IpAddr::V4(eni.ipv4.addr()))
            || eni
                .ipv6
                .is_some_and(|v6| self.addresses.contains(&IpAddr::V6(v6.addr())))
    }

    pub fn is_excluded_address(&self, ip: &IpAddr) -> bool {
        self.addresses.contains(ip)
    }
}

/// The exclusions a driver holds while it runs: the configured ones, and
/// the node's own devices as they are found. Both modes share it, so they
/// refuse and log alike. A poisoned lock is taken over: every write leaves
/// the set whole.
#[derive(Debug, Default)]
pub struct LiveExclusions(RwLock<Exclusions>);

impl LiveExclusions {
    pub fn new(exclusions: Exclusions) -> Self {
        LiveExclusions(RwLock::new(exclusions))
    }

    /// A copy of the exclusions as they are now.
    pub fn snapshot(&self) -> Exclusions {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Whether `eni` is excluded now.
    pub fn is_excluded(&self, eni: &Eni) -> bool {
        self.0
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .is_excluded(eni)
    }

    /// Excludes `eni` from now on: its device `device` is the node's own
    /// ([`crate::netlink::handout`]'s rule refused it for `why`). Logs the
    /// first time, `outcome` saying what the mode does with it.
    pub fn refuse(&self, eni: &Eni, device: &str, why: &dyn Display, outcome: &str) {
        let new = self
            .0
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .refuse(eni.mac);
        if new {
            tracing::error!(eni = %eni.id, mac = %eni.mac, device, reason = %why, "the provider lists a device of the node's own as an ENI: {outcome}");
        }
    }

    /// Adds the primary interface (see [`Exclusions::with_primary`]) and
    /// returns the exclusions as they are then.
    pub fn with_primary(&self, primary: Option<MacAddr>) -> Exclusions {
        let mut ex = self.0.write().unwrap_or_else(|p| p.into_inner());
        *ex = std::mem::take(&mut *ex).with_primary(primary);
        ex.clone()
    }
}

/// Why an ENI is held by enim itself rather than by a pod. A reservation is
/// an assignment in the provider under a reserved owner (one per ENI, so
/// each is its own attachment key): no provider, static or cloud, hands a
/// reserved ENI out, and listings show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reservation {
    /// Excluded by config, or a device of the node's own (the primary
    /// interface; one [`crate::netlink::handout`]'s rule refused).
    Excluded,
    /// Quarantined: its device is not in the host (detached outside enim,
    /// a failed NIC, a veth whose peer died). GC frees it when the device
    /// is back.
    Missing,
}

/// The network name of the reserved owner of quarantined ENIs.
pub use enim_core::reserved::MISSING_NETWORK;

impl Reservation {
    fn network(self) -> &'static str {
        match self {
            Reservation::Excluded => EXCLUDED_NETWORK,
            Reservation::Missing => MISSING_NETWORK,
        }
    }

    /// The reserved owner that holds `eni_id` for this reason.
    pub fn owner(self, eni_id: &str) -> EniOwner {
        EniOwner {
            network: self.network().into(),
            container_id: self.network().trim_start_matches("enim.io/").into(),
            ifname: eni_id.into(),
            pod: PodRef::default(),
        }
    }

    /// Why `owner` holds its ENI, if it is a reservation.
    pub fn of(owner: &EniOwner) -> Option<Reservation> {
        [Reservation::Excluded, Reservation::Missing]
            .into_iter()
            .find(|r| owner.network == r.network())
    }
}

/// The reserved owner that holds excluded ENI `eni_id`.
pub fn excluded_owner(eni_id: &str) -> EniOwner {
    Reservation::Excluded.owner(eni_id)
}

pub fn is_excluded_owner(owner: &EniOwner) -> bool {
    Reservation::of(owner) == Some(Reservation::Excluded)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eni(id: &str, mac: u8, v4: &str) -> Eni {
        Eni {
            id: id.into(),
            mac: MacAddr([2, 0, 0, 0, 0, mac]),
            ipv4: v4.parse().unwrap(),
            gateway4: "10.0.0.1".parse().unwrap(),
            ipv6: Some("fd00::5/64".parse().unwrap()),
            gateway6: None,
            mtu: None,
            owner: None,
            device_index: None,
            secondary_ips: Vec::new(),
            placement: Default::default(),
        }
    }

    #[test]
    fn by_id_mac_address_and_primary() {
        let ex = Exclusions::from_config(&ExclusionConfig {
            enis: vec!["eni-a".into(), "02:00:00:00:00:02".into()],
            addresses: vec!["10.0.0.3".parse().unwrap()],
        });
        assert!(ex.is_excluded(&eni("eni-a", 1, "10.0.0.1/24")));
        assert!(ex.is_excluded(&eni("eni-b", 2, "10.0.0.2/24")));
        assert!(ex.is_excluded(&eni("eni-c", 3, "10.0.0.3/24")));
        assert!(!ex.is_excluded(&eni("eni-d", 4, "10.0.0.4/24")));
        let ex = ex.with_primary(Some(MacAddr([2, 0, 0, 0, 0, 4])));
        assert!(ex.is_excluded(&eni("eni-d", 4, "10.0.0.4/24")));
        let by_v6 = Exclusions::from_config(&ExclusionConfig {
            enis: vec![],
            addresses: vec!["fd00::5".parse().unwrap()],
        });
        assert!(by_v6.is_excluded(&eni("eni-e", 5, "10.0.0.5/24")));
        assert!(is_excluded_owner(&excluded_owner("eni-a")));
        let missing = Reservation::Missing.owner("eni-a");
        assert_eq!(Reservation::of(&missing), Some(Reservation::Missing));
        assert!(!is_excluded_owner(&missing));
        assert_eq!(
            Reservation::of(&excluded_owner("eni-a")),
            Some(Reservation::Excluded)
        );
    }
}
