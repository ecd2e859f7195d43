//! Kubernetes Events for enimd and enim-operator: [`EventSink`] (a
//! bounded queue in front of kube-runtime's recorder, so a tell never
//! delays the caller) and its [`spam`] filter (a token bucket per object,
//! as the kubelet bounds its own events).

pub mod sink;
pub mod spam;

/// Who posts (controller and instance), as kube-runtime names it.
pub use kube::runtime::events::Reporter;
pub use sink::{
    node_ref, object_ref, pod_ref, EventCounts, EventSink, Notice, Outcome, Severity, SinkLimits,
};
pub use spam::{SpamFilter, SpamLimits};
