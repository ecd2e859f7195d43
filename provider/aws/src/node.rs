//! [`AwsBackend`]: the [`CloudBackend`] the warm pool drives on EC2, for
//! one node, and [`build`], the started pool `enimd` uses.
//!
//! Instance metadata is the truth for what is attached and how it is
//! addressed (it is what the node's kernel sees); the EC2 API is the truth
//! for what exists, which interfaces enim created (by tag), and for
//! attachment state while metadata lags.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use aws_credential_types::Credentials;
use enim_core::fault::crash_point;
use enim_core::pacing::{Pacing, AGENT_PACING};
use enim_core::{AddressCount, AddressLimits, Eni, MacAddr, ProviderError};
use enim_provider::cloud::{
    format_created_at, CloudBackend, Reaped, TaggedEni, UnattachedEni, TAG_CLUSTER, TAG_CREATED_AT,
};
use enim_provider::kept::{keeps, KeptEnis};
use enim_provider::EniProvider;
use enim_provider_pool::{PoolRole, WarmPool};
use tokio::sync::{Mutex, OnceCell};

use crate::client::{CreateEni, Ec2Client, NetworkInterface};
use crate::config::AwsConfig;
use crate::credentials::CredentialsProvider;
use crate::error::{ec2, imds, AwsError};
use crate::metadata::{Imds, InterfaceInfo};
use crate::steps;
use crate::tags::{self, TAG_MANAGED, TAG_NODE};

// The reaper's side of `AwsBackend`.
mod reaper;

/// Bound on waiting for a lagging interface while listing: listing runs at
/// pool start and should not stall for the full `metadata_wait`.
const LIST_LAG_WAIT: Duration = Duration::from_secs(10);

/// The AWS provider for `enimd`: discovers the instance, then starts a
/// warm pool over the EC2 backend. Credentials come from the environment,
/// else the instance role.
pub async fn build(
    config: &AwsConfig,
    role: PoolRole,
) -> Result<Arc<dyn EniProvider>, ProviderError> {
    let pool: Arc<dyn EniProvider> = build_with(config, None, role).await?;
    Ok(pool)
}

/// As [`build`], with fixed credentials when given, returning the pool
/// itself (for its statistics and shutdown).
pub async fn build_with(
    config: &AwsConfig,
    credentials: Option<Credentials>,
    role: PoolRole,
) -> Result<Arc<WarmPool>, ProviderError> {
    let backend = AwsBackend::discover_with(config, credentials).await?;
    WarmPool::start_as(Arc::new(backend), config.pool.clone(), role).await
}

/// The EC2 backend of one instance.
pub struct AwsBackend {
    imds: Arc<Imds>,
    ec2: Ec2Client,
    /// `ec2`'s pacing, which the pool's fill steers.
    pacing: Arc<Pacing>,
    instance_id: String,
    instance_type: String,
    region: String,
    subnet_id: String,
    /// New ENIs' groups: the config's, else the primary interface's.
    security_group_ids: Vec<String>,
    config: AwsConfig,
    /// The instance type's limits, asked once.
    limits: OnceCell<AddressLimits>,
    /// Device-index choice and attach happen one at a time, so two creates
    /// never pick the same index.
    attach_lock: Mutex<()>,
    /// ENIs made here whose attach was throttled, with their MACs: the
    /// next create attaches one of them instead of making another.
    kept: KeptEnis<(String, String)>,
}

impl AwsBackend {
    /// Discovers the instance through IMDS and sets up the EC2 client with
    /// the default credentials chain (environment, then instance role).
    pub async fn discover(config: &AwsConfig) -> Result<AwsBackend, AwsError> {
        Self::discover_with(config, None).await
    }

