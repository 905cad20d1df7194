//! The replica's API writes, shared fairly: one rate for the whole replica
//! (`--max-writes-per-second`, a [`TokenBucket`]), handed out by start-time fair queuing —
//! first across tenants (a namespace's controllers; the cluster's controllers are one more
//! tenant), then, within a tenant, across its controllers.
//!
//! A tenant alone may use all of the rate; when several want more than there is, each gets an
//! equal share, however many controllers it runs (21 controllers of one tenant together get
//! what one tenant gets). A tenant's account is kept by namespace, not by runner: a
//! controller's restart or spec change gives its tenant nothing new. An idle tenant saves no
//! credit: when it wants writes again it starts at the current virtual time, ahead of the
//! tenants that have been writing, so its first write waits for at most one grant of each.
//!
//! One dispatcher task takes a token of the replica's rate, then grants it to the waiting
//! write whose tenant (then controller) has the smallest virtual time, and moves that time on
//! by one. A write whose waiter is gone (its reconcile was cancelled) gets no token.
//! Memory: an account is kept while its tenant or controller waits, or is ahead of the
//! current virtual time (it wrote more than its share lately) — no more.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};

use prometheus_client::metrics::counter::Counter;
use tokio::sync::{Notify, oneshot};

use super::TokenBucket;
use crate::sync::Locks as _;

/// The replica's write scheduler (see the module doc).
#[derive(Clone)]
pub struct WriteScheduler {
    inner: Arc<Inner>,
}

struct Inner {
    rate: TokenBucket,
    queues: Mutex<Queues>,
    wake: Arc<Notify>,
}

/// The accounts and the waiting writes.
#[derive(Default)]
struct Queues {
    /// The virtual time of the last grant.
    now: f64,
    tenants: BTreeMap<String, Tenant>,
    /// Writes granted so far.
    granted: u64,
}

#[derive(Default)]
struct Tenant {
    /// Its virtual time: grants it had, from when it last started waiting.
    at: f64,
    /// The virtual time of its last grant among its controllers.
    now: f64,
    controllers: BTreeMap<String, Account>,
}

#[derive(Default)]
struct Account {
    at: f64,
    waiting: VecDeque<oneshot::Sender<()>>,
}

impl Tenant {
    fn waiting(&self) -> bool {
        self.controllers.values().any(|c| !c.waiting.is_empty())
    }
}

impl WriteScheduler {
    /// A scheduler handing out `per_second` writes, `burst` at once after a quiet spell; its
    /// dispatcher runs on the current tokio runtime until the scheduler is dropped.
    pub fn new(per_second: f64, burst: u32) -> WriteScheduler {
        let wake = Arc::new(Notify::new());
        let inner = Arc::new(Inner {
            rate: TokenBucket::new(per_second, burst),
            queues: Mutex::default(),
            wake: wake.clone(),
        });
        tokio::spawn(dispatch(Arc::downgrade(&inner), wake));
        WriteScheduler { inner }
    }

    /// The door of controller `controller` of tenant `tenant` (its namespace, `""` for the
    /// cluster's), counting each write it is granted on `granted`.
    pub fn lane(&self, tenant: &str, controller: &str, granted: Counter) -> Lane {
        Lane {
            scheduler: self.clone(),
            tenant: tenant.to_owned(),
            controller: controller.to_owned(),
            granted,
        }
    }

    /// Writes granted so far, to every tenant.
    pub fn granted(&self) -> u64 {
        self.inner.queues.locked().granted
    }
}

/// One controller's door to the replica's writes.
pub struct Lane {
    scheduler: WriteScheduler,
    tenant: String,
    controller: String,
    granted: Counter,
}

impl Lane {
    /// Waits for this controller's turn and a token of the replica's rate.
    pub async fn take(&self) {
        let (grant, granted) = oneshot::channel();
        {
            let mut queues = self.scheduler.inner.queues.locked();
            let now = queues.now;
            let tenant = queues.tenants.entry(self.tenant.clone()).or_default();
            if !tenant.waiting() {
                // Idle time saves no credit.
                tenant.at = tenant.at.max(now);
            }
            let clock = tenant.now;
            let account = tenant
                .controllers
                .entry(self.controller.clone())
                .or_default();
            if account.waiting.is_empty() {
                account.at = account.at.max(clock);
            }
            account.waiting.push_back(grant);
        }
        self.scheduler.inner.wake.notify_one();
        // Err: the scheduler is gone (the runtime is stopping); the fence decides.
        let _ = granted.await;
        self.granted.inc();
    }

    /// Writes granted to this controller so far.
    pub fn granted(&self) -> u64 {
        self.granted.get()
    }
}

/// Hands out the replica's tokens, one at a time, until the scheduler is dropped.
async fn dispatch(inner: Weak<Inner>, wake: Arc<Notify>) {
    loop {
        let Some(scheduler) = inner.upgrade() else {
            return;
        };
        if !scheduler.queues.locked().waiting() {
            drop(scheduler);
            wake.notified().await;
            continue;
        }
        scheduler.rate.take().await;
        if !scheduler.queues.locked().grant() {
            scheduler.rate.refund();
        }
    }
}

impl Queues {
    fn waiting(&self) -> bool {
        self.tenants.values().any(Tenant::waiting)
    }

