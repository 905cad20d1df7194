//! Write kubewasm controllers as plain Rust functions.
//!
//! A guest is one function from a typed [`Request`] (the target object, its observed state and
//! children) to a typed [`Response`] (actions for the host to carry out), with read access to
//! the cluster through the [`Cluster`] trait. [`export_reconciler!`] turns it into the
//! `reconcile` export of the `kubewasm:controller` WIT world when built for `wasm32-wasip2`;
//! on the host the same function runs in ordinary tests against `testing::FakeCluster`.
//!
//! ```no_run
//! use kubewasm_guest_sdk::{Cluster, Error, Request, Response, object};
//! use serde_json::json;
//!
//! /// Keep one ConfigMap per parent, carrying the parent's `spec.greeting`.
//! pub fn reconcile(req: &Request, _cluster: &dyn Cluster) -> Result<Response, Error> {
//!     let Some(parent) = &req.parent else {
//!         return Ok(Response::new()); // gone: the host garbage-collects the children
//!     };
//!     let greeting = object::spec_str(parent, "greeting").unwrap_or("hello");
//!     let config = object::child_of(parent, "v1", "ConfigMap", &req.target.name)
//!         .data(json!({ "greeting": greeting }));
//!     Ok(Response::new().apply(config).set_status(json!({ "ready": true })))
//! }
//!
//! kubewasm_guest_sdk::export_reconciler!(reconcile);
//! ```
//!
//! Build it with `cargo build --target wasm32-wasip2` (the crate needs
//! `crate-type = ["cdylib", "rlib"]`); the guest crate needs no wit-bindgen dependency.

#![warn(missing_docs)]

// Lets paths generated for guest crates (`kubewasm_guest_sdk::...`) resolve inside the SDK too.
extern crate self as kubewasm_guest_sdk;

mod cluster;
pub mod conditions;
mod error;
pub mod object;
pub mod query;
mod request;
mod response;
pub mod selector;
#[cfg(not(target_arch = "wasm32"))]
pub mod testing;
pub mod time;
mod wire;

// Guests built without WASI get the allocator that uses the initial memory before growing it.
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use kubewasm_guest_alloc as _;

#[cfg(target_arch = "wasm32")]
#[doc(hidden)]
#[path = "guest.rs"]
pub mod __private;

pub use cluster::{Cluster, LogLevel, Reads};
pub use error::Error;
pub use request::{ObjectRef, Request};
pub use response::{Action, EventType, MAX_STATE_BYTES, Response};
#[doc(hidden)]
pub use wire::WireRequest;

/// Export `reconcile` (a `fn(&Request, &dyn Cluster) -> Result<Response, Error>`) as the
/// guest's WIT `reconcile`. Use it once per guest crate, at the top level.
///
/// On wasm32 it generates the component export and the JSON conversions; on other targets it
/// only checks the function's signature, so the function stays an ordinary, testable function.
#[macro_export]
macro_rules! export_reconciler {
    ($reconcile:path) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            struct KubewasmGuest;

            impl $crate::__private::bindings::Guest for KubewasmGuest {
                fn reconcile(request: $crate::__private::WitRequest) {
                    $crate::__private::run(request, $reconcile)
                }
            }

            $crate::__private::bindings::__kubewasm_export_controller!(KubewasmGuest);
        };

        #[cfg(not(target_arch = "wasm32"))]
        const _: fn(
            &$crate::Request,
            &dyn $crate::Cluster,
        ) -> ::core::result::Result<$crate::Response, $crate::Error> = $reconcile;
    };
}
