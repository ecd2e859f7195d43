//! Test helpers for providers (feature `testing`): the checks every
//! [`EniProvider`] must pass, written once. The helpers that need no
//! provider are `enim_core::testing`'s (re-exported here for the old
//! paths).

use std::collections::HashSet;
use std::sync::Arc;

use enim_core::{EniOwner, ProviderError};

use crate::EniProvider;

pub use enim_core::testing::*;

/// The owner of attachment (`net`, `container_id`, `eth0`).
pub fn owner(container_id: &str) -> EniOwner {
    EniOwner {
        network: "net".into(),
        container_id: container_id.into(),
        ifname: "eth0".into(),
        pod: Default::default(),
    }
}

/// `n` owners (`c0`, `c1`, ...) ask `provider` for an ENI all at once.
/// Returns the ids handed out and, for each owner turned away as
/// [`ProviderError::Exhausted`], the total it reported. Panics when an ENI
/// is handed out twice or on any other error.
pub async fn allocate_concurrently<P>(provider: &Arc<P>, n: usize) -> (HashSet<String>, Vec<usize>)
where
    P: EniProvider + ?Sized + 'static,
{
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    let mut tasks = Vec::new();
    for i in 0..n {
        let (provider, barrier) = (provider.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            provider.allocate_next(&owner(&format!("c{i}"))).await
        }));
    }
    let mut ids = HashSet::new();
    let mut exhausted = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            Ok(e) => assert!(ids.insert(e.id), "ENI handed out twice"),
            Err(ProviderError::Exhausted { total }) => exhausted.push(total),
            Err(e) => panic!("{e}"),
        }
    }
    (ids, exhausted)
}

/// The ids of the ENIs `provider` lists, sorted.
pub async fn listed_ids<P: EniProvider + ?Sized>(provider: &P) -> Vec<String> {
    let mut ids: Vec<String> = provider
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.id)
        .collect();
    ids.sort();
    ids
}
