//! The runner's part of a shadow run ([`crate::host::shadow`]): a reconcile is sampled and its
//! request kept ([`Runner::shadow_start`]); the live answer's effects are taken before its
//! actions are carried out ([`Runner::live_effects`]); once the live reconcile has done all it
//! does, the candidate is called on the same request, in the tenant's fair share and within
//! the controller's limits, its reads answered as the live module's were (then from the
//! caches, through the same grants), and the two answers are compared
//! ([`Runner::shadow_finish`]). The live module's actions never wait for the candidate: only
//! the key's next reconcile does, for at most the candidate's own limits. (Called beside the
//! live one instead, on another thread, the candidate slowed the live call by half to double:
//! two instances made and unmade at once in one process contend; BENCHMARKS.md.)

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Event as CoreEvent, EventSource};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::Api;
use kube::api::PostParams;
use kubewasm_guest_sdk::selector::Selector;
use serde_json::Value;
use tracing::Instrument;

use crate::api::Problem;
use crate::controller::ObjectKey;
use crate::host::capsules::{RecordedRead, Replayed};
use crate::sandbox::{CallOutcome, Digest, GuestPre, ObjectRef, SharedReads, WireRequest};

use super::super::shadow::compare::{self, Answered, Selection};
use super::Runner;
use super::pipeline::Prepared;

/// The reason of the Event on the WasmController when its candidate first differs.
pub const CANDIDATE_DIFFERS: &str = "CandidateDiffers";

/// A reconcile sampled for a comparison: the candidate, the request it is handed, and the
/// reads the controller may make.
pub(super) struct Shadowed {
    digest: Digest,
    guest: Arc<GuestPre>,
    request: WireRequest,
    reads: SharedReads,
}

/// What the live module answered, as compared: its effects (or its failure), and the objects
/// its `deleteAllOf`s would delete as the caches held them before they were deleted.
pub(super) struct Live {
    answered: Answered,
    listed: Vec<Value>,
}

impl Runner {
    /// This reconcile's comparison, if the controller has a candidate and this reconcile is
    /// one of those sampled: the request is kept for the candidate.
    pub(super) fn shadow_start(
        &self,
        prepared: &Prepared,
        request: &WireRequest,
    ) -> Option<Shadowed> {
        let guest = self.setup.shadow.sample()?;
        Some(Shadowed {
            digest: guest.digest(),
            guest,
            request: request.clone(),
            reads: self.granted_reads(prepared),
        })
    }

    /// The live answer as it is compared, taken before its actions are carried out (a
    /// `deleteAllOf`'s objects are listed while the caches still hold them).
    pub(super) fn live_effects(
        &self,
        shadowed: &Shadowed,
        prepared: &Prepared,
        outcome: Result<&CallOutcome, &Problem>,
    ) -> Live {
        let mut listed = Vec::new();
        let answered = match outcome {
            Ok(outcome) => Answered::Did(compare::effects(
                &outcome.response.actions,
                &prepared.target,
                &mut |selection| {
                    let found = list(&shadowed.reads, selection)?;
                    listed.extend(found.iter().cloned());
                    Some(found)
                },
            )),
            Err(problem) => Answered::Failed(problem.clone()),
        };
        Live { answered, listed }
    }

