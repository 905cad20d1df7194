//! The `prepare` export (world `prepared-controller`): called once on an instance made ahead,
//! never on the call's path; what it does is charged to the call that follows and reaches
//! nobody else — its reads find nothing, its answer is forgotten, its lines and memory count
//! against the call's limits — and a `prepare` that loops or traps makes its module be made on
//! the call's path only, as a failing instantiation does.
//!
//! The guest is `guests/testing/prepared`, its `prepare` chosen by overwriting the mode in its
//! built `.wasm` ([`prepared`]).

use super::*;
use kubewasm::sandbox::{MAKE_DEADLINE, Ready};

/// What precedes the mode in the prepared guest's data, and its mode as built (`count`, padded
/// to 10 bytes): `guests/testing/prepared/src/lib.rs`.
const MARKER: &[u8] = b"kubewasm-test-prepare-mode:";
const MODE_BYTES: usize = 10;
/// Lines the `log` mode logs, and bytes the `hold` mode keeps (the guest's constants).
const PREPARE_LOG_LINES: usize = 1_000;
const HOLD_BYTES: u64 = 8 << 20;

/// The prepared guest with `prepare` doing `mode`: the built module with the mode's bytes
/// overwritten (the same length, so the module stays valid).
fn prepared(mode: &str) -> Vec<u8> {
    assert!(mode.len() <= MODE_BYTES, "mode {mode} is too long");
    let mut bytes = std::fs::read(common::guest("prepared")).expect("reading the prepared guest");
    let built = [MARKER, format!("{:<MODE_BYTES$}", "count").as_bytes()].concat();
    let at: Vec<usize> = bytes
        .windows(built.len())
        .enumerate()
        .filter(|(_, w)| *w == built.as_slice())
        .map(|(at, _)| at)
        .collect();
    assert_eq!(at.len(), 1, "the mode is in the prepared guest once");
    let mode = format!("{mode:<MODE_BYTES$}");
    bytes[at[0] + MARKER.len()..at[0] + built.len()].copy_from_slice(mode.as_bytes());
    bytes
}

/// Four instance slots; the tenant's log rate out of the way, so that a call's own line budget
/// is the only cap on its lines.
fn sandbox() -> Sandbox {
    Sandbox::new(SandboxConfig {
        max_instances: 4,
        log_lines_per_second: 1e6,
        log_line_burst: 1_000_000,
        ..SandboxConfig::default()
    })
    .expect("a sandbox")
}

/// ConfigMap `settings` and two others, whatever the namespace: what the call's reads find.
struct Settings;

impl Reads for Settings {
    fn get(&self, _: &str, _: &str, _: Option<&str>, name: &str) -> Result<Option<Value>, Error> {
        Ok((name == "settings").then(|| {
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings", "namespace": "test"}, "data": {"secret": "s3cr3t"}})
        }))
    }

    fn list(
        &self,
        _: &str,
        _: &str,
        _: Option<&str>,
        _: Option<&str>,
    ) -> Result<Vec<Value>, Error> {
        Ok(["settings", "a", "b"]
            .iter()
            .map(|name| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "test"}}))
            .collect())
    }
}

/// One call of `guest` for controller `team-p/one` with `ready`, reads [`Settings`]; its
/// outcome once the tidy (and so the next make ahead) ran.
async fn call(
    sandbox: &Sandbox,
    guest: &Arc<GuestPre>,
    ready: &Ready,
    limits: Limits,
) -> Result<CallOutcome, CallError> {
    let request = hello_request().with_controller("team-p/one");
    let call = sandbox.reconcile_ahead(
        "team-p",
        guest.clone(),
        request,
        Arc::new(Settings),
        limits,
        ready,
    );
    let (called, tidy) = tokio::time::timeout(WATCHDOG, call)
        .await
        .expect("the call returned");
    tidy.run().await;
    called
}

/// The status the prepared guest answered with.
fn status(outcome: &CallOutcome) -> Value {
    match outcome.response.actions.as_slice() {
        [Action::SetStatus(status)] => status.clone(),
        other => panic!("one setStatus, not {other:?}"),
    }
}

