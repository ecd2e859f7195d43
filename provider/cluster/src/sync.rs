//! The provider's two tasks: the watch of the node's own NetResourceSet,
//! and the status writer. Neither is ever awaited by an ADD or a DEL.

use std::pin::pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use enim_core::fault::crash_point;
use enim_core::retry::Backoff;
use enim_crd::{NetResourceSet, AGENT_MANAGER};
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Resource};

use crate::state::SeenSpec;
use crate::{cache, Shared, Source};

/// The crash point (`ENIMD_CRASH_AT`, with the `fault-injection` feature)
/// reached after every status write the API server took.
pub const AFTER_STATUS_WRITE: &str = "cluster:after-status-write";

/// Retries of a failed status write: quick at first, then every few
/// seconds, so the status catches up soon after the API server is back.
const WRITE_RETRY: Backoff = Backoff::new(Duration::from_millis(250), Duration::from_secs(5));

/// Follows the node's own object (field selector `metadata.name=<node>`).
pub(crate) async fn watch(shared: Arc<Shared>, api: Api<NetResourceSet>) {
    let config = watcher::Config::default().fields(&format!("metadata.name={}", shared.node));
    let mut events = pin!(watcher::watcher(api, config).default_backoff());
    // Whether the current (re)list found the object.
    let mut listed = false;
    while let Some(event) = events.next().await {
        match event {
            Ok(Event::Init) => listed = false,
            Ok(Event::InitApply(o) | Event::Apply(o)) => {
                listed = true;
                shared.reachable();
                take(&shared, o).await;
            }
            Ok(Event::InitDone) => {
                shared.reachable();
                if !listed {
                    absent(&shared);
                }
            }
            Ok(Event::Delete(_)) => {
                shared.reachable();
                absent(&shared);
            }
            Err(e) => {
                shared.unreachable(format!("watch: {e}"));
                // The writer's retries find out when it is back, and write
                // the status then.
                shared.dirty.notify_one();
            }
        }
    }
}

/// The object is not (or no longer) in the API: the last spec is still
/// served (pods keep working), and no status is written until it is back.
fn absent(shared: &Shared) {
    let mut link = shared.link();
    if link.present != Some(false) {
        tracing::warn!(node = %shared.node, "no NetResourceSet for this node in the API; serving the last spec seen, if any");
    }
    link.present = Some(false);
}

/// A version of the object: a new spec is cached, then served.
async fn take(shared: &Arc<Shared>, o: NetResourceSet) {
    if o.metadata.name.as_deref() != Some(shared.node.as_str()) {
        // The field selector makes this impossible; never serve another's.
        tracing::error!(name = ?o.metadata.name, node = %shared.node, "the watch returned another node's NetResourceSet; ignored");
        return;
    }
    let seen = SeenSpec {
        generation: o.metadata.generation,
        spec: o.spec,
    };
    let new = shared.state().seen() != Some(&seen);
    let first_sight = {
        let mut link = shared.link();
        let first = link.present != Some(true);
        link.present = Some(true);
        link.source = Source::Api;
        first
    };
    if new {
        // Cached before it is served: a restart serves what was served.
        let (path, node, copy) = (shared.cache.clone(), shared.node.clone(), seen.clone());
        match tokio::task::spawn_blocking(move || cache::save(&path, &node, &copy)).await {
            Ok(Ok(())) => {
                shared.link().cache_error = None;
            }
            Ok(Err(e)) => tracing::error!(error = %e, "spec not cached; served anyway"),
            Err(e) => tracing::error!(error = %e, "caching the spec panicked; served anyway"),
        }
        tracing::info!(node = %shared.node, generation = ?seen.generation, enis = seen.spec.enis.len(), draining = seen.spec.draining.len(), "NetResourceSet spec applied");
        shared.state().apply(seen);
    }
    // Our own status writes come back here too: only a new spec, or the
    // object's first sight, makes the status out of date.
    if new || first_sight {
        shared.changed(new);
    }
}

