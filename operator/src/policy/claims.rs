//! Policies that name security groups (and, if they like, a subnet per
//! zone): their pods get a whole ENI made with exactly those groups, in
//! the subnet of the zone it goes to, through a DRA claim (the operator's
//! on-demand path, docs/dra.md).
//!
//! A claim's template is namespaced, so the leader keeps one,
//! `enim-policy-<policy>`, in every namespace the policy's namespace
//! selector matches ([`keep_templates`]); the webhook adds to each pod it
//! selects a claim made from it ([`super::admit`]). A template's spec
//! cannot change, so a policy whose groups change gets its templates made
//! again: pods admitted before keep their claims (a change applies to new
//! pods only). Templates whose policy or namespace no longer match are
//! deleted; claims made from them stay with their pods.

use std::collections::{BTreeMap, HashMap};

use enim_core::Mode;
use enim_crd::dra::{exactly_groups, in_subnets, DEVICE_CLASS, DRIVER};
use enim_crd::{EniParameters, EniPolicy, ZoneSubnet};
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use super::select::selects_namespace;
use super::steer::{steer, Steering};
use crate::index::{PoolPolicy, WarmPool};

/// Each template's name: this prefix and the policy's name.
pub const TEMPLATE_PREFIX: &str = "enim-policy-";
/// The pod's claim the webhook adds (`spec.resourceClaims[].name`).
pub const POD_CLAIM: &str = "enim-eni";
/// On each template: the policy it is for.
pub const POLICY_LABEL: &str = "enim.io/policy";
/// On each template: what it was made from (a version and the groups), so
/// that the leader can tell a template to make again without comparing
/// specs the API server has defaulted.
pub const MADE_FROM: &str = "enim.io/made-from";
/// The label the webhook's namespaceSelector excludes (the chart's
/// MutatingWebhookConfiguration): no template there.
pub const IGNORE_LABEL: (&str, &str) = ("enim.io/admission", "ignore");
/// The longest object name the API takes.
const MAX_NAME: usize = 253;

