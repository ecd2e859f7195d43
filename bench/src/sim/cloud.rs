//! [`SimCloud`]: a [`CloudBackend`] for one simulated node, behaving as
//! AWS documents, over an [`Account`] every node of a fleet shares.
//!
//! Each backend method makes the same EC2 calls, in the same order, as
//! enim's AWS backend (`provider/aws/src/node.rs`):
//! - `eni_limit`: DescribeInstanceTypes, once per node (cached on success);
//! - `attached`: instance metadata (IMDS), not an EC2 call, never throttled;
//! - `tagged`: DescribeNetworkInterfaces with tag filters;
//! - `create_and_attach`: an ENI kept from a throttled attach if there is
//!   one, else IMDS (the interfaces shown, to refuse early) and
//!   CreateNetworkInterface; then under the node's attach
//!   lock DescribeNetworkInterfaces (filtered) again and
//!   AttachNetworkInterface (after a failed attach, a DescribeNetworkInterfaces
//!   by id to see whether it went through), then
//!   ModifyNetworkInterfaceAttribute (DeleteOnTermination; a failure is only
//!   logged), then IMDS polls until the interface shows (50 ms doubling to
//!   1 s, jittered, up to `metadata_wait`); an attach throttled past the
//!   client's retries keeps the ENI for the next create, any other failed
//!   attach or metadata wait deletes it again;
//! - `detach_and_delete`: DescribeNetworkInterfaces by id, DetachNetworkInterface,
//!   DescribeNetworkInterfaces by id polled (the backend's `DETACH_BACKOFF`,
//!   jittered, up to `detach_timeout`) until `available`, then
//!   DeleteNetworkInterface.
//!
//! A node's calls are paced by its throttle replies, per action, as the
//! agent's EC2 client paces them ([`enim_core::pacing`], `AGENT_PACING`);
//! the operator's are not.
//!
//! Every EC2 call goes through the client's retry as the real one does
//! (`provider/aws/src/client/query.rs`): a throttled reply is retried after
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
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use enim_core::pacing::Pacing;
use enim_core::{Eni, MacAddr, ProviderError};
use enim_provider_aws::client::RetryPolicy;
use enim_provider_aws::AwsConfig;
use ipnet::Ipv4Net;
use tokio::time::Instant;

use super::bucket::{Action, TokenBucket, ACTIONS};
use super::rng::Rng;

mod fleet_cloud;
mod node;
#[cfg(test)]
mod tests;

pub use fleet_cloud::{instance_id, SimFleet};
pub use node::SimCloud;

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
            retry: aws.api.retry_policy(),
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
    /// The operator's client token (`enim.io/intent`), when it made it.
    intent: Option<String>,
    created: Instant,
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
            placement: Default::default(),
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

    /// A new ENI tagged for `node` (and the operator's `intent`), not
    /// attached: ids, MACs and addresses counted up (10.0.0.0/8 from .2;
    /// the gateway is .1).
    fn new_eni(
        &mut self,
        node: usize,
        intent: Option<String>,
        now: Instant,
    ) -> Result<String, ProviderError> {
        self.next_eni += 1;
        let n = self.next_eni;
        let id = format!("eni-{n:08x}");
        let [_, a, b, c] = n.to_be_bytes();
        let mac = MacAddr([0x02, 0x5e, 0x00, a, b, c]);
        let host = 0x0a00_0000 | (n.wrapping_add(1) & 0x00ff_ffff);
        let ipv4 = Ipv4Net::new(Ipv4Addr::from(host), 8)
            .map_err(|e| ProviderError::Config(e.to_string()))?;
        self.by_node.entry(node).or_default().insert(id.clone());
        self.enis.insert(
            id.clone(),
            EniRecord {
                node,
                mac,
                ipv4,
                attachment: None,
                intent,
                created: now,
            },
        );
        Ok(id)
    }

    /// An AttachNetworkInterface's effect: `id` attaches to `node` at
    /// `index`, showing a time drawn from `took` later.
    fn start_attach(
        &mut self,
        id: &str,
        node: usize,
        index: u32,
        now: Instant,
        took: (Duration, Duration),
    ) -> Result<(), ProviderError> {
        let took = self.rng.between(took.0, took.1);
        let e = self
            .enis
            .get_mut(id)
            .ok_or_else(|| ProviderError::UnknownEni(id.into()))?;
        e.settle(now);
        if e.attachment.is_some() {
            return Err(ProviderError::Unavailable(format!(
                "ENI {id} is not available"
            )));
        }
        e.attachment = Some(Attachment {
            node,
            device_index: index,
            attached_at: now + took,
            detached_at: None,
        });
        Ok(())
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

    /// The wall clock of the simulation at `t`: a fixed epoch plus the
    /// simulated time since the account's start.
    pub fn wall(&self, t: Instant) -> std::time::SystemTime {
        std::time::UNIX_EPOCH + Duration::from_secs(1_800_000_000) + (t - self.start)
    }

    /// The backend of node `node` (its instance id is `i-sim<node>`).
    pub fn node(self: &Arc<Self>, node: usize) -> Arc<SimCloud> {
        Arc::new(SimCloud::new(self.clone(), node))
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
        effect: impl FnMut(&mut State, Instant) -> Result<T, ProviderError>,
    ) -> Result<T, ProviderError> {
        self.call_paced(action, None, effect).await
    }

    /// As [`Self::call`], each attempt first waiting for its slot in the
    /// caller's `pacing` (by the action's API name, as the client keys it),
    /// which each reply adjusts as the client's does.
    async fn call_paced<T>(
        &self,
        action: Action,
        pacing: Option<&Pacing>,
        mut effect: impl FnMut(&mut State, Instant) -> Result<T, ProviderError>,
    ) -> Result<T, ProviderError> {
        let policy = &self.params.retry;
        let mut delays = policy.backoff().delays();
        let mut attempt = 1;
        loop {
            if let Some(p) = pacing {
                p.wait(action.api()).await;
            }
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
                if let Some(p) = pacing {
                    if granted {
                        p.answered(action.api());
                    } else {
                        p.throttled(action.api());
                    }
                }
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
