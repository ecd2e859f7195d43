//! [`AwsFleet`]: the operator's [`FleetCloud`] on EC2, for the whole
//! cluster from one place.
//!
//! Everything is learnt from EC2, never from instance metadata: one paged
//! DescribeNetworkInterfaces by the cluster's tag per listing, and the
//! subnets' blocks (for prefix lengths and gateways), asked once per subnet
//! and kept. The EC2 steps themselves are the node backend's
//! ([`crate::steps`]); what is the operator's own is that every call names
//! its instance and that it only ever touches this cluster's ENIs.
//!
//! Idempotency of `create`: EC2 returns the first ENI for a repeated
//! ClientToken, and every ENI carries the token as its [`TAG_INTENT`] tag
//! too, which is looked up first unless the intent is
//! [`CreateEni::fresh`] (its token never sent, so no ENI can carry it): a
//! successor, or a retry (or a cloud that ignores ClientToken), finds the
//! ENI instead of making another.
//!
//! Lookups by id: none before an attach of an ENI shown attached nowhere
//! (EC2 refuses one in use; only a refusal is looked at) nor before a
//! [`DeleteCheck::Listed`] delete (EC2 refuses one in use); a
//! [`DeleteCheck::SecondLook`] delete, and the address verbs, look first.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use aws_credential_types::Credentials;
use enim_core::fault::crash_point;
use enim_core::sync::lock;
use enim_core::{AddressCount, AddressLimits, ProviderError};
use enim_provider::cloud::{format_created_at, CreatedAt, Reaped, TAG_CLUSTER, TAG_CREATED_AT};
use enim_provider::fleet::{
    CreateEni, DeleteCheck, FleetAttachment, FleetCloud, FleetEni, Slot, SubnetBlocks, TAG_INTENT,
};

use crate::client::{self, Ec2Client, NetworkInterface, Subnet};
use crate::config::{AwsCredentialsConfig, AwsFleetConfig};
use crate::credentials::{from_env, CredentialsProvider};
use crate::error::{ec2, imds, AwsError};
use crate::metadata::{Imds, InterfaceInfo};
use crate::steps;
use crate::tags::{in_cluster, TAG_MANAGED, TAG_NODE};

/// EC2's limit on a ClientToken: 64 ASCII characters.
const MAX_CLIENT_TOKEN: usize = 64;

/// `subnet`'s blocks, as EC2 describes them.
fn blocks_of(subnet: &Subnet) -> Result<SubnetBlocks, AwsError> {
    let v6 = subnet.ipv6_cidr_block_association_set.item.first();
    let v6 = v6.map(|b| b.ipv6_cidr_block.as_str());
    SubnetBlocks::parse(&subnet.cidr_block, v6).map_err(|value| AwsError::BadSubnet {
        subnet: subnet.subnet_id.clone(),
        value: value.into(),
    })
}

/// The operator's EC2 backend for one cluster. One per operator: its
/// token buckets are the whole cluster's.
pub struct AwsFleet {
    ec2: Ec2Client,
    cluster: String,
    assign_ipv6: bool,
    detach_timeout: Duration,
    /// Subnet id to its blocks: subnets do not change their blocks.
    subnets: Mutex<HashMap<String, SubnetBlocks>>,
    /// Instance type to its limits: instance types do not change.
    limits: Mutex<HashMap<String, AddressLimits>>,
    /// Instance to its primary interface's security groups: the groups of
    /// the ENIs made for it when none are configured.
    primary_groups: Mutex<HashMap<String, Vec<String>>>,
}

