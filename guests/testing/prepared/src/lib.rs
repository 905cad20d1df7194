//! A test guest of world `prepared-controller` (guest-sdk/wit/kubewasm.wit), written against
//! the bare WIT contract: the host calls `prepare` on each instance it makes ahead, and this
//! guest says in its answer what its `prepare` did. What `prepare` does is chosen by the bytes
//! after [`MODE_MARKER`] in the module's data, which a test overwrites in the built `.wasm`
//! (`prepare` has no request to read a mode from; one build serves every mode):
//!
//! | mode | `prepare` |
//! | --- | --- |
//! | `count` | counts the call |
//! | `loop` | computes forever |
//! | `trap` | panics |
//! | `sleep` | sleeps an hour in WASI (blocked in the host, not computing) |
//! | `respond` | counts, and answers with an apply of ConfigMap [`FROM_PREPARE`] |
//! | `read` | counts, and reads as `reconcile` does (below): what it found is in the answer |
//! | `log` | counts, and logs [`PREPARE_LOG_LINES`] lines `prepared <n>` |
//! | `hold` | counts, and keeps [`HOLD_BYTES`] it wrote |
//!
//! `reconcile` lists ConfigMaps and gets ConfigMap `settings`, and answers with one `setStatus`:
//! `{"mode", "prepares", "preparedSaw", "held", "saw"}` — how many times `prepare` ran in this
//! instance, what its reads found (`null` when it read nothing), how many bytes it holds, and what
//! the reconcile's own reads found (`{"listed": <count>, "got": "found" | "not found" |
//! "refused"}`).

use std::cell::RefCell;
use std::hint::black_box;

#[allow(unsafe_code, missing_docs)]
mod bindings {
    wit_bindgen::generate!({
        path: "../../../guest-sdk/wit",
        world: "prepared-controller",
    });

    use super::Component;
    export!(Component);
}

use bindings::Guest;
use bindings::kubewasm::controller::host;
use bindings::kubewasm::controller::types::{LogLevel, Request};

/// Precedes the mode in the module's data; the mode is the [`MODE_BYTES`] after it, padded
/// with spaces.
pub const MODE_MARKER: &str = "kubewasm-test-prepare-mode:";

/// Bytes of the mode after [`MODE_MARKER`].
pub const MODE_BYTES: usize = 10;

/// The marker and the mode of this build, `count`; read through [`black_box`] so the compiler
/// keeps the bytes a test overwrites.
static MODE: [u8; 37] = *b"kubewasm-test-prepare-mode:count     ";

/// The ConfigMap `respond` applies in `prepare`.
pub const FROM_PREPARE: &str = "from-prepare";

/// Lines `log` logs in `prepare`.
pub const PREPARE_LOG_LINES: usize = 1_000;

/// Bytes `hold` keeps (8 MiB).
pub const HOLD_BYTES: usize = 8 << 20;

thread_local! {
    static PREPARED: RefCell<Prepared> = const { RefCell::new(Prepared { count: 0, saw: None, held: Vec::new() }) };
}

struct Prepared {
    count: u32,
    saw: Option<String>,
    held: Vec<u8>,
}

fn mode() -> String {
    let bytes = black_box(&MODE);
    String::from_utf8_lossy(&bytes[MODE_MARKER.len()..])
        .trim_end()
        .to_owned()
}

struct Component;

impl Guest for Component {
    fn prepare() {
        let mode = mode();
        match mode.as_str() {
            "loop" => loop {
                black_box(0u64);
            },
            "trap" => panic!("the prepared test guest panicked in prepare on purpose"),
            // Blocked in the host (a WASI poll), where no epoch deadline reaches it.
            "sleep" => std::thread::sleep(std::time::Duration::from_secs(3600)),
            _ => {}
        }
        PREPARED.with_borrow_mut(|p| p.count += 1);
        match mode.as_str() {
            "respond" => {
                let answer = format!(
                    r#"{{"actions":[{{"apply":{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"{FROM_PREPARE}"}}}}}}]}}"#
                );
                host::respond(Ok(&answer));
            }
            "read" => {
                let saw = reads();
                PREPARED.with_borrow_mut(|p| p.saw = Some(saw));
            }
            "log" => {
                for n in 0..PREPARE_LOG_LINES {
                    host::log(LogLevel::Info, &format!("prepared {n}"));
                }
            }
            "hold" => {
                let held = vec![0x5a; HOLD_BYTES];
                PREPARED.with_borrow_mut(|p| p.held = black_box(held));
            }
            _ => {}
        }
    }

    fn reconcile(_request: Request) {
        let saw = reads();
        let status = PREPARED.with_borrow(|p| {
            format!(
                r#"{{"mode":"{}","prepares":{},"preparedSaw":{},"held":{},"saw":{saw}}}"#,
                mode(),
                p.count,
                p.saw.as_deref().unwrap_or("null"),
                p.held.len(),
            )
        });
        let answer = format!(r#"{{"actions":[{{"setStatus":{status}}}]}}"#);
        host::respond(Ok(&answer));
    }
}

/// What the host's reads find, as JSON: `{"listed": <ConfigMaps listed, -1 when refused>, "got":
/// "found" | "not found" | "refused"}` (ConfigMap `settings`).
fn reads() -> String {
    let listed = host::list("v1", "ConfigMap", None, None).map_or(-1, |l| l.len() as i64);
    let got = match host::get("v1", "ConfigMap", None, "settings") {
        Ok(Some(_)) => "found",
        Ok(None) => "not found",
        Err(_) => "refused",
    };
    format!(r#"{{"listed":{listed},"got":"{got}"}}"#)
}
