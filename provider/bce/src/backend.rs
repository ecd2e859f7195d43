//! [`BceBackend`]: the [`CloudBackend`] the warm pool drives on Baidu BCE.
//!
//! ENIs enim creates are named `enim-<instance-id>-<random>` and described
//! as enim's, because BCE's ENI API has no tags to mark them with. The name
//! is what `tagged` looks for, and what `detach_and_delete` insists on before
//! deleting anything.
//!
//! For the fleet-wide reaper, the description carries what AWS keeps in
//! tags, as `key=value` words: `enim.io/created-at=<RFC 3339>` and, with a
//! cluster configured, `enim.io/cluster=<name>`.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use enim_provider::cloud::{
    format_created_at, CloudBackend, CreatedAt, Reaped, TaggedEni, UnattachedEni, TAG_CLUSTER,
    TAG_CREATED_AT,
};
use enim_provider::retry::{Backoff, Poll};
use enim_provider::{AddressLimits, Eni, MacAddr, ProviderError};

use crate::api::{client_token, ApiClient, ApiEni, ApiError, CreateEni, EniStatus, PrivateIp};
use crate::metadata::{MetadataClient, MetadataError};

impl From<MetadataError> for ProviderError {
    fn from(e: MetadataError) -> Self {
        // Metadata is local and eventually right; a bad answer now is still
        // worth asking again later.
        ProviderError::Unavailable(e.to_string())
    }
}

/// What the backend needs once discovery is done.
#[derive(Debug, Clone)]
pub struct BackendSettings {
    pub instance_id: String,
    pub vpc_id: String,
    pub subnet_id: String,
    pub security_group_ids: Vec<String>,
    /// Between two status (or metadata) polls.
    pub poll_interval: Duration,
    /// How long one attach, detach or metadata wait may take.
    pub operation_timeout: Duration,
    /// `maxKeys` of list calls.
    pub page_size: u32,
    /// The cluster new ENIs are marked with, and the reaper works for.
    pub cluster: Option<String>,
}

pub struct BceBackend {
    api: ApiClient,
    meta: MetadataClient,
    s: BackendSettings,
    name_prefix: String,
}

impl BceBackend {
    pub fn new(api: ApiClient, meta: MetadataClient, settings: BackendSettings) -> Self {
        let name_prefix = eni_name_prefix(&settings.instance_id);
        BceBackend {
            api,
            meta,
            s: settings,
            name_prefix,
        }
    }

    pub fn settings(&self) -> &BackendSettings {
        &self.s
    }

    fn is_ours(&self, eni: &ApiEni) -> bool {
        eni.name.starts_with(&self.name_prefix)
    }

    /// enim's (any node's) and marked for this cluster.
    fn in_cluster(&self, eni: &ApiEni) -> bool {
        let cluster = self.s.cluster.as_deref();
        cluster.is_some()
            && eni.name.starts_with(ENI_NAME_PREFIX)
            && description_tag(&eni.description, TAG_CLUSTER) == cluster
    }

    fn is_unattached(eni: &ApiEni) -> bool {
        eni.status() == EniStatus::Available && eni.attached_to().is_none()
    }

    /// The description of a new ENI: what it is for people, and the
    /// reaper's marks as `key=value` words (BCE ENIs have no tags).
    fn description(&self, now: SystemTime) -> String {
        let mut d = format!(
            "enim: exclusive ENI of instance {}, do not attach elsewhere; {TAG_CREATED_AT}={}",
            self.s.instance_id,
            format_created_at(now)
        );
        if let Some(c) = &self.s.cluster {
            d.push_str(&format!(" {TAG_CLUSTER}={c}"));
        }
        d
    }

    /// Polls of one attach or detach: every `poll_interval` at most
    /// (jittered), for `operation_timeout` in all.
    fn poll(&self) -> Poll {
        Poll::within(
            &Backoff::steady(self.s.poll_interval),
            self.s.operation_timeout,
        )
    }

    fn timeout(&self, eni_id: &str, what: &str, last: &str) -> ProviderError {
        ProviderError::Unavailable(format!(
            "ENI {eni_id}: still {last} after {:?} waiting for it to {what}",
            self.s.operation_timeout
        ))
    }