    /// As [`discover`](Self::discover), with fixed credentials when given.
    pub async fn discover_with(
        config: &AwsConfig,
        credentials: Option<Credentials>,
    ) -> Result<AwsBackend, AwsError> {
        config.validate().map_err(AwsError::Config)?;
        let imds_client =
            Arc::new(Imds::new(&config.imds_endpoint).map_err(imds("instance metadata client"))?);
        let instance_id = imds_client
            .instance_id()
            .await
            .map_err(imds("discovering the instance id"))?;
        let region = match &config.region {
            Some(r) => r.clone(),
            None => imds_client
                .region()
                .await
                .map_err(imds("discovering the region"))?,
        };
        let instance_type = imds_client
            .instance_type()
            .await
            .map_err(imds("discovering the instance type"))?;
        // What the config leaves out comes from the instance's own
        // interface, as AWS VPC CNI's defaults do: its subnet, and its
        // security groups (not the VPC's default group, which EC2 would
        // give an ENI made without any).
        let primary = match config.subnet_id.is_none() || config.security_group_ids.is_empty() {
            true => Some(
                imds_client
                    .interfaces(LIST_LAG_WAIT)
                    .await
                    .map_err(imds("discovering the primary interface"))?
                    .into_iter()
                    .find(InterfaceInfo::is_primary)
                    .ok_or(AwsError::NoPrimary)?,
            ),
            false => None,
        };
        let subnet_id = config
            .subnet_id
            .clone()
            .or_else(|| primary.as_ref().map(|p| p.subnet_id.clone()))
            .ok_or(AwsError::NoPrimary)?;
        let security_group_ids = match &primary {
            Some(p) if config.security_group_ids.is_empty() => imds_client
                .security_groups(p.mac)
                .await
                .map_err(imds("reading the primary interface's security groups"))?,
            _ => config.security_group_ids.clone(),
        };
        let creds = Arc::new(match credentials {
            Some(c) => CredentialsProvider::fixed(c),
            None => CredentialsProvider::default_chain(imds_client.clone(), &region).await?,
        });
        // One set of buckets for the agent: the backend is its only EC2
        // client. Paced by throttle replies: the agent shares the account's
        // buckets with every other node's and can see only its own replies.
        let pacing = Arc::new(Pacing::new(AGENT_PACING));
        let ec2_client = Ec2Client::configured(&region, creds, &config.api)
            .map_err(ec2("EC2 client"))?
            .with_pacing(pacing.clone());
        tracing::info!(
            instance = %instance_id,
            %instance_type,
            %region,
            subnet = %subnet_id,
            security_groups = ?security_group_ids,
            cluster = config.cluster.as_deref().unwrap_or("-"),
            "AWS backend discovered the instance",
        );
        Ok(AwsBackend {
            imds: imds_client,
            ec2: ec2_client,
            pacing,
            instance_id,
            instance_type,
            region,
            subnet_id,
            security_group_ids,
            config: config.clone(),
            limits: OnceCell::new(),
            attach_lock: Mutex::new(()),
            kept: KeptEnis::default(),
        })
    }

    pub fn instance_id(&self) -> &str {
        &self.instance_id
    }

    pub fn instance_type(&self) -> &str {
        &self.instance_type
    }

    pub fn region(&self) -> &str {
        &self.region
    }

    /// The subnet new ENIs are created in.
    pub fn subnet_id(&self) -> &str {
        &self.subnet_id
    }

    pub fn ec2(&self) -> &Ec2Client {
        &self.ec2
    }

    /// Tags of a new ENI: enim's, this node's, when it was made (the
    /// reaper's cooldown) and, when configured, the cluster's.
    fn tags(&self) -> Vec<(String, String)> {
        let mut tags = vec![
            (TAG_MANAGED.into(), "true".into()),
            (TAG_NODE.into(), self.instance_id.clone()),
            (TAG_CREATED_AT.into(), format_created_at(SystemTime::now())),
        ];
        if let Some(c) = &self.config.cluster {
            tags.push((TAG_CLUSTER.into(), c.clone()));
        }
        tags
    }

    /// `eni_id` as EC2 sees it, `None` if it does not exist; `what` names
    /// the step in an error.
    async fn describe(
        &self,
        eni_id: &str,
        what: String,
    ) -> Result<Option<NetworkInterface>, AwsError> {
        steps::describe(&self.ec2, eni_id, what).await
    }

    fn is_ours(&self, eni: &NetworkInterface) -> bool {
        tags::of_node(eni, &self.instance_id)
    }

    /// Unique per create, at most 64 ASCII characters as EC2 requires.
    fn client_token(&self) -> String {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let mut t = format!(
            "enim-{}-{:x}-{:x}",
            self.instance_id,
            nanos,
            fastrand::u32(..)
        );
        t.truncate(64);
        t
    }

    async fn limits(&self) -> Result<AddressLimits, AwsError> {
        self.limits
            .get_or_try_init(|| async {
                self.ec2
                    .instance_limits(&self.instance_type)
                    .await
                    .map_err(ec2(format!(
                        "limits of instance type {}",
                        self.instance_type
                    )))
            })
            .await
            .copied()
    }

