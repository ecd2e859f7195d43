//! One suite of protocol, fault and rollback cases, run against every
//! driver over its fake: whatever a driver does to the kernel, the engine's
//! promises (nothing left after a failed ADD, idempotent ADD and DEL,
//! recovery that finishes or undoes, GC that spares the young and the
//! living) must hold for it. A new driver gets a [`Harness`] and the whole
//! suite with one line in [`conformance_suite!`].

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use enim_api::model::{AttachmentKey, Phase};
use enim_api::{GcReport, GcRequest, MtuExpectation, ValidAttachment};
use enim_core::EniOwner;
use tokio::sync::Notify;

use super::{Driver, Engine, EngineError};

pub(crate) const POD: &str = "/run/netns/pod";

/// A driver over its fake kernel, with a static provider and a checkpoint
/// in a temporary directory.
#[async_trait]
pub(crate) trait Harness: Send + Sync + Sized + 'static {
    type D: Driver;
    /// Fake steps a fault can be armed at, each failing the ADD's pod side.
    const FAULT_STEPS: &'static [&'static str];
    /// A fault that fails the pod side, and one that fails its undo.
    const UNDO_FAULTS: (&'static str, &'static str);
    /// Which checkpoint write of a first ADD is its outcome (1 = the first).
    const OUTCOME_WRITE: u32;
    /// ADDs `n` ENIs can serve before the node is full.
    fn capacity(n: u8) -> usize;

    /// A recovered node with `n` ENIs and a pod netns at [`POD`].
    async fn new(n: u8) -> Self;
    fn engine(&self) -> &Engine<Self::D>;
    /// The node restarts: a new engine over the same kernel, provider and
    /// checkpoint file replaces the old one, and recovers.
    async fn restart(&mut self);
    fn fail_once(&self, step: &'static str);
    fn add_netns(&self, path: &Path);
    /// The netns dies (its devices come home or die with it).
    fn kill_netns(&self, path: &Path);
    /// Something that is not enim's already has `ifname` in `netns`.
    fn occupy(&self, netns: &Path, ifname: &str);
    /// The pod side in `netns` drifts from what was recorded.
    fn break_pod(&self, netns: &Path);
    /// Pauses the next pod-side step; returns (entered, resume).
    fn pause_plumb(&self) -> (Arc<Notify>, Arc<Notify>);
    /// Waits for work a DEL left behind its answer (none by default).
    async fn settle(&self) {}
    /// Pod-side objects in the kernel.
    fn pod_objects(&self) -> usize;
    /// What the node hands out that is held (ENIs or addresses).
    async fn held(&self) -> usize;
    /// Every host device is under its host name and MTU.
    fn host_is_home(&self) -> bool;
}

/// The fixtures' MAC of ENI `i`.
pub(crate) fn mac(i: u8) -> enim_core::MacAddr {
    enim_core::MacAddr([2, 0, 0, 0, 0, i])
}

/// Static ENI `i` of the fixtures: `10.0.i.10/24` and `fd00:i::10/64`,
/// device index `i`, MTU 9001, two secondary addresses of each family.
pub(crate) fn static_eni(i: u8) -> enim_provider_static::StaticEniConfig {
    enim_provider_static::StaticEniConfig {
        id: format!("eni-{i}"),
        mac: mac(i),
        ipv4: format!("10.0.{i}.10/24").parse().unwrap(),
        gateway4: format!("10.0.{i}.1").parse().unwrap(),
        ipv6: Some(format!("fd00:{i}::10/64").parse().unwrap()),
        gateway6: Some(format!("fd00:{i}::1").parse().unwrap()),
        mtu: Some(9001),
        device_index: Some(u32::from(i)),
        secondary_ipv4: (11..=12)
            .map(|h| format!("10.0.{i}.{h}").parse().unwrap())
            .collect(),
        secondary_ipv6: (11..=12)
            .map(|h| format!("fd00:{i}::{h}").parse().unwrap())
            .collect(),
        placement: Default::default(),
    }
}

pub(crate) fn owner(cid: &str) -> EniOwner {
    EniOwner {
        network: "n".into(),
        container_id: cid.into(),
        ifname: "eth0".into(),
        pod: Default::default(),
    }
}

fn pod() -> PathBuf {
    PathBuf::from(POD)
}

/// The invariant after a failed ADD or a full DEL: nothing of any pod.
pub(crate) async fn assert_clean<H: Harness>(h: &H, why: &str) {
    h.settle().await;
    assert_eq!(h.pod_objects(), 0, "{why}: pod objects left");
    assert!(
        h.engine().attachments().await.is_empty(),
        "{why}: a record is left"
    );
    assert_eq!(h.held().await, 0, "{why}: something is still held");
    assert!(h.host_is_home(), "{why}: a host device is not home");
}

