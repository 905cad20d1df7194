//! The sandbox against the hostile guest: every misbehaviour ends in its exact typed error,
//! and the same Sandbox serves well-behaved guests right after. Also what `load` refuses,
//! and calls running side by side.

use kubewasm_test_support::guests as common;
#[path = "sandbox/ahead.rs"]
mod ahead;
#[path = "sandbox/compiler.rs"]
mod compiler;
#[path = "sandbox/no_wasi.rs"]
mod no_wasi;
#[path = "sandbox/prepare.rs"]
mod prepare;

use std::sync::mpsc;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use kubewasm::api::Reason;
use kubewasm::sandbox::{
    Action, CallError, CallOutcome, CompiledCache, Digest, Error, GuestPre, Limits, LoadError,
    MAX_GUEST_LOG_LINE_BYTES, MAX_GUEST_MESSAGE_BYTES, MIN_LOG_LINE_COST, NoReads, Reads, Ready,
    Request, Sandbox, SandboxConfig, SharedReads,
};
use serde_json::{Value, json};

/// One Sandbox for the whole file, as the runtime has one per process: hostile calls of
/// every test run in it, side by side.
static SANDBOX: LazyLock<Sandbox> =
    LazyLock::new(|| Sandbox::new(SandboxConfig::default()).expect("the sandbox starts"));
static HOSTILE: LazyLock<Arc<GuestPre>> = LazyLock::new(|| load("hostile"));
static HELLO: LazyLock<Arc<GuestPre>> = LazyLock::new(|| load("hello_world"));

/// No call may take longer than this; a guest that is not stopped fails the test instead
/// of hanging it.
const WATCHDOG: Duration = Duration::from_secs(20);

/// A component of world `controller` written by hand, whose `reconcile` returns without doing
/// anything: its core module (a memory, `reconcile`, `realloc`) has `core` besides, and the
/// component `exports` besides `reconcile` (the core instance is `$i`).
fn hand_written_controller(core: &str, exports: &str) -> Vec<u8> {
    wat::parse_str(format!(
        r#"(component
             (core module $m
               (memory (export "mem") 1)
               {core}
               (func (export "reconcile") (param i32))
               (func (export "realloc") (param i32 i32 i32 i32) (result i32) i32.const 8))
             (core instance $i (instantiate $m))
             (type $ref' (record (field "api-version" string) (field "kind" string)
               (field "namespace" (option string)) (field "name" string)))
             (export $ref "object-ref" (type $ref'))
             (type $req' (record (field "controller" string) (field "target" $ref)
               (field "parent" (option string)) (field "children" (list string))
               (field "previous" (option string)) (field "state" (option string))
               (field "finalizing" bool)))
             (export $req "request" (type $req'))
             (func (export "reconcile") (param "request" $req)
               (canon lift (core func $i "reconcile") (memory (core memory $i "mem"))
                 (realloc (core func $i "realloc"))))
             {exports})"#
    ))
    .expect("the component is valid text")
}

fn load(name: &str) -> Arc<GuestPre> {
    let bytes = std::fs::read(common::guest(name)).expect("reading the guest");
    SANDBOX
        .load(&bytes)
        .unwrap_or_else(|e| panic!("{name} does not load: {e}"))
}

fn hostile_request(mode: &str) -> Request {
    Request::for_object(json!({
        "apiVersion": "example.com/v1",
        "kind": "Hostile",
        "metadata": {"name": format!("h-{mode}"), "namespace": "test"},
        "spec": {"mode": mode},
    }))
    .expect("a valid request")
    .with_controller("test/hostile")
}

fn hello_request() -> Request {
    Request::for_object(json!({
        "apiVersion": "example.com/v1",
        "kind": "HelloWorld",
        "metadata": {"name": "your-name", "namespace": "test"},
        "spec": {"who": "Your Name"},
    }))
    .expect("a valid request")
    .with_controller("test/hello-world")
}

/// Runs one call on its own thread and fails the test if it does not return in time.
fn call_with(
    guest: &'static LazyLock<Arc<GuestPre>>,
    request: Request,
    reads: SharedReads,
    limits: Limits,
) -> Result<CallOutcome, CallError> {
    let guest = Arc::clone(guest);
    let what = format!("{} with {limits:?}", request.target);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(guest.call(&request, reads, &limits));
    });
    rx.recv_timeout(WATCHDOG)
        .unwrap_or_else(|_| panic!("the call for {what} did not return within {WATCHDOG:?}"))
}

fn hostile(mode: &str, limits: Limits) -> Result<CallOutcome, CallError> {
    call_with(&HOSTILE, hostile_request(mode), Arc::new(NoReads), limits)
}

fn hostile_err(mode: &str, limits: Limits) -> CallError {
    match hostile(mode, limits) {
        Ok(outcome) => panic!("mode {mode} succeeded: {:?}", outcome.response),
        Err(err) => err,
    }
}

