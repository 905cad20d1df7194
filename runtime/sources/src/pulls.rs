//! The runtime's registry pulls, beside the manager loop: asking for a controller's image
//! starts a pull in a task of its own (at most [`PARALLEL_PULLS`] at once) and answers at
//! once — with the result of the last pull, or "not yet". When a pull ends, the manager is
//! woken ([`Pulls::notified`]) and asks again. So a registry that never answers, drips bytes
//! or sends an endless blob holds one task until its deadline, never the manager.
//!
//! Fairness: one tenant (a namespace's controllers, or the cluster's) pulls one image at a
//! time, so a tenant naming many images on a registry that never answers holds one of the
//! [`PARALLEL_PULLS`] permits, not all of them.
//!
//! Memory: a pull's bytes are at most `--max-module-bytes`; a pull keeps its permit until
//! the manager has taken its module for every controller waiting for it (or [`UNTAKEN_TTL`]
//! has passed: a module nobody takes must not hold a permit), so at most [`PARALLEL_PULLS`]
//! pulled modules are held between the registry and the compiler at once. A layer is charged
//! to the module read budget (`--module-read-bytes`, [`super::ReadBudget`]) before it is read,
//! and every controller a pull serves gets the same bytes, not a copy. The answer of a
//! digest-pinned shared pull is kept [`TAKEN_GRACE`] after its last waiter took it (its
//! permit freed, its bytes still charged), for a controller that names it while the module
//! compiles.
//!
//! Shared pulls: an *anonymous* pull gets the same answer for whoever asks (the registry
//! gives it to anyone): of a digest-pinned reference, the bytes the digest names; of a tag,
//! what the tag resolves to now. So one pull serves every controller that names it: ten
//! thousand tenants running one published module cause one pull, not ten thousand, and a tag
//! is resolved once per poll for all the controllers that have the same digest loaded. It waits for the turn of any one of the tenants waiting
//! for it, so a tenant whose own pulls queue behind a registry that never answers cannot
//! hold back another tenant's pull of the same reference. Pulls with a pull secret are never
//! shared: what one tenant's credentials may read is that tenant's.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

pub use super::credentials::Credentials;
use super::fetches::{Turns, tenant_of};
use super::oci::{PullError, Pulled, RegistryConfig, pull};
use kubewasm_api::ImageRef;
use kubewasm_sandbox::sync::Locks as _;

/// Pulls under way (or done and not yet taken) at once, for all controllers.
pub const PARALLEL_PULLS: usize = 4;

use super::fetches::UNTAKEN_TTL;

/// What asking for a controller's module found.
#[derive(Debug)]
pub enum Polled {
    /// A pull is under way (or not due yet): nothing new. With the error of the last pull
    /// that failed, if no pull succeeded since.
    Waiting(Option<PullError>),
    /// The last pull's answer.
    Done(Result<Pulled, PullError>),
}

/// One controller's pulls.
#[derive(Default)]
struct Slot {
    /// The image and credentials the pulls are for.
    wanted: String,
    /// Bumped when `wanted` changes: a pull of an older spec is dropped when it ends.
    generation: u64,
    running: bool,
    started: Option<tokio::time::Instant>,
    finished: Option<Finished>,
    /// The error of the last pull, taken, until one succeeds.
    last_error: Option<PullError>,
}

/// A pull's answer, until it is taken.
struct Finished {
    result: Result<Pulled, PullError>,
    at: tokio::time::Instant,
    _permit: Option<OwnedSemaphorePermit>,
}

/// The runtime's registry pulls, one slot per controller (see the module doc).
pub struct Pulls {
    config: RegistryConfig,
    /// The least time between two pulls of one controller's image.
    poll: Duration,
    permits: Arc<Semaphore>,
    /// One pull at a time per tenant (the namespace part of a key).
    tenants: Turns,
    slots: Mutex<HashMap<String, Slot>>,
    shared: Mutex<SharedPulls>,
    done: Mutex<HashSet<String>>,
    notify: Notify,
}

