//! Comparing answers: normalised, keyed by object, field-level, bounded.

use std::time::Duration;

use serde_json::{Value, json};

use super::compare::{Answered, Selection, differences, effects};
use crate::api::{Problem, Reason};
use crate::sandbox::{Action, EventType, ObjectRef};

fn target() -> ObjectRef {
    ObjectRef {
        api_version: "example.com/v1".into(),
        kind: "HelloWorld".into(),
        namespace: Some("team".into()),
        name: "hello".into(),
    }
}

fn pod(command: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "hello"},
           "spec": {"containers": [{"name": "hello", "command": ["echo", command]}]}})
}

fn did(actions: &[Action]) -> Answered {
    Answered::Did(effects(actions, &target(), &mut |_| None))
}

#[test]
fn the_same_effects_in_another_order_do_not_differ() {
    let cm = |n: &str| {
        Action::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": n}}))
    };
    let live = did(&[cm("a"), cm("b"), Action::SetStatus(json!({"pods": 1}))]);
    let candidate = did(&[Action::SetStatus(json!({"pods": 1})), cm("b"), cm("a")]);
    assert!(differences(&live, &candidate).is_empty());
    // The namespace the runtime fills in is filled in on both sides.
    let explicit = Action::Apply(
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "namespace": "team"}}),
    );
    assert!(differences(&did(&[cm("a")]), &did(&[explicit])).is_empty());
    // Requeues: the shortest is what happens.
    let requeues = [
        Action::RequeueAfter(Duration::from_secs(5)),
        Action::RequeueAfter(Duration::from_secs(2)),
    ];
    assert!(
        differences(
            &did(&requeues),
            &did(&[Action::RequeueAfter(Duration::from_secs(2))])
        )
        .is_empty()
    );
}

#[test]
fn a_changed_field_is_named_with_both_values() {
    let live = did(&[Action::Apply(pod("Hello, World!"))]);
    let candidate = did(&[Action::Apply(pod("Howdy, World!"))]);
    let lines = differences(&live, &candidate);
    assert_eq!(
        lines,
        [
            r#"apply Pod (v1) team/hello: spec.containers[0].command[1]: "Hello, World!" → "Howdy, World!""#
        ]
    );
}

#[test]
fn what_only_one_side_does_is_said_so() {
    let event = Action::Event {
        event_type: EventType::Normal,
        reason: "PodsRestarted".into(),
        message: "done".into(),
    };
    let live = did(&[Action::SetState(Some("a".into()))]);
    let candidate = did(&[Action::SetState(Some("a".into())), event]);
    assert_eq!(
        differences(&live, &candidate),
        ["record a Normal Event PodsRestarted: only the candidate would do it"]
    );
    assert_eq!(
        differences(&candidate, &live),
        ["record a Normal Event PodsRestarted: only the live module does it"]
    );
}

