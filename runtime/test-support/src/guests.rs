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

/// The directory `make guests` writes the guests built without WASI to (README, "Guests
/// without WASI"): `KUBEWASM_GUEST_DIR_NO_WASI` if set, else
/// `<target>/wasm32-unknown-unknown/guest` beside the running test binary's profile.
pub fn guest_dir_without_wasi() -> PathBuf {
    match std::env::var_os("KUBEWASM_GUEST_DIR_NO_WASI") {
        Some(dir) => PathBuf::from(dir),
        None => crate::profile_dir().join("../wasm32-unknown-unknown/guest"),
    }
}

/// Path of one built guest, e.g. `guest("hostile")`; panics with what to do when missing.
pub fn guest(name: &str) -> PathBuf {
    built(guest_dir(), name)
}

/// Path of one guest built without WASI, e.g. `guest_without_wasi("hello_world")`; panics
/// with what to do when missing.
pub fn guest_without_wasi(name: &str) -> PathBuf {
    built(guest_dir_without_wasi(), name)
}

fn built(dir: PathBuf, name: &str) -> PathBuf {
    let path = dir.join(format!("{name}.wasm"));
    assert!(
        path.is_file(),
        "{} is missing: run `make guests` first",
        path.display()
    );
    path
}

/// `module` with a custom section `name` holding `payload` appended: other bytes (another
/// digest) for the same code, which every loader ignores. Sizes are unsigned LEB128 padded to
/// 5 bytes, so the section's length is exactly `1 + 5 + 1 + name + payload`.
pub fn with_custom_section(mut module: Vec<u8>, name: &str, payload: &[u8]) -> Vec<u8> {
    let leb5 = |mut n: usize| -> [u8; 5] {
        let mut out = [0u8; 5];
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = (n & 0x7f) as u8 | if i < 4 { 0x80 } else { 0 };
            n >>= 7;
        }
        out
    };
    assert!(name.len() < 0x80, "a custom section name under 128 bytes");
    module.push(0);
    module.extend(leb5(1 + name.len() + payload.len()));
    module.push(name.len() as u8);
    module.extend(name.as_bytes());
    module.extend(payload);
    module
}
