//! The pool tests' cloud: in memory, with knobs.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use enim_core::{AddressCount, AddressLimits, Eni, MacAddr, ProviderError};
use enim_provider::cloud::{CloudBackend, CreatedAt, Reaped, TaggedEni, UnattachedEni};
use std::net::IpAddr;

/// Addresses per ENI, its own included.
pub(super) const ADDRESSES_PER_ENI: usize = 4;
use std::sync::{Arc, Mutex};
use tokio::sync::{watch, Semaphore};
use tokio::time::Instant;

/// A bound that turns a pool stuck in the wrong state into a failure
/// instead of a hang (virtual time in the paused-clock tests).
pub(super) const WAIT_LIMIT: Duration = Duration::from_secs(120);

/// An in-memory cloud: ENIs with attached/tagged flags, an attachment
/// limit, call counters, injectable transient failures and gates that hold
/// create or delete calls until the test opens them.
pub(super) struct FakeCloud {
    st: Mutex<FakeState>,
    /// Bumped after every call, so tests can wait for a cloud state.
    events: watch::Sender<u64>,
    pub(super) create_gate: Semaphore,
    pub(super) delete_gate: Semaphore,
    /// The cluster the reaper works for; `None`: reaper off.
    cluster: Option<String>,
}

#[derive(Default)]
pub(super) struct FakeState {
    /// ENIs the instance may have attached, the primary included.
    pub(super) limit: usize,
    next_id: u32,
    pub(super) enis: BTreeMap<String, FakeEni>,
    /// The next this many create/delete calls fail with `Throttled`.
    pub(super) fail_next: usize,
    /// Every this many-th create fails with `Throttled` (0: none).
    pub(super) fail_every: usize,
    /// The cloud API (not instance metadata) answers `Unavailable`.
    pub(super) api_down: bool,
    pub(super) hold_creates: bool,
    pub(super) hold_deletes: bool,
    pub(super) creates: usize,
    pub(super) creates_started: usize,
    pub(super) deletes: Vec<String>,
    pub(super) create_times: Vec<Instant>,
    pub(super) delete_times: Vec<Instant>,
    /// When `attached` was called: the pool's discovery and timer rounds.
    pub(super) attached_times: Vec<Instant>,
    /// Creates that would have exceeded the limit.
    pub(super) over_limit: usize,
    /// When the reaper listed this cluster's unattached ENIs.
    pub(super) reap_lists: Vec<Instant>,
    /// ENIs the reaper deleted.
    pub(super) reaped: Vec<String>,
    /// Each fill the pool said before a create ([`CloudBackend::pool_fill`]).
    pub(super) fills: Vec<f64>,
}

pub(super) struct FakeEni {
    pub(super) eni: Eni,
    pub(super) attached: bool,
    pub(super) tagged: bool,
    /// The cluster tag, if any.
    pub(super) cluster: Option<String>,
    /// The creation tag's value, if any.
    pub(super) created_at: Option<String>,
}

fn eni(n: u32) -> Eni {
    let [.., hi, lo] = n.to_be_bytes();
    Eni {
        id: format!("eni-{n}"),
        mac: MacAddr([2, 0, 0, 0, hi, lo]),
        ipv4: format!("10.0.{}.{}/16", n >> 8, n & 0xff).parse().unwrap(),
        gateway4: "10.0.255.254".parse().unwrap(),
        ipv6: None,
        gateway6: None,
        mtu: Some(9001),
        owner: None,
        device_index: Some(n),
        secondary_ips: Vec::new(),
        placement: Default::default(),
    }
}

impl FakeCloud {
    pub(super) fn new(limit: usize) -> Arc<FakeCloud> {
        Self::build(limit, None)
    }

    /// A cloud whose backend reaps for `cluster`.
    pub(super) fn in_cluster(limit: usize, cluster: &str) -> Arc<FakeCloud> {
        Self::build(limit, Some(cluster.into()))
    }

    fn build(limit: usize, cluster: Option<String>) -> Arc<FakeCloud> {
        Arc::new(FakeCloud {
            cluster,
            st: Mutex::new(FakeState {
                limit,
                next_id: 1,
                ..Default::default()
            }),
            events: watch::Sender::new(0),
            create_gate: Semaphore::new(0),
            delete_gate: Semaphore::new(0),
        })
    }

