//! Where a controller's states are kept: its shard objects (WasmControllerState), read when
//! it starts and written a merge patch at a time, and its status, where runtimes before those
//! objects kept the states.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use crate::api::{
    ClusterWasmController, STATE_OF_LABEL, WasmController, WasmControllerState,
    WasmControllerStateSpec, state_prefix,
};
use crate::host::actions::api_message;

use super::{STATE_SHARDS, StateError};

/// Shard objects read a page when a controller's states are loaded.
const LOAD_PAGE: u32 = 8;

/// Where a controller's states are kept.
#[derive(Clone)]
pub enum StateOwner {
    /// In WasmControllerState objects.
    Store(Box<Store>),
    /// Nowhere (offline runs, tests): kept in memory only.
    Memory,
}

/// The shards of one controller, and where its states were kept before.
#[derive(Clone)]
pub struct Store {
    api: Api<WasmControllerState>,
    /// The namespace its shards live in.
    home: String,
    /// `WasmController/<name>` or `ClusterWasmController/<name>`.
    controller: String,
    /// Name prefix and label value ([`state_prefix`]).
    prefix: String,
    /// The controller, as the shards' owner (`None` until its uid is known: no owner then).
    owner: Option<OwnerReference>,
    legacy: Legacy,
}

/// The controller's status, where runtimes before this one kept the states.
#[derive(Clone)]
enum Legacy {
    Namespaced(Api<WasmController>, String),
    Cluster(Api<ClusterWasmController>, String),
}

impl StateOwner {
    /// The shards of the controller `namespace/name` (a WasmController) or `name` (a
    /// ClusterWasmController, whose shards live in `cluster_namespace`, the runtime's own),
    /// uid `uid`, written with `client` (the runtime's own identity).
    pub fn of(
        client: Client,
        namespace: Option<&str>,
        name: &str,
        uid: Option<&str>,
        cluster_namespace: &str,
    ) -> StateOwner {
        let (kind, legacy, home) = match namespace {
            Some(ns) => (
                "WasmController",
                Legacy::Namespaced(Api::namespaced(client.clone(), ns), name.to_owned()),
                ns,
            ),
            None => (
                "ClusterWasmController",
                Legacy::Cluster(Api::all(client.clone()), name.to_owned()),
                cluster_namespace,
            ),
        };
        let owner = uid.map(|uid| OwnerReference {
            api_version: "kubewasm.dev/v1alpha1".into(),
            kind: kind.into(),
            name: name.to_owned(),
            uid: uid.to_owned(),
            ..OwnerReference::default()
        });
        StateOwner::Store(Box::new(Store {
            api: Api::namespaced(client, home),
            home: home.to_owned(),
            controller: format!("{kind}/{name}"),
            prefix: state_prefix(kind, name),
            owner,
            legacy,
        }))
    }
}

impl Store {
    /// The controller, as its shards name it (`WasmController/<name>`).
    pub(super) fn controller(&self) -> &str {
        &self.controller
    }

    /// Where its shards live: their namespace and name prefix (also their label's value).
    pub(super) fn place(&self) -> (&str, &str) {
        (&self.home, &self.prefix)
    }

    /// The entries of each of the controller's shard objects, by shard. Objects labelled as
    /// its shards that are not (labelled by hand) are passed over.
    pub(super) async fn read(&self) -> Result<Vec<(usize, BTreeMap<String, String>)>, StateError> {
        // A few objects a page, and no more pages than the shards: whoever may write the
        // namespace may label objects as these, and what the runtime reads is bounded.
        let mut params = ListParams::default()
            .labels(&format!("{STATE_OF_LABEL}={}", self.prefix))
            .limit(LOAD_PAGE);
        let mut seen = 0;
        let mut shards = Vec::new();
        loop {
            let page = self
                .api
                .list(&params)
                .await
                .map_err(|e| StateError::Load(api_message(&e)))?;
            seen += page.items.len();
            for object in page.items {
                let shard = object.spec.shard;
                let name = format!("{}-{shard:02}", self.prefix);
                if object.spec.controller == self.controller
                    && shard < STATE_SHARDS
                    && object.metadata.name.as_deref() == Some(name.as_str())
                {
                    shards.push((shard as usize, object.spec.entries));
                }
            }
            match page.metadata.continue_ {
                Some(token) if !token.is_empty() && seen < 2 * STATE_SHARDS as usize => {
                    params = params.continue_token(&token);
                }
                _ => break,
            }
        }
        Ok(shards)
    }

    /// Removes `status.guestState` from the controller, once its states are moved.
    pub(super) async fn clear_legacy(&self) -> Result<(), StateError> {
        let clear = Patch::Merge(json!({"status": {"guestState": null}}));
        let params = PatchParams::default();
        let cleared = match &self.legacy {
            Legacy::Namespaced(api, name) => {
                api.patch_status(name, &params, &clear).await.map(drop)
            }
            Legacy::Cluster(api, name) => api.patch_status(name, &params, &clear).await.map(drop),
        };
        cleared.map_err(|e| {
            StateError::Load(format!(
                "removing status.guestState once moved: {}",
                api_message(&e)
            ))
        })
    }

    /// One write of shard `index`: a merge patch of its entries, or its creation.
    pub(super) async fn write(
        &self,
        index: usize,
        changes: &BTreeMap<String, Option<String>>,
    ) -> Result<(), String> {
        let name = format!("{}-{index:02}", self.prefix);
        let patch = Patch::Merge(json!({"spec": {"entries": changes}}));
        let message = |e: &kube::Error| api_message(e);
        match self.api.patch(&name, &PatchParams::default(), &patch).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(message(&e)),
        }
        let object = WasmControllerState {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some(BTreeMap::from([(
                    STATE_OF_LABEL.to_owned(),
                    self.prefix.clone(),
                )])),
                owner_references: self.owner.clone().map(|o| vec![o]),
                ..ObjectMeta::default()
            },
            spec: WasmControllerStateSpec {
                controller: self.controller.clone(),
                shard: index as u32,
                entries: changes
                    .iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.clone()?)))
                    .collect(),
            },
        };
        match self.api.create(&PostParams::default(), &object).await {
            Ok(_) => Ok(()),
            // Made meanwhile (by a replica that ran this controller a moment ago): patch it.
            Err(kube::Error::Api(s)) if s.code == 409 => self
                .api
                .patch(&name, &PatchParams::default(), &patch)
                .await
                .map(drop)
                .map_err(|e| message(&e)),
            Err(e) => Err(message(&e)),
        }
    }
}
