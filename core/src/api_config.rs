//! [`ApiConfig`]: how a cloud provider reaches its cloud's API, with the
//! same keys on every cloud. It is the `api` table of each cloud's node
//! config (enimd's `[provider.api]`) and fleet config (the operator's
//! `[cloud.api]`); what only one cloud has stays a key of that cloud's
//! config.
//!
//! Invariants once [`ApiConfig::validate`] passed: at least one attempt,
//! `max_backoff` at least `backoff`, and both rates usable token buckets.
//! The endpoint is checked by the cloud's client, which knows its form.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::check_at_least;
use crate::ratelimit::{RateLimit, DEFAULT_MUTATING_RATE, DEFAULT_READ_RATE};
use crate::retry::RetryPolicy;

/// Every key has a default; a cloud whose defaults differ starts from
/// [`ApiConfig::default`] and changes those (see
/// [`crate::config_keys::read_config`], which fills a partial table from
/// them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct ApiConfig {
    /// The API's URL.
    ///
    /// Default: the region's: aws `https://ec2.<region>.amazonaws.com`
    /// (`.com.cn` in `cn-*`), bce `https://bcc.<region>.baidubce.com`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Tries per call on throttling, 5xx and network errors (at least 1).
    pub max_attempts: u32,
    /// The first jittered backoff between tries, doubling...
    #[serde(with = "humantime_serde")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub backoff: Duration,
    /// ...up to this step.
    #[serde(with = "humantime_serde")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub max_backoff: Duration,
    /// This process's own token bucket for calls that change something
    /// (aws: every action but `Describe*`, `Get*` and `List*`; bce: every
    /// request but a GET), well under the account's, which every node of
    /// every cluster in the account shares.
    pub mutating_rate: RateLimit,
    /// ...and for reads (aws: `Describe*`, `Get*`, `List*`; bce: GETs).
    pub read_rate: RateLimit,
}

impl Default for ApiConfig {
    /// 5 attempts, 200 ms doubling to 10 s, the shared default rates.
    fn default() -> Self {
        ApiConfig {
            endpoint: None,
            max_attempts: 5,
            backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(10),
            mutating_rate: DEFAULT_MUTATING_RATE,
            read_rate: DEFAULT_READ_RATE,
        }
    }
}

impl ApiConfig {
    /// `Err` names the key as it is written in a config, `api.<key>`.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_attempts == 0 {
            return Err("api.max_attempts must be at least 1".into());
        }
        check_at_least(
            ("api.max_backoff", self.max_backoff),
            ("api.backoff", self.backoff),
        )?;
        for (key, rate) in [
            ("api.mutating_rate", &self.mutating_rate),
            ("api.read_rate", &self.read_rate),
        ] {
            rate.validate().map_err(|e| format!("{key}: {e}"))?;
        }
        Ok(())
    }

    /// How the client retries a call.
    pub fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy {
            attempts: self.max_attempts,
            initial: self.backoff,
            max: self.max_backoff,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_the_key() {
        ApiConfig::default().validate().unwrap();
        type Change = fn(&mut ApiConfig);
        let cases: [(Change, &str); 4] = [
            (|c| c.max_attempts = 0, "api.max_attempts"),
            (|c| c.max_backoff = Duration::ZERO, "api.max_backoff"),
            (|c| c.mutating_rate.burst = 0, "api.mutating_rate: burst"),
            (
                |c| c.read_rate.every = Duration::ZERO,
                "api.read_rate: every",
            ),
        ];
        for (change, needle) in cases {
            let mut c = ApiConfig::default();
            change(&mut c);
            let e = c.validate().unwrap_err();
            assert!(e.contains(needle), "{needle}: {e}");
        }
    }

    #[test]
    fn retry_policy_is_the_three_retry_keys() {
        let c = ApiConfig {
            max_attempts: 3,
            backoff: Duration::from_millis(10),
            max_backoff: Duration::from_secs(1),
            ..ApiConfig::default()
        };
        assert_eq!(
            c.retry_policy(),
            RetryPolicy {
                attempts: 3,
                initial: Duration::from_millis(10),
                max: Duration::from_secs(1),
            }
        );
    }
}
