//! Guest reads: resolved, checked against the grants, then answered from a source of objects
//! (the shared watch cache when live, a fixed set of objects offline) through one [`Query`].

use std::sync::Arc;

use kubewasm_guest_sdk::object;
use kubewasm_guest_sdk::query::{self, Query};
use serde_json::Value;

use crate::api::Verb;
use crate::sandbox::{Error, Reads};

use super::grants::Permissions;

/// Where objects are read from. No permission checks here: [`GrantedReads`] does those.
/// Every answer goes through a [`Query`], the filter the SDK's `FakeCluster` uses too.
pub trait ObjectSource: Send + Sync {
    /// Whether objects of the kind live in namespaces; `None` when this source does not hold
    /// the kind at all (live: it is not one the controller declared for reading).
    fn namespaced(&self, api_version: &str, kind: &str) -> Option<bool>;
    /// The object called `name` that `query` can see, if present.
    fn get(&self, query: &Query, name: &str) -> Option<Value>;
    /// The objects `query` matches, in any order. Sources filter before converting objects
    /// to JSON: lists are on the reconcile path.
    fn list(&self, query: &Query) -> Vec<Value>;
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

    pub fn objects(&self) -> &[Value] {
        &self.objects
    }
}

impl ObjectSource for ObjectSet {
    /// As the objects tell (as `FakeCluster` does): a kind with no objects, or with namespaced
    /// ones, is taken as namespaced.
    fn namespaced(&self, api_version: &str, kind: &str) -> Option<bool> {
        Some(
            self.objects
                .iter()
                .find(|o| {
                    object::api_version(o) == Some(api_version) && object::kind(o) == Some(kind)
                })
                .is_none_or(|o| object::namespace(o).is_some()),
        )
    }

    fn get(&self, query: &Query, name: &str) -> Option<Value> {
        self.objects.iter().find(|o| query.finds(o, name)).cloned()
    }

    fn list(&self, query: &Query) -> Vec<Value> {
        self.objects
            .iter()
            .filter(|o| query.matches(o))
            .cloned()
            .collect()
    }
}

/// The reads one reconcile may make: resolved (scope, namespace, selector), then checked
/// against the declaration, then answered. A kind the source does not hold is refused
/// without asking the API server anything.
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

    /// Resolve, then authorize: the query a read means, if the controller may make it. A
    /// refusal is permanent: it holds until the spec or the read changes.
    fn authorize(
        &self,
        verb: Verb,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        label_selector: Option<&str>,
    ) -> Result<Query, Error> {
        let default_namespace = self
            .target_namespace
            .as_deref()
            .or(self.permissions.namespace());
        let Some(namespaced) = self.source.namespaced(api_version, kind) else {
            // Not a kind this controller reads: refused with the grant that would allow it
            // (or, if declared after all, as not readable), never looked up.
            self.permissions
                .check(verb, api_version, kind, namespace.or(default_namespace))
                .map_err(|e| Error::permanent(e.to_string()))?;
            return Err(Error::permanent(format!(
                "{kind} ({api_version}) is not readable by this controller: declare it with verbs [get, list] in spec.grants"
            )));
        };
        let query = Query::new(
            api_version,
            kind,
            namespaced,
            namespace,
            default_namespace,
            label_selector,
        )
        .map_err(|e| Error::permanent(e.to_string()))?;
        self.permissions
            .check(verb, api_version, kind, query.namespace())
            .map_err(|e| Error::permanent(e.to_string()))?;
        Ok(query)
    }
}

