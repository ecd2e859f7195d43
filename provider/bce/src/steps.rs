//! The BCE steps of an ENI's life that the node's backend
//! ([`crate::node::BceBackend`]) and the operator's
//! ([`crate::fleet::BceFleet`]) take
//! alike, written once over an [`ApiClient`]: attach and wait, detach and
//! wait (or only ask, for the operator), delete (after a second look, or
//! on BCE's refusal alone), the private-IP verbs, and the security groups
//! of a new ENI. What only
//! one caller knows (metadata, which instance is "this" one, which ENIs
//! are its own) comes in as arguments.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

use enim_core::fault::crash_point;
use enim_core::retry::{Backoff, Poll};
use enim_core::sync::lock;
use enim_core::AddressCount;
use enim_provider::cloud::{
    assign_new, spared_on_second_look, unassign_present, Departed, Family, Reaped,
};

use crate::client::{client_token, ApiClient, ApiEni, Attachment, EniStatus, PRIVATE_IP_BATCH_MAX};
use crate::error::BceError;

/// Polls of one attach or detach: every `interval` at most (jittered), for
/// `timeout` in all.
pub(crate) fn operation_poll(interval: Duration, timeout: Duration) -> Poll {
    Poll::within(&Backoff::steady(interval), timeout)
}

/// An attach or detach that did not finish within `limit`.
pub(crate) fn timed_out(eni_id: &str, what: &'static str, last: &str, limit: Duration) -> BceError {
    BceError::StateTimeout {
        eni_id: eni_id.into(),
        what,
        last: last.into(),
        limit,
    }
}

/// The security groups new ENIs get when none are configured: their
/// instance's own (on BCC groups are bound to the instance and apply to its
/// primary NIC), as AWS's backends take the primary interface's, rather
/// than the default group BCE gives an ENI created with none. Listed once
/// per instance and kept; an instance without any is an error, never an
/// empty list.
pub(crate) struct InstanceGroups {
    vpc_id: String,
    /// `maxKeys` of the listing.
    page_size: u32,
    known: Mutex<HashMap<String, Vec<String>>>,
}

impl InstanceGroups {
    pub(crate) fn new(vpc_id: &str, page_size: u32) -> Self {
        InstanceGroups {
            vpc_id: vpc_id.to_string(),
            page_size,
            known: Mutex::new(HashMap::new()),
        }
    }

    /// The groups of a new ENI of `instance`: `configured` when it names
    /// any, else the instance's.
    pub(crate) async fn for_new_eni(
        &self,
        api: &ApiClient,
        instance: &str,
        configured: &[String],
    ) -> Result<Vec<String>, BceError> {
        if !configured.is_empty() {
            return Ok(configured.to_vec());
        }
        if let Some(groups) = lock(&self.known).get(instance) {
            return Ok(groups.clone());
        }
        let groups = api
            .instance_security_groups(instance, &self.vpc_id, self.page_size)
            .await?;
        // Not kept: a group bound later is found on the next try.
        if groups.is_empty() {
            return Err(BceError::NoSecurityGroups {
                instance: instance.to_string(),
                vpc_id: self.vpc_id.clone(),
            });
        }
        tracing::info!(%instance, ?groups, "new ENIs take the instance's security groups");
        lock(&self.known).insert(instance.to_string(), groups.clone());
        Ok(groups)
    }
}

/// `eni_id` as the API sees it; an ENI that does not exist is
/// [`BceError::Missing`].
pub(crate) async fn get_known(api: &ApiClient, eni_id: &str) -> Result<ApiEni, BceError> {
    api.get_eni(eni_id).await.map_err(|e| {
        if e.is_not_found() {
            BceError::Missing(eni_id.to_string())
        } else {
            e.into()
        }
    })
}

pub(crate) fn is_unattached(eni: &ApiEni) -> bool {
    eni.status() == EniStatus::Available && eni.attached_to().is_none()
}

/// Attaches `eni_id` to `instance` unless it is, and polls until it is
/// `inuse` there; returns it as the API then shows it. `looked` is the ENI
/// as the caller has just got it, taken as the first look (no GET for
/// it). `limit` is what `poll` allows, for the message.
pub(crate) async fn attach_polled(
    api: &ApiClient,
    eni_id: &str,
    instance: &str,
    mut looked: Option<ApiEni>,
    poll: &mut Poll,
    limit: Duration,
) -> Result<ApiEni, BceError> {
    let token = client_token();
    let mut attach_sent = false;
    loop {
        let eni = match looked.take() {
            Some(e) => e,
            None => get_known(api, eni_id).await?,
        };
        let status = eni.status();
        match (&status, eni.attached_to()) {
            (EniStatus::InUse, Some(i)) if i == instance => return Ok(eni),
            (EniStatus::InUse | EniStatus::Attaching, Some(other)) if other != instance => {
                return Err(BceError::OwnedByOther {
                    eni_id: eni_id.to_string(),
                    holder: format!("instance {other}"),
                    requester: format!("instance {instance}"),
                });
            }
            (EniStatus::Available, _) if !attach_sent => {
                api.set_attachment(Attachment::Attach, eni_id, instance, &token)
                    .await?;
                attach_sent = true;
                tracing::info!(eni = eni_id, instance, "attach requested");
            }
            // attaching, detaching (a crashed caller's detach), or
            // available right after our attach call: wait.
            _ => {}
        }
        if !poll.wait().await {
            return Err(timed_out(eni_id, "be attached", &status.to_string(), limit));
        }
    }
}

