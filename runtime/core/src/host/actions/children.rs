//! Owned children: drift detection, the three update strategies, and garbage collection of
//! children a response no longer asks for.
//!
//! **Drift** is a change of what the guest asks for, not a difference from what the API
//! server stores: every child is applied with an annotation holding the sha256 of the desired
//! object (with its namespace and owner reference), and an observed child whose annotation
//! matches is up to date. Comparing with the stored object instead would see drift in every
//! field the server fills in or normalises (admission-added tolerations, `cpu: 0.5` stored as
//! `500m`, defaulted fields), and recreate a `Recreate` child on every reconcile. This is
//! Metacontroller's rule too (it keeps the last applied configuration in an annotation), and
//! costs no API call; a server-side-apply dry run would cost one per child per reconcile.
//! What it does not see is a child edited by someone else: that is put right when the
//! desired object next changes (`InPlace` re-applies then, `Recreate` replaces it).

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

use crate::api::{UpdateStrategy, Verb};
use crate::controller::{Cached, ObjectKey, Watch};
use crate::sandbox::ObjectRef;

use super::{ActionError, ChildKind, DesiredChildren, Executor, Outcome, str_at};

/// Where the executor looks up an object of a child kind that this parent does not control.
pub trait ExistingChildren: Send + Sync {
    /// The object of `kind` named as `r` says, as cached (`None`: not seen).
    fn existing(&self, kind: &ChildKind, r: &ObjectRef) -> Option<Arc<Cached>>;
}

impl ExistingChildren for Vec<(ChildKind, Arc<Watch>)> {
    fn existing(&self, kind: &ChildKind, r: &ObjectRef) -> Option<Arc<Cached>> {
        let (_, watch) = self
            .iter()
            .find(|(c, _)| c.kind.resource == kind.kind.resource)?;
        watch.get(&ObjectKey {
            namespace: r.namespace.clone(),
            name: r.name.clone(),
        })
    }
}

/// No cache: every name is free (offline runs, unit tests).
pub struct NoExistingChildren;

impl ExistingChildren for NoExistingChildren {
    fn existing(&self, _: &ChildKind, _: &ObjectRef) -> Option<Arc<Cached>> {
        None
    }
}

/// Why an apply must not take over `existing`, an object of a child kind that the parent
/// (`parent_uid`) does not control: a guest never adopts. An object another controller holds
/// would get a second controller reference (or be taken from its owner); an object nobody
/// owns may be anything — a team's hand-made ConfigMap, the controller's own module — and
/// owning it means deleting it with the parent. Kubernetes' own controllers adopt orphans by
/// label selector; a sandboxed tenant gets no such reach.
fn held_elsewhere(existing: &Cached, parent_uid: &str, r: &ObjectRef) -> Option<String> {
    let owners = existing
        .metadata
        .owner_references
        .as_deref()
        .unwrap_or_default();
    match owners.iter().find(|o| o.controller == Some(true)) {
        Some(o) if o.uid == parent_uid => None,
        Some(o) => Some(format!(
            "{r} exists and is controlled by {} {} (uid {}), not by this parent: not taken over; give the child another name (or, if that owner is being deleted, this is retried)",
            o.kind, o.name, o.uid
        )),
        None => Some(format!(
            "{r} exists and no controller owns it (made by hand, by another tool, or a module ConfigMap): a controller does not adopt it; give the child another name, or delete the object so that the controller creates its own"
        )),
    }
}

/// The annotation on every child holding the sha256 of the object its controller last asked
/// for.
pub const DESIRED_ANNOTATION: &str = "kubewasm.dev/desired-sha256";

/// [`DESIRED_ANNOTATION`] as a JSON pointer into an object.
const DESIRED_POINTER: &str = "/metadata/annotations/kubewasm.dev~1desired-sha256";

