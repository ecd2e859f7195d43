//! enim's custom resources: the only place the operator (`enim-operator`)
//! and the node agent (`enimd` with the `cluster` provider) meet.
//!
//! One [`NetResourceSet`] per node, named after the node and owned by its
//! Node object (CCE's NetResourceSet, Cilium's CiliumNode):
//! - **spec** is written by the operator only, under the field manager
//!   [`OPERATOR_MANAGER`]: the instance, the pool's watermarks and the ENIs
//!   (in secondary mode, their addresses) this node may hand out;
//! - **status** is written by the node's agent only, under
//!   [`AGENT_MANAGER`], through the status subresource: which ENIs or
//!   addresses are in use and by whom, which are quarantined, and which
//!   ENIs the agent has let go of when the operator asked for them back.
//!
//! Taking an ENI back is a handshake, so that the operator never detaches
//! an ENI an agent is handing to a pod at that moment: the operator lists
//! it in `spec.draining`; the agent stops handing it out and, once no pod
//! holds it, lists it in `status.released`; only then does the operator
//! detach and delete it.
//!
//! Names and fields are serialised in camelCase, as Kubernetes APIs are.
//! `crdgen` writes the CRD into the Helm chart's `crds/` (deploy/ gets it
//! from there, scripts/render-deploy.sh), and a test fails when the
//! committed copy differs from these types.

use std::net::IpAddr;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub mod dra;
pub mod policy;
pub use policy::{EniPolicy, EniPolicySpec, EniPolicyStatus, ZoneSubnet, POLICY_ANNOTATION};

/// How pods use a node's ENIs, and the pool's watermarks: enim-core's,
/// with their JSON schemas.
pub use enim_core::{Mode, Watermarks};

/// The API group of enim's resources.
pub const GROUP: &str = "enim.io";
/// The field manager of everything the operator writes (spec, metadata).
pub const OPERATOR_MANAGER: &str = "enim-operator";
/// The field manager of everything an agent writes (status).
pub const AGENT_MANAGER: &str = "enimd";
/// The finalizer that keeps a deleted node's NetResourceSet until the
/// operator has detached and deleted its ENIs.
pub const FINALIZER: &str = "enim.io/release-enis";
/// Set on a NetResourceSet by the chart's uninstall hook (`enimctl
/// uninstall`): the operator releases the node's ENIs at once, as for a
/// deleted Node, and removes its finalizer, but never deletes the set nor
/// serves the node again while the annotation stays.
pub const UNINSTALL_ANNOTATION: &str = "enim.io/uninstall";
/// Where the committed CRD lives, relative to the workspace root.
pub const CRD_PATH: &str = "charts/enim/crds/05-crd-netresourceset.yaml";

/// The ENIs one node may use, and who uses them.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "enim.io",
    version = "v1alpha1",
    kind = "NetResourceSet",
    plural = "netresourcesets",
    shortname = "nrs",
    status = "NetResourceSetStatus",
    printcolumn = r#"{"name":"Mode","type":"string","jsonPath":".spec.mode"}"#,
    printcolumn = r#"{"name":"Instance","type":"string","jsonPath":".spec.instance.id"}"#,
    printcolumn = r#"{"name":"ENIs","type":"integer","description":"ENIs made available to this node","jsonPath":".status.summary.enis"}"#,
    printcolumn = r#"{"name":"Used","type":"integer","description":"ENIs (secondary mode: addresses) held by pods","jsonPath":".status.summary.used"}"#,
    printcolumn = r#"{"name":"Available","type":"integer","description":"ENIs (secondary mode: addresses) free to hand out","jsonPath":".status.summary.available"}"#,
    printcolumn = r#"{"name":"Deleting","type":"date","description":"How long ago deletion was asked: the node is gone, and the operator releases its ENIs after node_grace","jsonPath":".metadata.deletionTimestamp"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct NetResourceSetSpec {
    /// The cloud instance behind the node, from its `spec.providerID`.
    pub instance: Instance,
    /// How pods use the ENIs.
    pub mode: Mode,
    /// Subnets new ENIs are created in (the first with room wins).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subnets: Vec<String>,
    /// Security groups new ENIs get.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub security_groups: Vec<String>,
    /// The pool's watermarks, in ENIs (primary mode) or addresses
    /// (secondary mode).
    pub watermarks: Watermarks,
    /// The ENIs attached to the instance for enim, ready to hand out.
    #[serde(default)]
    pub enis: Vec<EniSpec>,
    /// What the operator wants back: ENI ids (secondary mode: also single
    /// addresses). The agent hands none of them out and lists each in
    /// `status.released` once no pod holds it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub draining: Vec<String>,
    /// The operator's intents, written before it calls the cloud: a crashed
    /// or deposed leader's successor finishes them with the same client
    /// token, so a retried create never makes a second ENI.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub intents: Vec<Intent>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Instance {
    /// "aws", "bce" or "static".
    pub provider: String,
    /// The cloud's instance id (`i-…`).
    pub id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub instance_type: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub zone: String,
}