fn assert_ok_response(mode: &str, outcome: &CallOutcome) {
    let actions = &outcome.response.actions;
    assert_eq!(actions.len(), 2, "mode {mode}: {actions:?}");
    match &actions[0] {
        Action::Apply(cm) => {
            assert_eq!(cm["kind"], "ConfigMap", "{cm}");
            assert_eq!(cm["metadata"]["name"], format!("h-{mode}"), "{cm}");
            assert_eq!(cm["data"]["mode"], "ok", "{cm}");
        }
        other => panic!("mode {mode}: expected an apply first, got {other:?}"),
    }
    assert_eq!(actions[1], Action::SetStatus(json!({"ok": true})));
}

/// The runtime is unharmed by what just happened: the hostile guest in `ok` mode and the
/// hello-world guest both succeed on the same Sandbox.
fn assert_still_serves() {
    let ok = hostile("ok", Limits::default()).expect("ok mode right after a hostile call");
    assert_ok_response("ok", &ok);

    let hello = call_with(
        &HELLO,
        hello_request(),
        Arc::new(NoReads),
        Limits::default(),
    )
    .expect("hello-world right after a hostile call");
    let pod = hello.response.actions.iter().find_map(|a| match a {
        Action::Apply(o) if o["kind"] == "Pod" => Some(o),
        _ => None,
    });
    let pod = pod.unwrap_or_else(|| panic!("no Pod applied: {:?}", hello.response));
    assert_eq!(pod["metadata"]["name"], "your-name");
    assert_eq!(
        pod["spec"]["containers"][0]["command"],
        json!(["echo", "Hello, Your Name!"])
    );
}

#[test]
fn endless_loop_times_out() {
    let limit = Duration::from_millis(200);
    let err = hostile_err("loop", Limits::default().with_timeout(limit));
    assert!(
        matches!(err, CallError::Timeout { limit: l } if l == limit),
        "{err:?}"
    );
    assert!(err.to_string().contains("timed out"), "{err}");
    assert_eq!(kubewasm::host::reason_of(&err), Reason::Timeout);
    assert_still_serves();
}

#[test]
fn unbounded_allocation_hits_the_memory_limit() {
    let err = hostile_err("alloc", Limits::default());
    assert!(
        matches!(err, CallError::MemoryLimitExceeded { limit } if limit == 64 << 20),
        "{err:?}"
    );
    let err = hostile_err("alloc", Limits::default().with_memory_bytes(16 << 20));
    assert!(
        matches!(err, CallError::MemoryLimitExceeded { limit } if limit == 16 << 20),
        "{err:?}"
    );
    assert_eq!(kubewasm::host::reason_of(&err), Reason::MemoryLimitExceeded);
    assert_still_serves();
}

#[test]
fn panic_is_reported_with_its_message() {
    let err = hostile_err("panic", Limits::default());
    match &err {
        CallError::Panicked { message: Some(m) } => {
            assert!(m.contains("hostile guest panicked on purpose"), "{m}");
        }
        other => panic!("expected Panicked with a message, got {other:?}"),
    }
    assert!(
        err.to_string()
            .contains("guest panicked: hostile guest panicked on purpose"),
        "{err}"
    );
    assert_still_serves();
}

#[test]
fn unbounded_recursion_is_a_stack_overflow() {
    let err = hostile_err("recurse", Limits::default());
    assert!(matches!(err, CallError::StackOverflow), "{err:?}");
    assert_still_serves();
}

#[test]
fn endless_reads_hit_the_host_call_limit() {
    let err = hostile_err("get-loop", Limits::default().with_host_calls(100));
    assert!(
        matches!(err, CallError::HostCallLimit { limit: 100 }),
        "{err:?}"
    );
    assert_eq!(
        kubewasm::host::reason_of(&err),
        Reason::HostCallLimitExceeded
    );
    assert_still_serves();
}

#[test]
fn guest_error_is_passed_on() {
    let err = hostile_err("error", Limits::default());
    match &err {
        CallError::Guest { message, retryable } => {
            assert_eq!(message, "hostile guest refuses");
            assert!(!retryable, "the hostile guest's error is permanent");
        }
        other => panic!("expected a Guest error, got {other:?}"),
    }
    assert!(!err.retryable());
    assert_still_serves();
}

#[test]
fn applying_a_non_object_is_an_invalid_response() {
    let err = hostile_err("bad-object", Limits::default());
    match &err {
        CallError::InvalidResponse(m) => {
            assert!(
                m.contains("action 1: apply: not a Kubernetes object"),
                "{m}"
            );
        }
        other => panic!("expected InvalidResponse, got {other:?}"),
    }
    assert_still_serves();
}

