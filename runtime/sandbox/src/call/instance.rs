//! The instance one call runs in: made (on the call's path or ahead of it), then called once.

use std::time::{Duration, Instant};

use wasmtime::component::types::ComponentItem;
use wasmtime::component::{Component, ComponentExportIndex, InstancePre, ResourceTable};
use wasmtime::{Engine, Store, UpdateDeadline};

use super::{
    About, CallOutcome, CallState, Phases, classify, deadline_ticks, log_dropped_lines, log_output,
};
use crate::bindings::{Controller, ControllerIndices, PREPARED_WORLD};
use crate::error::CallError;
use crate::limits::{Limits, MemoryLimiter};
use crate::output::{BoundedOutput, LogBudget, SharedLines};
use crate::types::{NoReads, ObjectRef, SharedReads, WireRequest, wire_to_wit};

/// One module made ready to instantiate: linked, its `reconcile` found, and its `prepare` when
/// it has one (world `prepared-controller`).
pub(crate) struct Linked {
    pre: InstancePre<CallState>,
    indices: ControllerIndices,
    prepare: Option<ComponentExportIndex>,
}

impl Linked {
    /// `pre` of `component`: an error when it does not export the `controller` world, or
    /// exports a `prepare` that is not `func()`.
    pub(crate) fn new(
        component: &Component,
        pre: InstancePre<CallState>,
    ) -> wasmtime::Result<Linked> {
        let indices = ControllerIndices::new(&pre)?;
        let prepare = match component.get_export(None, "prepare") {
            None => None,
            Some((ComponentItem::ComponentFunc(f), index))
                if f.params().len() == 0 && f.results().len() == 0 =>
            {
                Some(index)
            }
            Some((item, _)) => {
                let found = match item {
                    ComponentItem::ComponentFunc(f) => format!(
                        "has {} parameter(s) and {} result(s)",
                        f.params().len(),
                        f.results().len()
                    ),
                    _ => "is not a function".to_owned(),
                };
                wasmtime::bail!(
                    "its export `prepare` {found}, where world `{PREPARED_WORLD}` has `prepare: func()`"
                )
            }
        };
        Ok(Linked {
            pre,
            indices,
            prepare,
        })
    }

    /// Whether it exports `prepare`.
    pub(crate) fn prepares(&self) -> bool {
        self.prepare.is_some()
    }
}

/// A guest instantiated in a fresh Store for one controller, before its request is known: made
/// on the call's path, or ahead of it ([`crate::Ready`]). It serves exactly one call
/// ([`call`] consumes it) and is never reset for another.
pub(crate) struct Instance {
    store: Store<CallState>,
    guest: Controller,
    stdout: BoundedOutput,
    stderr: BoundedOutput,
    /// Its setup and instantiation.
    phases: Phases,
    limits: Limits,
    /// Made ahead of its call: its making is not the call's time.
    ahead: bool,
}

impl Instance {
    /// The same instance, made ahead of its call.
    pub(crate) fn made_ahead(self) -> Instance {
        Instance {
            ahead: true,
            ..self
        }
    }

    /// The limits it was made with (its memory limiter is already set).
    pub(crate) fn limits(&self) -> &Limits {
        &self.limits
    }
}

/// A used instance's Store: dropping it hands the pool slot back and resets the pages the call
/// touched (the teardown), which the caller may do off the latency path.
pub(crate) struct Spent(#[allow(dead_code)] Store<CallState>);

/// When an instance of a module with a `prepare` export is to be prepared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Prepare {
    /// Made ahead of its call: `prepare` runs as part of the making, within its deadline.
    Ahead,
    /// Made on the call's path: not prepared (it would only add to the call's time).
    Never,
}

