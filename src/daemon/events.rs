//! The agent's Kubernetes Events (`[events]`, off by default): a pod's ADD
//! refused, and why (no free ENI or, in secondary mode, address; a
//! quarantined ENI; no claim), on the Pod; an ENI quarantined, on the Node. They go through
//! [`EventSink`]: an ADD's reply never waits on the API server, and a
//! storm of refusals is held to the spam filter's bounds.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use enim_core::{PodRef, ProviderError};
use enim_events::{node_ref, pod_ref, EventSink, Notice, Severity, SinkLimits};
use enim_provider::EniProvider;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::engine::EngineError;
use crate::support::exclusion::Reservation;

/// `[events]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct EventsConfig {
    /// Post Events to the API server. Off by default: an agent outside a
    /// cluster has no API server to tell.
    #[serde(default)]
    pub enabled: bool,
    /// The Node that events about ENIs are posted on.
    ///
    /// Default: env `NODE_NAME`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// A kubeconfig file.
    ///
    /// Default: the pod's in-cluster ServiceAccount.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubeconfig: Option<PathBuf>,
    /// How often the node's ENIs are looked at for new quarantines; above
    /// zero.
    #[serde(default = "default_quarantine_check", with = "humantime_serde")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub quarantine_check: Duration,
}

fn default_quarantine_check() -> Duration {
    Duration::from_secs(10)
}

