//! The `[provider]` section of `enimd`'s config when `type = "aws"`.

use std::time::Duration;

use enim_provider::check_at_least;
use enim_provider::cloud::validate_cluster_name;
use enim_provider::ratelimit::RateLimit;
use enim_provider_pool::PoolConfig;
use serde::{Deserialize, Serialize};

use crate::ec2::RetryPolicy;

pub const DEFAULT_IMDS_ENDPOINT: &str = "http://169.254.169.254";

/// Every key is optional: what is left out takes its value from
/// [`AwsConfig::default`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AwsConfig {
    /// EC2 region; default: the instance's, from instance metadata.
    pub region: Option<String>,
    /// Instance metadata service (scheme and authority).
    pub imds_endpoint: String,
    /// EC2 API endpoint; default `https://ec2.<region>.amazonaws.com`.
    pub ec2_endpoint: Option<String>,
    /// Subnet for new ENIs; default: the primary interface's subnet.
    pub subnet_id: Option<String>,
    /// Security groups for new ENIs; default: the VPC's default group.
    pub security_group_ids: Vec<String>,
    /// Give each new ENI one IPv6 address (the subnet needs an IPv6 block).
    pub assign_ipv6: bool,
    /// MTU for pod interfaces; default: keep the device's own.
    pub mtu: Option<u32>,
    /// How long to wait for instance metadata to show a new attachment.
    #[serde(with = "humantime_serde")]
    pub metadata_wait: Duration,
    /// How long to wait for a detach to finish before giving up (the pool
    /// retries later).
    #[serde(with = "humantime_serde")]
    pub detach_timeout: Duration,
    /// EC2 calls: attempts in all for throttled or failed requests.
    pub api_attempts: u32,
    /// EC2 calls: first retry delay (doubles, with jitter).
    #[serde(with = "humantime_serde")]
    pub api_backoff: Duration,
    /// EC2 calls: retry delay bound.
    #[serde(with = "humantime_serde")]
    pub api_max_backoff: Duration,
    /// EC2 mutating actions (create, attach, modify, detach, delete): this
    /// agent's own token bucket. Well under the account's buckets (5 per
    /// second, 50 to 100 deep), which every node of every cluster in the
    /// account shares.
    pub api_mutating_rate: RateLimit,
    /// EC2 describe actions: this agent's own token bucket (the account's:
    /// 10 to 20 per second, 50 to 100 deep).
    pub api_describe_rate: RateLimit,
    /// The cluster's name: new ENIs are tagged `enim.io/cluster=<it>`, and
    /// the fleet-wide reaper deletes this cluster's ENIs left unattached.
    /// Unset: no cluster tag, reaper off.
    pub cluster: Option<String>,
    /// Warm-pool watermarks and timing.
    pub pool: PoolConfig,
}

/// Defaults of `api_mutating_rate` and `api_describe_rate` (shared with
/// BCE).
pub use enim_provider::ratelimit::{
    DEFAULT_MUTATING_RATE, DEFAULT_READ_RATE as DEFAULT_DESCRIBE_RATE,
};

impl Default for AwsConfig {
    fn default() -> Self {
        AwsConfig {
            region: None,
            imds_endpoint: DEFAULT_IMDS_ENDPOINT.into(),
            ec2_endpoint: None,
            subnet_id: None,
            security_group_ids: Vec::new(),
            assign_ipv6: false,
            mtu: None,
            metadata_wait: Duration::from_secs(60),
            detach_timeout: Duration::from_secs(120),
            api_attempts: 5,
            api_backoff: Duration::from_millis(200),
            api_max_backoff: Duration::from_secs(10),
            api_mutating_rate: DEFAULT_MUTATING_RATE,
            api_describe_rate: DEFAULT_DESCRIBE_RATE,
            cluster: None,
            pool: PoolConfig::default(),
        }
    }
}

impl AwsConfig {
    pub fn retry_policy(&self) -> RetryPolicy {
        self.api().retry_policy()
    }

    /// Its EC2 API settings, as the operator's config has them too.
    pub fn api(&self) -> Ec2ApiConfig {
        Ec2ApiConfig {
            attempts: self.api_attempts,
            backoff: self.api_backoff,
            max_backoff: self.api_max_backoff,
            mutating_rate: self.api_mutating_rate,
            describe_rate: self.api_describe_rate,
        }
    }

    pub fn validate(&self) -> Result<(), String> {
        if let Err(e) = self.pool.validate() {
            return Err(format!("aws: {e}"));
        }
        self.api()
            .validate("api_")
            .map_err(|e| format!("aws: {e}"))?;
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
        for (key, url) in [
            ("imds_endpoint", Some(&self.imds_endpoint)),
            ("ec2_endpoint", self.ec2_endpoint.as_ref()),
        ] {
            if let Some(url) = url {
                check_url(key, url).map_err(|e| format!("aws: {e}"))?;
            }
        }
        Ok(())
    }
}

