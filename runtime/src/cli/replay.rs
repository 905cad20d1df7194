//! `kubewasm reconcile --capsule FILE`: a failed reconcile the runtime kept, replayed
//! offline — the same module (by digest), the same request, the same answers to its reads,
//! the same limits — and whether it fails the same way.

use std::io::Read as _;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, bail, ensure};
use kubewasm::api::Source;
use kubewasm::host::capsules::{CAPSULE_KIND, Capsule, Replayed, Stage};
use kubewasm::sandbox::{Digest, Sandbox, SandboxConfig, WireRequest};
use kubewasm::sources::oci::{Pulled, RegistryConfig, pull};
use kubewasm::sources::{self, OfflineOrigin};

use super::registry::{RegistryArgs, block_on, image_reference};

/// Most bytes of a capsule file (the runtime keeps each within 1 MiB).
const MAX_CAPSULE_FILE_BYTES: u64 = 16 << 20;

/// Replays the capsule in `path` with the module in `module` (else pulled).
pub fn run(path: &Path, module: Option<&Path>, registry: &RegistryArgs) -> anyhow::Result<()> {
    let mut text = Vec::new();
    std::fs::File::open(path)
        .with_context(|| format!("cannot open {}", path.display()))?
        .take(MAX_CAPSULE_FILE_BYTES)
        .read_to_end(&mut text)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let capsule: Capsule = serde_json::from_slice(&text).with_context(|| {
        format!(
            "{} is not a capsule (a file `kubewasm capsules` wrote)",
            path.display()
        )
    })?;
    ensure!(
        capsule.kind == CAPSULE_KIND,
        "{} is a {}, not a {CAPSULE_KIND}",
        path.display(),
        capsule.kind
    );
    let Some(request) = capsule.request.clone() else {
        bail!(
            "this capsule of {} cannot be replayed: {}",
            capsule.object,
            capsule.incomplete.as_deref().unwrap_or("it has no request")
        );
    };
    if let Some(why) = &capsule.incomplete {
        eprintln!("warning: the capsule is not complete ({why}): the replay may differ");
    }
    let bytes = module_of(&capsule, module, registry)?;
    let sandbox = Sandbox::new(SandboxConfig::default())?;
    let guest = sandbox
        .load(&bytes)
        .context("the capsule's module is not a usable guest")?;
    let reads = Arc::new(Replayed::new(capsule.reads.clone()));
    let result = guest.call(
        WireRequest::from(request),
        reads.clone(),
        &capsule.limits.into(),
    );
    let recorded = &capsule.error;
    let unread = match reads.unused() {
        0 => String::new(),
        n => format!(" ({n} recorded reads were not made)"),
    };
    let object = &capsule.object;
    let digest = &capsule.module.digest;
    match (result, recorded.stage) {
        (Err(e), _) => {
            let (reason, message) = (kubewasm::host::reason_of(&e), e.to_string());
            ensure!(
                reason.as_str() == recorded.reason && message == recorded.message,
                "replayed {object} with {digest}: it failed otherwise{unread}.\n  recorded: {}: {}\n  replayed: {}: {message}",
                recorded.reason,
                recorded.message,
                reason.as_str()
            );
            println!(
                "replayed {object} with {digest}: the same failure{unread}\n  {}: {message}",
                reason.as_str()
            );
            Ok(())
        }
        (Ok(outcome), Stage::Apply) => {
            println!(
                "{}",
                serde_json::to_string_pretty(&outcome.response.actions)?
            );
            println!(
                "replayed {object} with {digest}: the guest answered as above{unread}; the recorded failure came when the runtime carried out that answer, which a replay does not do:\n  {}: {}",
                recorded.reason, recorded.message
            );
            Ok(())
        }
        (Ok(outcome), Stage::Call) => bail!(
            "replayed {object} with {digest}: the guest succeeded ({} actions){unread}, where it failed when recorded:\n  {}: {}",
            outcome.response.actions.len(),
            recorded.reason,
            recorded.message
        ),
    }
}

/// The capsule's module: `module`, or pulled by the manifest digest it was pulled as (else
/// the image its controller names); either way of the capsule's digest.
fn module_of(
    capsule: &Capsule,
    module: Option<&Path>,
    registry: &RegistryArgs,
) -> anyhow::Result<Vec<u8>> {
    let want = &capsule.module.digest;
    // The manifest it was pulled by, else the spec's reference (a tag may have moved on).
    let image = capsule
        .module
        .image
        .as_ref()
        .or(capsule.module.source.image.as_ref());
    let (bytes, from) = match (module, image) {
        (Some(path), _) => (module_file(path)?, path.display().to_string()),
        (None, Some(image)) => (pull_module(image, registry)?, image.clone()),
        (None, None) => {
            let hint = match &capsule.module.source.config_map {
                Some(cm) => format!(
                    " (its controller reads it from ConfigMap {}, key {}: `kubectl get configmap {} -o jsonpath='{{.binaryData.{}}}' | base64 -d > module.wasm`)",
                    cm.name,
                    cm.key,
                    cm.name,
                    cm.key.replace('.', "\\.")
                ),
                None => String::new(),
            };
            bail!("give the module of {want} with --module FILE{hint}")
        }
    };
    let got = format!("sha256:{}", Digest::of(&bytes).hex());
    ensure!(
        &got == want,
        "{from} is module {got}, not the capsule's {want}: replay with the module that failed (--module FILE)"
    );
    Ok(bytes)
}

/// The module in file `path` (gzipped or not), read as `kubewasm reconcile --module` reads it.
fn module_file(path: &Path) -> anyhow::Result<Vec<u8>> {
    let source = Source::File {
        path: path.to_string_lossy().into_owned(),
    };
    let origin = OfflineOrigin::new(&[]);
    let fetched = block_on("reading the module", async {
        Ok(sources::fetch(&origin, &source, None, None).await?)
    })?;
    match fetched {
        sources::Fetched::Module { bytes, .. } => Ok(bytes.to_vec()),
        sources::Fetched::Unchanged | sources::Fetched::Pending => {
            bail!("no module was read from {}", path.display())
        }
    }
}

/// Pulls `image`'s module, as the runtime does (a capsule's image may have moved on: the
/// digest is checked by the caller).
fn pull_module(image: &str, registry: &RegistryArgs) -> anyhow::Result<Vec<u8>> {
    let reference = image_reference(image)?;
    let host = reference.reference().registry().to_owned();
    let config = RegistryConfig {
        insecure: if registry.insecure {
            vec![host.clone()]
        } else {
            Vec::new()
        },
        ..RegistryConfig::new(kubewasm::sources::DEFAULT_MAX_MODULE_BYTES)
    };
    let auth = registry.credentials(&host)?;
    let pulled = block_on("the pull", async {
        pull(&config, &reference, &auth, None)
            .await
            .map_err(|e| anyhow::anyhow!("{}: {e}", registry.cannot("pull", image)))
    })?;
    match pulled {
        Pulled::Module { bytes, .. } => Ok(bytes.to_vec()),
        Pulled::Unchanged => bail!("{image}: nothing pulled"),
    }
}
