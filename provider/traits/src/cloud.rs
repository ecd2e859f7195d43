//! What a cloud must offer for enim's warm pool (`provider/pool`) to keep
//! ENIs attached ahead of demand. Each cloud crate (`provider/aws`,
//! `provider/bce`) implements [`CloudBackend`]; the pool implements
//! [`crate::EniProvider`] on top of it, so pods never wait on a cloud call
//! while the pool has a free ENI.

use std::fmt;
use std::future::Future;
use std::net::IpAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;

use enim_core::{AddressCount, AddressLimits, Eni, ProviderError};

/// The cluster an ENI was made for: the fleet-wide reaper deletes only
/// this cluster's leaked ENIs. (AWS: a tag; BCE: a `key=value` word of the
/// description, as BCE ENIs have no tags.)
pub const TAG_CLUSTER: &str = "enim.io/cluster";
/// When an ENI was made (RFC 3339, UTC): the reaper spares ENIs younger
/// than its cooldown, which may be between create and attach.
pub const TAG_CREATED_AT: &str = "enim.io/created-at";

/// The value of [`TAG_CREATED_AT`] for an ENI made at `t`.
pub fn format_created_at(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

/// Reads a [`TAG_CREATED_AT`] value: RFC 3339 (what enim writes) or whole
/// Unix seconds. `None` when it is neither.
pub fn parse_created_at(value: &str) -> Option<SystemTime> {
    let value = value.trim();
    if let Ok(t) = humantime::parse_rfc3339_weak(value) {
        return Some(t);
    }
    let secs: u64 = value.parse().ok()?;
    UNIX_EPOCH.checked_add(Duration::from_secs(secs))
}

/// Config validation of a cluster name: it must fit an EC2 tag value and
/// one word of a BCE description, so 1 to 63 of `A-Z a-z 0-9 . _ -`.
pub fn validate_cluster_name(name: &str) -> Result<(), String> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if name.is_empty() || name.len() > 63 || !name.chars().all(ok_char) {
        return Err(format!(
            "cluster {name:?} must be 1 to 63 characters of A-Z a-z 0-9 . _ -"
        ));
    }
    Ok(())
}

/// An ENI of this cluster attached nowhere (any node's): a candidate for
/// the fleet-wide reaper.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnattachedEni {
    pub id: String,
    pub created_at: CreatedAt,
}

/// What an ENI's creation tag says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreatedAt {
    At(SystemTime),
    /// No creation tag (made by an older enim, or by hand): never reaped.
    Missing,
    /// A creation tag that is not a time, as found: never reaped.
    Unreadable(String),
}

impl CreatedAt {
    /// From the tag's value, if the ENI has one.
    pub fn from_tag(value: Option<&str>) -> CreatedAt {
        match value {
            None => CreatedAt::Missing,
            Some(v) => {
                parse_created_at(v).map_or_else(|| CreatedAt::Unreadable(v.into()), CreatedAt::At)
            }
        }
    }
}

/// What [`CloudBackend::reap`] did with one ENI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reaped {
    Deleted,
    /// Already gone: another node's reaper (or its owner) won the race.
    Gone,
    /// Not deleted, and why: it was attached, or lost this cluster's tag,
    /// since it was listed.
    Spared(String),
}

/// The reaper's second look at an ENI it listed, before deleting it:
/// why it is spared now, if it is no longer this cluster's (`mark`: how the
/// cloud marks it, "tagged" or "marked") or no longer attached nowhere.
pub fn spared_on_second_look(
    in_cluster: bool,
    mark: &str,
    unattached: bool,
    status: impl std::fmt::Display,
) -> Option<Reaped> {
    if !in_cluster {
        return Some(Reaped::Spared(format!("no longer {mark} for this cluster")));
    }
    if !unattached {
        return Some(Reaped::Spared(format!("now {status}")));
    }
    None
}

/// An address family: the clouds' address verbs take one at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub fn of(ip: &IpAddr) -> Family {
        match ip {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        })
    }
}

/// What an assign added: the addresses of the ENI's listing `after` that
/// its listing `before` did not have (logged). Both clouds read the
/// listing, not the assign's reply, which is not the same everywhere (and
/// counts a retried call twice).
fn added_addresses(eni_id: &str, before: Vec<IpAddr>, after: Vec<IpAddr>) -> Vec<IpAddr> {
    let known: std::collections::HashSet<IpAddr> = before.into_iter().collect();
    let new: Vec<IpAddr> = after.into_iter().filter(|ip| !known.contains(ip)).collect();
    tracing::info!(eni = eni_id, assigned = ?new, "assigned secondary addresses");
    new
}

