//! The backend of one node: the AWS backend's calls, in its order, over the
//! shared [`Account`].

use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use enim_core::pacing::{Pacing, AGENT_PACING};
use enim_core::retry::Poll;
use enim_core::{AddressCount, AddressLimits, Eni, ProviderError};
use enim_provider::cloud::{CloudBackend, TaggedEni};
use enim_provider::kept::{keeps, KeptEnis};
use enim_provider_aws::{DETACH_BACKOFF, SETTLE_BACKOFF};

use tokio::time::Instant;

use super::{Account, State};
use crate::sim::bucket::Action;

/// The [`CloudBackend`] of one simulated node.
pub struct SimCloud {
    account: Arc<Account>,
    node: usize,
    instance: String,
    /// DescribeInstanceTypes' answer, once it succeeded.
    limit: Mutex<Option<usize>>,
    /// Device-index choice and attach, one at a time (as the AWS backend).
    attach_lock: tokio::sync::Mutex<()>,
    /// New ENIs whose attach was throttled (as the AWS backend).
    kept: KeptEnis<String>,
    /// The agent's client's pacing of its EC2 calls.
    pacing: Pacing,
}

fn unavailable(what: String) -> ProviderError {
    ProviderError::Unavailable(what)
}

impl SimCloud {
    pub(super) fn new(account: Arc<Account>, node: usize) -> SimCloud {
        SimCloud {
            account,
            node,
            instance: super::instance_id(node),
            limit: Mutex::new(None),
            attach_lock: tokio::sync::Mutex::new(()),
            kept: KeptEnis::default(),
            pacing: Pacing::new(AGENT_PACING),
        }
    }

    /// One EC2 call of this node's, paced as the agent's client paces it.
    async fn ec2<T>(
        &self,
        action: Action,
        effect: impl FnMut(&mut State, Instant) -> Result<T, ProviderError>,
    ) -> Result<T, ProviderError> {
        self.account
            .call_paced(action, Some(&self.pacing), effect)
            .await
    }

    async fn limit(&self) -> Result<usize, ProviderError> {
        let known = *self.limit.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(l) = known {
            return Ok(l);
        }
        let limit = self.account.params.eni_limit;
        self.ec2(Action::DescribeInstanceTypes, |_, _| Ok(limit))
            .await?;
        *self.limit.lock().unwrap_or_else(|p| p.into_inner()) = Some(limit);
        Ok(limit)
    }

    /// Interfaces on this instance (the primary included) and the lowest
    /// free device index, from DescribeNetworkInterfaces (filtered).
    async fn device_slots(&self) -> Result<(usize, u32), ProviderError> {
        let node = self.node;
        self.ec2(Action::DescribeNetworkInterfacesFiltered, |st, now| {
            let mut used = vec![0u32];
            for (_, e) in st.of_node(node, now) {
                if let Some(a) = e.attachment.as_ref().filter(|a| a.node == node) {
                    used.push(a.device_index);
                }
            }
            let free = (1..).find(|i| !used.contains(i)).unwrap_or(u32::MAX);
            Ok((used.len(), free))
        })
        .await
    }

    /// DescribeNetworkInterfaces by id: `Some(available)` when it exists.
    async fn describe(&self, id: &str) -> Result<Option<bool>, ProviderError> {
        self.ec2(Action::DescribeNetworkInterfacesById, |st, now| {
            Ok(st.enis.get_mut(id).map(|e| {
                e.settle(now);
                e.available()
            }))
        })
        .await
    }

    fn no_slot(&self, attached: usize, limit: usize) -> ProviderError {
        unavailable(format!(
            "instance {} already has {attached} interfaces on card 0, its limit is {limit}",
            self.instance
        ))
    }

    async fn attach(&self, id: &str) -> Result<(), ProviderError> {
        {
            let _one_at_a_time = self.attach_lock.lock().await;
            let (attached, index) = self.device_slots().await?;
            let limit = self.limit().await?;
            if attached >= limit {
                return Err(self.no_slot(attached, limit));
            }
            let (node, (lo, hi)) = (self.node, self.account.params.attach);
            let result = self
                .ec2(Action::AttachNetworkInterface, |st, now| {
                    st.start_attach(id, node, index, now, (lo, hi))
                })
                .await;
            if let Err(e) = result {
                // The backend looks before reporting failure: a retried
                // attach may have gone through.
                let _ = self.describe(id).await;
                return Err(e);
            }
        }
        // DeleteOnTermination; the backend only logs a failure.
        let _ = self
            .ec2(Action::ModifyNetworkInterfaceAttribute, |st, _| {
                if st.enis.contains_key(id) {
                    Ok(())
                } else {
                    Err(ProviderError::UnknownEni(id.into()))
                }
            })
            .await;
        Ok(())
    }

    async fn await_metadata(&self, id: &str) -> Result<Eni, ProviderError> {
        let mut poll = Poll::within(&SETTLE_BACKOFF, self.account.params.metadata_wait);
        let node = self.node;
        loop {
            let shown = self
                .account
                .imds(|st, now| {
                    st.enis.get_mut(id).and_then(|e| {
                        e.settle(now);
                        e.in_metadata_of(node, now).then(|| e.eni(id))
                    })
                })
                .await;
            if let Some(eni) = shown {
                return Ok(eni);
            }
            if !poll.wait().await {
                return Err(unavailable(format!(
                    "ENI {id} attached: not in instance metadata after {:?}",
                    poll.elapsed()
                )));
            }
        }
    }

