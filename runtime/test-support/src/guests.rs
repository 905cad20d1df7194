//! Where the built guests are (the sandbox, CLI and live tests, the benches), and their build
//! when a test asks for one that is not there: `cargo test --workspace` on a fresh clone builds
//! what `make guests` would, once, into the same place (the way wasmtime's test programs are
//! built for its tests), so no `make` step comes first.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// The directory `make guests` writes the guest components to: `KUBEWASM_GUEST_DIR` if set,
/// else `<target>/wasm32-wasip2/guest` beside the running test binary's profile.
pub fn guest_dir() -> PathBuf {
    match std::env::var_os("KUBEWASM_GUEST_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => crate::profile_dir().join("../wasm32-wasip2/guest"),
    }
}

/// The directory `make guests` writes the guests built without WASI to (docs/03-writing-a-controller.md,
/// "Guests without WASI"): `KUBEWASM_GUEST_DIR_NO_WASI` if set, else
/// `<target>/wasm32-unknown-unknown/guest` beside the running test binary's profile.
pub fn guest_dir_without_wasi() -> PathBuf {
    match std::env::var_os("KUBEWASM_GUEST_DIR_NO_WASI") {
        Some(dir) => PathBuf::from(dir),
        None => crate::profile_dir().join("../wasm32-unknown-unknown/guest"),
    }
}

/// Path of one built guest, e.g. `guest("hostile")`, or of a [`VARIANTS`] build; built first
/// when missing (see [`build_missing`]), else panics with what to do.
pub fn guest(name: &str) -> PathBuf {
    built(guest_dir(), "KUBEWASM_GUEST_DIR", &WASIP2, name)
}

/// Guests built again with a build-time setting (the Makefile's `variant-guests`), into a
/// target directory of their own: `(name, crate, its file in that build)`.
pub const VARIANTS: &[(&str, &str, &str)] = &[
    ("hello_world_howdy", "hello-world", "hello_world.wasm"),
    (
        "configmap_restarter_wide",
        "configmap-restarter",
        "configmap_restarter.wasm",
    ),
];

/// The settings of the [`VARIANTS`] build (`variant-guests`).
const VARIANT_SETTINGS: &[(&str, &str)] = &[
    ("HELLO_WORLD_GREETING", "Howdy"),
    ("CONFIGMAP_RESTARTER_WIDEN", "1"),
];

/// Path of one guest built without WASI, e.g. `guest_without_wasi("hello_world")`; built
/// first when missing, else panics with what to do.
pub fn guest_without_wasi(name: &str) -> PathBuf {
    built(
        guest_dir_without_wasi(),
        "KUBEWASM_GUEST_DIR_NO_WASI",
        &WITHOUT_WASI,
        name,
    )
}

/// The Rust guests of one target, as the Makefile's `guests` target builds them.
struct Target {
    triple: &'static str,
    crates: &'static [&'static str],
}

/// `GUESTS` of the Makefile.
const WASIP2: Target = Target {
    triple: "wasm32-wasip2",
    crates: &[
        "hello-world",
        "configmap-restarter",
        "guitar-reviewer",
        "pod-watcher",
        "hello-finalizer",
        "hostile",
        "intruder",
        "prepared",
    ],
};

/// `NO_WASI_GUESTS` of the Makefile.
const WITHOUT_WASI: Target = Target {
    triple: "wasm32-unknown-unknown",
    crates: &[
        "hello-world",
        "configmap-restarter",
        "guitar-reviewer",
        "pod-watcher",
        "hello-finalizer",
        "hostile",
    ],
};

/// One build at a time within a test binary (across binaries: the build's own locks).
static BUILDING: Mutex<()> = Mutex::new(());

fn built(dir: PathBuf, variable: &str, target: &Target, name: &str) -> PathBuf {
    let path = dir.join(format!("{name}.wasm"));
    if !path.is_file() && std::env::var_os(variable).is_none() {
        let _one = BUILDING.lock().unwrap_or_else(|e| e.into_inner());
        if !path.is_file()
            && let Err(why) = build_missing(target, name, &path)
        {
            panic!(
                "{} is missing and could not be built ({why}): run `make guests` first",
                path.display()
            );
        }
    }
    assert!(
        path.is_file(),
        "{} is missing: run `make guests` first",
        path.display()
    );
    path
}

