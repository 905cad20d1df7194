//! The fence: whether this process may still act for the work it holds (a shard's Lease, see
//! [`super::ShardHolder`]).

use std::sync::Arc;

use tokio::sync::watch;
use tokio::time::Instant;

/// Whether this process may act: open until the Lease is lost or given up, and only until the
/// time its last renewal covers. Every reconcile checks it before it starts, and every API
/// write of a guest's action just before it is sent.
///
/// The time matters as much as the closing: a process that was paused (a stopped container,
/// a VM migration, a stalled node) wakes with its tasks all ready at once; whichever runs
/// first, a runner sees that the renewal no longer covers the present and does not act,
/// even before the renewal task has noticed and closed the fence.
#[derive(Clone, Debug)]
pub struct Fence(Arc<watch::Sender<Validity>>);

#[derive(Debug, Clone, Copy)]
struct Validity {
    closed: bool,
    /// The work is being given up (see [`Fence::leave`]).
    leaving: bool,
    /// `None`: open for as long as it is not closed (no leader election).
    until: Option<Instant>,
}

impl Validity {
    fn held(&self) -> bool {
        !self.closed && self.until.is_none_or(|until| Instant::now() < until)
    }
}

impl Default for Fence {
    fn default() -> Self {
        Fence(Arc::new(watch::Sender::new(Validity {
            closed: false,
            leaving: false,
            until: None,
        })))
    }
}

impl Fence {
    /// A fence open until `until`, unless extended.
    pub fn until(until: Instant) -> Self {
        Fence(Arc::new(watch::Sender::new(Validity {
            closed: false,
            leaving: false,
            until: Some(until),
        })))
    }

    /// Whether acting is allowed now.
    pub fn is_open(&self) -> bool {
        let validity = *self.0.borrow();
        !validity.leaving && validity.held()
    }

    /// Whether the work is still held (its Lease not lost, its last renewal covering the
    /// present), even while being given up: what was done while the fence was open may still
    /// be written down (a guest's saves left behind, when its controller stops), nothing new
    /// may start.
    pub fn is_held(&self) -> bool {
        self.0.borrow().held()
    }

    /// Starts giving the work up: nothing new may act ([`Fence::is_open`] is false from now
    /// on, for good), but the work stays held ([`Fence::is_held`]) while its Lease is renewed,
    /// until it is released or lost ([`Fence::close`]).
    pub fn leave(&self) {
        self.0.send_modify(|v| v.leaving = true);
    }

    /// Allows acting until `until` (a renewal succeeded); no effect once closed.
    pub fn extend(&self, until: Instant) {
        self.0.send_if_modified(|v| {
            if v.closed {
                return false;
            }
            v.until = Some(until);
            true
        });
    }

    /// Forbids acting from now on, for good.
    pub fn close(&self) {
        self.0.send_modify(|v| v.closed = true);
    }

    /// Waits until the fence is closed.
    pub async fn closed(&self) {
        let mut rx = self.0.subscribe();
        let _ = rx.wait_for(|v| v.closed).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_closed_fence_stays_closed_and_wakes_every_waiter() {
        let fence = Fence::default();
        assert!(fence.is_open());
        let waiter = tokio::spawn({
            let fence = fence.clone();
            async move { fence.closed().await }
        });
        fence.clone().close();
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("a waiter saw the fence close")
            .unwrap();
        assert!(!fence.is_open());
        fence.closed().await; // already closed: returns at once
        fence.extend(Instant::now() + Duration::from_secs(60));
        assert!(!fence.is_open(), "a closed fence cannot be reopened");
    }

    #[tokio::test(start_paused = true)]
    async fn a_fence_left_lets_nothing_act_but_is_held_until_closed_or_past_its_renewal() {
        let fence = Fence::until(Instant::now() + Duration::from_secs(2));
        fence.leave();
        assert!(!fence.is_open());
        assert!(fence.is_held());
        fence.extend(Instant::now() + Duration::from_secs(4));
        tokio::time::advance(Duration::from_secs(3)).await;
        assert!(fence.is_held(), "renewed while it is given up");
        assert!(!fence.is_open(), "left for good");
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(!fence.is_held(), "past its last renewal");
        let fence = Fence::default();
        fence.leave();
        fence.close();
        assert!(!fence.is_held());
    }

    #[tokio::test(start_paused = true)]
    async fn a_leaders_fence_is_shut_once_its_renewal_no_longer_covers_the_present() {
        let fence = Fence::until(Instant::now() + Duration::from_secs(2));
        assert!(fence.is_open());
        tokio::time::advance(Duration::from_millis(1500)).await;
        fence.extend(Instant::now() + Duration::from_secs(2));
        tokio::time::advance(Duration::from_millis(1500)).await;
        assert!(fence.is_open(), "extended by the renewal");
        // Nobody renews (the process was paused, the renewal task has not run yet): no one
        // has closed the fence, and still it does not let anyone act.
        tokio::time::advance(Duration::from_millis(600)).await;
        assert!(!fence.is_open());
    }
}
