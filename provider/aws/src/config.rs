//! The AWS provider's configs: [`AwsConfig`], enimd's `[provider]` with
//! `type = "aws"` (the node), and [`AwsFleetConfig`], the operator's
//! `[cloud]` with `type = "aws"` (the whole cluster). Both keep the EC2
//! API's settings in one `api` table ([`ApiConfig`]), with the keys every
//! cloud's provider has.
//!
//! Keys that moved into that table ([`NODE_MOVES`], [`FLEET_MOVES`]) are
//! still read, with a deprecation warning; a file that sets a key under
//! both names is refused. Once `validate` passed, every duration that
//! bounds a wait is above zero and every URL is an `http(s)` URL.

use std::time::Duration;

use enim_core::api_config::ApiConfig;
use enim_core::config_keys::{ConfigKeys, KeyMove, FLAT_RATE_MOVES};
use enim_core::Secret;
use enim_provider::cloud::validate_cluster_name;
use enim_provider_pool::PoolConfig;
use serde::{Deserialize, Serialize};

pub const DEFAULT_IMDS_ENDPOINT: &str = "http://169.254.169.254";

/// The node's keys that moved into `api`.
pub const NODE_MOVES: &[KeyMove] = &[
    KeyMove {
        old: "ec2_endpoint",
        new: "api.endpoint",
    },
    KeyMove {
        old: "api_attempts",
        new: "api.max_attempts",
    },
    KeyMove {
        old: "api_backoff",
        new: "api.backoff",
    },
    KeyMove {
        old: "api_max_backoff",
        new: "api.max_backoff",
    },
    FLAT_RATE_MOVES[0],
    FLAT_RATE_MOVES[1],
];

/// The operator's keys that moved into (or within) `api`.
pub const FLEET_MOVES: &[KeyMove] = &[
    KeyMove {
        old: "ec2_endpoint",
        new: "api.endpoint",
    },
    KeyMove {
        old: "api.attempts",
        new: "api.max_attempts",
    },
    KeyMove {
        old: "api.describe_rate",
        new: "api.read_rate",
    },
];

/// Every key is optional: what is left out takes its value from
/// [`AwsConfig::default`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self", default, deny_unknown_fields)]
pub struct AwsConfig {
    /// The EC2 region.
    ///
    /// Default: instance metadata's placement/region.
    pub region: Option<String>,
    /// Instance metadata (IMDSv2): scheme and authority.
    pub imds_endpoint: String,
    /// The subnet of new ENIs.
    ///
    /// Default: the primary ENI's subnet.
    pub subnet_id: Option<String>,
    /// The security groups of new ENIs.
    ///
    /// Default: the primary interface's (from instance metadata), as AWS VPC CNI gives its ENIs.
    pub security_group_ids: Vec<String>,
    /// One IPv6 address per new ENI (the subnet needs an IPv6 block).
    pub assign_ipv6: bool,
    /// The pod MTU, 576..=9001.
    ///
    /// Default: the device's.
    pub mtu: Option<u32>,
    /// Bound on instance metadata showing a new attachment.
    #[serde(with = "humantime_serde")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub metadata_wait: Duration,
    /// Bound on a detach reaching `available` (the pool retries later).
    #[serde(with = "humantime_serde")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub detach_timeout: Duration,
    /// The cluster's name: new ENIs are tagged `enim.io/cluster=<it>`, and
    /// the fleet-wide reaper, on while it is set, deletes this cluster's
    /// ENIs left unattached.
    pub cluster: Option<String>,
    /// The EC2 client: endpoint, retries, and this agent's own token
    /// buckets, well under the account's (mutating: 5 per second, 50 to
    /// 100 deep; describe: 10 to 20 per second), which every node of every
    /// cluster in the account shares.
    pub api: ApiConfig,
    /// The warm pool.
    pub pool: PoolConfig,
}

enim_core::serde_with_moved_keys!(
    AwsConfig,
    ConfigKeys {
        section: "provider",
        moves: NODE_MOVES,
        api_defaults: Some(ApiConfig::default()),
        rewrite: None,
    }
);

impl Default for AwsConfig {
    fn default() -> Self {
        AwsConfig {
            region: None,
            imds_endpoint: DEFAULT_IMDS_ENDPOINT.into(),
            subnet_id: None,
            security_group_ids: Vec::new(),
            assign_ipv6: false,
            mtu: None,
            metadata_wait: Duration::from_secs(60),
            detach_timeout: Duration::from_secs(120),
            cluster: None,
            api: ApiConfig::default(),
            pool: PoolConfig::default(),
        }
    }
}

impl AwsConfig {
    pub fn validate(&self) -> Result<(), String> {
        if let Err(e) = self.pool.validate() {
            return Err(format!("aws: {e}"));
        }
        validate_api(&self.api).map_err(|e| format!("aws: {e}"))?;
        if let Some(c) = &self.cluster {
            validate_cluster_name(c).map_err(|e| format!("aws: {e}"))?;
        }
        if self.metadata_wait.is_zero() || self.detach_timeout.is_zero() {
            return Err("aws: metadata_wait and detach_timeout must be above zero".into());
        }
        if let Some(m) = self.mtu {
            if !(576..=9001).contains(&m) {
                return Err(format!("aws: mtu {m} is outside 576..=9001"));
            }
        }
        check_url("imds_endpoint", &self.imds_endpoint).map_err(|e| format!("aws: {e}"))
    }
}

