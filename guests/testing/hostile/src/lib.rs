//! A hostile guest for the runtime's sandbox tests: one build, the misbehaviour chosen by the
//! parent object's `spec.mode` (or, for a kind without a spec such as a ConfigMap, its
//! annotation [`MODE_ANNOTATION`]).
//!
//! | `spec.mode` | behaviour |
//! | --- | --- |
//! | `ok` (or no parent, or no mode) | Apply ConfigMap `<target name>` with `data.mode: ok`, SetStatus `{"ok": true}` (not on a ConfigMap parent, which has no status) |
//! | `loop` | computes forever, no host calls |
//! | `alloc` | allocates 1 MiB chunks filled with data, forever |
//! | `panic` | panics with `hostile guest panicked on purpose` |
//! | `recurse` | unbounded recursion on wasm locals: a wasm stack overflow trap |
//! | `flood` | writes 8 MiB of `hostile guest flooding stdout` lines to stdout, then behaves like `ok` |
//! | `huge-response` | Applies a ConfigMap whose `data.big` is a 100 MiB string |
//! | `get-loop` | calls `get("v1", "ConfigMap", None, "x")` forever |
//! | `error` | returns the permanent error `hostile guest refuses` |
//! | `bad-object` | Applies the JSON number `42` |
//! | `read` | lists ConfigMaps once and sets status `{"seen": <count>}` |
//! | `sleep` | sleeps an hour in WASI (blocked in the host, not computing), then behaves like `ok` |
//! | `huge-error` | returns a permanent error whose message is [`HUGE_BYTES`] long |
//! | `read-fail` | gets ConfigMap `spec.config` (default `settings`) and fails (permanently) with its `data.value` in the message |
//! | `huge-log` | logs a [`HUGE_BYTES`] line [`HUGE_LOG_LINES`] times through the host, then behaves like `ok` |
//! | `log-loop` | logs like `huge-log`, then asks to be reconciled again in a second (a poll, which the runtime does not damp), every time: a guest logging at its full rate for as long as it runs |
//! | `many-actions` | returns [`MANY_ACTIONS`] `requeue-after` actions |
//! | `log-lines` | logs [`LOG_LINES`] empty lines through the host, then behaves like `ok` |
//! | `forge-log` | logs, prints and fails (retryable) with text that carries a line break and a [`FORGED`] runtime log line after it |
//! | `compose` | applies a child Pod named after the target from `spec.pod` (`labels` and `spec`), and records the Event `Composed` every time |
//! | `requeue-zero` | sets status `{"requeued": true}` and asks to be reconciled again at once, every time |
//! | `requeue-write` | sets status `{"requeues": <status.requeues + 1>}` (a new status, so a write, every time) and asks to be reconciled again at once: a spin both ways, its own write's watch event and the requeue |
//! | `event-flood` | records [`EVENT_FLOOD`] Events on the parent, each with a reason of its own (`Flood000`, …), and asks to be reconciled again at once |
//! | `churn` | sets status `{"seen": <the parent's resourceVersion>}`, which changes the parent and so calls for another reconcile: a hot loop of writes, as a buggy controller makes |
//! | `hoard-state` | saves the most state an object may have ([`MAX_STATE_BYTES`] bytes, the target's name over and over), every time: a controller keeping as much as it can in etcd |
//! | `compute` | computes [`compute`] for `spec.rounds` rounds (default [`COMPUTE_ROUNDS`]), no host calls, and sets status `{"computed": <result>}` |
//! | `remember` | looks through its whole linear memory for what an earlier call left (`spec.lookFor`, hidden as [`hidden`] makes it) and in its statics, then leaves `spec.secret` there itself: a static, and [`REMEMBER_BYTES`] of heap; sets status `{"callsBefore", "staticHeld", "found", "foundOwn"}` ([`remember`]) |
//!
//! Modes that step around the SDK and call the host imports directly (wasm only), as a
//! guest written against the bare WIT contract could:
//!
//! | `spec.mode` | behaviour |
//! | --- | --- |
//! | `raw-huge-response` | responds with a valid document behind [`ATTACK_BYTES`] of leading spaces |
//! | `raw-huge-error` | responds with an error whose message is [`ATTACK_BYTES`] long |
//! | `raw-huge-selector` | lists ConfigMaps with a [`HUGE_BYTES`] label selector and responds with the host's refusal as a permanent error |
//! | `raw-huge-read` | gets a ConfigMap whose name is [`HUGE_BYTES`] long, and responds like `raw-huge-selector` |
//! | `respond-twice` | responds twice |
//! | `no-respond` | returns without responding |
//!
//! Any other mode is a permanent error naming the mode.

