//! The secondary driver over a provider with an address feed: an empty
//! start is fine, listings are applied as they change, the provider hears
//! what pods hold and what the store holds.

use std::net::IpAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use enim_core::{Eni, EniOwner, ProviderError, StoredAddresses};
use enim_provider::{AddressFeed, EniProvider};
use enim_provider_static::StaticProvider;
use tokio::sync::watch;

use crate::engine::conformance::{mac, owner, static_eni, POD};
use crate::engine::Engine;
use crate::secondary::fake::FakeSecondary;
use crate::secondary::{SecondaryConfig, SecondaryDriver};
use crate::store::checkpoint::Checkpoint;
use crate::support::exclusion::Exclusions;

/// A provider whose listing the test sets, as the operator's spec would.
struct Feed {
    enis: Mutex<Vec<Eni>>,
    changes: watch::Sender<u64>,
    held: Mutex<Vec<(String, Vec<IpAddr>)>>,
    stored: Mutex<Option<StoredAddresses>>,
}

impl Feed {
    fn set(&self, enis: Vec<Eni>) {
        *self.enis.lock().unwrap() = enis;
        self.changes.send_modify(|n| *n += 1);
    }

    fn stored(&self) -> Vec<IpAddr> {
        let mut ips = self
            .stored
            .lock()
            .unwrap()
            .as_ref()
            .map(|s| s.addresses.clone())
            .unwrap_or_default();
        ips.sort();
        ips
    }
}

#[async_trait]
impl EniProvider for Feed {
    fn name(&self) -> &str {
        "feed"
    }
    async fn list(&self) -> Result<Vec<Eni>, ProviderError> {
        Ok(self.enis.lock().unwrap().clone())
    }
    async fn allocate_next(&self, _: &EniOwner) -> Result<Eni, ProviderError> {
        Err(ProviderError::Config("not in secondary mode".into()))
    }
    async fn release(&self, _: &EniOwner) -> Result<(), ProviderError> {
        Ok(())
    }
    async fn restore(&self, _: &[(String, EniOwner)]) -> Result<(), ProviderError> {
        Ok(())
    }
    fn address_feed(&self) -> Option<&dyn AddressFeed> {
        Some(self)
    }
}

impl AddressFeed for Feed {
    fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }
    fn held(&self, eni_id: &str, ips: &[IpAddr], owner: &EniOwner) {
        assert_eq!(owner.ifname, "eth0");
        self.held
            .lock()
            .unwrap()
            .push((eni_id.to_string(), ips.to_vec()));
    }
    fn freed(&self, owner: &EniOwner) {
        let _ = owner;
        self.held.lock().unwrap().clear();
    }
    fn stored(&self, store: StoredAddresses) {
        *self.stored.lock().unwrap() = Some(store);
    }
}

/// Static ENI `i` of the fixtures, IPv4 only, as a provider lists it.
fn eni(i: u8) -> Eni {
    let mut config = static_eni(i);
    config.ipv6 = None;
    config.gateway6 = None;
    config.secondary_ipv6.clear();
    let p = StaticProvider::new(vec![config]).unwrap();
    futures::executor::block_on(p.list()).unwrap().remove(0)
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !check() {
        assert!(Instant::now() < deadline, "not within 5 s: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn listings_are_followed_and_the_provider_hears_what_is_held() {
    let feed = Arc::new(Feed {
        enis: Mutex::new(Vec::new()),
        changes: watch::channel(0).0,
        held: Mutex::new(Vec::new()),
        stored: Mutex::new(None),
    });
    // eni-1's device is in the host; eni-2's is not yet.
    let fake = Arc::new(FakeSecondary::with_enis(&[(mac(1), "eth1")]));
    fake.add_netns(Path::new(POD));
    let dir = tempfile::tempdir().unwrap();
    let cp = Arc::new(Checkpoint::open(&dir.path().join("cp.json"), false).unwrap());
    let mut config = SecondaryConfig {
        cooldown: Duration::ZERO,
        ..SecondaryConfig::default()
    };
    config.pool.initial_retry = Duration::from_millis(20);
    let driver = SecondaryDriver::new(
        config,
        feed.clone(),
        fake.clone(),
        cp.clone(),
        Exclusions::default(),
    )
    .unwrap();
    let engine = Engine::new(driver, cp);
    // Nothing listed yet (no spec): a start, not a config error.
    engine.recover().await.unwrap();
    assert!(engine.add(&owner("early"), Path::new(POD)).await.is_err());

    feed.set(vec![eni(1), eni(2)]);
    eventually("eni-1's addresses join the store", || {
        feed.stored() == [ip("10.0.1.11"), ip("10.0.1.12")]
    })
    .await;
    let result = engine.add(&owner("a"), Path::new(POD)).await.unwrap();
    let held = feed.held.lock().unwrap().clone();
    assert_eq!(held.len(), 1);
    assert_eq!(held[0].0, "eni-1");
    assert_eq!(
        result
            .ips
            .iter()
            .map(|c| c.address.addr())
            .collect::<Vec<_>>(),
        held[0].1
    );
    let held_ip = held[0].1[0];
    let free_ip = if held_ip == ip("10.0.1.11") {
        ip("10.0.1.12")
    } else {
        ip("10.0.1.11")
    };

    // The listing drops both addresses: the free one leaves at once, the
    // held one stays with its pod until the pod goes.
    let mut without = eni(1);
    without.secondary_ips.clear();
    feed.set(vec![without, eni(2)]);
    eventually("the free address leaves on the first look", || {
        feed.stored() == [held_ip]
    })
    .await;
    assert_ne!(free_ip, held_ip);
    engine.del(&owner("a")).await.unwrap();
    assert!(feed.held.lock().unwrap().is_empty());
    assert!(feed.stored().is_empty(), "{:?}", feed.stored());

    // eni-2's device shows up late: it is looked for again and joins.
    fake.world().enis.insert(mac(2), "eth2".into());
    eventually("the late ENI joins", || {
        feed.stored() == [ip("10.0.2.11"), ip("10.0.2.12")]
    })
    .await;
    let served = feed.stored.lock().unwrap().clone().unwrap().enis;
    assert_eq!(served, ["eni-1", "eni-2"]);
}

#[test]
fn an_authoritative_listing_acts_on_the_first_check() {
    use crate::secondary::datastore::DataStore;
    use enim_api::model::AttachmentKey;
    let t0 = Instant::now();
    let mut ds = DataStore::new(Duration::from_secs(30));
    ds.add_eni("eni-a", 2).unwrap();
    for a in ["10.0.0.11", "10.0.0.12", "fd00::11"] {
        ds.add_address("eni-a", ip(a)).unwrap();
    }
    let key = AttachmentKey::of(&owner("p"));
    let held = ds.assign(&key, false, t0).unwrap().ipv4.unwrap();
    let out = ds.sync_eni_after("eni-a", &[ip("fd00::11")], 1).unwrap();
    assert_eq!(out.lost, vec![held]);
    assert_eq!(out.removed.len(), 1, "{out:?}");
    let mut left = ds.addresses();
    left.sort();
    assert_eq!(left, [held, ip("fd00::11")], "the free IPv4 left at once");
    ds.unassign(&key, t0);
    assert_eq!(ds.addresses(), [ip("fd00::11")], "dropped when freed");
}
