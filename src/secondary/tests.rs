//! The secondary driver over [`FakeSecondary`]: the engine's conformance
//! suite, and what only this mode does (host ENIs set up at restore, the
//! sweep of enim-shaped objects no record explains).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use enim_api::{GcReport, GcRequest, MtuExpectation};
use enim_core::MacAddr;
use enim_provider_static::{StaticEniConfig, StaticProvider};
use tokio::sync::Notify;

use super::fake::{FakeSecondary, FakeVeth, FAULT_STEPS};
use super::plumbing::{OwnedRule, RuleSelector, MAIN_TABLE};
use super::{SecondaryConfig, SecondaryDriver};
use crate::engine::conformance::{conformance_suite, mac, owner, static_eni, Harness, POD};
use crate::engine::Engine;
use crate::netlink::handout::UplinkMark;
use crate::netlink::Refusal;
use crate::store::checkpoint::Checkpoint;
use crate::support::exclusion::{ExclusionConfig, Exclusions};

fn enis(n: u8) -> Vec<StaticEniConfig> {
    (1..=n).map(static_eni).collect()
}

fn config() -> SecondaryConfig {
    SecondaryConfig {
        cooldown: Duration::ZERO,
        ..SecondaryConfig::default()
    }
}

/// An engine over `fake` with `n` static ENIs and `exclusions`, recovered.
async fn node(
    fake: &Arc<FakeSecondary>,
    n: u8,
    cp: Arc<Checkpoint>,
    exclusions: Exclusions,
) -> Engine<SecondaryDriver> {
    node_with(config(), fake, n, cp, exclusions).await
}

/// [`node`], with `config`.
async fn node_with(
    config: SecondaryConfig,
    fake: &Arc<FakeSecondary>,
    n: u8,
    cp: Arc<Checkpoint>,
    exclusions: Exclusions,
) -> Engine<SecondaryDriver> {
    let provider = Arc::new(StaticProvider::new(enis(n)).unwrap());
    let driver =
        SecondaryDriver::new(config, provider, fake.clone(), cp.clone(), exclusions).unwrap();
    let engine = Engine::new(driver, cp);
    engine.recover().await.unwrap();
    engine
}

/// The ids of the ENIs the node serves addresses from.
fn host_eni_ids(engine: &Engine<SecondaryDriver>) -> Vec<String> {
    engine
        .driver()
        .host_enis()
        .into_iter()
        .map(|e| e.id)
        .collect()
}

fn fake_with(n: u8) -> Arc<FakeSecondary> {
    let names: Vec<String> = (1..=n).map(|i| format!("eth{i}")).collect();
    let devs: Vec<(MacAddr, &str)> = (1..=n)
        .map(|i| (mac(i), names[usize::from(i) - 1].as_str()))
        .collect();
    Arc::new(FakeSecondary::with_enis(&devs))
}

pub(crate) struct SecondaryHarness {
    engine: Engine<SecondaryDriver>,
    fake: Arc<FakeSecondary>,
    n: u8,
    dir: tempfile::TempDir,
}

impl SecondaryHarness {
    fn checkpoint(&self) -> Arc<Checkpoint> {
        Arc::new(Checkpoint::open(&self.dir.path().join("cp.json"), false).unwrap())
    }
}

