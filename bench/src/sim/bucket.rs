//! EC2's request throttling: one token bucket per API action and account
//! (and Region), with the default sizes and refill rates AWS documents.
//!
//! Source: "Request throttling for the Amazon EC2 API",
//! <https://docs.aws.amazon.com/ec2/latest/devguide/ec2-api-throttling.html>
//! (read 2026-11-23 from a stored copy of the page). The page says each API
//! action is evaluated individually ("Limits are applied to individual API
//! actions, not API action categories"); an action listed under
//! "Uncategorized actions" has its own numbers, the others take their
//! category's. A request takes one token; a bucket below its capacity gets
//! its refill "every second"; an empty bucket answers `RequestLimitExceeded`.

use std::time::Duration;

use crate::stats::float;

/// The EC2 calls enim's AWS backend makes (`provider/aws/src/client/mod.rs`).
/// DescribeNetworkInterfaces is two entries: with `Filter.N` and
/// `MaxResults` it draws from the non-mutating bucket; by
/// `NetworkInterfaceId.1` alone it sends neither a filter nor pagination,
/// which the page puts in the smaller "unfiltered and unpaginated" bucket
/// (whether an id list counts as a filter the page does not say; we assume
/// not, the stricter reading).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Action {
    DescribeInstanceTypes,
    DescribeNetworkInterfacesFiltered,
    DescribeNetworkInterfacesById,
    CreateNetworkInterface,
    AttachNetworkInterface,
    ModifyNetworkInterfaceAttribute,
    DetachNetworkInterface,
    DeleteNetworkInterface,
}

pub const ACTIONS: [Action; 8] = [
    Action::DescribeInstanceTypes,
    Action::DescribeNetworkInterfacesFiltered,
    Action::DescribeNetworkInterfacesById,
    Action::CreateNetworkInterface,
    Action::AttachNetworkInterface,
    Action::ModifyNetworkInterfaceAttribute,
    Action::DetachNetworkInterface,
    Action::DeleteNetworkInterface,
];

pub const SOURCE_URL: &str =
    "https://docs.aws.amazon.com/ec2/latest/devguide/ec2-api-throttling.html";

/// A bucket's documented default.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limit {
    pub capacity: f64,
    /// Tokens added per second.
    pub refill: f64,
    /// The page's row this comes from.
    pub row: &'static str,
}

impl Action {
    /// The EC2 API action name.
    pub fn api(self) -> &'static str {
        match self {
            Action::DescribeInstanceTypes => "DescribeInstanceTypes",
            Action::DescribeNetworkInterfacesFiltered | Action::DescribeNetworkInterfacesById => {
                "DescribeNetworkInterfaces"
            }
            Action::CreateNetworkInterface => "CreateNetworkInterface",
            Action::AttachNetworkInterface => "AttachNetworkInterface",
            Action::ModifyNetworkInterfaceAttribute => "ModifyNetworkInterfaceAttribute",
            Action::DetachNetworkInterface => "DetachNetworkInterface",
            Action::DeleteNetworkInterface => "DeleteNetworkInterface",
        }
    }

    /// A name for tables and JSON keys, telling the two describes apart.
    pub fn key(self) -> &'static str {
        match self {
            Action::DescribeNetworkInterfacesFiltered => "DescribeNetworkInterfaces(filtered)",
            Action::DescribeNetworkInterfacesById => "DescribeNetworkInterfaces(by id)",
            other => other.api(),
        }
    }

    /// Creates, modifies or deletes (the page's "mutating"); the rest read.
    pub fn mutating(self) -> bool {
        !matches!(
            self,
            Action::DescribeInstanceTypes
                | Action::DescribeNetworkInterfacesFiltered
                | Action::DescribeNetworkInterfacesById
        )
    }

    pub fn limit(self) -> Limit {
        let (capacity, refill, row) = match self {
            Action::DescribeInstanceTypes | Action::DescribeNetworkInterfacesFiltered => {
                (100.0, 20.0, "Non-mutating actions")
            }
            Action::DescribeNetworkInterfacesById => (
                50.0,
                10.0,
                "Unfiltered and unpaginated non-mutating actions",
            ),
            Action::AttachNetworkInterface | Action::DetachNetworkInterface => {
                (50.0, 5.0, "Mutating actions")
            }
            Action::CreateNetworkInterface
            | Action::ModifyNetworkInterfaceAttribute
            | Action::DeleteNetworkInterface => (100.0, 5.0, "Uncategorized actions (own row)"),
        };
        Limit {
            capacity,
            refill,
            row,
        }
    }
}

