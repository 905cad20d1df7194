//! Leader election with a `coordination.k8s.io/v1` Lease, so that of several runtime
//! replicas exactly one acts while the others wait to take over.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::PostParams;
use kube::{Api, Client};

/// Whether this process may act: open until leadership is lost, or, for a leader, until the
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
    /// `None`: open for as long as it is not closed (no leader election).
    until: Option<Instant>,
}

impl Default for Fence {
    fn default() -> Self {
        Fence(Arc::new(watch::Sender::new(Validity {
            closed: false,
            until: None,
        })))
    }
}

impl Fence {
    /// A fence open until `until`, unless extended.
    pub fn until(until: Instant) -> Self {
        Fence(Arc::new(watch::Sender::new(Validity {
            closed: false,
            until: Some(until),
        })))
    }

    /// Whether acting is allowed now.
    pub fn is_open(&self) -> bool {
        let validity = *self.0.borrow();
        !validity.closed && validity.until.is_none_or(|until| Instant::now() < until)
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

/// Holds or waits for one Lease.
#[derive(Clone)]
pub struct LeaderElector {
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: Duration,
    retry: Duration,
}

fn conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

impl LeaderElector {
    /// An elector for Lease `namespace/name`, holding it as `identity` for `duration` per renewal.
    pub fn new(
        client: Client,
        namespace: &str,
        name: &str,
        identity: &str,
        duration: Duration,
    ) -> Self {
        LeaderElector {
            api: Api::namespaced(client, namespace),
            name: name.to_owned(),
            identity: identity.to_owned(),
            duration,
            retry: duration / 3,
        }
    }

    /// This elector's identity.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// The renew deadline: two thirds of the lease duration. A leader acts only within this
    /// time of the start of its last successful renewal, a third of a lease before another
    /// replica may take over.
    pub fn renew_deadline(&self) -> Duration {
        self.duration * 2 / 3
    }

    /// Waits until this process holds the Lease; the fence returned is open for the renew
    /// deadline, and [`hold`](Self::hold) keeps it open while renewals succeed.
    pub async fn acquire(&self) -> Result<Fence, kube::Error> {
        loop {
            let started = Instant::now();
            if self.try_acquire_or_renew().await? {
                return Ok(Fence::until(started + self.renew_deadline()));
            }
            tokio::time::sleep(self.retry).await;
        }
    }

    /// Keeps renewing and extends `fence` after each renewal, to the renew deadline counted
    /// from when the renewal was sent; closes it and returns once leadership is lost: another
    /// holder, or no successful renewal within the renew deadline. Run it in a task of its
    /// own, so that nothing else the process does can delay a renewal.
    pub async fn hold(&self, fence: &Fence) {
        let deadline = self.renew_deadline();
        let mut last_renewal = Instant::now();
        loop {
            tokio::time::sleep(self.retry).await;
            let started = Instant::now();
            let renewal = tokio::time::timeout(
                deadline.saturating_sub(last_renewal.elapsed()),
                self.try_acquire_or_renew(),
            )
            .await;
            match renewal {
                Ok(Ok(true)) => {
                    last_renewal = started;
                    fence.extend(started + deadline);
                }
                Ok(Ok(false)) => break,
                Ok(Err(e)) => tracing::warn!("could not renew the leader Lease: {e}"),
                Err(_) => tracing::warn!("renewing the leader Lease did not finish in time"),
            }
            if last_renewal.elapsed() >= deadline {
                break;
            }
        }
        fence.close();
    }

    /// Gives the Lease up so that a standby replica takes over at once.
    pub async fn release(&self) -> Result<(), kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            return Ok(());
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.renew_time = None;
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if conflict(&e) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// One round: `Ok(true)` when this process holds the Lease afterwards.
    pub async fn try_acquire_or_renew(&self) -> Result<bool, kube::Error> {
        let now = Timestamp::now();
        let seconds = i32::try_from(self.duration.as_secs().max(1)).unwrap_or(i32::MAX);
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(seconds),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(e) if conflict(&e) => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        let mine = spec.holder_identity.as_deref() == Some(self.identity.as_str());
        let held_for =
            SignedDuration::from_secs(spec.lease_duration_seconds.unwrap_or(seconds).into());
        let expired = match (&spec.holder_identity, &spec.renew_time) {
            (None, _) | (_, None) => true,
            (Some(_), Some(MicroTime(renewed))) => renewed
                .checked_add(held_for)
                .map(|end| end < now)
                .unwrap_or(true),
        };
        if !mine && !expired {
            return Ok(false);
        }
        if !mine {
            spec.holder_identity = Some(self.identity.clone());
            spec.acquire_time = Some(MicroTime(now));
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        spec.lease_duration_seconds = Some(seconds);
        spec.renew_time = Some(MicroTime(now));
        // The resourceVersion in `lease` makes this a compare-and-swap.
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if conflict(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
