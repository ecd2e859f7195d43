//! [`BceFleet`]: the operator's [`FleetCloud`] on Baidu BCE, for the whole
//! cluster from one place.
//!
//! BCE ENIs have no tags, so the marks the node backend keeps in an ENI's
//! name and description are the listing's truth here too: the name
//! `enim-<instance>-<suffix>` says enim made it and for which node, and
//! the description's `key=value` words carry the cluster, the creation
//! time, the intent ([`TAG_INTENT`]) and the device index. BCE chooses no
//! device index itself, so [`FleetCloud::attach`] writes the one it is
//! given into the description first (secondary mode numbers route tables
//! from it, on the node as here).
//!
//! BCE's list call has no filter by description: the VPC is listed (paged)
//! and filtered here, once per listing. The subnets' blocks come from the
//! VPC API once per subnet and are kept.
//!
//! A create whose request names no security groups gives the ENI its
//! instance's (listed once per instance and kept), never BCE's default
//! group.
//!
//! Idempotency of `create`: BCE answers a repeated clientToken with the
//! first answer, and the name is made from the token, so a retry is the
//! same request; the intent word lets a successor find the ENI in the
//! listing. No look-up by intent is made before a create, so
//! [`CreateEni::fresh`] changes nothing here.
//!
//! Lookups by id: an attach refuses an ENI the listing (or the create)
//! did not see marked for this cluster without a call; its one GET (for
//! the name and description the device index is written into) is the
//! attach's first poll too. A [`DeleteCheck::Listed`] delete is sent with
//! no look (BCE refuses an ENI in use); a [`DeleteCheck::SecondLook`] one
//! looks first.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Mutex;
use std::time::SystemTime;

use async_trait::async_trait;
use enim_core::fault::crash_point;
use enim_core::sync::lock;
use enim_core::{AddressCount, AddressLimits, MacAddr, ProviderError};
use enim_provider::cloud::{format_created_at, CreatedAt, Reaped, TAG_CLUSTER, TAG_CREATED_AT};
use enim_provider::fleet::{
    CreateEni, DeleteCheck, FleetAttachment, FleetCloud, FleetEni, Slot, SubnetBlocks, TAG_INTENT,
};
use ipnet::{Ipv4Net, Ipv6Net};

use crate::client::{self, client_token, ApiClient, ApiEni, ApiSubnet, EniStatus, PrivateIp};
use crate::config::BceFleetConfig;
use crate::error::BceError;
use crate::metadata::MetaInterface;
use crate::steps::{self, InstanceGroups};
use crate::tags::{
    description_tag, device_index_of, eni_name_prefix, in_cluster, node_of, with_word,
    DEVICE_INDEXES, TAG_DEVICE_INDEX,
};

/// BCE's limits on a description and a clientToken.
const MAX_DESCRIPTION: usize = 200;
const MAX_CLIENT_TOKEN: usize = 64;

/// `s`'s blocks, as the VPC API describes them (the gateways are each
/// block's first host).
fn blocks_of(s: &ApiSubnet) -> Result<SubnetBlocks, BceError> {
    let v6 = Some(s.ipv6_cidr.trim()).filter(|b| !b.is_empty());
    SubnetBlocks::parse(&s.cidr, v6).map_err(|value| BceError::BadSubnet {
        subnet: s.subnet_id.clone(),
        value: value.into(),
    })
}

/// The operator's BCE backend for one cluster (one per operator: its
/// token buckets are the whole cluster's).
pub struct BceFleet {
    api: ApiClient,
    config: BceFleetConfig,
    subnets: Mutex<HashMap<String, SubnetBlocks>>,
    /// Each instance's security groups, once listed: its new ENIs' when
    /// the request names none.
    groups: InstanceGroups,
}

/// A short stable digest of a token (FNV-1a), for the ENI's name: the
/// same token always names the same ENI, so a retried create is the same
/// request.
fn token_digest(token: &str) -> String {
    let hash = token.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("{:012x}", hash & 0xffff_ffff_ffff)
}