impl Executor<'_> {
    /// Applies an owned child unless it is up to date; a changed one is updated as its kind's
    /// strategy says.
    pub(super) async fn apply_child(
        &self,
        child: &ChildKind,
        r: &ObjectRef,
        mut object: Value,
        desired: &mut DesiredChildren,
        outcome: &mut Outcome,
    ) -> Result<(), ActionError> {
        let Some(parent) = self.parent else {
            return Ok(());
        };
        desired.insert((r.api_version.clone(), r.kind.clone(), r.name.clone()));
        let digest = as_child(&mut object, parent, self.target)?;
        let observed = self.children.iter().find(|c| {
            str_at(c, "/kind") == Some(r.kind.as_str())
                && str_at(c, "/metadata/name") == Some(r.name.as_str())
        });
        if observed.is_none()
            && let Some(existing) = self.existing.existing(child, r)
            && let Some(why) = held_elsewhere(
                &existing,
                str_at(parent, "/metadata/uid").unwrap_or_default(),
                r,
            )
        {
            return Err(ActionError::Invalid(why));
        }
        if let Some(observed) = observed {
            if observed.pointer("/metadata/deletionTimestamp").is_some() {
                outcome.requeue_after = Some(Duration::from_secs(2));
                return Ok(());
            }
            if str_at(observed, DESIRED_POINTER) == Some(digest.as_str()) {
                return Ok(());
            }
            match child.strategy {
                UpdateStrategy::OnDelete => return Ok(()),
                UpdateStrategy::Recreate => {
                    let namespace = r.namespace.as_deref();
                    let gone = self
                        .delete_object(&child.kind, namespace, observed, outcome)
                        .await?;
                    if !gone {
                        outcome.requeue_after = Some(Duration::from_secs(2));
                        return Ok(());
                    }
                }
                UpdateStrategy::InPlace => {}
            }
        }
        self.server_side_apply(&child.kind, r, &object, outcome)
            .await?;
        outcome.wrote_child = true;
        Ok(())
    }

    /// Deletes every observed child that the actions did not apply.
    pub(super) async fn delete_undesired_children(
        &self,
        desired: &DesiredChildren,
        outcome: &mut Outcome,
    ) -> Result<(), ActionError> {
        for observed in self.children {
            let (Some(api_version), Some(kind), Some(name)) = (
                str_at(observed, "/apiVersion"),
                str_at(observed, "/kind"),
                str_at(observed, "/metadata/name"),
            ) else {
                continue;
            };
            if desired.contains(&(api_version.to_owned(), kind.to_owned(), name.to_owned()))
                || observed.pointer("/metadata/deletionTimestamp").is_some()
            {
                continue;
            }
            let Some(child) = self.child_kind(api_version, kind) else {
                continue;
            };
            let namespace = str_at(observed, "/metadata/namespace");
            self.permissions
                .check(Verb::Delete, api_version, kind, namespace)?;
            self.delete_object(&child.kind, namespace, observed, outcome)
                .await?;
        }
        Ok(())
    }
}

/// A declared child as the runtime applies it: the parent's controller ownerReference, then
/// [`DESIRED_ANNOTATION`]; returns the digest. (`kubewasm reconcile --controller` shows the
/// same.)
pub fn as_child(
    object: &mut Value,
    parent: &Value,
    target: &ObjectRef,
) -> Result<String, ActionError> {
    add_owner(object, parent, target);
    mark_desired(object)
}

/// Adds [`DESIRED_ANNOTATION`] with the sha256 of `object` as it is now, and returns it.
/// Refuses (rather than panics on) an object whose `metadata.annotations` is not a map.
fn mark_desired(object: &mut Value) -> Result<String, ActionError> {
    let digest = format!("{:x}", Sha256::digest(object.to_string().as_bytes()));
    let meta = &mut object["metadata"];
    match meta.get_mut("annotations") {
        None | Some(Value::Null) => meta["annotations"] = json!({ DESIRED_ANNOTATION: digest }),
        Some(Value::Object(annotations)) => {
            annotations.insert(DESIRED_ANNOTATION.to_owned(), json!(digest));
        }
        Some(other) => {
            return Err(ActionError::Invalid(format!(
                "metadata.annotations must be a map of strings, got `{}`",
                crate::sandbox::bounded(&other.to_string(), 60)
            )));
        }
    }
    Ok(digest)
}

