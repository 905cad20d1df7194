//! The response decoder against random and adversarial documents: it never panics, it
//! refuses what is past the limits with a reason, and it never allocates more than a fixed
//! multiple of the document's length (the allocator below aborts the test if it does).
//!
//! The byte limit is process-wide: the other test here allocates little and briefly.

use std::alloc::System;
use std::time::Duration;

use cap::Cap;
use kubewasm::sandbox::{Action, Limits, decode_response};
use proptest::prelude::*;
use serde_json::{Value, json};

#[global_allocator]
static ALLOCATOR: Cap<System> = Cap::new(System, usize::MAX);

/// Most bytes decoding may allocate per byte of document: a parsed `serde_json::Value` costs
/// at most 32 bytes (plus its container's share) for the 2 bytes of `0,` or `[]`.
const BYTES_PER_BYTE: usize = 40;

/// Fixed headroom for the decoder's own bookkeeping and the error message.
const HEADROOM: usize = 256 << 10;

/// Decodes with the allocator capped at what the bound allows; an allocation past it aborts.
fn decode_bounded(document: &str, limits: &Limits) -> Result<usize, String> {
    let bound = ALLOCATOR.allocated() + BYTES_PER_BYTE * document.len() + HEADROOM;
    ALLOCATOR
        .set_limit(bound)
        .expect("the bound is above what is allocated");
    let result = decode_response(document, limits).map(|r| r.actions.len());
    ALLOCATOR.set_limit(usize::MAX).expect("lifting the bound");
    result
}

fn limits() -> Limits {
    Limits::default()
        .with_response_bytes(64 << 10)
        .with_actions(100)
}

fn action() -> impl Strategy<Value = Value> {
    let text = "[a-zA-Z0-9 é=!,()-]{0,40}";
    prop_oneof![
        (text, text).prop_map(|(kind, name)| json!({"apply": {
            "apiVersion": "v1", "kind": kind, "metadata": {"name": name}
        }})),
        any::<i64>().prop_map(|n| json!({"apply": n})),
        (text, proptest::option::of(text), text).prop_map(|(kind, ns, name)| json!({"delete": {
            "apiVersion": "v1", "kind": kind, "namespace": ns, "name": name
        }})),
        text.prop_map(|sel| json!({"deleteAllOf": {
            "apiVersion": "v1", "kind": "Pod", "labelSelector": sel
        }})),
        any::<bool>().prop_map(|b| json!({"setStatus": {"ok": b}})),
        any::<bool>().prop_map(|b| json!({"setStatus": b})),
        (any::<bool>(), text, text).prop_map(|(warn, reason, message)| json!({"event": {
            "type": if warn { "Warning" } else { "Normal" }, "reason": reason, "message": message
        }})),
        any::<u64>().prop_map(|ms| json!({"requeueAfterMillis": ms})),
        proptest::option::of(text).prop_map(|v| json!({"setState": v})),
        any::<bool>().prop_map(|b| json!({"finalized": b})),
        text.prop_map(|t| json!({"deleteAllOf": {
            "apiVersion": "v1", "kind": "Pod", "labelSelector": "app=x", "createdBefore": t
        }})),
        any::<i64>().prop_map(|ms| json!({"requeueAfterMillis": ms})),
        text.prop_map(|k| json!({ k: {} })),
    ]
}

/// Documents built to hurt a parser: deep nesting, many tiny values, long strings, escapes,
/// lone surrogates, huge numbers, repeated keys, too many actions.
fn adversarial() -> impl Strategy<Value = String> {
    prop_oneof![
        (1usize..5000).prop_map(|n| format!(r#"{{"actions": [{{"setStatus": {}"#, "[".repeat(n))),
        (1usize..20_000).prop_map(|n| format!(
            r#"{{"actions": [{{"setStatus": {{"x": [{}]}}}}]}}"#,
            vec!["0"; n].join(",")
        )),
        (1usize..20_000).prop_map(|n| format!(
            r#"{{"actions": [{{"setStatus": {{"x": [{}]}}}}]}}"#,
            vec!["{}"; n].join(",")
        )),
        (1usize..20_000).prop_map(|n| format!(
            r#"{{"actions": [{}]}}"#,
            vec![r#"{"requeueAfterMillis": 1}"#; n].join(",")
        )),
        (1usize..8000).prop_map(|n| format!(
            r#"{{"actions": [{{"event": {{"type": "Normal", "reason": "{}", "message": ""}}}}]}}"#,
            "\\u00e9".repeat(n)
        )),
        Just(
            r#"{"actions": [{"event": {"type": "Normal", "reason": "\ud800", "message": ""}}]}"#
                .to_owned()
        ),
        Just(r#"{"actions": [{"requeueAfterMillis": 1e400}]}"#.to_owned()),
        Just(format!(
            r#"{{"actions": [{{"setStatus": {{"n": {}}}}}]}}"#,
            "9".repeat(60_000)
        )),
        (1usize..2000).prop_map(|n| format!(
            r#"{{"actions": [], {}}}"#,
            vec![r#""actions": []"#; n].join(",")
        )),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn the_decoder_never_panics_and_allocates_in_proportion(
        bytes in proptest::collection::vec(any::<u8>(), 0..4096),
        actions in proptest::collection::vec(action(), 0..200),
        hostile in adversarial(),
    ) {
        let limits = limits();
        // Random bytes: refused, with a reason.
        let noise = String::from_utf8_lossy(&bytes);
        if let Err(e) = decode_bounded(&noise, &limits) {
            prop_assert!(!e.is_empty());
        }
        // Random actions: decoded when within the limits, each error names what is wrong.
        let document = json!({ "actions": actions }).to_string();
        match decode_bounded(&document, &limits) {
            Ok(n) => {
                prop_assert_eq!(n, actions.len());
                prop_assert!(n <= limits.actions);
                prop_assert!(document.len() <= limits.response_bytes);
            }
            Err(e) => prop_assert!(
                e.starts_with("action ") || e.contains("more than the limit") || e.starts_with("not a response document"),
                "{e}"
            ),
        }
        // Adversarial documents: never more than the bound, whatever they are.
        let _ = decode_bounded(&hostile, &limits);
        let roomy = limits.with_response_bytes(4 << 20);
        let _ = decode_bounded(&hostile, &roomy);
    }
}

#[test]
fn a_valid_document_round_trips() {
    let document = json!({"actions": [
        {"apply": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}},
        {"requeueAfterMillis": 1500},
    ]})
    .to_string();
    let response = decode_response(&document, &Limits::default()).unwrap();
    assert_eq!(
        response.actions[1],
        Action::RequeueAfter(Duration::from_millis(1500))
    );
}
