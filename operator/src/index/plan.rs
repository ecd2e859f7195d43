//! [`plan`]: the tasks that bring every node to its watermarks, neediest
//! first. See the module above for the invariants.

use std::collections::{BTreeSet, HashMap, HashSet};

use enim_crd::{EniParameters, EniSpec, NetResourceSetSpec, NetResourceSetStatus};
use enim_provider::cloud::CreatedAt;

use super::node_plan::{plan_gone, Asked, NodePlan, Placed};
use super::{warm, ClaimInfo, Index, MadeFor, NodeEntry, Phase, PoolSettings, SetInfo, Task};

/// Every task of this pass: a node's tasks together and in running order,
/// nodes by deficit descending (surplus last), then leaked ENIs.
pub fn plan(index: &Index) -> Vec<Task> {
    plan_pass(index).tasks
}

/// One pass's plan and what the next pass must know of it.
#[derive(Debug, Default)]
pub struct Planned {
    /// As [`plan`].
    pub tasks: Vec<Task>,
    /// The nodes above their watermarks in this pass, drained or held
    /// back by `drain_delay`: the caller keeps since when each has been
    /// (the next pass's [`super::Input::surplus_since`]).
    pub surplus: BTreeSet<String>,
}

/// [`plan`], with the nodes in surplus.
pub fn plan_pass(index: &Index) -> Planned {
    let mut surplus = BTreeSet::new();
    let mut groups: Vec<(i64, &str, Vec<Task>)> = Vec::new();
    let mut releasing: HashSet<&str> = HashSet::new();
    let mut room = Room::default();
    let mut placed = place_claims(index, &mut room);
    let kept = warm::plan_warm(index, &mut room);
    for (node, made) in kept.make {
        placed.entry(node).or_default().extend(made);
    }
    let mut drain_kept = kept.drain;
    surplus.extend(kept.surplus);
    for e in &index.nodes {
        let mut tasks = Vec::new();
        let need = match e.phase {
            Phase::Gone(since) => {
                plan_gone(index, e, since, &mut tasks, &mut releasing);
                0
            }
            // Unserved or frozen: nothing.
            Phase::New | Phase::Live => match e.serving.pool() {
                Some(pool) => {
                    let asked = Asked {
                        make: placed.remove(e.name).unwrap_or_default(),
                        drain_kept: drain_kept.remove(e.name).unwrap_or_default(),
                    };
                    let planned = NodePlan::new(index, e, pool).run(&mut tasks, asked);
                    if planned.surplus {
                        surplus.insert(e.name.to_string());
                    }
                    planned.need
                }
                None => 0,
            },
        };
        if !tasks.is_empty() {
            groups.push((need, e.name, tasks));
        }
    }
    groups.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(b.1)));
    let mut out: Vec<Task> = groups.into_iter().flat_map(|g| g.2).collect();
    for eni in &index.unclaimed {
        let old_enough = match &eni.created_at {
            CreatedAt::At(t) => index
                .now
                .duration_since(*t)
                .is_ok_and(|age| age >= index.policy.reap_cooldown),
            CreatedAt::Missing | CreatedAt::Unreadable(_) => false,
        };
        if old_enough && !releasing.contains(eni.id.as_str()) {
            out.push(Task::DeleteLeaked {
                eni: eni.id.clone(),
            });
        }
    }
    Planned {
        tasks: out,
        surplus,
    }
}

/// The subnet and groups a claim's ENI gets on a node of `pool` in
/// `zone`: what it asks, else the pool's; `None` when it asks for a subnet
/// per zone and names none for `zone` (its ENI may not go there).
pub(super) fn wanted(
    pool: PoolSettings,
    want: &EniParameters,
    zone: &str,
) -> Option<(String, Vec<String>)> {
    let subnet = match want.subnet_in(zone)? {
        Some(subnet) => subnet.to_string(),
        None => pool.subnet(),
    };
    let groups = match want.security_groups.is_empty() {
        true => pool.security_groups.to_vec(),
        false => want.security_groups.clone(),
    };
    Some((subnet, groups))
}

