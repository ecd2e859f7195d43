//! The sink against a real API server (testkit's etcd + kube-apiserver):
//! an event lands with its reason, type, note and object, and a storm of
//! identical failures about one object posts at most the spam filter's
//! burst, folded into one Event's series.

use std::time::Duration;

use enim_events::{node_ref, pod_ref, EventSink, Notice, Outcome, Severity, SinkLimits};
use enim_testkit::apiserver::ControlPlane;
use k8s_openapi::api::events::v1::Event;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::events::Reporter;
use kube::Api;

async fn admin(cp: &ControlPlane) -> kube::Client {
    let kc = Kubeconfig::read_from(cp.admin_kubeconfig()).expect("admin kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("client config");
    kube::Client::try_from(config).expect("client")
}

/// Waits (30 s at most) until the sink's task has handled `n` events.
async fn handled(sink: &EventSink, n: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while sink.counts().handled() < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "handled {} of {n}",
            sink.counts().handled()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The events in `namespace` about object `name` with `reason`.
async fn events_about(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    reason: &str,
) -> Vec<Event> {
    let api: Api<Event> = Api::namespaced(client.clone(), namespace);
    api.list(&Default::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .collect()
}

fn refused(regarding: k8s_openapi::api::core::v1::ObjectReference, reason: &'static str) -> Notice {
    Notice {
        regarding,
        related: None,
        severity: Severity::Warning,
        reason,
        action: "AddPod",
        note: "no free ENI: all 2 ENIs of this node are in use".into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_lands_on_its_object_and_a_storm_posts_at_most_the_burst() {
    let Some(cp) = tokio::task::block_in_place(ControlPlane::start) else {
        return;
    };
    let client = admin(&cp).await;
    let reporter = Reporter {
        controller: "enimd".into(),
        instance: Some("node-a".into()),
    };
    let sink = EventSink::start(client.clone(), reporter, SinkLimits::default());

    // One refusal on a pod: in the pod's namespace, about the pod.
    sink.tell(refused(
        pod_ref("default", "web-1", Some("uid-1")),
        "NoFreeEni",
    ));
    handled(&sink, 1).await;
    assert_eq!(sink.counts().get(Outcome::Posted), 1);
    let found = events_about(&client, "default", "web-1", "NoFreeEni").await;
    assert_eq!(found.len(), 1, "{found:?}");
    let e = &found[0];
    assert_eq!(e.type_.as_deref(), Some("Warning"));
    assert_eq!(e.reporting_controller.as_deref(), Some("enimd"));
    assert_eq!(e.reporting_instance.as_deref(), Some("node-a"));
    assert_eq!(e.action.as_deref(), Some("AddPod"));
    assert!(e
        .note
        .as_deref()
        .unwrap_or_default()
        .contains("no free ENI"));
    let regarding = e.regarding.as_ref().unwrap();
    assert_eq!(regarding.kind.as_deref(), Some("Pod"));
    assert_eq!(regarding.uid.as_deref(), Some("uid-1"));

    // A storm: 100 identical failures about one node. The burst (25) is
    // posted, folded into one Event; the other 75 are held back.
    const STORM: u64 = 100;
    let burst = u64::from(enim_events::spam::DEFAULT_BURST);
    for _ in 0..STORM {
        sink.tell(refused(node_ref("node-a", None), "EniQuarantined"));
    }
    handled(&sink, 1 + STORM).await;
    assert_eq!(sink.counts().get(Outcome::Posted), 1 + burst);
    assert_eq!(sink.counts().get(Outcome::RateLimited), STORM - burst);
    assert_eq!(sink.counts().get(Outcome::Failed), 0);
    // A cluster-scoped object's events go to "default".
    let storm = events_about(&client, "default", "node-a", "EniQuarantined").await;
    assert_eq!(storm.len(), 1, "one Event for the repeats: {storm:?}");
    let count = storm[0].series.as_ref().map_or(1, |s| s.count);
    assert!(
        i64::from(count) <= i64::try_from(burst).unwrap(),
        "series count {count} above the burst"
    );
    assert_eq!(i64::from(count), i64::try_from(burst).unwrap());
    assert_eq!(
        storm[0].regarding.as_ref().and_then(|r| r.uid.as_deref()),
        Some("node-a"),
        "a node's name stands in for its uid, as the kubelet's"
    );

    // Another object is not held back by the first one's storm.
    sink.tell(refused(pod_ref("default", "web-2", None), "NoClaim"));
    handled(&sink, 2 + STORM).await;
    assert_eq!(
        events_about(&client, "default", "web-2", "NoClaim")
            .await
            .len(),
        1
    );
}
