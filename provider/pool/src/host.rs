//! The pool in its host-ENI role (secondary mode): the backend's address
//! verbs, and one more ENI on request.

use std::net::IpAddr;

use async_trait::async_trait;
use enim_core::{AddressCount, AddressLimits, Eni, ProviderError};
use enim_provider::SecondaryIps;

use crate::{context, WarmPool};

/// Secondary mode's verbs: the backend's, with the members' view of their
/// addresses kept current so [`EniProvider::list`](enim_provider::EniProvider::list) shows what was done.
#[async_trait]
impl SecondaryIps for WarmPool {
    async fn address_limits(&self) -> Result<AddressLimits, ProviderError> {
        self.inner.backend.address_limits().await
    }

    async fn assign(&self, eni_id: &str, n: AddressCount) -> Result<Vec<IpAddr>, ProviderError> {
        let new = self.inner.backend.assign(eni_id, n).await?;
        let mut st = self.inner.state();
        if let Some(m) = st.members.iter_mut().find(|m| m.eni.id == eni_id) {
            for ip in &new {
                if !m.eni.secondary_ips.contains(ip) {
                    m.eni.secondary_ips.push(*ip);
                }
            }
        }
        Ok(new)
    }

    async fn unassign(&self, eni_id: &str, ips: &[IpAddr]) -> Result<(), ProviderError> {
        self.inner.backend.unassign(eni_id, ips).await?;
        let mut st = self.inner.state();
        if let Some(m) = st.members.iter_mut().find(|m| m.eni.id == eni_id) {
            m.eni.secondary_ips.retain(|ip| !ips.contains(ip));
        }
        Ok(())
    }

    async fn attach_eni(&self) -> Result<Eni, ProviderError> {
        // One at a time with the loop's own rounds (orphan deletes).
        let _round = self.inner.round.lock().await;
        {
            let st = self.inner.state();
            let Some(limit) = st.eni_limit else {
                return Err(ProviderError::Unavailable(
                    "the ENI limit is not known yet (the cloud has not answered)".into(),
                ));
            };
            // The primary interface counts toward the limit.
            if st.members.len() + 1 >= limit {
                return Err(ProviderError::Exhausted {
                    total: st.members.len(),
                });
            }
        }
        let eni = self
            .inner
            .backend
            .create_and_attach()
            .await
            .map_err(|e| context(e, "create and attach an ENI"))?;
        self.inner.take_in_created(eni.clone());
        Ok(eni)
    }
}
