//! enim's shared core: the vocabulary every crate speaks (ENIs, their
//! owners and addresses, [`MacAddr`], [`ProviderError`], the node's
//! [`Mode`], a warm pool's [`Watermarks`]) and the plumbing they share
//! (retry and rate limits for cloud calls, atomic file writes, crash
//! points for tests, locking, and reading configs whose keys moved).
//! Nothing here talks to a cloud, the kernel or Kubernetes; the provider
//! traits built on it live in `enim-provider`.

pub mod api_config;
pub mod atomic_file;
mod checks;
pub mod config_keys;
mod eni;
mod error;
pub mod fault;
mod mac;
mod mode;
pub mod pacing;
pub mod ratelimit;
pub mod reserved;
pub mod retry;
mod secret;
pub mod sync;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod watermarks;

pub use checks::{check_allocate_wait, check_at_least, MAX_ALLOCATE_WAIT};
pub use eni::{
    AddressCount, AddressLimits, Eni, EniOwner, LimitsConfig, Placement, PodRef, PoolStatistics,
    StoredAddresses,
};
pub use error::{with_causes, ProviderError};
pub use mac::{MacAddr, MacParseError};
pub use mode::Mode;
pub use secret::Secret;
pub use watermarks::Watermarks;
