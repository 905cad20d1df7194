//! Per-call limits and the memory limiter that enforces them.

use std::time::Duration;

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
    /// Bytes of host `log` lines logged per call, each line counting its length plus one (so
    /// empty lines are not free); the rest is counted and dropped, never failing the guest.
    pub log_bytes: usize,
    /// Total size of the JSON documents in one response.
    pub response_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory_bytes: 64 << 20,
            timeout: Duration::from_secs(1),
            host_calls: 10_000,
            output_bytes: 64 << 10,
            log_bytes: 64 << 10,
            response_bytes: 4 << 20,
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

    /// Sets the largest response accepted.
    #[must_use]
    pub fn with_response_bytes(mut self, bytes: usize) -> Self {
        self.response_bytes = bytes;
        self
    }
}

/// Denies memory growth past the limit and remembers that it did, so the trap that follows
/// (a Rust guest aborts when allocation fails) is reported as "memory limit exceeded".
#[derive(Debug)]
pub(crate) struct MemoryLimiter {
    pub(crate) limit: usize,
    pub(crate) exceeded: bool,
}

impl wasmtime::ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.limit {
            self.exceeded = true;
            return Ok(false);
        }
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
