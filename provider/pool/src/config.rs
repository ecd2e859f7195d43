//! The pool's config (watermarks, loop timing, the reaper's), its role,
//! and its statistics.
//!
//! The watermarks are enim-core's [`Watermarks`], under the keys the
//! operator's and secondary mode's pools use; `min_allocate` does not
//! apply to a node's ENIs (always 0). A file with the old keys
//! (`min_free`, `max_free`) is still read, with a warning each: see
//! [`FREE_RANGE_MOVES`].

use std::time::Duration;

use enim_core::config_keys::{self, ConfigKeys, KeyError, KeyMove};
use enim_core::retry::Backoff;
use enim_core::{check_allocate_wait, check_at_least, Mode, ProviderError, Watermarks};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Watermarks and loop timing of the warm pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self", default, deny_unknown_fields)]
pub struct PoolConfig {
    /// Free ENIs kept attached ahead of demand (PreAllocate).
    pub pre_allocate: u32,
    /// Free ENIs beyond `pre_allocate` kept; more are detached and deleted
    /// (MaxAboveWatermark).
    pub max_above_watermark: u32,
    /// The first retry after a failed round, doubling per failure; each
    /// delay is drawn from the upper half of its step (jitter).
    #[serde(with = "humantime_serde")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub initial_retry: Duration,
    /// The longest retry step.
    #[serde(with = "humantime_serde")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub max_backoff: Duration,
    /// The longest pause between rounds when nothing failed and nothing
    /// woke the pool (jittered); rounds on this timer also compare the
    /// pool with what instance metadata shows attached.
    #[serde(with = "humantime_serde")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub resync_interval: Duration,
    /// ENIs created at once while the pool is more than one below
    /// `pre_allocate` (at least 1): an attach takes about 10 s, so creating
    /// them one at a time makes the n-th pod of a burst wait n × 10 s.
    /// Bounded, because the account's API buckets are shared by the whole
    /// fleet.
    pub max_parallel_creates: usize,
    /// Between two passes of the fleet-wide reaper (jittered; the first
    /// from all of it, so nodes started together do not reap together).
    /// Off unless the provider names a `cluster`.
    #[serde(with = "humantime_serde")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub reap_interval: Duration,
    /// The reaper spares ENIs younger than this (by their creation tag),
    /// since a new ENI is unattached between its create and its attach; at
    /// least `1m`.
    #[serde(with = "humantime_serde")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub reap_cooldown: Duration,
    /// How long an ADD that finds no free ENI waits for one on its way
    /// (created, or attached from outside) before answering "try again
    /// later", while the pool can still bring one (room on the instance,
    /// the cloud answering). The kubelet retries a failed sandbox only
    /// after 10-15 s: without the wait a pod is ready up to that long after
    /// its ENI landed. The default covers two attaches on EC2 (8-12 s
    /// each), one after the other. `"0s"` turns the wait off; at most 25 s.
    #[serde(with = "humantime_serde")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub allocate_wait: Duration,
}

pub use enim_core::MAX_ALLOCATE_WAIT;

/// The pool's keys before it spoke in watermarks, read where they moved,
/// each with a warning: `min_free` is `pre_allocate` renamed; `max_free`,
/// a bound on the free ENIs, is read as `max_above_watermark` =
/// `max_free` - `pre_allocate`. What a file with old keys leaves out
/// takes the old defaults (`min_free` 1, `max_free` 3), so it keeps
/// meaning what it meant.
pub const FREE_RANGE_MOVES: &[KeyMove] = &[MIN_FREE, MAX_FREE];

const MIN_FREE: KeyMove = KeyMove {
    old: "min_free",
    new: "pre_allocate",
};
const MAX_FREE: KeyMove = KeyMove {
    old: "max_free",
    new: "max_above_watermark",
};

/// The old defaults of [`FREE_RANGE_MOVES`]' keys.
const OLD_MIN_FREE: u32 = 1;
const OLD_MAX_FREE: u32 = 3;

enim_core::serde_with_moved_keys!(
    PoolConfig,
    ConfigKeys {
        section: "provider.pool",
        moves: &[],
        api_defaults: None,
        rewrite: Some(read_free_range),
    }
);

