//! [`SimFleet`]: the operator's [`FleetCloud`] over the same simulated
//! [`Account`] (its buckets, latencies and seed), making exactly the EC2
//! calls `AwsFleet` makes:
//! - `list_cluster_enis`: DescribeNetworkInterfaces with the cluster's tag
//!   filter, paged at EC2's `MaxResults` of 1,000 (a call per page);
//! - `limits`: DescribeInstanceTypes, once per type;
//! - `create`: for an intent that is not [`CreateEni::fresh`], first
//!   DescribeNetworkInterfaces filtered by the intent tag (its ENI, if
//!   found, is the answer); then CreateNetworkInterface with the client
//!   token (idempotent);
//! - `attach`: an ENI not seen marked for the cluster is refused with no
//!   call; one shown attached nowhere, AttachNetworkInterface at once (EC2
//!   refuses an ENI in use, a taken device index, a full instance); a
//!   refusal other than the full instance's (or a throttled attach) is
//!   looked at once (DescribeNetworkInterfaces by id): attached there at
//!   that index is done. One shown attached somewhere is looked at first
//!   (the operator never asks that). Then ModifyNetworkInterfaceAttribute
//!   (DeleteOnTermination); the device shows on the node a time drawn
//!   from `attach` later (the listing says "attaching" until then);
//! - `start_detach`: DetachNetworkInterface by the listed attachment, no
//!   polling (the operator's next listing shows it done); without a listed
//!   attachment id, DescribeNetworkInterfaces by id first, as the backend;
//! - `delete`: [`DeleteCheck::Listed`], DeleteNetworkInterface alone
//!   (refused while attached: spared); [`DeleteCheck::SecondLook`],
//!   DescribeNetworkInterfaces by id first, deleting only if available.
//!
//! Not modelled: `AwsFleet`'s polling of an ENI still detaching before it
//! attaches one shown attached (a path the operator does not take), and
//! its DescribeSubnets (one per subnet, ever).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use enim_core::{AddressCount, AddressLimits, ProviderError};
use enim_provider::cloud::{CreatedAt, Reaped};
use enim_provider::fleet::{CreateEni, DeleteCheck, FleetAttachment, FleetCloud, FleetEni, Slot};
use tokio::time::Instant;

use super::{Account, EniRecord, State};
use crate::sim::bucket::Action;

/// EC2's largest page of DescribeNetworkInterfaces.
pub const PAGE: usize = 1000;

/// The cluster every simulated ENI is tagged for.
const CLUSTER: &str = "sim";

/// How EC2 answered an AttachNetworkInterface.
enum Attached {
    Done,
    /// Refused; `look`: the backend looks at the ENI before it reports it
    /// (all but a full instance's refusal).
    Refused {
        error: ProviderError,
        look: bool,
    },
}

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
            cluster: Some(CLUSTER.into()),
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

    /// `id` as DescribeNetworkInterfaces by id shows it, `None` when it
    /// does not exist: whether it is available, and where it is attached.
    async fn describe(&self, id: &str) -> Result<Option<Look>, ProviderError> {
        self.account
            .call(Action::DescribeNetworkInterfacesById, |st, now| {
                Ok(st.enis.get_mut(id).map(|e| {
                    e.settle(now);
                    Look {
                        available: e.available(),
                        at: e.attachment.as_ref().map(|a| (a.node, a.device_index)),
                    }
                }))
            })
            .await
    }

    /// ModifyNetworkInterfaceAttribute (DeleteOnTermination) after an
    /// attach; a failure is only logged by the backend.
    async fn delete_on_termination(&self) {
        let _ = self
            .account
            .call(Action::ModifyNetworkInterfaceAttribute, |_, _| Ok(()))
            .await;
    }

    /// AttachNetworkInterface, EC2's refusals as EC2 makes them (each
    /// counted a failed call).
    async fn send_attach(&self, eni_id: &str, node: usize, device_index: u32) -> Attached {
        let (limit, took) = (self.account.params.eni_limit, self.account.params.attach);
        let mut full = false;
        let sent = self
            .account
            .call(Action::AttachNetworkInterface, |st, now| {
                // An ENI in use (or gone) `start_attach` refuses.
                let (used, taken) = Self::slots(st, node, device_index, now);
                if used >= limit {
                    full = true;
                    return Err(ProviderError::Unavailable(format!(
                        "AttachmentLimitExceeded: {used} of {limit} interfaces"
                    )));
                }
                if taken {
                    return Err(ProviderError::Unavailable(format!(
                        "device index {device_index} of node {node} is taken"
                    )));
                }
                st.start_attach(eni_id, node, device_index, now, took)
            })
            .await;
        match sent {
            Ok(()) => Attached::Done,
            // A throttled attach too is looked at: it may hide one.
            Err(error) => Attached::Refused { error, look: !full },
        }
    }
}

