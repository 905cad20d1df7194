//! Module loading and hot reload: fetch a controller's module from its source
//! ([`crate::sources`]), validate it in the sandbox, and swap it in when its digest changes.
//!
//! Module ConfigMaps are watched by their metadata only: a copy of every ConfigMap's bytes
//! in memory would be most of the runtime's memory (a thousand controllers, a thousand
//! copies of the same module). A ConfigMap's bytes are read when a controller starts and
//! whenever the ConfigMap's uid or resourceVersion is not the one the controller's module
//! came from ([`sources::ClusterOrigin`]), so a changed module is noticed as before, and an
//! unchanged one costs nothing.
//!
//! Every byte of a module is owned and capped where it is read ([`sources::ModuleReads`]):
//! a ConfigMap's version (or a gzipped image's digest) is read and gunzipped once for all
//! the controllers naming it, the bytes shared until the last has compiled them; every read,
//! pull and gunzip is charged to one budget (`--module-read-bytes`) before it reads; a gzip
//! stream inflates at most [`sources::MAX_GZIP_RATIO`] times its size. Bytes that are no
//! module are remembered by their version and not read again until it changes. And nothing
//! is read for a controller before the runtime knows it may act as its ServiceAccount (its
//! namespace and the account opted in): a tenant that did not opt in costs no read.
//!
//! Every module is fetched beside the manager loop ([`super::fetching`]): asking answers at
//! once, and the loop is woken when a fetch (or a registry's pull, [`sources::Pulls`]) has
//! found something ([`Manager::on_fetched`]). A tag is resolved
//! again every `--module-poll-seconds` with the files; a moved tag loads like a changed
//! ConfigMap (the last good module keeps running if the new one fails). An image pinned by
//! digest and pulled anonymously is pulled and compiled once for every controller naming it
//! ([`super::shared_images`]).

use std::collections::HashSet;
use std::sync::Arc;

use futures::StreamExt;

use crate::api::{Plan, Reason};
use crate::controller::ObjectKey;
use crate::sandbox::{Digest, GuestPre, LoadError};
use crate::sources::{Asked, Sourced as _, Version};

use super::compile_budget::Refused;
use super::compiles::{Compiled, Waiter};
use super::fetching::{Asking, Read};
use super::life::{Change, Found, Slot};
use super::shared_images::Known;
use super::{ControllerId, Manager, PARALLEL_STARTS, Problem};

/// What reading one of a controller's modules found ([`Manager::read_modules`]).
pub(super) struct ModuleRead(ControllerId, Slot, Result<Fetched, Problem>);

/// Which module of a controller is read, from where, and what it runs now.
struct Wanted<'a> {
    slot: Slot,
    source: &'a Result<crate::api::Source, String>,
    /// `sha256` of its spec.
    pin: Option<&'a str>,
    /// The version of its source its module came from.
    loaded: Option<&'a Version>,
}

/// What reading a controller's module found.
enum Fetched {
    /// Its source is still the version its module came from.
    Unchanged,
    /// Nothing new yet (a pull under way).
    Pending,
    /// Its module is being compiled, beside the loop ([`Manager::on_compiled`]).
    Compiling(Digest),
    /// These bytes, compiled (or why not), from this version of the source.
    Compiled(Result<Arc<GuestPre>, String>, Version),
    /// Not read: the runtime may not act as the controller's ServiceAccount (why: the
    /// problem its setup would have).
    Refused(Problem),
}

impl Manager {
    /// Reads these controllers' modules ([`PARALLEL_STARTS`] at once: reading one waits on
    /// the API server), then validates each and (when the digest changed) swaps it in. A
    /// module that fails leaves the last good one running. Callers drop unused modules after
    /// ([`Manager::retain_modules`]).
    pub(super) async fn load_modules(&mut self, ids: &[ControllerId]) {
        let fetched = self.read_modules(ids).await;
        self.load_fetched(fetched);
    }