use std::hint::black_box;
use std::io::Write as _;

use kubewasm_guest_sdk::{
    Cluster, Error, EventType, LogLevel, MAX_STATE_BYTES, Request, Response, object,
};
use serde_json::json;

/// Where a parent without a spec (a ConfigMap) names its mode.
pub const MODE_ANNOTATION: &str = "kubewasm.dev/hostile-mode";

/// The line `flood` writes, so tests can recognise it in captured output.
pub const FLOOD_LINE: &str = "hostile guest flooding stdout";

/// How much `flood` writes.
pub const FLOOD_BYTES: usize = 8 << 20;

/// How long the text of `huge-error` and each line of `huge-log` is (1 MiB).
pub const HUGE_BYTES: usize = 1 << 20;

/// How many lines `huge-log` logs.
pub const HUGE_LOG_LINES: usize = 64;

/// How many empty lines `log-lines` logs.
pub const LOG_LINES: usize = 1_000_000;

/// What `forge-log` puts after a line break, as if the runtime had logged it.
pub const FORGED: &str = "2026-01-01T00:00:00.000000Z  INFO kubewasm::manager: FORGED by a guest";

/// How many actions `many-actions` returns.
pub const MANY_ACTIONS: usize = 200_000;

/// How long the raw attacks' strings are (60 MiB).
pub const ATTACK_BYTES: usize = 60 << 20;

/// How many Events `event-flood` records per reconcile.
pub const EVENT_FLOOD: usize = 500;

/// Rounds `compute` runs when the parent does not say (`spec.rounds`).
pub const COMPUTE_ROUNDS: u64 = 1_000_000;

