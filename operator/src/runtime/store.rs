//! [`KubeStore`]: [`Store`] over the API server. A spec is written by
//! server-side apply under the operator's field manager, owned by its
//! Node and held by the finalizer; a set is released by removing that
//! finalizer only. Every write first asks [`Store::leadership`]. What the
//! allocator tells goes to the event queue (`super::events`).

use async_trait::async_trait;
use enim_crd::{NetResourceSet, NetResourceSetSpec, FINALIZER, OPERATOR_MANAGER};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, ResourceExt};

use super::events::Teller;
use crate::index::NodeInfo;
use crate::leader::Leadership;
use crate::store::{Store, StoreError, Told};

/// [`Store`] over the API server.
pub struct KubeStore {
    api: Api<NetResourceSet>,
    leadership: Leadership,
    teller: Teller,
}

impl KubeStore {
    pub(super) fn new(client: Client, leadership: Leadership, teller: Teller) -> KubeStore {
        KubeStore {
            api: Api::all(client),
            leadership,
            teller,
        }
    }
}

fn api_error(name: &str, source: kube::Error) -> StoreError {
    let name = name.to_string();
    match &source {
        kube::Error::Api(s) if s.code == 409 || s.code == 404 => {
            StoreError::Conflict { name, source }
        }
        _ => StoreError::Api { name, source },
    }
}

/// The object the operator applies for `node`: its spec, owned by the
/// Node (the garbage collector marks it deleted when the Node goes) and
/// held by the finalizer until its ENIs are released.
pub fn applied_set(node: &NodeInfo, spec: &NetResourceSetSpec) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "enim.io/v1alpha1",
        "kind": "NetResourceSet",
        "metadata": {
            "name": node.name,
            "finalizers": [FINALIZER],
            "ownerReferences": [{
                "apiVersion": "v1",
                "kind": "Node",
                "name": node.name,
                "uid": node.uid,
            }],
        },
        "spec": spec,
    })
}

#[async_trait]
impl Store for KubeStore {
    async fn apply_spec(
        &self,
        node: &NodeInfo,
        spec: &NetResourceSetSpec,
    ) -> Result<(), StoreError> {
        self.leadership()?;
        let params = PatchParams::apply(OPERATOR_MANAGER).force();
        self.api
            .patch(&node.name, &params, &Patch::Apply(applied_set(node, spec)))
            .await
            .map_err(|e| api_error(&node.name, e))?;
        Ok(())
    }

    async fn release_set(&self, name: &str) -> Result<(), StoreError> {
        self.leadership()?;
        let set = match self.api.get_opt(name).await {
            Ok(Some(set)) => set,
            Ok(None) => return Ok(()),
            Err(e) => return Err(api_error(name, e)),
        };
        let finalizers = set.finalizers();
        if !finalizers.iter().any(|f| f == FINALIZER) {
            return Ok(());
        }
        let kept: Vec<&String> = finalizers.iter().filter(|f| *f != FINALIZER).collect();
        // "test" first: a finalizer added since the read is never dropped.
        let patch: json_patch::Patch = serde_json::from_value(serde_json::json!([
            { "op": "test", "path": "/metadata/finalizers", "value": finalizers },
            { "op": "replace", "path": "/metadata/finalizers", "value": kept },
        ]))
        .expect("a well-formed JSON patch");
        self.api
            .patch(name, &PatchParams::default(), &Patch::<()>::Json(patch))
            .await
            .map_err(|e| api_error(name, e))?;
        Ok(())
    }

    fn is_leader(&self) -> bool {
        self.leadership.check().is_ok()
    }

    fn leadership(&self) -> Result<(), StoreError> {
        self.leadership.check().map(|_deadline| ())
    }

    fn tell(&self, told: Told) {
        self.teller.tell(told);
    }
}
