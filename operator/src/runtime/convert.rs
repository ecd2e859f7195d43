//! The API server's objects as the index sees them: a Node, a
//! NetResourceSet and a ResourceClaim converted into [`NodeInfo`],
//! [`SetInfo`] and [`ClaimInfo`]. Pure functions over the objects; a
//! stranger's object (a claim of another class, parameters that do not
//! parse) never stops a resync.

use std::time::SystemTime;

use enim_crd::NetResourceSet;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::{Resource, ResourceExt};

use crate::index::{ClaimInfo, NodeInfo, SetInfo};

/// The label the kubelet sets from the cloud's instance type.
pub const LABEL_INSTANCE_TYPE: &str = "node.kubernetes.io/instance-type";
/// The label the kubelet (or cloud controller) sets from the zone.
pub const LABEL_ZONE: &str = "topology.kubernetes.io/zone";

/// The DeviceClass of the DRA driver's ENIs (deploy/06-deviceclass.yaml),
/// and the driver, whose opaque config carries [`enim_crd::EniParameters`].
pub use enim_crd::dra::{DEVICE_CLASS, DRIVER as DRA_DRIVER};

/// A Node as the operator reads it.
pub fn node_info(node: &Node) -> NodeInfo {
    let label = |key: &str| node.labels().get(key).cloned().unwrap_or_default();
    NodeInfo {
        name: node.name_any(),
        uid: node.uid().unwrap_or_default(),
        provider_id: node
            .spec
            .as_ref()
            .and_then(|s| s.provider_id.clone())
            .unwrap_or_default(),
        instance_type: label(LABEL_INSTANCE_TYPE),
        zone: label(LABEL_ZONE),
        labels: node.labels().clone(),
    }
}

/// A NetResourceSet as the operator reads it.
pub fn set_info(set: &NetResourceSet) -> SetInfo {
    SetInfo {
        name: set.name_any(),
        spec: set.spec.clone(),
        status: set.status.clone(),
        deleting_since: set
            .meta()
            .deletion_timestamp
            .as_ref()
            .map(|t| SystemTime::from(t.0)),
        uninstall: set.uninstall(),
    }
}

/// A ResourceClaim as the operator sees it: `None` unless one of its
/// requests is for [`DEVICE_CLASS`]. Parameters that do not parse ask for
/// nothing (and say why in the log): a stranger's object never stops a
/// resync.
pub fn claim_info(rc: &ResourceClaim) -> Option<ClaimInfo> {
    let devices = rc.spec.devices.as_ref()?;
    let ours = devices.requests.iter().flatten().any(|r| {
        let exact = r
            .exactly
            .as_ref()
            .is_some_and(|e| e.device_class_name == DEVICE_CLASS);
        let any_of = r
            .first_available
            .iter()
            .flatten()
            .any(|s| s.device_class_name == DEVICE_CLASS);
        exact || any_of
    });
    if !ours {
        return None;
    }
    let name = || format!("{}/{}", rc.namespace().unwrap_or_default(), rc.name_any());
    let want = devices
        .config
        .iter()
        .flatten()
        .filter_map(|c| c.opaque.as_ref())
        .find(|o| o.driver == DRA_DRIVER)
        .and_then(|o| {
            match serde_json::from_value::<enim_crd::EniParameters>(o.parameters.0.clone()) {
                Ok(p) => Some(p),
                Err(e) => {
                    tracing::warn!(claim = %name(), error = %e, "claim's enim.io parameters ignored");
                    None
                }
            }
        });
    Some(ClaimInfo {
        claim: enim_crd::ClaimRef {
            namespace: rc.namespace().unwrap_or_default(),
            name: rc.name_any(),
            uid: rc.uid().unwrap_or_default(),
        },
        pending: rc
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .is_none(),
        want,
        pod: rc
            .owner_references()
            .iter()
            .find(|o| o.kind == "Pod" && o.controller == Some(true))
            .map(|o| (o.name.clone(), o.uid.clone())),
        policy: rc
            .labels()
            .get(crate::policy::claims::POLICY_LABEL)
            .cloned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A claim as the API server shows one made from a policy's template
    /// for pod db-1.
    fn claim(owner_kind: &str, parameters: serde_json::Value) -> ResourceClaim {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {
                "name": "db-1-enim-eni-x7", "namespace": "web", "uid": "c-uid",
                "labels": {"enim.io/policy": "db"},
                "ownerReferences": [{"apiVersion": "v1", "kind": owner_kind, "name": "db-1",
                                     "uid": "p-uid", "controller": true}],
            },
            "spec": {"devices": {
                "requests": [{"name": "eni", "exactly": {"deviceClassName": DEVICE_CLASS}}],
                "config": [{"requests": ["eni"], "opaque": {"driver": DRA_DRIVER, "parameters": parameters}}],
            }},
        }))
        .unwrap()
    }

    #[test]
    fn a_claim_carries_its_parameters_and_the_pod_it_was_made_for() {
        let params = serde_json::json!({
            "securityGroups": ["sg-db"],
            "subnets": [{"zone": "z1", "subnetId": "subnet-a"}],
        });
        let info = claim_info(&claim("Pod", params.clone())).unwrap();
        assert!(info.pending);
        assert_eq!(info.pod, Some(("db-1".into(), "p-uid".into())));
        assert_eq!(info.policy.as_deref(), Some("db"));
        let want = info.want.unwrap();
        assert_eq!(want.subnet_in("z1"), Some(Some("subnet-a")));
        assert_eq!(want.security_groups, ["sg-db"]);
        // Another kind of owner is no pod; unknown fields ask for nothing.
        assert_eq!(claim_info(&claim("Job", params)).unwrap().pod, None);
        let odd = claim_info(&claim("Pod", serde_json::json!({"vlan": 7}))).unwrap();
        assert_eq!(odd.want, None);
    }
}