/// The credentials `config` names, read now (the environment's) or
/// checked to exist (the instance role's).
async fn credentials_provider(
    config: &AwsCredentialsConfig,
    region: &str,
) -> Result<Arc<CredentialsProvider>, AwsError> {
    let provider = match config {
        AwsCredentialsConfig::Environment => {
            let creds = from_env(|k| std::env::var(k).ok())?.ok_or_else(|| {
                AwsError::Config(
                    "credentials: source \"environment\" but AWS_ACCESS_KEY_ID and \
                     AWS_SECRET_ACCESS_KEY are not set"
                        .into(),
                )
            })?;
            CredentialsProvider::fixed(creds)
        }
        AwsCredentialsConfig::Static {
            access_key_id,
            secret_access_key,
            session_token,
        } => CredentialsProvider::fixed(Credentials::new(
            access_key_id,
            secret_access_key.expose(),
            session_token.as_ref().map(|t| t.expose().to_string()),
            None,
            "operator config",
        )),
        AwsCredentialsConfig::InstanceRole { imds_endpoint } => {
            let imds = Imds::new(imds_endpoint).map_err(imds("instance metadata client"))?;
            let provider = CredentialsProvider::instance_role(Arc::new(imds));
            provider.get().await?;
            provider
        }
        AwsCredentialsConfig::WebIdentity(settings) => {
            let provider = CredentialsProvider::web_identity(region, settings)?;
            provider.get().await?;
            provider
        }
        AwsCredentialsConfig::Container => {
            let provider = CredentialsProvider::container(region)?;
            provider.get().await?;
            provider
        }
    };
    Ok(Arc::new(provider))
}

impl AwsFleet {
    /// Validates `config` and sets up the EC2 client with the credentials
    /// it names.
    pub async fn connect(config: &AwsFleetConfig) -> Result<AwsFleet, AwsError> {
        config.validate().map_err(AwsError::Config)?;
        let creds = credentials_provider(&config.credentials, &config.region).await?;
        let source = creds.describe();
        let client =
            Ec2Client::configured(&config.region, creds, &config.api).map_err(ec2("EC2 client"))?;
        tracing::info!(cluster = %config.cluster, region = %config.region, credentials = source, "AWS fleet backend ready");
        Ok(AwsFleet {
            ec2: client,
            cluster: config.cluster.clone(),
            assign_ipv6: config.assign_ipv6,
            detach_timeout: config.detach_timeout,
            subnets: Mutex::new(HashMap::new()),
            limits: Mutex::new(HashMap::new()),
            primary_groups: Mutex::new(HashMap::new()),
        })
    }

    pub fn cluster(&self) -> &str {
        &self.cluster
    }

    /// The security groups of `instance`'s primary interface (device 0),
    /// asked once: what its ENIs get when no groups are configured, as AWS
    /// VPC CNI gives them, rather than the VPC's default group EC2 would.
    async fn primary_groups(&self, instance: &str) -> Result<Vec<String>, AwsError> {
        if let Some(groups) = lock(&self.primary_groups).get(instance) {
            return Ok(groups.clone());
        }
        let attached = self
            .ec2
            .describe_network_interfaces(&[("attachment.instance-id", &[instance])])
            .await
            .map_err(ec2(format!("listing {instance}'s interfaces")))?;
        let groups: Vec<String> = attached
            .iter()
            .find(|e| steps::is_primary(e))
            .ok_or_else(|| AwsError::NoPrimaryInterface(instance.to_string()))?
            .group_ids()
            .into_iter()
            .map(str::to_string)
            .collect();
        tracing::info!(%instance, ?groups, "new ENIs take the primary interface's security groups");
        lock(&self.primary_groups).insert(instance.to_string(), groups.clone());
        Ok(groups)
    }

    pub fn ec2(&self) -> &Ec2Client {
        &self.ec2
    }

    /// The blocks of `ids`, asking EC2 (in one call) only for those not
    /// known yet. A subnet EC2 does not know is left out.
    async fn subnet_nets(&self, ids: &[&str]) -> Result<HashMap<String, SubnetBlocks>, AwsError> {
        let mut missing: Vec<&str> = {
            let known = lock(&self.subnets);
            ids.iter()
                .copied()
                .filter(|s| !known.contains_key(*s))
                .collect()
        };
        missing.sort_unstable();
        missing.dedup();
        if !missing.is_empty() {
            let found = self
                .ec2
                .describe_subnets(&missing)
                .await
                .map_err(ec2(format!("describing subnets {missing:?}")))?;
            let mut known = lock(&self.subnets);
            for s in &found {
                known.insert(s.subnet_id.clone(), blocks_of(s)?);
            }
        }
        let known = lock(&self.subnets);
        Ok(ids
            .iter()
            .filter_map(|id| Some((id.to_string(), *known.get(*id)?)))
            .collect())
    }

