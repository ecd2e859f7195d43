//! Node pools in the plan: the first matching pool's settings, nothing for
//! a node in none, frozen sets left as they are, and a late instance type.

use std::collections::BTreeMap;

use super::*;

const LABEL: &str = "enim.io/pool";

fn pool(name: &str, selector: &[(&str, &str)], mode: Mode, pre: u32) -> PoolPolicy {
    PoolPolicy {
        name: name.into(),
        node_selector: selector
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        mode,
        watermarks: Watermarks {
            pre_allocate: pre,
            min_allocate: 0,
            max_above_watermark: 1,
        },
        subnets: vec![format!("subnet-{name}")],
        security_groups: vec![format!("sg-{name}")],
    }
}

/// A primary pool (2 free ENIs) and a secondary one (6 free addresses).
fn two_pools(w: &mut World) {
    w.policy.pools = vec![
        pool("prim", &[(LABEL, "prim")], Mode::Primary, 2),
        pool("sec", &[(LABEL, "sec")], Mode::Secondary, 6),
    ];
}

fn labelled(name: &str, labels: &[(&str, &str)]) -> NodeInfo {
    let mut n = node(name);
    n.labels = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect::<BTreeMap<_, _>>();
    n
}

fn relabel(w: &mut World, name: &str, value: &str) {
    let n = w.nodes.iter_mut().find(|n| n.name == name).unwrap();
    n.labels.insert(LABEL.into(), value.into());
}

/// How the index serves node `name`.
fn serving<'w>(w: &'w World, name: &str) -> Serving<'w> {
    let index = Index::build(w.input());
    let e = index.nodes.iter().find(|e| e.name == name).unwrap();
    e.serving
}

