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
//! the manager has taken its module (or [`UNTAKEN_TTL`] has passed: a module nobody takes
//! must not hold a permit), so at most [`PARALLEL_PULLS`] modules are in memory between the
//! registry and the compiler at once.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use oci_client::secrets::RegistryAuth;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use super::oci::{PullError, Pulled, RegistryConfig, docker_config_auth, pull};
use crate::api::{ImageRef, Reason};
use crate::sync::Locks as _;

/// Pulls under way (or done and not yet taken) at once, for all controllers.
pub const PARALLEL_PULLS: usize = 4;

/// How long a pulled module waits to be taken before it is dropped (and its permit freed).
pub const UNTAKEN_TTL: Duration = Duration::from_secs(30);

/// Whose credentials a pull uses.
#[derive(Clone)]
pub enum Credentials {
    /// None.
    Anonymous,
    /// A `kubernetes.io/dockerconfigjson` Secret, read with `client` (which acts as the
    /// controller's ServiceAccount `account`).
    Secret {
        /// A client impersonating the ServiceAccount.
        client: kube::Client,
        /// The Secret's (and the ServiceAccount's) namespace.
        namespace: String,
        /// The Secret's name.
        name: String,
        /// The ServiceAccount's name.
        account: String,
    },
}

impl Credentials {
    /// What the credentials are, to tell a changed spec from an unchanged one.
    fn describe(&self) -> String {
        match self {
            Credentials::Anonymous => String::new(),
            Credentials::Secret {
                namespace,
                name,
                account,
                ..
            } => format!("{namespace}/{name} as {account}"),
        }
    }

    /// The registry credentials, read from the Secret as the ServiceAccount.
    async fn registry_auth(&self, registry: &str) -> Result<RegistryAuth, PullError> {
        let Credentials::Secret {
            client,
            namespace: ns,
            name,
            account,
        } = self
        else {
            return Ok(RegistryAuth::Anonymous);
        };
        let refuse = |reason, message| Err(PullError::PullSecret { reason, message });
        let api: kube::Api<Secret> = kube::Api::namespaced(client.clone(), ns);
        let secret = match api.get(name).await {
            Ok(secret) => secret,
            Err(kube::Error::Api(e)) if e.code == 403 => {
                return refuse(
                    Reason::Forbidden,
                    format!(
                        "ServiceAccount {ns}/{account} may not get Secret {ns}/{name} (spec.module.imagePullSecret), and the runtime reads it as that account: {}; its owner allows it with `kubectl -n {ns} create role {name}-reader --verb=get --resource=secrets --resource-name={name}` and `kubectl -n {ns} create rolebinding {name}-reader --role={name}-reader --serviceaccount={ns}:{account}`",
                        crate::sandbox::guest_text(&e.message, 300)
                    ),
                );
            }
            Err(kube::Error::Api(e)) if e.code == 404 => {
                return refuse(
                    Reason::ModuleNotFound,
                    format!(
                        "Secret {ns}/{name} (spec.module.imagePullSecret) does not exist; create it with `kubectl -n {ns} create secret docker-registry {name} --docker-server={registry} --docker-username=USER --docker-password=PASSWORD`"
                    ),
                );
            }
            Err(e) => {
                return refuse(
                    Reason::ClientError,
                    format!("cannot read Secret {ns}/{name} (spec.module.imagePullSecret): {e}"),
                );
            }
        };
        let invalid = |why: String| {
            refuse(
                Reason::InvalidSpec,
                format!("Secret {ns}/{name} (spec.module.imagePullSecret) {why}"),
            )
        };
        if secret.type_.as_deref() != Some("kubernetes.io/dockerconfigjson") {
            return invalid(format!(
                "is of type {}, not kubernetes.io/dockerconfigjson; make it with `kubectl create secret docker-registry`",
                secret.type_.as_deref().unwrap_or("Opaque")
            ));
        }
        let Some(json) = secret
            .data
            .as_ref()
            .and_then(|d| d.get(".dockerconfigjson"))
        else {
            return invalid("has no key .dockerconfigjson".into());
        };
        match docker_config_auth(&json.0, registry) {
            Ok(Some(auth)) => Ok(auth),
            Ok(None) => invalid(format!("has no credentials for registry {registry}")),
            Err(why) => invalid(why),
        }
    }
}

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
    tenants: Mutex<HashMap<String, Arc<Semaphore>>>,
    slots: Mutex<HashMap<String, Slot>>,
    done: Mutex<HashSet<String>>,
    notify: Notify,
}

impl Pulls {
    /// Pulls under `config`, each controller's at most once per `poll`.
    pub fn new(config: RegistryConfig, poll: Duration) -> Arc<Pulls> {
        Arc::new(Pulls {
            config,
            poll,
            permits: Arc::new(Semaphore::new(PARALLEL_PULLS)),
            tenants: Mutex::default(),
            slots: Mutex::default(),
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
    /// when nothing is loaded (`known`, a manifest digest, is `None`), else once per poll.
    pub fn module(
        self: &Arc<Self>,
        key: &str,
        image: &ImageRef,
        credentials: Credentials,
        known: Option<&str>,
    ) -> Polled {
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
            let tenant = this
                .tenants
                .locked()
                .entry(tenant_of(&key).to_owned())
                .or_insert_with(|| Arc::new(Semaphore::new(1)))
                .clone();
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
        let mut slots = self.slots.locked();
        slots.retain(|key, _| keep(key));
        let tenants: std::collections::HashSet<&str> = slots.keys().map(|k| tenant_of(k)).collect();
        self.tenants.locked().retain(|tenant, turn| {
            tenants.contains(tenant.as_str()) || turn.available_permits() == 0
        });
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

/// The tenant of a controller's key: its namespace (`ns/name`), or `""` for the cluster's.
fn tenant_of(key: &str) -> &str {
    key.split_once('/').map_or("", |(ns, _)| ns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_is_one_tenant_and_the_cluster_controllers_another() {
        assert_eq!(tenant_of("team-a/hello"), "team-a");
        assert_eq!(tenant_of("pod-watcher"), "");
    }

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
}
