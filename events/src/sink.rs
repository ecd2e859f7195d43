//! [`EventSink`]: where a component hands the events it has to tell. A
//! tell never waits: it goes into a bounded queue (a full queue drops it
//! and counts the drop), and one background task posts them in order
//! through kube-runtime's [`Recorder`], which folds repeats of one event
//! (same object, reason and action) into the first one's `series`. Before
//! the post, the [`SpamFilter`] takes a token of the object's bucket, so a
//! storm of failures cannot flood the API server.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::Client;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::spam::{SpamFilter, SpamLimits};

/// Events waiting to be posted at most; more are dropped (and counted).
pub const DEFAULT_QUEUE: usize = 256;
/// The API server refuses a longer note (events.k8s.io/v1: 1 kB).
const NOTE_MAX_BYTES: usize = 1024;

/// Warning or Normal, as `kubectl get events` shows the type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    Normal,
    Warning,
}

/// One event to tell.
#[derive(Debug, Clone, PartialEq)]
pub struct Notice {
    /// The object it is about (shown by `kubectl describe` of it).
    pub regarding: ObjectReference,
    /// A second object it concerns (a claim's node, say).
    pub related: Option<ObjectReference>,
    pub severity: Severity,
    /// PascalCase, e.g. `EniCreateFailed`.
    pub reason: &'static str,
    /// What was being done, PascalCase, e.g. `CreateEni`.
    pub action: &'static str,
    pub note: String,
}

/// What became of the events handed to a sink (`enim_events_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Created, or folded into its first post's series.
    Posted,
    /// The queue was full: dropped without waiting.
    QueueFull,
    /// The object's bucket was empty.
    RateLimited,
    /// The API server refused it or did not answer.
    Failed,
}

impl Outcome {
    const ALL: [Outcome; 4] = [
        Outcome::Posted,
        Outcome::QueueFull,
        Outcome::RateLimited,
        Outcome::Failed,
    ];

    fn label(self) -> &'static str {
        match self {
            Outcome::Posted => "posted",
            Outcome::QueueFull => "queue_full",
            Outcome::RateLimited => "rate_limited",
            Outcome::Failed => "failed",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

/// The sink's counters, by outcome.
#[derive(Clone, Debug, Default)]
pub struct EventCounts(Family<OutcomeLabel, Counter>);

impl EventCounts {
    fn inc(&self, outcome: Outcome) {
        self.counter(outcome).inc();
    }

    fn counter(&self, outcome: Outcome) -> Counter {
        self.0
            .get_or_create(&OutcomeLabel {
                outcome: outcome.label(),
            })
            .clone()
    }

    pub fn get(&self, outcome: Outcome) -> u64 {
        self.counter(outcome).get()
    }

    /// Events the background task is done with (posted, limited, failed).
    pub fn handled(&self) -> u64 {
        [Outcome::Posted, Outcome::RateLimited, Outcome::Failed]
            .into_iter()
            .map(|o| self.get(o))
            .sum()
    }
}

/// The sink's bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SinkLimits {
    pub queue: usize,
    pub spam: SpamLimits,
}

impl Default for SinkLimits {
    fn default() -> Self {
        SinkLimits {
            queue: DEFAULT_QUEUE,
            spam: SpamLimits::default(),
        }
    }
}

/// See the module's documentation. Cheap to clone: clones share the queue.
#[derive(Clone, Debug)]
pub struct EventSink {
    /// `None`: events are off (no API server), tells do nothing.
    queue: Option<mpsc::Sender<Notice>>,
    counts: EventCounts,
}

impl EventSink {
    /// Starts the background task that posts as `reporter`. Must be called
    /// within a tokio runtime.
    pub fn start(client: Client, reporter: Reporter, limits: SinkLimits) -> EventSink {
        let (tx, rx) = mpsc::channel(limits.queue.max(1));
        let counts = EventCounts::default();
        let recorder = Recorder::new(client, reporter);
        tokio::spawn(post_all(
            rx,
            recorder,
            SpamFilter::new(limits.spam),
            counts.clone(),
        ));
        EventSink {
            queue: Some(tx),
            counts,
        }
    }

    /// A sink that tells nobody (no API server to tell).
    pub fn off() -> EventSink {
        EventSink {
            queue: None,
            counts: EventCounts::default(),
        }
    }

    /// Queues `notice` without waiting; a full queue drops it.
    pub fn tell(&self, notice: Notice) {
        let Some(queue) = &self.queue else { return };
        match queue.try_send(notice) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => self.counts.inc(Outcome::QueueFull),
            // The task is gone only when the runtime stops.
            Err(mpsc::error::TrySendError::Closed(_)) => {}
        }
    }

    pub fn counts(&self) -> &EventCounts {
        &self.counts
    }