/// The shared pulls (see the module doc), by what they pull: `registry/repository@digest`,
/// or a tag and the digest its askers have loaded.
#[derive(Default)]
struct SharedPulls {
    pulls: HashMap<String, SharedPull>,
    /// The reference each waiting controller waits for (one at a time).
    waiting_on: HashMap<String, String>,
    /// The error of each controller's last shared pull, until one succeeds.
    last_error: HashMap<String, PullError>,
    /// When each pull of a tag last started (one per poll).
    polled: HashMap<String, tokio::time::Instant>,
}

/// One shared pull.
#[derive(Default)]
struct SharedPull {
    /// The controllers waiting for its answer.
    waiters: HashSet<String>,
    running: bool,
    /// Woken when a controller joins: the pull may now take its tenant's turn.
    joined: Arc<Notify>,
    /// The answer (with its permit), until every waiter has taken it (or [`UNTAKEN_TTL`] has
    /// passed); then, of a digest-pinned reference, for [`TAKEN_GRACE`] more without its
    /// permit.
    finished: Option<Finished>,
    /// Whether it pulls a digest-pinned reference (its answer never changes).
    pinned: bool,
}

/// How long the answer of a digest-pinned shared pull is kept after its last waiter took it:
/// a controller naming the same reference meanwhile (declared while the module compiles,
/// before the manager has it compiled) gets the same bytes, and joins that compile, instead
/// of pulling again. The bytes stay charged to the module read budget until dropped.
const TAKEN_GRACE: Duration = Duration::from_secs(10);

impl SharedPulls {
    /// `key` no longer waits for `reference`; a pull nobody waits for is forgotten (its bytes
    /// and permit freed) once it is not running.
    fn leave(&mut self, reference: &str, key: &str) {
        if let Some(pull) = self.pulls.get_mut(reference) {
            pull.waiters.remove(key);
            if pull.waiters.is_empty() {
                match pull.finished.as_mut() {
                    Some(kept) if pull.pinned && kept.result.is_ok() => {
                        kept._permit = None;
                        kept.at = tokio::time::Instant::now();
                    }
                    _ => pull.finished = None,
                }
                if !pull.running && pull.finished.is_none() {
                    self.pulls.remove(reference);
                }
            }
        }
    }
}

impl Pulls {
    /// Pulls under `config`, each controller's at most once per `poll`.
    pub fn new(config: RegistryConfig, poll: Duration) -> Arc<Pulls> {
        Arc::new(Pulls {
            config,
            poll,
            permits: Arc::new(Semaphore::new(PARALLEL_PULLS)),
            tenants: Turns::new(1),
            slots: Mutex::default(),
            shared: Mutex::default(),
            done: Mutex::default(),
            notify: Notify::new(),
        })
    }

    /// The operator's registry settings.
    pub fn config(&self) -> &RegistryConfig {
        &self.config
    }

