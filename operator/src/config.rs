//! The operator's config (`enim-operator.toml`): the cluster it serves, the
//! pool policy it writes into every NetResourceSet (the top-level
//! settings, and per node pool, `[[operator.pools]]`: [`PoolConfig`]), and
//! the pace of its cloud calls (its `api` table, [`ApiRates`], with the
//! rate keys of the clouds' `api` tables).
//!
//! The flat rate keys of before ([`MOVES`]) are still read, with a
//! deprecation warning, through the same [`serde_with_moved_keys!`] the
//! clouds' configs use; a file that sets a key under both names is
//! refused.
//!
//! Invariants once [`OperatorConfig::validate`] passed: the cluster name
//! fits a cloud tag; every interval is above zero; `workers` is at least
//! one; both API rates are usable token buckets; `reap_cooldown` is at
//! least [`MIN_REAP_COOLDOWN`], so a new ENI (unattached between its create
//! and its attach) is never taken for a leak; the pools are valid (see
//! `pools`).
//!
//! [`serde_with_moved_keys!`]: enim_core::serde_with_moved_keys

use std::time::Duration;

use enim_core::config_keys::{ConfigKeys, KeyMove, FLAT_RATE_MOVES};
use enim_core::ratelimit::RateLimit;
use enim_core::{Mode, Watermarks};
use enim_provider::cloud::validate_cluster_name;
use serde::{Deserialize, Serialize};

use crate::policy::DefaultPolicy;

mod pools;

pub use pools::PoolConfig;

/// The shortest `reap_cooldown` accepted (as the agents' pool).
pub const MIN_REAP_COOLDOWN: Duration = Duration::from_secs(60);
/// The most workers accepted: more only queue on the token buckets.
pub const MAX_WORKERS: usize = 256;

/// Mutating calls of the whole cluster: ten a second, twenty at once.
pub const DEFAULT_MUTATING_RATE: RateLimit = RateLimit::new(Duration::from_millis(100), 20);
/// Reads (describes) of the whole cluster: one a second, five at once. A
/// resync lists the cluster once, so this is plenty.
pub const DEFAULT_READ_RATE: RateLimit = RateLimit::new(Duration::from_secs(1), 5);

/// The keys that moved into `api`, named as in the clouds' `api` tables
/// (the AWS node's config moved the same two).
pub const MOVES: &[KeyMove] = &FLAT_RATE_MOVES;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("operator config: {0}")]
    Parse(String),
    #[error("operator config: {key}: {why}")]
    Invalid { key: &'static str, why: String },
    /// A key of one `[[operator.pools]]` table: the pool by its name, or
    /// by its place in the file when it has none.
    #[error("operator config: pool {pool}: {key}: {why}")]
    Pool {
        pool: String,
        key: &'static str,
        why: String,
    },
}

/// The pool's watermarks when the config leaves them out: as the agents'
/// warm pool, one free, at most three.
pub const DEFAULT_WATERMARKS: Watermarks = Watermarks {
    pre_allocate: 1,
    min_allocate: 0,
    max_above_watermark: 2,
};

/// `drain_delay` when the config leaves it out.
pub const DEFAULT_DRAIN_DELAY: Duration = Duration::from_secs(30);

/// The `[watermarks]` table: [`Watermarks`] as the config file spells
/// them (snake case); a key left out keeps [`DEFAULT_WATERMARKS`]'s value.
#[derive(Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(
    remote = "Watermarks",
    default = "default_watermarks",
    deny_unknown_fields
)]
struct WatermarkKeys {
    /// Free ones kept ahead of demand.
    pre_allocate: u32,
    /// The fewest a node has, used or free.
    min_allocate: u32,
    /// Free ones beyond `pre_allocate` before draining.
    max_above_watermark: u32,
}

fn default_watermarks() -> Watermarks {
    DEFAULT_WATERMARKS
}

/// The `[operator.api]` table: the whole cluster's token buckets for cloud
/// calls, which the allocator's calls take from on top of the cloud
/// client's own (`[cloud.api]`). A key left out keeps its default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct ApiRates {
    /// Create, attach, detach, delete, assign, unassign.
    pub mutating_rate: RateLimit,
    /// The cluster listing, instance types.
    pub read_rate: RateLimit,
}

