//! `kubewasm reconcile --capsule`: a failed reconcile replayed offline from what the runtime
//! kept — the request, the answers to the guest's reads, the module by digest — says whether
//! it fails the same way, and refuses what it cannot replay truly.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use kubewasm::sandbox::Digest;
use serde_json::{Value, json};

use super::{Run, common, kubewasm, write};

/// A capsule of the hostile guest in mode `read-fail`, whose ConfigMap `settings` said
/// `value`, recorded as failing with `reason` and `message`.
fn capsule(value: &str, reason: &str, message: &str) -> Value {
    let wasm = std::fs::read(common::guest("hostile")).expect("the hostile guest");
    let parent = json!({"apiVersion": "example.com/v1", "kind": "Thing",
        "metadata": {"name": "t", "namespace": "team"}, "spec": {"mode": "read-fail"}});
    json!({
        "apiVersion": "kubewasm.dev/v1alpha1",
        "kind": "ReconcileCapsule",
        "controller": "team/hostile",
        "object": "team/t",
        "failedAt": "2026-11-28T03:00:00Z",
        "module": {
            "digest": format!("sha256:{}", Digest::of(&wasm).hex()),
            "source": {"configMap": {"name": "hostile", "key": "hostile.wasm"}},
        },
        "limits": {"memoryBytes": 67108864, "timeoutMs": 20000, "hostCalls": 100,
            "outputBytes": 65536, "logBytes": 65536, "logLines": 1000,
            "responseBytes": 1048576, "actions": 100},
        "error": {"reason": reason, "message": message, "stage": "call"},
        "request": {
            "controller": "team/hostile",
            "target": {"apiVersion": "example.com/v1", "kind": "Thing", "namespace": "team", "name": "t"},
            "parent": parent.to_string(),
            "children": [],
        },
        "reads": [{"op": "get", "apiVersion": "v1", "kind": "ConfigMap", "name": "settings",
            "objects": [{"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "settings", "namespace": "team"}, "data": {"value": value}}]}],
        "complete": true,
    })
}

fn replay(dir: &Path, capsule: &Value, module: Option<&Path>) -> Run {
    let file = write(dir, "capsule.json", capsule.to_string());
    let mut args: Vec<PathBuf> = vec!["reconcile".into(), "--capsule".into(), file];
    if let Some(module) = module {
        args.extend(["--module".into(), module.to_path_buf()]);
    }
    kubewasm(&args)
}

/// The failure the hostile guest in mode `read-fail` returns when ConfigMap `settings` says
/// `value`: the reason and message a capsule records for it.
#[cfg(feature = "cluster-tests")]
fn read_fail(value: &str) -> (&'static str, String) {
    (
        "ReconcileFailed",
        format!(r#"reconcile failed: ConfigMap settings says "{value}": refused"#),
    )
}

/// In the cluster tier: it needs Debian's `docker-registry`, which `make k8s-binaries` installs
/// with the control plane's binaries (the offline tier needs nothing installed).
#[cfg(feature = "cluster-tests")]
#[test]
fn a_capsule_of_a_registry_module_is_replayed_by_the_manifest_it_was_pulled_as() {
    let registry = kubewasm_test_support::registry::Registry::start().expect("docker-registry");
    let dir = tempfile::tempdir().unwrap();
    let tag = format!("{}/team/hostile:v1", registry.addr());
    let hostile = common::guest("hostile");
    let pushed = kubewasm(&[
        OsStr::new("push"),
        hostile.as_os_str(),
        OsStr::new(&tag),
        OsStr::new("--insecure"),
    ])
    .success();
    let manifest = (pushed.stdout.trim().rsplit_once('@'))
        .unwrap_or_else(|| panic!("push prints reference@digest: {}", pushed.stdout))
        .1
        .to_owned();
    // The tag moves on to another module after the failure was recorded.
    let other = common::guest("hello_world");
    kubewasm(&[
        OsStr::new("push"),
        other.as_os_str(),
        OsStr::new(&tag),
        OsStr::new("--insecure"),
    ])
    .success();
    let (reason, message) = read_fail("seven");
    let mut recorded = capsule("seven", reason, &message);
    recorded["module"]["source"] = json!({"image": tag});
    let file = write(dir.path(), "capsule.json", recorded.to_string());
    let run = |capsule: &Path| {
        kubewasm(&[
            OsStr::new("reconcile"),
            OsStr::new("--capsule"),
            capsule.as_os_str(),
            OsStr::new("--insecure"),
        ])
    };
    // By the spec's tag alone (a capsule of a runtime that did not say): today's module, told
    // apart by its digest.
    run(&file).failure(&["is module sha256:", "not the capsule's sha256:"]);
    // By the manifest the runtime pulled: the module that failed, and the same failure.
    recorded["module"]["image"] = json!(format!("{}/team/hostile@{manifest}", registry.addr()));
    let file = write(dir.path(), "capsule.json", recorded.to_string());
    let same = run(&file).success();
    assert!(same.stdout.contains("the same failure"), "{}", same.stdout);
}

#[test]
fn a_capsule_replays_to_the_same_failure_and_a_different_one_is_told() {
    let dir = tempfile::tempdir().unwrap();
    let hostile = common::guest("hostile");
    // Recorded with words the guest would not say for this read: the replay says so, and
    // shows what it did say — the recorded read's answer, not anything of this machine.
    let differs = replay(
        dir.path(),
        &capsule("forty-two", "ReconcileFailed", "something else"),
        Some(&hostile),
    )
    .failure(&["replayed team/t with sha256:", "it failed otherwise"]);
    assert!(
        differs
            .stderr
            .contains("recorded: ReconcileFailed: something else"),
        "{}",
        differs.stderr
    );
    let replayed = differs
        .stderr
        .lines()
        .find_map(|l| l.trim().strip_prefix("replayed: "))
        .unwrap_or_else(|| panic!("no replayed line:\n{}", differs.stderr))
        .to_owned();
    assert_eq!(
        replayed,
        r#"ReconcileFailed: reconcile failed: ConfigMap settings says "forty-two": refused"#
    );
    let (reason, message) = replayed.split_once(": ").expect("reason: message");

    // Recorded as the guest fails: the same failure, exit 0.
    let same = replay(
        dir.path(),
        &capsule("forty-two", reason, message),
        Some(&hostile),
    )
    .success();
    assert!(same.stdout.contains("the same failure"), "{}", same.stdout);
    assert!(same.stdout.contains("forty-two"), "{}", same.stdout);

    // The same capsule, another answer recorded for the read: another failure.
    let seven = replay(
        dir.path(),
        &capsule("seven", reason, message),
        Some(&hostile),
    )
    .failure(&["it failed otherwise"]);
    assert!(
        seven.stderr.contains(
            r#"replayed: ReconcileFailed: reconcile failed: ConfigMap settings says "seven""#
        ),
        "{}",
        seven.stderr
    );
}

#[test]
fn a_capsule_is_replayed_with_its_own_module_only() {
    let dir = tempfile::tempdir().unwrap();
    let recorded = capsule("x", "ReconcileFailed", "m");
    // Another module: its digest is not the capsule's.
    replay(dir.path(), &recorded, Some(&common::guest("hello_world"))).failure(&[
        "is module sha256:",
        "not the capsule's sha256:",
        "--module FILE",
    ]);
    // No module given for a ConfigMap's module: how to get it.
    replay(dir.path(), &recorded, None).failure(&[
        "give the module of sha256:",
        "ConfigMap hostile, key hostile.wasm",
        "kubectl get configmap hostile",
    ]);
    // Too large to have kept its request: cannot be replayed, and why.
    let mut cut = recorded.clone();
    cut.as_object_mut().unwrap().remove("request");
    cut["complete"] = json!(false);
    cut["incomplete"] = json!("its request took more than the 1024 KiB a capsule keeps: left out");
    replay(dir.path(), &cut, Some(&common::guest("hostile")))
        .failure(&["cannot be replayed", "its request took more than"]);
    // Not a capsule at all.
    let other = write(dir.path(), "other.json", r#"{"kind": "Pod"}"#);
    kubewasm(&[
        OsStr::new("reconcile"),
        OsStr::new("--capsule"),
        other.as_os_str(),
    ])
    .failure(&["is not a capsule"]);
}
