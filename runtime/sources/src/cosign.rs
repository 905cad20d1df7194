//! Cosign's signature format for module images, key-based: what `cosign sign --key` stores and
//! `cosign verify --key` checks, without a transparency log.
//!
//! A signature of image `REGISTRY/REPO@sha256:HEX` is a layer of the image manifest tagged
//! `sha256-HEX.sig` in the same repository ([`signature_tag`]). The layer's blob is the
//! payload cosign signs ([`payload`], media type [`PAYLOAD_MEDIA_TYPE`]): a small JSON naming
//! the repository and the manifest digest; its annotation [`SIGNATURE_ANNOTATION`] is the
//! base64 ASN.1 DER ECDSA signature of the payload's SHA-256. A signature is good when a
//! trusted key verifies it over the payload's bytes *and* the payload names the digest being
//! loaded ([`check`]); like cosign, the repository the payload names is not compared (a
//! signature copied with its image stays good).
//!
//! Keys are ECDSA P-256, the kind `cosign generate-key-pair` makes: public keys as PEM
//! `PUBLIC KEY` ([`TrustedKey`]); private keys as PEM `PRIVATE KEY` (PKCS#8), `EC PRIVATE KEY`
//! (SEC1) or cosign's own encrypted `ENCRYPTED SIGSTORE PRIVATE KEY` / `ENCRYPTED COSIGN
//! PRIVATE KEY` (scrypt and NaCl secretbox; [`SigningKey`]).

use std::path::Path;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use p256::ecdsa::signature::{Signer as _, Verifier as _};
use p256::pkcs8::{DecodePrivateKey as _, DecodePublicKey as _, EncodePublicKey as _, LineEnding};
use serde::{Deserialize, Serialize};

/// The media type of a signature layer (cosign's "simple signing" payload).
pub const PAYLOAD_MEDIA_TYPE: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// The layer annotation holding the signature.
pub const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
/// The `critical.type` of a cosign image signature.
pub const SIGNATURE_TYPE: &str = "cosign container image signature";
/// The config media type of a signature manifest.
pub const SIGNATURE_CONFIG_MEDIA_TYPE: &str = "application/vnd.oci.image.config.v1+json";
/// The most bytes a signature payload may have (cosign's are ~250).
pub const MAX_PAYLOAD_BYTES: u64 = 64 << 10;
/// The most signature layers one image's signature manifest may have that are looked at.
pub const MAX_SIGNATURES: usize = 32;

/// The tag cosign keeps the signatures of manifest `digest` (`sha256:HEX`) under:
/// `sha256-HEX.sig`. `None` for a digest of another form.
pub fn signature_tag(digest: &str) -> Option<String> {
    let hex = digest.strip_prefix("sha256:")?;
    (hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| format!("sha256-{hex}.sig"))
}

/// Cosign's signed payload ("simple signing"), in cosign's field order.
#[derive(Debug, Serialize, Deserialize)]
struct SimpleSigning {
    critical: Critical,
    optional: Option<serde_json::Map<String, serde_json::Value>>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Critical {
    identity: Identity,
    image: Image,
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct Identity {
    #[serde(rename = "docker-reference")]
    docker_reference: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct Image {
    #[serde(rename = "docker-manifest-digest")]
    docker_manifest_digest: String,
}

/// The payload cosign signs for manifest `digest` of `repository` (`registry/repo`), byte for
/// byte as cosign writes it.
pub fn payload(repository: &str, digest: &str) -> Vec<u8> {
    let payload = SimpleSigning {
        critical: Critical {
            identity: Identity {
                docker_reference: repository.to_owned(),
            },
            image: Image {
                docker_manifest_digest: digest.to_owned(),
            },
            kind: SIGNATURE_TYPE.to_owned(),
        },
        optional: None,
    };
    // A struct of strings always serializes.
    serde_json::to_vec(&payload).unwrap_or_default()
}

/// A public key signatures are checked with (`kubewasm run --verify-key`).
#[derive(Clone, PartialEq, Eq)]
pub struct TrustedKey {
    /// Where it came from (its file), to say which key verified a module.
    pub name: String,
    key: p256::ecdsa::VerifyingKey,
}

impl std::fmt::Debug for TrustedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TrustedKey({})", self.name)
    }
}

impl TrustedKey {
    /// A PEM `PUBLIC KEY` (ECDSA P-256, as `cosign generate-key-pair` writes `cosign.pub`).
    pub fn from_pem(name: impl Into<String>, pem: &str) -> Result<TrustedKey, String> {
        let key = p256::ecdsa::VerifyingKey::from_public_key_pem(pem.trim()).map_err(|e| {
            format!(
                "not a PEM ECDSA P-256 public key ({e}); cosign's `cosign.pub` is one, and `openssl ec -in KEY -pubout` writes one (RSA and Ed25519 keys are not supported)"
            )
        })?;
        Ok(TrustedKey {
            name: name.into(),
            key,
        })
    }