impl Default for ApiRates {
    fn default() -> Self {
        ApiRates {
            mutating_rate: DEFAULT_MUTATING_RATE,
            read_rate: DEFAULT_READ_RATE,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(remote = "Self", default, deny_unknown_fields)]
pub struct OperatorConfig {
    /// The cluster's name: the tag every ENI of the cluster carries
    /// (`[cloud] cluster` takes it when left out and must equal it).
    ///
    /// Default: required.
    pub cluster: String,
    /// How the nodes hand out their ENIs (in secondary mode the watermarks
    /// count addresses).
    pub mode: Mode,
    /// Per node, in ENIs (secondary mode: addresses).
    #[serde(with = "WatermarkKeys")]
    pub watermarks: Watermarks,
    /// The subnets new ENIs are made in (the first is used).
    pub subnets: Vec<String>,
    /// The security groups of new ENIs.
    ///
    /// Default: each node's own (aws: its primary interface's; bce: its instance's).
    pub security_groups: Vec<String>,
    /// Node pools, first match wins; none: every node, with the settings
    /// above.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pools: Vec<PoolConfig>,
    /// Nodes worked on at once in a resync, 1..=256.
    pub workers: usize,
    /// The whole cluster's token buckets.
    pub api: ApiRates,
    /// The resync timer, and at most one listing of the cloud per interval
    /// (resyncs in between plan from the last listing, amended with the
    /// operator's own calls).
    #[serde(with = "humantime_serde")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub resync_interval: Duration,
    /// How long a deleted node's ENIs outlive its Node object.
    #[serde(with = "humantime_serde")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub node_grace: Duration,
    /// Leaked ENIs younger than this (by their creation tag) are spared;
    /// at least `1m`.
    #[serde(with = "humantime_serde")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub reap_cooldown: Duration,
    /// How long a node's free ENIs (secondary: addresses) must stay above
    /// its watermarks before the surplus is drained, at the first resync
    /// after; `"0s"` drains at once. A drained ENI leaves the kubelet's
    /// device count before the scheduler sees the smaller count (the
    /// node's status, up to 10 s later), and a pod bound in between fails
    /// for good with `UnexpectedAdmissionError`: waiting out a burst of
    /// short pods keeps the pool from shrinking under the next one.
    #[serde(with = "humantime_serde")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub drain_delay: Duration,
    /// Between two passes over leaked ENIs.
    #[serde(with = "humantime_serde")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub reap_interval: Duration,
    /// EniPolicy and the admission webhook.
    pub policy: PolicyConfig,
}

/// The `[operator.policy]` table. A key left out keeps its default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default, deny_unknown_fields)]
pub struct PolicyConfig {
    /// What a pod no EniPolicy selects gets.
    pub default: DefaultPolicy,
    /// The webhook's serving certificate's lifetime; it is renewed at two
    /// thirds of it.
    #[serde(with = "humantime_serde")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub cert_lifetime: Duration,
}

/// The webhook's serving certificate's lifetime when the config leaves it
/// out: a year as a config writes it (`"1y"`: humantime's year, 365.25
/// days), so the configuration reference shows it as such.
pub const DEFAULT_CERT_LIFETIME: Duration = Duration::from_secs(31_557_600);

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            default: DefaultPolicy::None,
            cert_lifetime: DEFAULT_CERT_LIFETIME,
        }
    }
}

enim_core::serde_with_moved_keys!(
    OperatorConfig,
    ConfigKeys {
        section: "operator",
        moves: MOVES,
        api_defaults: None,
        rewrite: None,
    }
);

impl Default for OperatorConfig {
    fn default() -> Self {
        OperatorConfig {
            cluster: String::new(),
            mode: Mode::Primary,
            watermarks: DEFAULT_WATERMARKS,
            subnets: Vec::new(),
            security_groups: Vec::new(),
            pools: Vec::new(),
            workers: 8,
            api: ApiRates::default(),
            resync_interval: Duration::from_secs(30),
            node_grace: Duration::from_secs(300),
            reap_cooldown: Duration::from_secs(600),
            drain_delay: DEFAULT_DRAIN_DELAY,
            reap_interval: Duration::from_secs(3600),
            policy: PolicyConfig::default(),
        }
    }
}

