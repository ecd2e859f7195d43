//! The EC2 steps of an ENI's life that the node's backend
//! ([`crate::node::AwsBackend`]) and the operator's
//! ([`crate::fleet::AwsFleet`]) take alike, written once over an [`Ec2Client`]: attach at an index, detach
//! and wait, delete (after a second look, or on EC2's refusal alone),
//! and the address verbs. Each
//! checks here what both callers must check; what only one of them knows
//! (metadata, which instance is "this" one) stays with it.

use std::net::IpAddr;
use std::time::Duration;

use enim_core::fault::crash_point;
use enim_core::retry::{Backoff, Poll};
use enim_core::AddressCount;
use enim_provider::cloud::{
    assign_new, spared_on_second_look, unassign_present, Departed, Reaped, TAG_CLUSTER,
};

use crate::client::{Ec2Client, Ec2Error, NetworkInterface};
use crate::error::{ec2, AwsError};
use crate::tags::{in_cluster, TAG_MANAGED};

/// Polls of a detaching ENI: 2 s doubling to 5 s (jittered: the first
/// poll after 1-2 s). A detach takes 2-3 s, so polling sooner only spends
/// the account's describe bucket, which the whole fleet shares: the bench's
/// fleet simulation measured 15.1 % of that bucket's refill with polls from
/// 200 ms, 10.7 % from 1 s, 9.3 % from 2 s.
pub const DETACH_BACKOFF: Backoff = Backoff::new(Duration::from_secs(2), Duration::from_secs(5));

/// `eni_id` as EC2 sees it, `None` if it does not exist; `what` names the
/// step in an error.
pub(crate) async fn describe(
    client: &Ec2Client,
    eni_id: &str,
    what: String,
) -> Result<Option<NetworkInterface>, AwsError> {
    client
        .describe_network_interface(eni_id)
        .await
        .map_err(ec2(what))
}

/// As [`describe`], an ENI that does not exist being [`AwsError::Missing`].
pub(crate) async fn existing(
    client: &Ec2Client,
    eni_id: &str,
) -> Result<NetworkInterface, AwsError> {
    describe(client, eni_id, format!("looking up ENI {eni_id}"))
        .await?
        .ok_or_else(|| AwsError::Missing(eni_id.into()))
}

/// Every ENI of `cluster` (any node's, attached or not), in one paged
/// listing by tag.
pub(crate) async fn cluster_enis(
    client: &Ec2Client,
    cluster: &str,
) -> Result<Vec<NetworkInterface>, AwsError> {
    let enis = client
        .describe_network_interfaces(&[
            (&format!("tag:{TAG_CLUSTER}"), &[cluster]),
            (&format!("tag:{TAG_MANAGED}"), &["true"]),
        ])
        .await
        .map_err(ec2(format!("listing the ENIs of cluster {cluster}")))?;
    // Checked here too: a filter is trusted only as far as it is checked.
    Ok(enis
        .into_iter()
        .filter(|e| in_cluster(e, cluster))
        .collect())
}

/// Detached, by EC2's account: `available` and no live attachment.
pub(crate) fn is_unattached(eni: &NetworkInterface) -> bool {
    eni.status == "available" && eni.attached_instance().is_none()
}

/// The instance's own interface (device 0 on card 0): never enim's to
/// detach or readdress.
pub(crate) fn is_primary(eni: &NetworkInterface) -> bool {
    eni.attachment
        .as_ref()
        .is_some_and(|a| a.device_index == Some(0) && a.network_card_index.unwrap_or(0) == 0)
}

