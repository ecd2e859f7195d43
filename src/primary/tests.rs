//! The primary driver over [`FakePlumbing`]: the engine's conformance
//! suite, and what only this mode does (devices coming home renamed,
//! batched host looks, free ENIs put right, exclusions).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use enim_api::model::Phase;
use enim_api::{GcReport, GcRequest, MtuExpectation};
use enim_core::{MacAddr, ProviderError};
use enim_provider::EniProvider;
use enim_provider_static::{StaticEniConfig, StaticProvider};
use tokio::sync::Notify;

use super::HostPathConfig;
use super::PrimaryDriver;
use crate::engine::conformance::{conformance_suite, mac, owner, static_eni, Harness, POD};
use crate::engine::{Engine, EngineError};
use crate::netlink::fake::{FakeDev, FakePlumbing, FAULT_STEPS, HOST_PATH_FAULT_STEPS};
use crate::netlink::handout::UplinkMark;
use crate::netlink::{HostLinkHome, LinkInfo, Plumbing, Refusal};
use crate::store::checkpoint::Checkpoint;
use crate::support::exclusion::{is_excluded_owner, ExclusionConfig, Exclusions};

const HOST_MTU: u32 = 1500;

/// Primary mode over the fake, with pods given a host path or not.
pub(crate) struct PrimaryRig<const HOST_PATH: bool> {
    engine: Engine<PrimaryDriver>,
    fake: Arc<FakePlumbing>,
    provider: Arc<StaticProvider>,
    n: u8,
    _dir: tempfile::TempDir,
}

/// The primary mode as configured by default.
pub(crate) type PrimaryHarness = PrimaryRig<false>;
/// Primary mode with a host path for every pod.
pub(crate) type HostPathHarness = PrimaryRig<true>;

impl<const HOST_PATH: bool> PrimaryRig<HOST_PATH> {
    fn driver(&self, checkpoint: Arc<Checkpoint>, exclusions: Exclusions) -> PrimaryDriver {
        Self::driver_over(&self.provider, &self.fake, checkpoint, exclusions)
    }

    fn driver_over(
        provider: &Arc<StaticProvider>,
        fake: &Arc<FakePlumbing>,
        checkpoint: Arc<Checkpoint>,
        exclusions: Exclusions,
    ) -> PrimaryDriver {
        let driver = PrimaryDriver::new(provider.clone(), fake.clone(), checkpoint, exclusions);
        if HOST_PATH {
            driver.with_host_path(HostPathConfig {
                service_cidrs: vec!["10.96.0.0/12".parse().unwrap()],
                ..HostPathConfig::default()
            })
        } else {
            driver
        }
    }

    fn engine_over(
        &self,
        checkpoint: Arc<Checkpoint>,
        exclusions: Exclusions,
    ) -> Engine<PrimaryDriver> {
        Engine::new(self.driver(checkpoint.clone(), exclusions), checkpoint)
    }

    /// The physical device of a dead netns comes home as `dev<N>`.
    fn return_as_dev(&self, netns: &Path, name: &str) {
        let mut devs = self.fake.remove_netns(netns);
        for dev in &mut devs {
            dev.link.name = name.into();
        }
        self.fake.world.lock().unwrap().host.extend(devs);
    }
}

