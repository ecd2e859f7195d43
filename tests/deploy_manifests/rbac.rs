//! What each ServiceAccount may do in the API: exactly what the agent's
//! `cluster` provider and DRA plugin and the operator use, nothing granted
//! to anyone else, the NetResourceSet CRD those grants name, and the
//! admission policies that keep each agent's writes to its own node's
//! NetResourceSet, ResourceSlice and ResourceClaims (RBAC cannot say "the
//! caller's node").
//!
//! These are checks of the objects as written; operator/tests/rbac.rs
//! applies the same files to a real API server and tries the requests.

use std::fmt;

use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MatchResources, NamedRuleWithOperations, ValidatingAdmissionPolicySpec,
};
use k8s_openapi::api::rbac::v1::{PolicyRule, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::*;

const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

/// One permission: a verb on a resource of an API group, in one namespace
/// or (None) in all of them.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Grant {
    namespace: Option<String>,
    group: String,
    /// `resource` or `resource/subresource`, with `[names]` when the rule
    /// is limited to some objects.
    resource: String,
    verb: String,
}

impl Grant {
    fn wildcard(&self) -> bool {
        [&self.group, &self.resource, &self.verb]
            .iter()
            .any(|s| s.contains('*'))
    }
}

impl fmt::Display for Grant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let group = if self.group.is_empty() {
            "core"
        } else {
            &self.group
        };
        let at = self.namespace.as_deref().unwrap_or("all namespaces");
        write!(f, "{} {group}/{} in {at}", self.verb, self.resource)
    }
}

/// `verbs` on `resource` of `group`, in `namespace` (None: everywhere).
fn grants(namespace: Option<&str>, group: &str, resource: &str, verbs: &[&str]) -> Vec<Grant> {
    verbs
        .iter()
        .map(|v| Grant {
            namespace: namespace.map(str::to_owned),
            group: group.into(),
            resource: resource.into(),
            verb: (*v).into(),
        })
        .collect()
}

/// What `rule` grants, where a binding puts it (`at`).
fn rule_grants(rule: &PolicyRule, at: Option<&str>, out: &mut BTreeSet<Grant>) {
    let names = match rule.resource_names.as_deref() {
        Some(n) if !n.is_empty() => format!("[{}]", n.join(",")),
        _ => String::new(),
    };
    let mut resources = vec![];
    for g in rule.api_groups.iter().flatten() {
        for r in rule.resources.iter().flatten() {
            resources.push((g.clone(), format!("{r}{names}")));
        }
    }
    for u in rule.non_resource_urls.iter().flatten() {
        resources.push((String::new(), format!("nonResourceURL {u}")));
    }
    for (group, resource) in resources {
        for verb in &rule.verbs {
            out.insert(Grant {
                namespace: at.map(str::to_owned),
                group: group.clone(),
                resource: resource.clone(),
                verb: verb.clone(),
            });
        }
    }
}

/// One binding as it grants: to whom, where, which rules.
struct Bound<'a> {
    subjects: &'a [Subject],
    at: Option<&'a str>,
    rules: &'a [PolicyRule],
}

/// Every binding in deploy/ with the rules of the role it names. A binding
/// to a role deploy/ does not define (cluster-admin, say) is a problem: what
/// it grants cannot be checked here. So is a subject other than one of
/// deploy/'s own ServiceAccounts.
fn bindings<'a>(m: &'a Manifests, p: &mut Problems) -> Vec<Bound<'a>> {
    let mut out = vec![];
    let all = m
        .cluster_role_bindings
        .iter()
        .map(|b| ("ClusterRoleBinding", &b.metadata, &b.role_ref, &b.subjects))
        .chain(
            m.role_bindings
                .iter()
                .map(|b| ("RoleBinding", &b.metadata, &b.role_ref, &b.subjects)),
        );
    for (kind, meta, role_ref, subjects) in all {
        let name = meta.name.as_deref().unwrap_or_default();
        let at = if kind == "RoleBinding" {
            meta.namespace.as_deref()
        } else {
            None
        };
        let subjects = subjects.as_deref().unwrap_or_default();
        for s in subjects {
            let ours = s.kind == "ServiceAccount"
                && m.service_accounts.iter().any(|sa| {
                    sa.metadata.name.as_deref() == Some(&s.name)
                        && sa.metadata.namespace == s.namespace
                });
            p.check(ours, || {
                format!(
                    "{kind} {name} binds {} {} (namespace {:?}): only deploy/'s own \
                     ServiceAccounts are bound",
                    s.kind, s.name, s.namespace
                )
            });
        }
        if let Some(rules) = bound_rules(m, kind, name, at, role_ref, p) {
            out.push(Bound {
                subjects,
                at,
                rules,
            });
        }
    }
    out
}

