//! Per-call limits and the memory limiter that enforces them.

use std::time::Duration;

/// Most bytes of the state a controller saves for one object (`setState`): the contract's.
pub const MAX_GUEST_STATE_BYTES: usize = kubewasm_guest_sdk::MAX_STATE_BYTES;

/// Limits for one reconcile call. Every limit is on by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest linear memory a guest may grow to, in bytes.
    pub memory_bytes: usize,
    /// Wall-clock time one reconcile may take.
    pub timeout: Duration,
    /// Host reads (`get`/`list`) one reconcile may make.
    pub host_calls: u32,
    /// Bytes of guest stdout and of guest stderr kept per call (the rest is counted and dropped).
    pub output_bytes: usize,
    /// Bytes of host `log` lines (and lines of stdout and stderr) logged per call, each line
    /// counting its length and at least [`MIN_LOG_LINE_COST`](super::MIN_LOG_LINE_COST) (so
    /// empty lines are not free); the rest is counted and dropped, never failing the guest.
    pub log_bytes: usize,
    /// Lines logged per call at most. Under [`Sandbox::reconcile`](super::Sandbox::reconcile)
    /// each line is also taken from the tenant's log rate (`SandboxConfig::log_lines_per_second`,
    /// a few at a time as the call logs); a call made straight on a
    /// [`GuestPre`](super::GuestPre) has no rate to share.
    pub log_lines: usize,
    /// Largest response document, in bytes (checked before it is parsed).
    pub response_bytes: usize,
    /// Most actions in one response.
    pub actions: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory_bytes: 64 << 20,
            timeout: Duration::from_secs(1),
            host_calls: 10_000,
            output_bytes: 64 << 10,
            log_bytes: 64 << 10,
            log_lines: usize::MAX,
            response_bytes: 1 << 20,
            actions: 1000,
        }
    }
}

impl Limits {
    /// Sets the memory limit.
    #[must_use]
    pub fn with_memory_bytes(mut self, bytes: usize) -> Self {
        self.memory_bytes = bytes;
        self
    }

    /// Sets the time limit.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets the number of host reads allowed per call.
    #[must_use]
    pub fn with_host_calls(mut self, calls: u32) -> Self {
        self.host_calls = calls;
        self
    }

    /// Sets the bytes of host `log` lines logged per call.
    #[must_use]
    pub fn with_log_bytes(mut self, bytes: usize) -> Self {
        self.log_bytes = bytes;
        self
    }

    /// Sets the most lines logged per call.
    #[must_use]
    pub fn with_log_lines(mut self, lines: usize) -> Self {
        self.log_lines = lines;
        self
    }

    /// Sets the largest response accepted.
    #[must_use]
    pub fn with_response_bytes(mut self, bytes: usize) -> Self {
        self.response_bytes = bytes;
        self
    }

    /// Sets the most actions accepted in one response.
    #[must_use]
    pub fn with_actions(mut self, actions: usize) -> Self {
        self.actions = actions;
        self
    }
}

/// Denies memory growth past the limit and remembers that it did, so the trap that follows
/// (a Rust guest aborts when allocation fails) is reported as "memory limit exceeded". The
/// limit is for all of a call's linear memories together: a component with two memories does
/// not get twice the limit.
#[derive(Debug)]
pub(crate) struct MemoryLimiter {
    pub(crate) limit: usize,
    pub(crate) exceeded: bool,
    /// Bytes of every linear memory of the call, as last allowed.
    used: usize,
}

impl MemoryLimiter {
    /// A limiter allowing `limit` bytes of linear memory in all.
    pub(crate) fn new(limit: usize) -> Self {
        MemoryLimiter {
            limit,
            exceeded: false,
            used: 0,
        }
    }

    /// Bytes of every linear memory of the call, as last allowed.
    pub(crate) fn used(&self) -> usize {
        self.used
    }
}

impl wasmtime::ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let total = self.used.saturating_sub(current).saturating_add(desired);
        if total > self.limit {
            self.exceeded = true;
            return Ok(false);
        }
        self.used = total;
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 100_000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmtime::ResourceLimiter as _;

    #[test]
    fn the_memory_limit_is_for_all_memories_together() {
        let mut limiter = MemoryLimiter::new(64 << 20);
        // Two memories created at 16 MiB each, then each grown.
        assert!(limiter.memory_growing(0, 16 << 20, None).unwrap());
        assert!(limiter.memory_growing(0, 16 << 20, None).unwrap());
        assert!(limiter.memory_growing(16 << 20, 40 << 20, None).unwrap());
        assert!(!limiter.exceeded);
        // 40 + 16 in use: the second may not reach 40 as well.
        assert!(!limiter.memory_growing(16 << 20, 40 << 20, None).unwrap());
        assert!(limiter.exceeded);
        assert!(limiter.memory_growing(16 << 20, 24 << 20, None).unwrap());
    }
}
