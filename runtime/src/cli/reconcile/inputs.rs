//! What `kubewasm reconcile` hands the guest, by the runtime's own rules
//! ([`kubewasm::host::request`]): the objects of the files as the runtime's cache would hold
//! them, which of them are the parent's children, whether the parent is reconciled at all and
//! whether it is finalizing.

use std::sync::Arc;

use anyhow::Context;
use kube::core::{ApiResource, GroupVersionKind};
use kubewasm::api::ControllerPlan;
use kubewasm::controller::Cached;
use kubewasm::host::Finalizer;
use kubewasm::host::request::{self, Finalize};
use serde_json::Value;

use super::Declared;

/// The object as the runtime's cache holds it (typed by its own `apiVersion` and `kind`).
pub(super) fn as_cached(object: &Value) -> Cached {
    let text = |field: &str| {
        object
            .get(field)
            .and_then(Value::as_str)
            .unwrap_or_default()
    };
    let (group, version) = match text("apiVersion").split_once('/') {
        Some((group, version)) => (group, version),
        None => ("", text("apiVersion")),
    };
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, text("kind")));
    Cached::new(object.clone(), &resource)
}

/// The objects of `state` that may be the parent's children: those of the declared child
/// kinds, kind by kind in the spec's order (all of them without a declaration); the runtime's
/// rule ([`request::children_of`]) picks the children among them.
pub(super) fn candidates(state: &[Value], plan: Option<&ControllerPlan>) -> Vec<Arc<Cached>> {
    let of_kind = |api_version: &str, kind: &str| {
        state
            .iter()
            .filter(|o| {
                o.get("apiVersion").and_then(Value::as_str) == Some(api_version)
                    && o.get("kind").and_then(Value::as_str) == Some(kind)
            })
            .map(|o| Arc::new(as_cached(o)))
            .collect::<Vec<_>>()
    };
    match plan {
        None => state.iter().map(|o| Arc::new(as_cached(o))).collect(),
        Some(plan) => (plan.children.iter())
            .flat_map(|(c, _)| of_kind(&c.api_version, &c.kind))
            .collect(),
    }
}

/// What to say of each candidate that names the parent in an ownerReference but is not one
/// of its children by the runtime's rule: a fixture written by hand often lacks the uid.
pub(super) fn not_children(
    parent: &Cached,
    candidates: &[Arc<Cached>],
    children: &[Arc<Cached>],
) -> Vec<String> {
    let name = parent.metadata.name.as_deref();
    candidates
        .iter()
        .filter(|c| !children.iter().any(|child| Arc::ptr_eq(child, c)))
        .filter(|c| {
            (c.metadata.owner_references.as_deref().unwrap_or_default())
                .iter()
                .any(|o| Some(o.name.as_str()) == name || Some(&o.uid) == parent.metadata.uid.as_ref())
        })
        .map(|c| {
            format!(
                "note: {} names the parent in an ownerReference but is not handed to the guest as a child: the runtime hands only objects of the parent's namespace whose ownerReference has `controller: true` and the parent's metadata.uid{}",
                c.key(),
                if parent.metadata.uid.is_none() { " (the parent has no metadata.uid: give it one, and the child's ownerReference the same)" } else { "" }
            )
        })
        .collect()
}

/// Whether the guest is handed the parent as finalizing, as the runtime decides it; said when
/// the runtime would first add or remove its finalizer (offline, nothing is written: the
/// guest is called as the runtime calls it once that is done).
pub(super) fn finalizing(
    declared: &Declared,
    plan: Option<&ControllerPlan>,
    parent: &Value,
) -> bool {
    let Some(plan) = plan else {
        return false;
    };
    let name = declared.name.rsplit('/').next().unwrap_or_default();
    let finalizer = Finalizer::for_controller(declared.namespace.is_some(), name).ok();
    match request::finalize_step(finalizer.as_ref(), plan.finalize, parent) {
        Finalize::Call(finalizing) => finalizing,
        step => {
            let what = match step {
                Finalize::AddFirst => "adds its finalizer to the parent",
                _ => "removes its finalizer from the parent",
            };
            eprintln!("the runtime first {what} (spec.finalize), then calls the guest as here");
            false
        }
    }
}

/// Why the runtime would not call the guest for `parent` at all: another kind than the
/// spec's parent, or not matching `spec.parent.labelSelector`.
pub(super) fn not_reconciled(
    parent: &Value,
    cached: &Cached,
    plan: &ControllerPlan,
) -> anyhow::Result<Option<String>> {
    let (api_version, kind) = (
        parent
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or_default(),
        parent
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or_default(),
    );
    if api_version != plan.parent.api_version || kind != plan.parent.kind {
        return Ok(Some(format!(
            "it is a {kind} ({api_version}); the controller's parent is {} ({})",
            plan.parent.kind, plan.parent.api_version
        )));
    }
    let Some(parsed) = &plan.selector else {
        return Ok(None);
    };
    if let Some(labels) = parent.pointer("/metadata/labels") {
        serde_json::from_value::<std::collections::BTreeMap<String, String>>(labels.clone())
            .context("the object's metadata.labels is not a map of strings")?;
    }
    Ok((!request::selected(Some(parsed), cached))
        .then(|| format!("its labels do not match spec.parent.labelSelector `{parsed}`")))
}
