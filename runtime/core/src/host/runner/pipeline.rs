//! One reconcile of one key, as a pipeline: [`Runner::prepare`] what the guest is handed (or
//! decide that the finalizer needs writing first), [`Runner::call`] the guest,
//! [`Runner::apply`] its actions through the [`Executor`], and [`Runner::settle`] what the
//! controller remembers and when it looks again. Each step takes what the one before gave.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::api::Problem;
use crate::controller::{Cached, ObjectKey};
use crate::sandbox::{
    Action, CallOutcome, EventType, ObjectRef, SharedReads, WireRequest, requeue_delay,
};

use super::super::actions::{self, ChildKind, Executor};
use super::super::capsules::{Recording, Stage};
use super::super::finalizer::Finalizer;
use super::super::reads::GrantedReads;
use super::super::request::{self, Documents, Finalize};
use super::Runner;
use super::spins::Inputs;
use crate::sync::Locks as _;

/// How soon a parent whose clean-up the guest has not finished is looked at again, when the
/// guest does not say.
const FINALIZE_RETRY: Duration = Duration::from_secs(10);

/// What the guest is handed for one key, and what the later steps need of it.
pub(super) struct Prepared {
    pub(super) key: ObjectKey,
    /// The parent as cached (`None`: gone).
    parent: Option<Arc<Cached>>,
    /// The same as JSON, for the actions.
    parent_json: Option<Value>,
    /// The children it controls, as JSON, for the actions.
    children: Vec<Value>,
    pub(super) target: ObjectRef,
    /// Whether the parent is being deleted and waits for this controller's clean-up.
    pub(super) finalizing: bool,
    /// The request's documents as the caches hold them (shared, not copied): a failed
    /// reconcile's capsule is made of them.
    pub(super) sent: Documents,
}

impl Prepared {
    /// The request the guest is handed (each document copied once, for the call).
    pub(super) fn request(&self, controller: &str) -> WireRequest {
        self.sent.request(controller, &self.target, self.finalizing)
    }
}

/// What the first step decided.
pub(super) enum Prepare {
    /// Nothing to do (the parent does not match the selector).
    Skip,
    /// The controller's finalizer must be added to (`true`) or removed from the parent first;
    /// the watch brings the parent back, and a reconcile, once it is written.
    Finalizer(bool, Value),
    /// Call the guest with this request.
    Call(Box<Prepared>, WireRequest),
}

/// A failed reconcile: why, and, for a guest's permanent error, what it failed on.
pub(super) struct Failure {
    pub(super) problem: Problem,
    /// Set when the guest said its error is permanent: it is not retried until the parent
    /// or the module differs from this.
    pub(super) permanent: Option<Attempt>,
}

impl From<Problem> for Failure {
    fn from(problem: Problem) -> Self {
        Failure {
            problem,
            permanent: None,
        }
    }
}

/// What a reconcile ran on: the parent's version and the module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Attempt {
    resource_version: Option<String>,
    module: crate::sandbox::Digest,
}

/// What the guest answered, and what its actions did.
pub(super) struct Applied {
    outcome: CallOutcome,
    done: actions::Outcome,
    /// The guest said its clean-up of a finalizing parent is done.
    finalized: bool,
}

