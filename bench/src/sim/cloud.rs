//! [`SimCloud`]: a [`CloudBackend`] for one simulated node, behaving as
//! AWS documents, over an [`Account`] every node of a fleet shares.
//!
//! Each backend method makes the same EC2 calls, in the same order, as
//! enim's AWS backend (`provider/aws/src/backend.rs`):
//! - `eni_limit`: DescribeInstanceTypes, once per node (cached on success);
//! - `attached`: instance metadata (IMDS), not an EC2 call, never throttled;
//! - `tagged`: DescribeNetworkInterfaces with tag filters;
//! - `create_and_attach`: DescribeNetworkInterfaces (filtered, the free
//!   device slots), CreateNetworkInterface, then under the node's attach
//!   lock DescribeNetworkInterfaces (filtered) again and
//!   AttachNetworkInterface (after a failed attach, a DescribeNetworkInterfaces
//!   by id to see whether it went through), then
//!   ModifyNetworkInterfaceAttribute (DeleteOnTermination; a failure is only
//!   logged), then IMDS polls until the interface shows (50 ms doubling to
//!   1 s, jittered, up to `metadata_wait`); a failed attach or metadata wait
//!   deletes the ENI again;
//! - `detach_and_delete`: DescribeNetworkInterfaces by id, DetachNetworkInterface,
//!   DescribeNetworkInterfaces by id polled (the backend's `DETACH_BACKOFF`,
//!   jittered, up to `detach_timeout`) until `available`, then
//!   DeleteNetworkInterface.
//!
//! Every EC2 call goes through the client's retry as the real one does
//! (`provider/aws/src/ec2/query.rs`): a throttled reply is retried after
//! the policy's jittered backoff (AwsConfig defaults: 5 attempts, 200 ms
//! doubling to 10 s), then answered as [`ProviderError::Throttled`], the
//! transient kind the pool backs off on. Each call takes one token from its
//! action's bucket in the account when it is sent and is answered one round
//! trip later; every reply is counted by action and outcome.
//!
//! Timing: an attach completes (and shows in metadata at once) a time drawn
//! uniformly from `attach` after the AttachNetworkInterface call; a detach
//! completes a time drawn from `detach` after DetachNetworkInterface.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use enim_provider::cloud::{CloudBackend, TaggedEni};
use enim_provider::retry::Poll;
use enim_provider::{AddressLimits, Eni, MacAddr, ProviderError};
use enim_provider_aws::ec2::RetryPolicy;
use enim_provider_aws::AwsConfig;
use ipnet::Ipv4Net;
use tokio::time::Instant;

use super::bucket::{Action, TokenBucket, ACTIONS};
use super::rng::Rng;

use enim_provider_aws::{DETACH_BACKOFF, SETTLE_BACKOFF};

/// How the simulated cloud behaves.
#[derive(Debug, Clone)]
pub struct CloudParams {
    /// AttachNetworkInterface call → the interface shows in metadata.
    pub attach: (Duration, Duration),
    /// DetachNetworkInterface call → the ENI is `available`.
    pub detach: (Duration, Duration),
    /// Round trip of one EC2 call.
    pub api_rtt: Duration,
    /// Round trip of one metadata read.
    pub imds_rtt: Duration,
    /// Interfaces an instance takes, the primary included.
    pub eni_limit: usize,
    /// The EC2 client's retry of throttled calls.
    pub retry: RetryPolicy,
    pub metadata_wait: Duration,
    pub detach_timeout: Duration,
}

impl Default for CloudParams {
    fn default() -> Self {
        let aws = AwsConfig::default();
        CloudParams {
            attach: (Duration::from_secs(8), Duration::from_secs(12)),
            detach: (Duration::from_secs(2), Duration::from_secs(3)),
            api_rtt: Duration::from_millis(50),
            imds_rtt: Duration::from_millis(1),
            eni_limit: 15,
            retry: aws.retry_policy(),
            metadata_wait: aws.metadata_wait,
            detach_timeout: aws.detach_timeout,
        }
    }
}

