use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta, Time,
};
use k8s_openapi::jiff::Timestamp;

use super::*;
use enim_crd::EniPolicySpec;

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn match_labels(pairs: &[(&str, &str)]) -> Option<LabelSelector> {
    Some(LabelSelector {
        match_labels: Some(labels(pairs)),
        match_expressions: None,
    })
}

fn policy(name: &str, spec: EniPolicySpec) -> EniPolicy {
    let mut p = EniPolicy::new(name, spec);
    p.metadata = ObjectMeta {
        name: Some(name.into()),
        creation_timestamp: Some(Time("2026-11-01T00:00:00Z".parse::<Timestamp>().unwrap())),
        ..ObjectMeta::default()
    };
    p
}

fn created_at(mut p: EniPolicy, at: &str) -> EniPolicy {
    p.metadata.creation_timestamp = Some(Time(at.parse().unwrap()));
    p
}

fn facts<'a>(
    pod: &'a BTreeMap<String, String>,
    ns: &'a BTreeMap<String, String>,
    sa: &'a str,
) -> PodFacts<'a> {
    PodFacts {
        labels: pod,
        namespace_labels: ns,
        service_account: sa,
    }
}

#[test]
fn a_policy_selects_by_namespace_labels_pod_labels_and_service_account() {
    let p = policy(
        "db",
        EniPolicySpec {
            namespace_selector: match_labels(&[("team", "db")]),
            pod_selector: Some(LabelSelector {
                match_labels: None,
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: "tier".into(),
                    operator: "In".into(),
                    values: Some(vec!["primary".into(), "replica".into()]),
                }]),
            }),
            service_accounts: vec!["postgres".into()],
            ..EniPolicySpec::default()
        },
    );
    let ns = labels(&[("team", "db")]);
    let other_ns = labels(&[("team", "web")]);
    let pod = labels(&[("tier", "replica")]);
    let other_pod = labels(&[("tier", "cache")]);
    assert_eq!(selects(&p, &facts(&pod, &ns, "postgres")), Ok(true));
    assert_eq!(selects(&p, &facts(&pod, &other_ns, "postgres")), Ok(false));
    assert_eq!(selects(&p, &facts(&other_pod, &ns, "postgres")), Ok(false));
    assert_eq!(selects(&p, &facts(&pod, &ns, "default")), Ok(false));

    // No selector at all: every pod.
    let all = policy("all", EniPolicySpec::default());
    assert_eq!(selects(&all, &facts(&other_pod, &other_ns, "x")), Ok(true));
    // An empty selector also selects everything, as in Kubernetes.
    let empty = policy(
        "empty",
        EniPolicySpec {
            pod_selector: Some(LabelSelector::default()),
            ..EniPolicySpec::default()
        },
    );
    assert_eq!(selects(&empty, &facts(&other_pod, &ns, "x")), Ok(true));
}

#[test]
fn a_malformed_selector_selects_nothing_and_says_why() {
    let bad = policy(
        "bad",
        EniPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: None,
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: "tier".into(),
                    operator: "Near".into(),
                    values: Some(vec!["x".into()]),
                }]),
            }),
            ..EniPolicySpec::default()
        },
    );
    let none = BTreeMap::new();
    let e = selects(&bad, &facts(&none, &none, "default")).unwrap_err();
    assert_eq!((e.policy.as_str(), e.which), ("bad", "podSelector"));
    assert!(
        e.to_string()
            .contains("EniPolicy bad: podSelector is invalid"),
        "{e}"
    );

    let fallback = policy("fallback", EniPolicySpec::default());
    let policies = [bad, fallback];
    let (chosen, invalid) = select(&policies, &facts(&none, &none, "default"));
    assert_eq!(
        chosen.map(|p| p.metadata.name.as_deref()),
        Some(Some("fallback"))
    );
    assert_eq!(invalid.len(), 1);
}

#[test]
fn precedence_is_priority_then_specificity_then_age_then_name() {
    let pod = labels(&[("app", "web")]);
    let ns = labels(&[("env", "prod")]);
    let f = facts(&pod, &ns, "default");
    let name = |c: Option<&EniPolicy>| c.and_then(|p| p.metadata.name.clone());

    let broad = policy("broad", EniPolicySpec::default());
    let narrow = policy(
        "narrow",
        EniPolicySpec {
            pod_selector: match_labels(&[("app", "web")]),
            ..EniPolicySpec::default()
        },
    );
    let high = policy(
        "high",
        EniPolicySpec {
            priority: 10,
            ..EniPolicySpec::default()
        },
    );
    // Priority beats specificity, in any order of the list.
    let list = [broad.clone(), narrow.clone(), high.clone()];
    assert_eq!(name(select(&list, &f).0), Some("high".into()));
    let list = [high.clone(), narrow.clone(), broad.clone()];
    assert_eq!(name(select(&list, &f).0), Some("high".into()));
    // Same priority: the more specific.
    let list = [broad.clone(), narrow.clone()];
    assert_eq!(name(select(&list, &f).0), Some("narrow".into()));
    // Same priority and specificity: the older, then the name.
    let old = created_at(
        policy("zz-old", EniPolicySpec::default()),
        "2026-10-01T00:00:00Z",
    );
    let list = [broad.clone(), old.clone()];
    assert_eq!(name(select(&list, &f).0), Some("zz-old".into()));
    let twin = policy("aa-twin", EniPolicySpec::default());
    let list = [broad.clone(), twin];
    assert_eq!(name(select(&list, &f).0), Some("aa-twin".into()));

    // A policy being deleted selects nothing: the next one wins.
    let mut leaving = high;
    leaving.metadata.deletion_timestamp = leaving.metadata.creation_timestamp.clone();
    let list = [leaving, narrow];
    assert_eq!(name(select(&list, &f).0), Some("narrow".into()));
    // None selects: none.
    let other = policy(
        "other",
        EniPolicySpec {
            namespace_selector: match_labels(&[("env", "dev")]),
            ..EniPolicySpec::default()
        },
    );
    assert_eq!(name(select(&[other], &f).0), None);
}