    /// The answer of the last pull of `key`'s `image` (taken: asked again, it is a new pull),
    /// or [`Polled::Waiting`] — after starting a pull when none runs and one is due: at once
    /// when nothing is loaded (`known`, a manifest digest, is `None`), else once per poll. An
    /// anonymous pull of a digest-pinned reference is shared (see the module doc), and none
    /// is needed once that digest is loaded.
    pub fn module(
        self: &Arc<Self>,
        key: &str,
        image: &ImageRef,
        credentials: Credentials,
        known: Option<&str>,
    ) -> Polled {
        if let Credentials::Anonymous = credentials {
            let (reference, pull_known) = match image.digest() {
                Some(digest) if known == Some(digest) => {
                    return Polled::Done(Ok(Pulled::Unchanged));
                }
                Some(digest) => (image.at(digest), None),
                // A tag: shared by the controllers that have the same digest loaded (or
                // none), resolved once per poll for all of them.
                None => (
                    format!("{image} from {}", known.unwrap_or("nothing")),
                    known,
                ),
            };
            return self.shared_module(key, image, reference, pull_known);
        }
        self.leave_shared(key);
        let wanted = format!("{image} {}", credentials.describe());
        let mut slots = self.slots.locked();
        let slot = slots.entry(key.to_owned()).or_default();
        if slot.wanted != wanted {
            *slot = Slot {
                wanted,
                generation: slot.generation.wrapping_add(1),
                ..Slot::default()
            };
        }
        if let Some(Finished { result, .. }) = slot.finished.take() {
            slot.last_error = result.as_ref().err().cloned();
            return Polled::Done(result);
        }
        let now = tokio::time::Instant::now();
        let due = known.is_none() || slot.started.is_none_or(|at| now >= at + self.poll);
        if !slot.running && due {
            slot.running = true;
            slot.started = Some(now);
            let generation = slot.generation;
            let this = self.clone();
            let (key, image, known) = (key.to_owned(), image.clone(), known.map(str::to_owned));
            let tenant = this.tenants.of(tenant_of(&key));
            tokio::spawn(async move {
                let _turn = tenant.acquire_owned().await.ok();
                let permit = this.permits.clone().acquire_owned().await.ok();
                let result = this.pull(&image, &credentials, known.as_deref()).await;
                // Only a module's bytes are held with the permit until they are taken.
                let permit = permit.filter(|_| matches!(result, Ok(Pulled::Module { .. })));
                this.finish(&key, generation, result, permit);
            });
        }
        Polled::Waiting(slot.last_error.clone())
    }

    /// [`Pulls::module`] for an anonymous pull of `image` (`reference` names the pull: the
    /// image pinned, or the tag and the digest loaded, `known`): one pull for every
    /// controller asking, its answer given to each. With something loaded, at most one pull
    /// per poll.
    fn shared_module(
        self: &Arc<Self>,
        key: &str,
        image: &ImageRef,
        reference: String,
        known: Option<&str>,
    ) -> Polled {
        let mut shared = self.shared.locked();
        let now = tokio::time::Instant::now();
        let idle = shared
            .pulls
            .get(&reference)
            .is_none_or(|p| !p.running && p.finished.is_none());
        let due = known.is_none()
            || shared
                .polled
                .get(&reference)
                .is_none_or(|at| now >= *at + self.poll);
        if idle && !due {
            return Polled::Waiting(shared.last_error.get(key).cloned());
        }
        if let Some(before) = shared.waiting_on.insert(key.to_owned(), reference.clone())
            && before != reference
        {
            shared.leave(&before, key);
        }
        let pull = shared.pulls.entry(reference.clone()).or_default();
        pull.pinned = image.digest().is_some();
        if let Some(finished) = &pull.finished {
            // The permit stays with the answer until its last waiter has taken it (`leave`
            // below drops both). Each waiter takes the same bytes (`ModuleBytes` is shared),
            // charged once to the read budget until the last holder drops them.
            let result = finished.result.clone();
            match &result {
                Ok(_) => shared.last_error.remove(key),
                Err(e) => shared.last_error.insert(key.to_owned(), e.clone()),
            };
            shared.waiting_on.remove(key);
            shared.leave(&reference, key);
            return Polled::Done(result);
        }
        pull.waiters.insert(key.to_owned());
        if pull.running {
            pull.joined.notify_one();
        } else {
            pull.running = true;
            let this = self.clone();
            let (image, joined) = (image.clone(), pull.joined.clone());
            let known = known.map(str::to_owned);
            shared.polled.insert(reference.clone(), now);
            tokio::spawn(async move {
                let Some(_turn) = this.any_turn(&reference, &joined).await else {
                    return;
                };
                let permit = this.permits.clone().acquire_owned().await.ok();
                let result = this
                    .pull(&image, &Credentials::Anonymous, known.as_deref())
                    .await;
                let permit = permit.filter(|_| matches!(result, Ok(Pulled::Module { .. })));
                this.finish_shared(&reference, result, permit);
            });
        }
        Polled::Waiting(shared.last_error.get(key).cloned())
    }

