//! What makes a BCE ENI enim's, in place of tags (BCE's ENI API has none):
//! its name, `enim-<instance-id>-<suffix>`, says enim made it and for
//! which node; its description carries the rest as `key=value` words: the
//! creation time and the cluster (the tags AWS has, `enim.io/created-at`
//! and [`TAG_CLUSTER`]), the operator's intent and the device index
//! ([`TAG_DEVICE_INDEX`]).
//!
//! The device index is enim's own: secondary mode numbers each host ENI's
//! route table from it, and BCE gives none (see [`crate::node`]).

use enim_provider::cloud::TAG_CLUSTER;

use crate::client::ApiEni;

/// Every enim ENI's name starts with this (then the instance id).
pub const ENI_NAME_PREFIX: &str = "enim-";

/// The description word that keeps an ENI's device index.
pub const TAG_DEVICE_INDEX: &str = "enim.io/device-index";
/// Device indexes enim gives: 0 is the primary interface's, and secondary
/// mode's route tables span 256 indexes.
pub const DEVICE_INDEXES: std::ops::RangeInclusive<u32> = 1..=255;

/// The name prefix that marks an ENI as enim's for this instance.
pub fn eni_name_prefix(instance_id: &str) -> String {
    format!("{ENI_NAME_PREFIX}{instance_id}-")
}

/// The node an ENI was made for, from its name `enim-<instance>-<suffix>`.
pub fn node_of(name: &str) -> Option<&str> {
    let (node, _) = name.strip_prefix(ENI_NAME_PREFIX)?.rsplit_once('-')?;
    (!node.is_empty()).then_some(node)
}

/// The value of a `key=value` word in an ENI's description (words are
/// split at whitespace and `;`).
pub fn description_tag<'a>(description: &'a str, key: &str) -> Option<&'a str> {
    description
        .split(|c: char| c.is_whitespace() || c == ';')
        .find_map(|word| word.strip_prefix(key)?.strip_prefix('='))
}

/// `description` with `key=value` in place of any `key=` word it had.
pub fn with_word(description: &str, key: &str, value: &str) -> String {
    let mut words: Vec<String> = description
        .split_whitespace()
        .filter(|w| w.strip_prefix(key).is_none_or(|r| !r.starts_with('=')))
        .map(str::to_string)
        .collect();
    words.push(format!("{key}={value}"));
    words.join(" ")
}

/// The device index an ENI's description keeps, if a valid one.
pub fn device_index_of(eni: &ApiEni) -> Option<u32> {
    description_tag(&eni.description, TAG_DEVICE_INDEX)
        .and_then(|v| v.parse().ok())
        .filter(|i| DEVICE_INDEXES.contains(i))
}

/// enim's (any node's, by its name) and marked for `cluster`.
pub fn in_cluster(eni: &ApiEni, cluster: &str) -> bool {
    eni.name.starts_with(ENI_NAME_PREFIX)
        && description_tag(&eni.description, TAG_CLUSTER) == Some(cluster)
}

#[cfg(test)]
mod tests {
    use enim_provider::cloud::TAG_CREATED_AT;

    use super::*;

    #[test]
    fn description_tags() {
        let d = "enim: ENI of instance i-1; \
                 enim.io/created-at=2024-01-01T00:00:00Z enim.io/device-index=3 enim.io/cluster=prod";
        assert_eq!(description_tag(d, TAG_CLUSTER), Some("prod"));
        assert_eq!(
            description_tag(d, TAG_CREATED_AT),
            Some("2024-01-01T00:00:00Z")
        );
        assert_eq!(description_tag(d, TAG_DEVICE_INDEX), Some("3"));
        assert_eq!(description_tag(d, "enim.io/node"), None);
        assert_eq!(description_tag("enim.io/clusters=x", TAG_CLUSTER), None);
        assert_eq!(description_tag("", TAG_CLUSTER), None);
        assert_eq!(
            description_tag("a;enim.io/cluster=c;b", TAG_CLUSTER),
            Some("c")
        );
    }

    #[test]
    fn names_and_words() {
        assert_eq!(node_of("enim-i-AbC123-0123456789ab"), Some("i-AbC123"));
        assert_eq!(node_of("enim--x"), None);
        assert_eq!(node_of("other-i-1-x"), None);
        assert_eq!(
            with_word("a=1 enim.io/device-index=3 b", TAG_DEVICE_INDEX, "4"),
            "a=1 b enim.io/device-index=4"
        );
        assert_eq!(with_word("", "k", "v"), "k=v");
        assert_eq!(with_word("kk=1", "k", "v"), "kk=1 k=v");
    }
}
