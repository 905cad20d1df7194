//! Host bindings generated from the WIT contract in `guest-sdk/wit/` (never hand-written):
//! the world's types and the `reconcile` export. The host imports are defined in `call.rs`,
//! by hand, so that they see the guest's strings before copying them.
#![allow(missing_docs)]

wasmtime::component::bindgen!({
    world: "controller",
    path: "../../guest-sdk/wit",
    // Calls into the guest are async, so that a reconcile past its deadline is dropped
    // (and its Store and instance slot freed) wherever the guest is: computing, or blocked
    // in a host or WASI call.
    exports: { default: async },
});

pub use self::kubewasm::controller::types as wit;

/// The instance name of the host imports, `kubewasm:controller/host@<version>`: a guest
/// built against another version of the contract does not link.
pub const HOST_INTERFACE: &str = "kubewasm:controller/host@0.3.0";

/// The world of a controller that also exports `prepare`, which the host calls on instances it
/// makes ahead ([`crate::Ready`]).
pub const PREPARED_WORLD: &str = "kubewasm:controller/prepared-controller@0.3.0";

#[cfg(test)]
mod tests {
    #[test]
    fn the_host_interface_has_the_contracts_version() {
        let wit = include_str!("../../../guest-sdk/wit/kubewasm.wit");
        let version = super::HOST_INTERFACE.rsplit_once('@').unwrap().1;
        assert!(
            wit.contains(&format!("package kubewasm:controller@{version};")),
            "guest-sdk/wit/kubewasm.wit and HOST_INTERFACE disagree on the version"
        );
        assert!(
            super::PREPARED_WORLD.ends_with(&format!("@{version}"))
                && wit.contains("world prepared-controller {"),
            "guest-sdk/wit/kubewasm.wit and PREPARED_WORLD disagree"
        );
    }
}