    /// Attaches `eni_id` to this instance if it is not, waits for `inuse`,
    /// then for metadata to show it.
    async fn attach_and_wait(&self, eni_id: &str) -> Result<Eni, ProviderError> {
        let mut poll = self.poll();
        let token = client_token();
        let mut attach_sent = false;
        let mac = loop {
            let eni = self
                .api
                .get_eni(eni_id)
                .await
                .map_err(|e| unknown_if_missing(e, eni_id))?;
            let status = eni.status();
            match (&status, eni.attached_to()) {
                (EniStatus::InUse, Some(i)) if i == self.s.instance_id => break eni.mac_address,
                (EniStatus::InUse | EniStatus::Attaching, Some(other))
                    if other != self.s.instance_id =>
                {
                    return Err(ProviderError::OwnedByOther {
                        eni_id: eni_id.to_string(),
                        holder: format!("instance {other}"),
                        requester: format!("instance {}", self.s.instance_id),
                    });
                }
                (EniStatus::Available, _) if !attach_sent => {
                    self.api.attach(eni_id, &self.s.instance_id, &token).await?;
                    attach_sent = true;
                    tracing::info!(eni = eni_id, instance = %self.s.instance_id, "attach requested");
                }
                // attaching, detaching (a crashed agent's detach), or
                // available right after our attach call: wait.
                _ => {}
            }
            if !poll.wait().await {
                return Err(self.timeout(eni_id, "be attached", &status.to_string()));
            }
        };
        let mac: MacAddr = mac.parse().map_err(|e| {
            ProviderError::Unavailable(format!("ENI {eni_id}: BCE reports MAC {mac:?}: {e}"))
        })?;
        self.wait_for_metadata(eni_id, mac, &mut poll).await
    }

    /// Polls metadata until it lists `mac` with its addresses.
    async fn wait_for_metadata(
        &self,
        eni_id: &str,
        mac: MacAddr,
        poll: &mut Poll,
    ) -> Result<Eni, ProviderError> {
        loop {
            let last = match self.metadata_interface(mac).await {
                Ok(Some(iface)) => return Ok(iface.to_eni(eni_id)),
                Ok(None) => "absent from instance metadata".to_string(),
                Err(e) if e.is_transient() => e.to_string(),
                Err(e) => return Err(e.into()),
            };
            if !poll.wait().await {
                return Err(self.timeout(eni_id, "appear in instance metadata", &last));
            }
        }
    }

    async fn metadata_interface(
        &self,
        mac: MacAddr,
    ) -> Result<Option<crate::metadata::MetaInterface>, MetadataError> {
        for raw in self.meta.macs().await? {
            if raw.parse::<MacAddr>().ok() == Some(mac) {
                return self.meta.interface(&raw).await.map(Some);
            }
        }
        Ok(None)
    }
}

/// Every enim ENI's name starts with this (then the instance id).
pub const ENI_NAME_PREFIX: &str = "enim-";

/// The name prefix that marks an ENI as enim's for this instance.
pub fn eni_name_prefix(instance_id: &str) -> String {
    format!("{ENI_NAME_PREFIX}{instance_id}-")
}

/// The value of a `key=value` word in an ENI's description (words are
/// split at whitespace and `;`).
pub fn description_tag<'a>(description: &'a str, key: &str) -> Option<&'a str> {
    description
        .split(|c: char| c.is_whitespace() || c == ';')
        .find_map(|word| word.strip_prefix(key)?.strip_prefix('='))
}

fn unknown_if_missing(e: ApiError, eni_id: &str) -> ProviderError {
    if e.is_not_found() {
        ProviderError::UnknownEni(eni_id.to_string())
    } else {
        e.into()
    }
}

#[async_trait]
impl CloudBackend for BceBackend {
    fn name(&self) -> &str {
        "bce"
    }

