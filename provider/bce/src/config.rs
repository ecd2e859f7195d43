//! The BCE provider's configs: [`BceConfig`], enimd's `[provider]` with
//! `type = "bce"` (the node), and [`BceFleetConfig`], the operator's
//! `[cloud]` with `type = "bce"` (the whole cluster). Both keep the ENI
//! OpenAPI's settings in one `api` table ([`ApiConfig`]), with the keys
//! every cloud's provider has; BCE's own (polling, paging) are keys of
//! the config itself, the same in both.
//!
//! Keys that moved ([`NODE_MOVES`], [`FLEET_MOVES`]) are still read, with
//! a deprecation warning; a file that sets a key under both names is
//! refused. Once `validate` passed, polls are above zero and fit in an
//! operation, and list pages are within BCE's bounds.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use enim_core::api_config::ApiConfig;
use enim_core::config_keys::{ConfigKeys, KeyMove};
use enim_core::{LimitsConfig, ProviderError, Secret};
use enim_provider::cloud::validate_cluster_name;
use enim_provider_pool::PoolConfig;
use serde::{Deserialize, Serialize};

use crate::auth::{Credentials, NoCredentials};

/// The node's keys that moved into `api`.
pub const NODE_MOVES: &[KeyMove] = &[
    KeyMove {
        old: "endpoint",
        new: "api.endpoint",
    },
    KeyMove {
        old: "max_attempts",
        new: "api.max_attempts",
    },
    KeyMove {
        old: "retry_base",
        new: "api.backoff",
    },
    KeyMove {
        old: "retry_cap",
        new: "api.max_backoff",
    },
    KeyMove {
        old: "api_mutating_rate",
        new: "api.mutating_rate",
    },
    KeyMove {
        old: "api_read_rate",
        new: "api.read_rate",
    },
];

/// The operator's keys that moved into `api`, within it, or out of it
/// (BCE's own, which the node's config has outside it).
pub const FLEET_MOVES: &[KeyMove] = &[
    KeyMove {
        old: "endpoint",
        new: "api.endpoint",
    },
    KeyMove {
        old: "api.retry_base",
        new: "api.backoff",
    },
    KeyMove {
        old: "api.retry_cap",
        new: "api.max_backoff",
    },
    KeyMove {
        old: "api.api_mutating_rate",
        new: "api.mutating_rate",
    },
    KeyMove {
        old: "api.api_read_rate",
        new: "api.read_rate",
    },
    KeyMove {
        old: "api.poll_interval",
        new: "poll_interval",
    },
    KeyMove {
        old: "api.operation_timeout",
        new: "operation_timeout",
    },
    KeyMove {
        old: "api.list_page_size",
        new: "list_page_size",
    },
];

/// BCE's defaults of the `api` table: the shared ones, but retries from
/// 500 ms.
pub fn default_api() -> ApiConfig {
    ApiConfig {
        backoff: Duration::from_millis(500),
        ..ApiConfig::default()
    }
}

const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(2);
const DEFAULT_OPERATION_TIMEOUT: Duration = Duration::from_secs(120);
const DEFAULT_LIST_PAGE_SIZE: u32 = 100;

