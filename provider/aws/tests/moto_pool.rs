//! The warm pool over the AWS backend, against moto (signatures checked),
//! the fake IMDSv2 and the fault-injecting proxy.

use enim_testkit::moto as rig;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_credential_types::Credentials;
use enim_core::ratelimit::RateLimit;
use enim_core::{EniOwner, PodRef, ProviderError, Watermarks};
use enim_provider::EniProvider;
use enim_provider_aws::{build_with, AwsConfig, PoolConfig, PoolRole};
use enim_provider_pool::{PoolStats, WarmPool};
use rig::Env;

fn owner(n: u32) -> EniOwner {
    EniOwner {
        network: "aws".into(),
        container_id: format!("ctr-{n}"),
        ifname: "eth0".into(),
        pod: PodRef {
            namespace: "default".into(),
            name: format!("pod-{n}"),
            uid: None,
        },
    }
}

/// A pool that keeps `min_free` to `max_free` ENIs free.
fn pool_config(env: &Env, min_free: usize, max_free: usize) -> AwsConfig {
    let count = |n: usize| u32::try_from(n).unwrap();
    let w = Watermarks::from_free_range(count(min_free), count(max_free)).unwrap();
    AwsConfig {
        pool: PoolConfig {
            pre_allocate: w.pre_allocate,
            max_above_watermark: w.max_above_watermark,
            initial_retry: Duration::from_millis(100),
            max_backoff: Duration::from_secs(1),
            resync_interval: Duration::from_millis(200),
            ..PoolConfig::default()
        },
        ..env.config()
    }
}

/// A pod-ENI pool on `config` with the node's credentials, started.
async fn pod_pool(env: &Env, config: &AwsConfig) -> Arc<WarmPool> {
    build_with(config, Some(env.node.clone()), PoolRole::PodEnis)
        .await
        .unwrap()
}

async fn wait_stats(pool: &WarmPool, what: &str, f: impl Fn(&PoolStats) -> bool) -> PoolStats {
    let mut rx = pool.subscribe();
    let got = match tokio::time::timeout(Duration::from_secs(20), rx.wait_for(|s| f(s))).await {
        Ok(Ok(s)) => Some(*s),
        _ => None,
    };
    got.unwrap_or_else(|| panic!("timed out waiting for {what}; stats now {:?}", pool.stats()))
}

async fn pool_ids(pool: &WarmPool) -> HashSet<String> {
    pool.list()
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.id)
        .collect()
}

/// The rig with the proxy set to fail the next `times` calls of `action`
/// with `status` and the EC2 error `code`; `None` where moto is missing.
async fn env_with_fault((action, times, status, code): (&str, usize, u16, &str)) -> Option<Env> {
    let env = Env::start().await?;
    env.proxy.inject(action, times, status, code);
    Some(env)
}

#[tokio::test]
async fn fill_allocate_release_shrink_and_restart() {
    // A throttling burst during the first fill is absorbed by the client.
    let fault = ("CreateNetworkInterface", 2, 503, "RequestLimitExceeded");
    let Some(env) = env_with_fault(fault).await else {
        return;
    };
    let config = pool_config(&env, 1, 2);
    let pool = pod_pool(&env, &config).await;
    assert_eq!(pool.name(), "aws");

    // Fill to min_free.
    wait_stats(&pool, "min_free", |s| s.available == 1).await;
    assert_eq!(env.proxy.faulted("CreateNetworkInterface"), 2);
    assert_eq!(env.tagged_ids().await, pool_ids(&pool).await);
    // Shrinking needs the checkpoint restored (nothing held here).
    pool.restore(&[]).await.unwrap();

    // Allocate: idempotent per owner, and the pool refills behind it.
    let a = pool.allocate_next(&owner(1)).await.unwrap();
    assert_eq!(a.owner.as_ref(), Some(&owner(1)));
    assert_eq!(pool.allocate_next(&owner(1)).await.unwrap().id, a.id);
    wait_stats(&pool, "refill after a", |s| s.available == 1 && s.used == 1).await;
    let b = pool.allocate_next(&owner(2)).await.unwrap();
    // m5.xlarge: 4 interfaces, the primary included, so 3 for pods.
    let s = wait_stats(&pool, "refill after b", |s| s.available == 1 && s.used == 2).await;
    assert_eq!(s.remaining_interfaces, 0);
    let c = pool.allocate_next(&owner(3)).await.unwrap();
    let e = pool.allocate_next(&owner(4)).await.unwrap_err();
    assert_eq!(e, ProviderError::Exhausted { total: 3 });
    assert!(!env.attached().await.is_empty());
    let held: HashSet<String> = [&a, &b, &c].iter().map(|e| e.id.clone()).collect();
    assert_eq!(env.tagged_ids().await, held);
    for id in &held {
        assert!(env.attached().await.contains_key(id), "{id} attached");
    }
    // Addresses come from metadata, in the subnet, behind its router.
    for eni in [&a, &b, &c] {
        assert!(env.subnet_v4.contains(&eni.ipv4.addr()));
        assert_eq!(eni.gateway4.to_string(), "10.0.1.1");
    }

    // Release all three: 3 free > max_free 2, so one is detached and
    // deleted.
    for n in 1..=3 {
        pool.release(&owner(n)).await.unwrap();
    }
    // Releasing twice is fine.
    pool.release(&owner(1)).await.unwrap();
    // Done once the leaving ENI is gone: 2 members, so 1 slot free.
    wait_stats(&pool, "shrink to max_free", |s| {
        s.available == 2 && s.used == 0 && s.remaining_interfaces == 1
    })
    .await;
    let kept = pool_ids(&pool).await;
    assert_eq!(kept.len(), 2);
    assert!(kept.is_subset(&held));
    // Exactly the pool's ENIs are left in EC2, all attached, plus the primary.
    rig::eventually(Duration::from_secs(5), "EC2 to match the pool", || async {
        env.tagged_ids().await == kept
    })
    .await;
    let attached = env.attached().await;
    assert_eq!(attached.len(), 3);
    assert!(attached.contains_key(&env.primary_eni));
    pool.shutdown().await;
    drop(pool);

    // A restarted agent finds the attached ENIs, and deletes a leftover
    // that a crash between create and attach left behind.
    let orphan = env.create_tagged_eni().await;
    let pool = pod_pool(&env, &config).await;
    assert_eq!(pool_ids(&pool).await, kept);
    assert_eq!(pool.stats().available, 2);
    assert!(!env
        .tagged_ids()
        .await
        .contains(&orphan.network_interface_id));
    assert_eq!(env.tagged_ids().await, kept);
    pool.shutdown().await;
}