#[async_trait]
impl<const HOST_PATH: bool> Harness for PrimaryRig<HOST_PATH> {
    type D = PrimaryDriver;
    const FAULT_STEPS: &'static [&'static str] = if HOST_PATH {
        HOST_PATH_FAULT_STEPS
    } else {
        FAULT_STEPS
    };
    const UNDO_FAULTS: (&'static str, &'static str) = ("configure_pod_link", "move_to_host");
    // The host home (first sight), the intent, then the outcome.
    const OUTCOME_WRITE: u32 = 3;

    fn capacity(n: u8) -> usize {
        usize::from(n)
    }

    async fn new(n: u8) -> Self {
        let enis = (1..=n)
            .map(|i| StaticEniConfig {
                mtu: Some(9000),
                device_index: None,
                secondary_ipv4: vec![],
                secondary_ipv6: vec![],
                ..static_eni(i)
            })
            .collect();
        let names: Vec<String> = (1..=n).map(|i| format!("eni{i}")).collect();
        let devs: Vec<(MacAddr, &str, u32)> = (1..=n)
            .map(|i| (mac(i), names[usize::from(i) - 1].as_str(), HOST_MTU))
            .collect();
        let fake = Arc::new(FakePlumbing::with_host_devices(&devs));
        fake.add_netns(Path::new(POD));
        let provider = Arc::new(StaticProvider::new(enis).unwrap());
        let dir = tempfile::tempdir().unwrap();
        let cp = Arc::new(Checkpoint::open(&dir.path().join("cp.json"), false).unwrap());
        let driver = Self::driver_over(&provider, &fake, cp.clone(), Exclusions::default());
        let engine = Engine::new(driver, cp);
        engine.recover().await.unwrap();
        PrimaryRig {
            engine,
            fake,
            provider,
            n,
            _dir: dir,
        }
    }

    fn engine(&self) -> &Engine<PrimaryDriver> {
        &self.engine
    }

    async fn restart(&mut self) {
        let cp = Arc::new(Checkpoint::open(self.engine.checkpoint().path(), false).unwrap());
        self.engine = self.engine_over(cp, Exclusions::default());
        self.engine.recover().await.unwrap();
    }

    fn fail_once(&self, step: &'static str) {
        self.fake.fail_once(step);
    }

    fn add_netns(&self, path: &Path) {
        self.fake.add_netns(path);
    }

    fn kill_netns(&self, path: &Path) {
        self.return_as_dev(path, "dev42");
    }

    fn occupy(&self, netns: &Path, ifname: &str) {
        let mut w = self.fake.world.lock().unwrap();
        w.netns
            .entry(netns.to_path_buf())
            .or_default()
            .push(FakeDev {
                link: LinkInfo {
                    index: 999,
                    name: ifname.into(),
                    mac: MacAddr([2, 0xff, 0, 0, 0, 1]),
                    mtu: 1500,
                    up: true,
                },
                addrs: vec![],
                gateways: vec![],
            });
    }

    fn break_pod(&self, netns: &Path) {
        let mut w = self.fake.world.lock().unwrap();
        for dev in w.netns.get_mut(netns).into_iter().flatten() {
            dev.link.mtu = 1400;
        }
    }

    fn pause_plumb(&self) -> (Arc<Notify>, Arc<Notify>) {
        self.fake.pause_configure()
    }

    async fn settle(&self) {
        self.engine.driver().settled_deletions().await;
    }

    fn pod_objects(&self) -> usize {
        let w = self.fake.world.lock().unwrap();
        let ours = |d: &&FakeDev| (1..=self.n).any(|i| d.link.mac == mac(i));
        w.netns.values().flatten().filter(ours).count() + w.host_paths.len()
    }

    async fn held(&self) -> usize {
        let enis = self.provider.list().await.unwrap();
        enis.iter()
            .filter(|e| e.owner.as_ref().is_some_and(|o| !is_excluded_owner(o)))
            .count()
    }

    fn host_is_home(&self) -> bool {
        (1..=self.n).all(|i| {
            self.fake
                .host_dev(mac(i))
                .is_some_and(|d| d.link.name == format!("eni{i}") && d.link.mtu == HOST_MTU)
        })
    }
}

mod conformance {
    super::conformance_suite!(super::PrimaryHarness);
}

mod conformance_with_host_path {
    super::conformance_suite!(super::HostPathHarness);
}

#[tokio::test]
async fn del_after_the_netns_vanished_brings_the_device_home_renamed_back() {
    let h = PrimaryHarness::new(1).await;
    h.engine.add(&owner("c"), Path::new(POD)).await.unwrap();
    h.return_as_dev(Path::new(POD), "dev7");
    h.engine.del(&owner("c")).await.unwrap();
    assert!(h.host_is_home());
    assert_eq!(h.held().await, 0);
    assert!(h.engine.attachments().await.is_empty());
}

