//! The fleet-wide reaper's side of [`AwsBackend`]: this cluster's leaked
//! ENIs, found by tag and deleted only after a second look.

use enim_provider::cloud::{CreatedAt, Reaped, UnattachedEni, TAG_CREATED_AT};

use super::AwsBackend;
use crate::client::NetworkInterface;
use crate::error::AwsError;
use crate::{steps, tags};

impl AwsBackend {
    /// enim's and this cluster's (any node's).
    pub(super) fn in_cluster(&self, eni: &NetworkInterface) -> bool {
        let cluster = self.config.cluster.as_deref();
        cluster.is_some_and(|c| tags::in_cluster(eni, c))
    }

    pub(super) async fn do_unattached_in_cluster(&self) -> Result<Vec<UnattachedEni>, AwsError> {
        let Some(cluster) = self.config.cluster.as_deref() else {
            return Ok(Vec::new());
        };
        // Status is filtered here, not by EC2's `status` filter: the tag
        // filters already keep the listing to this cluster's ENIs.
        let enis = steps::cluster_enis(&self.ec2, cluster).await?;
        Ok(enis
            .into_iter()
            .filter(steps::is_unattached)
            .map(|e| UnattachedEni {
                created_at: CreatedAt::from_tag(e.tag(TAG_CREATED_AT)),
                id: e.network_interface_id,
            })
            .collect())
    }

    pub(super) async fn do_reap(&self, eni_id: &str) -> Result<Reaped, AwsError> {
        steps::delete_checked(&self.ec2, eni_id, |e| self.in_cluster(e)).await
    }
}
