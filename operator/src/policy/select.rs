//! Which [`EniPolicy`] applies to a pod: pure, no I/O.
//!
//! The order of precedence, when several policies select one pod, is
//! [`select`]'s: the highest `priority`, then the most specific, then the
//! oldest, then the name in byte order; so the choice never depends on the
//! order the API server lists policies in. Label selectors have
//! Kubernetes' meaning (kube's `Selector`): `matchLabels` AND every
//! `matchExpressions` term (In, NotIn, Exists, DoesNotExist); an empty or
//! absent selector selects every pod.

use std::borrow::Borrow;
use std::collections::BTreeMap;

use enim_crd::EniPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::core::{Selector, SelectorExt};
use kube::ResourceExt;

/// What selection needs of a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodFacts<'a> {
    pub labels: &'a BTreeMap<String, String>,
    pub namespace_labels: &'a BTreeMap<String, String>,
    /// The pod's ServiceAccount ("default" when the pod names none).
    pub service_account: &'a str,
}

/// A policy whose selector cannot select anything: an operator the label
/// selector grammar does not have.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("EniPolicy {policy}: {which} is invalid: {why}")]
pub struct InvalidSelector {
    pub policy: String,
    pub which: &'static str,
    pub why: String,
}

/// Whether `policy` selects the pod; `Err` when one of its selectors is
/// malformed (the policy then selects nothing, and says why).
pub fn selects(policy: &EniPolicy, pod: &PodFacts<'_>) -> Result<bool, InvalidSelector> {
    let accounts = &policy.spec.service_accounts;
    Ok(selects_namespace(policy, pod.namespace_labels)?
        && matches(policy, "podSelector", &policy.spec.pod_selector, pod.labels)?
        && (accounts.is_empty() || accounts.iter().any(|a| a == pod.service_account)))
}

/// Whether `policy`'s namespace selector selects a namespace of these
/// labels (whatever its pods).
pub fn selects_namespace(
    policy: &EniPolicy,
    namespace_labels: &BTreeMap<String, String>,
) -> Result<bool, InvalidSelector> {
    matches(
        policy,
        "namespaceSelector",
        &policy.spec.namespace_selector,
        namespace_labels,
    )
}

/// The first of `policy`'s selectors that is malformed, if any.
pub fn invalid_selector(policy: &EniPolicy) -> Option<InvalidSelector> {
    let none = BTreeMap::new();
    [
        ("namespaceSelector", &policy.spec.namespace_selector),
        ("podSelector", &policy.spec.pod_selector),
    ]
    .into_iter()
    .find_map(|(which, selector)| matches(policy, which, selector, &none).err())
}

/// Whether `selector` (`which` of `policy`'s) selects `labels`; an absent
/// one selects everything.
fn matches(
    policy: &EniPolicy,
    which: &'static str,
    selector: &Option<LabelSelector>,
    labels: &BTreeMap<String, String>,
) -> Result<bool, InvalidSelector> {
    let Some(selector) = selector else {
        return Ok(true);
    };
    let parsed = Selector::try_from(selector.clone()).map_err(|e| InvalidSelector {
        policy: policy.name_any(),
        which,
        why: e.to_string(),
    })?;
    Ok(parsed.matches(labels))
}

/// How narrowly `policy` selects: one for each selector term and one for a
/// ServiceAccount list; the second key of precedence.
pub fn specificity(policy: &EniPolicy) -> usize {
    let terms = |s: &Option<LabelSelector>| {
        s.as_ref().map_or(0, |s| {
            s.match_labels.as_ref().map_or(0, BTreeMap::len)
                + s.match_expressions.as_ref().map_or(0, Vec::len)
        })
    };
    terms(&policy.spec.namespace_selector)
        + terms(&policy.spec.pod_selector)
        + usize::from(!policy.spec.service_accounts.is_empty())
}

/// The one policy that applies to `pod` among `policies`, in this order of
/// precedence:
/// 1. the highest `priority`;
/// 2. then the most specific (more selector terms; a ServiceAccount list
///    counts as one);
/// 3. then the oldest (`metadata.creationTimestamp`);
/// 4. then the name, in byte order.
///
/// A policy being deleted selects nothing. A policy with a malformed
/// selector selects nothing either; its error is returned beside the
/// choice so that the caller can report it.
pub fn select<'p, P: Borrow<EniPolicy>>(
    policies: &'p [P],
    pod: &PodFacts<'_>,
) -> (Option<&'p EniPolicy>, Vec<InvalidSelector>) {
    let mut invalid = Vec::new();
    let mut best: Option<&EniPolicy> = None;
    for p in policies {
        let p = p.borrow();
        if p.metadata.deletion_timestamp.is_some() {
            continue;
        }
        match selects(p, pod) {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => {
                invalid.push(e);
                continue;
            }
        }
        best = Some(match best {
            Some(b) if precedes(b, p) => b,
            _ => p,
        });
    }
    (best, invalid)
}

/// Whether `a` wins over `b` by [`select`]'s order.
fn precedes(a: &EniPolicy, b: &EniPolicy) -> bool {
    let created = |p: &EniPolicy| p.metadata.creation_timestamp.as_ref().map(|t| t.0);
    let key = |p: &EniPolicy| {
        (
            std::cmp::Reverse(p.spec.priority),
            std::cmp::Reverse(specificity(p)),
            // Absent sorts last: a policy not yet persisted is the newest.
            created(p).is_none(),
            created(p),
        )
    };
    (key(a), a.name_any()) < (key(b), b.name_any())
}

#[cfg(test)]
mod tests;
