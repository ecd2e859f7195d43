//! The `[secondary]` table of enimd's config, and the names and numbers
//! it gives host ENIs, route tables and pod veths.

use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::time::Duration;

use enim_api::model::{naming, AttachmentKey};
use serde::{Deserialize, Serialize};

use super::MAX_DEVICE_INDEX;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("[secondary] config: {0}")]
pub struct SecondaryConfigError(pub String);

/// The `[secondary]` table of enimd's config.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct SecondaryConfig {
    /// An ENI's route table is `table_offset` + its device index; the
    /// tables may not include 0 nor the kernel's 253-255.
    pub table_offset: u32,
    /// Priority of the `to <pod ip> lookup main` rules (1..32766), below
    /// `rule_priority_from_pod`.
    pub rule_priority_to_pod: u32,
    /// Priority of the `from <pod ip> lookup <ENI table>` rules (1..32766).
    pub rule_priority_from_pod: u32,
    /// A released address rests this long before another pod gets it.
    #[serde(with = "humantime_serde")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub cooldown: Duration,
    /// Host ends of pod veths are named this plus a hash of the attachment
    /// key (15 bytes in all), 1-7 of `[a-z0-9-]`; GC treats such veths as
    /// enim's.
    pub veth_prefix: String,
    /// ENIs are renamed to this plus their device index (1-12 of
    /// `[a-z0-9-]`, not starting with `veth_prefix`).
    pub eni_name_prefix: String,
    /// Where the IPv6 sysctls without a netlink form (`proxy_ndp`,
    /// `accept_dad`, `all/forwarding`) are written: a non-privileged
    /// container has /proc/sys read-only, so `deploy/` mounts the node's
    /// at `/host/proc/sys/net` and names it here. Only nodes with IPv6
    /// secondaries write there.
    pub proc_sys_net: PathBuf,
    /// The warm address pool, with a provider that assigns addresses.
    pub pool: super::WarmIpConfig,
}

impl Default for SecondaryConfig {
    fn default() -> Self {
        SecondaryConfig {
            table_offset: 1000,
            rule_priority_to_pod: 512,
            rule_priority_from_pod: 1536,
            cooldown: Duration::from_secs(30),
            veth_prefix: "enim".into(),
            eni_name_prefix: "enis".into(),
            proc_sys_net: crate::netlink::sysctl::PROC_SYS_NET.into(),
            pool: super::WarmIpConfig::default(),
        }
    }
}

impl SecondaryConfig {
    pub fn validate(&self) -> Result<(), SecondaryConfigError> {
        let bad = |m: String| Err(SecondaryConfigError(m));
        let (to, from) = (self.rule_priority_to_pod, self.rule_priority_from_pod);
        // 0 is the local table's rule; 32766 and up are main and default.
        for (name, p) in [
            ("rule_priority_to_pod", to),
            ("rule_priority_from_pod", from),
        ] {
            if !(1..32766).contains(&p) {
                return bad(format!("{name} {p} must be in 1..32766"));
            }
        }
        if to >= from {
            // Pod-to-pod traffic on the node must hit `to` before `from`
            // sends it out of an ENI.
            return bad(format!(
                "rule_priority_to_pod ({to}) must be below rule_priority_from_pod ({from})"
            ));
        }
        let Some(last) = self.table_offset.checked_add(MAX_DEVICE_INDEX) else {
            return bad(format!("table_offset {} is too large", self.table_offset));
        };
        // 253..=255 are the default, main and local tables; 0 is unspecified.
        if self.table_offset == 0 || (self.table_offset <= 255 && last >= 253) {
            return bad(format!(
                "tables {}..={last} would include 0 or the kernel's tables 253-255",
                self.table_offset
            ));
        }
        if !naming::valid_veth_prefix(&self.veth_prefix) {
            return bad(format!(
                "veth_prefix {:?} must be 1-7 of [a-z0-9-] (the rest of the name is a hash)",
                self.veth_prefix
            ));
        }
        if !naming::name_chars_ok(&self.eni_name_prefix) || self.eni_name_prefix.len() > 12 {
            return bad(format!(
                "eni_name_prefix {:?} must be 1-12 of [a-z0-9-]",
                self.eni_name_prefix
            ));
        }
        if !self.proc_sys_net.is_absolute() {
            return bad(format!(
                "proc_sys_net {} must be an absolute path",
                self.proc_sys_net.display()
            ));
        }
        self.pool.validate().map_err(SecondaryConfigError)?;
        if self.eni_name_prefix.starts_with(&self.veth_prefix) {
            return bad(format!(
                "eni_name_prefix {:?} must not start with veth_prefix {:?}",
                self.eni_name_prefix, self.veth_prefix
            ));
        }
        Ok(())
    }

