use std::collections::BTreeMap;

use enim_crd::ZoneSubnet;

use super::*;

fn pool(name: &str, selector: &[(&str, &str)], mode: Mode, groups: &[&str]) -> PoolPolicy {
    PoolPolicy {
        name: name.into(),
        node_selector: selector
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        mode,
        subnets: vec!["subnet-a".into()],
        security_groups: groups.iter().map(|g| g.to_string()).collect(),
        ..PoolPolicy::default()
    }
}

fn spec(groups: &[&str]) -> EniPolicySpec {
    EniPolicySpec {
        mode: Mode::Secondary,
        security_groups: groups.iter().map(|g| g.to_string()).collect(),
        ..EniPolicySpec::default()
    }
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Whether a node with `labels` satisfies `terms` as the scheduler reads
/// them (terms ORed, an empty term matching nothing).
fn satisfies(terms: &[NodeSelectorTerm], labels: &BTreeMap<String, String>) -> bool {
    terms.iter().any(|t| {
        let reqs = t.match_expressions.as_deref().unwrap_or_default();
        !reqs.is_empty()
            && reqs.iter().all(|r| {
                let values = r.values.as_deref().unwrap_or_default();
                let value = labels.get(&r.key);
                match r.operator.as_str() {
                    "In" => value.is_some_and(|v| values.contains(v)),
                    "NotIn" => value.is_none_or(|v| !values.contains(v)),
                    other => panic!("an operator steer does not write: {other}"),
                }
            })
    })
}

#[test]
fn a_pool_of_exactly_the_groups_is_where_its_pods_go() {
    let pools = [
        pool(
            "primary",
            &[("enim.io/pool", "primary")],
            Mode::Primary,
            &["sg-db"],
        ),
        pool(
            "web",
            &[("enim.io/pool", "web")],
            Mode::Secondary,
            &["sg-web"],
        ),
        pool(
            "db",
            &[("enim.io/pool", "db")],
            Mode::Secondary,
            &["sg-db", "sg-x"],
        ),
    ];
    // Groups as a set: order and repeats do not matter.
    let s = steer(&spec(&["sg-x", "sg-db"]), &pools).unwrap();
    assert_eq!(s.pools, ["db"]);
    let terms = s.terms.unwrap();
    assert!(satisfies(&terms, &labels(&[("enim.io/pool", "db")])));
    assert!(!satisfies(&terms, &labels(&[("enim.io/pool", "web")])));
    // Disjoint selectors (one key, other values): one plain term.
    assert_eq!(terms.len(), 1);
    assert_eq!(terms[0].match_expressions.as_ref().unwrap().len(), 1);

    // A subset of the groups, or a primary pool of them, is no match.
    let why = steer(&spec(&["sg-db"]), &pools).unwrap_err();
    assert!(why.contains("[sg-db]"), "{why}");
    assert!(why.contains("web [sg-web]; db [sg-db,sg-x]"), "{why}");
}

#[test]
fn subnets_narrow_the_pools_to_those_in_them() {
    let mut in_b = pool("b", &[("zone", "b")], Mode::Secondary, &["sg-1"]);
    in_b.subnets = vec!["subnet-b".into()];
    let pools = [
        pool("a", &[("zone", "a")], Mode::Secondary, &["sg-1"]),
        in_b,
    ];
    let mut wants_b = spec(&["sg-1"]);
    wants_b.subnets = vec![ZoneSubnet {
        zone: "b".into(),
        subnet_id: "subnet-b".into(),
    }];
    assert_eq!(steer(&wants_b, &pools).unwrap().pools, ["b"]);
    assert_eq!(steer(&spec(&["sg-1"]), &pools).unwrap().pools, ["a", "b"]);
    wants_b.subnets[0].subnet_id = "subnet-c".into();
    let why = steer(&wants_b, &pools).unwrap_err();
    assert!(why.contains("in its subnets only"), "{why}");
    // Subnets without groups: the pools in them, whatever their groups.
    let mut any_groups = spec(&[]);
    any_groups.subnets = vec![ZoneSubnet {
        zone: "b".into(),
        subnet_id: "subnet-b".into(),
    }];
    assert_eq!(steer(&any_groups, &pools).unwrap().pools, ["b"]);
}

#[test]
fn the_implicit_pool_takes_every_node() {
    let top = pool("", &[], Mode::Secondary, &["sg-1"]);
    let s = steer(&spec(&["sg-1"]), &[top]).unwrap();
    assert_eq!(
        s,
        Steering {
            pools: vec![String::new()],
            terms: None
        }
    );
}

#[test]
fn a_pool_an_earlier_one_covers_gets_nothing() {
    let pools = [
        pool("all", &[("team", "x")], Mode::Primary, &["sg-1"]),
        pool(
            "narrow",
            &[("team", "x"), ("tier", "db")],
            Mode::Secondary,
            &["sg-1"],
        ),
    ];
    let why = steer(&spec(&["sg-1"]), &pools).unwrap_err();
    assert!(why.contains("narrow [sg-1]"), "{why}");
}

/// Every node the terms admit is in a pool of the policy's, and every
/// node of such a pool is admitted: over every labelling of three keys
/// with overlapping pools.
#[test]
fn the_terms_name_exactly_the_nodes_of_the_pools() {
    let pools = [
        pool(
            "p1",
            &[("a", "1"), ("b", "1")],
            Mode::Secondary,
            &["sg-other"],
        ),
        pool("p2", &[("a", "1")], Mode::Secondary, &["sg-1"]),
        pool("p3", &[("c", "1")], Mode::Primary, &["sg-1"]),
        pool("p4", &[("b", "2")], Mode::Secondary, &["sg-1"]),
        pool("rest", &[], Mode::Secondary, &["sg-2"]),
    ];
    let s = steer(&spec(&["sg-1"]), &pools).unwrap();
    assert_eq!(s.pools, ["p2", "p4"]);
    let terms = s.terms.unwrap();
    let values = [None, Some("1"), Some("2")];
    let mut seen = 0;
    for a in values {
        for b in values {
            for c in values {
                let l: BTreeMap<String, String> = [("a", a), ("b", b), ("c", c)]
                    .into_iter()
                    .filter_map(|(k, v)| v.map(|v| (k.to_string(), v.to_string())))
                    .collect();
                let first = pools
                    .iter()
                    .find(|p| p.selects(&l))
                    .map(|p| p.name.as_str());
                let ours = matches!(first, Some("p2" | "p4"));
                assert_eq!(satisfies(&terms, &l), ours, "{l:?} (its pool {first:?})");
                seen += usize::from(ours);
            }
        }
    }
    assert!(seen > 0);
}

#[test]
fn too_many_overlaps_are_refused_with_why() {
    // Each earlier pool shares no label value with the last: 3 choices
    // each, 3^3 = 27 terms.
    let mut pools: Vec<PoolPolicy> = (0..3)
        .map(|i| {
            let keys = [format!("x{i}"), format!("y{i}"), format!("z{i}")];
            PoolPolicy {
                node_selector: keys.iter().map(|k| (k.clone(), "1".into())).collect(),
                ..pool(&format!("e{i}"), &[], Mode::Primary, &[])
            }
        })
        .collect();
    pools.push(pool("last", &[], Mode::Secondary, &["sg-1"]));
    let why = steer(&spec(&["sg-1"]), &pools).unwrap_err();
    assert!(why.contains("pool last") && why.contains("16"), "{why}");
}

#[test]
fn a_pods_own_terms_are_anded_with_ours() {
    let term = |k: &str, op: &str| NodeSelectorTerm {
        match_expressions: Some(vec![requirement(k, op, "1")]),
        match_fields: None,
    };
    let ours = [term("pool", "In")];
    assert_eq!(and_terms(&[], &ours), ours);
    let theirs = [term("zone-a", "In"), term("zone-b", "In")];
    let both = and_terms(&theirs, &ours);
    assert_eq!(both.len(), 2);
    assert!(satisfies(&both, &labels(&[("zone-a", "1"), ("pool", "1")])));
    assert!(!satisfies(&both, &labels(&[("zone-a", "1")])));
    assert!(!satisfies(&both, &labels(&[("pool", "1")])));
}