    /// A new ENI tagged for this node (after the slot check), not attached.
    async fn create(&self) -> Result<String, ProviderError> {
        let limit = self.limit().await?;
        // By metadata, the primary included.
        let attached = self.attached().await?.len() + 1;
        if attached >= limit {
            return Err(self.no_slot(attached, limit));
        }
        let node = self.node;
        self.ec2(Action::CreateNetworkInterface, |st, now| {
            st.new_eni(node, None, now)
        })
        .await
    }

    async fn delete_quietly(&self, id: &str) {
        // Tagged, so the pool finds and deletes it later if this fails.
        let _ = self.do_detach_and_delete(id).await;
    }

    async fn do_detach_and_delete(&self, id: &str) -> Result<(), ProviderError> {
        // ours(): the ENI as EC2 has it now.
        let node = self.node;
        let found = self
            .ec2(Action::DescribeNetworkInterfacesById, |st, now| {
                Ok(st.enis.get_mut(id).map(|e| {
                    e.settle(now);
                    (
                        e.node,
                        e.attachment
                            .as_ref()
                            .map(|a| (a.node, a.detached_at.is_some())),
                    )
                }))
            })
            .await?;
        let Some((owner, attachment)) = found else {
            return Ok(());
        };
        if owner != node {
            return Err(ProviderError::Config(format!(
                "ENI {id} was not created for {}",
                self.instance
            )));
        }
        let mut available = attachment.is_none();
        if let Some((on, detaching)) = attachment {
            if on != node {
                return Err(ProviderError::Config(format!(
                    "ENI {id} is attached to another instance"
                )));
            }
            if !detaching {
                let (lo, hi) = self.account.params.detach;
                self.ec2(Action::DetachNetworkInterface, |st, now| {
                    let took = st.rng.between(lo, hi);
                    if let Some(a) = st.enis.get_mut(id).and_then(|e| e.attachment.as_mut()) {
                        a.detached_at.get_or_insert(now + took);
                    }
                    Ok(())
                })
                .await?;
            }
            // Poll until available or gone.
            let mut poll = Poll::within(&DETACH_BACKOFF, self.account.params.detach_timeout);
            loop {
                match self.describe(id).await? {
                    None => return Ok(()),
                    Some(true) => {
                        available = true;
                        break;
                    }
                    Some(false) => {}
                }
                if !poll.wait().await {
                    return Err(unavailable(format!(
                        "ENI {id} still in-use after {:?}",
                        poll.elapsed()
                    )));
                }
            }
        }
        debug_assert!(available);
        self.ec2(Action::DeleteNetworkInterface, |st, now| {
            match st.enis.get_mut(id) {
                // Already gone: the backend treats not-found as done.
                None => Ok(()),
                Some(e) => {
                    e.settle(now);
                    if e.available() {
                        st.remove(id);
                        Ok(())
                    } else {
                        Err(unavailable(format!("ENI {id} is in use")))
                    }
                }
            }
        })
        .await
    }
}

#[async_trait]
impl CloudBackend for SimCloud {
    fn name(&self) -> &str {
        "sim-aws"
    }

    async fn attached(&self) -> Result<Vec<Eni>, ProviderError> {
        let node = self.node;
        Ok(self
            .account
            .imds(|st, now| {
                st.of_node(node, now)
                    .into_iter()
                    .filter_map(|(id, e)| e.in_metadata_of(node, now).then(|| e.eni(&id)))
                    .collect()
            })
            .await)
    }

    async fn tagged(&self) -> Result<Vec<TaggedEni>, ProviderError> {
        let node = self.node;
        self.ec2(Action::DescribeNetworkInterfacesFiltered, |st, now| {
            Ok(st
                .of_node(node, now)
                .into_iter()
                .map(|(id, e)| TaggedEni {
                    attached: e.attachment.as_ref().is_some_and(|a| a.node == node),
                    id,
                })
                .collect())
        })
        .await
    }

    async fn eni_limit(&self) -> Result<usize, ProviderError> {
        self.limit().await
    }

    fn pool_fill(&self, fill: f64) {
        self.pacing.set_fill(fill);
    }

    async fn create_and_attach(&self) -> Result<Eni, ProviderError> {
        let id = match self.kept.take() {
            Some(id) => id,
            None => self.create().await?,
        };
        if let Err(e) = self.attach(&id).await {
            if keeps(&e) {
                self.kept.keep(id);
            } else {
                self.delete_quietly(&id).await;
            }
            return Err(e);
        }
        match self.await_metadata(&id).await {
            Ok(eni) => Ok(eni),
            Err(e) => {
                self.delete_quietly(&id).await;
                Err(e)
            }
        }
    }

    async fn attach_existing(&self, eni_id: &str) -> Result<Eni, ProviderError> {
        match self.describe(eni_id).await? {
            None => return Err(ProviderError::UnknownEni(eni_id.into())),
            Some(true) => self.attach(eni_id).await?,
            Some(false) => {}
        }
        self.await_metadata(eni_id).await
    }

    async fn detach_and_delete(&self, eni_id: &str) -> Result<(), ProviderError> {
        self.do_detach_and_delete(eni_id).await
    }

    // The burst and fleet scenarios are primary mode's: whole ENIs.
    async fn address_limits(&self) -> Result<AddressLimits, ProviderError> {
        Err(primary_only())
    }

    async fn assign(&self, _: &str, _: AddressCount) -> Result<Vec<IpAddr>, ProviderError> {
        Err(primary_only())
    }

    async fn unassign(&self, _: &str, _: &[IpAddr]) -> Result<(), ProviderError> {
        Err(primary_only())
    }
}

fn primary_only() -> ProviderError {
    ProviderError::Config("the simulated cloud serves primary mode only".into())
}