/// How a policy's pods are served.
#[derive(Debug, Clone, PartialEq)]
pub enum Serving {
    /// The node pool's ENIs, through this extended resource.
    Resource(&'static str),
    /// An address (`enim.io/ip`) on the nodes of the secondary pools whose
    /// ENIs carry the policy's groups and subnets ([`super::steer`]).
    Steered(Steering),
    /// An ENI made for the pod, through a claim from this template.
    Claim { template: String },
}

/// How `policy`'s pods are served, or why they cannot be. `pools`: the
/// operator's node pools, which serve a secondary policy of groups or
/// subnets (a primary one's ENI is made for its pod, whatever the pools).
pub fn serving(policy: &EniPolicy, pools: &[PoolPolicy]) -> Result<Serving, String> {
    let spec = &policy.spec;
    if spec.security_groups.is_empty() && spec.subnets.is_empty() {
        return Ok(Serving::Resource(super::admit::resource_of(spec.mode)));
    }
    if spec.mode == Mode::Secondary {
        if spec.warm_enis > 0 {
            return Err("it names warmEnis in secondary mode: its pods take addresses of the node pools' ENIs, which the pools' watermarks keep warm (warmEnis keeps whole ENIs, mode primary)".into());
        }
        return steer(spec, pools).map(Serving::Steered);
    }
    if spec.security_groups.is_empty() {
        // A made ENI would get each node pool's groups, which a claim's
        // selector cannot name: a free ENI of any groups in the subnet
        // would do, and a pod could run behind another policy's groups.
        return Err(
            "it names subnets without securityGroups: name the groups its ENIs get too".into(),
        );
    }
    exactly_groups(&spec.security_groups)?;
    let template = template_name(&policy.name_any());
    if template.len() > MAX_NAME {
        return Err(format!(
            "its name is too long for its claim template's ({template:.40}…, over {MAX_NAME} characters)"
        ));
    }
    Ok(Serving::Claim { template })
}

/// For the callers that ask only whether a claim serves a policy, which
/// the pools do not change.
const NO_POOLS: &[PoolPolicy] = &[];

pub fn template_name(policy: &str) -> String {
    format!("{TEMPLATE_PREFIX}{policy}")
}

/// What a template of `groups` and `subnets` is made from, as
/// [`MADE_FROM`] says it (a policy without subnets as before they were
/// served, so that its templates are not made again on an upgrade).
fn made_from(groups: &[String], subnets: &[ZoneSubnet]) -> String {
    let mut sorted = groups.to_vec();
    sorted.sort();
    let mut from = format!("v1:{}", sorted.join(","));
    if !subnets.is_empty() {
        let mut zones: Vec<String> = subnets
            .iter()
            .map(|z| format!("{}={}", z.zone, z.subnet_id))
            .collect();
        zones.sort();
        from.push_str(&format!(";subnets:{}", zones.join(",")));
    }
    from
}

/// The template for `policy`'s pods in `namespace`: one ENI of the class,
/// guarded by exactly the policy's groups, and the opaque parameters that
/// tell the operator to make one when no free ENI has them.
pub fn template(policy: &EniPolicy, namespace: &str) -> Result<ResourceClaimTemplate, String> {
    let name = policy.name_any();
    let groups = &policy.spec.security_groups;
    let subnets = &policy.spec.subnets;
    let mut selectors = vec![json!({ "cel": { "expression": exactly_groups(groups)? } })];
    if !subnets.is_empty() {
        let ids: Vec<&str> = subnets.iter().map(|z| z.subnet_id.as_str()).collect();
        selectors.push(json!({ "cel": { "expression": in_subnets(&ids) } }));
    }
    let parameters = serde_json::to_value(parameters(policy)).map_err(|e| e.to_string())?;
    let value = json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": template_name(&name),
            "namespace": namespace,
            "labels": {
                POLICY_LABEL: name,
                "app.kubernetes.io/managed-by": enim_crd::OPERATOR_MANAGER,
            },
            "annotations": { MADE_FROM: made_from(groups, subnets) },
        },
        "spec": {
            "metadata": { "labels": { POLICY_LABEL: name } },
            "spec": { "devices": {
                "requests": [{
                    "name": "eni",
                    "exactly": {
                        "deviceClassName": DEVICE_CLASS,
                        "selectors": selectors,
                    },
                }],
                "config": [{
                    "requests": ["eni"],
                    "opaque": {
                        "driver": DRIVER,
                        "parameters": parameters,
                    },
                }],
            }},
        },
    });
    serde_json::from_value(value).map_err(|e| e.to_string())
}

/// What `policy`'s claims ask of an ENI: its groups, and its subnet per
/// zone.
fn parameters(policy: &EniPolicy) -> EniParameters {
    EniParameters {
        api_version: Some("enim.io/v1alpha1".into()),
        kind: Some("EniParameters".into()),
        subnet: None,
        subnets: policy.spec.subnets.clone(),
        security_groups: policy.spec.security_groups.clone(),
    }
}

/// The warm ENIs `policy` keeps, when it keeps some and is served by a
/// claim (a policy being deleted keeps none: its ENIs go once free).
pub fn warm_pool(policy: &EniPolicy) -> Option<WarmPool> {
    let count = usize::try_from(policy.spec.warm_enis).ok()?;
    if count == 0 || policy.metadata.deletion_timestamp.is_some() {
        return None;
    }
    match serving(policy, NO_POOLS) {
        Ok(Serving::Claim { .. }) => Some(WarmPool {
            policy: policy.name_any(),
            want: parameters(policy),
            count,
        }),
        _ => None,
    }
}

