//! How a call that did not answer ended: the [`CallError`] a trap, a limit or a guest's panic
//! becomes, its text bounded (the guest chose the function names of a backtrace and the words
//! of a panic).

use wasmtime::Trap;

use super::CallState;
use crate::error::{CallError, HostCallLimitHit};
use crate::limits::Limits;
use crate::output::Captured;
use crate::text::{MAX_GUEST_MESSAGE_BYTES, escaped, guest_text};

pub(super) fn classify(
    err: wasmtime::Error,
    state: &CallState,
    stderr: &Captured,
    limits: &Limits,
) -> CallError {
    if state.limiter.exceeded {
        return CallError::MemoryLimitExceeded {
            limit: limits.memory_bytes,
        };
    }
    if let Some(HostCallLimitHit(limit)) = err.downcast_ref::<HostCallLimitHit>() {
        return CallError::HostCallLimit { limit: *limit };
    }
    match err.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => CallError::Timeout {
            limit: limits.timeout,
        },
        Some(Trap::StackOverflow) => CallError::StackOverflow,
        Some(Trap::UnreachableCodeReached) => match panic_message(&stderr.text())
            .or_else(|| state.panic_line.as_deref().and_then(panic_message))
        {
            Some(message) => CallError::Panicked {
                message: Some(message),
            },
            None => CallError::Trap(trap_text(&err)),
        },
        _ => CallError::Trap(trap_text(&err)),
    }
}

/// The trap with its wasm backtrace, cut to [`MAX_GUEST_MESSAGE_BYTES`]: the backtrace names
/// the guest's functions, and the guest chose those names. When it is cut, the cause (which
/// comes last) goes first so that it survives.
pub(super) fn trap_text(err: &wasmtime::Error) -> String {
    let text = format!("{err:#}");
    let (whole, cut) = escaped(&text, MAX_GUEST_MESSAGE_BYTES);
    if cut == 0 {
        return whole.into_owned();
    }
    let cause = guest_text(&err.root_cause().to_string(), MAX_GUEST_MESSAGE_BYTES / 4).into_owned();
    let room = MAX_GUEST_MESSAGE_BYTES - cause.len() - "; ".len();
    format!("{cause}; {}", guest_text(&text, room))
}

/// Most bytes kept of a panic's location, so that a long one leaves room for the message.
const MAX_PANIC_LOCATION_BYTES: usize = 256;

/// Pulls the panic message out of what Rust's default panic hook printed:
/// `thread '<unnamed>' panicked at src/lib.rs:5:9:\n<message>\nnote: ...`. The guest wrote
/// it, so the result is cut to [`MAX_GUEST_MESSAGE_BYTES`], location included.
pub(super) fn panic_message(stderr: &str) -> Option<String> {
    let at = stderr.find("panicked at ")?;
    let rest = &stderr[at + "panicked at ".len()..];
    let (location, message) = rest.split_once('\n').unwrap_or((rest, ""));
    let message: Vec<&str> = message
        .lines()
        .take_while(|l| !l.starts_with("note: "))
        .collect();
    let location = guest_text(location.trim_end_matches(':'), MAX_PANIC_LOCATION_BYTES);
    let room = MAX_GUEST_MESSAGE_BYTES - location.len() - " (at )".len();
    let message = message.join("\n");
    Some(format!(
        "{} (at {location})",
        guest_text(message.trim(), room)
    ))
}
