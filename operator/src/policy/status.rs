//! The leader's judgement of each EniPolicy, in its status: a `Ready`
//! condition and the `observedGeneration` it was made for. A policy that
//! cannot be served (groups or subnets in secondary mode that no
//! secondary node pool has, subnets without groups in primary mode) is
//! `Ready=False`, reason `NotServedYet`; one with a
//! malformed selector, reason `InvalidSelector`; one whose claims' ENIs
//! the cloud refuses lately ([`super::refusals`]), reason `CloudRefused`.
//! While leading, it also keeps the claim templates of policies that name
//! groups ([`super::claims`]).

use std::time::Duration;

use enim_crd::{EniPolicy, EniPolicyStatus, OPERATOR_MANAGER};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use tokio::sync::watch;

use std::sync::Arc;

use super::claims::{keep_templates, serving, Serving};
use super::refusals::{Refusal, Refusals};
use super::select::invalid_selector;
use super::steer::pool_name;
use super::webhook::ClusterView;
use crate::index::PoolPolicy;

/// Between two passes over the policies.
pub const INTERVAL: Duration = Duration::from_secs(5);

/// The `Ready` condition a policy should carry: (status, reason, message);
/// `refused`: what the cloud last refused its pods, if lately.
pub fn judge(
    policy: &EniPolicy,
    pools: &[PoolPolicy],
    refused: Option<&Refusal>,
) -> (&'static str, &'static str, String) {
    if let Some(e) = invalid_selector(policy) {
        return (
            "False",
            "InvalidSelector",
            format!("{}: {}", e.which, e.why),
        );
    }
    match (serving(policy, pools), refused) {
        (Err(why), _) => ("False", "NotServedYet", why),
        (Ok(_), Some(r)) => (
            "False",
            "CloudRefused",
            format!("the cloud refused to make an ENI for {} (its pods stay Pending; tried again each minute): {}", r.made_for, r.error),
        ),
        (Ok(Serving::Resource(resource)), None) => (
            "True",
            "Served",
            format!("new pods it selects are given {resource} from the node pools"),
        ),
        (Ok(Serving::Steered(s)), None) => (
            "True",
            "Served",
            format!(
                "new pods it selects are given enim.io/ip on the nodes of the operator's pool(s) {}, whose ENIs are made with {}",
                s.pools.iter().map(|p| pool_name(p)).collect::<Vec<_>>().join(", "),
                if policy.spec.security_groups.is_empty() {
                    "its subnets".to_string()
                } else {
                    format!("exactly its security groups [{}]", policy.spec.security_groups.join(","))
                }
            ),
        ),
        (Ok(Serving::Claim { template }), None) => (
            "True",
            "Served",
            format!(
                "new pods it selects get an ENI made with exactly its security groups, through a claim from {template} in their namespace{}",
                match policy.spec.warm_enis {
                    0 => String::new(),
                    n => format!("; {n} such ENI(s) kept free in each of its zones"),
                }
            ),
        ),
    }
}

/// Writes the status of each policy whose judgement or generation changed;
/// the number written.
pub async fn write_statuses(
    client: &Client,
    policies: &[EniPolicy],
    pools: &[PoolPolicy],
    refusals: &Refusals,
) -> Result<usize, kube::Error> {
    let api = Api::<EniPolicy>::all(client.clone());
    let mut written = 0;
    for policy in policies {
        let refused = refusals.of(&policy.name_any());
        let (status, reason, message) = judge(policy, pools, refused.as_ref());
        let generation = policy.metadata.generation;
        let old = policy.status.as_ref();
        let current = old.and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"));
        let unchanged = old.and_then(|s| s.observed_generation) == generation
            && current
                .is_some_and(|c| c.status == status && c.reason == reason && c.message == message);
        if unchanged {
            continue;
        }
        // The transition time moves only when the status does.
        let since = current.filter(|c| c.status == status).map_or_else(
            || Time(k8s_openapi::jiff::Timestamp::now()),
            |c| c.last_transition_time.clone(),
        );
        let new = EniPolicyStatus {
            observed_generation: generation,
            conditions: vec![Condition {
                type_: "Ready".into(),
                status: status.into(),
                reason: reason.into(),
                message,
                observed_generation: generation,
                last_transition_time: since,
            }],
        };
        api.patch_status(
            &policy.name_any(),
            &PatchParams::apply(OPERATOR_MANAGER).force(),
            &Patch::Apply(json!({
                "apiVersion": "enim.io/v1alpha1",
                "kind": "EniPolicy",
                "status": new,
            })),
        )
        .await?;
        written += 1;
    }
    Ok(written)
}

