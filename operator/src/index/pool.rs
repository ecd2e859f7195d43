//! Node pools: which settings (mode, watermarks, subnets, groups) each node
//! is planned with, and whether the operator serves it at all.
//!
//! - A node belongs to the **first** pool, in the config's order, whose
//!   `node_selector` its labels match (every label = value of the
//!   selector, as Kubernetes' `matchLabels`; an empty selector matches
//!   every node). Later pools never see a node an earlier one took.
//! - Without pools, one implicit pool of the top-level settings selects
//!   every node: the operator as it was before pools, a mode change
//!   rewritten into every set included.
//! - With pools, a node in none is **unserved**: no NetResourceSet is made
//!   for it, and the operator makes, attaches, releases and reaps no ENI
//!   of its instance (another manager, a per-node agent for one, may own
//!   them).
//! - A node whose set exists but whose pool no longer fits it is
//!   **frozen**: its labels (or the config) left it in no pool, or put it
//!   in a pool of another mode than its set's (a mode changed under
//!   running pods would break them). Its set stays exactly as it is (no
//!   ENI made, drained or taken back, its spec not rewritten), its agent
//!   serves what it has, and it takes no DRA claim. It thaws when a pool
//!   of its set's mode selects it again; once its Node is deleted (or its
//!   set is), the usual release after `node_grace` applies. Deleting the
//!   set of a drained node is how a node moves to a pool of another mode.
//!
//! Everything here is a pure function of the policy, a Node's labels and
//! its set: the same inputs decide the same way at every resync.

use std::collections::BTreeMap;
use std::fmt;

use enim_crd::{Instance, Mode, NetResourceSetSpec, Watermarks};

use super::{NodeInfo, Policy, SetInfo};

/// One pool of the config, its settings resolved (what it left out is
/// the top level's).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PoolPolicy {
    pub name: String,
    /// Label = value, every one to match; empty: every node.
    pub node_selector: BTreeMap<String, String>,
    pub mode: Mode,
    pub watermarks: Watermarks,
    pub subnets: Vec<String>,
    pub security_groups: Vec<String>,
}

impl PoolPolicy {
    /// Whether `labels` carry every label of the selector.
    pub fn selects(&self, labels: &BTreeMap<String, String>) -> bool {
        self.node_selector
            .iter()
            .all(|(key, value)| labels.get(key) == Some(value))
    }

    pub fn settings(&self) -> PoolSettings<'_> {
        PoolSettings {
            pool: &self.name,
            mode: self.mode,
            watermarks: self.watermarks,
            subnets: &self.subnets,
            security_groups: &self.security_groups,
        }
    }
}

/// What the operator wants of the nodes of one pool: the fields it
/// writes into their sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolSettings<'a> {
    /// The pool's name; empty for the implicit pool.
    pub pool: &'a str,
    pub mode: Mode,
    pub watermarks: Watermarks,
    pub subnets: &'a [String],
    pub security_groups: &'a [String],
}

impl PoolSettings<'_> {
    /// The spec of a node that has none yet: no ENIs.
    pub fn new_spec(&self, instance: Instance) -> NetResourceSetSpec {
        let mut spec = NetResourceSetSpec {
            instance,
            ..Default::default()
        };
        self.stamp(&mut spec);
        spec
    }

    /// Whether `spec` carries the pool's current fields.
    pub fn matches(&self, spec: &NetResourceSetSpec) -> bool {
        spec.mode == self.mode
            && spec.watermarks == self.watermarks
            && spec.subnets == self.subnets
            && spec.security_groups == self.security_groups
    }

    /// Writes the pool's fields into `spec`.
    pub fn stamp(&self, spec: &mut NetResourceSetSpec) {
        spec.mode = self.mode;
        spec.watermarks = self.watermarks;
        spec.subnets = self.subnets.to_vec();
        spec.security_groups = self.security_groups.to_vec();
    }

    /// The subnet a new ENI of the pool goes into: the first.
    pub fn subnet(&self) -> String {
        self.subnets.first().cloned().unwrap_or_default()
    }
}