#[test]
fn huge_response_hits_memory_or_response_limit() {
    // 100 MiB of JSON does not fit in the default 64 MiB of guest memory...
    let err = hostile_err("huge-response", Limits::default());
    assert!(
        matches!(err, CallError::MemoryLimitExceeded { limit } if limit == 64 << 20),
        "{err:?}"
    );
    // ...and with room for it, the host refuses a response past the response limit. The
    // timeout is generous: building 100 MiB in the guest is slow on a loaded machine.
    let roomy = Limits::default()
        .with_memory_bytes(512 << 20)
        .with_timeout(Duration::from_secs(10));
    let err = hostile_err("huge-response", roomy);
    match &err {
        CallError::InvalidResponse(m) => assert!(m.contains("more than the limit"), "{m}"),
        other => panic!("expected InvalidResponse, got {other:?}"),
    }
    assert_still_serves();
}

#[test]
fn flooding_stdout_keeps_the_first_bytes_and_succeeds() {
    // Each of the ~220k lines is its own host call (Rust's stdout is line-buffered): about
    // 0.7 s alone on a 2-core machine, so more than the default 1 s beside the other tests.
    // This test is about the output bound, not the speed.
    let limits = Limits::default().with_timeout(Duration::from_secs(10));
    let outcome = hostile("flood", limits).expect("a flood is not a failure");
    assert_ok_response("flood", &outcome);
    let out = &outcome.stdout;
    assert_eq!(out.kept.len(), 64 << 10);
    assert_eq!(out.kept.len(), Limits::default().output_bytes);
    assert!(out.dropped > 0, "nothing dropped: {out:?}");
    assert!(
        out.kept.len() as u64 + out.dropped >= 8 << 20,
        "the guest writes 8 MiB; kept {} dropped {}",
        out.kept.len(),
        out.dropped
    );
    assert!(
        out.text()
            .starts_with("hostile guest flooding stdout 00000000\n"),
        "{:?}",
        &out.text()[..80]
    );
    assert_still_serves();
}

/// The hostile guest's `huge-error` message and each `huge-log` line: 1 MiB.
const HUGE_BYTES: usize = 1 << 20;

/// How many lines `huge-log` logs.
const HUGE_LOG_LINES: usize = 64;

#[test]
fn huge_guest_error_is_cut_to_the_bound() {
    let err = hostile_err("huge-error", Limits::default());
    match &err {
        CallError::Guest { message, retryable } => {
            assert!(
                message.len() <= MAX_GUEST_MESSAGE_BYTES,
                "the guest's error is kept at {} bytes",
                message.len()
            );
            assert!(message.starts_with("hostile guest error éé"), "{message}");
            assert!(message.ends_with(" more bytes)"), "{message}");
            assert!(!retryable, "the hostile guest's error is permanent");
        }
        other => panic!("expected a Guest error, got {other:?}"),
    }
    assert_eq!(kubewasm::host::reason_of(&err), Reason::ReconcileFailed);
    assert_still_serves();
}

/// `guests/testing/hostile`'s `ATTACK_BYTES` and `MANY_ACTIONS`.
const ATTACK_BYTES: usize = 60 << 20;
const MANY_ACTIONS: usize = 200_000;

/// Room for the raw attacks' 60 MiB strings, so that what stops them is the host's check of
/// what crossed the boundary, not the guest's memory limit.
fn roomy() -> Limits {
    Limits::default()
        .with_memory_bytes(256 << 20)
        .with_timeout(Duration::from_secs(10))
}

#[test]
fn a_response_past_the_limit_is_refused_for_its_length() {
    let err = hostile_err("raw-huge-response", roomy());
    match &err {
        CallError::InvalidResponse(m) => assert!(
            m.contains(&format!(
                "response is {} bytes, more than the limit of {} bytes",
                ATTACK_BYTES + r#"{"actions": []}"#.len(),
                Limits::default().response_bytes
            )),
            "{m}"
        ),
        other => panic!("expected InvalidResponse, got {other:?}"),
    }
    assert_still_serves();
}

#[test]
fn a_60_mib_error_is_cut_to_the_bound() {
    let err = hostile_err("raw-huge-error", roomy());
    match &err {
        CallError::Guest { message, .. } => {
            assert!(
                message.len() <= MAX_GUEST_MESSAGE_BYTES,
                "{}",
                message.len()
            );
            assert!(message.starts_with("eeee"), "{message}");
            assert!(message.ends_with(" more bytes)"), "{message}");
        }
        other => panic!("expected a Guest error, got {other:?}"),
    }
    assert_still_serves();
}

#[test]
fn too_many_actions_are_refused() {
    // 200,000 actions take 5.6 MB: past the default response limit...
    match hostile_err("many-actions", roomy()) {
        CallError::InvalidResponse(m) => {
            assert!(m.contains("more than the limit of 1048576 bytes"), "{m}")
        }
        other => panic!("expected InvalidResponse, got {other:?}"),
    }
    // ...and with room for the bytes, past the limit on actions.
    let err = hostile_err("many-actions", roomy().with_response_bytes(16 << 20));
    match &err {
        CallError::InvalidResponse(m) => assert!(
            m.contains(&format!(
                "more than the limit of {} actions in one response",
                Limits::default().actions
            )),
            "{m}"
        ),
        other => panic!("expected InvalidResponse, got {other:?}"),
    }
    // With the operator's leave, as many as the guest sends.
    let generous = roomy()
        .with_actions(MANY_ACTIONS)
        .with_response_bytes(16 << 20);
    let outcome = hostile("many-actions", generous).expect("within the raised limits");
    assert_eq!(outcome.response.actions.len(), MANY_ACTIONS);
    assert_still_serves();
}

