//! The control plane's checks must fail too: each case breaks one thing in
//! the RBAC, the admission policy, the CRD or the operator's Deployment and
//! expects a problem naming it (broken.rs does the same for the agent).

use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MatchResources, NamedRuleWithOperations, ValidatingAdmissionPolicyBindingSpec,
    ValidatingAdmissionPolicySpec,
};
use k8s_openapi::api::core::v1::{
    Capabilities, EnvVar, HTTPGetAction, HostPathVolumeSource, PodSecurityContext, SecurityContext,
};
use k8s_openapi::api::rbac::v1::{AggregationRule, PolicyRule, RoleRef, Subject};
use k8s_openapi::api::resource::v1::{
    CELDeviceSelector, DeviceClassConfiguration, DeviceSelector, OpaqueDeviceConfiguration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;

use super::broken::{expect_problem, named_mut};
use super::*;

fn by_name_mut<'a, T>(items: &'a mut [T], name: &str) -> &'a mut T
where
    T: k8s_openapi::Metadata<Ty = ObjectMeta>,
{
    items
        .iter_mut()
        .find(|o| o.metadata().name.as_deref() == Some(name))
        .unwrap()
}

/// The rules of ClusterRole `name`.
fn rules_mut<'a>(m: &'a mut Manifests, name: &str) -> &'a mut Vec<PolicyRule> {
    by_name_mut(&mut m.cluster_roles, name)
        .rules
        .as_mut()
        .unwrap()
}

/// The rule of ClusterRole `name` for `resource`.
fn rule_mut<'a>(m: &'a mut Manifests, name: &str, resource: &str) -> &'a mut PolicyRule {
    rules_mut(m, name)
        .iter_mut()
        .find(|r| r.resources.iter().flatten().any(|x| x == resource))
        .unwrap()
}

/// The agent's ClusterRole's rule for `resource`.
fn agent_rule_mut<'a>(m: &'a mut Manifests, resource: &str) -> &'a mut PolicyRule {
    rule_mut(m, "enim:agent", resource)
}

/// The verbs of that rule.
fn agent_verbs_mut<'a>(m: &'a mut Manifests, resource: &str) -> &'a mut Vec<String> {
    &mut agent_rule_mut(m, resource).verbs
}

fn subjects_mut<'a>(m: &'a mut Manifests, binding: &str) -> &'a mut Vec<Subject> {
    by_name_mut(&mut m.cluster_role_bindings, binding)
        .subjects
        .as_mut()
        .unwrap()
}

fn policy_mut(m: &mut Manifests) -> &mut ValidatingAdmissionPolicySpec {
    m.policies[0].spec.as_mut().unwrap()
}

fn match_rule_mut(m: &mut Manifests) -> &mut NamedRuleWithOperations {
    let c = policy_mut(m).match_constraints.as_mut().unwrap();
    &mut c.resource_rules.as_mut().unwrap()[0]
}

/// The DRA policies: ResourceSlices, ResourceClaims' status.
const SLICES: &str = "enim-agent-own-slices";
const CLAIMS: &str = "enim-agent-own-claims";

fn named_policy_mut<'a>(m: &'a mut Manifests, name: &str) -> &'a mut ValidatingAdmissionPolicySpec {
    by_name_mut(&mut m.policies, name).spec.as_mut().unwrap()
}

fn named_rule_mut<'a>(m: &'a mut Manifests, name: &str) -> &'a mut NamedRuleWithOperations {
    let c = named_policy_mut(m, name)
        .match_constraints
        .as_mut()
        .unwrap();
    &mut c.resource_rules.as_mut().unwrap()[0]
}

/// Variable `var` of policy `name`, with `from` replaced by `to`.
fn edit_variable(m: &mut Manifests, name: &str, var: &str, from: &str, to: &str) {
    let v = named_mut(&mut named_policy_mut(m, name).variables, var, |v| &v.name);
    assert!(v.expression.contains(from), "{name} {var}: no {from:?}");
    v.expression = v.expression.replace(from, to);
}

/// [`edit_variable`] of the agent's own-slices policy.
fn edit_slice_variable(m: &mut Manifests, var: &str, from: &str, to: &str) {
    edit_variable(m, SLICES, var, from, to)
}

/// [`edit_variable`] of the agent's own-claims policy.
fn edit_claim_variable(m: &mut Manifests, var: &str, from: &str, to: &str) {
    edit_variable(m, CLAIMS, var, from, to)
}

