//! Resolving `apiVersion` + `kind` to an API resource (plural, scope), cached.

use std::collections::HashMap;
use std::sync::Arc;

use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::discovery::Scope;
use kube::{Api, Client};
use tokio::sync::Mutex;

/// A resolved kind: how to reach it through the API.
#[derive(Debug, Clone)]
pub struct Kind {
    /// The API resource (group, version, kind, plural).
    pub resource: ApiResource,
    /// Whether objects of this kind live in namespaces.
    pub namespaced: bool,
    /// Whether the kind has a `status` subresource.
    pub has_status: bool,
}

impl Kind {
    /// An `Api` for this kind in a namespace (ignored for cluster-scoped kinds).
    pub fn api(&self, client: Client, namespace: Option<&str>) -> Api<DynamicObject> {
        match (self.namespaced, namespace) {
            (true, Some(ns)) => Api::namespaced_with(client, ns, &self.resource),
            (true, None) => Api::all_with(client, &self.resource),
            (false, _) => Api::all_with(client, &self.resource),
        }
    }
}

/// Resolves kinds with the API server's discovery, once per kind.
#[derive(Clone)]
pub struct Resolver {
    client: Client,
    cache: Arc<Mutex<HashMap<(String, String), Kind>>>,
}

impl Resolver {
    /// A resolver using this client.
    pub fn new(client: Client) -> Self {
        Resolver {
            client,
            cache: Arc::default(),
        }
    }

    /// The kind for `api_version` (`v1`, `apps/v1`, `example.com/v1`) and `kind`.
    pub async fn resolve(&self, api_version: &str, kind: &str) -> Result<Kind, kube::Error> {
        let key = (api_version.to_owned(), kind.to_owned());
        if let Some(found) = self.cache.lock().await.get(&key) {
            return Ok(found.clone());
        }
        let (group, version) = match api_version.split_once('/') {
            Some((g, v)) => (g, v),
            None => ("", api_version),
        };
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let (resource, caps) = kube::discovery::pinned_kind(&self.client, &gvk).await?;
        let found = Kind {
            resource,
            namespaced: matches!(caps.scope, Scope::Namespaced),
            has_status: caps.subresources.iter().any(|(r, _)| r.plural == "status"),
        };
        self.cache.lock().await.insert(key, found.clone());
        Ok(found)
    }

    /// Forgets everything (e.g. after CRDs changed).
    pub async fn forget(&self, api_version: &str, kind: &str) {
        self.cache
            .lock()
            .await
            .remove(&(api_version.to_owned(), kind.to_owned()));
    }
}
