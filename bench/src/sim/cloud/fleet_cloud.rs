//! [`SimFleet`]: the operator's [`FleetCloud`] over the same simulated
//! [`Account`] (its buckets, latencies and seed), making the EC2 calls an
//! AWS fleet backend makes:
//! - `list_cluster_enis`: DescribeNetworkInterfaces with the cluster's tag
//!   filter, paged at EC2's `MaxResults` of 1,000 (a call per page);
//! - `limits`: DescribeInstanceTypes, once per type;
//! - `create`: CreateNetworkInterface with the client token (idempotent);
//! - `attach`: AttachNetworkInterface, then ModifyNetworkInterfaceAttribute
//!   (DeleteOnTermination); the device shows on the node a time drawn from
//!   `attach` later (the listing says "attaching" until then);
//! - `start_detach`: DetachNetworkInterface by the listed attachment, no
//!   polling (the operator's next listing shows it done); without a listed
//!   attachment id, DescribeNetworkInterfaces by id first, as the backend;
//! - `delete`: DeleteNetworkInterface (spared while attached).
//!
//! Not modelled: three looks `AwsFleet` makes besides: a
//! DescribeNetworkInterfaces by id before each attach (`ours`) and before
//! each delete (`delete_checked`'s second look), and a filtered one by the
//! intent tag before each create. Counted (a trial run of the operator
//! phase at 1,000 nodes with them added), the steady churn's busiest
//! describe bucket, the by-id one, goes from 1.0 % to 8.6 % of its refill.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use enim_provider::cloud::{CreatedAt, Reaped};
use enim_provider::fleet::{CreateEni, FleetAttachment, FleetCloud, FleetEni};
use enim_provider::{AddressLimits, ProviderError};
use tokio::time::Instant;

use super::{Account, EniRecord, State};
use crate::sim::bucket::Action;

/// EC2's largest page of DescribeNetworkInterfaces.
pub const PAGE: usize = 1000;

/// Node `node`'s instance id.
pub fn instance_id(node: usize) -> String {
    format!("i-sim{node:05}")
}

fn node_of(instance: &str) -> Result<usize, ProviderError> {
    instance
        .strip_prefix("i-sim")
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| ProviderError::Config(format!("no such instance {instance}")))
}

pub struct SimFleet {
    account: Arc<Account>,
    limits: Mutex<HashMap<String, AddressLimits>>,
}

impl SimFleet {
    pub fn new(account: Arc<Account>) -> SimFleet {
        SimFleet {
            account,
            limits: Mutex::default(),
        }
    }

    fn fleet_eni(&self, id: &str, e: &EniRecord, now: Instant) -> FleetEni {
        let eni = e.eni(id);
        FleetEni {
            id: id.to_string(),
            mac: eni.mac,
            ipv4: eni.ipv4,
            gateway4: eni.gateway4,
            ipv6: None,
            gateway6: None,
            subnet: "subnet-sim".into(),
            security_groups: vec!["sg-sim".into()],
            secondary_ips: Vec::new(),
            attachment: e.attachment.as_ref().map(|a| FleetAttachment {
                instance: instance_id(a.node),
                device_index: a.device_index,
                attachment_id: format!("eni-attach-{id}"),
                state: if a.detached_at.is_some() {
                    "detaching"
                } else if now < a.attached_at {
                    "attaching"
                } else {
                    "attached"
                }
                .into(),
            }),
            node: Some(instance_id(e.node)),
            intent: e.intent.clone(),
            created_at: CreatedAt::At(self.account.wall(e.created)),
        }
    }

    /// Interfaces on `node` (the primary included) and whether `index` is
    /// one of theirs.
    fn slots(st: &mut State, node: usize, index: u32, now: Instant) -> (usize, bool) {
        let mut used = 1;
        let mut taken = index == 0;
        for (_, e) in st.of_node(node, now) {
            if let Some(a) = e.attachment.as_ref().filter(|a| a.node == node) {
                used += 1;
                taken |= a.device_index == index;
            }
        }
        (used, taken)
    }

    /// `Some(available)` when `id` exists (DescribeNetworkInterfaces by id).
    async fn describe(&self, id: &str) -> Result<Option<bool>, ProviderError> {
        self.account
            .call(Action::DescribeNetworkInterfacesById, |st, now| {
                Ok(st.enis.get_mut(id).map(|e| {
                    e.settle(now);
                    e.available()
                }))
            })
            .await
    }
}

#[async_trait]
impl FleetCloud for SimFleet {
    fn name(&self) -> &str {
        "sim-aws"
    }

    async fn list_cluster_enis(&self) -> Result<Vec<FleetEni>, ProviderError> {
        let mut all: Vec<FleetEni> = Vec::new();
        let mut page = 0;
        loop {
            let chunk = self
                .account
                .call(Action::DescribeNetworkInterfacesFiltered, |st, now| {
                    let ids: Vec<String> = st
                        .enis
                        .keys()
                        .skip(page * PAGE)
                        .take(PAGE)
                        .cloned()
                        .collect();
                    Ok(ids
                        .iter()
                        .filter_map(|id| {
                            let e = st.enis.get_mut(id)?;
                            e.settle(now);
                            Some(self.fleet_eni(id, e, now))
                        })
                        .collect::<Vec<_>>())
                })
                .await?;
            let full = chunk.len() == PAGE;
            all.extend(chunk);
            if !full {
                return Ok(all);
            }
            page += 1;
        }
    }