/// The move home sets the host name and MTU itself, so DEL looks for the
/// device in the host only when the move could not bring it.
#[tokio::test]
async fn del_looks_for_the_device_only_when_the_move_did_not_bring_it_home() {
    let h = PrimaryHarness::new(1).await;
    let pod = Path::new(POD);
    h.engine.add(&owner("c"), pod).await.unwrap();
    h.engine.del(&owner("c")).await.unwrap();
    let lookups = || h.fake.calls("restore_host_link") + h.fake.calls("restore_host_links");
    assert_eq!(lookups(), 0);
    assert!(h.host_is_home());
    h.fake.add_netns(pod);
    h.engine.add(&owner("d"), pod).await.unwrap();
    h.return_as_dev(pod, "dev7");
    h.engine.del(&owner("d")).await.unwrap();
    assert_eq!(lookups(), 1);
    assert!(h.host_is_home());
}

#[tokio::test]
async fn gc_releases_orphans_and_normalises_free_enis() {
    let h = PrimaryHarness::new(3).await;
    // A crash between allocation and the intent write.
    h.provider.allocate_next(&owner("orphan")).await.unwrap();
    let report = h
        .engine
        .gc(&GcRequest::default(), Duration::from_secs(3600))
        .await;
    assert_eq!(report.orphans_released, ["eni-1"], "{report:?}");
    // A free ENI renamed and retuned by someone else is put right.
    {
        let mut w = h.fake.world.lock().unwrap();
        let d = w.host.iter_mut().find(|d| d.link.mac == mac(3)).unwrap();
        d.link.name = "dev7".into();
        d.link.mtu = 1400;
    }
    let report = h.engine.gc(&GcRequest::default(), Duration::ZERO).await;
    assert_eq!(report.normalised, ["eni-3"], "{report:?}");
    assert!(h.host_is_home());
    assert_eq!(
        h.engine.gc(&GcRequest::default(), Duration::ZERO).await,
        GcReport::default()
    );
}

#[tokio::test]
async fn gc_of_records_without_devices_looks_at_the_host_once() {
    let h = PrimaryHarness::new(5).await;
    for i in 1..=5 {
        let ns = PathBuf::from(format!("/run/netns/p{i}"));
        h.fake.add_netns(&ns);
        h.engine.add(&owner(&format!("c{i}")), &ns).await.unwrap();
    }
    // Four pods died with their devices (veths go with the netns); the
    // fifth's ENI came back to the host as dev9 with another MTU.
    for i in 1..=4 {
        h.fake
            .remove_netns(&PathBuf::from(format!("/run/netns/p{i}")));
    }
    let mut dev = h.fake.remove_netns(Path::new("/run/netns/p5"))[0].clone();
    dev.link.name = "dev9".into();
    dev.link.mtu = 1400;
    h.fake.world.lock().unwrap().host.push(dev);
    let lookups = h.fake.calls("host_link");

    let report = h.engine.gc(&GcRequest::default(), Duration::ZERO).await;
    assert_eq!(report.collected.len(), 5, "{report:?}");
    assert!(report.errors.is_empty(), "{report:?}");
    assert_eq!(report.records_dropped.len(), 4, "{report:?}");
    assert_eq!(h.fake.calls("restore_host_links"), 1);
    assert_eq!(h.fake.calls("restore_host_link"), 0);
    assert_eq!(h.fake.calls("host_link"), lookups);
    let back = h.fake.host_dev(mac(5)).unwrap();
    assert_eq!((back.link.name.as_str(), back.link.mtu), ("eni5", HOST_MTU));
    assert!(h.engine.attachments().await.is_empty());
    assert_eq!(h.held().await, 0);
}

#[tokio::test]
async fn gc_keeps_a_record_whose_device_could_not_be_put_home() {
    let h = PrimaryHarness::new(1).await;
    let gone = PathBuf::from("/run/netns/gone");
    h.fake.add_netns(&gone);
    h.engine.add(&owner("c"), &gone).await.unwrap();
    h.return_as_dev(&gone, "dev3");
    h.fake.fail_once("restore_host_link");
    let report = h.engine.gc(&GcRequest::default(), Duration::ZERO).await;
    assert!(report.collected.is_empty(), "{report:?}");
    assert_eq!(report.errors.len(), 1, "{report:?}");
    assert_eq!(
        report.errors[0].step,
        enim_api::GcStep::Unplumb,
        "{report:?}"
    );
    // Still recorded (as being deleted) and assigned: the next pass
    // finishes it.
    assert_eq!(h.engine.attachments().await[0].phase, Phase::Deleting);
    assert_eq!(h.held().await, 1);
    let report = h.engine.gc(&GcRequest::default(), Duration::ZERO).await;
    assert_eq!(report.collected, ["n/c/eth0"]);
    assert!(h.host_is_home());
}

