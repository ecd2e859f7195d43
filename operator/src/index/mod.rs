//! The cluster as the operator sees it, and [`plan`]: what to do about it.
//! Pure: no I/O, no clock, no tokio. The allocator builds an [`Index`]
//! from its caches and one cloud listing, plans, and runs the tasks.
//!
//! Invariants `plan` keeps (the tests check them on random clusters):
//! - an ENI (secondary mode: an address) that a pod holds, per the node's
//!   `status.used`, is never drained, detached, deleted or unassigned, and
//!   never leaves the spec; only a node gone past `node_grace` loses its
//!   ENIs, used or not (its pods are gone with it);
//! - an ENI leaves the cloud only through the handshake: the operator lists
//!   it in `spec.draining`, the agent lists it in `status.released`, then
//!   [`Task::Reclaim`] asks for its detach, and deletes it (and drops it
//!   from the spec) only once a later listing shows it attached nowhere:
//!   no describe is spent waiting for a detach;
//! - a leaked ENI is deleted only when the listing shows it attached
//!   nowhere, in no spec, made by no live intent, and older than
//!   `reap_cooldown` by a readable creation tag;
//! - a node's free ENIs (secondary: addresses) above its watermarks are
//!   drained only once they have been above them at every pass for
//!   `drain_delay` (by [`Input::surplus_since`]); an ENI made for a claim
//!   that is gone is not surplus and goes at once;
//! - tasks come neediest node first (deficit descending, surplus last, as
//!   CCE's `GetNodesByIPWatermark`), a node's tasks next to each other and
//!   in the order they must run: its set, finish intents, adopt, reclaim,
//!   its claims, then grow or drain (one phase of `NodePlan` each);
//! - a deleted node's set is released only when no pod holds its ENIs
//!   and the listing shows none of them attached or detaching, after the
//!   deletes.
//! - an EniPolicy's warm ENIs (the `warm` module) are made only on such
//!   nodes too, are no node's pool, and one a pod holds is never drained;
//! - an ENI for a DRA claim is made only on a live node whose agent says,
//!   in its status, that it serves claims (condition `ServesClaims`): no
//!   claim's pod could use one on a device-plugin node;
//! - each node is planned with its pool's settings (the `pool` module: the
//!   first pool whose selector its labels match); a node in no pool gets
//!   no set, and a frozen one (its set's mode is not its pool's, or it is
//!   in no pool any more) no task while its Node lives: neither gets, nor
//!   loses, nor has reaped an ENI, nor takes a DRA claim;
//! - a set made without an instance type gets the one its Node is later
//!   labelled with (never another over it), and is planned with it.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::time::{Duration, SystemTime};

use enim_core::AddressLimits;
use enim_crd::{EniSpec, Instance, Mode, NetResourceSetSpec, Watermarks};
use enim_provider::fleet::{DeleteCheck, FleetEni};

mod node_plan;
mod plan;
mod pool;
mod provider_id;
#[cfg(test)]
pub(crate) mod tests;
mod view;
mod warm;

pub use plan::{plan, plan_pass, unservable_claims, Planned};
pub use pool::{Frozen, NoInstance, PoolPolicy, PoolSettings, Serving};
pub use provider_id::instance_of;
pub use view::{ClaimInfo, NodeInfo, SetInfo, Uninstall, WarmPool};
pub use warm::{surplus_key, warm_refused_key};

/// `Intent::action` of a create followed by an attach.
pub const ACTION_CREATE_ATTACH: &str = "create-attach";

/// Whom an ENI made with its own subnet and groups is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MadeFor {
    /// A DRA claim no free ENI serves.
    Claim(enim_crd::ClaimRef),
    /// An EniPolicy's warm ENIs (its `warmEnis`).
    Policy(String),
}

/// What the operator wants of the nodes, from its config: the top-level
/// settings (the implicit pool, and what a pool leaves out), the pools,
/// and the cluster-wide keys.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Policy {
    pub cluster: String,
    pub mode: Mode,
    pub watermarks: Watermarks,
    pub subnets: Vec<String>,
    pub security_groups: Vec<String>,
    /// In the config's order; empty: one implicit pool of the top level.
    pub pools: Vec<PoolPolicy>,
    pub node_grace: Duration,
    pub reap_cooldown: Duration,
    /// See [`crate::config::OperatorConfig::drain_delay`].
    pub drain_delay: Duration,
}

