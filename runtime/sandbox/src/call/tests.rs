//! One call's checks, without a cluster.
use super::ended::{panic_message, trap_text};
use super::*;
use wasmtime::Trap;

#[test]
fn panic_message_is_extracted() {
    let stderr = "\nthread '<unnamed>' panicked at src/lib.rs:5:9:\nboom went the guest\nnote: run with `RUST_BACKTRACE=1`\n";
    assert_eq!(
        panic_message(stderr).as_deref(),
        Some("boom went the guest (at src/lib.rs:5:9)")
    );
    assert_eq!(panic_message("nothing here"), None);
}

#[test]
fn panic_message_and_location_are_bounded() {
    let huge = format!(
        "thread '<unnamed>' panicked at {}:1:1:\n{}\n",
        "l".repeat(1 << 20),
        "é".repeat(1 << 20)
    );
    let message = panic_message(&huge).unwrap();
    assert!(
        message.len() <= MAX_GUEST_MESSAGE_BYTES,
        "{}",
        message.len()
    );
    assert!(message.starts_with("éé"), "{}", &message[..20]);
    assert!(message.contains(" more bytes) (at llll"), "{message}");
    assert!(message.ends_with(" more bytes))"), "{message}");
}

#[test]
fn long_trap_text_keeps_its_cause() {
    let err = wasmtime::Error::new(Trap::UnreachableCodeReached)
        .context(format!("backtrace: {}", "guest_fn_".repeat(1 << 16)));
    let text = trap_text(&err);
    assert!(text.len() <= MAX_GUEST_MESSAGE_BYTES, "{}", text.len());
    assert!(
        text.starts_with(&format!(
            "{}; backtrace: guest_fn_",
            Trap::UnreachableCodeReached
        )),
        "{text}"
    );
    assert!(text.ends_with(" more bytes)"), "{text}");
    let short = wasmtime::Error::new(Trap::StackOverflow).context("at f");
    assert_eq!(trap_text(&short), format!("at f: {}", Trap::StackOverflow));
}

#[test]
fn deadline_rounds_up_and_adds_a_tick() {
    assert_eq!(
        deadline_ticks(Duration::from_secs(1), Duration::from_millis(10)),
        101
    );
    assert_eq!(
        deadline_ticks(Duration::from_millis(15), Duration::from_millis(10)),
        3
    );
}
