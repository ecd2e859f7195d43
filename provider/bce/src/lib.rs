//! enim's Baidu AI Cloud (BCE) backend: whole ENIs from BCE's ENI OpenAPI,
//! discovered through BCC instance metadata, kept warm by the pool
//! (`enim-provider-pool`).
//!
//! - [`auth`]: bce-auth-v1 request signing.
//! - [`metadata`]: the instance metadata service (all paths in one place).
//! - [`api`]: the ENI OpenAPI client (paging, clientTokens, retries).
//! - [`backend`]: [`BceBackend`], the [`CloudBackend`] on top of both.
//!
//! [`build`] turns a [`BceConfig`] into a started warm pool.

pub mod api;
pub mod auth;
pub mod backend;
pub mod fleet;
pub mod idcache;
pub mod metadata;
mod steps;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use enim_provider::cloud::{validate_cluster_name, CloudBackend};
use enim_provider::ratelimit::RateLimit;
use enim_provider::retry::{Backoff, Poll};
use enim_provider::{EniProvider, ProviderError};
use enim_provider_pool::WarmPool;
pub use enim_provider_pool::{PoolConfig, PoolRole};
use serde::{Deserialize, Serialize};

use api::ApiClient;
pub use api::{MethodLimits, RetryPolicy};
pub use auth::{Credentials, Secret};
pub use backend::{BackendSettings, BceBackend};
pub use fleet::{BceFleet, BceFleetConfig};

pub const ENV_ACCESS_KEY_ID: &str = "BCE_ACCESS_KEY_ID";
pub const ENV_SECRET_ACCESS_KEY: &str = "BCE_SECRET_ACCESS_KEY";

/// `[provider]` with `type = "bce"`. Everything but the credentials has a
/// default (what is left out takes its value from [`BceConfig::default`]) or
/// is discovered from instance metadata.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BceConfig {
    /// BCE region (`bj`, `gz`, `su`, ...); default: metadata `region`.
    pub region: Option<String>,
    /// ENI OpenAPI endpoint; default `https://bcc.<region>.baidubce.com`.
    pub endpoint: Option<String>,
    /// Instance metadata base URL; default
    /// `http://169.254.169.254/1.0/meta-data/`.
    pub metadata_endpoint: Option<String>,
    /// VPC to list ENIs in; default: metadata `vpc-id`.
    pub vpc_id: Option<String>,
    /// Subnet new ENIs are created in; default: metadata `subnet-id`.
    pub subnet_id: Option<String>,
    /// Security groups of new ENIs.
    pub security_group_ids: Vec<String>,
    /// Access key; default: env `BCE_ACCESS_KEY_ID`.
    pub access_key_id: Option<String>,
    /// Secret key; default: env `BCE_SECRET_ACCESS_KEY`. `Debug` never
    /// prints it.
    pub secret_access_key: Option<Secret>,
    /// Longest pause between two ENI status or metadata polls (each drawn
    /// from its upper half, so nodes do not poll in lockstep).
    #[serde(with = "humantime_serde")]
    pub poll_interval: Duration,
    /// Bound on one attach, detach or wait for metadata.
    #[serde(with = "humantime_serde")]
    pub operation_timeout: Duration,
    /// Tries per API call on throttling, 5xx and transport errors.
    pub max_attempts: u32,
    /// First backoff step of those retries (doubling, jittered).
    #[serde(with = "humantime_serde")]
    pub retry_base: Duration,
    /// Largest backoff step.
    #[serde(with = "humantime_serde")]
    pub retry_cap: Duration,
    /// `maxKeys` of ENI list calls.
    pub list_page_size: u32,
    /// Calls that change something (create, attach, detach, delete): this
    /// agent's own token bucket, so one node cannot spend the account's
    /// API quota, which every node shares.
    pub api_mutating_rate: RateLimit,
    /// Reads (list, get, quota): this agent's own token bucket.
    pub api_read_rate: RateLimit,
    /// The cluster's name: new ENIs carry `enim.io/cluster=<it>` in their
    /// description, and the fleet-wide reaper deletes this cluster's ENIs
    /// left unattached. Unset: reaper off.
    pub cluster: Option<String>,
    /// Where the backend keeps the ids of the ENIs attached here, to serve
    /// them through an API outage at start (instance metadata names no
    /// ids); enimd's default: `bce-eni-ids.json` beside its checkpoint.
    /// Unset: no cache, and a start without the API serves nothing.
    pub eni_id_cache: Option<PathBuf>,
    pub pool: PoolConfig,
}