#[test]
fn oversized_read_arguments_are_refused_to_the_guest() {
    for (mode, what) in [
        (
            "raw-huge-selector",
            "label selector is 1048578 bytes, more than the limit of 4096 bytes",
        ),
        (
            "raw-huge-read",
            "name is 1048576 bytes, more than the limit of 320 bytes",
        ),
    ] {
        match hostile_err(mode, roomy()) {
            CallError::Guest { message, .. } => assert_eq!(message, what, "{mode}"),
            other => panic!("{mode}: expected the refusal back, got {other:?}"),
        }
    }
    assert_still_serves();
}

#[test]
fn a_guest_answers_exactly_once() {
    match hostile_err("respond-twice", Limits::default()) {
        CallError::Trap(m) => assert!(m.contains("called `respond` twice"), "{m}"),
        other => panic!("expected a trap, got {other:?}"),
    }
    match hostile_err("no-respond", Limits::default()) {
        CallError::InvalidResponse(m) => {
            assert!(m.contains("returned without calling `respond`"), "{m}")
        }
        other => panic!("expected InvalidResponse, got {other:?}"),
    }
    assert_still_serves();
}

/// Everything `tracing` writes while a call runs, one line per event.
#[derive(Clone, Default)]
struct LogCapture(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogCapture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn huge_log_lines_are_cut_and_the_rest_dropped() {
    let capture = LogCapture::default();
    let subscriber = tracing_subscriber::fmt()
        .json()
        .with_max_level(tracing::Level::TRACE)
        .with_writer({
            let capture = capture.clone();
            move || capture.clone()
        })
        .finish();
    // Generous: each of the 64 lines crosses into the host as 1 MiB. This is about bounds.
    let limits = Limits::default().with_timeout(Duration::from_secs(10));
    // The subscriber is set per thread: the call's own, under the watchdog.
    let (tx, rx) = mpsc::channel();
    let guest = Arc::clone(&HOSTILE);
    std::thread::spawn(move || {
        tracing::subscriber::with_default(subscriber, || {
            let _ = tx.send(guest.call(hostile_request("huge-log"), Arc::new(NoReads), &limits));
        });
    });
    let outcome = rx
        .recv_timeout(WATCHDOG)
        .unwrap_or_else(|_| panic!("huge-log did not return within {WATCHDOG:?}"))
        .expect("logging too much is not a failure");
    assert_ok_response("huge-log", &outcome);

    let logged = String::from_utf8(capture.0.lock().unwrap().clone()).unwrap();
    let messages: Vec<String> = logged
        .lines()
        .map(|line| {
            let event: Value = serde_json::from_str(line).expect("one JSON event per line");
            event["fields"]["message"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    let guest_lines: Vec<&String> = messages
        .iter()
        .filter(|m| m.starts_with("hostile guest log line éé"))
        .collect();
    // 64 KiB of budget holds 16 lines of 4 KiB.
    assert_eq!(guest_lines.len(), 16, "{} lines logged", guest_lines.len());
    for line in &guest_lines {
        assert!(
            line.len() <= MAX_GUEST_LOG_LINE_BYTES,
            "a {}-byte line",
            line.len()
        );
        assert!(line.ends_with(" more bytes)"), "not marked as cut: {line}");
    }
    let kept: usize = guest_lines
        .iter()
        .map(|l| l.len().max(MIN_LOG_LINE_COST))
        .sum();
    assert!(kept <= limits.log_bytes, "{kept} bytes logged");
    let written = (HUGE_LOG_LINES * HUGE_BYTES) as u64;
    assert!(
        outcome.log_dropped > written - limits.log_bytes as u64 && outcome.log_dropped < written,
        "dropped {} of {written}",
        outcome.log_dropped
    );
    assert!(
        messages.iter().any(|m| m.contains("were dropped"))
            && logged.contains(&format!("\"dropped_bytes\":{}", outcome.log_dropped)),
        "no warning about the dropped lines"
    );
    assert_still_serves();
}

/// A hostile call under the watchdog, with everything `tracing` wrote meanwhile (in the
/// default text format, or JSON).
fn logged_call(mode: &str, limits: Limits, json: bool) -> (Result<CallOutcome, CallError>, String) {
    let capture = LogCapture::default();
    let writer = {
        let capture = capture.clone();
        move || capture.clone()
    };
    let builder = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_max_level(tracing::Level::TRACE)
        .with_writer(writer);
    let subscriber: Box<dyn tracing::Subscriber + Send + Sync> = if json {
        Box::new(builder.json().finish())
    } else {
        Box::new(builder.finish())
    };
    let (tx, rx) = mpsc::channel();
    let guest = Arc::clone(&HOSTILE);
    let request = hostile_request(mode);
    std::thread::spawn(move || {
        tracing::subscriber::with_default(subscriber, || {
            let _ = tx.send(guest.call(&request, Arc::new(NoReads), &limits));
        });
    });
    let result = rx
        .recv_timeout(WATCHDOG)
        .unwrap_or_else(|_| panic!("{mode} did not return within {WATCHDOG:?}"));
    let logged = String::from_utf8(capture.0.lock().unwrap().clone()).unwrap();
    (result, logged)
}

#[test]
fn a_million_empty_log_lines_cost_what_lines_cost() {
    // Each line is a host call and costs at least MIN_LOG_LINE_COST of the log budget: the
    // guest is stopped at its host-call limit, and the runtime wrote a bounded number of lines.
    let limits = Limits::default().with_timeout(Duration::from_secs(10));
    let (result, logged) = logged_call("log-lines", limits, false);
    let err = result.expect_err("a million host calls are past the limit");
    assert!(
        matches!(err, CallError::HostCallLimit { limit: 10_000 }),
        "{err:?}"
    );
    let lines = logged.lines().count();
    let most = limits.log_bytes / MIN_LOG_LINE_COST;
    assert!(
        lines <= most + 2,
        "{lines} runtime log lines for one call (at most {most} guest lines + the warning)"
    );
    assert!(lines >= most, "only {lines} lines: the budget was not used");
    assert!(
        logged.contains("dropped_lines="),
        "no warning counts the dropped lines"
    );
    // Given fewer lines than the budget holds (what is left of its tenant's rate), a call
    // logs no more.
    let (result, logged) = logged_call("log-lines", limits.with_log_lines(7), false);
    assert!(result.is_err());
    let guest_lines = logged.lines().filter(|l| !l.contains("dropped")).count();
    assert_eq!(guest_lines, 7, "{logged}");
    assert_still_serves();
}

#[test]
fn guest_text_cannot_forge_a_runtime_log_line() {
    for json in [false, true] {
        let (result, logged) = logged_call("forge-log", Limits::default(), json);
        let err = result.expect_err("forge-log fails");
        for line in logged.lines() {
            assert!(
                !line.starts_with("2026-01-01T00:00:00.000000Z"),
                "a forged line in the runtime's log (json: {json}): {line}"
            );
            assert!(!line.contains('\r') && !line.contains('\u{1b}'), "{line:?}");
        }
        // Each of the three texts is there, its line break escaped.
        let escaped = logged.matches("FORGED by a guest").count();
        assert_eq!(
            escaped, 2,
            "the log and stdout lines (json: {json}): {logged}"
        );
        let message = err.to_string();
        assert!(
            message.contains("failed\\n2026-01-01") && !message.contains('\n'),
            "{message}"
        );
    }
}

/// Three ConfigMaps, whatever is asked.
struct ThreeConfigMaps;

impl Reads for ThreeConfigMaps {
    fn get(&self, _: &str, _: &str, _: Option<&str>, _: &str) -> Result<Option<Value>, Error> {
        Ok(None)
    }

    fn list(
        &self,
        api_version: &str,
        kind: &str,
        _: Option<&str>,
        _: Option<&str>,
    ) -> Result<Vec<Value>, Error> {
        assert_eq!((api_version, kind), ("v1", "ConfigMap"));
        Ok((1..=3)
            .map(|i| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("cm-{i}"), "namespace": "test"}}))
            .collect())
    }
}

#[test]
fn reads_go_through_the_reads_given() {
    let outcome = call_with(
        &HOSTILE,
        hostile_request("read"),
        Arc::new(ThreeConfigMaps),
        Limits::default(),
    )
    .expect("read mode");
    assert_eq!(
        outcome.response.actions,
        vec![Action::SetStatus(json!({"seen": 3}))]
    );
    assert_eq!(outcome.host_calls, 1);
}

/// Forty ConfigMaps of 256 KiB each: 10 MiB of text.
struct BigConfigMaps;

impl Reads for BigConfigMaps {
    fn get(&self, _: &str, _: &str, _: Option<&str>, _: &str) -> Result<Option<Value>, Error> {
        Ok(None)
    }

    fn list(
        &self,
        _: &str,
        _: &str,
        _: Option<&str>,
        _: Option<&str>,
    ) -> Result<Vec<Value>, Error> {
        let data = "x".repeat(256 << 10);
        Ok((0..40)
            .map(|i| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("cm-{i}")}, "data": {"big": data}}))
            .collect())
    }
}