impl OperatorConfig {
    /// Parses and validates a TOML config.
    pub fn from_toml(text: &str) -> Result<OperatorConfig, ConfigError> {
        let c: OperatorConfig =
            toml::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))?;
        c.validate()?;
        Ok(c)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |key, why: String| Err(ConfigError::Invalid { key, why });
        if let Err(why) = validate_cluster_name(&self.cluster) {
            return bad("cluster", why);
        }
        if self.workers == 0 || self.workers > MAX_WORKERS {
            return bad(
                "workers",
                format!("{} is not in 1..={MAX_WORKERS}", self.workers),
            );
        }
        for (key, rate) in [
            ("api.mutating_rate", self.api.mutating_rate),
            ("api.read_rate", self.api.read_rate),
        ] {
            if let Err(why) = rate.validate() {
                return bad(key, why);
            }
        }
        for (key, d) in [
            ("resync_interval", self.resync_interval),
            ("reap_interval", self.reap_interval),
            ("policy.cert_lifetime", self.policy.cert_lifetime),
        ] {
            if d.is_zero() {
                return bad(key, "must be above zero".into());
            }
        }
        if self.reap_cooldown < MIN_REAP_COOLDOWN {
            return bad(
                "reap_cooldown",
                format!(
                    "{:?} is below the minimum {MIN_REAP_COOLDOWN:?}: a new ENI is unattached between its create and its attach",
                    self.reap_cooldown
                ),
            );
        }
        if self
            .subnets
            .iter()
            .chain(&self.security_groups)
            .any(String::is_empty)
        {
            return bad("subnets", "an empty subnet or security group id".into());
        }
        pools::validate(&self.pools)
    }

    /// The policy [`crate::index`] plans with.
    pub fn policy(&self) -> crate::index::Policy {
        crate::index::Policy {
            cluster: self.cluster.clone(),
            mode: self.mode,
            watermarks: self.watermarks,
            subnets: self.subnets.clone(),
            security_groups: self.security_groups.clone(),
            pools: self.pools.iter().map(|p| p.resolve(self)).collect(),
            node_grace: self.node_grace,
            reap_cooldown: self.reap_cooldown,
            drain_delay: self.drain_delay,
        }
    }
}

#[cfg(test)]
mod tests {
    use enim_core::testing::{read_with_deprecations, read_without_warnings};

    use super::*;

    #[test]
    fn a_full_config_parses_and_the_defaults_fill_the_rest() {
        let c = OperatorConfig::from_toml(
            r#"
            cluster = "prod"
            mode = "secondary"
            subnets = ["subnet-1"]
            security_groups = ["sg-1"]
            workers = 4
            node_grace = "2m"
            [api]
            mutating_rate = { every = "50ms", burst = 100 }
            [watermarks]
            pre_allocate = 8
            "#,
        )
        .unwrap();
        assert_eq!(c.mode, Mode::Secondary);
        assert_eq!(c.workers, 4);
        assert_eq!(c.node_grace, Duration::from_secs(120));
        assert_eq!(c.watermarks.pre_allocate, 8);
        assert_eq!(c.watermarks.max_above_watermark, 2);
        assert_eq!(
            c.api.mutating_rate,
            RateLimit::new(Duration::from_millis(50), 100)
        );
        assert_eq!(c.api.read_rate, DEFAULT_READ_RATE);
        assert_eq!(c.resync_interval, Duration::from_secs(30));
        let p = c.policy();
        assert_eq!(p.watermarks.pre_allocate, 8);
        assert_eq!(p.cluster, "prod");
        assert_eq!(c.policy, PolicyConfig::default());
    }

    #[test]
    fn the_policy_table_sets_the_cluster_default_and_the_cert_lifetime() {
        let c = OperatorConfig::from_toml(
            "cluster = \"c\"\n[policy]\ndefault = \"secondary\"\ncert_lifetime = \"6s\"",
        )
        .unwrap();
        assert_eq!(c.policy.default, DefaultPolicy::Secondary);
        assert_eq!(c.policy.cert_lifetime, Duration::from_secs(6));
        let e =
            OperatorConfig::from_toml("cluster = \"c\"\n[policy]\ndefault = \"all\"").unwrap_err();
        assert!(
            matches!(&e, ConfigError::Parse(m) if m.contains("none") && m.contains("primary")),
            "{e}"
        );
    }

