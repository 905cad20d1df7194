//! Helpers shared by the sandbox and CLI tests: where the built guests are.

use std::path::PathBuf;

/// The directory `make guests` writes the guest components to: `KUBEWASM_GUEST_DIR` if set,
/// else `<workspace>/target/wasm32-wasip2/guest`.
pub fn guest_dir() -> PathBuf {
    match std::env::var_os("KUBEWASM_GUEST_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/wasm32-wasip2/guest"),
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
