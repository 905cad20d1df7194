//! One reconcile: a fresh Store with limits and a deadline (an [`Instance`], made on the call's
//! path or ahead of it), the host imports, trap mapping.

use std::time::Duration;

use kubewasm_guest_sdk::selector::MAX_SELECTOR_BYTES;
use wasmtime::StoreContextMut;
use wasmtime::component::{ComponentType, Lift, Linker, ResourceTable, WasmStr};
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use super::bindings::{HOST_INTERFACE, wit};
use super::error::{CallError, HostCallLimitHit};
use super::limits::{Limits, MemoryLimiter};
use super::output::{BoundedOutput, Captured, LogBudget, MIN_LOG_LINE_COST};
use super::text::{MAX_GUEST_LOG_LINE_BYTES, MAX_GUEST_MESSAGE_BYTES, guest_text};
use super::types::{ObjectRef, Response, SharedReads, decode_response};

mod ended;
mod instance;

use ended::classify;
pub(crate) use instance::{Instance, Linked, Prepare, Spent, call, instantiate};

/// What a successful call produced, besides the response.
#[derive(Debug)]
pub struct CallOutcome {
    pub response: Response,
    /// What the guest wrote to stdout.
    pub stdout: Captured,
    /// What the guest wrote to stderr.
    pub stderr: Captured,
    /// Host reads the guest made.
    pub host_calls: u32,
    /// Bytes of host `log` lines not logged: cut from lines longer than
    /// [`MAX_GUEST_LOG_LINE_BYTES`] or past [`Limits::log_bytes`].
    pub log_dropped: u64,
    /// Guest lines logged (host `log`, stdout, stderr).
    pub log_lines: usize,
    /// Wall-clock time of instantiation plus the call; of the call alone for an instance made
    /// ahead (its [`Phases::setup`] and [`Phases::instantiate`] are then zero).
    pub elapsed: Duration,
    /// Where that time and the time before it went.
    pub phases: Phases,
    /// Whether the instance was made ahead of the call, off its path.
    pub made_ahead: bool,
    /// Bytes of linear memory the instance had when it returned (all its memories, as the
    /// limiter last allowed them): what [`Limits::memory_bytes`] is measured against.
    pub memory_bytes: usize,
}

/// Wall-clock time of each part of a call (for the bench's breakdown and debug logs). What is
/// left of a caller's measured time after these is the Store's teardown (the instance slot
/// handed back, touched pages reset) and the caller's own work.
#[derive(Debug, Clone, Copy, Default)]
pub struct Phases {
    /// The per-call state: limiter, Store, deadline (the WASI context, captured stdout/stderr
    /// only, is made at the guest's first WASI call, inside `call`).
    pub setup: Duration,
    /// Instantiating the component from its pre-linked form (a pool slot, data segments).
    pub instantiate: Duration,
    /// The request converted for WIT: its documents serialized to JSON text (when the caller
    /// handed [`crate::Request`]'s values) and copied into the WIT record.
    pub request: Duration,
    /// The export called: the request lowered into guest memory, the guest's work, its host
    /// calls, and the response checked and decoded in `respond`.
    pub call: Duration,
}

/// Most bytes of an `apiVersion`, kind, namespace or name a guest may pass to `get` or
/// `list`: a group (253) and a version (63) with the slash; longer ones name nothing.
const MAX_READ_FIELD_BYTES: usize = 320;

/// What the guest answered through `respond`: the checked response, or why not.
type Answer = Result<Response, CallError>;

