//! In-memory [`FleetCloud`] and [`Store`] for tests and the bench: an
//! instant cloud that behaves as the trait says (idempotent create by
//! token, attach and detach that succeed when already done, a detach that
//! only starts (the next listing, or a later one, shows it done), delete
//! that spares attached ENIs), with call counts and injected failures.
//!
//! The looks a cloud makes besides its verbs are counted as "look" (and
//! by kind: "look-intent" before a create that is not
//! [`CreateEni::fresh`], "look-delete" for a [`DeleteCheck::SecondLook`]),
//! and a fresh create whose token an ENI already carries panics: the
//! allocator promised the token was never sent.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use enim_core::{AddressCount, AddressLimits, MacAddr, ProviderError};
use enim_crd::NetResourceSetSpec;
use enim_provider::cloud::{CreatedAt, Reaped};
use enim_provider::fleet::{
    CreateEni, DeleteCheck, FleetAttachment, FleetCloud, FleetEni, Slot, DETACHING,
};

use crate::index::{NodeInfo, SetInfo};
use crate::store::{Store, StoreError};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[derive(Default)]
struct CloudState {
    enis: BTreeMap<String, FleetEni>,
    next: u32,
    calls: BTreeMap<&'static str, usize>,
    /// Verb → calls still to fail.
    failing: HashMap<&'static str, usize>,
    /// Verb → calls still to refuse, as EC2 refuses a subnet or group that
    /// does not exist (a permanent error).
    refusing: HashMap<&'static str, usize>,
    /// ENIs being detached → listings that still show them "detaching".
    detaching: HashMap<String, usize>,
    /// What `detaching` starts at.
    detach_listings: usize,
}

pub struct MemCloud {
    state: Mutex<CloudState>,
    pub limits: AddressLimits,
    /// Creation tags are stamped with this.
    pub now: Mutex<SystemTime>,
}

impl Default for MemCloud {
    fn default() -> Self {
        MemCloud::new(AddressLimits {
            ipv4_per_eni: 10,
            ipv6_per_eni: 0,
            enis: 8,
        })
    }
}

impl MemCloud {
    pub fn new(limits: AddressLimits) -> MemCloud {
        MemCloud {
            state: Mutex::default(),
            limits,
            now: Mutex::new(UNIX_EPOCH + Duration::from_secs(1_800_000_000)),
        }
    }

    /// The next `n` calls of `verb` ("create", "attach", ...) fail.
    pub fn fail_next(&self, verb: &'static str, n: usize) {
        lock(&self.state).failing.insert(verb, n);
    }

    /// The next `n` calls of `verb` are refused for good (a configuration
    /// error: retrying as it is cannot help).
    pub fn refuse_next(&self, verb: &'static str, n: usize) {
        lock(&self.state).refusing.insert(verb, n);
    }

    /// A detach shows as "detaching" in the next `n` listings, then is
    /// done (default 0: done by the next listing).
    pub fn detach_takes_listings(&self, n: usize) {
        lock(&self.state).detach_listings = n;
    }

    pub fn calls(&self, verb: &str) -> usize {
        lock(&self.state).calls.get(verb).copied().unwrap_or(0)
    }

    /// Calls of every verb.
    pub fn total_calls(&self) -> usize {
        lock(&self.state).calls.values().sum()
    }

    pub fn enis(&self) -> Vec<FleetEni> {
        lock(&self.state).enis.values().cloned().collect()
    }

    /// Puts an ENI into the cloud as if someone else made it.
    pub fn insert(&self, eni: FleetEni) {
        lock(&self.state).enis.insert(eni.id.clone(), eni);
    }

    fn enter(&self, verb: &'static str) -> Result<MutexGuard<'_, CloudState>, ProviderError> {
        let mut st = lock(&self.state);
        *st.calls.entry(verb).or_default() += 1;
        if let Some(n) = st.failing.get_mut(verb).filter(|n| **n > 0) {
            *n -= 1;
            return Err(ProviderError::Unavailable(format!(
                "{verb}: injected failure"
            )));
        }
        if let Some(n) = st.refusing.get_mut(verb).filter(|n| **n > 0) {
            *n -= 1;
            return Err(ProviderError::Config(format!(
                "{verb}: InvalidSubnetID.NotFound (injected)"
            )));
        }
        Ok(st)
    }

    /// Counts a look of `kind` besides the verb's own call.
    fn look(st: &mut CloudState, kind: &'static str) {
        *st.calls.entry("look").or_default() += 1;
        *st.calls.entry(kind).or_default() += 1;
    }
}

#[async_trait]
impl FleetCloud for MemCloud {
    // Its nodes carry `aws:///` providerIDs, as the tests' Nodes do.
    fn name(&self) -> &str {
        "aws"
    }