impl BceFleet {
    /// Validates `config` and sets up the API client (credentials from
    /// the config, else the environment). Makes no call.
    pub fn connect(config: &BceFleetConfig) -> Result<BceFleet, ProviderError> {
        config.validate()?;
        let creds = config.credentials().map_err(BceError::from)?;
        let endpoint = config.endpoint();
        let api =
            ApiClient::configured(&endpoint, creds, &config.api).map_err(BceError::Endpoint)?;
        tracing::info!(cluster = %config.cluster, vpc = %config.vpc_id, %endpoint, "BCE fleet backend ready");
        Ok(BceFleet {
            api,
            config: config.clone(),
            subnets: Mutex::new(HashMap::new()),
            groups: InstanceGroups::new(&config.vpc_id, config.list_page_size),
        })
    }

    /// enim's (its name) and marked for this cluster.
    fn in_cluster(&self, eni: &ApiEni) -> bool {
        in_cluster(eni, &self.config.cluster)
    }

    /// `eni_id`, checked to be this cluster's.
    async fn ours(&self, eni_id: &str) -> Result<ApiEni, BceError> {
        let eni = steps::get_known(&self.api, eni_id).await?;
        self.check_ours(&eni)?;
        Ok(eni)
    }

    fn check_ours(&self, eni: &ApiEni) -> Result<(), BceError> {
        if self.in_cluster(eni) {
            return Ok(());
        }
        Err(BceError::NotInCluster {
            eni_id: eni.eni_id.clone(),
            name: eni.name.clone(),
            cluster: self.config.cluster.clone(),
        })
    }

    /// The blocks of `subnet`, asked once.
    async fn nets(&self, subnet: &str) -> Result<SubnetBlocks, BceError> {
        if let Some(n) = lock(&self.subnets).get(subnet) {
            return Ok(*n);
        }
        let nets = blocks_of(&self.api.get_subnet(subnet).await?)?;
        lock(&self.subnets).insert(subnet.to_string(), nets);
        Ok(nets)
    }

    /// `eni` as the listing shows it, addressed as instance metadata
    /// addresses it on a node.
    async fn fleet_eni(&self, eni: ApiEni) -> Result<FleetEni, BceError> {
        let nets = self.nets(&eni.subnet_id).await?;
        let id = &eni.eni_id;
        let bad = |what: &str| BceError::BadReport {
            eni_id: id.clone(),
            what: what.into(),
        };
        let mac: MacAddr = eni
            .mac_address
            .parse()
            .map_err(|_| bad(&format!("MAC {:?}", eni.mac_address)))?;
        let primary = eni.primary_ipv4().ok_or_else(|| bad("no primary IPv4"))?;
        let own_v6 = eni
            .ipv6_private_ip_set
            .first()
            .and_then(|p| p.private_ip_address.parse::<Ipv6Addr>().ok());
        let first_host = |net: Ipv4Net| Ipv4Addr::from(u32::from(net.network()).wrapping_add(1));
        let v6 = nets.v6.zip(own_v6).and_then(|(net, a)| {
            let gw = Ipv6Addr::from(u128::from(net.network()).wrapping_add(1));
            Some((Ipv6Net::new(a, net.prefix_len()).ok()?, gw))
        });
        let iface = MetaInterface {
            mac,
            ipv4: Ipv4Net::new(primary, nets.v4.prefix_len()).map_err(|_| bad("a bad prefix"))?,
            gateway4: first_host(nets.v4),
            ipv6: v6.map(|(n, _)| n),
            gateway6: v6.map(|(_, gw)| gw),
            all_ips: std::iter::once(IpAddr::V4(primary))
                .chain(own_v6.map(IpAddr::V6))
                .chain(eni.non_primary_ips())
                .collect(),
        };
        let status = eni.status();
        let attachment = match (&status, eni.attached_to()) {
            (EniStatus::Available, _) | (_, None) => None,
            (_, Some(instance)) => Some(FleetAttachment {
                instance: instance.to_string(),
                device_index: device_index_of(&eni).unwrap_or_default(),
                attachment_id: String::new(),
                state: status.to_string(),
            }),
        };
        let words = &eni.description;
        Ok(FleetEni {
            attachment,
            node: node_of(&eni.name).map(str::to_string),
            intent: description_tag(words, TAG_INTENT).map(str::to_string),
            cluster: description_tag(words, TAG_CLUSTER).map(str::to_string),
            created_at: CreatedAt::from_tag(description_tag(words, TAG_CREATED_AT)),
            ..FleetEni::addressed(iface.to_eni(id), eni.subnet_id.clone(), Vec::new())
        })
    }

