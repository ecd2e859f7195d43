//! [`plan`]: the tasks that bring every node to its watermarks, neediest
//! first. See the module above for the invariants.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::IpAddr;

use enim_crd::{ClaimRef, EniParameters, EniSpec, Mode, NetResourceSetSpec, NetResourceSetStatus};
use enim_provider::cloud::CreatedAt;
use enim_provider::fleet::{DeleteCheck, FleetEni};

use super::{eni_spec, Index, NodeEntry, Phase, Task, ACTION_CREATE_ATTACH};

/// Every task of this pass: a node's tasks together and in running order,
/// nodes by deficit descending (surplus last), then leaked ENIs.
pub fn plan(index: &Index) -> Vec<Task> {
    let mut groups: Vec<(i64, &str, Vec<Task>)> = Vec::new();
    let mut releasing: HashSet<&str> = HashSet::new();
    let mut placed = place_claims(index);
    for e in &index.nodes {
        let mut tasks = Vec::new();
        let need = match e.phase {
            Phase::Gone(since) => {
                plan_gone(index, e, since, &mut tasks, &mut releasing);
                0
            }
            Phase::New | Phase::Live => {
                let claims = placed.remove(e.name).unwrap_or_default();
                NodePlan::new(index, e).run(&mut tasks, claims)
            }
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
    out
}

/// A claim's ENI to make on a node: the claim, subnet, groups.
type Placed = (ClaimRef, String, Vec<String>);

/// The subnet and groups a claim's ENI gets: what it asks, else the
/// operator's.
fn wanted(index: &Index, want: &EniParameters) -> (String, Vec<String>) {
    let policy = index.policy;
    let subnet = want
        .subnet
        .clone()
        .unwrap_or_else(|| policy.subnets.first().cloned().unwrap_or_default());
    let groups = match want.security_groups.is_empty() {
        true => policy.security_groups.clone(),
        false => want.security_groups.clone(),
    };
    (subnet, groups)
}

/// The groups of a spec ENI: its own, else its node's.
fn groups_of<'a>(eni: &'a EniSpec, spec: &'a NetResourceSetSpec) -> &'a [String] {
    match eni.security_groups.is_empty() {
        true => &spec.security_groups,
        false => &eni.security_groups,
    }
}

/// Pending claims no node has a free ENI for, each given to the live node
/// with the most free device slots. A claim with an ENI or an intent
/// already (anywhere) gets nothing more: one ENI per claim, whoever made it.
fn place_claims(index: &Index) -> HashMap<String, Vec<Placed>> {
    let mut placed: HashMap<String, Vec<Placed>> = HashMap::new();
    let Some(claims) = index.claims else {
        return placed;
    };
    // Most resyncs have none: then nothing below is worth computing.
    let asking: Vec<_> = claims
        .iter()
        .filter(|c| c.pending)
        .filter_map(|c| Some((c, c.want.as_ref()?)))
        .collect();
    if asking.is_empty() {
        return placed;
    }
    let mut served: HashSet<&str> = HashSet::new();
    for e in &index.nodes {
        if let Some(set) = e.set {
            served.extend(
                set.spec
                    .enis
                    .iter()
                    .filter_map(|s| s.claim.as_ref())
                    .map(|c| c.uid.as_str()),
            );
            served.extend(
                set.spec
                    .intents
                    .iter()
                    .filter_map(|i| i.claim.as_ref())
                    .map(|c| c.uid.as_str()),
            );
        }
    }
    let mut room: Vec<(usize, &str)> = index
        .nodes
        .iter()
        .filter(|e| e.phase == Phase::Live && e.set.is_some())
        .map(|e| (NodePlan::new(index, e).slots().left(), e.name))
        .collect();
    for (c, want) in asking {
        if served.contains(c.claim.uid.as_str()) {
            continue;
        }
        let (subnet, groups) = wanted(index, want);
        if free_match_exists(index, &subnet, &groups) {
            continue;
        }
        // Most room first, then by name: the same choice every resync.
        room.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(b.1)));
        let Some(best) = room.first_mut().filter(|r| r.0 > 0) else {
            continue;
        };
        best.0 -= 1;
        placed
            .entry(best.1.to_string())
            .or_default()
            .push((c.claim.clone(), subnet, groups));
    }
    placed
}