    async fn list_cluster_enis(&self) -> Result<Vec<FleetEni>, ProviderError> {
        let mut st = self.enter("list")?;
        let st = &mut *st;
        st.detaching.retain(|id, left| {
            let done = *left == 0;
            *left = left.saturating_sub(1);
            if done {
                if let Some(e) = st.enis.get_mut(id) {
                    e.attachment = None;
                }
            }
            !done
        });
        Ok(st.enis.values().cloned().collect())
    }

    async fn limits(&self, _instance_type: &str) -> Result<AddressLimits, ProviderError> {
        drop(self.enter("limits")?);
        Ok(self.limits)
    }

    async fn create(&self, req: &CreateEni) -> Result<FleetEni, ProviderError> {
        let now = *lock(&self.now);
        let mut st = self.enter("create")?;
        if !req.fresh {
            Self::look(&mut st, "look-intent");
        }
        if let Some(e) = st
            .enis
            .values()
            .find(|e| e.intent.as_deref() == Some(req.client_token.as_str()))
        {
            assert!(
                !req.fresh,
                "a fresh create with token {} that {} carries already",
                req.client_token, e.id
            );
            return Ok(e.clone());
        }
        st.next += 1;
        let n = st.next;
        let [_, a, b, c] = n.to_be_bytes();
        let host = |k: u32| Ipv4Addr::from(0x0a00_0000 | ((n * 64 + k) & 0x00ff_ffff));
        let eni = FleetEni {
            id: format!("eni-{n:06}"),
            mac: MacAddr([2, 0, 0, a, b, c]),
            ipv4: ipnet::Ipv4Net::new(host(0), 8)
                .map_err(|e| ProviderError::Config(e.to_string()))?,
            gateway4: Ipv4Addr::new(10, 0, 0, 1),
            ipv6: None,
            gateway6: None,
            subnet: req.subnet.clone(),
            security_groups: req.security_groups.clone(),
            secondary_ips: (1..=u32::try_from(req.secondary_ipv4).unwrap_or(0))
                .map(|k| IpAddr::V4(host(k)))
                .collect(),
            attachment: None,
            node: Some(req.instance.clone()),
            intent: Some(req.client_token.clone()),
            cluster: Some("mem".into()),
            created_at: CreatedAt::At(now),
        };
        st.enis.insert(eni.id.clone(), eni.clone());
        Ok(eni)
    }

    async fn attach(&self, eni: &FleetEni, at: Slot<'_>) -> Result<(), ProviderError> {
        let eni_id = eni.id.as_str();
        let mut st = self.enter("attach")?;
        let e = st
            .enis
            .get_mut(eni_id)
            .ok_or_else(|| ProviderError::UnknownEni(eni_id.into()))?;
        match &e.attachment {
            Some(a) if a.instance == at.instance => Ok(()),
            Some(a) => Err(ProviderError::Unavailable(format!(
                "{eni_id} is attached to {}",
                a.instance
            ))),
            None => {
                e.attachment = Some(FleetAttachment {
                    instance: at.instance.into(),
                    device_index: at.device_index,
                    attachment_id: format!("attach-{eni_id}"),
                    state: "attached".into(),
                });
                Ok(())
            }
        }
    }

    async fn start_detach(&self, eni: &FleetEni) -> Result<(), ProviderError> {
        let mut st = self.enter("detach")?;
        let st = &mut *st;
        let Some(a) = st.enis.get_mut(&eni.id).and_then(|e| e.attachment.as_mut()) else {
            return Ok(());
        };
        if !a.detaching() {
            a.state = DETACHING.into();
            st.detaching.insert(eni.id.clone(), st.detach_listings);
        }
        Ok(())
    }

    async fn delete(&self, eni_id: &str, check: DeleteCheck) -> Result<Reaped, ProviderError> {
        let mut st = self.enter("delete")?;
        if check == DeleteCheck::SecondLook {
            Self::look(&mut st, "look-delete");
        }
        Ok(match st.enis.get(eni_id) {
            None => Reaped::Gone,
            Some(e) if e.attachment.is_some() => Reaped::Spared("attached".into()),
            Some(_) => {
                st.enis.remove(eni_id);
                Reaped::Deleted
            }
        })
    }

    async fn assign(&self, eni_id: &str, n: AddressCount) -> Result<Vec<IpAddr>, ProviderError> {
        let mut st = self.enter("assign")?;
        let e = st
            .enis
            .get_mut(eni_id)
            .ok_or_else(|| ProviderError::UnknownEni(eni_id.into()))?;
        let base = u32::from(e.ipv4.addr());
        let mut new = Vec::new();
        let mut k = 1;
        while new.len() < n.ipv4 {
            let ip = IpAddr::V4(Ipv4Addr::from(base + k));
            if !e.secondary_ips.contains(&ip) {
                e.secondary_ips.push(ip);
                new.push(ip);
            }
            k += 1;
        }
        Ok(new)
    }