/// Makes an [`Instance`] of `linked` for `controller` with `limits`, and prepares it when asked
/// and the module exports `prepare`; `deadline` bounds the instantiation and the preparing
/// together (both are guest code: a component's start function, `prepare`). Until [`call`], its
/// reads are none, its log lines name no object, and what it answers is forgotten.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn instantiate(
    engine: &Engine,
    linked: &Linked,
    tick: Duration,
    controller: &str,
    limits: &Limits,
    deadline: Duration,
    lines: Option<SharedLines>,
    prepare: Prepare,
) -> Result<Instance, CallError> {
    let entered = Instant::now();
    let stdout = BoundedOutput::new(limits.output_bytes);
    let stderr = BoundedOutput::new(limits.output_bytes);
    let state = CallState {
        wasi: None,
        stdout: stdout.clone(),
        stderr: stderr.clone(),
        table: ResourceTable::new(),
        limiter: MemoryLimiter::new(limits.memory_bytes),
        reads: std::sync::Arc::new(NoReads),
        host_calls: 0,
        limits: *limits,
        logs: LogBudget::new(limits.log_bytes, limits.log_lines).sharing(lines),
        controller: controller.to_owned(),
        target: ObjectRef::new("", "", None, ""),
        answer: None,
        panic_line: None,
    };
    let mut store = Store::new(engine, state);
    store.limiter(|s| &mut s.limiter);
    arm_deadline(&mut store, deadline, tick);
    let started = Instant::now();
    let prepare = linked
        .prepare
        .as_ref()
        .filter(|_| prepare == Prepare::Ahead);
    match made(&mut store, linked, prepare).await {
        Ok(guest) => Ok(Instance {
            store,
            guest,
            stdout,
            stderr,
            phases: Phases {
                setup: started - entered,
                instantiate: started.elapsed(),
                ..Phases::default()
            },
            limits: *limits,
            ahead: false,
        }),
        Err(err) => Err(classify(err, store.data(), &stderr.take(), limits)),
    }
}

/// Instantiates `linked` in `store` and calls `prepare` on it when given. The Store's reads are
/// none while it runs; an answer it gave and a panic line it logged are forgotten after it.
async fn made(
    store: &mut Store<CallState>,
    linked: &Linked,
    prepare: Option<&ComponentExportIndex>,
) -> wasmtime::Result<Controller> {
    let instance = linked.pre.instantiate_async(&mut *store).await?;
    let guest = linked.indices.load(&mut *store, &instance)?;
    if let Some(prepare) = prepare {
        let prepare = instance.get_typed_func::<(), ()>(&mut *store, prepare)?;
        prepare.call_async(&mut *store, ()).await?;
        let state = store.data_mut();
        state.answer = None;
        state.panic_line = None;
    }
    Ok(guest)
}

/// Every epoch tick the guest yields to the executor, so that a caller's timeout can drop the
/// call (and with it the Store and the instance slot) at any moment; the deadline itself traps
/// a guest that computes, whoever polls it. Armed again for the call of an instance made ahead.
fn arm_deadline(store: &mut Store<CallState>, timeout: Duration, tick: Duration) {
    let deadline = deadline_ticks(timeout, tick);
    let mut ticks = 0u64;
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(move |_| {
        ticks += 1;
        Ok(if ticks >= deadline {
            UpdateDeadline::Interrupt
        } else {
            UpdateDeadline::Yield(1)
        })
    });
}

/// The one call `instance` serves: `request` with `reads`, within the instance's limits. The
/// Store comes back spent, for the caller to drop where it costs the least.
pub(crate) async fn call(
    mut instance: Instance,
    tick: Duration,
    request: WireRequest,
    reads: SharedReads,
) -> (Result<CallOutcome, CallError>, Spent) {
    let limits = instance.limits;
    let about = About {
        controller: request.controller.clone(),
        target: request.target.clone(),
    };
    let store = &mut instance.store;
    let state = store.data_mut();
    state.reads = reads;
    state.controller = request.controller.clone();
    state.target = request.target.clone();
    arm_deadline(store, limits.timeout, tick);
    let made_ahead = instance.ahead;
    let mut phases = match made_ahead {
        true => Phases::default(),
        false => instance.phases,
    };
    let started = Instant::now();
    let wit_request = wire_to_wit(request);
    let converted = Instant::now();
    phases.request = converted - started;
    let result = instance
        .guest
        .call_reconcile(&mut *store, &wit_request)
        .await;
    phases.call = converted.elapsed();
    let elapsed = phases.instantiate + started.elapsed();
    let (stdout, stderr) = (instance.stdout.take(), instance.stderr.take());
    let state = store.data_mut();
    // Lines of stdout and stderr are logged within the same budget as `log` lines.
    log_output(&about, "stdout", &stdout, &mut state.logs);
    log_output(&about, "stderr", &stderr, &mut state.logs);
    log_dropped_lines(&about, &state.logs, &limits);
    let outcome = match result {
        Err(err) => Err(classify(err, state, &stderr, &limits)),
        Ok(()) => state
            .answer
            .take()
            .unwrap_or_else(|| {
                Err(CallError::InvalidResponse(
                    "the guest returned without calling `respond`; build it with the current kubewasm-guest-sdk".into(),
                ))
            })
            .map(|response| CallOutcome {
                response,
                stdout,
                stderr,
                host_calls: state.host_calls,
                log_dropped: state.logs.dropped(),
                log_lines: state.logs.lines(),
                elapsed,
                phases,
                made_ahead,
                memory_bytes: state.limiter.used(),
            }),
    };
    (outcome, Spent(instance.store))
}