    /// What [`Manager::read_module`] finds for each of these controllers, [`PARALLEL_STARTS`]
    /// at once. Reads only: nothing changes until [`Manager::load_fetched`].
    pub(super) async fn read_modules(&self, ids: &[ControllerId]) -> Vec<ModuleRead> {
        let mut wanted = Vec::new();
        for id in ids {
            let Some(m) = self.controllers.get(id) else {
                continue;
            };
            let live = (m.spec.module.sha256.clone(), m.plan.source.clone());
            wanted.push((id.clone(), Slot::Live, live, m.plan.clone()));
            // A candidate is read beside it, in the same tenant's turns and budgets; its
            // runner is handed it when it starts (or at once if it runs).
            if let (Some(source), Some(candidate)) = (&m.plan.candidate, &m.spec.candidate) {
                let pin = candidate.sha256.clone();
                wanted.push((
                    id.clone(),
                    Slot::Candidate,
                    (pin, source.clone()),
                    m.plan.clone(),
                ));
            }
        }
        futures::stream::iter(wanted)
            .map(|(id, slot, (pin, source), plan)| async move {
                let version = self
                    .controllers
                    .get(&id)
                    .and_then(|m| m.life.version_in(slot).cloned());
                let wanted = Wanted {
                    slot,
                    source: &source,
                    pin: pin.as_deref(),
                    loaded: version.as_ref(),
                };
                let fetched = self.read_module(&id, wanted, &plan).await;
                ModuleRead(id, slot, fetched)
            })
            .buffered(PARALLEL_STARTS)
            .collect()
            .await
    }

    /// Validates and swaps in what [`Manager::read_modules`] found.
    pub(super) fn load_fetched(&mut self, fetched: Vec<ModuleRead>) {
        for ModuleRead(id, slot, fetched) in fetched {
            self.load_module(&id, slot, fetched);
        }
        let compilations = self.sandbox.compilations();
        self.metrics
            .set_compilations(compilations.compiled(), compilations.cached());
        let layers = &self.config.module_cache;
        self.metrics.set_pulls(layers.pulled(), layers.hits());
        self.metrics.set_module_reads(&self.reads);
    }

    /// Validates (compiles once per digest) and swaps in what [`Manager::read_module`] found:
    /// the controller's life takes it ([`Life::read`]), and what it changed is carried out.
    fn load_module(&mut self, id: &ControllerId, slot: Slot, fetched: Result<Fetched, Problem>) {
        let found = match fetched {
            Ok(Fetched::Pending) => Found::Pending,
            Ok(Fetched::Compiling(digest)) => Found::Compiling(digest),
            Ok(Fetched::Refused(problem)) => Found::Refused(problem),
            Ok(Fetched::Unchanged) => Found::Unchanged,
            Err(problem) => Found::Unreachable(problem),
            Ok(Fetched::Compiled(compiled, version)) => {
                let image = self.controllers.get(id).and_then(|m| {
                    let source = match slot {
                        Slot::Live => m.plan.source.as_ref().ok()?,
                        Slot::Candidate => m.plan.candidate.as_ref()?.as_ref().ok()?,
                    };
                    source.image_at(&version)
                });
                // Each distinct module stays compiled while a controller runs it: a namespace
                // may hold only so many (its controllers running one module share it).
                let guest = compiled
                    .map_err(|e| Problem::new(Reason::ModuleInvalid, e))
                    .and_then(|guest| self.module_cap(id, slot, guest.digest()).map(|()| guest));
                Found::Loaded {
                    version,
                    image,
                    guest,
                }
            }
        };
        let Some(m) = self.controllers.get_mut(id) else {
            return;
        };
        if slot == Slot::Candidate {
            match m.life.read_in(slot, found) {
                Change::Swapped(guest) => {
                    tracing::info!(controller = %id, digest = %guest.digest(), image = m.life.candidate().and_then(|(_, i)| i).unwrap_or_default(), "candidate module loaded: compared in shadow with the live module");
                }
                Change::Failed(problem) => {
                    tracing::warn!(controller = %id, reason = %problem.reason, "candidate module not loaded: {}", problem.message);
                }
                _ => {}
            }
            return;
        }
        match m.life.read(found) {
            Change::Nothing => {}
            Change::Refused { problem, new } => {
                if new {
                    tracing::warn!(controller = %id, reason = %problem.reason, "module not read: {}", problem.message);
                }
            }
            Change::Kept => self.metrics.module_loaded(&id.to_string(), "success"),
            Change::Swapped(guest) => {
                self.metrics.module_loaded(&id.to_string(), "success");
                tracing::info!(controller = %id, digest = %guest.digest(), size = guest.size(), image = m.life.image().unwrap_or_default(), "module loaded");
            }
            Change::Failed(problem) => {
                self.metrics
                    .module_loaded(&id.to_string(), problem.reason.as_str());
                let keeping = m
                    .life
                    .guest()
                    .map(|g| format!("; still running the last good module {}", g.digest()))
                    .unwrap_or_default();
                tracing::warn!(controller = %id, reason = %problem.reason, "module not loaded: {}{keeping}", problem.message);
            }
        }
    }

