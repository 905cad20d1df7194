//! `kubewasm push FILE REF`: a built component into a registry as the CNCF wasm OCI artifact
//! (config `application/vnd.wasm.config.v0+json` naming its world, one `application/wasm`
//! layer), printing `REF@sha256:…` — what `spec.module.image` can pin.
//!
//! Credentials and plain HTTP: [`super::registry::RegistryArgs`].

use std::path::PathBuf;

use anyhow::{Context, bail};
use kubewasm::sandbox::Digest;
use kubewasm::sources::oci::{
    CONFIG_MEDIA_TYPE, ComponentInfo, LAYER_MEDIA_TYPE, MANIFEST_MEDIA_TYPE, WasmConfig,
};
use oci_client::client::{Config, ImageLayer};
use oci_client::manifest::OciImageManifest;

use super::registry::{RegistryArgs, block_on, image_reference};

/// Arguments of `kubewasm push`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The built component (`.wasm`, e.g. from `cargo build --target wasm32-unknown-unknown`).
    file: PathBuf,
    /// Where to push it: `registry/repository:tag` (the registry named, e.g.
    /// `127.0.0.1:5000/team/hello:v1`).
    reference: String,
    #[command(flatten)]
    registry: RegistryArgs,
}

/// Pushes the file and prints the reference with the pushed digest.
pub fn run(args: Args) -> anyhow::Result<()> {
    let image = image_reference(&args.reference)?;
    let reference = image.reference();
    if reference.digest().is_some() || reference.tag().is_none() {
        bail!(
            "push to a tag (`{}/{}:v1`): the registry gives the digest",
            reference.registry(),
            reference.repository()
        );
    }
    let bytes = std::fs::read(&args.file)
        .with_context(|| format!("cannot read {}", args.file.display()))?;
    let info =
        ComponentInfo::of(&bytes).map_err(|e| anyhow::anyhow!("{}: {e}", args.file.display()))?;
    if info.target.is_none() {
        eprintln!(
            "warning: {} is not a kubewasm controller (it does not import kubewasm:controller/host and export reconcile); the runtime will refuse it",
            args.file.display()
        );
    }
    let auth = args.registry.credentials(image.registry())?;
    let layer_digest = format!("sha256:{}", Digest::of(&bytes).hex());
    let config = WasmConfig::for_component(info, layer_digest);
    let config = Config::new(
        serde_json::to_vec(&config).context("cannot write the config")?,
        CONFIG_MEDIA_TYPE.to_owned(),
        None,
    );
    let layers = vec![ImageLayer::new(bytes, LAYER_MEDIA_TYPE.to_owned(), None)];
    let mut manifest = OciImageManifest::build(&layers, &config, None);
    manifest.media_type = Some(MANIFEST_MEDIA_TYPE.to_owned());
    let client = args.registry.client(image.registry())?;
    let digest = block_on(&format!("pushing to {}", args.reference), async {
        client
            .push(reference, &layers, config, &auth, Some(manifest))
            .await
            .with_context(|| args.registry.cannot("push to", &args.reference))?;
        // What the registry stores, as it says it.
        client
            .fetch_manifest_digest(reference, &auth)
            .await
            .with_context(|| format!("pushed, but cannot read the digest of {}", args.reference))
    })?;
    println!("{}@{digest}", args.reference);
    Ok(())
}