pub(crate) async fn add_is_idempotent_and_del_restores<H: Harness>() {
    let h = H::new(1).await;
    let e = h.engine();
    let first = e.add(&owner("a"), &pod()).await.unwrap();
    assert_eq!(e.add(&owner("a"), &pod()).await.unwrap(), first);
    assert_eq!(e.attachments().await[0].phase, Phase::Ready);
    assert!(h.pod_objects() > 0);
    e.check(&owner("a"), &pod(), MtuExpectation::Recorded)
        .await
        .unwrap();
    e.del(&owner("a")).await.unwrap();
    e.del(&owner("a")).await.unwrap();
    assert_clean(&h, "after DEL").await;
    // DEL of an attachment never made is success too.
    e.del(&owner("never")).await.unwrap();
}

pub(crate) async fn every_add_fault_rolls_back<H: Harness>() {
    for step in H::FAULT_STEPS {
        let h = H::new(1).await;
        h.fail_once(step);
        let err = h.engine().add(&owner("c"), &pod()).await.expect_err(step);
        assert!(
            !matches!(err, EngineError::RollbackFailed { .. }),
            "{step}: {err}"
        );
        assert_clean(&h, step).await;
        h.engine()
            .add(&owner("c"), &pod())
            .await
            .unwrap_or_else(|e| panic!("{step}: retry: {e}"));
    }
}

pub(crate) async fn checkpoint_write_failures_roll_back<H: Harness>() {
    // Every write an ADD waits for; a write behind it (the outcome) fails
    // nobody and is carried by the next write.
    for nth in 1..=3 {
        let mut h = H::new(1).await;
        h.engine().checkpoint().fail_nth_write(nth);
        match h.engine().add(&owner("c"), &pod()).await {
            Err(err) => {
                assert!(matches!(err, EngineError::Checkpoint(_)), "{nth}: {err}");
                assert_clean(&h, &format!("checkpoint write {nth}")).await;
            }
            Ok(_) => {
                h.engine().checkpoint().settle().await;
                h.engine().checkpoint().flush().await.unwrap();
                h.restart().await;
                let recs = h.engine().attachments().await;
                assert_eq!(recs[0].phase, Phase::Ready, "{nth}");
            }
        }
    }
}

pub(crate) async fn outcomes_are_written_behind_and_a_failed_one_is_retried<H: Harness>() {
    let h = H::new(1).await;
    let e = h.engine();
    let cp = e.checkpoint().clone();
    let on_disk = || {
        let path = cp.path().to_path_buf();
        async move {
            crate::store::checkpoint::Checkpoint::open(&path, false)
                .unwrap()
                .list()
                .await
                .into_iter()
                .map(|r| r.phase)
                .collect::<Vec<_>>()
        }
    };
    // The outcome is written behind: its failure does not fail the ADD,
    // and memory keeps it for the next write.
    cp.fail_nth_write(H::OUTCOME_WRITE);
    e.add(&owner("c"), &pod()).await.unwrap();
    assert_eq!(e.attachments().await[0].phase, Phase::Ready);
    cp.settle().await;
    assert!(
        cp.has_unwritten().await,
        "the failed write-behind left nothing pending"
    );
    assert_eq!(on_disk().await, [Phase::Adding], "disk keeps the intent");
    cp.flush().await.unwrap();
    assert!(!cp.has_unwritten().await);
    assert_eq!(on_disk().await, [Phase::Ready]);
    // DEL's outcome (the record's removal) lands behind it too.
    e.del(&owner("c")).await.unwrap();
    assert!(e.attachments().await.is_empty());
    cp.settle().await;
    assert!(!cp.has_unwritten().await);
    assert!(on_disk().await.is_empty(), "the removal never landed");
}

pub(crate) async fn ifname_clash_leaves_the_pod_alone<H: Harness>() {
    let h = H::new(1).await;
    h.occupy(&pod(), "eth0");
    let err = h.engine().add(&owner("c"), &pod()).await.unwrap_err();
    assert!(matches!(err, EngineError::IfnameConflict { .. }), "{err}");
    assert_clean(&h, "clash").await;
}