/// Attaches `eni_id` to `instance` at `index` on card 0 and marks it
/// delete-on-termination, so a terminated node does not leak it. EC2
/// refuses an ENI in use; a refused attach (other than for a full instance
/// or credentials) is looked at once and `settle` says what the ENI as it
/// is now means: `Ok(Some(attachment id))` attached as asked already (a
/// retry whose first try went through), `Ok(None)` the refusal stands, or
/// an error of its own.
pub(crate) async fn attach_at(
    client: &Ec2Client,
    eni_id: &str,
    instance: &str,
    index: u32,
    settle: impl Fn(&NetworkInterface) -> Result<Option<String>, AwsError>,
) -> Result<(), AwsError> {
    let attachment_id = match client
        .attach_network_interface(eni_id, instance, index, 0)
        .await
    {
        Ok(id) => id,
        Err(e) => {
            let may_have_attached = !matches!(
                e,
                Ec2Error::AttachmentLimitExceeded { .. } | Ec2Error::Auth { .. }
            );
            let now = if may_have_attached {
                client
                    .describe_network_interface(eni_id)
                    .await
                    .ok()
                    .flatten()
            } else {
                None
            };
            let settled = match &now {
                Some(n) => settle(n)?,
                None => None,
            };
            match settled {
                Some(id) => id,
                None => {
                    return Err(ec2(format!(
                        "attaching ENI {eni_id} to {instance} at device index {index}"
                    ))(e))
                }
            }
        }
    };
    // The ENI is usable without it: a failure here is only logged.
    if let Err(e) = client
        .set_delete_on_termination(eni_id, &attachment_id)
        .await
    {
        tracing::warn!(eni = %eni_id, error = %e, "could not mark ENI delete-on-termination");
    }
    Ok(())
}

/// The attachment id of `eni` if it is attached to `instance` (at
/// `index`, when given).
pub(crate) fn attachment_on(
    eni: &NetworkInterface,
    instance: &str,
    index: Option<u32>,
) -> Option<String> {
    let att = eni.attachment.as_ref()?;
    let here = eni.attached_instance() == Some(instance)
        && index.is_none_or(|i| att.device_index == Some(i));
    here.then(|| att.attachment_id.clone()).flatten()
}

/// Asks EC2 to detach `eni` from wherever it is attached (or attaching);
/// nothing when it is not. Refuses an instance's primary interface.
pub(crate) async fn send_detach(
    client: &Ec2Client,
    eni: &NetworkInterface,
) -> Result<(), AwsError> {
    let eni_id = &eni.network_interface_id;
    if is_primary(eni) {
        return Err(AwsError::Primary(eni_id.clone()));
    }
    let Some(att) = &eni.attachment else {
        return Ok(());
    };
    if let (Some(att_id), "attaching" | "attached" | "") =
        (att.attachment_id.as_deref(), att.status.as_str())
    {
        detach_attachment(client, eni_id, att_id).await?;
    }
    Ok(())
}

/// DetachNetworkInterface of `eni_id`'s attachment `attachment_id`; an
/// attachment already over (or being detached) counts as done.
pub(crate) async fn detach_attachment(
    client: &Ec2Client,
    eni_id: &str,
    attachment_id: &str,
) -> Result<(), AwsError> {
    crash_point("cloud:before-detach");
    match client.detach_network_interface(attachment_id).await {
        Ok(()) => tracing::info!(eni = %eni_id, "detaching ENI"),
        // Already detached (or detaching) meanwhile.
        Err(e) if e.is_not_found() || e.code() == Some("IncorrectState") => {}
        Err(e) => return Err(ec2(format!("detaching ENI {eni_id}"))(e)),
    }
    Ok(())
}

/// Polls EC2 until `eni_id` is `available` (detached) or gone (`None`),
/// at most `timeout`.
pub(crate) async fn await_detached(
    client: &Ec2Client,
    eni_id: &str,
    timeout: Duration,
) -> Result<Option<NetworkInterface>, AwsError> {
    let mut poll = Poll::within(&DETACH_BACKOFF, timeout);
    loop {
        let what = format!("waiting for ENI {eni_id} to detach");
        let Some(now) = describe(client, eni_id, what).await? else {
            return Ok(None);
        };
        if now.status == "available" {
            return Ok(Some(now));
        }
        if !poll.wait().await {
            return Err(AwsError::StateTimeout {
                eni_id: eni_id.into(),
                status: now.status,
                waited: poll.elapsed(),
            });
        }
    }
}