#[test]
fn a_list_larger_than_the_guest_memory_is_refused_before_it_is_copied_out() {
    let limits = Limits::default().with_memory_bytes(4 << 20);
    let err = call_with(
        &HOSTILE,
        hostile_request("read"),
        Arc::new(BigConfigMaps),
        limits,
    )
    .expect_err("the list does not fit");
    let message = err.to_string();
    assert!(
        message.contains("more than the reconcile's memory limit of 4194304 bytes (40 objects)"),
        "{message}"
    );
    // With room for it, the same list is handed over.
    let outcome = call_with(
        &HOSTILE,
        hostile_request("read"),
        Arc::new(BigConfigMaps),
        Limits::default().with_memory_bytes(64 << 20),
    )
    .expect("the list fits");
    assert_eq!(
        outcome.response.actions,
        vec![Action::SetStatus(json!({"seen": 40}))]
    );
}

#[test]
fn not_wasm_is_refused() {
    let err = SANDBOX.load(b"apiVersion: v1\nkind: Pod\n").unwrap_err();
    assert!(matches!(err, LoadError::NotWasm), "{err:?}");
    assert!(SANDBOX.load(b"").is_err());
}

#[test]
fn core_module_is_not_a_component() {
    let err = SANDBOX.load(b"\0asm\x01\0\0\0").unwrap_err();
    assert!(matches!(err, LoadError::NotAComponent), "{err:?}");
    assert!(err.to_string().contains("wasm32-wasip2"), "{err}");
}

