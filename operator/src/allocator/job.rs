//! One node's tasks, run one after another on one working copy of its
//! spec (see the allocator's invariants). Spec-only changes (drain,
//! adopt, the pool's settings, a late instance type) are written once at
//! the end of the job; an intent is written before its create, and a
//! publish right after its attach. An ENI leaving is detached in one
//! resync (the call only asks) and deleted in a later one, when the
//! listing shows it attached nowhere.

use std::net::IpAddr;

use enim_core::fault::crash_point;
use enim_core::{AddressCount, ProviderError};
use enim_crd::{EniSpec, Intent, NetResourceSetSpec};
use enim_provider::cloud::Reaped;
use enim_provider::fleet::{
    CreateEni, DeleteCheck, FleetAttachment, FleetCloud, FleetEni, Slot, DETACHING,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::{Allocator, Class, Counters, TaskError};
use crate::index::{eni_spec, MadeFor, NodeInfo, PoolSettings, Task, ACTION_CREATE_ATTACH};
use crate::store::{EniStep, Told};

pub(super) struct Job<'a> {
    pub alloc: &'a Allocator,
    pub counters: &'a Counters,
    /// The node the tasks are for; `None` for a leaked ENI's job.
    pub node: Option<String>,
    /// The node's Node; `None` for a set whose Node is gone.
    pub info: Option<&'a NodeInfo>,
    /// The working spec: the last written or observed one.
    pub spec: Option<NetResourceSetSpec>,
}

impl<'a> Job<'a> {
    /// Runs `tasks` in order; one result per task (and one more if the
    /// final write fails). Stops at the first sign of lost leadership.
    pub async fn run(mut self, tasks: Vec<Task>) -> Vec<Result<(), TaskError>> {
        let mut out = Vec::with_capacity(tasks.len());
        let mut dirty = false;
        for t in tasks {
            let r = self.one(t, &mut dirty).await;
            let deposed = r.as_ref().is_err_and(TaskError::is_deposed);
            out.push(r);
            if deposed {
                return out;
            }
        }
        if dirty {
            if let Err(e) = self.flush().await {
                out.push(Err(e));
            }
        }
        out
    }

    /// A mutating call to the cloud (`call` is handed the cloud): the
    /// allocator's leadership checks and bucket, counted in this job's
    /// counters.
    async fn mutate<T, Fut>(
        &self,
        call: impl FnOnce(&'a dyn FleetCloud) -> Fut,
    ) -> Result<T, TaskError>
    where
        Fut: std::future::Future<Output = Result<T, ProviderError>>,
    {
        let alloc: &'a Allocator = self.alloc;
        let r = alloc.gate.call(Class::Mutating, self.counters, call).await;
        if let (Err(TaskError::Cloud(ProviderError::Throttled(e))), Some(node)) = (&r, &self.node) {
            alloc.store.tell(Told::Throttled {
                node: node.clone(),
                node_uid: self.info.map(|i| i.uid.clone()),
                error: e.clone(),
            });
        }
        r
    }

    /// Tells that `step` on this job's node failed with `e` (a lost
    /// leadership is no failure of the step, a leaked ENI has no node).
    fn tell_failed(&self, step: EniStep, eni: Option<&str>, e: &TaskError) {
        let Some(node) = self.node.as_ref().filter(|_| !e.is_deposed()) else {
            return;
        };
        self.alloc.store.tell(Told::EniStepFailed {
            node: node.clone(),
            node_uid: self.info.map(|i| i.uid.clone()),
            step,
            eni: eni.map(str::to_string),
            error: e.to_string(),
        });
    }

    fn spec(&mut self) -> Result<&mut NetResourceSetSpec, TaskError> {
        self.spec
            .as_mut()
            .ok_or_else(|| TaskError::Missing("a task for a node without a spec".into()))
    }

    /// Writes the working spec unless it is what was last written.
    async fn flush(&mut self) -> Result<(), TaskError> {
        let (Some(info), Some(spec)) = (self.info, self.spec.as_ref()) else {
            return Err(TaskError::Missing(
                "a spec write for a node that is gone".into(),
            ));
        };
        if self.alloc.cache().written.get(&info.name) == Some(spec) {
            return Ok(());
        }
        self.alloc.lead()?;
        self.alloc.store.apply_spec(info, spec).await?;
        self.counters
            .writes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.alloc
            .cache()
            .written
            .insert(info.name.clone(), spec.clone());
        Ok(())
    }

    /// The settings of the node's pool: what the plan planned it with
    /// (the same policy, the same Node).
    fn pool(&self) -> Result<PoolSettings<'a>, TaskError> {
        let alloc: &'a Allocator = self.alloc;
        let info = self
            .info
            .ok_or_else(|| TaskError::Missing("a pool's task for a node that is gone".into()))?;
        alloc
            .policy
            .pool_of(&info.labels)
            .ok_or_else(|| TaskError::Missing(format!("node {} is in no pool", info.name)))
    }

