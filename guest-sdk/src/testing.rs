//! A native test harness: a fake cluster loaded from YAML and requests built from fixtures,
//! so a guest's `reconcile` runs in ordinary `cargo test` without wasm or a cluster.
//!
//! ```
//! use kubewasm_guest_sdk::testing::{FakeCluster, request_from_yaml};
//! use kubewasm_guest_sdk::{Cluster, Error, Request, Response};
//!
//! fn reconcile(req: &Request, cluster: &dyn Cluster) -> Result<Response, Error> {
//!     let pods = cluster.list("v1", "Pod", req.target.namespace.as_deref(), Some("app=web"))?;
//!     Ok(Response::new().set_status(serde_json::json!({"pods": pods.len()})))
//! }
//!
//! let cluster = FakeCluster::from_yaml("
//! apiVersion: v1
//! kind: Pod
//! metadata: {name: web-1, namespace: demo, labels: {app: web}}
//! ");
//! let request = request_from_yaml("
//! apiVersion: example.com/v1
//! kind: Site
//! metadata: {name: site, namespace: demo}
//! ");
//! let response = reconcile(&request, &cluster).unwrap();
//! assert_eq!(response.status(), Some(&serde_json::json!({"pods": 1})));
//! ```
//!
//! The helpers here panic with a clear message on malformed fixtures, like assertions do.

use std::cell::RefCell;

use serde::Deserialize;
use serde_json::Value;

use crate::query::{self, Query};
use crate::{Cluster, Error, LogLevel, Reads, Request, object};

/// Every document of a (multi-document) YAML string, as JSON values. Empty documents are
/// skipped.
#[track_caller]
pub fn objects_from_yaml(yaml: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(yaml)
        .map(|doc| {
            Value::deserialize(doc).unwrap_or_else(|e| panic!("fixture is not valid YAML: {e}"))
        })
        .filter(|doc| !doc.is_null())
        .collect()
}

/// The single object of a YAML string.
#[track_caller]
pub fn object_from_yaml(yaml: &str) -> Value {
    let mut objects = objects_from_yaml(yaml);
    assert_eq!(
        objects.len(),
        1,
        "expected exactly one YAML document, found {}",
        objects.len()
    );
    objects.remove(0)
}

/// A request from a YAML fixture: the first document is the parent (the target), every
/// further document an observed child.
#[track_caller]
pub fn request_from_yaml(yaml: &str) -> Request {
    let mut objects = objects_from_yaml(yaml);
    assert!(!objects.is_empty(), "the request fixture has no documents");
    let parent = objects.remove(0);
    Request::for_object(parent)
        .unwrap_or_else(|e| panic!("the request fixture's first document: {e}"))
        .with_children(objects)
        .with_controller("test/controller")
}

/// An in-memory cluster: objects loaded from YAML, reads answered through the same
/// [`Query`] as the runtime's (scope, namespace, names, selector, order), log lines kept for
/// assertions.
#[derive(Debug, Default)]
pub struct FakeCluster {
    objects: Vec<Value>,
    default_namespace: Option<String>,
    refuse_reads: Option<String>,
    logs: RefCell<Vec<(LogLevel, String)>>,
}

impl FakeCluster {
    /// An empty cluster.
    pub fn new() -> Self {
        Self::default()
    }

    /// A cluster holding every object of a (multi-document) YAML string.
    #[track_caller]
    pub fn from_yaml(yaml: &str) -> Self {
        Self::new().with_yaml(yaml)
    }

    /// Add every object of a (multi-document) YAML string.
    #[must_use]
    #[track_caller]
    pub fn with_yaml(mut self, yaml: &str) -> Self {
        for object in objects_from_yaml(yaml) {
            self.insert(object);
        }
        self
    }

    /// Add one object, replacing an object with the same apiVersion, kind, namespace and name.
    #[track_caller]
    pub fn insert(&mut self, obj: Value) {
        let key = crate::ObjectRef::of(&obj).unwrap_or_else(|e| panic!("{e}"));
        self.objects.retain(|existing| !key.refers_to(existing));
        self.objects.push(obj);
    }

    /// Reads with `namespace: None` look in this namespace (as the host uses the target's
    /// namespace). Without it, such reads see every namespace.
    #[must_use]
    pub fn with_default_namespace(mut self, namespace: &str) -> Self {
        self.default_namespace = Some(namespace.to_string());
        self
    }

    /// Refuse every read with this message, as a host does for kinds not granted.
    #[must_use]
    pub fn refusing_reads(mut self, message: &str) -> Self {
        self.refuse_reads = Some(message.to_string());
        self
    }

    /// The objects held, in insertion order.
    pub fn objects(&self) -> &[Value] {
        &self.objects
    }

    /// The log lines written so far.
    pub fn logs(&self) -> Vec<(LogLevel, String)> {
        self.logs.borrow().clone()
    }

    fn check_reads(&self) -> Result<(), Error> {
        match &self.refuse_reads {
            Some(message) => Err(Error::retryable(message.clone())),
            None => Ok(()),
        }
    }