/// Deletes `eni_id` if, looked at again now, it is still `ours` and
/// attached nowhere: it may have been attached or retagged since it was
/// listed, and DeleteNetworkInterface checks no tags.
pub(crate) async fn delete_checked(
    client: &Ec2Client,
    eni_id: &str,
    ours: impl Fn(&NetworkInterface) -> bool,
) -> Result<Reaped, AwsError> {
    let what = format!("looking up ENI {eni_id} before deleting it");
    let Some(eni) = describe(client, eni_id, what).await? else {
        return Ok(Reaped::Gone);
    };
    if let Some(spared) =
        spared_on_second_look(ours(&eni), "tagged", is_unattached(&eni), &eni.status)
    {
        return Ok(spared);
    }
    delete_unlooked(client, eni_id).await
}

/// EC2's codes for a delete refused because the ENI is attached (the
/// documented one and the one EC2 has been seen to answer).
const IN_USE: &[&str] = &[
    "InvalidNetworkInterface.InUse",
    "InvalidNetworkInterfaceID.InUse",
];

/// DeleteNetworkInterface of `eni_id` with no look first: EC2 refuses an
/// ENI in use ([`Reaped::Spared`]); one already gone is [`Reaped::Gone`].
/// Only for an ENI the caller knows is its own (it checks no tags).
pub(crate) async fn delete_unlooked(client: &Ec2Client, eni_id: &str) -> Result<Reaped, AwsError> {
    match client.delete_network_interface(eni_id).await {
        Ok(()) => {
            tracing::info!(eni = %eni_id, "deleted ENI");
            Ok(Reaped::Deleted)
        }
        // Someone else got there first.
        Err(e) if e.is_not_found() => Ok(Reaped::Gone),
        // Attached since the caller saw it attached nowhere.
        Err(e) if e.code().is_some_and(|c| IN_USE.contains(&c)) => {
            Ok(Reaped::Spared(format!("in use: {e}")))
        }
        Err(e) => Err(ec2(format!("deleting ENI {eni_id}"))(e)),
    }
}

/// Assigns `count` new addresses to `eni_id`; `lookup` is the
/// ENI as the caller may change it (checked its way), asked before and
/// after: the reply of an assign lists only the new addresses on EC2, but
/// all of them on some emulators, so the ENI's own listing tells.
pub(crate) async fn assign<F, Fut>(
    client: &Ec2Client,
    eni_id: &str,
    count: AddressCount,
    lookup: F,
) -> Result<Vec<IpAddr>, AwsError>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<NetworkInterface, AwsError>>,
{
    let before = lookup().await?;
    assign_new(
        eni_id,
        before.secondary_ips(),
        count,
        |family, count| async move {
            client
                .assign_addresses(family, eni_id, count)
                .await
                .map_err(ec2(format!(
                    "assigning {count} {family} addresses to {eni_id}"
                )))
        },
        || async { Ok(lookup().await?.secondary_ips()) },
    )
    .await
}

/// Gives those of `ips` back that `lookup` (the ENI checked the caller's
/// way) still shows; a missing ENI, or one attached elsewhere, has none of
/// the caller's to give back.
pub(crate) async fn unassign(
    client: &Ec2Client,
    eni_id: &str,
    ips: &[IpAddr],
    lookup: Result<NetworkInterface, AwsError>,
) -> Result<(), AwsError> {
    let departed = |e: &AwsError| match e {
        AwsError::Missing(_) => Some(Departed::Gone),
        AwsError::ForeignAttachment { .. } => Some(Departed::Elsewhere),
        _ => None,
    };
    let lookup = lookup.map(|e| e.secondary_ips());
    unassign_present(eni_id, ips, lookup, departed, |family, ips| async move {
        let strings: Vec<String> = ips.iter().map(ToString::to_string).collect();
        client
            .unassign_addresses(family, eni_id, &strings)
            .await
            .map_err(ec2(format!("unassigning {ips:?} from {eni_id}")))
    })
    .await
}
