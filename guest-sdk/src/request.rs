//! What one call to `reconcile` is about: the target object, its observed state and children.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::Error;
use crate::object;

/// Names one object: what it is (`api_version`, `kind`) and which one (`namespace`, `name`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ObjectRef {
    /// `apiVersion`, e.g. `v1` or `example.com/v1`.
    pub api_version: String,
    /// `kind`, e.g. `Pod`.
    pub kind: String,
    /// `metadata.namespace`; `None` for cluster-scoped objects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// `metadata.name`.
    pub name: String,
}

impl ObjectRef {
    /// A reference from its four parts.
    pub fn new(
        api_version: impl Into<String>,
        kind: impl Into<String>,
        namespace: Option<&str>,
        name: impl Into<String>,
    ) -> Self {
        ObjectRef {
            api_version: api_version.into(),
            kind: kind.into(),
            namespace: namespace.map(str::to_string),
            name: name.into(),
        }
    }

    /// The reference to a Kubernetes object given as JSON. Fails (permanently) when `obj` is
    /// not a JSON object or lacks `apiVersion`, `kind` or `metadata.name`; the message quotes
    /// at most the first 60 bytes of it.
    pub fn of(obj: &Value) -> Result<Self, Error> {
        if !obj.is_object() {
            return Err(Error::permanent(format!(
                "not a Kubernetes object: expected a JSON object, got `{}`",
                short(obj)
            )));
        }
        let field = |value: Option<&str>, what: &str| {
            value.map(str::to_string).ok_or_else(|| {
                Error::permanent(format!("not a Kubernetes object: missing `{what}`"))
            })
        };
        Ok(ObjectRef {
            api_version: field(object::api_version(obj), "apiVersion")?,
            kind: field(object::kind(obj), "kind")?,
            namespace: object::namespace(obj).map(str::to_string),
            name: field(object::name(obj), "metadata.name")?,
        })
    }

    /// Whether `obj` is the object this reference names.
    pub fn refers_to(&self, obj: &Value) -> bool {
        object::api_version(obj) == Some(self.api_version.as_str())
            && object::kind(obj) == Some(self.kind.as_str())
            && object::namespace(obj) == self.namespace.as_deref()
            && object::name(obj) == Some(self.name.as_str())
    }
}

/// `Kind namespace/name`, or `Kind name` for a cluster-scoped object.
impl std::fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} {}/{}", self.kind, ns, self.name),
            None => write!(f, "{} {}", self.kind, self.name),
        }
    }
}

/// At most the first 60 bytes of `v` as JSON, for messages.
fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.len() > 60 {
        format!("{}…", &s[..s.floor_char_boundary(60)])
    } else {
        s
    }
}

/// The input of one reconcile.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The controller being run, as `namespace/name` of its WasmController.
    pub controller: String,
    /// The object this call is about (set even when the object is gone).
    pub target: ObjectRef,
    /// The object as last observed, or `None` when it no longer exists.
    pub parent: Option<Value>,
    /// For composite controllers: the observed children owned by the parent.
    pub children: Vec<Value>,
    /// The object as this controller's last successful reconcile of it saw it; `None` the
    /// first time since the runtime (or the controller) started. With `parent`, it tells
    /// what changed: `None` → `Some` was added (or was there when the runtime started),
    /// `Some` → `None` was deleted.
    pub previous: Option<Value>,
    /// What this controller saved for the target with [`crate::Action::SetState`], kept by
    /// the runtime across restarts (in WasmControllerState objects of the controller's
    /// namespace); `None` when nothing is saved. At most [`crate::MAX_STATE_BYTES`] per
    /// object; how many objects is the operator's quota per controller in bytes
    /// (`--max-state-bytes-per-controller`, 8 MiB by default: over 10,000 objects). Forgotten once the target is gone, after the guest was called once more
    /// without `parent` — also for a target deleted while the runtime was not running.
    pub state: Option<String>,
    /// The target is being deleted and still carries this controller's finalizer
    /// (`spec.finalize`): clean up, then answer with [`crate::Action::Finalized`].
    pub finalizing: bool,
}

impl Request {
    /// A request about an existing object, with no children, as a host would send it when
    /// the object was last seen like `parent`. Fails when `parent` is not a named object.
    pub fn for_object(parent: Value) -> Result<Self, Error> {
        Ok(Request {
            controller: String::new(),
            target: ObjectRef::of(&parent)?,
            parent: Some(parent),
            children: Vec::new(),
            previous: None,
            state: None,
            finalizing: false,
        })
    }

    /// A request about an object that no longer exists.
    pub fn gone(target: ObjectRef) -> Self {
        Request {
            controller: String::new(),
            target,
            parent: None,
            children: Vec::new(),
            previous: None,
            state: None,
            finalizing: false,
        }
    }

    /// The same request with these observed children.
    #[must_use]
    pub fn with_children(mut self, children: Vec<Value>) -> Self {
        self.children = children;
        self
    }

    /// The same request with the object as last reconciled (see [`Request::previous`]).
    #[must_use]
    pub fn with_previous(mut self, previous: Value) -> Self {
        self.previous = Some(previous);
        self
    }

    /// The same request with this saved state (see [`Request::state`]).
    #[must_use]
    pub fn with_state(mut self, state: impl Into<String>) -> Self {
        self.state = Some(state.into());
        self
    }

    /// The same request for a target being deleted that still carries this controller's
    /// finalizer (see [`Request::finalizing`]).
    #[must_use]
    pub fn finalizing(mut self) -> Self {
        self.finalizing = true;
        self
    }

    /// The same request naming this controller (`namespace/name`).
    #[must_use]
    pub fn with_controller(mut self, controller: impl Into<String>) -> Self {
        self.controller = controller.into();
        self
    }

    /// The observed children of one kind, e.g. `children_of("v1", "Pod")`.
    pub fn children_of<'a>(
        &'a self,
        api_version: &'a str,
        kind: &'a str,
    ) -> impl Iterator<Item = &'a Value> + 'a {
        self.children.iter().filter(move |child| {
            object::api_version(child) == Some(api_version) && object::kind(child) == Some(kind)
        })
    }
}
