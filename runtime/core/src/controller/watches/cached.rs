//! One object as the shared caches hold it: the few metadata fields the runtime matches on,
//! decoded, and the whole object as the JSON text a guest is handed — nothing else.
//!
//! A watch used to keep each object as kube's `DynamicObject` (typed metadata, the rest a
//! `serde_json::Value` tree) and, once a guest had been handed it, its text beside it. A tree
//! of many small maps and strings takes about six times its JSON (a 4.8 KB Pod took 28 KB:
//! `make bench-cache`), so the default cap of 64 MiB per namespace held about 4,700 Pods,
//! and 1,000 tenants' ConfigMaps took 408 MiB. The text is what a guest gets in every case
//! and what a cache read hands back (parsed when the host needs to look inside: the parent's
//! status and finalizers, the children's desired-state annotations), so it is the one
//! representation kept. `metadata.managedFields` is left out of it, as controller-runtime's
//! `TransformStripManagedFields` does: it is the API server's bookkeeping of server-side
//! apply, often a third of an object, and no reconcile needs it.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{ApiResource, ObjectMeta};
use kube::core::DynamicResourceScope;
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};

use super::ObjectKey;

/// One cached object (one version of it).
#[derive(Clone, Debug)]
pub struct Cached {
    /// Name, namespace, uid, resourceVersion, labels and ownerReferences: what the runtime
    /// matches on. Every other field is only in [`Cached::text`].
    pub metadata: ObjectMeta,
    /// The object as JSON: `apiVersion` and `kind` first (a list's items have none; the
    /// watch sets its kind's, [`Cached::set_type`]), then the rest without `managedFields`.
    text: Arc<str>,
    /// Whether `text` starts with `apiVersion` and `kind`.
    typed: bool,
}

/// The metadata fields kept decoded.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Kept {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    labels: Option<BTreeMap<String, String>>,
    owner_references: Option<Vec<OwnerReference>>,
}

/// What each cached object costs beyond its text and its decoded metadata: the cache's entry
/// (kube's `ObjectRef`, with its copy of the kind's five names, and the map's slot), the
/// `Arc`s, the owner index and the watch's weights, at about the same again as a stub.
const ENTRY_COST: u64 = 640;

impl Cached {
    /// The object `value` (a JSON map; anything else is an object with no fields), typed as
    /// `resource`.
    pub fn new(value: Value, resource: &ApiResource) -> Cached {
        let map = match value {
            Value::Object(map) => map,
            _ => Map::new(),
        };
        let mut cached = Cached::untyped(map);
        cached.set_type(resource);
        cached
    }

    /// The object without its `apiVersion` and `kind` (set by [`Cached::set_type`]).
    fn untyped(mut map: Map<String, Value>) -> Cached {
        map.remove("apiVersion");
        map.remove("kind");
        if let Some(Value::Object(meta)) = map.get_mut("metadata") {
            meta.remove("managedFields");
        }
        // Fields of the wrong type (which an API server does not send) are left out here;
        // the text keeps them as they came.
        let kept = map
            .get("metadata")
            .and_then(|m| Kept::deserialize(m).ok())
            .unwrap_or_default();
        let metadata = ObjectMeta {
            name: kept.name,
            namespace: kept.namespace,
            uid: kept.uid,
            resource_version: kept.resource_version,
            labels: kept.labels,
            owner_references: kept.owner_references,
            ..ObjectMeta::default()
        };
        Cached {
            metadata,
            text: Value::Object(map).to_string().into(),
            typed: false,
        }
    }

    /// Puts `apiVersion` and `kind` of `resource` at the start of the text, once (a watch
    /// knows its kind; list responses leave it out of their items).
    pub fn set_type(&mut self, resource: &ApiResource) {
        if self.typed {
            return;
        }
        let head = format!(
            "{{\"apiVersion\":{},\"kind\":{}",
            Value::from(resource.api_version.as_str()),
            Value::from(resource.kind.as_str()),
        );
        // The untyped text is a JSON map: `{}` or `{"field":...}`.
        let rest = &self.text[1..];
        self.text = if rest == "}" {
            format!("{head}}}")
        } else {
            format!("{head},{rest}")
        }
        .into();
        self.typed = true;
    }

    /// The object as JSON text, as a guest is handed it.
    pub fn text(&self) -> &Arc<str> {
        &self.text
    }

