//! Bounded guest output: stdout/stderr capture and the host `log` budget keep the first
//! bytes and count the rest.
//!
//! A guest that floods its output is not failed for it (a full pipe would make Rust's
//! `println!` panic); it just loses what did not fit, and the log says how much.

use std::borrow::Cow;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError};

use super::text::{MAX_GUEST_LOG_LINE_BYTES, escaped};
use crate::sync::Locks as _;

/// What a guest wrote to one stream during one call.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Captured {
    /// The first bytes written, up to the limit.
    pub kept: Vec<u8>,
    /// How many bytes were written past the limit and dropped.
    pub dropped: u64,
}

impl Captured {
    /// The kept bytes as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.kept).into_owned()
    }
}

#[derive(Debug)]
struct Inner {
    captured: Captured,
    limit: usize,
}

/// A WASI output stream that never fails and never grows past its limit.
#[derive(Debug, Clone)]
pub(crate) struct BoundedOutput(Arc<Mutex<Inner>>);

impl BoundedOutput {
    pub(crate) fn new(limit: usize) -> Self {
        BoundedOutput(Arc::new(Mutex::new(Inner {
            captured: Captured::default(),
            limit,
        })))
    }

    pub(crate) fn take(&self) -> Captured {
        std::mem::take(&mut self.lock().captured)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A poisoned lock only means another writer panicked; the bytes are still valid.
        self.0.locked()
    }