    async fn unassign(&self, eni_id: &str, ips: &[IpAddr]) -> Result<(), ProviderError> {
        let mut st = self.enter("unassign")?;
        if let Some(e) = st.enis.get_mut(eni_id) {
            e.secondary_ips.retain(|ip| !ips.contains(ip));
        }
        Ok(())
    }
}

/// NetResourceSets in memory: spec by the operator, status by the test.
pub struct MemStore {
    sets: Mutex<BTreeMap<String, SetInfo>>,
    leader: AtomicBool,
    /// Leading by the flag, but this long past the leader deadline.
    past_deadline: Mutex<Option<std::time::Duration>>,
    writes: AtomicUsize,
    /// Leadership is lost after this many more writes (`usize::MAX`: never).
    lose_after: AtomicUsize,
}

impl Default for MemStore {
    fn default() -> Self {
        MemStore {
            sets: Mutex::default(),
            leader: AtomicBool::new(true),
            past_deadline: Mutex::new(None),
            writes: AtomicUsize::new(0),
            lose_after: AtomicUsize::new(usize::MAX),
        }
    }
}

impl MemStore {
    pub fn sets(&self) -> Vec<SetInfo> {
        lock(&self.sets).values().cloned().collect()
    }

    pub fn set(&self, name: &str) -> Option<SetInfo> {
        lock(&self.sets).get(name).cloned()
    }

    /// Changes a set as an agent (status) or the API server would.
    pub fn edit(&self, name: &str, f: impl FnOnce(&mut SetInfo)) {
        if let Some(s) = lock(&self.sets).get_mut(name) {
            f(s);
        }
    }

    pub fn set_leader(&self, leader: bool) {
        self.leader.store(leader, Ordering::SeqCst);
    }

    /// `Some`: the flag still up, the leader deadline passed that long ago.
    pub fn set_past_deadline(&self, late: Option<std::time::Duration>) {
        *lock(&self.past_deadline) = late;
    }

    pub fn lose_leadership_after(&self, writes: usize) {
        self.lose_after.store(writes, Ordering::SeqCst);
    }

    pub fn writes(&self) -> usize {
        self.writes.load(Ordering::SeqCst)
    }

    fn wrote(&self) {
        self.writes.fetch_add(1, Ordering::SeqCst);
        let left = self.lose_after.load(Ordering::SeqCst);
        if left != usize::MAX {
            if left <= 1 {
                self.set_leader(false);
            }
            self.lose_after
                .store(left.saturating_sub(1), Ordering::SeqCst);
        }
    }
}

#[async_trait]
impl Store for MemStore {
    async fn apply_spec(
        &self,
        node: &NodeInfo,
        spec: &NetResourceSetSpec,
    ) -> Result<(), StoreError> {
        self.leadership()?;
        lock(&self.sets)
            .entry(node.name.clone())
            .and_modify(|s| s.spec = spec.clone())
            .or_insert_with(|| SetInfo {
                name: node.name.clone(),
                spec: spec.clone(),
                status: None,
                deleting_since: None,
                uninstall: Default::default(),
            });
        self.wrote();
        Ok(())
    }

    async fn release_set(&self, name: &str) -> Result<(), StoreError> {
        self.leadership()?;
        lock(&self.sets).remove(name);
        self.wrote();
        Ok(())
    }

    fn is_leader(&self) -> bool {
        self.leadership().is_ok()
    }

    fn leadership(&self) -> Result<(), StoreError> {
        if !self.leader.load(Ordering::SeqCst) {
            return Err(StoreError::NotLeader);
        }
        match *lock(&self.past_deadline) {
            Some(late) => Err(StoreError::PastDeadline(late)),
            None => Ok(()),
        }
    }
}

/// The webhook's registration as the chart writes it (its rules, its
/// namespaceSelector, `failurePolicy: Fail`), but calling `url` and
/// trusting `ca` (PEM; `None`: an empty caBundle, as the chart leaves it
/// for the operator): for tests and the bench, whose webhook runs outside
/// a cluster.
pub fn webhook_by_url(
    url: &str,
    ca: Option<&[u8]>,
) -> k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration {
    let mut config: k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration =
        serde_json::from_value(serde_json::json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "enim-policy"},
            "webhooks": [{
                "name": "pods.policy.enim.io",
                "admissionReviewVersions": ["v1"],
                "clientConfig": {"url": url},
                "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"], "scope": "Namespaced"}],
                "failurePolicy": "Fail",
                "sideEffects": "None",
                "timeoutSeconds": 5,
                "reinvocationPolicy": "Never",
                "namespaceSelector": {"matchExpressions": [
                    {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", "enim-system"]},
                    {"key": "enim.io/admission", "operator": "NotIn", "values": ["ignore"]},
                ]},
            }],
        }))
        .expect("a valid MutatingWebhookConfiguration");
    // ByteString is written as base64 on the wire.
    config.webhooks.as_mut().expect("one webhook")[0]
        .client_config
        .ca_bundle = ca.map(|pem| k8s_openapi::ByteString(pem.to_vec()));
    config
}