/// Calls `guest` with `ready` until one is served by an instance made ahead (at most ten
/// calls); that call's outcome.
async fn served_ahead(
    sandbox: &Sandbox,
    guest: &Arc<GuestPre>,
    ready: &Ready,
    limits: Limits,
) -> CallOutcome {
    for _ in 0..10 {
        let outcome = call(sandbox, guest, ready, limits)
            .await
            .expect("the call succeeds");
        if outcome.made_ahead {
            return outcome;
        }
        // Made ahead after the tidy: give it a moment on a busy machine.
        for _ in 0..100 {
            if ready.holds() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    panic!("no call was served by an instance made ahead in ten calls");
}

/// A module of world `prepared-controller` is known as one at load; its instances made ahead
/// are prepared exactly once, its instances made on the call's path never, and either way the
/// call's reads are its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_module_is_prepared_once_when_made_ahead_and_never_on_the_calls_path() {
    let sandbox = sandbox();
    let guest = sandbox
        .load(&prepared("count"))
        .expect("the prepared guest loads");
    assert!(guest.prepares(), "it exports prepare");
    let hello = sandbox
        .load(&std::fs::read(common::guest("hello_world")).expect("reading HelloWorld"))
        .expect("HelloWorld loads");
    assert!(
        !hello.prepares(),
        "a controller without prepare is not one that prepares"
    );

    let on_path = sandbox
        .reconcile(
            "team-p",
            guest.clone(),
            hello_request().with_controller("team-p/one"),
            Arc::new(Settings),
            Limits::default(),
        )
        .await
        .expect("a call without a Ready");
    assert!(!on_path.made_ahead);
    assert_eq!(
        status(&on_path)["prepares"],
        0,
        "made on the call's path: not prepared"
    );
    assert_eq!(
        status(&on_path)["saw"],
        json!({"listed": 3, "got": "found"})
    );

    let ready = Ready::new();
    let first = call(&sandbox, &guest, &ready, Limits::default())
        .await
        .expect("the first call");
    assert!(!first.made_ahead);
    assert_eq!(status(&first)["prepares"], 0);
    for _ in 0..3 {
        let ahead = served_ahead(&sandbox, &guest, &ready, Limits::default()).await;
        let status = status(&ahead);
        assert_eq!(status["prepares"], 1, "made ahead: prepared once, {status}");
        assert_eq!(
            status["saw"],
            json!({"listed": 3, "got": "found"}),
            "the call reads as any call"
        );
        assert_eq!(
            (ahead.phases.setup, ahead.phases.instantiate),
            (Duration::ZERO, Duration::ZERO),
            "making and preparing are off the call's path"
        );
    }
}

/// The attack through `prepare`: reading before any request is known, answering for the call
/// that follows, logging and holding memory outside any call. Its reads find nothing (the
/// reads it gets are nobody's), its answer is forgotten (the call's answer is the reconcile's),
/// its lines and host calls are counted in the call's, and its memory is the call's: a
/// `prepare` past the call's memory limit fails the make, and the module is made on the
/// call's path only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_prepare_does_is_charged_to_its_call_and_reaches_nothing_else() {
    let sandbox = sandbox();

    let read = sandbox.load(&prepared("read")).expect("read loads");
    let outcome = served_ahead(&sandbox, &read, &Ready::new(), Limits::default()).await;
    let said = status(&outcome);
    assert_eq!(
        said["preparedSaw"],
        json!({"listed": 0, "got": "not found"}),
        "prepare's reads find nothing, though the call's find {}",
        said["saw"]
    );
    assert_eq!(said["saw"], json!({"listed": 3, "got": "found"}));
    assert_eq!(
        outcome.host_calls, 4,
        "prepare's two reads are counted in the call's"
    );

    let respond = sandbox.load(&prepared("respond")).expect("respond loads");
    let outcome = served_ahead(&sandbox, &respond, &Ready::new(), Limits::default()).await;
    assert_eq!(
        status(&outcome)["prepares"],
        1,
        "the answer is the reconcile's alone (no apply of from-prepare): {:?}",
        outcome.response.actions
    );

    let log = sandbox.load(&prepared("log")).expect("log loads");
    let limits = Limits::default().with_log_lines(100);
    let outcome = served_ahead(&sandbox, &log, &Ready::new(), limits).await;
    assert_eq!(status(&outcome)["prepares"], 1);
    assert_eq!(
        outcome.log_lines, 100,
        "prepare's lines fill the call's budget of 100, no more"
    );
    assert!(
        outcome.host_calls as usize >= PREPARE_LOG_LINES,
        "prepare's log calls are counted in the call's: {}",
        outcome.host_calls
    );

    let hold = sandbox.load(&prepared("hold")).expect("hold loads");
    let outcome = served_ahead(&sandbox, &hold, &Ready::new(), Limits::default()).await;
    assert_eq!(status(&outcome)["held"], HOLD_BYTES);
    assert!(
        outcome.memory_bytes as u64 >= HOLD_BYTES,
        "what prepare holds is the call's memory: {}",
        outcome.memory_bytes
    );
    // Past the call's memory limit, prepare fails the make: made on the call's path only.
    let limits = Limits::default().with_memory_bytes(4 << 20);
    let ready = Ready::new();
    for _ in 0..4 {
        let outcome = call(&sandbox, &hold, &ready, limits)
            .await
            .expect("made on the path, it reconciles");
        assert_eq!(status(&outcome)["prepares"], 0);
        assert!(!outcome.made_ahead);
    }
    assert!(
        !hold.may_be_made_ahead(),
        "its prepare failed ahead: made on the call's path only"
    );
}