/// The validation of policy `name` whose expression holds `from`, with
/// `from` replaced by `to`.
fn edit_validation(m: &mut Manifests, name: &str, from: &str, to: &str) {
    let validations = named_policy_mut(m, name).validations.as_mut().unwrap();
    let v = validations
        .iter_mut()
        .find(|v| v.expression.contains(from))
        .unwrap_or_else(|| panic!("{name}: no validation holds {from:?}"));
    v.expression = v.expression.replace(from, to);
}

/// Policy `name` without the validation whose expression holds `text`.
fn drop_validation(m: &mut Manifests, name: &str, text: &str) {
    let validations = named_policy_mut(m, name).validations.as_mut().unwrap();
    let before = validations.len();
    validations.retain(|v| !v.expression.contains(text));
    assert_eq!(
        validations.len() + 1,
        before,
        "{name}: one validation holds {text:?}"
    );
}

fn class_selectors_mut(m: &mut Manifests) -> &mut Vec<DeviceSelector> {
    m.device_classes[0].spec.selectors.as_mut().unwrap()
}

fn policy_binding_mut(m: &mut Manifests) -> &mut ValidatingAdmissionPolicyBindingSpec {
    m.policy_bindings[0].spec.as_mut().unwrap()
}

fn operator_spec_mut(m: &mut Manifests) -> &mut PodSpec {
    let d = by_name_mut(&mut m.deployments, OPERATOR);
    d.spec.as_mut().unwrap().template.spec.as_mut().unwrap()
}

fn operator_mut(m: &mut Manifests) -> &mut Container {
    &mut operator_spec_mut(m).containers[0]
}

fn operator_security_mut(m: &mut Manifests) -> &mut SecurityContext {
    operator_mut(m).security_context.as_mut().unwrap()
}

fn operator_pod_security_mut(m: &mut Manifests) -> &mut PodSecurityContext {
    operator_spec_mut(m).security_context.as_mut().unwrap()
}

fn operator_caps_mut(m: &mut Manifests) -> &mut Capabilities {
    operator_security_mut(m).capabilities.as_mut().unwrap()
}

fn operator_env_mut<'a>(m: &'a mut Manifests, name: &str) -> &'a mut EnvVar {
    named_mut(&mut operator_mut(m).env, name, |e| &e.name)
}

fn operator_http_get_mut(probe: &mut Option<Probe>) -> &mut HTTPGetAction {
    probe.as_mut().unwrap().http_get.as_mut().unwrap()
}

fn operator_command_mut(m: &mut Manifests) -> &mut Vec<String> {
    operator_mut(m).command.as_mut().unwrap()
}

