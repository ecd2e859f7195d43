//! The webhook's decision for one pod, pure: which resource (if any) to
//! add, the annotation naming why, or a refusal.
//!
//! A pod being created that asks for no enim resource (no `enim.io/eni` or
//! `enim.io/ip` in any container's requests or limits, no
//! `resourceClaims`) gets the mode of the policy [`select`] picks, or the
//! cluster default's: the resource in its first container's limits and
//! requests (an extended resource must be equal in both), and the
//! `enim.io/policy` annotation. A pod that asks already is only annotated
//! `(explicit)`. A policy naming security groups (a whole ENI) gets its
//! pods a claim instead ([`super::claims`]); one naming subnets, or
//! groups in secondary mode, is refused with why.

use std::collections::BTreeMap;
use std::sync::Arc;

use enim_core::Mode;
use enim_crd::policy::{DEFAULT_POLICY, EXPLICIT, POLICY_ANNOTATION};
use enim_crd::EniPolicy;
use json_patch::{AddOperation, Patch, PatchOperation};
use k8s_openapi::api::core::v1::Pod;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, Operation};
use kube::ResourceExt;
use serde_json::{json, Value};

use super::claims::{serving, Serving, POD_CLAIM};
use super::select::{select, PodFacts};
use super::steer::and_terms;
use super::DefaultPolicy;
use crate::index::PoolPolicy;

/// The extended resource of a whole ENI, as the device plugin advertises it.
pub const ENI_RESOURCE: &str = "enim.io/eni";
/// The extended resource of a secondary address.
pub const IP_RESOURCE: &str = "enim.io/ip";

/// What the webhook knows of the cluster when a pod comes in.
#[derive(Debug, Clone, Copy)]
pub struct Cluster<'a> {
    /// The watch's store's own: an admission copies none.
    pub policies: &'a [Arc<EniPolicy>],
    /// The labels of the pod's namespace (empty when unknown).
    pub namespace_labels: &'a BTreeMap<String, String>,
    pub default: DefaultPolicy,
    /// The operator's node pools, as nodes are matched to them.
    pub pools: &'a [PoolPolicy],
}

/// The extended resource a mode asks for.
pub fn resource_of(mode: Mode) -> &'static str {
    match mode {
        Mode::Primary => ENI_RESOURCE,
        Mode::Secondary => IP_RESOURCE,
    }
}

/// The response to one AdmissionReview request for a pod.
pub fn admit(req: &AdmissionRequest<Pod>, cluster: Cluster<'_>) -> AdmissionResponse {
    let response = AdmissionResponse::from(req);
    let Some(pod) = req
        .object
        .as_ref()
        .filter(|_| req.operation == Operation::Create)
    else {
        return response;
    };
    let (annotation, add) = if asks_for_enim(pod) {
        (EXPLICIT.to_string(), None)
    } else {
        let labels = pod.labels();
        let facts = PodFacts {
            labels,
            namespace_labels: cluster.namespace_labels,
            service_account: pod
                .spec
                .as_ref()
                .and_then(|s| s.service_account_name.as_deref())
                .unwrap_or("default"),
        };
        match select(cluster.policies, &facts).0 {
            Some(policy) => match serving(policy, cluster.pools) {
                Ok(how) => (policy.name_any(), Some(how)),
                Err(why) => {
                    return response.deny(format!(
                        "EniPolicy {} selects this pod but cannot be served: {why}",
                        policy.name_any()
                    ))
                }
            },
            None => (
                DEFAULT_POLICY.to_string(),
                cluster
                    .default
                    .mode()
                    .map(|m| Serving::Resource(resource_of(m))),
            ),
        }
    };
    let patch = patch_for(pod, &annotation, add.as_ref());
    match response.clone().with_patch(patch) {
        Ok(r) => r,
        Err(e) => response.deny(format!("enim's webhook could not write its patch: {e}")),
    }
}

/// Whether the pod asks for enim itself: an enim resource in any
/// container, or a ResourceClaim (the DRA path).
pub fn asks_for_enim(pod: &Pod) -> bool {
    let Some(spec) = &pod.spec else {
        return false;
    };
    if spec.resource_claims.as_ref().is_some_and(|c| !c.is_empty()) {
        return true;
    }
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .filter_map(|c| c.resources.as_ref())
        .flat_map(|r| r.requests.iter().chain(r.limits.iter()))
        .any(|m| m.contains_key(ENI_RESOURCE) || m.contains_key(IP_RESOURCE))
}