/// One ENI made available to the node.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EniSpec {
    pub id: String,
    /// Lower-case `aa:bb:cc:dd:ee:ff`: how the agent finds the device.
    pub mac: String,
    /// The primary IPv4 address with the subnet's prefix length.
    pub ipv4: String,
    pub gateway4: IpAddr,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway6: Option<IpAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_index: Option<u32>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub subnet: String,
    /// Secondary mode: the addresses pods get, one each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secondary_ips: Vec<IpAddr>,
    /// The ENI's own security groups, when they are not the node's
    /// (`spec.securityGroups`): an ENI made for a claim.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub security_groups: Vec<String>,
    /// The DRA claim this ENI was made for: kept while the claim exists,
    /// never counted in the watermarks, drained once the claim is gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<ClaimRef>,
    /// The EniPolicy this ENI was made to be kept warm for (its
    /// `warmEnis`): free for that policy's claims, never counted in the
    /// node's watermarks, drained once the policy keeps fewer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
}

/// A ResourceClaim, by namespace, name and uid.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// `namespace/name`, as kubectl names it.
impl std::fmt::Display for ClaimRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A cloud call the operator is about to make for this node.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Intent {
    /// The idempotency token the call carries (and the ENI's tag).
    pub client_token: String,
    /// "create-attach", "assign", "detach-delete".
    pub action: String,
    /// The ENI it concerns, once known.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub eni: String,
    pub since: Time,
    /// A create for a DRA claim: the claim, and the subnet and security
    /// groups it asked for (a retried create sends the same).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<ClaimRef>,
    /// A create to keep an EniPolicy's ENIs warm: the policy (with the
    /// subnet and groups below).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub subnet: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub security_groups: Vec<String>,
}

/// What a ResourceClaim asks of an ENI the cluster may not have yet: the
/// `parameters` of its opaque device config for driver `enim.io`. The
/// operator makes an ENI like this when no node has a free one.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EniParameters {
    /// `enim.io/v1alpha1`, when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// `EniParameters`, when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The subnet; default: the operator's first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subnet: Option<String>,
    /// A subnet per zone: the ENI is made on a node of one of these zones,
    /// in that zone's subnet (an `EniPolicy`'s `subnets`). Not with
    /// `subnet`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subnets: Vec<ZoneSubnet>,
    /// Exactly these groups; default: the operator's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub security_groups: Vec<String>,
}

impl EniParameters {
    /// Whether these can be served at all: not both `subnet` and
    /// `subnets`, each zone once, no empty zone or subnet id.
    pub fn check(&self) -> Result<(), String> {
        if self.subnet.is_some() && !self.subnets.is_empty() {
            return Err(
                "both subnet and subnets are given: name one subnet, or one per zone".into(),
            );
        }
        let mut zones = std::collections::BTreeSet::new();
        for z in &self.subnets {
            if z.zone.is_empty() || z.subnet_id.is_empty() {
                return Err("a subnets entry has an empty zone or subnetId".into());
            }
            if !zones.insert(z.zone.as_str()) {
                return Err(format!("zone {:?} is named twice in subnets", z.zone));
            }
        }
        Ok(())
    }

    /// The subnet asked for on a node in `zone`: `Some(None)` when any
    /// will do (no `subnets`: `subnet` or the operator's), `None` when
    /// `subnets` has no entry for the zone (no ENI for it goes there).
    pub fn subnet_in(&self, zone: &str) -> Option<Option<&str>> {
        if self.subnets.is_empty() {
            return Some(self.subnet.as_deref());
        }
        self.subnets
            .iter()
            .find(|z| z.zone == zone)
            .map(|z| Some(z.subnet_id.as_str()))
    }
}

