//! `enimctl uninstall`: what the chart's pre-delete hook runs, so that
//! `helm uninstall` leaves the nodes and the cloud as they were before the
//! install. In order:
//!
//! 1. **The nodes.** The hook's DaemonSet runs `enimd uninstall-cni` on
//!    every node and is Ready there once the node's conflist and plugin are
//!    gone. This waits for it, so no new pod gets an ENI after step 2
//!    begins.
//! 2. **The cloud.** Every NetResourceSet is annotated
//!    [`UNINSTALL_ANNOTATION`]. The operator (still running: a pre-delete
//!    hook runs before anything is deleted) then releases each node's ENIs
//!    at once, as for a deleted Node, keeps those a pod still holds, and
//!    removes its finalizer when none is left. This waits for every
//!    finalizer to go; a set whose pods still hold ENIs keeps its
//!    finalizer, and is named with its pods when the time is up.
//! 3. **The operator** is scaled to 0 and waited for (no pod counted, and
//!    its leader Lease released or run out, so no replica still writes),
//!    so that it cannot serve a node again; then the released sets are
//!    deleted.
//!
//! Anything not done in time fails the hook, with what is left and why:
//! `helm uninstall` then stops before deleting anything, and can be run
//! again once the cause is gone (or with `--no-hooks` to leave it all).

use std::collections::BTreeMap;
use std::time::Duration;

use enim_crd::{NetResourceSet, Uninstall as SetState, UNINSTALL_ANNOTATION};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use tokio::time::Instant;

/// The field manager of what `enimctl uninstall` writes.
pub const MANAGER: &str = "enimctl-uninstall";

/// How often the hook looks again while it waits.
const POLL: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum UninstallError {
    #[error("{what}")]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("not done in {timeout:?}: {left}")]
    Timeout { timeout: Duration, left: String },
}

fn api(what: impl Into<String>) -> impl FnOnce(kube::Error) -> UninstallError {
    let what = what.into();
    move |source| UninstallError::Api { what, source }
}

/// What to uninstall, and how long to wait for it.
#[derive(Debug, Clone)]
pub struct Uninstall {
    /// The release's namespace.
    pub namespace: String,
    /// The hook's node cleanup DaemonSet; `None`: the nodes are not
    /// cleaned.
    pub node_cleanup: Option<String>,
    /// The operator's Deployment; `None` (no operator in the release): the
    /// sets are left as they are.
    pub operator: Option<String>,
    /// The operator's leader Lease, in the same namespace.
    pub lease: String,
    /// For all of it together.
    pub timeout: Duration,
}

/// Runs the steps of the module's doc, printing each as it ends.
pub async fn run(client: Client, u: &Uninstall) -> Result<(), UninstallError> {
    let deadline = Instant::now() + u.timeout;
    let ns = &u.namespace;
    if let Some(ds) = &u.node_cleanup {
        let dss: Api<DaemonSet> = Api::namespaced(client.clone(), ns);
        let nodes = wait(u.timeout, deadline, || nodes_clean(&dss, ds)).await?;
        println!("nodes: enim's conflist and plugin removed on {nodes} node(s)");
    }
    let Some(operator) = &u.operator else {
        println!("no operator in the release: NetResourceSets left as they are");
        return Ok(());
    };
    let sets: Api<NetResourceSet> = Api::all(client.clone());
    let annotate = serde_json::json!({
        "metadata": { "annotations": { UNINSTALL_ANNOTATION: "true" } }
    });
    for set in list_sets(&sets).await? {
        let name = set.name_any();
        if !set.annotations().contains_key(UNINSTALL_ANNOTATION) {
            let params = PatchParams {
                field_manager: Some(MANAGER.into()),
                ..Default::default()
            };
            sets.patch(&name, &params, &Patch::Merge(&annotate))
                .await
                .map_err(api(format!("annotating NetResourceSet {name}")))?;
        }
    }
    let released = wait(u.timeout, deadline, || sets_released(&sets)).await?;
    println!("cloud: the operator released the ENIs of {released} NetResourceSet(s)");

    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let zero = serde_json::json!({ "spec": { "replicas": 0 } });
    deployments
        .patch_scale(operator, &PatchParams::default(), &Patch::Merge(&zero))
        .await
        .map_err(api(format!("scaling Deployment {ns}/{operator} to 0")))?;
    wait(u.timeout, deadline, || {
        operator_stopped(&deployments, operator)
    })
    .await?;
    let leases: Api<Lease> = Api::namespaced(client.clone(), ns);
    wait(u.timeout, deadline, || lease_free(&leases, &u.lease)).await?;
    println!("operator: {ns}/{operator} scaled to 0 and stopped");

    // Only sets this run released: one made since (a node that joined
    // meanwhile) still has ENIs the operator made, and is named instead.
    let mut left = Vec::new();
    let mut deleted = 0;
    for set in list_sets(&sets).await? {
        let name = set.name_any();
        if set.uninstall() != SetState::Released {
            left.push(name);
            continue;
        }
        match sets.delete(&name, &DeleteParams::default()).await {
            Ok(_) => deleted += 1,
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(api(format!("deleting NetResourceSet {name}"))(e)),
        }
    }
    println!("NetResourceSets: {deleted} deleted");
    if !left.is_empty() {
        return Err(UninstallError::Timeout {
            timeout: u.timeout,
            left: format!(
                "NetResourceSets made while the operator released the others, with ENIs \
                 it made: {} (install again and uninstall, or delete their ENIs by hand)",
                left.join(", ")
            ),
        });
    }
    Ok(())
}

