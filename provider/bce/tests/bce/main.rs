//! The BCE backend and its warm pool against the loopback fake in
//! `enim_testkit::bce` (signature-checking ENI OpenAPI plus instance metadata).

mod api;
mod fleet;
mod pool;
mod reaper;
mod secondary;
mod security_groups;

use std::sync::Arc;
use std::time::Duration;

use enim_core::ratelimit::RateLimit;
use enim_core::{EniOwner, PodRef};
use enim_provider_bce::client::ApiClient;
use enim_provider_bce::{ApiConfig, BceConfig, Credentials, RetryPolicy};
use enim_provider_pool::{PoolConfig, PoolRole, PoolStats, WarmPool};
use enim_testkit::bce as rig;
use rig::{FakeCloud, AK, SK};

fn config(cloud: &FakeCloud) -> BceConfig {
    BceConfig {
        metadata_endpoint: cloud.meta_url.clone(),
        security_group_ids: vec!["g-enim".into()],
        access_key_id: Some(AK.into()),
        secret_access_key: Some(SK.into()),
        poll_interval: Duration::from_millis(5),
        operation_timeout: Duration::from_secs(5),
        // Small pages force every listing through several calls.
        list_page_size: 2,
        api: fast_api(cloud),
        pool: PoolConfig {
            pre_allocate: 2,
            max_above_watermark: 1,
            initial_retry: Duration::from_millis(10),
            max_backoff: Duration::from_millis(100),
            resync_interval: Duration::from_millis(50),
            ..PoolConfig::default()
        },
        ..BceConfig::default()
    }
}

/// A client-side rate no test notices.
const FAST: RateLimit = RateLimit::new(Duration::from_micros(10), 1_000_000);

/// The fake's API with short retries; the buckets out of the way (the
/// bucket test sets its own).
fn fast_api(cloud: &FakeCloud) -> ApiConfig {
    ApiConfig {
        endpoint: Some(cloud.api_url.clone()),
        max_attempts: 4,
        backoff: Duration::from_millis(2),
        max_backoff: Duration::from_millis(10),
        mutating_rate: FAST,
        read_rate: FAST,
    }
}

fn owner(n: u32) -> EniOwner {
    EniOwner {
        network: "net".into(),
        container_id: format!("c{n}"),
        ifname: "eth0".into(),
        pod: PodRef::default(),
    }
}

async fn wait_for(pool: &WarmPool, what: &str, pred: impl Fn(&PoolStats) -> bool) -> PoolStats {
    let mut rx = pool.subscribe();
    let found = tokio::time::timeout(Duration::from_secs(10), async {
        rx.wait_for(|s| pred(s)).await.map(|s| *s)
    })
    .await;
    match found {
        Ok(Ok(s)) => s,
        _ => panic!("timed out waiting for {what}; stats {:?}", pool.stats()),
    }
}

/// The pool of pod ENIs over `cfg`, started.
async fn pod_pool(cfg: &BceConfig) -> Arc<WarmPool> {
    enim_provider_bce::start_pool(cfg, PoolRole::PodEnis)
        .await
        .unwrap()
}

/// An API client of `cloud` with the right keys that tries each call once.
fn api_client(cloud: &FakeCloud) -> ApiClient {
    let creds = Credentials {
        access_key_id: AK.into(),
        secret_access_key: SK.into(),
    };
    let retry = RetryPolicy {
        attempts: 1,
        initial: Duration::from_millis(1),
        max: Duration::from_millis(1),
    };
    ApiClient::new(&cloud.api_url, creds, retry).unwrap()
}