#[test]
fn a_delete_all_of_is_compared_by_the_objects_it_deletes() {
    let pods = |names: &[&str]| -> Vec<Value> {
        names
            .iter()
            .map(|n| json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": n, "namespace": "team"}}))
            .collect()
    };
    let delete = |selector: &str| Action::DeleteAllOf {
        api_version: "v1".into(),
        kind: "Pod".into(),
        namespace: None,
        label_selector: selector.into(),
        created_before: None,
    };
    let mut expand = |s: &Selection| -> Option<Vec<Value>> {
        assert_eq!(
            s.namespace.as_deref(),
            Some("team"),
            "the target's namespace"
        );
        Some(match s.label_selector.as_str() {
            "app=web,tier=front" => pods(&["web-1"]),
            _ => pods(&["web-1", "db-1", "db-2"]),
        })
    };
    let live = Answered::Did(effects(
        &[delete("app=web,tier=front")],
        &target(),
        &mut expand,
    ));
    let wider = Answered::Did(effects(&[delete("app=web")], &target(), &mut expand));
    assert_eq!(
        differences(&live, &wider),
        [
            "delete Pod (v1) team/db-1: only the candidate would do it",
            "delete Pod (v1) team/db-2: only the candidate would do it",
        ]
    );
    // Not listable: the selections themselves are compared.
    let live = did(&[delete("app=web,tier=front")]);
    let lines = differences(&live, &did(&[delete("app=web")]));
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(
        lines[1],
        "delete every Pod (v1) matching \"app=web\" in team: only the candidate would do it"
    );
}

#[test]
fn a_failure_on_one_side_only_is_a_difference() {
    let trap = Answered::Failed(Problem::new(Reason::Trapped, "wasm trap: unreachable"));
    let fine = did(&[Action::SetStatus(json!({"pods": 0}))]);
    let lines = differences(&fine, &trap);
    assert_eq!(lines.len(), 1);
    assert!(
        lines[0].starts_with("the candidate failed (Trapped: wasm trap: unreachable)"),
        "{lines:?}"
    );
    assert!(differences(&trap, &fine)[0].starts_with("the live module failed"));
    assert!(
        differences(&trap, &trap.clone()).is_empty(),
        "the same failure"
    );
}

#[test]
fn differences_are_bounded_in_lines_and_bytes() {
    let many = |prefix: &str| -> Vec<Action> {
        (0..500)
            .map(|i| Action::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("{prefix}-{i}")}, "data": {"x": "y".repeat(10_000)}})))
            .collect()
    };
    let lines = differences(&did(&many("a")), &did(&many("b")));
    assert_eq!(lines.len(), super::compare::MAX_LINES);
    assert!(
        lines.last().unwrap().starts_with("and "),
        "{:?}",
        lines.last()
    );
    assert!(
        lines
            .iter()
            .all(|l| l.len() <= super::compare::MAX_LINE_BYTES)
    );
    // One object differing in every field of a huge value: a few fields, each value cut.
    let wide = |v: &str| {
        let data: serde_json::Map<String, Value> = (0..100)
            .map(|i| (format!("k{i}"), json!(v.repeat(10_000))))
            .collect();
        did(&[Action::Apply(
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": data}),
        )])
    };
    let lines = differences(&wide("a"), &wide("b"));
    assert_eq!(lines.len(), 1);
    assert!(
        lines[0].len() <= super::compare::MAX_LINE_BYTES,
        "{}",
        lines[0].len()
    );
}

/// A candidate differing everywhere, forever: what a controller keeps of it stays within
/// [`super::KEPT_DIFFERENCES`] reconciles and its namespace's account, and the store forgets a
/// stopped controller's.
#[test]
fn what_is_kept_of_the_differences_is_bounded_and_owned() {
    let store = super::ShadowStore::new(64 << 10);
    let sandbox = crate::sandbox::Sandbox::new(crate::sandbox::SandboxConfig::default()).unwrap();
    let module = std::fs::read(kubewasm_test_support::guests::guest("hello_world")).unwrap();
    let candidate = sandbox.load(&module).unwrap();
    let digest = candidate.digest();
    let shadow = store.open("team/c", Some("team"), 1);
    // No candidate: nothing compared, nothing kept.
    assert!(!shadow.compared("team/x", digest, vec!["a".into()]));
    assert_eq!(shadow.counts(), (0, 0));
    shadow.set(Some((candidate, None)));
    let line = "x".repeat(super::compare::MAX_LINE_BYTES);
    let mut firsts = 0;
    for i in 0..1_000 {
        let changes = vec![line.clone(); super::compare::MAX_LINES];
        firsts += usize::from(shadow.compared(&format!("team/o{i}"), digest, changes));
    }
    assert_eq!(firsts, 1, "the first difference is told once");
    assert_eq!(shadow.counts(), (1_000, 1_000));
    let kept = store.of("team/c").unwrap();
    let items = kept["items"].as_array().unwrap();
    assert!(items.len() <= super::KEPT_DIFFERENCES);
    assert!(
        store.used(Some("team")) <= 64 << 10,
        "{}",
        store.used(Some("team"))
    );
    assert!(
        kept["dropped"].as_u64().unwrap() > 0,
        "the account's cap dropped some"
    );
    assert!(kept.to_string().len() < 80 << 10);
    // The status shows at most three, each cut.
    let status = shadow.status().unwrap();
    assert!(status.last_differences.len() <= super::SHOWN_DIFFERENCES);
    assert!(serde_json::to_string(&status).unwrap().len() < 8 << 10);
    // Another namespace's account is its own; a dropped controller credits all it took.
    drop(shadow);
    assert_eq!(store.used(Some("team")), 0);
    assert!(store.of("team/c").is_none());
}
