//! Reading the runtime's JSON log (`--log-format json`) as the availability tests do.

use anyhow::{Context, Result, ensure};
use serde_json::Value;

/// What a JSON runtime log holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogLines {
    /// Lines of the runtime.
    pub lines: u64,
    /// Lines a guest of `controller` made (host `log`, stdout, stderr), not counting the
    /// runtime's notes of what it dropped.
    pub guest: u64,
}

/// Checks that every line of `log` (the test's own `=== test` markers aside) is one JSON
/// object whose message carries no unescaped line break of a guest's, and counts the lines of
/// `controller`'s guests.
pub fn json_log_lines(log: &str, controller: &str) -> Result<LogLines> {
    let mut counted = LogLines { lines: 0, guest: 0 };
    for line in log.lines().filter(|l| !l.starts_with("=== test")) {
        counted.lines += 1;
        let event: Value = serde_json::from_str(line)
            .with_context(|| format!("a runtime log line that is not one JSON object: {line}"))?;
        let message = event
            .pointer("/fields/message")
            .and_then(Value::as_str)
            .unwrap_or_default();
        ensure!(
            !message.contains("FORGED by a guest\n") && !message.contains('\r'),
            "a guest's line break reached the log: {line}"
        );
        let from_guest = event["target"] == "kubewasm_sandbox::call"
            && event.pointer("/fields/controller").and_then(Value::as_str) == Some(controller)
            && !message.contains(" dropped");
        counted.guest += u64::from(from_guest);
    }
    Ok(counted)
}