    /// The key in file `path` (at most 64 KiB).
    pub fn read(path: &Path) -> Result<TrustedKey, String> {
        let pem = read_small(path)?;
        let pem =
            String::from_utf8(pem).map_err(|_| format!("{}: not PEM text", path.display()))?;
        TrustedKey::from_pem(path.display().to_string(), &pem)
            .map_err(|e| format!("{}: {e}", path.display()))
    }
}

/// Reads a key file, refusing one larger than any key.
fn read_small(path: &Path) -> Result<Vec<u8>, String> {
    use std::io::Read as _;
    let file =
        std::fs::File::open(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut bytes = Vec::new();
    file.take(64 << 10)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    Ok(bytes)
}

/// Why a signature layer is not a good signature of a digest.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// The annotation is not a base64 DER ECDSA signature.
    #[error("its signature is not a base64 ASN.1 DER ECDSA signature")]
    Malformed,
    /// No trusted key verifies it.
    #[error("it is signed by none of the trusted keys")]
    UntrustedKey,
    /// A trusted key signed it, but not as a cosign image signature.
    #[error("its payload is not a cosign image signature")]
    NotAnImageSignature,
    /// A trusted key signed another digest.
    #[error("it signs {0}, not this digest")]
    OtherDigest(String),
}

/// The trusted key that made `signature` (base64 DER) over `payload`, if the payload is a
/// cosign image signature of `digest`.
pub fn check<'k>(
    keys: &'k [TrustedKey],
    payload: &[u8],
    signature: &str,
    digest: &str,
) -> Result<&'k TrustedKey, Refused> {
    let der = BASE64
        .decode(signature.trim())
        .map_err(|_| Refused::Malformed)?;
    let signature = p256::ecdsa::Signature::from_der(&der).map_err(|_| Refused::Malformed)?;
    let key = keys
        .iter()
        .find(|k| k.key.verify(payload, &signature).is_ok())
        .ok_or(Refused::UntrustedKey)?;
    let signed: SimpleSigning =
        serde_json::from_slice(payload).map_err(|_| Refused::NotAnImageSignature)?;
    if signed.critical.kind != SIGNATURE_TYPE {
        return Err(Refused::NotAnImageSignature);
    }
    let named = signed.critical.image.docker_manifest_digest;
    if named != digest {
        return Err(Refused::OtherDigest(
            kubewasm_sandbox::guest_text(&named, 100).into_owned(),
        ));
    }
    Ok(key)
}

/// A private key that signs (`kubewasm sign --key`).
pub struct SigningKey(p256::ecdsa::SigningKey);

impl SigningKey {
    /// The key in PEM `pem`: PKCS#8 `PRIVATE KEY`, SEC1 `EC PRIVATE KEY`, or cosign's
    /// encrypted key, decrypted with what `password` gives (asked only for an encrypted key).
    pub fn from_pem(
        pem: &[u8],
        password: impl FnOnce() -> Result<Vec<u8>, String>,
    ) -> Result<SigningKey, String> {
        let text = std::str::from_utf8(pem).map_err(|_| "not PEM text".to_owned())?;
        let (label, der) = p256::pkcs8::der::pem::decode_vec(text.trim().as_bytes())
            .map_err(|e| format!("not a PEM private key: {e}"))?;
        let not_p256 = |e: &dyn std::fmt::Display| {
            format!("not an ECDSA P-256 private key ({e}); RSA and Ed25519 keys are not supported")
        };
        let key = match label {
            "PRIVATE KEY" => p256::SecretKey::from_pkcs8_der(&der).map_err(|e| not_p256(&e))?,
            "EC PRIVATE KEY" => p256::SecretKey::from_sec1_der(&der).map_err(|e| not_p256(&e))?,
            "ENCRYPTED SIGSTORE PRIVATE KEY" | "ENCRYPTED COSIGN PRIVATE KEY" => {
                let der = decrypt(&der, &password()?)?;
                p256::SecretKey::from_pkcs8_der(&der).map_err(|e| not_p256(&e))?
            }
            other => {
                return Err(format!(
                    "a PEM `{other}`, not a private key (`PRIVATE KEY`, `EC PRIVATE KEY` or cosign's `ENCRYPTED SIGSTORE PRIVATE KEY`)"
                ));
            }
        };
        Ok(SigningKey(key.into()))
    }