/// The rules of the role `role_ref` names, from deploy/.
fn bound_rules<'a>(
    m: &'a Manifests,
    kind: &str,
    name: &str,
    at: Option<&str>,
    role_ref: &RoleRef,
    p: &mut Problems,
) -> Option<&'a [PolicyRule]> {
    p.check(role_ref.api_group == RBAC_GROUP, || {
        format!(
            "{kind} {name} refers to a role of API group {:?}",
            role_ref.api_group
        )
    });
    let rules = match (role_ref.kind.as_str(), at) {
        ("ClusterRole", _) => by_name(&m.cluster_roles, &role_ref.name).map(|r| &r.rules),
        ("Role", Some(ns)) => m
            .roles
            .iter()
            .find(|r| {
                r.metadata.name.as_deref() == Some(&role_ref.name)
                    && r.metadata.namespace.as_deref() == Some(ns)
            })
            .map(|r| &r.rules),
        _ => None,
    };
    if rules.is_none() {
        p.0.push(format!(
            "{kind} {name} refers to {} {} (namespace {at:?}), which deploy/ does not define: \
             what it grants cannot be checked",
            role_ref.kind, role_ref.name
        ));
    }
    rules.map(|r| r.as_deref().unwrap_or_default())
}

/// Whether `s` names ServiceAccount `ns`/`name`: itself, its user name or a
/// group every service account (of that namespace) is in.
fn names_sa(s: &Subject, ns: &str, name: &str) -> bool {
    match s.kind.as_str() {
        "ServiceAccount" => s.name == name && s.namespace.as_deref() == Some(ns),
        "User" => s.name == format!("system:serviceaccount:{ns}:{name}"),
        "Group" => {
            s.name == "system:serviceaccounts"
                || s.name == "system:authenticated"
                || s.name == format!("system:serviceaccounts:{ns}")
        }
        _ => false,
    }
}

/// Everything deploy/ grants ServiceAccount `ns`/`sa`.
fn grants_of(bound: &[Bound], ns: &str, sa: &str) -> BTreeSet<Grant> {
    let mut out = BTreeSet::new();
    for b in bound {
        if b.subjects.iter().any(|s| names_sa(s, ns, sa)) {
            for rule in b.rules {
                rule_grants(rule, b.at, &mut out);
            }
        }
    }
    out
}

