//! [`EniPolicy`]: which pods get enim's network, and which network, without
//! editing each pod (AWS's SecurityGroupPolicy and Terway's PodNetworking
//! fill this role for their CNIs).
//!
//! A policy selects pods by their namespace's labels, their own labels and
//! their ServiceAccount, and says what a selected pod gets: a whole ENI or
//! a secondary address, and for the ENIs made for it, the subnet per zone
//! and the security groups, and whether it may reach the instance metadata
//! service. The operator's admission webhook applies the one policy that
//! selects a pod when the pod is created (the operator's `policy` module
//! says which); a change to a policy applies to pods created after it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::Mode;

/// The annotation the webhook puts on each pod it admits: the name of the
/// policy that selected it, [`DEFAULT_POLICY`] or [`EXPLICIT`].
pub const POLICY_ANNOTATION: &str = "enim.io/policy";
/// The annotation's value for a pod no policy selected, given the cluster
/// default.
pub const DEFAULT_POLICY: &str = "(default)";
/// The annotation's value for a pod that asked for enim itself (an enim
/// resource or a ResourceClaim): the webhook leaves it as it is.
pub const EXPLICIT: &str = "(explicit)";
/// Where the committed EniPolicy CRD lives, relative to the workspace root.
pub const POLICY_CRD_PATH: &str = "charts/enim/crds/06-crd-enipolicy.yaml";

/// Which pods get enim's network, and which.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "enim.io",
    version = "v1alpha1",
    kind = "EniPolicy",
    plural = "enipolicies",
    shortname = "enip",
    status = "EniPolicyStatus",
    printcolumn = r#"{"name":"Mode","type":"string","jsonPath":".spec.mode"}"#,
    printcolumn = r#"{"name":"Priority","type":"integer","jsonPath":".spec.priority"}"#,
    printcolumn = r#"{"name":"Warm","type":"integer","jsonPath":".spec.warmEnis"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "!has(self.warmEnis) || self.warmEnis == 0 || (has(self.securityGroups) && size(self.securityGroups) > 0)",
    "message": "warmEnis keeps ENIs of the policy's own securityGroups made ahead of its pods: name the groups (without them, the node pools' watermarks keep ENIs warm)"
}]))]
pub struct EniPolicySpec {
    /// Pods in namespaces with these labels; absent: every namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
    /// Pods with these labels; absent: every pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<LabelSelector>,
    /// Pods running as one of these ServiceAccounts (names in the pod's
    /// namespace); empty: any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(length(min = 1)), extend("x-kubernetes-list-type" = "set"))]
    pub service_accounts: Vec<String>,
    /// A whole ENI (`primary`) or a secondary address (`secondary`).
    pub mode: Mode,
    /// The security groups of the ENIs a selected pod gets; empty: the
    /// node pool's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(length(min = 1)), extend("x-kubernetes-list-type" = "set"))]
    pub security_groups: Vec<String>,
    /// Where its ENIs are made, one subnet per zone; empty: the node
    /// pool's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["zone"]))]
    pub subnets: Vec<ZoneSubnet>,
    /// Whether selected pods may reach the instance metadata service
    /// (refused to pods by default).
    #[serde(default)]
    pub metadata_access: bool,
    /// How many free ENIs of its groups (in its subnet) the operator keeps
    /// made ahead of its pods, in each zone its subnets name (without
    /// subnets: in each zone with a node serving DRA claims), so that a
    /// new pod need not wait for one to be made. Needs `securityGroups`.
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(range(max = 64))]
    pub warm_enis: u32,
    /// Where two policies select one pod, the higher wins (the operator's
    /// `policy` module documents the whole order).
    #[serde(default)]
    pub priority: i32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The subnet a policy's ENIs are made in, in one zone.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ZoneSubnet {
    /// The zone (one entry per zone: the API server refuses a repeat).
    #[schemars(length(min = 1))]
    pub zone: String,
    /// The provider's subnet id in that zone.
    #[schemars(length(min = 1))]
    pub subnet_id: String,
}

/// What the operator last judged of a policy.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EniPolicyStatus {
    /// The `metadata.generation` the operator last judged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`: whether pods it selects can be served, and if not why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// The EniPolicy CRD as YAML, as `crdgen enipolicy` writes it into the
/// chart's `crds/`.
pub fn policy_crd_yaml() -> String {
    crate::generated_yaml::<EniPolicy>("crdgen -- enipolicy", "crd/src/policy.rs")
}

#[cfg(test)]
mod tests;
