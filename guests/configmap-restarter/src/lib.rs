//! The ConfigMap restarter of the controller tutorials, level-based, as a kubewasm guest.
//!
//! A ConfigMap annotated `magalix.com/podDeleteMatch: "<label selector>"` names the Pods that
//! use it; when its data changes, every Pod in its namespace that matches the selector is
//! deleted (and recreated by its Deployment with the new data).
//!
//! The tutorial reacts to update *events*, so a change made while it is down is lost. This
//! guest is level-based instead: it keeps, in the ConfigMap's annotation
//! `restarter.kubewasm.dev/data-digest`, the digest of the data the Pods were last restarted
//! for, and compares it with the digest of the data it observes now:
//!
//! - no digest yet (first sighting): record it, restart nothing;
//! - same digest (e.g. a metadata-only change, or our own annotation write): nothing;
//! - another digest: delete the matching Pods, record the new digest, emit `PodsRestarted`.
//!
//! A change made while the runtime was down shows up as a different digest when it comes back.
//! The digest is written with a partial object, which server-side apply merges into the
//! ConfigMap touching only that annotation.
//!
//! An invalid (or empty, which would match every Pod) selector is the ConfigMap author's
//! mistake, not the controller's: the guest emits a `Warning` Event `InvalidSelector` on the
//! ConfigMap, where its author looks (`kubectl describe configmap`), restarts nothing and
//! records nothing; the controller itself stays healthy. Once the selector is fixed, a data
//! change made in the meantime is acted on as usual.

use std::fmt::Write as _;

use kubewasm_guest_sdk::selector::Selector;
use kubewasm_guest_sdk::{Cluster, Error, EventType, Request, Response, object};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

/// The annotation that opts a ConfigMap in, holding the selector of the Pods to restart.
pub const SELECTOR_ANNOTATION: &str = "magalix.com/podDeleteMatch";

/// The annotation where the guest keeps the digest of the data the Pods were restarted for.
pub const DIGEST_ANNOTATION: &str = "restarter.kubewasm.dev/data-digest";

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
    let record = object::object("v1", "ConfigMap", namespace, &req.target.name)
        .annotation(DIGEST_ANNOTATION, &digest);
    match object::annotation(config_map, DIGEST_ANNOTATION) {
        None => Ok(Response::new().apply(record)),
        Some(recorded) if recorded == digest => Ok(Response::new()),
        Some(_) => {
            let message = format!(
                "ConfigMap data changed: deleted the Pods in namespace {} matching {:?}",
                namespace.unwrap_or_default(),
                selector.to_string()
            );
            Ok(Response::new()
                .delete_all_of("v1", "Pod", namespace, selector.to_string())
                .apply(record)
                .event(EventType::Normal, "PodsRestarted", message))
        }
    }
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