#[tokio::test]
async fn excluded_and_primary_enis_are_never_handed_out() {
    let h = PrimaryHarness::new(4).await;
    let pod = Path::new(POD);
    // eni-1 is in use from before it was excluded; eni-2 excluded by MAC;
    // eni-3 is the node's primary interface.
    h.engine.add(&owner("old"), pod).await.unwrap();
    h.fake.refused.lock().unwrap().insert(
        mac(3),
        Refusal::Uplink(UplinkMark::DefaultRoute {
            table: 100,
            v6: false,
        }),
    );
    let engine = h.engine_over(
        h.engine.checkpoint().clone(),
        Exclusions::from_config(&ExclusionConfig {
            enis: vec!["eni-1".into(), mac(2).to_string()],
            addresses: vec![],
        }),
    );
    engine.recover().await.unwrap();
    let listed = h.provider.list().await.unwrap();
    let holder = |id: &str| listed.iter().find(|e| e.id == id).unwrap().owner.clone();
    assert_eq!(
        holder("eni-1").unwrap().container_id,
        "old",
        "a live attachment keeps its ENI"
    );
    assert!(is_excluded_owner(&holder("eni-2").unwrap()));
    assert!(is_excluded_owner(&holder("eni-3").unwrap()));
    // Only eni-4 can be handed out.
    let p2 = PathBuf::from("/run/netns/p2");
    h.fake.add_netns(&p2);
    assert_eq!(
        engine.add(&owner("new"), &p2).await.unwrap().eni_id,
        "eni-4"
    );
    let p3 = PathBuf::from("/run/netns/p3");
    h.fake.add_netns(&p3);
    let err = engine.add(&owner("third"), &p3).await.unwrap_err();
    assert!(
        matches!(err, EngineError::Provider(ProviderError::Exhausted { .. })),
        "{err}"
    );
    // GC neither releases reservations as orphans nor renames them.
    let report = engine.gc(&GcRequest::default(), Duration::ZERO).await;
    assert!(
        report.orphans_released.is_empty() && report.normalised.is_empty(),
        "{report:?}"
    );
    // Once the old attachment goes, eni-1 becomes reserved, not free.
    engine.del(&owner("old")).await.unwrap();
    engine.gc(&GcRequest::default(), Duration::ZERO).await;
    let listed = h.provider.list().await.unwrap();
    assert!(
        is_excluded_owner(listed[0].owner.as_ref().unwrap()),
        "{:?}",
        listed[0]
    );
    engine
        .check(&owner("new"), &p2, MtuExpectation::Recorded)
        .await
        .unwrap();
}

/// The unit side of issue #29 defect 3 (the kernel side is
/// tests/handout_netns.rs): an ENI whose device the hand-out rule refuses
/// at ADD, after start-up's survey (the entry arrived later, or the device
/// became the node's own), is never moved: the ADD reserves it as excluded
/// and takes the next; with none left the error names the refusal and is
/// "try again later". A configured exclusion is consulted at ADD too.
#[tokio::test]
async fn a_device_refused_at_add_is_reserved_and_the_next_eni_taken() {
    let h = PrimaryHarness::new(3).await;
    let uplink = Refusal::Uplink(UplinkMark::DefaultRoute {
        table: 100,
        v6: false,
    });
    h.fake
        .refused
        .lock()
        .unwrap()
        .insert(mac(1), uplink.clone());
    let r = h.engine.add(&owner("a"), Path::new(POD)).await.unwrap();
    assert_eq!(r.eni_id, "eni-2");
    assert!(
        h.fake.host_dev(mac(1)).is_some(),
        "the refused device moved"
    );
    let listed = h.provider.list().await.unwrap();
    assert!(is_excluded_owner(listed[0].owner.as_ref().unwrap()));
    assert_eq!(eni1_state(&h).await, Some(enim_api::EniState::Excluded));

    // eni-3 is refused too, and nothing else is free.
    h.fake.refused.lock().unwrap().insert(mac(3), uplink);
    let p2 = PathBuf::from("/run/netns/p2");
    h.fake.add_netns(&p2);
    let err = h.engine.add(&owner("b"), &p2).await.unwrap_err();
    assert!(matches!(err, EngineError::DeviceRefused { .. }), "{err}");
    assert!(err.is_transient(), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("eni-3") && text.contains("table 100"),
        "{text}"
    );
    assert!(
        h.fake.host_dev(mac(3)).is_some(),
        "the refused device moved"
    );
    assert_eq!(h.fake.pod_devs(), 1);

    // GC keeps both reserved.
    h.engine.gc(&GcRequest::default(), Duration::ZERO).await;
    let listed = h.provider.list().await.unwrap();
    for i in [0, 2] {
        let owner = listed[i].owner.as_ref().unwrap();
        assert!(is_excluded_owner(owner), "{:?}", listed[i]);
    }
}