    async fn limit(&self) -> Result<usize, AwsError> {
        Ok(self.limits().await?.enis)
    }

    /// Interfaces on card 0 (the primary included) as instance metadata
    /// shows them now, not waiting for one it shows only in part.
    async fn attached_on_card0(&self) -> Result<usize, AwsError> {
        let shown = self
            .imds
            .interfaces(Duration::ZERO)
            .await
            .map_err(imds("listing attached interfaces"))?;
        let on_card0 = shown.iter().filter(|i| i.network_card == 0).count();
        Ok(on_card0.max(1))
    }

    /// Interfaces on card 0 now and the lowest free device index there,
    /// from EC2 (metadata may not show an attach in progress yet).
    async fn device_slots(&self) -> Result<(usize, u32), AwsError> {
        let attached = self
            .ec2
            .describe_network_interfaces(&[(
                "attachment.instance-id",
                &[self.instance_id.as_str()],
            )])
            .await
            .map_err(ec2("listing this instance's interfaces"))?;
        let used: BTreeSet<u32> = attached
            .iter()
            .filter_map(|n| n.attachment.as_ref())
            .filter(|a| a.network_card_index.unwrap_or(0) == 0)
            .filter_map(|a| a.device_index)
            .collect();
        let free = (1..).find(|i| !used.contains(i)).expect("a u32 is free");
        Ok((used.len().max(1), free))
    }

    /// Attaches `eni_id` at the lowest free device index on card 0 and
    /// marks it delete-on-termination.
    async fn attach(&self, eni_id: &str) -> Result<(), AwsError> {
        let _one_at_a_time = self.attach_lock.lock().await;
        let (attached, index) = self.device_slots().await?;
        let limit = self.limit().await?;
        if attached >= limit {
            return Err(AwsError::NoFreeSlot {
                instance: self.instance_id.clone(),
                attached,
                limit,
            });
        }
        let me = self.instance_id.as_str();
        let settle = |now: &NetworkInterface| Ok(steps::attachment_on(now, me, None));
        steps::attach_at(&self.ec2, eni_id, me, index, settle).await
    }

    /// Waits until metadata shows `eni_id` under `mac` and returns it.
    async fn await_metadata(&self, eni_id: &str, mac: &str) -> Result<Eni, AwsError> {
        let mac: MacAddr = mac.parse().map_err(|_| AwsError::BadMac {
            eni_id: eni_id.into(),
            mac: mac.into(),
        })?;
        let info = self
            .imds
            .interface_settled(mac, Some(eni_id), self.config.metadata_wait)
            .await
            .map_err(imds(format!("ENI {eni_id} attached")))?;
        Ok(info.to_eni(self.config.mtu))
    }

    /// Polls EC2 until `eni_id` is `available` (detached) or gone.
    async fn await_detached(&self, eni_id: &str) -> Result<Option<NetworkInterface>, AwsError> {
        steps::await_detached(&self.ec2, eni_id, self.config.detach_timeout).await
    }

    /// Looks `eni_id` up and checks it is enim's for this node.
    async fn ours(&self, eni_id: &str) -> Result<Option<NetworkInterface>, AwsError> {
        let Some(eni) = self
            .describe(eni_id, format!("looking up ENI {eni_id}"))
            .await?
        else {
            return Ok(None);
        };
        if !self.is_ours(&eni) {
            return Err(AwsError::NotOurs {
                eni_id: eni_id.into(),
                instance: self.instance_id.clone(),
            });
        }
        Ok(Some(eni))
    }

    async fn delete_quietly(&self, eni_id: &str) {
        match self.do_detach_and_delete(eni_id).await {
            Ok(()) => tracing::info!(eni = %eni_id, "deleted the ENI of a failed create"),
            // Tagged, so the pool finds and deletes it later.
            Err(e) => {
                tracing::warn!(eni = %eni_id, error = %e, "could not delete the ENI of a failed create")
            }
        }
    }

