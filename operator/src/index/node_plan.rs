//! One node's tasks, for [`plan`](super::plan): a new or live node's
//! [`NodePlan`], phase by phase, and a gone node's release
//! ([`plan_gone`]). Each pushes the node's tasks in the order they must
//! run; the order across nodes is `plan`'s.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::time::SystemTime;

use enim_core::watermarks::Level;
use enim_core::Mode;
use enim_crd::{EniSpec, NetResourceSetSpec, NetResourceSetStatus};
use enim_provider::fleet::{DeleteCheck, FleetEni};

use super::plan::same_groups;
use super::{
    eni_spec, Index, MadeFor, NodeEntry, PoolSettings, Task, Uninstall, ACTION_CREATE_ATTACH,
};

/// An ENI to make on a node for a claim or a policy: whom, subnet, groups.
pub(super) type Placed = (MadeFor, String, Vec<String>);

/// What the pass asks of a node beyond its own watermarks: ENIs to make
/// for claims and policies, and ENIs kept warm for a policy to drain.
#[derive(Debug, Default)]
pub(super) struct Asked {
    pub make: Vec<Placed>,
    pub drain_kept: Vec<String>,
}

/// A gone node past its grace: its ENIs (but those its pods still hold,
/// while its Node exists) leave, a step a listing, then its set goes.
/// `releasing` collects its ENIs, so that the leak reaper skips them.
pub(super) fn plan_gone<'a>(
    index: &Index,
    e: &NodeEntry<'a>,
    since: SystemTime,
    tasks: &mut Vec<Task>,
    releasing: &mut HashSet<&'a str>,
) {
    let due = index
        .now
        .duration_since(since)
        .is_ok_and(|d| d >= index.policy.node_grace);
    let Some(set) = e.set.filter(|_| due) else {
        return;
    };
    // Released for the uninstall hook, and kept: nothing more to do.
    if set.uninstall == Uninstall::Released {
        return;
    }
    // With its Node still there, its pods are too: keep what they hold.
    let held: HashSet<&str> = match (e.node, &set.status) {
        (Some(_), Some(st)) => st.used.iter().map(|u| u.eni.as_str()).collect(),
        _ => HashSet::new(),
    };
    let ids: BTreeSet<&'a str> = set
        .spec
        .enis
        .iter()
        .map(|s| s.id.as_str())
        .chain(e.listed.iter().map(|f| f.id.as_str()))
        .filter(|id| !held.contains(id))
        .collect();
    let mut leaving = Leaving::default();
    for id in &ids {
        leaving.add(&e.listed, id);
    }
    releasing.extend(ids);
    let release_set = held.is_empty() && leaving.detach.is_empty() && leaving.waiting == 0;
    if release_set || !leaving.detach.is_empty() || !leaving.delete.is_empty() {
        tasks.push(Task::ReleaseNode {
            node: e.name.to_string(),
            detach: leaving.detach,
            delete: leaving.delete,
            release_set,
        });
    }
}

/// ENIs leaving the cloud, sorted by what the listing shows of each: the
/// next step of a two-phase detach and delete.
#[derive(Default)]
struct Leaving {
    /// Attached (or attaching): ask for the detach.
    detach: Vec<FleetEni>,
    /// Attached nowhere ([`DeleteCheck::Listed`]: the cloud refuses it if
    /// attached since), or not listed (gone, or retagged: looked at again).
    delete: Vec<(String, DeleteCheck)>,
    /// Detaching: a later listing shows it done.
    waiting: usize,
}

impl Leaving {
    fn add(&mut self, listed: &[&FleetEni], id: &str) {
        match listed.iter().find(|f| f.id == id) {
            Some(f) => match &f.attachment {
                Some(a) if a.detaching() => self.waiting += 1,
                Some(_) => self.detach.push((*f).clone()),
                None => self.delete.push((id.to_string(), DeleteCheck::Listed)),
            },
            None => self.delete.push((id.to_string(), DeleteCheck::SecondLook)),
        }
    }
}

/// The device indexes free on an instance, lowest first.
pub(super) struct Slots(std::vec::IntoIter<u32>);

impl Slots {
    fn next(&mut self) -> Option<u32> {
        self.0.next()
    }
    pub(super) fn left(&self) -> usize {
        self.0.len()
    }
}