    async fn one(&mut self, task: Task, dirty: &mut bool) -> Result<(), TaskError> {
        match task {
            Task::CreateSet { spec, .. } => {
                self.spec = Some(spec);
                self.flush().await
            }
            Task::RefreshPolicy { .. } => {
                let pool = self.pool()?;
                let spec = self.spec()?;
                // The ENIs made with the node's old groups keep them in the
                // cloud: pinned, they are published as what they are, and
                // the plan drains them once free.
                if spec.security_groups != pool.security_groups {
                    let old = spec.security_groups.clone();
                    for e in spec
                        .enis
                        .iter_mut()
                        .filter(|e| e.security_groups.is_empty())
                    {
                        e.security_groups.clone_from(&old);
                    }
                }
                pool.stamp(spec);
                *dirty = true;
                Ok(())
            }
            Task::FillInstanceType { instance_type, .. } => {
                let instance = &mut self.spec()?.instance;
                // A type already there is what its ENIs were made for.
                if instance.instance_type.is_empty() {
                    instance.instance_type = instance_type;
                    *dirty = true;
                }
                Ok(())
            }
            Task::FinishIntent {
                token,
                made,
                device_index,
                secondary_ipv4,
                ..
            } => {
                // A claim's intent: the same subnet and groups again.
                let intent = self
                    .spec()?
                    .intents
                    .iter()
                    .find(|i| i.client_token == token)
                    .cloned();
                let params = intent.as_ref().and_then(claim_params);
                // Found in the spec: an earlier create may have made it.
                let eni = match made {
                    Some(eni) => eni,
                    None => match self.create(&token, secondary_ipv4, false, params).await {
                        Ok(eni) => eni,
                        Err(e) => {
                            if let Some(intent) = &intent {
                                if self.refused_for_claim(intent, &e)? {
                                    self.flush().await?;
                                    return Ok(());
                                }
                            }
                            return Err(e);
                        }
                    },
                };
                let mut published = entry_for(&eni, intent.as_ref());
                if let Some(ix) = device_index {
                    self.attach(&eni, ix).await?;
                    published.device_index = Some(ix);
                }
                let spec = self.spec()?;
                if !spec.enis.iter().any(|e| e.id == published.id) {
                    spec.enis.push(published);
                }
                spec.intents.retain(|i| i.client_token != token);
                self.flush().await?;
                crash_point("operator-after-publish");
                Ok(())
            }
            Task::DropIntent { token, .. } => {
                self.spec()?.intents.retain(|i| i.client_token != token);
                *dirty = true;
                Ok(())
            }
            Task::Adopt {
                enis, addresses, ..
            } => {
                let spec = self.spec()?;
                for e in enis {
                    if !spec.enis.iter().any(|s| s.id == e.id) {
                        spec.enis.push(e);
                    }
                }
                for (id, ips) in addresses {
                    add_addresses(spec, &id, &ips);
                }
                *dirty = true;
                Ok(())
            }
            Task::Reclaim {
                detach,
                delete,
                addresses,
                stale,
                ..
            } => self.reclaim(detach, delete, addresses, stale, dirty).await,
            Task::CreateEnis {
                device_indexes,
                secondary_ipv4,
                ..
            } => {
                let new = device_indexes.into_iter().map(|ix| (ix, None)).collect();
                self.create_enis(new, secondary_ipv4).await
            }
            Task::CreateForClaim {
                claim,
                subnet,
                security_groups,
                device_index,
                ..
            } => {
                let own = (MadeFor::Claim(claim), subnet, security_groups);
                self.create_enis(vec![(device_index, Some(own))], 0).await
            }
            Task::CreateWarm {
                policy,
                subnet,
                security_groups,
                device_index,
                ..
            } => {
                let own = (MadeFor::Policy(policy), subnet, security_groups);
                self.create_enis(vec![(device_index, Some(own))], 0).await
            }
            Task::AssignAddresses { eni, count, .. } => {
                let ips = self
                    .mutate(|c| c.assign(&eni, AddressCount::v4(count)))
                    .await?;
                self.alloc.amend(|l| {
                    if let Some(f) = l.iter_mut().find(|f| f.id == eni) {
                        for ip in &ips {
                            if !f.secondary_ips.contains(ip) {
                                f.secondary_ips.push(*ip);
                            }
                        }
                    }
                });
                add_addresses(self.spec()?, &eni, &ips);
                *dirty = true;
                Ok(())
            }
            Task::Undrain { items, .. } => {
                self.spec()?.draining.retain(|d| !items.contains(d));
                *dirty = true;
                Ok(())
            }
            Task::Drain { items, .. } => {
                let spec = self.spec()?;
                for it in items {
                    if !spec.draining.contains(&it) {
                        spec.draining.push(it);
                    }
                }
                *dirty = true;
                Ok(())
            }
            Task::ReleaseNode {
                node,
                detach,
                delete,
                release_set,
            } => {
                self.release_node(&node, detach, delete, release_set, dirty)
                    .await
            }
            Task::DeleteLeaked { eni } => {
                let r = self
                    .mutate(|c| c.delete(&eni, DeleteCheck::SecondLook))
                    .await?;
                match r {
                    Reaped::Deleted | Reaped::Gone => {
                        tracing::info!(eni, "deleted a leaked ENI");
                        self.alloc.amend(|l| l.retain(|f| f.id != eni));
                    }
                    Reaped::Spared(why) => tracing::info!(eni, why, "spared a leak candidate"),
                }
                Ok(())
            }
        }
    }

