//! `enimctl cluster`: the cluster half at a glance, from the API server
//! alone (no node's agent is asked): who leads the operators (their
//! Lease), every node's NetResourceSet (its ENIs, who holds each, what is
//! quarantined, whether its agent says Ready and has applied the latest
//! spec), and how many devices each node's DRA driver publishes
//! (ResourceSlices of driver `enim.io`).
//!
//! What is "not ready", and so makes `enimctl cluster` exit 2: no operator
//! holds the Lease, or its holder stopped renewing it; a NetResourceSet
//! whose Ready condition is not True, or whose agent has not applied its
//! latest spec. A quarantined ENI is shown, not counted: the set still
//! serves from its other ENIs.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use enim_crd::{NetResourceSet, CONDITION_READY};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::resource::v1::ResourceSlice;
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};
use serde::Serialize;

/// Reading the cluster failed (as opposed to it being not ready). Its
/// text leaves the cause out: [`enim_core::with_causes`] tells them all.
#[derive(Debug, thiserror::Error)]
#[error("reading {what} from the API server")]
pub struct ClusterViewError {
    what: &'static str,
    #[source]
    source: kube::Error,
}

fn reading(what: &'static str) -> impl FnOnce(kube::Error) -> ClusterViewError {
    move |source| ClusterViewError { what, source }
}

