//! A HelloWorld-style controller with clean-up: Metacontroller's finalize hook as a kubewasm
//! guest.
//!
//! For each `HelloWorld` it keeps a greeting record, ConfigMap `greeting-<name>`, that the
//! parent does *not* own: the garbage collector would never remove it, as with anything a
//! controller makes outside the cluster (a DNS entry, a bucket). Its WasmController sets
//! `spec.finalize: true`, so the runtime puts the controller's finalizer on every HelloWorld.
//! When one is deleted the guest is called with `finalizing`:
//!
//! - while the record still exists: delete it, and look again in a second;
//! - once it is gone: answer `finalized`, and the runtime removes the finalizer.
//!
//! A HelloWorld annotated `example.com/hold-deletion: "true"` is never released, to show a
//! clean-up that does not finish: the deletion waits, visibly (a `FinalizationPending` Event
//! on the HelloWorld, the WasmController's `status.finalizing`).

use std::time::Duration;

use kubewasm_guest_sdk::{Cluster, Error, ObjectRef, Request, Response, object};
use serde_json::json;

/// Who is greeted when `spec.who` is missing or empty.
pub const DEFAULT_WHO: &str = "World";

/// An annotation that makes the clean-up of its HelloWorld never finish.
pub const HOLD_ANNOTATION: &str = "example.com/hold-deletion";

/// The name of a HelloWorld's greeting record.
pub fn record_name(hello_world: &str) -> String {
    format!("greeting-{hello_world}")
}

/// Keep the record while the HelloWorld lives; remove it before letting it go.
pub fn reconcile(req: &Request, cluster: &dyn Cluster) -> Result<Response, Error> {
    let Some(parent) = &req.parent else {
        return Ok(Response::new());
    };
    let namespace = req.target.namespace.as_deref();
    let record = record_name(&req.target.name);
    if req.finalizing {
        if object::annotation(parent, HOLD_ANNOTATION) == Some("true") {
            return Ok(Response::new().requeue_after(Duration::from_secs(5)));
        }
        return Ok(match cluster.get("v1", "ConfigMap", namespace, &record)? {
            Some(_) => Response::new()
                .delete(ObjectRef::new("v1", "ConfigMap", namespace, record))
                .requeue_after(Duration::from_secs(1)),
            None => Response::new().finalized(),
        });
    }
    if parent.pointer("/metadata/deletionTimestamp").is_some() {
        return Ok(Response::new()); // being deleted without our finalizer: nothing held
    }
    let who = object::spec_str(parent, "who")
        .filter(|who| !who.is_empty())
        .unwrap_or(DEFAULT_WHO);
    let greeting = format!("Hello, {who}!");
    Ok(Response::new()
        .apply(
            object::object("v1", "ConfigMap", namespace, &record)
                .label("app.kubernetes.io/managed-by", "kubewasm")
                .data(json!({ "greeting": greeting })),
        )
        .set_status(json!({ "greeting": greeting })))
}

kubewasm_guest_sdk::export_reconciler!(reconcile);