pub(crate) async fn failed_undo_keeps_the_record_and_recovery_finishes_it<H: Harness>() {
    let mut h = H::new(1).await;
    let (fail, fail_undo) = H::UNDO_FAULTS;
    h.fail_once(fail);
    h.fail_once(fail_undo);
    let err = h.engine().add(&owner("c"), &pod()).await.unwrap_err();
    assert!(matches!(err, EngineError::RollbackFailed { .. }), "{err}");
    let recs = h.engine().attachments().await;
    assert_eq!(recs.len(), 1, "the half-done attachment must stay recorded");
    assert_eq!(recs[0].phase, Phase::Adding);
    assert!(h.held().await > 0, "held while the kernel may still use it");
    h.restart().await;
    assert_clean(&h, "after recovery").await;
}

pub(crate) async fn recovery_finishes_or_undoes_intents_and_keeps_ready_ones<H: Harness>() {
    let mut h = H::new(3).await;
    let e = h.engine();
    let (other, third) = (
        PathBuf::from("/run/netns/other"),
        PathBuf::from("/run/netns/third"),
    );
    h.add_netns(&other);
    h.add_netns(&third);
    e.add(&owner("ready"), &pod()).await.unwrap();
    e.add(&owner("adding"), &other).await.unwrap();
    e.add(&owner("deleting"), &third).await.unwrap();
    // Crashes before the outcome write (everything made), and after a
    // DEL's intent.
    for (cid, phase) in [("adding", Phase::Adding), ("deleting", Phase::Deleting)] {
        let key = AttachmentKey::of(&owner(cid));
        let mut rec = e.checkpoint().get(&key).await.unwrap();
        rec.phase = phase;
        e.checkpoint().put(rec).await.unwrap();
    }
    let held_by_one = h.held().await / 3;
    h.restart().await;
    let again = h.engine();
    let phases: Vec<(String, Phase)> = again
        .attachments()
        .await
        .iter()
        .map(|r| (r.key.container_id.clone(), r.phase))
        .collect();
    assert_eq!(
        phases,
        [
            ("adding".into(), Phase::Ready),
            ("ready".into(), Phase::Ready)
        ]
    );
    assert_eq!(h.held().await, 2 * held_by_one);
    for cid in ["adding", "ready"] {
        let netns = if cid == "ready" { pod() } else { other.clone() };
        again
            .check(&owner(cid), &netns, MtuExpectation::Recorded)
            .await
            .unwrap();
    }
    // What "deleting" held is free again, and nothing is handed out twice.
    again.add(&owner("new"), &third).await.unwrap();
    assert_eq!(h.held().await, 3 * held_by_one);
}

pub(crate) async fn a_stale_record_never_touches_another_attachment<H: Harness>() {
    let h = H::new(1).await;
    let e = h.engine();
    e.add(&owner("old"), &pod()).await.unwrap();
    let stale = e.attachments().await.remove(0);
    e.del(&owner("old")).await.unwrap();
    let other = PathBuf::from("/run/netns/other");
    h.add_netns(&other);
    e.add(&owner("new"), &other).await.unwrap();
    // A crash left the old record behind.
    e.checkpoint().put(stale).await.unwrap();
    e.del(&owner("old")).await.unwrap();
    e.check(&owner("new"), &other, MtuExpectation::Recorded)
        .await
        .expect("the new attachment is untouched");
    assert_eq!(e.attachments().await.len(), 1);
}

pub(crate) async fn gc_collects_the_dead_and_spares_the_young_and_the_living<H: Harness>() {
    let h = H::new(2).await;
    let e = h.engine();
    let gone = PathBuf::from("/run/netns/gone");
    h.add_netns(&gone);
    e.add(&owner("live"), &pod()).await.unwrap();
    e.add(&owner("dead"), &gone).await.unwrap();
    h.kill_netns(&gone);
    let report = e.gc(&GcRequest::default(), Duration::from_secs(3600)).await;
    assert_eq!(
        (report.too_young, report.collected.len()),
        (2, 0),
        "{report:?}"
    );
    let report = e.gc(&GcRequest::default(), Duration::ZERO).await;
    assert_eq!(report.collected, ["n/dead/eth0"], "{report:?}");
    assert!(report.errors.is_empty(), "{report:?}");
    e.check(&owner("live"), &pod(), MtuExpectation::Recorded)
        .await
        .unwrap();
    // Nothing left to do: a second pass is a no-op.
    assert_eq!(
        e.gc(&GcRequest::default(), Duration::ZERO).await,
        GcReport::default()
    );
    e.del(&owner("live")).await.unwrap();
    assert_clean(&h, "after GC and DEL").await;
}