/// Whether a live node has a free ENI, made for no claim, in `subnet`
/// with exactly `groups`: the scheduler can give the claim that one.
fn free_match_exists(index: &Index, subnet: &str, groups: &[String]) -> bool {
    let want: BTreeSet<&str> = groups.iter().map(String::as_str).collect();
    index
        .nodes
        .iter()
        .filter(|e| e.phase == Phase::Live)
        .filter_map(|e| e.set)
        .any(|set| {
            let st = set.status.as_ref();
            let held = |id: &str| st.is_some_and(|st| st.used.iter().any(|u| u.eni == id));
            set.spec.enis.iter().any(|s| {
                s.claim.is_none()
                    && s.subnet == subnet
                    && groups_of(s, &set.spec)
                        .iter()
                        .map(String::as_str)
                        .collect::<BTreeSet<_>>()
                        == want
                    && !held(&s.id)
                    && !set.spec.draining.contains(&s.id)
            })
        })
}

fn plan_gone<'a>(
    index: &Index,
    e: &NodeEntry<'a>,
    since: std::time::SystemTime,
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
struct Slots(std::vec::IntoIter<u32>);

impl Slots {
    fn next(&mut self) -> Option<u32> {
        self.0.next()
    }
    fn left(&self) -> usize {
        self.0.len()
    }
}

