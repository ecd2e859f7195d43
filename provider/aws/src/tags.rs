//! The EC2 tags that make an ENI enim's: which node it was made for and,
//! with the shared [`TAG_CLUSTER`], which cluster. A tag filter in a
//! listing is trusted only as far as these checks repeat it.

use enim_provider::cloud::TAG_CLUSTER;

use crate::client::NetworkInterface;

/// Marks an ENI as created by enim.
pub const TAG_MANAGED: &str = "enim.io/managed";
/// The instance an enim ENI belongs to.
pub const TAG_NODE: &str = "enim.io/node";

/// enim's and made for `instance`.
pub fn of_node(eni: &NetworkInterface, instance: &str) -> bool {
    eni.tag(TAG_MANAGED) == Some("true") && eni.tag(TAG_NODE) == Some(instance)
}

/// enim's and `cluster`'s (any node's).
pub fn in_cluster(eni: &NetworkInterface, cluster: &str) -> bool {
    eni.tag(TAG_MANAGED) == Some("true") && eni.tag(TAG_CLUSTER) == Some(cluster)
}