/// The [`config_keys::Rewrite`] of [`FREE_RANGE_MOVES`].
fn read_free_range(section: &str, table: &mut Map<String, Value>) -> Result<Vec<String>, String> {
    let key_error = |e: KeyError| e.to_string();
    let (min_move, max_move) = (&MIN_FREE, &MAX_FREE);
    let min_free = config_keys::take_old(section, table, min_move).map_err(key_error)?;
    let max_free = config_keys::take_old(section, table, max_move).map_err(key_error)?;
    if min_free.is_none() && max_free.is_none() {
        return Ok(Vec::new());
    }
    let invalid = |why: String| format!("[{section}] {why}");
    let number = |key: &str, value: Option<&Value>, default: u32| match value {
        None => Ok(default),
        Some(v) => u32::deserialize(v).map_err(|e| invalid(format!("{key}: {e}"))),
    };
    let pre = match &min_free {
        Some(v) => number(min_move.old, Some(v), OLD_MIN_FREE)?,
        None => number(
            min_move.new,
            config_keys::get(table, min_move.new),
            OLD_MIN_FREE,
        )?,
    };
    // The bound the file meant: its max_free, or the old default when it
    // set only min_free (and no max_above_watermark of its own).
    let bound = match &max_free {
        Some(v) => Some(number(max_move.old, Some(v), OLD_MAX_FREE)?),
        None if config_keys::get(table, max_move.new).is_none() => Some(OLD_MAX_FREE),
        None => None,
    };
    let mut warnings = Vec::new();
    if min_free.is_some() {
        config_keys::insert(section, table, min_move.new, pre.into()).map_err(key_error)?;
        warnings.push(min_move.deprecation(section));
    }
    if let Some(bound) = bound {
        let above = Watermarks::from_free_range(pre, bound)
            .map_err(invalid)?
            .max_above_watermark;
        config_keys::insert(section, table, max_move.new, above.into()).map_err(key_error)?;
    }
    if max_free.is_some() {
        warnings.push(format!(
            "[{section}] {} is deprecated: it is read as {} = {} - {}; write {} instead",
            max_move.old, max_move.new, max_move.old, min_move.new, max_move.new
        ));
    }
    Ok(warnings)
}

/// The shortest `reap_cooldown` accepted: an ENI's create and attach,
/// with their retries and token waits, take well under it.
pub const MIN_REAP_COOLDOWN: Duration = Duration::from_secs(60);

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            pre_allocate: 1,
            max_above_watermark: 2,
            initial_retry: Duration::from_secs(1),
            max_backoff: Duration::from_secs(60),
            resync_interval: Duration::from_secs(30),
            max_parallel_creates: 2,
            reap_interval: Duration::from_secs(3600),
            reap_cooldown: Duration::from_secs(600),
            allocate_wait: Duration::from_secs(20),
        }
    }
}

impl PoolConfig {
    /// The pool's watermarks (`min_allocate` 0: see the module comment).
    pub fn watermarks(&self) -> Watermarks {
        Watermarks {
            pre_allocate: self.pre_allocate,
            min_allocate: 0,
            max_above_watermark: self.max_above_watermark,
        }
    }

    /// The delays between failed rounds.
    pub fn retry_backoff(&self) -> Backoff {
        Backoff::new(self.initial_retry, self.max_backoff)
    }

    pub fn validate(&self) -> Result<(), ProviderError> {
        let bad = |why: String| ProviderError::Config(format!("warm pool: {why}"));
        if self.initial_retry.is_zero() {
            return Err(bad("initial_retry must be above zero".into()));
        }
        check_at_least(
            ("max_backoff", self.max_backoff),
            ("initial_retry", self.initial_retry),
        )
        .map_err(bad)?;
        if self.resync_interval.is_zero() {
            return Err(bad("resync_interval must be above zero".into()));
        }
        if self.max_parallel_creates == 0 {
            return Err(bad("max_parallel_creates must be at least 1".into()));
        }
        if self.reap_interval.is_zero() {
            return Err(bad("reap_interval must be above zero".into()));
        }
        check_at_least(
            ("reap_cooldown", self.reap_cooldown),
            ("the minimum", MIN_REAP_COOLDOWN),
        )
        .map_err(bad)?;
        check_allocate_wait(self.allocate_wait).map_err(bad)?;
        Ok(())
    }
}

/// What the pool's ENIs are for, fixed at start by the agent's mode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PoolRole {
    /// Primary mode: each ENI goes to one pod; the watermarks keep free
    /// ENIs ahead of demand and detach the surplus.
    #[default]
    PodEnis,
    /// Secondary mode: every ENI serves the node's pods by its secondary
    /// addresses. The watermarks do not apply (an ENI is never detached
    /// for being "free"); the agent's address pool attaches one more
    /// through [`SecondaryIps::attach_eni`](enim_provider::SecondaryIps::attach_eni) when the attached ones are full.
    HostEnis,
}

impl From<Mode> for PoolRole {
    /// The one mapping from the agent's mode to what its pool's ENIs are for.
    fn from(mode: Mode) -> Self {
        match mode {
            Mode::Primary => PoolRole::PodEnis,
            Mode::Secondary => PoolRole::HostEnis,
        }
    }
}

/// Pool statistics (CCE/cilium IPAM `Statistics`, counted in ENIs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolStats {
    /// ENIs assigned to an owner.
    pub used: usize,
    /// Free ENIs that can be allocated now (not being detached).
    pub available: usize,
    /// ENIs still to create to reach `pre_allocate`, bounded by
    /// `remaining_interfaces`.
    pub needed: usize,
    /// Free ENIs above `pre_allocate` + `max_above_watermark`.
    pub excess: usize,
    /// ENIs the instance may still attach: the limit minus the primary
    /// minus every ENI the pool holds.
    pub remaining_interfaces: usize,
}
