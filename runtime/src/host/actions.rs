//! Carrying out a guest's actions against the API server, as the controller's ServiceAccount.
//!
//! Every action is checked against the declaration first ([`Permissions`]); Kubernetes RBAC
//! for the impersonated ServiceAccount is the final judge.

use std::collections::HashSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event as CoreEvent, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{
    DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams, Preconditions,
};
use kube::{Api, Client};
use kubewasm_guest_sdk::query;
use kubewasm_guest_sdk::selector::Selector;
use serde_json::{Value, json};

use crate::api::{UpdateStrategy, Verb};
use crate::controller::{Fence, Kind, TokenBucket};
use crate::sandbox::{Action, EventType, ObjectRef};

use super::grants::{Denied, Permissions};
use super::kinds::DeclaredKinds;

/// An action that could not be carried out.
#[derive(Debug, thiserror::Error)]
pub enum ActionError {
    /// The declaration does not allow it.
    #[error(transparent)]
    Denied(#[from] Denied),
    /// The API server refused or failed.
    #[error("{what} failed: {}", api_message(.source))]
    Api {
        /// The action, in words.
        what: String,
        /// The API error (RBAC refusals show up here as 403).
        #[source]
        source: kube::Error,
    },
    /// The guest asked for something malformed.
    #[error("{0}")]
    Invalid(String),
}

/// The API server's own words for an error (`403 Forbidden: pods "x" is forbidden: ...`),
/// without the debug dump kube's `Display` adds.
pub fn api_message(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(s) => format!("{} {}: {}", s.code, s.reason, s.message),
        other => other.to_string(),
    }
}

/// A child kind the controller owns.
#[derive(Debug, Clone)]
pub struct ChildKind {
    /// How to reach it.
    pub kind: Kind,
    /// What to do when an existing child differs.
    pub strategy: UpdateStrategy,
}

/// Everything needed to carry out one reconcile's actions.
pub struct Executor<'a> {
    /// Client acting as the controller's ServiceAccount.
    pub client: Client,
    /// The kinds the controller declared, resolved when it started.
    pub kinds: &'a DeclaredKinds,
    /// The controller's API write budget: every write (and a delete-by-selector's list) takes
    /// a token, waiting when there is none.
    pub budget: &'a TokenBucket,
    /// Closed once this process may no longer act: no write is sent after that.
    pub fence: &'a Fence,
    /// What the controller may do.
    pub permissions: &'a Permissions,
    /// Field manager for server-side apply (one per controller).
    pub field_manager: String,
    /// The parent's kind.
    pub parent_kind: &'a Kind,
    /// The parent as observed, `None` when gone.
    pub parent: Option<&'a Value>,
    /// The parent's reference.
    pub target: &'a ObjectRef,
    /// Declared child kinds.
    pub child_kinds: &'a [ChildKind],
    /// Children observed for this parent.
    pub children: &'a [Value],
}

/// What carrying out the actions did, for logs and requeueing.
#[derive(Debug, Default)]
pub struct Outcome {
    /// One line per change made.
    pub changes: Vec<String>,
    /// Ask to look again soon (e.g. a child is still being deleted).
    pub requeue_after: Option<Duration>,
}

fn str_at<'v>(v: &'v Value, ptr: &str) -> Option<&'v str> {
    v.pointer(ptr).and_then(Value::as_str)
}

/// Whether every field set in `desired` has the same value in `observed` (the API server
/// adds defaults, so equality would never hold).
pub fn is_subset(desired: &Value, observed: &Value) -> bool {
    match (desired, observed) {
        (Value::Object(d), Value::Object(o)) => d
            .iter()
            .all(|(k, dv)| o.get(k).is_some_and(|ov| is_subset(dv, ov)) || dv.is_null()),
        (Value::Array(d), Value::Array(o)) => {
            d.len() == o.len() && d.iter().zip(o).all(|(a, b)| is_subset(a, b))
        }
        (d, o) => d == o,
    }
}

