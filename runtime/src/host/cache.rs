//! Guest reads answered from the shared watch caches.

use std::collections::HashMap;
use std::sync::Arc;

use kube::api::DynamicObject;
use kubewasm_guest_sdk::selector::Selector;
use serde_json::Value;

use crate::controller::{ObjectKey, Watch};
use crate::sandbox::ObjectRef;

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
}

/// The object as JSON, with `apiVersion` and `kind` set (list responses leave them out).
pub fn to_json(watch: &Watch, object: &DynamicObject) -> Value {
    let mut value = serde_json::to_value(object).unwrap_or(Value::Null);
    if let Value::Object(map) = &mut value {
        let r = &watch.kind().resource;
        map.insert("apiVersion".into(), Value::String(r.api_version.clone()));
        map.insert("kind".into(), Value::String(r.kind.clone()));
    }
    value
}

impl ObjectSource for CacheSource {
    fn get(&self, object: &ObjectRef) -> Option<Value> {
        let watch = self.watch(&object.api_version, &object.kind)?;
        let key = ObjectKey {
            namespace: object.namespace.clone(),
            name: object.name.clone(),
        };
        watch.get(&key).map(|o| to_json(watch, &o))
    }

    fn list(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        selector: &Selector,
    ) -> Vec<Value> {
        let Some(watch) = self.watch(api_version, kind) else {
            return Vec::new();
        };
        let no_labels = std::collections::BTreeMap::new();
        watch
            .store()
            .state()
            .iter()
            .filter(|o| namespace.is_none() || o.metadata.namespace.as_deref() == namespace)
            .filter(|o| selector.matches(o.metadata.labels.as_ref().unwrap_or(&no_labels)))
            .map(|o| to_json(watch, o))
            .collect()
    }
}