    /// `eni` as the listing shows it, addressed in its subnet as instance
    /// metadata would address it on a node.
    fn fleet_eni(eni: NetworkInterface, nets: SubnetBlocks) -> Result<FleetEni, AwsError> {
        let id = eni.network_interface_id.clone();
        let bad_address = |value: &str| AwsError::BadAddress {
            eni_id: id.clone(),
            value: value.into(),
        };
        let mac = eni.mac_address.parse().map_err(|_| AwsError::BadMac {
            eni_id: id.clone(),
            mac: eni.mac_address.clone(),
        })?;
        let primary = eni.private_ip_address.as_deref().unwrap_or_default();
        let primary: Ipv4Addr = primary.parse().map_err(|_| bad_address(primary))?;
        let att = eni.attachment.as_ref();
        let info = InterfaceInfo {
            mac,
            interface_id: id.clone(),
            device_number: att.and_then(|a| a.device_index).unwrap_or_default(),
            network_card: att.and_then(|a| a.network_card_index).unwrap_or_default(),
            ipv4s: std::iter::once(primary)
                .chain(eni.secondary_ips().into_iter().filter_map(|ip| match ip {
                    IpAddr::V4(v4) => Some(v4),
                    IpAddr::V6(_) => None,
                }))
                .collect(),
            subnet_v4: nets.v4,
            ipv6s: eni
                .ipv6_addresses_set
                .item
                .iter()
                .filter_map(|i| i.ipv6_address.parse().ok())
                .collect(),
            subnet_v6: nets.v6,
            subnet_id: eni.subnet_id.clone(),
        };
        let attachment = att.and_then(|a| {
            let instance = a.instance_id.clone()?;
            (a.status != "detached").then(|| FleetAttachment {
                instance,
                device_index: a.device_index.unwrap_or_default(),
                attachment_id: a.attachment_id.clone().unwrap_or_default(),
                state: a.status.clone(),
            })
        });
        let groups = eni.group_set.item.iter().map(|g| g.group_id.clone());
        Ok(FleetEni {
            attachment,
            node: eni.tag(TAG_NODE).map(str::to_string),
            intent: eni.tag(TAG_INTENT).map(str::to_string),
            cluster: eni.tag(TAG_CLUSTER).map(str::to_string),
            created_at: CreatedAt::from_tag(eni.tag(TAG_CREATED_AT)),
            ..FleetEni::addressed(info.to_eni(None), eni.subnet_id.clone(), groups.collect())
        })
    }

    /// [`Self::fleet_eni`] of ENIs EC2 listed, their subnets asked as
    /// needed. An ENI that cannot be read is left out, with a warning: one
    /// odd ENI must not hide the cluster's others.
    async fn fleet_enis(&self, enis: Vec<NetworkInterface>) -> Result<Vec<FleetEni>, AwsError> {
        let ids: Vec<&str> = enis.iter().map(|e| e.subnet_id.as_str()).collect();
        let nets = self.subnet_nets(&ids).await?;
        let mut out = Vec::with_capacity(enis.len());
        for eni in enis {
            let id = eni.network_interface_id.clone();
            let Some(n) = nets.get(&eni.subnet_id).copied() else {
                tracing::warn!(eni = %id, subnet = %eni.subnet_id, "ENI in a subnet EC2 does not describe; left out");
                continue;
            };
            match Self::fleet_eni(eni, n) {
                Ok(e) => out.push(e),
                Err(e) => tracing::warn!(eni = %id, error = %e, "unreadable ENI left out"),
            }
        }
        Ok(out)
    }

