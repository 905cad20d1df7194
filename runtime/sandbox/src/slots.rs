//! Sandbox instance slots shared fairly between tenants.
//!
//! A plain semaphore hands freed slots to whoever waited first, so a tenant with a thousand
//! queued reconciles makes every other tenant wait behind all of them. Here a freed slot goes
//! to the waiting tenant that holds the fewest slots (first come among equals), so a tenant's
//! next reconcile waits at most for the next slot to free up, whatever others have queued;
//! and every call ends at its deadline, so that wait is bounded by the longest deadline.
//! (tokio's Semaphore is FIFO only, hence this small queue.)

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use crate::sync::Locks as _;
use tokio::sync::oneshot;

#[derive(Default)]
struct State {
    free: usize,
    running: HashMap<String, usize>,
    /// Waiters in arrival order, with their tenant.
    waiting: VecDeque<(String, oneshot::Sender<Slot>)>,
}

/// A pool of instance slots shared fairly between tenants.
#[derive(Clone)]
pub struct FairSlots {
    state: Arc<Mutex<State>>,
    capacity: usize,
}

/// One slot, given back when dropped.
pub struct Slot {
    state: Arc<Mutex<State>>,
    tenant: String,
    /// False for a slot that never reached a holder (its waiter was gone).
    armed: bool,
}

impl FairSlots {
    /// A pool of `slots` slots (at least one).
    pub fn new(slots: usize) -> Self {
        let slots = slots.max(1);
        FairSlots {
            state: Arc::new(Mutex::new(State {
                free: slots,
                ..State::default()
            })),
            capacity: slots,
        }
    }

    /// Whether an `acquire` now would wait (no slot free, or others waiting).
    pub fn would_wait(&self) -> bool {
        let state = lock(&self.state);
        state.free == 0 || !state.waiting.is_empty()
    }

    /// A slot for `tenant` now, without waiting: when one is free, nobody waits, and `tenant`
    /// holds fewer than an equal share of the pool among the tenants holding slots (itself
    /// counted) and fewer than half of it. For what is worth having but never worth waiting
    /// for.
    pub fn try_share(&self, tenant: &str) -> Option<Slot> {
        let mut state = lock(&self.state);
        if state.free == 0 || !state.waiting.is_empty() {
            return None;
        }
        let held = state.running.get(tenant).copied().unwrap_or(0);
        let tenants = state.running.len() + usize::from(held == 0);
        // Never more than half the pool, so that another tenant always finds room.
        let share = (self.capacity / tenants.max(1))
            .min(self.capacity / 2)
            .max(1);
        if held >= share {
            return None;
        }
        state.free -= 1;
        *state.running.entry(tenant.to_owned()).or_default() += 1;
        Some(Slot {
            state: self.state.clone(),
            tenant: tenant.to_owned(),
            armed: true,
        })
    }

    /// Waits for a slot for `tenant`.
    pub async fn acquire(&self, tenant: &str) -> Slot {
        let rx = {
            let mut state = lock(&self.state);
            if state.free > 0 && state.waiting.is_empty() {
                state.free -= 1;
                *state.running.entry(tenant.to_owned()).or_default() += 1;
                return Slot {
                    state: self.state.clone(),
                    tenant: tenant.to_owned(),
                    armed: true,
                };
            }
            let (tx, rx) = oneshot::channel();
            state.waiting.push_back((tenant.to_owned(), tx));
            rx
        };
        // The sender is only dropped with a slot sent; the pool outlives every waiter. Nothing
        // a tenant sends reaches this: it holds whatever the guest does.
        #[allow(clippy::expect_used)]
        rx.await
            .expect("a waiter's sender is dropped only after sending a slot")
    }

    /// Slots held by `tenant` now.
    #[cfg(test)]
    fn held_by(&self, tenant: &str) -> usize {
        lock(&self.state).running.get(tenant).copied().unwrap_or(0)
    }
}

fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    state.locked()
}