/// The status writer: waits for a change, lets more gather for the
/// debounce, then applies the whole status; retries until it is taken.
pub(crate) async fn write_status(shared: Arc<Shared>, api: Api<NetResourceSet>) {
    let mut retry = WRITE_RETRY.delays();
    loop {
        shared.dirty.notified().await;
        loop {
            tokio::time::sleep(shared.debounce).await;
            match write_once(&shared, &api).await {
                Ok(()) => {
                    retry.reset();
                    break;
                }
                Err(e) => {
                    let delay = retry.next_delay();
                    tracing::debug!(error = %e, retry_in = ?delay, "status write failed");
                    shared.unreachable(format!("status write: {e}"));
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = shared.api_back.notified() => {}
                    }
                }
            }
        }
    }
}

/// One write of the current status; `Ok` also when there is nothing to
/// write to (no spec yet, or no object).
async fn write_once(shared: &Shared, api: &Api<NetResourceSet>) -> Result<(), kube::Error> {
    if shared.link().present == Some(false) {
        return Ok(());
    }
    let status = {
        let mut state = shared.state();
        if state.seen().is_none() {
            return Ok(());
        }
        state.status(&shared.node, Time(Timestamp::now()))
    };
    let mut body = serde_json::json!({
        "apiVersion": NetResourceSet::api_version(&()),
        "kind": NetResourceSet::kind(&()),
        "metadata": { "name": shared.node },
        "status": status,
    });
    let params = PatchParams::apply(AGENT_MANAGER).force();
    let mut written = api
        .patch_status(&shared.node, &params, &Patch::Apply(&body))
        .await;
    // An agent upgraded before the CRD: server-side apply refuses a whole
    // status with a field the cluster's schema lacks. The status is written
    // without it (each such field once, at most), and said once.
    for _ in 0..UNKNOWN_FIELDS_DROPPED {
        let Err(kube::Error::Api(refused)) = &written else {
            break;
        };
        let Some(field) = undeclared_status_field(&refused.message) else {
            break;
        };
        let dropped = body["status"]
            .as_object_mut()
            .and_then(|st| st.remove(&field))
            .is_some();
        if !dropped {
            break;
        }
        if !shared.told_old_crd.swap(true, Ordering::Relaxed) {
            tracing::warn!(field = %field, "the cluster's NetResourceSet CRD is older than this agent: status.{field} is left out; apply the chart's crds/ to have it");
        }
        written = api
            .patch_status(&shared.node, &params, &Patch::Apply(&body))
            .await;
    }
    match written {
        Ok(_) => {
            shared.writes.fetch_add(1, Ordering::Relaxed);
            // Tests kill the agent between two status writes here (with
            // ENIMD_DELAY_AT the same point first stalls the writer while
            // the agent goes on): the status in the API is then behind.
            crash_point(AFTER_STATUS_WRITE);
            shared.reachable();
            Ok(())
        }
        Err(kube::Error::Api(status)) if status.code == 404 => {
            // Gone since the last event: the watch says when it is back.
            shared.reachable();
            shared.link().present = Some(false);
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// How many status fields a write leaves out for a CRD that lacks them.
const UNKNOWN_FIELDS_DROPPED: usize = 4;

/// The top-level status field server-side apply says the CRD's schema does
/// not declare (`….status.cooling: field not declared in schema`), if the
/// refusal is that.
fn undeclared_status_field(message: &str) -> Option<String> {
    let (before, _) = message.split_once(": field not declared in schema")?;
    let field = before.rsplit_once(".status.")?.1;
    let ok = !field.is_empty() && field.chars().all(|c| c.is_ascii_alphanumeric());
    ok.then(|| field.to_string())
}

#[cfg(test)]
mod undeclared_tests {
    use super::undeclared_status_field;

    #[test]
    fn the_refused_field_is_read_from_the_api_servers_message() {
        let m = "failed to create typed patch object (/node-o; enim.io/v1alpha1, Kind=NetResourceSet): .status.cooling: field not declared in schema";
        assert_eq!(undeclared_status_field(m).as_deref(), Some("cooling"));
        // Nested, or anything else: not this refusal.
        let nested = "…: .status.used[0].extra: field not declared in schema";
        assert_eq!(undeclared_status_field(nested), None);
        assert_eq!(undeclared_status_field("conflict"), None);
    }
}
