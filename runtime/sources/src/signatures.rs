//! Whether an image's digest is signed by a key the operator trusts: the cosign signatures
//! stored beside it in its repository, read through the pull's session, every byte capped.

use oci_client::manifest::OciImageManifest;

use super::cosign;
use super::oci::{MANIFEST_MEDIA_TYPE, PullError, RegistryConfig, read_blob, read_manifest};
use super::registry_http::Session;
use kubewasm_api::ImageRef;

/// Media types a signature manifest may have: cosign writes OCI manifests, older releases
/// Docker's (the same shape).
const SIGNATURE_MANIFEST_MEDIA_TYPES: [&str; 2] = [
    MANIFEST_MEDIA_TYPE,
    "application/vnd.docker.distribution.manifest.v2+json",
];

/// Whether a cosign signature of `digest` by one of `keys` is in `image`'s repository (see
/// [`cosign`]): at most [`cosign::MAX_SIGNATURES`] signatures of at most
/// [`cosign::MAX_PAYLOAD_BYTES`] each are read.
pub(super) async fn verify_signature(
    config: &RegistryConfig,
    session: &mut Session,
    image: &ImageRef,
    digest: &str,
) -> Result<(), PullError> {
    let keys = &config.verify_keys;
    let reference = image.reference();
    let repository = format!("{}/{}", reference.registry(), reference.repository());
    let refuse = |why: String| PullError::Signature {
        image: image.to_string(),
        repository: repository.clone(),
        digest: digest.to_owned(),
        why,
    };
    let Some(tag) = cosign::signature_tag(digest) else {
        return Err(refuse("cosign signs sha256 digests only".into()));
    };
    let Some(raw) = read_manifest(session, &tag, &SIGNATURE_MANIFEST_MEDIA_TYPES).await? else {
        return Err(refuse(format!(
            "it has no signature (its repository has no tag {tag})"
        )));
    };
    let manifest: OciImageManifest = serde_json::from_slice(&raw).map_err(|e| {
        refuse(format!(
            "its signatures ({tag}) are not an image manifest: {e}"
        ))
    })?;
    drop(raw);
    let mut refusals: Vec<String> = Vec::new();
    let layers = manifest
        .layers
        .iter()
        .filter(|l| l.media_type == cosign::PAYLOAD_MEDIA_TYPE)
        .take(cosign::MAX_SIGNATURES);
    for layer in layers {
        let Some(signature) = layer
            .annotations
            .as_ref()
            .and_then(|a| a.get(cosign::SIGNATURE_ANNOTATION))
        else {
            continue;
        };
        if layer.urls.as_ref().is_some_and(|u| !u.is_empty()) {
            refusals.push("a signature names foreign `urls`".into());
            continue;
        }
        let payload = match read_blob(session, layer, cosign::MAX_PAYLOAD_BYTES, "signature").await
        {
            Ok(payload) => payload,
            Err(e) => {
                refusals.push(format!("a signature cannot be read: {e}"));
                continue;
            }
        };
        match cosign::check(keys, &payload, signature, digest) {
            Ok(key) => {
                tracing::debug!(image = %image, digest, key = %key.name, "signature verified");
                return Ok(());
            }
            Err(why) => refusals.push(why.to_string()),
        }
    }
    refusals.dedup();
    Err(refuse(match refusals.as_slice() {
        [] => format!("{tag} holds no cosign signature"),
        [one] => format!("its one signature is refused: {one}"),
        many => format!(
            "none of its {} signatures is good: {}",
            many.len(),
            many.join("; ")
        ),
    }))
}
