//! The allocator's [`Told`] as Kubernetes Events: each on the
//! NetResourceSet and on the Node or ResourceClaim it concerns, handed to
//! the [`EventSink`] (queued, never awaited; rate-limited per object).

use enim_crd::{ClaimRef, NetResourceSet};
use enim_events::{node_ref, object_ref, EventSink, Notice, Severity};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::reflector::{ObjectRef, Store as Cache};
use kube::Resource;

use crate::store::{EniStep, Told};

/// Posts what the allocator tells, with the sets' uids from the cache.
pub(super) struct Teller {
    sink: EventSink,
    sets: Cache<NetResourceSet>,
    /// This replica's Pod: what concerns no node is told there.
    operator: ObjectReference,
}

impl Teller {
    pub(super) fn new(
        sink: EventSink,
        sets: Cache<NetResourceSet>,
        operator: ObjectReference,
    ) -> Teller {
        Teller {
            sink,
            sets,
            operator,
        }
    }

    pub(super) fn tell(&self, told: Told) {
        let set = |node: &str| set_ref(node, set_uid(&self.sets, node).as_deref());
        for n in notices(told, set, &self.operator) {
            if is_set(&n.regarding) && n.regarding.uid.is_none() {
                self.tell_once_known(n);
            } else {
                self.sink.tell(n);
            }
        }
    }