    /// Whether a kind lives in namespaces, as far as the objects held tell: a kind with no
    /// objects, or with namespaced ones, is taken as namespaced.
    fn namespaced(&self, api_version: &str, kind: &str) -> bool {
        self.objects
            .iter()
            .find(|o| object::api_version(o) == Some(api_version) && object::kind(o) == Some(kind))
            .is_none_or(|o| object::namespace(o).is_some())
    }

    /// The read as the runtime would resolve it (same scope rules, same errors).
    fn query(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        label_selector: Option<&str>,
    ) -> Result<Query, Error> {
        Ok(Query::new(
            api_version,
            kind,
            self.namespaced(api_version, kind),
            namespace,
            self.default_namespace.as_deref(),
            label_selector,
        )?)
    }
}

impl Reads for FakeCluster {
    fn get(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Option<Value>, Error> {
        self.check_reads()?;
        query::validate_name(name)?;
        let query = self.query(api_version, kind, namespace, None)?;
        Ok(self.objects.iter().find(|o| query.finds(o, name)).cloned())
    }

    fn list(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        label_selector: Option<&str>,
    ) -> Result<Vec<Value>, Error> {
        self.check_reads()?;
        let query = self.query(api_version, kind, namespace, label_selector)?;
        let mut found: Vec<Value> = self
            .objects
            .iter()
            .filter(|o| query.matches(o))
            .cloned()
            .collect();
        query::sort(&mut found);
        Ok(found)
    }
}

impl Cluster for FakeCluster {
    fn log(&self, level: LogLevel, message: &str) {
        self.logs.borrow_mut().push((level, message.to_string()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PODS: &str = "
apiVersion: v1
kind: Pod
metadata: {name: a, namespace: one, labels: {app: web}}
---
apiVersion: v1
kind: Pod
metadata: {name: b, namespace: one, labels: {app: db}}
---
apiVersion: v1
kind: Pod
metadata: {name: c, namespace: two, labels: {app: web}}
---
apiVersion: v1
kind: Namespace
metadata: {name: one}
";

    fn names(objects: &[Value]) -> Vec<&str> {
        objects.iter().filter_map(object::name).collect()
    }

    #[test]
    fn list_filters_by_namespace_and_selector() {
        let cluster = FakeCluster::from_yaml(PODS);
        let web = cluster.list("v1", "Pod", None, Some("app=web")).unwrap();
        assert_eq!(names(&web), ["a", "c"]);
        let in_one = cluster.list("v1", "Pod", Some("one"), None).unwrap();
        assert_eq!(names(&in_one), ["a", "b"]);
        let scoped = FakeCluster::from_yaml(PODS).with_default_namespace("two");
        assert_eq!(names(&scoped.list("v1", "Pod", None, None).unwrap()), ["c"]);
        let not_web = cluster
            .list("v1", "Pod", Some("one"), Some("app notin (web)"))
            .unwrap();
        assert_eq!(names(&not_web), ["b"]);
    }

    #[test]
    fn get_finds_namespaced_and_cluster_scoped() {
        let cluster = FakeCluster::from_yaml(PODS).with_default_namespace("one");
        assert!(cluster.get("v1", "Pod", None, "a").unwrap().is_some());
        assert!(cluster.get("v1", "Pod", None, "c").unwrap().is_none());
        assert!(
            cluster
                .get("v1", "Pod", Some("two"), "c")
                .unwrap()
                .is_some()
        );
        assert!(
            cluster
                .get("v1", "Namespace", None, "one")
                .unwrap()
                .is_some()
        );
        assert!(cluster.get("apps/v1", "Pod", None, "a").unwrap().is_none());
    }

    #[test]
    fn bad_selector_and_refused_reads_are_errors() {
        let cluster = FakeCluster::from_yaml(PODS);
        let err = cluster.list("v1", "Pod", None, Some("app in")).unwrap_err();
        assert!(err.message.contains("invalid label selector"), "{err}");
        assert!(!err.retryable);
        let refusing = FakeCluster::new().refusing_reads("not granted");
        assert_eq!(
            refusing.get("v1", "Pod", None, "a").unwrap_err(),
            Error::retryable("not granted")
        );
    }

    #[test]
    fn insert_replaces_same_object_and_logs_are_kept() {
        let mut cluster = FakeCluster::from_yaml(PODS);
        cluster.insert(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "a", "namespace": "one", "labels": {"app": "cache"}},
        }));
        assert_eq!(cluster.objects().len(), 4);
        assert!(
            cluster
                .list("v1", "Pod", Some("one"), Some("app=cache"))
                .unwrap()
                .len()
                == 1
        );
        cluster.info("hello");
        assert_eq!(cluster.logs(), [(LogLevel::Info, "hello".to_string())]);
    }

    #[test]
    fn request_from_yaml_takes_parent_then_children() {
        let request = request_from_yaml(PODS);
        assert_eq!(request.target.name, "a");
        assert_eq!(request.target.namespace.as_deref(), Some("one"));
        assert_eq!(request.children.len(), 3);
        assert_eq!(request.children_of("v1", "Pod").count(), 2);
    }
}