/// Checks that `who` is granted exactly `want`.
fn exactly(who: &str, got: &BTreeSet<Grant>, want: &BTreeSet<Grant>, p: &mut Problems) {
    for g in got.iter().filter(|g| g.wildcard()) {
        p.0.push(format!("{who} is granted a wildcard: {g}"));
    }
    let show = |set: BTreeSet<&Grant>| {
        set.into_iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let extra: BTreeSet<&Grant> = got.difference(want).collect();
    p.check(extra.is_empty(), || {
        format!("{who} is granted more than it uses: {}", show(extra))
    });
    let missing: BTreeSet<&Grant> = want.difference(got).collect();
    p.check(missing.is_empty(), || {
        format!("{who} lacks {}", show(missing))
    });
}

pub(crate) fn check(m: &Manifests, p: &mut Problems) {
    let versions = check_crd(m, p);
    let Some(ns) = m
        .namespaces
        .first()
        .and_then(|n| n.metadata.name.as_deref())
    else {
        return;
    };
    for r in &m.cluster_roles {
        p.check(r.aggregation_rule.is_none(), || {
            format!(
                "ClusterRole {:?} aggregates other roles: what it grants cannot be checked",
                r.metadata.name
            )
        });
    }
    let bound = bindings(m, p);

    // The agent's `cluster` provider reads NetResourceSets (its own, with a
    // field selector; RBAC cannot narrow list/watch to it) and writes
    // their status. Everything else about a set is the operator's.
    // Its DRA plugin reads its Node (the slice's owner), applies its
    // node's ResourceSlice (no delete: the kubelet's, once the plugin is
    // gone), reads the claims it prepares (by name, never a list) and
    // patches their status with the ENI's networkData. Both components post
    // Events (events.k8s.io: create, and patch to fold a repeat), in every
    // namespace (a pod's event goes to the pod's), and never read them.
    // With `[host_path] service_cidrs_from_api` it also lists and watches
    // the cluster's ServiceCIDRs (cluster-scoped), and only then.
    let events = grants(None, "events.k8s.io", "events", &["create", "patch"]);
    let nrs = CRD_PLURAL;
    let status = format!("{CRD_PLURAL}/status");
    let follows_service_cidrs = agent_config(m, &mut Problems::default())
        .is_some_and(|(c, _)| c.host_path.service_cidrs_from_api);
    let service_cidrs = match follows_service_cidrs {
        true => grants(
            None,
            "networking.k8s.io",
            "servicecidrs",
            &["list", "watch"],
        ),
        false => vec![],
    };
    let agent: BTreeSet<Grant> = [
        grants(None, CRD_GROUP, nrs, &["get", "list", "watch"]),
        grants(None, CRD_GROUP, &status, &["get", "patch", "update"]),
        grants(None, "", "nodes", &["get"]),
        grants(
            None,
            DRA_GROUP,
            "resourceslices",
            &["get", "create", "patch"],
        ),
        grants(None, DRA_GROUP, "resourceclaims", &["get"]),
        grants(None, DRA_GROUP, "resourceclaims/status", &["patch"]),
        events.clone(),
        service_cidrs,
    ]
    .concat()
    .into_iter()
    .collect();
    let who = format!("ServiceAccount {AGENT_SA} (the agent)");
    exactly(&who, &grants_of(&bound, ns, AGENT_SA), &agent, p);

    // The operator reads Nodes, creates NetResourceSets and patches them
    // (server-side apply; the finalizer's removal), never their status
    // and never a delete (the garbage collector's), reads ResourceClaims
    // (ENIs made on demand for DRA claims), and holds its leader Lease in
    // its own namespace (and watches it, for its leader deadline).
    let operator: BTreeSet<Grant> = [
        grants(None, "", "nodes", &["get", "list", "watch"]),
        grants(
            None,
            "resource.k8s.io",
            "resourceclaims",
            &["get", "list", "watch"],
        ),
        grants(
            None,
            CRD_GROUP,
            nrs,
            &["get", "list", "watch", "create", "patch"],
        ),
        grants(
            Some(ns),
            "coordination.k8s.io",
            "leases",
            &["get", "list", "watch", "create", "patch"],
        ),
        events,
    ]
    .concat()
    .into_iter()
    .collect();
    let who = format!("ServiceAccount {OPERATOR}");
    exactly(&who, &grants_of(&bound, ns, OPERATOR), &operator, p);

    check_policy(m, ns, &versions, p);
}

/// The CRD the grants and the policy name; returns its served versions.
fn check_crd(m: &Manifests, p: &mut Problems) -> Vec<String> {
    let Some(crd) = one(&m.crds, "CustomResourceDefinition", p) else {
        return vec![];
    };
    let want = format!("{CRD_PLURAL}.{CRD_GROUP}");
    let spec = &crd.spec;
    let named = format!("{}.{}", spec.names.plural, spec.group);
    p.check(
        crd.metadata.name.as_deref() == Some(&want) && named == want,
        || {
            format!(
                "CustomResourceDefinition {:?} (of {named}) is not {want}, which the RBAC \
                 and the admission policy name",
                crd.metadata.name
            )
        },
    );
    // One set per node, named after it: the policy compares the name with
    // the node's.
    p.check(spec.scope == "Cluster", || {
        format!(
            "CustomResourceDefinition {want} is {}-scoped: a NetResourceSet is named after \
             its node, cluster-wide",
            spec.scope
        )
    });
    for v in &spec.versions {
        let has_status = v.subresources.as_ref().and_then(|s| s.status.as_ref());
        p.check(has_status.is_some(), || {
            format!(
                "CustomResourceDefinition {want} version {} has no status subresource: \
                 the agent is granted {CRD_PLURAL}/status only",
                v.name
            )
        });
    }
    spec.versions
        .iter()
        .filter(|v| v.served)
        .map(|v| v.name.clone())
        .collect()
}

/// `text` without whitespace, with single quotes as double ones.
pub(crate) fn squeeze(text: &str) -> String {
    text.chars()
        .filter(|c| !c.is_whitespace())
        .map(|c| if c == '\'' { '"' } else { c })
        .collect()
}

fn ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Byte offsets where `ident` (a dotted name like `request.name`) stands
/// whole in CEL `text`: not part of a longer name or member access.
fn ident_at(text: &str, ident: &str) -> Vec<usize> {
    text.match_indices(ident)
        .map(|(i, _)| i)
        .filter(|&i| {
            let before = text[..i].chars().next_back();
            let after = text[i + ident.len()..].chars().next();
            !before.is_some_and(|c| ident_char(c) || c == '.') && !after.is_some_and(ident_char)
        })
        .collect()
}

/// `text` with each whole `ident` replaced by `(with)`.
fn substitute(text: &str, ident: &str, with: &str) -> String {
    let mut out = String::new();
    let mut from = 0;
    for i in ident_at(text, ident) {
        out.push_str(&text[from..i]);
        out.push_str(&format!("({with})"));
        from = i + ident.len();
    }
    out.push_str(&text[from..]);
    out
}

/// Whether `rule` matches `op` on `resource` (maybe `resource/sub`) of
/// `group` in every one of `versions`, at the resource's scope.
fn covers(
    rule: &NamedRuleWithOperations,
    group: &str,
    versions: &[String],
    resource: &str,
    namespaced: bool,
    op: &str,
) -> bool {
    let any =
        |list: &Option<Vec<String>>, f: &dyn Fn(&str) -> bool| list.iter().flatten().any(|x| f(x));
    let (main, sub) = match resource.split_once('/') {
        Some((r, s)) => (r, Some(s)),
        None => (resource, None),
    };
    let scope = if namespaced { "Namespaced" } else { "Cluster" };
    any(&rule.api_groups, &|g| g == "*" || g == group)
        && versions
            .iter()
            .all(|v| any(&rule.api_versions, &|x| x == "*" || x == v))
        && any(&rule.operations, &|o| o == "*" || o == op)
        && any(&rule.resources, &|r| match sub {
            None => r == "*" || r == main,
            Some(s) => {
                r == "*/*" || r == resource || r == format!("{main}/*") || r == format!("*/{s}")
            }
        })
        && rule.resource_names.as_ref().is_none_or(Vec::is_empty)
        && rule.scope.as_deref().is_none_or(|s| s == "*" || s == scope)
}

/// Whether `r` narrows matching beyond its rules (selectors, exclusions).
fn narrows(r: &MatchResources) -> bool {
    let selects = |s: &Option<LabelSelector>| {
        s.as_ref().is_some_and(|s| {
            s.match_labels.as_ref().is_some_and(|l| !l.is_empty())
                || s.match_expressions.as_ref().is_some_and(|e| !e.is_empty())
        })
    };
    selects(&r.namespace_selector)
        || selects(&r.object_selector)
        || r.exclude_resource_rules
            .as_ref()
            .is_some_and(|e| !e.is_empty())
}

/// The versions of resource.k8s.io a 1.34 API server may serve: a policy
/// must hold the agent's writes through any of them.
const DRA_VERSIONS: [&str; 3] = ["v1", "v1beta1", "v1beta2"];

/// One kind of write by the agent that an admission policy must keep to
/// its own node: which operations on which resources, and what a
/// validation compares the token's node with.
struct Guarded {
    /// The object, for messages.
    what: &'static str,
    group: &'static str,
    versions: Vec<String>,
    resources: Vec<String>,
    namespaced: bool,
    ops: &'static [&'static str],
    /// Whole names a comparing validation uses (`.?` read as `.`)...
    names: Vec<&'static str>,
    /// ...and strings it holds.
    holds: Vec<String>,
}

