//! The leader deadline (what client-go's leader election calls the renew
//! deadline): a replica calls the cloud and writes only while the Lease,
//! as the API server stores it, names it holder with a renewal recent
//! enough that no follower can have taken over yet.
//!
//! kube-lease-manager never turns its leader flag off while renewals fail
//! (it would have to reach the API server to learn it lost), so the flag
//! alone let a leader cut off from the API server, but not from the cloud,
//! go on reclaiming, releasing and reaping from stale caches after the
//! follower took over. Hence, besides the flag:
//!
//! ```text
//! deadline = renewTime + leaseDurationSeconds − margin
//! ```
//!
//! read from the Lease object itself (the runtime watches it), and only
//! while its `holderIdentity` is this replica. `renewTime` is stamped by
//! this replica's clock before its renew request is sent, so that
//! request's latency and the watch's delay count against it; a late or
//! lost watch event only leaves an older `renewTime`, an earlier deadline.
//! A follower takes over at `renewTime + leaseDurationSeconds` by its own
//! clock; the margin covers the two clocks' skew and a cloud call already
//! on the wire when the deadline falls (the runtime then abandons the
//! pass, so no further call of it is sent).
//!
//! The margin is half the lease grace: the manager renews `grace` before
//! the lease ends, so a healthy renewal has the other half (its request
//! and the watch event back) to land before the old deadline falls.
//!
//! Pure logic, no I/O: the runtime feeds it the Lease and the manager's
//! flag.

use std::time::{Duration, SystemTime};

use k8s_openapi::api::coordination::v1::Lease;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::store::StoreError;

/// The deadline's margin for a lease renewed `grace` before it ends.
pub fn margin(grace: Duration) -> Duration {
    grace / 2
}

/// The deadline `lease` gives `identity`, on the monotonic clock (`now`
/// is the instant of `wall_now`): `None` unless `identity` holds it with
/// a renewal time and a duration.
pub fn deadline_of(
    lease: &Lease,
    identity: &str,
    margin: Duration,
    wall_now: SystemTime,
    now: Instant,
) -> Option<Instant> {
    let spec = lease.spec.as_ref()?;
    if spec.holder_identity.as_deref() != Some(identity) {
        return None;
    }
    let renewed = SystemTime::from(spec.renew_time.as_ref()?.0);
    let lasts = Duration::from_secs(u64::try_from(spec.lease_duration_seconds?).ok()?);
    let end = renewed.checked_add(lasts)?.checked_sub(margin)?;
    Some(match end.duration_since(wall_now) {
        Ok(left) => now + left,
        // Already past: as far back as the clock goes, else now (past too).
        Err(late) => now.checked_sub(late.duration()).unwrap_or(now),
    })
}

/// The leader channel or the deadline channel is gone: the lease manager
/// (or the Lease's watch) stopped, so leadership can never be had again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Closed;

/// Whether this replica may call the cloud and write now: the lease
/// manager's flag is up AND the Lease's deadline has not passed. Cheap to
/// clone; the lease manager releases the lease once every clone is gone.
#[derive(Debug, Clone)]
pub struct Leadership {
    flag: watch::Receiver<bool>,
    deadline: watch::Receiver<Option<Instant>>,
}

impl Leadership {
    pub fn new(
        flag: watch::Receiver<bool>,
        deadline: watch::Receiver<Option<Instant>>,
    ) -> Leadership {
        Leadership { flag, deadline }
    }

    /// The deadline while this replica leads; else why it does not.
    pub fn check(&self) -> Result<Instant, StoreError> {
        // A manager (or a Lease watch) gone leaves its last value behind:
        // not to be trusted.
        let gone = self.flag.has_changed().is_err() || self.deadline.has_changed().is_err();
        if gone || !*self.flag.borrow() {
            return Err(StoreError::NotLeader);
        }
        // None: the Lease not (yet) seen naming this replica.
        let deadline = (*self.deadline.borrow()).ok_or(StoreError::NotLeader)?;
        let now = Instant::now();
        if now < deadline {
            Ok(deadline)
        } else {
            Err(StoreError::PastDeadline(now - deadline))
        }
    }

    /// The time left before the deadline (zero when past it), while the
    /// Lease names this replica; `None` otherwise.
    pub fn remaining(&self) -> Option<Duration> {
        let deadline = (*self.deadline.borrow())?;
        Some(deadline.saturating_duration_since(Instant::now()))
    }

    /// Resolves once [`Leadership::check`] fails: at the deadline unless
    /// a renewal moves it first, at once if the flag drops or a channel
    /// closes.
    pub async fn lost(&self) {
        let (mut flag, mut deadline) = (self.flag.clone(), self.deadline.clone());
        loop {
            let Ok(until) = self.check() else { return };
            tokio::select! {
                () = tokio::time::sleep_until(until) => {}
                r = flag.changed() => if r.is_err() { return },
                r = deadline.changed() => if r.is_err() { return },
            }
        }
    }