    /// The one ENI `eni` makes of the listing, or why it cannot.
    async fn one(&self, eni: NetworkInterface) -> Result<FleetEni, AwsError> {
        let subnet = eni.subnet_id.clone();
        let nets = self.subnet_nets(&[&subnet]).await?;
        let n = nets
            .get(&subnet)
            .copied()
            .ok_or_else(|| AwsError::BadSubnet {
                subnet,
                value: "not found".into(),
            })?;
        Self::fleet_eni(eni, n)
    }

    /// `eni_id`, checked to be this cluster's and not an instance's own
    /// interface; [`AwsError::Missing`] when it does not exist.
    async fn ours(&self, eni_id: &str) -> Result<NetworkInterface, AwsError> {
        let eni = steps::existing(&self.ec2, eni_id).await?;
        if !in_cluster(&eni, &self.cluster) {
            return Err(AwsError::NotInCluster {
                eni_id: eni_id.into(),
                cluster: self.cluster.clone(),
            });
        }
        if steps::is_primary(&eni) {
            return Err(AwsError::Primary(eni_id.into()));
        }
        Ok(eni)
    }

    /// The ENI an earlier create with `token` made, if any.
    async fn by_intent(&self, token: &str) -> Result<Option<NetworkInterface>, AwsError> {
        let mut found = self
            .ec2
            .describe_network_interfaces(&[
                (&format!("tag:{TAG_CLUSTER}"), &[self.cluster.as_str()]),
                (&format!("tag:{TAG_INTENT}"), &[token]),
            ])
            .await
            .map_err(ec2(format!("looking up the ENI of intent {token}")))?;
        found.retain(|e| in_cluster(e, &self.cluster) && e.tag(TAG_INTENT) == Some(token));
        found.sort_by(|a, b| a.network_interface_id.cmp(&b.network_interface_id));
        if found.len() > 1 {
            // Only a cloud that ignores ClientToken makes two; the rest
            // are leaks the reaper finds (untouched by the operator).
            tracing::warn!(intent = token, enis = ?found.iter().map(|e| &e.network_interface_id).collect::<Vec<_>>(), "more than one ENI carries the same intent; using the first");
        }
        Ok(found.into_iter().next())
    }