    fn push(&self, bytes: &[u8]) {
        let mut inner = self.lock();
        let room = inner.limit.saturating_sub(inner.captured.kept.len());
        let keep = room.min(bytes.len());
        inner.captured.kept.extend_from_slice(&bytes[..keep]);
        inner.captured.dropped += (bytes.len() - keep) as u64;
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for BoundedOutput {
    async fn ready(&mut self) {}
}

#[wasmtime_wasi::async_trait]
impl OutputStream for BoundedOutput {
    fn write(&mut self, bytes: bytes::Bytes) -> Result<(), StreamError> {
        self.push(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> Result<(), StreamError> {
        Ok(())
    }

    fn check_write(&mut self) -> Result<usize, StreamError> {
        Ok(64 << 10)
    }
}

impl tokio::io::AsyncWrite for BoundedOutput {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.push(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl IsTerminal for BoundedOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for BoundedOutput {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

/// What is left of one call's budget for host `log` lines.
#[derive(Debug)]
pub(crate) struct LogBudget {
    limit: usize,
    used: usize,
    max_lines: usize,
    lines: usize,
    dropped: u64,
    dropped_lines: u64,
    /// Where the lines come from, when they are shared with other calls (the tenant's rate),
    /// and how many taken from it are not used yet.
    shared: Option<(SharedLines, usize)>,
}

/// A tenant's log lines a second, shared by its calls: each call takes a few at a time as it
/// logs ([`LINES_TAKEN_AT_ONCE`]), and gives back what it took and did not use when it ends,
/// so that calls running side by side share the tenant's lines by what they log, not by who
/// started first.
#[derive(Debug, Clone)]
pub struct SharedLines {
    pub rate: std::sync::Arc<super::TenantRate>,
    pub tenant: String,
}

/// Lines a call takes from its tenant's rate at once: few enough that a call cannot hold the
/// lines its tenant's other calls need, enough that a guest logging many does not lock the
/// rate for each.
pub const LINES_TAKEN_AT_ONCE: usize = 8;

/// The least a guest's log line costs of its call's log budget, an empty one too.
pub const MIN_LOG_LINE_COST: usize = 128;

impl LogBudget {
    /// A budget of `limit` bytes and at most `max_lines` lines.
    pub(crate) fn new(limit: usize, max_lines: usize) -> Self {
        LogBudget {
            limit,
            used: 0,
            max_lines,
            lines: 0,
            dropped: 0,
            dropped_lines: 0,
            shared: None,
        }
    }

    /// The same budget, whose lines are also taken from `shared` as they are logged.
    pub(crate) fn sharing(mut self, shared: Option<SharedLines>) -> Self {
        self.shared = shared.map(|s| (s, 0));
        self
    }

    /// Whether one more line may be logged now: under the call's own line cap, and a line of
    /// the shared rate in hand (a few more taken when none is).
    fn line_available(&mut self) -> bool {
        if self.lines >= self.max_lines {
            return false;
        }
        let Some((shared, taken)) = &mut self.shared else {
            return true;
        };
        if *taken == 0 {
            let want = LINES_TAKEN_AT_ONCE.min(self.max_lines - self.lines);
            *taken = shared.rate.take(&shared.tenant, want);
        }
        if *taken == 0 {
            return false;
        }
        *taken -= 1;
        true
    }

    /// What to log of `line`: escaped ([`super::text::guest_text`]), at most
    /// [`MAX_GUEST_LOG_LINE_BYTES`] and what is left of the budget, where each line costs its
    /// length and at least [`MIN_LOG_LINE_COST`] (a line costs the runtime a log record
    /// whatever its length: a million empty lines are not free); `None` once too little is
    /// left.
    pub(crate) fn admit<'a>(&mut self, line: &'a str) -> Option<Cow<'a, str>> {
        let left = self.limit.saturating_sub(self.used);
        if left < MIN_LOG_LINE_COST || !self.line_available() {
            self.used = self.limit;
            self.dropped += line.len() as u64;
            self.dropped_lines += 1;
            return None;
        }
        let (kept, cut) = escaped(line, left.min(MAX_GUEST_LOG_LINE_BYTES));
        self.used += kept.len().max(MIN_LOG_LINE_COST);
        self.lines += 1;
        self.dropped += cut as u64;
        Some(kept)
    }

    /// Lines logged.
    pub(crate) fn lines(&self) -> usize {
        self.lines
    }

    /// Lines not logged at all (over the budget).
    pub(crate) fn dropped_lines(&self) -> u64 {
        self.dropped_lines
    }

    /// Bytes of log lines not logged: cut from long lines or over the budget.
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped
    }
}

impl Drop for LogBudget {
    /// Gives back the lines taken from the shared rate and not logged: the call ended (or was
    /// dropped at its deadline).
    fn drop(&mut self) {
        if let Some((shared, taken)) = &mut self.shared {
            shared.rate.give_back(&shared.tenant, std::mem::take(taken));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_lines_are_cut_and_the_budget_is_kept() {
        let mut budget = LogBudget::new(MAX_GUEST_LOG_LINE_BYTES + 300, usize::MAX);
        assert_eq!(budget.admit("abc").as_deref(), Some("abc"));
        let long = "y".repeat(1 << 20);
        let line = budget.admit(&long).unwrap();
        assert_eq!(line.len(), MAX_GUEST_LOG_LINE_BYTES);
        assert!(
            line.ends_with(" more bytes)"),
            "{}",
            &line[line.len() - 30..]
        );
        // 128 (the least a line costs) + 4096 of 4396 used: 172 left, room for one more line,
        // cut to what is left.
        let zs = "z".repeat(500);
        let last = budget.admit(&zs).unwrap();
        assert!(last.len() <= 172 && last.starts_with("zzz"), "{last}");
        assert_eq!(budget.admit("more"), None);
        assert_eq!(budget.admit(""), None);
        assert_eq!(budget.dropped_lines(), 2);
        // The long line keeps 4072 bytes and a 24-byte marker `… (1044504 more bytes)`.
        let last_kept = last.split('…').next().unwrap().len();
        assert_eq!(
            budget.dropped(),
            ((1 << 20) - 4072) + (500 - last_kept) as u64 + 4
        );
    }

    #[test]
    fn empty_lines_cost_the_least_a_line_costs() {
        let mut budget = LogBudget::new(64 << 10, usize::MAX);
        let logged = (0..1_000_000)
            .filter(|_| budget.admit("").is_some())
            .count();
        assert_eq!(logged, (64 << 10) / MIN_LOG_LINE_COST);
        assert_eq!(budget.dropped_lines(), 1_000_000 - logged as u64);
    }

    #[test]
    fn a_call_logs_no_more_lines_than_it_was_given() {
        let mut budget = LogBudget::new(64 << 10, 3);
        let logged = (0..10).filter(|_| budget.admit("x").is_some()).count();
        assert_eq!((logged, budget.lines(), budget.dropped_lines()), (3, 3, 7));
    }

    #[test]
    fn calls_side_by_side_share_their_tenants_lines_as_they_log() {
        let rate = std::sync::Arc::new(super::super::TenantRate::new(0.0, 100));
        let shared = |tenant: &str| {
            Some(SharedLines {
                rate: rate.clone(),
                tenant: tenant.to_owned(),
            })
        };
        // Three calls of one tenant start together; none takes the others' lines up front.
        let mut calls: Vec<LogBudget> = (0..3)
            .map(|_| LogBudget::new(64 << 10, 500).sharing(shared("team-a")))
            .collect();
        let mut logged = [0usize; 3];
        for _ in 0..40 {
            for (call, n) in calls.iter_mut().zip(&mut logged) {
                *n += usize::from(call.admit("x").is_some());
            }
        }
        // Eight at a time: the first to come when 4 are left gets them.
        assert_eq!(logged, [36, 32, 32], "100 lines shared by what each logged");
        assert_eq!(calls[0].admit("x"), None, "the tenant's lines are used up");
        // Another tenant's lines are its own.
        let mut other = LogBudget::new(64 << 10, 500).sharing(shared("team-b"));
        assert!(other.admit("x").is_some());
        // What a call took and did not log goes back when it ends.
        drop(other);
        assert_eq!(rate.take("team-b", usize::MAX), 99);
    }

    #[test]
    fn log_lines_are_escaped() {
        let mut budget = LogBudget::new(64 << 10, usize::MAX);
        assert_eq!(
            budget.admit("a\nINFO forged").as_deref(),
            Some("a\\nINFO forged")
        );
    }

    #[test]
    fn keeps_the_first_bytes_and_counts_the_rest() {
        let out = BoundedOutput::new(4);
        out.push(b"abc");
        out.push(b"defg");
        let got = out.take();
        assert_eq!(got.kept, b"abcd");
        assert_eq!(got.dropped, 3);
        assert_eq!(out.take(), Captured::default());
    }
}