impl Drop for Slot {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let mut state = lock(&self.state);
        if let Some(n) = state.running.get_mut(&self.tenant) {
            *n -= 1;
            if *n == 0 {
                state.running.remove(&self.tenant);
            }
        }
        // Hand the slot to the waiting tenant holding the fewest (first come among equals).
        loop {
            state.waiting.retain(|(_, tx)| !tx.is_closed());
            let next = state
                .waiting
                .iter()
                .enumerate()
                .min_by_key(|(at, (tenant, _))| {
                    (state.running.get(tenant).copied().unwrap_or(0), *at)
                })
                .map(|(at, _)| at);
            let Some(at) = next else {
                state.free += 1;
                return;
            };
            let Some((tenant, tx)) = state.waiting.remove(at) else {
                state.free += 1;
                return;
            };
            *state.running.entry(tenant.clone()).or_default() += 1;
            let slot = Slot {
                state: self.state.clone(),
                tenant: tenant.clone(),
                armed: true,
            };
            match tx.send(slot) {
                Ok(()) => return,
                Err(mut unsent) => {
                    // The waiter went away meanwhile: take the slot back, try the next one.
                    unsent.armed = false;
                    if let Some(n) = state.running.get_mut(&tenant) {
                        *n -= 1;
                        if *n == 0 {
                            state.running.remove(&tenant);
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// The slot, if the waiter got one within a moment.
    async fn granted(rx: &mut tokio::task::JoinHandle<Slot>) -> Option<Slot> {
        tokio::time::timeout(Duration::from_millis(50), rx)
            .await
            .ok()
            .map(|joined| joined.expect("the waiter task"))
    }

    #[tokio::test]
    async fn a_freed_slot_goes_to_the_tenant_holding_the_fewest() {
        let pool = FairSlots::new(2);
        let a1 = pool.acquire("a").await;
        let a2 = pool.acquire("a").await;
        // team-a's backlog queues first, team-b's one reconcile after it.
        let mut backlog: Vec<_> = (0..5)
            .map(|_| {
                let pool = pool.clone();
                tokio::spawn(async move { pool.acquire("a").await })
            })
            .collect();
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        let mut b = {
            let pool = pool.clone();
            tokio::spawn(async move { pool.acquire("b").await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(granted(&mut b).await.is_none(), "no slot is free yet");
        drop(a1);
        let b_slot = granted(&mut b).await;
        assert!(
            b_slot.is_some(),
            "team-b got the freed slot before team-a's backlog"
        );
        assert_eq!(pool.held_by("b"), 1);
        assert_eq!(pool.held_by("a"), 1);
        // The next freed slot goes to team-a's backlog, first come first.
        drop(a2);
        let first = granted(&mut backlog[0]).await;
        assert!(first.is_some());
        for waiter in &mut backlog[1..] {
            assert!(granted(waiter).await.is_none());
        }
        drop((b_slot, first));
    }

    #[test]
    fn a_share_is_taken_only_when_free_and_within_the_tenants_part() {
        let pool = FairSlots::new(4);
        // Alone, a tenant takes half the pool, never more.
        let a: Vec<Slot> = (0..3).filter_map(|_| pool.try_share("a")).collect();
        assert_eq!(a.len(), 2);
        // Another tenant finds the rest: its equal share of two tenants.
        let b: Vec<Slot> = (0..3).filter_map(|_| pool.try_share("b")).collect();
        assert_eq!(b.len(), 2);
        assert!(pool.try_share("c").is_none(), "the pool is full");
        drop(a);
        // b and c now: c's share is 4 / 2.
        let c: Vec<Slot> = (0..3).filter_map(|_| pool.try_share("c")).collect();
        assert_eq!(c.len(), 2);
        drop(b);
        let b = pool.try_share("b");
        assert!(b.is_some());
        // Three tenants: d's share is 4 / 3 = 1.
        let d = pool.try_share("d");
        assert!(d.is_some(), "the free slot, within d's share of 1");
        assert!(pool.try_share("e").is_none(), "the pool is full");
        drop((b, c, d));
        let one = FairSlots::new(1);
        assert!(one.try_share("a").is_some(), "a pool of one: its one");
    }

    #[tokio::test]
    async fn a_waiter_that_gave_up_does_not_lose_the_slot() {
        let pool = FairSlots::new(1);
        let held = pool.acquire("a").await;
        let gone = {
            let pool = pool.clone();
            tokio::spawn(async move { pool.acquire("b").await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        gone.abort();
        let _ = gone.await;
        drop(held);
        let again = tokio::time::timeout(Duration::from_secs(5), pool.acquire("c"))
            .await
            .expect("the slot came back");
        assert_eq!(pool.held_by("c"), 1);
        drop(again);
        assert_eq!(pool.held_by("c"), 0);
    }
}
