//! The provider the engine sees on a DRA node: every ADD gets exactly the
//! ENI its pod's prepared claim names (by `K8S_POD_UID`), never "the next
//! free one". The scheduler chose it; enimd only carries it out.
//!
//! - A pod with no prepared claim of this driver is refused (permanent: on
//!   a DRA node a pod on enim claims its ENI through the DeviceClass).
//! - A claimed ENI still held by another attachment (the last pod's DEL
//!   not yet done) is "try again later": the runtime retries the ADD.
//! - Once the ENI is the pod's, the claim's networkData is written behind.
//! - A claim's pods are recorded at prepare, but the kubelet prepares a
//!   claim once per node: a pod added to a shared claim later never reaches
//!   this driver. So a pod in no recorded list has the claims prepared in
//!   its namespace read again ([`Reservations`], bounded by
//!   [`LOOKUP_WITHIN`]) before it is refused, and joins the record of the
//!   one that is now reserved for it.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use enim_core::{Eni, EniOwner, PoolStatistics, ProviderError};
use enim_provider::{AddressFeed, EniProvider, SecondaryIps};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;

use super::claims::{Claims, PreparedClaim, PreparedDevice};
use super::status::{DeviceNetwork, StatusWriter};
use super::DraError;

/// How long an ADD waits for the API server when it has to read claims.
pub const LOOKUP_WITHIN: Duration = Duration::from_secs(5);

/// The uids of the pods `rc` is reserved for.
pub fn reserved_pod_uids(rc: &ResourceClaim) -> Vec<String> {
    rc.status
        .as_ref()
        .and_then(|s| s.reserved_for.as_ref())
        .into_iter()
        .flatten()
        .filter(|c| c.resource == "pods" && c.api_group.as_deref().unwrap_or("").is_empty())
        .map(|c| c.uid.clone())
        .collect()
}

/// Where ADD reads a claim's `reservedFor` as it is now.
#[async_trait]
pub trait Reservations: Send + Sync {
    /// The pods claim `namespace/name` is reserved for, while it exists
    /// under `uid`; `None` once it is gone or replaced.
    async fn reserved_for(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> Result<Option<Vec<String>>, DraError>;
}

/// [`Reservations`] from the API server.
pub struct ApiReservations(pub kube::Client);

#[async_trait]
impl Reservations for ApiReservations {
    async fn reserved_for(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> Result<Option<Vec<String>>, DraError> {
        let api: Api<ResourceClaim> = Api::namespaced(self.0.clone(), namespace);
        Ok(api
            .get_opt(name)
            .await?
            .filter(|rc| rc.metadata.uid.as_deref() == Some(uid))
            .map(|rc| reserved_pod_uids(&rc)))
    }
}

pub struct BoundProvider {
    inner: Arc<dyn EniProvider>,
    claims: Arc<Claims>,
    status: Option<StatusWriter>,
    reservations: Option<Arc<dyn Reservations>>,
}

impl BoundProvider {
    /// `status`: where networkData goes; `reservations`: where a pod no
    /// record lists is looked up. `None` for either: none (tests).
    pub fn new(
        inner: Arc<dyn EniProvider>,
        claims: Arc<Claims>,
        status: Option<StatusWriter>,
        reservations: Option<Arc<dyn Reservations>>,
    ) -> BoundProvider {
        BoundProvider {
            inner,
            claims,
            status,
            reservations,
        }
    }