    /// Resolves once [`Leadership::check`] passes; `Err` if it never can.
    pub async fn gained(&self) -> Result<(), Closed> {
        let (mut flag, mut deadline) = (self.flag.clone(), self.deadline.clone());
        loop {
            if self.check().is_ok() {
                return Ok(());
            }
            tokio::select! {
                r = flag.changed() => r.map_err(|_| Closed)?,
                r = deadline.changed() => r.map_err(|_| Closed)?,
            }
        }
    }

    /// Resolves when leadership is no longer `leading` (lost, or gained);
    /// `Err` once it can never be had again.
    pub async fn flipped(&self, leading: bool) -> Result<(), Closed> {
        if leading {
            self.lost().await;
            if self.flag.has_changed().is_err() || self.deadline.has_changed().is_err() {
                return Err(Closed);
            }
            Ok(())
        } else {
            self.gained().await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    fn lease(holder: &str, renewed: SystemTime, secs: i32) -> Lease {
        Lease {
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                renew_time: Some(MicroTime(renewed.try_into().unwrap())),
                lease_duration_seconds: Some(secs),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_deadline_runs_from_the_renewal_not_from_when_it_was_seen() {
        let wall = SystemTime::now();
        let now = Instant::now();
        let margin = margin(Duration::from_secs(4));
        assert_eq!(margin, Duration::from_secs(2));
        // Renewed 3 s before it was seen: 10 − 2 − 3 = 5 s left.
        let renewed = wall - Duration::from_secs(3);
        let d = deadline_of(&lease("op-a", renewed, 10), "op-a", margin, wall, now);
        assert_eq!(d, Some(now + Duration::from_secs(5)));
        // Seen 9 s late: already 1 s past.
        let renewed = wall - Duration::from_secs(9);
        let d = deadline_of(&lease("op-a", renewed, 10), "op-a", margin, wall, now).unwrap();
        assert_eq!(now - d, Duration::from_secs(1));
    }

    #[test]
    fn no_deadline_from_a_lease_held_by_another_or_without_a_renewal() {
        let (wall, now) = (SystemTime::now(), Instant::now());
        let m = Duration::from_secs(1);
        assert_eq!(
            deadline_of(&lease("op-b", wall, 10), "op-a", m, wall, now),
            None
        );
        let mut released = lease("op-a", wall, 10);
        released.spec.as_mut().unwrap().renew_time = None;
        assert_eq!(deadline_of(&released, "op-a", m, wall, now), None);
        assert_eq!(deadline_of(&Lease::default(), "op-a", m, wall, now), None);
    }

    #[tokio::test(start_paused = true)]
    async fn the_flag_alone_does_not_lead_past_the_deadline() {
        let (flag_tx, flag) = watch::channel(true);
        let (deadline_tx, deadline) = watch::channel(None);
        let lead = Leadership::new(flag, deadline);
        assert!(matches!(lead.check(), Err(StoreError::NotLeader)));

        let start = Instant::now();
        deadline_tx.send_replace(Some(start + Duration::from_secs(2)));
        assert!(lead.check().is_ok());
        // A renewal moves the deadline; lost() follows it, then fires.
        let waiter = {
            let lead = lead.clone();
            tokio::spawn(async move {
                lead.lost().await;
                Instant::now()
            })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        deadline_tx.send_replace(Some(start + Duration::from_secs(3)));
        let lost_at = waiter.await.unwrap();
        assert_eq!(lost_at - start, Duration::from_secs(3));
        // The flag is still up (the manager cannot tell), yet no lead.
        assert!(*flag_tx.borrow());
        assert_eq!(lead.remaining(), Some(Duration::ZERO));
        tokio::time::sleep(Duration::from_millis(500)).await;
        match lead.check() {
            Err(StoreError::PastDeadline(late)) => {
                assert_eq!(late, Duration::from_millis(500))
            }
            other => panic!("{other:?}"),
        }
        // A renewal that lands again leads again.
        let back = {
            let lead = lead.clone();
            tokio::spawn(async move { lead.gained().await })
        };
        deadline_tx.send_replace(Some(Instant::now() + Duration::from_secs(2)));
        back.await.unwrap().unwrap();
        assert!(lead.check().is_ok());
        // The manager gone: never again.
        drop(flag_tx);
        assert!(matches!(lead.check(), Err(StoreError::NotLeader)));
        assert_eq!(lead.flipped(false).await, Err(Closed));
    }
}
