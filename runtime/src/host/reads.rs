//! Guest reads: checked against the grants, then answered from a source of objects
//! (the shared watch cache when live, a fixed set of objects offline).

use std::sync::Arc;

use kubewasm_guest_sdk::selector::Selector;
use serde_json::Value;

use crate::api::Verb;
use crate::sandbox::{ObjectRef, Reads};

use super::grants::Permissions;

/// Where objects are read from. No permission checks here: [`GrantedReads`] does those.
pub trait ObjectSource: Send + Sync {
    /// One object, if present.
    fn get(&self, object: &ObjectRef) -> Option<Value>;
    /// The objects of a kind whose labels match, in one namespace or (`None`) everywhere.
    /// Sources filter before converting objects to JSON: lists are on the reconcile path.
    fn list(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        selector: &Selector,
    ) -> Vec<Value>;
}

/// A fixed set of objects, e.g. the `--state` files of an offline run.
#[derive(Debug, Default, Clone)]
pub struct ObjectSet {
    objects: Vec<Value>,
}

impl ObjectSet {
    /// A set of these objects.
    pub fn new(objects: Vec<Value>) -> Self {
        ObjectSet { objects }
    }

    /// The objects.
    pub fn objects(&self) -> &[Value] {
        &self.objects
    }
}

fn str_at<'a>(v: &'a Value, ptr: &str) -> Option<&'a str> {
    v.pointer(ptr).and_then(Value::as_str)
}

impl ObjectSource for ObjectSet {
    fn get(&self, r: &ObjectRef) -> Option<Value> {
        self.objects
            .iter()
            .find(|o| ObjectRef::of(o).as_ref() == Ok(r))
            .cloned()
    }

    fn list(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        selector: &Selector,
    ) -> Vec<Value> {
        self.objects
            .iter()
            .filter(|o| {
                str_at(o, "/apiVersion") == Some(api_version) && str_at(o, "/kind") == Some(kind)
            })
            .filter(|o| namespace.is_none() || str_at(o, "/metadata/namespace") == namespace)
            .filter(|o| selector.matches_object(o))
            .cloned()
            .collect()
    }
}

/// The reads one reconcile may make: grant-checked, namespace-defaulted, selector-filtered.
pub struct GrantedReads<S: ?Sized> {
    source: Arc<S>,
    permissions: Arc<Permissions>,
    target_namespace: Option<String>,
}

impl<S: ObjectSource + ?Sized> GrantedReads<S> {
    /// Reads for a call about an object in `target_namespace`.
    pub fn new(
        source: Arc<S>,
        permissions: Arc<Permissions>,
        target_namespace: Option<String>,
    ) -> Self {
        GrantedReads {
            source,
            permissions,
            target_namespace,
        }
    }

    /// `None` from the guest means "the target's namespace" (or the controller's own).
    fn namespace<'a>(&'a self, asked: Option<&'a str>) -> Option<&'a str> {
        asked
            .or(self.target_namespace.as_deref())
            .or(self.permissions.namespace())
    }
}

impl<S: ObjectSource + ?Sized> Reads for GrantedReads<S> {
    fn get(&self, object: &ObjectRef) -> Result<Option<Value>, String> {
        let namespace = self
            .namespace(object.namespace.as_deref())
            .map(str::to_owned);
        self.permissions
            .check(
                Verb::Get,
                &object.api_version,
                &object.kind,
                namespace.as_deref(),
            )
            .map_err(|e| e.to_string())?;
        let object = ObjectRef {
            namespace,
            ..object.clone()
        };
        Ok(self.source.get(&object))
    }

    fn list(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        label_selector: Option<&str>,
    ) -> Result<Vec<Value>, String> {
        let namespace = self.namespace(namespace);
        self.permissions
            .check(Verb::List, api_version, kind, namespace)
            .map_err(|e| e.to_string())?;
        let selector = match label_selector {
            Some(s) => {
                Selector::parse(s).map_err(|e| format!("invalid label selector `{s}`: {e}"))?
            }
            None => Selector::default(),
        };
        let mut found: Vec<Value> = self.source.list(api_version, kind, namespace, &selector);
        found.sort_by(|a, b| str_at(a, "/metadata/name").cmp(&str_at(b, "/metadata/name")));
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, ns: &str, app: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns, "labels": {"app": app}}})
    }

    #[test]
    fn list_defaults_to_the_target_namespace_and_filters_by_selector() {
        let set = Arc::new(ObjectSet::new(vec![
            pod("a", "web", "frontend"),
            pod("b", "web", "backend"),
            pod("c", "other", "frontend"),
        ]));
        let reads = GrantedReads::new(
            set,
            Arc::new(Permissions::allow_all("t")),
            Some("web".into()),
        );
        let found = reads.list("v1", "Pod", None, Some("app=frontend")).unwrap();
        assert_eq!(found, vec![pod("a", "web", "frontend")]);
        let err = reads.list("v1", "Pod", None, Some("app in (")).unwrap_err();
        assert!(err.contains("invalid label selector"), "{err}");
    }

    #[test]
    fn reads_outside_the_grants_are_refused() {
        let spec =
            serde_yaml::from_str("module: {path: /m}\nparent: {apiVersion: v1, kind: ConfigMap}")
                .unwrap();
        let perms = Arc::new(Permissions::from_spec("web/c", Some("web"), &spec));
        let reads = GrantedReads::new(Arc::new(ObjectSet::default()), perms, Some("web".into()));
        let err = reads.list("v1", "Secret", None, None).unwrap_err();
        assert!(err.contains("may not list Secret"), "{err}");
        assert_eq!(reads.list("v1", "ConfigMap", None, None), Ok(vec![]));
    }
}