    /// The key in file `path` (see [`SigningKey::from_pem`]).
    pub fn read(
        path: &Path,
        password: impl FnOnce() -> Result<Vec<u8>, String>,
    ) -> Result<SigningKey, String> {
        SigningKey::from_pem(&read_small(path)?, password)
            .map_err(|e| format!("{}: {e}", path.display()))
    }

    /// The base64 ASN.1 DER ECDSA (SHA-256) signature of `payload`, as cosign stores it.
    pub fn sign(&self, payload: &[u8]) -> String {
        let signature: p256::ecdsa::Signature = self.0.sign(payload);
        BASE64.encode(signature.to_der().as_bytes())
    }

    /// Its public key as PEM `PUBLIC KEY` (what `--verify-key` reads).
    pub fn public_key_pem(&self) -> String {
        self.0
            .verifying_key()
            .to_public_key_pem(LineEnding::LF)
            .unwrap_or_default()
    }
}

/// Cosign's encrypted private key (go-securesystemslib's format): a JSON of the scrypt
/// parameters, the secretbox nonce and the ciphertext of the PKCS#8 key.
fn decrypt(json: &[u8], password: &[u8]) -> Result<Vec<u8>, String> {
    #[derive(Deserialize)]
    struct Encrypted {
        kdf: Kdf,
        cipher: Cipher,
        ciphertext: String,
    }
    #[derive(Deserialize)]
    struct Kdf {
        name: String,
        params: ScryptParams,
        salt: String,
    }
    #[derive(Deserialize)]
    struct ScryptParams {
        #[serde(rename = "N")]
        n: u64,
        r: u32,
        p: u32,
    }
    #[derive(Deserialize)]
    struct Cipher {
        name: String,
        nonce: String,
    }
    use crypto_secretbox::aead::{Aead as _, KeyInit as _};
    let bad = |why: &str| format!("not a cosign encrypted key: {why}");
    let encrypted: Encrypted = serde_json::from_slice(json).map_err(|e| bad(&e.to_string()))?;
    if encrypted.kdf.name != "scrypt" || encrypted.cipher.name != "nacl/secretbox" {
        return Err(bad("only scrypt with nacl/secretbox is known"));
    }
    let ScryptParams { n, r, p } = encrypted.kdf.params;
    // N is a power of two; cosign uses 2^15 or 2^16. Past 2^20 a key file could make this
    // command allocate gigabytes.
    let log_n = match n.checked_ilog2() {
        Some(log) if n.is_power_of_two() && (1..=20).contains(&log) => log as u8,
        _ => {
            return Err(bad(&format!(
                "scrypt N = {n} (a power of two up to 2^20 is taken)"
            )));
        }
    };
    let params = scrypt::Params::new(log_n, r, p, 32)
        .map_err(|e| bad(&format!("scrypt parameters: {e}")))?;
    let decode = |field: &str, value: &str| {
        BASE64
            .decode(value)
            .map_err(|_| bad(&format!("its {field} is not base64")))
    };
    let salt = decode("salt", &encrypted.kdf.salt)?;
    let nonce = decode("nonce", &encrypted.cipher.nonce)?;
    let ciphertext = decode("ciphertext", &encrypted.ciphertext)?;
    if nonce.len() != 24 {
        return Err(bad("its nonce is not 24 bytes"));
    }
    let mut key = [0u8; 32];
    scrypt::scrypt(password, &salt, &params, &mut key).map_err(|e| bad(&e.to_string()))?;
    let cipher = crypto_secretbox::XSalsa20Poly1305::new_from_slice(&key)
        .map_err(|e| bad(&e.to_string()))?;
    cipher
        .decrypt(
            crypto_secretbox::Nonce::from_slice(&nonce),
            ciphertext.as_slice(),
        )
        .map_err(|_| {
            "cannot decrypt the key: wrong password (cosign reads it from $COSIGN_PASSWORD)"
                .to_owned()
        })
}