/// One live (or new) node's planning, in phases that run in this order
/// (the order its tasks must run in, see [`crate::index`]): the set,
/// finish intents, adopt, reclaim, claims, then grow or drain. Each phase
/// pushes its tasks and hands the later ones what they need of it.
pub(super) struct NodePlan<'i, 'a> {
    index: &'i Index<'a>,
    e: &'i NodeEntry<'a>,
    /// The node's pool: what it is planned with.
    pool: PoolSettings<'a>,
    spec: std::borrow::Cow<'a, NetResourceSetSpec>,
    status: Option<&'a NetResourceSetStatus>,
    name: String,
}

/// What the node's status says is taken.
struct Held<'a> {
    enis: HashSet<&'a str>,
    ips: HashSet<IpAddr>,
    quarantined: HashSet<&'a str>,
    released: HashSet<&'a str>,
}

/// What every phase reads of the node, computed once.
struct Facts<'s> {
    held: Held<'s>,
    /// The spec's ENIs by id.
    in_spec: HashMap<&'s str, &'s EniSpec>,
    secondary: bool,
    /// Secondary addresses an ENI of the instance's type holds.
    per_eni: usize,
    /// Secondary addresses a new ENI is made with (0 in primary mode).
    ips_per_new: usize,
}

/// ENIs and addresses on their way into the spec (intents being
/// finished, adoptions): the watermarks count them as there.
#[derive(Debug, Default, Clone, Copy)]
struct Coming {
    enis: usize,
    ips: usize,
}

/// What the spec lists as draining, as the reclaim phase sorted it.
#[derive(Default)]
struct Draining<'s> {
    /// Spec ENIs being drained.
    ids: HashSet<&'s str>,
    /// Addresses being drained (secondary mode).
    ips: HashSet<IpAddr>,
    /// Drains the agent has not answered, of nothing a pod holds (nor of
    /// a claim's ENI): the first taken back when the node is short.
    undrainable: Vec<&'s str>,
}

/// Where the node stands against its watermarks once planned.
enum Balance {
    /// Short of them by this many ENIs (secondary: addresses).
    Short(usize),
    /// Above them: this many asked back.
    Surplus(usize),
    /// Above them for less than `drain_delay`: nothing asked back yet.
    SurplusHeld,
    Even,
}

/// What a node's plan tells the pass.
pub(super) struct NodeOutcome {
    /// Deficit above zero, surplus below: the pass's order.
    pub need: i64,
    /// Above its watermarks (drained or held back).
    pub surplus: bool,
}

impl<'i, 'a> NodePlan<'i, 'a> {
    pub(super) fn new(index: &'i Index<'a>, e: &'i NodeEntry<'a>, pool: PoolSettings<'a>) -> Self {
        let spec = match e.set {
            Some(s) => std::borrow::Cow::Borrowed(&s.spec),
            None => std::borrow::Cow::Owned(pool.new_spec(e.instance.clone())),
        };
        NodePlan {
            index,
            e,
            pool,
            spec,
            status: e.set.and_then(|s| s.status.as_ref()),
            name: e.name.to_string(),
        }
    }

    fn attached_here(&self, f: &FleetEni) -> bool {
        f.attachment
            .as_ref()
            .is_some_and(|a| a.instance == self.e.instance.id && a.state != "detaching")
    }

    pub(super) fn slots(&self) -> Slots {
        let Some(limits) = self.e.limits else {
            return Slots(Vec::new().into_iter());
        };
        let mut taken: HashSet<u32> = self
            .e
            .listed
            .iter()
            .filter_map(|f| f.attachment.as_ref())
            .filter(|a| a.instance == self.e.instance.id)
            .map(|a| a.device_index)
            .collect();
        taken.extend(self.spec.enis.iter().filter_map(|s| s.device_index));
        let end = u32::try_from(limits.enis).unwrap_or(u32::MAX);
        let free: Vec<u32> = (1..end).filter(|i| !taken.contains(i)).collect();
        Slots(free.into_iter())
    }

