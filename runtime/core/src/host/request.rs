//! What a guest is handed for one parent — whether it is called at all, which objects are its
//! children and in what order, whether it is finalizing, each document's text — decided here
//! once, for the runtime's reconciles and for `kubewasm reconcile` offline, so that a guest
//! tested on files sees the request it sees live, byte for byte.

use std::sync::Arc;

use kubewasm_guest_sdk::selector::Selector;
use serde_json::Value;

use super::finalizer::{Finalizer, Phase};
use crate::controller::Cached;
use crate::sandbox::{ObjectRef, WireRequest};

/// Whether `parent` is one of the controller's parents: it matches `spec.parent.labelSelector`
/// (its kind is the parent kind's: the watch's live, checked by the caller offline).
pub fn selected(selector: Option<&Selector>, parent: &Cached) -> bool {
    selector.is_none_or(|s| s.matches(&parent.metadata.labels))
}

/// The children of `parent` a guest is handed, out of `candidates` (the objects of the
/// declared child kinds, kind by kind in the spec's order): those with a controller
/// ownerReference naming the parent's uid, in the parent's namespace (none, for a
/// cluster-scoped parent), sorted by name (for one name, in the order of the kinds). An object
/// that names the parent's kind and name with another uid (an earlier object of that name), or
/// owns it without being its controller, is not a child.
pub fn children_of(
    parent: &Cached,
    candidates: impl IntoIterator<Item = Arc<Cached>>,
) -> Vec<Arc<Cached>> {
    let Some(uid) = parent.metadata.uid.as_deref() else {
        return Vec::new();
    };
    let mut found: Vec<Arc<Cached>> = candidates
        .into_iter()
        .filter(|child| {
            let controlled = (child.metadata.owner_references.as_deref())
                .unwrap_or_default()
                .iter()
                .any(|o| o.controller == Some(true) && o.uid == uid);
            controlled && child.metadata.namespace == parent.metadata.namespace
        })
        .collect();
    found.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    found
}

/// What comes before a call, by where a parent stands with the controller's finalizer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finalize {
    /// The controller asks for its finalizer and the parent lacks it: add it first (the
    /// guest is called once the watch brings the parent back).
    AddFirst,
    /// The controller no longer asks for it and the parent carries it: remove it first.
    RemoveFirst,
    /// Call the guest; `true` when the parent is being deleted and waits for its clean-up.
    Call(bool),
}

/// Where `parent` stands with `finalizer` (`None`: the controller's name makes none) when
/// the controller's `spec.finalize` is `finalize`.
pub fn finalize_step(finalizer: Option<&Finalizer>, finalize: bool, parent: &Value) -> Finalize {
    let Some(finalizer) = finalizer else {
        return Finalize::Call(false);
    };
    match (finalizer.phase(parent), finalize) {
        (Phase::Missing, true) => Finalize::AddFirst,
        (Phase::Held | Phase::Finalizing, false) => Finalize::RemoveFirst,
        (Phase::Finalizing, true) => Finalize::Call(true),
        _ => Finalize::Call(false),
    }
}

/// The documents of a request, each as the cache holds it (shared with the caches live).
#[derive(Debug, Clone, Default)]
pub struct Documents {
    /// The parent's text (`None`: gone).
    pub parent: Option<Arc<str>>,
    /// The children's texts, in [`children_of`]'s order.
    pub children: Vec<Arc<str>>,
    /// The parent as last reconciled.
    pub previous: Option<Arc<str>>,
    /// The state the guest saved for the object.
    pub state: Option<String>,
}

impl Documents {
    /// The documents of `parent` (`None`: gone) and its children as [`children_of`] found
    /// them.
    pub fn of(parent: Option<&Cached>, children: &[Arc<Cached>]) -> Documents {
        Documents {
            parent: parent.map(|p| p.text().clone()),
            children: children.iter().map(|c| c.text().clone()).collect(),
            previous: None,
            state: None,
        }
    }