    async fn do_create(&self, req: &CreateEni) -> Result<FleetEni, AwsError> {
        let token = req.client_token.as_str();
        if token.is_empty() || token.len() > MAX_CLIENT_TOKEN || !token.is_ascii() {
            return Err(AwsError::Config(format!(
                "client token {token:?} must be 1 to {MAX_CLIENT_TOKEN} ASCII characters"
            )));
        }
        // A fresh token was never sent: no ENI carries it, and EC2's
        // ClientToken covers the client's own retries of this one call.
        if !req.fresh {
            if let Some(made) = self.by_intent(token).await? {
                tracing::info!(eni = %made.network_interface_id, intent = token, "the intent's ENI exists already");
                return self.one(made).await;
            }
        }
        let tags = [
            (TAG_MANAGED, "true"),
            (TAG_CLUSTER, &self.cluster),
            (TAG_NODE, &req.instance),
            (TAG_INTENT, token),
            (TAG_CREATED_AT, &format_created_at(SystemTime::now())),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()));
        let description = format!("enim pod ENI of {}", req.instance);
        let security_groups = match req.security_groups.is_empty() {
            true => self.primary_groups(&req.instance).await?,
            false => req.security_groups.clone(),
        };
        crash_point("cloud:before-create");
        let created = self
            .ec2
            .create_network_interface(&client::CreateEni {
                subnet_id: &req.subnet,
                security_group_ids: &security_groups,
                description: &description,
                client_token: token,
                tags: &tags,
                ipv6_address_count: u32::from(self.assign_ipv6),
                secondary_ipv4_count: req.secondary_ipv4,
            })
            .await;
        let created = match created {
            Ok(eni) => eni,
            // The token was used with other parameters: what it made is
            // the intent's ENI all the same.
            Err(e) if e.code() == Some("IdempotentParameterMismatch") => {
                match self.by_intent(token).await? {
                    Some(made) => made,
                    None => return Err(ec2(format!("creating an ENI in {}", req.subnet))(e)),
                }
            }
            Err(e) => return Err(ec2(format!("creating an ENI in {}", req.subnet))(e)),
        };
        crash_point("cloud:after-create");
        tracing::info!(eni = %created.network_interface_id, node = %req.instance, intent = token, "created ENI");
        let mut eni = self.one(created).await?;
        // The create's reply may leave the tags out; they are these.
        eni.node = Some(req.instance.clone());
        eni.intent = Some(token.to_string());
        eni.cluster = Some(self.cluster.clone());
        if eni.created_at == CreatedAt::Missing {
            eni.created_at = CreatedAt::from_tag(Some(&tags[4].1));
        }
        Ok(eni)
    }

    /// Attaches `eni` as listed or created: this cluster's (by what was
    /// seen, no call), and attached nowhere then, so AttachNetworkInterface
    /// straight away; EC2 refuses an ENI in use, and only then is it looked
    /// at. One shown attached somewhere is looked at first.
    async fn do_attach(&self, eni: &FleetEni, at: Slot<'_>) -> Result<(), AwsError> {
        let (instance, index) = (at.instance, at.device_index);
        let eni_id = eni.id.as_str();
        if eni.cluster.as_deref() != Some(self.cluster.as_str()) {
            return Err(AwsError::NotInCluster {
                eni_id: eni_id.into(),
                cluster: self.cluster.clone(),
            });
        }
        if eni.attachment.is_some() {
            return self.attach_looked(eni_id, at).await;
        }
        let settle = |now: &NetworkInterface| {
            if !in_cluster(now, &self.cluster) {
                return Err(AwsError::NotInCluster {
                    eni_id: eni_id.into(),
                    cluster: self.cluster.clone(),
                });
            }
            if let Some(id) = steps::attachment_on(now, instance, Some(index)) {
                tracing::info!(
                    eni = eni_id,
                    instance,
                    device_index = index,
                    "ENI attached there already"
                );
                return Ok(Some(id));
            }
            match now.attached_instance() {
                Some(other) if other != instance => Err(AwsError::ForeignAttachment {
                    eni_id: eni_id.into(),
                    other: other.into(),
                    instance: instance.into(),
                }),
                _ => Ok(None),
            }
        };
        steps::attach_at(&self.ec2, eni_id, instance, index, settle).await?;
        crash_point("cloud:after-attach");
        tracing::info!(eni = eni_id, instance, device_index = index, "attached ENI");
        Ok(())
    }

    /// Attaches `eni_id` after a look: attached here already is done,
    /// elsewhere refused, mid-detach waited for.
    async fn attach_looked(&self, eni_id: &str, at: Slot<'_>) -> Result<(), AwsError> {
        let (instance, index) = (at.instance, at.device_index);
        let eni = self.ours(eni_id).await?;
        match eni.attached_instance() {
            Some(i) if i == instance => {
                let at = eni.attachment.as_ref().and_then(|a| a.device_index);
                if at != Some(index) {
                    tracing::warn!(
                        eni = eni_id,
                        instance,
                        asked = index,
                        ?at,
                        "ENI already attached to the instance at another device index"
                    );
                }
                return Ok(());
            }
            Some(other) => {
                return Err(AwsError::ForeignAttachment {
                    eni_id: eni_id.into(),
                    other: other.into(),
                    instance: instance.into(),
                })
            }
            None => {}
        }
        if eni.status != "available"
            && steps::await_detached(&self.ec2, eni_id, self.detach_timeout)
                .await?
                .is_none()
        {
            return Err(AwsError::Missing(eni_id.into()));
        }
        let settle = |now: &NetworkInterface| Ok(steps::attachment_on(now, instance, Some(index)));
        steps::attach_at(&self.ec2, eni_id, instance, index, settle).await?;
        crash_point("cloud:after-attach");
        tracing::info!(eni = eni_id, instance, device_index = index, "attached ENI");
        Ok(())
    }

    /// Asks EC2 to detach `eni` and returns: no polling (the operator's
    /// next listing shows the detach). With the listing's attachment id,
    /// DetachNetworkInterface alone (an attachment that is over is refused
    /// by EC2 and counts as done); without one, or for device index 0,
    /// the ENI is looked at first (this cluster's, not a primary).
    async fn do_start_detach(&self, eni: &FleetEni) -> Result<(), AwsError> {
        let listed = eni.detachable_attachment();
        let Some(att) = listed else {
            let eni = match self.ours(&eni.id).await {
                Ok(eni) => eni,
                Err(AwsError::Missing(_)) => return Ok(()),
                Err(e) => return Err(e),
            };
            return steps::send_detach(&self.ec2, &eni).await;
        };
        if att.detaching() {
            return Ok(());
        }
        steps::detach_attachment(&self.ec2, &eni.id, &att.attachment_id).await
    }

    async fn do_delete(&self, eni_id: &str, check: DeleteCheck) -> Result<Reaped, AwsError> {
        let cluster = self.cluster.as_str();
        let reaped = match check {
            DeleteCheck::Listed => steps::delete_unlooked(&self.ec2, eni_id).await?,
            DeleteCheck::SecondLook => {
                steps::delete_checked(&self.ec2, eni_id, |e| in_cluster(e, cluster)).await?
            }
        };
        if reaped == Reaped::Deleted {
            crash_point("cloud:after-delete");
        }
        Ok(reaped)
    }

    async fn do_limits(&self, instance_type: &str) -> Result<AddressLimits, AwsError> {
        if let Some(l) = lock(&self.limits).get(instance_type) {
            return Ok(*l);
        }
        let l = self
            .ec2
            .instance_limits(instance_type)
            .await
            .map_err(ec2(format!("limits of instance type {instance_type}")))?;
        lock(&self.limits).insert(instance_type.to_string(), l);
        Ok(l)
    }
}

