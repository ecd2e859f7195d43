//! DRA claims in the plan: an ENI made for a pending claim that no node
//! can serve, never twice, kept out of the pool, and taken back once its
//! claim is gone.

use super::*;
use enim_crd::{ClaimRef, EniParameters, CONDITION_SERVES_CLAIMS};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

/// The set's agent says whether its DRA driver is on, as enimd's cluster
/// provider does.
pub(super) fn says_dra(set: &mut SetInfo, on: bool) {
    status(set).conditions.push(Condition {
        type_: CONDITION_SERVES_CLAIMS.into(),
        status: if on { "True" } else { "False" }.into(),
        reason: "Test".into(),
        message: String::new(),
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        observed_generation: None,
    });
}

/// A node whose agent serves DRA claims.
pub(super) fn live_dra(w: &mut World, name: &str, enis: &[&str]) {
    says_dra(w.live(name, enis), true);
}

fn claim(uid: &str) -> ClaimRef {
    ClaimRef {
        namespace: "default".into(),
        name: format!("claim-{uid}"),
        uid: uid.into(),
    }
}

pub(super) fn pending(uid: &str, groups: &[&str]) -> ClaimInfo {
    ClaimInfo {
        claim: claim(uid),
        pending: true,
        want: Some(EniParameters {
            security_groups: groups.iter().map(|g| g.to_string()).collect(),
            ..EniParameters::default()
        }),
        pod: None,
        policy: None,
    }
}

fn for_claim(tasks: &[Task]) -> Vec<(&str, &str, &[String], u32)> {
    tasks
        .iter()
        .filter_map(|t| match t {
            Task::CreateForClaim {
                node,
                claim,
                security_groups,
                device_index,
                subnet,
            } => {
                assert_eq!(subnet, "subnet-1", "the policy's subnet by default");
                Some((
                    node.as_str(),
                    claim.uid.as_str(),
                    security_groups.as_slice(),
                    *device_index,
                ))
            }
            _ => None,
        })
        .collect()
}

#[test]
fn a_claim_for_groups_no_node_has_gets_an_eni_on_the_roomiest_node() {
    let mut w = World::new(Mode::Primary);
    live_dra(&mut w, "a", &["a1", "a2"]);
    live_dra(&mut w, "b", &["b1", "b2"]);
    // a has one slot fewer.
    w.set("a").spec.enis.push(spec_eni("a3", 3));
    status(w.set("a")).used.push(used("a3", None));
    w.claims = Some(vec![pending("u1", &["sg-db"])]);
    let tasks = w.plan();
    let groups = ["sg-db".to_string()];
    assert_eq!(for_claim(&tasks), [("b", "u1", &groups[..], 3)]);
}

#[test]
fn nothing_is_made_while_claims_are_unknown_or_a_free_eni_matches() {
    let mut w = World::new(Mode::Primary);
    live_dra(&mut w, "a", &["a1", "a2"]);
    w.claims = None;
    assert!(for_claim(&w.plan()).is_empty());
    // The node's own groups: its free ENIs already match.
    w.claims = Some(vec![pending("u1", &["sg-1"])]);
    assert!(for_claim(&w.plan()).is_empty());
    // Both held: now one is made.
    status(w.set("a"))
        .used
        .extend([used("a1", None), used("a2", None)]);
    assert_eq!(for_claim(&w.plan()).len(), 1);
    // Allocated claims ask for nothing.
    w.claims.as_mut().unwrap()[0].pending = false;
    assert!(for_claim(&w.plan()).is_empty());
}

#[test]
fn a_claims_eni_goes_only_to_a_node_whose_agent_serves_claims() {
    let mut w = World::new(Mode::Primary);
    // a serves claims; b, the roomier, runs the device plugin.
    live_dra(&mut w, "a", &["a1", "a2"]);
    status(w.set("a")).used.push(used("a1", None));
    says_dra(w.live("b", &["b1"]), false);
    w.claims = Some(vec![pending("u1", &["sg-db"])]);
    let groups = ["sg-db".to_string()];
    assert_eq!(for_claim(&w.plan()), [("a", "u1", &groups[..], 3)]);
    // No node serves claims: none is made (an old agent says nothing).
    w.set("a").status.as_mut().unwrap().conditions.clear();
    assert!(for_claim(&w.plan()).is_empty(), "{:?}", w.plan());
    w.set("a").status = None;
    assert!(for_claim(&w.plan()).is_empty(), "{:?}", w.plan());
}