    /// The turn of any one tenant waiting for the shared pull of `reference` (tenants who
    /// join while it waits count too); `None` once nobody waits for it (it is dropped).
    async fn any_turn(&self, reference: &str, joined: &Notify) -> Option<OwnedSemaphorePermit> {
        loop {
            let more = joined.notified();
            let turns: Vec<Arc<Semaphore>> = {
                let mut shared = self.shared.locked();
                let tenants: HashSet<String> = match shared.pulls.get(reference) {
                    Some(pull) if !pull.waiters.is_empty() => pull
                        .waiters
                        .iter()
                        .map(|k| tenant_of(k).to_owned())
                        .collect(),
                    _ => {
                        shared.pulls.remove(reference);
                        return None;
                    }
                };
                tenants.iter().map(|t| self.tenants.of(t)).collect()
            };
            let any = futures::future::select_all(
                turns.into_iter().map(|turn| Box::pin(turn.acquire_owned())),
            );
            tokio::select! {
                (turn, _, _) = any => return turn.ok(),
                () = more => {}
            }
        }
    }

    fn finish_shared(
        &self,
        reference: &str,
        result: Result<Pulled, PullError>,
        permit: Option<OwnedSemaphorePermit>,
    ) {
        let waiters: Vec<String> = {
            let mut shared = self.shared.locked();
            let Some(pull) = shared.pulls.get_mut(reference) else {
                return;
            };
            pull.running = false;
            if pull.waiters.is_empty() {
                shared.pulls.remove(reference);
                return;
            }
            pull.finished = Some(Finished {
                result,
                at: tokio::time::Instant::now(),
                _permit: permit,
            });
            pull.waiters.iter().cloned().collect()
        };
        self.done.locked().extend(waiters);
        self.notify.notify_one();
    }

    /// `key` has what it wanted without taking its shared pull's answer (the manager found
    /// the module already compiled): it waits no more, and an answer nobody else waits for
    /// is dropped.
    pub fn settled(&self, key: &str) {
        self.leave_shared(key);
    }

    fn leave_shared(&self, key: &str) {
        let mut shared = self.shared.locked();
        shared.last_error.remove(key);
        if let Some(reference) = shared.waiting_on.remove(key) {
            shared.leave(&reference, key);
        }
    }

    async fn pull(
        &self,
        image: &ImageRef,
        credentials: &Credentials,
        known: Option<&str>,
    ) -> Result<Pulled, PullError> {
        let deadline = self.config.pull_timeout;
        let auth = tokio::time::timeout(deadline, credentials.registry_auth(image.registry()))
            .await
            .unwrap_or_else(|_| {
                Err(PullError::TimedOut {
                    image: image.to_string(),
                    after: deadline,
                })
            })?;
        pull(&self.config, image, &auth, known).await
    }

    fn finish(
        &self,
        key: &str,
        generation: u64,
        result: Result<Pulled, PullError>,
        permit: Option<OwnedSemaphorePermit>,
    ) {
        {
            let mut slots = self.slots.locked();
            let Some(slot) = slots.get_mut(key) else {
                return;
            };
            if slot.generation != generation {
                return;
            }
            slot.running = false;
            slot.finished = Some(Finished {
                result,
                at: tokio::time::Instant::now(),
                _permit: permit,
            });
        }
        self.done.locked().insert(key.to_owned());
        self.notify.notify_one();
    }

    /// Waits until a pull has ended, and gives the keys of those that did.
    pub async fn notified(&self) -> HashSet<String> {
        self.notify.notified().await;
        std::mem::take(&mut *self.done.locked())
    }

