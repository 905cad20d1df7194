//! How many new modules each tenant may have compiled: a token bucket per tenant (a
//! namespace, or the cluster's controllers), `--compile-burst` at once and then
//! `--compiles-per-hour` spread over the hour. Compiling is the costliest thing a tenant can
//! ask of the runtime (seconds of a core and hundreds of MiB for a Python module), and a tag
//! that moves to a new digest at every poll, or a ConfigMap rewritten in a loop, would
//! otherwise make it compile forever. A module already compiled (by any tenant) costs
//! nothing; a refused compile is tried again at a later poll, once the bucket has a token.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::sync::Locks as _;

/// The most tenants' buckets remembered: past it, full buckets (which say nothing a new one
/// would not) are forgotten.
const MAX_BUCKETS: usize = 10_000;

/// Compiles of new modules each tenant may start, refilled over time.
#[derive(Debug)]
pub struct CompileBudget {
    per_hour: u32,
    burst: u32,
    buckets: Mutex<HashMap<Option<String>, Bucket>>,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl CompileBudget {
    /// A budget of `burst` compiles at once, then `per_hour` per tenant per hour (0: none
    /// after the burst).
    pub fn new(per_hour: u32, burst: u32) -> CompileBudget {
        CompileBudget {
            per_hour,
            burst: burst.max(1),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes one compile for `tenant`, or says how long until one is left.
    pub fn take(&self, tenant: Option<&str>) -> Result<(), Duration> {
        let now = Instant::now();
        let burst = f64::from(self.burst);
        let rate = f64::from(self.per_hour) / 3600.0;
        let mut buckets = self.buckets.locked();
        if buckets.len() >= MAX_BUCKETS {
            buckets.retain(|_, b| b.refilled(now, rate, burst) < burst);
        }
        let bucket = buckets.entry(tenant.map(str::to_owned)).or_insert(Bucket {
            tokens: burst,
            at: now,
        });
        bucket.tokens = bucket.refilled(now, rate, burst);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            return Ok(());
        }
        if rate <= 0.0 {
            return Err(Duration::from_secs(3600));
        }
        Err(Duration::from_secs_f64(
            ((1.0 - bucket.tokens) / rate).min(3600.0),
        ))
    }

    /// The compiles per hour.
    pub fn per_hour(&self) -> u32 {
        self.per_hour
    }

    /// The compiles at once.
    pub fn burst(&self) -> u32 {
        self.burst
    }
}

impl Bucket {
    fn refilled(&self, now: Instant, rate: f64, burst: f64) -> f64 {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        (self.tokens + elapsed * rate).min(burst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_tenant_compiles_its_burst_then_at_the_hourly_rate() {
        let budget = CompileBudget::new(60, 16);
        for _ in 0..16 {
            assert_eq!(budget.take(Some("team-a")), Ok(()));
        }
        let wait = budget.take(Some("team-a")).unwrap_err();
        assert!(
            wait <= Duration::from_secs(60) && wait > Duration::from_secs(50),
            "{wait:?}"
        );
        // Another tenant is not held back by team-a.
        assert_eq!(budget.take(Some("team-b")), Ok(()));
        assert_eq!(budget.take(None), Ok(()));
        // One a minute afterwards, however often it asks.
        tokio::time::advance(Duration::from_secs(61)).await;
        assert_eq!(budget.take(Some("team-a")), Ok(()));
        assert!(budget.take(Some("team-a")).is_err());
        let mut compiled = 0;
        for _ in 0..600 {
            tokio::time::advance(Duration::from_secs(1)).await;
            compiled += u32::from(budget.take(Some("team-a")).is_ok());
        }
        assert!(
            (9..=11).contains(&compiled),
            "{compiled} compiles in 10 minutes"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn no_rate_means_the_burst_only() {
        let budget = CompileBudget::new(0, 16);
        for _ in 0..16 {
            assert_eq!(budget.take(Some("ns")), Ok(()));
        }
        tokio::time::advance(Duration::from_secs(7200)).await;
        assert_eq!(budget.take(Some("ns")), Err(Duration::from_secs(3600)));
    }
}