impl Policy {
    /// The implicit pool: the top-level settings.
    pub fn top_level(&self) -> PoolSettings<'_> {
        PoolSettings {
            pool: "",
            mode: self.mode,
            watermarks: self.watermarks,
            subnets: &self.subnets,
            security_groups: &self.security_groups,
        }
    }

    /// The pools as nodes are matched to them, in order: the configured
    /// ones, or the implicit pool (named "", selecting every node).
    pub fn node_pools(&self) -> Vec<PoolPolicy> {
        if !self.pools.is_empty() {
            return self.pools.clone();
        }
        vec![PoolPolicy {
            name: String::new(),
            node_selector: BTreeMap::new(),
            mode: self.mode,
            watermarks: self.watermarks,
            subnets: self.subnets.clone(),
            security_groups: self.security_groups.clone(),
        }]
    }

    /// The settings of the pool a node with `labels` belongs to: the first
    /// that selects it; `None` when pools are configured and none does.
    pub fn pool_of(&self, labels: &BTreeMap<String, String>) -> Option<PoolSettings<'_>> {
        if self.pools.is_empty() {
            return Some(self.top_level());
        }
        self.pools
            .iter()
            .find(|p| p.selects(labels))
            .map(PoolPolicy::settings)
    }

    /// Whether the operator serves a node, and with which settings: see
    /// the module's rules. `set` is the node's set, if it has one.
    pub fn serving<'p>(&'p self, node: &NodeInfo, set: Option<&SetInfo>) -> Serving<'p> {
        let pool = self.pool_of(&node.labels);
        let Some(set) = set else {
            return pool.map_or(Serving::Unserved, Serving::Pool);
        };
        match pool {
            // The implicit pool rewrites a changed mode, as before pools.
            Some(p) if self.pools.is_empty() || p.mode == set.spec.mode => Serving::Pool(p),
            now => Serving::Frozen(Frozen {
                now: now.map(|p| (p.pool, p.mode)),
                set_mode: set.spec.mode,
                made_by: self
                    .pools
                    .iter()
                    .find(|p| p.settings().matches(&set.spec))
                    .map(|p| p.name.as_str()),
            }),
        }
    }
}

/// Whether the operator serves a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Serving<'a> {
    /// Planned with these settings.
    Pool(PoolSettings<'a>),
    /// In no pool, and without a set: nothing is made for it.
    Unserved,
    /// Its set is left exactly as it is.
    Frozen(Frozen<'a>),
    /// Without a set, and its providerID names no instance of the
    /// operator's cloud (a cloud controller may set it after the Node
    /// registers): nothing is made for it until it does.
    NoInstance(NoInstance<'a>),
}

impl<'a> Serving<'a> {
    /// The settings of a served node.
    pub fn pool(&self) -> Option<PoolSettings<'a>> {
        match self {
            Serving::Pool(p) => Some(*p),
            Serving::Unserved | Serving::Frozen(_) | Serving::NoInstance(_) => None,
        }
    }
}

/// A node the operator's cloud has no instance for, for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoInstance<'a> {
    pub provider_id: &'a str,
    /// The provider the operator's cloud serves.
    pub cloud: &'a str,
}

impl fmt::Display for NoInstance<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.provider_id {
            "" => write!(f, "it has no providerID yet, so no {} instance", self.cloud),
            id => write!(f, "its providerID {id:?} names no {} instance", self.cloud),
        }
    }
}

/// Why a node with a set is frozen, for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frozen<'a> {
    /// The pool that selects the node now, and its mode; `None`: no pool.
    pub now: Option<(&'a str, Mode)>,
    /// The mode the set was made in, which it keeps.
    pub set_mode: Mode,
    /// The first pool whose settings the set carries (most likely the one
    /// that made it), if any.
    pub made_by: Option<&'a str>,
}

impl fmt::Display for Frozen<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.now {
            Some((pool, mode)) => write!(f, "pool {pool:?} ({}) now selects it, ", mode.as_str())?,
            None => write!(f, "no pool selects it any more, ")?,
        }
        let mode = self.set_mode.as_str();
        match self.made_by {
            Some(pool) => write!(f, "its set is pool {pool:?}'s ({mode} mode)")?,
            None => write!(f, "its set ({mode} mode) matches no pool's settings")?,
        }
        write!(
            f,
            ": the set is left as it is (no ENI made or taken back) until a pool of its mode selects the node again or the node is deleted"
        )
    }
}