    async fn attached(&self) -> Result<Vec<Eni>, ProviderError> {
        let listed = self
            .api
            .list_enis(&self.s.vpc_id, Some(&self.s.instance_id), self.s.page_size)
            .await?;
        let mut by_mac: HashMap<MacAddr, ApiEni> = HashMap::new();
        for e in listed {
            // The instanceId filter is trusted only as far as it is checked.
            if e.status() != EniStatus::InUse || e.attached_to() != Some(&self.s.instance_id) {
                continue;
            }
            match e.mac_address.parse() {
                Ok(mac) => {
                    by_mac.insert(mac, e);
                }
                Err(err) => {
                    tracing::warn!(eni = %e.eni_id, %err, "ENI with an unreadable MAC skipped")
                }
            }
        }
        let local = self.meta.local_ipv4().await?;
        let mut out = Vec::new();
        for raw in self.meta.macs().await? {
            let Ok(mac) = raw.parse::<MacAddr>() else {
                tracing::warn!(mac = %raw, "metadata lists an unreadable MAC; skipped");
                continue;
            };
            // The primary interface is normally not an ENI of the listing;
            // the local-ipv4 check below keeps it out if it is.
            let Some(api) = by_mac.get(&mac) else {
                continue;
            };
            let iface = self.meta.interface(&raw).await?;
            if iface.all_ips.contains(&std::net::IpAddr::V4(local)) {
                continue;
            }
            out.push(iface.to_eni(&api.eni_id));
        }
        Ok(out)
    }

    async fn tagged(&self) -> Result<Vec<TaggedEni>, ProviderError> {
        // Detached ENIs have no instance, so the whole VPC is listed and
        // filtered by name.
        let all = self
            .api
            .list_enis(&self.s.vpc_id, None, self.s.page_size)
            .await?;
        Ok(all
            .into_iter()
            .filter(|e| self.is_ours(e))
            .map(|e| TaggedEni {
                attached: e.status() == EniStatus::InUse
                    && e.attached_to() == Some(self.s.instance_id.as_str()),
                id: e.eni_id,
            })
            .collect())
    }

    async fn eni_limit(&self) -> Result<usize, ProviderError> {
        let q = self.api.quota(&self.s.instance_id).await?;
        // Read as "interfaces this instance may have", primary included: if
        // BCE's totalQuantity excludes the primary, enim uses one ENI fewer
        // than it could, rather than failing attaches past the quota.
        Ok(q.total_quantity as usize)
    }

    async fn create_and_attach(&self) -> Result<Eni, ProviderError> {
        let name = format!(
            "{}{}",
            self.name_prefix,
            &client_token().replace('-', "")[..12]
        );
        let description = self.description(SystemTime::now());
        let eni_id = self
            .api
            .create_eni(
                &CreateEni {
                    name: &name,
                    subnet_id: &self.s.subnet_id,
                    security_group_ids: &self.s.security_group_ids,
                    private_ip_set: vec![PrivateIp {
                        primary: true,
                        private_ip_address: String::new(),
                    }],
                    description: &description,
                },
                &client_token(),
            )
            .await?;
        tracing::info!(eni = %eni_id, %name, "ENI created");
        match self.attach_and_wait(&eni_id).await {
            Ok(eni) => Ok(eni),
            Err(e) => {
                // Best effort: a leftover is found again by `tagged`.
                if let Err(cleanup) = self.detach_and_delete(&eni_id).await {
                    tracing::warn!(eni = %eni_id, error = %cleanup, "could not clean up after a failed attach");
                }
                Err(e)
            }
        }
    }

    async fn attach_existing(&self, eni_id: &str) -> Result<Eni, ProviderError> {
        let eni = self
            .api
            .get_eni(eni_id)
            .await
            .map_err(|e| unknown_if_missing(e, eni_id))?;
        if !self.is_ours(&eni) {
            return Err(ProviderError::Config(format!(
                "ENI {eni_id} ({:?}) was not created by enim for instance {}; not attaching it",
                eni.name, self.s.instance_id
            )));
        }
        self.attach_and_wait(eni_id).await
    }

    async fn detach_and_delete(&self, eni_id: &str) -> Result<(), ProviderError> {
        let mut poll = self.poll();
        let detach_token = client_token();
        let delete_token = client_token();
        let mut detach_sent = false;
        loop {
            let eni = match self.api.get_eni(eni_id).await {
                Ok(e) => e,
                Err(e) if e.is_not_found() => return Ok(()),
                Err(e) => return Err(e.into()),
            };
            if !self.is_ours(&eni) {
                return Err(ProviderError::Config(format!(
                    "refusing to delete ENI {eni_id} ({:?}): not created by enim for instance {}",
                    eni.name, self.s.instance_id
                )));
            }
            let status = eni.status();
            match (&status, eni.attached_to()) {
                (EniStatus::Available, _) => {
                    return match self.api.delete_eni(eni_id, &delete_token).await {
                        Ok(()) => {
                            tracing::info!(eni = eni_id, "ENI deleted");
                            Ok(())
                        }
                        Err(e) if e.is_not_found() => Ok(()),
                        Err(e) => Err(e.into()),
                    };
                }
                (EniStatus::InUse, Some(i)) if i != self.s.instance_id => {
                    return Err(ProviderError::OwnedByOther {
                        eni_id: eni_id.to_string(),
                        holder: format!("instance {i}"),
                        requester: format!("instance {}", self.s.instance_id),
                    });
                }
                (EniStatus::InUse, _) if !detach_sent => {
                    self.api
                        .detach(eni_id, &self.s.instance_id, &detach_token)
                        .await?;
                    detach_sent = true;
                    tracing::info!(eni = eni_id, "detach requested");
                }
                _ => {}
            }
            if !poll.wait().await {
                return Err(self.timeout(eni_id, "be detached and deleted", &status.to_string()));
            }
        }
    }

