//! `kubewasm sign --key FILE REF`: signs the manifest digest `REF` resolves to, in cosign's
//! format ([`kubewasm::sources::cosign`]), and pushes the signature next to the image (tag
//! `sha256-HEX.sig`), keeping the signatures already there. What `kubewasm run --verify-key`
//! checks, and what `cosign verify --key cosign.pub --insecure-ignore-tlog=true REF` accepts
//! (no transparency-log entry is made).
//!
//! The key: PEM `PRIVATE KEY` (PKCS#8) or `EC PRIVATE KEY` (SEC1), ECDSA P-256, or a key made
//! by `cosign generate-key-pair` (its password from `$COSIGN_PASSWORD`, as cosign reads it).

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Context;
use kubewasm::sandbox::Digest;
use kubewasm::sources::cosign::{self, SigningKey};
use kubewasm::sources::oci::MANIFEST_MEDIA_TYPE;
use oci_client::RegistryOperation;
use oci_client::manifest::{OciDescriptor, OciImageManifest, OciManifest};

use super::registry::{RegistryArgs, block_on, image_reference};

/// Arguments of `kubewasm sign`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The private key (PEM, ECDSA P-256; or cosign's encrypted `cosign.key`, its password in
    /// `$COSIGN_PASSWORD`).
    #[arg(long, value_name = "FILE")]
    key: PathBuf,
    /// The image to sign: `registry/repository:tag` (the digest the tag names now is signed)
    /// or `registry/repository@sha256:…`.
    reference: String,
    #[command(flatten)]
    registry: RegistryArgs,
}

/// Signs the image's digest and prints `REPOSITORY@DIGEST`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let image = image_reference(&args.reference)?;
    let key = SigningKey::read(&args.key, || {
        std::env::var("COSIGN_PASSWORD")
            .map(String::into_bytes)
            .map_err(|_| {
                "the key is encrypted: give its password in $COSIGN_PASSWORD (as cosign reads it)"
                    .to_owned()
            })
    })
    .map_err(|e| anyhow::anyhow!("--key {e}"))?;
    let auth = args.registry.credentials(image.registry())?;
    let client = args.registry.client(image.registry())?;
    let reference = image.reference();
    let repository = format!("{}/{}", reference.registry(), reference.repository());
    let signed = block_on(&format!("signing {}", args.reference), async {
        client
            .auth(reference, &auth, RegistryOperation::Push)
            .await
            .with_context(|| args.registry.cannot("log in to", &args.reference))?;
        // The digest the reference names, as the registry has it (a digest reference is
        // checked to exist: a signature of nothing is refused).
        let digest = client
            .fetch_manifest_digest(reference, &auth)
            .await
            .with_context(|| args.registry.cannot("resolve", &args.reference))?;
        let tag = cosign::signature_tag(&digest).with_context(|| {
            format!(
                "{} resolves to {digest}, not a sha256 digest",
                args.reference
            )
        })?;
        let signatures = oci_client::Reference::with_tag(
            reference.registry().to_owned(),
            reference.repository().to_owned(),
            tag,
        );
        let payload = cosign::payload(&repository, &digest);
        let payload_digest = format!("sha256:{}", Digest::of(&payload).hex());
        let layer = OciDescriptor {
            media_type: cosign::PAYLOAD_MEDIA_TYPE.to_owned(),
            digest: payload_digest.clone(),
            size: payload.len() as i64,
            annotations: Some(BTreeMap::from([(
                cosign::SIGNATURE_ANNOTATION.to_owned(),
                key.sign(&payload),
            )])),
            ..OciDescriptor::default()
        };
        // The signatures already there are kept (cosign appends too).
        let mut layers = match client
            .pull_manifest_raw(&signatures, &auth, &[MANIFEST_MEDIA_TYPE])
            .await
        {
            Ok((raw, _)) => {
                serde_json::from_slice::<OciImageManifest>(&raw)
                    .with_context(|| format!("{signatures} is not an image manifest"))?
                    .layers
            }
            Err(_) => Vec::new(),
        };
        // ECDSA signatures here are deterministic (RFC 6979): signing again adds nothing.
        let same =
            |l: &OciDescriptor| l.digest == layer.digest && l.annotations == layer.annotations;
        if layers.iter().any(same) {
            return Ok(format!("{repository}@{digest}"));
        }
        layers.push(layer);
        client
            .push_blob(&signatures, payload, &payload_digest)
            .await
            .with_context(|| {
                args.registry
                    .cannot("push the signature to", &args.reference)
            })?;
        let diff_ids: Vec<String> = layers.iter().map(|l| l.digest.clone()).collect();
        let config = cosign::signature_config(&diff_ids);
        let config_digest = format!("sha256:{}", Digest::of(&config).hex());
        let config_descriptor = OciDescriptor {
            media_type: cosign::SIGNATURE_CONFIG_MEDIA_TYPE.to_owned(),
            digest: config_digest.clone(),
            size: config.len() as i64,
            ..OciDescriptor::default()
        };
        client
            .push_blob(&signatures, config, &config_digest)
            .await
            .with_context(|| {
                args.registry
                    .cannot("push the signature to", &args.reference)
            })?;
        let manifest = OciImageManifest {
            schema_version: 2,
            media_type: Some(MANIFEST_MEDIA_TYPE.to_owned()),
            config: config_descriptor,
            layers,
            subject: None,
            artifact_type: None,
            annotations: None,
        };
        client
            .push_manifest(&signatures, &OciManifest::Image(manifest))
            .await
            .with_context(|| {
                args.registry
                    .cannot("push the signature to", &args.reference)
            })?;
        Ok(format!("{repository}@{digest}"))
    })?;
    println!("{signed}");
    Ok(())
}