/// Detaches `eni_id` from wherever it is attached and polls until it is
/// `available`; returns it then, or `None` when it is gone. `check` sees
/// the ENI at every look and may refuse (it is not the caller's).
pub(crate) async fn detach_polled(
    api: &ApiClient,
    eni_id: &str,
    check: impl Fn(&ApiEni) -> Result<(), BceError>,
    poll: &mut Poll,
    limit: Duration,
) -> Result<Option<ApiEni>, BceError> {
    let token = client_token();
    let mut detach_sent = false;
    loop {
        let eni = match api.get_eni(eni_id).await {
            Ok(e) => e,
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        check(&eni)?;
        let status = eni.status();
        match (&status, eni.attached_to()) {
            (EniStatus::Available, _) => {
                if detach_sent {
                    crash_point("cloud:after-detach");
                }
                return Ok(Some(eni));
            }
            (EniStatus::InUse, Some(instance)) if !detach_sent => {
                request_detach(api, eni_id, instance, &token).await?;
                detach_sent = true;
            }
            _ => {}
        }
        if !poll.wait().await {
            return Err(timed_out(eni_id, "be detached", &status.to_string(), limit));
        }
    }
}

/// Asks BCE to detach `eni_id` from `instance`, without waiting.
pub(crate) async fn request_detach(
    api: &ApiClient,
    eni_id: &str,
    instance: &str,
    token: &str,
) -> Result<(), BceError> {
    crash_point("cloud:before-detach");
    api.set_attachment(Attachment::Detach, eni_id, instance, token)
        .await?;
    tracing::info!(eni = eni_id, instance, "detach requested");
    Ok(())
}

/// Deletes `eni_id` if, looked at again now, it is still `ours` and
/// attached nowhere (it may have been attached since it was listed).
pub(crate) async fn delete_checked(
    api: &ApiClient,
    eni_id: &str,
    ours: impl Fn(&ApiEni) -> bool,
) -> Result<Reaped, BceError> {
    let eni = match api.get_eni(eni_id).await {
        Ok(e) => e,
        Err(e) if e.is_not_found() => return Ok(Reaped::Gone),
        Err(e) => return Err(e.into()),
    };
    if let Some(spared) =
        spared_on_second_look(ours(&eni), "marked", is_unattached(&eni), eni.status())
    {
        return Ok(spared);
    }
    delete_unlooked(api, eni_id).await
}

/// Deletes `eni_id` with no look first: BCE refuses an ENI that is not
/// available (a conflict: [`Reaped::Spared`]); one already gone is
/// [`Reaped::Gone`]. Only for an ENI the caller knows is its own.
pub(crate) async fn delete_unlooked(api: &ApiClient, eni_id: &str) -> Result<Reaped, BceError> {
    match api.delete_eni(eni_id, &client_token()).await {
        Ok(()) => {
            tracing::info!(eni = eni_id, "ENI deleted");
            Ok(Reaped::Deleted)
        }
        // Someone else got there first.
        Err(e) if e.is_not_found() => Ok(Reaped::Gone),
        // Attached since the caller saw it attached nowhere.
        Err(e) if e.is_conflict() => Ok(Reaped::Spared(format!("delete refused: {e}"))),
        Err(e) => Err(e.into()),
    }
}

/// Adds `count` new addresses to `eni_id`, cut to `per_eni`
/// addresses of each family (its quota), in batches BCE takes; `before`
/// and `lookup` are the ENI checked the caller's way, before and after: what is
/// new in its listing is what was added, so a retried batch is not
/// counted twice.
pub(crate) async fn assign<F, Fut>(
    api: &ApiClient,
    eni_id: &str,
    before: ApiEni,
    count: AddressCount,
    per_eni: usize,
    lookup: F,
) -> Result<Vec<IpAddr>, BceError>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<ApiEni, BceError>>,
{
    let AddressCount { ipv4, ipv6 } = count;
    let want4 = ipv4.min(per_eni.saturating_sub(before.ipv4_count()));
    let want6 = ipv6.min(per_eni.saturating_sub(before.ipv6_private_ip_set.len()));
    if (want4, want6) != (ipv4, ipv6) {
        tracing::info!(eni = eni_id, asked = ?(ipv4, ipv6), assigning = ?(want4, want6), per_eni, "assign cut to the ENI's private-IP quota");
    }
    assign_new(
        eni_id,
        before.non_primary_ips(),
        AddressCount {
            ipv4: want4,
            ipv6: want6,
        },
        |family, count| async move {
            let mut left = count;
            while left > 0 {
                let n = left.min(PRIVATE_IP_BATCH_MAX);
                api.batch_add_private_ips(eni_id, n, family == Family::V6, &client_token())
                    .await?;
                left -= n;
            }
            Ok(())
        },
        || async { Ok(lookup().await?.non_primary_ips()) },
    )
    .await
}

/// Gives those of `ips` back that `lookup` (the ENI checked the caller's
/// way) still shows, in batches BCE takes; an ENI gone, or attached
/// elsewhere, has none of the caller's.
pub(crate) async fn unassign(
    api: &ApiClient,
    eni_id: &str,
    ips: &[IpAddr],
    lookup: Result<ApiEni, BceError>,
) -> Result<(), BceError> {
    let departed = |e: &BceError| match e {
        BceError::Missing(_) => Some(Departed::Gone),
        BceError::OwnedByOther { .. } => Some(Departed::Elsewhere),
        _ => None,
    };
    let lookup = lookup.map(|e| e.non_primary_ips());
    // One family per call: the API takes either, mixing is not documented.
    unassign_present(eni_id, ips, lookup, departed, |_, ips| async move {
        for chunk in ips.chunks(PRIVATE_IP_BATCH_MAX) {
            let strings: Vec<String> = chunk.iter().map(ToString::to_string).collect();
            match api
                .batch_del_private_ips(eni_id, &strings, &client_token())
                .await
            {
                Ok(()) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    })
    .await
}