/// Do whatever `spec.mode` asks for.
pub fn reconcile(req: &Request, cluster: &dyn Cluster) -> Result<Response, Error> {
    let mode = req
        .parent
        .as_ref()
        .and_then(|parent| {
            object::spec_str(parent, "mode").or_else(|| object::annotation(parent, MODE_ANNOTATION))
        })
        .unwrap_or("ok");
    match mode {
        "ok" => Ok(well_behaved(req)),
        "loop" => spin(),
        "alloc" => hoard(),
        "panic" => panic!("hostile guest panicked on purpose"),
        "recurse" => {
            let result = recurse(black_box(1));
            Ok(Response::new().set_status(json!({ "unreachable": result })))
        }
        "flood" => {
            flood();
            Ok(well_behaved(req))
        }
        "huge-response" => Ok(huge_response(req)),
        "get-loop" => loop {
            let _ = black_box(cluster.get("v1", "ConfigMap", None, "x"));
        },
        "error" => Err(Error::permanent("hostile guest refuses")),
        "bad-object" => Ok(Response::new().apply(json!(42))),
        "read" => {
            let seen = cluster.list("v1", "ConfigMap", None, None)?.len();
            Ok(Response::new().set_status(json!({ "seen": seen })))
        }
        "huge-error" => Err(Error::permanent(huge_text("hostile guest error"))),
        // Fails with what it read: only a replay that answers its read as it was answered
        // live fails with the same words.
        "read-fail" => {
            let name = req
                .parent
                .as_ref()
                .and_then(|p| object::spec_str(p, "config"))
                .unwrap_or("settings");
            let said = cluster
                .get("v1", "ConfigMap", None, name)?
                .and_then(|cm| {
                    cm.pointer("/data/value")
                        .and_then(|v| v.as_str().map(str::to_owned))
                })
                .unwrap_or_default();
            Err(Error::permanent(format!(
                "ConfigMap {name} says {said:?}: refused"
            )))
        }
        // Blocked in a WASI poll (a clock), where no epoch deadline can reach it.
        "sleep" => {
            std::thread::sleep(std::time::Duration::from_secs(3600));
            Ok(well_behaved(req))
        }
        "log-lines" => {
            for _ in 0..LOG_LINES {
                cluster.log(LogLevel::Info, black_box(""));
            }
            Ok(well_behaved(req))
        }
        "forge-log" => {
            cluster.log(LogLevel::Info, &format!("ok\n{FORGED}\r\u{1b}[2K"));
            println!("ok\r{FORGED}");
            Err(Error::retryable(format!("failed\n{FORGED}")))
        }
        "huge-log" => {
            let line = huge_text("hostile guest log line");
            for _ in 0..HUGE_LOG_LINES {
                cluster.log(LogLevel::Warn, black_box(&line));
            }
            Ok(well_behaved(req))
        }
        "log-loop" => {
            let line = huge_text("hostile guest log line");
            for _ in 0..HUGE_LOG_LINES {
                cluster.log(LogLevel::Warn, black_box(&line));
            }
            Ok(Response::new().requeue_after(std::time::Duration::from_secs(1)))
        }
        "many-actions" => Ok((0..MANY_ACTIONS).fold(Response::new(), |r, _| {
            r.requeue_after(std::time::Duration::from_secs(1))
        })),
        "compose" => Ok(compose(req)),
        "churn" => {
            let seen = req
                .parent
                .as_ref()
                .and_then(|parent| parent.pointer("/metadata/resourceVersion"))
                .cloned()
                .unwrap_or_default();
            Ok(Response::new().set_status(json!({ "seen": seen })))
        }
        "requeue-zero" => Ok(Response::new()
            .set_status(json!({ "requeued": true }))
            .requeue_after(std::time::Duration::ZERO)),
        "requeue-write" => {
            let requeues = req
                .parent
                .as_ref()
                .and_then(|parent| parent.pointer("/status/requeues")?.as_u64())
                .unwrap_or(0);
            Ok(Response::new()
                .set_status(json!({ "requeues": requeues.saturating_add(1) }))
                .requeue_after(std::time::Duration::ZERO))
        }
        "event-flood" => Ok((0..EVENT_FLOOD)
            .fold(Response::new(), |r, i| {
                r.event(
                    EventType::Normal,
                    format!("Flood{i:03}"),
                    format!("flood {i} of {EVENT_FLOOD}"),
                )
            })
            .requeue_after(std::time::Duration::ZERO)),
        "compute" => {
            let rounds = req
                .parent
                .as_ref()
                .and_then(|parent| parent.pointer("/spec/rounds")?.as_u64())
                .unwrap_or(COMPUTE_ROUNDS);
            // A string: JSON numbers past 2^53 do not survive every reader.
            Ok(Response::new().set_status(json!({ "computed": compute(rounds).to_string() })))
        }
        "remember" => Ok(remember(req)),
        "hoard-state" => Ok(Response::new().set_state(hoarded(&req.target.name))),
        other => Err(Error::permanent(format!("unknown hostile mode {other:?}"))),
    }
}

/// How many bytes of heap `remember` fills with its secret (past the 4 MiB of an instance's
/// memory the pool keeps resident and zeroes itself, so that both ways a slot is reset are
/// looked through), and grows its memory by before it looks.
pub const REMEMBER_BYTES: usize = 12 << 20;

/// Calls of `remember` this instance has seen.
static REMEMBERED_CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The secret `remember` left in a static.
static REMEMBERED: std::sync::Mutex<Vec<u8>> = std::sync::Mutex::new(Vec::new());

/// How a secret is kept in memory: every byte flipped by this mask, so that the secret as
/// the request carries it (copied into memory by the call) is not what is looked for.
pub const HIDE: u8 = 0x5a;

/// `secret` as `remember` keeps it in memory.
pub fn hidden(secret: &str) -> Vec<u8> {
    secret.bytes().map(|b| b ^ HIDE).collect()
}