/// The agent's writes, each to be kept to its node.
fn guarded(crd_versions: &[String]) -> Vec<Guarded> {
    let cud: &[&str] = &["CREATE", "UPDATE", "DELETE"];
    // The DRA objects an agent writes: slices (created, updated and
    // deleted) and claims' status (updated only).
    let dra = |what, resource: &str, namespaced, ops, names, holds| Guarded {
        what,
        group: DRA_GROUP,
        versions: DRA_VERSIONS.map(String::from).to_vec(),
        resources: vec![resource.into()],
        namespaced,
        ops,
        names,
        holds,
    };
    let slice = |names, holds| dra("ResourceSlice", "resourceslices", false, cud, names, holds);
    let update: &[&str] = &["UPDATE"];
    let claim_status = |names, holds| {
        dra(
            "ResourceClaims",
            "resourceclaims/status",
            true,
            update,
            names,
            holds,
        )
    };
    let driver_pool = || vec![".pool".into(), format!("\"{DRA_DRIVER}\"")];
    vec![
        // Named after its node.
        Guarded {
            what: "NetResourceSet",
            group: CRD_GROUP,
            versions: crd_versions.to_vec(),
            resources: vec![CRD_PLURAL.into(), format!("{CRD_PLURAL}/status")],
            namespaced: false,
            ops: cud,
            names: vec!["request.name"],
            holds: vec![],
        },
        // spec.nodeName, the name `<node>-<driver>` and the pool, before
        // and after: an update must not move a slice between nodes either
        // way, and no agent may take another node's slice name (nodeName is
        // immutable: that node could never publish) or pool.
        slice(
            vec!["object.spec.nodeName", "oldObject.spec.nodeName"],
            vec![],
        ),
        slice(
            vec!["object.metadata.name", "oldObject.metadata.name"],
            vec![format!("\"-{DRA_DRIVER}\"")],
        ),
        slice(
            vec!["object.spec.pool.name", "oldObject.spec.pool.name"],
            vec![],
        ),
        // The pool of each of its driver's devices allocated before the
        // write, the node's (the allocation may not change: see
        // UNCHANGED_CLAIM_STATUS)...
        claim_status(
            vec!["oldObject.status.allocation.devices.results"],
            driver_pool(),
        ),
        // ...and each entry of status.devices it writes, its driver's and
        // the node's pool.
        claim_status(
            vec!["object.status.devices", "oldObject.status.devices"],
            driver_pool(),
        ),
    ]
}

