//! Small helpers for Kubernetes objects as JSON: read common fields and build new objects.
//!
//! ```
//! use kubewasm_guest_sdk::object::{self, child_of};
//! use serde_json::json;
//!
//! let parent = json!({
//!     "apiVersion": "example.com/v1", "kind": "HelloWorld",
//!     "metadata": {"name": "hi", "namespace": "demo"},
//!     "spec": {"who": "Ada"},
//! });
//! assert_eq!(object::spec_str(&parent, "who"), Some("Ada"));
//!
//! let pod = child_of(&parent, "v1", "Pod", "hi")
//!     .label("app", "hello")
//!     .spec(json!({"containers": []}))
//!     .build();
//! assert_eq!(object::namespace(&pod), Some("demo"));
//! assert_eq!(object::label(&pod, "app"), Some("hello"));
//! ```
//!
//! Typed objects, e.g. k8s-openapi's, go through [`typed`] and [`to_value`]; they cost module
//! size (docs/03-writing-a-controller.md, "Typed objects"), so the JSON helpers stay the default.

use std::collections::BTreeMap;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

use crate::Error;

/// `apiVersion` of an object.
pub fn api_version(obj: &Value) -> Option<&str> {
    obj.get("apiVersion").and_then(Value::as_str)
}

/// `kind` of an object.
pub fn kind(obj: &Value) -> Option<&str> {
    obj.get("kind").and_then(Value::as_str)
}

/// `metadata.name` of an object.
pub fn name(obj: &Value) -> Option<&str> {
    obj.pointer("/metadata/name").and_then(Value::as_str)
}

/// `metadata.namespace` of an object (`None` for cluster-scoped objects).
pub fn namespace(obj: &Value) -> Option<&str> {
    obj.pointer("/metadata/namespace").and_then(Value::as_str)
}

/// `metadata.uid` of an object.
pub fn uid(obj: &Value) -> Option<&str> {
    obj.pointer("/metadata/uid").and_then(Value::as_str)
}

/// One label's value.
pub fn label<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    string_map_entry(obj, "labels", key)
}

/// One annotation's value.
pub fn annotation<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    string_map_entry(obj, "annotations", key)
}

/// All labels (string values only), sorted by key; empty when there are none.
pub fn labels(obj: &Value) -> BTreeMap<String, String> {
    string_map(obj, "labels")
}

/// All annotations (string values only), sorted by key; empty when there are none.
pub fn annotations(obj: &Value) -> BTreeMap<String, String> {
    string_map(obj, "annotations")
}

/// `spec` of an object.
pub fn spec(obj: &Value) -> Option<&Value> {
    obj.get("spec")
}

/// A string field of `spec`, e.g. `spec_str(&obj, "who")` for `spec.who`. `None` when the
/// field is missing or not a string.
pub fn spec_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    spec(obj)?.get(field)?.as_str()
}

fn string_map_entry<'a>(obj: &'a Value, map: &str, key: &str) -> Option<&'a str> {
    obj.get("metadata")?.get(map)?.get(key)?.as_str()
}