/// The config blob of a signature manifest with layers `payload_digests`, as cosign writes it
/// (an empty image's config listing its layers).
pub fn signature_config(payload_digests: &[String]) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "architecture": "",
        "created": "0001-01-01T00:00:00Z",
        "history": [{"created": "0001-01-01T00:00:00Z"}],
        "os": "",
        "rootfs": {"type": "layers", "diff_ids": payload_digests},
        "config": {},
    }))
    .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A public key and the signature real cosign made with its private key of the payload
    /// below (sigstore-rs's test vector, `src/crypto/verification_key.rs`, Apache-2.0).
    const COSIGN_PUBLIC_KEY: &str = "-----BEGIN PUBLIC KEY-----
MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAENptdY/l3nB0yqkXLBWkZWQwo6+cu
OSWS1X9vPavpiQOoTTGC0xX57OojUadxF1cdQmrsiReWg2Wn4FneJfa8xw==
-----END PUBLIC KEY-----";
    const COSIGN_SIGNATURE: &str = "MEUCIQD6q/COgzOyW0YH1Dk+CCYSt4uAhm3FDHUwvPI55zwnlwIgE0ZK58ZOWpZw8YVmBapJhBqCfdPekIknimuO0xH8Jh8=";
    const COSIGN_PAYLOAD: &str = r#"{"critical":{"identity":{"docker-reference":"registry-testing.svc.lan/busybox"},"image":{"docker-manifest-digest":"sha256:f3cfc9d0dbf931d3db4685ec659b7ac68e2a578219da4aae65427886e649b06b"},"type":"cosign container image signature"},"optional":null}"#;
    const COSIGN_DIGEST: &str =
        "sha256:f3cfc9d0dbf931d3db4685ec659b7ac68e2a578219da4aae65427886e649b06b";

    /// A key made by `cosign generate-key-pair` with an empty password (sigstore-rs's
    /// `tests/data/keys/cosign_generated_encrypted_empty_private.key`, Apache-2.0).
    const COSIGN_ENCRYPTED_KEY: &str = "-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----
