//! Summaries of measured times: min/median/max over rounds, p50/p99 over many samples.

use std::time::Duration;

/// Sorted samples of one measured thing.
#[derive(Debug, Clone)]
pub struct Samples(Vec<Duration>);

impl Samples {
    /// The samples, sorted.
    pub fn new(mut times: Vec<Duration>) -> Self {
        times.sort_unstable();
        Samples(times)
    }

    /// How many.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The `q` quantile (0.0..=1.0), nearest rank; zero when there are no samples.
    pub fn quantile(&self, q: f64) -> Duration {
        if self.0.is_empty() {
            return Duration::ZERO;
        }
        let rank = (q * self.0.len() as f64).ceil() as usize;
        self.0[rank.clamp(1, self.0.len()) - 1]
    }

    /// The median (the lower middle of an even count).
    pub fn median(&self) -> Duration {
        self.quantile(0.5)
    }

    /// The smallest.
    pub fn min(&self) -> Duration {
        self.0.first().copied().unwrap_or_default()
    }

    /// The largest.
    pub fn max(&self) -> Duration {
        self.0.last().copied().unwrap_or_default()
    }

    /// `median X ms (min Y, max Z, n rounds)`.
    pub fn rounds(&self) -> String {
        format!(
            "median {} (min {}, max {}; {} rounds)",
            ms(self.median()),
            ms(self.min()),
            ms(self.max()),
            self.len()
        )
    }

    /// `p50 X ms, p99 Y ms, max Z ms (n)`.
    pub fn percentiles(&self) -> String {
        format!(
            "p50 {}, p99 {}, max {} ({} samples)",
            ms(self.quantile(0.5)),
            ms(self.quantile(0.99)),
            ms(self.max()),
            self.len()
        )
    }
}

/// A duration in milliseconds, one decimal.
pub fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

/// `+X ms (×R)`: how much `slow` takes above `fast`.
pub fn overhead(slow: Duration, fast: Duration) -> String {
    let extra = slow.as_secs_f64() - fast.as_secs_f64();
    let ratio = slow.as_secs_f64() / fast.as_secs_f64().max(1e-9);
    format!("{:+.1} ms (×{ratio:.2})", extra * 1e3)
}