    #[test]
    fn unknown_keys_and_bad_values_are_named() {
        let e = OperatorConfig::from_toml("cluster = \"c\"\nworkerz = 3").unwrap_err();
        assert!(
            matches!(&e, ConfigError::Parse(m) if m.contains("workerz")),
            "{e}"
        );
        let cases = [
            ("cluster = \"\"", "cluster"),
            ("cluster = \"c\"\nworkers = 0", "workers"),
            ("cluster = \"c\"\nreap_cooldown = \"10s\"", "reap_cooldown"),
            (
                "cluster = \"c\"\nresync_interval = \"0s\"",
                "resync_interval",
            ),
            (
                "cluster = \"c\"\n[api]\nread_rate = { every = \"1s\", burst = 0 }",
                "api.read_rate",
            ),
            (
                "cluster = \"c\"\napi_describe_rate = { every = \"1s\", burst = 0 }",
                "api.read_rate",
            ),
            ("cluster = \"c\"\nsubnets = [\"\"]", "subnets"),
            (
                "cluster = \"c\"\n[policy]\ncert_lifetime = \"0s\"",
                "policy.cert_lifetime",
            ),
        ];
        for (text, key) in cases {
            match OperatorConfig::from_toml(text) {
                Err(ConfigError::Invalid { key: k, why }) => assert_eq!(k, key, "{text}: {why}"),
                other => panic!("{text}: {other:?}"),
            }
        }
        let e = OperatorConfig::from_toml("cluster = \"c\"\nworkers = 0").unwrap_err();
        assert_eq!(
            e.to_string(),
            "operator config: workers: 0 is not in 1..=256"
        );
    }

    /// The flat rate keys of before: each read as its `api` key, with a
    /// warning that names it.
    #[test]
    fn old_rate_keys_are_read_as_the_api_table_with_a_warning() {
        let text = "cluster = \"c\"\n\
                    api_mutating_rate = { every = \"50ms\", burst = 100 }\n\
                    api_describe_rate = { every = \"2s\", burst = 3 }";
        let old = read_with_deprecations("operator", MOVES, || OperatorConfig::from_toml(text));
        let new = read_without_warnings(|| {
            OperatorConfig::from_toml(
                "cluster = \"c\"\n[api]\n\
                 mutating_rate = { every = \"50ms\", burst = 100 }\n\
                 read_rate = { every = \"2s\", burst = 3 }",
            )
        });
        assert_eq!(old, new);
        assert_eq!(
            new.api,
            ApiRates {
                mutating_rate: RateLimit::new(Duration::from_millis(50), 100),
                read_rate: RateLimit::new(Duration::from_secs(2), 3),
            }
        );
        // One moved key leaves the other's default alone.
        let one = OperatorConfig::from_toml(
            "cluster = \"c\"\napi_describe_rate = { every = \"2s\", burst = 3 }",
        )
        .unwrap();
        assert_eq!(one.api.mutating_rate, DEFAULT_MUTATING_RATE);
        let written = toml::to_string(&new).unwrap();
        assert!(written.contains("[api"), "{written}");
        assert_eq!(OperatorConfig::from_toml(&written).unwrap(), new);
    }

    /// As the clouds' configs: either choice would drop one of them.
    #[test]
    fn a_rate_key_given_under_both_names_is_refused() {
        for (text, new) in [
            (
                "cluster = \"c\"\napi_mutating_rate = { every = \"1s\", burst = 1 }\n\
                 [api]\nmutating_rate = { every = \"1s\", burst = 2 }",
                "api.mutating_rate",
            ),
            (
                "cluster = \"c\"\napi_describe_rate = { every = \"1s\", burst = 1 }\n\
                 [api]\nread_rate = { every = \"1s\", burst = 2 }",
                "api.read_rate",
            ),
        ] {
            let e = OperatorConfig::from_toml(text).unwrap_err();
            assert!(
                matches!(&e, ConfigError::Parse(m) if m.contains(&format!("(deprecated) and {new}: keep only {new}"))),
                "{text}: {e}"
            );
        }
    }
}
