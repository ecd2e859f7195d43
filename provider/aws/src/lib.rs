//! enim's AWS backend: secondary ENIs for pods on EC2.
//!
//! - [`imds`]: instance metadata (IMDSv2) — the instance, its interfaces and
//!   their addresses, and the instance role's credentials.
//! - [`ec2`]: a small SigV4-signed client of the EC2 Query API.
//! - [`backend`]: [`AwsBackend`], the [`enim_provider::cloud::CloudBackend`]
//!   the warm pool drives.
//! - [`build`]: a started [`WarmPool`] over it, as `enimd` uses it.
//! - [`fleet`]: [`AwsFleet`], the operator's
//!   [`enim_provider::fleet::FleetCloud`] for the whole cluster, on the
//!   same EC2 steps (`steps`) as the node's backend.

pub mod backend;
pub mod config;
pub mod credentials;
pub mod ec2;
pub mod fleet;
pub mod imds;
mod steps;

use std::sync::Arc;

use aws_credential_types::Credentials;
use enim_provider::{EniProvider, ProviderError};
use enim_provider_pool::WarmPool;

pub use backend::{AwsBackend, AwsError, DETACH_BACKOFF, TAG_MANAGED, TAG_NODE};
pub use config::{AwsConfig, Ec2ApiConfig};
pub use enim_provider_pool::{PoolConfig, PoolRole};
pub use fleet::{fleet_iam_actions, AwsCredentialsConfig, AwsFleet, AwsFleetConfig};
pub use imds::SETTLE_BACKOFF;

/// The AWS provider for `enimd`: discovers the instance, then starts a
/// warm pool over the EC2 backend. Credentials come from the environment,
/// else the instance role.
pub async fn build(
    config: &AwsConfig,
    role: PoolRole,
) -> Result<Arc<dyn EniProvider>, ProviderError> {
    let pool: Arc<dyn EniProvider> = build_with(config, None, role).await?;
    Ok(pool)
}

/// As [`build`], with fixed credentials when given, returning the pool
/// itself (for its statistics and shutdown).
pub async fn build_with(
    config: &AwsConfig,
    credentials: Option<Credentials>,
    role: PoolRole,
) -> Result<Arc<WarmPool>, ProviderError> {
    let backend = AwsBackend::discover_with(config, credentials).await?;
    WarmPool::start_as(Arc::new(backend), config.pool.clone(), role).await
}

/// The IAM actions the node's credentials must allow. `ec2:CreateTags`
/// covers the tags set on create (TagSpecification).
pub const REQUIRED_IAM_ACTIONS: &[&str] = &[
    "ec2:DescribeInstanceTypes",
    "ec2:DescribeNetworkInterfaces",
    "ec2:CreateNetworkInterface",
    "ec2:CreateTags",
    "ec2:AttachNetworkInterface",
    "ec2:ModifyNetworkInterfaceAttribute",
    "ec2:DetachNetworkInterface",
    "ec2:DeleteNetworkInterface",
    // Secondary mode.
    "ec2:AssignPrivateIpAddresses",
    "ec2:UnassignPrivateIpAddresses",
    "ec2:AssignIpv6Addresses",
    "ec2:UnassignIpv6Addresses",
];