impl Default for EventsConfig {
    fn default() -> Self {
        EventsConfig {
            enabled: false,
            node_name: None,
            kubeconfig: None,
            quarantine_check: default_quarantine_check(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EventsError {
    #[error("[events] quarantine_check must be above zero")]
    ZeroCheck,
    #[error(
        "[events] enabled = true needs the node's name: set node_name, or NODE_NAME (the \
         DaemonSet sets it from spec.nodeName)"
    )]
    NoNodeName,
    #[error("[events] enabled = true, but no client for the API server: {0}")]
    Client(#[source] enim_provider_cluster::ClusterError),
}

impl EventsConfig {
    pub fn validate(&self) -> Result<(), EventsError> {
        if self.quarantine_check.is_zero() {
            return Err(EventsError::ZeroCheck);
        }
        Ok(())
    }

    fn node(&self) -> Option<String> {
        self.node_name
            .clone()
            .or_else(|| std::env::var("NODE_NAME").ok())
            .filter(|n| !n.is_empty())
    }
}

/// What the agent tells, and the ENIs it has told quarantined.
#[derive(Debug)]
pub struct AgentEvents {
    sink: EventSink,
    node: String,
    quarantined_now: AtomicUsize,
}

impl AgentEvents {
    /// Off: nothing is told.
    pub fn off() -> AgentEvents {
        AgentEvents {
            sink: EventSink::off(),
            node: String::new(),
            quarantined_now: AtomicUsize::new(0),
        }
    }

    /// As `config` says: off, or posting as `enimd` of the node.
    pub async fn start(config: &EventsConfig) -> Result<AgentEvents, EventsError> {
        if !config.enabled {
            return Ok(AgentEvents::off());
        }
        let node = config.node().ok_or(EventsError::NoNodeName)?;
        let client = enim_provider_cluster::kube_client(config.kubeconfig.as_deref())
            .await
            .map_err(EventsError::Client)?;
        let reporter = enim_events::Reporter {
            controller: "enimd".into(),
            instance: Some(node.clone()),
        };
        let sink = EventSink::start(client, reporter, SinkLimits::default());
        tracing::info!(%node, "posting Events");
        Ok(AgentEvents {
            sink,
            node,
            quarantined_now: AtomicUsize::new(0),
        })
    }

    pub fn sink(&self) -> &EventSink {
        &self.sink
    }

    /// Tells `pod` why its ADD was refused, when the reason is one a pod's
    /// owner can act on; never waits.
    pub fn add_refused(&self, pod: &PodRef, error: &EngineError, dra: bool) {
        if pod.namespace.is_empty() || pod.name.is_empty() {
            return;
        }
        let quarantined = self.quarantined_now.load(Ordering::Relaxed);
        let Some((reason, note)) = refusal(error, dra, quarantined) else {
            return;
        };
        self.sink.tell(Notice {
            regarding: pod_ref(&pod.namespace, &pod.name, pod.uid.as_deref()),
            related: Some(node_ref(&self.node, None)),
            severity: Severity::Warning,
            reason,
            action: "AddPodNetwork",
            note,
        });
    }

    /// Tells the Node of each ENI of `enis` newly quarantined.
    fn quarantined(&self, enis: &[String]) {
        for eni in enis {
            self.sink.tell(Notice {
                regarding: node_ref(&self.node, None),
                related: None,
                severity: Severity::Warning,
                reason: "EniQuarantined",
                action: "CheckEni",
                note: format!(
                    "ENI {eni} is quarantined: its device is not on the node (detached outside \
                     enim, or a failed NIC); no pod gets it until the device is back"
                ),
            });
        }
    }
}

/// The reason and note of an ADD refused with `error`, if it is one told
/// on the pod: no free ENI (`quarantined` of the node's are quarantined),
/// a quarantined ENI, no claim on a DRA node (`dra`).
pub fn refusal(
    error: &EngineError,
    dra: bool,
    quarantined: usize,
) -> Option<(&'static str, String)> {
    match error {
        EngineError::Provider(ProviderError::Exhausted { .. }) if quarantined > 0 => Some((
            "EniQuarantined",
            format!(
                "{error}; {quarantined} of the node's ENIs are quarantined (their device is not \
                 on the node): see the Node's EniQuarantined events"
            ),
        )),
        EngineError::Provider(ProviderError::Exhausted { .. }) => {
            Some(("NoFreeEni", error.to_string()))
        }
        EngineError::DeviceMissing { .. } => Some(("EniQuarantined", error.to_string())),
        // Secondary mode: every address of the node's ENIs held or cooling.
        EngineError::NoFreeAddress(_) => Some(("NoFreeAddress", error.to_string())),
        // The host path's service CIDRs are to come from the API, not yet listed.
        EngineError::ServiceCidrsUnknown(_) => Some(("ServiceCIDRsUnknown", error.to_string())),
        // On a DRA node the provider refuses a pod without a prepared
        // claim as a configuration error (permanent for that pod).
        EngineError::Provider(ProviderError::Config(_)) if dra => {
            Some(("NoClaim", error.to_string()))
        }
        EngineError::RollbackFailed { original, .. } => refusal(original, dra, quarantined),
        EngineError::Shared(inner) => refusal(inner, dra, quarantined),
        _ => None,
    }
}

/// Looks at `provider`'s ENIs every `every` until `stop`, and tells each
/// ENI newly quarantined; keeps the count for [`AgentEvents::add_refused`].
pub async fn watch_quarantines(
    events: Arc<AgentEvents>,
    provider: Arc<dyn EniProvider>,
    every: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut told: BTreeSet<String> = BTreeSet::new();
    loop {
        if let Ok(enis) = provider.list().await {
            let now: BTreeSet<String> = enis
                .into_iter()
                .filter(|e| {
                    e.owner.as_ref().and_then(Reservation::of) == Some(Reservation::Missing)
                })
                .map(|e| e.id)
                .collect();
            let new: Vec<String> = now.difference(&told).cloned().collect();
            events.quarantined(&new);
            events.quarantined_now.store(now.len(), Ordering::Relaxed);
            told = now;
        }
        tokio::select! {
            _ = stop.changed() => return,
            () = tokio::time::sleep(every) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exhausted() -> EngineError {
        EngineError::Provider(ProviderError::Exhausted { total: 2 })
    }

    #[test]
    fn each_refusal_a_pod_can_act_on_has_its_reason() {
        let reason = |e: &EngineError, dra: bool, q: usize| refusal(e, dra, q).map(|r| r.0);
        assert_eq!(reason(&exhausted(), false, 0), Some("NoFreeEni"));
        assert_eq!(reason(&exhausted(), false, 1), Some("EniQuarantined"));
        let missing = EngineError::DeviceMissing {
            eni_id: "eni-1".into(),
            mac: "02:00:00:00:00:01".into(),
        };
        assert_eq!(reason(&missing, false, 0), Some("EniQuarantined"));
        let no_address = EngineError::NoFreeAddress("every address held".into());
        assert_eq!(reason(&no_address, false, 0), Some("NoFreeAddress"));
        let config = EngineError::Provider(ProviderError::Config("no claim".into()));
        assert_eq!(reason(&config, true, 0), Some("NoClaim"));
        assert_eq!(
            reason(&config, false, 0),
            None,
            "not a DRA node: not a claim"
        );
        // Wrapped: the original's reason.
        let shared = EngineError::Shared(Arc::new(exhausted()));
        assert_eq!(reason(&shared, false, 0), Some("NoFreeEni"));
        let rolled = EngineError::RollbackFailed {
            original: Box::new(exhausted()),
            undo: Box::new(EngineError::InvalidRequest("x".into())),
        };
        assert_eq!(reason(&rolled, false, 0), Some("NoFreeEni"));
        // Others are the kubelet's to tell.
        assert_eq!(
            reason(&EngineError::InvalidRequest("x".into()), false, 0),
            None
        );
        let throttled = EngineError::Provider(ProviderError::Throttled("slow down".into()));
        assert_eq!(reason(&throttled, false, 0), None);
    }

    #[test]
    fn the_note_says_how_many_are_quarantined() {
        let (_, note) = refusal(&exhausted(), false, 2).unwrap();
        assert!(
            note.contains("2 of the node's ENIs are quarantined"),
            "{note}"
        );
        assert!(note.contains("no free ENI"), "{note}");
    }

    #[test]
    fn the_config_defaults_off_and_refuses_a_zero_check() {
        let c: EventsConfig = toml::from_str("").unwrap();
        assert!(!c.enabled);
        assert_eq!(c.quarantine_check, Duration::from_secs(10));
        let zero: EventsConfig = toml::from_str("quarantine_check = \"0s\"").unwrap();
        assert!(matches!(zero.validate(), Err(EventsError::ZeroCheck)));
        assert!(toml::from_str::<EventsConfig>("enable = true").is_err());
    }
}
