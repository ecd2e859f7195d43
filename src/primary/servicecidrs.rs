//! The service CIDRs a host path routes: the configured ones, or
//! (`[host_path] service_cidrs_from_api`) the cluster's `ServiceCIDR`
//! objects (networking.k8s.io/v1, GA since Kubernetes 1.33), followed.
//!
//! The API's set is the union of every object's `spec.cidrs`. An object
//! being deleted still counts: the API server keeps it while a Service
//! holds an address in it. Each set listed is written to a cache file
//! ([`CACHE_FILE`], beside the checkpoint), and an agent that starts while
//! the API server is away serves from the cached set until the watch lists
//! again; a cache that cannot be read is reported and ignored, never
//! trusted in part. With neither, nothing is known before the first
//! listing completes, and an ADD that needs the set waits a moment for it,
//! then fails with "try again later": a pod whose host path lacked the
//! service routes would send its ClusterIP traffic out of its ENI and fail
//! quietly.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use ipnet::IpNet;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, ResourceExt};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

/// The cache's file name, in the checkpoint's directory.
pub const CACHE_FILE: &str = "service-cidrs.json";

/// The cache file's content.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Cached {
    cidrs: Vec<IpNet>,
}

/// Where the service CIDRs come from.
#[derive(Clone)]
pub enum ServiceCidrs {
    Configured(Arc<[IpNet]>),
    FromApi(watch::Receiver<ApiState>),
}

/// What the watch of the `ServiceCIDR` objects knows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApiState {
    /// The union, sorted; `None` until the first listing is complete.
    pub cidrs: Option<Arc<[IpNet]>>,
    /// The watch's last error, until a listing succeeds.
    pub error: Option<String>,
}

/// The API's service CIDRs are not known (yet).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the service CIDRs are not read from the API server yet ({0}); retry shortly")]
pub struct NotListed(String);

impl ServiceCidrs {
    /// The set now. From the API, waits up to `wait` for the first listing.
    pub async fn current(&self, wait: Duration) -> Result<Arc<[IpNet]>, NotListed> {
        let rx = match self {
            ServiceCidrs::Configured(cidrs) => return Ok(cidrs.clone()),
            ServiceCidrs::FromApi(rx) => rx,
        };
        let mut rx = rx.clone();
        let listed = tokio::time::timeout(wait, rx.wait_for(|s| s.cidrs.is_some()))
            .await
            .ok()
            .and_then(|r| r.ok().and_then(|state| state.cidrs.clone()));
        if let Some(cidrs) = listed {
            return Ok(cidrs);
        }
        let state = rx.borrow();
        Err(NotListed(match &state.error {
            Some(e) => format!("last error: {e}"),
            None => "the first listing has not completed".into(),
        }))
    }
}

/// The task following the `ServiceCIDR` objects.
pub struct Follower {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Follower {
    /// Stops following; returns once a cache write under way has landed,
    /// so that none lands after enimd removed its files (an uninstall).
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

/// Starts following the cluster's `ServiceCIDR` objects, from the set in
/// `cache` until the first listing; the task runs until [`Follower::stop`]
/// (the watch retries with backoff on errors).
pub fn follow(client: kube::Client, cache: PathBuf) -> (watch::Receiver<ApiState>, Follower) {
    let state = ApiState {
        cidrs: read_cache(&cache),
        error: None,
    };
    let (tx, rx) = watch::channel(state);
    let (stop, stopped) = watch::channel(false);
    let events = watcher(Api::<ServiceCIDR>::all(client));
    let task = tokio::spawn(run(events, tx, cache, stopped));
    (rx, Follower { stop, task })
}

/// The cached set, if a readable cache holds one.
fn read_cache(path: &Path) -> Option<Arc<[IpNet]>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            tracing::warn!(cache = %path.display(), error = %e, "ignoring the service CIDRs' cache");
            return None;
        }
    };
    match serde_json::from_str::<Cached>(&text) {
        Ok(c) if c.cidrs.iter().all(|n| n.trunc() == *n) => {
            tracing::info!(cache = %path.display(), cidrs = ?c.cidrs, "service CIDRs from the cache until the API lists them");
            Some(c.cidrs.into())
        }
        Ok(_) => {
            tracing::warn!(cache = %path.display(), "ignoring the service CIDRs' cache: a CIDR has host bits");
            None
        }
        Err(e) => {
            tracing::warn!(cache = %path.display(), error = %e, "ignoring the service CIDRs' cache: not what enimd writes");
            None
        }
    }
}

/// Writes `cidrs` to the cache (whole, by rename); a failure is logged:
/// the cache only serves a start without the API server.
async fn write_cache(path: &Path, cidrs: &[IpNet]) {
    let bytes = match serde_json::to_vec(&Cached {
        cidrs: cidrs.to_vec(),
    }) {
        Ok(b) => b,
        Err(e) => return tracing::warn!(error = %e, "encoding the service CIDRs' cache"),
    };
    let path = path.to_path_buf();
    let durability = enim_core::atomic_file::Durability {
        data: true,
        rename: false,
    };
    let written = tokio::task::spawn_blocking(move || {
        enim_core::atomic_file::replace(&path, 0o600, durability, &bytes)
    })
    .await;
    match written {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "writing the service CIDRs' cache"),
        Err(e) => tracing::warn!(error = %e, "writing the service CIDRs' cache"),
    }
}

