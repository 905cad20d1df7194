//! The shared test vectors (`guest-sdk/vectors/`): label selectors, reads' queries and
//! response documents, asserted here for the Rust SDK and by
//! `guest-sdk/python/tests/test_vectors.py` for the Python SDK, so the two answer alike.

use std::time::Duration;

use kubewasm_guest_sdk::query::Query;
use kubewasm_guest_sdk::selector::Selector;
use kubewasm_guest_sdk::{EventType, ObjectRef, Response};
use serde_json::Value;

/// The cases of `vectors/<name>.json`.
fn cases(name: &str) -> Vec<Value> {
    let path = format!("{}/vectors/{name}.json", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let vectors: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
    vectors["cases"].as_array().cloned().unwrap_or_default()
}

fn text(value: &Value) -> Option<&str> {
    value.as_str()
}

#[test]
fn selectors() {
    let cases = cases("selectors");
    assert!(cases.len() > 10);
    for case in cases {
        let selector = text(&case["selector"]).unwrap_or_default();
        let parsed = Selector::parse(selector);
        if case["invalid"] == true {
            assert!(parsed.is_err(), "`{selector}` is refused");
            continue;
        }
        let parsed = parsed.unwrap_or_else(|e| panic!("`{selector}`: {e}"));
        for pair in case["match"].as_array().into_iter().flatten() {
            let labels = pair[0].as_object().cloned().unwrap_or_default();
            assert_eq!(
                parsed.matches(&labels),
                pair[1] == true,
                "`{selector}` against {labels:?}"
            );
        }
    }
}

#[test]
fn queries() {
    for case in cases("queries") {
        let query = Query::new(
            text(&case["apiVersion"]).unwrap_or_default(),
            text(&case["kind"]).unwrap_or_default(),
            case["namespaced"] == true,
            text(&case["namespace"]),
            text(&case["defaultNamespace"]),
            text(&case["labelSelector"]),
        );
        if case["invalid"] == true {
            assert!(query.is_err(), "{case} is refused");
            continue;
        }
        let query = query.unwrap_or_else(|e| panic!("{case}: {e}"));
        for pair in case["objects"].as_array().into_iter().flatten() {
            assert_eq!(
                query.matches(&pair[0]),
                pair[1] == true,
                "{case}: {}",
                pair[0]
            );
        }
    }
}

/// The response `actions` (in the wire form) build with the SDK's builder.
fn build(actions: &[Value]) -> Response {
    actions.iter().fold(Response::new(), |response, action| {
        let (name, body) = action
            .as_object()
            .and_then(|o| o.iter().next())
            .unwrap_or_else(|| panic!("an action: {action}"));
        let field = |f: &str| text(&body[f]).unwrap_or_default().to_owned();
        match name.as_str() {
            "apply" => response.apply(body.clone()),
            "delete" => {
                let object: ObjectRef =
                    serde_json::from_value(body.clone()).unwrap_or_else(|e| panic!("{body}: {e}"));
                response.delete(object)
            }
            "deleteAllOf" => {
                let (api, kind, selector) =
                    (field("apiVersion"), field("kind"), field("labelSelector"));
                let namespace = text(&body["namespace"]);
                match text(&body["createdBefore"]) {
                    Some(before) => {
                        response.delete_all_created_before(api, kind, namespace, selector, before)
                    }
                    None => response.delete_all_of(api, kind, namespace, selector),
                }
            }
            "setStatus" => response.set_status(body.clone()),
            "event" => {
                let event_type: EventType = serde_json::from_value(body["type"].clone())
                    .unwrap_or_else(|e| panic!("{body}: {e}"));
                response.event(event_type, field("reason"), field("message"))
            }
            "requeueAfterMillis" => {
                response.requeue_after(Duration::from_millis(body.as_u64().unwrap_or_default()))
            }
            "setState" => match text(body) {
                Some(state) => response.set_state(state),
                None => response.clear_state(),
            },
            "finalized" => response.finalized(),
            other => panic!("no builder for action `{other}`"),
        }
    })
}

#[test]
fn responses() {
    for case in cases("responses") {
        let actions = case["actions"].as_array().cloned().unwrap_or_default();
        let written = serde_json::to_string(&build(&actions)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            Some(written.as_str()),
            text(&case["document"]),
            "{actions:?}"
        );
    }
}