/// Everything one Store owns. Created per call, dropped with the Store.
pub(crate) struct CallState {
    /// Made at the guest's first WASI call (a guest that prints, reads a clock or seeds a
    /// hash map): a reconcile that makes none does not pay for one.
    wasi: Option<WasiCtx>,
    /// Where the WASI context sends the guest's stdout and stderr.
    stdout: BoundedOutput,
    stderr: BoundedOutput,
    table: ResourceTable,
    limiter: MemoryLimiter,
    reads: SharedReads,
    host_calls: u32,
    limits: Limits,
    logs: LogBudget,
    controller: String,
    /// The call's object, formatted for log lines only when the guest logs.
    target: ObjectRef,
    answer: Option<Answer>,
    /// The last error-level `log` line that starts like a panic (`panicked at `), cut to
    /// [`MAX_PANIC_LINE_BYTES`]: guests built without WASI have no stderr, so their SDK logs
    /// the panic message there instead.
    panic_line: Option<String>,
}

/// Most bytes kept of a logged panic line (a message and its location are cut further).
const MAX_PANIC_LINE_BYTES: usize = 4096;

impl WasiView for CallState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        let (stdout, stderr) = (&self.stdout, &self.stderr);
        // No preopened dirs, no env, no args, no network: only captured stdout/stderr.
        let ctx = self.wasi.get_or_insert_with(|| {
            WasiCtxBuilder::new()
                .stdout(stdout.clone())
                .stderr(stderr.clone())
                .build()
        });
        WasiCtxView {
            ctx,
            table: &mut self.table,
        }
    }
}

impl CallState {
    fn count_host_call(&mut self) -> wasmtime::Result<()> {
        self.host_calls += 1;
        if self.host_calls > self.limits.host_calls {
            return Err(wasmtime::Error::new(HostCallLimitHit(
                self.limits.host_calls,
            )));
        }
        Ok(())
    }
}

/// The WIT `error` record as it lies in guest memory: lifted without copying its message.
#[derive(ComponentType, Lift)]
#[component(record)]
struct GuestError {
    message: WasmStr,
    retryable: bool,
}

/// A string argument the guest passed, checked against `max` bytes before anything is copied:
/// for a UTF-8 guest `to_str` borrows its memory. `Err` is the refusal handed back to the guest.
fn argument<'a>(
    store: &'a StoreContextMut<'_, CallState>,
    text: &WasmStr,
    what: &str,
    max: usize,
) -> wasmtime::Result<Result<std::borrow::Cow<'a, str>, String>> {
    let text = text.to_str(store)?;
    if text.len() > max {
        return Ok(Err(format!(
            "{what} is {} bytes, more than the limit of {max} bytes",
            text.len()
        )));
    }
    Ok(Ok(text))
}

fn optional<'a>(
    store: &'a StoreContextMut<'_, CallState>,
    text: &Option<WasmStr>,
    what: &str,
    max: usize,
) -> wasmtime::Result<Result<Option<std::borrow::Cow<'a, str>>, String>> {
    match text {
        None => Ok(Ok(None)),
        Some(text) => Ok(argument(store, text, what, max)?.map(Some)),
    }
}

/// The guest's `log`: the line is cut to what is left of the call's budget before it is
/// copied out of the guest's memory.
fn log(
    mut store: StoreContextMut<'_, CallState>,
    (level, message): (wit::LogLevel, WasmStr),
) -> wasmtime::Result<()> {
    // A line costs the runtime a log record and a call: counted like a read.
    store.data_mut().count_host_call()?;
    // Taken out while the line is read from the guest's memory (which borrows the store);
    // put back below.
    let mut logs = std::mem::replace(&mut store.data_mut().logs, LogBudget::new(0, 0));
    let panic_line = {
        let message = message.to_str(&store)?;
        if let Some(line) = logs.admit(&message) {
            let state = store.data();
            let (controller, object) = (state.controller.as_str(), state.target.to_string());
            let object = object.as_str();
            match level {
                wit::LogLevel::Trace => tracing::trace!(controller, object, guest = true, "{line}"),
                wit::LogLevel::Debug => tracing::debug!(controller, object, guest = true, "{line}"),
                wit::LogLevel::Info => tracing::info!(controller, object, guest = true, "{line}"),
                wit::LogLevel::Warn => tracing::warn!(controller, object, guest = true, "{line}"),
                wit::LogLevel::Error => tracing::error!(controller, object, guest = true, "{line}"),
            }
        }
        (matches!(level, wit::LogLevel::Error) && message.starts_with("panicked at "))
            .then(|| message[..message.floor_char_boundary(MAX_PANIC_LINE_BYTES)].to_owned())
    };
    let state = store.data_mut();
    state.logs = logs;
    if panic_line.is_some() {
        state.panic_line = panic_line;
    }
    Ok(())
}

