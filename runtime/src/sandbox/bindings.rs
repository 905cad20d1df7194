//! Host bindings generated from the WIT contract in `guest-sdk/wit/` (never hand-written).
#![allow(missing_docs)]

wasmtime::component::bindgen!({
    world: "controller",
    path: "../guest-sdk/wit",
    imports: { default: trappable },
});

pub use self::kubewasm::controller::types as wit;