/// The fields of a claim's status an agent may not change at all: the
/// scheduler allocates and reserves, the agent only reports.
const UNCHANGED_CLAIM_STATUS: [&str; 2] = ["status.allocation", "status.reservedFor"];

/// `spec`'s validations, each with its variables expanded, squeezed, and
/// with `.?` read as `.`.
fn expanded_validations(spec: &ValidatingAdmissionPolicySpec) -> Vec<String> {
    let mut vars: Vec<(String, String)> = vec![];
    for v in spec.variables.iter().flatten() {
        let mut e = v.expression.clone();
        for (ident, with) in &vars {
            e = substitute(&e, ident, with);
        }
        vars.push((format!("variables.{}", v.name), e));
    }
    spec.validations
        .iter()
        .flatten()
        .map(|v| {
            let mut e = v.expression.clone();
            for (ident, with) in vars.iter().rev() {
                e = substitute(&e, ident, with);
            }
            squeeze(&e).replace(".?", ".")
        })
        .collect()
}

/// Whether a validation of `spec` holds `object.FIELD == oldObject.FIELD`
/// (either way round), each side whole.
fn keeps_unchanged(spec: &ValidatingAdmissionPolicySpec, field: &str) -> bool {
    let (new, old) = (format!("object.{field}"), format!("oldObject.{field}"));
    let equals = |e: &str, left: &str, right: &str| {
        ident_at(e, left).into_iter().any(|i| {
            e[i + left.len()..]
                .strip_prefix("==")
                .and_then(|r| r.strip_prefix(right))
                .is_some_and(|r| !r.starts_with(|c: char| ident_char(c) || c == '.'))
        })
    };
    expanded_validations(spec)
        .iter()
        .any(|e| equals(e, &new, &old) || equals(e, &old, &new))
}