/// An assign as both clouds make it: `add` (the cloud's verb) once for
/// each family `n` asks any of, then what is new in the ENI's listing
/// (`before`, and `listing` after the adds; its addresses but the primary
/// IPv4), see [`added_addresses`].
pub async fn assign_new<E, AddFut, ListFut>(
    eni_id: &str,
    before: Vec<IpAddr>,
    n: AddressCount,
    mut add: impl FnMut(Family, usize) -> AddFut,
    listing: impl FnOnce() -> ListFut,
) -> Result<Vec<IpAddr>, E>
where
    AddFut: Future<Output = Result<(), E>>,
    ListFut: Future<Output = Result<Vec<IpAddr>, E>>,
{
    for (family, count) in [(Family::V4, n.ipv4), (Family::V6, n.ipv6)] {
        if count > 0 {
            add(family, count).await?;
        }
    }
    Ok(added_addresses(eni_id, before, listing().await?))
}

/// Why an unassign finds an ENI no longer this node's to change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Departed {
    /// Gone: its addresses went with it.
    Gone,
    /// Detached, or attached to another instance: its addresses are not
    /// this node's any more.
    Elsewhere,
}

/// An unassign as both clouds make it. `lookup` is the ENI's listing (its
/// addresses but the primary IPv4), checked to be a secondary ENI attached
/// here; an error that `departed` recognises means there is nothing to
/// give back. Otherwise those of `ips` the ENI still has go back one
/// family at a time through `remove` (the cloud's verb; never called with
/// none): an address already gone counts as given back.
pub async fn unassign_present<E, Fut>(
    eni_id: &str,
    ips: &[IpAddr],
    lookup: Result<Vec<IpAddr>, E>,
    departed: impl FnOnce(&E) -> Option<Departed>,
    mut remove: impl FnMut(Family, Vec<IpAddr>) -> Fut,
) -> Result<(), E>
where
    E: fmt::Display,
    Fut: Future<Output = Result<(), E>>,
{
    let present: std::collections::HashSet<IpAddr> = match lookup {
        Ok(present) => present.into_iter().collect(),
        Err(e) => {
            return match departed(&e) {
                Some(Departed::Gone) => Ok(()),
                Some(Departed::Elsewhere) => {
                    tracing::warn!(eni = eni_id, error = %e, "not unassigning addresses of an ENI no longer attached here");
                    Ok(())
                }
                None => Err(e),
            };
        }
    };
    let (v4, v6): (Vec<IpAddr>, Vec<IpAddr>) = ips
        .iter()
        .filter(|ip| present.contains(ip))
        .partition(|ip| ip.is_ipv4());
    for (family, ips) in [(Family::V4, v4), (Family::V6, v6)] {
        if !ips.is_empty() {
            remove(family, ips).await?;
        }
    }
    tracing::info!(eni = eni_id, unassigned = ?ips, "unassigned secondary addresses");
    Ok(())
}

/// An ENI enim created for this node, found by its tags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaggedEni {
    pub id: String,
    /// Attached to this instance right now.
    pub attached: bool,
}

#[async_trait]
pub trait CloudBackend: Send + Sync {
    /// "aws", "bce".
    fn name(&self) -> &str;

    /// The secondary ENIs attached to this instance and visible in instance
    /// metadata, with their addresses (owner always `None`). The
    /// instance's primary interface is never listed.
    async fn attached(&self) -> Result<Vec<Eni>, ProviderError>;

    /// ENIs enim created for this node (by tag), attached or not, so a
    /// restarted agent finds what it made and never leaks it.
    async fn tagged(&self) -> Result<Vec<TaggedEni>, ProviderError>;

    /// How many ENIs this instance may have attached, the primary included.
    async fn eni_limit(&self) -> Result<usize, ProviderError>;

    /// Creates an ENI tagged for this node, attaches it, and returns it once
    /// instance metadata shows it (retrying while metadata lags).
    async fn create_and_attach(&self) -> Result<Eni, ProviderError>;

    /// How full the warm pool is (0: empty, 1: at its goal), said before
    /// each create: a backend that paces its calls by throttle replies lets
    /// an emptier pool call sooner. By default, nothing.
    fn pool_fill(&self, _fill: f64) {}

    /// Attaches an ENI enim created earlier that is not attached (found by
    /// `tagged` after a crash) and returns it once metadata shows it.
    async fn attach_existing(&self, eni_id: &str) -> Result<Eni, ProviderError>;

    /// Detaches (waiting until detached) and deletes an ENI enim created.
    async fn detach_and_delete(&self, eni_id: &str) -> Result<(), ProviderError>;

    // Secondary mode: addresses on the attached ENIs (see
    // [`crate::SecondaryIps`], which the pool serves with these).

    /// The instance type's per-ENI address limits and ENI limit.
    async fn address_limits(&self) -> Result<AddressLimits, ProviderError>;

    /// Assigns `n` new secondary addresses to `eni_id`, an ENI
    /// attached here; returns them.
    async fn assign(&self, eni_id: &str, n: AddressCount) -> Result<Vec<IpAddr>, ProviderError>;

