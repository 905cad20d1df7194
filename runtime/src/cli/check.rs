//! `kubewasm check`: is this file a loadable kubewasm controller?

use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context;
use kubewasm::sandbox::{Sandbox, SandboxConfig};

/// Arguments of `kubewasm check`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The guest component (`.wasm`, gzip accepted).
    module: PathBuf,
}

/// Compiles and validates the module, prints digest and size.
pub fn run(args: Args) -> anyhow::Result<()> {
    let raw = std::fs::read(&args.module)
        .with_context(|| format!("cannot read `{}`", args.module.display()))?;
    let warning = configmap_size_warning(&args.module, &raw);
    let bytes =
        kubewasm::sources::unpack(raw, None, true, kubewasm::sources::DEFAULT_MAX_MODULE_BYTES)?;
    let sandbox = Sandbox::new(SandboxConfig::default())?;
    let guest = sandbox
        .load(&bytes)
        .with_context(|| format!("`{}` is not a usable guest", args.module.display()))?;
    println!(
        "ok: {} is a kubewasm controller (kubewasm:controller/controller@0.3.0)",
        args.module.display()
    );
    println!("digest: {}", guest.digest());
    println!("size: {} bytes", guest.size());
    if let Some(warning) = warning {
        eprintln!("warning: {warning}");
    }
    Ok(())
}

/// The most a ConfigMap holds: the API server refuses one whose `data` and `binaryData` values
/// exceed 1 MiB together. Keys and metadata do not count (measured with Kubernetes 1.20: a
/// 1,048,576-byte value with a 205-byte key is accepted, one byte more is refused), so a module
/// alone in its ConfigMap may be exactly this big.
pub const CONFIGMAP_MAX_BYTES: usize = 1 << 20;

/// What to do when the module, as it would be stored (gzipped or not), does not fit in a
/// ConfigMap; `None` when it fits. Only a warning: a module file under `--module-dir` has no
/// such limit.
fn configmap_size_warning(path: &Path, raw: &[u8]) -> Option<String> {
    if raw.len() <= CONFIGMAP_MAX_BYTES {
        return None;
    }
    let file = path.display();
    let too_big = format!(
        "{file} is {} bytes{}, more than the {CONFIGMAP_MAX_BYTES} bytes a ConfigMap holds: the API server will refuse it",
        raw.len(),
        if raw.starts_with(&[0x1f, 0x8b]) {
            " gzipped"
        } else {
            ""
        },
    );
    let smaller = "build with the release profile `kubewasm new` writes (`[profile.release]` with \
                   lto = true, strip = true, codegen-units = 1, panic = \"abort\"; `cargo build \
                   --release --target wasm32-unknown-unknown`, i.e. `make build`: a debug build is many \
                   times bigger)";
    let elsewhere = "or push it to a registry (`kubewasm push`) and name it in `spec.module.image`, \
                     which has no such limit, or give a ClusterWasmController the module as a file \
                     (`spec.module.path` under `kubewasm run --module-dir`)";
    if raw.starts_with(&[0x1f, 0x8b]) {
        return Some(format!("{too_big}. Fix: {smaller}, {elsewhere}"));
    }
    let gzipped = gzipped_len(raw);
    let ratio = kubewasm::sources::MAX_GZIP_RATIO;
    if gzipped <= CONFIGMAP_MAX_BYTES && raw.len() as u64 > (gzipped as u64).saturating_mul(ratio) {
        return Some(format!(
            "{too_big}. Gzipped it is {gzipped} bytes, but it inflates more than {ratio}× its size, \
             the most the runtime inflates (a module this compressible is mostly padding: a \
             large zeroed data segment or custom section). Fix: {smaller}, {elsewhere}"
        ));
    }
    if gzipped <= CONFIGMAP_MAX_BYTES {
        Some(format!(
            "{too_big}. Gzipped it is {gzipped} bytes, which fits: `gzip -9k {file}` and load \
             {file}.gz under the same key (the runtime gunzips it; `make update GZIPPED=1` in a \
             crate from `kubewasm new`). Smaller still: {smaller}"
        ))
    } else {
        Some(format!(
            "{too_big}, and {gzipped} bytes gzipped. Fix: {smaller}, {elsewhere}"
        ))
    }
}

/// The size of `bytes` after `gzip -9`.
fn gzipped_len(bytes: &[u8]) -> usize {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    // Writing to a Vec cannot fail; were it to, the size is unknown and reported as too big.
    match encoder.write_all(bytes).and_then(|()| encoder.finish()) {
        Ok(out) => out.len(),
        Err(_) => usize::MAX,
    }
}