/// What a by-id describe tells the backend.
struct Look {
    available: bool,
    at: Option<(usize, u32)>,
}

#[async_trait]
impl FleetCloud for SimFleet {
    // The simulated nodes carry `aws:///` providerIDs.
    fn name(&self) -> &str {
        "aws"
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
        let carrying = |st: &State| {
            st.enis
                .iter()
                .find(|(_, e)| e.intent.as_deref() == Some(token.as_str()))
                .map(|(id, _)| id.clone())
        };
        if !req.fresh {
            // The backend's look-up by the intent tag.
            let found = self
                .account
                .call(Action::DescribeNetworkInterfacesFiltered, |st, now| {
                    Ok(carrying(st).and_then(|id| {
                        let e = st.enis.get_mut(&id)?;
                        e.settle(now);
                        Some(self.fleet_eni(&id, e, now))
                    }))
                })
                .await?;
            if let Some(made) = found {
                return Ok(made);
            }
        }
        self.account
            .call(Action::CreateNetworkInterface, |st, now| {
                // EC2's ClientToken: the same token returns the same ENI.
                let id = match carrying(st) {
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

    async fn attach(&self, eni: &FleetEni, at: Slot<'_>) -> Result<(), ProviderError> {
        let (instance, device_index) = (at.instance, at.device_index);
        let node = node_of(instance)?;
        if eni.cluster.as_deref() != Some(CLUSTER) {
            return Err(ProviderError::Config(format!(
                "{} is not this cluster's",
                eni.id
            )));
        }
        if eni.attachment.is_some() {
            // The backend's look before an attach of an ENI shown attached.
            match self.describe(&eni.id).await? {
                None => return Err(ProviderError::UnknownEni(eni.id.clone())),
                Some(Look {
                    at: Some((n, _)), ..
                }) if n == node => return Ok(()),
                Some(Look {
                    at: Some((n, _)), ..
                }) => {
                    return Err(ProviderError::Config(format!(
                        "{} is attached to {}",
                        eni.id,
                        instance_id(n)
                    )))
                }
                Some(_) => {}
            }
        }
        match self.send_attach(&eni.id, node, device_index).await {
            Attached::Done => {}
            Attached::Refused { error, look } => {
                let settled = look
                    && self
                        .describe(&eni.id)
                        .await
                        .ok()
                        .flatten()
                        .is_some_and(|l| l.at == Some((node, device_index)));
                if !settled {
                    return Err(error);
                }
            }
        }
        self.delete_on_termination().await;
        Ok(())
    }

    async fn start_detach(&self, eni: &FleetEni) -> Result<(), ProviderError> {
        let listed = eni.detachable_attachment();
        match listed {
            Some(a) if a.detaching() => return Ok(()),
            Some(_) => {}
            // No attachment id to detach by: the backend looks first.
            None => {
                if self.describe(&eni.id).await?.is_none_or(|l| l.available) {
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

    async fn delete(&self, eni_id: &str, check: DeleteCheck) -> Result<Reaped, ProviderError> {
        if check == DeleteCheck::SecondLook {
            match self.describe(eni_id).await? {
                None => return Ok(Reaped::Gone),
                Some(l) if !l.available => return Ok(Reaped::Spared("attached".into())),
                Some(_) => {}
            }
        }
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
                            // EC2's InvalidNetworkInterface.InUse.
                            Reaped::Spared("in use".into())
                        }
                    }
                })
            })
            .await
    }

    // The operator's fleet scenario is primary mode's, as the per-node one.
    async fn assign(&self, _: &str, _: AddressCount) -> Result<Vec<IpAddr>, ProviderError> {
        Err(ProviderError::Config(
            "the simulated fleet serves primary mode only".into(),
        ))
    }

    async fn unassign(&self, _: &str, _: &[IpAddr]) -> Result<(), ProviderError> {
        Err(ProviderError::Config(
            "the simulated fleet serves primary mode only".into(),
        ))
    }
}