impl Runner {
    /// The whole pipeline for one key. `Ok(Some(d))`: reconcile again after `d`.
    pub(super) async fn pipeline(&self, key: &ObjectKey) -> Result<Option<Duration>, Failure> {
        // A state the last reconcile of this object left behind is stored before anything
        // of the object runs again (or, if its write failed, this reconcile fails and the
        // guest is called again with what is stored).
        self.setup
            .state
            .settled(&key.to_string())
            .await
            .map_err(|e| Problem::new(e.reason(), e.to_string()))?;
        let prepared = match self.prepare(key) {
            Prepare::Skip => return Ok(None),
            Prepare::Finalizer(add, parent) => {
                return Ok(self.write_finalizer(&parent, add).await?);
            }
            Prepare::Call(prepared, request) => (prepared, request),
        };
        let (prepared, request) = prepared;
        let guest = self.guest();
        let attempt = Attempt {
            resource_version: prepared
                .parent
                .as_ref()
                .and_then(|p| p.metadata.resource_version.clone()),
            module: guest.digest(),
        };
        let recording = Arc::new(Recording::new(self.granted_reads(&prepared)));
        // The candidate (if any, and this reconcile is sampled) is called on the same request
        // once the live reconcile is done, and compared.
        let shadowed = self.shadow_start(&prepared, &request);
        let (called, tidy) = self.call(guest, request, recording.clone()).await;
        let outcome = match called {
            Ok(outcome) => outcome,
            Err(e) => {
                tidy.run().await;
                let problem = Problem::new(super::super::reason_of(&e), e.to_string());
                let recorded = recording.reads();
                self.capsule(&prepared, &recording, &problem, Stage::Call, attempt.module);
                self.report_failure(&prepared, &problem).await;
                let live =
                    (shadowed.as_ref()).map(|sh| self.live_effects(sh, &prepared, Err(&problem)));
                let at = (&prepared.key, &prepared.target);
                self.shadow_finish(at, shadowed, live, recorded).await;
                return Err(Failure {
                    problem,
                    permanent: (!e.retryable()).then_some(attempt),
                });
            }
        };
        let live = (shadowed.as_ref()).map(|sh| self.live_effects(sh, &prepared, Ok(&outcome)));
        let recorded = match &shadowed {
            Some(_) => recording.reads(),
            None => Vec::new(),
        };
        // The spent instance is torn down, and the next made ahead, while the actions' writes
        // are on their way.
        let (applied, ()) = tokio::join!(self.apply(&prepared, outcome), tidy.run());
        let applied = match applied {
            Ok(applied) => applied,
            Err(problem) => {
                self.capsule(
                    &prepared,
                    &recording,
                    &problem,
                    Stage::Apply,
                    attempt.module,
                );
                self.report_failure(&prepared, &problem).await;
                let at = (&prepared.key, &prepared.target);
                self.shadow_finish(at, shadowed, live, recorded).await;
                return Err(problem.into());
            }
        };
        drop(recording);
        let compared = (prepared.key.clone(), prepared.target.clone());
        let settled = self.settle(*prepared, applied, attempt.module).await;
        let at = (&compared.0, &compared.1);
        self.shadow_finish(at, shadowed, live, recorded).await;
        Ok(settled?)
    }

    /// A failed reconcile, told where its author looks: a Warning Event on the parent (reason
    /// the failure's, e.g. `ReconcileFailed`), counted on one Event while it repeats (a
    /// retried failure backs off; a permanent one is not called again), with the controller's
    /// own identity and write budget like any Event of its guest. A ServiceAccount that may
    /// not create Events still has the failure in its WasmController's status.
    async fn report_failure(&self, prepared: &Prepared, problem: &Problem) {
        if prepared.parent_json.is_none() {
            return; // nothing to post it on
        }
        let s = &self.setup;
        let state_key = prepared.key.to_string();
        let executor = self.executor(prepared, &[], &state_key);
        let message = format!("controller {}: {}", s.id, problem.message);
        let message = crate::sandbox::guest_text(&message, crate::sandbox::MAX_GUEST_MESSAGE_BYTES);
        match executor
            .record_event_only(EventType::Warning, problem.reason.as_str(), &message)
            .await
        {
            Ok(outcome) => {
                self.stats.events(&outcome);
                for skipped in &outcome.skipped {
                    tracing::debug!("{skipped}");
                }
            }
            Err(e) => tracing::debug!("the failure's Event was not recorded: {e}"),
        }
    }

    /// Whether the key last failed with a permanent error on the parent and module it has
    /// now: then it is not called again (a resync, a child's change) until one of them changes.
    pub(super) fn still_failing(&self, key: &ObjectKey) -> bool {
        let Some(failed) = self.permanent.locked().get(key).cloned() else {
            return false;
        };
        let now = Attempt {
            resource_version: self
                .setup
                .parent
                .get(key)
                .and_then(|p| p.metadata.resource_version.clone()),
            module: self.guest().digest(),
        };
        failed == now
    }