impl Policy {
    /// The spec of a node of the implicit pool that has none yet.
    pub fn new_spec(&self, instance: Instance) -> NetResourceSetSpec {
        self.top_level().new_spec(instance)
    }
}

/// What one index is built from.
#[derive(Debug, Clone, Copy)]
pub struct Input<'a> {
    pub policy: &'a Policy,
    pub nodes: &'a [NodeInfo],
    pub sets: &'a [SetInfo],
    /// One listing of the cluster's ENIs.
    pub enis: &'a [FleetEni],
    /// By instance type; a type missing here gets no new ENIs.
    pub limits: &'a HashMap<String, AddressLimits>,
    /// Sets whose Node the allocator found gone, and since when (a set
    /// being deleted counts from its `deleting_since`).
    pub gone_since: &'a HashMap<String, SystemTime>,
    /// Nodes whose free ENIs were above their watermarks at the last
    /// passes, since when (see [`Planned::surplus`]).
    pub surplus_since: &'a HashMap<String, SystemTime>,
    /// Look for leaked ENIs in this pass (the listing is fresh and the
    /// reap interval has passed).
    pub reap_leaks: bool,
    pub now: SystemTime,
    /// Every ResourceClaim of the DRA driver's class; `None` while the
    /// operator does not know them (its watch is not synced): then no ENI
    /// is made for a claim, and none made for one is taken back.
    pub claims: Option<&'a [ClaimInfo]>,
    /// Claims (by uid) whose ENI the cloud refused lately, with what it
    /// said: no ENI is made for them until the allocator lets them try
    /// again.
    pub refused: &'a HashMap<String, String>,
    /// The EniPolicies that keep ENIs warm; `None` while the operator does
    /// not know the policies (its watch is not synced): then no ENI is
    /// made to keep one warm, and none kept for one is taken back.
    pub warm: Option<&'a [WarmPool]>,
    /// The provider of the instances the operator's cloud serves
    /// ([`enim_provider::fleet::FleetCloud::name`]). A node without a set
    /// whose providerID names another (or none yet) gets nothing.
    pub cloud: &'a str,
}

/// What a node is, as far as planning goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// A Node without its NetResourceSet yet.
    New,
    Live,
    /// The set outlives its Node (or is being deleted) since then.
    Gone(SystemTime),
}

/// One node (or one set without a node).
#[derive(Debug, Clone)]
pub struct NodeEntry<'a> {
    pub name: &'a str,
    pub node: Option<&'a NodeInfo>,
    pub set: Option<&'a SetInfo>,
    pub phase: Phase,
    /// The set's instance (what its ENIs were made for), else the Node's.
    pub instance: Instance,
    pub limits: Option<AddressLimits>,
    /// The listing's ENIs attached to this instance or tagged for it.
    pub listed: Vec<&'a FleetEni>,
    /// Its pool's settings, or why it is not served (see [`Serving`]);
    /// a set without its Node is [`Serving::Unserved`] (its phase says
    /// what becomes of it).
    pub serving: Serving<'a>,
    /// The set was made without an instance type and the Node's label now
    /// gives one: `instance` carries it, the set is to get it.
    pub late_type: bool,
}

impl NodeEntry<'_> {
    /// Whether the operator leaves this Node's instance alone: it is in
    /// no pool, or frozen.
    fn left_alone(&self) -> bool {
        self.node.is_some() && self.serving.pool().is_none()
    }
}

/// The cluster at one instant.
#[derive(Debug, Clone)]
pub struct Index<'a> {
    pub policy: &'a Policy,
    pub now: SystemTime,
    /// By name.
    pub nodes: Vec<NodeEntry<'a>>,
    /// Listed ENIs no live spec or intent accounts for: leak candidates
    /// (filtered by [`plan`]). Empty unless `reap_leaks`.
    pub unclaimed: Vec<&'a FleetEni>,
    /// See [`Input::claims`].
    pub claims: Option<&'a [ClaimInfo]>,
    /// The uids of `claims`, once for every node's plan.
    pub claim_uids: Option<HashSet<&'a str>>,
    /// See [`Input::refused`].
    pub refused: &'a HashMap<String, String>,
    /// See [`Input::warm`].
    pub warm: Option<&'a [WarmPool]>,
    /// See [`Input::surplus_since`].
    pub surplus_since: &'a HashMap<String, SystemTime>,
}