/// While `leader` is true, judges the policies `view` sees every
/// [`INTERVAL`]; returns when `stop` turns true.
pub async fn run(
    client: Client,
    view: ClusterView,
    refusals: Arc<Refusals>,
    leader: watch::Receiver<bool>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        if *leader.borrow() {
            let policies = view.policies();
            if let Err(e) = write_statuses(&client, &policies, &view.pools, &refusals).await {
                tracing::warn!(error = %e, "EniPolicy status: not written, retried");
            }
            if let Err(e) = keep_templates(&client, &policies, &view.namespaces()).await {
                tracing::warn!(error = %e, "EniPolicy claim templates: not kept, retried");
            }
        }
        tokio::select! {
            () = tokio::time::sleep(INTERVAL) => {}
            _ = stop.changed() => if *stop.borrow() { return },
        }
    }
}

#[cfg(test)]
mod tests {
    use enim_crd::{EniPolicySpec, Mode, ZoneSubnet};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

    use super::*;

    #[test]
    fn what_cannot_be_served_and_bad_selectors_are_named() {
        let plain = EniPolicy::new(
            "plain",
            EniPolicySpec {
                mode: Mode::Secondary,
                ..EniPolicySpec::default()
            },
        );
        assert_eq!(judge(&plain, &[], None).0, "True");
        let mut subnets = plain.clone();
        subnets.spec.subnets = vec![ZoneSubnet {
            zone: "z".into(),
            subnet_id: "s".into(),
        }];
        // In secondary mode with no pool in the subnet: not served.
        let (status, reason, message) = judge(&subnets, &[], None);
        assert_eq!((status, reason), ("False", "NotServedYet"));
        assert!(message.contains("subnets"), "{message}");
        // With one: served on its nodes.
        let pool = PoolPolicy {
            name: "db".into(),
            mode: Mode::Secondary,
            subnets: vec!["s".into()],
            security_groups: vec!["sg-db".into()],
            ..PoolPolicy::default()
        };
        let (status, _, message) = judge(&subnets, std::slice::from_ref(&pool), None);
        assert_eq!(status, "True");
        assert!(
            message.contains("enim.io/ip on the nodes of the operator's pool(s) db"),
            "{message}"
        );
        // In primary mode with groups: served.
        let mut primary = subnets.clone();
        primary.spec.mode = Mode::Primary;
        primary.spec.security_groups = vec!["sg-1".into()];
        assert_eq!(judge(&primary, &[], None).0, "True");
        primary.spec.warm_enis = 2;
        let (_, _, message) = judge(&primary, &[], None);
        assert!(
            message.ends_with("; 2 such ENI(s) kept free in each of its zones"),
            "{message}"
        );
        primary.spec.warm_enis = 0;
        // Its claims' ENIs refused by the cloud: not Ready, and why.
        let refused = Refusal {
            made_for: "claim web/db-1-enim-eni".into(),
            error: "InvalidSubnetID.NotFound: the subnet does not exist".into(),
        };
        let (status, reason, message) = judge(&primary, &[], Some(&refused));
        assert_eq!((status, reason), ("False", "CloudRefused"));
        assert!(
            message.contains("web/db-1-enim-eni") && message.contains("InvalidSubnetID.NotFound"),
            "{message}"
        );
        // What cannot be served says so first.
        assert_eq!(judge(&subnets, &[], Some(&refused)).1, "NotServedYet");
        let mut bad = plain;
        bad.spec.pod_selector = Some(LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "a".into(),
                operator: "Near".into(),
                values: None,
            }]),
        });
        let (status, reason, message) = judge(&bad, &[], None);
        assert_eq!((status, reason), ("False", "InvalidSelector"));
        assert!(message.starts_with("podSelector"), "{message}");
    }
}