async fn list_sets(sets: &Api<NetResourceSet>) -> Result<Vec<NetResourceSet>, UninstallError> {
    let list = sets
        .list(&ListParams::default())
        .await
        .map_err(api("listing the NetResourceSets"))?;
    Ok(list.items)
}

/// Polls `step` until it is done (`Ok(Ok(n))`) or the deadline passes,
/// then fails with the last thing it said was left.
async fn wait<F, Fut>(
    timeout: Duration,
    deadline: Instant,
    mut step: F,
) -> Result<usize, UninstallError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Result<usize, String>, UninstallError>>,
{
    loop {
        let left = match step().await? {
            Ok(n) => return Ok(n),
            Err(left) => left,
        };
        if Instant::now() >= deadline {
            return Err(UninstallError::Timeout { timeout, left });
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The cleanup DaemonSet is rolled out and Ready on every node it is
/// scheduled to: the count of nodes, or what is missing.
async fn nodes_clean(
    dss: &Api<DaemonSet>,
    name: &str,
) -> Result<Result<usize, String>, UninstallError> {
    let ds = dss
        .get(name)
        .await
        .map_err(api(format!("reading the node cleanup DaemonSet {name}")))?;
    let seen = ds.status.as_ref().and_then(|s| s.observed_generation);
    let Some(st) = ds.status.filter(|_| seen >= ds.metadata.generation) else {
        return Ok(Err(format!(
            "DaemonSet {name} not seen by its controller yet"
        )));
    };
    let want = st.desired_number_scheduled;
    if st.number_ready == want && st.updated_number_scheduled.unwrap_or(0) == want {
        return Ok(Ok(usize::try_from(want).unwrap_or(0)));
    }
    Ok(Err(format!(
        "DaemonSet {name}: {} of {want} node(s) clean (a node that cannot run it, NotReady \
         or out of room, keeps enim's conflist and plugin)",
        st.number_ready
    )))
}

/// Every set the annotating pass reached is released: how many, or which
/// are not and why.
async fn sets_released(
    sets: &Api<NetResourceSet>,
) -> Result<Result<usize, String>, UninstallError> {
    let mut released = 0;
    let mut waiting = BTreeMap::new();
    for set in &list_sets(sets).await? {
        match set.uninstall() {
            SetState::Released => released += 1,
            // Made after the annotating pass.
            SetState::No => {}
            SetState::Releasing => {
                waiting.insert(set.name_any(), why_kept(set));
            }
        }
    }
    if waiting.is_empty() {
        return Ok(Ok(released));
    }
    let left: Vec<String> = waiting
        .into_iter()
        .map(|(n, why)| format!("{n} ({why})"))
        .collect();
    Ok(Err(format!(
        "the operator has not released every node's ENIs: {}",
        left.join("; ")
    )))
}

/// Why the operator keeps a set: its pods' ENIs, or what is still in it.
fn why_kept(set: &NetResourceSet) -> String {
    let pods: Vec<String> = set
        .status
        .iter()
        .flat_map(|s| &s.used)
        .map(|u| match u.pod_name.is_empty() {
            true => format!("{} held by container {}", u.eni, u.container_id),
            false => format!("{} held by pod {}/{}", u.eni, u.pod_namespace, u.pod_name),
        })
        .collect();
    match pods.is_empty() {
        true => format!(
            "{} ENI(s) still in its spec: is an operator leading?",
            set.spec.enis.len()
        ),
        false => format!("{}: delete those pods", pods.join(", ")),
    }
}

/// The operator's Deployment has no pod left.
async fn operator_stopped(
    deployments: &Api<Deployment>,
    name: &str,
) -> Result<Result<usize, String>, UninstallError> {
    let got = deployments.get_opt(name).await;
    let Some(d) = got.map_err(api(format!("reading Deployment {name}")))? else {
        return Ok(Ok(0));
    };
    let st = d.status.unwrap_or_default();
    let running = st.replicas.unwrap_or(0);
    match running {
        0 => Ok(Ok(0)),
        n => Ok(Err(format!("Deployment {name} still has {n} pod(s)"))),
    }
}

/// No replica leads any more: the Lease is gone, released (the operator
/// lets it go at its stop) or not renewed within its duration. A pod the
/// Deployment no longer counts may still be shutting down.
async fn lease_free(
    leases: &Api<Lease>,
    name: &str,
) -> Result<Result<usize, String>, UninstallError> {
    let got = leases.get_opt(name).await;
    let Some(lease) = got.map_err(api(format!("reading Lease {name}")))? else {
        return Ok(Ok(0));
    };
    match crate::clusterview::leader(&lease, k8s_openapi::jiff::Timestamp::now()) {
        Some(l) if l.current => Ok(Err(format!(
            "the operator's Lease {name} is still held by {}",
            l.holder
        ))),
        _ => Ok(Ok(0)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use enim_crd::{EniUse, NetResourceSetSpec, NetResourceSetStatus, FINALIZER};

    fn set(annotated: bool, finalizer: bool) -> NetResourceSet {
        let mut s = NetResourceSet::new("n1", NetResourceSetSpec::default());
        if annotated {
            s.annotations_mut()
                .insert(UNINSTALL_ANNOTATION.into(), "true".into());
        }
        if finalizer {
            s.finalizers_mut().push(FINALIZER.into());
        }
        s
    }

    #[test]
    fn a_set_is_released_only_when_annotated_and_its_finalizer_gone() {
        assert_eq!(set(false, true).uninstall(), SetState::No);
        assert_eq!(set(false, false).uninstall(), SetState::No);
        assert_eq!(set(true, true).uninstall(), SetState::Releasing);
        assert_eq!(set(true, false).uninstall(), SetState::Released);
        // Another party's finalizer is not the operator's.
        let mut other = set(true, false);
        other.finalizers_mut().push("example.com/keep".into());
        assert_eq!(other.uninstall(), SetState::Released);
    }

    #[test]
    fn a_kept_set_names_its_pods_or_asks_for_the_operator() {
        let mut s = set(true, true);
        let eni = |id: &str| {
            serde_json::from_value(serde_json::json!({
                "id": id, "mac": "02:00:00:00:00:01", "ipv4": "10.0.0.5/24", "gateway4": "10.0.0.1"
            }))
            .unwrap()
        };
        s.spec.enis = vec![eni("eni-1"), eni("eni-2")];
        assert_eq!(
            why_kept(&s),
            "2 ENI(s) still in its spec: is an operator leading?"
        );
        s.status = Some(NetResourceSetStatus {
            used: vec![
                EniUse {
                    eni: "eni-1".into(),
                    pod_namespace: "web".into(),
                    pod_name: "a".into(),
                    ..Default::default()
                },
                EniUse {
                    eni: "eni-2".into(),
                    container_id: "c2".into(),
                    ..Default::default()
                },
            ],
            ..Default::default()
        });
        assert_eq!(
            why_kept(&s),
            "eni-1 held by pod web/a, eni-2 held by container c2: delete those pods"
        );
    }
}