#[async_trait]
impl Harness for SecondaryHarness {
    type D = SecondaryDriver;
    const FAULT_STEPS: &'static [&'static str] = FAULT_STEPS;
    const UNDO_FAULTS: (&'static str, &'static str) = ("setup_pod:partial", "teardown_pod");
    // The intent, then the outcome.
    const OUTCOME_WRITE: u32 = 2;

    /// Two IPv4 (and two IPv6) secondary addresses per ENI, one of each
    /// per pod.
    fn capacity(n: u8) -> usize {
        2 * usize::from(n)
    }

    async fn new(n: u8) -> Self {
        let fake = fake_with(n);
        fake.add_netns(Path::new(POD));
        let dir = tempfile::tempdir().unwrap();
        let cp = Arc::new(Checkpoint::open(&dir.path().join("cp.json"), false).unwrap());
        let engine = node(&fake, n, cp, Exclusions::default()).await;
        SecondaryHarness {
            engine,
            fake,
            n,
            dir,
        }
    }

    fn engine(&self) -> &Engine<SecondaryDriver> {
        &self.engine
    }

    async fn restart(&mut self) {
        self.engine = node(&self.fake, self.n, self.checkpoint(), Exclusions::default()).await;
    }

    fn fail_once(&self, step: &'static str) {
        self.fake.fail_once(step);
    }

    fn add_netns(&self, path: &Path) {
        self.fake.add_netns(path);
    }

    fn kill_netns(&self, path: &Path) {
        self.fake.kill_netns(path);
    }

    fn occupy(&self, netns: &Path, ifname: &str) {
        self.fake
            .world()
            .foreign
            .insert((netns.to_path_buf(), ifname.into()));
    }

    fn break_pod(&self, _netns: &Path) {
        self.fake.world().rules.clear();
    }

    fn pause_plumb(&self) -> (Arc<Notify>, Arc<Notify>) {
        self.fake.pause_setup()
    }

    fn pod_objects(&self) -> usize {
        let w = self.fake.world();
        w.veths.len() + w.rules.len() + w.proxies.len()
    }

    async fn held(&self) -> usize {
        self.engine.address_stats().map_or(0, |s| s.assigned)
    }

    fn host_is_home(&self) -> bool {
        // Host ENIs stay in the host, named by device index.
        let w = self.fake.world();
        w.enis.values().all(|name| name.starts_with("enis"))
    }
}

mod conformance {
    super::conformance_suite!(super::SecondaryHarness);
}

#[tokio::test]
async fn restore_sets_up_host_enis_and_the_store() {
    let h = SecondaryHarness::new(2).await;
    let w = h.fake.world().clone();
    assert_eq!(
        w.enis.values().cloned().collect::<Vec<_>>(),
        ["enis1", "enis2"]
    );
    assert_eq!(w.tables.iter().copied().collect::<Vec<_>>(), [1001, 1002]);
    assert_eq!(w.forwarding, Some(true), "IPv6 forwarding too");
    assert_eq!(h.engine.address_stats().unwrap().total, 8);
    let enis = h.engine.driver().host_enis();
    assert_eq!(
        (enis[1].name.as_str(), enis[1].table, enis[1].mtu),
        ("enis2", 1002, 9001)
    );
    let listed = h.engine.enis().await.unwrap();
    let devices: Vec<Option<&str>> = listed.iter().map(|e| e.host_device.as_deref()).collect();
    assert_eq!(devices, [Some("enis1"), Some("enis2")]);
}

#[tokio::test]
async fn excluded_enis_addresses_and_the_primary_interface_are_not_used() {
    let fake = fake_with(3);
    fake.world().primary = Some(mac(3));
    let dir = tempfile::tempdir().unwrap();
    let cp = Arc::new(Checkpoint::open(&dir.path().join("cp.json"), false).unwrap());
    let exclusions = Exclusions::from_config(&ExclusionConfig {
        enis: vec!["eni-1".into()],
        addresses: vec!["10.0.2.11".parse().unwrap()],
    });
    let engine = node(&fake, 3, cp, exclusions).await;
    let ids = host_eni_ids(&engine);
    assert_eq!(ids, ["eni-2"]);
    assert_eq!(engine.address_stats().unwrap().total, 3);
    let names: Vec<String> = fake.world().enis.values().cloned().collect();
    assert_eq!(
        names,
        ["eth1", "enis2", "eth3"],
        "excluded devices were touched"
    );
}

/// A listed ENI whose device the hand-out rule refuses (the node's own,
/// e.g. its uplink with the default route only in a policy table) is
/// never set up: left under its name, excluded, listed as such.
#[tokio::test]
async fn a_refused_device_is_never_set_up_and_is_listed_excluded() {
    let fake = fake_with(2);
    let uplink = Refusal::Uplink(UplinkMark::DefaultRoute {
        table: 100,
        v6: false,
    });
    fake.world().refused.insert(mac(1), uplink);
    let dir = tempfile::tempdir().unwrap();
    let cp = Arc::new(Checkpoint::open(&dir.path().join("cp.json"), false).unwrap());
    let engine = node(&fake, 2, cp, Exclusions::default()).await;
    assert_eq!(host_eni_ids(&engine), ["eni-2"]);
    let names: Vec<String> = fake.world().enis.values().cloned().collect();
    assert_eq!(names, ["eth1", "enis2"], "the refused device was touched");
    assert!(!fake.world().tables.contains(&1001));
    let listed = engine.enis().await.unwrap();
    let state = listed.iter().find(|e| e.eni.id == "eni-1").unwrap().state;
    assert_eq!(state, enim_api::EniState::Excluded);
}

