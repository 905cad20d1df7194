//! Host bindings generated from the WIT contract in `guest-sdk/wit/` (never hand-written).
#![allow(missing_docs)]

wasmtime::component::bindgen!({
    world: "controller",
    path: "../guest-sdk/wit",
    imports: { default: trappable },
    // Calls into the guest are async, so that a reconcile past its deadline is dropped
    // (and its Store and instance slot freed) wherever the guest is: computing, or blocked
    // in a host or WASI call.
    exports: { default: async },
});

pub use self::kubewasm::controller::types as wit;