pub(crate) async fn cni_gc_collects_only_omitted_attachments_of_its_network<H: Harness>() {
    let h = H::new(2).await;
    let e = h.engine();
    let mut b = owner("b");
    b.ifname = "net1".into();
    e.add(&owner("a"), &pod()).await.unwrap();
    e.add(&b, &pod()).await.unwrap();
    let other = GcRequest {
        network: Some("other".into()),
        valid_attachments: Some(vec![]),
    };
    assert!(e.gc(&other, Duration::ZERO).await.collected.is_empty());
    let request = GcRequest {
        network: Some("n".into()),
        valid_attachments: Some(vec![ValidAttachment {
            container_id: "a".into(),
            ifname: "eth0".into(),
        }]),
    };
    let report = e.gc(&request, Duration::ZERO).await;
    assert_eq!(report.collected, ["n/b/net1"], "{report:?}");
    let left: Vec<String> = e
        .attachments()
        .await
        .iter()
        .map(|r| r.key.to_string())
        .collect();
    assert_eq!(left, ["n/a/eth0"]);
}

pub(crate) async fn gc_never_collects_an_attachment_mid_add<H: Harness>() {
    let h = Arc::new(H::new(1).await);
    let (entered, resume) = h.pause_plumb();
    let adder = {
        let h = h.clone();
        tokio::spawn(async move { h.engine().add(&owner("c"), &pod()).await })
    };
    entered.notified().await;
    assert_eq!(h.engine().attachments().await[0].phase, Phase::Adding);
    // The runtime's view lags: its GC list does not have the new pod yet.
    let lagging = GcRequest {
        network: None,
        valid_attachments: Some(vec![]),
    };
    let gc = {
        let h = h.clone();
        tokio::spawn(async move { h.engine().gc(&lagging, Duration::from_secs(30)).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    // The host pass waits for the ADD: it would see half-made objects.
    assert!(
        !gc.is_finished(),
        "GC's host pass ran while an ADD was half-way"
    );
    resume.notify_one();
    adder.await.unwrap().expect("the ADD completes untouched");
    let report = gc.await.unwrap();
    assert_eq!(
        (report.too_young, report.collected.len()),
        (1, 0),
        "{report:?}"
    );
    assert!(
        report.swept.is_empty() && report.orphans_released.is_empty(),
        "{report:?}"
    );
    h.engine()
        .check(&owner("c"), &pod(), MtuExpectation::Recorded)
        .await
        .unwrap();
}

pub(crate) async fn unclaimed_attachments_expire_unless_claimed<H: Harness>() {
    let mut h = H::new(2).await;
    let e = h.engine();
    let other = PathBuf::from("/run/netns/other");
    h.add_netns(&other);
    e.add(&owner("a"), &pod()).await.unwrap();
    e.add(&owner("b"), &other).await.unwrap();
    let long = Duration::from_secs(3600);
    for cid in ["a", "b"] {
        e.mark_unclaimed(&AttachmentKey::of(&owner(cid)), Duration::ZERO)
            .await
            .unwrap();
    }
    // "a" is claimed by the runtime's retried ADD; "b" is never claimed.
    e.add(&owner("a"), &pod()).await.unwrap();
    let expiry = |cid: &'static str| async move {
        e.attachments()
            .await
            .into_iter()
            .find(|r| r.key.container_id == cid)
            .map(|r| r.expires_ms)
    };
    assert_eq!(expiry("a").await, Some(None));
    // Expiry beats the grace period: the runtime has given up on "b".
    let report = e.gc(&GcRequest::default(), long).await;
    assert_eq!(report.collected, ["n/b/eth0"], "{report:?}");
    assert_eq!(report.too_young, 1);
    // A kept-but-unexpired one stays, and CHECK claims it too.
    e.mark_unclaimed(&AttachmentKey::of(&owner("a")), long)
        .await
        .unwrap();
    assert!(e
        .gc(&GcRequest::default(), Duration::ZERO)
        .await
        .collected
        .is_empty());
    e.check(&owner("a"), &pod(), MtuExpectation::Recorded)
        .await
        .unwrap();
    assert_eq!(expiry("a").await, Some(None));
    // The expiry survives a restart (it is in the checkpoint).
    e.mark_unclaimed(&AttachmentKey::of(&owner("a")), Duration::ZERO)
        .await
        .unwrap();
    h.restart().await;
    let report = h.engine().gc(&GcRequest::default(), long).await;
    assert_eq!(report.collected, ["n/a/eth0"], "{report:?}");
}

pub(crate) async fn a_full_node_is_transient_and_check_reports_drift<H: Harness>() {
    let h = H::new(1).await;
    let e = h.engine();
    let full = H::capacity(1);
    for i in 0..full {
        let ns = PathBuf::from(format!("/run/netns/p{i}"));
        h.add_netns(&ns);
        e.add(&owner(&format!("c{i}")), &ns).await.unwrap();
    }
    let err = e.add(&owner("one-too-many"), &pod()).await.unwrap_err();
    assert!(err.is_transient(), "{err}");
    assert_eq!(e.attachments().await.len(), full);

    let p0 = PathBuf::from("/run/netns/p0");
    let err = e
        .check(&owner("c0"), &pod(), MtuExpectation::Recorded)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("recorded netns"), "{err}");
    let err = e
        .check(&owner("nobody"), &p0, MtuExpectation::Recorded)
        .await
        .unwrap_err();
    assert!(matches!(err, EngineError::UnknownAttachment(_)), "{err}");
    h.break_pod(&p0);
    let err = e
        .check(&owner("c0"), &p0, MtuExpectation::Recorded)
        .await
        .unwrap_err();
    assert!(matches!(err, EngineError::CheckFailed { .. }), "{err}");
}

pub(crate) async fn a_conflicting_add_is_refused_and_harms_nothing<H: Harness>() {
    let h = H::new(2).await;
    let e = h.engine();
    let first = e.add(&owner("c1"), &pod()).await.unwrap();
    let objects = h.pod_objects();
    let p2 = PathBuf::from("/run/netns/p2");
    h.add_netns(&p2);
    // The same key into another netns while the first pod lives.
    let err = e.add(&owner("c1"), &p2).await.unwrap_err();
    assert!(
        matches!(err, EngineError::AttachmentConflict { .. }),
        "{err}"
    );
    assert_eq!(h.pod_objects(), objects, "the live pod was touched");
    e.check(&owner("c1"), &pod(), MtuExpectation::Recorded)
        .await
        .expect("the live attachment is as it was");
    assert_eq!(e.attachments().await[0].netns, pod());
    // A retried ADD into the same netns stays idempotent.
    assert_eq!(e.add(&owner("c1"), &pod()).await.unwrap(), first);
    // Once the first pod's netns is gone, the ADD proceeds.
    h.kill_netns(&pod());
    e.add(&owner("c1"), &p2).await.unwrap();
    e.check(&owner("c1"), &p2, MtuExpectation::Recorded)
        .await
        .unwrap();
    assert_eq!(e.attachments().await.len(), 1);
}

pub(crate) async fn bad_requests_are_refused_before_anything_is_taken<H: Harness>() {
    let h = H::new(1).await;
    let e = h.engine();
    for (bad, what) in [
        (
            EniOwner {
                network: String::new(),
                ..owner("c")
            },
            "network",
        ),
        (
            EniOwner {
                container_id: String::new(),
                ..owner("c")
            },
            "container",
        ),
        (
            EniOwner {
                ifname: "x/y".into(),
                ..owner("c")
            },
            "interface",
        ),
    ] {
        let err = e.add(&bad, &pod()).await.unwrap_err();
        assert!(matches!(err, EngineError::InvalidRequest(_)), "{err}");
        assert!(err.to_string().contains(what), "{err}");
    }
    let err = e
        .add(&owner("c"), Path::new("/run/netns/missing"))
        .await
        .unwrap_err();
    assert!(matches!(err, EngineError::Netns(_)), "{err}");
    assert_clean(&h, "bad requests").await;
}

/// Runs every case of the suite against one harness.
macro_rules! conformance_suite {
    ($harness:ty) => {
        $crate::engine::conformance::conformance_suite!(@cases $harness;
            add_is_idempotent_and_del_restores,
            every_add_fault_rolls_back,
            checkpoint_write_failures_roll_back,
            outcomes_are_written_behind_and_a_failed_one_is_retried,
            ifname_clash_leaves_the_pod_alone,
            failed_undo_keeps_the_record_and_recovery_finishes_it,
            recovery_finishes_or_undoes_intents_and_keeps_ready_ones,
            a_stale_record_never_touches_another_attachment,
            gc_collects_the_dead_and_spares_the_young_and_the_living,
            cni_gc_collects_only_omitted_attachments_of_its_network,
            gc_never_collects_an_attachment_mid_add,
            unclaimed_attachments_expire_unless_claimed,
            a_full_node_is_transient_and_check_reports_drift,
            a_conflicting_add_is_refused_and_harms_nothing,
            bad_requests_are_refused_before_anything_is_taken,
        );
    };
    (@cases $harness:ty; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $case() {
                $crate::engine::conformance::$case::<$harness>().await;
            }
        )*
    };
}
pub(crate) use conformance_suite;