    /// The request the guest is handed (each document copied once, for the call).
    pub fn request(&self, controller: &str, target: &ObjectRef, finalizing: bool) -> WireRequest {
        WireRequest {
            controller: controller.to_owned(),
            target: target.clone(),
            parent: self.parent.as_deref().map(str::to_owned),
            children: self.children.iter().map(|t| t.to_string()).collect(),
            previous: self.previous.as_deref().map(str::to_owned),
            state: self.state.clone(),
            finalizing,
        }
    }
}

#[cfg(test)]
mod tests {
    use kube::core::{ApiResource, GroupVersionKind};
    use serde_json::json;

    use super::*;

    fn cached(value: Value) -> Arc<Cached> {
        let resource = ApiResource::from_gvk(&GroupVersionKind::gvk("", "v1", "ConfigMap"));
        Arc::new(Cached::new(value, &resource))
    }

    fn owned(name: &str, ns: &str, uid: &str, controller: Option<bool>) -> Arc<Cached> {
        cached(
            json!({"metadata": {"name": name, "namespace": ns, "ownerReferences": [
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "p", "uid": uid, "controller": controller}]}}),
        )
    }

    #[test]
    fn children_are_controlled_by_the_parents_uid_in_its_namespace_sorted_by_name() {
        let parent = cached(json!({"metadata": {"name": "p", "namespace": "a", "uid": "u1"}}));
        let candidates = vec![
            owned("z", "a", "u1", Some(true)),
            owned("b", "a", "u1", Some(true)),
            // Owned, not controlled.
            owned("c", "a", "u1", None),
            owned("d", "a", "u1", Some(false)),
            // The parent's kind and name, another uid: an earlier object named p.
            owned("e", "a", "u0", Some(true)),
            // Its uid, another namespace.
            owned("f", "b", "u1", Some(true)),
        ];
        let names: Vec<_> = children_of(&parent, candidates)
            .iter()
            .map(|c| c.metadata.name.clone().unwrap_or_default())
            .collect();
        assert_eq!(names, ["b", "z"]);
        let no_uid = cached(json!({"metadata": {"name": "p", "namespace": "a"}}));
        assert!(children_of(&no_uid, [owned("b", "a", "u1", Some(true))]).is_empty());
    }

    #[test]
    fn a_parent_is_selected_by_its_labels() {
        let parent = cached(json!({"metadata": {"name": "p", "labels": {"app": "x"}}}));
        let unlabelled = cached(json!({"metadata": {"name": "q"}}));
        let selector = Selector::parse("app=x").unwrap_or_else(|e| panic!("{e}"));
        assert!(selected(None, &unlabelled));
        assert!(selected(Some(&selector), &parent));
        assert!(!selected(Some(&selector), &unlabelled));
    }

    #[test]
    fn the_finalizer_decides_what_comes_before_the_call() {
        let finalizer = Finalizer::for_controller(true, "c").unwrap_or_else(|e| panic!("{e}"));
        let with = json!({"metadata": {"finalizers": [finalizer.name()]}});
        let deleting = json!({"metadata": {"finalizers": [finalizer.name()],
            "deletionTimestamp": "2026-01-01T00:00:00Z"}});
        let without = json!({"metadata": {}});
        let step = |parent: &Value, finalize| finalize_step(Some(&finalizer), finalize, parent);
        assert_eq!(step(&without, true), Finalize::AddFirst);
        assert_eq!(step(&with, true), Finalize::Call(false));
        assert_eq!(step(&deleting, true), Finalize::Call(true));
        assert_eq!(step(&with, false), Finalize::RemoveFirst);
        assert_eq!(step(&deleting, false), Finalize::RemoveFirst);
        assert_eq!(step(&without, false), Finalize::Call(false));
        assert_eq!(finalize_step(None, true, &with), Finalize::Call(false));
    }
}