/// The templates that should exist: for each live policy served by a claim,
/// one in each namespace its selector matches and the webhook sees.
pub fn desired(
    policies: &[EniPolicy],
    namespaces: &[(String, BTreeMap<String, String>)],
) -> Vec<ResourceClaimTemplate> {
    let mut out = Vec::new();
    for policy in policies {
        let live = policy.metadata.deletion_timestamp.is_none();
        if !live || !matches!(serving(policy, NO_POOLS), Ok(Serving::Claim { .. })) {
            continue;
        }
        for (namespace, labels) in namespaces {
            let ignored = labels.get(IGNORE_LABEL.0).map(String::as_str) == Some(IGNORE_LABEL.1);
            // A malformed selector selects nothing (its status says why).
            if ignored || !matches!(selects_namespace(policy, labels), Ok(true)) {
                continue;
            }
            if let Ok(t) = template(policy, namespace) {
                out.push(t);
            }
        }
    }
    out
}

/// What one pass of [`keep_templates`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Kept {
    pub created: usize,
    pub remade: usize,
    pub deleted: usize,
}

/// Makes the cluster's templates of enim's policies what [`desired`]
/// says: creates the missing, makes again those made from other groups,
/// deletes those no policy wants. Only templates carrying
/// [`POLICY_LABEL`] and enim's `managed-by` are ever touched.
pub async fn keep_templates(
    client: &Client,
    policies: &[EniPolicy],
    namespaces: &[(String, BTreeMap<String, String>)],
) -> Result<Kept, kube::Error> {
    let all = Api::<ResourceClaimTemplate>::all(client.clone());
    let ours = ListParams::default().labels(&format!(
        "{POLICY_LABEL},app.kubernetes.io/managed-by={}",
        enim_crd::OPERATOR_MANAGER
    ));
    let mut existing: HashMap<(String, String), ResourceClaimTemplate> = all
        .list(&ours)
        .await?
        .items
        .into_iter()
        .map(|t| ((t.namespace().unwrap_or_default(), t.name_any()), t))
        .collect();
    let mut kept = Kept::default();
    for want in desired(policies, namespaces) {
        let (ns, name) = (want.namespace().unwrap_or_default(), want.name_any());
        let api = Api::<ResourceClaimTemplate>::namespaced(client.clone(), &ns);
        let from = |t: &ResourceClaimTemplate| t.annotations().get(MADE_FROM).cloned();
        match existing.remove(&(ns.clone(), name.clone())) {
            Some(have) if from(&have) == from(&want) => continue,
            Some(_) => {
                api.delete(&name, &DeleteParams::default()).await?;
                api.create(&PostParams::default(), &want).await?;
                tracing::info!(namespace = %ns, template = %name, "claim template made again: its policy's groups changed");
                kept.remade += 1;
            }
            None => {
                match api.create(&PostParams::default(), &want).await {
                    Ok(_) => {}
                    // A namespace being deleted takes no new object.
                    Err(kube::Error::Api(e)) if e.code == 403 || e.code == 409 => {
                        tracing::debug!(namespace = %ns, template = %name, error = %e, "claim template not made");
                        continue;
                    }
                    Err(e) => return Err(e),
                }
                tracing::info!(namespace = %ns, template = %name, "claim template made for its policy's pods");
                kept.created += 1;
            }
        }
    }
    for ((ns, name), _) in existing {
        let api = Api::<ResourceClaimTemplate>::namespaced(client.clone(), &ns);
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => continue,
            Err(e) => return Err(e),
        }
        tracing::info!(namespace = %ns, template = %name, "claim template deleted: no policy selects its namespace for it any more");
        kept.deleted += 1;
    }
    Ok(kept)
}

#[cfg(test)]
mod tests {
    use enim_crd::{EniPolicySpec, ZoneSubnet};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

    use super::*;

    fn policy(name: &str, mode: Mode, groups: &[&str]) -> EniPolicy {
        EniPolicy::new(
            name,
            EniPolicySpec {
                mode,
                security_groups: groups.iter().map(|g| g.to_string()).collect(),
                namespace_selector: Some(LabelSelector {
                    match_labels: Some([("team".to_string(), "db".to_string())].into()),
                    match_expressions: None,
                }),
                ..EniPolicySpec::default()
            },
        )
    }