#[test]
fn a_free_eni_on_a_device_plugin_node_is_no_match_for_a_claim() {
    let mut w = World::new(Mode::Primary);
    // b has free ENIs with the claim's groups, but no DRA driver to
    // publish them: a's agent serves claims, so the ENI is made there.
    live_dra(&mut w, "a", &["a1"]);
    status(w.set("a")).used.push(used("a1", None));
    says_dra(w.live("b", &["b1", "b2"]), false);
    w.claims = Some(vec![pending("u1", &["sg-1"])]);
    let groups = ["sg-1".to_string()];
    assert_eq!(for_claim(&w.plan()), [("a", "u1", &groups[..], 2)]);
    // Once b serves claims too, its free ENI is the claim's to take.
    w.set("b").status.as_mut().unwrap().conditions.clear();
    says_dra(w.set("b"), true);
    assert!(for_claim(&w.plan()).is_empty(), "{:?}", w.plan());
}

#[test]
fn one_eni_per_claim_whoever_made_it() {
    let mut w = World::new(Mode::Primary);
    live_dra(&mut w, "a", &["a1", "a2"]);
    w.claims = Some(vec![pending("u1", &["sg-db"]), pending("u2", &["sg-db"])]);
    // u1's create is recorded as an intent; u2's ENI is published.
    let mut i = intent("t1");
    i.claim = Some(claim("u1"));
    w.set("a").spec.intents.push(i);
    let mut e = spec_eni("c2", 3);
    e.claim = Some(claim("u2"));
    e.security_groups = vec!["sg-db".into()];
    w.set("a").spec.enis.push(e);
    assert!(for_claim(&w.plan()).is_empty(), "{:?}", w.plan());
}

#[test]
fn a_claims_eni_is_not_pool_and_goes_back_once_the_claim_is_gone() {
    let mut w = World::new(Mode::Primary);
    w.live("a", &["a1", "a2"]);
    let mut e = spec_eni("c1", 3);
    e.claim = Some(claim("u1"));
    e.security_groups = vec!["sg-db".into()];
    w.set("a").spec.enis.push(e);
    // Two free pool ENIs and the claim's: no surplus to drain (pre 2 +
    // 1 above), and the claim's is never drained for the pool.
    w.claims = Some(vec![ClaimInfo {
        claim: claim("u1"),
        pending: false,
        want: None,
        pod: None,
        policy: None,
    }]);
    assert!(w.plan().is_empty(), "{:?}", w.plan());
    // The pool ENIs are taken: two more are made for the pool (room for
    // them on a bigger instance); the claim's ENI does not count as free.
    w.limits.get_mut("m5").unwrap().enis = 6;
    status(w.set("a"))
        .used
        .extend([used("a1", None), used("a2", None)]);
    let tasks = w.plan();
    assert_eq!(
        tasks,
        [Task::CreateEnis {
            node: "a".into(),
            device_indexes: vec![4, 5],
            secondary_ipv4: 0
        }]
    );
    status(w.set("a")).used.clear();
    // The claim is gone: its ENI is drained, unless a pod still holds it.
    w.claims = Some(vec![]);
    status(w.set("a")).used.push(used("c1", None));
    assert!(!w.plan().iter().any(|t| matches!(t, Task::Drain { .. })));
    status(w.set("a")).used.clear();
    assert!(w.plan().contains(&Task::Drain {
        node: "a".into(),
        items: vec!["c1".into()],
    }));
    // Drained and not yet released: a pool deficit does not take it back.
    w.set("a").spec.draining.push("c1".into());
    status(w.set("a"))
        .used
        .extend([used("a1", None), used("a2", None)]);
    assert!(!w
        .plan()
        .iter()
        .any(|t| matches!(t, Task::Undrain { items, .. } if items.contains(&"c1".to_string()))));
}

