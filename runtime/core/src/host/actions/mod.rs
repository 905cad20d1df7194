//! Carrying out a guest's actions against the API server, as the controller's ServiceAccount.
//!
//! Every action is checked against the declaration first ([`Permissions`]); Kubernetes RBAC
//! for the impersonated ServiceAccount is the final judge. One file per concept:
//! - this one: the [`Executor`], the order of actions, what every write shares (declared
//!   kind, namespace, write budget and fence, uid-guarded delete);
//! - [`children`]: owned children, their drift detection and update strategies, and
//!   garbage collection of children no longer desired;
//! - [`parent`]: the parent applying itself and its status;
//! - [`objects`]: granted objects of other kinds (apply, delete, delete by selector);
//! - [`events`]: Events on the parent, repeated ones counted on one object.

mod children;
mod events;
mod objects;
mod parent;
#[cfg(test)]
mod tests;

pub use children::{DESIRED_ANNOTATION, ExistingChildren, NoExistingChildren, as_child};
pub use events::EventRecorder;
pub use parent::HeldStatuses;

use std::collections::HashSet;
use std::time::Duration;

use kube::Client;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kubewasm_guest_sdk::query;
use serde_json::{Value, json};

use crate::api::{UpdateStrategy, Verb};
use crate::controller::{Kind, WriteGate};
use crate::sandbox::{Action, ObjectRef};

use super::grants::{Denied, Permissions};
use super::kinds::DeclaredKinds;
use super::state::GuestState;

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
    /// A state could not be saved.
    #[error(transparent)]
    State(#[from] super::state::StateError),
}

impl ActionError {
    /// The reason a reconcile that failed with it shows.
    pub fn reason(&self) -> crate::api::Reason {
        match self {
            ActionError::State(e) => e.reason(),
            _ => crate::api::Reason::ActionFailed,
        }
    }
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
    /// The controller's write budget and fence: every write (and a delete-by-selector's list)
    /// takes a token, and none is sent once this process may no longer act.
    pub writes: &'a WriteGate,
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
    /// Objects of the child kinds as cached, whoever holds them: an apply of a name held by
    /// another owner, or by nobody, is refused rather than adopted ([`children`]).
    pub existing: &'a dyn ExistingChildren,
    /// The controller's Events, counted per object and reason.
    pub events: &'a EventRecorder,
    /// The controller's saved states (`setState`), and the target's key in them.
    pub state: (&'a std::sync::Arc<GuestState>, &'a str),
    /// The parents whose last status was held back ([`HeldStatuses`]).
    pub held: &'a HeldStatuses,
}

/// Owned children a response applied, as `(apiVersion, kind, name)`: every other observed
/// child is deleted after the actions.
type DesiredChildren = HashSet<(String, String, String)>;

/// What carrying out the actions did, for logs and requeueing.
#[derive(Debug, Default)]
pub struct Outcome {
    /// One line per change made.
    pub changes: Vec<String>,
    /// Ask to look again soon (e.g. a child is still being deleted).
    pub requeue_after: Option<Duration>,
    /// What was left undone without failing the reconcile (an Event the ServiceAccount may not
    /// create), for the log.
    pub skipped: Vec<String>,
    /// What the API server said when an Event was refused (403): the controller's status says
    /// its Events are not recorded, and how to allow them.
    pub events_refused: Option<String>,
    /// An Event was written: Events are allowed (again).
    pub events_recorded: bool,
    /// Kinds (`Kind (apiVersion)`) applied without an owner: granted, not declared children,
    /// so nothing collects them with the parent — said in the controller's status.
    pub unowned: Vec<String>,
    /// An owned child was created, replaced or updated: its watch event brings the parent
    /// back, and the guest sees the child as it is now.
    pub wrote_child: bool,
    /// An object was written (applied, its status set, deleted): a watch may bring this key
    /// back for it. Events and saved state are not objects anyone watches for it.
    pub wrote: bool,
    /// The resourceVersions those writes left, the latest [`MAX_WRITTEN_VERSIONS`]: a watch
    /// event carrying one of them is this controller's own doing, not a change of its inputs.
    pub written_versions: Vec<String>,
    /// The resourceVersion the last write of the parent (its status, or itself) left.
    pub parent_version: Option<String>,
}

/// Most resourceVersions an [`Outcome`] keeps of the objects it wrote besides the parent.
pub const MAX_WRITTEN_VERSIONS: usize = 16;