    /// The object as a JSON value, for the host to look inside (parsed from the text).
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or(Value::Null)
    }

    /// Namespace and name.
    pub fn key(&self) -> ObjectKey {
        ObjectKey {
            namespace: self.metadata.namespace.clone(),
            name: self.metadata.name.clone().unwrap_or_default(),
        }
    }

    /// An estimate of the memory this object takes in a cache: its text, its decoded metadata
    /// (weighed as JSON, [`crate::controller::weigh`]) and the cache's entry. `make
    /// bench-cache` prints how close it is.
    pub fn weight(&self) -> u64 {
        (self.text.len() as u64)
            .saturating_add(crate::controller::weigh(&self.metadata))
            .saturating_add(ENTRY_COST)
    }

    /// An object with only the name and namespace of `key`: what a cache needs to remove it.
    pub fn stub(key: &ObjectKey) -> Cached {
        Cached {
            metadata: ObjectMeta {
                name: Some(key.name.clone()),
                namespace: key.namespace.clone(),
                ..ObjectMeta::default()
            },
            text: "{}".into(),
            typed: false,
        }
    }
}

impl<'de> Deserialize<'de> for Cached {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(Cached::untyped(Map::deserialize(deserializer)?))
    }
}

impl kube::Resource for Cached {
    type DynamicType = ApiResource;
    type Scope = DynamicResourceScope;

    fn group(dt: &ApiResource) -> Cow<'_, str> {
        dt.group.as_str().into()
    }

    fn version(dt: &ApiResource) -> Cow<'_, str> {
        dt.version.as_str().into()
    }

    fn kind(dt: &ApiResource) -> Cow<'_, str> {
        dt.kind.as_str().into()
    }

    fn api_version(dt: &ApiResource) -> Cow<'_, str> {
        dt.api_version.as_str().into()
    }

    fn plural(dt: &ApiResource) -> Cow<'_, str> {
        dt.plural.as_str().into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pods() -> ApiResource {
        ApiResource {
            group: String::new(),
            version: "v1".into(),
            api_version: "v1".into(),
            kind: "Pod".into(),
            plural: "pods".into(),
        }
    }

    #[test]
    fn the_text_is_the_object_typed_without_managed_fields() {
        let item = json!({"metadata": {"name": "p", "namespace": "ns", "uid": "u",
            "resourceVersion": "7", "labels": {"app": "a"}, "annotations": {"note": "kept"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "o", "uid": "o-1", "controller": true}],
            "managedFields": [{"manager": "kubectl", "operation": "Update"}]},
            "spec": {"containers": [{"name": "c", "image": "i"}]}});
        let mut cached: Cached = serde_json::from_value(item.clone()).unwrap();
        cached.set_type(&pods());
        cached.set_type(&pods()); // once only
        let mut want = item;
        want["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("managedFields");
        want["apiVersion"] = json!("v1");
        want["kind"] = json!("Pod");
        assert_eq!(cached.json(), want);
        assert!(
            cached
                .text()
                .starts_with(r#"{"apiVersion":"v1","kind":"Pod","metadata":"#)
        );
        assert_eq!(cached.key().to_string(), "ns/p");
        assert_eq!(cached.metadata.uid.as_deref(), Some("u"));
        assert_eq!(cached.metadata.resource_version.as_deref(), Some("7"));
        assert_eq!(cached.metadata.labels.as_ref().unwrap()["app"], "a");
        assert_eq!(
            cached.metadata.owner_references.as_ref().unwrap()[0].uid,
            "o-1"
        );
        // Only what the runtime matches on is decoded; the rest is in the text alone.
        assert!(cached.metadata.annotations.is_none());
    }

    #[test]
    fn the_type_is_the_watchs_and_an_empty_object_stays_valid() {
        // An item that names another kind is still the watch's kind (the cache's truth).
        let cached = Cached::new(json!({"apiVersion": "v2", "kind": "Other"}), &pods());
        assert_eq!(cached.json(), json!({"apiVersion": "v1", "kind": "Pod"}));
        let odd = Cached::new(json!(["not", "a", "map"]), &pods());
        assert_eq!(odd.json(), json!({"apiVersion": "v1", "kind": "Pod"}));
        // Metadata of the wrong shape decodes as none; the text keeps what came.
        let bad = Cached::new(json!({"metadata": {"name": 5}}), &pods());
        assert_eq!(bad.metadata.name, None);
        assert_eq!(bad.json()["metadata"]["name"], 5);
    }

    #[test]
    fn an_object_weighs_its_text_and_decoded_metadata() {
        let small = Cached::new(json!({"metadata": {"name": "a"}}), &pods());
        let large = Cached::new(
            json!({"metadata": {"name": "a"}, "data": {"k": "x".repeat(100_000)}}),
            &pods(),
        );
        assert!(small.weight() >= ENTRY_COST + small.text().len() as u64);
        assert!(large.weight() - small.weight() >= 100_000);
        assert!(large.weight() - small.weight() < 100_100);
    }
}