    fn held(&self) -> Held<'a> {
        let mut h = Held {
            enis: HashSet::new(),
            ips: HashSet::new(),
            quarantined: HashSet::new(),
            released: HashSet::new(),
        };
        if let Some(st) = self.status {
            for u in &st.used {
                h.enis.insert(u.eni.as_str());
                h.ips.extend(u.ip);
            }
            // Resting their cooldown: not free yet, nor surplus.
            h.ips.extend(st.cooling.iter().copied());
            h.quarantined
                .extend(st.quarantined.iter().map(|q| q.eni.as_str()));
            h.released.extend(st.released.iter().map(String::as_str));
        }
        h
    }

    fn facts(&self) -> Facts<'_> {
        let secondary = self.pool.mode == Mode::Secondary;
        let per_eni = self.e.limits.map_or(0, |l| l.secondary_ipv4_per_eni());
        let pre = self.pool.watermarks.pre_allocate;
        Facts {
            held: self.held(),
            in_spec: self.spec.enis.iter().map(|s| (s.id.as_str(), s)).collect(),
            secondary,
            per_eni,
            ips_per_new: if secondary {
                per_eni.min(usize::try_from(pre.max(1)).unwrap_or(usize::MAX))
            } else {
                0
            },
        }
    }

    /// Pushes the node's tasks (with what the pass `asked` of it), phase
    /// by phase.
    pub(super) fn run(&self, tasks: &mut Vec<Task>, asked: Asked) -> NodeOutcome {
        self.create_or_refresh_set(tasks);
        let facts = self.facts();
        let mut slots = self.slots();
        let (tokens, finishing) = self.finish_intents(&facts, &mut slots, tasks);
        let adopted = self.adopt(&facts, &tokens, tasks);
        let draining = self.reclaim(&facts, tasks);
        let claimed = self.serve_claims(asked, &facts, &draining, &mut slots, tasks);
        let coming = Coming {
            enis: finishing.enis + adopted.enis,
            ips: finishing.ips + adopted.ips,
        };
        let need = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        let balance = self.grow_or_drain(&facts, &draining, coming, &mut slots, tasks);
        NodeOutcome {
            need: match balance {
                Balance::Short(want) => need(want + claimed),
                Balance::Surplus(drained) => -need(drained),
                Balance::SurplusHeld | Balance::Even => need(claimed),
            },
            surplus: matches!(balance, Balance::Surplus(_) | Balance::SurplusHeld),
        }
    }

    /// The set: the first one of a new node, or its pool's current fields
    /// and an instance type learnt late.
    fn create_or_refresh_set(&self, tasks: &mut Vec<Task>) {
        match self.e.set {
            None => tasks.push(Task::CreateSet {
                node: self.name.clone(),
                spec: self.spec.as_ref().clone(),
            }),
            Some(_) if !self.pool.matches(&self.spec) => tasks.push(Task::RefreshPolicy {
                node: self.name.clone(),
            }),
            Some(_) => {}
        }
        if self.e.late_type {
            tasks.push(Task::FillInstanceType {
                node: self.name.clone(),
                instance_type: self.e.instance.instance_type.clone(),
            });
        }
    }

    /// Intents a crashed or deposed leader left: each finished with its
    /// token, or dropped when it cannot be. Returns every create+attach
    /// token (their ENIs are not adopted) and what the finished ones add.
    fn finish_intents<'s>(
        &'s self,
        facts: &Facts<'s>,
        slots: &mut Slots,
        tasks: &mut Vec<Task>,
    ) -> (HashSet<&'s str>, Coming) {
        let by_token: HashMap<&str, &FleetEni> = self
            .e
            .listed
            .iter()
            .filter_map(|f| f.intent.as_deref().map(|t| (t, *f)))
            .collect();
        let mut tokens: HashSet<&str> = HashSet::new();
        let mut finishing = Coming::default();
        for intent in self
            .spec
            .intents
            .iter()
            .filter(|i| i.action == ACTION_CREATE_ATTACH)
        {
            let token = intent.client_token.as_str();
            tokens.insert(token);
            let made = by_token.get(token).copied();
            let drop = || Task::DropIntent {
                node: self.name.clone(),
                token: token.to_string(),
            };
            let device_index = match made {
                Some(m) if facts.in_spec.contains_key(m.id.as_str()) => {
                    tasks.push(drop());
                    continue;
                }
                Some(m) if self.attached_here(m) => None,
                Some(m) if m.attachment.is_some() => {
                    tasks.push(drop());
                    continue;
                }
                _ => match slots.next() {
                    Some(i) => Some(i),
                    None => {
                        tasks.push(drop());
                        continue;
                    }
                },
            };
            finishing.enis += 1;
            finishing.ips += made.map_or(facts.ips_per_new, |m| m.secondary_ips.len());
            tasks.push(Task::FinishIntent {
                node: self.name.clone(),
                token: token.to_string(),
                made: made.cloned(),
                device_index,
                secondary_ipv4: facts.ips_per_new,
            });
        }
        (tokens, finishing)
    }

    /// What the cloud shows here that the spec lacks: ENIs attached here
    /// and tagged for this instance by no intent of `tokens` and, in
    /// secondary mode, addresses of spec ENIs. Returns what they add.
    fn adopt(&self, facts: &Facts, tokens: &HashSet<&str>, tasks: &mut Vec<Task>) -> Coming {
        let enis: Vec<EniSpec> = self
            .e
            .listed
            .iter()
            .filter(|f| self.attached_here(f))
            .filter(|f| f.node.as_deref() == Some(self.e.instance.id.as_str()))
            .filter(|f| !facts.in_spec.contains_key(f.id.as_str()))
            .filter(|f| f.intent.as_deref().is_none_or(|t| !tokens.contains(t)))
            .map(|f| {
                // Its groups as the cloud lists them, when not the pool's:
                // the agent publishes what the spec says.
                let mut s = eni_spec(f);
                s.security_groups.clone_from(&f.security_groups);
                if self.of_pool(&s) {
                    s.security_groups.clear();
                }
                s
            })
            .collect();
        let mut addresses: Vec<(String, Vec<IpAddr>)> = Vec::new();
        if facts.secondary {
            for f in &self.e.listed {
                if let Some(s) = facts.in_spec.get(f.id.as_str()) {
                    let known: HashSet<&IpAddr> = s.secondary_ips.iter().collect();
                    let new: Vec<IpAddr> = f
                        .secondary_ips
                        .iter()
                        .filter(|ip| !known.contains(ip))
                        .copied()
                        .collect();
                    if !new.is_empty() {
                        addresses.push((f.id.clone(), new));
                    }
                }
            }
        }
        let adopted = Coming {
            enis: enis.len(),
            ips: enis.iter().map(|a| a.secondary_ips.len()).sum::<usize>()
                + addresses.iter().map(|(_, v)| v.len()).sum::<usize>(),
        };
        if !enis.is_empty() || !addresses.is_empty() {
            tasks.push(Task::Adopt {
                node: self.name.clone(),
                enis,
                addresses,
            });
        }
        adopted
    }

    /// The released side of the drain handshake: what the agent released
    /// and no pod holds leaves (a step a listing), drains that name nothing
    /// go. Returns what is draining, for the later phases.
    fn reclaim<'s>(&'s self, facts: &Facts<'s>, tasks: &mut Vec<Task>) -> Draining<'s> {
        let held = &facts.held;
        let ip_owner: HashMap<IpAddr, &str> = self
            .spec
            .enis
            .iter()
            .flat_map(|s| s.secondary_ips.iter().map(move |ip| (*ip, s.id.as_str())))
            .collect();
        let (mut leaving, mut stale) = (Leaving::default(), Vec::new());
        let mut addresses: Vec<(String, Vec<IpAddr>)> = Vec::new();
        let mut draining = Draining::default();
        for d in &self.spec.draining {
            let released = held.released.contains(d.as_str());
            if let Some(s) = facts.in_spec.get(d.as_str()) {
                draining.ids.insert(d);
                // A claim's or a policy's ENI, or one of groups the pool no
                // longer has, is never taken back for the pool.
                let claimed = s.claim.is_some() || s.policy.is_some() || !self.of_pool(s);
                if released && !held.enis.contains(d.as_str()) {
                    leaving.add(&self.e.listed, d);
                } else if !released && !held.enis.contains(d.as_str()) && !claimed {
                    draining.undrainable.push(d);
                }
            } else if let Some((ip, owner)) = d
                .parse::<IpAddr>()
                .ok()
                .and_then(|ip| ip_owner.get(&ip).map(|o| (ip, *o)))
            {
                draining.ips.insert(ip);
                if released && !held.ips.contains(&ip) {
                    match addresses.iter_mut().find(|(e, _)| e == owner) {
                        Some((_, v)) => v.push(ip),
                        None => addresses.push((owner.to_string(), vec![ip])),
                    }
                } else if !released && !held.ips.contains(&ip) {
                    draining.undrainable.push(d);
                }
            } else {
                stale.push(d.clone());
            }
        }
        if !leaving.detach.is_empty()
            || !leaving.delete.is_empty()
            || !addresses.is_empty()
            || !stale.is_empty()
        {
            tasks.push(Task::Reclaim {
                node: self.name.clone(),
                detach: leaving.detach,
                delete: leaving.delete,
                addresses,
                stale,
            });
        }
        draining
    }

    /// DRA claims and policies' warm ENIs: an ENI for each `asked` to be
    /// made here while slots last, and back to the cloud the ENIs whose
    /// claim is gone (free ones; a held one waits for its pod), those kept
    /// warm that the pass found in excess, and the pool's ENIs of groups
    /// the pool no longer has ([`NodePlan::of_pool`]). Returns how many
    /// were placed.
    fn serve_claims(
        &self,
        asked: Asked,
        facts: &Facts,
        draining: &Draining,
        slots: &mut Slots,
        tasks: &mut Vec<Task>,
    ) -> usize {
        let placed = asked.make.len();
        for (made_for, subnet, security_groups) in asked.make {
            let Some(device_index) = slots.next() else {
                break;
            };
            let node = self.name.clone();
            tasks.push(match made_for {
                MadeFor::Claim(claim) => Task::CreateForClaim {
                    node,
                    claim,
                    subnet,
                    security_groups,
                    device_index,
                },
                MadeFor::Policy(policy) => Task::CreateWarm {
                    node,
                    policy,
                    subnet,
                    security_groups,
                    device_index,
                },
            });
        }
        let mut drain = asked.drain_kept;
        let stale = self.spec.enis.iter().filter(|s| {
            s.claim.is_none()
                && s.policy.is_none()
                && !self.of_pool(s)
                && !facts.held.enis.contains(s.id.as_str())
                && !draining.ids.contains(s.id.as_str())
        });
        drain.extend(stale.map(|s| s.id.clone()));
        if let Some(exists) = &self.index.claim_uids {
            let orphans = self
                .spec
                .enis
                .iter()
                .filter(|s| {
                    s.claim
                        .as_ref()
                        .is_some_and(|c| !exists.contains(c.uid.as_str()))
                })
                .filter(|s| {
                    !facts.held.enis.contains(s.id.as_str())
                        && !draining.ids.contains(s.id.as_str())
                })
                .map(|s| s.id.clone());
            drain.extend(orphans);
        }
        if !drain.is_empty() {
            tasks.push(Task::Drain {
                node: self.name.clone(),
                items: drain,
            });
        }
        placed
    }

    /// Whether `eni` (made for no claim or policy) has the pool's groups:
    /// its own are none (the node's, which are the pool's) or the pool's.
    /// One made before the pool's groups changed (its own pinned then, see
    /// the allocator's `RefreshPolicy`), or adopted with others, is no
    /// pool ENI: a pod asking for the pool's network must not get it.
    fn of_pool(&self, eni: &EniSpec) -> bool {
        let (own, pool) = (&eni.security_groups, self.pool.security_groups);
        // A pool naming no groups takes the cloud's default, whatever it is.
        own.is_empty() || pool.is_empty() || same_groups(own, pool)
    }

    /// The watermarks, over the pool (spec ENIs neither draining,
    /// quarantined nor made for a claim or a policy: those are theirs,
    /// neither pool nor surplus; nor of groups the pool no longer has) and
    /// what is `coming`: grow a node short of them, drain one above them.
    fn grow_or_drain(
        &self,
        facts: &Facts,
        draining: &Draining,
        coming: Coming,
        slots: &mut Slots,
        tasks: &mut Vec<Task>,
    ) -> Balance {
        let held = &facts.held;
        let pool: Vec<&EniSpec> = self
            .spec
            .enis
            .iter()
            .filter(|s| {
                !draining.ids.contains(s.id.as_str())
                    && !held.quarantined.contains(s.id.as_str())
                    && s.claim.is_none()
                    && s.policy.is_none()
                    && self.of_pool(s)
            })
            .collect();
        let (free, total) = if facts.secondary {
            let ips = pool
                .iter()
                .flat_map(|s| s.secondary_ips.iter())
                .filter(|ip| !draining.ips.contains(ip));
            let (mut free, mut total) = (0, 0);
            for ip in ips {
                total += 1;
                free += usize::from(!held.ips.contains(ip));
            }
            (free + coming.ips, total + coming.ips)
        } else {
            let free = pool
                .iter()
                .filter(|s| !held.enis.contains(s.id.as_str()))
                .count();
            (free + coming.enis, pool.len() + coming.enis)
        };
        let wm = self.pool.watermarks;
        let level = Level {
            free,
            total,
            waiting: 0,
        };
        let want = wm.deficit(level);
        if want > 0 {
            self.grow(want, facts, draining, slots, tasks);
            return Balance::Short(want);
        }
        let surplus = wm.surplus(level);
        if surplus > 0 {
            if !self.index.surplus_lasted(self.e.name) {
                return Balance::SurplusHeld;
            }
            let drained = self.drain(surplus, &pool, facts, draining, tasks);
            if drained > 0 {
                return Balance::Surplus(drained);
            }
        }
        Balance::Even
    }

    /// Short by `want` ENIs (secondary: addresses): drains not answered
    /// yet are taken back first, then addresses go onto ENIs with room
    /// (secondary mode), then new ENIs are made.
    fn grow(
        &self,
        want: usize,
        facts: &Facts,
        draining: &Draining,
        slots: &mut Slots,
        tasks: &mut Vec<Task>,
    ) {
        let undrain: Vec<String> = draining
            .undrainable
            .iter()
            .take(want)
            .map(|d| d.to_string())
            .collect();
        let mut rem = want - undrain.len();
        if !undrain.is_empty() {
            tasks.push(Task::Undrain {
                node: self.name.clone(),
                items: undrain,
            });
        }
        if facts.secondary {
            rem = self.assign(tasks, rem, facts.per_eni, &draining.ids, &facts.held);
        }
        self.create(tasks, rem, facts.per_eni, facts.secondary, slots);
    }

    /// `surplus` free ENIs of `pool` (secondary: addresses) asked back,
    /// the last attached (secondary: assigned) first; how many.
    fn drain(
        &self,
        surplus: usize,
        pool: &[&EniSpec],
        facts: &Facts,
        draining: &Draining,
        tasks: &mut Vec<Task>,
    ) -> usize {
        let held = &facts.held;
        let items: Vec<String> = if facts.secondary {
            let mut ips: Vec<IpAddr> = pool
                .iter()
                .flat_map(|s| s.secondary_ips.iter().copied())
                .filter(|ip| !draining.ips.contains(ip) && !held.ips.contains(ip))
                .collect();
            ips.reverse();
            ips.into_iter()
                .take(surplus)
                .map(|ip| ip.to_string())
                .collect()
        } else {
            let mut free: Vec<&EniSpec> = pool
                .iter()
                .copied()
                .filter(|s| !held.enis.contains(s.id.as_str()))
                .collect();
            free.sort_by(|a, b| (b.device_index, &b.id).cmp(&(a.device_index, &a.id)));
            free.into_iter()
                .take(surplus)
                .map(|s| s.id.clone())
                .collect()
        };
        let drained = items.len();
        if drained > 0 {
            tasks.push(Task::Drain {
                node: self.name.clone(),
                items,
            });
        }
        drained
    }

    /// Secondary mode: addresses onto spec ENIs with room; what is left.
    fn assign(
        &self,
        tasks: &mut Vec<Task>,
        mut rem: usize,
        per_eni: usize,
        draining: &HashSet<&str>,
        held: &Held,
    ) -> usize {
        let listed: HashMap<&str, usize> = self
            .e
            .listed
            .iter()
            .map(|f| (f.id.as_str(), f.secondary_ips.len()))
            .collect();
        for s in &self.spec.enis {
            if rem == 0 {
                break;
            }
            if draining.contains(s.id.as_str()) || held.quarantined.contains(s.id.as_str()) {
                continue;
            }
            let has = s
                .secondary_ips
                .len()
                .max(listed.get(s.id.as_str()).copied().unwrap_or(0));
            let n = per_eni.saturating_sub(has).min(rem);
            if n > 0 {
                rem -= n;
                tasks.push(Task::AssignAddresses {
                    node: self.name.clone(),
                    eni: s.id.clone(),
                    count: n,
                });
            }
        }
        rem
    }

    /// New ENIs for `rem` ENIs (secondary: addresses), within the slots.
    fn create(
        &self,
        tasks: &mut Vec<Task>,
        rem: usize,
        per_eni: usize,
        secondary: bool,
        slots: &mut Slots,
    ) {
        if rem == 0 || slots.left() == 0 {
            return;
        }
        if !secondary {
            let device_indexes: Vec<u32> = (0..rem).map_while(|_| slots.next()).collect();
            tasks.push(Task::CreateEnis {
                node: self.name.clone(),
                device_indexes,
                secondary_ipv4: 0,
            });
            return;
        }
        if per_eni == 0 {
            return;
        }
        // Full ENIs, then one with the remainder.
        let (full, part) = (rem / per_eni, rem % per_eni);
        for (n, ips) in [(full, per_eni), (usize::from(part > 0), part)] {
            let device_indexes: Vec<u32> = (0..n).map_while(|_| slots.next()).collect();
            if !device_indexes.is_empty() {
                tasks.push(Task::CreateEnis {
                    node: self.name.clone(),
                    device_indexes,
                    secondary_ipv4: ips,
                });
            }
        }
    }
}