    fn ns(name: &str, labels: &[(&str, &str)]) -> (String, BTreeMap<String, String>) {
        let labels = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        (name.to_string(), labels)
    }

    #[test]
    fn groups_in_primary_mode_are_served_by_a_claim_and_the_rest_is_named() {
        let db = policy("db", Mode::Primary, &["sg-db"]);
        let claim = || {
            Ok(Serving::Claim {
                template: "enim-policy-db".into(),
            })
        };
        assert_eq!(serving(&db, NO_POOLS), claim());
        assert_eq!(
            serving(&policy("plain", Mode::Secondary, &[]), NO_POOLS),
            Ok(Serving::Resource("enim.io/ip"))
        );
        let mut subnets = db.clone();
        subnets.spec.subnets = vec![ZoneSubnet {
            zone: "z".into(),
            subnet_id: "s".into(),
        }];
        assert_eq!(serving(&subnets, NO_POOLS), claim());
        let mut no_groups = subnets.clone();
        no_groups.spec.security_groups.clear();
        let why = serving(&no_groups, NO_POOLS).unwrap_err();
        assert!(why.contains("without securityGroups"), "{why}");
        let long = serving(&policy("db", Mode::Primary, &[&"g".repeat(40)]), NO_POOLS).unwrap_err();
        assert!(long.contains("cannot be a device attribute"), "{long}");
    }

    #[test]
    fn groups_in_secondary_mode_steer_to_the_pools_of_those_groups() {
        let pools = [PoolPolicy {
            name: "db".into(),
            node_selector: [("enim.io/pool".to_string(), "db".to_string())].into(),
            mode: Mode::Secondary,
            security_groups: vec!["sg-db".into()],
            ..PoolPolicy::default()
        }];
        let secondary = policy("s", Mode::Secondary, &["sg-db"]);
        let Ok(Serving::Steered(s)) = serving(&secondary, &pools) else {
            panic!("{:?}", serving(&secondary, &pools))
        };
        assert_eq!(s.pools, ["db"]);
        let why = serving(&secondary, NO_POOLS).unwrap_err();
        assert!(why.contains("no node pool"), "{why}");
        let mut warm = secondary.clone();
        warm.spec.warm_enis = 1;
        let why = serving(&warm, &pools).unwrap_err();
        assert!(why.contains("warmEnis in secondary mode"), "{why}");
    }

    #[test]
    fn a_template_asks_for_exactly_the_groups_and_carries_them_to_the_operator() {
        let t = template(&policy("db", Mode::Primary, &["sg-b", "sg-a"]), "web").unwrap();
        assert_eq!(t.name_any(), "enim-policy-db");
        assert_eq!(t.namespace().as_deref(), Some("web"));
        assert_eq!(t.labels()[POLICY_LABEL], "db");
        assert_eq!(t.annotations()[MADE_FROM], "v1:sg-a,sg-b");
        let devices = &t.spec.spec.devices.as_ref().unwrap();
        let request = &devices.requests.as_ref().unwrap()[0];
        let exactly = request.exactly.as_ref().unwrap();
        assert_eq!(exactly.device_class_name, DEVICE_CLASS);
        let cel = &exactly.selectors.as_ref().unwrap()[0]
            .cel
            .as_ref()
            .unwrap()
            .expression;
        assert!(cel.contains(".?sg_b.") && cel.contains(".?sg_a.") && cel.ends_with("== 2"));
        let opaque = devices.config.as_ref().unwrap()[0].opaque.as_ref().unwrap();
        assert_eq!(opaque.driver, DRIVER);
        let params: enim_crd::EniParameters =
            serde_json::from_value(opaque.parameters.0.clone()).unwrap();
        assert_eq!(params.security_groups, ["sg-b", "sg-a"]);
        assert!(params.subnets.is_empty());
        assert_eq!(exactly.selectors.as_ref().unwrap().len(), 1);
    }