type GetParams = (WasmStr, WasmStr, Option<WasmStr>, WasmStr);
type ReadResult<T> = wasmtime::Result<(Result<T, wit::Error>,)>;

/// A read refused before it reached the reads: an argument past its bound (permanent).
fn refused<T>(message: String) -> ReadResult<T> {
    Ok((Err(wit::Error {
        message,
        retryable: false,
    }),))
}

fn to_wit_error(error: kubewasm_guest_sdk::Error) -> wit::Error {
    wit::Error {
        message: error.message,
        retryable: error.retryable,
    }
}

fn get(
    mut store: StoreContextMut<'_, CallState>,
    (api_version, kind, namespace, name): GetParams,
) -> ReadResult<Option<String>> {
    store.data_mut().count_host_call()?;
    let field = |text, what| argument(&store, text, what, MAX_READ_FIELD_BYTES);
    let (api_version, kind, name) = match (
        field(&api_version, "apiVersion")?,
        field(&kind, "kind")?,
        field(&name, "name")?,
    ) {
        (Ok(a), Ok(k), Ok(n)) => (a, k, n),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => return refused(e),
    };
    let namespace = match optional(&store, &namespace, "namespace", MAX_READ_FIELD_BYTES)? {
        Ok(ns) => ns,
        Err(e) => return refused(e),
    };
    let found = store
        .data()
        .reads
        .get(&api_version, &kind, namespace.as_deref(), &name);
    Ok((found
        .map(|o| o.map(|v| v.to_string()))
        .map_err(to_wit_error),))
}

type ListParams = (WasmStr, WasmStr, Option<WasmStr>, Option<WasmStr>);

fn list(
    mut store: StoreContextMut<'_, CallState>,
    (api_version, kind, namespace, selector): ListParams,
) -> ReadResult<Vec<String>> {
    store.data_mut().count_host_call()?;
    let (api_version, kind) = match (
        argument(&store, &api_version, "apiVersion", MAX_READ_FIELD_BYTES)?,
        argument(&store, &kind, "kind", MAX_READ_FIELD_BYTES)?,
    ) {
        (Ok(a), Ok(k)) => (a, k),
        (Err(e), _) | (_, Err(e)) => return refused(e),
    };
    let (namespace, selector) = match (
        optional(&store, &namespace, "namespace", MAX_READ_FIELD_BYTES)?,
        optional(&store, &selector, "label selector", MAX_SELECTOR_BYTES)?,
    ) {
        (Ok(n), Ok(s)) => (n, s),
        (Err(e), _) | (_, Err(e)) => return refused(e),
    };
    let found = store.data().reads.list(
        &api_version,
        &kind,
        namespace.as_deref(),
        selector.as_deref(),
    );
    let objects = match found {
        Ok(objects) => objects,
        Err(e) => return Ok((Err(to_wit_error(e)),)),
    };
    // What could never fit in the guest's memory is not copied for it: the texts are made
    // only up to the call's memory limit.
    let limit = store.data().limits.memory_bytes;
    let mut texts = Vec::with_capacity(objects.len());
    let mut total = 0usize;
    for object in &objects {
        let text = object.to_string();
        total = total.saturating_add(text.len());
        if total > limit {
            return refused(format!(
                "the list of {kind} ({api_version}) is more than the reconcile's memory limit of {limit} bytes ({} objects); narrow it with a label selector or a namespace",
                objects.len()
            ));
        }
        texts.push(text);
    }
    Ok((Ok(texts),))
}