impl<'a> Index<'a> {
    pub fn build(input: Input<'a>) -> Index<'a> {
        let mut by_name: HashMap<&str, NodeEntry<'a>> = HashMap::with_capacity(input.nodes.len());
        for n in input.nodes {
            let instance = instance_of(n);
            by_name.insert(
                &n.name,
                NodeEntry {
                    name: &n.name,
                    node: Some(n),
                    set: None,
                    phase: Phase::New,
                    limits: input.limits.get(&instance.instance_type).copied(),
                    instance,
                    listed: Vec::new(),
                    serving: Serving::Unserved,
                    late_type: false,
                },
            );
        }
        for s in input.sets {
            let gone = s
                .deleting_since
                .or_else(|| input.gone_since.get(&s.name).copied())
                .unwrap_or(input.now);
            let entry = by_name.entry(&s.name).or_insert_with(|| NodeEntry {
                name: &s.name,
                node: None,
                set: None,
                phase: Phase::Gone(gone),
                instance: Instance::default(),
                limits: None,
                listed: Vec::new(),
                serving: Serving::Unserved,
                late_type: false,
            });
            entry.set = Some(s);
            // The spec's instance is what the ENIs were made for.
            entry.instance = s.spec.instance.clone();
            // But for a type the Node got labelled with after its set was
            // made: without one no ENI could be made, so none was.
            let labelled = entry.node.map_or("", |n| n.instance_type.as_str());
            if entry.instance.instance_type.is_empty() && !labelled.is_empty() {
                entry.instance.instance_type = labelled.to_string();
                entry.late_type = true;
            }
            entry.limits = input.limits.get(&entry.instance.instance_type).copied();
            entry.phase = match (entry.node, s.deleting_since, s.uninstall) {
                // The uninstall hook's: released now, whatever the grace.
                (_, _, Uninstall::Releasing | Uninstall::Released) => {
                    Phase::Gone(SystemTime::UNIX_EPOCH)
                }
                (Some(_), None, Uninstall::No) => Phase::Live,
                _ => Phase::Gone(gone),
            };
        }
        let mut nodes: Vec<NodeEntry<'a>> = by_name.into_values().collect();
        nodes.sort_unstable_by(|a, b| a.name.cmp(b.name));
        for e in &mut nodes {
            if let Some(n) = e.node {
                e.serving = match e.set {
                    // Its instance is the cloud's to make ENIs for: an EC2
                    // call for a node named like a static one would fail at
                    // each pass, and its set would name the wrong instance.
                    None if e.instance.provider != input.cloud => Serving::NoInstance(NoInstance {
                        provider_id: &n.provider_id,
                        cloud: input.cloud,
                    }),
                    _ => input.policy.serving(n, e.set),
                };
            }
        }

        let by_instance: HashMap<String, usize> = nodes
            .iter()
            .enumerate()
            .filter(|(_, e)| !e.instance.id.is_empty())
            .map(|(i, e)| (e.instance.id.clone(), i))
            .collect();
        for eni in input.enis {
            let attached = eni.attachment.as_ref().map(|a| a.instance.as_str());
            let tagged = eni.node.as_deref();
            let mut seen = None;
            for inst in [attached, tagged].into_iter().flatten() {
                if let Some(&i) = by_instance.get(inst) {
                    if seen != Some(i) {
                        nodes[i].listed.push(eni);
                        seen = Some(i);
                    }
                }
            }
        }

        let mut unclaimed = Vec::new();
        if input.reap_leaks {
            let mut in_spec: HashSet<&str> = HashSet::new();
            let mut tokens: HashSet<&str> = HashSet::new();
            for s in input.sets {
                in_spec.extend(s.spec.enis.iter().map(|e| e.id.as_str()));
                tokens.extend(s.spec.intents.iter().map(|i| i.client_token.as_str()));
            }
            // Another manager's, perhaps (a per-node agent's): not ours to reap.
            let left_alone: HashSet<&str> = nodes
                .iter()
                .filter(|e| e.left_alone())
                .map(|e| e.instance.id.as_str())
                .collect();
            unclaimed = input
                .enis
                .iter()
                .filter(|e| e.attachment.is_none() && !in_spec.contains(e.id.as_str()))
                .filter(|e| e.intent.as_deref().is_none_or(|t| !tokens.contains(t)))
                .filter(|e| e.node.as_deref().is_none_or(|i| !left_alone.contains(i)))
                .collect();
        }
        Index {
            policy: input.policy,
            now: input.now,
            nodes,
            unclaimed,
            claims: input.claims,
            claim_uids: input
                .claims
                .map(|all| all.iter().map(|c| c.claim.uid.as_str()).collect()),
            refused: input.refused,
            warm: input.warm,
            surplus_since: input.surplus_since,
        }
    }
}

impl Index<'_> {
    /// Whether what `key` names (a node, or a warm pool's
    /// [`surplus_key`]) has been above its watermarks for `drain_delay`:
    /// the passes before this one saw it so since then.
    fn surplus_lasted(&self, key: &str) -> bool {
        let delay = self.policy.drain_delay;
        delay.is_zero()
            || self
                .surplus_since
                .get(key)
                .is_some_and(|since| self.now.duration_since(*since).is_ok_and(|d| d >= delay))
    }
}

