use enim_crd::{EniPolicySpec, ZoneSubnet};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::core::admission::AdmissionReview;

use super::*;

/// An AdmissionReview request as the API server sends it, for `pod`.
fn request(pod: Value, operation: &str) -> AdmissionRequest<Pod> {
    let review: AdmissionReview<Pod> = serde_json::from_value(json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u-1",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "team-a",
            "operation": operation,
            "userInfo": {"username": "alice"},
            "object": pod,
            "oldObject": null,
        }
    }))
    .unwrap();
    review.try_into().unwrap()
}

fn pod(containers: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "team-a", "labels": {"app": "web"}},
        "spec": {"containers": containers},
    })
}

fn policy(name: &str, mode: Mode, ns: &str) -> EniPolicy {
    let mut p = EniPolicy::new(
        name,
        EniPolicySpec {
            namespace_selector: Some(LabelSelector {
                match_labels: Some([("team".to_string(), ns.to_string())].into()),
                match_expressions: None,
            }),
            mode,
            ..EniPolicySpec::default()
        },
    );
    p.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        "2026-11-01T00:00:00Z".parse().unwrap(),
    ));
    p
}

/// The pod after the response's patch.
fn patched(pod: &Value, response: &AdmissionResponse) -> Value {
    assert!(response.allowed, "{:?}", response.result);
    let patch: Patch = serde_json::from_slice(response.patch.as_ref().unwrap()).unwrap();
    let mut doc = pod.clone();
    json_patch::patch(&mut doc, &patch).unwrap();
    doc
}

fn run(pod: &Value, cluster: Cluster<'_>) -> AdmissionResponse {
    admit(&request(pod.clone(), "CREATE"), cluster)
}

#[test]
fn a_selected_pod_gets_the_resource_in_limits_and_requests_and_the_policy_name() {
    let ns: BTreeMap<String, String> = [("team".to_string(), "a".to_string())].into();
    let policies = [Arc::new(policy("fast", Mode::Primary, "a"))];
    let cluster = Cluster {
        policies: &policies,
        namespace_labels: &ns,
        default: DefaultPolicy::None,
        pools: &[],
    };
    // No resources at all, and resources with other limits: both patched.
    for containers in [
        json!([{"name": "c", "image": "i"}, {"name": "d", "image": "i"}]),
        json!([{"name": "c", "image": "i", "resources": {"limits": {"cpu": "1"}}}]),
    ] {
        let before = pod(containers);
        let after = patched(&before, &run(&before, cluster));
        let r = &after["spec"]["containers"][0]["resources"];
        assert_eq!(r["limits"]["enim.io/eni"], "1", "{after}");
        assert_eq!(r["requests"]["enim.io/eni"], "1", "{after}");
        assert_eq!(after["metadata"]["annotations"]["enim.io/policy"], "fast");
        assert_eq!(after["spec"]["containers"][1]["resources"], Value::Null);
    }
    let r = &patched(
        &pod(json!([{"name": "c", "image": "i", "resources": {"limits": {"cpu": "1"}}}])),
        &run(
            &pod(json!([{"name": "c", "image": "i", "resources": {"limits": {"cpu": "1"}}}])),
            cluster,
        ),
    )["spec"]["containers"][0]["resources"];
    assert_eq!(r["limits"]["cpu"], "1");
}

#[test]
fn the_default_applies_when_no_policy_selects() {
    let ns: BTreeMap<String, String> = [("team".to_string(), "b".to_string())].into();
    let policies = [Arc::new(policy("fast", Mode::Primary, "a"))];
    let before = pod(json!([{"name": "c", "image": "i"}]));
    let secondary = Cluster {
        policies: &policies,
        namespace_labels: &ns,
        default: DefaultPolicy::Secondary,
        pools: &[],
    };
    let after = patched(&before, &run(&before, secondary));
    assert_eq!(
        after["spec"]["containers"][0]["resources"]["requests"]["enim.io/ip"],
        "1"
    );
    assert_eq!(
        after["metadata"]["annotations"]["enim.io/policy"],
        "(default)"
    );
    // "none": annotated only.
    let none = Cluster {
        default: DefaultPolicy::None,
        pools: &[],
        ..secondary
    };
    let after = patched(&before, &run(&before, none));
    assert_eq!(after["spec"], before["spec"]);
    assert_eq!(
        after["metadata"]["annotations"]["enim.io/policy"],
        "(default)"
    );
}

#[test]
fn a_pod_that_asks_already_is_only_annotated_and_other_operations_pass() {
    let ns: BTreeMap<String, String> = [("team".to_string(), "a".to_string())].into();
    let policies = [Arc::new(policy("fast", Mode::Primary, "a"))];
    let cluster = Cluster {
        policies: &policies,
        namespace_labels: &ns,
        default: DefaultPolicy::Primary,
        pools: &[],
    };
    let asks = pod(json!([
        {"name": "c", "image": "i"},
        {"name": "d", "image": "i", "resources": {"limits": {"enim.io/ip": "1"}, "requests": {"enim.io/ip": "1"}}},
    ]));
    let after = patched(&asks, &run(&asks, cluster));
    assert_eq!(after["spec"], asks["spec"]);
    assert_eq!(
        after["metadata"]["annotations"]["enim.io/policy"],
        "(explicit)"
    );
    let mut claims = pod(json!([{"name": "c", "image": "i"}]));
    claims["spec"]["resourceClaims"] = json!([{"name": "eni", "resourceClaimTemplateName": "t"}]);
    let after = patched(&claims, &run(&claims, cluster));
    assert_eq!(after["spec"], claims["spec"]);

    let update = admit(&request(asks.clone(), "UPDATE"), cluster);
    assert!(update.allowed && update.patch.is_none());
}

