//! Guest reads answered from the shared watch caches.

use std::collections::HashMap;
use std::sync::Arc;

use kubewasm_guest_sdk::query::{Query, Scope};
use serde_json::Value;

use crate::controller::{ObjectKey, Watch};

use super::reads::ObjectSource;

/// The caches of the kinds one controller may read.
#[derive(Clone, Default)]
pub struct CacheSource {
    watches: HashMap<(String, String), Arc<Watch>>,
}

impl CacheSource {
    /// Reads over these watches.
    pub fn new(watches: impl IntoIterator<Item = Arc<Watch>>) -> Self {
        let watches = watches
            .into_iter()
            .map(|w| {
                (
                    (
                        w.kind().resource.api_version.clone(),
                        w.kind().resource.kind.clone(),
                    ),
                    w,
                )
            })
            .collect();
        CacheSource { watches }
    }

    fn watch(&self, api_version: &str, kind: &str) -> Option<&Arc<Watch>> {
        self.watches.get(&(api_version.to_owned(), kind.to_owned()))
    }

    /// The kinds read from, sorted.
    pub fn kinds(&self) -> Vec<String> {
        let mut kinds: Vec<String> = self
            .watches
            .values()
            .map(|w| w.kind().resource.kind.clone())
            .collect();
        kinds.sort();
        kinds
    }

    /// The resources (`plural` or `plural.group`) whose caches have not listed yet, sorted.
    pub fn unlisted(&self) -> Vec<String> {
        let mut unlisted: Vec<String> = self
            .watches
            .values()
            .filter(|w| !w.listed())
            .map(|w| {
                let r = &w.kind().resource;
                if r.group.is_empty() {
                    r.plural.clone()
                } else {
                    format!("{}.{}", r.plural, r.group)
                }
            })
            .collect();
        unlisted.sort();
        unlisted
    }

    /// Waits until every cache a guest may read from has listed once: before that, a read
    /// would answer "not found" for an object that exists.
    pub async fn ready(&self) {
        for watch in self.watches.values() {
            watch.ready().await;
        }
    }
}

impl ObjectSource for CacheSource {
    fn namespaced(&self, api_version: &str, kind: &str) -> Option<bool> {
        self.watch(api_version, kind).map(|w| w.kind().namespaced)
    }

    fn get(&self, query: &Query, name: &str) -> Option<Value> {
        let watch = self.watch(&query.api_version, &query.kind)?;
        let found = match &query.scope {
            Scope::Namespace(ns) => watch.get(&ObjectKey {
                namespace: Some(ns.clone()),
                name: name.to_owned(),
            }),
            Scope::Cluster => watch.get(&ObjectKey {
                namespace: None,
                name: name.to_owned(),
            }),
            Scope::AllNamespaces => watch
                .store()
                .state()
                .into_iter()
                .find(|o| o.metadata.name.as_deref() == Some(name)),
        }?;
        // The cache's own scope rules are not the query's: check again what was found.
        query
            .matches_meta(found.metadata.namespace.as_deref(), &found.metadata.labels)
            .then(|| found.json())
    }

    fn list(&self, query: &Query) -> Vec<Value> {
        let Some(watch) = self.watch(&query.api_version, &query.kind) else {
            return Vec::new();
        };
        watch
            .store()
            .state()
            .iter()
            .filter(|o| query.matches_meta(o.metadata.namespace.as_deref(), &o.metadata.labels))
            .map(|o| o.json())
            .collect()
    }
}