impl Outcome {
    /// An object was written (`change`, in words), leaving `version` if the API server said;
    /// `parent`: the object is the parent.
    fn written(&mut self, change: String, version: Option<String>, parent: bool) {
        self.changes.push(change);
        self.wrote = true;
        match version {
            Some(v) if parent => self.parent_version = Some(v),
            Some(v) => {
                if self.written_versions.len() >= MAX_WRITTEN_VERSIONS {
                    self.written_versions.remove(0);
                }
                self.written_versions.push(v);
            }
            None => {}
        }
    }
}

fn str_at<'v>(v: &'v Value, ptr: &str) -> Option<&'v str> {
    v.pointer(ptr).and_then(Value::as_str)
}

impl Executor<'_> {
    /// Carries out the actions in order, then deletes owned children no longer desired.
    pub async fn execute(&self, actions: &[Action]) -> Result<Outcome, ActionError> {
        let mut outcome = Outcome::default();
        let mut desired_children = DesiredChildren::new();
        for (i, action) in actions.iter().enumerate() {
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
                    created_before,
                } => {
                    let r = ObjectRef {
                        api_version: api_version.clone(),
                        kind: kind.clone(),
                        namespace: namespace.clone(),
                        name: String::new(),
                    };
                    self.delete_matching(
                        &r,
                        label_selector,
                        created_before.as_deref(),
                        &mut outcome,
                    )
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
                Action::SetState(value) => {
                    let (state, key) = self.state;
                    if state.changes(key, value.as_deref()) {
                        self.may_write().await?;
                        // Nothing of this object follows it (no action after it, no child
                        // to collect): written within milliseconds, together with other
                        // objects' saves, and the next reconcile of the object waits for it.
                        // Otherwise it is stored before the next action runs.
                        let behind = self.child_kinds.is_empty()
                            && actions[i + 1..]
                                .iter()
                                .all(|a| matches!(a, Action::RequeueAfter(_)));
                        if behind {
                            state.set_behind(key, value.as_deref(), self.writes.fence())
                        } else {
                            state.set(key, value.as_deref()).await
                        }?;
                        outcome
                            .changes
                            .push(format!("saved state for {}", self.target));
                    }
                }
                Action::RequeueAfter(_) | Action::Finalized(_) => {}
            }
        }
        if self.parent.is_some() {
            self.delete_undesired_children(&desired_children, &mut outcome)
                .await?;
        } else {
            self.held.forget(self.target);
        }
        Ok(outcome)
    }

    /// Server-side apply of one object: the parent itself, an owned child (with drift
    /// detection and its update strategy) or a granted object of another kind.
    async fn apply(
        &self,
        object: &Value,
        desired_children: &mut DesiredChildren,
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
        let target = ObjectRef { namespace, ..r };
        if self.is_parent(&target) {
            return self.apply_parent(kind, &target, &object, outcome).await;
        }
        if let Some(child) = self.child_kind(&target.api_version, &target.kind) {
            return self
                .apply_child(child, &target, object, desired_children, outcome)
                .await;
        }
        self.server_side_apply(kind, &target, &object, outcome)
            .await?;
        let unowned = format!("{} ({})", target.kind, target.api_version);
        if !outcome.unowned.contains(&unowned) {
            outcome.unowned.push(unowned);
        }
        Ok(())
    }

    /// `PATCH` with server-side apply as this controller's field manager, forced (the guest
    /// owns the fields it sets).
    async fn server_side_apply(
        &self,
        kind: &Kind,
        r: &ObjectRef,
        object: &Value,
        outcome: &mut Outcome,
    ) -> Result<(), ActionError> {
        let api = kind.api(self.client.clone(), r.namespace.as_deref());
        let params = PatchParams::apply(&self.field_manager).force();
        self.may_write().await?;
        let applied = api
            .patch(&r.name, &params, &Patch::Apply(object))
            .await
            .map_err(|source| ActionError::Api {
                what: format!("apply {r}"),
                source,
            })?;
        let version = applied.metadata.resource_version;
        outcome.written(format!("applied {r}"), version, self.is_parent(r));
        Ok(())
    }

    /// Waits for the write budget, then checks that this process may still act.
    async fn may_write(&self) -> Result<(), ActionError> {
        if self.writes.admit().await {
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
                outcome.written(format!("deleted {what}"), None, false);
                Ok(either.is_right())
            }
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(true),
            Err(source) => Err(ActionError::Api {
                what: format!("delete {what}"),
                source,
            }),
        }
    }
}