fn labels(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, String>> {
    Some(
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    )
}

#[test]
fn each_control_plane_check_fails_on_a_broken_manifest() {
    let good = load();
    type Break = fn(&mut Manifests);
    let cases: &[(&str, Break, &str)] = &[
        // The agent's grants.
        (
            "agent may delete sets",
            |m| rules_mut(m, "enim:agent")[0].verbs.push("delete".into()),
            "ServiceAccount enimd (the agent) is granted more than it uses: \
             delete enim.io/netresourcesets in all namespaces",
        ),
        (
            "agent's status verbs by wildcard",
            |m| rules_mut(m, "enim:agent")[1].verbs = vec!["*".into()],
            "ServiceAccount enimd (the agent) is granted a wildcard: \
             * enim.io/netresourcesets/status",
        ),
        (
            "agent may read Secrets",
            |m| {
                rules_mut(m, "enim:agent").push(PolicyRule {
                    api_groups: Some(vec![String::new()]),
                    resources: Some(vec!["secrets".into()]),
                    verbs: vec!["get".into()],
                    ..Default::default()
                })
            },
            "ServiceAccount enimd (the agent) is granted more than it uses: \
             get core/secrets in all namespaces",
        ),
        (
            "agent cannot patch its status",
            |m| rules_mut(m, "enim:agent")[1].verbs.retain(|v| v != "patch"),
            "ServiceAccount enimd (the agent) lacks patch enim.io/netresourcesets/status",
        ),
        (
            "agent's role bound to enimd of another namespace",
            |m| subjects_mut(m, "enim:agent")[0].namespace = Some("default".into()),
            "ServiceAccount enimd (the agent) lacks get core/nodes in all namespaces, \
             get enim.io/netresourcesets",
        ),
        (
            "agent's role bound to every service account",
            |m| {
                subjects_mut(m, "enim:agent").push(Subject {
                    kind: "Group".into(),
                    name: "system:serviceaccounts".into(),
                    api_group: Some("rbac.authorization.k8s.io".into()),
                    namespace: None,
                })
            },
            "ClusterRoleBinding enim:agent binds Group system:serviceaccounts",
        ),
        (
            "cluster-admin for the agent",
            |m| {
                let mut b = by_name_mut(&mut m.cluster_role_bindings, "enim:agent").clone();
                b.metadata.name = Some("enim:agent-admin".into());
                b.role_ref.name = "cluster-admin".into();
                m.cluster_role_bindings.push(b);
            },
            "ClusterRoleBinding enim:agent-admin refers to ClusterRole cluster-admin \
             (namespace None), which deploy/ does not define",
        ),
        (
            "agent's role aggregated",
            |m| {
                by_name_mut(&mut m.cluster_roles, "enim:agent").aggregation_rule =
                    Some(AggregationRule::default())
            },
            "ClusterRole Some(\"enim:agent\") aggregates other roles",
        ),
        // The agent's DRA grants.
        (
            "agent may delete ResourceSlices",
            |m| agent_verbs_mut(m, "resourceslices").push("delete".into()),
            "ServiceAccount enimd (the agent) is granted more than it uses: \
             delete resource.k8s.io/resourceslices in all namespaces",
        ),
        (
            "agent may list claims",
            |m| agent_verbs_mut(m, "resourceclaims").push("list".into()),
            "ServiceAccount enimd (the agent) is granted more than it uses: \
             list resource.k8s.io/resourceclaims in all namespaces",
        ),
        (
            "agent may update claims, not only their status",
            |m| {
                agent_rule_mut(m, "resourceclaims/status")
                    .resources
                    .as_mut()
                    .unwrap()
                    .push("resourceclaims".into())
            },
            "ServiceAccount enimd (the agent) is granted more than it uses: \
             patch resource.k8s.io/resourceclaims in all namespaces",
        ),
        (
            "agent cannot patch a claim's status",
            |m| *agent_verbs_mut(m, "resourceclaims/status") = vec!["update".into()],
            "ServiceAccount enimd (the agent) lacks patch resource.k8s.io/resourceclaims/status",
        ),
        (
            "agent cannot create its slice",
            |m| agent_verbs_mut(m, "resourceslices").retain(|v| v != "create"),
            "ServiceAccount enimd (the agent) lacks create resource.k8s.io/resourceslices",
        ),
        (
            "agent may patch Nodes",
            |m| agent_verbs_mut(m, "nodes").push("patch".into()),
            "ServiceAccount enimd (the agent) is granted more than it uses: \
             patch core/nodes in all namespaces",
        ),
        // The operator's grants.
        (
            "operator may delete sets",
            |m| rules_mut(m, "enim:operator")[1].verbs.push("delete".into()),
            "ServiceAccount enim-operator is granted more than it uses: \
             delete enim.io/netresourcesets in all namespaces",
        ),
        (
            "operator writes status",
            |m| {
                let r = &mut rules_mut(m, "enim:operator")[1];
                r.resources
                    .as_mut()
                    .unwrap()
                    .push("netresourcesets/status".into());
            },
            "ServiceAccount enim-operator is granted more than it uses: \
             create enim.io/netresourcesets/status in all namespaces",
        ),
        (
            "operator cannot list Nodes",
            |m| rules_mut(m, "enim:operator")[0].verbs = vec!["get".into(), "watch".into()],
            "ServiceAccount enim-operator lacks list core/nodes in all namespaces",
        ),
        (
            "operator's leases in every namespace",
            |m| {
                let lease = |r: &Role| r.metadata.name.as_deref() == Some("enim:operator-lease");
                let role = m.roles.remove(m.roles.iter().position(lease).unwrap());
                m.role_bindings.clear();
                let mut cr = m.cluster_roles[0].clone();
                cr.metadata.name = role.metadata.name.clone();
                cr.rules = role.rules;
                m.cluster_roles.push(cr);
                let mut crb = by_name_mut(&mut m.cluster_role_bindings, "enim:operator").clone();
                crb.metadata.name = role.metadata.name.clone();
                crb.role_ref.name = role.metadata.name.unwrap();
                m.cluster_role_bindings.push(crb);
            },
            "ServiceAccount enim-operator is granted more than it uses: \
             create coordination.k8s.io/leases in all namespaces",
        ),
        (
            "operator's lease Role gone",
            |m| m.roles.clear(),
            "RoleBinding enim:operator-lease refers to Role enim:operator-lease \
             (namespace Some(\"enim-system\")), which deploy/ does not define",
        ),
        (
            "lease Role bound to the agent",
            |m| m.role_bindings[0].subjects.as_mut().unwrap()[0].name = AGENT_SA.into(),
            "ServiceAccount enimd (the agent) is granted more than it uses: \
             create coordination.k8s.io/leases in enim-system",
        ),
        (
            "lease RoleBinding to a Role of another group",
            |m| {
                m.role_bindings[0].role_ref = RoleRef {
                    api_group: "example.com".into(),
                    ..m.role_bindings[0].role_ref.clone()
                }
            },
            "RoleBinding enim:operator-lease refers to a role of API group \"example.com\"",
        ),
        // Where objects live.
        (
            "lease Role in kube-system",
            |m| {
                by_name_mut(&mut m.roles, "enim:operator-lease")
                    .metadata
                    .namespace = Some("kube-system".into())
            },
            "Role Some(\"enim:operator-lease\") is in namespace Some(\"kube-system\")",
        ),
        (
            "a ClusterRole with a namespace",
            |m| m.cluster_roles[0].metadata.namespace = Some("enim-system".into()),
            "ClusterRole Some(\"enim:agent\") is cluster-scoped but names namespace",
        ),
        // The admission policy.
        (
            "policy for another user",
            |m| {
                policy_mut(m).match_conditions.as_mut().unwrap()[0].expression =
                    "request.userInfo.username == 'system:serviceaccount:enim-system:x'".into()
            },
            "no ValidatingAdmissionPolicy of the agent's matches CREATE of \
             enim.io/netresourcesets (every served version): nothing keeps an agent to its \
             own node's NetResourceSet",
        ),
        (
            "no policy for the agent",
            |m| {
                for v in &mut m.policies {
                    let c = &mut v.spec.as_mut().unwrap().match_conditions.as_mut().unwrap()[0];
                    c.expression = c.expression.replace("enimd", "x");
                }
            },
            "no ValidatingAdmissionPolicy has the matchCondition",
        ),
        (
            "policy for whoever is not the agent",
            |m| {
                let c = &mut policy_mut(m).match_conditions.as_mut().unwrap()[0];
                c.expression = c.expression.replace("==", "!=");
            },
            "no ValidatingAdmissionPolicy of the agent's matches UPDATE of enim.io/netresourcesets",
        ),
        (
            "policy narrowed to creates",
            |m| {
                policy_mut(m)
                    .match_conditions
                    .as_mut()
                    .unwrap()
                    .push(MatchCondition {
                        name: "creates".into(),
                        expression: "request.operation == 'CREATE'".into(),
                    })
            },
            "matchCondition creates narrows which of the agent's writes it checks",
        ),
        (
            "policy lets writes through when it fails",
            |m| policy_mut(m).failure_policy = Some("Ignore".into()),
            "failurePolicy Some(\"Ignore\")",
        ),
        (
            "policy misses DELETE",
            |m| {
                let ops = match_rule_mut(m).operations.as_mut().unwrap();
                ops.retain(|o| o != "DELETE");
            },
            "no ValidatingAdmissionPolicy of the agent's matches DELETE of enim.io/netresourcesets",
        ),
        (
            "policy misses the status",
            |m| {
                let r = match_rule_mut(m).resources.as_mut().unwrap();
                r.retain(|r| r != "netresourcesets/status");
            },
            "matches UPDATE of enim.io/netresourcesets/status",
        ),
        (
            "policy for a version the CRD does not serve",
            |m| match_rule_mut(m).api_versions = Some(vec!["v1".into()]),
            "matches CREATE of enim.io/netresourcesets (every served version)",
        ),
        (
            "policy limited to labelled sets",
            |m| {
                let c = policy_mut(m).match_constraints.as_mut().unwrap();
                c.object_selector = Some(LabelSelector {
                    match_labels: labels(&[("enim.io/checked", "true")]),
                    ..Default::default()
                });
            },
            "matchConstraints has selectors or exclusions",
        ),
        (
            "policy compares the namespace",
            |m| {
                let v = &mut policy_mut(m).validations.as_mut().unwrap()[0];
                v.expression = v.expression.replace("request.name", "request.namespace");
            },
            "no validation compares the token's authentication.kubernetes.io/node-name \
             with request.name",
        ),
        (
            "policy compares another claim",
            |m| {
                let v = &mut policy_mut(m).variables.as_mut().unwrap()[0];
                v.expression = v.expression.replace("node-name", "pod-name");
            },
            "no validation compares the token's authentication.kubernetes.io/node-name",
        ),
        // The DRA policies.
        (
            "slice policy misses DELETE",
            |m| {
                let ops = named_rule_mut(m, SLICES).operations.as_mut().unwrap();
                ops.retain(|o| o != "DELETE");
            },
            "no ValidatingAdmissionPolicy of the agent's matches DELETE of \
             resource.k8s.io/resourceslices (every served version): nothing keeps an agent \
             to its own node's ResourceSlice",
        ),
        (
            "slice policy for v1 only",
            |m| named_rule_mut(m, SLICES).api_versions = Some(vec!["v1".into()]),
            "matches CREATE of resource.k8s.io/resourceslices (every served version)",
        ),
        (
            "slice policy for namespaced objects",
            |m| named_rule_mut(m, SLICES).scope = Some("Namespaced".into()),
            "matches UPDATE of resource.k8s.io/resourceslices",
        ),
        (
            "slice policy ignores the slice before the update",
            |m| edit_slice_variable(m, "oldNode", "oldObject.spec", "object.spec"),
            "ValidatingAdmissionPolicy enim-agent-own-slices: no validation compares the \
             token's authentication.kubernetes.io/node-name with object.spec.nodeName and \
             oldObject.spec.nodeName",
        ),
        (
            "slice policy compares the slice's name",
            |m| {
                let node = "object.spec.?nodeName.orValue('')";
                edit_slice_variable(m, "newNode", node, "object.metadata.name");
            },
            "enim-agent-own-slices: no validation compares the token's \
             authentication.kubernetes.io/node-name with object.spec.nodeName",
        ),
        (
            "slice policy ignores the old slice's name",
            |m| edit_slice_variable(m, "oldName", "oldObject.metadata", "object.metadata"),
            "ValidatingAdmissionPolicy enim-agent-own-slices: no validation compares the \
             token's authentication.kubernetes.io/node-name with object.metadata.name and \
             oldObject.metadata.name",
        ),
        (
            "slice policy takes the node's name for the slice's",
            |m| edit_slice_variable(m, "ownSlice", " + '-enim.io'", ""),
            "enim-agent-own-slices: no validation compares the token's \
             authentication.kubernetes.io/node-name with object.metadata.name",
        ),
        (
            "slice policy ignores the pool",
            |m| edit_slice_variable(m, "newPool", "object.spec.pool.name", "variables.node"),
            "ValidatingAdmissionPolicy enim-agent-own-slices: no validation compares the \
             token's authentication.kubernetes.io/node-name with object.spec.pool.name and \
             oldObject.spec.pool.name",
        ),
        (
            "slice policy only warns",
            |m| {
                let b = by_name_mut(&mut m.policy_bindings, SLICES);
                b.spec.as_mut().unwrap().validation_actions = Some(vec!["Audit".into()]);
            },
            "ValidatingAdmissionPolicyBinding enim-agent-own-slices: validationActions \
             [\"Audit\"] lack Deny",
        ),
        (
            "claim policy on the claim, not its status",
            |m| named_rule_mut(m, CLAIMS).resources = Some(vec!["resourceclaims".into()]),
            "no ValidatingAdmissionPolicy of the agent's matches UPDATE of \
             resource.k8s.io/resourceclaims/status (every served version): nothing keeps an \
             agent to its own node's ResourceClaims",
        ),
        (
            "claim policy for cluster-scoped objects",
            |m| named_rule_mut(m, CLAIMS).scope = Some("Cluster".into()),
            "matches UPDATE of resource.k8s.io/resourceclaims/status",
        ),
        (
            "claim policy ignores the claim before the update",
            |m| edit_claim_variable(m, "oldPools", "oldObject.?status", "object.?status"),
            "ValidatingAdmissionPolicy enim-agent-own-claims: no validation compares the \
             token's authentication.kubernetes.io/node-name with \
             oldObject.status.allocation.devices.results",
        ),
        (
            "claim policy counts every driver's devices",
            |m| {
                let f = ".filter(r, r.driver == 'enim.io')";
                edit_claim_variable(m, "oldPools", f, "");
            },
            "enim-agent-own-claims: no validation compares the token's \
             authentication.kubernetes.io/node-name with \
             oldObject.status.allocation.devices.results",
        ),
        (
            "claim policy lets the allocation change",
            |m| drop_validation(m, CLAIMS, "status.?allocation =="),
            "ValidatingAdmissionPolicy enim-agent-own-claims: no validation keeps a \
             ResourceClaim's status.allocation unchanged",
        ),
        (
            "claim policy checks the allocation against itself",
            |m| {
                let new = "object.?status.?allocation ==";
                edit_validation(m, CLAIMS, new, "oldObject.?status.?allocation ==");
            },
            "no validation keeps a ResourceClaim's status.allocation unchanged",
        ),
        (
            "claim policy lets reservedFor change",
            |m| drop_validation(m, CLAIMS, "status.?reservedFor =="),
            "ValidatingAdmissionPolicy enim-agent-own-claims: no validation keeps a \
             ResourceClaim's status.reservedFor unchanged",
        ),
        (
            "claim policy compares the old entries with themselves",
            |m| edit_claim_variable(m, "newDevices", "object.?status", "oldObject.?status"),
            "ValidatingAdmissionPolicy enim-agent-own-claims: no validation compares the \
             token's authentication.kubernetes.io/node-name with object.status.devices and \
             oldObject.status.devices",
        ),
        (
            "claim policy lets the agent write any pool's entries",
            |m| edit_validation(m, CLAIMS, "d.pool == variables.node", "true"),
            "enim-agent-own-claims: no validation compares the token's \
             authentication.kubernetes.io/node-name with object.status.devices",
        ),
        (
            "claim policy unbound",
            |m| {
                m.policy_bindings
                    .retain(|b| b.metadata.name.as_deref() != Some(CLAIMS))
            },
            "no ValidatingAdmissionPolicyBinding names ValidatingAdmissionPolicy \
             enim-agent-own-claims",
        ),
        (
            "policy unbound",
            |m| m.policy_bindings.clear(),
            "no ValidatingAdmissionPolicyBinding names ValidatingAdmissionPolicy \
             enim-agent-own-node",
        ),
        (
            "binding of another policy",
            |m| policy_binding_mut(m).policy_name = Some("enim-other".into()),
            "no ValidatingAdmissionPolicyBinding names",
        ),
        (
            "binding only warns",
            |m| policy_binding_mut(m).validation_actions = Some(vec!["Warn".into()]),
            "validationActions [\"Warn\"] lack Deny",
        ),
        (
            "binding narrowed to labelled sets",
            |m| {
                policy_binding_mut(m).match_resources = Some(MatchResources {
                    object_selector: Some(LabelSelector {
                        match_labels: labels(&[("enim.io/checked", "true")]),
                        ..Default::default()
                    }),
                    ..Default::default()
                })
            },
            "ValidatingAdmissionPolicyBinding enim-agent-own-node: matchResources narrows",
        ),
        // The DRA DeviceClass.
        (
            "DeviceClass gone",
            |m| m.device_classes.clear(),
            "expected exactly one DeviceClass, found 0",
        ),
        (
            "DeviceClass renamed",
            |m| m.device_classes[0].metadata.name = Some("eni.example.com".into()),
            "DeviceClass \"eni.example.com\" is not eni.enim.io",
        ),
        (
            "DeviceClass of another driver",
            |m| {
                let cel = class_selectors_mut(m)[0].cel.as_mut().unwrap();
                cel.expression = "device.driver == \"gpu.example.com\"".into();
            },
            "DeviceClass eni.enim.io has no selector `device.driver == \"enim.io\"`",
        ),
        (
            "DeviceClass of every driver",
            |m| m.device_classes[0].spec.selectors = None,
            "DeviceClass eni.enim.io has no selector `device.driver == \"enim.io\"`",
        ),
        (
            "DeviceClass narrowed to a subnet",
            |m| {
                class_selectors_mut(m).push(DeviceSelector {
                    cel: Some(CELDeviceSelector {
                        expression: "device.attributes[\"enim.io\"].subnet == \"subnet-a\"".into(),
                    }),
                })
            },
            "DeviceClass eni.enim.io has 2 selectors",
        ),
        (
            "DeviceClass with opaque config",
            |m| {
                m.device_classes[0].spec.config = Some(vec![DeviceClassConfiguration {
                    opaque: Some(OpaqueDeviceConfiguration {
                        driver: "enim.io".into(),
                        parameters: RawExtension(serde_json::json!({"mtu": 9001})),
                    }),
                }])
            },
            "DeviceClass eni.enim.io passes opaque config",
        ),
        (
            "DeviceClass as the device plugin's resource",
            |m| m.device_classes[0].spec.extended_resource_name = Some("enim.io/eni".into()),
            "DeviceClass eni.enim.io sets extendedResourceName Some(\"enim.io/eni\")",
        ),
        (
            "DeviceClass with a namespace",
            |m| m.device_classes[0].metadata.namespace = Some("enim-system".into()),
            "DeviceClass Some(\"eni.enim.io\") is cluster-scoped but names namespace",
        ),
        // The CRD.
        (
            "CRD renamed",
            |m| {
                let crd = &mut m.crds[0];
                crd.metadata.name = Some("netresourcesets.enim.example".into());
                crd.spec.group = "enim.example".into();
            },
            "is not netresourcesets.enim.io, which the RBAC and the admission policy name",
        ),
        (
            "CRD gone",
            |m| m.crds.clear(),
            "expected exactly one CustomResourceDefinition, found 0",
        ),
        (
            "CRD without a status subresource",
            |m| m.crds[0].spec.versions[0].subresources = None,
            "version v1alpha1 has no status subresource",
        ),
        (
            "CRD namespaced",
            |m| m.crds[0].spec.scope = "Namespaced".into(),
            "netresourcesets.enim.io is Namespaced-scoped",
        ),
        // The operator's Deployment.
        (
            "operator without a ServiceAccount",
            |m| {
                m.service_accounts
                    .retain(|s| s.metadata.name.as_deref() != Some(OPERATOR))
            },
            "no ServiceAccount enim-operator",
        ),
        (
            "operator Deployment gone",
            |m| m.deployments.clear(),
            "expected the one Deployment enim-operator, found []",
        ),
        (
            "one operator",
            |m| {
                by_name_mut(&mut m.deployments, OPERATOR)
                    .spec
                    .as_mut()
                    .unwrap()
                    .replicas = Some(1)
            },
            "Deployment enim-operator: replicas Some(1), not 2",
        ),
        (
            "operator selecting the agent's pods",
            |m| {
                let d = by_name_mut(&mut m.deployments, OPERATOR);
                d.spec.as_mut().unwrap().selector.match_labels =
                    labels(&[("app.kubernetes.io/name", "enim")]);
            },
            "Deployment enim-operator and DaemonSet Some(\"enimd\") select each other's pods",
        ),
        (
            "replicas may share a node",
            |m| operator_spec_mut(m).affinity = None,
            "no required pod anti-affinity on kubernetes.io/hostname",
        ),
        (
            "replicas apart per zone only",
            |m| {
                let a = operator_spec_mut(m).affinity.as_mut().unwrap();
                let anti = a.pod_anti_affinity.as_mut().unwrap();
                let terms = anti
                    .required_during_scheduling_ignored_during_execution
                    .as_mut()
                    .unwrap();
                terms[0].topology_key = "topology.kubernetes.io/zone".into();
            },
            "no required pod anti-affinity on kubernetes.io/hostname",
        ),
        (
            "operator as the default ServiceAccount",
            |m| operator_spec_mut(m).service_account_name = None,
            "Deployment enim-operator: serviceAccountName None, not enim-operator",
        ),
        (
            "operator without a token",
            |m| operator_spec_mut(m).automount_service_account_token = Some(false),
            "Deployment enim-operator mounts no service account token",
        ),
        (
            "operator on the pod network",
            |m| operator_spec_mut(m).host_network = None,
            "Deployment enim-operator: hostNetwork is not true",
        ),
        (
            "operator may run as root",
            |m| operator_pod_security_mut(m).run_as_non_root = None,
            "Deployment enim-operator: runAsNonRoot is None, not true",
        ),
        (
            "operator as uid 0",
            |m| operator_security_mut(m).run_as_user = Some(0),
            "Deployment enim-operator runs as uid 0",
        ),
        (
            "operator with a writable root",
            |m| operator_security_mut(m).read_only_root_filesystem = Some(false),
            "Deployment enim-operator has a writable root filesystem",
        ),
        (
            "operator keeps its capabilities",
            |m| operator_caps_mut(m).drop = None,
            "Deployment enim-operator does not drop ALL capabilities",
        ),
        (
            "operator with NET_ADMIN",
            |m| operator_caps_mut(m).add = Some(vec!["NET_ADMIN".into()]),
            "Deployment enim-operator adds capabilities",
        ),
        (
            "operator may escalate",
            |m| operator_security_mut(m).allow_privilege_escalation = None,
            "Deployment enim-operator allows privilege escalation",
        ),
        (
            "operator without seccomp",
            |m| operator_pod_security_mut(m).seccomp_profile = None,
            "Deployment enim-operator runs with seccomp None",
        ),
        (
            "operator of another image",
            |m| operator_mut(m).image = Some("enim-operator:0.1.0".into()),
            "Deployment enim-operator image Some(\"enim-operator:0.1.0\") differs",
        ),
        (
            "operator named by its uid",
            |m| {
                let var = operator_env_mut(m, "POD_NAME");
                let field = var.value_from.as_mut().unwrap().field_ref.as_mut().unwrap();
                field.field_path = "metadata.uid".into();
            },
            "env POD_NAME comes from Some(\"metadata.uid\")",
        ),
        (
            "operator without its namespace",
            |m| {
                let env = operator_mut(m).env.as_mut().unwrap();
                env.retain(|e| e.name != "POD_NAMESPACE");
            },
            "env POD_NAMESPACE comes from None",
        ),
        (
            "readiness on a port number",
            |m| {
                operator_http_get_mut(&mut operator_mut(m).readiness_probe).port =
                    IntOrString::Int(9470)
            },
            "readinessProbe port Int(9470) is not the named port health",
        ),
        (
            "health port renamed",
            |m| operator_mut(m).ports.as_mut().unwrap()[0].name = Some("http".into()),
            "Deployment enim-operator: no container port named health",
        ),
        (
            "liveness on /readyz",
            |m| {
                operator_http_get_mut(&mut operator_mut(m).liveness_probe).path =
                    Some("/readyz".into())
            },
            "livenessProbe path Some(\"/readyz\"), not /healthz",
        ),
        (
            "operator reads another file",
            |m| operator_command_mut(m)[2] = "/etc/enim/other.toml".into(),
            "--config /etc/enim/other.toml is not /etc/enim/operator.toml",
        ),
        (
            "operator reads the agent's ConfigMap",
            |m| {
                let v = named_mut(&mut operator_spec_mut(m).volumes, "config", |v| &v.name);
                v.config_map.as_mut().unwrap().name = "enimd-config".into();
            },
            "comes from Some((\"enimd-config\", \"operator.toml\")), not ConfigMap enim-operator",
        ),
        (
            "operator's config mounted elsewhere",
            |m| {
                let c = operator_mut(m);
                named_mut(&mut c.volume_mounts, "config", |v| &v.name).mount_path =
                    "/etc/operator".into();
            },
            "--config /etc/enim/operator.toml comes from None",
        ),
        (
            "operator's config mount writable",
            |m| {
                let c = operator_mut(m);
                named_mut(&mut c.volume_mounts, "config", |v| &v.name).read_only = None;
            },
            "Deployment enim-operator: its config mount is writable",
        ),
        (
            "operator.toml broken",
            |m| {
                let cm = by_name_mut(&mut m.config_maps, OPERATOR);
                let data = cm.data.as_mut().unwrap();
                data.insert("operator.toml".into(), "[operator\n".into());
            },
            "ConfigMap enim-operator operator.toml is not TOML",
        ),
        (
            "operator settings on the command line",
            |m| operator_command_mut(m).extend(["--cluster".into(), "x".into()]),
            "Deployment enim-operator command: --cluster: keep settings in the ConfigMap",
        ),
        (
            "operator logs text",
            |m| {
                let line = operator_command_mut(m);
                let at = line.iter().position(|a| a == "--log-format").unwrap();
                line.drain(at..at + 2);
            },
            "Deployment enim-operator logs text (the default), not json",
        ),
        (
            "operator runs another binary",
            |m| operator_command_mut(m)[0] = "/usr/local/bin/enimd".into(),
            "Deployment enim-operator runs /usr/local/bin/enimd, not enim-operator",
        ),
        (
            "operator with a hostPath",
            |m| {
                let spec = operator_spec_mut(m);
                let mut v = spec.volumes.as_ref().unwrap()[0].clone();
                v.name = "state".into();
                v.config_map = None;
                v.host_path = Some(HostPathVolumeSource {
                    path: "/var/lib/enim".into(),
                    type_: None,
                });
                spec.volumes.as_mut().unwrap().push(v);
                let c = &mut spec.containers[0];
                let mut mnt = c.volume_mounts.as_ref().unwrap()[0].clone();
                mnt.name = "state".into();
                mnt.mount_path = "/var/lib/enim".into();
                c.volume_mounts.as_mut().unwrap().push(mnt);
            },
            "Deployment enim-operator: hostPath volume state: it needs nothing of the node",
        ),
    ];
    assert!(check(&good).is_empty(), "the unbroken manifests must pass");
    for (name, break_it, needle) in cases {
        let mut m = good.clone();
        break_it(&mut m);
        expect_problem(name, &m, needle);
    }
}
