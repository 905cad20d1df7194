//! Where the built guests are (the sandbox, CLI and live tests, the benches).

use std::path::PathBuf;

/// The directory `make guests` writes the guest components to: `KUBEWASM_GUEST_DIR` if set,
/// else `<target>/wasm32-wasip2/guest` beside the running test binary's profile.
pub fn guest_dir() -> PathBuf {
    match std::env::var_os("KUBEWASM_GUEST_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => crate::profile_dir().join("../wasm32-wasip2/guest"),
    }
}

/// Path of one built guest, e.g. `guest("hostile")`; panics with what to do when missing.
pub fn guest(name: &str) -> PathBuf {
    let path = guest_dir().join(format!("{name}.wasm"));
    assert!(
        path.is_file(),
        "{} is missing: run `make guests` first",
        path.display()
    );
    path
}