    async fn limits(&self, instance_type: &str) -> Result<AddressLimits, ProviderError> {
        if let Some(l) = self
            .limits
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(instance_type)
        {
            return Ok(*l);
        }
        let enis = self.account.params.eni_limit;
        let l = self
            .account
            .call(Action::DescribeInstanceTypes, |_, _| {
                Ok(AddressLimits {
                    ipv4_per_eni: 15,
                    ipv6_per_eni: 15,
                    enis,
                })
            })
            .await?;
        self.limits
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(instance_type.to_string(), l);
        Ok(l)
    }

    async fn create(&self, req: &CreateEni) -> Result<FleetEni, ProviderError> {
        let node = node_of(&req.instance)?;
        let token = req.client_token.clone();
        self.account
            .call(Action::CreateNetworkInterface, |st, now| {
                // EC2's ClientToken: the same token returns the same ENI.
                let known = st
                    .enis
                    .iter()
                    .find(|(_, e)| e.intent.as_deref() == Some(token.as_str()))
                    .map(|(id, _)| id.clone());
                let id = match known {
                    Some(id) => id,
                    None => st.new_eni(node, Some(token.clone()), now)?,
                };
                let e = st
                    .enis
                    .get(&id)
                    .ok_or_else(|| ProviderError::UnknownEni(id.clone()))?;
                Ok(self.fleet_eni(&id, e, now))
            })
            .await
    }

    async fn attach(
        &self,
        eni_id: &str,
        instance: &str,
        device_index: u32,
    ) -> Result<(), ProviderError> {
        let node = node_of(instance)?;
        let (limit, took) = (self.account.params.eni_limit, self.account.params.attach);
        self.account
            .call(Action::AttachNetworkInterface, |st, now| {
                let e = st
                    .enis
                    .get_mut(eni_id)
                    .ok_or_else(|| ProviderError::UnknownEni(eni_id.into()))?;
                e.settle(now);
                if e.attachment.as_ref().is_some_and(|a| a.node == node) {
                    return Ok(());
                }
                let (used, taken) = Self::slots(st, node, device_index, now);
                if used >= limit || taken {
                    return Err(ProviderError::Unavailable(format!(
                        "{instance}: device index {device_index} taken or {used} of {limit} interfaces"
                    )));
                }
                st.start_attach(eni_id, node, device_index, now, took)
            })
            .await?;
        // DeleteOnTermination; a failure is only logged by the backend.
        let _ = self
            .account
            .call(Action::ModifyNetworkInterfaceAttribute, |_, _| Ok(()))
            .await;
        Ok(())
    }

    async fn start_detach(&self, eni: &FleetEni) -> Result<(), ProviderError> {
        let listed = eni
            .attachment
            .as_ref()
            .filter(|a| a.device_index != 0 && !a.attachment_id.is_empty());
        match listed {
            Some(a) if a.detaching() => return Ok(()),
            Some(_) => {}
            // No attachment id to detach by: the backend looks first.
            None => {
                if self.describe(&eni.id).await? != Some(false) {
                    return Ok(());
                }
            }
        }
        let (lo, hi) = self.account.params.detach;
        self.account
            .call(Action::DetachNetworkInterface, |st, now| {
                let took = st.rng.between(lo, hi);
                if let Some(e) = st.enis.get_mut(&eni.id) {
                    e.settle(now);
                    if let Some(a) = e.attachment.as_mut() {
                        a.detached_at.get_or_insert(now + took);
                    }
                }
                Ok(())
            })
            .await
    }

    async fn delete(&self, eni_id: &str) -> Result<Reaped, ProviderError> {
        self.account
            .call(Action::DeleteNetworkInterface, |st, now| {
                Ok(match st.enis.get_mut(eni_id) {
                    None => Reaped::Gone,
                    Some(e) => {
                        e.settle(now);
                        if e.available() {
                            st.remove(eni_id);
                            Reaped::Deleted
                        } else {
                            Reaped::Spared("attached".into())
                        }
                    }
                })
            })
            .await
    }

    // The operator's fleet scenario is primary mode's, as the per-node one.
    async fn assign_addresses(
        &self,
        _: &str,
        _: usize,
        _: usize,
    ) -> Result<Vec<IpAddr>, ProviderError> {
        Err(ProviderError::Config(
            "the simulated fleet serves primary mode only".into(),
        ))
    }

    async fn unassign_addresses(&self, _: &str, _: &[IpAddr]) -> Result<(), ProviderError> {
        Err(ProviderError::Config(
            "the simulated fleet serves primary mode only".into(),
        ))
    }
}