    /// Whether `id` may run module `digest` beside the modules its namespace's other
    /// controllers run (each distinct module stays compiled while one runs it).
    fn module_cap(&self, id: &ControllerId, slot: Slot, digest: Digest) -> Result<(), Problem> {
        let Some(ns) = &id.namespace else {
            return Ok(());
        };
        // Every module the namespace's controllers hold compiled, candidates included, but
        // the one this one would replace.
        let others = self
            .controllers
            .iter()
            .filter(|(other, _)| other.namespace.as_ref() == Some(ns))
            .flat_map(|(other, m)| {
                let live = (other != id || slot != Slot::Live).then(|| m.life.guest());
                let candidate =
                    (other != id || slot != Slot::Candidate).then(|| m.life.candidate());
                let live = live.flatten().map(|g| g.digest());
                live.into_iter()
                    .chain(candidate.flatten().map(|(g, _)| g.digest()))
            });
        let cap = self.config.max_modules_per_namespace;
        if module_fits(others, digest, cap) {
            return Ok(());
        }
        Err(Problem::new(
            Reason::TooManyModules,
            format!(
                "namespace {ns} already runs {cap} distinct modules, the most this runtime's operator allows per namespace (`kubewasm run --max-modules-per-namespace`); run one of them, or remove a controller"
            ),
        ))
    }

    /// Drops the compiled modules no controller runs any more (after loads and reloads).
    pub(super) fn retain_modules(&self) {
        let keep: HashSet<_> = self
            .controllers
            .values()
            .flat_map(|m| {
                let candidate = m.life.candidate().map(|(g, _)| g.digest());
                m.life
                    .guest()
                    .map(|g| g.digest())
                    .into_iter()
                    .chain(candidate)
            })
            .collect();
        let named = self
            .controllers
            .values()
            .filter_map(|m| m.plan.source.as_ref().ok()?.shareable())
            .map(|(reference, _)| reference)
            .collect();
        self.shared_images.retain(&keep, &named);
        self.sandbox.retain(&keep.into_iter().collect::<Vec<_>>());
    }

