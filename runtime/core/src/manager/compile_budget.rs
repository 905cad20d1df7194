//! How much compiling each tenant (a namespace, or the cluster's controllers) may have done,
//! in two token buckets: compiles — `--compile-burst` at once, then `--compiles-per-hour` —
//! and the compiler's CPU seconds — `--compile-cpu-seconds-per-hour`, with an hour's worth at
//! once. Compiling is the costliest thing a tenant can ask of the runtime (seconds of a core
//! and hundreds of MiB for a Python module), and a tag that moves to a new digest at every
//! poll, or a ConfigMap rewritten in a loop, would otherwise make it compile forever; counting
//! compiles alone would let a tenant whose modules each take the compile's whole CPU limit keep
//! the one compiler busy most of the hour. A compile is charged its CPU seconds when it ends
//! (they are not known before): a tenant may overdraw by one compile, and then waits until
//! the bucket is back above zero. A module already compiled (by any tenant) costs nothing; a
//! refused compile is tried again at a later poll, once both buckets allow it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::sync::Locks as _;

/// The most tenants' buckets remembered: past it, full buckets (which say nothing a new one
/// would not) are forgotten.
const MAX_BUCKETS: usize = 10_000;

/// Compiles of new modules each tenant may start, and the CPU seconds they may take,
/// refilled over time.
#[derive(Debug)]
pub struct CompileBudget {
    per_hour: u32,
    burst: u32,
    cpu_per_hour: u32,
    buckets: Mutex<HashMap<Option<String>, Buckets>>,
}

/// Why a compile waits, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The tenant started its compiles of the moment.
    Compiles(Duration),
    /// The tenant's compiles took its CPU seconds of the moment.
    CpuSeconds(Duration),
}

