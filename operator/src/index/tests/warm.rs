//! EniPolicies' warm ENIs in the plan: kept at the policy's count in each
//! zone, made only where claims are served, never the node pool's, and
//! taken back when in excess (after `drain_delay`) or kept for nothing.

use super::claims::{in_zone, live_dra, pending, says_dra};
use super::*;
use crate::index::{surplus_key, warm_refused_key};
use enim_crd::{EniParameters, ZoneSubnet};

/// Policy `db`: groups `sg-db`, `count` warm in each zone of `subnets`.
fn db(count: usize, subnets: &[(&str, &str)]) -> WarmPool {
    WarmPool {
        policy: "db".into(),
        want: EniParameters {
            security_groups: vec!["sg-db".into()],
            subnets: subnets
                .iter()
                .map(|(zone, subnet)| ZoneSubnet {
                    zone: zone.to_string(),
                    subnet_id: subnet.to_string(),
                })
                .collect(),
            ..EniParameters::default()
        },
        count,
    }
}

/// Spec ENI `id` on `node`, kept for `db` in `subnet` (free).
fn kept(w: &mut World, node: &str, id: &str, device_index: u32, subnet: &str) {
    let mut s = spec_eni(id, device_index);
    s.policy = Some("db".into());
    s.subnet = subnet.into();
    s.security_groups = vec!["sg-db".into()];
    w.set(node).spec.enis.push(s);
}

/// The (node, subnet, device index) of each warm create, for `db`.
fn made(tasks: &[Task]) -> Vec<(&str, &str, u32)> {
    tasks
        .iter()
        .filter_map(|t| match t {
            Task::CreateWarm {
                node,
                policy,
                subnet,
                security_groups,
                device_index,
            } => {
                assert_eq!(policy, "db");
                assert_eq!(security_groups, &["sg-db".to_string()]);
                Some((node.as_str(), subnet.as_str(), *device_index))
            }
            _ => None,
        })
        .collect()
}

/// What each node is asked to drain.
fn drained(tasks: &[Task]) -> Vec<(&str, &[String])> {
    tasks
        .iter()
        .filter_map(|t| match t {
            Task::Drain { node, items } => Some((node.as_str(), items.as_slice())),
            _ => None,
        })
        .collect()
}

#[test]
fn a_policy_keeps_its_warm_enis_in_each_zone_it_names_in_that_zones_subnet() {
    let mut w = World::new(Mode::Primary);
    live_dra(&mut w, "a", &["a1", "a2"]);
    live_dra(&mut w, "b", &["b1", "b2"]);
    in_zone(&mut w, "b", "z2");
    w.warm = Some(vec![db(1, &[("z1", "subnet-z1"), ("z2", "subnet-z2")])]);
    assert_eq!(
        made(&w.plan()),
        [("a", "subnet-z1", 3), ("b", "subnet-z2", 3)]
    );
    // Kept in z1 already, and being made in z2: nothing more.
    kept(&mut w, "a", "a3", 3, "subnet-z1");
    let mut making = intent("t1");
    making.policy = Some("db".into());
    w.set("b").spec.intents.push(making);
    assert!(made(&w.plan()).is_empty(), "{:?}", w.plan());
    // A pod holds the one in z1: another is made (no slot on a: none).
    status(w.set("a")).used.push(used("a3", None));
    assert!(made(&w.plan()).is_empty(), "a is full: {:?}", w.plan());
    w.limits.get_mut("m5").unwrap().enis = 5;
    assert_eq!(made(&w.plan()), [("a", "subnet-z1", 4)]);
}

#[test]
fn nothing_is_kept_while_policies_are_unknown_or_where_no_agent_serves_claims() {
    let mut w = World::new(Mode::Primary);
    // a runs the device plugin; b serves claims.
    says_dra(w.live("a", &["a1", "a2"]), false);
    live_dra(&mut w, "b", &["b1", "b2"]);
    kept(&mut w, "a", "a3", 3, "subnet-1");
    w.warm = None;
    let tasks = w.plan();
    assert!(
        made(&tasks).is_empty() && drained(&tasks).is_empty(),
        "{tasks:?}"
    );
    // Known: made on b only (in the pool's subnet, the policy naming
    // none), and the one on a, where no claim can use it, goes.
    w.warm = Some(vec![db(1, &[])]);
    let tasks = w.plan();
    assert_eq!(made(&tasks), [("b", "subnet-1", 3)]);
    assert_eq!(drained(&tasks), [("a", &["a3".to_string()][..])]);
}