    /// Grants the next write (see the module doc); `false` when nobody waits any more.
    fn grant(&mut self) -> bool {
        loop {
            let Some((name, _)) = self
                .tenants
                .iter()
                .filter(|(_, t)| t.waiting())
                .min_by(|a, b| a.1.at.total_cmp(&b.1.at))
            else {
                return false;
            };
            let name = name.clone();
            let Some(tenant) = self.tenants.get_mut(&name) else {
                return false;
            };
            let Some(account) = tenant
                .controllers
                .values_mut()
                .filter(|c| !c.waiting.is_empty())
                .min_by(|a, b| a.at.total_cmp(&b.at))
            else {
                return false;
            };
            let Some(waiter) = account.waiting.pop_front() else {
                return false;
            };
            // A waiter that went away (its reconcile was cancelled) costs nothing.
            if waiter.send(()).is_err() {
                continue;
            }
            tenant.now = account.at;
            account.at += 1.0;
            self.now = tenant.at;
            tenant.at += 1.0;
            self.granted += 1;
            self.forget_settled();
            return true;
        }
    }

    /// Drops the accounts that remember nothing: nobody waits, and not ahead of the clock.
    /// When nobody waits at all, nobody is ahead of anyone: every account is dropped.
    fn forget_settled(&mut self) {
        if !self.waiting() {
            self.tenants.clear();
            return;
        }
        let now = self.now;
        self.tenants.retain(|_, tenant| {
            let clock = tenant.now;
            tenant
                .controllers
                .retain(|_, c| !c.waiting.is_empty() || c.at > clock);
            tenant.waiting() || tenant.at > now || !tenant.controllers.is_empty()
        });
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Each lane writes as fast as it is let, until `until`; how many each got.
    async fn flood(lanes: Vec<Lane>, until: Duration) -> Vec<u64> {
        let lanes: Vec<Arc<Lane>> = lanes.into_iter().map(Arc::new).collect();
        let tasks: Vec<_> = lanes
            .iter()
            .map(|lane| {
                let lane = lane.clone();
                tokio::spawn(async move {
                    loop {
                        lane.take().await;
                    }
                })
            })
            .collect();
        tokio::time::sleep(until).await;
        for task in &tasks {
            task.abort();
        }
        lanes.iter().map(|l| l.granted()).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_tenant_alone_gets_the_whole_rate() {
        let scheduler = WriteScheduler::new(100.0, 10);
        let got = flood(
            vec![scheduler.lane("team-a", "one", Counter::default())],
            Duration::from_secs(10),
        )
        .await;
        // 10 at once, then 100/s.
        assert!((1005..=1011).contains(&got[0]), "{got:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn tenants_share_equally_however_many_controllers_each_runs() {
        let scheduler = WriteScheduler::new(100.0, 1);
        let mut lanes: Vec<Lane> = (0..21)
            .map(|i| scheduler.lane("team-a", &format!("c{i}"), Counter::default()))
            .collect();
        lanes.push(scheduler.lane("team-b", "only", Counter::default()));
        let got = flood(lanes, Duration::from_secs(21)).await;
        let team_a: u64 = got[..21].iter().sum();
        let team_b = got[21];
        // 2,100 writes in 21 s: half each, and team-a's half shared by its 21 controllers.
        assert!(
            team_a.abs_diff(team_b) <= 2,
            "team-a {team_a}, team-b {team_b}"
        );
        for (i, one) in got[..21].iter().enumerate() {
            assert!(
                (48..=52).contains(one),
                "team-a's controller {i} got {one}: {got:?}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_tenant_saves_no_credit_but_goes_first_when_it_wakes() {
        let scheduler = WriteScheduler::new(10.0, 1);
        let busy = Arc::new(scheduler.lane("team-a", "flood", Counter::default()));
        let flooding = {
            let busy = busy.clone();
            tokio::spawn(async move {
                loop {
                    busy.take().await;
                }
            })
        };
        tokio::time::sleep(Duration::from_secs(30)).await;
        // team-b was idle for 30 s: its one write waits at most a grant or two, and then it
        // shares, rather than taking the 30 s of writes it did not use.
        let late = scheduler.lane("team-b", "one", Counter::default());
        let asked = tokio::time::Instant::now();
        late.take().await;
        assert!(
            asked.elapsed() <= Duration::from_millis(200),
            "{:?}",
            asked.elapsed()
        );
        let before = busy.granted();
        let got = flood(vec![late], Duration::from_secs(10)).await;
        let busy_got = busy.granted() - before;
        assert!(
            got[0].abs_diff(busy_got) <= 2,
            "team-b {got:?}, team-a {busy_got}"
        );
        flooding.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_write_takes_no_token() {
        let scheduler = WriteScheduler::new(1.0, 1);
        let lane = scheduler.lane("team-a", "one", Counter::default());
        lane.take().await; // the burst
        // Asked and given up before its turn.
        let gave_up = tokio::time::timeout(Duration::from_millis(100), lane.take()).await;
        assert!(gave_up.is_err());
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(
            scheduler.granted(),
            1,
            "the cancelled write was not granted"
        );
        // The next write goes at once: the bucket refilled while nobody waited.
        let asked = tokio::time::Instant::now();
        lane.take().await;
        assert_eq!(asked.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn accounts_are_forgotten_once_settled() {
        let scheduler = WriteScheduler::new(1000.0, 1000);
        for i in 0..100 {
            scheduler
                .lane(&format!("ns-{i}"), "c", Counter::default())
                .take()
                .await;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let kept = scheduler.inner.queues.locked().tenants.len();
        assert!(kept <= 1, "{kept} accounts kept");
    }
}