/// How an EC2 client retries and how fast it may call: the `api_*` keys
/// of [`AwsConfig`], and the `[api]` table of the operator's
/// [`crate::fleet::AwsFleetConfig`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Ec2ApiConfig {
    /// Attempts in all for throttled or failed requests.
    pub attempts: u32,
    /// First retry delay (doubles, with jitter).
    #[serde(with = "humantime_serde")]
    pub backoff: Duration,
    /// Retry delay bound.
    #[serde(with = "humantime_serde")]
    pub max_backoff: Duration,
    /// Mutating actions (create, attach, modify, detach, delete): this
    /// client's own token bucket, well under the account's (which every
    /// caller in the account shares).
    pub mutating_rate: RateLimit,
    /// Describe actions: this client's own token bucket.
    pub describe_rate: RateLimit,
}

impl Default for Ec2ApiConfig {
    fn default() -> Self {
        AwsConfig::default().api()
    }
}

impl Ec2ApiConfig {
    pub fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy {
            attempts: self.attempts,
            initial: self.backoff,
            max: self.max_backoff,
        }
    }

    /// `Err` names the key, as `prefix` + its name (`api_` in enimd's
    /// config, `api.` in the operator's).
    pub fn validate(&self, prefix: &str) -> Result<(), String> {
        if self.attempts == 0 {
            return Err(format!("{prefix}attempts must be at least 1"));
        }
        check_at_least(
            (&format!("{prefix}max_backoff"), self.max_backoff),
            (&format!("{prefix}backoff"), self.backoff),
        )?;
        for (key, rate) in [
            ("mutating_rate", &self.mutating_rate),
            ("describe_rate", &self.describe_rate),
        ] {
            rate.validate().map_err(|e| format!("{prefix}{key}: {e}"))?;
        }
        Ok(())
    }
}

/// An `http(s)` URL with a host, or `Err` naming `key`.
pub(crate) fn check_url(key: &str, url: &str) -> Result<(), String> {
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
mod tests {
    use super::*;

    #[test]
    fn minimal_config_takes_defaults() {
        let c: AwsConfig = toml::from_str("").unwrap();
        assert_eq!(c, AwsConfig::default());
        assert_eq!(c.imds_endpoint, "http://169.254.169.254");
        assert_eq!(c.region, None);
        assert_eq!(c.pool, PoolConfig::default());
        c.validate().unwrap();
    }

    #[test]
    fn full_config_parses() {
        let c: AwsConfig = toml::from_str(
            r#"
            region = "eu-west-1"
            imds_endpoint = "http://127.0.0.1:1338"
            ec2_endpoint = "http://127.0.0.1:5000"
            subnet_id = "subnet-0abc"
            security_group_ids = ["sg-1", "sg-2"]
            assign_ipv6 = true
            mtu = 9001
            metadata_wait = "30s"
            detach_timeout = "1m"
            api_attempts = 3
            api_backoff = "100ms"
            api_max_backoff = "5s"
            api_mutating_rate = { every = "2s", burst = 3 }
            api_describe_rate = { every = "100ms", burst = 20 }
            cluster = "prod-eu"
            [pool]
            min_free = 2
            max_free = 4
            "#,
        )
        .unwrap();
        assert_eq!(c.region.as_deref(), Some("eu-west-1"));
        assert_eq!(c.security_group_ids, ["sg-1", "sg-2"]);
        assert_eq!(c.metadata_wait, Duration::from_secs(30));
        assert_eq!(c.api_backoff, Duration::from_millis(100));
        assert_eq!((c.pool.min_free, c.pool.max_free), (2, 4));
        assert_eq!(
            c.api_mutating_rate,
            RateLimit::new(Duration::from_secs(2), 3)
        );
        assert_eq!(
            c.api_describe_rate,
            RateLimit::new(Duration::from_millis(100), 20)
        );
        assert_eq!(c.cluster.as_deref(), Some("prod-eu"));
        c.validate().unwrap();
    }

    #[test]
    fn unknown_keys_and_bad_values_are_rejected() {
        let e = toml::from_str::<AwsConfig>("regoin = \"x\"").unwrap_err();
        assert!(e.to_string().contains("regoin"), "{e}");
        let e = toml::from_str::<AwsConfig>("[pool]\nmin_fre = 1").unwrap_err();
        assert!(e.to_string().contains("min_fre"), "{e}");

        // Each change to the defaults and what the error must name.
        type Change = fn(&mut AwsConfig);
        let cases: [(Change, &str); 8] = [
            (|c| c.api_attempts = 0, "api_attempts"),
            (
                |c| {
                    c.api_backoff = Duration::from_secs(2);
                    c.api_max_backoff = Duration::from_secs(1);
                },
                "api_max_backoff",
            ),
            (|c| c.mtu = Some(100), "mtu"),
            (
                |c| c.ec2_endpoint = Some("ec2.local".into()),
                "ec2_endpoint",
            ),
            (
                |c| c.api_mutating_rate = RateLimit::new(Duration::from_secs(1), 0),
                "api_mutating_rate: burst",
            ),
            (
                |c| c.api_describe_rate = RateLimit::new(Duration::ZERO, 5),
                "api_describe_rate: every",
            ),
            (|c| c.cluster = Some("no spaces".into()), "cluster"),
            (
                |c| {
                    c.pool.min_free = 5;
                    c.pool.max_free = 1;
                },
                "max_free",
            ),
        ];
        for (change, needle) in cases {
            let mut c = AwsConfig::default();
            change(&mut c);
            let e = c.validate().unwrap_err();
            assert!(e.contains(needle), "{needle}: {e}");
        }
    }
}
