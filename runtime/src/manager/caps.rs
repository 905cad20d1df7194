//! The operator's maxima for what a spec may ask (`kubewasm run --max-memory`,
//! `--max-timeout-millis`, `--max-concurrency`): a spec above one is clamped, and the
//! controller's status says so.

use std::time::Duration;

use crate::sandbox::Limits;

/// Upper bounds on per-controller limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitCaps {
    /// Most memory one reconcile may have.
    pub memory_bytes: usize,
    /// Most time one reconcile may take.
    pub timeout: Duration,
    /// Most reconciles of one controller at once.
    pub concurrency: usize,
}

impl Default for LimitCaps {
    fn default() -> Self {
        LimitCaps {
            memory_bytes: 256 << 20,
            timeout: Duration::from_secs(10),
            concurrency: 8,
        }
    }
}

impl LimitCaps {
    /// The limits and concurrency to run with, and a sentence per value that was clamped.
    pub fn apply(&self, mut limits: Limits, concurrency: usize) -> (Limits, usize, Vec<String>) {
        let mut clamped = Vec::new();
        if limits.memory_bytes > self.memory_bytes {
            clamped.push(format!(
                "spec.limits.memory {} MiB clamped to the operator's maximum of {} MiB (--max-memory)",
                limits.memory_bytes >> 20,
                self.memory_bytes >> 20
            ));
            limits.memory_bytes = self.memory_bytes;
        }
        if limits.timeout > self.timeout {
            clamped.push(format!(
                "spec.limits.timeoutMillis {} clamped to the operator's maximum of {} (--max-timeout-millis)",
                limits.timeout.as_millis(),
                self.timeout.as_millis()
            ));
            limits.timeout = self.timeout;
        }
        let concurrency = if concurrency > self.concurrency {
            clamped.push(format!(
                "spec.limits.concurrency {concurrency} clamped to the operator's maximum of {} (--max-concurrency)",
                self.concurrency
            ));
            self.concurrency
        } else {
            concurrency
        };
        (limits, concurrency, clamped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_above_a_cap_are_clamped_and_said() {
        let caps = LimitCaps::default();
        let asked = Limits::default()
            .with_memory_bytes(4 << 30)
            .with_timeout(Duration::from_secs(3600));
        let (limits, concurrency, clamped) = caps.apply(asked, 64);
        assert_eq!(limits.memory_bytes, 256 << 20);
        assert_eq!(limits.timeout, Duration::from_secs(10));
        assert_eq!(concurrency, 8);
        assert_eq!(clamped.len(), 3, "{clamped:?}");
        assert!(clamped[0].contains("4096 MiB clamped to the operator's maximum of 256 MiB"));
        let (limits, concurrency, clamped) = caps.apply(Limits::default(), 2);
        assert_eq!((limits, concurrency), (Limits::default(), 2));
        assert!(clamped.is_empty());
    }
}
