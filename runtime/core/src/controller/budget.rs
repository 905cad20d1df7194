//! A token bucket (the replica's write rate, with a burst) and the door every write of a
//! controller goes through.
//!
//! tokio has no rate limiter and a bucket is a few lines; waiting is async, so a controller
//! over its budget waits without holding a thread, and no other controller notices.

use std::sync::Mutex;
use std::time::Duration;

use crate::sync::Locks as _;
use prometheus_client::metrics::counter::Counter;
use tokio::time::Instant;

/// Writes per second, and how many may go at once after a quiet spell.
#[derive(Debug)]
pub struct TokenBucket {
    per_second: f64,
    burst: f64,
    state: Mutex<(f64, Instant)>,
    /// Counts every token taken (the controller's API requests, exported as a metric).
    taken: Counter,
}

impl TokenBucket {
    /// A full bucket of `burst` tokens (at least 1), refilled at `per_second` (at least 0.001).
    pub fn new(per_second: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        TokenBucket {
            per_second: per_second.max(0.001),
            burst,
            state: Mutex::new((burst, Instant::now())),
            taken: Counter::default(),
        }
    }

    /// The same bucket, counting every token taken on `taken` (e.g. a metric's series).
    #[must_use]
    pub fn counting(mut self, taken: Counter) -> Self {
        self.taken = taken;
        self
    }

    /// Tokens taken so far.
    pub fn taken(&self) -> u64 {
        self.taken.get()
    }

    /// Gives back a token taken and not used (up to the burst).
    pub fn refund(&self) {
        let mut state = self.state.locked();
        state.0 = (state.0 + 1.0).min(self.burst);
    }

    /// Takes one token, waiting until there is one.
    pub async fn take(&self) {
        loop {
            let wait = {
                let mut state = self.state.locked();
                let (tokens, at) = &mut *state;
                let now = Instant::now();
                *tokens = (*tokens + now.duration_since(*at).as_secs_f64() * self.per_second)
                    .min(self.burst);
                *at = now;
                if *tokens >= 1.0 {
                    *tokens -= 1.0;
                    self.taken.inc();
                    return;
                }
                Duration::from_secs_f64((1.0 - *tokens) / self.per_second)
            };
            tokio::time::sleep(wait).await;
        }
    }
}

/// The one door every API write of a controller goes through: its turn at the replica's
/// write rate ([`super::WriteScheduler`]), then the fence (this process may still act).
/// Actions, finalizers and saved state all pass here, so a new kind of write cannot forget
/// either.
pub struct WriteGate {
    lane: super::Lane,
    fence: super::Fence,
}

impl WriteGate {
    /// Writes through `lane` while `fence` is open.
    pub fn new(lane: super::Lane, fence: super::Fence) -> Self {
        WriteGate { lane, fence }
    }

    /// Waits for this controller's turn; then whether the write may be sent (`false`: this
    /// process lost its Lease, nothing more is sent).
    pub async fn admit(&self) -> bool {
        self.lane.take().await;
        self.fence.is_open()
    }

    /// Whether this process may still act (no turn taken).
    pub fn is_open(&self) -> bool {
        self.fence.is_open()
    }

    /// The fence, for a write sent later than its turn (a saved state left behind).
    pub fn fence(&self) -> super::Fence {
        self.fence.clone()
    }

    /// Writes granted to this controller so far.
    pub fn granted(&self) -> u64 {
        self.lane.granted()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_burst_goes_at_once_then_the_rate_holds() {
        let bucket = TokenBucket::new(10.0, 5);
        let started = Instant::now();
        for _ in 0..5 {
            bucket.take().await;
        }
        assert_eq!(
            started.elapsed(),
            Duration::ZERO,
            "the burst waits for nothing"
        );
        for _ in 0..10 {
            bucket.take().await;
        }
        assert_eq!(bucket.taken(), 15, "every token taken is counted");
        let elapsed = started.elapsed().as_secs_f64();
        assert!(
            (0.99..1.01).contains(&elapsed),
            "10 more at 10/s took {elapsed} s"
        );
        tokio::time::sleep(Duration::from_secs(60)).await;
        let before = Instant::now();
        for _ in 0..5 {
            bucket.take().await;
        }
        assert_eq!(
            before.elapsed(),
            Duration::ZERO,
            "refilled to the burst, not beyond"
        );
        bucket.take().await;
        assert!(before.elapsed() >= Duration::from_millis(99));
    }
}