fn created_spec<'t>(tasks: &'t [Task], name: &str) -> &'t NetResourceSetSpec {
    tasks
        .iter()
        .find_map(|t| match t {
            Task::CreateSet { node, spec } if node == name => Some(spec),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no set for {name}: {tasks:?}"))
}

#[test]
fn each_node_gets_its_pools_mode_watermarks_subnets_and_groups() {
    let mut w = World::new(Mode::Primary);
    two_pools(&mut w);
    w.nodes.push(labelled("p", &[(LABEL, "prim")]));
    w.nodes.push(labelled("s", &[(LABEL, "sec")]));
    let tasks = w.plan();

    let p = created_spec(&tasks, "p");
    assert_eq!(p.mode, Mode::Primary);
    assert_eq!(p.watermarks.pre_allocate, 2);
    assert_eq!(
        (p.subnets.as_slice(), p.security_groups.as_slice()),
        (
            &["subnet-prim".to_string()][..],
            &["sg-prim".to_string()][..]
        )
    );
    let s = created_spec(&tasks, "s");
    assert_eq!(s.mode, Mode::Secondary);
    assert_eq!(s.watermarks.pre_allocate, 6);
    assert_eq!(s.subnets, ["subnet-sec"]);

    // Primary: two ENIs; secondary: 6 addresses on ENIs of 4 each (m5
    // here holds 5 addresses an ENI, its primary one included).
    assert!(tasks.contains(&Task::CreateEnis {
        node: "p".into(),
        device_indexes: vec![1, 2],
        secondary_ipv4: 0
    }));
    let sec: Vec<(&[u32], usize)> = tasks
        .iter()
        .filter_map(|t| match t {
            Task::CreateEnis {
                node,
                device_indexes,
                secondary_ipv4,
            } if node == "s" => Some((device_indexes.as_slice(), *secondary_ipv4)),
            _ => None,
        })
        .collect();
    assert_eq!(sec, [(&[1][..], 4), (&[2][..], 2)]);
}

#[test]
fn the_first_pool_that_matches_wins_and_an_empty_selector_matches_all() {
    let mut w = World::new(Mode::Primary);
    w.policy.pools = vec![
        pool("gpu", &[(LABEL, "x"), ("gpu", "yes")], Mode::Secondary, 3),
        pool("x", &[(LABEL, "x")], Mode::Primary, 1),
        pool("rest", &[], Mode::Primary, 2),
    ];
    w.nodes
        .push(labelled("both", &[(LABEL, "x"), ("gpu", "yes")]));
    w.nodes
        .push(labelled("one", &[(LABEL, "x"), ("gpu", "no")]));
    w.nodes.push(labelled("none", &[]));
    let tasks = w.plan();
    let got = |n| {
        let s = created_spec(&tasks, n);
        (s.mode, s.watermarks.pre_allocate, s.subnets[0].clone())
    };
    assert_eq!(got("both"), (Mode::Secondary, 3, "subnet-gpu".into()));
    assert_eq!(got("one"), (Mode::Primary, 1, "subnet-x".into()));
    assert_eq!(got("none"), (Mode::Primary, 2, "subnet-rest".into()));
    // The order is the config's, not the names'.
    w.policy.pools.swap(0, 1);
    let tasks = w.plan();
    assert_eq!(created_spec(&tasks, "both").mode, Mode::Primary);
}

#[test]
fn a_node_in_no_pool_gets_nothing_and_its_enis_are_not_reaped() {
    let mut w = World::new(Mode::Primary);
    two_pools(&mut w);
    w.nodes.push(labelled("own", &[(LABEL, "per-node")]));
    w.nodes.push(labelled("bare", &[]));
    // Its own agent's ENIs: one attached, one not (old enough to reap).
    w.enis.push(fleet_eni("o1", Some(("own", 1)), Some("own")));
    w.enis.push(fleet_eni("o2", None, Some("own")));
    w.reap = true;
    assert!(w.plan().is_empty(), "{:?}", w.plan());
    // The same ENI, tagged for a node the operator serves: a leak.
    w.nodes.push(labelled("p", &[(LABEL, "prim")]));
    w.enis.push(fleet_eni("l1", None, Some("p")));
    let leaked: Vec<Task> = w
        .plan()
        .into_iter()
        .filter(|t| t.kind() == "delete-leaked")
        .collect();
    assert_eq!(leaked, [Task::DeleteLeaked { eni: "l1".into() }]);
}

/// A node of pool `prim` with its set, two ENIs, one held by a pod and a
/// drain the agent has released.
fn served_primary(w: &mut World) {
    two_pools(w);
    w.policy.watermarks = w.policy.pools[0].watermarks;
    w.policy.subnets = w.policy.pools[0].subnets.clone();
    w.policy.security_groups = w.policy.pools[0].security_groups.clone();
    w.live("a", &["e1", "e2", "e3"]);
    relabel(w, "a", "prim");
    let s = w.set("a");
    s.spec.draining.push("e3".into());
    status(s).used.push(used("e1", None));
    status(s).released.push("e3".into());
    // The pool's own: planned as usual (the released drain leaves).
    let tasks = w.plan();
    assert!(kinds(&tasks).contains(&("reclaim", Some("a"))), "{tasks:?}");
}

/// [`served_primary`]'s node relabelled `enim.io/pool=value`: frozen, so
/// its released drain stays where it is.
fn relabelled_served_primary(value: &str) -> World {
    let mut w = World::new(Mode::Primary);
    served_primary(&mut w);
    relabel(&mut w, "a", value);
    assert!(w.plan().is_empty(), "{:?}", w.plan());
    w
}

#[test]
fn a_node_that_leaves_every_pool_is_frozen_until_its_node_is_deleted() {
    let mut w = relabelled_served_primary("per-node");
    // Short of its watermarks, or a surplus: nothing moves either.
    status(w.set("a")).used.clear();
    w.set("a").spec.enis.push(spec_eni("e4", 4));
    assert!(w.plan().is_empty(), "{:?}", w.plan());
    let Serving::Frozen(why) = serving(&w, "a") else {
        panic!("{:?}", serving(&w, "a"))
    };
    assert_eq!(
        why.to_string(),
        "no pool selects it any more, its set is pool \"prim\"'s (primary mode): the set is left as it is (no ENI made or taken back) until a pool of its mode selects the node again or the node is deleted"
    );

    // Back in its pool: planned again.
    relabel(&mut w, "a", "prim");
    assert!(!w.plan().is_empty());

    // Out again, then its Node deleted: the usual release after the grace.
    relabel(&mut w, "a", "per-node");
    w.nodes.retain(|n| n.name != "a");
    w.gone.insert("a".into(), now() - Duration::from_secs(301));
    assert_eq!(kinds(&w.plan()), [("release-node", Some("a"))]);
}

#[test]
fn a_node_moved_to_a_pool_of_another_mode_keeps_its_set_frozen() {
    let mut w = relabelled_served_primary("sec");
    let frozen = serving(&w, "a");
    assert_eq!(
        frozen,
        Serving::Frozen(Frozen {
            now: Some(("sec", Mode::Secondary)),
            set_mode: Mode::Primary,
            made_by: Some("prim"),
        })
    );
    let Serving::Frozen(why) = frozen else {
        unreachable!()
    };
    assert!(why.to_string().starts_with(
        "pool \"sec\" (secondary) now selects it, its set is pool \"prim\"'s (primary mode)"
    ));

    // A pool of the same mode: its settings are written, as a config
    // change would be.
    w.policy.pools[1].mode = Mode::Primary;
    assert_eq!(kinds(&w.plan())[0], ("refresh-policy", Some("a")));
}

#[test]
fn without_pools_a_changed_mode_is_rewritten_as_before() {
    let mut w = World::new(Mode::Primary);
    w.live("a", &["e1", "e2"]);
    w.policy.mode = Mode::Secondary;
    assert_eq!(kinds(&w.plan())[0], ("refresh-policy", Some("a")));
}

#[test]
fn a_set_made_without_an_instance_type_gets_the_late_label_and_fills_up() {
    let mut w = World::new(Mode::Primary);
    w.live("a", &[]);
    w.set("a").spec.instance.instance_type.clear();
    w.nodes[0].instance_type.clear();
    // No type yet: no limits, nothing to make.
    assert!(w.plan().is_empty(), "{:?}", w.plan());
    // The cloud controller labels the Node.
    w.nodes[0].instance_type = "m5".into();
    assert_eq!(
        w.plan(),
        [
            Task::FillInstanceType {
                node: "a".into(),
                instance_type: "m5".into()
            },
            Task::CreateEnis {
                node: "a".into(),
                device_indexes: vec![1, 2],
                secondary_ipv4: 0
            }
        ]
    );
    // A type the set has is never changed.
    w.set("a").spec.instance.instance_type = "m5".into();
    w.nodes[0].instance_type = "m6".into();
    let tasks = w.plan();
    assert!(
        !tasks.iter().any(|t| t.kind() == "fill-instance-type"),
        "{tasks:?}"
    );
}

#[test]
fn claims_go_only_to_served_nodes() {
    let mut w = World::new(Mode::Primary);
    two_pools(&mut w);
    w.policy
        .pools
        .push(pool("dra", &[(LABEL, "dra")], Mode::Primary, 0));
    // "big" has the most room, but is frozen (in no pool any more).
    for (name, value, enis) in [("big", "gone", &[][..]), ("small", "dra", &["s1"][..])] {
        let s = w.live(name, enis);
        status(s)
            .conditions
            .push(k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
                type_: enim_crd::CONDITION_SERVES_CLAIMS.into(),
                status: "True".into(),
                reason: "Test".into(),
                message: String::new(),
                last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
                observed_generation: None,
            });
        relabel(&mut w, name, value);
    }
    w.set("small").spec.watermarks.pre_allocate = 0;
    status(w.set("small")).used.push(used("s1", None));
    // A free ENI with the claim's groups on the frozen node does not count.
    let mut free = spec_eni("b1", 1);
    free.security_groups = vec!["sg-db".into()];
    w.set("big").spec.enis.push(free);
    w.claims = Some(vec![ClaimInfo {
        claim: enim_crd::ClaimRef {
            namespace: "default".into(),
            name: "db".into(),
            uid: "u1".into(),
        },
        pending: true,
        want: Some(enim_crd::EniParameters {
            security_groups: vec!["sg-db".into()],
            ..Default::default()
        }),
        pod: None,
        policy: None,
    }]);
    let made: Vec<(String, String)> = w
        .plan()
        .into_iter()
        .filter_map(|t| match t {
            Task::CreateForClaim { node, subnet, .. } => Some((node, subnet)),
            _ => None,
        })
        .collect();
    // On the served node, in its pool's subnet.
    assert_eq!(made, [("small".to_string(), "subnet-dra".to_string())]);
}
