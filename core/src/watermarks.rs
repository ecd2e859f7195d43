//! [`Watermarks`]: how many ENIs (primary mode) or pod addresses
//! (secondary mode) a warm pool keeps, in CCE's and cilium's IPAM terms,
//! and the one arithmetic every pool runs on them: the agent's ENI pool
//! (`provider/pool`), its address pool (secondary mode) and the
//! operator's plan for each node.
//!
//! Invariant: a pool short of its watermarks is never also above them
//! ([`Watermarks::deficit`] and [`Watermarks::surplus`] are never both
//! above zero for the same [`Level`]).

use serde::{Deserialize, Serialize};

use crate::check_at_least;

/// The watermarks of CCE's IPAM (`PreAllocate`, `MinAllocate`,
/// `MaxAboveWatermark`), in ENIs (primary) or addresses (secondary).
/// Serialized as the NetResourceSet spec writes them (camelCase); each
/// config file reads them under its own (snake_case) keys.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Watermarks {
    /// Free ones to keep ahead of demand.
    pub pre_allocate: u32,
    /// The fewest a node ever has, used or free.
    pub min_allocate: u32,
    /// Free ones beyond `preAllocate` tolerated before the surplus goes
    /// back to the cloud.
    pub max_above_watermark: u32,
}

/// Where a pool stands: what it holds and who waits for one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Level {
    /// Free now (and, where the caller counts them so, on their way).
    pub free: usize,
    /// Held in all, used or free.
    pub total: usize,
    /// Pods told "try again later" for want of one: demand on top of
    /// `pre_allocate`, never surplus.
    pub waiting: usize,
}

/// A watermark as a count (a `u32` always fits a `usize` on the targets
/// enim builds for; saturating keeps the arithmetic total regardless).
fn count(n: u32) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

impl Watermarks {
    /// The pool's old pair of keys (`min_free` free at least, `max_free`
    /// at most) as watermarks; `Err` names both when `max_free` is below
    /// `min_free`.
    pub fn from_free_range(min_free: u32, max_free: u32) -> Result<Watermarks, String> {
        check_at_least(("max_free", max_free), ("min_free", min_free))?;
        Ok(Watermarks {
            pre_allocate: min_free,
            min_allocate: 0,
            max_above_watermark: max_free - min_free,
        })
    }

    /// The most free ones kept when no pod waits: `pre_allocate` plus
    /// `max_above_watermark`.
    pub fn high(&self) -> usize {
        count(self.pre_allocate).saturating_add(count(self.max_above_watermark))
    }

    /// `max_above_watermark` as a count: what a pool that grows at all may
    /// add beyond its need, so demand arriving one by one costs a cloud
    /// call per few, not one each.
    pub fn headroom(&self) -> usize {
        count(self.max_above_watermark)
    }

    /// How many to add: the free ones short of `pre_allocate` plus the
    /// waiting pods, or the total short of `min_allocate`, whichever is
    /// more.
    pub fn deficit(&self, level: Level) -> usize {
        let want_free = count(self.pre_allocate).saturating_add(level.waiting);
        want_free
            .saturating_sub(level.free)
            .max(count(self.min_allocate).saturating_sub(level.total))
    }

    /// How many may go: the free ones above [`high`](Self::high) (plus
    /// the waiting pods, who are about to take some), never taking the
    /// total below `min_allocate`.
    pub fn surplus(&self, level: Level) -> usize {
        let keep = self.high().saturating_add(level.waiting);
        level
            .free
            .saturating_sub(keep)
            .min(level.total.saturating_sub(count(self.min_allocate)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wm(pre_allocate: u32, min_allocate: u32, max_above_watermark: u32) -> Watermarks {
        Watermarks {
            pre_allocate,
            min_allocate,
            max_above_watermark,
        }
    }

    fn level(free: usize, total: usize, waiting: usize) -> Level {
        Level {
            free,
            total,
            waiting,
        }
    }

    #[test]
    fn deficit_is_the_larger_of_free_and_total_short() {
        let w = wm(2, 5, 1);
        assert_eq!(w.deficit(level(2, 5, 0)), 0);
        assert_eq!(w.deficit(level(0, 5, 0)), 2, "free short");
        assert_eq!(w.deficit(level(2, 2, 0)), 3, "total short");
        assert_eq!(w.deficit(level(2, 5, 3)), 3, "waiting pods are demand");
    }

    #[test]
    fn surplus_is_above_high_and_never_below_min_allocate() {
        let w = wm(2, 4, 1);
        assert_eq!(w.high(), 3);
        assert_eq!(w.surplus(level(3, 10, 0)), 0, "at high: kept");
        assert_eq!(w.surplus(level(6, 10, 0)), 3);
        assert_eq!(w.surplus(level(6, 5, 0)), 1, "min_allocate holds");
        assert_eq!(w.surplus(level(6, 10, 2)), 1, "waiting pods take some");
    }

    #[test]
    fn never_short_and_above_at_once() {
        for w in [wm(0, 0, 0), wm(2, 4, 1), wm(5, 0, 3), wm(1, 9, 0)] {
            for free in 0..12 {
                for total in free..14 {
                    for waiting in 0..3 {
                        let l = level(free, total, waiting);
                        assert!(w.deficit(l) == 0 || w.surplus(l) == 0, "{w:?} {l:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn the_free_range_is_pre_allocate_and_what_is_above_it() {
        assert_eq!(Watermarks::from_free_range(1, 3), Ok(wm(1, 0, 2)));
        assert_eq!(Watermarks::from_free_range(2, 2), Ok(wm(2, 0, 0)));
        let e = Watermarks::from_free_range(4, 3).unwrap_err();
        assert_eq!(e, "max_free (3) must be >= min_free (4)");
    }

    #[test]
    fn written_as_the_spec_writes_them() {
        let json = serde_json::to_value(wm(1, 2, 3)).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"preAllocate": 1, "minAllocate": 2, "maxAboveWatermark": 3})
        );
    }
}