    pub fn table(&self, device_index: u32) -> u32 {
        self.table_offset + device_index
    }

    /// Every table number an ENI of this node may use.
    pub fn tables(&self) -> RangeInclusive<u32> {
        self.table_offset..=self.table_offset + MAX_DEVICE_INDEX
    }

    pub fn eni_name(&self, device_index: u32) -> String {
        format!("{}{device_index}", self.eni_name_prefix)
    }

    /// The host end of a pod's veth: the prefix and a stable hash of the
    /// attachment key, 15 bytes in all, so GC can tell it from the key.
    pub fn veth_name(&self, key: &AttachmentKey) -> String {
        naming::veth_name(&self.veth_prefix, key)
    }

    /// Whether `name` has the shape of a pod veth's host end.
    pub fn is_veth_name(&self, name: &str) -> bool {
        naming::is_veth_name(&self.veth_prefix, name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(c: &str, ifname: &str) -> AttachmentKey {
        AttachmentKey {
            network: "net".into(),
            container_id: c.into(),
            ifname: ifname.into(),
        }
    }

    #[test]
    fn veth_names_are_stable_distinct_and_recognised() {
        let c = SecondaryConfig::default();
        let a = c.veth_name(&key("abc", "eth0"));
        // Pinned: a name must never change between versions, or GC of an
        // upgraded agent would take live pods' veths for strangers.
        assert_eq!(a, "enimbb9cd5bd352");
        assert_eq!(a.len(), 15);
        assert_eq!(a, c.veth_name(&key("abc", "eth0")));
        assert_ne!(a, c.veth_name(&key("abc", "net1")));
        assert_ne!(a, c.veth_name(&key("abd", "eth0")));
        assert!(c.is_veth_name(&a));
        for other in [
            "enis1",
            "eth0",
            "enimbb9cd5bd35",
            "enimXb9cd5bd352",
            "enimbb9cd5bd3521",
        ] {
            assert!(!c.is_veth_name(other), "{other}");
        }
        let long = SecondaryConfig {
            veth_prefix: "podveth".into(),
            ..c
        };
        assert_eq!(long.veth_name(&key("abc", "eth0")).len(), 15);
    }

    #[test]
    fn defaults_validate_and_mistakes_do_not() {
        let c = SecondaryConfig::default();
        c.validate().unwrap();
        assert_eq!(c.table(2), 1002);
        assert_eq!(c.tables(), 1000..=1255);
        assert_eq!(c.eni_name(3), "enis3");
        let bad = [
            SecondaryConfig {
                rule_priority_to_pod: 2000,
                ..c.clone()
            },
            SecondaryConfig {
                rule_priority_from_pod: 32766,
                ..c.clone()
            },
            SecondaryConfig {
                table_offset: 100,
                ..c.clone()
            },
            SecondaryConfig {
                table_offset: u32::MAX - 3,
                ..c.clone()
            },
            SecondaryConfig {
                veth_prefix: "toolong8".into(),
                ..c.clone()
            },
            SecondaryConfig {
                veth_prefix: "a/b".into(),
                ..c.clone()
            },
            SecondaryConfig {
                eni_name_prefix: "enimx".into(),
                ..c.clone()
            },
            SecondaryConfig {
                proc_sys_net: "proc/sys/net".into(),
                ..c.clone()
            },
        ];
        for b in bad {
            assert!(b.validate().is_err(), "{b:?}");
        }
    }
}