#[test]
fn empty_component_is_the_wrong_world() {
    // `(component)`: a valid component that exports no reconciler.
    let err = SANDBOX.load(b"\0asm\x0d\0\x01\0").unwrap_err();
    assert!(matches!(err, LoadError::WrongWorld(_)), "{err:?}");
    assert!(
        err.to_string()
            .contains("kubewasm:controller/controller@0.3.0"),
        "{err}"
    );
}

/// A component exporting `f(s: string)`, lifted with `encoding`, optionally nested in another.
fn component_with_strings(encoding: &str, nested: bool) -> Vec<u8> {
    let inner = format!(
        r#"(component
             (core module $m
               (memory (export "mem") 1)
               (func (export "f") (param i32 i32))
               (func (export "realloc") (param i32 i32 i32 i32) (result i32) i32.const 0))
             (core instance $i (instantiate $m))
             (func (export "f") (param "s" string)
               (canon lift (core func $i "f") (memory (core memory $i "mem")) (realloc (core func $i "realloc")) string-encoding={encoding})))"#
    );
    let text = if nested {
        format!("(component {inner})")
    } else {
        inner
    };
    wat::parse_str(text).unwrap()
}

#[test]
fn components_with_utf16_or_latin1_strings_are_refused_before_compiling() {
    for encoding in ["utf16", "latin1+utf16"] {
        for nested in [false, true] {
            let err = SANDBOX
                .load(&component_with_strings(encoding, nested))
                .unwrap_err();
            assert!(
                matches!(err, LoadError::StringEncoding { .. }),
                "{encoding} nested={nested}: {err:?}"
            );
            assert!(err.to_string().contains("UTF-8 strings only"), "{err}");
        }
    }
    // The same component with UTF-8 strings passes the check (and is refused for its world).
    let err = SANDBOX
        .load(&component_with_strings("utf8", false))
        .unwrap_err();
    assert!(matches!(err, LoadError::WrongWorld(_)), "{err:?}");
}

#[test]
fn truncated_component_does_not_compile() {
    let bytes = std::fs::read(common::guest("hello_world")).unwrap();
    let err = SANDBOX.load(&bytes[..bytes.len() / 2]).unwrap_err();
    assert!(matches!(err, LoadError::Compile(_)), "{err:?}");
}

#[test]
fn oversized_module_is_refused() {
    let small = SandboxConfig {
        max_module_bytes: 1024,
        ..SandboxConfig::default()
    };
    let sandbox = Sandbox::new(small).unwrap();
    let bytes = std::fs::read(common::guest("hello_world")).unwrap();
    let err = sandbox.load(&bytes).unwrap_err();
    assert!(
        matches!(err, LoadError::TooLarge { size, limit: 1024 } if size == bytes.len()),
        "{err:?}"
    );
}

/// The bench's measuring knob: an Engine without epoch interruption runs the same guest to
/// the same answer (the `compute` mode the bench times both ways).
#[test]
fn without_epoch_interruption_a_guest_computes_the_same() {
    let off = Sandbox::new(SandboxConfig {
        max_instances: 2,
        epoch_interruption: false,
        ..SandboxConfig::default()
    })
    .unwrap();
    let bytes = std::fs::read(common::guest("hostile")).unwrap();
    let request = Request::for_object(json!({
        "apiVersion": "example.com/v1",
        "kind": "Hostile",
        "metadata": {"name": "h-compute", "namespace": "test"},
        "spec": {"mode": "compute", "rounds": 1000},
    }))
    .unwrap();
    let status = |guest: &GuestPre| match guest
        .call(&request, Arc::new(NoReads), &Limits::default())
        .expect("compute returns")
        .response
        .actions
        .as_slice()
    {
        [Action::SetStatus(status)] => status.clone(),
        other => panic!("expected one setStatus, got {other:?}"),
    };
    let with_epochs = status(&SANDBOX.load(&bytes).unwrap());
    let computed = with_epochs["computed"].as_str().expect("a string");
    assert!(computed.parse::<u64>().is_ok(), "{with_epochs}");
    assert_eq!(status(&off.load(&bytes).unwrap()), with_epochs);
}