    /// Registers `events` (with the registry's prefix, e.g.
    /// `enim_events_total`), by outcome.
    /// Every outcome is served from the start, at 0 (off too: the family
    /// is on `/metrics` either way).
    pub fn register(&self, registry: &mut Registry) {
        for o in Outcome::ALL {
            self.counts.counter(o);
        }
        registry.register(
            "events",
            "Kubernetes Events handed to the sink, by outcome (posted, queue_full, rate_limited, failed)",
            self.counts.0.clone(),
        );
    }
}

/// The key of `object`'s spam bucket.
fn object_key(r: &ObjectReference) -> String {
    let part = |s: &Option<String>| s.clone().unwrap_or_default();
    format!(
        "{}/{}/{}/{}/{}",
        part(&r.api_version),
        part(&r.kind),
        part(&r.namespace),
        part(&r.name),
        part(&r.uid)
    )
}

/// `note` cut to what the API server takes, at a character boundary.
fn bounded_note(mut note: String) -> String {
    if note.len() > NOTE_MAX_BYTES {
        let mut end = NOTE_MAX_BYTES - '…'.len_utf8();
        while !note.is_char_boundary(end) {
            end -= 1;
        }
        note.truncate(end);
        note.push('…');
    }
    note
}

async fn post_all(
    mut rx: mpsc::Receiver<Notice>,
    recorder: Recorder,
    mut spam: SpamFilter,
    counts: EventCounts,
) {
    // Failures are logged once each time they start, not at every event.
    let mut failing = false;
    while let Some(n) = rx.recv().await {
        if !spam.allow(&object_key(&n.regarding), Instant::now()) {
            counts.inc(Outcome::RateLimited);
            continue;
        }
        let event = Event {
            type_: match n.severity {
                Severity::Normal => EventType::Normal,
                Severity::Warning => EventType::Warning,
            },
            reason: n.reason.into(),
            note: Some(bounded_note(n.note)),
            action: n.action.into(),
            secondary: n.related,
        };
        match recorder.publish(&event, &n.regarding).await {
            Ok(()) => {
                counts.inc(Outcome::Posted);
                failing = false;
            }
            Err(e) => {
                counts.inc(Outcome::Failed);
                if !failing {
                    tracing::warn!(reason = n.reason, error = %e, "could not post an event (further failures not logged until one is posted)");
                }
                failing = true;
            }
        }
    }
}

/// A reference to the cluster-scoped or namespaced object `kind` of
/// `api_version` (`v1` for the core group).
pub fn object_ref(
    api_version: &str,
    kind: &str,
    namespace: Option<&str>,
    name: &str,
    uid: Option<&str>,
) -> ObjectReference {
    ObjectReference {
        api_version: Some(api_version.into()),
        kind: Some(kind.into()),
        namespace: namespace.map(str::to_string),
        name: Some(name.into()),
        uid: uid.filter(|u| !u.is_empty()).map(str::to_string),
        ..Default::default()
    }
}

/// Node `name`. Without its uid the node's name stands in, as the kubelet
/// does (`kubectl describe node` looks for both).
pub fn node_ref(name: &str, uid: Option<&str>) -> ObjectReference {
    object_ref("v1", "Node", None, name, Some(uid.unwrap_or(name)))
}

/// Pod `namespace/name`.
pub fn pod_ref(namespace: &str, name: &str, uid: Option<&str>) -> ObjectReference {
    object_ref("v1", "Pod", Some(namespace), name, uid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_note_is_cut_at_a_character_boundary_within_the_limit() {
        let note = "é".repeat(1000);
        let cut = bounded_note(note);
        assert!(cut.len() <= NOTE_MAX_BYTES, "{}", cut.len());
        assert!(cut.ends_with('…'));
        let short = bounded_note("no free ENI".into());
        assert_eq!(short, "no free ENI");
    }

    #[test]
    fn objects_differing_in_any_part_have_their_own_bucket() {
        let a = pod_ref("ns", "p", Some("u1"));
        let b = pod_ref("ns", "p", Some("u2"));
        let c = pod_ref("other", "p", Some("u1"));
        let n = node_ref("p", None);
        let keys: std::collections::HashSet<String> =
            [&a, &b, &c, &n].into_iter().map(object_key).collect();
        assert_eq!(keys.len(), 4);
        assert_eq!(n.uid.as_deref(), Some("p"));
    }

    #[tokio::test]
    async fn a_full_queue_drops_and_counts_without_waiting() {
        // A sink whose task never runs: the receiver is held, not read.
        let (tx, _rx) = mpsc::channel(2);
        let sink = EventSink {
            queue: Some(tx),
            counts: EventCounts::default(),
        };
        let notice = Notice {
            regarding: node_ref("n", None),
            related: None,
            severity: Severity::Warning,
            reason: "Test",
            action: "Test",
            note: String::new(),
        };
        for _ in 0..5 {
            sink.tell(notice.clone());
        }
        assert_eq!(sink.counts().get(Outcome::QueueFull), 3);
        // Off: nothing queued, nothing counted.
        let off = EventSink::off();
        off.tell(notice);
        assert_eq!(off.counts().get(Outcome::QueueFull), 0);
    }
}
