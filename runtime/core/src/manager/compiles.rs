//! Compiles beside the manager loop. A new module is compiled in a child process
//! ([`crate::sandbox::ChildCompiler`]) that may take as long as its CPU limit allows; the loop
//! does not wait for it: reading the module answers [`Compiling`](super::modules) at once, the
//! compile runs on a blocking thread, and the loop is handed the result
//! ([`Manager::on_compiled`](super::Manager)) with every controller that asked for that module
//! meanwhile. One compile per digest: a controller whose module is being compiled joins it
//! (and costs its namespace's compile budget nothing).
//!
//! Compiles run one at a time (each uses every core), taken round-robin between tenants (a
//! namespace; the cluster's controllers together): a tenant that queued many compiles delays
//! another's next one by at most one compile, not by all of its own. Each is handed back with
//! the compiler's CPU time, which the manager charges to the tenant's compile budget.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::sandbox::{Digest, GuestPre, LoadError, Sandbox, compilers_cpu};
use crate::sources::Version;
use crate::sync::Locks as _;

use super::ControllerId;

/// A controller waiting for a compile: what it read its module as.
pub(super) struct Waiter {
    pub id: ControllerId,
    /// Which of its modules: the live one or its candidate.
    pub slot: super::life::Slot,
    /// The version of its source the bytes came from.
    pub version: Version,
    /// The anonymous pinned image it shares, if it does (see `shared_images`).
    pub shared: Option<String>,
}

/// A compile that ended, and the controllers that waited for it.
pub(super) struct Compiled {
    pub digest: Digest,
    /// The tenant whose turn it was (who started it), charged its CPU time.
    pub tenant: Option<String>,
    /// The compiler process's CPU time (or, compiled in the runtime's process or mapped from
    /// the compiled cache, the time it took).
    pub cpu: Duration,
    /// The module, or why not.
    pub result: Result<Arc<GuestPre>, LoadError>,
    /// Who asked for it while it ran.
    pub waiters: Vec<Waiter>,
}

/// A compile waiting for its turn.
struct Job {
    tenant: Option<String>,
    sandbox: Sandbox,
    bytes: Box<dyn AsRef<[u8]> + Send>,
    digest: Digest,
}

/// The compiles waiting for their turn, per tenant, and whether one runs.
#[derive(Default)]
struct Queue {
    jobs: HashMap<Option<String>, VecDeque<Job>>,
    /// Tenants with jobs, in the order they are served next.
    turns: VecDeque<Option<String>>,
    running: bool,
}

impl Queue {
    /// The next job: the first of the tenant whose turn it is (that tenant goes last).
    fn next(&mut self) -> Option<Job> {
        let tenant = self.turns.pop_front()?;
        let jobs = self.jobs.get_mut(&tenant)?;
        let job = jobs.pop_front();
        if jobs.is_empty() {
            self.jobs.remove(&tenant);
        } else {
            self.turns.push_back(tenant);
        }
        job
    }
}

/// The compiles under way, by digest, with their waiters.
pub(super) struct Compiles {
    waiting: Arc<Mutex<HashMap<Digest, Vec<Waiter>>>>,
    queue: Arc<Mutex<Queue>>,
    done: mpsc::UnboundedSender<Compiled>,
    /// Taken by the manager loop when it starts.
    ended: Mutex<Option<mpsc::UnboundedReceiver<Compiled>>>,
}

impl Compiles {
    pub(super) fn new() -> Compiles {
        let (done, ended) = mpsc::unbounded_channel();
        Compiles {
            waiting: Arc::default(),
            queue: Arc::default(),
            done,
            ended: Mutex::new(Some(ended)),
        }
    }

    /// The ends of compiles, for the manager loop (once).
    pub(super) fn ended(&self) -> Option<mpsc::UnboundedReceiver<Compiled>> {
        self.ended.locked().take()
    }

    /// Adds `waiter` to the compile of `digest` if one is under way (once per controller: a
    /// controller that reads its module again while it compiles waits once, with its latest
    /// read); else gives it back (`Some`).
    pub(super) fn join(&self, digest: Digest, waiter: Waiter) -> Option<Waiter> {
        match self.waiting.locked().get_mut(&digest) {
            Some(waiters) => {
                waiters.retain(|w| (&w.id, w.slot) != (&waiter.id, waiter.slot));
                waiters.push(waiter);
                None
            }
            None => Some(waiter),
        }
    }