#[tokio::test]
async fn an_excluded_eni_free_at_add_is_reserved_not_handed_out() {
    let h = PrimaryHarness::new(2).await;
    let engine = h.engine_over(
        h.engine.checkpoint().clone(),
        Exclusions::from_config(&ExclusionConfig {
            enis: vec!["eni-1".into()],
            addresses: vec![],
        }),
    );
    // No start-up here: the exclusion has reserved nothing yet, as for
    // an entry that arrived in the list after the last GC pass.
    let r = engine.add(&owner("a"), Path::new(POD)).await.unwrap();
    assert_eq!(r.eni_id, "eni-2");
    assert!(h.fake.host_dev(mac(1)).is_some());
    let listed = h.provider.list().await.unwrap();
    assert!(is_excluded_owner(listed[0].owner.as_ref().unwrap()));
}

/// ENI eni-1's state as the engine lists it.
async fn eni1_state(h: &PrimaryHarness) -> Option<enim_api::EniState> {
    let enis = h.engine.enis().await.unwrap();
    enis.iter().find(|e| e.eni.id == "eni-1").map(|e| e.state)
}

/// ADDs container `cid` into a netns made at `netns`: the ENI it got.
async fn add_into_new_netns(h: &PrimaryHarness, cid: &str, netns: &str) -> String {
    h.fake.add_netns(Path::new(netns));
    let r = h.engine.add(&owner(cid), Path::new(netns)).await.unwrap();
    r.eni_id
}

#[tokio::test]
async fn an_eni_without_a_device_is_quarantined_and_comes_back() {
    let mut h = PrimaryHarness::new(3).await;
    // enimd's start-up GC learns the free ENIs' host homes.
    h.engine.gc(&GcRequest::default(), Duration::ZERO).await;
    let gone = {
        let mut w = h.fake.world.lock().unwrap();
        let i = w.host.iter().position(|d| d.link.mac == mac(1)).unwrap();
        w.host.remove(i)
    };
    // The ADD that allocates it skips it, in the same ADD.
    let r = h.engine.add(&owner("a"), Path::new(POD)).await.unwrap();
    assert_eq!(r.eni_id, "eni-2");
    assert_eq!(eni1_state(&h).await, Some(enim_api::EniState::Missing));
    // Held as missing, it is neither handed out nor an orphan.
    assert_eq!(add_into_new_netns(&h, "b", "/run/netns/p2").await, "eni-3");
    let report = h.engine.gc(&GcRequest::default(), Duration::ZERO).await;
    assert!(
        report.orphans_released.is_empty() && report.back_in_service.is_empty(),
        "{report:?}"
    );
    // A restart while it is missing finds it missing again.
    h.restart().await;
    assert_eq!(eni1_state(&h).await, Some(enim_api::EniState::Missing));
    // Back under another name: GC frees it and puts its name right.
    let mut back = gone;
    back.link.name = "dev5".into();
    h.fake.world.lock().unwrap().host.push(back);
    let report = h.engine.gc(&GcRequest::default(), Duration::ZERO).await;
    assert_eq!(report.back_in_service, ["eni-1"], "{report:?}");
    assert_eq!(report.normalised, ["eni-1"], "{report:?}");
    assert!(h
        .fake
        .host_dev(mac(1))
        .is_some_and(|d| d.link.name == "eni1"));
    assert_eq!(eni1_state(&h).await, Some(enim_api::EniState::Free));
    assert_eq!(add_into_new_netns(&h, "c", "/run/netns/p3").await, "eni-1");
}