    #[test]
    fn a_template_of_subnets_asks_for_a_device_in_one_and_tells_the_operator_which_zone_has_which()
    {
        let mut p = policy("db", Mode::Primary, &["sg-a"]);
        p.spec.subnets = vec![
            ZoneSubnet {
                zone: "zone-b".into(),
                subnet_id: "subnet-b".into(),
            },
            ZoneSubnet {
                zone: "zone-a".into(),
                subnet_id: "subnet-a".into(),
            },
        ];
        let t = template(&p, "web").unwrap();
        assert_eq!(
            t.annotations()[MADE_FROM],
            "v1:sg-a;subnets:zone-a=subnet-a,zone-b=subnet-b"
        );
        let devices = t.spec.spec.devices.as_ref().unwrap();
        let exactly = devices.requests.as_ref().unwrap()[0]
            .exactly
            .as_ref()
            .unwrap();
        let cels: Vec<&str> = exactly
            .selectors
            .as_ref()
            .unwrap()
            .iter()
            .map(|s| s.cel.as_ref().unwrap().expression.as_str())
            .collect();
        assert_eq!(cels.len(), 2);
        assert_eq!(
            cels[1],
            r#"device.attributes["enim.io"].?subnet.orValue("") in ["subnet-b", "subnet-a"]"#
        );
        let opaque = devices.config.as_ref().unwrap()[0].opaque.as_ref().unwrap();
        let params: enim_crd::EniParameters =
            serde_json::from_value(opaque.parameters.0.clone()).unwrap();
        params.check().unwrap();
        assert_eq!(params.subnet_in("zone-a"), Some(Some("subnet-a")));
        assert_eq!(params.subnet_in("zone-c"), None);
        // Another subnet list is another template: made again.
        let mut moved = p.clone();
        moved.spec.subnets[0].subnet_id = "subnet-b2".into();
        assert_ne!(
            template(&moved, "web").unwrap().annotations()[MADE_FROM],
            t.annotations()[MADE_FROM]
        );
    }

    #[test]
    fn templates_go_where_the_namespace_selector_matches_and_the_webhook_looks() {
        let namespaces = [
            ns("a", &[("team", "db")]),
            ns("b", &[("team", "web")]),
            ns("c", &[("team", "db"), IGNORE_LABEL]),
        ];
        let mut gone = policy("gone", Mode::Primary, &["sg-x"]);
        gone.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ));
        let policies = [
            policy("db", Mode::Primary, &["sg-db"]),
            policy("pool", Mode::Primary, &[]),
            gone,
        ];
        let want: Vec<(String, String)> = desired(&policies, &namespaces)
            .iter()
            .map(|t| (t.namespace().unwrap(), t.name_any()))
            .collect();
        assert_eq!(want, [("a".to_string(), "enim-policy-db".to_string())]);
    }

    #[test]
    fn a_policy_keeps_warm_enis_only_when_served_by_a_claim() {
        let mut db = policy("db", Mode::Primary, &["sg-db"]);
        assert_eq!(warm_pool(&db), None, "warmEnis 0 keeps none");
        db.spec.warm_enis = 2;
        db.spec.subnets = vec![ZoneSubnet {
            zone: "z1".into(),
            subnet_id: "subnet-z1".into(),
        }];
        let pool = warm_pool(&db).expect("kept");
        assert_eq!((pool.policy.as_str(), pool.count), ("db", 2));
        // Exactly what its claims ask: the template's parameters.
        let t = template(&db, "web").unwrap();
        let config = &t.spec.spec.devices.unwrap().config.unwrap()[0];
        let asked = &config.opaque.as_ref().unwrap().parameters.0;
        assert_eq!(serde_json::to_value(&pool.want).unwrap(), *asked);
        // Served through the pool's resource, being deleted, or refused:
        // none.
        let mut plain = policy("plain", Mode::Primary, &[]);
        plain.spec.warm_enis = 2;
        assert_eq!(warm_pool(&plain), None);
        let mut secondary = db.clone();
        secondary.spec.mode = Mode::Secondary;
        assert_eq!(warm_pool(&secondary), None);
        db.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert_eq!(warm_pool(&db), None);
    }
}