    /// The module, compiled, or [`Fetched::Unchanged`] when its source is still at `loaded`,
    /// or [`Fetched::Pending`] while it is fetched beside the loop ([`super::fetching`]).
    async fn read_module(
        &self,
        id: &ControllerId,
        wanted: Wanted<'_>,
        plan: &Plan,
    ) -> Result<Fetched, Problem> {
        let Wanted {
            slot,
            source,
            pin,
            loaded,
        } = wanted;
        let source = source
            .as_ref()
            .map_err(|e| Problem::new(Reason::InvalidSpec, e.clone()))?;
        // Nothing of a controller's module is read (nor shared with it) before the runtime
        // knows it may act as the controller's ServiceAccount: its namespace and the account
        // opted in. A tenant that did not opt in costs no read.
        let acting = match super::setup::service_account(plan) {
            Ok(account) => self.check_acting(&account).await.map(|()| account),
            Err(problem) => Err(problem),
        };
        let account = match acting {
            Ok(account) => account,
            Err(problem) => return Ok(Fetched::Refused(problem)),
        };
        let asking = Asking {
            slot,
            source,
            pin,
            loaded,
            account,
        };
        let (bytes, version) = match self.ask_module(id, asking) {
            Asked::Running => return Ok(Fetched::Pending),
            Asked::Done(answer) => match answer? {
                Read::Unchanged => return Ok(Fetched::Unchanged),
                Read::Shared(compiled, version) => return Ok(Fetched::Compiled(compiled, version)),
                Read::Invalid(why, version) => return Ok(Fetched::Compiled(Err(why), version)),
                Read::Bytes(bytes, version) => (bytes, version),
            },
        };
        let shared = source
            .shareable()
            .filter(|(_, digest)| loaded != Some(&Version::Image(digest.clone())));
        // Compiled beside the manager loop, in a child process, once per digest (a compile
        // takes as long as the tenant's module makes it, up to its CPU limit): the loop is
        // handed the result (`on_compiled`). A module whose compile ended the compiler is not
        // compiled again (see `quarantine`).
        let digest = bytes.digest();
        let shared = shared.map(|(reference, _)| reference);
        if let Some(guest) = self.sandbox.loaded(&digest) {
            return Ok(self.recorded(shared.as_deref(), digest, Ok(guest), version));
        }
        let hex = digest.hex();
        if let Some(why) = self.quarantine.why(&hex) {
            return Err(Problem::new(Reason::Quarantined, why.to_owned()));
        }
        // Before the compile: the namespace's module cap (checked again when it is swapped
        // in), and its compile budget (not charged to join a compile under way).
        self.module_cap(id, slot, digest)?;
        let waiter = Waiter {
            id: id.clone(),
            slot,
            version,
            shared,
        };
        let Some(waiter) = self.compiles.join(digest, waiter) else {
            return Ok(Fetched::Compiling(digest));
        };
        if let Err(refused) = self.compile_budget.take(id.namespace.as_deref()) {
            let tenant = id.namespace.as_ref().map_or_else(
                || "the cluster's controllers".to_owned(),
                |ns| format!("namespace {ns}"),
            );
            let (what, wait) = match refused {
                Refused::Compiles(wait) => (
                    format!(
                        "had more new modules compiled than this runtime's operator allows ({} at once, then {} an hour: `kubewasm run --compile-burst`, `--compiles-per-hour`)",
                        self.compile_budget.burst(),
                        self.compile_budget.per_hour(),
                    ),
                    wait,
                ),
                Refused::CpuSeconds(wait) => (
                    format!(
                        "had its modules' compiles take the CPU time this runtime's operator allows ({} CPU seconds an hour: `kubewasm run --compile-cpu-seconds-per-hour`)",
                        self.compile_budget.cpu_per_hour(),
                    ),
                    wait,
                ),
            };
            return Err(Problem::new(
                Reason::CompileBudgetExceeded,
                format!(
                    "{tenant} {what}; module sha256:{hex} is compiled in about {}s. Modules already compiled cost nothing: pin a digest rather than following a tag that moves often",
                    wait.as_secs().max(1)
                ),
            ));
        }
        self.compiles
            .start(self.sandbox.clone(), bytes, digest, waiter);
        Ok(Fetched::Compiling(digest))
    }

    /// `compiled`, from `version` of a controller's source, recorded for the anonymous pinned
    /// image it shares (if it does) so that its other controllers find it without a pull.
    fn recorded(
        &self,
        shared: Option<&str>,
        digest: Digest,
        compiled: Result<Arc<GuestPre>, String>,
        version: Version,
    ) -> Fetched {
        if let Some(reference) = shared {
            let known = Known {
                digest,
                compiled: compiled.as_ref().map(|_| ()).map_err(Clone::clone),
            };
            self.shared_images.record(reference, known);
        }
        Fetched::Compiled(compiled, version)
    }