#[async_trait]
impl FleetCloud for AwsFleet {
    fn name(&self) -> &str {
        "aws"
    }

    async fn list_cluster_enis(&self) -> Result<Vec<FleetEni>, ProviderError> {
        let listed = steps::cluster_enis(&self.ec2, &self.cluster).await?;
        Ok(self.fleet_enis(listed).await?)
    }

    async fn limits(&self, instance_type: &str) -> Result<AddressLimits, ProviderError> {
        Ok(self.do_limits(instance_type).await?)
    }

    async fn create(&self, req: &CreateEni) -> Result<FleetEni, ProviderError> {
        Ok(self.do_create(req).await?)
    }

    async fn attach(&self, eni: &FleetEni, at: Slot<'_>) -> Result<(), ProviderError> {
        Ok(self.do_attach(eni, at).await?)
    }

    async fn start_detach(&self, eni: &FleetEni) -> Result<(), ProviderError> {
        Ok(self.do_start_detach(eni).await?)
    }

    async fn delete(&self, eni_id: &str, check: DeleteCheck) -> Result<Reaped, ProviderError> {
        Ok(self.do_delete(eni_id, check).await?)
    }

    async fn assign(&self, eni_id: &str, n: AddressCount) -> Result<Vec<IpAddr>, ProviderError> {
        Ok(steps::assign(&self.ec2, eni_id, n, || self.ours(eni_id)).await?)
    }

    async fn unassign(&self, eni_id: &str, ips: &[IpAddr]) -> Result<(), ProviderError> {
        let lookup = self.ours(eni_id).await;
        Ok(steps::unassign(&self.ec2, eni_id, ips, lookup).await?)
    }
}