/// One live (or new) node's planning.
struct NodePlan<'i, 'a> {
    index: &'i Index<'a>,
    e: &'i NodeEntry<'a>,
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

impl<'i, 'a> NodePlan<'i, 'a> {
    fn new(index: &'i Index<'a>, e: &'i NodeEntry<'a>) -> Self {
        let spec = match e.set {
            Some(s) => std::borrow::Cow::Borrowed(&s.spec),
            None => std::borrow::Cow::Owned(index.policy.new_spec(e.instance.clone())),
        };
        NodePlan {
            index,
            e,
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

    fn slots(&self) -> Slots {
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
            h.quarantined
                .extend(st.quarantined.iter().map(|q| q.eni.as_str()));
            h.released.extend(st.released.iter().map(String::as_str));
        }
        h
    }

    /// Pushes the node's tasks (with an ENI for each of `claims`); returns
    /// its need (deficit > 0, surplus < 0).
    fn run(&self, tasks: &mut Vec<Task>, claims: Vec<Placed>) -> i64 {
        let name = || self.name.clone();
        let spec = self.spec.as_ref();
        match self.e.set {
            None => tasks.push(Task::CreateSet {
                node: name(),
                spec: spec.clone(),
            }),
            Some(_) if !self.index.policy.matches(spec) => {
                tasks.push(Task::RefreshPolicy { node: name() })
            }
            Some(_) => {}
        }
        let held = self.held();
        let mut slots = self.slots();
        let in_spec: HashMap<&str, &EniSpec> =
            spec.enis.iter().map(|s| (s.id.as_str(), s)).collect();
        let secondary = self.index.policy.mode == Mode::Secondary;
        let per_eni = self.e.limits.map_or(0, |l| l.secondary_ipv4_per_eni());
        let wm = self.index.policy.watermarks;
        let ips_per_new = if secondary {
            per_eni.min(usize::try_from(wm.pre_allocate.max(1)).unwrap_or(usize::MAX))
        } else {
            0
        };

        // 1. Intents a crashed or deposed leader left.
        let by_token: HashMap<&str, &FleetEni> = self
            .e
            .listed
            .iter()
            .filter_map(|f| f.intent.as_deref().map(|t| (t, *f)))
            .collect();
        let mut tokens: HashSet<&str> = HashSet::new();
        let (mut pending, mut pending_ips) = (0usize, 0usize);
        for intent in spec
            .intents
            .iter()
            .filter(|i| i.action == ACTION_CREATE_ATTACH)
        {
            let token = intent.client_token.as_str();
            tokens.insert(token);
            let made = by_token.get(token).copied();
            let drop = || Task::DropIntent {
                node: name(),
                token: token.to_string(),
            };
            let device_index = match made {
                Some(m) if in_spec.contains_key(m.id.as_str()) => {
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
            pending += 1;
            pending_ips += made.map_or(ips_per_new, |m| m.secondary_ips.len());
            tasks.push(Task::FinishIntent {
                node: name(),
                token: token.to_string(),
                made: made.cloned(),
                device_index,
                secondary_ipv4: ips_per_new,
            });
        }

        // 2. What the cloud shows here that the spec lacks.
        let adopted: Vec<EniSpec> = self
            .e
            .listed
            .iter()
            .filter(|f| self.attached_here(f))
            .filter(|f| f.node.as_deref() == Some(self.e.instance.id.as_str()))
            .filter(|f| !in_spec.contains_key(f.id.as_str()))
            .filter(|f| f.intent.as_deref().is_none_or(|t| !tokens.contains(t)))
            .map(|f| eni_spec(f))
            .collect();
        let mut adopted_ips: Vec<(String, Vec<IpAddr>)> = Vec::new();
        if secondary {
            for f in &self.e.listed {
                if let Some(s) = in_spec.get(f.id.as_str()) {
                    let known: HashSet<&IpAddr> = s.secondary_ips.iter().collect();
                    let new: Vec<IpAddr> = f
                        .secondary_ips
                        .iter()
                        .filter(|ip| !known.contains(ip))
                        .copied()
                        .collect();
                    if !new.is_empty() {
                        adopted_ips.push((f.id.clone(), new));
                    }
                }
            }
        }
        let adopted_ip_count: usize = adopted.iter().map(|a| a.secondary_ips.len()).sum::<usize>()
            + adopted_ips.iter().map(|(_, v)| v.len()).sum::<usize>();
        let adopted_enis = adopted.len();
        if !adopted.is_empty() || !adopted_ips.is_empty() {
            tasks.push(Task::Adopt {
                node: name(),
                enis: adopted,
                addresses: adopted_ips,
            });
        }

        // 3. The released side of the drain handshake.
        let ip_owner: HashMap<IpAddr, &str> = spec
            .enis
            .iter()
            .flat_map(|s| s.secondary_ips.iter().map(move |ip| (*ip, s.id.as_str())))
            .collect();
        let (mut reclaim, mut stale) = (Leaving::default(), Vec::new());
        let mut reclaim_ips: Vec<(String, Vec<IpAddr>)> = Vec::new();
        let mut draining_ids: HashSet<&str> = HashSet::new();
        let mut draining_ips: HashSet<IpAddr> = HashSet::new();
        let mut undrainable: Vec<&str> = Vec::new();
        for d in &spec.draining {
            let released = held.released.contains(d.as_str());
            if in_spec.contains_key(d.as_str()) {
                draining_ids.insert(d);
                // A claim's ENI is never taken back for the pool.
                let claimed = in_spec.get(d.as_str()).is_some_and(|s| s.claim.is_some());
                if released && !held.enis.contains(d.as_str()) {
                    reclaim.add(&self.e.listed, d);
                } else if !released && !held.enis.contains(d.as_str()) && !claimed {
                    undrainable.push(d);
                }
            } else if let Some((ip, owner)) = d
                .parse::<IpAddr>()
                .ok()
                .and_then(|ip| ip_owner.get(&ip).map(|o| (ip, *o)))
            {
                draining_ips.insert(ip);
                if released && !held.ips.contains(&ip) {
                    match reclaim_ips.iter_mut().find(|(e, _)| e == owner) {
                        Some((_, v)) => v.push(ip),
                        None => reclaim_ips.push((owner.to_string(), vec![ip])),
                    }
                } else if !released && !held.ips.contains(&ip) {
                    undrainable.push(d);
                }
            } else {
                stale.push(d.clone());
            }
        }
        if !reclaim.detach.is_empty()
            || !reclaim.delete.is_empty()
            || !reclaim_ips.is_empty()
            || !stale.is_empty()
        {
            tasks.push(Task::Reclaim {
                node: name(),
                detach: reclaim.detach,
                delete: reclaim.delete,
                addresses: reclaim_ips,
                stale,
            });
        }

        // 4. DRA claims: an ENI for each placed here, and back to the
        // cloud those whose claim is gone (free ones; a held one waits for
        // its pod).
        let claimed = claims.len();
        for (claim, subnet, security_groups) in claims {
            let Some(device_index) = slots.next() else {
                break;
            };
            tasks.push(Task::CreateForClaim {
                node: name(),
                claim,
                subnet,
                security_groups,
                device_index,
            });
        }
        if let Some(exists) = &self.index.claim_uids {
            let orphans: Vec<String> = spec
                .enis
                .iter()
                .filter(|s| {
                    s.claim
                        .as_ref()
                        .is_some_and(|c| !exists.contains(c.uid.as_str()))
                })
                .filter(|s| {
                    !held.enis.contains(s.id.as_str()) && !draining_ids.contains(s.id.as_str())
                })
                .map(|s| s.id.clone())
                .collect();
            if !orphans.is_empty() {
                tasks.push(Task::Drain {
                    node: name(),
                    items: orphans,
                });
            }
        }

        // 5. The watermarks. An ENI made for a claim is that claim's: it is
        // neither pool nor surplus.
        let live = |s: &&EniSpec| {
            !draining_ids.contains(s.id.as_str())
                && !held.quarantined.contains(s.id.as_str())
                && s.claim.is_none()
        };
        let (free, total) = if secondary {
            let live_ips = spec
                .enis
                .iter()
                .filter(live)
                .flat_map(|s| s.secondary_ips.iter())
                .filter(|ip| !draining_ips.contains(ip));
            let (mut free, mut total) = (0, 0);
            for ip in live_ips {
                total += 1;
                free += usize::from(!held.ips.contains(ip));
            }
            (
                free + adopted_ip_count + pending_ips,
                total + adopted_ip_count + pending_ips,
            )
        } else {
            let live: Vec<&EniSpec> = spec.enis.iter().filter(live).collect();
            let free = live
                .iter()
                .filter(|s| !held.enis.contains(s.id.as_str()))
                .count();
            (
                free + adopted_enis + pending,
                live.len() + adopted_enis + pending,
            )
        };
        let count = |n: u32| usize::try_from(n).unwrap_or(usize::MAX);
        let (pre, min) = (count(wm.pre_allocate), count(wm.min_allocate));
        let high = pre.saturating_add(count(wm.max_above_watermark));
        let want = pre.saturating_sub(free).max(min.saturating_sub(total));
        if want > 0 {
            let mut rem = want;
            let undrain: Vec<String> = undrainable
                .iter()
                .take(rem)
                .map(|d| d.to_string())
                .collect();
            rem -= undrain.len();
            if !undrain.is_empty() {
                tasks.push(Task::Undrain {
                    node: name(),
                    items: undrain,
                });
            }
            if secondary {
                rem = self.assign(tasks, rem, per_eni, &draining_ids, &held);
            }
            self.create(tasks, rem, per_eni, secondary, &mut slots);
            return i64::try_from(want + claimed).unwrap_or(i64::MAX);
        }
        if free > high {
            let surplus = (free - high).min(total.saturating_sub(min));
            let items = if secondary {
                let mut ips: Vec<IpAddr> = spec
                    .enis
                    .iter()
                    .filter(live)
                    .flat_map(|s| s.secondary_ips.iter().copied())
                    .filter(|ip| !draining_ips.contains(ip) && !held.ips.contains(ip))
                    .collect();
                ips.reverse();
                ips.into_iter()
                    .take(surplus)
                    .map(|ip| ip.to_string())
                    .collect()
            } else {
                let mut free: Vec<&EniSpec> = spec
                    .enis
                    .iter()
                    .filter(live)
                    .filter(|s| !held.enis.contains(s.id.as_str()))
                    .collect();
                // The last attached go first.
                free.sort_by(|a, b| (b.device_index, &b.id).cmp(&(a.device_index, &a.id)));
                free.into_iter()
                    .take(surplus)
                    .map(|s| s.id.clone())
                    .collect()
            };
            let items: Vec<String> = items;
            if !items.is_empty() {
                let n = items.len();
                tasks.push(Task::Drain {
                    node: name(),
                    items,
                });
                return -i64::try_from(n).unwrap_or(i64::MAX);
            }
        }
        i64::try_from(claimed).unwrap_or(i64::MAX)
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