    /// A compile ended: the controllers that waited for it (and still run that module) load
    /// it, or say why not, and those not running yet start. A module whose compile ended the
    /// compiler (a crash, a limit) is quarantined.
    pub(super) async fn on_compiled(&mut self, done: Compiled) {
        let Compiled {
            digest,
            tenant,
            cpu,
            result,
            waiters,
        } = done;
        self.compile_budget.charge_cpu(tenant.as_deref(), cpu);
        tracing::debug!(digest = %digest.hex(), ?tenant, ?cpu, "compile ended");
        let result = match result {
            Ok(guest) => Ok(Ok(guest)),
            Err(crashed @ LoadError::CompileCrashed { .. }) => {
                let why = self
                    .quarantine
                    .record(&digest.hex(), &crashed.to_string())
                    .await;
                self.metrics.set_quarantined(self.quarantine.len());
                Err(Problem::new(Reason::Quarantined, why))
            }
            Err(invalid) => Ok(Err(invalid.to_string())),
        };
        let mut reads = Vec::new();
        for Waiter {
            id,
            slot,
            version,
            shared,
        } in waiters
        {
            let compiling = self
                .controllers
                .get(&id)
                .and_then(|m| m.life.compiling_in(slot));
            if compiling != Some(digest) {
                continue;
            }
            let fetched = match &result {
                Ok(compiled) => {
                    Ok(self.recorded(shared.as_deref(), digest, compiled.clone(), version))
                }
                Err(problem) => Err(problem.clone()),
            };
            reads.push(ModuleRead(id, slot, fetched));
        }
        let ids: Vec<ControllerId> = reads.iter().map(|ModuleRead(id, ..)| id.clone()).collect();
        self.load_fetched(reads);
        self.retain_modules();
        let stopped: Vec<ControllerId> = ids
            .into_iter()
            .filter(|id| self.controllers.get(id).is_some_and(|m| !m.life.running()))
            .collect();
        let stored = self.stored_states(&stopped).await;
        self.set_up_all(&stopped, stored.as_ref()).await;
    }

    /// These module ConfigMaps changed (or were listed again): the controllers whose module
    /// is in one of them load it again.
    pub(super) async fn on_config_maps(&mut self, keys: &HashSet<ObjectKey>) {
        let ids: Vec<ControllerId> = self
            .controllers
            .iter()
            .filter(|(_, m)| {
                let candidate = m.plan.candidate.as_ref().and_then(|c| c.as_ref().ok());
                let sources = m.plan.source.as_ref().ok().into_iter().chain(candidate);
                sources
                    .filter_map(|s| s.watched_config_map())
                    .any(|(namespace, name)| {
                        keys.contains(&ObjectKey {
                            namespace: Some(namespace.to_owned()),
                            name: name.to_owned(),
                        })
                    })
            })
            .map(|(id, _)| id.clone())
            .collect();
        self.reload(&ids).await;
    }

    /// Loads the modules of running controllers again (swapped in when changed), and starts
    /// the others.
    pub(super) async fn reload(&mut self, ids: &[ControllerId]) {
        let (running, stopped): (Vec<ControllerId>, Vec<ControllerId>) = ids
            .iter()
            .cloned()
            .partition(|id| self.controllers.get(id).is_some_and(|m| m.life.running()));
        self.load_modules(&running).await;
        self.retain_modules();
        self.start_all(&stopped).await;
    }

    /// Loads again the modules whose source nothing watches ([`Source::is_polled`]): every
    /// `--module-poll-seconds`.
    pub(super) async fn reload_polled(&mut self) {
        self.forget_pulls();
        let ids: Vec<ControllerId> = self
            .controllers
            .iter()
            .filter(|(_, m)| {
                let candidate = m.plan.candidate.as_ref().and_then(|c| c.as_ref().ok());
                m.plan.source.as_ref().is_ok_and(|s| s.is_polled())
                    || candidate.is_some_and(|c| c.is_polled())
            })
            .map(|(id, _)| id.clone())
            .collect();
        self.reload(&ids).await;
    }
}

/// Whether a module of `digest` fits beside the modules (`others`, with repeats) of a
/// namespace's other controllers: it is one of them, or there are fewer than `cap`.
fn module_fits(others: impl Iterator<Item = Digest>, digest: Digest, cap: usize) -> bool {
    let distinct: HashSet<Digest> = others.collect();
    distinct.contains(&digest) || distinct.len() < cap
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_runs_at_most_cap_distinct_modules() {
        let d = |b: u8| Digest([b; 32]);
        let running = [d(1), d(1), d(2)];
        assert!(module_fits(running.into_iter(), d(3), 3));
        assert!(!module_fits(running.into_iter(), d(3), 2), "a third module");
        assert!(
            module_fits(running.into_iter(), d(2), 2),
            "one already running"
        );
        assert!(module_fits(std::iter::empty(), d(1), 1));
    }
}