    pub(super) fn st(&self) -> std::sync::MutexGuard<'_, FakeState> {
        self.st.lock().unwrap()
    }

    /// Adds an ENI directly (as a previous agent run would have left it).
    pub(super) fn add(&self, attached: bool, tagged: bool) -> String {
        let mut st = self.st();
        let e = eni(st.next_id);
        st.next_id += 1;
        let id = e.id.clone();
        st.enis.insert(
            id.clone(),
            FakeEni {
                eni: e,
                attached,
                tagged,
                cluster: None,
                created_at: None,
            },
        );
        id
    }

    /// Adds an ENI with cluster and creation tags, as any node of a
    /// cluster would have made it.
    pub(super) fn add_in_cluster(
        &self,
        cluster: Option<&str>,
        created_at: Option<&str>,
        attached: bool,
    ) -> String {
        // Not tagged for this node: another node of the cluster made it.
        let id = self.add(attached, false);
        let mut st = self.st();
        let e = st.enis.get_mut(&id).unwrap();
        e.cluster = cluster.map(String::from);
        e.created_at = created_at.map(String::from);
        id
    }

    pub(super) fn attached_count(&self) -> usize {
        self.st().enis.values().filter(|e| e.attached).count()
    }

    pub(super) fn fail_next(&self, n: usize) {
        self.st().fail_next = n;
    }

    fn bump(&self) {
        self.events.send_modify(|n| *n += 1);
    }

    /// Waits until `pred` holds on the cloud state, re-checking after each
    /// call the fake serves.
    pub(super) async fn until(&self, pred: impl Fn(&FakeState) -> bool) {
        self.until_within(WAIT_LIMIT, pred).await
    }

    /// As [`until`](Self::until), for states that take longer to come.
    pub(super) async fn until_within(&self, limit: Duration, pred: impl Fn(&FakeState) -> bool) {
        let mut rx = self.events.subscribe();
        tokio::time::timeout(limit, rx.wait_for(|_| pred(&self.st())))
            .await
            .expect("the cloud never reached the expected state")
            .unwrap();
    }

    /// The start of a create or delete call: `record` notes it and says
    /// whether the test holds such calls; if so, waits for `gate`.
    async fn enter(&self, gate: &Semaphore, record: impl FnOnce(&mut FakeState) -> bool) {
        let hold = record(&mut self.st());
        self.bump();
        if hold {
            gate.acquire().await.unwrap().forget();
        }
    }

    fn api(&self) -> Result<(), ProviderError> {
        if self.st().api_down {
            return Err(ProviderError::Unavailable("injected outage".into()));
        }
        Ok(())
    }

    fn injected_failure(&self) -> Result<(), ProviderError> {
        self.api()?;
        let mut st = self.st();
        if st.fail_next > 0 {
            st.fail_next -= 1;
            return Err(ProviderError::Throttled("injected".into()));
        }
        Ok(())
    }
}

#[async_trait]
impl CloudBackend for FakeCloud {
    fn name(&self) -> &str {
        "fake"
    }

    async fn attached(&self) -> Result<Vec<Eni>, ProviderError> {
        let list = {
            let mut st = self.st();
            st.attached_times.push(Instant::now());
            st.enis
                .values()
                .filter(|e| e.attached)
                .map(|e| e.eni.clone())
                .collect()
        };
        self.bump();
        Ok(list)
    }

    async fn tagged(&self) -> Result<Vec<TaggedEni>, ProviderError> {
        self.api()?;
        Ok(self
            .st()
            .enis
            .values()
            .filter(|e| e.tagged)
            .map(|e| TaggedEni {
                id: e.eni.id.clone(),
                attached: e.attached,
            })
            .collect())
    }

    async fn eni_limit(&self) -> Result<usize, ProviderError> {
        self.api()?;
        Ok(self.st().limit)
    }

    fn pool_fill(&self, fill: f64) {
        self.st().fills.push(fill);
    }

    async fn create_and_attach(&self) -> Result<Eni, ProviderError> {
        self.enter(&self.create_gate, |st| {
            st.creates_started += 1;
            st.create_times.push(Instant::now());
            st.hold_creates
        })
        .await;
        let result = self.injected_failure().and_then(|()| {
            let mut st = self.st();
            if st.fail_every > 0 && st.creates_started.is_multiple_of(st.fail_every) {
                return Err(ProviderError::Throttled("injected, every n-th".into()));
            }
            let attached = st.enis.values().filter(|e| e.attached).count();
            if attached + 1 >= st.limit {
                st.over_limit += 1;
                return Err(ProviderError::Config("ENI limit exceeded".into()));
            }
            let e = eni(st.next_id);
            st.next_id += 1;
            st.creates += 1;
            st.enis.insert(
                e.id.clone(),
                FakeEni {
                    eni: e.clone(),
                    attached: true,
                    tagged: true,
                    cluster: self.cluster.clone(),
                    created_at: Some(enim_provider::cloud::format_created_at(
                        std::time::SystemTime::now(),
                    )),
                },
            );
            Ok(e)
        });
        self.bump();
        result
    }