/// What `enimctl cluster` prints (`-o json|yaml` prints it as it is).
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterView {
    pub leader: Option<Leader>,
    pub nodes: Vec<NodeView>,
    /// Why the cluster is not ready; empty when it is.
    pub not_ready: Vec<String>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Leader {
    pub holder: String,
    /// Seconds since the holder last renewed.
    pub renewed_secs_ago: Option<i64>,
    /// Renewed within the lease's duration.
    pub current: bool,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeView {
    pub node: String,
    pub mode: String,
    pub instance: String,
    /// The Ready condition's status and message, as the agent wrote it.
    pub ready: String,
    pub ready_message: String,
    pub enis: Vec<EniView>,
    /// ENIs (secondary mode: addresses) held, and free.
    pub used: u32,
    pub available: u32,
    /// Devices in this node's enim.io ResourceSlices (DRA nodes).
    pub dra_devices: Option<usize>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EniView {
    pub id: String,
    /// `namespace/name` of each pod holding it (secondary mode: one per
    /// address).
    pub held_by: Vec<String>,
    /// Why the agent will not hand it out, when it will not.
    pub quarantined: Option<String>,
    /// The operator has asked for it back.
    pub draining: bool,
}

/// Reads the Lease `namespace/lease`, every NetResourceSet and enim.io's
/// ResourceSlices, and judges them as of `now`.
pub async fn gather(
    client: Client,
    namespace: &str,
    lease: &str,
    now: Timestamp,
) -> Result<ClusterView, ClusterViewError> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let lease = leases
        .get_opt(lease)
        .await
        .map_err(reading("the operator's Lease"))?;
    let sets = Api::<NetResourceSet>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(reading("the NetResourceSets"))?
        .items;
    let slices = Api::<ResourceSlice>::all(client)
        .list(&ListParams::default())
        .await
        .map_err(reading("the ResourceSlices"))?
        .items;
    Ok(judge(lease.as_ref(), &sets, &slices, now))
}

/// The view of what was read; pure, for tests.
pub fn judge(
    lease: Option<&Lease>,
    sets: &[NetResourceSet],
    slices: &[ResourceSlice],
    now: Timestamp,
) -> ClusterView {
    let mut not_ready = Vec::new();
    let leader = lease.and_then(|l| leader(l, now));
    match &leader {
        None => not_ready.push("no operator holds the Lease".to_string()),
        Some(l) if !l.current => not_ready.push(format!(
            "the operator's leader {} has not renewed its Lease for {} s",
            l.holder,
            l.renewed_secs_ago.unwrap_or_default()
        )),
        Some(_) => {}
    }
    let mut devices: BTreeMap<String, usize> = BTreeMap::new();
    for s in slices
        .iter()
        .filter(|s| s.spec.driver == crate::dra::DRIVER)
    {
        if let Some(node) = &s.spec.node_name {
            *devices.entry(node.clone()).or_default() +=
                s.spec.devices.as_ref().map_or(0, Vec::len);
        }
    }
    let mut nodes: Vec<NodeView> = sets
        .iter()
        .map(|set| node_view(set, devices.get(&set.name_any()).copied()))
        .collect();
    nodes.sort_by(|a, b| a.node.cmp(&b.node));
    for view in &nodes {
        if view.ready != "True" {
            not_ready.push(format!(
                "{}: Ready is {}{}",
                view.node,
                view.ready,
                match view.ready_message.as_str() {
                    "" => String::new(),
                    m => format!(" ({m})"),
                }
            ));
        }
    }
    for set in sets {
        let observed = set.status.as_ref().and_then(|s| s.observed_generation);
        if let (Some(generation), Some(observed)) = (set.metadata.generation, observed) {
            if observed < generation {
                not_ready.push(format!(
                    "{}: its agent applied spec generation {observed}, the latest is {generation}",
                    set.name_any()
                ));
            }
        }
    }
    ClusterView {
        leader,
        nodes,
        not_ready,
    }
}

/// The Lease's holder, if any, and whether it renewed within the
/// lease's duration as of `now`.
pub(crate) fn leader(lease: &Lease, now: Timestamp) -> Option<Leader> {
    let spec = lease.spec.as_ref()?;
    let holder = spec.holder_identity.clone().filter(|h| !h.is_empty())?;
    let renewed = spec
        .renew_time
        .as_ref()
        .map(|t| now.as_second() - t.0.as_second());
    let current = match (renewed, spec.lease_duration_seconds) {
        (Some(ago), Some(lasts)) => ago <= i64::from(lasts),
        _ => false,
    };
    Some(Leader {
        holder,
        renewed_secs_ago: renewed,
        current,
    })
}

fn node_view(set: &NetResourceSet, dra_devices: Option<usize>) -> NodeView {
    let status = set.status.clone().unwrap_or_default();
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == CONDITION_READY);
    let mut held: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for u in &status.used {
        held.entry(u.eni.as_str())
            .or_default()
            .push(format!("{}/{}", u.pod_namespace, u.pod_name));
    }
    let quarantined: BTreeMap<&str, &str> = status
        .quarantined
        .iter()
        .map(|q| (q.eni.as_str(), q.reason.as_str()))
        .collect();
    let enis = set
        .spec
        .enis
        .iter()
        .map(|e| EniView {
            id: e.id.clone(),
            held_by: held.get(e.id.as_str()).cloned().unwrap_or_default(),
            quarantined: quarantined.get(e.id.as_str()).map(|r| r.to_string()),
            draining: set.spec.draining.iter().any(|d| d == &e.id),
        })
        .collect();
    NodeView {
        node: set.name_any(),
        mode: set.spec.mode.to_string(),
        instance: set.spec.instance.id.clone(),
        ready: ready.map_or("Unknown".into(), |c| c.status.clone()),
        ready_message: ready.map(|c| c.message.clone()).unwrap_or_default(),
        enis,
        used: status.summary.used,
        available: status.summary.available,
        dra_devices,
    }
}

/// The view as a table for a terminal.
pub fn table(view: &ClusterView) -> String {
    let mut out = String::new();
    let _ = match &view.leader {
        Some(l) => writeln!(
            out,
            "leader: {} (renewed {} s ago{})",
            l.holder,
            l.renewed_secs_ago.map_or("?".into(), |s| s.to_string()),
            if l.current { "" } else { ", expired" }
        ),
        None => writeln!(out, "leader: none"),
    };
    let _ = writeln!(
        out,
        "{:<24} {:<10} {:<20} {:<6} {:>5} {:>5} {:>5} {:>4}",
        "NODE", "MODE", "INSTANCE", "READY", "ENIS", "USED", "FREE", "DRA"
    );
    for n in &view.nodes {
        let _ = writeln!(
            out,
            "{:<24} {:<10} {:<20} {:<6} {:>5} {:>5} {:>5} {:>4}",
            n.node,
            n.mode,
            n.instance,
            n.ready,
            n.enis.len(),
            n.used,
            n.available,
            n.dra_devices.map_or("-".into(), |d| d.to_string())
        );
        for e in &n.enis {
            let mut notes = Vec::new();
            if !e.held_by.is_empty() {
                notes.push(format!("held by {}", e.held_by.join(", ")));
            }
            if let Some(why) = &e.quarantined {
                notes.push(format!("quarantined: {why}"));
            }
            if e.draining {
                notes.push("draining".into());
            }
            let notes = match notes.is_empty() {
                true => "free".to_string(),
                false => notes.join("; "),
            };
            let _ = writeln!(out, "  {} {notes}", e.id);
        }
    }
    if view.not_ready.is_empty() {
        let _ = writeln!(out, "ready");
    } else {
        for why in &view.not_ready {
            let _ = writeln!(out, "not ready: {why}");
        }
    }
    out
}