/// Everything but the credentials has a default (what is left out takes
/// its value from [`BceConfig::default`]) or is discovered from instance
/// metadata.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self", default, deny_unknown_fields)]
pub struct BceConfig {
    /// The BCE region: `bj`, `gz`, `su`, ...
    ///
    /// Default: metadata `region`.
    pub region: Option<String>,
    /// BCC instance metadata's base URL.
    pub metadata_endpoint: String,
    /// The VPC to list ENIs in.
    ///
    /// Default: metadata `vpc-id`.
    pub vpc_id: Option<String>,
    /// The subnet of new ENIs.
    ///
    /// Default: metadata `subnet-id`.
    pub subnet_id: Option<String>,
    /// The security groups of new ENIs.
    ///
    /// Default: the instance's (listed once; an instance with none is an error, never BCE's default group).
    pub security_group_ids: Vec<String>,
    /// The access key.
    ///
    /// Default: env `BCE_ACCESS_KEY_ID`.
    pub access_key_id: Option<String>,
    /// The secret key (never printed).
    ///
    /// Default: env `BCE_SECRET_ACCESS_KEY`.
    pub secret_access_key: Option<Secret>,
    /// The longest pause between two ENI status or metadata polls (each
    /// drawn from its upper half, so nodes do not poll in lockstep).
    #[serde(with = "humantime_serde")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub poll_interval: Duration,
    /// Bound on one attach, detach or metadata wait; at least
    /// `poll_interval`.
    #[serde(with = "humantime_serde")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub operation_timeout: Duration,
    /// `maxKeys` of ENI list calls, 1..=1000.
    pub list_page_size: u32,
    /// The cluster's name: new ENIs carry `enim.io/cluster=<it>` in their
    /// description, and the fleet-wide reaper, on while it is set, deletes
    /// this cluster's ENIs left unattached.
    pub cluster: Option<String>,
    /// The ids of the ENIs attached here, kept to serve them through an
    /// API outage at start (instance metadata names no ids).
    ///
    /// Default: `bce-eni-ids.json` beside the checkpoint.
    pub eni_id_cache: Option<PathBuf>,
    /// The BCE client (the ENI OpenAPI): endpoint, retries, and this
    /// agent's own token buckets, so one node cannot spend the account's
    /// API quota, which every node shares.
    pub api: ApiConfig,
    /// The warm pool.
    pub pool: PoolConfig,
}

enim_core::serde_with_moved_keys!(
    BceConfig,
    ConfigKeys {
        section: "provider",
        moves: NODE_MOVES,
        api_defaults: Some(default_api()),
        rewrite: None,
    }
);

impl Default for BceConfig {
    fn default() -> Self {
        BceConfig {
            region: None,
            metadata_endpoint: crate::metadata::DEFAULT_BASE.into(),
            vpc_id: None,
            subnet_id: None,
            security_group_ids: Vec::new(),
            access_key_id: None,
            secret_access_key: None,
            poll_interval: DEFAULT_POLL_INTERVAL,
            operation_timeout: DEFAULT_OPERATION_TIMEOUT,
            list_page_size: DEFAULT_LIST_PAGE_SIZE,
            cluster: None,
            eni_id_cache: None,
            api: default_api(),
            pool: PoolConfig::default(),
        }
    }
}

impl BceConfig {
    pub fn validate(&self) -> Result<(), ProviderError> {
        let bad = |why: String| Err(ProviderError::Config(format!("bce: {why}")));
        let polling = validate_polling(
            self.poll_interval,
            self.operation_timeout,
            self.list_page_size,
        );
        if let Err(e) = polling.and_then(|()| self.api.validate()) {
            return bad(e);
        }
        if let Some(c) = &self.cluster {
            if let Err(e) = validate_cluster_name(c) {
                return bad(e);
            }
        }
        self.pool.validate()
    }

    /// Credentials from the config, else from the environment.
    pub fn credentials(&self) -> Result<Credentials, NoCredentials> {
        Credentials::configured(
            self.access_key_id.as_deref(),
            self.secret_access_key.as_ref(),
        )
    }
}

