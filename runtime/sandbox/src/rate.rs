//! A rate per tenant, never waited for.

use crate::sync::Locks as _;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

/// A rate per tenant (a token bucket each): what one tenant uses, from all its controllers
/// together, is its own and no other tenant's. Takes never wait: a caller takes what is left
/// (and may give back what it did not use), so nothing that shares a loop with other tenants
/// is held by one. Used for guest log lines (a call takes what is left of its tenant's lines
/// when it starts) and the runtime's status writes.
#[derive(Debug)]
pub struct TenantRate {
    per_second: f64,
    burst: f64,
    tenants: Mutex<HashMap<String, (f64, Instant)>>,
}

/// Tenants whose bucket is kept before full (idle) ones are forgotten.
const RATE_TENANTS: usize = 4096;

impl TenantRate {
    /// `per_second` for each tenant, `burst` at once after a quiet spell.
    pub fn new(per_second: f64, burst: u32) -> Self {
        TenantRate {
            per_second: per_second.max(0.0),
            burst: f64::from(burst.max(1)),
            tenants: Mutex::default(),
        }
    }

    /// Takes up to `want` of `tenant`'s bucket; how many were taken.
    pub fn take(&self, tenant: &str, want: usize) -> usize {
        let mut tenants = self.tenants.locked();
        let now = Instant::now();
        if tenants.len() >= RATE_TENANTS && !tenants.contains_key(tenant) {
            // Full buckets say nothing a new one would not: forget them.
            let (rate, burst) = (self.per_second, self.burst);
            tenants.retain(|_, (tokens, at)| {
                *tokens + now.duration_since(*at).as_secs_f64() * rate < burst
            });
        }
        let (tokens, at) = tenants
            .entry(tenant.to_owned())
            .or_insert((self.burst, now));
        *tokens =
            (*tokens + now.duration_since(*at).as_secs_f64() * self.per_second).min(self.burst);
        *at = now;
        // Whole lines only; `as` saturates, and `tokens` is within 0..=burst.
        let taken = (tokens.floor() as usize).min(want);
        *tokens -= taken as f64;
        taken
    }

    /// Returns what a caller took and did not use.
    pub fn give_back(&self, tenant: &str, unused: usize) {
        if unused == 0 {
            return;
        }
        let mut tenants = self.tenants.locked();
        if let Some((tokens, _)) = tenants.get_mut(tenant) {
            *tokens = (*tokens + unused as f64).min(self.burst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenants_share_their_own_log_rate_only() {
        let rate = TenantRate::new(0.0, 100);
        assert_eq!(rate.take("team-a", 60), 60);
        assert_eq!(rate.take("team-a", 60), 40, "what is left of the burst");
        assert_eq!(rate.take("team-a", 60), 0);
        assert_eq!(
            rate.take("team-b", 60),
            60,
            "team-a's flood is not team-b's"
        );
        rate.give_back("team-a", 25);
        assert_eq!(rate.take("team-a", usize::MAX), 25);
        rate.give_back("team-a", 1000);
        assert_eq!(rate.take("team-a", usize::MAX), 100, "never past the burst");
        // Refilled at the rate: 1,000 lines a second for 20 ms is about 20.
        let rate = TenantRate::new(1000.0, 100);
        assert_eq!(rate.take("t", usize::MAX), 100);
        std::thread::sleep(std::time::Duration::from_millis(20));
        let refilled = rate.take("t", usize::MAX);
        assert!((15..=100).contains(&refilled), "{refilled}");
    }
}
