//! Property-style tests: random clusters (a seeded generator, many cases),
//! and what no plan may ever do.

use std::collections::{HashMap, HashSet};

use super::*;

/// xorshift64*: enough randomness for generating clusters, repeatable.
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn chance(&mut self, pct: u64) -> bool {
        self.below(100) < pct
    }
}

fn random_world(g: &mut Gen) -> World {
    let mode = if g.chance(50) {
        Mode::Secondary
    } else {
        Mode::Primary
    };
    let mut w = World::new(mode);
    w.policy.watermarks = Watermarks {
        pre_allocate: u32::try_from(g.below(5)).unwrap(),
        min_allocate: u32::try_from(g.below(4)).unwrap(),
        max_above_watermark: u32::try_from(g.below(3)).unwrap(),
    };
    w.limits.get_mut("m5").unwrap().enis = usize::try_from(2 + g.below(8)).unwrap();
    w.reap = g.chance(50);
    for n in 0..1 + g.below(6) {
        let name = format!("n{n}");
        let k = usize::try_from(g.below(7)).unwrap();
        let ids: Vec<String> = (0..k).map(|i| format!("{name}-e{i}")).collect();
        let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
        w.live(&name, &refs);
        let s = w.set(&name);
        let mut items: Vec<String> = Vec::new();
        for (i, e) in s.spec.enis.iter_mut().enumerate() {
            items.push(e.id.clone());
            if mode == Mode::Secondary {
                for j in 0..g.below(5) {
                    let ip: IpAddr = format!("10.{n}.{i}.{j}").parse().unwrap();
                    e.secondary_ips.push(ip);
                    items.push(ip.to_string());
                }
            }
        }
        // Some kept warm for policy db (a whole ENI each).
        if mode == Mode::Primary {
            for e in s.spec.enis.iter_mut() {
                if g.chance(25) {
                    e.policy = Some("db".into());
                    e.security_groups = vec!["sg-db".into()];
                }
            }
        }
        let enis: Vec<EniSpec> = s.spec.enis.clone();
        // The listing at any step of a detach: attached, detaching,
        // attached nowhere, or gone.
        let prefix = format!("{name}-");
        for l in w.enis.iter_mut().filter(|l| l.id.starts_with(&prefix)) {
            match g.below(8) {
                0 => l.attachment.as_mut().unwrap().state = "detaching".into(),
                1 => l.attachment = None,
                2 => l.id = format!("{}-deleted", l.id),
                _ => {}
            }
        }
        let s = w.set(&name);
        let mut st = NetResourceSetStatus::default();
        for e in &enis {
            if mode == Mode::Primary && g.chance(40) {
                st.used.push(used(&e.id, None));
            }
            for ip in &e.secondary_ips {
                if g.chance(40) {
                    st.used.push(used(&e.id, Some(&ip.to_string())));
                }
            }
            if g.chance(10) {
                st.quarantined.push(Quarantined {
                    eni: e.id.clone(),
                    reason: "x".into(),
                });
            }
        }
        // Drains and releases at random, used ones included: the agent's
        // status may lag or contradict the spec.
        for it in &items {
            if g.chance(30) {
                s.spec.draining.push(it.clone());
            }
            if g.chance(30) {
                st.released.push(it.clone());
            }
        }
        if g.chance(20) {
            s.spec.intents.push(intent(&format!("{name}-t")));
        }
        s.status = Some(st);
        if g.chance(60) {
            super::claims::says_dra(s, true);
        }
        match g.below(10) {
            0 => s.deleting_since = Some(now() - Duration::from_secs(g.below(900))),
            1 => {
                w.nodes.retain(|x| x.name != name);
                w.gone
                    .insert(name.clone(), now() - Duration::from_secs(g.below(900)));
            }
            _ => {}
        }
        // Extra listed ENIs: adoptable, loose, made by the intent.
        for x in 0..g.below(3) {
            let id = format!("{name}-x{x}");
            let dev = u32::try_from(10 + x).unwrap();
            let mut e = match g.below(3) {
                0 => fleet_eni(&id, Some((&name, dev)), Some(&name)),
                1 => fleet_eni(&id, None, Some(&name)),
                _ => fleet_eni(&id, None, None),
            };
            if g.chance(30) {
                e.intent = Some(format!("{name}-t"));
            }
            w.enis.push(e);
        }
    }
    if g.chance(30) {
        w.nodes.push(node("fresh"));
    }
    w.warm = match g.below(3) {
        0 => None,
        1 => Some(Vec::new()),
        _ => Some(vec![WarmPool {
            policy: "db".into(),
            want: enim_crd::EniParameters {
                security_groups: vec!["sg-db".into()],
                ..Default::default()
            },
            count: usize::try_from(1 + g.below(3)).unwrap(),
        }]),
    };
    w
}

/// Everything a task would take from a node (drain, detach, delete,
/// unassign), as ENI ids and addresses.
fn touched(t: &Task) -> Vec<String> {
    match t {
        Task::Drain { items, .. } => items.clone(),
        Task::Reclaim {
            detach,
            delete,
            addresses,
            ..
        } => detach
            .iter()
            .map(|e| e.id.clone())
            .chain(delete.iter().map(|(id, _)| id.clone()))
            .chain(
                addresses
                    .iter()
                    .flat_map(|(_, ips)| ips.iter().map(IpAddr::to_string)),
            )
            .collect(),
        Task::ReleaseNode { detach, delete, .. } => detach
            .iter()
            .map(|e| e.id.clone())
            .chain(delete.iter().map(|(id, _)| id.clone()))
            .collect(),
        Task::DeleteLeaked { eni } => vec![eni.clone()],
        _ => Vec::new(),
    }
}

