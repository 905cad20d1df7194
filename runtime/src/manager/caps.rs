//! The operator's maxima for what a spec may ask (`kubewasm run --max-memory`,
//! `--max-timeout-millis`, `--max-concurrency`, `--max-actions`, `--max-response-bytes`,
//! `--max-log-bytes`): a spec above one is clamped, and the controller's status says so.

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
    /// Most actions in one response.
    pub actions: usize,
    /// Largest response document.
    pub response_bytes: usize,
    /// Most bytes of host `log` lines kept per call.
    pub log_bytes: usize,
}

impl Default for LimitCaps {
    fn default() -> Self {
        LimitCaps {
            memory_bytes: 256 << 20,
            timeout: Duration::from_secs(10),
            concurrency: 8,
            actions: 10_000,
            response_bytes: 4 << 20,
            log_bytes: 1 << 20,
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
        let mut clamp_bytes = |asked: &mut usize, cap: usize, field: &str, flag: &str| {
            if *asked > cap {
                clamped.push(format!(
                    "spec.limits.{field} {} KiB clamped to the operator's maximum of {} KiB ({flag})",
                    *asked >> 10,
                    cap >> 10
                ));
                *asked = cap;
            }
        };
        clamp_bytes(
            &mut limits.response_bytes,
            self.response_bytes,
            "responseBytes",
            "--max-response-bytes",
        );
        clamp_bytes(
            &mut limits.log_bytes,
            self.log_bytes,
            "logBytes",
            "--max-log-bytes",
        );
        if limits.actions > self.actions {
            clamped.push(format!(
                "spec.limits.actions {} clamped to the operator's maximum of {} (--max-actions)",
                limits.actions, self.actions
            ));
            limits.actions = self.actions;
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
            .with_timeout(Duration::from_secs(3600))
            .with_actions(1_000_000)
            .with_response_bytes(1 << 30)
            .with_log_bytes(1 << 30);
        let (limits, concurrency, clamped) = caps.apply(asked, 64);
        assert_eq!(limits.memory_bytes, 256 << 20);
        assert_eq!(limits.timeout, Duration::from_secs(10));
        assert_eq!(concurrency, 8);
        assert_eq!(limits.actions, 10_000);
        assert_eq!(limits.response_bytes, 4 << 20);
        assert_eq!(limits.log_bytes, 1 << 20);
        assert_eq!(clamped.len(), 6, "{clamped:?}");
        assert!(clamped.iter().any(|c| c.contains(
            "spec.limits.responseBytes 1048576 KiB clamped to the operator's maximum of 4096 KiB (--max-response-bytes)"
        )), "{clamped:?}");
        assert!(clamped[0].contains("4096 MiB clamped to the operator's maximum of 256 MiB"));
        let (limits, concurrency, clamped) = caps.apply(Limits::default(), 2);
        assert_eq!((limits, concurrency), (Limits::default(), 2));
        assert!(clamped.is_empty());
    }
}
