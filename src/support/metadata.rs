//! The instance metadata service, as pods see it: refused by default.
//!
//! A primary-mode pod owns a whole ENI, so IMDS's hop limit does not stop
//! it, and the node's role (with the per-node providers) may create,
//! attach and delete ENIs. So every pod interface enim makes, in both
//! modes, gets a `prohibit` route in the pod's main table for each
//! metadata address: a connect fails at once with EACCES ("Permission
//! denied") instead of timing out, and longest-prefix match beats the
//! default route and the host path's routes alike.
//!
//! The opt-in is by namespace in enimd's config (`[pod_metadata]`), not by
//! a pod annotation: an annotation is written by whoever may create pods,
//! the very party this keeps from the node's credentials, while the
//! namespace comes from the runtime (`K8S_POD_NAMESPACE`) and the config
//! from the cluster admin.
//!
//! The routes live in the pod's netns: a pod granted CAP_NET_ADMIN can
//! delete them (Pod Security "baseline" refuses that capability). A pod
//! that is not a Kubernetes pod (no namespace) is refused like any other.

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use enim_core::PodRef;

/// AWS's IMDS over IPv4; Baidu BCC's metadata service uses it too.
pub const METADATA_V4: &str = "169.254.169.254/32";
/// AWS's IMDS over IPv6 (Nitro instances).
pub const METADATA_V6: &str = "fd00:ec2::254/128";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("[pod_metadata] config: {0}")]
pub struct MetadataConfigError(pub String);

/// The `[pod_metadata]` table of enimd's config.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct MetadataConfig {
    /// The metadata addresses pods may not reach: a `prohibit` route for
    /// each in every pod's netns. `[]` turns the refusal off.
    #[cfg_attr(feature = "schema", schemars(with = "Vec<String>"))]
    pub blocked: Vec<IpNet>,
    /// Namespaces whose pods reach them anyway (e.g. system agents that
    /// need the instance identity); `"*"` is every namespace.
    pub allowed_namespaces: Vec<String>,
}

impl Default for MetadataConfig {
    fn default() -> Self {
        MetadataConfig {
            blocked: [METADATA_V4, METADATA_V6]
                .iter()
                .map(|n| n.parse().expect("valid constant"))
                .collect(),
            allowed_namespaces: Vec::new(),
        }
    }
}

impl MetadataConfig {
    pub fn validate(&self) -> Result<(), MetadataConfigError> {
        for net in &self.blocked {
            if net.trunc() != *net {
                return Err(MetadataConfigError(format!(
                    "blocked {net} has host bits set; write {}",
                    net.trunc()
                )));
            }
            if net.prefix_len() == 0 {
                return Err(MetadataConfigError(format!(
                    "blocked {net} would refuse every destination"
                )));
            }
        }
        for ns in &self.allowed_namespaces {
            if ns.is_empty() || (ns != "*" && !is_dns_label(ns)) {
                return Err(MetadataConfigError(format!(
                    "allowed_namespaces: {ns:?} is not a namespace name (a DNS label) or \"*\""
                )));
            }
        }
        Ok(())
    }

    /// The prefixes `pod` may not reach, of the families it has (`v4`,
    /// `v6`): a route of a family the pod lacks would only fail.
    pub fn blocked_for(&self, pod: &PodRef, v4: bool, v6: bool) -> Vec<IpNet> {
        let allowed = !pod.namespace.is_empty()
            && self
                .allowed_namespaces
                .iter()
                .any(|ns| ns == "*" || *ns == pod.namespace);
        if allowed {
            return Vec::new();
        }
        self.blocked
            .iter()
            .filter(|n| match n {
                IpNet::V4(_) => v4,
                IpNet::V6(_) => v6,
            })
            .copied()
            .collect()
    }
}

/// RFC 1123 label: what Kubernetes allows as a namespace name.
fn is_dns_label(s: &str) -> bool {
    s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(namespace: &str) -> PodRef {
        PodRef {
            namespace: namespace.into(),
            name: "p".into(),
            uid: None,
        }
    }

    #[test]
    fn every_pod_is_refused_by_default_in_its_own_families() {
        let c = MetadataConfig::default();
        let both: Vec<String> = c
            .blocked_for(&pod("default"), true, true)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(both, [METADATA_V4, METADATA_V6]);
        assert_eq!(c.blocked_for(&pod("default"), true, false).len(), 1);
        assert_eq!(c.blocked_for(&pod(""), true, true).len(), 2);
    }

    #[test]
    fn only_the_listed_namespaces_opt_in() {
        let c = MetadataConfig {
            allowed_namespaces: vec!["agents".into()],
            ..Default::default()
        };
        assert!(c.blocked_for(&pod("agents"), true, true).is_empty());
        assert_eq!(c.blocked_for(&pod("default"), true, true).len(), 2);
        // A pod with no namespace (not from Kubernetes) is never listed.
        assert_eq!(c.blocked_for(&pod(""), true, true).len(), 2);
        let all = MetadataConfig {
            allowed_namespaces: vec!["*".into()],
            ..Default::default()
        };
        assert!(all.blocked_for(&pod("x"), true, true).is_empty());
    }

    #[test]
    fn bad_entries_are_refused() {
        for bad in [
            MetadataConfig {
                blocked: vec!["169.254.169.254/24".parse().unwrap()],
                ..Default::default()
            },
            MetadataConfig {
                blocked: vec!["0.0.0.0/0".parse().unwrap()],
                ..Default::default()
            },
            MetadataConfig {
                allowed_namespaces: vec!["Kube_System".into()],
                ..Default::default()
            },
            MetadataConfig {
                allowed_namespaces: vec![String::new()],
                ..Default::default()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
        MetadataConfig::default().validate().unwrap();
    }
}