/// The operator's `bce` section. `vpc_id`, `cluster` and either `region`
/// or `api.endpoint` are required; the rest has defaults.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self", default, deny_unknown_fields)]
pub struct BceFleetConfig {
    /// The BCE region (`bj`, `gz`, ...): the endpoint is then
    /// `https://bcc.<region>.baidubce.com`.
    ///
    /// Default: required unless `api.endpoint` is set.
    pub region: Option<String>,
    /// The VPC whose ENIs are listed.
    ///
    /// Default: required.
    pub vpc_id: String,
    /// The cluster's name, marked in its ENIs' descriptions. Must equal
    /// `[operator] cluster`.
    ///
    /// Default: `[operator] cluster`.
    pub cluster: String,
    /// The access key.
    ///
    /// Default: env `BCE_ACCESS_KEY_ID`.
    pub access_key_id: Option<String>,
    /// The secret key (never printed).
    ///
    /// Default: env `BCE_SECRET_ACCESS_KEY`.
    pub secret_access_key: Option<Secret>,
    /// The longest pause between two ENI status polls (jittered).
    #[serde(with = "humantime_serde")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub poll_interval: Duration,
    /// Bound on one attach or detach; at least `poll_interval`.
    #[serde(with = "humantime_serde")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub operation_timeout: Duration,
    /// `maxKeys` of ENI list calls, 1..=1000.
    pub list_page_size: u32,
    /// Per instance type, `{ enis, ipv4_per_eni, ipv6_per_eni }` (BCE's
    /// quota call asks by instance, not by type); a type without an entry
    /// is an error.
    pub limits: BTreeMap<String, LimitsConfig>,
    /// The BCE client: endpoint (instead of the region's), retries and
    /// the operator's own token buckets.
    pub api: ApiConfig,
}

enim_core::serde_with_moved_keys!(
    BceFleetConfig,
    ConfigKeys {
        section: "cloud",
        moves: FLEET_MOVES,
        api_defaults: Some(default_api()),
        rewrite: None,
    }
);

impl Default for BceFleetConfig {
    fn default() -> Self {
        BceFleetConfig {
            region: None,
            vpc_id: String::new(),
            cluster: String::new(),
            access_key_id: None,
            secret_access_key: None,
            poll_interval: DEFAULT_POLL_INTERVAL,
            operation_timeout: DEFAULT_OPERATION_TIMEOUT,
            list_page_size: DEFAULT_LIST_PAGE_SIZE,
            limits: BTreeMap::new(),
            api: default_api(),
        }
    }
}

impl BceFleetConfig {
    pub fn validate(&self) -> Result<(), ProviderError> {
        let bad = |why: String| Err(ProviderError::Config(format!("bce fleet: {why}")));
        let given = |s: &Option<String>| s.as_deref().is_some_and(|s| !s.trim().is_empty());
        if !given(&self.api.endpoint) && !given(&self.region) {
            return bad(
                "set region or endpoint (api.endpoint): the operator reads no instance metadata"
                    .into(),
            );
        }
        if self.vpc_id.trim().is_empty() {
            return bad("vpc_id must be set".into());
        }
        if let Err(e) = validate_cluster_name(&self.cluster) {
            return bad(e);
        }
        let polling = validate_polling(
            self.poll_interval,
            self.operation_timeout,
            self.list_page_size,
        );
        if let Err(e) = polling.and_then(|()| self.api.validate()) {
            return bad(e);
        }
        Ok(())
    }

    /// `api.endpoint`, else the region's.
    pub fn endpoint(&self) -> String {
        match (&self.api.endpoint, &self.region) {
            (Some(e), _) if !e.trim().is_empty() => e.clone(),
            (_, region) => crate::client::region_endpoint(region.as_deref().unwrap_or_default()),
        }
    }

    /// Credentials from the config, else from the environment.
    pub fn credentials(&self) -> Result<Credentials, NoCredentials> {
        Credentials::configured(
            self.access_key_id.as_deref(),
            self.secret_access_key.as_ref(),
        )
    }
}

/// BCE's own keys, as both configs have them.
fn validate_polling(
    poll_interval: Duration,
    operation_timeout: Duration,
    list_page_size: u32,
) -> Result<(), String> {
    if poll_interval.is_zero() {
        return Err("poll_interval must be above zero".into());
    }
    if operation_timeout < poll_interval {
        return Err("operation_timeout must be at least poll_interval".into());
    }
    if !(1..=1000).contains(&list_page_size) {
        return Err("list_page_size must be 1..=1000 (BCE's maxKeys limit)".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests;