/// The spec entry of a listed ENI.
pub fn eni_spec(e: &FleetEni) -> EniSpec {
    EniSpec {
        id: e.id.clone(),
        mac: e.mac.to_string(),
        ipv4: e.ipv4.to_string(),
        gateway4: IpAddr::V4(e.gateway4),
        ipv6: e.ipv6.map(|n| n.to_string()),
        gateway6: e.gateway6.map(IpAddr::V6),
        mtu: None,
        device_index: e.attachment.as_ref().map(|a| a.device_index),
        subnet: e.subnet.clone(),
        secondary_ips: e.secondary_ips.clone(),
        security_groups: Vec::new(),
        claim: None,
        policy: None,
    }
}

/// One thing to do. Every task but [`Task::DeleteLeaked`] concerns one
/// node (its [`Task::node`]); the allocator runs a node's tasks one after
/// another, in plan order, on one working copy of its spec.
#[derive(Debug, Clone, PartialEq)]
pub enum Task {
    /// Write the first NetResourceSet of a new node.
    CreateSet {
        node: String,
        spec: NetResourceSetSpec,
    },
    /// Write the node's pool's current mode, watermarks, subnets and
    /// groups.
    RefreshPolicy { node: String },
    /// Write the instance type the Node's label gives into a set made
    /// without one (never over another type).
    FillInstanceType { node: String, instance_type: String },
    /// Finish a create+attach recorded in `spec.intents`: create with the
    /// same token unless the listing shows the ENI it made (`made`), attach
    /// it unless attached here, publish it, drop the intent.
    FinishIntent {
        node: String,
        token: String,
        made: Option<FleetEni>,
        /// Where to attach it; `None` when `made` is attached here already.
        device_index: Option<u32>,
        secondary_ipv4: usize,
    },
    /// Drop an intent that cannot be finished (no room on the instance,
    /// or its ENI is published already). Its ENI, if any, is unattached:
    /// the leak reaper deletes it after the cooldown.
    DropIntent { node: String, token: String },
    /// Publish ENIs (and, in secondary mode, addresses of spec ENIs) the
    /// listing shows attached here and tagged for this instance but the
    /// spec lacks: a crashed leader's work, or a restore.
    Adopt {
        node: String,
        enis: Vec<EniSpec>,
        addresses: Vec<(String, Vec<IpAddr>)>,
    },
    /// The released side of the drain handshake, one step a listing: ask
    /// the cloud to detach `detach` (released ENIs the listing shows
    /// attached; they stay in the spec), delete `delete` (released ENIs it
    /// shows attached nowhere, [`DeleteCheck::Listed`], or no longer lists,
    /// [`DeleteCheck::SecondLook`]), unassign `addresses`,
    /// then drop what was deleted or unassigned (and `stale` draining
    /// entries that name nothing) from the spec. A released ENI the
    /// listing shows detaching waits for a later listing.
    Reclaim {
        node: String,
        detach: Vec<FleetEni>,
        delete: Vec<(String, DeleteCheck)>,
        addresses: Vec<(String, Vec<IpAddr>)>,
        stale: Vec<String>,
    },
    /// Create and attach `device_indexes.len()` ENIs, each with
    /// `secondary_ipv4` addresses (secondary mode).
    CreateEnis {
        node: String,
        device_indexes: Vec<u32>,
        secondary_ipv4: usize,
    },
    /// Create and attach one ENI for a DRA claim no node has a free ENI
    /// for, in `subnet` with exactly `security_groups`, at `device_index`,
    /// and publish it marked with the claim.
    CreateForClaim {
        node: String,
        claim: enim_crd::ClaimRef,
        subnet: String,
        security_groups: Vec<String>,
        device_index: u32,
    },
    /// Create and attach one ENI to keep `policy`'s ENIs warm, in
    /// `subnet` with exactly `security_groups`, at `device_index`, and
    /// publish it marked with the policy.
    CreateWarm {
        node: String,
        policy: String,
        subnet: String,
        security_groups: Vec<String>,
        device_index: u32,
    },
    /// Secondary mode: assign `count` more addresses to `eni`.
    AssignAddresses {
        node: String,
        eni: String,
        count: usize,
    },
    /// Take back drains the agent has not answered yet: the node needs them.
    Undrain { node: String, items: Vec<String> },
    /// Ask the agent for these free ENIs (secondary mode: addresses) back.
    Drain { node: String, items: Vec<String> },
    /// The node is gone past its grace: every ENI it had leaves, one step
    /// a listing as in [`Task::Reclaim`] (`detach` those still attached,
    /// `delete` those attached nowhere or no longer listed, checked as
    /// there), and once none
    /// is attached or detaching, its set goes (`release_set`, after the
    /// deletes). A set deleted while its Node still exists keeps the ENIs
    /// pods hold, and the set, until they are free.
    ReleaseNode {
        node: String,
        detach: Vec<FleetEni>,
        delete: Vec<(String, DeleteCheck)>,
        release_set: bool,
    },
    /// An ENI of this cluster attached nowhere and claimed by nothing:
    /// deleted after a second look ([`DeleteCheck::SecondLook`]), as not
    /// this operator's doing.
    DeleteLeaked { eni: String },
}