    /// The ENIs of prepared claims that were reserved for `owner`'s pod
    /// after their prepare: each prepared claim in the pod's namespace is
    /// read again, and one now reserved for the pod records it. Empty when
    /// none is; an error when the API server does not answer in time.
    async fn reserved_since_prepare(
        &self,
        owner: &EniOwner,
        pod: &str,
    ) -> Result<Vec<(PreparedClaim, PreparedDevice)>, ProviderError> {
        let Some(source) = &self.reservations else {
            return Ok(Vec::new());
        };
        // A pod's claims are in its own namespace.
        let candidates: Vec<PreparedClaim> = self
            .claims
            .all()
            .into_iter()
            .filter(|c| c.namespace == owner.pod.namespace)
            .collect();
        if candidates.is_empty() {
            return Ok(Vec::new());
        }
        let lookup = async {
            for claim in &candidates {
                let name = format!("{}/{}", claim.namespace, claim.name);
                let pods = source
                    .reserved_for(&claim.namespace, &claim.name, &claim.uid)
                    .await
                    .map_err(|e| (name.clone(), e.to_string()))?;
                if pods.is_some_and(|pods| pods.iter().any(|p| p == pod)) {
                    self.claims
                        .add_pod(&claim.uid, pod)
                        .map_err(|e| (name.clone(), e.to_string()))?;
                    tracing::info!(pod = %owner.pod, claim = %name, "pod reserved on a prepared claim since its prepare: recorded");
                }
            }
            Ok::<_, (String, String)>(())
        };
        match tokio::time::timeout(LOOKUP_WITHIN, lookup).await {
            Ok(Ok(())) => Ok(self.claims.enis_for_pod(pod)),
            Ok(Err((claim, e))) => Err(ProviderError::Unavailable(format!(
                "pod {} is in no prepared claim's reservedFor as recorded at prepare, and \
                 claim {claim} could not be read again to see whether it is now: {e}",
                owner.pod
            ))),
            Err(_) => Err(ProviderError::Unavailable(format!(
                "pod {} is in no prepared claim's reservedFor as recorded at prepare, and the \
                 API server did not answer within {LOOKUP_WITHIN:?} to see whether it is now",
                owner.pod
            ))),
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
        let mut claimed = if pod.is_empty() {
            Vec::new()
        } else {
            self.claims.enis_for_pod(pod)
        };
        if claimed.is_empty() && !pod.is_empty() {
            claimed = self.reserved_since_prepare(owner, pod).await?;
        }
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

    async fn release_unused(&self) -> enim_provider::Released {
        self.inner.release_unused().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dra::claims::{PreparedClaim, PreparedDevice};
    use enim_provider_static::StaticProvider;
    use enim_testkit::fixtures::dra_owner;

    fn owner(container: &str, pod_uid: Option<&str>) -> EniOwner {
        dra_owner(container, &format!("pod-{container}"), pod_uid)
    }

    fn setup() -> (tempfile::TempDir, Arc<Claims>, BoundProvider) {
        let dir = tempfile::tempdir().unwrap();
        let claims = Arc::new(Claims::open(&dir.path().join("c.json")).unwrap());
        let enis = (1..=3)
            .map(crate::engine::conformance::static_eni)
            .collect();
        let inner: Arc<dyn EniProvider> = Arc::new(StaticProvider::new(enis).unwrap());
        let p = BoundProvider::new(inner, claims.clone(), None, None);
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

    /// The API server as the tests want it: each claim (by uid) reserved
    /// for some pods, gone, failing, or not answering; every read counted.
    #[derive(Default)]
    struct FakeApi {
        reserved: std::collections::HashMap<String, Vec<String>>,
        failing: bool,
        silent: bool,
        reads: std::sync::atomic::AtomicUsize,
    }

    #[async_trait]
    impl Reservations for FakeApi {
        async fn reserved_for(
            &self,
            _namespace: &str,
            _name: &str,
            uid: &str,
        ) -> Result<Option<Vec<String>>, DraError> {
            self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if self.silent {
                std::future::pending::<()>().await;
            }
            if self.failing {
                return Err(DraError::Config("connection refused".into()));
            }
            Ok(self.reserved.get(uid).cloned())
        }
    }

    fn with_api(api: Arc<FakeApi>) -> (tempfile::TempDir, Arc<Claims>, BoundProvider) {
        let (dir, claims, p) = setup();
        let p = BoundProvider::new(p.inner, claims.clone(), None, Some(api));
        (dir, claims, p)
    }

    #[tokio::test]
    async fn a_pod_reserved_on_a_shared_claim_after_its_prepare_gets_its_eni() {
        let api = Arc::new(FakeApi {
            reserved: [(
                "c1".to_string(),
                vec!["pod-1".to_string(), "pod-2".to_string()],
            )]
            .into(),
            ..FakeApi::default()
        });
        let (_d, claims, p) = with_api(api.clone());
        // Prepared while reserved for pod-1 alone.
        claims.record(prepared("c1", "pod-1", "eni-3")).unwrap();
        // pod-1 is recorded: no read.
        assert_eq!(
            p.allocate_next(&owner("a", Some("pod-1")))
                .await
                .unwrap()
                .id,
            "eni-3"
        );
        assert_eq!(api.reads.load(std::sync::atomic::Ordering::SeqCst), 0);
        p.release(&owner("a", Some("pod-1"))).await.unwrap();
        // pod-2 joined the claim later: read once, recorded, served.
        let eni = p.allocate_next(&owner("b", Some("pod-2"))).await.unwrap();
        assert_eq!(eni.id, "eni-3");
        assert_eq!(claims.get("c1").unwrap().pods, ["pod-1", "pod-2"]);
        assert_eq!(api.reads.load(std::sync::atomic::Ordering::SeqCst), 1);
        // Its retried ADD: from the record.
        p.allocate_next(&owner("b", Some("pod-2"))).await.unwrap();
        assert_eq!(api.reads.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_pod_no_claim_is_reserved_for_is_still_refused_for_good() {
        let api = Arc::new(FakeApi {
            reserved: [("c1".to_string(), vec!["pod-1".to_string()])].into(),
            ..FakeApi::default()
        });
        let (_d, claims, p) = with_api(api.clone());
        claims.record(prepared("c1", "pod-1", "eni-3")).unwrap();
        // Neither in the list nor (c2) still under its uid on the server.
        claims.record(prepared("c2", "pod-9", "eni-2")).unwrap();
        let e = p
            .allocate_next(&owner("x", Some("pod-x")))
            .await
            .unwrap_err();
        assert!(!e.is_transient(), "{e}");
        assert!(
            e.to_string().contains("no ResourceClaim of driver enim.io"),
            "{e}"
        );
        assert_eq!(api.reads.load(std::sync::atomic::Ordering::SeqCst), 2);
        assert_eq!(claims.get("c1").unwrap().pods, ["pod-1"]);
        // A pod of another namespace: its claims cannot be these, no read.
        let mut elsewhere = owner("y", Some("pod-y"));
        elsewhere.pod.namespace = "other".into();
        assert!(p.allocate_next(&elsewhere).await.is_err());
        assert_eq!(api.reads.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn an_api_server_that_fails_or_does_not_answer_is_try_again_later() {
        for (api, says) in [
            (
                FakeApi {
                    failing: true,
                    ..FakeApi::default()
                },
                "connection refused",
            ),
            (
                FakeApi {
                    silent: true,
                    ..FakeApi::default()
                },
                "did not answer within 5s",
            ),
        ] {
            let (_d, claims, p) = with_api(Arc::new(api));
            claims.record(prepared("c1", "pod-1", "eni-3")).unwrap();
            let e = p
                .allocate_next(&owner("b", Some("pod-2")))
                .await
                .unwrap_err();
            assert!(e.is_transient(), "{e}");
            assert!(e.to_string().contains(says), "{e}");
            assert!(e.to_string().contains("reservedFor"), "{e}");
            assert_eq!(
                claims.get("c1").unwrap().pods,
                ["pod-1"],
                "nothing recorded"
            );
        }
    }
}