/// A token bucket refilled at whole seconds of simulated time, as the page
/// describes ("a set number of tokens is added back to it every second").
/// Starts full.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    limit: Limit,
    tokens: f64,
    /// The whole second of the last refill, counted from the account's start.
    second: u64,
}

impl TokenBucket {
    pub fn new(limit: Limit) -> TokenBucket {
        TokenBucket {
            limit,
            tokens: limit.capacity,
            second: 0,
        }
    }

    /// Takes a token at `now` (since the account's start) if there is one.
    pub fn try_take(&mut self, now: Duration) -> bool {
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Tokens left at `now`.
    #[cfg(test)]
    pub fn tokens(&mut self, now: Duration) -> f64 {
        self.refill(now);
        self.tokens
    }

    fn refill(&mut self, now: Duration) {
        let s = now.as_secs();
        if s > self.second {
            let added = float(s - self.second) * self.limit.refill;
            self.tokens = (self.tokens + added).min(self.limit.capacity);
            self.second = s;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn bucket(capacity: f64, refill: f64) -> TokenBucket {
        TokenBucket::new(Limit {
            capacity,
            refill,
            row: "test",
        })
    }

    #[test]
    fn drains_then_refills_at_whole_seconds_up_to_capacity() {
        let mut b = bucket(50.0, 5.0);
        let t = Duration::from_millis(300);
        assert_eq!((0..60).filter(|_| b.try_take(t)).count(), 50);
        assert!(!b.try_take(999 * MS), "no refill within the first second");
        // Second 1: five tokens, and no more until second 2.
        let t1 = Duration::from_millis(1000);
        assert_eq!((0..10).filter(|_| b.try_take(t1)).count(), 5);
        assert!(!b.try_take(1999 * MS));
        // Ten idle seconds refill 50, capped at the capacity.
        assert_eq!(b.tokens(Duration::from_secs(12)), 50.0);
        assert_eq!(b.tokens(Duration::from_secs(100)), 50.0);
    }

    #[test]
    fn fractional_refill_accumulates() {
        let mut b = bucket(1.0, 0.5);
        assert!(b.try_take(Duration::ZERO));
        assert!(!b.try_take(Duration::from_secs(1)), "half a token");
        assert!(b.try_take(Duration::from_secs(2)));
    }

    #[test]
    fn a_steady_rate_at_the_refill_is_never_throttled() {
        let mut b = bucket(100.0, 20.0);
        // 20 per second for ten minutes, spread within each second.
        for s in 0..600u64 {
            for i in 0..20u64 {
                assert!(
                    b.try_take(Duration::from_secs(s) + Duration::from_millis(i * 40)),
                    "{s}.{i}"
                );
            }
        }
        // One more than the refill per second drains the burst in time.
        let mut b = bucket(100.0, 20.0);
        let throttled = (0..600u64)
            .flat_map(|s| {
                (0..21u64).map(move |i| Duration::from_secs(s) + Duration::from_millis(i * 40))
            })
            .filter(|t| !b.try_take(*t))
            .count();
        // The net drain of one a second empties the burst by second 80;
        // from then on one request a second is turned away.
        assert_eq!(throttled, 520);
    }

    #[test]
    fn documented_defaults() {
        use Action::*;
        let l = |a: Action| (a.limit().capacity, a.limit().refill);
        assert_eq!(l(CreateNetworkInterface), (100.0, 5.0));
        assert_eq!(l(DeleteNetworkInterface), (100.0, 5.0));
        assert_eq!(l(ModifyNetworkInterfaceAttribute), (100.0, 5.0));
        assert_eq!(l(AttachNetworkInterface), (50.0, 5.0));
        assert_eq!(l(DetachNetworkInterface), (50.0, 5.0));
        assert_eq!(l(DescribeNetworkInterfacesFiltered), (100.0, 20.0));
        assert_eq!(l(DescribeNetworkInterfacesById), (50.0, 10.0));
        assert_eq!(l(DescribeInstanceTypes), (100.0, 20.0));
        assert_eq!(ACTIONS.iter().filter(|a| !a.mutating()).count(), 3);
    }
}
