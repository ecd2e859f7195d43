//! Checks the cloud backends' tests (AWS on moto, BCE on its fake) make
//! alike: what the reaper and the client-side token buckets promise does
//! not depend on the cloud, so it is checked by one piece of code.

use std::collections::HashSet;
use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use enim_core::ratelimit::RateLimit;
use enim_provider::cloud::{format_created_at, CloudBackend, Reaped};
use enim_provider_pool::{reap_pass, ReapReport};

/// Runs `check` every `every` until it passes; past `limit`, panics with
/// what its last run said was missing.
pub async fn poll_until<F, Fut>(limit: Duration, every: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let deadline = std::time::Instant::now() + limit;
    loop {
        let Err(missing) = check().await else {
            return;
        };
        assert!(std::time::Instant::now() < deadline, "{missing}");
        tokio::time::sleep(every).await;
    }
}

/// A creation tag `minutes` before now.
pub fn minutes_ago(minutes: u64) -> String {
    format_created_at(SystemTime::now() - Duration::from_secs(60 * minutes))
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

/// Leaked ENIs (unattached, as other nodes leave them), one of each kind
/// a reaper pass with a 10-minute cooldown tells apart.
pub struct Leaks {
    /// The creation tag of the old ones: 20 minutes ago.
    pub old: String,
    /// Old, of this cluster: deleted.
    pub old_a: String,
    /// Old by a tag in Unix seconds (an hour ago): deleted.
    pub old_b: String,
    /// Two minutes old: spared as young.
    pub young: String,
    /// A creation tag that is not a time: never deleted.
    pub unreadable: String,
    /// No creation tag: never deleted.
    pub no_created: String,
    /// Old, but of another cluster (`c2`): never listed.
    pub other_cluster: String,
}

impl Leaks {
    /// Leaks each with `leak(cluster, creation tag)`, which returns its id.
    pub async fn make<F, Fut>(cluster: &str, mut leak: F) -> Leaks
    where
        F: FnMut(String, Option<String>) -> Fut,
        Fut: Future<Output = String>,
    {
        let old = minutes_ago(20);
        let unix_old = (SystemTime::now() - Duration::from_secs(3600))
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs()
            .to_string();
        let mut ours = |created_at: Option<&str>| leak(cluster.into(), created_at.map(Into::into));
        let old_a = ours(Some(&old)).await;
        let old_b = ours(Some(&unix_old)).await;
        let young = ours(Some(&minutes_ago(2))).await;
        // One word: BCE keeps the tag in a description of words.
        let unreadable = ours(Some("after-lunch")).await;
        let no_created = ours(None).await;
        let other_cluster = leak("c2".into(), Some(old.clone())).await;
        Leaks {
            old,
            old_a,
            old_b,
            young,
            unreadable,
            no_created,
            other_cluster,
        }
    }

    /// Checks the report of one pass over them: the old two deleted, the
    /// young one spared as young, the two without a readable tag as
    /// unreadable, and nothing else done.
    pub fn assert_pass(&self, r: ReapReport) {
        assert_eq!(
            sorted(r.deleted),
            sorted(vec![self.old_a.clone(), self.old_b.clone()])
        );
        assert_eq!(r.young, vec![self.young.clone()]);
        assert_eq!(
            sorted(r.unreadable),
            sorted(vec![self.unreadable.clone(), self.no_created.clone()])
        );
        assert!(r.gone.is_empty() && r.spared.is_empty() && r.failed.is_empty());
    }

    /// Asked directly after the pass, `b` refuses to reap what it skipped
    /// as changed since listed: the other cluster's ENI and `foreign`
    /// (this cluster's mark on an ENI not enim's), which are not this
    /// cluster's (`why[0]`, in the cloud's words), and `attached`
    /// (`why[1]`).
    pub async fn assert_refused(
        &self,
        b: &dyn CloudBackend,
        foreign: &str,
        attached: &str,
        why: [&str; 2],
    ) {
        let cases = [
            (self.other_cluster.as_str(), why[0]),
            (foreign, why[0]),
            (attached, why[1]),
        ];
        for (id, why) in cases {
            match b.reap(id).await.unwrap() {
                Reaped::Spared(w) => assert!(w.contains(why), "{id}: {w}"),
                other => panic!("{id}: {other:?}"),
            }
        }
    }

    /// The ones a pass leaves in the cloud.
    pub fn kept(&self) -> [&String; 4] {
        [
            &self.young,
            &self.unreadable,
            &self.no_created,
            &self.other_cluster,
        ]
    }
}

/// Two reapers of one cluster list its `n` leaked ENIs before either
/// deletes: both see the same ones, `a` deletes each, and `b`, coming
/// second, finds each already gone (not an error).
pub async fn both_list_then_reap(a: &dyn CloudBackend, b: &dyn CloudBackend, n: usize) {
    let listed_a = a.unattached_in_cluster().await.unwrap();
    let listed_b = b.unattached_in_cluster().await.unwrap();
    assert_eq!(listed_a, listed_b);
    assert_eq!(listed_a.len(), n);
    for e in &listed_a {
        assert_eq!(a.reap(&e.id).await.unwrap(), Reaped::Deleted);
    }
    for e in &listed_b {
        assert_eq!(b.reap(&e.id).await.unwrap(), Reaped::Gone, "{}", e.id);
    }
}

/// Two whole reaper passes at once over the leaked ENIs `ids`: neither
/// fails, and each ENI is deleted exactly once, by one of them. The
/// reports are returned for the cloud's own checks.
pub async fn two_passes_at_once(
    a: &dyn CloudBackend,
    b: &dyn CloudBackend,
    cooldown: Duration,
    ids: &HashSet<String>,
) -> (ReapReport, ReapReport) {
    let (ra, rb) = tokio::join!(
        reap_pass(a, cooldown, || false),
        reap_pass(b, cooldown, || false)
    );
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    assert!(
        ra.failed.is_empty() && rb.failed.is_empty(),
        "{ra:?} {rb:?}"
    );
    let deleted: HashSet<String> = ra.deleted.iter().chain(&rb.deleted).cloned().collect();
    assert_eq!(&deleted, ids, "{ra:?} {rb:?}");
    let gone: HashSet<String> = ra.gone.iter().chain(&rb.gone).cloned().collect();
    assert!(gone.is_subset(ids), "{ra:?} {rb:?}");
    assert_eq!(ra.deleted.len() + rb.deleted.len(), ids.len());
    (ra, rb)
}

/// A burst of calls through a client's two buckets, as the cloud saw them
/// arrive (sorted, from the burst's start): `paced`, through a bucket of
/// `limit`, went `limit.burst` at once and then one per interval: never
/// sooner (the bucket's promise) and not much later (the rate is used, not
/// wasted). `other`, the other class, with its own bucket, waited behind
/// none of them.
pub fn assert_paced(paced: &[Duration], limit: RateLimit, other: &[Duration]) {
    let burst = usize::try_from(limit.burst).unwrap();
    for (k, at) in paced.iter().enumerate() {
        let due = limit.every * u32::try_from(k.saturating_sub(burst - 1)).unwrap();
        assert!(*at >= due, "call {k} at {at:?}, due {due:?}: {paced:?}");
        assert!(
            *at < due + Duration::from_millis(500),
            "call {k} at {at:?}, due {due:?}: {paced:?}"
        );
    }
    let last = *paced.last().unwrap();
    assert!(
        other.iter().all(|o| *o < last / 2),
        "{other:?} vs {paced:?}"
    );
}
