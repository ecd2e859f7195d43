//! The fleet-wide reaper's side of [`AwsBackend`]: this cluster's leaked
//! ENIs, found by tag and deleted only after a second look.

use enim_provider::cloud::{
    spared_on_second_look, CreatedAt, Reaped, UnattachedEni, TAG_CLUSTER, TAG_CREATED_AT,
};

use super::{ec2, AwsBackend, AwsError, TAG_MANAGED};
use crate::ec2::NetworkInterface;

impl AwsBackend {
    /// enim's and this cluster's (any node's).
    pub(super) fn in_cluster(&self, eni: &NetworkInterface) -> bool {
        let cluster = self.config.cluster.as_deref();
        cluster.is_some() && eni.tag(TAG_MANAGED) == Some("true") && eni.tag(TAG_CLUSTER) == cluster
    }

    /// Detached, by EC2's account: `available` and no live attachment.
    fn is_unattached(eni: &NetworkInterface) -> bool {
        eni.status == "available" && eni.attached_instance().is_none()
    }

    pub(super) async fn do_unattached_in_cluster(&self) -> Result<Vec<UnattachedEni>, AwsError> {
        let Some(cluster) = self.config.cluster.as_deref() else {
            return Ok(Vec::new());
        };
        // Status is filtered here, not by EC2's `status` filter: the tag
        // filters already keep the listing to this cluster's ENIs.
        let enis = self
            .ec2
            .describe_network_interfaces(&[
                (&format!("tag:{TAG_CLUSTER}"), &[cluster]),
                (&format!("tag:{TAG_MANAGED}"), &["true"]),
            ])
            .await
            .map_err(ec2("listing this cluster's ENIs"))?;
        Ok(enis
            .into_iter()
            .filter(|e| self.in_cluster(e) && Self::is_unattached(e))
            .map(|e| UnattachedEni {
                created_at: CreatedAt::from_tag(e.tag(TAG_CREATED_AT)),
                id: e.network_interface_id,
            })
            .collect())
    }

    pub(super) async fn do_reap(&self, eni_id: &str) -> Result<Reaped, AwsError> {
        // Looked up again: it may have been attached (or retagged) since
        // it was listed, and DeleteNetworkInterface does not check tags.
        let Some(eni) = self
            .describe(eni_id, format!("looking up leaked ENI {eni_id}"))
            .await?
        else {
            return Ok(Reaped::Gone);
        };
        let in_cluster = self.in_cluster(&eni);
        if let Some(spared) =
            spared_on_second_look(in_cluster, "tagged", Self::is_unattached(&eni), &eni.status)
        {
            return Ok(spared);
        }
        match self.ec2.delete_network_interface(eni_id).await {
            Ok(()) => Ok(Reaped::Deleted),
            // Another node's reaper got there first.
            Err(e) if e.is_not_found() => Ok(Reaped::Gone),
            // Attached between our look and the delete.
            Err(e) if e.code() == Some("InvalidNetworkInterface.InUse") => {
                Ok(Reaped::Spared("attached meanwhile".into()))
            }
            Err(e) => Err(ec2(format!("deleting leaked ENI {eni_id}"))(e)),
        }
    }
}