    fn reap_cluster(&self) -> Option<&str> {
        self.s.cluster.as_deref()
    }

    async fn unattached_in_cluster(&self) -> Result<Vec<UnattachedEni>, ProviderError> {
        if self.s.cluster.is_none() {
            return Ok(Vec::new());
        }
        // No server-side filter for the description: the VPC is listed
        // and filtered here, as `tagged` does.
        let all = self
            .api
            .list_enis(&self.s.vpc_id, None, self.s.page_size)
            .await?;
        Ok(all
            .into_iter()
            .filter(|e| self.in_cluster(e) && Self::is_unattached(e))
            .map(|e| UnattachedEni {
                created_at: CreatedAt::from_tag(description_tag(&e.description, TAG_CREATED_AT)),
                id: e.eni_id,
            })
            .collect())
    }

    async fn reap(&self, eni_id: &str) -> Result<Reaped, ProviderError> {
        // Looked at again: it may have been attached since it was listed.
        let eni = match self.api.get_eni(eni_id).await {
            Ok(e) => e,
            Err(e) if e.is_not_found() => return Ok(Reaped::Gone),
            Err(e) => return Err(e.into()),
        };
        if !self.in_cluster(&eni) {
            return Ok(Reaped::Spared("no longer marked for this cluster".into()));
        }
        if !Self::is_unattached(&eni) {
            return Ok(Reaped::Spared(format!("now {}", eni.status())));
        }
        match self.api.delete_eni(eni_id, &client_token()).await {
            Ok(()) => Ok(Reaped::Deleted),
            // Another node's reaper got there first.
            Err(e) if e.is_not_found() => Ok(Reaped::Gone),
            // Attached between our look and the delete.
            Err(e) if e.is_conflict() => Ok(Reaped::Spared(format!("delete refused: {e}"))),
            Err(e) => Err(e.into()),
        }
    }

    // Secondary mode on BCE is not built yet: a config asking for it is
    // refused at start with this error, never served with an empty pool.
    async fn address_limits(&self) -> Result<AddressLimits, ProviderError> {
        Err(secondary_unsupported())
    }

    async fn assign_addresses(
        &self,
        _eni_id: &str,
        _ipv4: usize,
        _ipv6: usize,
    ) -> Result<Vec<IpAddr>, ProviderError> {
        Err(secondary_unsupported())
    }

    async fn unassign_addresses(
        &self,
        _eni_id: &str,
        _ips: &[IpAddr],
    ) -> Result<(), ProviderError> {
        Err(secondary_unsupported())
    }
}

fn secondary_unsupported() -> ProviderError {
    ProviderError::Config("the bce provider does not serve secondary mode yet".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn description_tags() {
        let d = "enim: exclusive ENI of instance i-1, do not attach elsewhere; \
                 enim.io/created-at=2024-01-01T00:00:00Z enim.io/cluster=prod";
        assert_eq!(description_tag(d, TAG_CLUSTER), Some("prod"));
        assert_eq!(
            description_tag(d, TAG_CREATED_AT),
            Some("2024-01-01T00:00:00Z")
        );
        assert_eq!(description_tag(d, "enim.io/node"), None);
        assert_eq!(description_tag("enim.io/clusters=x", TAG_CLUSTER), None);
        assert_eq!(description_tag("", TAG_CLUSTER), None);
        assert_eq!(
            description_tag("a;enim.io/cluster=c;b", TAG_CLUSTER),
            Some("c")
        );
    }
}