    async fn do_list(&self) -> Result<Vec<FleetEni>, BceError> {
        let all = self
            .api
            .list_enis(&self.config.vpc_id, None, self.config.list_page_size)
            .await?;
        let mut out = Vec::new();
        for eni in all.into_iter().filter(|e| self.in_cluster(e)) {
            let id = eni.eni_id.clone();
            match self.fleet_eni(eni).await {
                Ok(e) => out.push(e),
                // One odd ENI must not hide the cluster's others.
                Err(e) if !e.is_transient() => {
                    let e = ProviderError::from(e);
                    tracing::warn!(eni = %id, error = %e, "unreadable ENI left out")
                }
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    async fn do_create(&self, req: &CreateEni) -> Result<FleetEni, BceError> {
        let token = req.client_token.as_str();
        let bad = |why: String| Err(BceError::Config(why));
        if token.is_empty() || token.len() > MAX_CLIENT_TOKEN || !token.is_ascii() {
            return bad(format!(
                "client token {token:?} must be 1 to {MAX_CLIENT_TOKEN} ASCII characters"
            ));
        }
        if token.contains(char::is_whitespace) || token.contains(';') {
            return bad(format!("client token {token:?} must be one word"));
        }
        let name = format!("{}{}", eni_name_prefix(&req.instance), token_digest(token));
        let description = format!(
            "{TAG_CREATED_AT}={} {TAG_CLUSTER}={} {TAG_INTENT}={token}",
            format_created_at(SystemTime::now()),
            self.config.cluster
        );
        // Room is left for the device index attach writes.
        let room = MAX_DESCRIPTION - format!(" {TAG_DEVICE_INDEX}=255").len();
        if description.len() > room {
            return bad(format!(
                "cluster name and client token too long for a BCE description ({} of {room} characters)",
                description.len()
            ));
        }
        let security_groups = self
            .groups
            .for_new_eni(&self.api, &req.instance, &req.security_groups)
            .await?;
        crash_point("cloud:before-create");
        let eni_id = self
            .api
            .create_eni(
                &client::CreateEni {
                    name: &name,
                    subnet_id: &req.subnet,
                    security_group_ids: &security_groups,
                    private_ip_set: vec![PrivateIp {
                        primary: true,
                        private_ip_address: String::new(),
                    }],
                    description: &description,
                },
                token,
            )
            .await?;
        crash_point("cloud:after-create");
        tracing::info!(eni = %eni_id, %name, node = %req.instance, intent = token, "ENI created");
        let mut eni = steps::get_known(&self.api, &eni_id).await?;
        // Secondary addresses up to the count asked for: by what the ENI
        // has, so a retried create adds none twice.
        let have = eni.ipv4_count().saturating_sub(1);
        if req.secondary_ipv4 > have {
            let per_eni = usize::try_from(self.api.ip_quota(&eni_id).await?.total_quantity)
                .unwrap_or(usize::MAX);
            let lookup = || steps::get_known(&self.api, &eni_id);
            let counts = AddressCount::v4(req.secondary_ipv4 - have);
            steps::assign(&self.api, &eni_id, eni, counts, per_eni, lookup).await?;
            eni = steps::get_known(&self.api, &eni_id).await?;
        }
        self.fleet_eni(eni).await
    }

    async fn do_attach(&self, listed: &FleetEni, at: Slot<'_>) -> Result<(), BceError> {
        let (instance, index) = (at.instance, at.device_index);
        let eni_id = listed.id.as_str();
        if !DEVICE_INDEXES.contains(&index) {
            return Err(BceError::Config(format!(
                "device index {index} is outside {DEVICE_INDEXES:?}"
            )));
        }
        if listed.cluster.as_deref() != Some(self.config.cluster.as_str()) {
            return Err(BceError::Config(format!(
                "ENI {eni_id} was not seen marked {TAG_CLUSTER}={}: not this cluster's",
                self.config.cluster
            )));
        }
        let eni = self.ours(eni_id).await?;
        let attached_here = eni.attached_to() == Some(instance)
            && matches!(eni.status(), EniStatus::InUse | EniStatus::Attaching);
        if !attached_here && device_index_of(&eni) != Some(index) {
            // Kept with the ENI before it is attached: the node numbers its
            // route table from it.
            let described = with_word(&eni.description, TAG_DEVICE_INDEX, &index.to_string());
            self.api
                .modify_eni(eni_id, &eni.name, &described, &client_token())
                .await?;
        }
        let limit = self.config.operation_timeout;
        let mut poll = steps::operation_poll(self.config.poll_interval, limit);
        // The look above is the first poll: status and attachment are all
        // it reads, and the description change left them as they were.
        steps::attach_polled(&self.api, eni_id, instance, Some(eni), &mut poll, limit).await?;
        if !attached_here {
            crash_point("cloud:after-attach");
            tracing::info!(eni = eni_id, instance, device_index = index, "ENI attached");
        }
        Ok(())
    }

    /// One look (BCE's detach names the instance; it has no attachment
    /// id), then the detach asked for an ENI in use: no polling, the
    /// operator's next listing shows it detaching or available.
    async fn do_start_detach(&self, eni_id: &str) -> Result<(), BceError> {
        let eni = match self.api.get_eni(eni_id).await {
            Ok(e) => e,
            Err(e) if e.is_not_found() => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        self.check_ours(&eni)?;
        // Attaching: BCE detaches only an ENI in use; the next listing
        // shows it in use and the operator asks again.
        if let (EniStatus::InUse, Some(instance)) = (eni.status(), eni.attached_to()) {
            steps::request_detach(&self.api, eni_id, instance, &client_token()).await?;
        }
        Ok(())
    }

    async fn do_delete(&self, eni_id: &str, check: DeleteCheck) -> Result<Reaped, BceError> {
        let reaped = match check {
            DeleteCheck::Listed => steps::delete_unlooked(&self.api, eni_id).await?,
            DeleteCheck::SecondLook => {
                steps::delete_checked(&self.api, eni_id, |e| self.in_cluster(e)).await?
            }
        };
        if reaped == Reaped::Deleted {
            crash_point("cloud:after-delete");
        }
        Ok(reaped)
    }

    async fn do_assign(&self, eni_id: &str, count: AddressCount) -> Result<Vec<IpAddr>, BceError> {
        let before = self.ours(eni_id).await?;
        let per_eni =
            usize::try_from(self.api.ip_quota(eni_id).await?.total_quantity).unwrap_or(usize::MAX);
        let lookup = || self.ours(eni_id);
        steps::assign(&self.api, eni_id, before, count, per_eni, lookup).await
    }
}

#[async_trait]
impl FleetCloud for BceFleet {
    fn name(&self) -> &str {
        "bce"
    }

    async fn list_cluster_enis(&self) -> Result<Vec<FleetEni>, ProviderError> {
        Ok(self.do_list().await?)
    }

    async fn limits(&self, instance_type: &str) -> Result<AddressLimits, ProviderError> {
        let known = self.config.limits.get(instance_type);
        known.copied().map(AddressLimits::from).ok_or_else(|| {
            ProviderError::Config(format!(
                "bce fleet: no limits for instance type {instance_type:?}: add them to [limits]"
            ))
        })
    }

    async fn create(&self, req: &CreateEni) -> Result<FleetEni, ProviderError> {
        Ok(self.do_create(req).await?)
    }

    async fn attach(&self, eni: &FleetEni, at: Slot<'_>) -> Result<(), ProviderError> {
        Ok(self.do_attach(eni, at).await?)
    }

    async fn start_detach(&self, eni: &FleetEni) -> Result<(), ProviderError> {
        Ok(self.do_start_detach(&eni.id).await?)
    }

    async fn delete(&self, eni_id: &str, check: DeleteCheck) -> Result<Reaped, ProviderError> {
        Ok(self.do_delete(eni_id, check).await?)
    }

    async fn assign(&self, eni_id: &str, n: AddressCount) -> Result<Vec<IpAddr>, ProviderError> {
        Ok(self.do_assign(eni_id, n).await?)
    }

    async fn unassign(&self, eni_id: &str, ips: &[IpAddr]) -> Result<(), ProviderError> {
        let lookup = self.ours(eni_id).await;
        Ok(steps::unassign(&self.api, eni_id, ips, lookup).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests() {
        let d = token_digest("intent-1");
        assert_eq!(d.len(), 12);
        assert_eq!(d, token_digest("intent-1"));
        assert_ne!(d, token_digest("intent-2"));
    }
}
