use std::sync::Arc;

use serde_json::json;

use super::*;
use crate::sandbox::{Error, NoReads, Reads};

fn request(parent_bytes: usize) -> WireRequest {
    WireRequest {
        controller: "team/c".into(),
        target: ObjectRef {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            namespace: Some("team".into()),
            name: "p".into(),
        },
        parent: Some(format!("{{\"pad\":\"{}\"}}", "x".repeat(parent_bytes))),
        children: vec![],
        previous: None,
        state: Some("s".into()),
        finalizing: false,
    }
}

fn failed() -> CapsuleError {
    failed_with("team/p: boom")
}

fn failed_with(message: &str) -> CapsuleError {
    CapsuleError {
        reason: "ReconcileFailed".into(),
        message: message.into(),
        stage: Stage::Call,
    }
}

fn source() -> ModuleSource {
    serde_json::from_value(json!({"configMap": {"name": "m", "key": "m.wasm"}}))
        .unwrap_or_else(|e| panic!("{e}"))
}

fn decoded(bytes: &[u8]) -> Capsule {
    serde_json::from_slice(bytes).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn a_capsule_keeps_the_request_exactly_and_round_trips() {
    let store = CapsuleStore::new(1 << 20);
    let capsules = store.open("team/c", Some("team"), source(), Limits::default());
    let wire = request(10);
    capsules.record(
        "team/p",
        Some(&wire),
        (vec![], true),
        "sha256:ab".into(),
        failed(),
    );
    let kept = store.of("team/c");
    assert_eq!(kept.len(), 1);
    let capsule = decoded(&kept[0]);
    assert!(capsule.complete && capsule.incomplete.is_none());
    assert_eq!(capsule.kind, CAPSULE_KIND);
    assert_eq!(capsule.module.digest, "sha256:ab");
    assert_eq!(Limits::from(capsule.limits), Limits::default());
    let back: WireRequest = capsule
        .request
        .unwrap_or_else(|| panic!("a request"))
        .into();
    assert_eq!(back, wire, "the request as the guest was handed it");
    assert!(store.of("team/other").is_empty());
}

#[test]
fn a_controller_keeps_its_latest_and_its_namespace_pays() {
    let store = CapsuleStore::new(1 << 20);
    let capsules = store.open("team/c", Some("team"), source(), Limits::default());
    for i in 0..8 {
        let error = CapsuleError {
            message: format!("failure {i}"),
            ..failed()
        };
        // The same failure again only refreshes its capsule.
        capsules.record(
            "team/p",
            Some(&request(10)),
            (vec![], true),
            "sha256:ab".into(),
            error.clone(),
        );
        capsules.record(
            "team/p",
            Some(&request(10)),
            (vec![], true),
            "sha256:ab".into(),
            error,
        );
    }
    let kept: Vec<String> = store
        .of("team/c")
        .iter()
        .map(|c| decoded(c).error.message)
        .collect();
    assert_eq!(
        kept,
        [
            "failure 3",
            "failure 4",
            "failure 5",
            "failure 6",
            "failure 7"
        ]
    );
    let held: usize = store.of("team/c").iter().map(|c| c.len()).sum();
    assert_eq!(store.used(Some("team")), held);
    drop(capsules);
    assert_eq!(store.used(Some("team")), 0, "credited with the controller");
    assert!(store.of("team/c").is_empty());
}

#[test]
fn past_the_namespace_cap_the_oldest_go_and_the_rest_is_not_kept() {
    // Room for about two capsules of 300 KiB.
    let store = CapsuleStore::new(700 << 10);
    let a = store.open("team/a", Some("team"), source(), Limits::default());
    let b = store.open("team/b", Some("team"), source(), Limits::default());
    for i in 0..2 {
        a.record(
            "team/p",
            Some(&request(300 << 10)),
            (vec![], true),
            "d".into(),
            failed_with(&format!("failure {i}")),
        );
    }
    assert_eq!(store.of("team/a").len(), 2);
    b.record(
        "team/p",
        Some(&request(300 << 10)),
        (vec![], true),
        "d".into(),
        failed(),
    );
    assert!(
        store.of("team/b").is_empty(),
        "b's own ring had nothing to give"
    );
    assert_eq!(store.dropped(), 1);
    assert!(store.used(Some("team")) <= 700 << 10);
    // Another namespace is not held back by team.
    let other = store.open("other/c", Some("other"), source(), Limits::default());
    other.record(
        "other/p",
        Some(&request(300 << 10)),
        (vec![], true),
        "d".into(),
        failed(),
    );
    assert_eq!(store.of("other/c").len(), 1);
}

#[test]
fn a_capsule_too_large_leaves_out_its_reads_then_its_request() {
    let reads = vec![RecordedRead {
        op: ReadOp::List,
        api_version: "v1".into(),
        kind: "Secret".into(),
        namespace: None,
        name: None,
        label_selector: None,
        objects: vec![json!({"data": "y".repeat(MAX_CAPSULE_BYTES)})],
        error: None,
    }];
    let store = CapsuleStore::new(8 << 20);
    let capsules = store.open("team/c", Some("team"), source(), Limits::default());
    capsules.record(
        "team/p",
        Some(&request(10)),
        (reads, true),
        "d".into(),
        failed(),
    );
    let capsule = decoded(&store.of("team/c")[0]);
    assert!(!capsule.complete && capsule.reads.is_empty() && capsule.request.is_some());
    assert!(
        capsule
            .incomplete
            .as_deref()
            .is_some_and(|w| w.contains("reads"))
    );
    capsules.record(
        "team/p",
        Some(&request(MAX_CAPSULE_BYTES)),
        (vec![], true),
        "d".into(),
        failed_with("too large"),
    );
    let kept = store.of("team/c");
    let capsule = decoded(&kept[1]);
    assert!(kept[1].len() <= MAX_CAPSULE_BYTES);
    assert!(capsule.request.is_none() && !capsule.complete);
    assert_eq!(
        capsule.error,
        failed_with("too large"),
        "the error is always kept"
    );
}

/// Answers every read with one object naming what was asked, or an error for `denied`.
struct Echo;

impl Reads for Echo {
    fn get(
        &self,
        _: &str,
        kind: &str,
        _: Option<&str>,
        name: &str,
    ) -> Result<Option<serde_json::Value>, Error> {
        match kind {
            "Secret" => Err(Error::retryable("denied")),
            _ => Ok(Some(json!({"kind": kind, "name": name}))),
        }
    }

    fn list(
        &self,
        _: &str,
        kind: &str,
        _: Option<&str>,
        sel: Option<&str>,
    ) -> Result<Vec<serde_json::Value>, Error> {
        Ok(vec![json!({"kind": kind, "selector": sel})])
    }
}

#[test]
fn recorded_reads_are_answered_again_in_the_replay() {
    let recording = Recording::new(Arc::new(Echo));
    let first = recording.get("v1", "ConfigMap", None, "a");
    let denied = recording.get("v1", "Secret", Some("x"), "s");
    let listed = recording.list("v1", "Pod", None, Some("app=web"));
    let (reads, all) = recording.take();
    assert!(all && reads.len() == 3);
    // Through a capsule's JSON, as a team fetches it.
    let reads: Vec<RecordedRead> =
        serde_json::from_value(serde_json::to_value(&reads).unwrap_or_default())
            .unwrap_or_else(|e| panic!("{e}"));
    let replay = Replayed::new(reads);
    assert_eq!(replay.list("v1", "Pod", None, Some("app=web")), listed);
    assert_eq!(replay.get("v1", "ConfigMap", None, "a"), first);
    assert_eq!(replay.get("v1", "Secret", Some("x"), "s"), denied);
    assert_eq!(replay.unused(), 0);
    let unknown = replay.get("v1", "ConfigMap", None, "a");
    assert!(
        unknown.is_err_and(|e| !e.retryable && e.message.contains("reads differently")),
        "each recorded answer is given once; a read not recorded is refused"
    );
}

#[test]
fn a_recording_stops_at_its_object_cap_and_says_so() {
    struct Many;
    impl Reads for Many {
        fn get(
            &self,
            _: &str,
            _: &str,
            _: Option<&str>,
            _: &str,
        ) -> Result<Option<serde_json::Value>, Error> {
            Ok(None)
        }
        fn list(
            &self,
            _: &str,
            _: &str,
            _: Option<&str>,
            _: Option<&str>,
        ) -> Result<Vec<serde_json::Value>, Error> {
            Ok(vec![json!({}); 600])
        }
    }
    let recording = Recording::new(Arc::new(Many));
    for _ in 0..3 {
        assert_eq!(
            recording.list("v1", "Pod", None, None).map(|l| l.len()),
            Ok(600)
        );
    }
    let (reads, all) = recording.take();
    assert!(!all, "past its cap");
    assert_eq!(reads.len(), 1);
    let none = Recording::new(Arc::new(NoReads));
    assert!(none.take().1, "nothing read, nothing missing");
}

#[test]
fn a_capsule_names_the_manifest_its_module_was_pulled_as() {
    let store = CapsuleStore::new(1 << 20);
    let capsules = store.open("team/c", Some("team"), source(), Limits::default());
    let image = |n: u8| format!("r.example/team/c@sha256:{}", n.to_string().repeat(64));
    capsules.pulled_as("sha256:a".into(), image(1));
    capsules.pulled_as("sha256:b".into(), image(2));
    let failed_on = |digest: &str| {
        capsules.record(
            "team/p",
            None,
            (vec![], true),
            digest.into(),
            failed_with(digest),
        );
        decoded(store.of("team/c").last().unwrap_or_else(|| panic!("kept"))).module
    };
    // A reconcile that began before the swap to b ends after it: a is still known.
    assert_eq!(failed_on("sha256:a").image, Some(image(1)));
    assert_eq!(failed_on("sha256:b").image, Some(image(2)));
    // A module that did not come from a registry (or long gone) names none.
    assert_eq!(failed_on("sha256:c").image, None);
    capsules.pulled_as("sha256:c".into(), image(3));
    assert_eq!(failed_on("sha256:a").image, None, "two remembered");
    assert_eq!(failed_on("sha256:c").image, Some(image(3)));
}

/// A candidate's reads: what the live module read is answered as it was then (not as the
/// caches hold it after the live module's writes); what only the candidate reads, from the
/// caches.
#[test]
fn a_candidate_is_answered_the_live_reads_then_the_caches() {
    let recording = Recording::new(Arc::new(Echo));
    let live = recording.list("v1", "Pod", None, Some("app=web")).unwrap();
    let then = Replayed::or(recording.reads(), Arc::new(NoReads));
    assert_eq!(then.list("v1", "Pod", None, Some("app=web")).unwrap(), live);
    // Not read by the live module: the fallback's answer (here none), not a refusal.
    assert_eq!(
        then.list("v1", "Pod", None, Some("app=db")).unwrap(),
        Vec::<serde_json::Value>::new()
    );
    assert_eq!(then.get("v1", "ConfigMap", None, "c").unwrap(), None);
    // The recording is still whole for a capsule.
    assert_eq!(recording.take().0.len(), 1);
}