/// A `prepare` that computes forever, sleeps in the host or traps costs one make ahead, cut at
/// [`MAKE_DEADLINE`], and never another: the module's calls are made on their path (unprepared)
/// and answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepare_that_loops_sleeps_or_traps_makes_its_module_made_on_the_calls_path_only() {
    let sandbox = sandbox();
    for mode in ["loop", "sleep", "trap"] {
        let guest = sandbox
            .load(&prepared(mode))
            .unwrap_or_else(|e| panic!("{mode} loads: {e}"));
        let ready = Ready::new();
        for _ in 0..4 {
            let request = hello_request().with_controller("team-p/evil");
            let call = sandbox.reconcile_ahead(
                "team-p",
                guest.clone(),
                request,
                Arc::new(Settings),
                Limits::default(),
                &ready,
            );
            let (called, tidy) = tokio::time::timeout(WATCHDOG, call)
                .await
                .expect("the call returned");
            let tidied = std::time::Instant::now();
            tokio::time::timeout(WATCHDOG, tidy.run())
                .await
                .unwrap_or_else(|_| panic!("{mode}: tidying (the make ahead) never ended"));
            assert!(
                tidied.elapsed() < MAKE_DEADLINE + Duration::from_secs(1),
                "{mode}: tidying took {:?}",
                tidied.elapsed()
            );
            let outcome =
                called.unwrap_or_else(|e| panic!("{mode}: made on the path, it reconciles: {e}"));
            assert!(!outcome.made_ahead, "{mode}");
            assert_eq!(status(&outcome)["prepares"], 0, "{mode}");
        }
        assert!(
            !guest.may_be_made_ahead(),
            "{mode}: made on the call's path only"
        );
        assert!(!ready.holds(), "{mode}");
    }
}

/// A component exporting a `prepare` of another type is refused at load, saying so.
#[test]
fn a_prepare_of_another_type_is_refused_at_load() {
    let component = hand_written_controller(
        r#"(func (export "prepare") (param i32))"#,
        r#"(func (export "prepare") (param "times" u32) (canon lift (core func $i "prepare")))"#,
    );
    let err = sandbox()
        .load(&component)
        .expect_err("a prepare that takes a u32 is refused");
    assert!(matches!(err, LoadError::WrongWorld(_)), "{err:?}");
    let said = err.to_string();
    assert!(
        said.contains("`prepare` has 1 parameter(s) and 0 result(s)")
            && said.contains("prepared-controller"),
        "{said}"
    );
}

/// The Python SDK builds its guests against world `prepared-controller` (componentize-py's
/// setup of an instance is then done in `prepare`, ahead), the Rust SDK against `controller`.
#[test]
fn the_python_guests_export_prepare_and_the_rust_guests_do_not() {
    use kubewasm::sources::oci::ComponentInfo;
    for (name, prepares) in [
        ("python_hello_world", true),
        ("python_configmap_restarter", true),
        ("hello_world", false),
    ] {
        let bytes = std::fs::read(common::guest(name)).expect("reading the guest");
        let info = ComponentInfo::of(&bytes).expect("a component");
        assert_eq!(
            info.exports.iter().any(|e| e == "prepare"),
            prepares,
            "{name}: {:?}",
            info.exports
        );
    }
}
