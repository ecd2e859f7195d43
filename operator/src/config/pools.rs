//! `[[operator.pools]]`: node pools, each a selector of Node labels and the
//! settings its nodes are planned with. A node belongs to the first pool,
//! in file order, whose `node_selector` matches; a key a pool leaves out
//! (`mode`, `watermarks`, `subnets`, `security_groups`) is the top level's.
//! A pool's `watermarks` table replaces the top level's whole: a key left
//! out of it takes the default, as at the top level, since watermarks
//! count ENIs in primary mode and addresses in secondary mode.
//!
//! Invariants once [`validate`] passed: every pool's name is a DNS label
//! and no two pools share one; every selector key is a Kubernetes label
//! key and every value a label value; no subnet or group id is empty.

use std::collections::{BTreeMap, HashSet};

use enim_core::{Mode, Watermarks};
use serde::{Deserialize, Serialize};

use super::ConfigError;
use crate::index::PoolPolicy;

/// One `[[operator.pools]]` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    /// A DNS label, unique among the pools: the logs name the pool by it.
    pub name: String,
    /// `{ label = "value", ... }`, every one to match (`matchLabels`);
    /// `{}`, which matches every node, must be asked for.
    pub node_selector: BTreeMap<String, String>,
    /// As `[operator] mode`, for this pool's nodes.
    ///
    /// Default: the top level's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,
    /// Replaces `[operator.watermarks]` whole: a key it leaves out takes
    /// the default, since watermarks count ENIs in primary mode and
    /// addresses in secondary mode.
    ///
    /// Default: the top level's.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "optional_watermarks"
    )]
    #[cfg_attr(feature = "schema", schemars(with = "Option<super::WatermarkKeys>"))]
    pub watermarks: Option<Watermarks>,
    /// As `[operator] subnets`, for this pool's nodes.
    ///
    /// Default: the top level's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subnets: Option<Vec<String>>,
    /// As `[operator] security_groups`, for this pool's nodes.
    ///
    /// Default: the top level's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_groups: Option<Vec<String>>,
}

impl PoolConfig {
    /// The pool as the planner reads it: what it leaves out is `top`'s.
    pub fn resolve(&self, top: &super::OperatorConfig) -> PoolPolicy {
        PoolPolicy {
            name: self.name.clone(),
            node_selector: self.node_selector.clone(),
            mode: self.mode.unwrap_or(top.mode),
            watermarks: self.watermarks.unwrap_or(top.watermarks),
            subnets: self.subnets.as_ref().unwrap_or(&top.subnets).clone(),
            security_groups: self
                .security_groups
                .as_ref()
                .unwrap_or(&top.security_groups)
                .clone(),
        }
    }
}