/// A validation of `spec`, its variables expanded, that compares the
/// token's node with what `g` names.
fn compares(spec: &ValidatingAdmissionPolicySpec, g: &Guarded) -> bool {
    let extra = format!("request.userInfo.extra[\"{NODE_NAME_EXTRA}\"]");
    expanded_validations(spec).iter().any(|e| {
        e.contains(&extra)
            && e.contains("==")
            && g.names.iter().all(|n| !ident_at(e, n).is_empty())
            && g.holds.iter().all(|h| e.contains(h.as_str()))
    })
}

/// The admission policies on the agent's writes, and their bindings.
fn check_policy(m: &Manifests, ns: &str, versions: &[String], p: &mut Problems) {
    let user = format!("system:serviceaccount:{ns}:{AGENT_SA}");
    let is_agent = |c: &MatchCondition| {
        let e = squeeze(&c.expression);
        e == format!("request.userInfo.username==\"{user}\"")
            || e == format!("\"{user}\"==request.userInfo.username")
    };
    let policies: Vec<&ValidatingAdmissionPolicy> = m
        .policies
        .iter()
        .filter(|v| {
            let conditions = v.spec.as_ref().and_then(|s| s.match_conditions.as_ref());
            conditions.into_iter().flatten().any(is_agent)
        })
        .collect();
    if policies.is_empty() {
        p.0.push(format!(
            "no ValidatingAdmissionPolicy has the matchCondition \
             `request.userInfo.username == \"{user}\"`: nothing keeps an agent to its own \
             node's objects"
        ));
        return;
    }
    for policy in &policies {
        let name = policy.metadata.name.as_deref().unwrap_or_default();
        let spec = policy.spec.as_ref().unwrap();
        let what = format!("ValidatingAdmissionPolicy {name}");
        // Every condition must hold for the policy to apply: another one
        // would let some of the agent's writes through unchecked.
        for c in spec.match_conditions.iter().flatten() {
            p.check(is_agent(c), || {
                format!(
                    "{what}: matchCondition {} narrows which of the agent's writes it checks",
                    c.name
                )
            });
        }
        // Unset is Fail, the API's default.
        let failure = spec.failure_policy.as_deref();
        p.check(failure.is_none_or(|f| f == "Fail"), || {
            format!("{what}: failurePolicy {failure:?}: a write it cannot judge must be refused")
        });
        p.check(spec.param_kind.is_none(), || {
            format!("{what} takes parameters: the node's name comes from the request alone")
        });
        if let Some(c) = &spec.match_constraints {
            p.check(!narrows(c), || {
                format!("{what}: matchConstraints has selectors or exclusions: every write of the agent's must be checked")
            });
        }

        // Bound, and denying: an unbound policy checks nothing, a Warn or
        // Audit one lets the write through.
        let bound: Vec<_> = m
            .policy_bindings
            .iter()
            .filter(|b| b.spec.as_ref().and_then(|s| s.policy_name.as_deref()) == Some(name))
            .collect();
        p.check(!bound.is_empty(), || {
            format!("no ValidatingAdmissionPolicyBinding names {what}: unbound, it checks nothing")
        });
        for b in bound {
            let bname = b.metadata.name.as_deref().unwrap_or_default();
            let spec = b.spec.as_ref().unwrap();
            let actions = spec.validation_actions.as_deref().unwrap_or_default();
            p.check(actions.iter().any(|a| a == "Deny"), || {
                format!("ValidatingAdmissionPolicyBinding {bname}: validationActions {actions:?} lack Deny, so a write to another node's object goes through")
            });
            p.check(spec.match_resources.as_ref().is_none_or(|r| !narrows(r) && r.resource_rules.is_none()), || {
                format!("ValidatingAdmissionPolicyBinding {bname}: matchResources narrows the policy")
            });
        }
    }

    // Each of the agent's writes is matched by a policy of the agent's
    // whose validations compare the token's node with the object's. The
    // variables are expanded in the validations; the semantics are tried
    // on a real API server in operator/tests/rbac.rs.
    let mut found = BTreeSet::new();
    for g in guarded(versions) {
        for resource in &g.resources {
            for op in g.ops {
                let matching = matching(&policies, &g, resource, op);
                if matching.is_empty() {
                    found.insert(format!(
                        "no ValidatingAdmissionPolicy of the agent's matches {op} of {}/{resource} \
                         (every served version): nothing keeps an agent to its own node's {}",
                        g.group, g.what
                    ));
                } else if !matching
                    .iter()
                    .any(|v| compares(v.spec.as_ref().unwrap(), &g))
                {
                    found.insert(format!(
                        "ValidatingAdmissionPolicy {}: no validation compares the token's \
                         {NODE_NAME_EXTRA} with {}",
                        names_of(&matching),
                        g.names.join(" and ")
                    ));
                }
            }
        }
        // The claim's allocation and reservedFor are not the agent's to
        // write at all (a missing policy is reported above).
        if g.resources.iter().any(|r| r == "resourceclaims/status") {
            let matching = matching(&policies, &g, "resourceclaims/status", "UPDATE");
            for field in UNCHANGED_CLAIM_STATUS {
                let kept = matching
                    .iter()
                    .any(|v| keeps_unchanged(v.spec.as_ref().unwrap(), field));
                if !matching.is_empty() && !kept {
                    found.insert(format!(
                        "ValidatingAdmissionPolicy {}: no validation keeps a ResourceClaim's \
                         {field} unchanged (object.{field} == oldObject.{field}): an agent \
                         could allocate or reserve any claim",
                        names_of(&matching)
                    ));
                }
            }
        }
    }
    p.0.extend(found);
}

/// The policies among `policies` that match `op` on `resource` of `g`'s
/// group in each of its versions.
fn matching<'a>(
    policies: &[&'a ValidatingAdmissionPolicy],
    g: &Guarded,
    resource: &str,
    op: &str,
) -> Vec<&'a ValidatingAdmissionPolicy> {
    policies
        .iter()
        .copied()
        .filter(|v| {
            let rules = v
                .spec
                .as_ref()
                .and_then(|s| s.match_constraints.as_ref())
                .and_then(|c| c.resource_rules.as_deref())
                .unwrap_or_default();
            rules
                .iter()
                .any(|r| covers(r, g.group, &g.versions, resource, g.namespaced, op))
        })
        .collect()
}

fn names_of(policies: &[&ValidatingAdmissionPolicy]) -> String {
    let names: Vec<&str> = policies
        .iter()
        .map(|v| v.metadata.name.as_deref().unwrap_or_default())
        .collect();
    names.join(", ")
}