#[test]
fn a_claim_no_node_can_take_is_unservable_and_says_why() {
    let mut w = World::new(Mode::Primary);
    // No node serves claims yet.
    says_dra(w.live("a", &["a1"]), false);
    status(w.set("a")).used.push(used("a1", None));
    w.claims = Some(vec![pending("u1", &["sg-db"])]);
    let none = w.unservable();
    assert_eq!(none.len(), 1, "{none:?}");
    assert!(none[0].1.contains("serving DRA claims"), "{none:?}");
    // It does now, with room: placed, not unservable.
    w.set("a").status.as_mut().unwrap().conditions.clear();
    says_dra(w.set("a"), true);
    assert_eq!(for_claim(&w.plan()).len(), 1);
    assert!(w.unservable().is_empty());
    // Its every slot taken (m5: 3 besides the primary): no room.
    for (id, ix) in [("a2", 2), ("a3", 3)] {
        w.set("a").spec.enis.push(spec_eni(id, ix));
        status(w.set("a")).used.push(used(id, None));
    }
    assert!(for_claim(&w.plan()).is_empty(), "{:?}", w.plan());
    let full = w.unservable();
    assert_eq!(full.len(), 1, "{full:?}");
    assert!(full[0].1.contains("free device slot"), "{full:?}");
    // Served by an ENI made for it: nothing to say. Allocated: nor.
    let mut e = spec_eni("c1", 3);
    e.claim = Some(claim("u1"));
    w.set("a").spec.enis.push(e);
    assert!(w.unservable().is_empty());
    w.set("a").spec.enis.pop();
    w.claims.as_mut().unwrap()[0].pending = false;
    assert!(w.unservable().is_empty());
}

/// Puts node `name` in `zone` (its Node and its set's instance).
pub(super) fn in_zone(w: &mut World, name: &str, zone: &str) {
    w.nodes.iter_mut().find(|n| n.name == name).unwrap().zone = zone.into();
    w.set(name).spec.instance.zone = zone.into();
}

/// A pending claim for `groups` with a subnet per zone.
fn pending_in(uid: &str, groups: &[&str], subnets: &[(&str, &str)]) -> ClaimInfo {
    let mut c = pending(uid, groups);
    c.want.as_mut().unwrap().subnets = subnets
        .iter()
        .map(|(zone, subnet)| enim_crd::ZoneSubnet {
            zone: zone.to_string(),
            subnet_id: subnet.to_string(),
        })
        .collect();
    c
}

/// The (node, claim, subnet) of each create for a claim.
fn created_where(tasks: &[Task]) -> Vec<(&str, &str, &str)> {
    tasks
        .iter()
        .filter_map(|t| match t {
            Task::CreateForClaim {
                node,
                claim,
                subnet,
                ..
            } => Some((node.as_str(), claim.uid.as_str(), subnet.as_str())),
            _ => None,
        })
        .collect()
}

#[test]
fn a_claim_with_a_subnet_per_zone_gets_its_eni_in_a_zone_it_names_in_that_zones_subnet() {
    let mut w = World::new(Mode::Primary);
    // a is the roomier, but in a zone the claim does not name.
    live_dra(&mut w, "a", &["a1"]);
    live_dra(&mut w, "b", &["b1", "b2"]);
    in_zone(&mut w, "b", "z2");
    status(w.set("b")).used.push(used("b2", None));
    w.claims = Some(vec![pending_in(
        "u1",
        &["sg-db"],
        &[("z2", "subnet-z2"), ("z3", "subnet-z3")],
    )]);
    assert_eq!(created_where(&w.plan()), [("b", "u1", "subnet-z2")]);
    assert!(w.unservable().is_empty());
    // A free ENI with the groups, in the pool's subnet, is no match: the
    // claim asks for its zone's subnet.
    w.claims = Some(vec![pending_in("u2", &["sg-1"], &[("z2", "subnet-z2")])]);
    assert_eq!(created_where(&w.plan()), [("b", "u2", "subnet-z2")]);
    // One that is in it is.
    w.set("b").spec.enis[0].subnet = "subnet-z2".into();
    assert!(created_where(&w.plan()).is_empty(), "{:?}", w.plan());
}

#[test]
fn a_claim_whose_zones_have_no_node_or_whose_subnets_conflict_is_unservable_and_says_why() {
    let mut w = World::new(Mode::Primary);
    live_dra(&mut w, "a", &["a1"]);
    status(w.set("a")).used.push(used("a1", None));
    w.claims = Some(vec![pending_in("u1", &["sg-db"], &[("z9", "subnet-z9")])]);
    assert!(created_where(&w.plan()).is_empty(), "{:?}", w.plan());
    let none = w.unservable();
    assert_eq!(none.len(), 1, "{none:?}");
    assert!(none[0].1.contains("zone its subnets name (z9)"), "{none:?}");

    let mut both = pending_in("u2", &["sg-db"], &[("z1", "subnet-z1")]);
    both.want.as_mut().unwrap().subnet = Some("subnet-x".into());
    w.claims = Some(vec![both]);
    assert!(created_where(&w.plan()).is_empty(), "{:?}", w.plan());
    let bad = w.unservable();
    assert!(bad[0].1.contains("both subnet and subnets"), "{bad:?}");
}