/// The groups of a spec ENI: its own, else its node's.
pub(super) fn groups_of<'a>(eni: &'a EniSpec, spec: &'a NetResourceSetSpec) -> &'a [String] {
    match eni.security_groups.is_empty() {
        true => &spec.security_groups,
        false => &eni.security_groups,
    }
}

/// Pending claims no node has a free ENI for, each given to the live node
/// with the most free device slots among those the operator serves (in a
/// pool, not frozen) whose agent serves DRA claims (a device-plugin node,
/// or an agent too old to say, would hold an ENI no claim's pod can use).
/// A claim with an ENI or an intent already (anywhere) gets nothing more:
/// one ENI per claim, whoever made it. What a claim leaves out, its ENI
/// takes from the chosen node's pool.
fn place_claims<'i>(index: &'i Index<'i>, room: &mut Room<'i>) -> HashMap<String, Vec<Placed>> {
    let mut placed: HashMap<String, Vec<Placed>> = HashMap::new();
    let asking = asking_claims(index);
    // Most resyncs have none: then nothing below is worth computing.
    if asking.is_empty() {
        return placed;
    }
    let served = claimed_uids(index);
    for (c, want) in asking {
        let uid = c.claim.uid.as_str();
        if served.contains(uid) || want.check().is_err() || index.refused.contains_key(uid) {
            continue;
        }
        if free_match_exists(index, want) {
            continue;
        }
        let Some((node, subnet, groups)) = room.take(index, want, None) else {
            continue;
        };
        placed.entry(node.to_string()).or_default().push((
            MadeFor::Claim(c.claim.clone()),
            subnet,
            groups,
        ));
    }
    placed
}

/// The device slots left on each node a claim's (or a policy's) ENI may
/// go to, counted once per pass, on first use, and taken as ENIs are
/// placed.
#[derive(Default)]
pub(super) struct Room<'i> {
    /// Slots left, node, its pool, its zone.
    nodes: Option<Vec<(usize, &'i str, PoolSettings<'i>, &'i str)>>,
}

impl<'i> Room<'i> {
    /// Takes a slot for an ENI of `want` (in `zone` only, if given): the
    /// node with the most room where `want` may go, then by name (the same
    /// choice every pass). Returns the node and the ENI's subnet and
    /// groups there; `None` when no such node has room.
    pub(super) fn take(
        &mut self,
        index: &'i Index<'i>,
        want: &EniParameters,
        zone: Option<&str>,
    ) -> Option<(&'i str, String, Vec<String>)> {
        let nodes = self.nodes.get_or_insert_with(|| {
            claim_nodes(index)
                .map(|(e, pool)| {
                    let left = NodePlan::new(index, e, pool).slots().left();
                    (left, e.name, pool, e.instance.zone.as_str())
                })
                .collect()
        });
        nodes.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(b.1)));
        let (best, (subnet, groups)) = nodes
            .iter_mut()
            .filter(|r| r.0 > 0 && zone.is_none_or(|z| z == r.3))
            .find_map(|r| {
                let got = wanted(r.2, want, r.3)?;
                Some((r, got))
            })?;
        best.0 -= 1;
        Some((best.1, subnet, groups))
    }
}

/// Pending claims that ask for an ENI the operator could make.
fn asking_claims<'i>(index: &Index<'i>) -> Vec<(&'i ClaimInfo, &'i EniParameters)> {
    index
        .claims
        .unwrap_or_default()
        .iter()
        .filter(|c| c.pending)
        .filter_map(|c| Some((c, c.want.as_ref()?)))
        .collect()
}

/// The uids of the claims an ENI, or an intent to make one, is for.
fn claimed_uids<'i>(index: &Index<'i>) -> HashSet<&'i str> {
    let mut served: HashSet<&str> = HashSet::new();
    for set in index.nodes.iter().filter_map(|e| e.set) {
        let enis = set.spec.enis.iter().filter_map(|s| s.claim.as_ref());
        let intents = set.spec.intents.iter().filter_map(|i| i.claim.as_ref());
        served.extend(enis.chain(intents).map(|c| c.uid.as_str()));
    }
    served
}

