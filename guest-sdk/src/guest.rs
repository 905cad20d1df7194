//! The wasm side of the SDK: WIT bindings, conversions between WIT and SDK types, and the
//! [`Cluster`] implemented over the host imports. Only [`crate::export_reconciler!`] uses it.

// The generated glue's `unsafe` comes from wit-bindgen's macro, which the workspace's
// `forbid(unsafe_code)` does not look into; missing docs and clippy style are its business.
#[allow(missing_docs, clippy::all)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "wit",
        world: "controller",
        pub_export_macro: true,
        export_macro_name: "__kubewasm_export_controller",
        default_bindings_module: "kubewasm_guest_sdk::__private::bindings",
        runtime_path: "kubewasm_guest_sdk::__private::wit_bindgen::rt",
    });
}

pub use wit_bindgen;

use bindings::kubewasm::controller::{host, types as wit};
use serde_json::Value;

use crate::{Cluster, Error, LogLevel, ObjectRef, Reads, Request, Response, WireRequest};

/// The request type of the WIT export.
pub type WitRequest = wit::Request;

/// The signature of a guest's reconcile function.
pub type ReconcileFn = fn(&Request, &dyn Cluster) -> Result<Response, Error>;

/// Run one reconcile: convert the WIT request, call the guest, and hand its answer to the
/// host as one JSON document (`host::respond`).
pub fn run(request: WitRequest, reconcile: ReconcileFn) {
    #[cfg(target_os = "unknown")]
    log_panics();
    let outcome = from_wit_request(request)
        .and_then(|request| reconcile(&request, &HostCluster))
        .and_then(|response| serde_json::to_string(&response).map_err(Error::from));
    match outcome {
        Ok(json) => host::respond(Ok(&json)),
        Err(e) => host::respond(Err(&wit::Error {
            message: e.message,
            retryable: e.retryable,
        })),
    }
}

/// Without WASI there is no stderr for Rust's panic message: the message goes to the host's
/// `log` at error level instead, as `panicked at <location>:\n<message>` (what the default hook
/// prints), where the runtime takes it for the `Panicked` error as it does from stderr.
#[cfg(target_os = "unknown")]
fn log_panics() {
    std::panic::set_hook(Box::new(|info| {
        host::log(wit::LogLevel::Error, &info.to_string());
    }));
}

/// The cluster as the host's imports offer it.
struct HostCluster;

impl Reads for HostCluster {
    fn get(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Option<Value>, Error> {
        // Refused here already, as `FakeCluster` and the host refuse them (permanently).
        crate::query::validate_name(name)?;
        if let Some(ns) = namespace {
            crate::query::validate_namespace(ns)?;
        }
        match host::get(api_version, kind, namespace, name) {
            Ok(Some(json)) => Ok(Some(serde_json::from_str(&json)?)),
            Ok(None) => Ok(None),
            Err(refused) => Err(from_wit_error(refused)),
        }
    }

    fn list(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        label_selector: Option<&str>,
    ) -> Result<Vec<Value>, Error> {
        crate::query::parse_selector(label_selector)?;
        if let Some(ns) = namespace {
            crate::query::validate_namespace(ns)?;
        }
        host::list(api_version, kind, namespace, label_selector)
            .map_err(from_wit_error)?
            .iter()
            .map(|json| serde_json::from_str(json).map_err(Error::from))
            .collect()
    }
}

impl Cluster for HostCluster {
    fn log(&self, level: LogLevel, message: &str) {
        let level = match level {
            LogLevel::Trace => wit::LogLevel::Trace,
            LogLevel::Debug => wit::LogLevel::Debug,
            LogLevel::Info => wit::LogLevel::Info,
            LogLevel::Warn => wit::LogLevel::Warn,
            LogLevel::Error => wit::LogLevel::Error,
        };
        host::log(level, message);
    }
}

fn from_wit_request(request: WitRequest) -> Result<Request, Error> {
    let target = request.target;
    WireRequest {
        controller: request.controller,
        target: ObjectRef {
            api_version: target.api_version,
            kind: target.kind,
            namespace: target.namespace,
            name: target.name,
        },
        parent: request.parent,
        children: request.children,
        previous: request.previous,
        state: request.state,
        finalizing: request.finalizing,
    }
    .parse()
}

fn from_wit_error(error: wit::Error) -> Error {
    Error {
        message: error.message,
        retryable: error.retryable,
    }
}