#[tokio::test]
async fn a_missing_eni_device_is_skipped() {
    let fake = Arc::new(FakeSecondary::with_enis(&[(mac(2), "eth2")]));
    let dir = tempfile::tempdir().unwrap();
    let cp = Arc::new(Checkpoint::open(&dir.path().join("cp.json"), false).unwrap());
    let engine = node(&fake, 2, cp, Exclusions::default()).await;
    let ids = host_eni_ids(&engine);
    assert_eq!(ids, ["eni-2"]);
    assert_eq!(engine.address_stats().unwrap().total, 4);
}

#[tokio::test]
async fn gc_sweeps_what_no_record_explains_and_nothing_else() {
    let h = SecondaryHarness::new(2).await;
    h.engine.add(&owner("live"), Path::new(POD)).await.unwrap();
    let stranger = OwnedRule {
        priority: 512,
        table: MAIN_TABLE,
        selector: RuleSelector::To("10.0.1.99".parse().unwrap()),
    };
    {
        let mut w = h.fake.world();
        w.rules.insert(stranger);
        w.tables.insert(1042);
        w.veths.insert(
            "enim00000000000".into(),
            FakeVeth {
                netns: "/run/netns/x".into(),
                ifname: "eth0".into(),
                mac: mac(9),
                mtu: 1500,
                ips: vec![],
            },
        );
    }
    let report = h
        .engine
        .gc(&GcRequest::default(), Duration::from_secs(3600))
        .await;
    let mut swept = report.swept.clone();
    swept.sort();
    assert_eq!(
        swept,
        [
            "rule 512: to 10.0.1.99 lookup 254",
            "table 1042",
            "veth enim00000000000"
        ],
        "{report:?}"
    );
    h.engine
        .check(&owner("live"), Path::new(POD), MtuExpectation::Recorded)
        .await
        .unwrap();
    let w = h.fake.world().clone();
    assert_eq!((w.rules.len(), w.proxies.len(), w.veths.len()), (4, 2, 1));
    assert_eq!(w.tables.iter().copied().collect::<Vec<_>>(), [1001, 1002]);
    assert_eq!(
        h.engine.gc(&GcRequest::default(), Duration::ZERO).await,
        GcReport::default()
    );
}

/// An ADD that finds every free address cooling down waits for the first
/// to end its cooldown, within `allocate_wait`, instead of answering "try
/// again later" (the kubelet would come back 10 s or more later); one
/// whose cooldown ends after the wait is refused at once, as before.
#[tokio::test]
async fn an_add_waits_for_an_address_whose_cooldown_ends_within_the_wait() {
    let cooldown = Duration::from_millis(700);
    for (wait, served) in [
        (Duration::from_secs(5), true),
        (Duration::from_millis(100), false),
    ] {
        let fake = fake_with(1);
        let netns = |c: &str| Path::new("/run/netns").join(format!("pod-{c}"));
        for c in ["a", "b", "c"] {
            fake.add_netns(&netns(c));
        }
        let dir = tempfile::tempdir().unwrap();
        let cp = Arc::new(Checkpoint::open(&dir.path().join("cp.json"), false).unwrap());
        let mut config = config();
        config.cooldown = cooldown;
        config.pool.allocate_wait = wait;
        let engine = node_with(config, &fake, 1, cp, Exclusions::default()).await;
        // Both of the ENI's slots taken, then one given back: it cools.
        engine.add(&owner("a"), &netns("a")).await.unwrap();
        engine.add(&owner("b"), &netns("b")).await.unwrap();
        engine.del(&owner("a")).await.unwrap();
        let asked = std::time::Instant::now();
        let got = engine.add(&owner("c"), &netns("c")).await;
        let took = asked.elapsed();
        match served {
            true => {
                got.unwrap();
                assert!(
                    took >= cooldown / 2,
                    "served before the cooldown ended: {took:?}"
                );
            }
            false => {
                let e = got.unwrap_err();
                assert!(
                    matches!(e, crate::engine::EngineError::NoFreeAddress(_)),
                    "{e}"
                );
                assert!(took < cooldown / 2, "refused only after {took:?}");
            }
        }
    }
}
