//! The ConfigMap restarter of the controller tutorials, level-based, as a kubewasm guest.
//!
//! A ConfigMap annotated `magalix.com/podDeleteMatch: "<label selector>"` names the Pods that
//! use it; when its data changes, every Pod in its namespace that matches the selector is
//! deleted (and recreated by its Deployment with the new data).
//!
//! The tutorial reacts to update *events*, so a change made while it is down is lost. This
//! guest is level-based instead: it saves, as its state for the ConfigMap (`setState`, kept by
//! the runtime in the WasmController's status), the digest of the data the Pods were last
//! restarted for, and compares it with the digest of the data it observes now:
//!
//! - no state yet (first sighting): save the digest, restart nothing;
//! - same digest (e.g. a metadata-only change): nothing;
//! - another digest: delete the matching Pods *created before the data changed*, then save
//!   the new digest, and emit `PodsRestarted`.
//!
//! It needs no write on the ConfigMap: the tutorial's ServiceAccount `joe` (read ConfigMaps;
//! read and delete Pods) is enough. A change made while the runtime was down shows up as a
//! different digest when it comes back. A runtime killed after deleting the Pods but before
//! saving the digest sees the old digest again when it returns; the Pods it deletes then are
//! again only those created before the change — the replacements are newer, so they are left
//! alone and nothing restarts twice.
//!
//! When the data changed is read from the ConfigMap itself, in the API server's clock: the
//! latest `metadata.managedFields[].time` of a field manager that owns `data` or
//! `binaryData`. The API server keeps seconds, so a Pod created in the very second of the
//! change counts as newer (left alone). With no such entry (managed fields stripped), every
//! matching Pod is deleted, as the tutorial does.
//!
//! An invalid (or empty, which would match every Pod) selector is the ConfigMap author's
//! mistake, not the controller's: the guest emits a `Warning` Event `InvalidSelector` on the
//! ConfigMap, where its author looks (`kubectl describe configmap`), restarts nothing and
//! saves nothing; the controller itself stays healthy. Once the selector is fixed, a data
//! change made in the meantime is acted on as usual.

use std::fmt::Write as _;

use kubewasm_guest_sdk::selector::Selector;
use kubewasm_guest_sdk::{Cluster, Error, EventType, Request, Response, object};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

/// The annotation that opts a ConfigMap in, holding the selector of the Pods to restart.
pub const SELECTOR_ANNOTATION: &str = "magalix.com/podDeleteMatch";

/// Restart the ConfigMap's Pods once per change of its data.
pub fn reconcile(req: &Request, _cluster: &dyn Cluster) -> Result<Response, Error> {
    let Some(config_map) = &req.parent else {
        return Ok(Response::new());
    };
    let Some(selector) = object::annotation(config_map, SELECTOR_ANNOTATION) else {
        return Ok(Response::new());
    };
    if config_map.pointer("/metadata/deletionTimestamp").is_some() {
        return Ok(Response::new());
    }
    let selector = match parse_selector(selector) {
        Ok(selector) => selector,
        Err(why) => {
            return Ok(Response::new().event(EventType::Warning, "InvalidSelector", why));
        }
    };

    let digest = data_digest(config_map);
    let namespace = req.target.namespace.as_deref();
    match req.state.as_deref() {
        None => Ok(Response::new().set_state(digest)),
        Some(saved) if saved == digest => Ok(Response::new()),
        Some(_) => {
            let selector = selector.to_string();
            let (response, since) = match data_changed_at(config_map) {
                Some(time) => (
                    Response::new().delete_all_created_before(
                        "v1",
                        "Pod",
                        namespace,
                        &selector,
                        time,
                    ),
                    format!(", created before the change at {time}"),
                ),
                None => (
                    Response::new().delete_all_of("v1", "Pod", namespace, &selector),
                    String::new(),
                ),
            };
            let message = format!(
                "ConfigMap data changed: deleted the Pods in namespace {} matching {selector:?}{since}",
                namespace.unwrap_or_default(),
            );
            Ok(response
                .set_state(digest)
                .event(EventType::Normal, "PodsRestarted", message))
        }
    }
}

/// When `data` or `binaryData` last changed, as the API server recorded it: the latest
/// `time` of a `managedFields` entry that owns either. `None` when no entry says.
pub fn data_changed_at(config_map: &Value) -> Option<&str> {
    config_map
        .pointer("/metadata/managedFields")?
        .as_array()?
        .iter()
        .filter(|entry| {
            let fields = entry.get("fieldsV1");
            ["f:data", "f:binaryData"]
                .iter()
                .any(|f| fields.and_then(|v| v.get(f)).is_some())
        })
        .filter_map(|entry| entry.get("time").and_then(Value::as_str))
        // RFC 3339 in UTC with a fixed format (`2026-11-23T12:00:00Z`): text order is time order.
        .max()
}

/// A selector the guest is willing to delete by: valid, and not empty (which would select
/// every Pod in the namespace).
fn parse_selector(selector: &str) -> Result<Selector, String> {
    let parsed = Selector::parse(selector).map_err(|e| {
        format!(
            "annotation {SELECTOR_ANNOTATION}: {e}; no Pods will be restarted until it is fixed"
        )
    })?;
    if parsed.is_empty() {
        return Err(format!(
            "annotation {SELECTOR_ANNOTATION} is empty, which would select every Pod in the namespace; no Pods will be restarted"
        ));
    }
    Ok(parsed)
}

/// `sha256:<hex>` over a canonical form of `data` and `binaryData`: every entry as
/// `[section, key, value]`, sorted, serialised as JSON. Independent of key order in the
/// object and of serde_json's map implementation.
pub fn data_digest(config_map: &Value) -> String {
    let mut entries: Vec<(&str, &str, &Value)> = ["data", "binaryData"]
        .into_iter()
        .flat_map(|section| {
            config_map
                .get(section)
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
                .map(move |(key, value)| (section, key.as_str(), value))
        })
        .collect();
    entries.sort_unstable_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
    let canonical = serde_json::to_vec(&entries).expect("strings and JSON values serialise");
    let hash = Sha256::digest(&canonical);
    let mut digest = String::from("sha256:");
    for byte in hash {
        let _ = write!(digest, "{byte:02x}");
    }
    digest
}

kubewasm_guest_sdk::export_reconciler!(reconcile);