/// Looks for what an earlier call of this guest left behind — in its statics, and anywhere
/// in its linear memory (the hidden form of `spec.lookFor`) — then leaves `spec.secret` in a
/// static and in [`REMEMBER_BYTES`] of leaked heap, and looks for that too (the scan finds
/// what is there). Status: `callsBefore` (this instance's earlier calls), `staticHeld` (bytes
/// in the static), `found` (places `lookFor` was found), `foundOwn` (places its own secret
/// was found once left).
fn remember(req: &Request) -> Response {
    let spec = |key: &str| {
        req.parent
            .as_ref()
            .and_then(|p| object::spec_str(p, key))
            .unwrap_or_default()
            .to_owned()
    };
    let (secret, look_for) = (spec("secret"), spec("lookFor"));
    // Memory as large as an earlier call's, before looking through it.
    let room = black_box(vec![1u8; REMEMBER_BYTES]);
    drop(room);
    let found = occurrences(look_for.as_bytes());
    let calls_before = REMEMBERED_CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let held = REMEMBERED.lock().map(|s| s.len()).unwrap_or(0);
    let kept = hidden(&secret);
    if let Ok(mut s) = REMEMBERED.lock() {
        s.clone_from(&kept);
    }
    let mut leak = Vec::with_capacity(REMEMBER_BYTES);
    while !kept.is_empty() && leak.len() + kept.len() <= REMEMBER_BYTES {
        leak.extend_from_slice(&kept);
    }
    std::mem::forget(black_box(leak));
    let found_own = occurrences(secret.as_bytes());
    Response::new().set_status(json!({
        "callsBefore": calls_before,
        "staticHeld": held,
        "found": found,
        "foundOwn": found_own,
    }))
}

/// How many places of this instance's whole linear memory hold `secret` hidden ([`hidden`]),
/// compared byte by byte as it is read, so that the hidden form is never written anywhere by
/// looking for it.
#[cfg(target_arch = "wasm32")]
#[allow(unsafe_code)]
fn occurrences(secret: &[u8]) -> usize {
    let Some((&first, rest)) = secret.split_first() else {
        return 0;
    };
    let size = core::arch::wasm32::memory_size(0) * 65536;
    // Every address of linear memory is readable by the guest: that is what is being tested.
    let byte = |at: usize| unsafe { core::ptr::read_volatile(at as *const u8) };
    (1..size.saturating_sub(secret.len()))
        .filter(|&at| {
            byte(at) == first ^ HIDE
                && rest
                    .iter()
                    .enumerate()
                    .all(|(i, &b)| byte(at + 1 + i) == b ^ HIDE)
        })
        .count()
}

/// Natively there is no linear memory to look through.
#[cfg(not(target_arch = "wasm32"))]
fn occurrences(_secret: &[u8]) -> usize {
    0
}

/// What `hoard-state` saves for object `name`: [`MAX_STATE_BYTES`] bytes of it, repeated.
pub fn hoarded(name: &str) -> String {
    let seed = if name.is_empty() { "x" } else { name };
    seed.chars().cycle().take(MAX_STATE_BYTES).collect()
}

fn well_behaved(req: &Request) -> Response {
    let config_map = object::object(
        "v1",
        "ConfigMap",
        req.target.namespace.as_deref(),
        &req.target.name,
    )
    .data(json!({ "mode": "ok" }));
    let response = Response::new().apply(config_map);
    if req.target.kind == "ConfigMap" {
        response
    } else {
        response.set_status(json!({ "ok": true }))
    }
}

fn compose(req: &Request) -> Response {
    let name = &req.target.name;
    let pod = req
        .parent
        .as_ref()
        .and_then(|p| p.pointer("/spec/pod"))
        .cloned()
        .unwrap_or_default();
    Response::new()
        .apply(json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": pod.get("labels").cloned().unwrap_or_default()},
            "spec": pod.get("spec").cloned().unwrap_or_default(),
        }))
        .event(
            EventType::Normal,
            "Composed",
            format!("composed Pod {name}"),
        )
}

fn spin() -> ! {
    let mut counter: u64 = 0;
    loop {
        counter = black_box(counter.wrapping_add(1));
    }
}

/// A fixed amount of work: the sum of splitmix64's output for `0..rounds`. The rounds do not
/// depend on each other, so the loop runs at the core's arithmetic throughput and a check at
/// each loop back-edge (epoch interruption) shows as much as it ever can.
pub fn compute(rounds: u64) -> u64 {
    (0..rounds).fold(0u64, |sum, i| {
        let mut z = i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        sum.wrapping_add(z ^ (z >> 31))
    })
}