impl CloudParams {
    /// Mean AttachNetworkInterface → metadata time.
    pub fn mean_attach(&self) -> Duration {
        (self.attach.0 + self.attach.1) / 2
    }
}

/// Replies to one action.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Count {
    pub ok: u64,
    /// `RequestLimitExceeded` replies (each retried attempt counts).
    pub throttled: u64,
    /// Other error replies.
    pub failed: u64,
    /// Calls the client gave up on after its attempts, all throttled.
    pub gave_up: u64,
}

impl Count {
    pub fn calls(&self) -> u64 {
        self.ok + self.throttled + self.failed
    }

    fn minus(&self, o: &Count) -> Count {
        Count {
            ok: self.ok - o.ok,
            throttled: self.throttled - o.throttled,
            failed: self.failed - o.failed,
            gave_up: self.gave_up - o.gave_up,
        }
    }
}

/// Every reply so far, by action, and the metadata reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counts {
    pub by_action: BTreeMap<Action, Count>,
    pub imds_reads: u64,
}

impl Counts {
    /// What happened since `earlier`.
    pub fn since(&self, earlier: &Counts) -> Counts {
        Counts {
            by_action: self
                .by_action
                .iter()
                .map(|(a, c)| {
                    (
                        *a,
                        c.minus(&earlier.by_action.get(a).copied().unwrap_or_default()),
                    )
                })
                .collect(),
            imds_reads: self.imds_reads - earlier.imds_reads,
        }
    }

    pub fn get(&self, a: Action) -> Count {
        self.by_action.get(&a).copied().unwrap_or_default()
    }

    /// Calls (replies) of the mutating or the non-mutating actions.
    pub fn calls(&self, mutating: bool) -> u64 {
        ACTIONS
            .iter()
            .filter(|a| a.mutating() == mutating)
            .map(|a| self.get(*a).calls())
            .sum()
    }

    pub fn throttled(&self) -> u64 {
        self.by_action.values().map(|c| c.throttled).sum()
    }

    pub fn gave_up(&self) -> u64 {
        self.by_action.values().map(|c| c.gave_up).sum()
    }
}

#[derive(Debug, Clone)]
struct Attachment {
    node: usize,
    device_index: u32,
    /// The attach completes (and shows in metadata) at this instant.
    attached_at: Instant,
    /// Being detached: gone at this instant.
    detached_at: Option<Instant>,
}

#[derive(Debug, Clone)]
struct EniRecord {
    /// The node whose tag it carries.
    node: usize,
    mac: MacAddr,
    ipv4: Ipv4Net,
    attachment: Option<Attachment>,
}

impl EniRecord {
    /// Drops an attachment whose detach has completed.
    fn settle(&mut self, now: Instant) {
        if self
            .attachment
            .as_ref()
            .and_then(|a| a.detached_at)
            .is_some_and(|t| now >= t)
        {
            self.attachment = None;
        }
    }

    fn available(&self) -> bool {
        self.attachment.is_none()
    }

    /// Attached to `node` and shown in its metadata at `now`.
    fn in_metadata_of(&self, node: usize, now: Instant) -> bool {
        self.attachment
            .as_ref()
            .is_some_and(|a| a.node == node && now >= a.attached_at && a.detached_at.is_none())
    }

    fn eni(&self, id: &str) -> Eni {
        Eni {
            id: id.to_string(),
            mac: self.mac,
            ipv4: self.ipv4,
            gateway4: Ipv4Addr::from(u32::from(self.ipv4.network()) + 1),
            ipv6: None,
            gateway6: None,
            mtu: None,
            owner: None,
            device_index: None,
            secondary_ips: Vec::new(),
        }
    }
}

struct State {
    buckets: BTreeMap<Action, TokenBucket>,
    counts: Counts,
    rng: Rng,
    enis: BTreeMap<String, EniRecord>,
    /// The ids of the ENIs tagged for each node (the only node they ever
    /// attach to here), so a node's lookups do not walk the whole account.
    by_node: BTreeMap<usize, BTreeSet<String>>,
    next_eni: u32,
}

