//! enim's Baidu AI Cloud (BCE) backend: whole ENIs from BCE's ENI OpenAPI,
//! discovered through BCC instance metadata, kept warm by the pool
//! (`enim-provider-pool`).
//!
//! - [`config`]: the node's and the operator's configs, the API's settings
//!   in one `api` table.
//! - [`error`]: [`BceError`], what every step fails with.
//! - [`client`]: the ENI OpenAPI client (paging, clientTokens, retries).
//! - [`metadata`]: the instance metadata service (all paths in one place).
//! - [`auth`]: bce-auth-v1 request signing, and where the keys come from.
//! - [`tags`]: the name and description words that make an ENI enim's.
//! - [`idcache`]: the ids of the ENIs attached here, kept for a start
//!   without the API.
//! - `steps`: the API steps the node and the operator take alike.
//! - [`node`]: [`BceBackend`], the [`enim_provider::cloud::CloudBackend`]
//!   the warm pool drives, and [`build`], the started pool `enimd` uses.
//! - [`fleet`]: [`BceFleet`], the operator's
//!   [`enim_provider::fleet::FleetCloud`] for the whole cluster.

pub mod auth;
pub mod client;
pub mod config;
pub mod error;
pub mod fleet;
pub mod idcache;
pub mod metadata;
pub mod node;
mod steps;
pub mod tags;

pub use auth::{Credentials, Secret, ENV_ACCESS_KEY_ID, ENV_SECRET_ACCESS_KEY};
pub use client::{MethodLimits, RetryPolicy};
pub use config::{BceConfig, BceFleetConfig};
pub use enim_core::api_config::ApiConfig;
pub use enim_core::ratelimit::{DEFAULT_MUTATING_RATE, DEFAULT_READ_RATE};
pub use enim_provider_pool::{PoolConfig, PoolRole};
pub use error::BceError;
pub use fleet::BceFleet;
pub use node::{build, start_pool, BackendSettings, BceBackend};