/// A pod's host path is planned into its intent (the node's addresses
/// included), shows in the result as a second interface with its routes,
/// and GC sweeps only host path veths no record explains.
#[tokio::test]
async fn host_path_is_recorded_returned_and_strays_are_swept() {
    let h = HostPathHarness::new(2).await;
    *h.fake.node_addrs.lock().unwrap() = vec!["192.168.7.1".parse().unwrap()];
    let result = h.engine.add(&owner("c"), Path::new(POD)).await.unwrap();
    let hp = result.host_path.clone().expect("a host path interface");
    assert_eq!(hp.name, "eth0-host");
    assert_eq!(hp.sandbox, PathBuf::from(POD));
    let routes: Vec<String> = result
        .routes
        .iter()
        .map(|r| format!("{} via {}", r.dst, r.gw.unwrap()))
        .collect();
    // The ENI's default routes, then the host path's (IPv4 only here).
    assert_eq!(
        routes[2..],
        [
            "10.96.0.0/12 via 169.254.1.1",
            "192.168.7.1/32 via 169.254.1.1"
        ]
    );
    let record = h.engine.attachments().await.remove(0);
    let recorded = record.primary().unwrap().host_path.clone().unwrap();
    assert_eq!(recorded.mac, Some(hp.mac), "the pod end's MAC is learned");
    // Another attachment's interface gets none.
    h.fake.add_netns(Path::new("/run/netns/other"));
    let net1 = h
        .engine
        .add(
            &enim_core::EniOwner {
                ifname: "net1".into(),
                ..owner("d")
            },
            Path::new("/run/netns/other"),
        )
        .await
        .unwrap();
    assert!(net1.host_path.is_none());

    // A stray of enim's shape (a crash lost its record) and a stranger's.
    for stray in ["enih0123456789a", "vethforeign"] {
        h.fake.world.lock().unwrap().host_paths.insert(
            stray.into(),
            crate::netlink::fake::FakeHostPath {
                netns: PathBuf::from("/run/netns/gone"),
                ifname: "x".into(),
                routes: vec![],
            },
        );
    }
    let report = h.engine.gc(&GcRequest::default(), Duration::ZERO).await;
    assert_eq!(report.swept, ["veth enih0123456789a"], "{report:?}");
    let mut left = h.fake.host_path_veths();
    left.retain(|v| v != &recorded.host_veth);
    assert_eq!(left, ["vethforeign"]);
    h.engine
        .check(&owner("c"), Path::new(POD), MtuExpectation::Recorded)
        .await
        .unwrap();
}

/// A DEL answers once its ENI is home: the host path's deletion runs
/// behind the answer, so its failure fails nothing; the veth it left is
/// GC's to sweep, and the next ADD still gets a host path.
#[tokio::test]
async fn a_host_path_deletion_behind_the_del_fails_nothing_and_gc_sweeps_its_veth() {
    let h = HostPathHarness::new(1).await;
    h.engine.add(&owner("c"), Path::new(POD)).await.unwrap();
    let veth = h.fake.host_path_veths();
    assert_eq!(veth.len(), 1);
    h.fake.fail_once("remove_host_path");
    h.engine.del(&owner("c")).await.unwrap();
    assert!(h.engine.attachments().await.is_empty());
    assert!(h.host_is_home(), "the ENI came home before the answer");
    h.settle().await;
    assert_eq!(
        h.fake.host_path_veths(),
        veth,
        "the failed deletion left it"
    );
    let report = h.engine.gc(&GcRequest::default(), Duration::ZERO).await;
    assert_eq!(report.swept, [format!("veth {}", veth[0])], "{report:?}");
    assert!(h.fake.host_path_veths().is_empty());
    let again = h.engine.add(&owner("d"), Path::new(POD)).await.unwrap();
    assert!(again.host_path.is_some());
    h.engine.del(&owner("d")).await.unwrap();
    h.settle().await;
    assert!(h.fake.host_path_veths().is_empty());
}

