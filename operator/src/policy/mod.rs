//! EniPolicy in the operator: which policy applies to a pod ([`select`],
//! pure) and what a pod gets when none does (the cluster default,
//! [`DefaultPolicy`], the config's `[operator.policy] default`).

use enim_core::Mode;
use serde::{Deserialize, Serialize};

pub mod admit;
pub mod certs;
pub mod keeper;
pub mod select;
pub mod status;
pub mod webhook;

/// What a pod no EniPolicy selects gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DefaultPolicy {
    /// Nothing: the pod keeps the network it asks for (none: the
    /// cluster's other CNI, or the node's default), only annotated.
    #[default]
    None,
    /// A secondary address (`enim.io/ip`).
    Secondary,
    /// A whole ENI (`enim.io/eni`).
    Primary,
}

impl DefaultPolicy {
    /// The mode the default gives, if any.
    pub fn mode(self) -> Option<Mode> {
        match self {
            DefaultPolicy::None => None,
            DefaultPolicy::Secondary => Some(Mode::Secondary),
            DefaultPolicy::Primary => Some(Mode::Primary),
        }
    }
}
