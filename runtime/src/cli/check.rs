//! `kubewasm check`: is this file a loadable kubewasm controller?

use std::path::PathBuf;

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
    let bytes = kubewasm::sources::unpack(raw, None, true)?;
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
    Ok(())
}