    /// Forgets the pulls of keys `keep` says no: their controllers are gone or no longer
    /// name an image (their bytes and permits are freed); and drops answers untaken for
    /// [`UNTAKEN_TTL`].
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        let now = tokio::time::Instant::now();
        let mut shared = self.shared.locked();
        let gone: Vec<(String, String)> = shared
            .waiting_on
            .iter()
            .filter(|(key, _)| !keep(key))
            .map(|(key, reference)| (key.clone(), reference.clone()))
            .collect();
        for (key, reference) in gone {
            shared.waiting_on.remove(&key);
            shared.leave(&reference, &key);
        }
        shared.last_error.retain(|key, _| keep(key));
        let poll = self.poll;
        shared.polled.retain(|_, at| now < *at + poll);
        let stale: Vec<String> = shared
            .pulls
            .iter()
            .filter(|(_, p)| {
                let kept = if p.waiters.is_empty() {
                    TAKEN_GRACE
                } else {
                    UNTAKEN_TTL
                };
                p.finished.as_ref().is_some_and(|f| now >= f.at + kept)
            })
            .map(|(reference, _)| reference.clone())
            .collect();
        for reference in stale {
            // Its waiters were woken and did not take it: they ask again when they ask.
            if let Some(pull) = shared.pulls.remove(&reference) {
                for key in pull.waiters {
                    shared.waiting_on.remove(&key);
                }
            }
        }
        let mut slots = self.slots.locked();
        slots.retain(|key, _| keep(key));
        let tenants: HashSet<&str> = slots
            .keys()
            .chain(shared.waiting_on.keys())
            .map(|k| tenant_of(k))
            .collect();
        self.tenants.retain(|tenant| tenants.contains(tenant));
        for slot in slots.values_mut() {
            if slot
                .finished
                .as_ref()
                .is_some_and(|f| now >= f.at + UNTAKEN_TTL)
            {
                slot.finished = None;
                slot.started = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubewasm_api::Reason;

    #[tokio::test]
    async fn a_pull_answers_at_once_and_wakes_the_manager_when_it_ends() {
        // Nothing listens on port 9 of loopback: the pull fails fast, beside the caller.
        let pulls = Pulls::new(
            RegistryConfig {
                insecure: vec!["127.0.0.1:9".into()],
                ..RegistryConfig::new(1 << 20)
            },
            Duration::from_secs(5),
        );
        let image = ImageRef::parse("127.0.0.1:9/team/hello:v1").unwrap();
        let first = pulls.module("team/hello", &image, Credentials::Anonymous, None);
        assert!(matches!(first, Polled::Waiting(None)), "{first:?}");
        let woken = tokio::time::timeout(Duration::from_secs(60), pulls.notified())
            .await
            .expect("the manager is woken when the pull ends");
        assert!(woken.contains("team/hello"));
        match pulls.module("team/hello", &image, Credentials::Anonymous, None) {
            Polled::Done(Err(e)) => assert_eq!(e.reason(), Reason::ModuleNotFound, "{e}"),
            other => panic!("{other:?}"),
        }
        // Asked again at once: a new pull, the last error still said.
        match pulls.module("team/hello", &image, Credentials::Anonymous, None) {
            Polled::Waiting(Some(e)) => assert_eq!(e.reason(), Reason::ModuleNotFound),
            other => panic!("{other:?}"),
        }
    }

    /// A registry on loopback that closes every connection at once, counting them.
    async fn closing_registry() -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                drop(stream);
            }
        });
        (addr, accepted)
    }

    /// A registry on loopback that accepts connections and never answers.
    async fn silent_registry() -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        });
        addr
    }

    fn pulls_from(registries: &[&str]) -> Arc<Pulls> {
        Pulls::new(
            RegistryConfig {
                insecure: registries.iter().map(|r| r.to_string()).collect(),
                ..RegistryConfig::new(1 << 20)
            },
            Duration::from_secs(5),
        )
    }

    /// Waits until every key of `keys` has been woken.
    async fn woken(pulls: &Pulls, keys: &[&str]) -> HashSet<String> {
        let mut seen = HashSet::new();
        tokio::time::timeout(Duration::from_secs(10), async {
            while !keys.iter().all(|k| seen.contains(*k)) {
                seen.extend(pulls.notified().await);
            }
        })
        .await
        .unwrap_or_else(|_| panic!("woken: {seen:?}, want {keys:?}"));
        seen
    }

    #[tokio::test]
    async fn one_anonymous_pull_of_a_pinned_reference_serves_every_controller_naming_it() {
        let (addr, accepted) = closing_registry().await;
        let pulls = pulls_from(&[&addr]);
        let pinned = |n: char| {
            ImageRef::parse(&format!(
                "{addr}/team/hello@sha256:{}",
                n.to_string().repeat(64)
            ))
            .unwrap()
        };
        let connections = || accepted.load(std::sync::atomic::Ordering::SeqCst);

        // One controller's pull, to count what one pull costs.
        pulls.module("a/one", &pinned('1'), Credentials::Anonymous, None);
        woken(&pulls, &["a/one"]).await;
        let one_pull = connections();
        assert!(one_pull > 0, "the pull reached the registry");

        // Three tenants' controllers naming one reference: one pull, each woken and answered.
        let keys = ["b/x", "c/y", "d/z"];
        for key in keys {
            let first = pulls.module(key, &pinned('2'), Credentials::Anonymous, None);
            assert!(matches!(first, Polled::Waiting(None)), "{first:?}");
        }
        woken(&pulls, &keys).await;
        assert_eq!(
            connections(),
            2 * one_pull,
            "one pull for three controllers"
        );
        for key in keys {
            match pulls.module(key, &pinned('2'), Credentials::Anonymous, None) {
                Polled::Done(Err(e)) => assert_eq!(e.reason(), Reason::ModuleNotFound, "{e}"),
                other => panic!("{key}: {other:?}"),
            }
        }
        // Loaded at that digest: nothing to pull.
        let known = format!("sha256:{}", "2".repeat(64));
        assert!(matches!(
            pulls.module("b/x", &pinned('2'), Credentials::Anonymous, Some(&known)),
            Polled::Done(Ok(Pulled::Unchanged))
        ));
        // Asked again after a failure: a new pull, the controller's last error still said.
        match pulls.module("c/y", &pinned('2'), Credentials::Anonymous, None) {
            Polled::Waiting(Some(e)) => assert_eq!(e.reason(), Reason::ModuleNotFound),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_tag_is_resolved_once_per_poll_for_the_controllers_with_one_digest_loaded() {
        let (addr, accepted) = closing_registry().await;
        let pulls = pulls_from(&[&addr]);
        let tag = ImageRef::parse(&format!("{addr}/team/hello:v1")).unwrap();
        let connections = || accepted.load(std::sync::atomic::Ordering::SeqCst);
        pulls.module("a/one", &tag, Credentials::Anonymous, None);
        woken(&pulls, &["a/one"]).await;
        let one_pull = connections();
        assert!(one_pull > 0, "the pull reached the registry");

        let loaded = format!("sha256:{}", "4".repeat(64));
        let keys = ["b/x", "c/y", "d/z"];
        for key in keys {
            let first = pulls.module(key, &tag, Credentials::Anonymous, Some(&loaded));
            assert!(matches!(first, Polled::Waiting(None)), "{first:?}");
        }
        woken(&pulls, &keys).await;
        assert_eq!(
            connections(),
            2 * one_pull,
            "one resolution for three controllers"
        );
        for key in keys {
            let answer = pulls.module(key, &tag, Credentials::Anonymous, Some(&loaded));
            assert!(matches!(answer, Polled::Done(Err(_))), "{key}: {answer:?}");
        }
        // Asked again within the poll: no pull, the last error still said.
        let again = pulls.module("b/x", &tag, Credentials::Anonymous, Some(&loaded));
        assert!(matches!(again, Polled::Waiting(Some(_))), "{again:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(connections(), 2 * one_pull, "not due before the poll");
    }

    #[tokio::test]
    async fn a_shared_module_keeps_its_permit_until_every_waiter_took_it() {
        let pulls = pulls_from(&[]);
        let digest = format!("sha256:{}", "5".repeat(64));
        let reference = format!("example.com/pub/hello@{digest}");
        let reference = reference.as_str();
        {
            let mut shared = pulls.shared.locked();
            let pull = shared.pulls.entry(reference.to_owned()).or_default();
            pull.running = true;
            pull.waiters
                .extend(["a/one".to_owned(), "b/two".to_owned()]);
            for key in ["a/one", "b/two"] {
                shared
                    .waiting_on
                    .insert(key.to_owned(), reference.to_owned());
            }
        }
        let permit = pulls.permits.clone().acquire_owned().await.unwrap();
        let module = Pulled::Module {
            digest: digest.clone(),
            bytes: crate::ModuleBytes::uncharged(vec![0; 1 << 10]),
        };
        pulls.finish_shared(reference, Ok(module), Some(permit));
        let free = || pulls.permits.available_permits();
        assert_eq!(free(), PARALLEL_PULLS - 1);
        let image = ImageRef::parse(reference).unwrap();
        let taken = pulls.shared_module("a/one", &image, reference.to_owned(), None);
        assert!(
            matches!(taken, Polled::Done(Ok(Pulled::Module { .. }))),
            "{taken:?}"
        );
        assert_eq!(free(), PARALLEL_PULLS - 1, "b/two has not taken it yet");
        let taken = pulls.shared_module("b/two", &image, reference.to_owned(), None);
        assert!(
            matches!(taken, Polled::Done(Ok(Pulled::Module { .. }))),
            "{taken:?}"
        );
        assert_eq!(
            free(),
            PARALLEL_PULLS,
            "taken by every waiter: permit freed"
        );
        // A controller naming it a moment later (declared while the module compiles) gets
        // the same answer without a pull; past the grace, it is forgotten.
        let taken = pulls.shared_module("c/three", &image, reference.to_owned(), None);
        assert!(
            matches!(taken, Polled::Done(Ok(Pulled::Module { .. }))),
            "{taken:?}"
        );
        assert!(!pulls.shared.locked().pulls[reference].running, "no pull");
        tokio::time::pause();
        tokio::time::advance(TAKEN_GRACE).await;
        pulls.retain(|_| true);
        assert!(pulls.shared.locked().pulls.is_empty(), "bytes freed");
    }

    #[tokio::test]
    async fn a_shared_pull_takes_the_turn_of_any_tenant_waiting_for_it() {
        let silent = silent_registry().await;
        let (addr, accepted) = closing_registry().await;
        let pulls = pulls_from(&[&silent, &addr]);
        let connections = || accepted.load(std::sync::atomic::Ordering::SeqCst);
        // Tenant `slow` holds its turn on a registry that never answers (20 s to time out).
        let hanging = ImageRef::parse(&format!("{silent}/slow/hang:v1")).unwrap();
        pulls.module("slow/hang", &hanging, Credentials::Anonymous, None);
        let shared =
            ImageRef::parse(&format!("{addr}/pub/hello@sha256:{}", "3".repeat(64))).unwrap();
        pulls.module("slow/hello", &shared, Credentials::Anonymous, None);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(connections(), 0, "queued behind its only waiter's turn");

        // Another tenant names the same reference: the pull runs on that tenant's turn.
        pulls.module("fast/hello", &shared, Credentials::Anonymous, None);
        let done = woken(&pulls, &["fast/hello", "slow/hello"]).await;
        assert!(
            !done.contains("slow/hang"),
            "the silent registry still holds slow's turn"
        );
        assert!(connections() > 0);
    }
}