#[test]
fn a_policy_it_cannot_serve_refuses_the_pod_and_names_itself() {
    let ns: BTreeMap<String, String> = [("team".to_string(), "a".to_string())].into();
    let mut subnets = policy("isolated", Mode::Primary, "a");
    subnets.spec.subnets = vec![ZoneSubnet {
        zone: "z1".into(),
        subnet_id: "subnet-1".into(),
    }];
    let mut secondary = policy("isolated", Mode::Secondary, "a");
    secondary.spec.security_groups = vec!["sg-1".into()];
    for (p, why) in [
        (subnets, "subnets without securityGroups"),
        (secondary, "secondary mode"),
    ] {
        let policies = [Arc::new(p)];
        let cluster = Cluster {
            policies: &policies,
            namespace_labels: &ns,
            default: DefaultPolicy::None,
            pools: &[],
        };
        let r = run(&pod(json!([{"name": "c", "image": "i"}])), cluster);
        assert!(!r.allowed);
        assert!(r.patch.is_none());
        assert!(
            r.result.message.contains("EniPolicy isolated") && r.result.message.contains(why),
            "{}",
            r.result.message
        );
    }
}

/// Groups in primary mode: the pod gets a claim from the policy's
/// template, and its first container uses it; the resources it had stay.
#[test]
fn a_policy_with_groups_gives_the_pod_a_claim_from_its_template() {
    let ns: BTreeMap<String, String> = [("team".to_string(), "a".to_string())].into();
    let mut p = policy("db", Mode::Primary, "a");
    p.spec.security_groups = vec!["sg-1".into()];
    let policies = [Arc::new(p)];
    let cluster = Cluster {
        policies: &policies,
        namespace_labels: &ns,
        default: DefaultPolicy::None,
        pools: &[],
    };
    let before = pod(json!([
        {"name": "c", "image": "i", "resources": {"limits": {"cpu": "1"}}},
        {"name": "d", "image": "i"}
    ]));
    let after = patched(&before, &run(&before, cluster));
    assert_eq!(after["metadata"]["annotations"]["enim.io/policy"], "db");
    assert_eq!(
        after["spec"]["resourceClaims"],
        json!([{"name": "enim-eni", "resourceClaimTemplateName": "enim-policy-db"}])
    );
    assert_eq!(
        after["spec"]["containers"][0]["resources"],
        json!({"limits": {"cpu": "1"}, "claims": [{"name": "enim-eni"}]})
    );
    assert_eq!(
        after["spec"]["containers"][1],
        before["spec"]["containers"][1]
    );
}

/// Groups in secondary mode: the address, and a required node affinity to
/// the pool of those groups, whatever part of an affinity the pod had.
#[test]
fn a_secondary_policy_of_groups_steers_the_pod_to_its_pool() {
    let ns: BTreeMap<String, String> = [("team".to_string(), "a".to_string())].into();
    let mut p = policy("web", Mode::Secondary, "a");
    p.spec.security_groups = vec!["sg-web".into()];
    let policies = [Arc::new(p)];
    let pools = [crate::index::PoolPolicy {
        name: "web".into(),
        node_selector: [("enim.io/pool".to_string(), "web".to_string())].into(),
        mode: Mode::Secondary,
        security_groups: vec!["sg-web".into()],
        ..Default::default()
    }];
    let cluster = Cluster {
        policies: &policies,
        namespace_labels: &ns,
        default: DefaultPolicy::None,
        pools: &pools,
    };
    let ours =
        json!({"matchExpressions": [{"key": "enim.io/pool", "operator": "In", "values": ["web"]}]});
    let theirs = json!({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]});
    let both = json!({"matchExpressions": [
        {"key": "zone", "operator": "In", "values": ["a"]},
        {"key": "enim.io/pool", "operator": "In", "values": ["web"]},
    ]});
    let required = |terms: Value| json!({"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}});
    let preferred = json!([{"weight": 1, "preference": theirs.clone()}]);
    for (affinity, want) in [
        (
            Value::Null,
            json!({"nodeAffinity": required(json!([ours.clone()]))}),
        ),
        (
            json!({"podAffinity": {}}),
            json!({"podAffinity": {}, "nodeAffinity": required(json!([ours.clone()]))}),
        ),
        (
            json!({"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": preferred.clone()}}),
            json!({"nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": preferred.clone(),
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [ours.clone()]},
            }}),
        ),
        (
            json!({"nodeAffinity": required(json!([theirs.clone()]))}),
            json!({"nodeAffinity": required(json!([both.clone()]))}),
        ),
    ] {
        let mut before = pod(json!([{"name": "c", "image": "i"}]));
        if !affinity.is_null() {
            before["spec"]["affinity"] = affinity;
        }
        let after = patched(&before, &run(&before, cluster));
        assert_eq!(after["spec"]["affinity"], want, "{after}");
        let r = &after["spec"]["containers"][0]["resources"];
        assert_eq!(r["limits"]["enim.io/ip"], "1", "{after}");
        assert_eq!(r["requests"]["enim.io/ip"], "1", "{after}");
        assert_eq!(after["metadata"]["annotations"]["enim.io/policy"], "web");
    }
}
