//! Secondary-mode policies that name security groups (and, if they like,
//! subnets): their pods get an address (`enim.io/ip`) on nodes whose ENIs
//! carry exactly those groups. Such nodes are those of the operator's
//! secondary pools made with those groups, so the webhook steers the pod
//! there with a required node affinity, and the node's device plugin and
//! agent serve it as any secondary pod.
//!
//! A node belongs to the first pool, in the config's order, whose selector
//! matches it ([`crate::index`]'s pools), so a pool's nodes are those its
//! selector matches and no earlier pool's does. As node selector terms
//! (ORed, each an AND of requirements), "not an earlier pool's" is, for
//! each earlier pool that can share a node with this one, one of its
//! labels `NotIn` its value: one term per choice. Pure; the same pools
//! always steer the same way.

use std::collections::BTreeSet;

use enim_core::Mode;
use enim_crd::EniPolicySpec;
use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm};

use crate::index::PoolPolicy;

/// The most node selector terms a policy's pools may need; more means
/// pools whose selectors overlap in too many ways to spell out.
pub const MAX_TERMS: usize = 16;

/// Where a secondary policy's pods may run.
#[derive(Debug, Clone, PartialEq)]
pub struct Steering {
    /// The pools whose nodes serve them (`""`: the implicit pool).
    pub pools: Vec<String>,
    /// The nodes of those pools, as terms of a required node affinity;
    /// `None`: every node is one (a pool with no selector that no earlier
    /// pool narrows).
    pub terms: Option<Vec<NodeSelectorTerm>>,
}

/// The nodes `spec`'s pods can get addresses of exactly its groups on
/// (any groups, where it names none), in one of its subnets (any, where
/// it names none), or why none can.
pub fn steer(spec: &EniPolicySpec, pools: &[PoolPolicy]) -> Result<Steering, String> {
    let groups: BTreeSet<&str> = spec.security_groups.iter().map(String::as_str).collect();
    let subnets: BTreeSet<&str> = spec.subnets.iter().map(|z| z.subnet_id.as_str()).collect();
    let mut names = Vec::new();
    let mut terms = Vec::new();
    let mut everywhere = false;
    for (i, pool) in pools.iter().enumerate() {
        let pool_groups: BTreeSet<&str> = pool.security_groups.iter().map(String::as_str).collect();
        let in_subnets = subnets.is_empty()
            || (!pool.subnets.is_empty()
                && pool.subnets.iter().all(|s| subnets.contains(s.as_str())));
        let of_groups = groups.is_empty() || pool_groups == groups;
        if pool.mode != Mode::Secondary || !of_groups || !in_subnets {
            continue;
        }
        match nodes_of(i, pools)? {
            Reach::None => continue,
            Reach::Every => everywhere = true,
            Reach::Terms(t) => terms.extend(t),
        }
        names.push(pool.name.clone());
    }
    if names.is_empty() {
        let secondary: Vec<String> = pools
            .iter()
            .filter(|p| p.mode == Mode::Secondary)
            .map(|p| {
                format!(
                    "{} [{}]{}",
                    pool_name(&p.name),
                    p.security_groups.join(","),
                    if subnets.is_empty() {
                        String::new()
                    } else {
                        format!(" in {}", p.subnets.join(","))
                    }
                )
            })
            .collect();
        return Err(format!(
            "no node pool of the operator in secondary mode has {}{} (its pods' addresses must be on such ENIs); the secondary pools: {}",
            if groups.is_empty() {
                "ENIs".to_string()
            } else {
                format!("exactly its security groups [{}]", spec.security_groups.join(","))
            },
            if subnets.is_empty() {
                String::new()
            } else {
                " in its subnets only".to_string()
            },
            if secondary.is_empty() {
                "none".to_string()
            } else {
                secondary.join("; ")
            }
        ));
    }
    if terms.len() > MAX_TERMS {
        return Err(format!(
            "the nodes of its pools ({}) take {} node selector terms to name (at most {MAX_TERMS}): earlier pools' selectors overlap theirs in too many ways",
            names.join(", "),
            terms.len()
        ));
    }
    Ok(Steering {
        pools: names,
        terms: (!everywhere).then_some(terms),
    })
}

/// How a pool's name reads in a message.
pub fn pool_name(name: &str) -> &str {
    if name.is_empty() {
        "(the top level's)"
    } else {
        name
    }
}

/// The nodes of one pool, as node selector terms.
enum Reach {
    /// An earlier pool takes every node this one's selector matches.
    None,
    Every,
    Terms(Vec<NodeSelectorTerm>),
}

/// The nodes of pool `i`: its selector's labels, and for each earlier
/// pool that can take a node of them, one of that pool's other labels
/// not its value.
fn nodes_of(i: usize, pools: &[PoolPolicy]) -> Result<Reach, String> {
    let own = &pools[i].node_selector;
    let mut choices: Vec<Vec<(&String, &String)>> = Vec::new();
    for earlier in &pools[..i] {
        let sel = &earlier.node_selector;
        // A label both name with different values: no node is in both.
        if sel.iter().any(|(k, v)| own.get(k).is_some_and(|o| o != v)) {
            continue;
        }
        let rest: Vec<(&String, &String)> = sel
            .iter()
            .filter(|(k, v)| own.get(*k) != Some(*v))
            .collect();
        if rest.is_empty() {
            return Ok(Reach::None);
        }
        choices.push(rest);
    }
    if own.is_empty() && choices.is_empty() {
        return Ok(Reach::Every);
    }
    let mut terms: Vec<Vec<NodeSelectorRequirement>> = vec![own.iter().map(in_value).collect()];
    for choice in choices {
        if terms.len() * choice.len() > MAX_TERMS {
            return Err(format!(
                "the nodes of pool {} take over {MAX_TERMS} node selector terms to name: earlier pools' selectors overlap its own in too many ways",
                pool_name(&pools[i].name)
            ));
        }
        terms = terms
            .iter()
            .flat_map(|t| {
                choice.iter().map(move |(k, v)| {
                    let mut t = t.clone();
                    t.push(requirement(k, "NotIn", v));
                    t
                })
            })
            .collect();
    }
    Ok(Reach::Terms(
        terms
            .into_iter()
            .map(|match_expressions| NodeSelectorTerm {
                match_expressions: Some(match_expressions),
                match_fields: None,
            })
            .collect(),
    ))
}

fn in_value((key, value): (&String, &String)) -> NodeSelectorRequirement {
    requirement(key, "In", value)
}

fn requirement(key: &str, operator: &str, value: &str) -> NodeSelectorRequirement {
    NodeSelectorRequirement {
        key: key.to_string(),
        operator: operator.to_string(),
        values: Some(vec![value.to_string()]),
    }
}

/// The pod's required node affinity terms ANDed with `ours`: each of its
/// terms with each of ours (terms are ORed, a term's requirements ANDed);
/// `existing` empty: ours.
pub fn and_terms(
    existing: &[NodeSelectorTerm],
    ours: &[NodeSelectorTerm],
) -> Vec<NodeSelectorTerm> {
    if existing.is_empty() {
        return ours.to_vec();
    }
    existing
        .iter()
        .flat_map(|e| {
            ours.iter().map(move |o| NodeSelectorTerm {
                match_expressions: Some(
                    e.match_expressions
                        .iter()
                        .flatten()
                        .chain(o.match_expressions.iter().flatten())
                        .cloned()
                        .collect(),
                ),
                match_fields: e.match_fields.clone(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests;