#[test]
fn same_bytes_load_once() {
    let bytes = std::fs::read(common::guest("hello_world")).unwrap();
    let first = SANDBOX.load(&bytes).unwrap();
    let second = SANDBOX.load(&bytes).unwrap();
    assert_eq!(first.digest(), second.digest());
    assert!(
        Arc::ptr_eq(&first, &second),
        "the second load compiled again"
    );
    assert_eq!(first.digest(), Digest::of(&bytes));
    assert_eq!(first.size(), bytes.len());
    let shown = first.digest().to_string();
    assert!(
        shown.starts_with("sha256:") && shown.len() == 7 + 64,
        "{shown}"
    );
    let other = SANDBOX
        .load(&std::fs::read(common::guest("hostile")).unwrap())
        .unwrap();
    assert_ne!(first.digest(), other.digest());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_looping_call_does_not_hold_up_the_others() {
    let limit = Duration::from_millis(200);
    let calls = (0..8).map(|i| {
        let mode = if i == 3 { "loop" } else { "ok" };
        SANDBOX.reconcile(
            "test",
            Arc::clone(&HOSTILE),
            hostile_request(mode),
            Arc::new(NoReads),
            Limits::default().with_timeout(limit),
        )
    });
    let results = tokio::time::timeout(WATCHDOG, futures::future::join_all(calls))
        .await
        .expect("8 concurrent calls, one looping, did not all return");
    for (i, result) in results.iter().enumerate() {
        match (i, result) {
            (3, Err(CallError::Timeout { limit: l })) => assert_eq!(*l, limit),
            (3, other) => panic!("the looping call: expected Timeout, got {other:?}"),
            (_, Ok(outcome)) => assert_ok_response("ok", outcome),
            (_, Err(err)) => panic!("call {i} failed beside the looping one: {err}"),
        }
    }
}

/// A Sandbox of its own with a single instance slot (every call runs in the slot the call
/// before it used), and the hostile guest loaded in it.
fn one_slot_hostile() -> (Sandbox, Arc<GuestPre>) {
    let one_slot = Sandbox::new(SandboxConfig {
        max_instances: 1,
        ..SandboxConfig::default()
    })
    .expect("a sandbox with one instance slot");
    let hostile = one_slot
        .load(&std::fs::read(common::guest("hostile")).unwrap())
        .unwrap();
    (one_slot, hostile)
}

/// A guest blocked in a WASI call (sleeping on a clock) never reaches an epoch check; its
/// reconcile must still end at the deadline and give its instance slot back: with a single
/// slot, a good guest runs right after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_blocked_in_wasi_times_out_and_frees_its_slot() {
    let (one_slot, hostile) = one_slot_hostile();
    let limit = Duration::from_millis(200);
    for _ in 0..3 {
        let slept = tokio::time::timeout(
            WATCHDOG,
            one_slot.reconcile(
                "test",
                hostile.clone(),
                hostile_request("sleep"),
                Arc::new(NoReads),
                Limits::default().with_timeout(limit),
            ),
        )
        .await
        .expect("a sleeping guest was not stopped");
        match slept {
            Err(CallError::Timeout { limit: l }) => assert_eq!(l, limit),
            other => panic!("the sleeping guest: expected Timeout, got {other:?}"),
        }
    }
    let ok = tokio::time::timeout(
        WATCHDOG,
        one_slot.reconcile(
            "test",
            hostile,
            hostile_request("ok"),
            Arc::new(NoReads),
            Limits::default(),
        ),
    )
    .await
    .expect("the only slot was still taken by a sleeping guest")
    .expect("a good guest after sleeping ones");
    assert_ok_response("ok", &ok);
}

/// `--compiled-cache-dir`: a second Sandbox on the same directory (a restarted runtime, a new
/// leader) loads the module compiled by the first instead of compiling it, and it runs;
/// other bytes, or an engine with other settings, are compiled anew.
#[test]
fn a_restart_loads_compiled_modules_from_the_cache() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let config = |epochs: bool| SandboxConfig {
        compiled_cache: Some(CompiledCache {
            dir: dir.path().to_owned(),
            max_bytes: 256 << 20,
        }),
        epoch_interruption: epochs,
        max_instances: 2,
        ..SandboxConfig::default()
    };
    let wasm = std::fs::read(common::guest("hello_world")).expect("reading the guest");
    let counts = |s: &Sandbox| (s.compilations().compiled(), s.compilations().cached());

    let first = Sandbox::new(config(true)).expect("the sandbox starts");
    first.load(&wasm).expect("hello_world loads");
    assert_eq!(counts(&first), (1, 0), "a cold cache compiles");
    drop(first);

    let restarted = Sandbox::new(config(true)).expect("the sandbox starts");
    let guest = restarted.load(&wasm).expect("hello_world loads");
    assert_eq!(
        counts(&restarted),
        (0, 1),
        "a restart takes it from the cache"
    );
    let outcome = guest
        .call(
            Request::for_object(json!({"apiVersion": "example.com/v1", "kind": "HelloWorld",
                "metadata": {"name": "cached", "namespace": "ns"}, "spec": {"who": "Cache"}}))
            .expect("a request"),
            Arc::new(NoReads),
            &Limits::default(),
        )
        .expect("the cached module runs");
    assert!(
        serde_json::to_string(&outcome.response.actions)
            .unwrap_or_default()
            .contains("Hello, Cache!"),
        "{:?}",
        outcome.response.actions
    );

    let other = common::with_custom_section(wasm.clone(), "other", b"bytes");
    restarted.load(&other).expect("the variant loads");
    assert_eq!(counts(&restarted), (1, 1), "other bytes are compiled");

    let other_settings = Sandbox::new(config(false)).expect("the sandbox starts");
    other_settings.load(&wasm).expect("hello_world loads");
    assert_eq!(
        counts(&other_settings),
        (1, 0),
        "an engine with other settings compiles its own"
    );
}