/// Defaults of `api_mutating_rate` and `api_read_rate` (shared with AWS).
pub use enim_provider::ratelimit::{DEFAULT_MUTATING_RATE, DEFAULT_READ_RATE};

impl Default for BceConfig {
    fn default() -> Self {
        BceConfig {
            region: None,
            endpoint: None,
            metadata_endpoint: None,
            vpc_id: None,
            subnet_id: None,
            security_group_ids: Vec::new(),
            access_key_id: None,
            secret_access_key: None,
            poll_interval: Duration::from_secs(2),
            operation_timeout: Duration::from_secs(120),
            max_attempts: 5,
            retry_base: Duration::from_millis(500),
            retry_cap: Duration::from_secs(10),
            list_page_size: 100,
            api_mutating_rate: DEFAULT_MUTATING_RATE,
            api_read_rate: DEFAULT_READ_RATE,
            cluster: None,
            eni_id_cache: None,
            pool: PoolConfig::default(),
        }
    }
}

impl BceConfig {
    fn validate(&self) -> Result<(), ProviderError> {
        let bad = |why: &str| Err(ProviderError::Config(format!("bce: {why}")));
        if let Err(e) = self.api().validate("") {
            return bad(&e);
        }
        if let Some(c) = &self.cluster {
            if let Err(e) = validate_cluster_name(c) {
                return bad(&e);
            }
        }
        self.pool.validate()
    }

    /// Its API settings, as the operator's config has them too.
    pub fn api(&self) -> BceApiConfig {
        BceApiConfig {
            poll_interval: self.poll_interval,
            operation_timeout: self.operation_timeout,
            max_attempts: self.max_attempts,
            retry_base: self.retry_base,
            retry_cap: self.retry_cap,
            list_page_size: self.list_page_size,
            api_mutating_rate: self.api_mutating_rate,
            api_read_rate: self.api_read_rate,
        }
    }

    /// Credentials from the config, else from the environment.
    pub fn credentials(&self) -> Result<Credentials, ProviderError> {
        credentials(
            self.access_key_id.as_deref(),
            self.secret_access_key.as_ref(),
        )
    }
}

/// Credentials as configured, else from the environment
/// (`BCE_ACCESS_KEY_ID`, `BCE_SECRET_ACCESS_KEY`).
pub fn credentials(
    access_key_id: Option<&str>,
    secret_access_key: Option<&Secret>,
) -> Result<Credentials, ProviderError> {
    let pick = |configured: Option<&str>, env: &str| {
        configured
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .or_else(|| std::env::var(env).ok().filter(|s| !s.is_empty()))
    };
    match (
        pick(access_key_id, ENV_ACCESS_KEY_ID),
        pick(secret_access_key.map(Secret::expose), ENV_SECRET_ACCESS_KEY),
    ) {
        (Some(access_key_id), Some(secret_access_key)) => Ok(Credentials {
            access_key_id,
            secret_access_key: secret_access_key.into(),
        }),
        _ => Err(ProviderError::Config(format!(
            "bce: no credentials: set access_key_id and secret_access_key, or \
             {ENV_ACCESS_KEY_ID} and {ENV_SECRET_ACCESS_KEY}"
        ))),
    }
}

/// How a BCE client polls, retries, pages and paces its calls: keys of
/// [`BceConfig`], and the `[api]` table of the operator's
/// [`fleet::BceFleetConfig`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BceApiConfig {
    /// Longest pause between two ENI status polls (jittered).
    #[serde(with = "humantime_serde")]
    pub poll_interval: Duration,
    /// Bound on one attach or detach.
    #[serde(with = "humantime_serde")]
    pub operation_timeout: Duration,
    /// Tries per API call on throttling, 5xx and transport errors.
    pub max_attempts: u32,
    #[serde(with = "humantime_serde")]
    pub retry_base: Duration,
    #[serde(with = "humantime_serde")]
    pub retry_cap: Duration,
    /// `maxKeys` of ENI list calls.
    pub list_page_size: u32,
    /// Calls that change something: this client's own token bucket.
    pub api_mutating_rate: RateLimit,
    /// Reads: this client's own token bucket.
    pub api_read_rate: RateLimit,
}