impl<S: ObjectSource + ?Sized> Reads for GrantedReads<S> {
    fn get(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Option<Value>, Error> {
        query::validate_name(name)?;
        let query = self.authorize(Verb::Get, api_version, kind, namespace, None)?;
        Ok(self.source.get(&query, name))
    }

    fn list(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        label_selector: Option<&str>,
    ) -> Result<Vec<Value>, Error> {
        let query = self.authorize(Verb::List, api_version, kind, namespace, label_selector)?;
        let mut found = self.source.list(&query);
        query::sort(&mut found);
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
        assert!(err.message.contains("invalid label selector"), "{err}");
        assert!(!err.retryable);
    }

    #[test]
    fn reads_outside_the_grants_are_refused() {
        let spec =
            serde_yaml::from_str("module: {path: /m}\nparent: {apiVersion: v1, kind: ConfigMap}")
                .unwrap();
        let perms = Arc::new(Permissions::from_spec("web/c", Some("web"), &spec));
        let reads = GrantedReads::new(Arc::new(ObjectSet::default()), perms, Some("web".into()));
        let err = reads.list("v1", "Secret", None, None).unwrap_err();
        assert!(err.message.contains("may not list Secret"), "{err}");
        assert_eq!(reads.list("v1", "ConfigMap", None, None), Ok(vec![]));
    }

    const STATE: &str = "
apiVersion: v1
kind: Pod
metadata: {name: b, namespace: web, labels: {app: frontend}}
---
apiVersion: v1
kind: Pod
metadata: {name: a, namespace: web, labels: {app: frontend}}
---
apiVersion: v1
kind: Pod
metadata: {name: a, namespace: other, labels: {app: frontend}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: cluster-admin}
";

    #[test]
    fn object_set_and_fake_cluster_answer_alike() {
        use kubewasm_guest_sdk::testing::{FakeCluster, objects_from_yaml};
        let fake = FakeCluster::from_yaml(STATE).with_default_namespace("web");
        let reads = GrantedReads::new(
            Arc::new(ObjectSet::new(objects_from_yaml(STATE))),
            Arc::new(Permissions::allow_all("t")),
            Some("web".into()),
        );
        let crb = "rbac.authorization.k8s.io/v1";
        let lists: [(&str, &str, Option<&str>, Option<&str>); 6] = [
            ("v1", "Pod", None, None),
            ("v1", "Pod", Some("other"), Some("app=frontend")),
            ("v1", "Pod", None, Some("app notin (frontend)")),
            ("v1", "Pod", None, Some("app in (")),
            (crb, "ClusterRoleBinding", None, None),
            (crb, "ClusterRoleBinding", Some("web"), None),
        ];
        for (av, kind, ns, sel) in lists {
            let live = reads.list(av, kind, ns, sel);
            let native = fake.list(av, kind, ns, sel);
            assert_eq!(live, native, "list {kind} in {ns:?} matching {sel:?}");
        }
        let gets: [(&str, &str, Option<&str>, &str); 5] = [
            ("v1", "Pod", None, "a"),
            ("v1", "Pod", Some("other"), "a"),
            ("v1", "Pod", None, "x?fieldManager=y"),
            (crb, "ClusterRoleBinding", None, "cluster-admin"),
            (crb, "ClusterRoleBinding", Some("web"), "cluster-admin"),
        ];
        for (av, kind, ns, name) in gets {
            let live = reads.get(av, kind, ns, name);
            let native = fake.get(av, kind, ns, name);
            assert_eq!(live, native, "get {kind} {ns:?}/{name}");
        }
        let names: Vec<_> = reads
            .list("v1", "Pod", None, None)
            .unwrap()
            .iter()
            .map(|p| p["metadata"]["name"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(names, ["a", "b"], "sorted by name within the namespace");
    }

    #[test]
    fn a_namespaced_controller_cannot_read_cluster_scoped_kinds() {
        let spec = serde_yaml::from_str(
            "module: {configMap: {name: m, key: m.wasm}}\nparent: {apiVersion: v1, kind: ConfigMap}\n\
             grants: [{apiVersion: rbac.authorization.k8s.io/v1, kind: ClusterRoleBinding, verbs: [get, list]}]",
        )
        .unwrap();
        let perms = Arc::new(Permissions::from_spec("web/c", Some("web"), &spec));
        let reads = GrantedReads::new(
            Arc::new(ObjectSet::new(
                kubewasm_guest_sdk::testing::objects_from_yaml(STATE),
            )),
            perms,
            Some("web".into()),
        );
        let crb = ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding");
        let err = reads.get(crb.0, crb.1, None, "cluster-admin").unwrap_err();
        assert!(
            err.message.contains("only in its own namespace `web`"),
            "{err}"
        );
        let err = reads
            .get(crb.0, crb.1, Some("web"), "cluster-admin")
            .unwrap_err();
        assert!(err.message.contains("is cluster-scoped"), "{err}");
    }
}
