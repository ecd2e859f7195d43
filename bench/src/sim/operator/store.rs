//! The API server and the nodes' agents, in memory: NetResourceSets (spec
//! by the operator through [`Store`], status by the agents), and agents
//! that hand spec ENIs to pods and answer the drain handshake.
//!
//! An agent hands out an ENI of its spec that is not draining, not held,
//! and whose device shows on the node (the attach has completed). It lists
//! in `status.released` every draining ENI no pod holds, at once (its watch
//! is milliseconds). Every status change wakes the operator, as its watch
//! of NetResourceSets would.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use enim_crd::{EniUse, NetResourceSetSpec, NetResourceSetStatus};
use enim_operator::index::{NodeInfo, SetInfo};
use enim_operator::store::{Store, StoreError};
use tokio::sync::Notify;

use crate::sim::cloud::{instance_id, Account};

#[derive(Default)]
struct State {
    nodes: BTreeMap<String, (usize, NodeInfo)>,
    sets: BTreeMap<String, SetInfo>,
}

pub struct SimStore {
    account: Arc<Account>,
    state: Mutex<State>,
    /// The operator's watch: a node or a status changed.
    pub changed: Notify,
    pub spec_writes: AtomicU64,
}

pub fn node_name(i: usize) -> String {
    format!("node{i:05}")
}

impl SimStore {
    pub fn new(account: Arc<Account>) -> SimStore {
        SimStore {
            account,
            state: Mutex::default(),
            changed: Notify::new(),
            spec_writes: AtomicU64::new(0),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Node `i` registers (its kubelet starts).
    pub fn add_node(&self, i: usize) {
        let name = node_name(i);
        let info = NodeInfo {
            name: name.clone(),
            uid: format!("uid-{i}"),
            provider_id: format!("aws:///us-east-1a/{}", instance_id(i)),
            instance_type: "m5.large".into(),
            zone: "us-east-1a".into(),
            labels: Default::default(),
        };
        self.state().nodes.insert(name, (i, info));
        self.changed.notify_one();
    }

    /// The runtime's caches: every Node and every set.
    pub fn snapshot(&self) -> (Vec<NodeInfo>, Vec<SetInfo>) {
        let st = self.state();
        (
            st.nodes.values().map(|(_, n)| n.clone()).collect(),
            st.sets.values().cloned().collect(),
        )
    }

    /// ENIs node `name`'s agent could hand out now.
    pub fn free(&self, name: &str) -> usize {
        let st = self.state();
        self.free_ids(&st, name).len()
    }

    fn free_ids(&self, st: &State, name: &str) -> Vec<String> {
        let (Some((i, _)), Some(set)) = (st.nodes.get(name), st.sets.get(name)) else {
            return Vec::new();
        };
        let present = self.account.attached_ids(*i);
        let used = set.status.as_ref().map(|s| &s.used[..]).unwrap_or(&[]);
        set.spec
            .enis
            .iter()
            .filter(|e| !set.spec.draining.contains(&e.id))
            .filter(|e| !used.iter().any(|u| u.eni == e.id))
            .filter(|e| present.contains(&e.id))
            .map(|e| e.id.clone())
            .collect()
    }

    /// A pod's ADD on node `name`: a free ENI, now held by `pod`.
    pub fn take(&self, name: &str, pod: &str) -> Option<String> {
        let mut st = self.state();
        let eni = self.free_ids(&st, name).into_iter().next()?;
        let set = st.sets.get_mut(name)?;
        let status = set.status.get_or_insert_with(Default::default);
        status.used.push(EniUse {
            eni: eni.clone(),
            pod_namespace: "sim".into(),
            pod_name: pod.into(),
            container_id: pod.into(),
            ifname: "eth0".into(),
            ..Default::default()
        });
        drop(st);
        self.changed.notify_one();
        Some(eni)
    }

    /// A pod's DEL: false when its ENI was no longer the node's (taken
    /// away while held: a pod-visible failure).
    pub fn give_back(&self, name: &str, pod: &str, eni: &str) -> bool {
        let mut st = self.state();
        let Some(i) = st.nodes.get(name).map(|(i, _)| *i) else {
            return false;
        };
        let still_here = self.account.attached_ids(i).iter().any(|id| id == eni);
        if let Some(set) = st.sets.get_mut(name) {
            let in_spec = set.spec.enis.iter().any(|e| e.id == eni);
            if let Some(status) = set.status.as_mut() {
                status.used.retain(|u| u.container_id != pod);
                answer_drains(&set.spec, status);
            }
            drop(st);
            self.changed.notify_one();
            return still_here && in_spec;
        }
        false
    }
}

/// The agent's side of the handshake: every draining ENI no pod holds is
/// released (and never handed out again).
fn answer_drains(spec: &NetResourceSetSpec, status: &mut NetResourceSetStatus) -> bool {
    let released: Vec<String> = spec
        .draining
        .iter()
        .filter(|d| !status.used.iter().any(|u| &u.eni == *d))
        .cloned()
        .collect();
    let changed = released != status.released;
    status.released = released;
    changed
}

#[async_trait]
impl Store for SimStore {
    async fn apply_spec(
        &self,
        node: &NodeInfo,
        spec: &NetResourceSetSpec,
    ) -> Result<(), StoreError> {
        self.spec_writes.fetch_add(1, Ordering::Relaxed);
        let mut st = self.state();
        let set = st.sets.entry(node.name.clone()).or_insert_with(|| SetInfo {
            name: node.name.clone(),
            spec: spec.clone(),
            status: Some(NetResourceSetStatus::default()),
            deleting_since: None,
            uninstall: Default::default(),
        });
        set.spec = spec.clone();
        let status = set.status.get_or_insert_with(Default::default);
        let changed = answer_drains(&set.spec, status);
        drop(st);
        if changed {
            self.changed.notify_one();
        }
        Ok(())
    }

    async fn release_set(&self, name: &str) -> Result<(), StoreError> {
        self.state().sets.remove(name);
        Ok(())
    }

    fn is_leader(&self) -> bool {
        true
    }
}