    /// A kept ENI (see [`KeptEnis`]) attached, else a new one created and
    /// attached. An attach the cloud throttled keeps the ENI for the next
    /// call; any other failure deletes it again.
    async fn do_create_and_attach(&self) -> Result<Eni, ProviderError> {
        let (id, mac) = match self.kept.take() {
            Some(kept) => kept,
            None => self.create().await?,
        };
        if let Err(e) = self.attach(&id).await {
            let e = ProviderError::from(e);
            if keeps(&e) {
                tracing::info!(eni = %id, error = %e, "attach throttled: ENI kept for the next create");
                self.kept.keep((id, mac));
            } else {
                self.delete_quietly(&id).await;
            }
            return Err(e);
        }
        crash_point("cloud:after-attach");
        match self.await_metadata(&id, &mac).await {
            Ok(eni) => Ok(eni),
            Err(e) => {
                // Attached but invisible to the node: the pool would never
                // use it, so take it away again rather than hold the slot.
                self.delete_quietly(&id).await;
                Err(e.into())
            }
        }
    }

    /// A new ENI tagged for this node, not attached: its id and MAC.
    async fn create(&self) -> Result<(String, String), AwsError> {
        // Refuse early rather than create an ENI that cannot be attached,
        // by instance metadata: it costs no call of the account's describe
        // bucket, which a fleet starting together drains. Metadata may not
        // show an attach in progress yet, so it can only count too few;
        // the look from EC2 before the attach is the one that decides.
        let limit = self.limit().await?;
        let attached = self.attached_on_card0().await?;
        if attached >= limit {
            return Err(AwsError::NoFreeSlot {
                instance: self.instance_id.clone(),
                attached,
                limit,
            });
        }
        let token = self.client_token();
        let tags = self.tags();
        let description = format!("enim pod ENI of {}", self.instance_id);
        crash_point("cloud:before-create");
        let created = self
            .ec2
            .create_network_interface(&CreateEni {
                subnet_id: &self.subnet_id,
                security_group_ids: &self.security_group_ids,
                description: &description,
                client_token: &token,
                tags: &tags,
                ipv6_address_count: u32::from(self.config.assign_ipv6),
                secondary_ipv4_count: 0,
            })
            .await
            .map_err(ec2(format!("creating an ENI in {}", self.subnet_id)))?;
        let id = created.network_interface_id;
        tracing::info!(eni = %id, mac = %created.mac_address, subnet = %self.subnet_id, "created ENI");
        crash_point("cloud:after-create");
        Ok((id, created.mac_address))
    }

    async fn do_attach_existing(&self, eni_id: &str) -> Result<Eni, AwsError> {
        let eni = self
            .ours(eni_id)
            .await?
            .ok_or_else(|| AwsError::Missing(eni_id.into()))?;
        match eni
            .attachment
            .as_ref()
            .and_then(|a| a.instance_id.as_deref())
        {
            Some(other) if other != self.instance_id => {
                return Err(AwsError::ForeignAttachment {
                    eni_id: eni_id.into(),
                    other: other.into(),
                    instance: self.instance_id.clone(),
                })
            }
            _ => {}
        }
        if eni.attached_instance() != Some(&self.instance_id) {
            if eni.status != "available" {
                // Mid-detach from an earlier run: let it finish first.
                self.await_detached(eni_id)
                    .await?
                    .ok_or_else(|| AwsError::Missing(eni_id.into()))?;
            }
            self.attach(eni_id).await?;
        }
        self.await_metadata(eni_id, &eni.mac_address).await
    }

    async fn do_detach_and_delete(&self, eni_id: &str) -> Result<(), AwsError> {
        let Some(eni) = self.ours(eni_id).await? else {
            return Ok(());
        };
        let elsewhere = eni
            .attachment
            .as_ref()
            .and_then(|a| a.instance_id.as_deref());
        if let Some(other) = elsewhere.filter(|i| *i != self.instance_id) {
            return Err(AwsError::ForeignAttachment {
                eni_id: eni_id.into(),
                other: other.into(),
                instance: self.instance_id.clone(),
            });
        }
        steps::send_detach(&self.ec2, &eni).await?;
        if eni.status != "available" && self.await_detached(eni_id).await?.is_none() {
            return Ok(());
        }
        crash_point("cloud:after-detach");
        match self.ec2.delete_network_interface(eni_id).await {
            Ok(()) => {
                tracing::info!(eni = %eni_id, "deleted ENI");
                crash_point("cloud:after-delete");
                Ok(())
            }
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(ec2(format!("deleting ENI {eni_id}"))(e)),
        }
    }