/// Pending claims that get nothing from `tasks` (the plan of `index`):
/// no ENI or intent is theirs, no free ENI matches them, and the plan
/// makes none for them. Each with why, for the claim's owner to read.
pub fn unservable_claims(index: &Index, tasks: &[Task]) -> Vec<(ClaimInfo, String)> {
    let asking = asking_claims(index);
    if asking.is_empty() {
        return Vec::new();
    }
    let served = claimed_uids(index);
    let placed: HashSet<&str> = tasks
        .iter()
        .filter_map(|t| match t {
            Task::CreateForClaim { claim, .. } => Some(claim.uid.as_str()),
            _ => None,
        })
        .collect();
    let why = |c: &ClaimInfo, want: &EniParameters| {
        if let Err(e) = want.check() {
            return format!("its enim.io parameters cannot be served: {e}");
        }
        if let Some(error) = index.refused.get(&c.claim.uid) {
            return format!(
                "the cloud refused to make its ENI (tried again within {} s): {error}",
                crate::policy::refusals::CLAIM_RETRY.as_secs()
            );
        }
        let mut nodes = claim_nodes(index).peekable();
        if nodes.peek().is_none() {
            return "no live node the operator serves has an agent serving DRA claims".into();
        }
        if !nodes.any(|(e, pool)| wanted(pool, want, &e.instance.zone).is_some()) {
            let zones: Vec<&str> = want.subnets.iter().map(|z| z.zone.as_str()).collect();
            return format!(
                "no live node the operator serves with an agent serving DRA claims is in a zone its subnets name ({})",
                zones.join(", ")
            );
        }
        "no node the operator serves has a free device slot for another ENI".into()
    };
    asking
        .into_iter()
        .filter(|(c, _)| {
            let uid = c.claim.uid.as_str();
            !served.contains(uid) && !placed.contains(uid)
        })
        .filter(|(_, want)| !free_match_exists(index, want))
        .map(|(c, want)| (c.clone(), why(c, want)))
        .collect()
}

/// The live nodes a claim's ENI may go to, with their pools: served by the
/// operator, their agent serving DRA claims.
pub(super) fn claim_nodes<'i, 'a>(
    index: &'i Index<'a>,
) -> impl Iterator<Item = (&'i NodeEntry<'a>, PoolSettings<'a>)> {
    index
        .nodes
        .iter()
        .filter(|e| e.phase == Phase::Live && e.set.is_some_and(serves_claims))
        .filter_map(|e| Some((e, e.serving.pool()?)))
}

/// Whether the set's agent says it serves DRA claims.
pub(super) fn serves_claims(set: &SetInfo) -> bool {
    set.status
        .as_ref()
        .is_some_and(NetResourceSetStatus::serves_claims)
}

/// Whether two lists of security groups name the same groups, in any
/// order.
pub(super) fn same_groups(a: &[String], b: &[String]) -> bool {
    a.iter().collect::<BTreeSet<_>>() == b.iter().collect::<BTreeSet<_>>()
}

/// Whether `eni` of `set` is free for a claim: made for no claim, held by
/// no pod, not draining.
pub(super) fn free_in(set: &SetInfo, eni: &EniSpec) -> bool {
    let held = set
        .status
        .as_ref()
        .is_some_and(|st| st.used.iter().any(|u| u.eni == eni.id));
    eni.claim.is_none() && !held && !set.spec.draining.contains(&eni.id)
}

/// Whether a live node the operator serves, its agent serving DRA claims,
/// has a free ENI, made for no claim, in the subnet with exactly the
/// groups the claim gets there (`wanted`): the scheduler can give the
/// claim that one (a device-plugin node's ENI is no DRA device).
fn free_match_exists(index: &Index, asked: &EniParameters) -> bool {
    claim_nodes(index)
        .filter_map(|(e, pool)| Some((e.set?, pool, e.instance.zone.as_str())))
        .any(|(set, pool, zone)| {
            let Some((subnet, groups)) = wanted(pool, asked, zone) else {
                return false;
            };
            set.spec.enis.iter().any(|s| {
                free_in(set, s)
                    && s.subnet == subnet
                    && same_groups(groups_of(s, &set.spec), &groups)
            })
        })
}
