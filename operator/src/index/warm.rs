//! EniPolicies' warm ENIs (`warmEnis`): for each policy that keeps some,
//! and each zone it may have ENIs in, that many free ENIs made for it
//! (marked with it in the spec, `EniSpec::policy`) across the nodes there
//! that serve DRA claims, so that its pods' claims find one made.
//!
//! - **Short** (counting creates under way): made on the roomiest such
//!   node of the zone, after the pass's claims (a waiting pod first).
//! - **Above the count** at every pass for `drain_delay` (a pod's ENI came
//!   back free): the last attached go. The (policy, zone) is tracked in
//!   [`super::Planned::surplus`] under [`surplus_key`], beside the nodes.
//! - **Kept for nothing:** a free ENI kept for a policy that keeps none now
//!   (deleted, `warmEnis: 0`, other groups or subnets, a zone it no longer
//!   names), or on a node no longer serving claims, goes at once.
//! - A held ENI is never drained: its pod keeps it, and it counts again
//!   once free.
//!
//! Zones: those the policy's subnets name; without subnets, every zone
//! with a node serving claims (each ENI in its node pool's subnet).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::node_plan::Placed;
use super::plan::{claim_nodes, free_in, groups_of, same_groups, serves_claims, wanted, Room};
use super::{Index, MadeFor, Phase, WarmPool};

/// What the pass does for the policies' warm ENIs.
#[derive(Debug, Default)]
pub(super) struct WarmPlan {
    /// ENIs to make, by node.
    pub make: HashMap<String, Vec<Placed>>,
    /// Free ENIs kept warm to drain, by node.
    pub drain: HashMap<String, Vec<String>>,
    /// The (policy, zone)s above their count in this pass, as
    /// [`surplus_key`]s.
    pub surplus: BTreeSet<String>,
}

/// The key a (policy, zone) above its count is tracked under, beside the
/// node names in [`super::Input::surplus_since`] (a node name has no `/`).
pub fn surplus_key(policy: &str, zone: &str) -> String {
    format!("enipolicy/{policy}/{zone}")
}

/// The key under which a refusal of `policy`'s warm ENIs stands in
/// [`super::Input::refused`] (beside claim uids): none is made meanwhile.
pub fn warm_refused_key(policy: &str) -> String {
    format!("enipolicy/{policy}")
}

/// A free ENI kept for a policy, where it is.
struct Kept<'i> {
    node: &'i str,
    id: &'i str,
    device_index: Option<u32>,
}

/// The warm ENIs' tasks of this pass (nothing while the policies are not
/// known). `room` is shared with the claims placed before.
pub(super) fn plan_warm<'i>(index: &'i Index<'i>, room: &mut Room<'i>) -> WarmPlan {
    let mut out = WarmPlan::default();
    let Some(pools) = index.warm else {
        return out;
    };
    let by_policy: HashMap<&str, &WarmPool> =
        pools.iter().map(|p| (p.policy.as_str(), p)).collect();
    // Free kept ENIs by (policy, zone), and creates under way.
    let mut free: BTreeMap<(&str, &str), Vec<Kept>> = BTreeMap::new();
    let mut coming: HashMap<(&str, &str), usize> = HashMap::new();
    for e in &index.nodes {
        let (Phase::Live, Some(set), Some(pool)) = (e.phase, e.set, e.serving.pool()) else {
            continue;
        };
        let zone = e.instance.zone.as_str();
        for i in &set.spec.intents {
            if let Some(p) = &i.policy {
                *coming.entry((p.as_str(), zone)).or_default() += 1;
            }
        }
        for s in &set.spec.enis {
            let Some(p) = s.policy.as_deref() else {
                continue;
            };
            if !free_in(set, s) {
                continue;
            }
            let kept = Kept {
                node: e.name,
                id: &s.id,
                device_index: s.device_index,
            };
            // Still what its policy keeps here?
            let as_kept = serves_claims(set)
                .then(|| by_policy.get(p))
                .flatten()
                .and_then(|w| wanted(pool, &w.want, zone))
                .is_some_and(|(subnet, groups)| {
                    s.subnet == subnet && same_groups(groups_of(s, &set.spec), &groups)
                });
            match as_kept {
                true => free.entry((p, zone)).or_default().push(kept),
                false => out
                    .drain
                    .entry(e.name.to_string())
                    .or_default()
                    .push(s.id.clone()),
            }
        }
    }
    for pool in pools {
        let refused = index.refused.contains_key(&warm_refused_key(&pool.policy));
        for zone in zones_of(index, pool) {
            let key = (pool.policy.as_str(), zone);
            let kept = free.remove(&key).unwrap_or_default();
            let have = kept.len() + coming.get(&key).copied().unwrap_or(0);
            if have < pool.count && !refused {
                for _ in have..pool.count {
                    let Some((node, subnet, groups)) = room.take(index, &pool.want, Some(zone))
                    else {
                        break;
                    };
                    out.make.entry(node.to_string()).or_default().push((
                        MadeFor::Policy(pool.policy.clone()),
                        subnet,
                        groups,
                    ));
                }
            } else if have > pool.count && !kept.is_empty() {
                let key = surplus_key(&pool.policy, zone);
                let due = index.surplus_lasted(&key);
                out.surplus.insert(key);
                if due {
                    drain_last(kept, have - pool.count, &mut out);
                }
            }
        }
    }
    out
}

/// The zones `pool` keeps ENIs in: its subnets', else those of the nodes
/// serving claims.
fn zones_of<'i>(index: &'i Index<'i>, pool: &'i WarmPool) -> BTreeSet<&'i str> {
    match pool.want.subnets.is_empty() {
        false => pool.want.subnets.iter().map(|z| z.zone.as_str()).collect(),
        true => claim_nodes(index)
            .map(|(e, _)| e.instance.zone.as_str())
            .collect(),
    }
}

/// Drains `n` of `kept`, the last attached first (as a node's pool does),
/// then by node and id: the same choice every pass.
fn drain_last(mut kept: Vec<Kept>, n: usize, out: &mut WarmPlan) {
    kept.sort_by(|a, b| (b.device_index, b.node, b.id).cmp(&(a.device_index, a.node, a.id)));
    for k in kept.into_iter().take(n) {
        out.drain
            .entry(k.node.to_string())
            .or_default()
            .push(k.id.to_string());
    }
}