/// One tenant's two buckets.
#[derive(Debug, Clone, Copy)]
struct Buckets {
    compiles: Bucket,
    cpu: Bucket,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl CompileBudget {
    /// A budget of `burst` compiles at once, then `per_hour` per tenant per hour (0: none
    /// after the burst), and of `cpu_per_hour` CPU seconds of compiling per tenant per hour,
    /// as many at once (0: no CPU budget).
    pub fn new(per_hour: u32, burst: u32, cpu_per_hour: u32) -> CompileBudget {
        CompileBudget {
            per_hour,
            burst: burst.max(1),
            cpu_per_hour,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// The two buckets' sizes and rates per second: compiles, CPU seconds.
    fn shapes(&self) -> [(f64, f64); 2] {
        let cpu = f64::from(self.cpu_per_hour);
        [
            (f64::from(self.burst), f64::from(self.per_hour) / 3600.0),
            (cpu, cpu / 3600.0),
        ]
    }

    /// Runs `f` on `tenant`'s buckets, refilled to now.
    fn with<T>(&self, tenant: Option<&str>, f: impl FnOnce(&mut Buckets) -> T) -> T {
        let now = Instant::now();
        let [(burst, rate), (cpu, cpu_rate)] = self.shapes();
        let mut buckets = self.buckets.locked();
        if buckets.len() >= MAX_BUCKETS {
            buckets.retain(|_, b| {
                b.compiles.refilled(now, rate, burst) < burst
                    || b.cpu.refilled(now, cpu_rate, cpu) < cpu
            });
        }
        let full = |tokens| Bucket { tokens, at: now };
        let b = buckets.entry(tenant.map(str::to_owned)).or_insert(Buckets {
            compiles: full(burst),
            cpu: full(cpu),
        });
        b.compiles = full(b.compiles.refilled(now, rate, burst));
        b.cpu = full(b.cpu.refilled(now, cpu_rate, cpu));
        f(b)
    }

    /// Takes one compile for `tenant`, or says which bucket is short and how long until it is
    /// not.
    pub fn take(&self, tenant: Option<&str>) -> Result<(), Refused> {
        let [(_, rate), (_, cpu_rate)] = self.shapes();
        self.with(tenant, |b| {
            if self.cpu_per_hour > 0 && b.cpu.tokens <= 0.0 {
                // Back above zero (a whole second) before the next compile.
                return Err(Refused::CpuSeconds(until(1.0 - b.cpu.tokens, cpu_rate)));
            }
            if b.compiles.tokens < 1.0 {
                return Err(Refused::Compiles(until(1.0 - b.compiles.tokens, rate)));
            }
            b.compiles.tokens -= 1.0;
            Ok(())
        })
    }

    /// Charges `tenant` the CPU time a compile of its took (the bucket may go below zero by
    /// one compile: it is known only afterwards).
    pub fn charge_cpu(&self, tenant: Option<&str>, cpu: Duration) {
        if self.cpu_per_hour > 0 {
            self.with(tenant, |b| b.cpu.tokens -= cpu.as_secs_f64());
        }
    }

    /// CPU seconds of compiling per tenant per hour (0: not limited).
    pub fn cpu_per_hour(&self) -> u32 {
        self.cpu_per_hour
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

/// How long `missing` tokens take at `rate` a second (at most an hour).
fn until(missing: f64, rate: f64) -> Duration {
    if rate <= 0.0 {
        return Duration::from_secs(3600);
    }
    Duration::from_secs_f64((missing / rate).clamp(0.0, 3600.0))
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
        let budget = CompileBudget::new(60, 16, 0);
        for _ in 0..16 {
            assert_eq!(budget.take(Some("team-a")), Ok(()));
        }
        let Err(Refused::Compiles(wait)) = budget.take(Some("team-a")) else {
            panic!("the burst is spent")
        };
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
        let budget = CompileBudget::new(0, 16, 0);
        for _ in 0..16 {
            assert_eq!(budget.take(Some("ns")), Ok(()));
        }
        tokio::time::advance(Duration::from_secs(7200)).await;
        assert_eq!(
            budget.take(Some("ns")),
            Err(Refused::Compiles(Duration::from_secs(3600)))
        );
    }

    /// A tenant whose compiles each take the compile's CPU limit (120 s) gets the compiler
    /// for its hourly CPU seconds, not for as many compiles as it may start.
    #[tokio::test(start_paused = true)]
    async fn compiles_that_take_the_cpu_limit_spend_the_tenants_cpu_seconds() {
        let budget = CompileBudget::new(60, 16, 600);
        let limit = Duration::from_secs(120);
        let mut compiled = 0;
        // Five compiles of 120 s take the 600 s; the sixth overdraws nothing more: refused.
        while budget.take(Some("team-a")).is_ok() {
            budget.charge_cpu(Some("team-a"), limit);
            compiled += 1;
            assert!(compiled <= 16, "the CPU budget never refused");
        }
        assert_eq!(compiled, 5);
        let Err(Refused::CpuSeconds(wait)) = budget.take(Some("team-a")) else {
            panic!("the CPU seconds are spent")
        };
        assert!(
            wait > Duration::from_secs(5) && wait <= Duration::from_secs(7),
            "one CPU second back at 600 an hour: {wait:?}"
        );
        // Another tenant compiles at once.
        assert_eq!(budget.take(Some("team-b")), Ok(()));
        // Over an hour, team-a's compiles take about its 600 CPU seconds, not 60 × 120.
        let mut cpu = Duration::ZERO;
        for _ in 0..3600 {
            tokio::time::advance(Duration::from_secs(1)).await;
            if budget.take(Some("team-a")).is_ok() {
                budget.charge_cpu(Some("team-a"), limit);
                cpu += limit;
            }
        }
        assert!(
            cpu >= Duration::from_secs(480) && cpu <= Duration::from_secs(720),
            "{cpu:?} of compiling in an hour"
        );
        // Cheap compiles are limited by the count alone.
        let budget = CompileBudget::new(60, 16, 600);
        for _ in 0..16 {
            assert_eq!(budget.take(Some("ns")), Ok(()));
            budget.charge_cpu(Some("ns"), Duration::from_millis(500));
        }
        assert!(matches!(budget.take(Some("ns")), Err(Refused::Compiles(_))));
    }
}