/// Every key but `region` and `cluster` has a default (what is left out
/// takes its value from [`AwsFleetConfig::default`]). No instance metadata
/// is needed: the operator need not run on EC2, so the region is given and
/// the credentials come from the config, the environment or, where the
/// operator does run on EC2, the instance role.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self", default, deny_unknown_fields)]
pub struct AwsFleetConfig {
    /// The EC2 region (the operator reads no instance metadata).
    ///
    /// Default: required.
    pub region: String,
    /// The cluster's name: the ENIs the operator lists, makes and deletes
    /// carry `enim.io/cluster=<it>`. Must equal `[operator] cluster`.
    ///
    /// Default: `[operator] cluster`.
    pub cluster: String,
    /// Where the operator's AWS credentials come from.
    pub credentials: AwsCredentialsConfig,
    /// One IPv6 address per new ENI (the subnet needs an IPv6 block).
    pub assign_ipv6: bool,
    /// How long a detach may take before the call fails (the operator
    /// retries later).
    #[serde(with = "humantime_serde")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub detach_timeout: Duration,
    /// The EC2 client: endpoint, retries and the operator's own token
    /// buckets.
    pub api: ApiConfig,
}

enim_core::serde_with_moved_keys!(
    AwsFleetConfig,
    ConfigKeys {
        section: "cloud",
        moves: FLEET_MOVES,
        api_defaults: Some(ApiConfig::default()),
        rewrite: None,
    }
);

impl Default for AwsFleetConfig {
    fn default() -> Self {
        AwsFleetConfig {
            region: String::new(),
            cluster: String::new(),
            credentials: AwsCredentialsConfig::default(),
            assign_ipv6: false,
            detach_timeout: Duration::from_secs(120),
            api: ApiConfig::default(),
        }
    }
}

/// `credentials.source` and what that source needs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "source", rename_all = "snake_case", deny_unknown_fields)]
pub enum AwsCredentialsConfig {
    /// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`
    /// (in `deploy/`, from the optional Secret `enim-operator-cloud`).
    #[default]
    Environment,
    /// Keys written in the config (never printed).
    Static {
        access_key_id: String,
        secret_access_key: Secret,
        #[serde(default)]
        session_token: Option<Secret>,
    },
    /// The EC2 instance role through instance metadata (an operator that
    /// runs on EC2); `imds_endpoint` defaults to `http://169.254.169.254`.
    InstanceRole {
        #[serde(default = "default_imds_endpoint")]
        imds_endpoint: String,
    },
    /// IRSA: a ServiceAccount token exchanged with STS for a role; each key
    /// left out is read from `AWS_ROLE_ARN`, `AWS_WEB_IDENTITY_TOKEN_FILE`,
    /// `AWS_ROLE_SESSION_NAME`, as EKS's pod identity webhook sets them;
    /// STS at `AWS_ENDPOINT_URL_STS` when set.
    WebIdentity(crate::credentials::WebIdentity),
    /// EKS Pod Identity: the container credentials endpoint that
    /// `AWS_CONTAINER_CREDENTIALS_FULL_URI` and
    /// `AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE` name.
    Container,
}

fn default_imds_endpoint() -> String {
    DEFAULT_IMDS_ENDPOINT.into()
}

impl AwsFleetConfig {
    /// `Err` names the key and what is wrong with it.
    pub fn validate(&self) -> Result<(), String> {
        let bad = |e: String| format!("aws fleet: {e}");
        if self.region.trim().is_empty() {
            return Err(bad(
                "region must be set (the operator reads no instance metadata)".into(),
            ));
        }
        validate_cluster_name(&self.cluster).map_err(bad)?;
        if self.detach_timeout.is_zero() {
            return Err(bad("detach_timeout must be above zero".into()));
        }
        validate_api(&self.api).map_err(bad)?;
        match &self.credentials {
            AwsCredentialsConfig::Environment => Ok(()),
            AwsCredentialsConfig::Static {
                access_key_id,
                secret_access_key,
                ..
            } => {
                if access_key_id.trim().is_empty() || secret_access_key.expose().trim().is_empty() {
                    return Err(bad(
                        "credentials: source \"static\" needs access_key_id and secret_access_key"
                            .into(),
                    ));
                }
                Ok(())
            }
            AwsCredentialsConfig::InstanceRole { imds_endpoint } => {
                check_url("credentials.imds_endpoint", imds_endpoint).map_err(bad)
            }
            AwsCredentialsConfig::WebIdentity(settings) => settings
                .validate()
                .map_err(|e| bad(format!("credentials: source \"web_identity\": {e}"))),
            AwsCredentialsConfig::Container => Ok(()),
        }
    }
}

/// The shared checks of `api`, and EC2's endpoint is an `http(s)` URL.
fn validate_api(api: &ApiConfig) -> Result<(), String> {
    api.validate()?;
    match &api.endpoint {
        Some(url) => check_url("api.endpoint", url),
        None => Ok(()),
    }
}

/// An `http(s)` URL with a host, or `Err` naming `key`.
fn check_url(key: &str, url: &str) -> Result<(), String> {
    let ok = url
        .parse::<http::Uri>()
        .ok()
        .is_some_and(|u| u.scheme().is_some() && u.host().is_some());
    if !ok {
        return Err(format!("{key} {url:?} is not an http(s) URL"));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