    /// Step 1: the request, from the caches.
    fn prepare(&self, key: &ObjectKey) -> Prepare {
        let s = &self.setup;
        let parent_watch = &s.parent;
        let parent = parent_watch.get(key);
        if let Some(p) = &parent
            && !request::selected(s.parent_selector.as_ref(), p)
        {
            return Prepare::Skip;
        }
        let parent_json = parent.as_ref().map(|p| p.json());
        let finalizing = match &parent_json {
            Some(p) => match request::finalize_step(s.finalizer.as_ref(), s.finalize, p) {
                Finalize::AddFirst => return Prepare::Finalizer(true, p.clone()),
                Finalize::RemoveFirst => return Prepare::Finalizer(false, p.clone()),
                Finalize::Call(finalizing) => finalizing,
            },
            None => false,
        };
        let children = match &parent {
            Some(p) => {
                let candidates = (s.children.iter()).flat_map(|(_, watch)| {
                    p.metadata
                        .uid
                        .as_deref()
                        .map(|uid| watch.owned_by(uid))
                        .unwrap_or_default()
                });
                request::children_of(p, candidates)
            }
            None => Vec::new(),
        };
        // The guest gets each object as the cache holds it (`Cached::text`).
        let mut sent = Documents::of(parent.as_deref(), &children);
        sent.previous = self.reconciled.locked().get(key).map(|p| p.text().clone());
        sent.state = s.state.get(&key.to_string());
        let children = children.iter().map(|child| child.json()).collect();
        let resource = &parent_watch.kind().resource;
        let target = ObjectRef {
            api_version: resource.api_version.clone(),
            kind: resource.kind.clone(),
            namespace: key.namespace.clone(),
            name: key.name.clone(),
        };
        let prepared = Prepared {
            key: key.clone(),
            parent,
            parent_json,
            children,
            target,
            finalizing,
            sent,
        };
        let request = prepared.request(&s.id);
        Prepare::Call(Box::new(prepared), request)
    }

    /// What the guest of `prepared` may read: the caches, through the controller's grants.
    pub(super) fn granted_reads(&self, prepared: &Prepared) -> SharedReads {
        let s = &self.setup;
        Arc::new(GrantedReads::new(
            Arc::new(s.reads.clone()),
            s.permissions.clone(),
            prepared.key.namespace.clone(),
        ))
    }

    /// Step 2: the guest, in the sandbox, reading through the controller's grants (and
    /// recorded, for a capsule should it fail), in the instance made ahead for it when it is
    /// busy; what is left to tidy comes back with the answer.
    async fn call(
        &self,
        guest: Arc<crate::sandbox::GuestPre>,
        request: WireRequest,
        reads: SharedReads,
    ) -> (
        Result<CallOutcome, crate::sandbox::CallError>,
        crate::sandbox::Tidy,
    ) {
        let s = &self.setup;
        self.stats
            .reconciles
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // Fair between tenants: a namespace's controllers, or one cluster controller.
        let tenant = s.namespace.as_deref().unwrap_or(&s.id);
        s.sandbox
            .reconcile_ahead(tenant, guest, request, reads, s.limits, &self.ready)
            .await
    }

    /// Step 3: the guest's actions, carried out by the [`Executor`] (which owns every write
    /// of them), plus a warning Event while a finalizing parent's clean-up is not done.
    async fn apply(&self, prepared: &Prepared, outcome: CallOutcome) -> Result<Applied, Problem> {
        let s = &self.setup;
        let finalized = prepared.finalizing && outcome.response.is_finalized();
        let mut actions = std::borrow::Cow::Borrowed(&outcome.response.actions);
        if prepared.finalizing && !finalized {
            actions.to_mut().push(Action::Event {
                event_type: EventType::Warning,
                reason: "FinalizationPending".into(),
                message: format!(
                    "the deletion waits for controller {} to finish its clean-up (its finalizer {} stays until it answers `finalized`)",
                    s.id,
                    s.finalizer.as_ref().map(Finalizer::name).unwrap_or_default()
                ),
            });
        }
        let state_key = prepared.key.to_string();
        let child_kinds: Vec<ChildKind> = s.children.iter().map(|(c, _)| c.clone()).collect();
        let executor = self.executor(prepared, &child_kinds, &state_key);
        let done = executor
            .execute(&actions)
            .await
            .map_err(|e| Problem::new(e.reason(), e.to_string()))?;
        drop(actions);
        Ok(Applied {
            outcome,
            done,
            finalized,
        })
    }