/// DEL writes its intent behind: a DEL whose device came home but whose
/// intent never reached the disk leaves a Ready record; at restart the
/// device's place says the DEL happened, and recovery finishes it. A Ready
/// record whose device is in the pod is kept.
#[tokio::test]
async fn recovery_finishes_a_del_whose_device_is_home() {
    let mut h = PrimaryHarness::new(2).await;
    h.fake.add_netns(Path::new("/run/netns/keep"));
    h.engine.add(&owner("gone"), Path::new(POD)).await.unwrap();
    h.engine
        .add(&owner("keep"), Path::new("/run/netns/keep"))
        .await
        .unwrap();
    h.engine.checkpoint().flush().await.unwrap();
    // The DEL's move home happened; its intent and outcome did not land.
    let moved = h.fake.remove_netns(Path::new(POD));
    let gone_mac = moved[0].link.mac;
    h.fake.add_netns(Path::new(POD));
    h.fake.world.lock().unwrap().host.extend(moved);
    h.fake
        .restore_host_link(HostLinkHome {
            mac: gone_mac,
            name: "eni1",
            mtu: HOST_MTU,
        })
        .await
        .unwrap();

    let cp = Arc::new(Checkpoint::open(h.engine.checkpoint().path(), false).unwrap());
    h.engine = h.engine_over(cp, Exclusions::default());
    let report = h.engine.recover().await.unwrap();
    assert_eq!((report.finished_dels, report.ready), (1, 1), "{report:?}");
    let left: Vec<String> = h
        .engine
        .attachments()
        .await
        .iter()
        .map(|r| r.key.container_id.clone())
        .collect();
    assert_eq!(left, ["keep"]);
    assert_eq!(h.held().await, 1, "the finished DEL's ENI is free");
}

/// DEL does not wait for the disk: with every write failing, it still
/// succeeds, and the record is gone from memory (the write is retried).
#[tokio::test]
async fn del_waits_for_no_checkpoint_write() {
    let h = PrimaryHarness::new(1).await;
    h.engine.add(&owner("c"), Path::new(POD)).await.unwrap();
    h.engine.checkpoint().flush().await.unwrap();
    h.engine.checkpoint().fail_nth_write(1);
    h.engine.del(&owner("c")).await.unwrap();
    assert!(h.engine.attachments().await.is_empty());
    assert!(h.host_is_home());
    assert_eq!(h.held().await, 0);
}

/// The node leaves (uninstall): with a pod attached nothing is undone,
/// its record and the state files stay; once it is gone the state files
/// go, and a file of someone else's beside them stays.
#[tokio::test]
async fn leaving_the_node_keeps_everything_while_a_pod_is_attached() {
    use crate::daemon::leave::{leave, Leftovers};
    let h = PrimaryHarness::new(1).await;
    let dir = tempfile::tempdir().unwrap();
    let ours = [dir.path().join("cp.json"), dir.path().join("cp.json.lock")];
    let theirs = dir.path().join("someone-else");
    for f in ours.iter().chain([&theirs]) {
        std::fs::write(f, b"x").unwrap();
    }
    let leftovers = || Leftovers {
        files: ours.to_vec(),
        masquerade: None,
    };
    h.engine.add(&owner("c"), Path::new(POD)).await.unwrap();

    let left = leave(&h.engine, leftovers()).await;
    assert_eq!(left.attached, 1);
    assert!(left.files_removed.is_empty());
    assert!(ours.iter().all(|f| f.exists()));
    assert_eq!(h.engine.attachments().await.len(), 1);

    h.engine.del(&owner("c")).await.unwrap();
    let left = leave(&h.engine, leftovers()).await;
    assert_eq!(left.attached, 0);
    assert_eq!(left.files_removed, ours.to_vec());
    assert!(left.files_failed.is_empty());
    assert!(ours.iter().all(|f| !f.exists()));
    assert!(theirs.exists());
}