impl State {
    /// The ENIs tagged for `node`, settled at `now`.
    fn of_node(&mut self, node: usize, now: Instant) -> Vec<(String, EniRecord)> {
        let ids: Vec<String> = self
            .by_node
            .get(&node)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default();
        ids.into_iter()
            .filter_map(|id| {
                let e = self.enis.get_mut(&id)?;
                e.settle(now);
                Some((id, e.clone()))
            })
            .collect()
    }

    fn remove(&mut self, id: &str) {
        if let Some(e) = self.enis.remove(id) {
            if let Some(set) = self.by_node.get_mut(&e.node) {
                set.remove(id);
            }
        }
    }
}

/// One AWS account and Region: its throttling buckets and every ENI in it.
pub struct Account {
    pub params: CloudParams,
    start: Instant,
    state: Mutex<State>,
}

impl Account {
    /// Must be called inside the (paused-clock) runtime.
    pub fn new(params: CloudParams, seed: u64) -> Arc<Account> {
        Arc::new(Account {
            params,
            start: Instant::now(),
            state: Mutex::new(State {
                buckets: ACTIONS
                    .iter()
                    .map(|a| (*a, TokenBucket::new(a.limit())))
                    .collect(),
                counts: Counts::default(),
                rng: Rng::new(seed),
                enis: BTreeMap::new(),
                by_node: BTreeMap::new(),
                next_eni: 0,
            }),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // No critical section here can leave the state half-changed.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn counts(&self) -> Counts {
        self.state().counts.clone()
    }

    /// The backend of node `node` (its instance id is `i-sim<node>`).
    pub fn node(self: &Arc<Self>, node: usize) -> Arc<SimCloud> {
        Arc::new(SimCloud {
            account: self.clone(),
            node,
            instance: format!("i-sim{node:05}"),
            limit: Mutex::new(None),
            attach_lock: tokio::sync::Mutex::new(()),
        })
    }

    /// ENIs in the account (any state).
    #[cfg(test)]
    pub fn eni_count(&self) -> usize {
        self.state().enis.len()
    }

    /// The ids metadata of `node` shows now.
    pub fn attached_ids(&self, node: usize) -> Vec<String> {
        let now = Instant::now();
        self.state()
            .of_node(node, now)
            .into_iter()
            .filter_map(|(id, e)| e.in_metadata_of(node, now).then_some(id))
            .collect()
    }

    /// One EC2 call: a token at sending, the effect and the reply one round
    /// trip later, retried as the client does while throttled.
    async fn call<T>(
        &self,
        action: Action,
        mut effect: impl FnMut(&mut State, Instant) -> Result<T, ProviderError>,
    ) -> Result<T, ProviderError> {
        let policy = &self.params.retry;
        let mut delays = policy.backoff().delays();
        let mut attempt = 1;
        loop {
            let granted = {
                let mut st = self.state();
                let since = Instant::now() - self.start;
                st.buckets
                    .get_mut(&action)
                    .is_some_and(|b| b.try_take(since))
            };
            tokio::time::sleep(self.params.api_rtt).await;
            let gave_up = {
                let mut st = self.state();
                if granted {
                    let result = effect(&mut st, Instant::now());
                    let c = st.counts.by_action.entry(action).or_default();
                    match result {
                        Ok(_) => c.ok += 1,
                        Err(_) => c.failed += 1,
                    }
                    return result;
                }
                let c = st.counts.by_action.entry(action).or_default();
                c.throttled += 1;
                if attempt >= policy.attempts {
                    c.gave_up += 1;
                }
                attempt >= policy.attempts
            };
            if gave_up {
                return Err(ProviderError::Throttled(format!(
                    "EC2 {}: throttled (RequestLimitExceeded) after {attempt} attempts",
                    action.api()
                )));
            }
            tokio::time::sleep(delays.next_delay()).await;
            attempt += 1;
        }
    }

    /// One metadata read (never throttled).
    async fn imds<T>(&self, read: impl FnOnce(&mut State, Instant) -> T) -> T {
        tokio::time::sleep(self.params.imds_rtt).await;
        let mut st = self.state();
        st.counts.imds_reads += 1;
        read(&mut st, Instant::now())
    }
}

/// The [`CloudBackend`] of one simulated node.
pub struct SimCloud {
    account: Arc<Account>,
    node: usize,
    instance: String,
    /// DescribeInstanceTypes' answer, once it succeeded.
    limit: Mutex<Option<usize>>,
    /// Device-index choice and attach, one at a time (as the AWS backend).
    attach_lock: tokio::sync::Mutex<()>,
}

fn unavailable(what: String) -> ProviderError {
    ProviderError::Unavailable(what)
}

impl SimCloud {
    async fn limit(&self) -> Result<usize, ProviderError> {
        let known = *self.limit.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(l) = known {
            return Ok(l);
        }
        let limit = self.account.params.eni_limit;
        self.account
            .call(Action::DescribeInstanceTypes, |_, _| Ok(limit))
            .await?;
        *self.limit.lock().unwrap_or_else(|p| p.into_inner()) = Some(limit);
        Ok(limit)
    }

    /// Interfaces on this instance (the primary included) and the lowest
    /// free device index, from DescribeNetworkInterfaces (filtered).
    async fn device_slots(&self) -> Result<(usize, u32), ProviderError> {
        let node = self.node;
        self.account
            .call(Action::DescribeNetworkInterfacesFiltered, |st, now| {
                let mut used = vec![0u32];
                for (_, e) in st.of_node(node, now) {
                    if let Some(a) = e.attachment.as_ref().filter(|a| a.node == node) {
                        used.push(a.device_index);
                    }
                }
                let free = (1..).find(|i| !used.contains(i)).unwrap_or(u32::MAX);
                Ok((used.len(), free))
            })
            .await
    }

    /// DescribeNetworkInterfaces by id: `Some(available)` when it exists.
    async fn describe(&self, id: &str) -> Result<Option<bool>, ProviderError> {
        self.account
            .call(Action::DescribeNetworkInterfacesById, |st, now| {
                Ok(st.enis.get_mut(id).map(|e| {
                    e.settle(now);
                    e.available()
                }))
            })
            .await
    }

    fn no_slot(&self, attached: usize, limit: usize) -> ProviderError {
        unavailable(format!(
            "instance {} already has {attached} interfaces on card 0, its limit is {limit}",
            self.instance
        ))
    }

    async fn attach(&self, id: &str) -> Result<(), ProviderError> {
        {
            let _one_at_a_time = self.attach_lock.lock().await;
            let (attached, index) = self.device_slots().await?;
            let limit = self.limit().await?;
            if attached >= limit {
                return Err(self.no_slot(attached, limit));
            }
            let (node, (lo, hi)) = (self.node, self.account.params.attach);
            let result = self
                .account
                .call(Action::AttachNetworkInterface, |st, now| {
                    let took = st.rng.between(lo, hi);
                    let e = st
                        .enis
                        .get_mut(id)
                        .ok_or_else(|| ProviderError::UnknownEni(id.into()))?;
                    e.settle(now);
                    if e.attachment.is_some() {
                        return Err(unavailable(format!("ENI {id} is not available")));
                    }
                    e.attachment = Some(Attachment {
                        node,
                        device_index: index,
                        attached_at: now + took,
                        detached_at: None,
                    });
                    Ok(())
                })
                .await;
            if let Err(e) = result {
                // The backend looks before reporting failure: a retried
                // attach may have gone through.
                let _ = self.describe(id).await;
                return Err(e);
            }
        }
        // DeleteOnTermination; the backend only logs a failure.
        let _ = self
            .account
            .call(Action::ModifyNetworkInterfaceAttribute, |st, _| {
                if st.enis.contains_key(id) {
                    Ok(())
                } else {
                    Err(ProviderError::UnknownEni(id.into()))
                }
            })
            .await;
        Ok(())
    }

    async fn await_metadata(&self, id: &str) -> Result<Eni, ProviderError> {
        let mut poll = Poll::within(&SETTLE_BACKOFF, self.account.params.metadata_wait);
        let node = self.node;
        loop {
            let shown = self
                .account
                .imds(|st, now| {
                    st.enis.get_mut(id).and_then(|e| {
                        e.settle(now);
                        e.in_metadata_of(node, now).then(|| e.eni(id))
                    })
                })
                .await;
            if let Some(eni) = shown {
                return Ok(eni);
            }
            if !poll.wait().await {
                return Err(unavailable(format!(
                    "ENI {id} attached: not in instance metadata after {:?}",
                    poll.elapsed()
                )));
            }
        }
    }

    async fn delete_quietly(&self, id: &str) {
        // Tagged, so the pool finds and deletes it later if this fails.
        let _ = self.do_detach_and_delete(id).await;
    }

    async fn do_detach_and_delete(&self, id: &str) -> Result<(), ProviderError> {
        // ours(): the ENI as EC2 has it now.
        let node = self.node;
        let found = self
            .account
            .call(Action::DescribeNetworkInterfacesById, |st, now| {
                Ok(st.enis.get_mut(id).map(|e| {
                    e.settle(now);
                    (
                        e.node,
                        e.attachment
                            .as_ref()
                            .map(|a| (a.node, a.detached_at.is_some())),
                    )
                }))
            })
            .await?;
        let Some((owner, attachment)) = found else {
            return Ok(());
        };
        if owner != node {
            return Err(ProviderError::Config(format!(
                "ENI {id} was not created for {}",
                self.instance
            )));
        }
        let mut available = attachment.is_none();
        if let Some((on, detaching)) = attachment {
            if on != node {
                return Err(ProviderError::Config(format!(
                    "ENI {id} is attached to another instance"
                )));
            }
            if !detaching {
                let (lo, hi) = self.account.params.detach;
                self.account
                    .call(Action::DetachNetworkInterface, |st, now| {
                        let took = st.rng.between(lo, hi);
                        if let Some(a) = st.enis.get_mut(id).and_then(|e| e.attachment.as_mut()) {
                            a.detached_at.get_or_insert(now + took);
                        }
                        Ok(())
                    })
                    .await?;
            }
            // Poll until available or gone.
            let mut poll = Poll::within(&DETACH_BACKOFF, self.account.params.detach_timeout);
            loop {
                match self.describe(id).await? {
                    None => return Ok(()),
                    Some(true) => {
                        available = true;
                        break;
                    }
                    Some(false) => {}
                }
                if !poll.wait().await {
                    return Err(unavailable(format!(
                        "ENI {id} still in-use after {:?}",
                        poll.elapsed()
                    )));
                }
            }
        }
        debug_assert!(available);
        self.account
            .call(Action::DeleteNetworkInterface, |st, now| {
                match st.enis.get_mut(id) {
                    // Already gone: the backend treats not-found as done.
                    None => Ok(()),
                    Some(e) => {
                        e.settle(now);
                        if e.available() {
                            st.remove(id);
                            Ok(())
                        } else {
                            Err(unavailable(format!("ENI {id} is in use")))
                        }
                    }
                }
            })
            .await
    }
}

#[async_trait]
impl CloudBackend for SimCloud {
    fn name(&self) -> &str {
        "sim-aws"
    }

    async fn attached(&self) -> Result<Vec<Eni>, ProviderError> {
        let node = self.node;
        Ok(self
            .account
            .imds(|st, now| {
                st.of_node(node, now)
                    .into_iter()
                    .filter_map(|(id, e)| e.in_metadata_of(node, now).then(|| e.eni(&id)))
                    .collect()
            })
            .await)
    }

    async fn tagged(&self) -> Result<Vec<TaggedEni>, ProviderError> {
        let node = self.node;
        self.account
            .call(Action::DescribeNetworkInterfacesFiltered, |st, now| {
                Ok(st
                    .of_node(node, now)
                    .into_iter()
                    .map(|(id, e)| TaggedEni {
                        attached: e.attachment.as_ref().is_some_and(|a| a.node == node),
                        id,
                    })
                    .collect())
            })
            .await
    }

    async fn eni_limit(&self) -> Result<usize, ProviderError> {
        self.limit().await
    }

    async fn create_and_attach(&self) -> Result<Eni, ProviderError> {
        let limit = self.limit().await?;
        let (attached, _) = self.device_slots().await?;
        if attached >= limit {
            return Err(self.no_slot(attached, limit));
        }
        let node = self.node;
        let id = self
            .account
            .call(Action::CreateNetworkInterface, |st, _| {
                st.next_eni += 1;
                let n = st.next_eni;
                let id = format!("eni-{n:08x}");
                let [_, a, b, c] = n.to_be_bytes();
                let mac = MacAddr([0x02, 0x5e, 0x00, a, b, c]);
                // Counted up in 10.0.0.0/8 from .2 (the gateway is .1).
                let host = 0x0a00_0000 | (n.wrapping_add(1) & 0x00ff_ffff);
                let ipv4 = Ipv4Net::new(Ipv4Addr::from(host), 8)
                    .map_err(|e| ProviderError::Config(e.to_string()))?;
                st.by_node.entry(node).or_default().insert(id.clone());
                st.enis.insert(
                    id.clone(),
                    EniRecord {
                        node,
                        mac,
                        ipv4,
                        attachment: None,
                    },
                );
                Ok(id)
            })
            .await?;
        if let Err(e) = self.attach(&id).await {
            self.delete_quietly(&id).await;
            return Err(e);
        }
        match self.await_metadata(&id).await {
            Ok(eni) => Ok(eni),
            Err(e) => {
                self.delete_quietly(&id).await;
                Err(e)
            }
        }
    }

    async fn attach_existing(&self, eni_id: &str) -> Result<Eni, ProviderError> {
        match self.describe(eni_id).await? {
            None => return Err(ProviderError::UnknownEni(eni_id.into())),
            Some(true) => self.attach(eni_id).await?,
            Some(false) => {}
        }
        self.await_metadata(eni_id).await
    }

    async fn detach_and_delete(&self, eni_id: &str) -> Result<(), ProviderError> {
        self.do_detach_and_delete(eni_id).await
    }

    // The burst and fleet scenarios are primary mode's: whole ENIs.
    async fn address_limits(&self) -> Result<AddressLimits, ProviderError> {
        Err(primary_only())
    }

    async fn assign_addresses(
        &self,
        _eni_id: &str,
        _ipv4: usize,
        _ipv6: usize,
    ) -> Result<Vec<IpAddr>, ProviderError> {
        Err(primary_only())
    }

    async fn unassign_addresses(
        &self,
        _eni_id: &str,
        _ips: &[IpAddr],
    ) -> Result<(), ProviderError> {
        Err(primary_only())
    }
}

fn primary_only() -> ProviderError {
    ProviderError::Config("the simulated cloud serves primary mode only".into())
}

/// A current-thread runtime on a paused clock: simulated time passes only
/// when every task waits, and costs no wall time. Seeds the thread-local
/// generator the pool's jitter draws from, so a run repeats from its seed.
pub fn paused_runtime(seed: u64) -> std::io::Result<tokio::runtime::Runtime> {
    fastrand::seed(seed);
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt() -> tokio::runtime::Runtime {
        paused_runtime(1).unwrap()
    }

    #[test]
    fn create_attach_detach_delete_make_the_aws_backends_calls() {
        rt().block_on(async {
            let account = Account::new(CloudParams::default(), 3);
            let node = account.node(0);
            assert_eq!(node.eni_limit().await.unwrap(), 15);
            assert_eq!(node.eni_limit().await.unwrap(), 15, "cached");
            let t = Instant::now();
            let eni = node.create_and_attach().await.unwrap();
            let took = t.elapsed();
            assert!(
                took >= Duration::from_secs(8) && took < Duration::from_secs(14),
                "{took:?}"
            );
            assert_eq!(node.attached().await.unwrap(), vec![eni.clone()]);
            assert_eq!(
                node.tagged().await.unwrap(),
                vec![TaggedEni {
                    id: eni.id.clone(),
                    attached: true
                }]
            );
            let c = account.counts();
            let n = |a| c.get(a).ok;
            assert_eq!(n(Action::DescribeInstanceTypes), 1);
            // Two slot checks and the tagged() list.
            assert_eq!(n(Action::DescribeNetworkInterfacesFiltered), 3);
            assert_eq!(n(Action::CreateNetworkInterface), 1);
            assert_eq!(n(Action::AttachNetworkInterface), 1);
            assert_eq!(n(Action::ModifyNetworkInterfaceAttribute), 1);
            assert_eq!(c.throttled(), 0);
            assert!(c.imds_reads >= 2);

            let t = Instant::now();
            node.detach_and_delete(&eni.id).await.unwrap();
            let took = t.elapsed();
            assert!(
                took >= Duration::from_secs(2) && took < Duration::from_secs(6),
                "{took:?}"
            );
            let c = account.counts();
            assert_eq!(c.get(Action::DetachNetworkInterface).ok, 1);
            assert_eq!(c.get(Action::DeleteNetworkInterface).ok, 1);
            // The lookup, then polls until available.
            assert!(c.get(Action::DescribeNetworkInterfacesById).ok >= 2);
            assert!(node.attached().await.unwrap().is_empty());
            assert_eq!(account.eni_count(), 0);
            // Deleting what is gone is done.
            node.detach_and_delete(&eni.id).await.unwrap();
        });
    }

    #[test]
    fn the_limit_counts_the_primary() {
        rt().block_on(async {
            let params = CloudParams {
                eni_limit: 3,
                ..CloudParams::default()
            };
            let account = Account::new(params, 1);
            let node = account.node(0);
            node.create_and_attach().await.unwrap();
            node.create_and_attach().await.unwrap();
            let e = node.create_and_attach().await.unwrap_err();
            assert!(e.is_transient(), "{e}");
            assert_eq!(account.attached_ids(0).len(), 2);
            // Refused before creating anything.
            assert_eq!(account.counts().get(Action::CreateNetworkInterface).ok, 2);
        });
    }

    #[test]
    fn an_empty_bucket_throttles_and_the_client_retries_then_gives_up() {
        rt().block_on(async {
            let account = Account::new(CloudParams::default(), 1);
            // 200 describes at once against 100 tokens + 20/s: the first 100
            // pass, the rest are throttled and retried with backoff.
            let nodes: Vec<_> = (0..200).map(|i| account.node(i)).collect();
            let tasks: Vec<_> = nodes
                .iter()
                .map(|n| {
                    let n = n.clone();
                    tokio::spawn(async move { n.tagged().await })
                })
                .collect();
            let mut ok = 0;
            let mut throttled = 0;
            for t in tasks {
                match t.await.unwrap() {
                    Ok(_) => ok += 1,
                    Err(e @ ProviderError::Throttled(_)) => {
                        assert!(e.is_transient());
                        throttled += 1;
                    }
                    Err(e) => panic!("{e}"),
                }
            }
            let c = account
                .counts()
                .get(Action::DescribeNetworkInterfacesFiltered);
            assert_eq!(ok + throttled, 200);
            assert_eq!(c.ok, ok);
            assert_eq!(c.gave_up, throttled);
            assert!(c.throttled >= 100, "{c:?}");
            // Four retries wait 1.5–3 s in all: 20–60 refilled tokens
            // (20/s) let some more through; the rest give up throttled.
            assert!((120..=170).contains(&ok), "{c:?}");
            assert!(throttled > 0, "{c:?}");
            // Other buckets are untouched.
            assert_eq!(
                account.counts().get(Action::DescribeInstanceTypes),
                Count::default()
            );
        });
    }

    #[test]
    fn same_seed_same_run() {
        let run = || {
            rt().block_on(async {
                let account = Account::new(CloudParams::default(), 9);
                let node = account.node(0);
                let mut times = Vec::new();
                for _ in 0..3 {
                    let t = Instant::now();
                    node.create_and_attach().await.unwrap();
                    times.push(t.elapsed());
                }
                (times, account.counts())
            })
        };
        assert_eq!(run(), run());
    }
}