    /// Intents first, then each ENI: create, attach, publish. One ENI's
    /// failure does not stop the others (unless leadership is lost); its
    /// intent stays for the next resync to finish with the same token.
    /// Each token is new and sent once here (`fresh`): a retry is the next
    /// resync's [`Task::FinishIntent`], which is not. An ENI for a DRA
    /// claim (or a policy's warm one) carries the claim (the policy),
    /// subnet and groups in its intent (so that a successor finishing it
    /// makes the same ENI) and is published marked with it.
    async fn create_enis(
        &mut self,
        new: Vec<(u32, Option<OwnEni>)>,
        ips: usize,
    ) -> Result<(), TaskError> {
        let since = Time(
            k8s_openapi::jiff::Timestamp::try_from((self.alloc.clock)())
                .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        );
        let intents: Vec<(Intent, u32)> = new
            .into_iter()
            .map(|(ix, own)| {
                let (claim, policy, subnet, security_groups) = match own {
                    Some((MadeFor::Claim(c), subnet, groups)) => (Some(c), None, subnet, groups),
                    Some((MadeFor::Policy(p), subnet, groups)) => (None, Some(p), subnet, groups),
                    None => (None, None, String::new(), Vec::new()),
                };
                let intent = Intent {
                    client_token: self.alloc.new_token(),
                    action: ACTION_CREATE_ATTACH.into(),
                    eni: String::new(),
                    since: since.clone(),
                    claim,
                    policy,
                    subnet,
                    security_groups,
                };
                (intent, ix)
            })
            .collect();
        self.spec()?
            .intents
            .extend(intents.iter().map(|(i, _)| i.clone()));
        self.flush().await?;
        crash_point("operator-after-intent");
        // Where a pass's cloud calls begin (the e2e rig's phase breakdowns).
        let claims: Vec<String> = intents
            .iter()
            .filter_map(|(i, _)| i.claim.as_ref())
            .map(ToString::to_string)
            .collect();
        tracing::info!(
            enis = intents.len(),
            ?claims,
            "intents recorded; creating and attaching"
        );
        let mut first_err = None;
        let mut published = 0;
        let mut refused = 0;
        for (intent, ix) in intents {
            let token = &intent.client_token;
            let created = self.create(token, ips, true, claim_params(&intent)).await;
            if let Err(e) = &created {
                if self.refused_for_claim(&intent, e)? {
                    refused += 1;
                    continue;
                }
            }
            let r = async {
                let eni = created?;
                self.attach(&eni, ix).await?;
                let mut s = entry_for(&eni, Some(&intent));
                s.device_index = Some(ix);
                Ok::<EniSpec, TaskError>(s)
            }
            .await;
            match r {
                Ok(s) => {
                    if let Some(c) = &intent.claim {
                        tracing::info!(claim = %c, eni = %s.id, "made an ENI for a claim");
                        if let Some(node) = &self.node {
                            self.alloc.store.tell(Told::ClaimServed {
                                claim: c.clone(),
                                node: node.clone(),
                                eni: s.id.clone(),
                            });
                        }
                    }
                    let spec = self.spec()?;
                    spec.enis.push(s);
                    spec.intents.retain(|i| &i.client_token != token);
                    published += 1;
                }
                Err(e) => {
                    let deposed = e.is_deposed();
                    first_err.get_or_insert(e);
                    if deposed {
                        break;
                    }
                }
            }
        }
        if published > 0 || refused > 0 {
            self.flush().await?;
            crash_point("operator-after-publish");
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Whether `e`, the failed create of `intent`, is the cloud's refusal
    /// to make a claim's ENI (its subnet or groups do not exist, or may
    /// not be used), or a policy's warm one: then nothing was made, so its
    /// intent is dropped (to be written with the next change of the spec)
    /// rather than tried again at every resync, and the claim (the
    /// policy's warm ENIs) waits out
    /// [`CLAIM_RETRY`](crate::policy::refusals::CLAIM_RETRY), told why.
    /// A pool's create, or a refusal that may pass, is no such thing.
    fn refused_for_claim(&mut self, intent: &Intent, e: &TaskError) -> Result<bool, TaskError> {
        let TaskError::Cloud(cloud) = e else {
            return Ok(false);
        };
        if cloud.is_transient() {
            return Ok(false);
        }
        match (&intent.claim, &intent.policy) {
            (Some(claim), _) => {
                tracing::warn!(claim = %claim, error = %cloud, "the cloud refused a claim's ENI");
                self.alloc.claim_refused(&claim.uid, cloud.to_string());
            }
            (None, Some(policy)) => {
                tracing::warn!(policy, error = %cloud, "the cloud refused a policy's warm ENI");
                self.alloc.warm_refused(policy, cloud.to_string());
            }
            (None, None) => return Ok(false),
        }
        let token = &intent.client_token;
        self.spec()?.intents.retain(|i| &i.client_token != token);
        Ok(true)
    }

    /// `fresh`: `token` was made by this process and never sent.
    /// `params`: the subnet and groups (a claim's); else the node's pool's.
    async fn create(
        &mut self,
        token: &str,
        ips: usize,
        fresh: bool,
        params: Option<(String, Vec<String>)>,
    ) -> Result<FleetEni, TaskError> {
        let instance = self.spec()?.instance.id.clone();
        let (subnet, security_groups) = match params {
            Some(p) => p,
            None => {
                let pool = self.pool()?;
                (pool.subnet(), pool.security_groups.to_vec())
            }
        };
        let req = CreateEni {
            instance,
            subnet,
            security_groups,
            client_token: token.to_string(),
            secondary_ipv4: ips,
            fresh,
        };
        let created = self.mutate(|c| c.create(&req)).await;
        if let Err(e) = &created {
            self.tell_failed(EniStep::Create, None, e);
        }
        let eni = created?;
        crash_point("operator-after-create");
        self.alloc.amend(|l| {
            if !l.iter().any(|f| f.id == eni.id) {
                l.push(eni.clone());
            }
        });
        Ok(eni)
    }

    async fn attach(&mut self, eni: &FleetEni, device_index: u32) -> Result<(), TaskError> {
        let instance = self.spec()?.instance.id.clone();
        let attached = self
            .mutate(|c| c.attach(eni, Slot::new(&instance, device_index)))
            .await;
        if let Err(e) = &attached {
            self.tell_failed(EniStep::Attach, Some(&eni.id), e);
        }
        attached?;
        crash_point("operator-after-attach");
        self.alloc.amend(|l| {
            if let Some(f) = l.iter_mut().find(|f| f.id == eni.id) {
                f.attachment = Some(FleetAttachment {
                    instance: instance.clone(),
                    device_index,
                    attachment_id: String::new(),
                    state: "attached".into(),
                });
            }
        });
        Ok(())
    }

    /// Asks the cloud to detach each of `enis` (as the listing shows
    /// them) and returns: no polling, a later listing shows each detach
    /// done and the plan deletes then. The first error, once all are asked.
    async fn start_detaches(&self, enis: Vec<FleetEni>) -> Result<(), TaskError> {
        let alloc = self.alloc;
        let mut first_err = None;
        for eni in enis {
            crash_point("operator-before-detach");
            let r = self.mutate(|c| c.start_detach(&eni)).await;
            match r {
                Ok(()) => {
                    crash_point("operator-after-detach");
                    alloc.amend(|l| {
                        let listed = l.iter_mut().find(|f| f.id == eni.id);
                        if let Some(a) = listed.and_then(|f| f.attachment.as_mut()) {
                            a.state = DETACHING.into();
                        }
                    });
                }
                Err(e) if e.is_deposed() => return Err(e),
                Err(e) => {
                    self.tell_failed(EniStep::Detach, Some(&eni.id), &e);
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// One step of ENIs leaving: the detaches asked for, then the deletes
    /// of `delete` (the listing shows them attached nowhere, or no longer
    /// lists them), each checked as the plan says. Those deleted or
    /// already gone, and the first error; lost leadership stops it.
    async fn leave(
        &self,
        detach: Vec<FleetEni>,
        delete: Vec<(String, DeleteCheck)>,
    ) -> Result<(Vec<String>, Option<TaskError>), TaskError> {
        let alloc = self.alloc;
        let mut first_err = match self.start_detaches(detach).await {
            Err(e) if e.is_deposed() => return Err(e),
            r => r.err(),
        };
        let mut removed = Vec::new();
        for (eni, check) in delete {
            let r = self.mutate(|c| c.delete(&eni, check)).await;
            match r {
                Ok(Reaped::Deleted | Reaped::Gone) => {
                    crash_point("operator-after-delete");
                    alloc.amend(|l| l.retain(|f| f.id != eni));
                    removed.push(eni);
                }
                Ok(Reaped::Spared(why)) => {
                    first_err
                        .get_or_insert(TaskError::Missing(format!("{eni} not deleted: {why}")));
                }
                Err(e) if e.is_deposed() => return Err(e),
                Err(e) => {
                    self.tell_failed(EniStep::Delete, Some(&eni), &e);
                    first_err.get_or_insert(e);
                }
            }
        }
        Ok((removed, first_err))
    }

    async fn reclaim(
        &mut self,
        detach: Vec<FleetEni>,
        delete: Vec<(String, DeleteCheck)>,
        addresses: Vec<(String, Vec<IpAddr>)>,
        stale: Vec<String>,
        dirty: &mut bool,
    ) -> Result<(), TaskError> {
        let (removed_enis, mut first_err) = self.leave(detach, delete).await?;
        let mut gone: Vec<String> = stale;
        let mut removed_ips: Vec<(String, Vec<IpAddr>)> = Vec::new();
        for (eni, ips) in addresses {
            let r = self.mutate(|c| c.unassign(&eni, &ips)).await;
            match r {
                Ok(()) => {
                    self.alloc.amend(|l| {
                        if let Some(f) = l.iter_mut().find(|f| f.id == eni) {
                            f.secondary_ips.retain(|ip| !ips.contains(ip));
                        }
                    });
                    removed_ips.push((eni, ips));
                }
                Err(e) if e.is_deposed() => return Err(e),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        let spec = self.spec()?;
        spec.enis.retain(|e| !removed_enis.contains(&e.id));
        for (eni, ips) in &removed_ips {
            if let Some(e) = spec.enis.iter_mut().find(|e| e.id == *eni) {
                e.secondary_ips.retain(|ip| !ips.contains(ip));
            }
            gone.extend(ips.iter().map(IpAddr::to_string));
        }
        gone.extend(removed_enis);
        spec.draining.retain(|d| !gone.contains(d));
        *dirty = true;
        first_err.map_or(Ok(()), Err)
    }

    async fn release_node(
        &mut self,
        node: &str,
        detach: Vec<FleetEni>,
        delete: Vec<(String, DeleteCheck)>,
        release_set: bool,
        dirty: &mut bool,
    ) -> Result<(), TaskError> {
        let (removed, first_err) = self.leave(detach, delete).await?;
        if first_err.is_none() && release_set {
            self.alloc.lead()?;
            self.alloc.store.release_set(node).await?;
            self.alloc.store.tell(Told::NodeReleased {
                node: node.to_string(),
            });
            self.counters
                .writes
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let mut cache = self.alloc.cache();
            cache.written.remove(node);
            cache.gone_since.remove(node);
            return Ok(());
        }
        // The set stays (for the ENIs its pods hold, or those still
        // detaching); the deleted leave it, if its Node is there to own it.
        if let Some(spec) = self.spec.as_mut().filter(|_| !removed.is_empty()) {
            spec.enis.retain(|e| !removed.contains(&e.id));
            spec.draining.retain(|d| !removed.contains(d));
            *dirty = self.info.is_some();
        }
        first_err.map_or(Ok(()), Err)
    }
}

/// An ENI to make with its own subnet and groups: whom for, the subnet,
/// the groups.
type OwnEni = (MadeFor, String, Vec<String>);

/// What a create for `intent` asks of the cloud: a claim's (a policy's)
/// subnet and groups; `None` (the node's pool's) for the pool.
fn claim_params(intent: &Intent) -> Option<(String, Vec<String>)> {
    (intent.claim.is_some() || intent.policy.is_some())
        .then(|| (intent.subnet.clone(), intent.security_groups.clone()))
}

/// The spec entry of `eni`, made for `intent`: marked with its claim (its
/// policy) and groups when it was made for one.
fn entry_for(eni: &FleetEni, intent: Option<&Intent>) -> EniSpec {
    let mut s = eni_spec(eni);
    if let Some(i) = intent.filter(|i| i.claim.is_some() || i.policy.is_some()) {
        s.claim.clone_from(&i.claim);
        s.policy.clone_from(&i.policy);
        s.security_groups.clone_from(&i.security_groups);
    }
    s
}

fn add_addresses(spec: &mut NetResourceSetSpec, eni: &str, ips: &[IpAddr]) {
    if let Some(e) = spec.enis.iter_mut().find(|e| e.id == eni) {
        for ip in ips {
            if !e.secondary_ips.contains(ip) {
                e.secondary_ips.push(*ip);
            }
        }
    }
}
