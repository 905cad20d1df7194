//! The one place the kubewasm runtime maps native code: a module compiled by its own
//! compiler process (`kubewasm compile-module`) into a file of its own compiled-module
//! directory. Compiles run out of the runtime's process so that what a tenant's module makes
//! the compiler do ends a child, not the runtime; what the child wrote is then mapped here.

use std::path::Path;

use wasmtime::Engine;
use wasmtime::component::Component;

/// Maps the precompiled component at `path` (written by `Engine::precompile_component` of an
/// engine with `engine`'s code-generation settings).
///
/// The caller vouches that the file was written by the runtime's own compiler, lives in a
/// directory no one else writes, and is never changed once there (entries are renamed into
/// place whole and only ever removed): wasmtime checks the header's settings against
/// `engine`, and cannot check the code.
pub fn map(engine: &Engine, path: &Path) -> wasmtime::Result<Component> {
    // SAFETY: `deserialize_file` requires a file made by `precompile_component` that does not
    // change while mapped; the caller vouches for both (see above), and wasmtime refuses a
    // file made by another version or with other settings.
    #[allow(unsafe_code)]
    unsafe {
        Component::deserialize_file(engine, path)
    }
}