    /// Unassigns `ips` of `eni_id`, an ENI attached here; those already
    /// unassigned count as done.
    async fn unassign(&self, eni_id: &str, ips: &[IpAddr]) -> Result<(), ProviderError>;

    // ---- The fleet-wide reaper of leaked ENIs (issue #16) ----
    // At the end of the trait, with defaults that keep the reaper off, so
    // a backend that knows no cluster needs none of them.

    /// The cluster whose leaked ENIs this backend reaps (config key
    /// `cluster`); `None` turns the reaper off.
    fn reap_cluster(&self) -> Option<&str> {
        None
    }

    /// ENIs carrying this cluster's tag that are attached nowhere, any
    /// node's, with their creation tag read. Never lists ENIs without the
    /// tag or with another cluster's.
    async fn unattached_in_cluster(&self) -> Result<Vec<UnattachedEni>, ProviderError> {
        Ok(Vec::new())
    }

    /// Deletes `eni_id` if it still carries this cluster's tag and is
    /// attached nowhere (checked again first: it may have changed since
    /// it was listed). Idempotent: an ENI already gone is [`Reaped::Gone`],
    /// not an error, because another node's reaper may have won the race.
    async fn reap(&self, eni_id: &str) -> Result<Reaped, ProviderError> {
        Ok(Reaped::Spared(format!(
            "{eni_id}: the {} backend does not reap",
            self.name()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creation_tags_round_trip_and_read_unix_seconds() {
        let t = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let tag = format_created_at(t);
        assert_eq!(tag, "2023-11-14T22:13:20Z");
        assert_eq!(parse_created_at(&tag), Some(t));
        assert_eq!(parse_created_at("1700000000"), Some(t));
        assert_eq!(parse_created_at(" 2023-11-14T22:13:20Z "), Some(t));
        for bad in ["", "yesterday", "-5", "2023-13-01T00:00:00Z", "1.5"] {
            assert_eq!(parse_created_at(bad), None, "{bad:?}");
        }
        assert_eq!(CreatedAt::from_tag(None), CreatedAt::Missing);
        assert_eq!(CreatedAt::from_tag(Some(&tag)), CreatedAt::At(t));
        assert_eq!(
            CreatedAt::from_tag(Some("soon")),
            CreatedAt::Unreadable("soon".into())
        );
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// A cloud verb that notes its arguments in `calls` and succeeds.
    fn noting<A, B>(
        calls: &std::sync::Mutex<Vec<(A, B)>>,
    ) -> impl FnMut(A, B) -> std::future::Ready<Result<(), String>> + '_ {
        move |a, b| {
            calls.lock().unwrap().push((a, b));
            std::future::ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn an_unassign_gives_back_what_is_present_one_family_at_a_time() {
        let calls = std::sync::Mutex::new(Vec::new());
        let present = vec![ip("10.0.0.5"), ip("fd00::5"), ip("10.0.0.6")];
        let asked = [ip("10.0.0.5"), ip("10.0.0.7"), ip("fd00::5")];
        unassign_present("eni-1", &asked, Ok(present), |_| None, noting(&calls))
            .await
            .unwrap();
        assert_eq!(
            *calls.lock().unwrap(),
            [
                (Family::V4, vec![ip("10.0.0.5")]),
                (Family::V6, vec![ip("fd00::5")])
            ]
        );

        // Gone or moved away: nothing to give back; any other error stands.
        calls.lock().unwrap().clear();
        for (departed, ok) in [
            (Some(Departed::Gone), true),
            (Some(Departed::Elsewhere), true),
            (None, false),
        ] {
            let lookup = Err("lookup failed".to_string());
            let r = unassign_present("eni-1", &asked, lookup, |_| departed, noting(&calls)).await;
            assert_eq!(r.is_ok(), ok, "{departed:?}");
        }
        assert!(calls.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn an_assign_returns_what_the_listing_gained() {
        let calls = std::sync::Mutex::new(Vec::new());
        let after = || async { Ok(vec![ip("10.0.0.5"), ip("10.0.0.9"), ip("fd00::9")]) };
        let new = assign_new(
            "eni-1",
            vec![ip("10.0.0.5")],
            AddressCount::v4(1),
            noting(&calls),
            after,
        )
        .await
        .unwrap();
        assert_eq!(new, [ip("10.0.0.9"), ip("fd00::9")]);
        assert_eq!(*calls.lock().unwrap(), [(Family::V4, 1)]);
    }

    #[test]
    fn cluster_names() {
        for ok in ["prod", "eu-west-1.prod_2", &"a".repeat(63)] {
            validate_cluster_name(ok).unwrap();
        }
        for bad in ["", "has space", "semi;colon", "a=b", "ü", &"a".repeat(64)] {
            assert!(validate_cluster_name(bad).is_err(), "{bad:?}");
        }
    }
}
