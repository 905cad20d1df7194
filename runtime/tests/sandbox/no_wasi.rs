//! Guests built without WASI (`wasm32-unknown-unknown` linked by `wasm-component-ld`,
//! docs/03-writing-a-controller.md, "Guests without WASI"): they import the host's interface and nothing else, answer exactly
//! as their `wasm32-wasip2` builds do, keep a small reconcile within their initial memory (the
//! SDK's allocator, `guest-sdk/alloc`), and meet the sandbox's limits with the same typed
//! errors — a panic's message included, which reaches the runtime through `log`.

use super::*;

static HELLO_NO_WASI: LazyLock<Arc<GuestPre>> = LazyLock::new(|| load_without_wasi("hello_world"));
static HOSTILE_NO_WASI: LazyLock<Arc<GuestPre>> = LazyLock::new(|| load_without_wasi("hostile"));

fn load_without_wasi(name: &str) -> Arc<GuestPre> {
    let bytes = std::fs::read(common::guest_without_wasi(name)).expect("reading the guest");
    SANDBOX
        .load(&bytes)
        .unwrap_or_else(|e| panic!("{name} (no WASI) does not load: {e}"))
}

/// The interfaces a component imports (`kubewasm:controller/host@0.3.0`,
/// `wasi:io/streams@0.2.x`, …); types it imports by name (the world's `request`) are left out.
fn imports(component: &[u8]) -> Vec<String> {
    let mut names = Vec::new();
    for payload in wasmparser::Parser::new(0).parse_all(component) {
        if let wasmparser::Payload::ComponentImportSection(section) =
            payload.expect("a valid component")
        {
            for import in section {
                let import = import.expect("a valid import");
                if matches!(import.ty, wasmparser::ComponentTypeRef::Instance(_)) {
                    names.push(import.name.name.to_string());
                }
            }
        }
    }
    names
}

/// The largest initial size of a memory the component's core modules define, in bytes.
fn initial_memory(component: &[u8]) -> u64 {
    let mut largest = 0;
    for payload in wasmparser::Parser::new(0).parse_all(component) {
        if let wasmparser::Payload::MemorySection(section) = payload.expect("a valid component") {
            for memory in section {
                largest = largest.max(memory.expect("a valid memory").initial << 16);
            }
        }
    }
    largest
}

/// HelloWorld's request with an annotation of `bytes` bytes of padding.
fn hello_request_of(bytes: usize) -> Request {
    let mut request = hello_request();
    if let Some(parent) = request.parent.as_mut() {
        parent["metadata"]["annotations"] = json!({"padding": "x".repeat(bytes)});
    }
    request
}

fn call(guest: &'static LazyLock<Arc<GuestPre>>, request: Request) -> CallOutcome {
    let what = request.target.to_string();
    call_with(guest, request, Arc::new(NoReads), Limits::default())
        .unwrap_or_else(|e| panic!("{what}: {e}"))
}

#[test]
fn a_guest_without_wasi_imports_only_the_host() {
    let without = imports(&std::fs::read(common::guest_without_wasi("hello_world")).unwrap());
    assert!(
        !without.is_empty()
            && without
                .iter()
                .all(|i| i.starts_with("kubewasm:controller/")),
        "the WASI-free build imports {without:?}"
    );
    // The same check tells the wasip2 build apart: it imports WASI whatever the guest uses.
    let with = imports(&std::fs::read(common::guest("hello_world")).unwrap());
    assert!(
        with.iter().any(|i| i.starts_with("wasi:")),
        "the wasip2 build imports {with:?}"
    );
}

/// The same answers as the wasip2 build, from 1 KiB and 64 KiB (served from the initial
/// memory's tail, 1 MiB in the workspace's guests: the instance ends the call at its initial
/// size, no `memory.grow`) to 1 MiB (past the tail: the allocator hands over to dlmalloc, and a
/// growing buffer moves from one to the other).
#[test]
fn a_guest_without_wasi_answers_as_its_wasip2_build() {
    let initial =
        initial_memory(&std::fs::read(common::guest_without_wasi("hello_world")).unwrap());
    assert!(
        initial >= 1 << 20,
        "built with {initial} bytes of initial memory: .cargo/config.toml asks for 1 MiB"
    );
    for bytes in [1 << 10, 64 << 10, 1 << 20] {
        let with = call(&HELLO, hello_request_of(bytes));
        let without = call(&HELLO_NO_WASI, hello_request_of(bytes));
        assert_eq!(without.response, with.response, "at {bytes} bytes");
        if bytes <= 64 << 10 {
            assert_eq!(
                without.memory_bytes as u64, initial,
                "a {bytes}-byte reconcile grew the WASI-free instance's memory"
            );
        } else {
            assert!(without.memory_bytes as u64 > initial, "at {bytes} bytes");
        }
    }
}

#[test]
fn a_guest_without_wasi_meets_the_same_limits() {
    let hostile = |mode: &str, limits: Limits| {
        call_with(
            &HOSTILE_NO_WASI,
            hostile_request(mode),
            Arc::new(NoReads),
            limits,
        )
    };
    match hostile("panic", Limits::default()) {
        Err(CallError::Panicked { message: Some(m) }) => {
            assert!(
                m.starts_with("hostile guest panicked on purpose (at "),
                "{m}"
            );
        }
        other => panic!("expected Panicked with the message from `log`, got {other:?}"),
    }
    let err = hostile("alloc", Limits::default().with_memory_bytes(16 << 20)).unwrap_err();
    assert!(
        matches!(err, CallError::MemoryLimitExceeded { limit } if limit == 16 << 20),
        "{err:?}"
    );
    let limit = Duration::from_millis(200);
    let err = hostile("loop", Limits::default().with_timeout(limit)).unwrap_err();
    assert!(
        matches!(err, CallError::Timeout { limit: l } if l == limit),
        "{err:?}"
    );
    let err = hostile("recurse", Limits::default()).unwrap_err();
    assert!(matches!(err, CallError::StackOverflow), "{err:?}");
    let ok = hostile("ok", Limits::default()).expect("ok mode after the others");
    assert_ok_response("ok", &ok);
}