#[test]
fn warm_enis_are_no_nodes_pool() {
    let mut w = World::new(Mode::Primary);
    // a's only free ENIs are db's: its pool is short of 2 all the same.
    live_dra(&mut w, "a", &[]);
    kept(&mut w, "a", "a1", 1, "subnet-1");
    w.warm = Some(vec![db(1, &[])]);
    let tasks = w.plan();
    assert_eq!(grown(&tasks), [&vec![2, 3]]);
    assert!(made(&tasks).is_empty());
    // Nor are they the pool's surplus: a full pool drains none of them.
    let mut w = World::new(Mode::Primary);
    live_dra(&mut w, "a", &["a1", "a2"]);
    kept(&mut w, "a", "a3", 3, "subnet-1");
    w.warm = Some(vec![db(1, &[])]);
    assert!(drained(&w.plan()).is_empty(), "{:?}", w.plan());
}

#[test]
fn above_its_count_the_last_attached_goes_once_it_has_lasted_drain_delay() {
    let mut w = World::new(Mode::Primary);
    w.limits.get_mut("m5").unwrap().enis = 8;
    live_dra(&mut w, "a", &["a1", "a2"]);
    kept(&mut w, "a", "a3", 3, "subnet-1");
    kept(&mut w, "a", "a4", 4, "subnet-1");
    kept(&mut w, "a", "a5", 5, "subnet-1");
    w.warm = Some(vec![db(1, &[])]);
    w.policy.drain_delay = Duration::from_secs(30);
    let key = surplus_key("db", "z1");
    let index = Index::build(w.input());
    let planned = plan_pass(&index);
    assert!(drained(&planned.tasks).is_empty(), "held back");
    assert!(planned.surplus.contains(&key), "{:?}", planned.surplus);
    drop(index);
    w.surplus_since.insert(key, w.now - Duration::from_secs(31));
    let a = ["a5".to_string(), "a4".to_string()];
    assert_eq!(drained(&w.plan()), [("a", &a[..])]);
    // One held by a pod is not among the free: only the excess of free
    // ones goes, and never the held one.
    status(w.set("a")).used.push(used("a5", None));
    let a = ["a4".to_string()];
    assert_eq!(drained(&w.plan()), [("a", &a[..])]);
}

#[test]
fn an_eni_kept_for_nothing_goes_once_free() {
    let mut w = World::new(Mode::Primary);
    w.limits.get_mut("m5").unwrap().enis = 8;
    live_dra(&mut w, "a", &["a1", "a2"]);
    kept(&mut w, "a", "a3", 3, "subnet-z1");
    kept(&mut w, "a", "a4", 4, "subnet-1");
    kept(&mut w, "a", "a5", 5, "subnet-1");
    status(w.set("a")).used.push(used("a5", None));
    w.policy.drain_delay = Duration::from_secs(30);
    // The policy asks for z1's own subnet now: a4 is of the old kind, a3
    // stays; a5 is held and waits.
    w.warm = Some(vec![db(1, &[("z1", "subnet-z1")])]);
    let a = ["a4".to_string()];
    assert_eq!(drained(&w.plan()), [("a", &a[..])]);
    // The policy is gone (or keeps none): every free one goes at once.
    w.warm = Some(Vec::new());
    let a = ["a3".to_string(), "a4".to_string()];
    assert_eq!(drained(&w.plan()), [("a", &a[..])]);
}

#[test]
fn a_refused_policy_gets_no_warm_eni_and_its_claims_take_a_kept_one() {
    let mut w = World::new(Mode::Primary);
    live_dra(&mut w, "a", &["a1", "a2"]);
    w.warm = Some(vec![db(1, &[])]);
    w.refused
        .insert(warm_refused_key("db"), "InvalidGroup.NotFound".into());
    assert!(made(&w.plan()).is_empty());
    // A claim of db's groups with a kept one free: no ENI made for it.
    w.refused.clear();
    kept(&mut w, "a", "a3", 3, "subnet-1");
    w.claims = Some(vec![pending("u1", &["sg-db"])]);
    let tasks = w.plan();
    assert!(
        !tasks
            .iter()
            .any(|t| matches!(t, Task::CreateForClaim { .. })),
        "{tasks:?}"
    );
    assert!(made(&tasks).is_empty());
}