/// The guest's answer. The response's length is checked against
/// [`Limits::response_bytes`] before it is parsed straight out of the guest's memory; an
/// error message is cut to [`MAX_GUEST_MESSAGE_BYTES`] before it is copied.
fn respond(
    mut store: StoreContextMut<'_, CallState>,
    (outcome,): (Result<WasmStr, GuestError>,),
) -> wasmtime::Result<()> {
    if store.data().answer.is_some() {
        return Err(wasmtime::Error::msg(
            "the guest called `respond` twice; a reconcile answers once",
        ));
    }
    let limits = store.data().limits;
    let answer = match outcome {
        Ok(json) => {
            let json = json.to_str(&store)?;
            decode_response(&json, &limits).map_err(|e| {
                CallError::InvalidResponse(guest_text(&e, MAX_GUEST_MESSAGE_BYTES).into_owned())
            })
        }
        Err(e) => Err(CallError::Guest {
            message: guest_text(&e.message.to_str(&store)?, MAX_GUEST_MESSAGE_BYTES).into_owned(),
            retryable: e.retryable,
        }),
    };
    store.data_mut().answer = Some(answer);
    Ok(())
}

/// Adds WASI 0.2 (with nothing granted per call) and the kubewasm host imports. The imports
/// are defined by hand, not by bindgen, so that every string a guest passes is lifted as a
/// [`WasmStr`] (a view of its memory) and checked before the host copies any of it.
pub(crate) fn add_to_linker(linker: &mut Linker<CallState>) -> wasmtime::Result<()> {
    wasmtime_wasi::p2::add_to_linker_async(linker)?;
    let mut host = linker.instance(HOST_INTERFACE)?;
    host.func_wrap("log", log)?;
    host.func_wrap("get", get)?;
    host.func_wrap("list", list)?;
    host.func_wrap("respond", respond)?;
    Ok(())
}

fn deadline_ticks(timeout: Duration, tick: Duration) -> u64 {
    let ticks = timeout.as_nanos().div_ceil(tick.as_nanos().max(1));
    // One extra tick: the deadline may land just after an increment.
    u64::try_from(ticks).unwrap_or(u64::MAX - 1) + 1
}

/// Which call a log line is about (the request itself is moved into the guest's record).
struct About {
    controller: String,
    target: ObjectRef,
}

fn log_output(request: &About, stream: &str, captured: &Captured, logs: &mut LogBudget) {
    if captured.kept.is_empty() && captured.dropped == 0 {
        return;
    }
    let controller = request.controller.as_str();
    let object = request.target.to_string();
    let text = captured.text();
    let lines = text.lines().filter(|l| !l.is_empty());
    for line in lines.filter_map(|l| logs.admit(l)) {
        if stream == "stderr" {
            tracing::warn!(
                controller,
                object = object.as_str(),
                stream,
                "guest: {line}"
            );
        } else {
            tracing::info!(
                controller,
                object = object.as_str(),
                stream,
                "guest: {line}"
            );
        }
    }
    if captured.dropped > 0 {
        tracing::warn!(
            controller,
            object = object.as_str(),
            stream,
            dropped_bytes = captured.dropped,
            "guest output over the limit of {} bytes was dropped",
            captured.kept.len()
        );
    }
}

fn log_dropped_lines(request: &About, logs: &LogBudget, limits: &Limits) {
    if logs.dropped() > 0 || logs.dropped_lines() > 0 {
        tracing::warn!(
            controller = request.controller.as_str(),
            object = request.target.to_string(),
            dropped_bytes = logs.dropped(),
            dropped_lines = logs.dropped_lines(),
            "guest log lines past {MAX_GUEST_LOG_LINE_BYTES} bytes each or {} bytes per call (each line counting at least {MIN_LOG_LINE_COST}) were dropped",
            limits.log_bytes
        );
    }
}

#[cfg(test)]
mod tests;
