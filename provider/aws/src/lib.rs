//! enim's AWS backend: secondary ENIs for pods on EC2.
//!
//! - [`config`]: the node's and the operator's configs, the EC2 API's
//!   settings in one `api` table.
//! - [`error`]: [`AwsError`], what every step fails with.
//! - [`client`]: a small SigV4-signed client of the EC2 Query API.
//! - [`metadata`]: instance metadata (IMDSv2): the instance, its
//!   interfaces and their addresses, and the instance role's credentials.
//! - [`credentials`]: where the EC2 client's keys come from; [`iam`]: the
//!   actions they must allow.
//! - [`tags`]: the tags that make an ENI enim's, and which node's and
//!   cluster's.
//! - `steps`: the EC2 steps the node and the operator take alike.
//! - [`node`]: [`AwsBackend`], the [`enim_provider::cloud::CloudBackend`]
//!   the warm pool drives, and [`build`], the started pool `enimd` uses.
//! - [`fleet`]: [`AwsFleet`], the operator's
//!   [`enim_provider::fleet::FleetCloud`] for the whole cluster.

pub mod client;
pub mod config;
pub mod credentials;
pub mod error;
pub mod fleet;
pub mod iam;
pub mod metadata;
pub mod node;
mod steps;
pub mod tags;

pub use config::{AwsConfig, AwsCredentialsConfig, AwsFleetConfig};
pub use enim_core::api_config::ApiConfig;
pub use enim_provider_pool::{PoolConfig, PoolRole};
pub use error::AwsError;
pub use fleet::AwsFleet;
pub use iam::{fleet_iam_actions, FLEET_EXTRA_IAM_ACTIONS, REQUIRED_IAM_ACTIONS};
pub use metadata::SETTLE_BACKOFF;
pub use node::{build, build_with, AwsBackend};
pub use steps::DETACH_BACKOFF;
pub use tags::{TAG_MANAGED, TAG_NODE};