impl Default for BceApiConfig {
    fn default() -> Self {
        BceConfig::default().api()
    }
}

impl BceApiConfig {
    /// `Err` names the key, as `prefix` + its name.
    pub fn validate(&self, prefix: &str) -> Result<(), String> {
        let bad = |why: &str| Err(format!("{prefix}{why}"));
        if self.poll_interval.is_zero() {
            return bad("poll_interval must be above zero");
        }
        if self.operation_timeout < self.poll_interval {
            return bad("operation_timeout must be at least poll_interval");
        }
        if self.max_attempts == 0 {
            return bad("max_attempts must be at least 1");
        }
        if self.retry_cap < self.retry_base {
            return bad("retry_cap must be at least retry_base");
        }
        if !(1..=1000).contains(&self.list_page_size) {
            return bad("list_page_size must be 1..=1000 (BCE's maxKeys limit)");
        }
        for (key, rate) in [
            ("api_mutating_rate", &self.api_mutating_rate),
            ("api_read_rate", &self.api_read_rate),
        ] {
            rate.validate().map_err(|e| format!("{prefix}{key}: {e}"))?;
        }
        Ok(())
    }

    /// A client of `endpoint` that retries and paces its calls as this
    /// says, with token buckets of its own (one client per process).
    pub fn client(&self, endpoint: &str, creds: Credentials) -> Result<ApiClient, ProviderError> {
        let retry = RetryPolicy {
            attempts: self.max_attempts,
            initial: self.retry_base,
            max: self.retry_cap,
        };
        let limits = Arc::new(MethodLimits::new(
            self.api_mutating_rate,
            self.api_read_rate,
        ));
        Ok(ApiClient::new(endpoint, creds, retry)
            .map_err(|e| ProviderError::Config(format!("bce: {e}")))?
            .with_limits(limits))
    }

    /// Polls of one attach or detach: every `poll_interval` at most
    /// (jittered), for `operation_timeout` in all.
    pub fn poll(&self) -> Poll {
        Poll::within(&Backoff::steady(self.poll_interval), self.operation_timeout)
    }
}

impl BceBackend {
    /// Fills what `config` leaves open from instance metadata and checks
    /// the credentials with one cheap signed call (the instance's ENI quota),
    /// so bad keys fail the agent's start with a clear message.
    pub async fn discover(config: &BceConfig) -> Result<BceBackend, ProviderError> {
        config.validate()?;
        let creds = config.credentials()?;
        let meta_base = config
            .metadata_endpoint
            .as_deref()
            .unwrap_or(metadata::DEFAULT_BASE);
        let meta = metadata::MetadataClient::new(meta_base)
            .map_err(|e| ProviderError::Config(format!("bce: metadata client: {e}")))?;
        let instance_id = meta.instance_id().await?;
        let given = |configured: &Option<String>| configured.clone().filter(|s| !s.is_empty());
        let endpoint = match given(&config.endpoint) {
            Some(e) => e,
            None => {
                let region = match given(&config.region) {
                    Some(r) => r,
                    None => meta.region().await?,
                };
                format!("https://bcc.{region}.baidubce.com")
            }
        };
        let vpc_id = match given(&config.vpc_id) {
            Some(v) => v,
            None => meta.vpc_id().await?,
        };
        let subnet_id = match given(&config.subnet_id) {
            Some(s) => s,
            None => meta.subnet_id().await?,
        };
        if config.security_group_ids.is_empty() {
            tracing::warn!("bce: no security_group_ids configured; new ENIs get BCE's default");
        }
        // One set of buckets for the agent: the backend is its only client.
        let api = config.api().client(&endpoint, creds)?;
        let backend = BceBackend::new(
            api,
            meta,
            BackendSettings {
                instance_id,
                vpc_id,
                subnet_id,
                security_group_ids: config.security_group_ids.clone(),
                poll_interval: config.poll_interval,
                operation_timeout: config.operation_timeout,
                page_size: config.list_page_size,
                cluster: config.cluster.clone(),
            },
        );
        let backend = match &config.eni_id_cache {
            Some(path) => backend.with_id_cache(idcache::IdCache::open(path.clone())),
            None => backend,
        };
        match backend.eni_limit().await {
            Ok(_) => {}
            // Bad keys fail the start; an API that does not answer does
            // not: the pool serves what is attached and grows when it is
            // back.
            Err(e) if e.is_transient() => {
                tracing::warn!(error = %e, "bce: the ENI API does not answer; credentials unchecked until it does")
            }
            Err(e) => return Err(e),
        }
        let s = backend.settings();
        tracing::info!(instance = %s.instance_id, vpc = %s.vpc_id, subnet = %s.subnet_id, %endpoint, "bce backend ready");
        Ok(backend)
    }
}

