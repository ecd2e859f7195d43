//! Pods as a runtime drives them: CNI ADD (here `allocate_next` on the
//! pool: the kernel plumbing takes milliseconds and is not modelled) and,
//! on "try again later", the kubelet's retry.
//!
//! A failed ADD fails the pod's sandbox; the kubelet's pod worker requeues
//! a failed sync after `wait.Jitter(backOffPeriod, 0.5)`, with
//! `backOffPeriod = 10 s` (kubernetes `pkg/kubelet/kubelet.go`,
//! `pkg/kubelet/pod_workers.go` `workerBackOffPeriodJitterFactor = 0.5`):
//! uniform in [10 s, 15 s). That is [`Retry::Kubelet`]. A fixed short delay
//! is offered as a what-if, to show how much of the wait is the
//! kubelet's.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use enim_core::{EniOwner, PodRef, ProviderError};
use enim_provider::EniProvider;
use enim_provider_pool::WarmPool;
use tokio::time::Instant;

use super::rng::Rng;

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Retry {
    /// The kubelet's pod worker: uniform in [10 s, 15 s).
    Kubelet,
    /// A fixed delay (what-if).
    Fixed(Duration),
}

impl Retry {
    pub fn delay(self, rng: &mut Rng) -> Duration {
        match self {
            Retry::Kubelet => rng.between(Duration::from_secs(10), Duration::from_secs(15)),
            Retry::Fixed(d) => d,
        }
    }

    pub fn describe(self) -> String {
        match self {
            Retry::Kubelet => "kubelet pod-worker backoff, uniform 10–15 s".into(),
            Retry::Fixed(d) => format!("fixed {} s (what-if)", d.as_secs_f64()),
        }
    }
}

/// Which pod holds which ENI, across a whole fleet; catches an ENI handed
/// to two pods at once.
#[derive(Default)]
pub struct Ledger {
    state: Mutex<LedgerState>,
}

#[derive(Default)]
struct LedgerState {
    holders: BTreeMap<String, String>,
    doubles: Vec<String>,
}

impl Ledger {
    fn lock(&self) -> std::sync::MutexGuard<'_, LedgerState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn take(&self, eni: &str, pod: &str) {
        let mut st = self.lock();
        if let Some(other) = st.holders.insert(eni.into(), pod.into()) {
            if other != pod {
                st.doubles
                    .push(format!("{eni} handed to {pod} while {other} held it"));
            }
        }
    }

    pub fn give_back(&self, eni: &str) {
        self.lock().holders.remove(eni);
    }

    /// Every time an ENI went to a second pod.
    pub fn doubles(&self) -> Vec<String> {
        self.lock().doubles.clone()
    }

    pub fn held(&self) -> usize {
        self.lock().holders.len()
    }
}

/// How one pod's ADD went.
#[derive(Debug, Clone, Default)]
pub struct PodResult {
    /// Arrival → successful allocation; `None` if it gave up.
    pub ready: Option<Duration>,
    pub eni: Option<String>,
    /// ADD attempts.
    pub tries: u32,
    /// Answers the runtime would see as "try again later" (CNI 11): the
    /// pool empty, or a transient provider error.
    pub try_again: u32,
    /// Any other error (a pod-visible failure that is not 11).
    pub other_errors: u32,
}

pub fn owner(pod: &str) -> EniOwner {
    EniOwner {
        network: "sim".into(),
        container_id: pod.into(),
        ifname: "eth0".into(),
        pod: PodRef {
            namespace: "sim".into(),
            name: pod.into(),
            uid: None,
        },
    }
}

/// ADD for `pod` until it succeeds, retrying as `retry` says, for at most
/// `give_up`.
pub async fn add(
    pool: &WarmPool,
    ledger: &Ledger,
    pod: &str,
    retry: Retry,
    rng: &mut Rng,
    give_up: Duration,
) -> PodResult {
    let start = Instant::now();
    let who = owner(pod);
    let mut r = PodResult::default();
    loop {
        r.tries += 1;
        // As enimd's ADD does before it allocates (src/engine/mod.rs).
        pool.wait_for_free(&who).await;
        match pool.allocate_next(&who).await {
            Ok(eni) => {
                ledger.take(&eni.id, pod);
                r.ready = Some(start.elapsed());
                r.eni = Some(eni.id);
                return r;
            }
            // The agent answers both as CNI code 11 (src/daemon/server.rs).
            Err(e) if e.is_transient() || matches!(e, ProviderError::Exhausted { .. }) => {
                r.try_again += 1
            }
            Err(_) => r.other_errors += 1,
        }
        if start.elapsed() >= give_up {
            return r;
        }
        tokio::time::sleep(retry.delay(rng)).await;
    }
}

/// DEL: the pod's ENI goes back to the pool.
pub async fn del(pool: &WarmPool, ledger: &Ledger, pod: &str, eni: &str) -> u32 {
    ledger.give_back(eni);
    match pool.release(&owner(pod)).await {
        Ok(()) => 0,
        Err(_) => 1,
    }
}