/// The JSON patch: the annotation, and what the pod is served by: an
/// extended resource, `resource: "1"` in the first container's limits and
/// requests (and, steered, a required node affinity); or a claim from a
/// template, in the pod's `resourceClaims` and the first container's
/// `resources.claims`. Each map is added whole when absent (a JSON patch
/// cannot add a key under a missing parent).
pub fn patch_for(pod: &Pod, annotation: &str, serving: Option<&Serving>) -> Patch {
    let mut ops = Vec::new();
    if pod.metadata.annotations.is_none() {
        ops.push(add("/metadata/annotations".into(), json!({})));
    }
    ops.push(add(
        format!("/metadata/annotations/{}", escape(POLICY_ANNOTATION)),
        json!(annotation),
    ));
    let first = pod.spec.as_ref().and_then(|s| s.containers.first());
    let (Some(serving), Some(container)) = (serving, first) else {
        return Patch(ops);
    };
    let resources = container.resources.as_ref();
    if resources.is_none() {
        ops.push(add("/spec/containers/0/resources".into(), json!({})));
    }
    match serving {
        Serving::Claim { template } => {
            // The pod asks for no claim (else it is explicit): both lists
            // are set whole.
            ops.push(add(
                "/spec/resourceClaims".into(),
                json!([{ "name": POD_CLAIM, "resourceClaimTemplateName": template }]),
            ));
            ops.push(add(
                "/spec/containers/0/resources/claims".into(),
                json!([{ "name": POD_CLAIM }]),
            ));
        }
        Serving::Resource(resource) => add_resource(&mut ops, resources, resource),
        Serving::Steered(steering) => {
            add_resource(&mut ops, resources, IP_RESOURCE);
            if let Some(terms) = &steering.terms {
                ops.push(node_affinity(pod, terms));
            }
        }
    }
    Patch(ops)
}

/// `resource: "1"` in the first container's limits and requests.
fn add_resource(
    ops: &mut Vec<PatchOperation>,
    resources: Option<&k8s_openapi::api::core::v1::ResourceRequirements>,
    resource: &str,
) {
    for (field, present) in [
        ("limits", resources.is_some_and(|r| r.limits.is_some())),
        ("requests", resources.is_some_and(|r| r.requests.is_some())),
    ] {
        let path = format!("/spec/containers/0/resources/{field}");
        if present {
            ops.push(add(format!("{path}/{}", escape(resource)), json!("1")));
        } else {
            ops.push(add(path, json!({ resource: "1" })));
        }
    }
}

/// The pod's required node affinity ANDed with `terms`: added at the
/// first level the pod lacks, or its terms replaced by each of them with
/// each of ours.
fn node_affinity(
    pod: &Pod,
    terms: &[k8s_openapi::api::core::v1::NodeSelectorTerm],
) -> PatchOperation {
    let affinity = pod.spec.as_ref().and_then(|s| s.affinity.as_ref());
    let node = affinity.and_then(|a| a.node_affinity.as_ref());
    let required = node.and_then(|n| {
        n.required_during_scheduling_ignored_during_execution
            .as_ref()
    });
    let (path, value) = match (affinity, node, required) {
        (None, _, _) => (
            "/spec/affinity",
            json!({ "nodeAffinity": { "requiredDuringSchedulingIgnoredDuringExecution": { "nodeSelectorTerms": terms } } }),
        ),
        (Some(_), None, _) => (
            "/spec/affinity/nodeAffinity",
            json!({ "requiredDuringSchedulingIgnoredDuringExecution": { "nodeSelectorTerms": terms } }),
        ),
        (Some(_), Some(_), None) => (
            "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution",
            json!({ "nodeSelectorTerms": terms }),
        ),
        (Some(_), Some(_), Some(r)) => (
            "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms",
            json!(and_terms(&r.node_selector_terms, terms)),
        ),
    };
    add(path.to_string(), value)
}

/// A JSON patch `add` (which replaces a member that is there).
fn add(path: String, value: Value) -> PatchOperation {
    PatchOperation::Add(AddOperation {
        path: path.parse().expect("a valid JSON pointer"),
        value,
    })
}

/// A key as one JSON pointer segment (RFC 6901: `~` and `/` escaped).
fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

#[cfg(test)]
mod tests;