impl Task {
    pub fn node(&self) -> Option<&str> {
        match self {
            Task::CreateSet { node, .. }
            | Task::RefreshPolicy { node }
            | Task::FillInstanceType { node, .. }
            | Task::FinishIntent { node, .. }
            | Task::DropIntent { node, .. }
            | Task::Adopt { node, .. }
            | Task::Reclaim { node, .. }
            | Task::CreateEnis { node, .. }
            | Task::CreateForClaim { node, .. }
            | Task::CreateWarm { node, .. }
            | Task::AssignAddresses { node, .. }
            | Task::Undrain { node, .. }
            | Task::Drain { node, .. }
            | Task::ReleaseNode { node, .. } => Some(node),
            Task::DeleteLeaked { .. } => None,
        }
    }

    /// A short name for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Task::CreateSet { .. } => "create-set",
            Task::RefreshPolicy { .. } => "refresh-policy",
            Task::FillInstanceType { .. } => "fill-instance-type",
            Task::FinishIntent { .. } => "finish-intent",
            Task::DropIntent { .. } => "drop-intent",
            Task::Adopt { .. } => "adopt",
            Task::Reclaim { .. } => "reclaim",
            Task::CreateEnis { .. } => "create-enis",
            Task::CreateForClaim { .. } => "create-for-claim",
            Task::CreateWarm { .. } => "create-warm",
            Task::AssignAddresses { .. } => "assign-addresses",
            Task::Undrain { .. } => "undrain",
            Task::Drain { .. } => "drain",
            Task::ReleaseNode { .. } => "release-node",
            Task::DeleteLeaked { .. } => "delete-leaked",
        }
    }
}