/// What the node's agent does with its ENIs.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetResourceSetStatus {
    /// ENIs (secondary mode: addresses) held by pods.
    #[serde(default)]
    pub used: Vec<EniUse>,
    /// ENIs the agent will not hand out, and why (a device missing or
    /// broken on the node).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub quarantined: Vec<Quarantined>,
    /// Entries of `spec.draining` (ENI ids or addresses) that no pod holds
    /// and the agent will not hand out again: the operator may take them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub released: Vec<String>,
    /// Secondary mode: addresses a pod gave back that rest their cooldown
    /// before the agent hands them out again: neither free nor surplus yet.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cooling: Vec<IpAddr>,
    #[serde(default)]
    pub summary: Summary,
    /// When the agent last wrote this status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sync: Option<Time>,
    /// The `metadata.generation` of the spec the agent last applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// Counts for `kubectl get`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    /// ENIs in the spec.
    pub enis: u32,
    /// ENIs (secondary: addresses) held by pods.
    pub used: u32,
    /// ENIs (secondary: addresses) free to hand out.
    pub available: u32,
}

/// One ENI (secondary mode: one address of it) held by a pod.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EniUse {
    pub eni: String,
    /// Secondary mode: the address the pod holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<IpAddr>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pod_namespace: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pod_name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pod_uid: String,
    pub container_id: String,
    pub ifname: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Quarantined {
    pub eni: String,
    pub reason: String,
}

/// The condition type an agent sets: True once it serves from this spec.
pub const CONDITION_READY: &str = "Ready";
/// The condition type an agent sets: True exactly when its DRA driver is
/// on (enimd's `[dra]`), so that pods get this node's ENIs through
/// ResourceClaims. The operator makes an ENI for a claim only on such a
/// node: on a device-plugin node no claim's pod could ever use it. An
/// agent that predates this condition never sets it, and gets none.
pub const CONDITION_SERVES_CLAIMS: &str = "ServesClaims";

impl NetResourceSetStatus {
    /// Whether the agent says it serves DRA claims
    /// ([`CONDITION_SERVES_CLAIMS`] is True); absent means no.
    pub fn serves_claims(&self) -> bool {
        self.conditions
            .iter()
            .any(|c| c.type_ == CONDITION_SERVES_CLAIMS && c.status == "True")
    }
}

/// Where a set is in the uninstall hook's release
/// ([`UNINSTALL_ANNOTATION`]): what the operator plans by and what
/// `enimctl uninstall` waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Uninstall {
    /// Not annotated: the node is served as its phase says.
    #[default]
    No,
    /// Annotated, the operator's finalizer still on it: its ENIs are to
    /// be released now, whatever the node grace.
    Releasing,
    /// Annotated and the finalizer gone: its ENIs were released, nothing
    /// more is done for the node.
    Released,
}

impl NetResourceSet {
    /// Where this set is in the uninstall hook's release. Only the
    /// operator's own finalizer counts: another party's keeps nothing.
    pub fn uninstall(&self) -> Uninstall {
        let annotated = self
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(UNINSTALL_ANNOTATION));
        let held = self
            .metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == FINALIZER);
        match (annotated, held) {
            (false, _) => Uninstall::No,
            (true, true) => Uninstall::Releasing,
            (true, false) => Uninstall::Released,
        }
    }
}

/// The CRD as YAML, as `crdgen` writes it and the chart's `crds/` holds it.
pub fn crd_yaml() -> String {
    generated_yaml::<NetResourceSet>("crdgen", "crd/src/lib.rs")
}

