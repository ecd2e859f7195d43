//! The provider the engine sees on a DRA node: every ADD gets exactly the
//! ENI its pod's prepared claim names (by `K8S_POD_UID`), never "the next
//! free one". The scheduler chose it; enimd only carries it out.
//!
//! - A pod with no prepared claim of this driver is refused (permanent: on
//!   a DRA node a pod on enim claims its ENI through the DeviceClass).
//! - A claimed ENI still held by another attachment (the last pod's DEL
//!   not yet done) is "try again later": the runtime retries the ADD.
//! - Once the ENI is the pod's, the claim's networkData is written behind.

use std::sync::Arc;

use async_trait::async_trait;
use enim_provider::{
    AddressFeed, Eni, EniOwner, EniProvider, PoolStatistics, ProviderError, SecondaryIps,
};

use super::claims::Claims;
use super::status::{DeviceNetwork, StatusWriter};

pub struct BoundProvider {
    inner: Arc<dyn EniProvider>,
    claims: Arc<Claims>,
    status: Option<StatusWriter>,
}

impl BoundProvider {
    /// `status`: where networkData goes; `None` writes none (tests).
    pub fn new(
        inner: Arc<dyn EniProvider>,
        claims: Arc<Claims>,
        status: Option<StatusWriter>,
    ) -> BoundProvider {
        BoundProvider {
            inner,
            claims,
            status,
        }
    }

    fn network(eni: &Eni, owner: &EniOwner, device: &str) -> DeviceNetwork {
        let mut ips = vec![eni.ipv4.to_string()];
        ips.extend(eni.ipv6.map(|v6| v6.to_string()));
        DeviceNetwork {
            device: device.to_string(),
            interface: owner.ifname.clone(),
            ips,
            mac: eni.mac.to_string(),
        }
    }
}

#[async_trait]
impl EniProvider for BoundProvider {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn list(&self) -> Result<Vec<Eni>, ProviderError> {
        self.inner.list().await
    }