impl Executor<'_> {
    /// Carries out the actions in order, then deletes owned children no longer desired.
    pub async fn execute(&self, actions: &[Action]) -> Result<Outcome, ActionError> {
        let mut outcome = Outcome::default();
        let mut desired_children: HashSet<(String, String, String)> = HashSet::new();
        for action in actions {
            match action {
                Action::Apply(object) => {
                    self.apply(object, &mut desired_children, &mut outcome)
                        .await?
                }
                Action::Delete(r) => self.delete_one(r, &mut outcome).await?,
                Action::DeleteAllOf {
                    api_version,
                    kind,
                    namespace,
                    label_selector,
                } => {
                    let r = ObjectRef {
                        api_version: api_version.clone(),
                        kind: kind.clone(),
                        namespace: namespace.clone(),
                        name: String::new(),
                    };
                    self.delete_matching(&r, label_selector, &mut outcome)
                        .await?
                }
                Action::SetStatus(status) => self.set_status(status, &mut outcome).await?,
                Action::Event {
                    event_type,
                    reason,
                    message,
                } => {
                    self.record_event(*event_type, reason, message, &mut outcome)
                        .await?
                }
                Action::RequeueAfter(_) => {}
            }
        }
        if self.parent.is_some() {
            self.delete_undesired_children(&desired_children, &mut outcome)
                .await?;
        }
        Ok(outcome)
    }

    /// Waits for the write budget, then checks that this process may still act.
    async fn may_write(&self) -> Result<(), ActionError> {
        self.budget.take().await;
        if self.fence.is_open() {
            Ok(())
        } else {
            Err(ActionError::Invalid(
                "not sent: this runtime lost its leader Lease".into(),
            ))
        }
    }

    /// The declared kind of an action, with the namespace it acts in (checked, not yet
    /// authorized). An undeclared kind is refused here, before discovery or any API call.
    fn resolve(&self, verb: Verb, r: &ObjectRef) -> Result<(&Kind, Option<String>), ActionError> {
        let Some(kind) = self.kinds.get(&r.api_version, &r.kind) else {
            let namespace = r.namespace.as_deref().or(self.target.namespace.as_deref());
            self.permissions
                .check(verb, &r.api_version, &r.kind, namespace)?;
            return Err(ActionError::Invalid(format!(
                "{} ({}) was not declared in spec.parent, spec.children or spec.grants",
                r.kind, r.api_version
            )));
        };
        if !kind.namespaced
            && let Some(ns) = &r.namespace
        {
            return Err(ActionError::Invalid(format!(
                "{} ({}) is cluster-scoped: leave out the namespace (got `{ns}`)",
                r.kind, r.api_version
            )));
        }
        let namespace = self.namespace_for(kind, r.namespace.as_deref());
        if let Some(ns) = &namespace {
            query::validate_namespace(ns).map_err(|e| ActionError::Invalid(e.to_string()))?;
        }
        if !r.name.is_empty() {
            query::validate_name(&r.name).map_err(|e| ActionError::Invalid(e.to_string()))?;
        }
        Ok((kind, namespace))
    }

    fn namespace_for(&self, kind: &Kind, asked: Option<&str>) -> Option<String> {
        if !kind.namespaced {
            return None;
        }
        asked
            .or(self.target.namespace.as_deref())
            .map(str::to_owned)
    }

    fn child_kind(&self, api_version: &str, kind: &str) -> Option<&ChildKind> {
        self.child_kinds
            .iter()
            .find(|c| c.kind.resource.api_version == api_version && c.kind.resource.kind == kind)
    }

    fn is_parent(&self, r: &ObjectRef) -> bool {
        r.api_version == self.target.api_version
            && r.kind == self.target.kind
            && r.name == self.target.name
            && (r.namespace.is_none() || r.namespace == self.target.namespace)
    }

    async fn apply(
        &self,
        object: &Value,
        desired_children: &mut HashSet<(String, String, String)>,
        outcome: &mut Outcome,
    ) -> Result<(), ActionError> {
        let r = ObjectRef::of(object).map_err(|e| ActionError::Invalid(e.message))?;
        query::validate_name(&r.name).map_err(|e| ActionError::Invalid(e.to_string()))?;
        let (kind, namespace) = self.resolve(Verb::Apply, &r)?;
        self.permissions
            .check(Verb::Apply, &r.api_version, &r.kind, namespace.as_deref())?;
        let mut object = object.clone();
        if let Some(ns) = &namespace {
            object["metadata"]["namespace"] = json!(ns);
        }
        let child = if self.is_parent(&r) {
            None
        } else {
            self.child_kind(&r.api_version, &r.kind)
        };
        if let Some(child) = child {
            let Some(parent) = self.parent else {
                return Ok(());
            };
            desired_children.insert((r.api_version.clone(), r.kind.clone(), r.name.clone()));
            add_owner(&mut object, parent, self.target);
            let observed = self.children.iter().find(|c| {
                str_at(c, "/kind") == Some(r.kind.as_str())
                    && str_at(c, "/metadata/name") == Some(r.name.as_str())
            });
            if let Some(observed) = observed {
                if observed.pointer("/metadata/deletionTimestamp").is_some() {
                    outcome.requeue_after = Some(Duration::from_secs(2));
                    return Ok(());
                }
                if is_subset(&object, observed) {
                    return Ok(());
                }
                match child.strategy {
                    UpdateStrategy::OnDelete => return Ok(()),
                    UpdateStrategy::Recreate => {
                        let gone = self
                            .delete_object(kind, namespace.as_deref(), observed, outcome)
                            .await?;
                        if !gone {
                            outcome.requeue_after = Some(Duration::from_secs(2));
                            return Ok(());
                        }
                    }
                    UpdateStrategy::InPlace => {}
                }
            }
        } else if self.is_parent(&r)
            && let Some(parent) = self.parent
            && is_subset(&object, parent)
        {
            return Ok(());
        }
        let api = kind.api(self.client.clone(), namespace.as_deref());
        let params = PatchParams::apply(&self.field_manager).force();
        self.may_write().await?;
        api.patch(&r.name, &params, &Patch::Apply(&object))
            .await
            .map_err(|source| ActionError::Api {
                what: format!(
                    "apply {}",
                    ObjectRef {
                        namespace: namespace.clone(),
                        ..r.clone()
                    }
                ),
                source,
            })?;
        outcome
            .changes
            .push(format!("applied {}", ObjectRef { namespace, ..r }));
        Ok(())
    }

    /// Deletes one observed object (uid-guarded). `Ok(true)` when it is gone now.
    async fn delete_object(
        &self,
        kind: &Kind,
        namespace: Option<&str>,
        observed: &Value,
        outcome: &mut Outcome,
    ) -> Result<bool, ActionError> {
        let name = str_at(observed, "/metadata/name").unwrap_or_default();
        let api = kind.api(self.client.clone(), namespace);
        let params = DeleteParams {
            preconditions: str_at(observed, "/metadata/uid").map(|uid| Preconditions {
                uid: Some(uid.to_owned()),
                resource_version: None,
            }),
            ..DeleteParams::background()
        };
        let what = format!(
            "{} {}/{}",
            kind.resource.kind,
            namespace.unwrap_or("-"),
            name
        );
        self.may_write().await?;
        match api.delete(name, &params).await {
            Ok(either) => {
                outcome.changes.push(format!("deleted {what}"));
                Ok(either.is_right())
            }
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(true),
            Err(source) => Err(ActionError::Api {
                what: format!("delete {what}"),
                source,
            }),
        }
    }

    async fn delete_one(&self, r: &ObjectRef, outcome: &mut Outcome) -> Result<(), ActionError> {
        query::validate_name(&r.name).map_err(|e| ActionError::Invalid(e.to_string()))?;
        let (kind, namespace) = self.resolve(Verb::Delete, r)?;
        self.permissions
            .check(Verb::Delete, &r.api_version, &r.kind, namespace.as_deref())?;
        let api = kind.api(self.client.clone(), namespace.as_deref());
        let what = ObjectRef {
            namespace,
            ..r.clone()
        };
        self.may_write().await?;
        match api.delete(&r.name, &DeleteParams::background()).await {
            Ok(_) => outcome.changes.push(format!("deleted {what}")),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(source) => {
                return Err(ActionError::Api {
                    what: format!("delete {what}"),
                    source,
                });
            }
        }
        Ok(())
    }

    async fn delete_matching(
        &self,
        r: &ObjectRef,
        selector: &str,
        outcome: &mut Outcome,
    ) -> Result<(), ActionError> {
        Selector::parse(selector).map_err(|e| {
            ActionError::Invalid(format!("invalid label selector `{selector}`: {e}"))
        })?;
        let (kind, namespace) = self.resolve(Verb::Delete, r)?;
        self.permissions
            .check(Verb::Delete, &r.api_version, &r.kind, namespace.as_deref())?;
        let api: Api<DynamicObject> = kind.api(self.client.clone(), namespace.as_deref());
        self.may_write().await?;
        let found = api
            .list(&ListParams::default().labels(selector))
            .await
            .map_err(|source| ActionError::Api {
                what: format!("list {} matching `{selector}`", r.kind),
                source,
            })?;
        for object in found.items {
            let value = serde_json::to_value(&object).unwrap_or(Value::Null);
            self.delete_object(kind, namespace.as_deref(), &value, outcome)
                .await?;
        }
        Ok(())
    }

    async fn set_status(&self, status: &Value, outcome: &mut Outcome) -> Result<(), ActionError> {
        let Some(parent) = self.parent else {
            return Ok(());
        };
        if parent.get("status") == Some(status) {
            return Ok(());
        }
        let api = self
            .parent_kind
            .api(self.client.clone(), self.target.namespace.as_deref());
        let body = json!({
            "apiVersion": self.target.api_version,
            "kind": self.target.kind,
            "metadata": {"name": self.target.name},
            "status": status,
        });
        // With a status subresource, status is written there (server-side apply, so fields
        // the guest stops setting go away); without one it is part of the object itself.
        self.may_write().await?;
        let result = if self.parent_kind.has_status {
            let params = PatchParams::apply(&self.field_manager).force();
            api.patch_status(&self.target.name, &params, &Patch::Apply(&body))
                .await
        } else {
            let merge = json!({"status": status});
            api.patch(
                &self.target.name,
                &PatchParams::default(),
                &Patch::Merge(&merge),
            )
            .await
        };
        result.map_err(|source| ActionError::Api {
            what: format!("set status of {}", self.target),
            source,
        })?;
        outcome
            .changes
            .push(format!("set status of {}", self.target));
        Ok(())
    }

    async fn record_event(
        &self,
        event_type: EventType,
        reason: &str,
        message: &str,
        outcome: &mut Outcome,
    ) -> Result<(), ActionError> {
        let Some(parent) = self.parent else {
            return Ok(());
        };
        let namespace = self
            .target
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let core = CoreEvent {
            metadata: ObjectMeta {
                generate_name: Some(format!("{}.", self.target.name)),
                namespace: Some(namespace.clone()),
                ..ObjectMeta::default()
            },
            involved_object: ObjectReference {
                api_version: Some(self.target.api_version.clone()),
                kind: Some(self.target.kind.clone()),
                name: Some(self.target.name.clone()),
                namespace: self.target.namespace.clone(),
                uid: str_at(parent, "/metadata/uid").map(str::to_owned),
                ..ObjectReference::default()
            },
            reason: Some(reason.to_owned()),
            message: Some(message.to_owned()),
            type_: Some(match event_type {
                EventType::Normal => "Normal".into(),
                EventType::Warning => "Warning".into(),
            }),
            source: Some(k8s_openapi::api::core::v1::EventSource {
                component: Some(self.field_manager.clone()),
                host: None,
            }),
            first_timestamp: Some(now.clone()),
            last_timestamp: Some(now),
            count: Some(1),
            ..CoreEvent::default()
        };
        let api: Api<CoreEvent> = Api::namespaced(self.client.clone(), &namespace);
        self.may_write().await?;
        api.create(&PostParams::default(), &core)
            .await
            .map_err(|source| ActionError::Api {
                what: format!("record Event {reason} on {}", self.target),
                source,
            })?;
        outcome
            .changes
            .push(format!("recorded Event {reason} on {}", self.target));
        Ok(())
    }

    async fn delete_undesired_children(
        &self,
        desired: &HashSet<(String, String, String)>,
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
    fn subset_ignores_server_defaults_but_sees_changed_values() {
        let desired =
            json!({"spec": {"containers": [{"name": "hello", "command": ["echo", "Hello, A!"]}]}});
        let observed = json!({"spec": {"containers": [{"name": "hello", "command": ["echo", "Hello, A!"],
            "imagePullPolicy": "Always"}], "dnsPolicy": "ClusterFirst"}, "status": {}});
        assert!(is_subset(&desired, &observed));
        let changed =
            json!({"spec": {"containers": [{"name": "hello", "command": ["echo", "Hello, B!"]}]}});
        assert!(!is_subset(&changed, &observed));
    }

    #[test]
    fn owner_reference_is_the_controller_one() {
        let mut child = json!({"metadata": {"name": "c"}});
        let parent = json!({"metadata": {"uid": "u-1"}});
        let target = ObjectRef {
            api_version: "example.com/v1".into(),
            kind: "HelloWorld".into(),
            namespace: None,
            name: "p".into(),
        };
        add_owner(&mut child, &parent, &target);
        assert_eq!(child["metadata"]["ownerReferences"][0]["uid"], "u-1");
        assert_eq!(child["metadata"]["ownerReferences"][0]["controller"], true);
    }
}