/// The warm pool over a discovered [`BceBackend`], started in `role`
/// (primary mode: ENIs for pods; secondary mode: the node's host ENIs,
/// whose addresses the pool assigns through BCE's private-IP calls).
pub async fn start_pool(
    config: &BceConfig,
    role: PoolRole,
) -> Result<Arc<WarmPool>, ProviderError> {
    let backend: Arc<dyn CloudBackend> = Arc::new(BceBackend::discover(config).await?);
    WarmPool::start_as(backend, config.pool.clone(), role).await
}

/// What `enimd` calls for `type = "bce"`.
pub async fn build(
    config: &BceConfig,
    role: PoolRole,
) -> Result<Arc<dyn EniProvider>, ProviderError> {
    let pool: Arc<dyn EniProvider> = start_pool(config, role).await?;
    Ok(pool)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_defaults_and_unknown_keys() {
        let c: BceConfig = serde_json::from_str(r#"{"security_group_ids": ["g-1"]}"#).unwrap();
        assert_eq!(c.poll_interval, Duration::from_secs(2));
        assert_eq!(c.list_page_size, 100);
        assert_eq!(c.pool, PoolConfig::default());
        assert!(c.validate().is_ok());
        assert!(serde_json::from_str::<BceConfig>(r#"{"regoin": "bj"}"#).is_err());
        let c: BceConfig = serde_json::from_str(
            r#"{"poll_interval": "50ms", "operation_timeout": "1s",
                "pool": {"min_free": 2, "max_free": 4}}"#,
        )
        .unwrap();
        assert_eq!(c.poll_interval, Duration::from_millis(50));
        assert_eq!(c.pool.min_free, 2);
        let mut bad = c.clone();
        bad.list_page_size = 0;
        assert!(bad.validate().is_err());
        assert_eq!(c.api_mutating_rate, DEFAULT_MUTATING_RATE);
        assert_eq!(c.cluster, None);
        let r: BceConfig = serde_json::from_str(
            r#"{"cluster": "prod", "api_read_rate": {"every": "100ms", "burst": 3}}"#,
        )
        .unwrap();
        assert_eq!(r.cluster.as_deref(), Some("prod"));
        assert_eq!(
            r.api_read_rate,
            RateLimit::new(Duration::from_millis(100), 3)
        );
        assert!(r.validate().is_ok());
        let mut bad = r.clone();
        bad.cluster = Some("a;b".into());
        assert!(bad.validate().unwrap_err().to_string().contains("cluster"));
        let mut bad = r.clone();
        bad.api_mutating_rate.burst = 0;
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .contains("api_mutating_rate: burst"));
        let mut bad = c;
        bad.pool.max_free = 1;
        assert!(bad.validate().is_err());
    }

    #[test]
    fn debug_hides_the_secret() {
        let c = BceConfig {
            access_key_id: Some("ak".into()),
            secret_access_key: Some("topsecret".into()),
            ..BceConfig::default()
        };
        let shown = format!("{c:?}");
        assert!(
            shown.contains("ak") && !shown.contains("topsecret"),
            "{shown}"
        );
        let creds = c.credentials().unwrap();
        assert!(!format!("{creds:?}").contains("topsecret"));
    }
}