fn add_owner(object: &mut Value, parent: &Value, target: &ObjectRef) {
    let owner = json!({
        "apiVersion": target.api_version,
        "kind": target.kind,
        "name": target.name,
        "uid": str_at(parent, "/metadata/uid").unwrap_or_default(),
        "controller": true,
        "blockOwnerDeletion": true,
    });
    let meta = &mut object["metadata"];
    match meta
        .get_mut("ownerReferences")
        .and_then(Value::as_array_mut)
    {
        Some(refs) => {
            refs.retain(|r| r.get("controller") != Some(&json!(true)));
            refs.push(owner);
        }
        None => meta["ownerReferences"] = json!([owner]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_reference_is_the_controller_one() {
        let mut child = json!({"metadata": {"name": "c"}});
        let parent = json!({"metadata": {"uid": "u-1"}});
        let target = ObjectRef::new("example.com/v1", "HelloWorld", None, "p");
        add_owner(&mut child, &parent, &target);
        assert_eq!(child["metadata"]["ownerReferences"][0]["uid"], "u-1");
        assert_eq!(child["metadata"]["ownerReferences"][0]["controller"], true);
    }

    #[test]
    fn the_desired_digest_follows_the_desired_object_only() {
        let pod = |cpu: &str| {
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"a": "b"}},
                "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]}})
        };
        let (mut first, mut again, mut changed) = (pod("0.5"), pod("0.5"), pod("1"));
        let digest = mark_desired(&mut first).unwrap();
        assert_eq!(mark_desired(&mut again).unwrap(), digest);
        assert_ne!(mark_desired(&mut changed).unwrap(), digest);
        assert_eq!(str_at(&first, DESIRED_POINTER), Some(digest.as_str()));
        assert_eq!(first["metadata"]["labels"]["a"], "b");
        // What the server stores (normalised quantity, added fields) has the same mark.
        let mut stored = first.clone();
        stored["spec"]["containers"][0]["resources"]["requests"]["cpu"] = json!("500m");
        stored["spec"]["tolerations"] = json!([{"key": "node.kubernetes.io/not-ready"}]);
        assert_eq!(str_at(&stored, DESIRED_POINTER), Some(digest.as_str()));
    }

    #[test]
    fn a_child_name_held_by_another_owner_or_by_nobody_is_not_taken_over() {
        let r = ObjectRef::new("v1", "ConfigMap", Some("ns"), "stamp");
        let object = |owners: Value| -> Cached {
            serde_json::from_value(json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "stamp", "namespace": "ns", "ownerReferences": owners}}))
            .unwrap()
        };
        let owner = |uid: &str, controller: bool| {
            json!({"apiVersion": "example.com/v1", "kind": "Stamp", "name": "other",
                "uid": uid, "controller": controller})
        };
        assert_eq!(
            held_elsewhere(&object(json!([owner("u-1", true)])), "u-1", &r),
            None
        );
        let other = held_elsewhere(&object(json!([owner("u-2", true)])), "u-1", &r).unwrap();
        assert!(
            other.contains("controlled by Stamp other (uid u-2)"),
            "{other}"
        );
        // Owned, but not controlled (a plain ownerReference): still nobody's to adopt.
        let orphan = held_elsewhere(&object(json!([owner("u-1", false)])), "u-1", &r).unwrap();
        assert!(
            orphan.contains("ConfigMap ns/stamp exists and no controller owns it"),
            "{orphan}"
        );
        let module = held_elsewhere(&object(json!(null)), "u-1", &r).unwrap();
        assert!(module.contains("module ConfigMap"), "{module}");
    }

    #[test]
    fn annotations_that_are_not_a_map_are_refused() {
        let mut odd = json!({"metadata": {"name": "p", "annotations": "x"}});
        let err = mark_desired(&mut odd).unwrap_err().to_string();
        assert!(err.contains("metadata.annotations must be a map"), "{err}");
    }
}