/// Builds guest `name` to `path` as `make guests` does: a Python guest (`python_*`) with
/// `guest-sdk/python/build.sh` (componentize-py, installed from PyPI into the cache on first
/// use), a Rust guest with every Rust guest of its target in one `cargo build --profile guest`
/// into this workspace's target directory.
fn build_missing(target: &Target, name: &str, path: &Path) -> Result<(), String> {
    let root = crate::workspace();
    let crate_name = name.replace('_', "-");
    if VARIANTS.iter().any(|(variant, ..)| *variant == name) {
        return build_variants(target, path);
    }
    let mut command = if crate_name.starts_with("python-") {
        let mut command = Command::new(root.join("guest-sdk/python/build.sh"));
        command.arg(root.join("guests").join(&crate_name)).arg(path);
        command
    } else if target.crates.contains(&crate_name.as_str()) {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let target_dir = crate::profile_dir().join("..");
        let mut command = Command::new(cargo);
        command
            .current_dir(&root)
            .args(["build", "--profile", "guest", "--target", target.triple])
            .arg("--target-dir")
            .arg(&target_dir);
        for guest in target.crates {
            command.args(["-p", guest]);
        }
        command
    } else {
        return Err(format!(
            "no guest crate `{crate_name}` for {}",
            target.triple
        ));
    };
    eprintln!(
        "building the guests for {} ({name} is missing)",
        target.triple
    );
    let status = command
        .status()
        .map_err(|e| format!("cannot run the build: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("the build failed: {status}"))
    }
}

/// Builds every [`VARIANTS`] guest as `make variant-guests` does, beside `path`.
fn build_variants(target: &Target, path: &Path) -> Result<(), String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let target_dir = crate::profile_dir().join("../variants");
    let mut command = Command::new(cargo);
    command
        .current_dir(crate::workspace())
        .args(["build", "--profile", "guest", "--target", target.triple])
        .arg("--target-dir")
        .arg(&target_dir)
        .envs(VARIANT_SETTINGS.iter().copied());
    for (_, crate_name, _) in VARIANTS {
        command.args(["-p", crate_name]);
    }
    eprintln!("building the guest variants for {}", target.triple);
    let status = command
        .status()
        .map_err(|e| format!("cannot run the build: {e}"))?;
    if !status.success() {
        return Err(format!("the build failed: {status}"));
    }
    let dir = path.parent().ok_or("no guest directory")?;
    for (name, _, file) in VARIANTS {
        let built = target_dir.join(target.triple).join("guest").join(file);
        std::fs::copy(&built, dir.join(format!("{name}.wasm")))
            .map_err(|e| format!("cannot copy {}: {e}", built.display()))?;
    }
    Ok(())
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

/// How the operands of [`heavy_component`]'s operations are chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operands {
    /// Three pseudo-random parameters, multiplied: long-lived values, little compression
    /// (gzip keeps about half).
    Random,
    /// Each operation takes the two parameters before it in a ring and adds or multiplies them
    /// (one pseudo-random bit): short-lived values, gzip keeps about a sixteenth (a module may
    /// inflate at most 32×).
    Ring,
}

/// A component whose one core function (exported, its module instantiated) is `ops`
/// operations `c = a op b` over its `params` i32 parameters, ending with `local.get 0`:
/// nothing folds away, so the compiler's memory grows with `ops`. Measured with the release
/// compiler process: 100,000 `Random` operations over 500 parameters peak near 85 MiB;
/// 800,000 `Ring` operations over 127 parameters near 470 MiB (5.6 MB, 341 KB gzipped).
/// `params` ≤ 127 keeps each operation 7 bytes (wasmparser takes functions ≤ 7,654,321 bytes).
pub fn heavy_component(ops: usize, params: usize, operands: Operands) -> Vec<u8> {
    fn leb(mut n: usize, out: &mut Vec<u8>) {
        loop {
            let byte = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }
    fn section(id: u8, body: &[u8], out: &mut Vec<u8>) {
        out.push(id);
        leb(body.len(), out);
        out.extend_from_slice(body);
    }
    let mut seed: u32 = 1;
    let mut next = move || {
        seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        (seed >> 16) as usize
    };
    let mut body = vec![0]; // no locals
    for i in 0..ops {
        let (a, b, c, op) = match operands {
            Operands::Random => (next() % params, next() % params, next() % params, 0x6c),
            Operands::Ring => (
                (i + params - 1) % params,
                (i + params - 2) % params,
                i % params,
                if next() & 1 == 0 { 0x6a } else { 0x6c },
            ),
        };
        body.push(0x20);
        leb(a, &mut body);
        body.push(0x20);
        leb(b, &mut body);
        body.push(op);
        body.push(0x21);
        leb(c, &mut body);
    }
    body.extend_from_slice(&[0x20, 0, 0x0b]); // local.get 0, end
    let mut types = vec![1, 0x60];
    leb(params, &mut types);
    types.extend(std::iter::repeat_n(0x7f, params));
    types.extend_from_slice(&[1, 0x7f]);
    let mut code = vec![1];
    leb(body.len(), &mut code);
    code.extend_from_slice(&body);
    let mut core = b"\0asm\x01\0\0\0".to_vec();
    section(1, &types, &mut core);
    section(3, &[1, 0], &mut core);
    section(7, &[1, 1, b'f', 0, 0], &mut core);
    section(10, &code, &mut core);
    let mut component = b"\0asm\x0d\0\x01\0".to_vec();
    section(1, &core, &mut component);
    section(2, &[1, 0, 0, 0], &mut component);
    component
}