fn string_map(obj: &Value, map: &str) -> BTreeMap<String, String> {
    obj.get("metadata")
        .and_then(|m| m.get(map))
        .and_then(Value::as_object)
        .map(|entries| {
            entries
                .iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

/// `obj` as a typed object, e.g. `k8s_openapi::api::core::v1::Pod`. Fails (permanently: the
/// same object will not fit next time either) with a message naming the object, the field
/// that did not fit and the type when it is not the object's kind, e.g. ``cannot read Pod
/// demo/web: at `spec.containers[0].name`: invalid type: integer `7`, expected a string``.
/// k8s-openapi's resource types also check `apiVersion` and `kind`.
///
/// ```
/// use kubewasm_guest_sdk::object;
/// use serde::Deserialize;
/// use serde_json::json;
///
/// #[derive(Debug, Deserialize)]
/// struct Replicas { spec: Spec }
/// #[derive(Debug, Deserialize)]
/// struct Spec { replicas: u32 }
///
/// let ok = json!({"kind": "Web", "metadata": {"name": "w"}, "spec": {"replicas": 3}});
/// assert_eq!(object::typed::<Replicas>(&ok).unwrap().spec.replicas, 3);
/// let bad = json!({"kind": "Web", "metadata": {"name": "w"}, "spec": {"replicas": "3"}});
/// let err = object::typed::<Replicas>(&bad).unwrap_err();
/// assert_eq!(
///     err.message,
///     "cannot read Web w as Replicas: at `spec.replicas`: invalid type: string \"3\", expected u32"
/// );
/// ```
pub fn typed<T: DeserializeOwned>(obj: &Value) -> Result<T, Error> {
    serde_path_to_error::deserialize(obj).map_err(|err| {
        let path = err.path().to_string();
        let at = if path == "." {
            "at the top level".to_string()
        } else {
            format!("at `{path}`")
        };
        let target = short_type_name::<T>();
        let what = describe(obj);
        let what = if kind(obj) == Some(target) {
            what
        } else {
            format!("{what} as {target}")
        };
        Error::permanent(format!("cannot read {what}: {at}: {}", err.inner()))
    })
}

/// `Pod` for `k8s_openapi::v1_33::api::core::v1::pod::Pod` (`Vec` for `Vec<Pod>`).
fn short_type_name<T>() -> &'static str {
    let full = std::any::type_name::<T>();
    let path = full.split('<').next().unwrap_or(full);
    path.rsplit("::").next().unwrap_or(path)
}

/// A typed object as JSON, for [`crate::Response::apply`] or comparisons with observed
/// objects. k8s-openapi's resource types write their `apiVersion` and `kind` themselves and
/// leave out unset optional fields, so the result is the partial object server-side apply
/// wants. Fails (permanently) only for types serde_json cannot write, e.g. maps with
/// non-string keys.
pub fn to_value<T: Serialize>(obj: &T) -> Result<Value, Error> {
    serde_json::to_value(obj).map_err(|err| {
        Error::permanent(format!(
            "cannot write {} as JSON: {err}",
            std::any::type_name::<T>()
        ))
    })
}

/// `Kind namespace/name` as far as `obj` says, for messages (at most 120 bytes of names).
fn describe(obj: &Value) -> String {
    let kind = kind(obj).unwrap_or("object");
    let name = match (namespace(obj), name(obj)) {
        (Some(ns), Some(name)) => format!(" {ns}/{name}"),
        (None, Some(name)) => format!(" {name}"),
        _ => String::new(),
    };
    let text = format!("{kind}{name}");
    match text.char_indices().nth(120) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}

/// Start an object of `api_version`/`kind` named `name` in `namespace` (`None`: cluster-scoped
/// or left for the host to fill in).
pub fn object(api_version: &str, kind: &str, namespace: Option<&str>, name: &str) -> ObjectBuilder {
    let mut metadata = Map::new();
    metadata.insert("name".into(), json!(name));
    if let Some(namespace) = namespace {
        metadata.insert("namespace".into(), json!(namespace));
    }
    let mut root = Map::new();
    root.insert("apiVersion".into(), json!(api_version));
    root.insert("kind".into(), json!(kind));
    root.insert("metadata".into(), Value::Object(metadata));
    ObjectBuilder { root }
}

/// Start a child object of `parent`: same namespace as the parent. The host adds the
/// controller ownerReference when it applies the child.
pub fn child_of(parent: &Value, api_version: &str, kind: &str, name: &str) -> ObjectBuilder {
    object(api_version, kind, namespace(parent), name)
}

/// Builds a Kubernetes object as JSON; turn it into a [`Value`] with [`ObjectBuilder::build`]
/// or pass it straight to [`crate::Response::apply`].
#[derive(Debug, Clone, PartialEq)]
pub struct ObjectBuilder {
    root: Map<String, Value>,
}

impl ObjectBuilder {
    /// Set a label.
    #[must_use]
    pub fn label(self, key: &str, value: &str) -> Self {
        self.metadata_entry("labels", key, value)
    }

    /// Set an annotation.
    #[must_use]
    pub fn annotation(self, key: &str, value: &str) -> Self {
        self.metadata_entry("annotations", key, value)
    }

    /// Set a top-level field, e.g. `field("data", json!({...}))`.
    #[must_use]
    pub fn field(mut self, key: &str, value: Value) -> Self {
        self.root.insert(key.to_string(), value);
        self
    }

    /// Set `spec`.
    #[must_use]
    pub fn spec(self, spec: Value) -> Self {
        self.field("spec", spec)
    }

    /// Set `data` (ConfigMaps, Secrets).
    #[must_use]
    pub fn data(self, data: Value) -> Self {
        self.field("data", data)
    }

    /// The finished object.
    pub fn build(self) -> Value {
        Value::Object(self.root)
    }

    fn metadata_entry(mut self, map: &str, key: &str, value: &str) -> Self {
        let metadata = object_entry(&mut self.root, "metadata");
        object_entry(metadata, map).insert(key.to_string(), json!(value));
        self
    }
}

/// The object at `map[key]`, made an empty object first when missing or not an object.
fn object_entry<'a>(map: &'a mut Map<String, Value>, key: &str) -> &'a mut Map<String, Value> {
    let entry = map.entry(key).or_insert_with(|| json!({}));
    if !entry.is_object() {
        *entry = json!({});
    }
    match entry {
        Value::Object(inner) => inner,
        _ => unreachable!("just made an object"),
    }
}

impl From<ObjectBuilder> for Value {
    fn from(builder: ObjectBuilder) -> Self {
        builder.build()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accessors_tolerate_missing_fields() {
        let empty = json!({});
        assert_eq!(name(&empty), None);
        assert_eq!(namespace(&empty), None);
        assert!(labels(&empty).is_empty());
        assert_eq!(annotation(&empty, "a"), None);
        assert_eq!(spec_str(&json!({"spec": {"who": 3}}), "who"), None);
    }

    #[test]
    fn builder_makes_a_full_object() {
        let obj = object("v1", "ConfigMap", Some("ns"), "cm")
            .annotation("a", "1")
            .label("l", "2")
            .data(json!({"k": "v"}))
            .build();
        assert_eq!(
            obj,
            json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "cm", "namespace": "ns",
                             "annotations": {"a": "1"}, "labels": {"l": "2"}},
                "data": {"k": "v"},
            })
        );
        assert_eq!(annotations(&obj).get("a").map(String::as_str), Some("1"));
        let cluster_scoped = object("v1", "Namespace", None, "n").build();
        assert_eq!(namespace(&cluster_scoped), None);
    }
}