/// Instance reuse: one instance slot, so that every call runs in the memory and tables the
/// call before it used (the pool resets a slot when it is handed back: the first 4 MiB zeroed
/// in place, the rest decommitted). Each call of the hostile guest's `remember` leaves a
/// secret in a static and in 12 MiB of heap, then the next — of another tenant, then of the
/// same — grows its memory as large and looks through all of it, and through its statics, for
/// the one before's: nothing, every time. That the look finds what is there is checked in the
/// same call (its own secret, once left). (`ahead::` runs the same rounds with instances made
/// ahead.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_sees_nothing_an_earlier_call_left_in_its_instance() {
    let (one_slot, hostile) = one_slot_hostile();
    let ahead = remember_rounds(&one_slot, &hostile, None).await;
    assert_eq!(
        ahead, 0,
        "no instance is made ahead without a controller's Ready"
    );
}

/// Six rounds of `remember` (team-a, team-b, team-b, …), each checking that nothing of the
/// round before is found; with `readies`, each tenant's controller has its [`Ready`] and a
/// round whose instance was ready before it started must have been served by it. Returns how
/// many rounds were.
async fn remember_rounds(
    sandbox: &Sandbox,
    hostile: &Arc<GuestPre>,
    readies: Option<&[(&str, Ready)]>,
) -> usize {
    /// `REMEMBER_BYTES` of the hostile guest.
    const LEFT_BYTES: usize = 12 << 20;
    let mut before = String::from("nothing-before");
    let mut ahead = 0;
    for round in 0..6 {
        let tenant = ["team-a", "team-b", "team-b"][round % 3];
        let ready = readies.and_then(|r| r.iter().find(|(t, _)| *t == tenant).map(|(_, r)| r));
        if let Some(ready) = ready {
            // A busy controller's next instance is made while this one waits a moment.
            for _ in 0..100 {
                if ready.holds() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        let held = ready.is_some_and(Ready::holds);
        let secret = format!("{tenant}-secret-{round}-7f3c91");
        let request = Request::for_object(json!({
            "apiVersion": "example.com/v1",
            "kind": "Hostile",
            "metadata": {"name": "remember", "namespace": tenant},
            "spec": {"mode": "remember", "secret": secret, "lookFor": before},
        }))
        .expect("a valid request")
        .with_controller(format!("{tenant}/hostile"));
        let limits = Limits::default().with_timeout(Duration::from_secs(10));
        let call = async {
            let (tenant, guest, reads) = (tenant, hostile.clone(), Arc::new(NoReads));
            match ready {
                None => {
                    sandbox
                        .reconcile(tenant, guest, request, reads, limits)
                        .await
                }
                Some(ready) => {
                    let (called, tidy) = (sandbox)
                        .reconcile_ahead(tenant, guest, request, reads, limits, ready)
                        .await;
                    tidy.run().await;
                    called
                }
            }
        };
        let outcome = tokio::time::timeout(WATCHDOG, call)
            .await
            .expect("a remembering call did not return")
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert_eq!(
            outcome.made_ahead, held,
            "round {round}: an instance ready before the call serves it"
        );
        ahead += usize::from(outcome.made_ahead);
        let status = outcome
            .response
            .actions
            .iter()
            .find_map(|a| match a {
                Action::SetStatus(s) => Some(s.clone()),
                _ => None,
            })
            .unwrap_or_else(|| panic!("round {round}: no status: {:?}", outcome.response));
        assert_eq!(
            (
                &status["callsBefore"],
                &status["staticHeld"],
                &status["found"]
            ),
            (&json!(0), &json!(0), &json!(0)),
            "round {round} ({tenant}) saw what the call before it left: {status}"
        );
        let own = status["foundOwn"].as_u64().unwrap_or(0) as usize;
        assert!(
            own >= LEFT_BYTES / secret.len(),
            "round {round}: the look found its own secret only {own} times: it does not see memory"
        );
        before = secret;
    }
    ahead
}