#[tokio::test]
async fn attachment_limit_exceeded_makes_the_pool_back_off() {
    let fault = ("AttachNetworkInterface", 3, 400, "AttachmentLimitExceeded");
    let Some(env) = env_with_fault(fault).await else {
        return;
    };
    let start = Instant::now();
    let pool = pod_pool(&env, &pool_config(&env, 1, 1)).await;
    wait_stats(&pool, "min_free despite three refusals", |s| {
        s.available == 1
    })
    .await;
    // Backoff 100, 200, 400 ms between the failed rounds.
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(700), "{took:?}");
    // Each refusal: create, attach refused (not retried), delete.
    assert_eq!(env.proxy.calls("AttachNetworkInterface"), 4);
    assert_eq!(env.proxy.calls("CreateNetworkInterface"), 4);
    assert_eq!(env.proxy.calls("DeleteNetworkInterface"), 3);
    assert_eq!(env.tagged_ids().await, pool_ids(&pool).await);
    assert_eq!(env.tagged_ids().await.len(), 1);
    pool.shutdown().await;
}

#[tokio::test]
async fn metadata_lag_during_fill() {
    let Some(env) = Env::start().await else {
        return;
    };
    env.imds.hide_new_interfaces_for(4);
    let pool = pod_pool(&env, &pool_config(&env, 2, 2)).await;
    wait_stats(&pool, "min_free", |s| s.available == 2).await;
    assert!(env.imds.hidden_hits() >= 8, "{}", env.imds.hidden_hits());
    assert_eq!(env.tagged_ids().await, pool_ids(&pool).await);
    pool.shutdown().await;
}

#[tokio::test]
async fn build_fails_clearly_on_a_wrong_secret() {
    let Some(env) = Env::start().await else {
        return;
    };
    let bad = Credentials::new(env.node.access_key_id(), "wrong", None, None, "test");
    let e = build_with(&pool_config(&env, 1, 1), Some(bad), PoolRole::PodEnis)
        .await
        .err()
        .expect("auth error");
    assert!(matches!(e, ProviderError::Config(_)), "{e:?}");
    assert!(e.to_string().contains("AuthFailure"), "{e}");
    assert!(!e.is_transient());
    assert!(env.tagged_ids().await.is_empty());

    // Through the public entry point too (as enimd calls it); the pool is
    // an EniProvider.
    let good = pod_pool(&env, &pool_config(&env, 0, 0)).await;
    let provider: Arc<dyn EniProvider> = good.clone();
    assert_eq!(provider.list().await.unwrap(), vec![]);
    good.shutdown().await;
}

/// A pod's ADD needs no cloud call while a free ENI exists, so it never
/// waits for a client-side token, even with the mutating bucket empty for
/// an hour; one beyond the free ENIs is told "try again later" at once.
#[tokio::test]
async fn a_pods_add_never_waits_for_an_api_token() {
    let Some(env) = Env::start().await else {
        return;
    };
    let mut config = pool_config(&env, 1, 2);
    // One ENI's create, attach and delete-on-termination; the next token
    // comes in an hour.
    config.api.mutating_rate = RateLimit::new(Duration::from_secs(3600), 3);
    let pool = pod_pool(&env, &config).await;
    wait_stats(&pool, "min_free", |s| s.available == 1).await;
    let t0 = Instant::now();
    let a = pool.allocate_next(&owner(1)).await.unwrap();
    let e = pool.allocate_next(&owner(2)).await.unwrap_err();
    assert_eq!(e, ProviderError::Exhausted { total: 1 });
    assert!(
        t0.elapsed() < Duration::from_millis(500),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(a.owner, Some(owner(1)));
    // The refill waits for its token meanwhile: no second create went out.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(env.proxy.calls("CreateNetworkInterface"), 1);
    assert_eq!(pool.stats().available, 0);
    // Not shut down: its round waits for that token; dropping the runtime
    // ends it.
}