eyJrZGYiOnsibmFtZSI6InNjcnlwdCIsInBhcmFtcyI6eyJOIjo2NTUzNiwiciI6
OCwicCI6MX0sInNhbHQiOiJFY3pJR3Z0bnpFcCsxaEpudERnbGI1UnoxN3gwQVMy
YklvWGRNcDQrU1NJPSJ9LCJjaXBoZXIiOnsibmFtZSI6Im5hY2wvc2VjcmV0Ym94
Iiwibm9uY2UiOiJtSVVKbG1OMzNINExvZ0dhaG5MamdmK3R4SmJwci93MCJ9LCJj
aXBoZXJ0ZXh0IjoiM3FtS2FidXRuYm1WT1IvTkZGM2NDaUErTXp1WWQ5L0VERDVI
MVlUSGhQVzZsSzAvdjVqdDZCQzlsME12NGV5am9qZkl0d3B6a2JJOXQrZGx5VXZ3
VUgvMWZjbkFZT2dEdXRLQzkvSkNiOE02SVY2VHpVaDF5c0ZFWDFzeG9xb1FzeUpL
bjM0UVlldFNlaVdDaGtmUHUyZXByQjFEV0pwekdzTGZIakxNVTkzOEdmNk1xM1A0
N0ZSd2syZzY1cFZnSGMwVWV1L1N1OUs0Zmc9PSJ9
-----END ENCRYPTED SIGSTORE PRIVATE KEY-----";

    #[test]
    fn a_signature_made_by_cosign_verifies_and_our_payload_is_cosigns_byte_for_byte() {
        let keys = [TrustedKey::from_pem("cosign.pub", COSIGN_PUBLIC_KEY).unwrap()];
        let key = check(
            &keys,
            COSIGN_PAYLOAD.as_bytes(),
            COSIGN_SIGNATURE,
            COSIGN_DIGEST,
        )
        .unwrap();
        assert_eq!(key.name, "cosign.pub");
        assert_eq!(
            payload("registry-testing.svc.lan/busybox", COSIGN_DIGEST),
            COSIGN_PAYLOAD.as_bytes()
        );
        // The same signature does not make another digest good.
        let other = format!("sha256:{}", "0".repeat(64));
        assert_eq!(
            check(&keys, COSIGN_PAYLOAD.as_bytes(), COSIGN_SIGNATURE, &other).unwrap_err(),
            Refused::OtherDigest(COSIGN_DIGEST.into())
        );
        // Nor another payload.
        let forged = payload("registry-testing.svc.lan/busybox", &other);
        assert_eq!(
            check(&keys, &forged, COSIGN_SIGNATURE, &other).unwrap_err(),
            Refused::UntrustedKey
        );
        assert_eq!(
            check(
                &keys,
                COSIGN_PAYLOAD.as_bytes(),
                "not@base64",
                COSIGN_DIGEST
            )
            .unwrap_err(),
            Refused::Malformed
        );
    }

    #[test]
    fn a_cosign_generated_encrypted_key_signs_and_a_wrong_password_is_said() {
        let key = SigningKey::from_pem(COSIGN_ENCRYPTED_KEY.as_bytes(), || Ok(Vec::new())).unwrap();
        let digest = format!("sha256:{}", "a".repeat(64));
        let body = payload("127.0.0.1:5000/team/hello", &digest);
        let signature = key.sign(&body);
        let trusted = [TrustedKey::from_pem("k", &key.public_key_pem()).unwrap()];
        assert!(check(&trusted, &body, &signature, &digest).is_ok());
        let err = SigningKey::from_pem(COSIGN_ENCRYPTED_KEY.as_bytes(), || Ok(b"nope".to_vec()))
            .err()
            .unwrap();
        assert!(err.contains("wrong password"), "{err}");
    }

    #[test]
    fn only_a_trusted_key_of_the_right_kind_is_taken() {
        let a = SigningKey(p256::SecretKey::from_slice(&[7u8; 32]).unwrap().into());
        let b = SigningKey(p256::SecretKey::from_slice(&[9u8; 32]).unwrap().into());
        let digest = format!("sha256:{}", "b".repeat(64));
        let body = payload("r/x", &digest);
        let only_a = [TrustedKey::from_pem("a", &a.public_key_pem()).unwrap()];
        assert_eq!(
            check(&only_a, &body, &b.sign(&body), &digest).unwrap_err(),
            Refused::UntrustedKey
        );
        // A trusted key's signature of something that is no image signature.
        let blob = br#"{"critical":{"identity":{"docker-reference":"r/x"},"image":{"docker-manifest-digest":"sha256:bb"},"type":"something else"},"optional":null}"#;
        assert_eq!(
            check(&only_a, blob, &a.sign(blob), &digest).unwrap_err(),
            Refused::NotAnImageSignature
        );
        let rsa = "-----BEGIN PUBLIC KEY-----
MFwwDQYJKoZIhvcNAQEBBQADSwAwSAJBAPHpCs1pCuIaOECmlB+1Hjokn+UAH3NW
jU4Lpe8ESqsrbSHbynWtQC55Q2cqAI7dF78Jxf/BtiMNZd93WUmTGm0CAwEAAQ==
-----END PUBLIC KEY-----";
        let err = TrustedKey::from_pem("rsa", rsa).unwrap_err();
        assert!(err.contains("not a PEM ECDSA P-256 public key"), "{err}");
        let err = SigningKey::from_pem(rsa.as_bytes(), || Ok(Vec::new()))
            .err()
            .unwrap();
        assert!(err.contains("not a private key"), "{err}");
    }

    #[test]
    fn signatures_live_under_the_digests_sig_tag() {
        let digest = format!("sha256:{}", "c".repeat(64));
        assert_eq!(
            signature_tag(&digest).unwrap(),
            format!("sha256-{}.sig", "c".repeat(64))
        );
        assert_eq!(signature_tag("sha256:zz"), None);
        assert_eq!(signature_tag("md5:00"), None);
    }
}