    async fn attach_existing(&self, eni_id: &str) -> Result<Eni, ProviderError> {
        Err(ProviderError::UnknownEni(eni_id.into()))
    }

    async fn address_limits(&self) -> Result<AddressLimits, ProviderError> {
        self.api()?;
        Ok(AddressLimits {
            enis: self.st().limit,
            ipv4_per_eni: ADDRESSES_PER_ENI,
            ipv6_per_eni: 0,
        })
    }

    /// Numbers new IPv4 addresses 10.200.<ENI number>.<n> in order.
    async fn assign(&self, eni_id: &str, n: AddressCount) -> Result<Vec<IpAddr>, ProviderError> {
        let AddressCount { ipv4, ipv6 } = n;
        self.api()?;
        let mut st = self.st();
        let e = st
            .enis
            .get_mut(eni_id)
            .filter(|e| e.attached)
            .ok_or_else(|| ProviderError::UnknownEni(eni_id.into()))?;
        if ipv6 > 0 || e.eni.secondary_ips.len() + ipv4 + 1 > ADDRESSES_PER_ENI {
            return Err(ProviderError::Config("address limit exceeded".into()));
        }
        let [.., third, _] = e.eni.ipv4.addr().octets();
        let mut new = Vec::new();
        for n in 1u8.. {
            if new.len() == ipv4 {
                break;
            }
            let ip = IpAddr::from([10, 200, third, n]);
            if !e.eni.secondary_ips.contains(&ip) {
                e.eni.secondary_ips.push(ip);
                new.push(ip);
            }
        }
        Ok(new)
    }

    async fn unassign(&self, eni_id: &str, ips: &[IpAddr]) -> Result<(), ProviderError> {
        self.api()?;
        if let Some(e) = self.st().enis.get_mut(eni_id) {
            e.eni.secondary_ips.retain(|ip| !ips.contains(ip));
        }
        Ok(())
    }

    async fn detach_and_delete(&self, eni_id: &str) -> Result<(), ProviderError> {
        self.enter(&self.delete_gate, |st| {
            st.delete_times.push(Instant::now());
            st.hold_deletes
        })
        .await;
        let result = self.injected_failure().and_then(|()| {
            let mut st = self.st();
            match st.enis.get(eni_id) {
                Some(e) if !e.tagged => {
                    Err(ProviderError::Config(format!("{eni_id} is not enim's")))
                }
                Some(_) => {
                    st.enis.remove(eni_id);
                    st.deletes.push(eni_id.into());
                    Ok(())
                }
                None => Err(ProviderError::UnknownEni(eni_id.into())),
            }
        });
        self.bump();
        result
    }

    fn reap_cluster(&self) -> Option<&str> {
        self.cluster.as_deref()
    }

    async fn unattached_in_cluster(&self) -> Result<Vec<UnattachedEni>, ProviderError> {
        // Every listing is noted, failed ones too.
        self.st().reap_lists.push(Instant::now());
        self.bump();
        self.api()?;
        let list = {
            let st = self.st();
            st.enis
                .values()
                .filter(|e| !e.attached && e.cluster.is_some() && e.cluster == self.cluster)
                .map(|e| UnattachedEni {
                    id: e.eni.id.clone(),
                    created_at: CreatedAt::from_tag(e.created_at.as_deref()),
                })
                .collect()
        };
        self.bump();
        Ok(list)
    }

    async fn reap(&self, eni_id: &str) -> Result<Reaped, ProviderError> {
        self.enter(&self.delete_gate, |st| st.hold_deletes).await;
        self.injected_failure()?;
        let result = {
            let mut st = self.st();
            match st.enis.get(eni_id) {
                None => Reaped::Gone,
                Some(e) if e.attached => Reaped::Spared("attached".into()),
                Some(e) if e.cluster.is_none() || e.cluster != self.cluster => {
                    Reaped::Spared("not this cluster's".into())
                }
                Some(_) => {
                    st.enis.remove(eni_id);
                    st.reaped.push(eni_id.into());
                    Reaped::Deleted
                }
            }
        };
        self.bump();
        Ok(result)
    }
}