    /// A set this replica has just made may not be in the watch's cache
    /// yet, and `kubectl describe` finds an Event by its object's uid: the
    /// Event waits for the uid (at most [`SET_UID_WAIT`]), then is told
    /// with or without it.
    fn tell_once_known(&self, mut n: Notice) {
        let (sink, sets) = (self.sink.clone(), self.sets.clone());
        tokio::spawn(async move {
            let deadline = tokio::time::Instant::now() + SET_UID_WAIT;
            let node = n.regarding.name.clone().unwrap_or_default();
            while tokio::time::Instant::now() < deadline {
                if let Some(uid) = set_uid(&sets, &node) {
                    n.regarding.uid = Some(uid);
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            sink.tell(n);
        });
    }
}

/// How long an Event about a set waits for the set to reach the cache.
const SET_UID_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

fn set_uid(sets: &Cache<NetResourceSet>, node: &str) -> Option<String> {
    sets.get(&ObjectRef::new(node))
        .and_then(|s| s.meta().uid.clone())
}

fn is_set(r: &ObjectReference) -> bool {
    r.kind.as_deref() == Some(&*NetResourceSet::kind(&()))
}

fn set_ref(node: &str, uid: Option<&str>) -> ObjectReference {
    let api_version = NetResourceSet::api_version(&());
    let kind = NetResourceSet::kind(&());
    object_ref(&api_version, &kind, None, node, uid)
}

fn claim_ref(c: &ClaimRef) -> ObjectReference {
    object_ref(
        "resource.k8s.io/v1",
        "ResourceClaim",
        Some(&c.namespace),
        &c.name,
        Some(&c.uid),
    )
}

/// The reason, action and verb of a failed step.
fn step_names(step: EniStep) -> (&'static str, &'static str, &'static str) {
    match step {
        EniStep::Create => ("EniCreateFailed", "CreateEni", "creating"),
        EniStep::Attach => ("EniAttachFailed", "AttachEni", "attaching"),
        EniStep::Detach => ("EniDetachFailed", "DetachEni", "detaching"),
        EniStep::Delete => ("EniDeleteFailed", "DeleteEni", "deleting"),
    }
}

/// The same event on two objects, each naming the other as related.
fn on_both(
    first: ObjectReference,
    second: ObjectReference,
    severity: Severity,
    (reason, action): (&'static str, &'static str),
    note: String,
) -> Vec<Notice> {
    let one = |regarding: &ObjectReference, related: &ObjectReference| Notice {
        regarding: regarding.clone(),
        related: Some(related.clone()),
        severity,
        reason,
        action,
        note: note.clone(),
    };
    vec![one(&first, &second), one(&second, &first)]
}

/// The events of `told`; `set` makes the reference of a node's set,
/// `operator` is this replica's Pod.
fn notices(
    told: Told,
    set: impl Fn(&str) -> ObjectReference,
    operator: &ObjectReference,
) -> Vec<Notice> {
    match told {
        Told::EniStepFailed {
            node,
            node_uid,
            step,
            eni,
            error,
        } => {
            let (reason, action, verb) = step_names(step);
            let what = match &eni {
                Some(eni) => format!("{verb} ENI {eni} failed (retried at the next resync): {error}"),
                None => format!("{verb} an ENI failed (retried at the next resync): {error}"),
            };
            on_both(
                set(&node),
                node_ref(&node, node_uid.as_deref()),
                Severity::Warning,
                (reason, action),
                what,
            )
        }
        Told::Throttled {
            node,
            node_uid,
            error,
        } => on_both(
            set(&node),
            node_ref(&node, node_uid.as_deref()),
            Severity::Warning,
            ("CloudThrottled", "CallCloud"),
            format!("the cloud throttled a call for this node (the operator's rate limits: [operator.api] and [cloud.api]): {error}"),
        ),
        Told::NodeReleased { node } => on_both(
            set(&node),
            node_ref(&node, None),
            Severity::Normal,
            ("NodeEnisReleased", "ReleaseNode"),
            "the node is gone and its ENIs are back to the cloud: its NetResourceSet is released".into(),
        ),
        Told::ClaimServed { claim, node, eni } => on_both(
            claim_ref(&claim),
            set(&node),
            Severity::Normal,
            ("ClaimServed", "CreateEni"),
            format!("ENI {eni} made for claim {claim} on node {node}"),
        ),
        Told::ClaimNotServable { claim, pod, why } => {
            let note = format!("no ENI can be made for claim {claim} now: {why}");
            let names = ("ClaimNotServable", "PlaceClaim");
            match pod {
                // The pod waits on it, Pending: `kubectl describe pod` shows why.
                Some((name, uid)) => on_both(
                    claim_ref(&claim),
                    object_ref("v1", "Pod", Some(&claim.namespace), &name, Some(&uid)),
                    Severity::Warning,
                    names,
                    note,
                ),
                None => vec![Notice {
                    regarding: claim_ref(&claim),
                    related: None,
                    severity: Severity::Warning,
                    reason: names.0,
                    action: names.1,
                    note,
                }],
            }
        }
        Told::ListingThrottled { error } => vec![Notice {
            regarding: operator.clone(),
            related: None,
            severity: Severity::Warning,
            reason: "CloudThrottled",
            action: "ListEnis",
            note: format!(
                "the cloud throttled the listing of the cluster's ENIs: no node's ENIs are made or released until it answers: {error}"
            ),
        }],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(node: &str) -> ObjectReference {
        set_ref(node, Some("set-uid"))
    }

    fn me() -> ObjectReference {
        object_ref("v1", "Pod", Some("enim-system"), "op-1", None)
    }

    #[test]
    fn a_failed_step_is_told_on_the_set_and_on_the_node_each_naming_the_other() {
        let told = Told::EniStepFailed {
            node: "n1".into(),
            node_uid: Some("node-uid".into()),
            step: EniStep::Attach,
            eni: Some("eni-1".into()),
            error: "boom".into(),
        };
        let out = notices(told, set, &me());
        assert_eq!(out.len(), 2);
        let kinds: Vec<_> = out
            .iter()
            .map(|n| n.regarding.kind.clone().unwrap())
            .collect();
        assert_eq!(kinds, ["NetResourceSet", "Node"]);
        assert_eq!(
            out[0].regarding.api_version.as_deref(),
            Some("enim.io/v1alpha1")
        );
        assert_eq!(out[0].regarding.uid.as_deref(), Some("set-uid"));
        assert_eq!(out[1].regarding.uid.as_deref(), Some("node-uid"));
        assert_eq!(out[0].related.as_ref(), Some(&out[1].regarding));
        assert!(out
            .iter()
            .all(|n| n.reason == "EniAttachFailed" && n.severity == Severity::Warning));
        assert!(out[0].note.contains("eni-1") && out[0].note.contains("boom"));
    }

    #[test]
    fn a_claim_is_told_in_its_namespace_and_an_unservable_one_there_and_on_its_pod() {
        let claim = ClaimRef {
            namespace: "apps".into(),
            name: "c1".into(),
            uid: "claim-uid".into(),
        };
        let served = notices(
            Told::ClaimServed {
                claim: claim.clone(),
                node: "n1".into(),
                eni: "eni-9".into(),
            },
            set,
            &me(),
        );
        assert_eq!(served[0].regarding.namespace.as_deref(), Some("apps"));
        assert_eq!(served[0].regarding.kind.as_deref(), Some("ResourceClaim"));
        assert_eq!(served[1].regarding.kind.as_deref(), Some("NetResourceSet"));
        assert_eq!(served[0].severity, Severity::Normal);
        let unservable = notices(
            Told::ClaimNotServable {
                claim: claim.clone(),
                pod: None,
                why: "no room".into(),
            },
            set,
            &me(),
        );
        assert_eq!(unservable.len(), 1);
        assert_eq!(unservable[0].reason, "ClaimNotServable");
        assert!(unservable[0].note.ends_with("apps/c1 now: no room"));
        // A claim made for a pod: the pod is told too, in its namespace.
        let with_pod = notices(
            Told::ClaimNotServable {
                claim,
                pod: Some(("db-1".into(), "pod-uid".into())),
                why: "no room".into(),
            },
            set,
            &me(),
        );
        assert_eq!(with_pod.len(), 2);
        let pod = &with_pod[1].regarding;
        assert_eq!(pod.kind.as_deref(), Some("Pod"));
        assert_eq!(
            (
                pod.namespace.as_deref(),
                pod.name.as_deref(),
                pod.uid.as_deref()
            ),
            (Some("apps"), Some("db-1"), Some("pod-uid"))
        );
        assert_eq!(with_pod[0].related.as_ref(), Some(pod));
        assert!(with_pod
            .iter()
            .all(|n| n.reason == "ClaimNotServable" && n.severity == Severity::Warning));
    }

    #[test]
    fn a_throttled_listing_is_told_on_the_operators_pod() {
        let told = Told::ListingThrottled {
            error: "RequestLimitExceeded".into(),
        };
        let out = notices(told, set, &me());
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].regarding, me());
        assert_eq!(out[0].reason, "CloudThrottled");
    }
}