#[test]
fn no_task_ever_touches_what_a_pod_holds() {
    let mut g = Gen(0x9E37_79B9_7F4A_7C15);
    let mut kinds: HashMap<&str, usize> = HashMap::new();
    for case in 0..3000 {
        let w = random_world(&mut g);
        let tasks = w.plan();
        let node_names: HashSet<&str> = w.nodes.iter().map(|n| n.name.as_str()).collect();
        // Held by pods on nodes that still exist: never taken.
        let mut held: HashSet<String> = HashSet::new();
        for s in &w.sets {
            if !node_names.contains(s.name.as_str()) {
                continue;
            }
            for u in &s.status.as_ref().unwrap().used {
                held.insert(u.eni.clone());
                held.extend(u.ip.map(|ip| ip.to_string()));
            }
        }
        for t in &tasks {
            *kinds.entry(t.kind()).or_default() += 1;
            for x in touched(t) {
                assert!(
                    !held.contains(&x),
                    "case {case}: {t:?} takes {x}, held by a pod"
                );
            }
        }
    }
    // The generator reaches every kind of task that takes something.
    for k in [
        "drain",
        "reclaim",
        "release-node",
        "delete-leaked",
        "undrain",
        "adopt",
        "finish-intent",
        "create-warm",
    ] {
        assert!(kinds.get(k).copied().unwrap_or(0) > 20, "{k}: {kinds:?}");
    }
}

#[test]
fn leaks_are_unattached_unclaimed_and_device_indexes_fit() {
    let mut g = Gen(42);
    for case in 0..3000 {
        let w = random_world(&mut g);
        let tasks = w.plan();
        let in_spec: HashSet<&str> = w
            .sets
            .iter()
            .flat_map(|s| s.spec.enis.iter().map(|e| e.id.as_str()))
            .collect();
        let listed: HashMap<&str, &FleetEni> = w.enis.iter().map(|e| (e.id.as_str(), e)).collect();
        let limit = u32::try_from(w.limits["m5"].enis).unwrap();
        let mut indexes: HashMap<&str, HashSet<u32>> = HashMap::new();
        for t in &tasks {
            match t {
                Task::DeleteLeaked { eni } => {
                    assert!(w.reap, "case {case}");
                    assert!(
                        !in_spec.contains(eni.as_str()),
                        "case {case}: {eni} in a spec"
                    );
                    assert!(
                        listed[eni.as_str()].attachment.is_none(),
                        "case {case}: {eni}"
                    );
                }
                Task::Reclaim { detach, delete, .. } | Task::ReleaseNode { detach, delete, .. } => {
                    // Two phases: a detach for what the listing shows
                    // attached (not detaching), a delete only for what it
                    // shows attached nowhere (no second look) or does not
                    // list (a second look).
                    for e in detach {
                        let a = listed[e.id.as_str()].attachment.as_ref();
                        assert!(a.is_some_and(|a| !a.detaching()), "case {case}: {t:?}");
                    }
                    for (id, check) in delete {
                        let want = match listed.get(id.as_str()) {
                            Some(l) => {
                                assert!(l.attachment.is_none(), "case {case}: {t:?}");
                                DeleteCheck::Listed
                            }
                            None => DeleteCheck::SecondLook,
                        };
                        assert_eq!(*check, want, "case {case}: {t:?}");
                    }
                }
                Task::CreateEnis {
                    node,
                    device_indexes,
                    ..
                } => {
                    assert!(!device_indexes.is_empty(), "case {case}: {t:?}");
                    for i in device_indexes {
                        assert!(*i >= 1 && *i < limit, "case {case}: {t:?}");
                        assert!(
                            indexes.entry(node).or_default().insert(*i),
                            "case {case}: {t:?}"
                        );
                    }
                }
                Task::FinishIntent {
                    node,
                    device_index: Some(i),
                    ..
                } => {
                    assert!(*i >= 1 && *i < limit, "case {case}: {t:?}");
                    assert!(
                        indexes.entry(node).or_default().insert(*i),
                        "case {case}: {t:?}"
                    );
                }
                _ => {}
            }
        }
        // Never onto an index an ENI of the node holds.
        for (node, new) in indexes {
            let set = w.sets.iter().find(|s| s.name == node);
            let taken: HashSet<u32> = set
                .into_iter()
                .flat_map(|s| s.spec.enis.iter().filter_map(|e| e.device_index))
                .chain(
                    w.enis
                        .iter()
                        .filter_map(|e| e.attachment.as_ref())
                        .filter(|a| a.instance == inst(node))
                        .map(|a| a.device_index),
                )
                .collect();
            assert!(
                taken.is_disjoint(&new),
                "case {case}: {node}: {new:?} vs {taken:?}"
            );
        }
        // A node's tasks are together.
        let mut seen: Vec<&str> = Vec::new();
        for n in tasks.iter().filter_map(Task::node) {
            if seen.last() != Some(&n) {
                assert!(!seen.contains(&n), "case {case}: {n}'s tasks are split");
                seen.push(n);
            }
        }
    }
}