/// `K`'s CRD as YAML under the header that says how it was made (`crdgen`
/// with its arguments, from `source`): what the chart's `crds/` holds.
fn generated_yaml<K: kube::CustomResourceExt>(crdgen: &str, source: &str) -> String {
    let header = format!(
        "# Generated by `cargo run -p enim-crd --bin {crdgen}` from {source}: do not edit.\n"
    );
    let body = serde_yaml::to_string(&K::crd()).expect("a CRD serialises");
    format!("{header}{body}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CI's check that each committed CRD is what these types generate
    /// (NetResourceSet, and EniPolicy from `policy`).
    #[test]
    fn the_committed_crd_matches_the_types() {
        for (file, generated, crdgen) in [
            (CRD_PATH, crd_yaml(), "crdgen"),
            (
                policy::POLICY_CRD_PATH,
                policy::policy_crd_yaml(),
                "crdgen -- enipolicy",
            ),
        ] {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("..")
                .join(file);
            let committed = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(
                committed == generated,
                "{file} is stale: run `cargo run -p enim-crd --bin {crdgen} > {file}`"
            );
        }
    }

    #[test]
    fn the_crd_is_cluster_scoped_with_a_status_subresource() {
        use kube::CustomResourceExt;
        let crd = NetResourceSet::crd();
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some("netresourcesets.enim.io")
        );
        assert_eq!(crd.spec.scope, "Cluster");
        let v = &crd.spec.versions[0];
        assert!(v.subresources.as_ref().unwrap().status.is_some());
        let columns: Vec<_> = v
            .additional_printer_columns
            .iter()
            .flatten()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(
            columns,
            [
                "Mode",
                "Instance",
                "ENIs",
                "Used",
                "Available",
                "Deleting",
                "Age"
            ]
        );
    }

    #[test]
    fn a_spec_round_trips_in_camel_case() {
        let spec = NetResourceSetSpec {
            instance: Instance {
                provider: "aws".into(),
                id: "i-1".into(),
                instance_type: "m5.large".into(),
                zone: "us-east-1a".into(),
            },
            mode: Mode::Secondary,
            watermarks: Watermarks {
                pre_allocate: 2,
                min_allocate: 1,
                max_above_watermark: 3,
            },
            enis: vec![EniSpec {
                id: "eni-1".into(),
                mac: "02:00:00:00:00:01".into(),
                ipv4: "10.0.0.5/24".into(),
                gateway4: "10.0.0.1".parse().unwrap(),
                ipv6: None,
                gateway6: None,
                mtu: Some(9001),
                device_index: Some(1),
                subnet: "subnet-1".into(),
                secondary_ips: vec!["10.0.0.6".parse().unwrap()],
                security_groups: Vec::new(),
                claim: None,
                policy: None,
            }],
            ..Default::default()
        };
        let json = serde_json::to_value(&spec).unwrap();
        assert_eq!(json["watermarks"]["maxAboveWatermark"], 3);
        assert_eq!(json["enis"][0]["secondaryIps"][0], "10.0.0.6");
        assert_eq!(json["instance"]["instanceType"], "m5.large");
        assert_eq!(json["mode"], "secondary");
        let back: NetResourceSetSpec = serde_json::from_value(json).unwrap();
        assert_eq!(back, spec);
    }

    #[test]
    fn only_a_true_serves_claims_condition_says_the_agent_serves_claims() {
        let condition = |type_: &str, status: &str| Condition {
            type_: type_.into(),
            status: status.into(),
            reason: "R".into(),
            message: String::new(),
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            observed_generation: None,
        };
        let with = |conditions| NetResourceSetStatus {
            conditions,
            ..Default::default()
        };
        // An older agent writes no such condition: no.
        assert!(!with(vec![]).serves_claims());
        assert!(!with(vec![condition(CONDITION_READY, "True")]).serves_claims());
        assert!(!with(vec![condition(CONDITION_SERVES_CLAIMS, "False")]).serves_claims());
        assert!(!with(vec![condition(CONDITION_SERVES_CLAIMS, "Unknown")]).serves_claims());
        assert!(with(vec![
            condition(CONDITION_READY, "False"),
            condition(CONDITION_SERVES_CLAIMS, "True")
        ])
        .serves_claims());
    }

    #[test]
    fn parameters_name_one_subnet_or_one_per_zone() {
        let zone = |z: &str, s: &str| ZoneSubnet {
            zone: z.into(),
            subnet_id: s.into(),
        };
        let any = EniParameters::default();
        assert_eq!(any.check(), Ok(()));
        assert_eq!(any.subnet_in("z1"), Some(None));
        let one = EniParameters {
            subnet: Some("subnet-1".into()),
            ..EniParameters::default()
        };
        assert_eq!(one.subnet_in("z9"), Some(Some("subnet-1")));
        let per_zone: EniParameters = serde_json::from_value(serde_json::json!({
            "securityGroups": ["sg-1"],
            "subnets": [{"zone": "z1", "subnetId": "subnet-a"}],
        }))
        .unwrap();
        assert_eq!(per_zone.check(), Ok(()));
        assert_eq!(per_zone.subnet_in("z1"), Some(Some("subnet-a")));
        assert_eq!(per_zone.subnet_in("z2"), None);
        let both = EniParameters {
            subnet: Some("subnet-1".into()),
            subnets: vec![zone("z1", "subnet-a")],
            ..EniParameters::default()
        };
        assert!(both.check().unwrap_err().contains("both"));
        let twice = EniParameters {
            subnets: vec![zone("z1", "a"), zone("z1", "b")],
            ..EniParameters::default()
        };
        assert!(twice.check().unwrap_err().contains("named twice"));
        let empty = EniParameters {
            subnets: vec![zone("", "a")],
            ..EniParameters::default()
        };
        assert!(empty.check().unwrap_err().contains("empty"));
    }
}