    /// Compiles `bytes` (of `digest`) on a blocking thread for `waiter` and whoever joins, in
    /// the turn of `waiter`'s tenant; the loop is handed the result. At most one compile per
    /// digest (callers [`Compiles::join`] first).
    pub(super) fn start(
        &self,
        sandbox: Sandbox,
        bytes: impl AsRef<[u8]> + Send + 'static,
        digest: Digest,
        waiter: Waiter,
    ) {
        let tenant = waiter.id.namespace.clone();
        self.waiting.locked().insert(digest, vec![waiter]);
        let job = Job {
            tenant: tenant.clone(),
            sandbox,
            bytes: Box::new(bytes),
            digest,
        };
        let mut queue = self.queue.locked();
        if !queue.jobs.contains_key(&tenant) {
            queue.turns.push_back(tenant.clone());
        }
        queue.jobs.entry(tenant).or_default().push_back(job);
        if queue.running {
            return;
        }
        queue.running = true;
        let (queue, waiting, done) = (self.queue.clone(), self.waiting.clone(), self.done.clone());
        tokio::spawn(async move {
            loop {
                let next = {
                    let mut queue = queue.locked();
                    let next = queue.next();
                    queue.running = next.is_some();
                    next
                };
                let Some(Job {
                    tenant,
                    sandbox,
                    bytes,
                    digest,
                }) = next
                else {
                    return;
                };
                let (result, cpu) = tokio::task::spawn_blocking(move || {
                    // One compile at a time: the compilers' CPU time that grew is this one's.
                    let (before, started) = (compilers_cpu(), Instant::now());
                    let result = sandbox.load((*bytes).as_ref());
                    let child = compilers_cpu()
                        .zip(before)
                        .map(|(after, before)| after.saturating_sub(before))
                        .filter(|cpu| !cpu.is_zero());
                    (result, child.unwrap_or_else(|| started.elapsed()))
                })
                .await
                .unwrap_or_else(|e| {
                    let failed = format!("the compile's thread failed: {e}");
                    (
                        Err(LoadError::Engine(wasmtime::Error::msg(failed))),
                        Duration::ZERO,
                    )
                });
                let waiters = waiting.locked().remove(&digest).unwrap_or_default();
                // The loop is gone only when the runtime stops.
                let _ = done.send(Compiled {
                    digest,
                    tenant,
                    cpu,
                    result,
                    waiters,
                });
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiter(name: &str) -> Waiter {
        waiter_in("ns", name)
    }

    fn waiter_in(namespace: &str, name: &str) -> Waiter {
        Waiter {
            id: ControllerId {
                namespace: Some(namespace.into()),
                name: name.into(),
            },
            slot: crate::manager::life::Slot::Live,
            version: Version::Image("sha256:00".into()),
            shared: None,
        }
    }

    #[tokio::test]
    async fn a_compile_is_shared_by_who_joins_it_and_handed_to_the_loop() {
        let compiles = Compiles::new();
        let mut ended = compiles.ended().expect("the loop's end");
        assert!(compiles.ended().is_none(), "once");
        let digest = Digest::of(b"not wasm");
        assert!(
            compiles.join(digest, waiter("first")).is_some(),
            "none under way"
        );
        let sandbox = Sandbox::new(crate::sandbox::SandboxConfig {
            max_instances: 1,
            ..Default::default()
        })
        .expect("a sandbox");
        // Joined before the blocking thread runs: the loop is not awaited by the test.
        compiles.start(sandbox, b"not wasm".to_vec(), digest, waiter("first"));
        let joined = compiles.join(digest, waiter("second"));
        let compiled = ended.recv().await.expect("the compile ends");
        assert_eq!(compiled.digest, digest);
        assert!(matches!(compiled.result, Err(LoadError::NotWasm)));
        let names: Vec<&str> = compiled
            .waiters
            .iter()
            .map(|w| w.id.name.as_str())
            .collect();
        match joined {
            None => assert_eq!(names, ["first", "second"]),
            Some(_) => assert_eq!(names, ["first"], "ended before the join: not joined"),
        }
        assert!(
            compiles.join(digest, waiter("third")).is_some(),
            "ended: none under way"
        );
        // A controller that reads again while its module compiles waits once.
        compiles
            .waiting
            .locked()
            .insert(digest, vec![waiter("again")]);
        assert!(compiles.join(digest, waiter("again")).is_none());
        assert!(compiles.join(digest, waiter("other")).is_none());
        let names: Vec<String> = compiles.waiting.locked()[&digest]
            .iter()
            .map(|w| w.id.name.clone())
            .collect();
        assert_eq!(names, ["again", "other"]);
    }

    /// team-a queues three compiles, then team-b one: team-b's runs second, not fourth.
    #[tokio::test]
    async fn compiles_are_taken_round_robin_between_tenants() {
        let compiles = Compiles::new();
        let mut ended = compiles.ended().expect("the loop's end");
        let sandbox = Sandbox::new(crate::sandbox::SandboxConfig {
            max_instances: 1,
            ..Default::default()
        })
        .expect("a sandbox");
        let queued = [
            ("team-a", "a1"),
            ("team-a", "a2"),
            ("team-a", "a3"),
            ("team-b", "b1"),
        ];
        // Queued before the worker runs (this test's runtime runs one task at a time).
        for (namespace, name) in queued {
            let digest = Digest::of(name.as_bytes());
            compiles.start(
                sandbox.clone(),
                name.as_bytes().to_vec(),
                digest,
                waiter_in(namespace, name),
            );
        }
        let mut order = Vec::new();
        for _ in queued {
            let compiled = ended.recv().await.expect("a compile ends");
            assert!(matches!(compiled.result, Err(LoadError::NotWasm)));
            order.extend(compiled.waiters.into_iter().map(|w| w.id.name));
        }
        assert_eq!(order, ["a1", "b1", "a2", "a3"]);
        assert!(
            !compiles.queue.locked().running,
            "the worker ends with the queue"
        );
    }
}
