//! The reviewer's decisions, natively, against the tutorial's Guitars.

use guitar_reviewer::{DISLIKED_BRANDS, GOOD_BRANDS, comment, reconcile};
use kubewasm_guest_sdk::testing::FakeCluster;
use kubewasm_guest_sdk::{Action, ObjectRef, Request};
use serde_json::{Value, json};

fn guitar(spec: Value) -> Request {
    Request::for_object(json!({
        "apiVersion": "kool.karmalabs.local/v1", "kind": "Guitar",
        "metadata": {"name": "ax", "namespace": "music"}, "spec": spec,
    }))
    .unwrap()
}

fn review(spec: Value) -> Option<Value> {
    let response = reconcile(&guitar(spec), &FakeCluster::new()).unwrap();
    match response.actions.as_slice() {
        [] => None,
        [Action::Apply(applied)] => Some(applied.clone()),
        other => panic!("expected at most one apply, got {other:?}"),
    }
}

#[test]
fn an_unreviewed_guitar_gets_reviewed_by_brand() {
    let applied = review(json!({"brand": "Fender"})).unwrap();
    assert_eq!(applied["apiVersion"], "kool.karmalabs.local/v1");
    assert_eq!(applied["kind"], "Guitar");
    assert_eq!(applied["metadata"]["name"], "ax");
    assert_eq!(applied["metadata"]["namespace"], "music");
    assert_eq!(applied["spec"]["review"], true);
    assert_eq!(
        applied["spec"]["comment"],
        "Fender makes great guitars: a fine choice"
    );
    assert!(
        applied["spec"].get("brand").is_none(),
        "the brand is the owner's field"
    );
    let unreviewed = review(json!({"brand": "yamaha", "review": false})).unwrap();
    assert!(
        unreviewed["spec"]["comment"]
            .as_str()
            .unwrap()
            .contains("not a brand")
    );
}

#[test]
fn every_listed_brand_has_its_verdict_and_others_a_polite_one() {
    for brand in GOOD_BRANDS {
        assert!(comment(brand).contains("great guitars"), "{brand}");
    }
    for brand in DISLIKED_BRANDS {
        assert!(
            comment(brand).contains("not a brand this reviewer would pick"),
            "{brand}"
        );
    }
    assert!(comment("Cole Clark").contains("great guitars"));
    assert_eq!(
        comment("Harley Benton"),
        "Harley Benton is an unknown brand to this reviewer: no opinion, sorry"
    );
    assert!(comment("").contains("no brand given"));
    assert!(
        comment(&"z".repeat(10_000)).len() < 200,
        "a long brand is not quoted whole"
    );
}

#[test]
fn a_reviewed_guitar_is_never_rewritten() {
    assert_eq!(
        review(json!({"brand": "fender", "review": true, "comment": "mine"})),
        None
    );
    // The brand edited after the review: still reviewed, still left alone.
    assert_eq!(review(json!({"brand": "yamaha", "review": true})), None);
}

#[test]
fn a_deleted_guitar_needs_nothing() {
    let gone = Request::gone(ObjectRef::new(
        "kool.karmalabs.local/v1",
        "Guitar",
        Some("music"),
        "ax",
    ));
    assert!(reconcile(&gone, &FakeCluster::new()).unwrap().is_empty());
}