fn hoard() -> ! {
    let mut chunks: Vec<Vec<u8>> = Vec::new();
    loop {
        chunks.push(vec![0xA5; 1 << 20]);
        black_box(&chunks);
    }
}

/// Each frame holds only wasm locals (no address taken, so nothing on the shadow stack in
/// linear memory), and the work after the call keeps LLVM from turning it into a loop.
#[inline(never)]
fn recurse(n: u64) -> u64 {
    if n == 0 {
        return 0;
    }
    recurse(n.wrapping_add(1)).rotate_left(1) ^ n
}

fn flood() {
    let mut stdout = std::io::stdout().lock();
    let mut written = 0;
    let mut line = 0u64;
    while written < FLOOD_BYTES {
        let text = format!("{FLOOD_LINE} {line:08}\n");
        // A host that stops taking output must not turn the flood into a panic.
        let _ = stdout.write_all(text.as_bytes());
        written += text.len();
        line += 1;
    }
    let _ = stdout.flush();
}

/// `HUGE_BYTES` of text starting with `start`, with multi-byte characters at every cut.
fn huge_text(start: &str) -> String {
    let mut text = format!("{start} ");
    while text.len() + "é".len() <= HUGE_BYTES {
        text.push('é');
    }
    text.push_str(&"x".repeat(HUGE_BYTES - text.len()));
    text
}

fn huge_response(req: &Request) -> Response {
    let big = "x".repeat(100 << 20);
    let config_map = object::object(
        "v1",
        "ConfigMap",
        req.target.namespace.as_deref(),
        &req.target.name,
    )
    .data(json!({ "big": big }));
    Response::new().apply(config_map)
}

/// The guest's own export: the raw modes step around the SDK, every other mode goes through it.
#[cfg(target_arch = "wasm32")]
mod raw {
    use kubewasm_guest_sdk::__private::bindings::kubewasm::controller::{host, types};
    use kubewasm_guest_sdk::__private::{self as sdk, bindings};
    use serde_json::Value;

    use super::{ATTACK_BYTES, HUGE_BYTES};

    struct Hostile;

    const EMPTY: &str = r#"{"actions": []}"#;

    fn refused(result: Result<impl Sized, types::Error>) -> Result<&'static str, types::Error> {
        match result {
            Ok(_) => Err(types::Error {
                message: "the host accepted it".into(),
                retryable: false,
            }),
            Err(refusal) => Err(refusal),
        }
    }

    impl bindings::Guest for Hostile {
        fn reconcile(request: sdk::WitRequest) {
            let mode = request
                .parent
                .as_deref()
                .and_then(|p| serde_json::from_str::<Value>(p).ok())
                .and_then(|p| p.pointer("/spec/mode")?.as_str().map(str::to_owned));
            let huge = "x".repeat(HUGE_BYTES);
            let answer = match mode.as_deref() {
                Some("raw-huge-response") => {
                    let document = format!("{}{EMPTY}", " ".repeat(ATTACK_BYTES));
                    host::respond(Ok(&document));
                    return;
                }
                Some("raw-huge-error") => Err(types::Error {
                    message: "e".repeat(ATTACK_BYTES),
                    retryable: false,
                }),
                Some("raw-huge-selector") => refused(host::list(
                    "v1",
                    "ConfigMap",
                    None,
                    Some(&format!("a={huge}")),
                )),
                Some("raw-huge-read") => refused(host::get("v1", "ConfigMap", None, &huge)),
                Some("respond-twice") => {
                    host::respond(Ok(EMPTY));
                    Ok(EMPTY)
                }
                Some("no-respond") => return,
                _ => return sdk::run(request, super::reconcile),
            };
            match answer {
                Ok(document) => host::respond(Ok(document)),
                Err(e) => host::respond(Err(&e)),
            }
        }
    }

    bindings::__kubewasm_export_controller!(Hostile);
}

#[cfg(not(target_arch = "wasm32"))]
kubewasm_guest_sdk::export_reconciler!(reconcile);