/// Takes the watch's `events` until `stop` turns true: each set is
/// published and cached. A stop waits for the event in hand to be done.
async fn run(
    events: impl futures::Stream<Item = Result<Event<ServiceCIDR>, watcher::Error>>,
    tx: watch::Sender<ApiState>,
    cache: PathBuf,
    mut stop: watch::Receiver<bool>,
) {
    futures::pin_mut!(events);
    let mut known = Objects::default();
    loop {
        let event = tokio::select! {
            event = events.next() => event,
            _ = stop.wait_for(|s| *s) => return,
        };
        let Some(event) = event else { return };
        match event {
            Ok(event) => {
                if let Some(cidrs) = known.apply(event) {
                    if publish(&tx, cidrs.clone()) {
                        write_cache(&cache, &cidrs).await;
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "watching ServiceCIDRs failed; retrying");
                tx.send_if_modified(|s| {
                    let error = Some(e.to_string());
                    let changed = s.error != error;
                    s.error = error;
                    changed
                });
            }
        }
    }
}

fn watcher(
    api: Api<ServiceCIDR>,
) -> impl futures::Stream<Item = Result<Event<ServiceCIDR>, watcher::Error>> {
    watcher::watcher(api, watcher::Config::default()).default_backoff()
}

/// Tells the followers of a new set, and only of a change: an object's
/// status update or a relist that changes nothing wakes no one. Returns
/// whether the set changed.
fn publish(tx: &watch::Sender<ApiState>, cidrs: Arc<[IpNet]>) -> bool {
    tx.send_if_modified(|s| {
        let changed = s.cidrs.as_ref() != Some(&cidrs);
        if changed {
            tracing::info!(cidrs = ?cidrs, "service CIDRs from the API");
        }
        s.cidrs = Some(cidrs);
        s.error = None;
        changed
    })
}

/// The objects seen, by name, and the listing in progress.
#[derive(Default)]
struct Objects {
    current: BTreeMap<String, Vec<IpNet>>,
    /// `Some` while a (re)listing runs: its objects replace `current` only
    /// once it is complete.
    listing: Option<BTreeMap<String, Vec<IpNet>>>,
    listed: bool,
}

impl Objects {
    /// Takes one watch event; returns the union when it may have changed.
    fn apply(&mut self, event: Event<ServiceCIDR>) -> Option<Arc<[IpNet]>> {
        match event {
            Event::Init => {
                self.listing = Some(BTreeMap::new());
                None
            }
            Event::InitApply(o) => {
                let (name, cidrs) = parse(&o);
                self.listing
                    .get_or_insert_with(BTreeMap::new)
                    .insert(name, cidrs);
                None
            }
            Event::InitDone => {
                self.current = self.listing.take().unwrap_or_default();
                self.listed = true;
                Some(self.union())
            }
            Event::Apply(o) => {
                let (name, cidrs) = parse(&o);
                self.current.insert(name, cidrs);
                self.listed.then(|| self.union())
            }
            Event::Delete(o) => {
                self.current.remove(&o.name_any());
                self.listed.then(|| self.union())
            }
        }
    }

    fn union(&self) -> Arc<[IpNet]> {
        let mut all: Vec<IpNet> = self.current.values().flatten().copied().collect();
        all.sort();
        all.dedup();
        all.into()
    }
}

/// An object's name and CIDRs. The API server validates them; one that
/// does not parse (or has host bits) is skipped with a warning rather than
/// routed wrongly.
fn parse(o: &ServiceCIDR) -> (String, Vec<IpNet>) {
    let name = o.name_any();
    let given = o
        .spec
        .as_ref()
        .and_then(|s| s.cidrs.as_deref())
        .unwrap_or_default();
    let cidrs = given
        .iter()
        .filter_map(|c| match c.parse::<IpNet>() {
            Ok(net) if net.trunc() == net => Some(net),
            _ => {
                tracing::warn!(servicecidr = %name, cidr = %c, "skipping a CIDR that is not a network prefix");
                None
            }
        })
        .collect();
    (name, cidrs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::networking::v1::ServiceCIDRSpec;
    use kube::api::ObjectMeta;

    fn object(name: &str, cidrs: &[&str]) -> ServiceCIDR {
        ServiceCIDR {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(ServiceCIDRSpec {
                cidrs: Some(cidrs.iter().map(|c| c.to_string()).collect()),
            }),
            status: None,
        }
    }

    fn nets(list: &[&str]) -> Arc<[IpNet]> {
        list.iter()
            .map(|c| c.parse().unwrap())
            .collect::<Vec<_>>()
            .into()
    }

    #[test]
    fn the_union_is_known_once_the_listing_is_complete() {
        let mut o = Objects::default();
        assert_eq!(o.apply(Event::Init), None);
        assert_eq!(
            o.apply(Event::InitApply(object(
                "kubernetes",
                &["10.100.0.0/16", "fd00:100::/108"]
            ))),
            None
        );
        assert_eq!(
            o.apply(Event::InitApply(object("extra", &["10.200.0.0/24"]))),
            None
        );
        assert_eq!(
            o.apply(Event::InitDone),
            Some(nets(&["10.100.0.0/16", "10.200.0.0/24", "fd00:100::/108"]))
        );
        // Added, then deleted: each is a new union.
        assert_eq!(
            o.apply(Event::Apply(object(
                "more",
                &["10.250.0.0/24", "10.100.0.0/16"]
            ))),
            Some(nets(&[
                "10.100.0.0/16",
                "10.200.0.0/24",
                "10.250.0.0/24",
                "fd00:100::/108"
            ]))
        );
        assert_eq!(
            o.apply(Event::Delete(object("extra", &[]))),
            Some(nets(&["10.100.0.0/16", "10.250.0.0/24", "fd00:100::/108"]))
        );
    }

    #[test]
    fn a_relist_replaces_what_was_known_only_when_complete() {
        let mut o = Objects::default();
        o.apply(Event::Init);
        o.apply(Event::InitApply(object("old", &["10.1.0.0/16"])));
        o.apply(Event::InitDone);
        o.apply(Event::Init);
        o.apply(Event::InitApply(object("new", &["10.2.0.0/16"])));
        assert_eq!(o.union(), nets(&["10.1.0.0/16"]), "mid-relist");
        assert_eq!(o.apply(Event::InitDone), Some(nets(&["10.2.0.0/16"])));
    }

    #[test]
    fn what_is_not_a_prefix_is_skipped() {
        let (_, cidrs) = parse(&object(
            "bad",
            &["10.96.0.1/12", "nonsense", "10.96.0.0/12"],
        ));
        assert_eq!(cidrs, nets(&["10.96.0.0/12"]).to_vec());
    }

    #[tokio::test]
    async fn the_cache_holds_the_last_set_and_a_bad_one_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(CACHE_FILE);
        assert_eq!(read_cache(&path), None, "no cache yet");
        let set = nets(&["10.100.0.0/16", "fd00:100::/108"]);
        write_cache(&path, &set).await;
        assert_eq!(read_cache(&path), Some(set));
        for bad in [
            "{",
            r#"{"cidrs": ["10.100.0.1/16"]}"#,
            r#"{"cidrs": ["10.100.0.0/16"], "more": 1}"#,
            r#"{"cidrs": ["nonsense"]}"#,
        ] {
            std::fs::write(&path, bad).unwrap();
            assert_eq!(read_cache(&path), None, "{bad}");
        }
    }

    #[tokio::test]
    async fn configured_cidrs_are_known_at_once_and_the_api_waits_for_its_listing() {
        let configured = ServiceCidrs::Configured(nets(&["10.96.0.0/12"]));
        assert_eq!(
            configured.current(Duration::ZERO).await.unwrap(),
            nets(&["10.96.0.0/12"])
        );

        let (tx, rx) = watch::channel(ApiState::default());
        let api = ServiceCidrs::FromApi(rx);
        let e = api.current(Duration::from_millis(10)).await.unwrap_err();
        assert!(e.to_string().contains("first listing"), "{e}");
        tx.send_modify(|s| s.error = Some("forbidden".into()));
        let e = api.current(Duration::from_millis(10)).await.unwrap_err();
        assert!(e.to_string().contains("forbidden"), "{e}");

        let waiting = tokio::spawn({
            let api = api.clone();
            async move { api.current(Duration::from_secs(5)).await }
        });
        publish(&tx, nets(&["10.100.0.0/16"]));
        assert_eq!(waiting.await.unwrap().unwrap(), nets(&["10.100.0.0/16"]));
        assert_eq!(tx.borrow().error, None, "a listing clears the error");
    }

    #[tokio::test]
    async fn a_stopped_follower_writes_the_cache_no_more() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(CACHE_FILE);
        let (events, stream) = futures::channel::mpsc::unbounded();
        let (tx, mut rx) = watch::channel(ApiState::default());
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(run(stream, tx, path.clone(), stopped));
        let follower = Follower { stop, task };
        for e in [
            Event::Init,
            Event::InitApply(object("a", &["10.100.0.0/16"])),
            Event::InitDone,
        ] {
            events.unbounded_send(Ok(e)).unwrap();
        }
        rx.wait_for(|s| s.cidrs.is_some()).await.unwrap();
        // Published first, then written.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while read_cache(&path).is_none() && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(read_cache(&path), Some(nets(&["10.100.0.0/16"])));

        follower.stop().await;
        // What the uninstall does next: the cache goes, and stays gone.
        std::fs::remove_file(&path).unwrap();
        let late = events.unbounded_send(Ok(Event::Apply(object("b", &["10.200.0.0/16"]))));
        assert!(late.is_err(), "the follower no longer takes events");
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!path.exists(), "no write after the stop");
    }
}