/// A pool's optional `watermarks` table, read as the top level's.
mod optional_watermarks {
    use enim_core::Watermarks;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    #[serde(transparent)]
    struct Keys(#[serde(with = "super::super::WatermarkKeys")] Watermarks);

    pub fn serialize<S: Serializer>(w: &Option<Watermarks>, s: S) -> Result<S::Ok, S::Error> {
        w.map(Keys).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Watermarks>, D::Error> {
        Ok(Option::<Keys>::deserialize(d)?.map(|k| k.0))
    }
}

/// Checks every pool; the first error names the pool and the key.
pub fn validate(pools: &[PoolConfig]) -> Result<(), ConfigError> {
    let mut names: HashSet<&str> = HashSet::new();
    for (i, p) in pools.iter().enumerate() {
        let bad = |key, why: String| {
            let pool = match p.name.is_empty() {
                true => format!("#{} (unnamed)", i + 1),
                false => format!("{:?}", p.name),
            };
            Err(ConfigError::Pool { pool, key, why })
        };
        if !is_dns_label(&p.name) {
            return bad(
                "name",
                format!(
                    "{:?} is not a DNS label (1 to 63 of a-z 0-9 -, a letter or digit at both ends)",
                    p.name
                ),
            );
        }
        if !names.insert(&p.name) {
            return bad("name", "another pool has this name".into());
        }
        for (key, value) in &p.node_selector {
            if let Err(why) = check_label_key(key) {
                return bad("node_selector", why);
            }
            if !value.is_empty() && !is_label_name(value) {
                return bad(
                    "node_selector",
                    format!("{key} = {value:?}: not a label value ({LABEL_NAME_RULE})"),
                );
            }
        }
        for (key, ids) in [
            ("subnets", &p.subnets),
            ("security_groups", &p.security_groups),
        ] {
            if ids.iter().flatten().any(String::is_empty) {
                return bad(key, "an empty id".into());
            }
        }
    }
    Ok(())
}

const LABEL_NAME_RULE: &str = "at most 63 of A-Z a-z 0-9 - _ ., a letter or digit at both ends";

/// Whether `s` is 1 to `max` bytes, each `edge` or in `inner`, with an
/// `edge` byte at both ends.
fn bounded_word(s: &str, max: usize, edge: fn(&u8) -> bool, inner: &[u8]) -> bool {
    let bytes = s.as_bytes();
    let ends_ok = bytes.first().is_some_and(edge) && bytes.last().is_some_and(edge);
    ends_ok && bytes.len() <= max && bytes.iter().all(|b| edge(b) || inner.contains(b))
}

fn lower_alphanumeric(b: &u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
}

/// RFC 1123 label, as Kubernetes names many objects.
fn is_dns_label(s: &str) -> bool {
    bounded_word(s, 63, lower_alphanumeric, b"-")
}

/// The name part of a label key, and a non-empty label value.
fn is_label_name(s: &str) -> bool {
    bounded_word(s, 63, u8::is_ascii_alphanumeric, b"-_.")
}

/// A label key: an optional DNS-subdomain prefix and `/`, then a name.
fn check_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        let subdomain = prefix.len() <= 253 && prefix.split('.').all(is_dns_label);
        if !subdomain {
            return Err(format!(
                "{key:?}: the prefix {prefix:?} is not a DNS subdomain"
            ));
        }
    }
    if !is_label_name(name) {
        return Err(format!(
            "{key:?} is not a label key (a name of {LABEL_NAME_RULE}, after an optional DNS subdomain and /)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::{OperatorConfig, DEFAULT_WATERMARKS};
    use super::*;

    const TOP: &str = r#"
        cluster = "c"
        mode = "primary"
        subnets = ["subnet-top"]
        security_groups = ["sg-top"]
        [watermarks]
        pre_allocate = 1
        min_allocate = 2
    "#;

    fn with_pools(pools: &str) -> Result<OperatorConfig, ConfigError> {
        OperatorConfig::from_toml(&format!("{TOP}\n{pools}"))
    }

    #[test]
    fn pools_parse_in_file_order_and_take_what_they_leave_out_from_the_top() {
        let c = with_pools(
            r#"
            [[pools]]
            name = "secondary"
            node_selector = { "enim.io/pool" = "secondary" }
            mode = "secondary"
            subnets = ["subnet-2"]
            [pools.watermarks]
            pre_allocate = 8
            [[pools]]
            name = "primary"
            node_selector = { "enim.io/pool" = "primary", zone = "a" }
            security_groups = ["sg-p"]
            [[pools]]
            name = "rest"
            node_selector = {}
            "#,
        )
        .unwrap();
        let p = c.policy();
        let names: Vec<&str> = p.pools.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["secondary", "primary", "rest"]);
        let (sec, pri, rest) = (&p.pools[0], &p.pools[1], &p.pools[2]);
        assert_eq!(sec.mode, Mode::Secondary);
        assert_eq!(sec.subnets, ["subnet-2"]);
        assert_eq!(sec.security_groups, ["sg-top"]);
        // Its own table, whole: a key left out takes the default.
        assert_eq!(
            sec.watermarks,
            Watermarks {
                pre_allocate: 8,
                ..DEFAULT_WATERMARKS
            }
        );
        assert_eq!(pri.mode, Mode::Primary);
        assert_eq!(pri.subnets, ["subnet-top"]);
        assert_eq!(pri.security_groups, ["sg-p"]);
        assert_eq!(pri.watermarks, c.watermarks);
        assert_eq!(pri.node_selector.len(), 2);
        assert!(rest.node_selector.is_empty());
        assert_eq!(rest.watermarks.min_allocate, 2);
        // Written and read again: the same.
        let written = toml::to_string(&c).unwrap();
        assert_eq!(OperatorConfig::from_toml(&written).unwrap(), c);
    }

    #[test]
    fn no_pools_is_the_config_of_before() {
        let c = OperatorConfig::from_toml(TOP).unwrap();
        assert!(c.pools.is_empty() && c.policy().pools.is_empty());
        let written = toml::to_string(&c).unwrap();
        assert!(!written.contains("pools"), "{written}");
    }

    #[test]
    fn pool_errors_name_the_pool_and_the_key() {
        let pool = |name: &str, rest: &str| {
            format!("[[pools]]\nname = {name:?}\nnode_selector = {{}}\n{rest}\n")
        };
        let cases = [
            (pool("", ""), "#1 (unnamed)", "name"),
            (pool("Primary", ""), "\"Primary\"", "name"),
            (pool("a-", ""), "\"a-\"", "name"),
            (
                format!("{}{}", pool("a", ""), pool("a", "")),
                "\"a\"",
                "name",
            ),
            (
                "[[pools]]\nname = \"a\"\nnode_selector = { \"bad key\" = \"x\" }".to_string(),
                "\"a\"",
                "node_selector",
            ),
            (
                "[[pools]]\nname = \"a\"\nnode_selector = { \"enim.io/pool\" = \"not a value\" }"
                    .to_string(),
                "\"a\"",
                "node_selector",
            ),
            (pool("a", "subnets = [\"\"]"), "\"a\"", "subnets"),
            (
                pool("a", "security_groups = [\"\"]"),
                "\"a\"",
                "security_groups",
            ),
        ];
        for (text, want_pool, want_key) in cases {
            match with_pools(&text) {
                Err(ConfigError::Pool { pool, key, why }) => {
                    assert_eq!((pool.as_str(), key), (want_pool, want_key), "{text}: {why}")
                }
                other => panic!("{text}: {other:?}"),
            }
        }
        let e = with_pools(&pool("Primary", "")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "operator config: pool \"Primary\": name: \"Primary\" is not a DNS label (1 to 63 of a-z 0-9 -, a letter or digit at both ends)"
        );
        // Unknown keys, and a pool without a selector, do not parse.
        for (text, word) in [
            (pool("a", "modes = \"primary\""), "modes"),
            ("[[pools]]\nname = \"a\"".to_string(), "node_selector"),
            (
                pool("a", "[pools.watermarks]\npre_alocate = 1"),
                "pre_alocate",
            ),
        ] {
            let e = with_pools(&text).unwrap_err();
            assert!(
                matches!(&e, ConfigError::Parse(m) if m.contains(word)),
                "{text}: {e}"
            );
        }
    }

    #[test]
    fn label_syntax() {
        for ok in ["a", "pool-1", &"a".repeat(63)] {
            assert!(is_dns_label(ok), "{ok}");
        }
        for bad in ["", "-a", "a-", "A", "a_b", "a.b", &"a".repeat(64)] {
            assert!(!is_dns_label(bad), "{bad}");
        }
        for ok in [
            "enim.io/pool",
            "node.kubernetes.io/instance-type",
            "Pool_1.x",
            "a",
        ] {
            assert_eq!(check_label_key(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "/pool",
            "enim.io/",
            "Enim.io/pool",
            "a/b/c",
            "pool-",
            "bad key",
            &"a".repeat(64),
        ] {
            assert!(check_label_key(bad).is_err(), "{bad}");
        }
        assert!(is_label_name("Primary_1"));
        assert!(!is_label_name("x y"));
    }
}