    /// Once the live reconcile is done: the candidate called on the same request, its reads
    /// answered as the live module's were (`recorded`, then the caches), and its answer
    /// compared with the live one's — counted, kept, the first difference told on the
    /// controller.
    pub(super) async fn shadow_finish(
        &self,
        (key, target): (&ObjectKey, &ObjectRef),
        shadowed: Option<Shadowed>,
        live: Option<Live>,
        recorded: Vec<RecordedRead>,
    ) {
        let (Some(shadowed), Some(live)) = (shadowed, live) else {
            return;
        };
        let s = &self.setup;
        // Fair between tenants: the candidate takes its turn in the tenant's share.
        let tenant = s.namespace.as_deref().unwrap_or(&s.id);
        let reads: SharedReads = Arc::new(Replayed::or(recorded, shadowed.reads.clone()));
        let span = tracing::info_span!("reconcile", controller = s.id.as_str(), object = %key, candidate = %shadowed.digest);
        let called = (s.sandbox)
            .reconcile(tenant, shadowed.guest, shadowed.request, reads, s.limits)
            .instrument(span)
            .await;
        let candidate = match called {
            Ok(outcome) => {
                // Objects the live module deleted meanwhile are still the candidate's to match.
                let reads = &shadowed.reads;
                Answered::Did(compare::effects(
                    &outcome.response.actions,
                    target,
                    &mut |selection| {
                        let mut found = list(reads, selection)?;
                        for object in &live.listed {
                            if selected(selection, object) && !found.contains(object) {
                                found.push(object.clone());
                            }
                        }
                        Some(found)
                    },
                ))
            }
            Err(e) => Answered::Failed(Problem::new(super::super::reason_of(&e), e.to_string())),
        };
        let changes = compare::differences(&live.answered, &candidate);
        let differed = !changes.is_empty();
        let object = key.to_string();
        let first = s.shadow.compared(&object, shadowed.digest, changes);
        s.metrics.shadow_compared(&s.id, differed);
        if differed {
            tracing::info!(candidate = %shadowed.digest, "the candidate module's answer differs from the live module's (kubewasm rollout diff)");
        }
        if first {
            self.tell_first_difference(&object, shadowed.digest).await;
        }
    }

    /// A Warning Event on the WasmController: its candidate's first difference, written as
    /// its ServiceAccount through its write gate (one that may not create Events has it in
    /// the status still).
    async fn tell_first_difference(&self, object: &str, digest: Digest) {
        let s = &self.setup;
        let Some(me) = &s.controller_ref else {
            return;
        };
        let namespace = me.namespace.clone().unwrap_or_else(|| "default".into());
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let event = CoreEvent {
            metadata: ObjectMeta {
                generate_name: Some(format!("{}.", me.name.as_deref().unwrap_or("controller"))),
                namespace: Some(namespace.clone()),
                ..ObjectMeta::default()
            },
            involved_object: me.clone(),
            reason: Some(CANDIDATE_DIFFERS.into()),
            message: Some(format!(
                "the candidate module {digest} answered differently from the live module on {object}: see status.rollout, or `kubewasm rollout diff`"
            )),
            type_: Some("Warning".into()),
            source: Some(EventSource {
                component: Some(format!("kubewasm/{}", s.id)),
                host: None,
            }),
            first_timestamp: Some(now.clone()),
            last_timestamp: Some(now),
            count: Some(1),
            ..CoreEvent::default()
        };
        if !s.writes.admit().await {
            return;
        }
        let api: Api<CoreEvent> = Api::namespaced(s.client.clone(), &namespace);
        if let Err(e) = api.create(&PostParams::default(), &event).await {
            tracing::debug!("the candidate's first difference was not recorded as an Event: {e}");
        }
    }
}

/// The objects `selection` names, as the controller may list them (`None`: it may not).
fn list(reads: &SharedReads, selection: &Selection) -> Option<Vec<Value>> {
    let found = reads
        .list(
            &selection.api_version,
            &selection.kind,
            selection.namespace.as_deref(),
            Some(&selection.label_selector),
        )
        .ok()?;
    Some(
        found
            .into_iter()
            .filter(|o| created_before(selection, o))
            .collect(),
    )
}

/// Whether `object` is one `selection` names.
fn selected(selection: &Selection, object: &Value) -> bool {
    let at = |p: &str| object.pointer(p).and_then(Value::as_str);
    at("/apiVersion") == Some(selection.api_version.as_str())
        && at("/kind") == Some(selection.kind.as_str())
        && at("/metadata/namespace") == selection.namespace.as_deref()
        && Selector::parse(&selection.label_selector).is_ok_and(|s| s.matches_object(object))
        && created_before(selection, object)
}

/// Whether `object` was created strictly before the selection's bound (if it has one).
fn created_before(selection: &Selection, object: &Value) -> bool {
    let Some(bound) = &selection.created_before else {
        return true;
    };
    let parse = |t: &str| t.parse::<k8s_openapi::jiff::Timestamp>().ok();
    let created = object
        .pointer("/metadata/creationTimestamp")
        .and_then(Value::as_str)
        .and_then(parse);
    match (created, parse(bound)) {
        (Some(created), Some(bound)) => created < bound,
        _ => false,
    }
}
