//! Resolving `apiVersion` + `kind` to an API resource (plural, scope), cached.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::discovery::Scope;
use kube::{Api, Client};
use kubewasm_guest_sdk::query::{GroupVersion, QueryError, validate_kind};
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
        self.api_of(client, namespace)
    }

    /// The same, for objects decoded as `K` (the caches' [`crate::controller::Cached`]).
    pub fn api_of<K>(&self, client: Client, namespace: Option<&str>) -> Api<K>
    where
        K: kube::Resource<DynamicType = ApiResource, Scope = kube::core::DynamicResourceScope>,
    {
        match (self.namespaced, namespace) {
            (true, Some(ns)) => Api::namespaced_with(client, ns, &self.resource),
            (true, None) => Api::all_with(client, &self.resource),
            (false, _) => Api::all_with(client, &self.resource),
        }
    }
}

/// How long the API server gets to answer one discovery request.
pub const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a kind could not be resolved.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// The apiVersion or kind is not one (see [`GroupVersion::parse`]).
    #[error("{0}")]
    Invalid(#[source] QueryError),
    /// The API server did not answer within [`DISCOVERY_TIMEOUT`].
    #[error("discovery did not answer within {}s", DISCOVERY_TIMEOUT.as_secs())]
    TimedOut,
    /// The API server answered with an error (or does not serve the kind).
    #[error(transparent)]
    Api(#[from] kube::Error),
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

    /// The kind for `api_version` (`v1`, `apps/v1`, `example.com/v1`) and `kind`. Both are
    /// parsed first (a spec's string becomes a discovery URL: nothing but a group, a version
    /// and a kind may reach it), and the API server gets [`DISCOVERY_TIMEOUT`] to answer.
    pub async fn resolve(&self, api_version: &str, kind: &str) -> Result<Kind, ResolveError> {
        let key = (api_version.to_owned(), kind.to_owned());
        if let Some(found) = self.cache.lock().await.get(&key) {
            return Ok(found.clone());
        }
        let gv = GroupVersion::parse(api_version).map_err(ResolveError::Invalid)?;
        validate_kind(kind).map_err(ResolveError::Invalid)?;
        let gvk = GroupVersionKind::gvk(gv.group, gv.version, kind);
        let (resource, caps) = tokio::time::timeout(
            DISCOVERY_TIMEOUT,
            kube::discovery::pinned_kind(&self.client, &gvk),
        )
        .await
        .map_err(|_| ResolveError::TimedOut)?
        .map_err(ResolveError::Api)?;
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