    async fn allocate_next(&self, owner: &EniOwner) -> Result<Eni, ProviderError> {
        let pod = owner.pod.uid.as_deref().unwrap_or_default();
        let claimed = if pod.is_empty() {
            Vec::new()
        } else {
            self.claims.enis_for_pod(pod)
        };
        if claimed.is_empty() {
            return Err(ProviderError::Config(format!(
                "pod {} has no ResourceClaim of driver {} prepared on this node: on a DRA node \
                 (enimd [dra] enabled) every pod on enim claims its ENI, e.g. through a \
                 ResourceClaimTemplate of DeviceClass eni.enim.io",
                owner.pod,
                super::DRIVER
            )));
        }
        // The first of the pod's claimed ENIs that is free or already its
        // own: a pod that claimed two ENIs gets one per interface.
        let mut last = None;
        for (claim, device) in &claimed {
            match self.inner.allocate_named(&device.eni_id, owner).await {
                Ok(eni) => {
                    if let Some(status) = &self.status {
                        status.attached(
                            (claim.namespace.clone(), claim.name.clone()),
                            Self::network(&eni, owner, &device.device),
                        );
                    }
                    tracing::info!(pod = %owner.pod, claim = %format!("{}/{}", claim.namespace, claim.name), eni = %eni.id, "claimed ENI allocated");
                    return Ok(eni);
                }
                Err(e @ ProviderError::OwnedByOther { .. }) => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        let held = last.map_or_else(String::new, |e| e.to_string());
        Err(ProviderError::Unavailable(format!(
            "every ENI pod {} claimed is held by another attachment ({held}); waiting for its DEL",
            owner.pod
        )))
    }

    async fn allocate_named(&self, eni_id: &str, owner: &EniOwner) -> Result<Eni, ProviderError> {
        self.inner.allocate_named(eni_id, owner).await
    }

    async fn wait_for_free(&self, owner: &EniOwner) {
        self.inner.wait_for_free(owner).await
    }

    async fn release(&self, owner: &EniOwner) -> Result<(), ProviderError> {
        // Which claimed ENI it held, before the release forgets it.
        let held: Vec<_> = match (&self.status, owner.pod.uid.as_deref()) {
            (Some(_), Some(pod)) => {
                let enis = self.inner.list().await.unwrap_or_default();
                let holds = |id: &str| {
                    enis.iter().any(|e| {
                        e.id == id && e.owner.as_ref().is_some_and(|o| o.same_attachment(owner))
                    })
                };
                self.claims
                    .enis_for_pod(pod)
                    .into_iter()
                    .filter(|(_, device)| holds(&device.eni_id))
                    .collect()
            }
            _ => Vec::new(),
        };
        self.inner.release(owner).await?;
        if let Some(status) = &self.status {
            for (claim, device) in held {
                status.detached((claim.namespace, claim.name), device.device);
            }
        }
        Ok(())
    }

    async fn restore(&self, assignments: &[(String, EniOwner)]) -> Result<(), ProviderError> {
        self.inner.restore(assignments).await
    }

    fn secondary_ips(&self) -> Option<&dyn SecondaryIps> {
        self.inner.secondary_ips()
    }

    fn address_feed(&self) -> Option<&dyn AddressFeed> {
        self.inner.address_feed()
    }

    fn statistics(&self) -> Option<PoolStatistics> {
        self.inner.statistics()
    }

    fn degraded(&self) -> Option<String> {
        self.inner.degraded()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dra::claims::{PreparedClaim, PreparedDevice};
    use enim_provider::PodRef;
    use enim_provider_static::StaticProvider;

    fn owner(container: &str, pod_uid: Option<&str>) -> EniOwner {
        EniOwner {
            network: "enim".into(),
            container_id: container.into(),
            ifname: "eth0".into(),
            pod: PodRef {
                namespace: "default".into(),
                name: format!("pod-{container}"),
                uid: pod_uid.map(str::to_string),
            },
        }
    }

    fn setup() -> (tempfile::TempDir, Arc<Claims>, BoundProvider) {
        let dir = tempfile::tempdir().unwrap();
        let claims = Arc::new(Claims::open(&dir.path().join("c.json")).unwrap());
        let enis = (1..=3)
            .map(crate::engine::conformance::static_eni)
            .collect();
        let inner: Arc<dyn EniProvider> = Arc::new(StaticProvider::new(enis).unwrap());
        let p = BoundProvider::new(inner, claims.clone(), None);
        (dir, claims, p)
    }

    fn prepared(uid: &str, pod: &str, eni: &str) -> PreparedClaim {
        PreparedClaim {
            uid: uid.into(),
            namespace: "default".into(),
            name: format!("c-{uid}"),
            devices: vec![PreparedDevice {
                request: "eni".into(),
                device: eni.into(),
                eni_id: eni.into(),
            }],
            pods: vec![pod.into()],
        }
    }

    #[tokio::test]
    async fn add_gets_exactly_the_claimed_eni() {
        let (_d, claims, p) = setup();
        // eni-3, not the first free one.
        claims.record(prepared("c1", "pod-1", "eni-3")).unwrap();
        let eni = p.allocate_next(&owner("a", Some("pod-1"))).await.unwrap();
        assert_eq!(eni.id, "eni-3");
        // The retried ADD of the same attachment: the same ENI.
        let again = p.allocate_next(&owner("a", Some("pod-1"))).await.unwrap();
        assert_eq!(again.id, "eni-3");
    }

    #[tokio::test]
    async fn a_pod_without_a_claim_is_refused_for_good() {
        let (_d, _claims, p) = setup();
        for o in [owner("a", Some("pod-x")), owner("b", None)] {
            let e = p.allocate_next(&o).await.unwrap_err();
            assert!(!e.is_transient(), "{e}");
            assert!(
                e.to_string().contains("no ResourceClaim of driver enim.io"),
                "{e}"
            );
        }
    }

    #[tokio::test]
    async fn a_claimed_eni_still_held_is_try_again_later() {
        let (_d, claims, p) = setup();
        claims.record(prepared("c1", "pod-1", "eni-2")).unwrap();
        claims.record(prepared("c2", "pod-2", "eni-2")).unwrap();
        p.allocate_next(&owner("a", Some("pod-1"))).await.unwrap();
        let e = p
            .allocate_next(&owner("b", Some("pod-2")))
            .await
            .unwrap_err();
        assert!(e.is_transient(), "{e}");
        // The first pod's DEL: now the second gets it.
        p.release(&owner("a", Some("pod-1"))).await.unwrap();
        let eni = p.allocate_next(&owner("b", Some("pod-2"))).await.unwrap();
        assert_eq!(eni.id, "eni-2");
    }

    #[tokio::test]
    async fn a_claimed_eni_the_node_does_not_have_is_an_error() {
        let (_d, claims, p) = setup();
        claims.record(prepared("c1", "pod-1", "eni-9")).unwrap();
        let e = p
            .allocate_next(&owner("a", Some("pod-1")))
            .await
            .unwrap_err();
        assert_eq!(e, ProviderError::UnknownEni("eni-9".into()));
    }
}
