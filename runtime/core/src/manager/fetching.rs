//! A controller's module is fetched beside the loop, whatever its source
//! ([`sources::Fetches`]): the loop asks, is answered at once ("under way", or what the last
//! fetch found), and is woken when a fetch has found something ([`Manager::on_fetched`]). What
//! a fetch does — the ConfigMap read and its share, the file, the registry's pull, the
//! compiled module of an anonymous pinned image another controller runs — is
//! [`sources::fetch`]'s and this job's; what is done with its answer (the compile, the caps,
//! the swap) stays on the loop, in [`super::modules`].

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;

use crate::api::{Problem, Source};
use crate::host::ServiceAccount;
use crate::sandbox::GuestPre;
use crate::sources::{self, Asked, ClusterOrigin, ImagePuller, ModuleBytes, Sourced as _, Version};

use super::life::Slot;
use super::{ControllerId, Manager};

/// What a fetch found of a controller's module.
pub(super) enum Read {
    /// Its source is still at the version loaded.
    Unchanged,
    /// The module's bytes (gunzipped, pin checked), from this version.
    Bytes(ModuleBytes, Version),
    /// The module of an anonymous pinned image another controller runs, compiled (or why it
    /// does not compile), without a pull.
    Shared(Result<Arc<GuestPre>, String>, Version),
    /// Bytes of this version that are no module: why (not read again until it changes).
    Invalid(String, Version),
}

/// A fetch's answer: what it found, or why it found nothing (a source that does not answer).
pub(super) type Answer = Result<Read, Problem>;

/// The key of a controller's candidate's fetches and pulls (its module's: its id).
pub(super) fn candidate_key(id: &ControllerId) -> String {
    format!("{id}#candidate")
}

/// The key of the fetches and pulls of `id`'s module in `slot`.
pub(super) fn key_of(id: &ControllerId, slot: Slot) -> String {
    match slot {
        Slot::Live => id.to_string(),
        Slot::Candidate => candidate_key(id),
    }
}

/// What [`Manager::ask_module`] is asked for.
pub(super) struct Asking<'a> {
    /// Which of the controller's modules.
    pub slot: Slot,
    pub source: &'a Source,
    pub pin: Option<&'a str>,
    /// The version the controller's module came from.
    pub loaded: Option<&'a Version>,
    /// The controller's ServiceAccount, which the runtime may act as (checked).
    pub account: ServiceAccount,
}

impl Manager {
    /// What the last fetch of `id`'s module found, or [`Asked::Running`] after starting one.
    pub(super) fn ask_module(&self, id: &ControllerId, asking: Asking<'_>) -> Asked<Answer> {
        let Asking {
            slot,
            source,
            pin,
            loaded,
            account,
        } = asking;
        let key = key_of(id, slot);
        // What the fetch is for: a spec that names another module (or account) makes the
        // answer of a fetch under way worthless.
        let wanted = format!(
            "{source:?} pin {pin:?} as {}/{}",
            account.namespace, account.name
        );
        self.fetches.ask(&key, &wanted, || {
            self.fetch_job(&key, source, pin, loaded, account)
        })
    }

    /// The fetch of `id`'s module, to run beside the loop: `None` when it found nothing new
    /// (a pull under way: the pulls wake the loop when it ends).
    fn fetch_job(
        &self,
        key: &str,
        source: &Source,
        pin: Option<&str>,
        loaded: Option<&Version>,
        account: ServiceAccount,
    ) -> impl Future<Output = Option<Answer>> + Send + 'static {
        let mut origin = ClusterOrigin::new(
            self.client.clone(),
            self.module_config_maps.clone(),
            self.config.module_dir.clone(),
            self.config.max_module_bytes,
            self.reads.clone(),
        );
        let mut impersonating = Ok(());
        if source.pulled() {
            // A pull secret is read as the controller's ServiceAccount (checked by the caller).
            let account = match source.credentials() {
                None => None,
                Some(_) => match self.impersonating(&account.namespace, &account.name) {
                    Ok(client) => Some((account.namespace, account.name, client)),
                    Err(e) => {
                        impersonating =
                            Err(Problem::new(crate::api::Reason::ClientError, e.to_string()));
                        None
                    }
                },
            };
            origin = origin.with_puller(ImagePuller {
                pulls: self.pulls.clone(),
                key: key.to_owned(),
                account,
            });
        }
        // An image another controller already runs by the same anonymous pinned reference:
        // its module, compiled, without a pull (one reader per reference at a time).
        let shared = source
            .shareable()
            .filter(|(_, digest)| loaded != Some(&Version::Image(digest.clone())));
        let (shared_images, sandbox, pulls) = (
            self.shared_images.clone(),
            self.sandbox.clone(),
            self.pulls.clone(),
        );
        let (key, source) = (key.to_owned(), source.clone());
        let (pin, loaded) = (pin.map(str::to_owned), loaded.cloned());
        async move {
            if let Err(problem) = impersonating {
                return Some(Err(problem));
            }
            let _turn = match &shared {
                Some((reference, digest)) => {
                    let turn = shared_images.turn(reference).await;
                    let compiled = match shared_images.known(reference) {
                        Some(k) if sources::check_pin(k.digest, pin.as_deref(), false).is_ok() => {
                            match k.compiled {
                                Ok(()) => sandbox.loaded(&k.digest).map(Ok),
                                Err(why) => Some(Err(why)),
                            }
                        }
                        _ => None,
                    };
                    if let Some(compiled) = compiled {
                        pulls.settled(&key);
                        let version = Version::Image(digest.clone());
                        return Some(Ok(Read::Shared(compiled, version)));
                    }
                    Some(turn)
                }
                None => None,
            };
            match sources::fetch(&origin, &source, pin.as_deref(), loaded.as_ref()).await {
                Ok(sources::Fetched::Pending) => None,
                Ok(sources::Fetched::Unchanged) => Some(Ok(Read::Unchanged)),
                Ok(sources::Fetched::Module { bytes, version }) => {
                    Some(Ok(Read::Bytes(bytes, version)))
                }
                // Bytes that are no module fail the same way: read again only once they change.
                Err(e) => Some(match e.invalid_at() {
                    Some(version) => Ok(Read::Invalid(e.to_string(), version.clone())),
                    None => Err(Problem::new(e.reason(), e.to_string())),
                }),
            }
        }
    }

    /// Fetches or pulls of these controllers' modules found something: they load it (or
    /// start). Those of controllers that are gone, or no longer name an image, are forgotten.
    pub(super) async fn on_fetched(&mut self, keys: &HashSet<String>) {
        let ids: Vec<ControllerId> = self
            .controllers
            .keys()
            .filter(|id| keys.contains(&id.to_string()) || keys.contains(&candidate_key(id)))
            .cloned()
            .collect();
        self.forget_pulls();
        self.reload(&ids).await;
    }

    /// Forgets the pulls of controllers that no longer name an image, and the fetches of
    /// controllers that are gone.
    pub(super) fn forget_pulls(&self) {
        let mut images: HashSet<String> = HashSet::new();
        let mut declared: HashSet<String> = HashSet::new();
        for (id, m) in &self.controllers {
            declared.insert(id.to_string());
            if m.plan.source.as_ref().is_ok_and(|s| s.pulled()) {
                images.insert(id.to_string());
            }
            if let Some(Ok(candidate)) = &m.plan.candidate {
                declared.insert(candidate_key(id));
                if candidate.pulled() {
                    images.insert(candidate_key(id));
                }
            }
        }
        self.pulls.retain(|key| images.contains(key));
        self.fetches.retain(|key| declared.contains(key));
    }
}