    /// `eni_id` as EC2 sees it, checked to be a secondary interface of
    /// this instance: addresses are only ever changed on those.
    async fn attached_here(&self, eni_id: &str) -> Result<NetworkInterface, AwsError> {
        let eni = steps::existing(&self.ec2, eni_id).await?;
        if eni.attached_instance() != Some(self.instance_id.as_str()) {
            return Err(AwsError::ForeignAttachment {
                eni_id: eni_id.into(),
                other: eni
                    .attachment
                    .as_ref()
                    .and_then(|a| a.instance_id.clone())
                    .unwrap_or_else(|| "no instance".into()),
                instance: self.instance_id.clone(),
            });
        }
        if steps::is_primary(&eni) {
            return Err(AwsError::Primary(eni_id.into()));
        }
        Ok(eni)
    }

    async fn do_assign(&self, eni_id: &str, count: AddressCount) -> Result<Vec<IpAddr>, AwsError> {
        steps::assign(&self.ec2, eni_id, count, || self.attached_here(eni_id)).await
    }

    async fn do_unassign(&self, eni_id: &str, ips: &[IpAddr]) -> Result<(), AwsError> {
        let lookup = self.attached_here(eni_id).await;
        steps::unassign(&self.ec2, eni_id, ips, lookup).await
    }
}

#[async_trait]
impl CloudBackend for AwsBackend {
    fn name(&self) -> &str {
        "aws"
    }

    async fn attached(&self) -> Result<Vec<Eni>, ProviderError> {
        let wait = self.config.metadata_wait.min(LIST_LAG_WAIT);
        let interfaces = self
            .imds
            .interfaces(wait)
            .await
            .map_err(imds("listing attached interfaces"))?;
        Ok(interfaces
            .iter()
            .filter(|i| !i.is_primary())
            .map(|i| i.to_eni(self.config.mtu))
            .collect())
    }

    async fn tagged(&self) -> Result<Vec<TaggedEni>, ProviderError> {
        let enis = self
            .ec2
            .describe_network_interfaces(&[
                (&format!("tag:{TAG_NODE}"), &[self.instance_id.as_str()]),
                (&format!("tag:{TAG_MANAGED}"), &["true"]),
            ])
            .await
            .map_err(ec2("listing enim's ENIs of this node"))?;
        let mut out = Vec::new();
        for eni in enis {
            let attached_to = eni
                .attachment
                .as_ref()
                .and_then(|a| a.instance_id.as_deref());
            match attached_to {
                Some(other) if other != self.instance_id => {
                    tracing::warn!(eni = %eni.network_interface_id, instance = %other, "an ENI tagged for this node is attached elsewhere; ignoring it");
                }
                _ => out.push(TaggedEni {
                    attached: eni.attached_instance() == Some(&self.instance_id),
                    id: eni.network_interface_id,
                }),
            }
        }
        Ok(out)
    }

    async fn eni_limit(&self) -> Result<usize, ProviderError> {
        Ok(self.limit().await?)
    }

    async fn create_and_attach(&self) -> Result<Eni, ProviderError> {
        self.do_create_and_attach().await
    }

    fn pool_fill(&self, fill: f64) {
        self.pacing.set_fill(fill);
    }

    async fn attach_existing(&self, eni_id: &str) -> Result<Eni, ProviderError> {
        Ok(self.do_attach_existing(eni_id).await?)
    }

    async fn detach_and_delete(&self, eni_id: &str) -> Result<(), ProviderError> {
        Ok(self.do_detach_and_delete(eni_id).await?)
    }

    async fn address_limits(&self) -> Result<AddressLimits, ProviderError> {
        Ok(self.limits().await?)
    }

    async fn assign(&self, eni_id: &str, n: AddressCount) -> Result<Vec<IpAddr>, ProviderError> {
        Ok(self.do_assign(eni_id, n).await?)
    }

    async fn unassign(&self, eni_id: &str, ips: &[IpAddr]) -> Result<(), ProviderError> {
        Ok(self.do_unassign(eni_id, ips).await?)
    }

    fn reap_cluster(&self) -> Option<&str> {
        self.config.cluster.as_deref()
    }

    async fn unattached_in_cluster(&self) -> Result<Vec<UnattachedEni>, ProviderError> {
        Ok(self.do_unattached_in_cluster().await?)
    }

    async fn reap(&self, eni_id: &str) -> Result<Reaped, ProviderError> {
        Ok(self.do_reap(eni_id).await?)
    }
}