    /// The one way this controller's writes for `prepared` are made: as its ServiceAccount,
    /// through its declaration, write gate and Event series.
    fn executor<'a>(
        &'a self,
        prepared: &'a Prepared,
        child_kinds: &'a [ChildKind],
        state_key: &'a str,
    ) -> Executor<'a> {
        let s = &self.setup;
        Executor {
            client: s.client.clone(),
            kinds: &s.kinds,
            writes: &s.writes,
            permissions: &s.permissions,
            field_manager: format!("kubewasm/{}", s.id),
            parent_kind: s.parent.kind(),
            parent: prepared.parent_json.as_ref(),
            target: &prepared.target,
            child_kinds,
            children: &prepared.children,
            existing: &s.children,
            events: &self.events,
            state: (&s.state, state_key),
            held: &self.held,
        }
    }

    /// Step 4: what the controller remembers of the key (its state when gone, the parent as
    /// reconciled, whether it waits for clean-up), the finalizer removed once the clean-up is
    /// done, and when to look again (a key that brings itself back backs off: [`super::spins`]).
    async fn settle(
        &self,
        prepared: Prepared,
        applied: Applied,
        module: crate::sandbox::Digest,
    ) -> Result<Option<Duration>, Problem> {
        let Prepared {
            key,
            parent,
            parent_json,
            finalizing,
            ..
        } = prepared;
        let Applied {
            outcome,
            done,
            finalized,
        } = applied;
        self.stats.events(&done);
        for skipped in &done.skipped {
            tracing::warn!("{skipped}");
        }
        if !done.unowned.is_empty() {
            let mut unowned = self.stats.unowned.locked();
            for kind in &done.unowned {
                if unowned.insert(kind.clone()) {
                    tracing::warn!(
                        "applied {kind} without an owner (a grant, not in spec.children): nothing deletes it with its parent"
                    );
                }
            }
        }
        let inputs = Inputs {
            version: parent
                .as_ref()
                .and_then(|p| p.metadata.resource_version.clone()),
            module,
        };
        if parent.is_none() {
            // The object is gone: so is what the controller kept about it.
            self.forget_state(&key.to_string()).await?;
        }
        let mut finalize_retry = None;
        {
            let mut waiting = self.stats.finalizing.locked();
            if finalizing && !finalized {
                waiting.insert(key.clone());
                finalize_retry = Some(FINALIZE_RETRY);
            } else {
                waiting.remove(&key);
            }
        }
        if finalized && let Some(p) = &parent_json {
            self.write_finalizer(p, false).await?;
        }
        {
            let mut reconciled = self.reconciled.locked();
            match parent {
                Some(seen) => reconciled.insert(key.clone(), seen),
                None => reconciled.remove(&key),
            };
        }
        for change in &done.changes {
            tracing::info!("{change}");
        }
        tracing::debug!(
            elapsed_ms = outcome.elapsed.as_secs_f64() * 1e3,
            actions = outcome.response.actions.len(),
            "reconciled"
        );
        let asked = [
            requeue_delay(&outcome.response),
            done.requeue_after,
            finalize_retry,
        ]
        .into_iter()
        .flatten()
        .min();
        self.spins
            .wrote(done.parent_version.iter().chain(&done.written_versions));
        let after = self
            .spins
            .settled(&key, inputs, done.wrote, asked, self.setup.requeue_floor);
        Ok(after)
    }
}

#[cfg(test)]
mod tests;
